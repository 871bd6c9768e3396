# A pipeline's delivery counters in tide.relay_pipeline_status (delivered,
# failed, failed_by_class, retried, dead_lettered, delivered_last_minute)
# do not depend on the attempt log:
#
#  1. A redis pipeline with its default "attempt_log": "failures" delivers
#     300 messages and dead-letters two (WRONGTYPE: refused; a template
#     without its header: template): the counters agree exactly with the
#     entries the broker's own client (test/brokers/redis_read) reads and
#     with the dead letters, while the attempt log holds the failures alone.
#  2. A webhook pipeline, also with "attempt_log": "failures", answered 500
#     (queued again) then 200, and 400 (dead-lettered): the counters agree
#     exactly with the answers the receiver logged.
#  3. The worker is stopped with SIGTERM (pg_terminate_backend) and the
#     launcher starts another: the totals do not go backwards and go on
#     counting, still equal to the receiver's.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use PgTide::Redis;
use PgTide::Receiver;
use JSON::PP;

my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new->canonical;
my $redis = PgTide::Redis->new(dir => $dir);
$redis->start;
my $rcv = PgTide::Receiver->new(dir => $dir);
$rcv->start;
my $node = tide_node('counters', "pg_tide.relay_naptime_ms = 100\n");

sub sql { return $node->safe_psql('postgres', $_[0]) }

# The counters of a pipeline as "delivered failed retried dead_lettered
# failed_by_class".
sub counters
{
	my ($pipeline) = @_;
	return sql("SELECT delivered || ' ' || failed || ' ' || retried || ' ' || dead_lettered
				   || ' ' || failed_by_class::text
				  FROM tide.relay_pipeline_status WHERE pipeline = '$pipeline'");
}

###########################################################################
# 1. Redis, "attempt_log": "failures" (the broker sinks' default)
###########################################################################
sql("SELECT tide.outbox_create('cnt')");
$redis->cli('SET', 'cnt.bad', 'a string, not a stream');
sql("SELECT tide.relay_set_outbox('cnt', 'cnt', 'cnt', "
	  . "'{\"sink_type\": \"redis\", \"url\": \"" . $redis->url . "\", \"stream\": \"cnt.{type}\", "
	  . "\"batch_size\": 50, \"retry\": {\"base_ms\": 20, \"cap_ms\": 100, \"max_attempts\": 3}}'::jsonb)");
is(sql("SELECT config ->> 'attempt_log' FROM tide.relay_outbox_config WHERE name = 'cnt'"), 'failures',
	'the redis pipeline logs failed attempts only');
my $last = sql("SELECT max(tide.outbox_publish('cnt', jsonb_build_object('n', g),
					CASE WHEN g = 100 THEN '{\"type\": \"bad\"}'::jsonb
						 WHEN g = 200 THEN '{\"other\": 1}'::jsonb
						 ELSE '{\"type\": \"ok\"}'::jsonb END))
				  FROM generate_series(1, 302) g");
