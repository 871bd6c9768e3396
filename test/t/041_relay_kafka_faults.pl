# The Kafka sink's failures, against librdkafka's mock cluster
# (test/brokers/kafka_mock), read back by a real librdkafka consumer:
#  - kill -9 of the postmaster in the middle of a backlog loses nothing,
#    and repeats at most the batch that was in flight;
#  - the brokers stopped and started again in the middle of a backlog:
#    the pipeline is held with class "connection", nothing is
#    dead-lettered, and once they are back it delivers the rest by itself;
#  - answers slower than timeout_ms: "timeout", retried with back-off,
#    then delivered, nothing dead-lettered;
#  - authentication that fails (SASL against a broker that has none, which
#    librdkafka reports as an authentication failure, as it does refused
#    credentials): the pipeline is held with class "auth", nothing is
#    dead-lettered, and the password is in no error text;
#  - errors the brokers answer (injected by the mock cluster): too large
#    (too_large) and a record they will not take (refused) are
#    dead-lettered with their class; a record broken on its way and an
#    unknown error are class broker, retried, then delivered;
#  - a new reading of the config with the same producer settings keeps the
#    producer (no new producer id asked for); other settings make a new one.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use PgTide::KafkaMock;
use JSON::PP;

my $json = JSON::PP->new->canonical;
my $kafka = PgTide::KafkaMock->new;
my $node = tide_node('kafka_faults', "pg_tide.relay_naptime_ms = 100\nrestart_after_crash = on\n");
my $bs = $kafka->bootstrap;

sub sql { return $node->safe_psql('postgres', $_[0]) }

sub set_pipeline
{
	my ($name, $outbox, $cfg) = @_;
	sql("SELECT tide.relay_set_outbox('$name', '$outbox', '$name', '" . $json->encode($cfg) . "'::jsonb)");
}

