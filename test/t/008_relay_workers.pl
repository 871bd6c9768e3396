# The relay's background workers: one launcher, one relay worker per
# database where pg_tide has an enabled pipeline. Workers follow CREATE and
# DROP EXTENSION and the pipelines (a database whose last pipeline is
# disabled lets its worker go, relay/on_demand.c), never block DROP
# DATABASE or ALTER DATABASE RENAME, are woken by publishing commits, stop
# and start again with pg_tide.relay_enabled, and are restarted after a
# SIGTERM.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node keep_relay_worker);
use Time::HiRes qw(time usleep);

my $node = tide_node('relay', "pg_tide.relay_naptime_ms = 200\n");

# The pid of the relay worker of a database, or '' when it has none.
sub worker_pid
{
	my ($db) = @_;
	return $node->safe_psql('postgres',
		"SELECT pid FROM tide.relay_workers() WHERE database = '$db'");
}

# Waits until the database has a worker (other than $old_pid); returns its pid.
sub wait_for_worker
{
	my ($db, $old_pid) = @_;
	my $not_old = defined $old_pid ? "AND pid <> $old_pid" : '';
	$node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM tide.relay_workers() WHERE database = '$db' $not_old")
	  or die "no relay worker for database $db";
	return worker_pid($db);
}

# Waits until the database has no worker.
sub wait_for_no_worker
{
	my ($db) = @_;
	return $node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM tide.relay_workers() WHERE database = '$db'");
}

# Sets a configuration value for the whole server and reloads.
sub set_conf
{
	my ($name, $value) = @_;
	$node->safe_psql('postgres', "ALTER SYSTEM SET $name = '$value'");
	$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
}

# Both kinds of worker show in pg_stat_activity.
keep_relay_worker($node, 'postgres');
my $postgres_pid = wait_for_worker('postgres');
ok($postgres_pid, 'database postgres has a relay worker');
is($node->safe_psql('postgres',
		"SELECT backend_type FROM pg_stat_activity WHERE pid = $postgres_pid"),
	'pg_tide relay worker', 'the relay worker shows in pg_stat_activity');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_tide launcher'"),
	'1', 'one launcher shows in pg_stat_activity');
my $launcher_pid = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_tide launcher'");

# A new database gets no worker until CREATE EXTENSION and a pipeline, then
# within seconds.
$node->safe_psql('postgres', 'CREATE DATABASE app');
usleep(500_000);
is(worker_pid('app'), '', 'a database without pg_tide has no worker');
my $created_at = time();
$node->safe_psql('app', 'CREATE EXTENSION pg_tide');
keep_relay_worker($node, 'app');
my $app_pid = wait_for_worker('app');
my $took = time() - $created_at;
cmp_ok($took, '<', 5, "CREATE EXTENSION and a pipeline started a worker (after ${took}s)");

# With an enabled pipeline, a publishing commit wakes the worker: its own
# look is an hour away.
$node->safe_psql('app', "SELECT tide.outbox_create('orders')");
usleep(600_000);	# a pass at the 200 ms naptime sees the pipeline
set_conf('pg_tide.relay_naptime_ms', '1h');
usleep(1_000_000);	# the worker takes the new naptime at its next slice
my $counters = "SELECT passes || ',' || wakeups FROM tide.relay_workers() WHERE database = 'app'";
my $before = $node->safe_psql('postgres', $counters);
usleep(500_000);
is($node->safe_psql('postgres', $counters), $before, 'the worker sleeps through a quiet half second');
my (undef, $wakeups) = split /,/, $before;
$node->safe_psql('app', q{SELECT tide.outbox_publish('orders', '{"n": 1}')});
ok($node->poll_query_until('postgres',
		"SELECT wakeups > $wakeups FROM tide.relay_workers() WHERE database = 'app'"),
	'a publishing commit woke the worker');

