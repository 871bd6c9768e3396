# A change of a reverse pipeline (a row of tide.relay_inbox_config) wakes
# the relay as a forward pipeline's change does: its transaction asks the
# launcher, at commit, to look at the database again, and the launcher
# starts a worker for a database that has none at once, rather than at the
# next periodic look (a minute here). The worker's start is read from the
# server log (the postmaster's "starting background worker process" at
# DEBUG1), since a worker that finds no enabled pipeline to serve leaves
# again within moments; one that finds an enabled reverse pipeline stays.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use Time::HiRes qw(usleep);

my $node = tide_node('reverse_wake',
	"pg_tide.relay_naptime_ms = 200\npg_tide.sweep_interval = 60s\nlog_min_messages = debug1\n");

sub sql { return $node->safe_psql('postgres', $_[0]) }

my $dboid = sql("SELECT oid FROM pg_database WHERE datname = 'postgres'");
my $started = qr/starting background worker process "pg_tide relay worker for database $dboid"/;

# How many times a relay worker of the database started after log offset $from.
sub starts_since
{
	my ($from) = @_;
	my $log = slurp_file($node->logfile);
	return scalar(() = substr($log, $from) =~ /$started/g);
}

# How many relay workers of the database run now.
sub workers
{
	return sql("SELECT count(*) FROM pg_stat_activity
		WHERE backend_type = 'pg_tide relay worker' AND datname = 'postgres'");
}

# Once the database has no worker: whether running $statement starts one
# within 10 s.
sub starts_worker
{
	my ($statement) = @_;
	wait_until(sub { workers() == 0 }, 30);
	my $from = -s $node->logfile;
	sql($statement);
	return wait_until(sub { starts_since($from) > 0 }, 10);
}

# The start-up worker finds no enabled pipeline and leaves.
ok(wait_until(sub { workers() == 0 }, 30), 'the database has no relay worker at rest');

# A reverse pipeline's row, written as a restore writes it (no trigger, so
# no wake-up yet).
sql("SELECT tide.inbox_create('rw_in')");
sql(q{SET session_replication_role = replica;
	INSERT INTO tide.relay_inbox_config (name, config)
	VALUES ('rw', '{"inbox": "rw_in", "source_type": "carrier_pigeon", "batch_size": 100}')});
my $from = -s $node->logfile;
usleep(1_000_000);
is(starts_since($from), 0, 'no worker started meanwhile');

# Each change its trigger announces brings a worker at once.
ok(starts_worker("SELECT tide.relay_disable('rw')"),
	'disabling a reverse pipeline starts a relay worker for its database');
ok(starts_worker("SELECT tide.relay_enable('rw')"),
	'enabling a reverse pipeline starts a relay worker for its database');
# an enabled reverse pipeline is the worker's work: it stays (on_demand.c)
usleep(1_500_000);
is(workers(), '1', 'the worker stays while a reverse pipeline is enabled');
sql("SELECT tide.relay_disable('rw')");
ok(starts_worker("SELECT tide.relay_delete('rw')"),
	'deleting a reverse pipeline starts a relay worker for its database');
is(sql("SELECT count(*) FROM tide.relay_inbox_config"), '0', 'and the pipeline is gone');

$node->stop;
done_testing();
