# Two clusters for the tests of the postgres endpoint (test/t/068, 069, 070): a
# remote database reached over TCP on 127.0.0.1 as a role that logs in with
# a password, and faults on both sides while messages go through.
package PgTide::Remote;

use strict;
use warnings;
use Exporter 'import';
use Test::More;
use Time::HiRes qw(time usleep);
use PgTide::TestNode qw(tide_node wait_until);

our @EXPORT = qw(remote_node remote_outbox local_node remote_source_config inbox_ids error_class random_faults);

# The password of role relay on a remote node.
our $PASSWORD = 'relay-secret';

# remote_node($name, $extra_conf, @hba): a node with pg_tide listening on
# 127.0.0.1 (its own relay off), role relay (LOGIN, tide_consumer, password
# $PASSWORD), and a pg_hba.conf that trusts the local socket and asks relay
# for its password over TCP (scram-sha-256), then the lines @hba.
sub remote_node
{
	my ($name, $extra_conf, @hba) = @_;
	my $node = tide_node($name, "listen_addresses = '127.0.0.1'\npg_tide.relay_enabled = off\n"
		  . "log_statement = none\n" . ($extra_conf // ''));
	$node->safe_psql('postgres', "CREATE ROLE relay LOGIN PASSWORD '$PASSWORD' IN ROLE tide_consumer");
	open my $f, '>', $node->data_dir . '/pg_hba.conf' or die "remote_node: $!";
	print $f join("\n", 'local all all trust', 'host all relay 127.0.0.1/32 scram-sha-256', @hba), "\n";
	close $f;
	$node->reload;
	return $node;
}

# remote_outbox($remote, $outbox, $group): outbox $outbox on $remote, which
# role relay may consume, with consumer group $group.
sub remote_outbox
{
	my ($remote, $outbox, $group) = @_;
	$remote->safe_psql('postgres', qq{
		SELECT tide.outbox_create('$outbox');
		SELECT tide.outbox_grant_consume('$outbox', 'relay');
		SELECT tide.create_consumer_group('$group', '$outbox')});
}

# local_node($name, $extra_conf): the node whose relay reaches the remote,
# started with PG_TIDE_REMOTE_PASSWORD in its environment (the password
# the configs refer to).
sub local_node
{
	my ($name, $extra_conf) = @_;
	$ENV{PG_TIDE_REMOTE_PASSWORD} = $PASSWORD;
	return tide_node($name, $extra_conf);
}

# inbox_ids($node, $inbox, $outbox): the ids of outbox $outbox's messages
# in inbox $inbox of $node (event id outbox_<outbox>:<id>) => times present.
sub inbox_ids
{
	my ($node, $inbox, $outbox) = @_;
	my %seen;
	for (split /\n/, $node->safe_psql('postgres', "SELECT event_id FROM tide.${inbox}_inbox"))
	{
		$seen{$1}++ if /^outbox_\Q$outbox\E:(\d+)$/;
	}
	return \%seen;
}

# error_class($node, $pipeline): the class of the pipeline's last error on
# $node, '' when none.
sub error_class
{
	my ($node, $pipeline) = @_;
	return $node->safe_psql('postgres',
		"SELECT coalesce(last_error_class, '') FROM tide.relay_pipeline_health WHERE pipeline_id = '$pipeline'");
}

# remote_source_config($remote, %keys): the config of a postgres source
# reading $remote as role relay over TCP, its password taken from
# PG_TIDE_REMOTE_PASSWORD (which the test sets before the local node
# starts), with short timeouts; %keys are added to it.
sub remote_source_config
{
	my ($remote, %keys) = @_;
	return { source_type => 'postgres',
		connection => 'host=127.0.0.1 port=' . $remote->port . ' dbname=postgres user=relay',
		password => { env => 'PG_TIDE_REMOTE_PASSWORD' },
		connect_timeout_ms => 2000, statement_timeout_ms => 10000, %keys };
}

# Starts a node again after kill -9 of its postmaster: a start fails while
# the old server's processes still hold its shared memory, and the node
# then believes it runs, so it is told otherwise before each try.
sub restart_after_kill9
{
	my ($node, $what) = @_;
	$node->kill9;
	defined wait_until(sub { $node->{_pid} = undef; $node->start(fail_ok => 1) }, 30, 200_000)
	  or BAIL_OUT("$what does not start again after kill -9");
}

# random_faults($seconds, $seed, $work, $local, $remote): until $seconds
# have passed, runs $work->() (which publishes), waits up to 0.7 s, then
# makes one fault at random: kill -9 of the local or of the remote
# postmaster (started again at once), or SIGTERM of the local relay worker
# (the launcher starts another). Returns the faults made by kind.
sub random_faults
{
	my ($seconds, $seed, $work, $local, $remote) = @_;
	my %faults = (local => 0, remote => 0, worker => 0);
	my $until = time() + $seconds;

	srand($seed);
	while (time() < $until)
	{
		$work->();
		usleep(int(rand(700_000)));
		my $what = (qw(local remote worker))[ int(rand(3)) ];
		if ($what eq 'worker')
		{
			$local->safe_psql('postgres',
				"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'pg_tide relay worker'");
		}
		else
		{
			restart_after_kill9($what eq 'local' ? $local : $remote, $what);
		}
		$faults{$what}++;
	}
	return \%faults;
}

1;
