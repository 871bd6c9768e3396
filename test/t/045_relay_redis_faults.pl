# The redis sink under faults, against a real Redis server on 127.0.0.1
# (appendonly yes, appendfsync always: what Redis acknowledged survives
# its own crash), read back by a real client (test/brokers/redis_read):
#
#  1. Nothing listens yet: connection refused holds the pipeline with
#     class connection, nothing is dead-lettered; once Redis is up
#     everything arrives.
#  2. Redis killed (SIGKILL) and restarted in the middle of a backlog:
#     the pipeline is held (connection) meanwhile and recovers by itself;
#     every message arrives, duplicates only from the batch in flight.
#  3. kill -9 of the postmaster in the middle of a backlog (with XADDs in
#     flight, Redis paused): after the restart every message arrives, at
#     most one batch twice.
#  4. Redis paused (SIGSTOP): XADDs unanswered within timeout_ms fail
#     with class timeout and are retried; once it resumes they arrive.
#  5. Redis out of memory (maxmemory, noeviction): OOM is class broker,
#     retried; once memory is allowed again they arrive.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use PgTide::Redis;
use JSON::PP;
use Time::HiRes qw(time usleep);

my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new->canonical;
my $batch_size = 200;

my $redis = PgTide::Redis->new(dir => $dir, appendonly => 1);
# a port for it, free now; nothing listens there until test 1 starts it
$redis->start;
$redis->stop('KILL');
my $node = tide_node('redis_faults', "pg_tide.relay_naptime_ms = 100\nrestart_after_crash = on\n");

sub sql { return $node->safe_psql('postgres', $_[0]) }

my $retry = { base_ms => 20, cap_ms => 300, max_attempts => 100 };

sub set_pipeline
{
	my ($name, %cfg) = @_;
	my $c = $json->encode({ sink_type => 'redis', url => $redis->url, stream => $name,
		batch_size => $batch_size, max_in_flight => 50, retry => $retry, %cfg });
	sql("SELECT tide.outbox_create('$name')");
	sql("SELECT tide.relay_set_outbox('$name', '$name', '$name', '$c'::jsonb)");
}

sub publish
{
	my ($outbox, $n) = @_;
	return split /\n/, sql("SELECT tide.outbox_publish('$outbox', jsonb_build_object('n', g)) FROM generate_series(1, $n) g");
}

# id => times it is in the stream.
sub delivered
{
	my ($stream) = @_;
	my %seen;
	$seen{ (/:(\d+)$/)[0] }++ for $redis->field_values('tide-id', $stream);
	return \%seen;
}

