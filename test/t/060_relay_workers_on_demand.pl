# Relay workers only where there is work: a database with pg_tide but no
# enabled pipeline holds no relay worker at rest (its start-up worker
# leaves); its periodic jobs (child tables made ahead, the sweep) still run
# in a worker started for them, which leaves again; enabling a pipeline
# brings a worker within a second and disabling it lets the worker go; a
# delivery works after a restart of the server; and with no background
# worker slot free, relay_set_outbox warns, naming max_worker_processes and
# how many slots pg_tide needs.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use Time::HiRes qw(time usleep);

my $node = tide_node('on_demand',
	"pg_tide.relay_naptime_ms = 200\npg_tide.sweep_interval = 2\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
chmod 0777, $dir;

sub sql { return $node->safe_psql($_[1] // 'postgres', $_[0]) }

# How many relay workers of database $db run now, as pg_stat_activity shows.
sub workers
{
	my ($db) = @_;
	return sql("SELECT count(*) FROM pg_stat_activity
				 WHERE backend_type = 'pg_tide relay worker' AND datname = '$db'");
}

# The share of samples, every 50 ms for $seconds, in which $db had a relay worker.
sub presence
{
	my ($db, $seconds) = @_;
	my ($n, $present) = (0, 0);
	my $end = time() + $seconds;
	while (time() < $end)
	{
		$n++;
		$present++ if workers($db) > 0;
		usleep(50_000);
	}
	return $present / $n;
}

sub set_conf
{
	my ($name, $value) = @_;
	sql("ALTER SYSTEM SET $name = '$value'");
	sql('SELECT pg_reload_conf()');
}

# 1. No pipeline: the start-up worker looks, does the periodic jobs, leaves.
ok(wait_until(sub { workers('postgres') == 0 }, 30, 10_000),
	'the worker of a database without a pipeline leaves after its start-up look');

# 2. The periodic jobs go on without a pipeline: children made ahead of the
# ids handed out, and the sweep of what every group has passed.
sql("SELECT tide.outbox_create('orders', p_retention_hours => 1)");
sql("SELECT tide.create_consumer_group('g', 'orders', 'earliest')");
sql("SELECT tide.outbox_publish('orders', jsonb_build_object('n', n)) FROM generate_series(1, 100) n");
my $last = sql("SELECT max(id) FROM tide.tide_outbox_messages");
ok( $node->poll_query_until('postgres',
		"SELECT coalesce(max(last_id) > $last, false) FROM tide.tide_outbox_partitions"),
	'a worker started for the periodic jobs made a child ahead of the ids handed out');
# past the retention, and passed by the one group
sql("UPDATE tide.tide_outbox_messages SET created_at = now() - interval '2 hours'");
sql("SELECT tide.commit_offset('g', 'c', max(id)) FROM tide.poll_outbox('g', 'c', 1000, 30)");
ok( $node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM tide.tide_outbox_messages WHERE outbox_name = 'orders'"),
	'and swept the messages every group had passed');
my $share = presence('postgres', 3);
cmp_ok($share, '<', 0.5, "the periodic workers leave again (present in ${\ sprintf('%.0f', 100 * $share)} % of samples)");

# 3. A pipeline gets its worker within a second of its commit; disabled, the
# worker leaves. The periodic workers now come only every minute.
set_conf('pg_tide.sweep_interval', '60s');
sleep(4);
ok(wait_until(sub { workers('postgres') == 0 }, 30, 10_000), 'no worker before the pipeline');
my $file = "$dir/out.jsonl";
my @took;
for my $try (1 .. 3)
{
	my $start = time();
	if ($try == 1)
	{
		sql("SELECT tide.relay_set_outbox('tofile', 'orders', 'tofile',
			  jsonb_build_object('sink_type', 'file', 'path', '$file', 'fsync', false))");
	}
	else
	{
		sql("SELECT tide.relay_enable('tofile')");
	}
	my $ok = wait_until(
		sub { sql("SELECT count(*) FROM tide.relay_workers() WHERE database = 'postgres' AND pipelines > 0") > 0 },
		30, 5_000);
	push @took, $ok ? time() - $start : 30;
	sql("SELECT tide.relay_disable('tofile')");
	ok(wait_until(sub { workers('postgres') == 0 }, 30, 10_000),
		"try $try: disabled, the pipeline's worker leaves");
}
my @sorted = sort { $a <=> $b } @took;
note('commit to worker present: ' . join(', ', map { sprintf('%.3f s', $_) } @took));
cmp_ok($sorted[1], '<', 1, 'a pipeline gets its worker within a second (median of 3)');

# 4. After a restart of the server, an enabled pipeline delivers.
sql("SELECT tide.relay_enable('tofile')");
$node->restart;
sql(q{SELECT tide.outbox_publish('orders', '{"after": "restart"}')});
ok(wait_until(sub { -e $file && slurp_file($file) =~ /"after": "restart"/ }, 30, 50_000),
	'a delivery works after a restart of the server');

# 5. No background worker slot free: max_worker_processes = 3 holds the
# logical replication launcher, pg_tide's launcher and the worker of
# postgres; a pipeline in another database warns.
$node->append_conf('postgresql.conf', "max_worker_processes = 3\n");
$node->restart;
ok(wait_until(sub { workers('postgres') == 1 }, 30, 20_000), 'postgres has its worker');
sql('CREATE DATABASE other');
sql('CREATE EXTENSION pg_tide', 'other');
sql("SELECT tide.outbox_create('orders')", 'other');
my ($ret, $out, $err) = $node->psql('other',
	"SELECT tide.relay_set_outbox('tofile', 'orders', 'tofile',
	   jsonb_build_object('sink_type', 'file', 'path', '$dir/other.jsonl', 'fsync', false))");
is($ret, 0, 'relay_set_outbox succeeds without a free slot');
like($err, qr/WARNING:  no background worker slot is free for the relay of database "other"/,
	'with a WARNING that no background worker slot is free');
like($err, qr/DETAIL:  pg_tide needs 3 of max_worker_processes \(3\) now: the launcher and 1 relay worker for each of the 2 databases with an enabled pipeline/,
	'naming max_worker_processes and how many slots pg_tide needs');
like($err, qr/HINT:  Raise max_worker_processes/, 'with a hint');
($ret, $out, $err) = $node->psql('other', "SELECT tide.relay_disable('tofile')");
is($err, '', 'disabling warns nothing');

# postgres lets its pipeline go: its worker leaves and other gets the slot.
sql("SELECT tide.relay_disable('tofile')");
sql("SELECT tide.relay_enable('tofile')", 'other');
sql(q{SELECT tide.outbox_publish('orders', '{"in": "other"}')}, 'other');
ok(wait_until(sub { -e "$dir/other.jsonl" && slurp_file("$dir/other.jsonl") =~ /"in": "other"/ }, 30, 50_000),
	'the slot let go by postgres serves the other database');

$node->stop;
done_testing();
