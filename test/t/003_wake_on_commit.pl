# Wake on commit: a waiter in tide.wait_for_messages() returns as soon as a
# publishing transaction commits, not at its next periodic look. The
# periodic look is set to an hour here, so without the wake-up the waiter
# would sleep through the whole test.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode;
use Time::HiRes qw(time usleep);

my $node = tide_node('wake');
$node->safe_psql('postgres', q{
	SELECT tide.outbox_create('orders');
	SELECT tide.create_consumer_group('g', 'orders');
});

# Starts a waiter and returns it once it sleeps (its pid too).
sub start_waiter
{
	my ($timeout_ms) = @_;
	my $waiter = $node->background_psql('postgres');
	my $pid = $waiter->query_safe('SELECT pg_backend_pid()');
	chomp $pid;
	$waiter->query_until(qr/waiting/, qq{
		SET pg_tide.wait_recheck_ms = 3600000;
		\\echo waiting
		SELECT tide.wait_for_messages('g', $timeout_ms) AS woke;
	});
	$node->poll_query_until('postgres', qq{
		SELECT wait_event_type = 'Extension' FROM pg_stat_activity WHERE pid = $pid
	}) or die 'waiter did not go to sleep';
	return ($waiter, $pid);
}

# Waits until the session is idle again; returns the seconds it took.
sub seconds_until_idle
{
	my ($pid, $since) = @_;
	$node->poll_query_until('postgres', qq{
		SELECT state = 'idle' FROM pg_stat_activity WHERE pid = $pid
	}) or die 'waiter did not return';
	return time() - $since;
}

# A rollback wakes nobody and publishes nothing: the waiter stays asleep.
my ($waiter, $pid) = start_waiter(3600 * 1000);
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT tide.outbox_publish('orders', '{"n": 0}');
	ROLLBACK;
});
usleep(300_000);
is($node->safe_psql('postgres', "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $pid"),
	'Extension', 'a rolled-back publish leaves the waiter asleep');

# A commit wakes it.
my $committed_at = time();
$node->safe_psql('postgres', q{SELECT tide.outbox_publish('orders', '{"n": 1}')});
my $took = seconds_until_idle($pid, $committed_at);
cmp_ok($took, '<', 60, "waiter woke on commit (after ${took}s; its own look was an hour away)");
like($waiter->query_safe('SELECT 1'), qr/^t$/m, 'wait_for_messages returned true');
is($node->safe_psql('postgres', q{SELECT string_agg(payload->>'n', ',') FROM tide.poll_outbox('g', 'c1')}),
	'1', 'the committed message is there to poll');
$waiter->quit;

# A commit in another database wakes nobody here for nothing: the waiter
# may wake, but it looks again and keeps waiting.
$node->safe_psql('postgres', 'CREATE DATABASE other');
$node->safe_psql('other', q{
	CREATE EXTENSION pg_tide;
	SELECT tide.outbox_create('orders');
});
$node->safe_psql('postgres', q{SELECT tide.commit_offset('g', 'c1', (SELECT max(id) FROM tide.tide_outbox_messages))});
($waiter, $pid) = start_waiter(3600 * 1000);
$node->safe_psql('other', q{SELECT tide.outbox_publish('orders', '{"other": true}')});
usleep(300_000);
is($node->safe_psql('postgres', "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $pid"),
	'Extension', 'a commit in another database does not end the wait');
$node->safe_psql('postgres', q{SELECT tide.outbox_publish('orders', '{"n": 2}')});
seconds_until_idle($pid, time());
like($waiter->query_safe('SELECT 1'), qr/^t$/m, 'woken by the commit in its own database');
$waiter->quit;

$node->stop;
done_testing();