ok(defined wait_until(sub { sql("SELECT offset_id = $last AND retry_queue = 0 FROM tide.relay_pipeline_status
								  WHERE pipeline = 'cnt'") eq 't' }, 60),
	'the 302 messages are settled');
my @entries = $redis->entries('cnt.ok');
is(scalar(@entries), 300, 'the broker\'s client reads 300 entries');
is(counters('cnt'), '300 2 0 2 {"refused": 1, "template": 1}',
	'delivered 300 as read back, 2 failed attempts by class, none retried, 2 dead-lettered');
is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'cnt'"), '2', 'the two dead letters');
is(sql("SELECT count(*) FILTER (WHERE status = 'success') || ' ' || count(*) FROM tide.relay_attempts
		 WHERE pipeline_id = 'cnt'"), '0 2', 'the attempt log holds the two failures and no success');
my $rate = sql("SELECT delivered_last_minute FROM tide.relay_pipeline_status WHERE pipeline = 'cnt'");
ok($rate > 0 && $rate <= 300, "delivered_last_minute counts without the attempt log ($rate)");

###########################################################################
# 2. A webhook: 500 then 200, and a 400 dead-lettered
###########################################################################
sql("SELECT tide.outbox_create('hook')");
sql("SELECT tide.relay_set_outbox('hook', 'hook', 'hook', jsonb_build_object(
	  'sink_type', 'webhook', 'url', '" . $rcv->url('/hook') . "', 'allow_http', true,
	  'allow_private_network', true, 'attempt_log', 'failures', 'batch_size', 1, 'max_in_flight', 1,
	  'retry', jsonb_build_object('base_ms', 20, 'cap_ms', 50, 'max_attempts', 100)))");

# The receiver's answers to /hook, as "200s 500s 400s".
sub answers
{
	my %n = (200 => 0, 500 => 0, 400 => 0);
	$n{ $_->{status} }++ for grep { $_->{path} eq '/hook' } $rcv->requests;
	return "$n{200} $n{500} $n{400}";
}

$rcv->control({ always => 500 });
sql("SELECT tide.outbox_publish('hook', '{\"n\": \"a\"}')");
ok(defined wait_until(sub { sql("SELECT failed >= 2 FROM tide.relay_pipeline_status WHERE pipeline = 'hook'") eq 't' }, 30),
	'a message answered 500 fails and is queued again');
$rcv->control({ always => undef });
ok(defined wait_until(sub { sql("SELECT delivered = 1 AND retry_queue = 0 FROM tide.relay_pipeline_status WHERE pipeline = 'hook'") eq 't' }, 30),
	'then answered 200: delivered');
$rcv->control({ always => 400 });
sql("SELECT tide.outbox_publish('hook', '{\"n\": \"b\"}')");
ok(defined wait_until(sub { sql("SELECT dead_lettered = 1 FROM tide.relay_pipeline_status WHERE pipeline = 'hook'") eq 't' }, 30),
	'a message answered 400 is dead-lettered');
$rcv->control({ always => undef });
my $hook_last = sql("SELECT max(tide.outbox_publish('hook', jsonb_build_object('n', g))) FROM generate_series(1, 10) g");
ok(defined wait_until(sub { sql("SELECT offset_id = $hook_last FROM tide.relay_pipeline_status WHERE pipeline = 'hook'") eq 't' }, 30),
	'ten more delivered');
my ($ok200, $n500, $n400) = split / /, answers();
is(counters('hook'), "$ok200 " . ($n500 + $n400) . " $n500 1 {\"http_4xx\": $n400, \"http_5xx\": $n500}",
	"the counters agree with the receiver's answers ($ok200 x 200, $n500 x 500, $n400 x 400)");
is($ok200, 11, 'the receiver acknowledged the 11 messages once each');
is(sql("SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 'hook' AND status = 'success'"), '0',
	'no success in the attempt log');

###########################################################################
# 3. The worker stopped and started again: the totals go on
###########################################################################
my $before = counters('hook');
my $pid = sql("SELECT pid FROM tide.relay_workers() WHERE database = 'postgres'");
ok($pid > 0, 'a relay worker serves the database');
sql("SELECT pg_terminate_backend($pid)");
ok(defined wait_until(sub { sql("SELECT count(*) FROM tide.relay_workers() WHERE database = 'postgres' AND pid <> $pid") eq '1' }, 30),
	'the launcher starts another worker');
is(counters('hook'), $before, 'the totals are kept across the restart');
$hook_last = sql("SELECT max(tide.outbox_publish('hook', jsonb_build_object('n', g))) FROM generate_series(1, 5) g");
ok(defined wait_until(sub { sql("SELECT offset_id = $hook_last FROM tide.relay_pipeline_status WHERE pipeline = 'hook'") eq 't' }, 30),
	'five more delivered by the new worker');
($ok200, $n500, $n400) = split / /, answers();
is($ok200, 16, 'the receiver acknowledged 16 messages');
is(counters('hook'), "$ok200 " . ($n500 + $n400) . " $n500 1 {\"http_4xx\": $n400, \"http_5xx\": $n500}",
	'the counters went on from where they were, still equal to the receiver\'s');

$node->stop;
done_testing();