# Publishes n messages to an outbox; returns their ids.
sub publish
{
	my ($outbox, $n) = @_;
	return split /\n/, sql("SELECT tide.outbox_publish('$outbox', jsonb_build_object('n', g))
	   FROM generate_series(1, $n) g");
}

# id => copies on the topic.
sub copies
{
	my ($topic) = @_;
	my %seen;
	for my $m ($kafka->consume($topic))
	{
		my ($id) = ($m->{headers}{'tide-id'} // '') =~ /:(\d+)$/;
		$seen{$id}++ if defined $id;
	}
	return \%seen;
}

sub successes
{
	my ($pipeline) = @_;
	return sql("SELECT count(DISTINCT message_id) FROM tide.relay_attempts
	   WHERE pipeline_id = '$pipeline' AND status = 'success'");
}

# Waits until every id is on the topic; returns the copies.
sub wait_all
{
	my ($topic, $ids, $timeout) = @_;
	my $seen;
	wait_until(sub { $seen = copies($topic); !grep { !$seen->{$_} } @$ids }, $timeout, 500);
	return $seen;
}

my $batch = 100;
my %common = (sink_type => 'kafka', bootstrap_servers => $bs, batch_size => $batch,
	max_in_flight => 100, timeout_ms => 2000, retry => { base_ms => 100, cap_ms => 500, max_attempts => 50 },
	attempt_log => JSON::PP::true);

# 1. kill -9 of the postmaster mid-delivery.
sql("SELECT tide.outbox_create('crash')");
$kafka->command("create crash 2");
$kafka->command("rtt 20");
my @ids = publish('crash', 3000);
set_pipeline('crash', 'crash', { %common, topic => 'crash' });
ok(defined wait_until(sub { successes('crash') >= 400 }, 60), 'the backlog is being delivered');
my $before = successes('crash');
$node->kill9;
# (a start fails while the old server's processes still hold its shared
# memory; the node then believes it runs, so it is told otherwise)
ok(defined wait_until(sub { $node->{_pid} = undef; $node->start(fail_ok => 1) }, 30, 500_000),
	'the server starts again after SIGKILL of the postmaster');
my $seen = wait_all('crash', \@ids, 90);
my @missing = grep { !$seen->{$_} } @ids;
my $dups = 0;
$dups += $seen->{$_} - 1 for keys %$seen;
is(scalar(@missing), 0, "after kill -9 (at $before delivered) every one of 3000 messages arrived");
ok($dups <= $batch, "at most the batch in flight arrived twice ($dups duplicates)");
is(sql("SELECT count(*) FROM tide.relay_dlq"), '0', 'nothing was dead-lettered');
$kafka->command("rtt 0");

# 2. The brokers stopped and started again mid-stream.
sql("SELECT tide.outbox_create('outage')");
$kafka->command("create outage 2");
$kafka->command("rtt 10");
@ids = publish('outage', 3000);
set_pipeline('outage', 'outage', { %common, topic => 'outage' });
ok(defined wait_until(sub { successes('outage') >= 300 }, 60), 'the backlog is being delivered');
$kafka->command("down");
ok(defined wait_until(sub {
	sql("SELECT health = 'held' AND last_error_class = 'connection' FROM tide.relay_pipeline_status
	   WHERE pipeline = 'outage'") eq 't' }, 30, 100),
	'with the brokers down the pipeline is held, class connection')
  or diag(sql("SELECT to_jsonb(s) FROM tide.relay_pipeline_status s WHERE pipeline = 'outage'"));
my $held_at = successes('outage');
ok(sql("SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 'outage' AND status = 'failed'
	  AND error_class = 'connection'") > 0, 'relay_attempts records the connection failures');
is(sql("SELECT count(*) FROM tide.relay_dlq"), '0', 'nothing is dead-lettered while the brokers are down');
sleep 3;
$kafka->command("up");
$seen = wait_all('outage', \@ids, 90);
@missing = grep { !$seen->{$_} } @ids;
$dups = 0;
$dups += $seen->{$_} - 1 for keys %$seen;
is(scalar(@missing), 0, "once the brokers are back (down at $held_at delivered) every one of 3000 messages arrived");
ok($dups <= 2 * $batch, "at most the batches cut by the outage arrived twice ($dups duplicates)");
is(sql("SELECT count(*) FROM tide.relay_dlq"), '0', 'nothing was dead-lettered');
ok(defined wait_until(sub {
	sql("SELECT health FROM tide.relay_pipeline_status WHERE pipeline = 'outage'") eq 'healthy' }, 30),
	'the pipeline is healthy again by itself');
$kafka->command("rtt 0");

# 3. Answers slower than timeout_ms (the message timeout is half of it, 1 s,
# which librdkafka checks about once a second).
sql("SELECT tide.outbox_create('slow')");
$kafka->command("create slow 1");
set_pipeline('slow', 'slow', { %common, topic => 'slow' });
my @first = publish('slow', 1);
wait_all('slow', \@first, 30);
$kafka->command("rtt 3000");
@ids = publish('slow', 20);
ok(defined wait_until(sub {
	sql("SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 'slow' AND status = 'failed'
	   AND error_class = 'timeout'") > 0 }, 30, 100),
	'answers slower than timeout_ms are class timeout')
  or diag(sql("SELECT string_agg(DISTINCT coalesce(error_class, '') || ' ' || coalesce(error, ''), E'\\n')
	  FROM tide.relay_attempts WHERE pipeline_id = 'slow'"));
# retried: it waits in the retry queue, or a later attempt of it was made
# (which may have succeeded, and taken it out of the queue, before this looks)
ok(defined wait_until(sub {
	sql("SELECT count(*) FROM tide.relay_retry_queue WHERE pipeline_id = 'slow'") > 0
	  || sql("SELECT count(*) FROM tide.relay_attempts a WHERE a.pipeline_id = 'slow' AND a.attempt > 1
		  AND EXISTS (SELECT FROM tide.relay_attempts t WHERE t.pipeline_id = 'slow' AND t.message_id = a.message_id
		              AND t.status = 'failed' AND t.error_class = 'timeout')") > 0 }, 30, 100),
	'a timed out message is retried');
$kafka->command("rtt 0");
$seen = wait_all('slow', \@ids, 60);
is(scalar(grep { !$seen->{$_} } @ids), 0, 'once the brokers answer in time every message arrives');
is(sql("SELECT count(*) FROM tide.relay_dlq"), '0', 'nothing was dead-lettered');

# 4. Authentication that fails.
sql("SELECT tide.outbox_create('auth')");
set_pipeline('auth', 'auth', { %common, topic => 'auth',
	auth => { mechanism => 'PLAIN', username => 'relay', password => 'hunter2-kafka' } });
# the server log from here on: the statement above, logged by the test's
# log_statement, holds the password
my $log_from = -s $node->logfile;
publish('auth', 5);
ok(defined wait_until(sub {
	sql("SELECT health = 'held' AND last_error_class = 'auth' FROM tide.relay_pipeline_status
	   WHERE pipeline = 'auth'") eq 't' }, 30, 100),
	'a failed authentication holds the pipeline, class auth')
  or diag(sql("SELECT to_jsonb(s) FROM tide.relay_pipeline_status s WHERE pipeline = 'auth'"));
# (before the test's own statements below name it)
my $log = substr(slurp_file($node->logfile), $log_from);
ok(length($log) > 0 && $log !~ /hunter2/, 'the password is not in the server log');
is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'auth'"), '0', 'nothing is dead-lettered');
is(sql("SELECT count(*) FROM tide.relay_attempts WHERE error LIKE '%hunter2%'")
	  + sql("SELECT count(*) FROM tide.relay_pipeline_health WHERE last_error LIKE '%hunter2%'
	      OR held_reason LIKE '%hunter2%'"), 0, 'the password is in no error');


# 5. Errors the brokers answer to a produce request (the mock cluster
# injects them: "error 0 <code> 1" fails the next Produce request): a
# record too large or one the brokers will not take is dead-lettered
# with its class; a record broken on its way and an unknown error are
# retried (class broker), then delivered. One message at a time, so that
# the failed request holds it alone.
sql("SELECT tide.outbox_create('answers')");
$kafka->command("create answers 1");
set_pipeline('answers', 'answers', { %common, topic => 'answers', batch_size => 1 });
wait_all('answers', [ publish('answers', 1) ], 30);
my %answer_of;
for my $case ([ 10, 'too_large' ], [ 87, 'refused' ], [ 44, 'refused' ], [ 2, 'broker' ], [ -1, 'broker' ])
{
	my ($code, $class) = @$case;
	$kafka->command("error 0 $code 1");
	my ($id) = publish('answers', 1);
	$answer_of{$id} = $case;
	wait_until(sub {
		sql("SELECT count(*) FROM tide.relay_attempts WHERE message_id = $id AND pipeline_id = 'answers'
		   AND (status = 'success' OR error_class IS NOT NULL)") > 0 }, 30, 100);
	if ($class eq 'broker')
	{
		ok(defined wait_until(sub { copies('answers')->{$id} }, 30, 200),
			"Kafka error $code: delivered in the end");
		# librdkafka 2.8 and later retry a corrupt record (error 2) themselves
		my $attempts = sql("SELECT string_agg(attempt || ' ' || status || ' ' || coalesce(error_class, ''), ',' ORDER BY id)
			  FROM tide.relay_attempts WHERE message_id = $id AND pipeline_id = 'answers'");
		if ($code == 2 && $attempts eq '1 success ')
		{
			pass("Kafka error $code: retried by librdkafka, delivered at the relay's first attempt");
		}
		else
		{
			is($attempts, '1 failed broker,2 success ', "Kafka error $code: class broker, retried once, then delivered");
		}
	}
	else
	{
		ok(defined wait_until(sub {
			sql("SELECT count(*) FROM tide.relay_dlq WHERE message_id = $id AND pipeline_id = 'answers'") eq '1' }, 30, 100),
			"Kafka error $code: dead-lettered");
		is(sql("SELECT last_error_class FROM tide.relay_dlq WHERE message_id = $id AND pipeline_id = 'answers'")
			  . ' ' . sql("SELECT string_agg(error_class, ',') FROM tide.relay_attempts
				  WHERE message_id = $id AND pipeline_id = 'answers'")
			  . ' ' . sql("SELECT last_error_class FROM tide.relay_pipeline_status WHERE pipeline = 'answers'"),
			"$class $class $class", "Kafka error $code: class $class in relay_dlq, relay_attempts and status");
		ok(!copies('answers')->{$id}, "Kafka error $code: not on the topic");
	}
}
is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'answers'"), '3',
	'only the three refused messages are dead-lettered');

# 6. A new reading of the config keeps the producer when its librdkafka
# settings are the same (here another topic), and makes a new one when
# they differ (linger_ms). Shown with an error the mock cluster answers to
# the next two InitProducerId requests (api key 22,
# CLUSTER_AUTHORIZATION_FAILED, fatal for an idempotent producer): only a
# new producer asks for a producer id, and a message of a new producer
# fails (two, so that a producer made before its first message meets one
# too).
sql("SELECT tide.outbox_create('reread')");
$kafka->command("create reread_a 1");
$kafka->command("create reread_b 1");
my %reread = (%common, batch_size => 10);
set_pipeline('reread', 'reread', { %reread, topic => 'reread_a' });
wait_all('reread_a', [ publish('reread', 1) ], 30);
$kafka->command("error 22 31 2");
set_pipeline('reread', 'reread', { %reread, topic => 'reread_b' });
my ($kept) = publish('reread', 1);
ok(defined wait_all('reread_b', [$kept], 30)->{$kept}, 'after a change of topic the message arrives');
is(sql("SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 'reread' AND message_id = $kept
	  AND status = 'failed'"), '0', 'the same producer delivered it: no producer id asked for, no failure');
set_pipeline('reread', 'reread', { %reread, topic => 'reread_b', linger_ms => 5 });
my ($renewed) = publish('reread', 1);
ok(defined wait_all('reread_b', [$renewed], 60)->{$renewed}, 'after a change of linger_ms the message arrives');
ok(sql("SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 'reread' AND message_id = $renewed
	  AND status = 'failed'") > 0, 'a new producer delivered it, after the producer id it asked for was refused')
  or diag(sql("SELECT string_agg(attempt || ' ' || status || ' ' || coalesce(error_class, '') || ' ' || coalesce(error, ''), E'\\n' ORDER BY id)
	  FROM tide.relay_attempts WHERE pipeline_id = 'reread'"));

$node->stop;
$kafka->stop;
done_testing();
