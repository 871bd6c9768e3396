# A real RabbitMQ node for the rabbitmq sink's TAP tests, started on
# 127.0.0.1 (its AMQP, TLS, distribution and epmd ports all on 127.0.0.1)
# in a directory of the test's own, with a vhost "tide" and a user "tide",
# stopped at the end even when the test dies; and the consuming side,
# test/brokers/rabbitmq_read (a rabbitmq-c client, not the sink's code).
#
#   my $rmq = PgTide::RabbitMQ->new(dir => $dir, password => 'pw',
#                                   conf => "max_message_size = 65536\n");
#   $rmq->start or BAIL_OUT(...);   # true once the node answers, vhost and user made
#   $rmq->port; $rmq->tls_port;     # AMQP, and AMQP over TLS (verify_none)
#   $rmq->tls_dir;                  # ca.pem (signed the node's certificate), other.pem
#   $rmq->ctl('stop_app');          # rabbitmqctl; true when it succeeded
#   $rmq->amqp('queue', 'q');       # rabbitmq_read as user tide in vhost tide
#   $rmq->stop;
package PgTide::RabbitMQ;

use strict;
use warnings;
use Carp;
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use IO::Socket::INET;
use POSIX qw(setsid);
use PostgreSQL::Test::Utils ();
use PgTide::TestNode qw(wait_until);

my $server = '/usr/lib/rabbitmq/bin/rabbitmq-server';
my $ctl = '/usr/lib/rabbitmq/bin/rabbitmqctl';
my $reader = abs_path(dirname(abs_path(__FILE__)) . '/../..') . '/brokers/rabbitmq_read';
my @started;

# new(dir => ..., password => ..., conf => lines for rabbitmq.conf): a node
# to start. Dies when rabbitmq-server or rabbitmq_read is missing (CI
# installs and builds them: the test fails rather than skips).
sub new
{
	my ($class, %args) = @_;
	croak 'PgTide::RabbitMQ->new needs dir' unless defined $args{dir};
	croak "rabbitmq-server is not installed" unless -x $server && -x $ctl;
	croak "$reader is missing: make installcheck builds it" unless -x $reader;
	my $self = bless { dir => $args{dir}, password => $args{password} // 'rmq-secret-pw',
		conf => $args{conf} // '', env => {}, pid => undef }, $class;
	return $self;
}

sub port { return $_[0]{port} }
sub tls_port { return $_[0]{tls_port} }
sub tls_dir { return "$_[0]{dir}/tls" }
sub password { return $_[0]{password} }

# A CA and the node's certificate for localhost; another CA that did not sign it.
sub _make_certificates
{
	my ($self) = @_;
	my $tls = $self->tls_dir;
	mkdir $tls;
	PostgreSQL::Test::Utils::append_to_file("$tls/san.cnf", "subjectAltName=DNS:localhost\n");
	for my $cmd (
		"req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout $tls/ca.key -out $tls/ca.pem -days 2 -subj /CN=tide-test-ca",
		"req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout $tls/other.key -out $tls/other.pem -days 2 -subj /CN=other-ca",
		"req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout $tls/server.key -out $tls/server.csr -subj /CN=localhost",
		"x509 -req -in $tls/server.csr -CA $tls/ca.pem -CAkey $tls/ca.key -CAcreateserial -out $tls/server.pem -days 2 -extfile $tls/san.cnf")
	{
		system("openssl $cmd >>$tls/openssl.log 2>&1") == 0 or croak "openssl $cmd failed";
	}
}

# Whether a port of 127.0.0.1 is free (PgTide::RabbitMQ::port_free).
sub port_free
{
	my ($port) = @_;
	my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $port,
		Listen => 1, ReuseAddr => 1);
	return 0 unless $s;
	close $s;
	return 1;
}

# rabbitmqctl with the node's environment; true when it succeeded.
sub ctl
{
	my ($self, @args) = @_;
	local %ENV = (%ENV, %{ $self->{env} });
	return system("$ctl -n $self->{nodename} @args >>$self->{dir}/rabbitmqctl.log 2>&1") == 0;
}

