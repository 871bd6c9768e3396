# Retention under load: publishers (pgbench, 2 clients) publish for 8 s
# while every message is aged past its outbox's retention at once, the
# relay worker sweeps every second, the test sweeps too, and two consumer
# groups read at different speeds while a file pipeline delivers. At the end
# each group has seen every published message exactly in order (a message
# swept before a group passed it would be missing), the file holds every
# message, and the sweep did delete what all had passed.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode;
use Time::HiRes qw(time usleep);

my $node = tide_node('sweep', "pg_tide.relay_naptime_ms = 100\npg_tide.sweep_interval = 1\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $file = "$dir/sweep.jsonl";
chmod 0777, $dir;

sub sql { return $node->safe_psql('postgres', $_[0]) }

sql("SELECT tide.outbox_create('orders', p_retention_hours => 1)");
sql("SELECT tide.create_consumer_group(g, 'orders', 'earliest') FROM unnest(ARRAY['fast', 'slow']) g");
sql("SELECT tide.relay_set_outbox('tofile', 'orders', 'tofile', jsonb_build_object(
	  'sink_type', 'file', 'path', '$file', 'fsync', false))");
sql("CREATE TABLE seen (grp text, id bigint, PRIMARY KEY (grp, id))");

# The publishers, in the background.
my $script = "$dir/publish.sql";
open(my $fh, '>', $script) or die;
print $fh "SELECT tide.outbox_publish('orders', jsonb_build_object('r', random())) FROM generate_series(1, 1 + (random() * 4)::int);\n";
close $fh;
my $pgbench = IPC::Run::start(
	[ 'pgbench', '-n', '-c', '2', '-j', '2', '-T', '8', '-R', '150', '-f', $script,
	  '-h', $node->host, '-p', $node->port, 'postgres' ],
	'>', "$dir/pgbench.out", '2>', "$dir/pgbench.err");

# One consumer step: poll a batch, record what came, commit the offset.
sub consume
{
	my ($grp, $batch) = @_;
	return sql("WITH b AS (SELECT id FROM tide.poll_outbox('$grp', 'c', $batch, 30)),
					 ins AS (INSERT INTO seen SELECT '$grp', id FROM b RETURNING id)
				SELECT tide.commit_offset('$grp', 'c', max(id)) FROM ins HAVING count(*) > 0");
}

my $start = time();
my ($swept, $steps) = (0, 0);
while (time() - $start < 9)
{
	# Every message is past retention at once: only positions protect it.
	sql("UPDATE tide.tide_outbox_messages SET created_at = now() - interval '2 hours'
		  WHERE outbox_name = 'orders' AND created_at > now() - interval '1 hour'");
	consume('fast', 60);
	consume('slow', 25);
	$swept += sql("SELECT (tide.outbox_sweep('orders', 50) ->> 'deleted')::int") if $steps % 5 == 0;
	$steps++;
	usleep(20_000);
}
$pgbench->finish;
my $deleted_during = sql("SELECT last_value FROM tide.tide_outbox_messages_id_seq")
  - sql("SELECT count(*) FROM tide.tide_outbox_messages WHERE outbox_name = 'orders'");
like(slurp_file("$dir/pgbench.out"), qr/number of failed transactions: 0/, 'the publishers ran without failures')
  or diag(slurp_file("$dir/pgbench.err"));

# Drain: both groups read the rest (no more aging, but what is old stays old).
for (1 .. 2000)
{
	my $left = sql("SELECT count(*) FROM tide.tide_outbox_messages m, tide.consumer_lag l
					 WHERE l.outbox_name = 'orders' AND m.outbox_name = 'orders' AND m.id > l.committed_offset");
	last if $left == 0;
	consume('fast', 500);
	consume('slow', 500);
}
my $published = sql("SELECT last_value FROM tide.tide_outbox_messages_id_seq");
note("published up to id $published in $steps steps; $deleted_during swept during the run, $swept of them by the test's own sweeps");

# Every id 1..last published was either committed (seen by both groups) or
# rolled back; publishing never rolls back here, so every id must be seen.
for my $grp ('fast', 'slow')
{
	is(sql("SELECT count(*) FROM generate_series(1, $published) i
			 WHERE NOT EXISTS (SELECT FROM seen s WHERE s.grp = '$grp' AND s.id = i)"), '0',
		"group $grp saw every published message: none was swept before it passed");
}
ok($node->poll_query_until('postgres',
		"SELECT last_change_id = $published FROM tide.relay_consumer_offsets WHERE pipeline_id = 'tofile'"),
	'the file pipeline delivered everything');
my %in_file = map { /"message_id": (\d+)/ ? ($1 => 1) : () } split /\n/, slurp_file($file);
is(scalar(grep { !$in_file{$_} } 1 .. $published), 0, 'the file holds every message');

# Once every participant has passed them, the worker's sweep removes them.
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM tide.tide_outbox_messages WHERE outbox_name = 'orders'"),
	'the relay worker swept every message all participants had passed');
cmp_ok($deleted_during, '>', 0, 'the sweeps deleted messages while publishing went on');

$node->stop;
done_testing();
