# Delivery operations with a live relay worker and receiver: the failures in
# a row reach the pipeline's alerts.failure_threshold and publish operator
# events at 50, 70, 90 and 100 % into the outbox pg_tide.operator_events_outbox
# names, and auto_disable disables the pipeline; relay_retry_message shows
# as a manual attempt in relay_attempts; relay_replay redelivers a range
# without moving the offset; relay_pipeline_status tells what happened; a
# rate limit holds the rate within 20 %; a circuit breaker opens, probes
# when half-open and closes; type and content filters pass messages over.
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

# Rate limit: 50 messages a second with a burst of 5. After the burst, the
# rate at the receiver is within 20 % of the setting.
my $rcv2 = PgTide::Receiver->new(dir => $dir);
$rcv2->start;
my $port2 = $rcv2->port;
sql("SELECT tide.outbox_create('paced')");
sql("SELECT tide.relay_set_outbox('paced', 'paced', 'paced', jsonb_build_object(
	  'sink_type', 'webhook', 'url', 'http://127.0.0.1:$port2/paced', 'allow_http', true,
	  'allow_private_network', true, 'batch_size', 100,
	  'rate_limit', jsonb_build_object('per_second', 50, 'burst', 5)))");
sql("SELECT tide.outbox_publish('paced', jsonb_build_object('n', g)) FROM generate_series(1, 200) g");
ok($rcv2->wait_for(sub { scalar(grep { $_->{path} eq '/paced' } @{ $_[0] }) >= 200 }, 30),
	'rate limit: all 200 arrive');
my @t = sort { $a <=> $b } map { $_->{t} } grep { $_->{path} eq '/paced' } $rcv2->requests;
my $rate = (@t - 5) / ($t[-1] - $t[0]);
note(sprintf('rate limit 50/s, burst 5: %.1f messages/s after the burst', $rate));
ok($rate >= 40 && $rate <= 60, sprintf('the rate is within 20 %% of 50/s (%.1f)', $rate));
ok(scalar(grep { $_ - $t[0] < 0.05 } @t) <= 10, 'the burst is bounded');

# Circuit breaker: three failed attempts in a row open it; nothing is sent
# for the cooldown; then one probe (half-open); a failed probe opens it
# again for twice as long; a successful probe closes it.
sql("SELECT tide.outbox_create('brk')");
$rcv2->control({ always => 503 });
sql("SELECT tide.relay_set_outbox('brk', 'brk', 'brk', jsonb_build_object(
	  'sink_type', 'webhook', 'url', 'http://127.0.0.1:$port2/brk', 'allow_http', true,
	  'allow_private_network', true, 'max_in_flight', 1,
	  'retry', jsonb_build_object('base_ms', 20, 'cap_ms', 40, 'max_attempts', 100),
	  'breaker', jsonb_build_object('failure_threshold', 3, 'cooldown_ms', 1500)))");
my $log_offset = -s $node->logfile;
sql("SELECT tide.outbox_publish('brk', '{\"n\": 1}')");
ok($node->poll_query_until('postgres', "SELECT health = 'breaker_open' FROM tide.relay_pipeline_status WHERE pipeline = 'brk'"),
	'three failures open the breaker (relay_pipeline_status health breaker_open)');
ok($rcv2->wait_for(sub { scalar(grep { $_->{path} eq '/brk' } @{ $_[0] }) >= 5 }, 20),
	'a probe follows, and fails, and another');
my @b = sort { $a <=> $b } map { $_->{t} } grep { $_->{path} eq '/brk' } $rcv2->requests;
note(sprintf('breaker: attempts at +%s s', join(', +', map { sprintf('%.2f', $_ - $b[0]) } @b)));
ok($b[2] - $b[0] < 1, 'the first three attempts come quickly');
ok($b[3] - $b[2] >= 1.4, sprintf('nothing is sent while the breaker is open (%.2f s)', $b[3] - $b[2]));
ok($b[4] - $b[3] >= 2.9, sprintf('after a failed probe it stays open twice as long (%.2f s)', $b[4] - $b[3]));
$rcv2->control({ always => undef });
ok($node->poll_query_until('postgres',
		"SELECT health = 'healthy' AND breaker = 'closed' AND retry_queue = 0
		   FROM tide.relay_pipeline_status WHERE pipeline = 'brk'"),
	'a successful probe closes the breaker and the message is delivered');
my $blog = slurp_file($node->logfile, $log_offset);
like($blog, qr/pipeline "brk": circuit breaker open after 3 failed attempts in a row/, 'the log says the breaker opened');
like($blog, qr/pipeline "brk": circuit breaker half-open/, 'and went half-open');
like($blog, qr/pipeline "brk": circuit breaker closed/, 'and closed');

# Routing: types order.* and a content filter; the others advance the
# offset without delivery and are counted.
sql("SELECT tide.outbox_create('routed')");
sql("SELECT tide.relay_set_outbox('routed', 'routed', 'routed', jsonb_build_object(
	  'sink_type', 'webhook', 'url', 'http://127.0.0.1:$port2/routed', 'allow_http', true,
	  'allow_private_network', true,
	  'types', jsonb_build_array('order.*'),
	  'filter', jsonb_build_object('\$or', jsonb_build_array(
		  jsonb_build_object('amount', jsonb_build_object('\$gte', 100)),
		  jsonb_build_object('vip', true)))))");
my @routed = split /\n/, sql("SELECT tide.outbox_publish('routed', jsonb_build_object('n', g, 'amount', g * 30, 'vip', g = 1),
								 jsonb_build_object('type', CASE WHEN g % 2 = 0 THEN 'order.paid' ELSE 'order.item.added' END))
							FROM generate_series(1, 8) g
						   UNION ALL
						  SELECT tide.outbox_publish('routed', jsonb_build_object('n', 9, 'amount', 500), jsonb_build_object('type', 'invoice.sent'))
						   UNION ALL
						  SELECT tide.outbox_publish('routed', jsonb_build_object('n', 10, 'amount', 500))");
ok($node->poll_query_until('postgres', "SELECT offset_id = $routed[-1] FROM tide.relay_pipeline_status WHERE pipeline = 'routed'"),
	'routing: the offset passes every message');
my @got = sort { $a <=> $b } map { decode_json($_->{body})->{payload}{n} } grep { $_->{path} eq '/routed' } $rcv2->requests;
is(join(',', @got), '1,4,5,6,7,8', 'only order.* messages with amount >= 100 or vip arrive');
is(sql("SELECT filtered FROM tide.relay_pipeline_status WHERE pipeline = 'routed'"), '4',
	'the four filtered-out messages are counted');
is(sql("SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 'routed'"), '6',
	'filtered-out messages have no attempts');

$rcv2->stop;
$rcv->stop;
$node->stop;
done_testing();
