# DROP EXTENSION pg_tide while the relay worker delivers to every sink type
# (webhook, file, Kafka, NATS, Redis, RabbitMQ, MQTT), 20 times, the
# extension created anew after each: every DROP succeeds (no deadlock with
# the worker's leases, records, partitions or health rows: the worker
# takes the extension's lock first, as DROP does), the worker leaves
# cleanly each time (no error, no crash) and delivery resumes after each
# CREATE EXTENSION.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use PgTide::Receiver;
use PgTide::KafkaMock;
use PgTide::NatsServer;
use PgTide::Redis;
use PgTide::Mosquitto;
use PgTide::RabbitMQ;
use JSON::PP;
use Time::HiRes qw(time);

my $rounds = 20;
my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new->canonical;

# CI installs every broker: one missing fails the test rather than skips it
my $receiver = PgTide::Receiver->new(dir => $dir, log => 0);
$receiver->start;
my $kafka = PgTide::KafkaMock->new;
my $nats = PgTide::NatsServer->new(dir => $dir);
$nats->start;
my $redis = PgTide::Redis->new(dir => $dir);
$redis->start;
my $mqtt = PgTide::Mosquitto->new(dir => $dir);
$mqtt->start;
my $rabbit = PgTide::RabbitMQ->new(dir => $dir);
ok($rabbit->start, 'rabbitmq-server runs on 127.0.0.1') or BAIL_OUT('rabbitmq-server did not start');

# A short deadlock_timeout: a deadlock, should there be one, is found (and
# logged) within the round.
my $node = tide_node('dropext',
	"pg_tide.relay_naptime_ms = 100\ndeadlock_timeout = 100ms\nlog_min_messages = log\n");

sub sql { return $node->safe_psql('postgres', $_[0]) }

my %sinks = (
	to_webhook => { sink_type => 'webhook', url => $receiver->url, allow_http => JSON::PP::true,
		allow_private_network => JSON::PP::true },
	to_file => { sink_type => 'file', path => "$dir/orders.jsonl" },
	to_kafka => { sink_type => 'kafka', bootstrap_servers => $kafka->bootstrap, topic => 'orders' },
	to_nats => { sink_type => 'nats', servers => $nats->url, subject => 'orders.all' },
	to_redis => { sink_type => 'redis', url => $redis->url, stream => 'orders' },
	to_mqtt => { sink_type => 'mqtt', host => '127.0.0.1', port => $mqtt->port, topic => 'orders' },
	to_rabbitmq => { sink_type => 'rabbitmq', host => '127.0.0.1', port => $rabbit->port,
		auth => { username => 'guest', password => 'guest' }, exchange => 'amq.fanout', routing_key => 'orders' },
);
my $npipelines = scalar(keys %sinks);

# The outbox and a pipeline of each sink type, small batches: the worker
# leases and records all the time.
sub configure
{
	sql("SELECT tide.outbox_create('orders')");
	for my $name (sort keys %sinks)
	{
		my $cfg = $json->encode({ %{ $sinks{$name} }, batch_size => 20 });
		sql("SELECT tide.relay_set_outbox('$name', 'orders', '$name', '$cfg'::jsonb)");
	}
}

sub publish
{
	my ($n) = @_;
	sql("SELECT count(tide.outbox_publish('orders', jsonb_build_object('n', g))) FROM generate_series(1, $n) g");
}

# How many pipelines recorded a delivery since the extension was created.
sub pipelines_delivered
{
	return sql("SELECT count(*) FROM tide.relay_consumer_offsets WHERE last_change_id > 0");
}

configure();
my ($dropped, $resumed, @failures) = (0, 0);
my $start = time();
for my $round (1 .. $rounds)
{
	publish(300);
	# every pipeline delivers: the worker serves the new extension
	$resumed++ if wait_until(sub { pipelines_delivered() == $npipelines }, 30, 50_000);
	# more, so that the drop meets leases, records and partitions in flight
	publish(300);
	my $timed_out = 0;
	my ($ret, $out, $err) = $node->psql('postgres', 'DROP EXTENSION pg_tide',
		timeout => 30, timed_out => \$timed_out);
	if ($ret == 0 && !$timed_out) { $dropped++ }
	else
	{
		push @failures, "round $round: " . ($timed_out ? 'DROP EXTENSION waited 30 s' : $err);
		# out of the way for the next round, however long it takes
		$node->psql('postgres', 'DROP EXTENSION IF EXISTS pg_tide CASCADE', timeout => 60);
		last if sql("SELECT count(*) FROM pg_extension WHERE extname = 'pg_tide'") ne '0';
	}
	# the worker leaves; the next CREATE EXTENSION starts another
	wait_until(sub { sql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_tide relay worker'") == 0 }, 30)
	  or push @failures, "round $round: the worker did not leave";
	sql('CREATE EXTENSION pg_tide');
	configure();
}
note(sprintf('%d rounds in %.1f s', $rounds, time() - $start));
is($dropped, $rounds, "every DROP EXTENSION succeeded during delivery ($rounds rounds)")
  or diag(join("\n", @failures));
is($resumed, $rounds, 'after every CREATE EXTENSION, every pipeline (every sink type) delivered');

publish(10);
ok(wait_until(sub { pipelines_delivered() == $npipelines }, 30, 50_000),
	'the last extension is served too');

# The server log's lines that match $re (the first 5 shown when any).
sub log_lines
{
	my ($re) = @_;
	my @lines = grep { /$re/ } split /\n/, slurp_file($node->logfile);
	diag(join("\n", @lines[ 0 .. ($#lines < 4 ? $#lines : 4) ])) if @lines;
	return scalar(@lines);
}
is(log_lines(qr/deadlock detected/), 0, 'no deadlock was detected');
# (a worker's statement racing the drop fails: "could not open relation")
is(log_lines(qr/stops after an error|stopped this pass after an error|could not look for messages/), 0,
	'no turn of the worker ended in an error');
is(log_lines(qr/terminated by signal|exited with exit code [1-9]/), 0, 'no process crashed or failed');
is(sql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_tide relay worker'"), '1',
	'one relay worker serves the database');

$node->stop;
done_testing();