# Without an enabled pipeline there is nothing to deliver: the change of
# the pipeline wakes the worker, which sees it disabled and leaves; a
# publishing commit then starts none.
$node->safe_psql('app', "UPDATE tide.relay_outbox_config SET enabled = false WHERE name = 'wake'");
ok(wait_for_no_worker('app'), 'disabling the last pipeline lets the worker go');
$node->safe_psql('app', q{SELECT tide.outbox_publish('orders', '{"n": 3}')});
usleep(500_000);
is(worker_pid('app'), '', 'without an enabled pipeline a publishing commit starts no worker');
set_conf('pg_tide.relay_naptime_ms', '200ms');

# DROP EXTENSION is not blocked, and the worker leaves.
$node->safe_psql('app', "UPDATE tide.relay_outbox_config SET enabled = true WHERE name = 'wake'");
wait_for_worker('app');
my ($ret, $out, $err) = $node->psql('app', 'DROP EXTENSION pg_tide', timeout => 30);
is($ret, 0, 'DROP EXTENSION succeeds while the worker runs') or diag($err);
ok(wait_for_no_worker('app'), 'DROP EXTENSION stops the worker');

# ALTER DATABASE ... RENAME and DROP DATABASE succeed while a worker runs.
$node->safe_psql('postgres', 'CREATE DATABASE doomed');
$node->safe_psql('doomed', 'CREATE EXTENSION pg_tide');
keep_relay_worker($node, 'doomed');
wait_for_worker('doomed');
($ret, $out, $err) = $node->psql('postgres', 'ALTER DATABASE doomed RENAME TO doomed2');
is($ret, 0, 'ALTER DATABASE RENAME succeeds while the worker runs') or diag($err);
($ret, $out, $err) = $node->psql('postgres', 'DROP DATABASE doomed2');
is($ret, 0, 'DROP DATABASE succeeds right after') or diag($err);
unlike($err, qr/being accessed by other users/, 'DROP DATABASE did not see the worker');
$node->safe_psql('postgres', 'CREATE DATABASE doomed');
$node->safe_psql('doomed', 'CREATE EXTENSION pg_tide');
keep_relay_worker($node, 'doomed');
wait_for_worker('doomed');
($ret, $out, $err) = $node->psql('postgres', 'DROP DATABASE doomed');
is($ret, 0, 'DROP DATABASE of a database with a running worker succeeds') or diag($err);
unlike($err, qr/being accessed by other users/, 'no "being accessed by other users"');
is($node->safe_psql('postgres', "SELECT count(*) FROM pg_database WHERE datname LIKE 'doomed%'"),
	'0', 'the databases are gone');

# relay_enabled = off stops every worker; on starts them again.
set_conf('pg_tide.relay_enabled', 'off');
ok($node->poll_query_until('postgres', 'SELECT count(*) = 0 FROM tide.relay_workers()'),
	'relay_enabled = off stops all workers');
usleep(500_000);
is($node->safe_psql('postgres', 'SELECT count(*) FROM tide.relay_workers()'),
	'0', 'and none is started while it is off');
set_conf('pg_tide.relay_enabled', 'on');
$postgres_pid = wait_for_worker('postgres', $postgres_pid);
ok($postgres_pid, 'relay_enabled = on starts them again');

# A worker ended by SIGTERM is started again by the launcher.
$node->safe_psql('postgres', "SELECT pg_terminate_backend($postgres_pid)");
my $new_pid = wait_for_worker('postgres', $postgres_pid);
isnt($new_pid, $postgres_pid, 'the launcher restarts a terminated worker');

is($node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_tide launcher'"),
	$launcher_pid, 'the launcher kept running throughout');

# Nothing of ours crashed.
my $log = slurp_file($node->logfile);
unlike($log, qr/terminated by signal|was terminated by|PANIC|server process .* exited abnormally/,
	'no crash or "terminated by signal" in the server log');
unlike($log, qr/pg_tide relay worker .* stops after an error/, 'no worker stopped on an error');

$node->stop;
done_testing();
