# A running relay worker sees settings given with ALTER DATABASE ... SET
# after pg_reload_conf(), as docs/configuration.md tells a user to set
# pg_tide.operator_events_outbox: set, changed and RESET, each reaches the
# worker that was already running, without a restart. Each step starts a
# new pipeline to a port where nothing listens, so that its failures in a
# row reach alerts.failure_threshold and publish pipeline.failing events to
# whatever outbox the worker's setting names at that moment. That a
# database owner's settings still do not steer the worker after a reload is
# checked in TAP 022.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);

my $node = tide_node('database_settings', "pg_tide.relay_naptime_ms = 100\n");
my $nobody = PostgreSQL::Test::Cluster::get_free_port();

sub sql { return $node->safe_psql('postgres', $_[0]) }

sql("SELECT tide.outbox_create(o) FROM unnest(ARRAY['orders', 'ops', 'ops2']) o");

# The worker of the first pipeline (a database without one has none,
# relay/on_demand.c).
my $worker;

# A new pipeline to a port where nothing listens, and a message for it.
sub failing_pipeline
{
	my ($name) = @_;
	sql("SELECT tide.relay_set_outbox('$name', 'orders', 'g_$name', jsonb_build_object(
		  'sink_type', 'webhook', 'url', 'http://127.0.0.1:$nobody/$name', 'allow_http', true,
		  'allow_private_network', true, 'batch_size', 1,
		  'retry', jsonb_build_object('base_ms', 20, 'cap_ms', 50),
		  'alerts', jsonb_build_object('failure_threshold', 4)))");
	sql("SELECT tide.outbox_publish('orders', '{\"for\": \"$name\"}')");
	return wait_until(
		sub {
			sql("SELECT coalesce(max(consecutive_failures), 0) >= 6 FROM tide.relay_pipeline_health
				  WHERE pipeline_id = '$name'") eq 't';
		},
		30);
}

# The events of a pipeline in an outbox: their percents, in order.
sub events
{
	my ($outbox, $pipeline) = @_;
	return sql("SELECT coalesce(string_agg(payload ->> 'event' || ':' || coalesce(payload ->> 'percent', ''), ',' ORDER BY id), '')
				  FROM tide.tide_outbox_messages
				 WHERE outbox_name = '$outbox' AND payload ->> 'pipeline' = '$pipeline'");
}

# Reloads and waits until the worker has had a pass after the reload.
sub reload
{
	my $passes = sql("SELECT passes FROM tide.relay_workers() WHERE pid = $worker");
	sql('SELECT pg_reload_conf()');
	wait_until(sub { sql("SELECT passes FROM tide.relay_workers() WHERE pid = $worker") > $passes + 2 }, 10);
}

# Not set: no events anywhere.
ok(failing_pipeline('down1'), 'down1 failed 6 times in a row');
$worker = sql("SELECT pid FROM tide.relay_workers() WHERE database = 'postgres'");
ok($worker, 'the relay worker runs');
is(events('ops', 'down1') . events('ops2', 'down1'), '', 'no setting: no operator events');

# Set on the database and reloaded: the running worker publishes to 'ops'.
sql("ALTER DATABASE postgres SET pg_tide.operator_events_outbox = 'ops'");
reload();
ok(failing_pipeline('down2'), 'down2 failed 6 times in a row');
is(events('ops', 'down2'), 'pipeline.failing:50,pipeline.failing:70,pipeline.failing:90,pipeline.failing:100',
	'ALTER DATABASE ... SET and a reload: the events reach outbox ops');

# Changed: now 'ops2'.
sql("ALTER DATABASE postgres SET pg_tide.operator_events_outbox = 'ops2'");
reload();
ok(failing_pipeline('down3'), 'down3 failed 6 times in a row');
is(events('ops', 'down3'), '', 'changed: no event of down3 in ops');
is(events('ops2', 'down3'), 'pipeline.failing:50,pipeline.failing:70,pipeline.failing:90,pipeline.failing:100',
	'changed and reloaded: the events reach outbox ops2');

# RESET: no events any more.
sql("ALTER DATABASE postgres RESET pg_tide.operator_events_outbox");
reload();
ok(failing_pipeline('down4'), 'down4 failed 6 times in a row');
is(events('ops', 'down4') . events('ops2', 'down4'), '', 'RESET and reloaded: no operator events');

# A value of the configuration file comes back when the database's goes.
$node->append_conf('postgresql.conf', "pg_tide.operator_events_outbox = 'ops'\n");
sql("ALTER DATABASE postgres SET pg_tide.operator_events_outbox = 'ops2'");
reload();
ok(failing_pipeline('down5'), 'down5 failed 6 times in a row');
is(events('ops', 'down5'), '', 'the database setting wins over the file');
isnt(events('ops2', 'down5'), '', 'the database setting: events in ops2');
sql("ALTER DATABASE postgres RESET pg_tide.operator_events_outbox");
reload();
ok(failing_pipeline('down6'), 'down6 failed 6 times in a row');
is(events('ops', 'down6'), 'pipeline.failing:50,pipeline.failing:70,pipeline.failing:90,pipeline.failing:100',
	'RESET on the database: the file value is back');
is(events('ops2', 'down6'), '', 'and nothing in ops2');

is(sql("SELECT pid FROM tide.relay_workers() WHERE database = 'postgres'"), $worker,
	'the same worker all along');

done_testing();