sub xlen { return $redis->cli('XLEN', $_[0]) // 0 }

# Waits until every id is in the stream; the time it took, or undef.
sub wait_all
{
	my ($stream, $ids, $timeout) = @_;
	return wait_until(sub {
		xlen($stream) >= @$ids or return 0;
		my $seen = delivered($stream);
		return !grep { !$seen->{$_} } @$ids;
	}, $timeout, 100_000);
}

sub check_all
{
	my ($t, $stream, $ids, $max_dups) = @_;
	my $seen = delivered($stream);
	is(scalar(grep { !$seen->{$_} } @$ids), 0, "$t: none lost");
	my $dups = 0;
	$dups += $_ - 1 for values %$seen;
	note("$t: duplicates: $dups");
	cmp_ok($dups, '<=', $max_dups, "$t: duplicates ($dups) at most $max_dups");
	is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = '$stream'"), '0', "$t: nothing is dead-lettered");
}

sub health { return sql("SELECT coalesce(last_error_class, '') FROM tide.relay_pipeline_health WHERE pipeline_id = '$_[0]'") }

###########################################################################
# 1. Connection refused, then Redis starts
###########################################################################
{
	set_pipeline('t1');
	my @ids = publish('t1', 100);
	ok(defined wait_until(sub { health('t1') eq 'connection' }, 20), 'test 1: connection refused is class connection');
	like(sql("SELECT last_error FROM tide.relay_pipeline_health WHERE pipeline_id = 't1'"), qr/could not connect|refused/i,
		'test 1: the error says the connection was refused');
	isnt(sql("SELECT held_reason FROM tide.relay_pipeline_health WHERE pipeline_id = 't1'"), '', 'test 1: the pipeline is held');
	is(sql("SELECT count(*) FROM tide.relay_retry_queue WHERE pipeline_id = 't1'"), '0', 'test 1: nothing is queued for retry');
	cmp_ok(sql("SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 't1' AND error_class = 'connection'"), '>', 0,
		'test 1: the attempts record class connection');
	$redis->start;
	ok(defined wait_all('t1', \@ids, 30), 'test 1: once Redis is up everything arrives');
	check_all('test 1', 't1', \@ids, 0);
}

###########################################################################
# 2. Redis killed and restarted in the middle of a backlog
###########################################################################
{
	set_pipeline('t2', batch_size => 100, max_in_flight => 20);
	my @ids = publish('t2', 8000);
	ok(defined wait_until(sub { xlen('t2') >= 1000 }, 30, 10_000), 'test 2: the backlog is being delivered');
	$redis->stop('KILL');
	my $t_kill = time();
	my @more = publish('t2', 500);
	ok(defined wait_until(sub { health('t2') eq 'connection' }, 20), 'test 2: with Redis down the pipeline fails with class connection');
	is(sql("SELECT count(*) FROM tide.relay_retry_queue WHERE pipeline_id = 't2'"), '0', 'test 2: nothing is queued for retry meanwhile');
	usleep(1_000_000);
	$redis->start;
	my $at_restart = xlen('t2');
	note("test 2: Redis restarted with $at_restart entries kept");
	cmp_ok($at_restart, '<', 8500, 'test 2: the kill came while messages were still undelivered');
	cmp_ok($at_restart, '>=', 1000, 'test 2: the restarted Redis kept what it acknowledged');
	my $took = wait_all('t2', [ @ids, @more ], 60);
	ok(defined $took, 'test 2: after the restart every message arrives, the pipeline recovers by itself');
	note(sprintf('test 2: all arrived %.1f s after the kill', time() - $t_kill));
	check_all('test 2', 't2', [ @ids, @more ], 100);
}

###########################################################################
# 3. kill -9 of the postmaster with XADDs in flight
###########################################################################
{
	set_pipeline('t3');
	my @ids = publish('t3', 8000);
	ok(defined wait_until(sub { xlen('t3') >= 1000 }, 30, 10_000), 'test 3: the backlog is being delivered');
	$redis->pause;
	usleep(300_000);
	my ($postmaster) = split /\n/, slurp_file($node->data_dir . '/postmaster.pid');
	$node->kill9;
	my $at_kill = xlen_after_resume();
	# the server starts again only once the old postmaster is gone and reaped
	wait_until(sub { !kill(0, $postmaster) }, 60);
	note("test 3: postmaster killed with $at_kill of 8,000 in the stream");
	cmp_ok($at_kill, '<', 8000, 'test 3: the kill came while messages were still undelivered');
	ok($node->start(fail_ok => 1), 'test 3: the node starts again after the crash');
	ok(defined wait_all('t3', \@ids, 60), 'test 3: after the restart every message arrives');
	check_all('test 3', 't3', \@ids, $batch_size);
}

# Resumes Redis and waits until it has run what it had been sent.
sub xlen_after_resume
{
	$redis->resume;
	my ($last, $now) = (-1, xlen('t3'));
	while ($now != $last)
	{
		usleep(200_000);
		($last, $now) = ($now, xlen('t3'));
	}
	return $now;
}

###########################################################################
# 4. Redis paused: timeouts
###########################################################################
{
	set_pipeline('t4', timeout_ms => 500, batch_size => 20);
	ok(defined wait_until(sub { sql("SELECT count(*) FROM tide.relay_workers()") > 0 }, 30), 'test 4: the relay runs');
	# the connection is made (and its set-up answered) before the pause: a
	# new connection whose set-up goes unanswered holds the pipeline instead
	ok(defined wait_all('t4', [ publish('t4', 1) ], 30), 'test 4: a first message arrives');
	$redis->pause;
	my @ids = publish('t4', 50);
	ok(defined wait_until(sub { sql("SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 't4' AND error_class = 'timeout'") > 0 }, 30),
		'test 4: an unanswered XADD fails with class timeout');
	like(sql("SELECT error FROM tide.relay_attempts WHERE pipeline_id = 't4' AND error_class = 'timeout' LIMIT 1"),
		qr/not answered within/, 'test 4: the error says XADD was not answered');
	ok(defined wait_until(sub { sql("SELECT count(*) FROM tide.relay_retry_queue WHERE pipeline_id = 't4' AND last_error_class = 'timeout'") > 0 }, 30),
		'test 4: a timeout is retried (the retry queue holds it)');
	$redis->resume;
	ok(defined wait_all('t4', \@ids, 30), 'test 4: once Redis answers every message arrives');
	# Redis runs every XADD that reached its socket while it was paused, so
	# each failed attempt (the sink logs failures only) may add a copy, and
	# nothing else may: how many there are depends on how long the pause
	# lasted, not on a constant.
	my $failed = sql("SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 't4' AND status = 'failed'");
	check_all('test 4', 't4', \@ids, $failed);
}

###########################################################################
# 5. Redis out of memory
###########################################################################
{
	set_pipeline('t5');
	$redis->cli('CONFIG', 'SET', 'maxmemory-policy', 'noeviction');
	$redis->cli('CONFIG', 'SET', 'maxmemory', '1');
	my @ids = publish('t5', 30);
	ok(defined wait_until(sub { sql("SELECT count(*) FROM tide.relay_retry_queue WHERE pipeline_id = 't5' AND last_error_class = 'broker'") > 0 }, 30),
		'test 5: OOM is class broker, retried');
	like(sql("SELECT error FROM tide.relay_attempts WHERE pipeline_id = 't5' AND error_class = 'broker' LIMIT 1"), qr/^OOM/,
		'test 5: the error is Redis\'s OOM');
	$redis->cli('CONFIG', 'SET', 'maxmemory', '0');
	ok(defined wait_all('t5', \@ids, 30), 'test 5: once memory is allowed every message arrives');
	check_all('test 5', 't5', \@ids, 0);
}

done_testing();
