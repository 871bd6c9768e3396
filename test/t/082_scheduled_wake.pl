# A scheduled message due further ahead than a worker stays for is moved
# on time in a database without a pipeline: the worker leaves (it holds no
# worker slot while the message waits), and the launcher starts one when
# the message falls due, from the time the scheduling commit and the
# leaving worker told it (relay/on_demand.c). pg_tide.sweep_interval is
# long (60 s), then off (0): neither makes the message wait for the
# database's periodic worker. Last, the launcher is ended and starts anew,
# knowing no due time: the worker it starts for the database tells it
# again. The lateness of each move (the move's transaction start minus
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

my $node = tide_node('scheduled_wake', "pg_tide.sweep_interval = 60s\n");

sub sql { return $node->safe_psql('postgres', $_[0]) }

sql(q{SELECT tide.outbox_create('later')});

# The pid of the postgres database's relay worker, or '' when none runs.
sub worker_pid
{
	return sql("SELECT pid FROM pg_stat_activity
				 WHERE backend_type = 'pg_tide relay worker' AND datname = 'postgres' LIMIT 1");
}

# Schedules message $key due $seconds from now; returns its deliver_at (epoch).
sub schedule_in
{
	my ($key, $seconds) = @_;
	my ($at) = split /\|/, sql("SELECT extract(epoch FROM d),
			tide.outbox_schedule('later', jsonb_build_object('k', '$key'), p_deliver_at => d)
		FROM (SELECT clock_timestamp() + interval '$seconds s' AS d) s");
	return $at;
}

# Waits until message $key is in the outbox, at most until $due + $grace
# (epoch); returns its lateness in seconds, or undef.
sub lateness
{
	my ($key, $due, $grace) = @_;
	my $late;
	wait_until(
		sub {
			$late = sql("SELECT extract(epoch FROM created_at) - $due
						   FROM tide.tide_outbox_messages WHERE payload->>'k' = '$key'");
			return $late ne '' || time() > $due + $grace;
		},
		$due + $grace - time() + 5, 50_000);
	return $late eq '' ? undef : $late;
}

# 1. sweep_interval 60 s: the worker does not stay for a message due in 8 s.
ok(defined wait_until(sub { worker_pid() eq '' }, 30, 100_000),
	'without a pipeline, the database\'s first worker leaves');
my $due = schedule_in('long', 8);
ok(defined wait_until(sub { worker_pid() eq '' }, 5, 50_000),
	'sweep_interval 60 s: no worker waits for a message due in 8 s');
my $late = lateness('long', $due, 8);
diag(sprintf('sweep_interval 60 s: moved %.3f s after its time', $late // -1));
ok(defined $late && $late < 1, 'sweep_interval 60 s: the message is moved within 1 s of its time');

# 2. sweep_interval 0 (sweeping left to the operator): the periodic worker
# comes only every 60 s.
sql("ALTER SYSTEM SET pg_tide.sweep_interval = 0; SELECT pg_reload_conf()");
ok(defined wait_until(sub { worker_pid() eq '' }, 10, 100_000), 'sweep_interval 0: the worker leaves');
$due = schedule_in('off', 6);
$late = lateness('off', $due, 8);
diag(sprintf('sweep_interval 0: moved %.3f s after its time', $late // -1));
ok(defined $late && $late < 1, 'sweep_interval 0: the message is moved within 1 s of its time');

# 3. The launcher ends while a message waits (SIGTERM: the postmaster
# starts it again after 10 s) and knows no due time when it is back.
ok(defined wait_until(sub { worker_pid() eq '' }, 10, 100_000), 'the worker leaves again');
$due = schedule_in('restart', 20);
ok(defined wait_until(sub { worker_pid() eq '' }, 5, 50_000), 'no worker waits for a message due in 20 s');
my $launcher = sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_tide launcher'");
sql("SELECT pg_terminate_backend($launcher)");
ok(defined wait_until(sub { my $p = sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_tide launcher'");
			return $p ne '' && $p ne $launcher }, 20, 100_000),
	'the launcher starts again');
$late = lateness('restart', $due, 8);
diag(sprintf('after a launcher restart: moved %.3f s after its time', $late // -1));
ok(defined $late && $late < 1, 'after a launcher restart: the message is moved within 1 s of its time');

is(sql('SELECT count(*) FROM tide.outbox_scheduled'), '0', 'no scheduled row is left');

$node->stop;
done_testing();
