# The postgres endpoint (relay/endpoints/postgres) against a remote
# database that does not answer: a silent server holds only its own
# pipeline. Both directions (a postgres sink and a postgres source) and
# five kinds of silence, each with connect_timeout_ms and
# statement_timeout_ms of 1 s:
#
#   a. a listener on 127.0.0.1 that never accepts: the kernel completes
#      the TCP connection and nothing ever answers libpq's first packet;
#   b. a server that accepts, declines TLS ('N'), reads the startup packet
#      and then never answers;
#   c. a server that accepts TLS ('S') and never answers the handshake;
#   d. an address whose packets are lost (PgTide::TestNode's
#      unanswered_port: the TCP connect itself never completes);
#   e. a real remote cluster stopped (SIGSTOP of its postmaster and every
#      backend) while both pipelines are connected, the sink's call and
#      the source's tide.wait_for_messages in flight.
#
#  1. A healthy webhook pipeline of the same database keeps its latency
#     beside the ten silent pipelines: 50 messages 40 ms apart, p50 and
#     max bounded (max < 2 s, p50 within max(3 x alone, alone + 50 ms)).
#  2. Each silent pipeline is held with class timeout, and in 15 s writes
#     at most 3 lines to the log (the hold's start, not each attempt).
#  3. No worker is stuck: relay_disable of a silent pipeline takes effect
#     in the worker within 5 s, and the worker ends within 5 s of SIGTERM.
#  4. The silence ends (a, b and c forward to the real remote from then
#     on, e gets SIGCONT; d stays silent): every pipeline recovers by
#     itself, every message is in its inbox exactly once, nothing is
#     dead-lettered.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until exited unanswered_port);
use PgTide::Receiver;
use PgTide::Remote;
use IO::Socket::INET;
use IO::Select;
use JSON::PP;
use POSIX ();
use Time::HiRes qw(time usleep);

my $t0 = time();
my $json = JSON::PP->new->canonical;
my $dir = PostgreSQL::Test::Utils::tempdir;

my $remote = remote_node('remote');
$remote->safe_psql('postgres', q{
	SELECT tide.outbox_create('events');
	SELECT tide.outbox_grant_consume('events', 'relay');
	SELECT tide.create_consumer_group('g_' || k, 'events') FROM unnest(ARRAY['a', 'b', 'c', 'd', 'e']) k;
	SELECT tide.inbox_create('in_' || k) FROM unnest(ARRAY['a', 'b', 'c', 'd', 'e']) k});

$ENV{PG_TIDE_REMOTE_PASSWORD} = $PgTide::Remote::PASSWORD;
my $node = tide_node('local', "pg_tide.relay_naptime_ms = 200\n");

sub sql { return $node->safe_psql('postgres', $_[0]) }
sub rsql { return $remote->safe_psql('postgres', $_[0]) }

# A server on 127.0.0.1 in a child process: silent as $mode says
# ('never': it never accepts; 'stall': it accepts, declines TLS, reads
# the startup packet and never answers; 'tls': it accepts, agrees to TLS
# and never answers the handshake), and from SIGUSR1 on a proxy to
# the remote cluster for every new connection. Returns its port and pid.
sub silent_server
{
	my ($mode) = @_;
	my $listen = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 128, ReuseAddr => 1)
	  or die "cannot listen: $!";
	my $pid = fork() // die "fork: $!";
	return ($listen->sockport, $pid) if $pid;

	# the child never returns: the test's END blocks are the parent's
	eval { serve($listen, $mode) };
	POSIX::_exit(0);
}

