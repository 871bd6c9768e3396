# Delivery operations with a live relay worker and receiver: the failures in
# a row reach the pipeline's alerts.failure_threshold and publish operator
# events at 50, 70, 90 and 100 % into the outbox pg_tide.operator_events_outbox
# names, and auto_disable disables the pipeline; relay_retry_message shows
# as a manual attempt in relay_attempts; relay_replay redelivers a range
# without moving the offset; relay_pipeline_status tells what happened.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode;
use PgTide::Receiver;
use JSON::PP;

my $node = tide_node('operations',
	"pg_tide.relay_naptime_ms = 100\npg_tide.operator_events_outbox = 'ops'\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $rcv = PgTide::Receiver->new(dir => $dir);
$rcv->start;
my $port = $rcv->port;

sub sql { return $node->safe_psql('postgres', $_[0]) }

# Message ids acknowledged (200) at the receiver, with how many times.
sub delivered
{
	my %seen;
	for my $r ($rcv->requests)
	{
		next unless $r->{status} == 200 && $r->{path} eq '/hook';
		$seen{ decode_json($r->{body})->{message_id} }++;
	}
	return \%seen;
}

sql("SELECT tide.outbox_create('orders')");
sql("SELECT tide.outbox_create('ops')");
sql("SELECT tide.relay_set_outbox('hook', 'orders', 'hook', jsonb_build_object(
	  'sink_type', 'webhook', 'url', 'http://127.0.0.1:$port/hook', 'allow_http', true,
	  'allow_private_network', true, 'max_in_flight', 1, 'batch_size', 1,
	  'retry', jsonb_build_object('base_ms', 20, 'cap_ms', 50, 'max_attempts', 100),
	  'alerts', jsonb_build_object('failure_threshold', 10, 'auto_disable', true)))");

# Healthy first: delivered, counted in the status view.
my @ids = split /\n/, sql("SELECT tide.outbox_publish('orders', jsonb_build_object('n', g)) FROM generate_series(1, 3) g");
ok($node->poll_query_until('postgres', "SELECT offset_id = $ids[-1] FROM tide.relay_pipeline_status"),
	'three messages delivered');
is(sql("SELECT health || ' ' || consecutive_failures || ' ' || delivered_last_minute || ' ' || lag_messages
		  FROM tide.relay_pipeline_status"), 'healthy 0 3 0', 'relay_pipeline_status: healthy, 3 delivered in the last minute');

# The receiver answers 503: the failures in a row climb to the threshold.
$rcv->control({ always => 503 });
my ($bad) = split /\n/, sql("SELECT tide.outbox_publish('orders', '{\"n\": 99}')");
ok($node->poll_query_until('postgres', "SELECT NOT enabled FROM tide.relay_outbox_config WHERE name = 'hook'"),
	'auto_disable disables the pipeline at the threshold');
is(sql("SELECT health || ' ' || consecutive_failures || ' ' || last_status || ' ' || last_error_class
		  FROM tide.relay_pipeline_status"), 'disabled 10 503 http_5xx',
	'relay_pipeline_status: disabled after 10 failures, the last 503');
is(sql("SELECT string_agg(coalesce(payload ->> 'percent', payload ->> 'event'), ',' ORDER BY id)
		  FROM tide.tide_outbox_messages WHERE outbox_name = 'ops'"), '50,70,90,100,pipeline.disabled',
	'operator events at 50, 70, 90, 100 % and pipeline.disabled, in order');
is(sql("SELECT count(*) FROM tide.tide_outbox_messages WHERE outbox_name = 'ops'
		   AND headers ->> 'type' LIKE 'pg_tide.pipeline.%' AND payload ->> 'pipeline' = 'hook'"), '5',
	'each event names the pipeline and carries its type in the headers');
my $attempts_bad = sql("SELECT count(*) FROM tide.relay_attempts WHERE message_id = $bad AND status = 'failed'");
cmp_ok($attempts_bad, '>=', 10, "relay_attempts shows the failed attempts ($attempts_bad)");

# Enabled again with the receiver well: the message arrives, the event says so.
$rcv->control({ always => undef });
sql("SELECT tide.relay_enable('hook')");
ok($node->poll_query_until('postgres', "SELECT offset_id = $bad AND health = 'healthy' FROM tide.relay_pipeline_status"),
	'enabled again, the failing message is delivered and the pipeline is healthy');
is(sql("SELECT payload ->> 'event' FROM tide.tide_outbox_messages WHERE outbox_name = 'ops' ORDER BY id DESC LIMIT 1"),
	'pipeline.enabled', 'a pipeline.enabled event');

# relay_retry_message: a manual attempt, in relay_attempts, offset unchanged.
my $offset = sql("SELECT offset_id FROM tide.relay_pipeline_status");
sql("SELECT tide.relay_retry_message('hook', $ids[0])");
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM tide.relay_attempts WHERE message_id = $ids[0] AND manual AND status = 'success'"),
	'relay_retry_message shows as a manual successful attempt in relay_attempts');
is(delivered()->{ $ids[0] }, 2, 'the receiver got the message a second time');
is(sql("SELECT offset_id FROM tide.relay_pipeline_status"), $offset, 'the offset did not move');

# relay_replay: a range again, offset unchanged, the retry queue empties.
is(sql("SELECT tide.relay_replay('hook', $ids[0], $ids[2])"), '3', 'relay_replay queues the three');
ok($node->poll_query_until('postgres', "SELECT retry_queue = 0 FROM tide.relay_pipeline_status"),
	'the replayed messages are delivered');
is(join(',', map { delivered()->{$_} } @ids), '3,2,2', 'each of the range arrived once more');
is(sql("SELECT offset_id FROM tide.relay_pipeline_status"), $offset, 'the live offset stayed');

$rcv->stop;
$node->stop;
done_testing();
