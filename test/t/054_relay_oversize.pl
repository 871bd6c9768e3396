# A message larger than a broker takes is the message's own failure:
# dead-lettered once as too_large, whatever the broker does with the
# connection, and the messages behind it are delivered.
#
# For each broker, started with a small limit (Redis proto-max-bulk-len
# 1 MB, NATS max_payload 1 MB (its default), MQTT max_packet_size 1 MB,
# Kafka message.max.bytes 1 MB), a pipeline whose first message has a
# 20 MB payload and 50 ordinary ones behind it:
#  - the large one is dead-lettered with reason permanent and class
#    too_large after one attempt (Redis closed the connection while the
#    relay was still writing it, which was taken for a lost connection:
#    the pipeline held, and the message was sent again and again);
#  - the 50 others reach the broker;
#  - the worker's private memory afterwards is within 16 MB of its memory
#    at rest (less than one large message kept).
# RabbitMQ (max_message_size) has the same case in test/t/046_relay_rabbitmq.pl.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use PgTide::Redis;
use PgTide::NatsServer;
use PgTide::Mosquitto;
use PgTide::KafkaMock;
use JSON::PP;

my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new->canonical;

my $redis = PgTide::Redis->new(dir => $dir);
$redis->start;
$redis->cli('CONFIG', 'SET', 'proto-max-bulk-len', '1mb');
my $nats = PgTide::NatsServer->new(dir => $dir);
$nats->start;
$nats->create_stream('BIG', 'big.>', 120);
my $mq = PgTide::Mosquitto->new(dir => $dir, conf => "max_packet_size 1048576\n");
$mq->start;
my $kafka = PgTide::KafkaMock->new;
$kafka->command('create big 1');

# (pg_tide.max_payload_bytes, 1 MB by default, is raised for the large payloads)
my $node = tide_node('oversize', "pg_tide.relay_naptime_ms = 100\npg_tide.max_payload_bytes = 33554432\n");

sub sql { return $node->safe_psql('postgres', $_[0]) }

my $retry = { base_ms => 50, cap_ms => 200, max_attempts => 100 };
my %pipelines = (
	redis => { sink_type => 'redis', url => $redis->url, stream => 'big' },
	nats => { sink_type => 'nats', servers => $nats->url, subject => 'big.x' },
	mqtt => { sink_type => 'mqtt', host => '127.0.0.1', port => $mq->port, topic => 'big' },
	kafka => { sink_type => 'kafka', bootstrap_servers => $kafka->bootstrap, topic => 'big',
		producer => { 'message.max.bytes' => 1048576 } });
my $sub = $mq->subscribe('big');

# The relay worker's private memory (kB).
sub worker_private_kb
{
	my $pid = sql("SELECT pid FROM pg_stat_activity WHERE backend_type LIKE 'pg_tide relay worker%' LIMIT 1");
	open(my $fh, '<', "/proc/$pid/smaps_rollup") or return undef;
	my $kb = 0;
	while (<$fh>) { $kb += $1 if /^Private_(?:Clean|Dirty):\s+(\d+) kB/ }
	return $kb;
}

# Each pipeline delivers a first message, so that the worker has loaded
# and connected everything before its memory at rest is read.
for my $p (sort keys %pipelines)
{
	sql("SELECT tide.outbox_create('$p')");
	sql("SELECT tide.outbox_publish('$p', '{\"first\": 1}')");
	my $c = $json->encode({ %{ $pipelines{$p} }, retry => $retry });
	sql("SELECT tide.relay_set_outbox('$p', '$p', '$p', '$c'::jsonb)");
}
ok(defined wait_until(sub { sql("SELECT count(*) FROM tide.relay_pipeline_status WHERE last_success_at IS NOT NULL") == keys %pipelines }, 60, 200_000),
	'each pipeline delivered its first message');
my $rest_kb = worker_private_kb();

# Per pipeline: the large message's id, then the 50 others'.
my %ids;
for my $p (sort keys %pipelines)
{
	@{ $ids{$p} } = split /\n/, sql(qq{SELECT tide.outbox_publish('$p', jsonb_build_object('pad', repeat('x', 20000000)));
		SELECT tide.outbox_publish('$p', jsonb_build_object('n', g)) FROM generate_series(1, 50) g});
}

# What each broker holds of the 50 ordinary messages.
my %arrived = (
	redis => sub { ($redis->cli('XLEN', 'big') // 0) - 1 },
	nats => sub { $nats->count('BIG') - 1 },
	mqtt => sub { my $m = $mq->by_id($sub); scalar grep { $m->{$_} } @{ $ids{mqtt} } },
	kafka => sub { (grep { length($_->{body}) < 1000 } $kafka->consume('big')) - 1 });

for my $p (sort keys %pipelines)
{
	my ($large, @rest) = @{ $ids{$p} };
	ok(defined wait_until(sub { sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = '$p'") == 1 }, 30, 100_000),
		"$p: the large message is dead-lettered");
	is(sql("SELECT message_id || ':' || reason || ':' || last_error_class FROM tide.relay_dlq WHERE pipeline_id = '$p'"),
		"$large:permanent:too_large", "$p: as too_large, permanent");
	is(sql("SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = '$p' AND message_id = $large"), '1',
		"$p: after one attempt");
	ok(defined wait_until(sub { $arrived{$p}->() >= 50 }, 30, 200_000), "$p: the 50 messages behind it arrive")
	  or diag("$p: " . $arrived{$p}->() . ' arrived; '
		  . sql("SELECT health || ' ' || coalesce(last_error_class, '') || ' ' || coalesce(last_error, '')
				   FROM tide.relay_pipeline_status WHERE pipeline = '$p'"));
}

# The memory of the large messages is given back once they are done: the
# worker's private memory comes back within one large message of its rest
# (the worker returns freed memory after a second without a batch in
# flight, worker_memory.c).
my $after_kb;
wait_until(sub { $after_kb = worker_private_kb(); $after_kb < $rest_kb + 16 * 1024 }, 10, 200_000);
note("the worker's private memory: $rest_kb kB at rest, $after_kb kB after the large messages");
cmp_ok($after_kb, '<', $rest_kb + 16 * 1024, 'the worker gave the large messages\' memory back');

my $log = slurp_file($node->logfile);
unlike($log, qr/terminated by signal/, 'no server process crashed');

$mq->shutdown;
$kafka->stop;
$nats->stop;
$redis->stop;
done_testing();