# silent_server's loop, for at most 300 s.
sub serve
{
	my ($listen, $mode) = @_;
	my $forward = 0;
	local $SIG{USR1} = sub { $forward = 1 };
	my $sel = IO::Select->new;
	my %peer;		# a proxied socket => the other end
	my $until = time() + 300;
	while (time() < $until)
	{
		$sel->add($listen) if ($forward || $mode ne 'never') && !$sel->exists($listen);
		for my $s ($sel->can_read(0.1))
		{
			if ($s == $listen)
			{
				my $c = $listen->accept or next;
				$sel->add($c);
				next unless $forward;
				my $r = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $remote->port);
				if (!$r) { $sel->remove($c); close $c; next }
				$sel->add($r);
				($peer{$c}, $peer{$r}) = ($r, $c);
				next;
			}
			my $n = sysread($s, my $buf, 65536);
			if (!$n)
			{
				my @ends = grep { defined } ($s, $peer{$s});
				for my $x (@ends)
				{
					$sel->remove($x);
					delete $peer{$x};
					close $x;
				}
				next;
			}
			if ($peer{$s})
			{
				my $off = 0;
				while ($off < $n)
				{
					my $w = syswrite($peer{$s}, $buf, $n - $off, $off);
					last unless $w;
					$off += $w;
				}
			}
			# the SSLRequest (8 bytes, code 80877103): declined, so that
			# libpq sends its startup packet, or agreed to, so that it
			# starts a handshake; neither is ever answered
			elsif ($n == 8 && unpack('N', substr($buf, 4, 4)) == 80877103)
			{
				syswrite($s, $mode eq 'tls' ? 'S' : 'N');
			}
		}
	}
}

my ($port_a, $pid_a) = silent_server('never');
my ($port_b, $pid_b) = silent_server('stall');
my ($port_c, $pid_c) = silent_server('tls');
my ($port_d, $close_d) = unanswered_port();
my @stopped;

# Whatever ends the test, the stopped remote goes on (else its stop hangs)
# and the servers end; this runs before the clusters' own END.
END
{
	kill 'CONT', @stopped if @stopped;
	kill 'KILL', grep { defined && $_ > 0 } $pid_a, $pid_b, $pid_c;
}

# The remote cluster's processes: its postmaster and its children.
sub remote_pids
{
	my $pm = $remote->{_pid};
	my @kids;
	for my $stat (glob('/proc/[0-9]*/stat'))
	{
		open(my $fh, '<', $stat) or next;
		my $line = <$fh> // '';
		close $fh;
		push @kids, $1 if $line =~ /^(\d+) \(.*\) \S (\d+) / && $2 == $pm;
	}
	return ($pm, @kids);
}

my $healthy = PgTide::Receiver->new(dir => $dir);
$healthy->start;

my %timeouts = (connect_timeout_ms => 1000, statement_timeout_ms => 1000);
sub connection_to
{
	my ($port) = @_;
	return (connection => "host=127.0.0.1 port=$port dbname=postgres user=relay",
		password => { env => 'PG_TIDE_REMOTE_PASSWORD' }, %timeouts);
}

sub set_sink
{
	my ($name, $port, $inbox) = @_;
	my $c = $json->encode({ sink_type => 'postgres', inbox => $inbox, connection_to($port),
			retry => { base_ms => 100, cap_ms => 1000 } });
	sql("SELECT tide.relay_set_outbox('$name', 'orders', '$name', '$c'::jsonb)");
}

sub set_source
{
	my ($name, $port, $group) = @_;
	my $c = $json->encode({ source_type => 'postgres', outbox => 'events', consumer_group => $group,
			connection_to($port) });
	sql("SELECT tide.inbox_create('$name')");
	sql("SELECT tide.relay_set_inbox('$name', '$name', '$c'::jsonb)");
}