# Starts a node on free ports and makes the vhost and the user; true once
# its AMQP port answers and they exist.
sub start
{
	my ($self) = @_;
	$self->_make_certificates unless -e $self->tls_dir . '/ca.pem';
	my $tls = $self->tls_dir;
	for my $try (1 .. 5)
	{
		my $p = 20000 + int(rand(20000));
		next unless port_free($p) && port_free($p + 1) && port_free($p + 2) && port_free($p + 20000);
		my $base = "$self->{dir}/rabbitmq$try";
		mkdir $base;
		mkdir "$base/$_" for qw(home mnesia log);
		@$self{qw(port epmd_port tls_port)} = ($p, $p + 1, $p + 2);
		$self->{nodename} = "tide_test_$$\_$try\@localhost";
		PostgreSQL::Test::Utils::append_to_file("$base/rabbitmq.conf",
			"listeners.tcp.1 = 127.0.0.1:$p\nloopback_users = none\n$self->{conf}"
			  . "listeners.ssl.1 = 127.0.0.1:$self->{tls_port}\nssl_options.cacertfile = $tls/ca.pem\n"
			  . "ssl_options.certfile = $tls/server.pem\nssl_options.keyfile = $tls/server.key\n"
			  . "ssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n");
		PostgreSQL::Test::Utils::append_to_file("$base/advanced.config",
			"[{kernel, [{inet_dist_use_interface, {127,0,0,1}}]}].\n");
		PostgreSQL::Test::Utils::append_to_file("$base/enabled_plugins", "[].\n");
		$self->{env} = { HOME => "$base/home", RABBITMQ_NODENAME => $self->{nodename},
			RABBITMQ_NODE_IP_ADDRESS => '127.0.0.1', RABBITMQ_NODE_PORT => $p,
			RABBITMQ_DIST_PORT => $p + 20000, ERL_EPMD_ADDRESS => '127.0.0.1',
			ERL_EPMD_PORT => $self->{epmd_port}, ERL_EPMD_RELAXED_COMMAND_CHECK => 1,
			RABBITMQ_MNESIA_BASE => "$base/mnesia",
			RABBITMQ_LOG_BASE => "$base/log", RABBITMQ_CONFIG_FILE => "$base/rabbitmq.conf",
			RABBITMQ_ADVANCED_CONFIG_FILE => "$base/advanced.config",
			RABBITMQ_ENABLED_PLUGINS_FILE => "$base/enabled_plugins",
			RABBITMQ_PID_FILE => "$base/pid" };
		$self->{pid} = fork;
		if ($self->{pid} == 0)
		{
			setsid();
			%ENV = (%ENV, %{ $self->{env} });
			open STDOUT, '>', "$base/server.out";
			open STDERR, '>&', \*STDOUT;
			exec $server;
		}
		push @started, $self;
		my $up = wait_until(sub {
			IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $p) }, 60, 200_000);
		return $self->ctl('add_vhost tide') && $self->ctl("add_user tide $self->{password}")
		  && $self->ctl(q{set_permissions -p tide tide '.*' '.*' '.*'})
		  if defined $up && $self->ctl('await_startup');
		Test::More::diag("rabbitmq-server did not start on port $p:\n"
			  . PostgreSQL::Test::Utils::slurp_file("$base/server.out"));
		$self->stop;
	}
	return 0;
}

# Stops the node, its process group and its own epmd daemon.
sub stop
{
	my ($self) = @_;
	return unless $self->{pid};
	$self->ctl('stop');
	kill 'KILL', -$self->{pid};
	waitpid($self->{pid}, 0);
	# ERL_EPMD_RELAXED_COMMAND_CHECK lets the node's epmd be killed
	wait_until(sub {
		system("ERL_EPMD_PORT=$self->{epmd_port} ERL_EPMD_RELAXED_COMMAND_CHECK=1 epmd -kill >/dev/null 2>&1");
		return port_free($self->{epmd_port});
	}, 10, 200_000);
	$self->{pid} = undef;
}

# rabbitmq_read @args as user tide in vhost tide; its output, or dies.
sub amqp
{
	my ($self, @args) = @_;
	my $out = `$reader 127.0.0.1 $self->{port} tide $self->{password} tide @args 2>&1`;
	croak "rabbitmq_read @args: $out" if $? != 0;
	return $out;
}

END { $_->stop for @started }

1;
