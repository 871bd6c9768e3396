# The MQTT sink's faults, against a real Mosquitto broker read by
# mosquitto_sub with a persistent session: a broker that is down holds the
# pipeline (class connection) and dead-letters nothing, and the pipeline
# delivers once it is up; the broker stopped and started again in the
# middle of a backlog loses nothing and the pipeline recovers by itself; the
# connection cut while messages are in flight (a proxy loses what is sent,
# then closes) loses nothing: what the broker never got is sent again; a
# broker that stops answering (SIGSTOP) fails the batch with class timeout,
# retried, and delivered once it answers again; kill -9 of the postmaster
# in the middle of a backlog loses nothing, with duplicates only from the
# batches in flight; a broker address that never answers holds its
# pipeline (class timeout) and not a file pipeline beside it in the worker,
# over plain TCP and over TLS (whose connect runs on a thread).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until unanswered_port);
use PgTide::Mosquitto;
use JSON::PP;
use Time::HiRes qw(time usleep);
use IO::Select;
use IO::Socket::INET;
use POSIX ();

my $node = tide_node('mqtt_faults', "pg_tide.relay_naptime_ms = 100\nrestart_after_crash = on\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new->canonical;
my $mq = PgTide::Mosquitto->new(dir => $dir);

sub sql { return $node->safe_psql('postgres', $_[0]); }

sub set_pipeline
{
	my ($name, $outbox, %cfg) = @_;
	my $c = $json->encode({ sink_type => 'mqtt', host => '127.0.0.1', port => $mq->port,
		topic => $outbox, retry => { base_ms => 100, cap_ms => 1000 }, %cfg });
	sql("SELECT tide.relay_set_outbox('$name', '$outbox', '$name', '$c')");
}

sub publish
{
	my ($outbox, $n) = @_;
	return split /\n/, sql("SELECT tide.outbox_publish('$outbox', jsonb_build_object('n', g))
		FROM generate_series(1, $n) g");
}

# How many of @ids the subscriber got, and how many copies beyond one.
sub counts
{
	my ($out, @ids) = @_;
	my $m = $mq->by_id($out);
	my ($got, $dups) = (0, 0);
	for (@ids)
	{
		next unless $m->{$_};
		$got++;
		$dups += @{ $m->{$_} } - 1;
	}
	return ($got, $dups);
}

# The number of lines a subscriber has written, cheaply.
sub lines
{
	my ($out) = @_;
	open(my $fh, '<', $out) or return 0;
	my $n = 0;
	$n++ while <$fh>;
	close $fh;
	return $n;
}

# A TCP proxy in a child process, from a free port to the broker's: on
# SIGUSR1 it discards what clients send for a second (a network that
# loses packets), then closes every connection (as a cut does), and goes
# on proxying new ones. Returns its port and pid.
sub start_proxy
{
	my ($to_port) = @_;
	my $listen = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 10, ReuseAddr => 1)
	  or die "proxy: $!";
	my $port = $listen->sockport;
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	return ($port, $pid) if $pid;
	my $cut_at = 0;
	local $SIG{USR1} = sub { $cut_at = time() };
	my $sel = IO::Select->new($listen);
	my %peer;
	my %from_client;
	while (1)
	{
		for my $s ($sel->can_read(0.05))
		{
			if ($s == $listen)
			{
				my $c = $listen->accept or next;
				my $b = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $to_port);
				if (!$b) { close $c; next; }
				$peer{$c} = $b;
				$peer{$b} = $c;
				$from_client{$c} = 1;
				$sel->add($c, $b);
				next;
			}
			my $n = sysread($s, my $buf, 65536);
			my $o = $peer{$s};
			if (!$n)
			{
				$sel->remove($s, $o);
				close $s;
				close $o if $o;
				delete @peer{ $s, $o // '' };
				next;
			}
			next if $cut_at && $from_client{$s};	# lost on the way
			syswrite($o, $buf) if $o;
		}
		if ($cut_at && time() - $cut_at > 1)
		{
			for my $s ($sel->handles)
			{
				next if $s == $listen;
				$sel->remove($s);
				close $s;
			}
			%peer = ();
			%from_client = ();
			$cut_at = 0;
		}
	}
	POSIX::_exit(0);
}

sub health { return sql("SELECT health FROM tide.relay_pipeline_status WHERE pipeline = '$_[0]'"); }

# --- The broker down when the pipeline starts: held, class connection.
$mq->start;
my $sub = $mq->subscribe('down', id => 'reader-down');
$mq->stop;
sql("SELECT tide.outbox_create('down')");
set_pipeline('dq', 'down');
my @ids = publish('down', 100);
ok(defined wait_until(sub {
	sql("SELECT count(*) >= 2 FROM tide.relay_attempts WHERE pipeline_id = 'dq' AND error_class = 'connection'") eq 't' }, 30, 100_000),
	'broker down: attempts fail with class connection');
like(sql("SELECT error FROM tide.relay_attempts WHERE pipeline_id = 'dq' AND error_class = 'connection' LIMIT 1"),
	qr/could not connect to 127\.0\.0\.1:\d+: Connection refused/, 'the error says the connection was refused');
is(health('dq'), 'held', 'the pipeline is held');
is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'dq'"), '0', 'nothing dead-lettered');
is(sql("SELECT count(*) FROM tide.relay_retry_queue WHERE pipeline_id = 'dq'"), '0', 'nothing queued for retry');
$mq->start;
ok($mq->wait_for_ids($sub, \@ids, 0, 30), 'once the broker is up, every message is delivered');

# --- The broker stopped and started again in the middle of a backlog.
sql("SELECT tide.outbox_create('restart')");
my $sub2 = $mq->subscribe('restart', id => 'reader-restart');
# paced, so that the stop comes in the middle of the backlog
set_pipeline('rq', 'restart', batch_size => 50, max_in_flight => 20, rate_limit => { per_second => 500 });
@ids = publish('restart', 4000);
ok(defined wait_until(sub { lines($sub2) >= 300 }, 30, 20_000), 'restart: delivery under way');
$mq->stop;
my ($at_stop) = counts($sub2, @ids);
note("broker stopped with $at_stop of 4000 messages received");
cmp_ok($at_stop, '<', 4000, 'the broker stopped while messages were undelivered');
ok(defined wait_until(sub {
	sql("SELECT count(*) > 0 FROM tide.relay_attempts WHERE pipeline_id = 'rq' AND error_class = 'connection'") eq 't' }, 30, 100_000),
	'while it is stopped: attempts fail with class connection');
usleep(1_000_000);
$mq->start;
ok($mq->wait_for_ids($sub2, \@ids, 0, 60), 'after the restart every message arrived');
my ($got, $dups) = counts($sub2, @ids);
note("restart: $dups duplicates");
is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'rq'"), '0', 'restart: nothing dead-lettered');
ok(defined wait_until(sub { health('rq') ne 'held' }, 20, 100_000), 'the pipeline recovered by itself');

# --- The connection cut while messages are in flight: what the broker
# never got is not counted delivered, and is sent again.
sql("SELECT tide.outbox_create('cut')");
my $sub5 = $mq->subscribe('cut', id => 'reader-cut');
my ($proxy_port, $proxy_pid) = start_proxy($mq->port);
my $c = $json->encode({ sink_type => 'mqtt', host => '127.0.0.1', port => $proxy_port, topic => 'cut',
	batch_size => 50, max_in_flight => 20, timeout_ms => 5000, rate_limit => { per_second => 500 },
	retry => { base_ms => 100, cap_ms => 1000 } });
sql("SELECT tide.relay_set_outbox('xq', 'cut', 'xq', '$c')");
@ids = publish('cut', 3000);
ok(defined wait_until(sub { lines($sub5) >= 300 }, 30, 20_000), 'cut: delivery under way');
kill 'USR1', $proxy_pid;
usleep(500_000);
my ($at_cut) = counts($sub5, @ids);
note("connection cut with $at_cut of 3000 messages received");
ok(defined wait_until(sub {
	sql("SELECT count(*) > 0 FROM tide.relay_attempts WHERE pipeline_id = 'xq' AND error_class IN ('connection', 'timeout')") eq 't' }, 30, 100_000),
	'the cut fails attempts with class connection or timeout');
ok($mq->wait_for_ids($sub5, \@ids, 0, 60), 'after the cut every message arrived');
($got, $dups) = counts($sub5, @ids);
note("cut: $dups duplicates");
is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'xq'"), '0', 'cut: nothing dead-lettered');
kill 'KILL', $proxy_pid;
waitpid($proxy_pid, 0);

# --- A broker that stops answering: class timeout, retried, then delivered.
sql("SELECT tide.outbox_create('stall')");
my $sub3 = $mq->subscribe('stall', id => 'reader-stall');
set_pipeline('tq', 'stall', timeout_ms => 1000);
kill 'STOP', $mq->pid;
@ids = publish('stall', 30);
my $timed_out = wait_until(sub {
	sql("SELECT count(*) > 0 FROM tide.relay_attempts WHERE pipeline_id = 'tq' AND error_class = 'timeout'") eq 't' }, 30, 100_000);
kill 'CONT', $mq->pid;
ok(defined $timed_out, 'a broker that does not acknowledge: attempts fail with class timeout');
ok($mq->wait_for_ids($sub3, \@ids, 0, 60), 'once it answers, every message arrives');
is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'tq'"), '0', 'stall: nothing dead-lettered');

# Publishes $count messages to $outbox one at a time, each awaited (10 s
# at most) in the file its pipeline writes; returns how many arrived and
# the slowest one's seconds.
sub deliver_one_by_one
{
	my ($outbox, $file, $count) = @_;
	my ($arrived, $took) = (0, 0);
	for my $n (1 .. $count)
	{
		my $t0 = time();
		sql("SELECT tide.outbox_publish('$outbox', jsonb_build_object('n', $n))");
		last unless defined wait_until(sub { lines($file) >= $n }, 10, 20_000);
		$took = time() - $t0 if time() - $t0 > $took;
		$arrived = $n;
	}
	return ($arrived, $took);
}

# Waits (30 s at most) until pipeline $p is held with class timeout; the
# test is named $what, and shows the pipeline's status when it fails.
sub held_by_timeout
{
	my ($p, $what) = @_;
	ok(defined wait_until(sub {
		sql("SELECT health || ' ' || coalesce(last_error_class, '') FROM tide.relay_pipeline_status WHERE pipeline = '$p'") eq 'held timeout' }, 30, 100_000),
		$what)
	  or diag(sql("SELECT to_jsonb(s) FROM tide.relay_pipeline_status s WHERE pipeline = '$p'"));
}

# --- A broker address that never answers (unanswered_port: the
# kernel drops the relay's SYNs, as a network that loses them): the MQTT
# pipeline waits without blocking the worker, so a file pipeline beside it,
# in the same worker, delivers each of 20 messages meanwhile; the MQTT
# pipeline fails with class timeout and is held, nothing dead-lettered.
{
	my ($silent_port, $close_silent) = unanswered_port();
	my $file = "$dir/beside.jsonl";
	sql("SELECT tide.outbox_create('silent')");
	sql("SELECT tide.outbox_create('beside')");
	set_pipeline('sq', 'silent', port => $silent_port, timeout_ms => 4000);
	publish('silent', 3);
	sql("SELECT tide.relay_set_outbox('bf', 'beside', 'bf', jsonb_build_object('sink_type', 'file', 'path', '$file'))");
	# the MQTT pipeline's first connection is made before the file's messages come
	usleep(500_000);
	my ($arrived, $took) = deliver_one_by_one('beside', $file, 20);
	is($arrived, 20, 'beside a broker that never answers, the file pipeline delivers each of 20 messages');
	note(sprintf('slowest of the file pipeline\'s messages: %.2f s', $took));
	held_by_timeout('sq', 'the silent broker: held, class timeout');
	is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'sq'"), '0', 'silent: nothing dead-lettered');
	sql("SELECT tide.relay_delete('sq')");
	sql("SELECT tide.relay_delete('bf')");
	$close_silent->();
}

# --- The same over TLS: libmosquitto's connect looks the name up and makes
# the TCP connection blocking, so it runs on a thread of the pipeline's own
# (the connector); the file pipeline beside it delivers meanwhile. Its
# pipeline deleted while the connect still waits, the worker gives the
# connector up; once the address refuses, the thread returns and destroys
# the client itself, and the worker goes on.
{
	my ($silent_port, $close_silent) = unanswered_port();
	my $file = "$dir/beside_tls.jsonl";
	my $pid = sql("SELECT pid FROM tide.relay_workers() WHERE database = 'postgres'");
	my $threads = sub { my @t = glob("/proc/$pid/task/*"); return scalar @t };
	my $threads_before = $threads->();
	sql("SELECT tide.outbox_create('silent_tls')");
	sql("SELECT tide.outbox_create('beside_tls')");
	set_pipeline('sqt', 'silent_tls', port => $silent_port, timeout_ms => 3000, tls => JSON::PP::true);
	publish('silent_tls', 3);
	sql("SELECT tide.relay_set_outbox('bft', 'beside_tls', 'bft', jsonb_build_object('sink_type', 'file', 'path', '$file'))");
	ok(defined wait_until(sub { $threads->() > $threads_before }, 10),
		'TLS: the connect waits on a thread of its own');
	my ($arrived, $took) = deliver_one_by_one('beside_tls', $file, 10);
	# (a connect in the loop would hold them for minutes: the kernel tries for about two)
	is($arrived, 10, 'TLS: beside a broker that never answers, the file pipeline delivers each of 10 messages within 10 s');
	note(sprintf('TLS: slowest of the file pipeline\'s messages: %.2f s', $took));
	held_by_timeout('sqt', 'TLS, the silent broker: held, class timeout');
	like(sql("SELECT error FROM tide.relay_attempts WHERE pipeline_id = 'sqt' ORDER BY attempted_at LIMIT 1"),
		qr/TCP connect\) was not made within the batch's timeout_ms/, 'TLS: the error says the connection was not made');
	is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'sqt'"), '0', 'TLS, silent: nothing dead-lettered');
	cmp_ok($threads->(), '>', $threads_before, 'the connect still waits');
	sql("SELECT tide.relay_delete('sqt')");
	# the address now refuses: the connect's next SYN gets a reset
	$close_silent->();
	ok(defined wait_until(sub { $threads->() == $threads_before }, 70, 100_000),
		'TLS: the abandoned connect\'s thread returns (and destroys its client)');
	sql("SELECT tide.outbox_publish('beside_tls', '{\"n\": 11}')");
	ok(defined wait_until(sub { lines($file) >= 11 }, 10, 20_000), 'TLS: and the worker delivers on');
	is(sql("SELECT pid FROM tide.relay_workers() WHERE database = 'postgres'"), $pid, 'TLS: the same worker');
	sql("SELECT tide.relay_delete('bft')");
}

# --- kill -9 of the postmaster in the middle of a backlog.
sql("SELECT tide.outbox_create('crash')");
my $sub4 = $mq->subscribe('crash', id => 'reader-crash');
my $batch = 50;
set_pipeline('cq', 'crash', batch_size => $batch, max_in_flight => 20, rate_limit => { per_second => 500 });
@ids = publish('crash', 4000);
ok(defined wait_until(sub { lines($sub4) >= 300 }, 30, 20_000), 'crash: delivery under way');
$node->kill9;
my ($at_kill) = counts($sub4, @ids);
note("postmaster killed with $at_kill of 4000 messages received");
cmp_ok($at_kill, '<', 4000, 'the kill came while messages were undelivered');
my $started = wait_until(sub { $node->{_pid} = undef; $node->start(fail_ok => 1) }, 30, 500_000);
ok(defined $started, 'the server starts again after SIGKILL of the postmaster');
ok($mq->wait_for_ids($sub4, \@ids, 0, 60), 'after the crash every message arrived');
($got, $dups) = counts($sub4, @ids);
note("crash: $dups duplicates (batch size $batch)");
cmp_ok($dups, '<=', 3 * $batch, 'duplicates are at most the batches in flight');

$mq->shutdown;
$node->stop;
done_testing();
