# pg_dump and pg_restore of a database the relay serves, with the relay on
# in the restored database too: a plain script through psql, and a custom
# archive restored with pg_restore -e, -1 and -j 2, two rounds each (and
# the plain script with a pause after the pipelines' rows). The
# source has pipelines, message child tables, retries, dead letters,
# attempts, health rows, offsets and a consumer group's lease. Each restore:
#  - succeeds (psql with ON_ERROR_STOP, pg_restore -e stop at the first
#    error: the relay worker, started by CREATE EXTENSION, wrote nothing
#    before the restore's COPY, no duplicate key);
#  - holds every row of every table of schema tide, child tables included,
#    as the source does;
#  - is served by the relay afterwards (a new message is delivered);
#  - lets DROP EXTENSION pg_tide drop it all without CASCADE.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use PgTide::Receiver;
use JSON::PP;

my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new->canonical;
my $file = "$dir/orders.jsonl";

# Answers 503 to a third of the requests (retried, 10 minutes later: they
# stay in the retry queue), and 400 to every request (dead letters).
my $flaky = PgTide::Receiver->new(dir => $dir, log => 0);
$flaky->start;
$flaky->control({ fail_rate => 0.3, fail_code => 503, seed => 7 });
my $refusing = PgTide::Receiver->new(dir => $dir, log => 0);
$refusing->start;
$refusing->control({ always => 400 });

my $node = tide_node('restore', "pg_tide.relay_naptime_ms = 100\npg_tide.partition_size = 1000\n");
my $connstr = sub { $node->connstr($_[0]) };

sub sql { my ($db, $q) = @_; return $node->safe_psql($db, $q) }

$node->safe_psql('postgres', 'CREATE DATABASE source');
sql('source', 'CREATE EXTENSION pg_tide');
sql('source', "SELECT tide.outbox_create('orders')");
my %hook = (sink_type => 'webhook', allow_http => JSON::PP::true, allow_private_network => JSON::PP::true,
	batch_size => 50, retry => { base_ms => 600000, max_attempts => 5 });
my %pipelines = (
	to_file => { sink_type => 'file', path => $file, batch_size => 100 },
	flaky => { %hook, url => $flaky->url },
	refused => { %hook, url => $refusing->url },
);
for my $name (sort keys %pipelines)
{
	sql('source', "SELECT tide.relay_set_outbox('$name', 'orders', '$name', '"
		  . $json->encode($pipelines{$name}) . "'::jsonb)");
}
sql('source', "SELECT tide.create_consumer_group('g', 'orders')");
# The application's own data, restored before pg_tide's (schema public
# comes first): the relay worker, started by CREATE EXTENSION, is running
# by the time the pipelines are loaded.
sql('source', "CREATE TABLE public.orders AS SELECT g AS id, md5(g::text) AS note FROM generate_series(1, 300000) g");

