# A started test cluster with pg_tide preloaded and installed, for the TAP
# tests in test/t.
package PgTide::TestNode;

use strict;
use warnings;
use Exporter 'import';
use PostgreSQL::Test::Cluster;
use Time::HiRes qw(time usleep);
use IO::Socket::INET;
use File::Basename qw(dirname);
use File::Path qw(make_path);

our @EXPORT = qw(tide_node);
our @EXPORT_OK = qw(wait_until disk_full unanswered_port keep_relay_worker installation_copy exited);

# tide_node($name, $extra_conf, %init): a new node with pg_tide preloaded,
# the given postgresql.conf lines appended, started, and the extension
# created in database postgres. %init goes to PostgreSQL::Test::Cluster's
# init (allows_streaming => 1 for a primary with standbys).
sub tide_node
{
	my ($name, $extra_conf, %init) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(%init);
	$node->append_conf('postgresql.conf',
		"shared_preload_libraries = 'pg_tide'\n" . ($extra_conf // ''));
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION pg_tide');
	return $node;
}

# installation_copy(): a copy of the PostgreSQL installation that pg_config
# names, in the test's directory, with the layout that locates share/ and
# lib/ from bin/, so that a test may take a module out of it or put one in.
# Returns its install_path (for PostgreSQL::Test::Cluster->new) and its
# $libdir.
sub installation_copy
{
	my $bindir = `pg_config --bindir`;
	chomp $bindir;
	my $sharedir = `pg_config --sharedir`;
	chomp $sharedir;
	my $pkglibdir = `pg_config --pkglibdir`;
	chomp $pkglibdir;
	my $root = PostgreSQL::Test::Utils::tempdir . '/install';
	my $libroot = dirname($bindir);
	my @a = split m{/}, $libroot;
	my @b = split m{/}, $sharedir;
	my $common = 0;
	$common++ while $common < @a && $common < @b && $a[$common] eq $b[$common];
	my $prefix = join('/', @a[ 0 .. $common - 1 ]);
	my ($rel_lib, $rel_share) = (substr($libroot, length($prefix)), substr($sharedir, length($prefix)));
	make_path(dirname("$root$rel_lib"), dirname("$root$rel_share"));
	system('cp', '-a', $libroot, "$root$rel_lib") == 0 or die 'cannot copy the installation';
	system('cp', '-a', $sharedir, "$root$rel_share") == 0 or die 'cannot copy the installation';
	return ("$root$rel_lib", "$root$rel_lib" . substr($pkglibdir, length($libroot)));
}

# keep_relay_worker($node, $db): gives database $db an enabled pipeline, so
# that it holds a relay worker (relay/on_demand.c): a row the validator
# would refuse (written with triggers off), so that it delivers nothing,
# and the wake-up the row's trigger would have asked for at commit.
sub keep_relay_worker
{
	my ($node, $db) = @_;
	$node->safe_psql($db, "SET session_replication_role = replica; BEGIN;
		INSERT INTO tide.relay_outbox_config (name, config) VALUES ('wake', '{}');
		SELECT tide._relay_wake_worker(); COMMIT");
}

# Waits until the sub returns true, at most $timeout seconds; returns the
# time taken, or undef.
sub wait_until
{
	my ($cond, $timeout, $step) = @_;
	my $start = time();
	while (time() - $start < $timeout)
	{
		return time() - $start if $cond->();
		usleep($step // 20_000);
	}
	return undef;
}

# exited($pid): whether a process has exited: gone, or a zombie (an orphan
# of a killed postmaster stays one until whoever inherited it reaps it,
# which in a container can take seconds).
sub exited
{
	my ($pid) = @_;
	return 1 unless kill(0, $pid);
	open(my $fh, '<', "/proc/$pid/stat") or return 1;
	my $stat = <$fh>;
	close $fh;
	return defined $stat && $stat =~ /^\d+ \(.*\) Z /;
}

# disk_full($node, $table, $events): makes every statement that writes table
# $table (events 'INSERT' unless given, e.g. 'INSERT OR UPDATE') fail as on
# a full disk ("could not extend file: No space left on device", SQLSTATE
# 53100), with a trigger named disk_full; DROP TRIGGER disk_full ON $table
# ends it. What a full tablespace under the table did in a manual run
# (docs/relay.md, "Disk full and out of connections").
sub disk_full
{
	my ($node, $table, $events) = @_;
	$events //= 'INSERT';
	$node->safe_psql('postgres', qq{
		CREATE OR REPLACE FUNCTION public.disk_full() RETURNS trigger LANGUAGE plpgsql AS \$\$
		BEGIN
			RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = 'disk_full';
		END \$\$;
		CREATE TRIGGER disk_full BEFORE $events ON $table
			FOR EACH STATEMENT EXECUTE FUNCTION public.disk_full()});
}

# unanswered_port(): a port of 127.0.0.1 that never answers, as an address
# whose packets are lost: a socket listens there and never accepts, and
# its backlog (1) is filled first, so that the kernel drops the SYNs of
# every connection tried later. Returns the port and a sub that closes
# it all (or let the sockets go when the test ends).
sub unanswered_port
{
	my $listen = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 1, ReuseAddr => 1)
	  or die "unanswered_port: $!";
	# a backlog of 1 holds two connections
	my @fillers = grep { defined } map {
		IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $listen->sockport, Blocking => 0)
	} 1 .. 3;
	return ($listen->sockport, sub { close $_ for @fillers, $listen; });
}

1;