sub health
{
	return sql("SELECT coalesce(last_error_class, '') || '|' || coalesce(held_reason, '') || '|' || coalesce(last_error, '')
				FROM tide.relay_pipeline_health WHERE pipeline_id = '$_[0]'");
}

# The commit-to-receipt waits (seconds, sorted) of the healthy webhook
# pipeline over 50 messages published 40 ms apart, one commit each.
sub waits { return $healthy->commit_waits($node, 'hooks', $_[0], 50, 0.04) }

sub publish_orders
{
	return split /\n/, sql("SELECT tide.outbox_publish('orders', jsonb_build_object('n', g)) FROM generate_series(1, $_[0]) g");
}

sub publish_events
{
	return split /\n/, rsql("SELECT tide.outbox_publish('events', jsonb_build_object('n', g)) FROM generate_series(1, $_[0]) g");
}

# How many ids of @$ids are not in $inbox exactly once, and how many rows it has.
sub not_once
{
	my ($inbox, $ids, $remote_side) = @_;
	my @rows = split /\n/, ($remote_side ? \&rsql : \&sql)->("SELECT event_id FROM tide.${inbox}_inbox");
	my %seen;
	$seen{$_}++ for @rows;
	my $prefix = $remote_side ? 'outbox_orders:' : 'outbox_events:';
	return (scalar(grep { ($seen{"$prefix$_"} // 0) != 1 } @$ids), scalar(@rows));
}

sql("SELECT tide.outbox_create('hooks'); SELECT tide.outbox_create('orders')");
my $hook = $json->encode({ sink_type => 'webhook', url => $healthy->url, allow_http => JSON::PP::true,
		allow_private_network => JSON::PP::true });
sql("SELECT tide.relay_set_outbox('healthy', 'hooks', 'healthy', '$hook'::jsonb)");

###########################################################################
# 1. The healthy pipeline alone, then beside the silent ones
###########################################################################
my $alone = waits('alone');
ok(defined $alone, 'test 1: the healthy pipeline delivers 50 messages alone');
BAIL_OUT('the healthy pipeline does not deliver') unless defined $alone;

# e: connected and delivering before the remote stops
set_sink('sink_e', $remote->port, 'in_e');
set_source('source_e', $remote->port, 'g_e');
my @orders = publish_orders(5);
my @events = publish_events(5);
ok(defined wait_until(sub { (not_once('in_e', \@orders, 1))[0] == 0 && (not_once('source_e', \@events))[0] == 0 }, 30),
	'test 1: sink_e and source_e deliver while the remote answers');
# the source's wait_for_messages is then in flight, the sink's connection idle
usleep(300_000);

my $log_at = -s $node->logfile;
my $t_silent = time();
@stopped = remote_pids();
kill 'STOP', @stopped;
set_sink('sink_a', $port_a, 'in_a');
set_sink('sink_b', $port_b, 'in_b');
set_source('source_a', $port_a, 'g_a');
set_source('source_b', $port_b, 'g_b');
set_sink('sink_c', $port_c, 'in_c');
set_source('source_c', $port_c, 'g_c');
set_sink('sink_d', $port_d, 'in_d');
set_source('source_d', $port_d, 'g_d');
# sink_e sends these on its open connection: a call that is never answered
push @orders, publish_orders(5);

my $beside = waits('beside');
ok(defined $beside, 'test 1: beside the ten silent pipelines the healthy pipeline delivers 50 messages');
if (defined $beside)
{
	my ($a, $b) = ($alone->[25], $beside->[25]);
	note(sprintf('healthy pipeline: p50 alone %.1f ms, beside %.1f ms; max alone %.1f ms, beside %.1f ms',
			$a * 1000, $b * 1000, $alone->[-1] * 1000, $beside->[-1] * 1000));
	cmp_ok($beside->[-1], '<', 2, 'test 1: beside the silent pipelines its max is under 2 s');
	my $bound = $a * 3 > $a + 0.050 ? $a * 3 : $a + 0.050;
	cmp_ok($b, '<=', $bound, 'test 1: its p50 is within max(3 x alone, alone + 50 ms)');
}

###########################################################################
# 2. Held with class timeout, and a quiet log
###########################################################################
my @silent = map { ("sink_$_", "source_$_") } qw(a b c d e);
for my $name (@silent)
{
	ok(defined wait_until(sub { health($name) =~ /^timeout\|.+\|.*timeout/ }, 15, 100_000),
		"test 2: $name is held with class timeout and an error that says so")
	  or diag("$name: " . health($name));
}
my $wait = $t_silent + 15 - time();
usleep(int($wait * 1e6)) if $wait > 0;
my $log = slurp_file($node->logfile, $log_at);
for my $name (@silent)
{
	my @lines = grep { /pipeline "\Q$name\E"/ } split /\n/, $log;
	cmp_ok(scalar(@lines), '<=', 3, "test 2: $name writes at most 3 log lines in 15 s of silence")
	  or diag(join("\n", @lines[ 0 .. ($#lines < 9 ? $#lines : 9) ]));
}

###########################################################################
# 3. No worker stuck
###########################################################################
{
	my $at = -s $node->logfile;
	my $t = time();
	sql("SELECT tide.relay_disable('sink_b'); SELECT tide.relay_disable('source_b')");
	my $took = wait_until(sub {
		my $l = slurp_file($node->logfile, $at);
		$l =~ /pipeline "sink_b" is no longer held: this worker no longer serves it/
		  && $l =~ /pipeline "source_b" is no longer held: this worker no longer serves it/ }, 10, 50_000);
	ok(defined $took && $took < 5, sprintf('test 3: relay_disable of two silent pipelines takes effect within 5 s (%.2f s)', $took // -1));
	sql("SELECT tide.relay_enable('sink_b'); SELECT tide.relay_enable('source_b')");

	my $pid = sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_tide relay worker'");
	ok($pid =~ /^\d+$/, 'test 3: one relay worker serves the database');
	$t = time();
	kill 'TERM', $pid;
	$took = wait_until(sub { exited($pid) }, 10, 20_000);
	ok(defined $took && $took < 5, sprintf('test 3: the worker ends within 5 s of SIGTERM (%.2f s)', $took // -1));
}

###########################################################################
# 4. The silence ends: everything arrives exactly once
###########################################################################
kill 'USR1', $pid_a, $pid_b, $pid_c;
kill 'CONT', @stopped;
push @orders, publish_orders(20);
push @events, publish_events(20);
ok(defined wait_until(sub {
	!grep { (not_once($_, \@orders, 1))[0] } qw(in_a in_b in_c in_e) }, 40, 200_000),
	'test 4: every order is in each remote inbox exactly once');
ok(defined wait_until(sub {
	!grep { (not_once($_, \@events))[0] } qw(source_a source_b source_c source_e) }, 40, 200_000),
	'test 4: every remote event is in each local inbox exactly once');
is(join(',', map { (not_once($_, \@orders, 1))[1] } qw(in_a in_b in_c in_e)), join(',', (scalar(@orders)) x 4),
	'test 4: and nothing else in the remote inboxes');
is(join(',', map { (not_once($_, \@events))[1] } qw(source_a source_b source_c source_e)), join(',', (scalar(@events)) x 4),
	'test 4: nor in the local ones');
ok(defined wait_until(sub { sql("SELECT count(*) FROM tide.relay_pipeline_health
		WHERE pipeline_id IN ('sink_a', 'sink_b', 'sink_c', 'sink_e', 'source_a', 'source_b', 'source_c', 'source_e')
		  AND held_reason IS NULL") == 8 }, 20),
	'test 4: no pipeline is held any more');
like(health('sink_d'), qr/^timeout\|.+/, 'test 4: sink_d, whose address stays silent, is still held');
is(sql("SELECT count(*) FROM tide.relay_dlq"), '0', 'nothing was dead-lettered');
unlike(slurp_file($node->logfile), qr/terminated by signal/, 'no server process crashed');

kill 'KILL', $pid_a, $pid_b, $pid_c;
waitpid($_, 0) for $pid_a, $pid_b, $pid_c;
($pid_a, $pid_b, $pid_c, @stopped) = ();
$close_d->();
$healthy->stop;
note(sprintf('took %.1f s', time() - $t0));
done_testing();