# Messages across the parent and several child tables (1,000 ids each, made
# by the worker ahead of the ids handed out).
for my $i (1 .. 3)
{
	sql('source', "SELECT count(tide.outbox_publish('orders', jsonb_build_object('n', g), '{\"h\": \"v\"}'))
		FROM generate_series(1, 1000) g");
	ok(wait_until(sub { sql('source', 'SELECT count(*) FROM tide.tide_outbox_partitions') >= $i + 1 }, 30),
		"child tables are made ($i)");
}
my $last = sql('source', 'SELECT max(id) FROM tide.tide_outbox_messages');
# A consumer's lease (offsets and a lease of consumer group g).
sql('source', "SELECT count(*) FROM tide.poll_outbox('g', 'c1', 100)");

# Every pipeline has gone through every message: delivered, queued for a
# retry or dead-lettered.
ok(wait_until(sub {
	sql('source', "SELECT count(*) FROM tide.relay_consumer_offsets WHERE last_change_id = $last") == 3 }, 60),
	'every pipeline went through every message');
is(sql('source', q{SELECT count(*) > 0 FROM tide.relay_retry_queue})
	. sql('source', q{SELECT count(*) > 0 FROM tide.relay_dlq})
	. sql('source', q{SELECT count(*) > 0 FROM tide.relay_attempts})
	. sql('source', q{SELECT count(*) > 0 FROM tide.relay_pipeline_health})
	. sql('source', q{SELECT count(*) > 0 FROM ONLY tide.tide_outbox_messages})
	. sql('source', q{SELECT count(*) FILTER (WHERE tableoid <> 'tide.tide_outbox_messages'::regclass) > 0 FROM tide.tide_outbox_messages}),
	'tttttt', 'the source has retries, dead letters, attempts, health rows and messages in the parent and in children');

# Every table of schema tide (child tables included), each as one md5 of its
# rows in order.
sub tables
{
	my ($db) = @_;
	return sql($db, q{
		SELECT string_agg(format('%s=%s', c.relname,
			  (xpath('/row/m/text()', query_to_xml(format(
				'SELECT md5(coalesce(string_agg(t::text, %L ORDER BY t::text), %L)) AS m FROM ONLY tide.%I t',
				'|', '', c.relname), false, false, '')))[1]::text), E'\n' ORDER BY c.relname)
		  FROM pg_class c
		 WHERE c.relnamespace = 'tide'::regnamespace AND c.relkind = 'r'});
}

my $source_tables = tables('source');
my $dump = "$dir/source.sql";
my $archive = "$dir/source.dump";
$node->command_ok([ 'pg_dump', '-d', $connstr->('source'), '-f', $dump ], 'pg_dump, plain');
$node->command_ok([ 'pg_dump', '-Fc', '-d', $connstr->('source'), '-f', $archive ], 'pg_dump, custom');
is(tables('source'), $source_tables, 'the source did not change while it was dumped');

# The plain script again, with a pause of a second after the pipelines'
# rows, as a slow disk or a large table there would make: the relay worker
# sees the pipelines long before their consumer groups, offsets and health
# rows arrive.
my $paused = "$dir/source_paused.sql";
my $script = slurp_file($dump);
ok($script =~ s/^(COPY tide\.relay_outbox_config .*?^\\\.\n)/$1SELECT pg_sleep(1);\n/ms,
	'a pause after the pipelines in the plain script');
PostgreSQL::Test::Utils::append_to_file($paused, $script);

my %restore = (
	plain => [ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-f', $dump ],
	plain_paused => [ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-f', $paused ],
	exit_on_error => [ 'pg_restore', '-e', $archive ],
	single_transaction => [ 'pg_restore', '-1', '-e', $archive ],
	parallel => [ 'pg_restore', '-j', '2', '-e', $archive ],
);
my $n = 0;
for my $round (1 .. 2)
{
	for my $how (qw(plain plain_paused exit_on_error single_transaction parallel))
	{
		my $db = "restored_$how\_$round";
		$n++;
		$node->safe_psql('postgres', "CREATE DATABASE $db");
		my @cmd = @{ $restore{$how} };
		splice(@cmd, 1, 0, '-d', $connstr->($db));
		my ($stdout, $stderr) = ('', '');
		my $ok = IPC::Run::run(\@cmd, '>', \$stdout, '2>', \$stderr);
		ok($ok, "$how restore, round $round, succeeds") or diag($stderr);
		is(tables($db), $source_tables, "$how restore, round $round: every row of every table is the source's")
		  or diag(tables($db));
		# the restored database is served: a new message reaches the file
		my $id = sql($db, "SELECT tide.outbox_publish('orders', '{\"restored\": $n}')");
		ok(wait_until(sub { -e $file && slurp_file($file) =~ /"restored":\s*$n\b/ }, 30),
			"$how restore, round $round: the relay delivers a new message");
		# its child tables belong to the extension again
		my ($ret, $out, $err) = $node->psql($db, 'DROP EXTENSION pg_tide');
		is($ret, 0, "$how restore, round $round: DROP EXTENSION without CASCADE") or diag($err);
		is(sql($db, q{SELECT count(*) FROM pg_class WHERE relname LIKE 'tide_outbox_messages%'}), '0',
			"$how restore, round $round: and the child tables went with it");
	}
}

my @errors = grep { /duplicate key|ERROR/ && !/DROP DATABASE/ } split /\n/, slurp_file($node->logfile);
is(scalar(@errors), 0, 'no statement failed in the server log') or diag(join("\n", @errors[0 .. 4]));

$node->stop;
done_testing();
