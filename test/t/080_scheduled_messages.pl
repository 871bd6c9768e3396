# Scheduled messages are moved into the outbox by the relay at their time:
# a consumer group polling all along never gets one before its deliver_at,
# gets each exactly once (one message id per scheduled row; a lease in
# flight at a crash may come again under the same id), skips none, and the
# messages published meanwhile without a schedule are not held back by
# them. In the middle, the postmaster is killed with SIGKILL while rows
# wait, and later the relay worker is ended with SIGTERM: the rows wait on
# and are moved afterwards. Last, an outbox that backpressure refuses
# keeps its due row while the other outbox's rows move. The lateness of
# the scheduled messages (first poll that returned each, minus its
# deliver_at) is printed.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use Time::HiRes qw(time usleep);

my $node = tide_node('scheduled', "pg_tide.relay_naptime_ms = 200\nrestart_after_crash = on\n");

sub sql { return $node->safe_psql('postgres', $_[0]) }

sql(q{SELECT tide.outbox_create('sched');
	  SELECT tide.create_consumer_group('g', 'sched');});

# What the consumer saw: key => { id => first poll time }, and the schedule's
# due time or the publish's time of each key.
my (%seen, %due, %published);
my $acked;

# One poll that acknowledges the last batch; a failed one (the server is
# down) returns 0 and is retried by the caller's loop.
sub poll_once
{
	my $upto = defined $acked ? $acked : 'NULL';
	my ($rc, $out) = $node->psql('postgres',
		"SELECT id, payload->>'k', extract(epoch FROM clock_timestamp())
		   FROM tide.poll_outbox('g', 'c1', 1000, 30, $upto)");
	return 0 if $rc != 0;
	my $n = 0;
	for my $row (split /\n/, $out)
	{
		my ($id, $key, $at) = split /\|/, $row;
		$seen{$key}{$id} //= $at;
		$acked = $id if !defined $acked || $id > $acked;
		$n++;
	}
	return $n;
}

# Polls until every key so far was seen, at most $seconds.
sub poll_until_all
{
	my ($seconds) = @_;
	my $end = time() + $seconds;
	while (time() < $end)
	{
		poll_once();
		return 1 if !grep { !$seen{$_} } (keys %due, keys %published);
		usleep(20_000);
	}
	return 0;
}

# Schedules $n rows of round $round due between $from and $to seconds from now.
sub schedule_round
{
	my ($round, $n, $from, $to) = @_;
	my $out = sql("SELECT 's$round-' || i, extract(epoch FROM d),
						  tide.outbox_schedule('sched', jsonb_build_object('k', 's$round-' || i), p_deliver_at => d)
					 FROM (SELECT i, clock_timestamp() + ($from + random() * ($to - $from)) * interval '1 second' AS d
							 FROM generate_series(1, $n) i) s");
	for my $row (split /\n/, $out)
	{
		my ($key, $at) = split /\|/, $row;
		$due{$key} = $at;
	}
}

# Publishes $n messages of round $round without a schedule, one at a time,
# polling between them.
sub publish_round
{
	my ($round, $n) = @_;
	for my $i (1 .. $n)
	{
		my $at = sql("SELECT extract(epoch FROM clock_timestamp()),
							 tide.outbox_publish('sched', jsonb_build_object('k', 'p$round-$i'))");
		($published{"p$round-$i"}) = split /\|/, $at;
		poll_once();
	}
}

# The relay worker's pid, or '' when none runs.
sub worker_pid
{
	my ($rc, $out) = $node->psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_tide relay worker' AND datname = 'postgres' LIMIT 1");
	return $rc == 0 ? $out : '';
}

# 1. Rows due in the next 0.2-3 s, published messages between.
schedule_round(1, 100, 0.2, 3);
publish_round(1, 20);
ok(poll_until_all(30), 'round 1: every scheduled and published message was polled');

# 2. The postmaster is killed while rows wait (due in 1-3 s).
schedule_round(2, 100, 1, 3);
publish_round(2, 5);
$node->kill9;
my $started = wait_until(sub { $node->{_pid} = undef; $node->start(fail_ok => 1) }, 30, 500_000);
ok(defined $started, 'round 2: the server starts again after SIGKILL of the postmaster');
publish_round(2.5, 5);
ok(poll_until_all(40), 'round 2: after the crash, every scheduled and published message was polled');

# 3. The worker is ended with SIGTERM while rows wait (due in 0.5-3 s).
# (without a pipeline, a worker runs only while rows are due soon: the
# schedule brings one)
schedule_round(3, 100, 0.5, 3);
ok(wait_until(sub { worker_pid() ne '' }, 20, 20_000), 'round 3: a relay worker runs');
my $pid = worker_pid();
sql("SELECT pg_terminate_backend($pid)") if $pid ne '';
publish_round(3, 20);
ok(poll_until_all(40), 'round 3: after the worker\'s SIGTERM, every scheduled and published message was polled');

# 4. An outbox that backpressure refuses keeps its due row scheduled and
# holds back no other outbox's rows; with room again, its row is moved.
sql(q{SELECT tide.outbox_create('full', p_inline_threshold => 1);
	  SELECT tide.create_consumer_group('full_readers', 'full');
	  SELECT tide.outbox_publish('full', '{"n": 1}');
	  SELECT tide.outbox_schedule('full', '{"n": 2}', p_deliver_at => now());});
schedule_round(4, 20, 0.2, 1.5);
ok(poll_until_all(30), 'round 4: a full outbox\'s due row holds back no other outbox\'s rows');
is(sql(q{SELECT count(*) FROM tide.outbox_scheduled WHERE outbox_name = 'full'}), '1',
	'round 4: the full outbox\'s row is still scheduled');
sql(q{SELECT tide.outbox_set_threshold('full', NULL)});
ok(wait_until(sub { sql(q{SELECT count(*) FROM tide.tide_outbox_messages WHERE outbox_name = 'full'}) eq '2' }, 20, 100_000),
	'round 4: with room again, the full outbox\'s row is moved');

# None early, each under one id, none left over, none unknown.
my @early = grep { $seen{$_} && (sort { $a <=> $b } values %{ $seen{$_} })[0] < $due{$_} } keys %due;
is(scalar(@early), 0, 'no scheduled message was polled before its deliver_at')
  or diag("early: @early[0 .. ($#early < 4 ? $#early : 4)]");
my @not_once = grep { keys %{ $seen{$_} // {} } != 1 } (keys %due, keys %published);
is(scalar(@not_once), 0, 'every message was polled under exactly one id')
  or diag("not once: @not_once[0 .. ($#not_once < 4 ? $#not_once : 4)]");
my @unknown = grep { !exists $due{$_} && !exists $published{$_} } keys %seen;
is(scalar(@unknown), 0, 'nothing else was polled');
is(sql('SELECT count(*) FROM tide.outbox_scheduled'), '0', 'no scheduled row is left');

# Lateness of the scheduled messages; the wait of the published ones.
sub first_seen { return (sort { $a <=> $b } values %{ $seen{ $_[0] } })[0] }
sub percentile
{
	my ($p, @v) = @_;
	@v = sort { $a <=> $b } @v;
	return $v[ int($p * $#v) ];
}
my @late = map { first_seen($_) - $due{$_} } grep { $seen{$_} } keys %due;
my @wait = map { first_seen($_) - $published{$_} } grep { $seen{$_} } keys %published;
if (@late && @wait)
{
	diag(sprintf('scheduled lateness: p50 %.3f s, max %.3f s (%d messages); published wait: p50 %.3f s, max %.3f s',
			percentile(0.5, @late), percentile(1, @late), scalar(@late), percentile(0.5, @wait), percentile(1, @wait)));
}
ok(@late == keys %due && percentile(0.5, @late) < 2,
	'every scheduled message was polled, half of them within 2 s of their time');
ok(@wait == keys %published && percentile(0.5, @wait) < 1,
	'every published message was polled, half of them within 1 s: not held back');

$node->stop;
done_testing();
