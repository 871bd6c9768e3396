# A NATS server with JetStream for the NATS sink's TAP tests (test/t/042,
# 043), started on 127.0.0.1 on a free port with its store under the
# test's directory, and test/brokers/nats_tool, a nats.c client, to make
# streams and read them back.
#
#   my $nats = PgTide::NatsServer->new(dir => $dir);   # user => 'u', password => 'p',
#                                    # token => 't', tls_cert => $pem, tls_key => $key,
#                                    # port => $port (else a free one)
#   $nats->start;                    # dies if nats-server is missing or does not start
#   $nats->url;                      # nats://127.0.0.1:<port>
#   $nats->create_stream('ORDERS', 'orders.>', 120);  # duplicate window in seconds,
#                                    # then max_msg_size, max_msgs (discard new)
#   my @m = $nats->messages('ORDERS');   # hashrefs: seq, subject, headers, body
#   my $h = $nats->silent('slow.x');   # a core subscriber that never answers;
#                                    # $h->kill_kill ends it
#   $nats->stop;                     # SIGKILL; start again: same port, same store
package PgTide::NatsServer;

use strict;
use warnings;
use Carp;
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use IO::Socket::INET;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use Time::HiRes qw(time usleep);

my $tool = abs_path(dirname(abs_path(__FILE__)) . '/../../brokers') . '/nats_tool';

# The servers running, by pid: killed at exit even when the test dies
# (IPC::Run cannot be relied on during global destruction).
my %running;
END
{
	kill 'KILL', keys %running;
}

sub new
{
	my ($class, %args) = @_;
	croak 'PgTide::NatsServer->new needs dir' unless defined $args{dir};
	return bless { port => undef, %args, h => undef, json => JSON::PP->new->utf8 }, $class;
}

sub port { return $_[0]{port} }
sub url { return ($_[0]{tls_cert} ? 'tls' : 'nats') . "://127.0.0.1:$_[0]{port}" }

# Whether something accepts connections on the port.
sub _listening
{
	my ($self) = @_;
	my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $self->{port},
		Proto => 'tcp', Timeout => 1);
	return 0 unless $s;
	close $s;
	return 1;
}

# Starts nats-server (on a new free port the first time, retried when the
# port was taken meanwhile; on the same port and store afterwards).
sub start
{
	my ($self) = @_;
	croak 'the NATS server is already running' if $self->{h};
	my $bin = `which nats-server 2>/dev/null`;
	chomp $bin;
	croak 'nats-server is not installed (Debian package nats-server)' unless $bin;
	croak "$tool is missing: make installcheck builds it (make test/brokers/nats_tool)" unless -x $tool;
	for my $try (1 .. 5)
	{
		my $fresh = !defined $self->{port};
		$self->{port} //= PostgreSQL::Test::Cluster::get_free_port();
		my $store = "$self->{dir}/nats-$self->{port}";
		my @cmd = ($bin, '-js', '-a', '127.0.0.1', '-p', $self->{port}, '-sd', $store);
		push @cmd, '--user', $self->{user}, '--pass', $self->{password} if defined $self->{user};
		push @cmd, '--auth', $self->{token} if defined $self->{token};
		push @cmd, '--tls', '--tlscert', $self->{tls_cert}, '--tlskey', $self->{tls_key}
		  if defined $self->{tls_cert};
		my $log = "$self->{dir}/nats-$self->{port}.log";
		$self->{h} = IPC::Run::start(\@cmd, '<', \undef, '>>', $log, '2>>', $log);
		my $deadline = time() + 10;
		$running{ $self->{h}{KIDS}[0]{PID} } = 1;
		while (time() < $deadline && $self->{h}->pumpable)
		{
			return $self if $self->_listening;
			usleep(20_000);
		}
		$self->stop;
		$self->{port} = undef if $fresh;
		croak "nats-server did not start on port $self->{port}: see $log" unless $fresh;
	}
	croak 'nats-server did not start on any of five free ports';
}

# Kills it (SIGKILL) and waits; start() starts it again on the same port.
sub stop
{
	my ($self) = @_;
	return unless $self->{h};
	delete $running{ $self->{h}{KIDS}[0]{PID} };
	$self->{h}->kill_kill(grace => 0);
	$self->{h} = undef;
	return;
}

sub tool
{
	my ($self, @args) = @_;
	local $ENV{NATS_USER} = $self->{user} if defined $self->{user};
	local $ENV{NATS_PASSWORD} = $self->{password} if defined $self->{user};
	local $ENV{NATS_TOKEN} = $self->{token} if defined $self->{token};
	local $ENV{NATS_CA_FILE} = $self->{tls_cert} if defined $self->{tls_cert};
	my ($out, $err) = ('', '');
	IPC::Run::run([ $tool, $self->url, @args ], '<', \undef, '>', \$out, '2>', \$err)
	  or croak "nats_tool @args failed: $err";
	return $out;
}

sub create_stream
{
	my ($self, $name, $subject, $window, @more) = @_;
	$self->tool('create', $name, $subject, $window, @more);
	return;
}

sub count
{
	my ($self, $stream) = @_;
	my $n = $self->tool('count', $stream);
	chomp $n;
	return $n;
}

# Every message of the stream, in order.
sub messages
{
	my ($self, $stream) = @_;
	return map { $self->{json}->decode($_) } split /\n/, $self->tool('dump', $stream);
}

# A core NATS subscriber on $subject that never answers (a JetStream
# publish there is heard, so not "no responders", and never acknowledged).
sub silent
{
	my ($self, $subject) = @_;
	my ($in, $out) = ('', '');
	my $h = IPC::Run::start([ $tool, $self->url, 'silent', $subject ], '<', \$in, '>', \$out,
		IPC::Run::timeout(10));
	$h->pump until $out =~ /subscribed/;
	return $h;
}

sub DESTROY
{
	my ($self) = @_;
	local ($@, $!, $?);
	eval { $self->stop };
	return;
}

1;
