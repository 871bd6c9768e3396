# More databases with pg_tide than pg_tide.max_relay_workers allows: the
# database left without a worker is logged once (with its name, the limit
# and a hint), not on every launcher pass; tide._relay_serving_state() and
# tide.relay_pipeline_status there say stopped, no relay worker slot free; when the other database drops pg_tide, the
# waiting one gets the worker, the launcher logs that, and it delivers. With
# relay_workers_per_database = 2, a database's second worker makes room for
# a database that has none. A worker that stops on an error waits out its
# back-off.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until keep_relay_worker);

my $node = tide_node('more_databases',
	"pg_tide.relay_naptime_ms = 100\npg_tide.max_relay_workers = 1\n");
my $dir = PostgreSQL::Test::Utils::tempdir;

sub sql { return $node->safe_psql($_[0], $_[1]) }

# How often the log says $pattern.
sub log_count
{
	my ($pattern) = @_;
	my @hits = slurp_file($node->logfile) =~ /$pattern/g;
	return scalar @hits;
}

# Waits until the state of $db is $state; returns the last state seen.
sub wait_for_state
{
	my ($db, $state) = @_;
	my $seen = '';
	wait_until(sub { ($seen = sql($db, 'SELECT state FROM tide._relay_serving_state()')) eq $state }, 30, 100_000);
	return $seen;
}

my $unserved = qr/LOG:  pg_tide relay has no worker for database "app": all 1 relay workers are in use/;
my $hint = qr/HINT:  Raise pg_tide.max_relay_workers and max_worker_processes/;
my $served_again = qr/LOG:  pg_tide relay has a worker for database "app" again/;

# postgres holds a worker only with an enabled pipeline (relay/on_demand.c)
keep_relay_worker($node, 'postgres');
is(wait_for_state('postgres', 'serving'), 'serving', 'database postgres is served by the one worker');

sql('postgres', 'CREATE DATABASE app');
sql('app', 'CREATE EXTENSION pg_tide');
sql('app', "SELECT tide.outbox_create('orders')");
sql('app', "SELECT tide.relay_set_outbox('to_file', 'orders', 'to_file',
	  jsonb_build_object('sink_type', 'file', 'path', '$dir/app.jsonl'))");
sql('app', "SELECT tide.outbox_publish('orders', '{\"n\": 1}')");

ok(wait_until(sub { log_count($unserved) > 0 }, 30), 'the launcher logs that database app has no worker');
like(slurp_file($node->logfile), qr/$unserved.*\n(.*\n)?.*$hint/, 'with a hint to raise the limits');
is(sql('app', 'SELECT state || \': \' || reason FROM tide._relay_serving_state()'),
	'stopped: no relay worker slot is free (pg_tide.max_relay_workers = 1)',
	'tide._relay_serving_state() in app: stopped, no slot free');
is(sql('app', "SELECT health || ': ' || reason FROM tide.relay_pipeline_status WHERE pipeline = 'to_file'"),
	'stopped: no relay worker slot is free (pg_tide.max_relay_workers = 1)',
	'relay_pipeline_status in app: the pipeline is stopped, and why');
# The launcher looks every 3 s; four more passes log nothing more.
sleep(12);
is(log_count($unserved), 1, 'logged once, not on every pass');
ok(!-e "$dir/app.jsonl", 'nothing delivered in app meanwhile');
is(sql('app', 'SELECT count(*) FROM tide.relay_workers() WHERE database = \'app\''), '0', 'no worker for app');

# postgres drops pg_tide: its worker leaves, app gets the slot and delivers.
sql('postgres', 'DROP EXTENSION pg_tide');
is(wait_for_state('app', 'serving'), 'serving', 'app is served once postgres has dropped pg_tide');
ok(wait_until(sub { log_count($served_again) == 1 }, 10), 'the launcher logs that app has a worker again');
ok(wait_until(sub { -s "$dir/app.jsonl" }, 20), 'and app delivers its message');

# With two workers per database and two slots, a database's second worker
# makes room for a database that has none.
$node->append_conf('postgresql.conf', "pg_tide.max_relay_workers = 2\npg_tide.relay_workers_per_database = 2\n");
$node->restart;
ok( wait_until(
		sub { sql('app', "SELECT count(*) FROM tide.relay_workers() WHERE database = 'app'") eq '2' },
		30),
	'app has two workers with two slots');
sql('postgres', 'CREATE EXTENSION pg_tide');
keep_relay_worker($node, 'postgres');
is(wait_for_state('postgres', 'serving'), 'serving', 'postgres is served too');
is(sql('postgres', "SELECT string_agg(database || ':' || worker_index, ' ' ORDER BY database)
					  FROM tide.relay_workers()"), 'app:0 postgres:0',
	'app gave up its second worker: one each');

# A worker that stops on an error is started again only after its 10 s
# back-off, also in a database the launcher knows has pg_tide: here its
# reading of the pipelines fails (recording that a pipeline's secret cannot
# be read fails in a trigger).
sql('app', "CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS
	  \$\$BEGIN RAISE EXCEPTION 'refused by test'; END\$\$;
	CREATE TRIGGER refuse BEFORE INSERT ON tide.relay_pipeline_health
	  FOR EACH ROW EXECUTE FUNCTION public.refuse()");
my $errors = qr/LOG:  pg_tide relay worker for database \d+ stops after an error/;
my $before = log_count($errors);
sql('app', "SELECT tide.relay_set_outbox('no_secret', 'orders', 'no_secret', jsonb_build_object(
	  'sink_type', 'webhook', 'url', 'http://127.0.0.1:1/x', 'allow_http', true, 'allow_private_network', true,
	  'signing_secret', jsonb_build_object('env', 'PG_TIDE_TEST_UNSET')))");
ok(wait_until(sub { log_count($errors) > $before }, 10), 'the worker of app stops on the error');
sleep(7);
is(log_count($errors), $before + 1, 'and is not started again within its back-off');
sql('app', 'DROP TRIGGER refuse ON tide.relay_pipeline_health');
is(wait_for_state('app', 'serving'), 'serving', 'once the error is gone, app is served again');

done_testing();
