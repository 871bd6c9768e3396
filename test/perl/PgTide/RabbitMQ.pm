# A RabbitMQ node for the TAP tests, on free ports of 127.0.0.1 (AMQP,
# distribution and epmd), with files of its own under dir; stopped, with
# its epmd, when the test ends.
package PgTide::RabbitMQ;

use strict;
use warnings;
use Carp;
use IO::Socket::INET;
use POSIX qw(setsid);
use PostgreSQL::Test::Utils ();
use PgTide::TestNode qw(wait_until);

my $server = '/usr/lib/rabbitmq/bin/rabbitmq-server';
my $ctl = '/usr/lib/rabbitmq/bin/rabbitmqctl';
my @running;

# Whether rabbitmq-server and rabbitmqctl are installed.
sub installed { return -x $server && -x $ctl }

# Whether nothing listens on 127.0.0.1:port (it can be bound).
sub port_free
{
	my ($port) = @_;
	my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $port,
		Listen => 1, ReuseAddr => 1);
	return 0 unless $s;
	close $s;
	return 1;
}

# new(dir => ..., conf => extra rabbitmq.conf lines): a started node
# (croaks when none starts in 5 tries).
sub new
{
	my ($class, %args) = @_;
	croak 'PgTide::RabbitMQ->new needs dir' unless defined $args{dir};
	my $self = bless { dir => $args{dir}, conf => $args{conf} // '' }, $class;
	croak 'rabbitmq-server did not start' unless $self->_start;
	push @running, $self;
	return $self;
}

sub port { return $_[0]{amqp_port} }

# rabbitmqctl with the node's environment; true when it succeeded.
sub ctl
{
	my ($self, @args) = @_;
	local %ENV = (%ENV, %{ $self->{env} });
	return system("$ctl -n $self->{nodename} @args >>$self->{dir}/rabbitmqctl.log 2>&1") == 0;
}

# Starts a node on free ports; true once its AMQP port answers.
sub _start
{
	my ($self) = @_;
	for my $try (1 .. 5)
	{
		my $p = 20000 + int(rand(20000));
		next unless port_free($p) && port_free($p + 1) && port_free($p + 20000);
		my $base = "$self->{dir}/rabbitmq$try";
		mkdir $base;
		mkdir "$base/$_" for qw(home mnesia log);
		$self->{amqp_port} = $p;
		$self->{epmd_port} = $p + 1;
		$self->{nodename} = "tide_test_$$\_$try\@localhost";
		PostgreSQL::Test::Utils::append_to_file("$base/rabbitmq.conf",
			"listeners.tcp.1 = 127.0.0.1:$p\nloopback_users = none\n$self->{conf}");
		PostgreSQL::Test::Utils::append_to_file("$base/advanced.config",
			"[{kernel, [{inet_dist_use_interface, {127,0,0,1}}]}].\n");
		PostgreSQL::Test::Utils::append_to_file("$base/enabled_plugins", "[].\n");
		$self->{env} = { HOME => "$base/home", RABBITMQ_NODENAME => $self->{nodename},
			RABBITMQ_NODE_IP_ADDRESS => '127.0.0.1', RABBITMQ_NODE_PORT => $p,
			RABBITMQ_DIST_PORT => $p + 20000, ERL_EPMD_ADDRESS => '127.0.0.1',
			ERL_EPMD_PORT => $p + 1, ERL_EPMD_RELAXED_COMMAND_CHECK => 1,
			RABBITMQ_MNESIA_BASE => "$base/mnesia",
			RABBITMQ_LOG_BASE => "$base/log", RABBITMQ_CONFIG_FILE => "$base/rabbitmq.conf",
			RABBITMQ_ADVANCED_CONFIG_FILE => "$base/advanced.config",
			RABBITMQ_ENABLED_PLUGINS_FILE => "$base/enabled_plugins",
			RABBITMQ_PID_FILE => "$base/pid" };
		my $pid = fork;
		if ($pid == 0)
		{
			setsid();
			%ENV = (%ENV, %{ $self->{env} });
			open STDOUT, '>', "$base/server.out";
			open STDERR, '>&', \*STDOUT;
			exec $server;
		}
		$self->{pid} = $pid;
		my $up = wait_until(sub {
			IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $p) }, 60, 200_000);
		return 1 if defined $up && $self->ctl('await_startup');
		$self->stop;
	}
	return 0;
}

# Stops the node and its epmd.
sub stop
{
	my ($self) = @_;
	return unless $self->{pid};
	$self->ctl('stop');
	kill 'KILL', -$self->{pid};
	waitpid($self->{pid}, 0);
	my $epmd = $self->{epmd_port};
	wait_until(sub {
		system("ERL_EPMD_PORT=$epmd ERL_EPMD_RELAXED_COMMAND_CHECK=1 epmd -kill >/dev/null 2>&1");
		return port_free($epmd);
	}, 10, 200_000);
	$self->{pid} = undef;
}

END { $_->stop for @running }

1;
