# A Mosquitto MQTT broker on 127.0.0.1 for the MQTT sink's TAP tests, and
# a subscriber (mosquitto_sub, the broker's own client) that writes each
# message it receives as a JSON line: topic, MQTT 5 user properties and
# payload. The broker is stopped when the object goes away, even when the
# test dies.
#
#   my $mq = PgTide::Mosquitto->new(dir => $dir, conf => "max_packet_size 4096\n",
#                                   users => { relay => 'secret' });
#   $mq->start;
#   my $sub = $mq->subscribe('orders/#');	# before publishing
#   ... $mq->messages($sub) ...
package PgTide::Mosquitto;

use strict;
use warnings;
use Carp;
use IPC::Run;
use IO::Socket::INET;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils ();
use Time::HiRes qw(time usleep);

# new(dir => ..., conf => extra mosquitto.conf lines, users => {name => password},
#     acl => the text of an acl_file, tls => 1): the broker is not started yet; its
# port (and with tls, a second, TLS, port: tls_port) is chosen by start. With
# tls, a CA and a certificate for localhost and 127.0.0.1 are made with openssl
# (ca_file).
sub new
{
	my ($class, %args) = @_;
	croak 'PgTide::Mosquitto->new needs dir' unless defined $args{dir};
	for my $bin ('mosquitto', 'mosquitto_sub', 'mosquitto_passwd')
	{
		my $found = grep { -x "$_/$bin" } split(/:/, $ENV{PATH} . ':/usr/sbin:/sbin');
		croak "$bin is not installed (Debian's mosquitto and mosquitto-clients)" unless $found;
	}
	my $self = bless { dir => $args{dir}, conf => $args{conf} // '', users => $args{users},
		acl => $args{acl}, tls => $args{tls}, port => undef, tls_port => undef, h => undef,
		subs => [], json => JSON::PP->new }, $class;
	mkdir "$self->{dir}/mosquitto";
	mkdir "$self->{dir}/mosquitto/data";
	$self->_make_certificates if $self->{tls};
	return $self;
}

sub port { return $_[0]{port} }
sub tls_port { return $_[0]{tls_port} }
sub ca_file { return "$_[0]{dir}/mosquitto/ca.pem" }

# A CA, and the broker's key and certificate signed by it.
sub _make_certificates
{
	my ($self) = @_;
	my $d = "$self->{dir}/mosquitto";
	my @quiet = ('>', '/dev/null', '2>', "$d/openssl.err");
	IPC::Run::run([ 'openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2',
		'-subj', '/CN=pg_tide test CA', '-keyout', "$d/ca.key", '-out', "$d/ca.pem" ], @quiet)
	  and IPC::Run::run([ 'openssl', 'req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=localhost',
		'-keyout', "$d/server.key", '-out', "$d/server.csr" ], @quiet)
	  or die 'openssl failed: ' . PostgreSQL::Test::Utils::slurp_file("$d/openssl.err");
	open(my $fh, '>', "$d/ext.cnf") or die;
	print $fh "subjectAltName=DNS:localhost,IP:127.0.0.1\n";
	close $fh;
	IPC::Run::run([ 'openssl', 'x509', '-req', '-in', "$d/server.csr", '-CA', "$d/ca.pem",
		'-CAkey', "$d/ca.key", '-CAcreateserial', '-days', '2', '-extfile', "$d/ext.cnf",
		'-out', "$d/server.pem" ], @quiet)
	  or die 'openssl failed: ' . PostgreSQL::Test::Utils::slurp_file("$d/openssl.err");
	return;
}

sub _binary
{
	my ($bin) = @_;
	for my $d (split(/:/, $ENV{PATH} . ':/usr/sbin:/sbin'))
	{
		return "$d/$bin" if -x "$d/$bin";
	}
	croak "$bin is not installed";
}

# Writes the config for $port (and $tls_port) and starts the broker; false
# when it did not listen (a port was taken).
sub _try_start
{
	my ($self, $port, $tls_port) = @_;
	my $d = "$self->{dir}/mosquitto";
	my $conf = "listener $port 127.0.0.1\n";
	$conf .= "listener $tls_port 127.0.0.1\ncafile $d/ca.pem\ncertfile $d/server.pem\nkeyfile $d/server.key\n"
	  if $self->{tls};
	$conf .= "persistence true\npersistence_location $d/data/\n"
	  . "max_queued_messages 0\nmax_inflight_messages 0\nlog_dest file $d/mosquitto-$port.log\n"
	  . join('', map { "log_type $_\n" } qw(error warning notice information subscribe));
	if ($self->{users})
	{
		my $pw = "$d/passwords";
		unlink $pw;
		open(my $fh, '>', $pw) or die "cannot write $pw: $!";
		close $fh;
		for my $u (sort keys %{ $self->{users} })
		{
			IPC::Run::run([ _binary('mosquitto_passwd'), '-b', $pw, $u, $self->{users}{$u} ])
			  or die "mosquitto_passwd failed";
		}
		chmod 0600, $pw;
		$conf .= "allow_anonymous false\npassword_file $pw\n";
	}
	else
	{
		$conf .= "allow_anonymous true\n";
	}
	if (defined $self->{acl})
	{
		open(my $fh, '>', "$d/acl") or die;
		print $fh $self->{acl};
		close $fh;
		$conf .= "acl_file $d/acl\n";
	}
	$conf .= $self->{conf};
	open(my $fh, '>', "$d/mosquitto.conf") or die;
	print $fh $conf;
	close $fh;
	$self->{h} = IPC::Run::start([ _binary('mosquitto'), '-c', "$d/mosquitto.conf" ],
		'<', \undef, '>>', "$d/stdout", '2>>', "$d/stderr");
	my $deadline = time() + 10;
	while (time() < $deadline)
	{
		my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Timeout => 1);
		my $t = !$self->{tls} || IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $tls_port, Timeout => 1);
		if ($s && $t)
		{
			close $s;
			return 1;
		}
		last unless $self->{h}->pumpable;
		usleep(50_000);
	}
	$self->{h}->kill_kill;
	$self->{h} = undef;
	return 0;
}

# Starts the broker: on a free port the first time (trying another when one
# is taken by then), on the same port after stop.
sub start
{
	my ($self) = @_;
	croak 'the broker is already running' if $self->{h};
	if (defined $self->{port})
	{
		# the port it had: its clients reconnect to it (retried while the
		# kernel still holds it)
		for (1 .. 20)
		{
			return $self if $self->_try_start($self->{port}, $self->{tls_port});
			usleep(250_000);
		}
		croak "mosquitto did not start again on port $self->{port}";
	}
	for (1 .. 5)
	{
		my $port = PostgreSQL::Test::Cluster::get_free_port();
		my $tls_port = $self->{tls} ? PostgreSQL::Test::Cluster::get_free_port() : undef;
		if ($self->_try_start($port, $tls_port))
		{
			$self->{port} = $port;
			$self->{tls_port} = $tls_port;
			return $self;
		}
	}
	croak 'mosquitto did not start: ' . PostgreSQL::Test::Utils::slurp_file("$self->{dir}/mosquitto/stderr");
}

# Stops the broker (SIGTERM: it saves its persistent state, as a restart does).
sub stop
{
	my ($self) = @_;
	return unless $self->{h};
	$self->{h}->signal('TERM');
	my $deadline = time() + 10;
	while ($self->{h}->pumpable && time() < $deadline)
	{
		eval { $self->{h}->pump_nb };
		usleep(50_000);
	}
	$self->{h}->kill_kill;
	$self->{h} = undef;
	return;
}

# subscribe($filter, %opt): starts mosquitto_sub on $filter with QoS 1 (or
# $opt{qos}) and MQTT 5 and a persistent session (client id $opt{id}), so
# that messages published while it was disconnected are kept for it;
# returns its output file. user/password when the broker has users. Waits
# until it is subscribed.
sub subscribe
{
	my ($self, $filter, %opt) = @_;
	my $id = $opt{id} // 'reader-' . scalar(@{ $self->{subs} });
	my $out = "$self->{dir}/mosquitto/sub-$id.jsonl";
	my @auth = $opt{user} ? ('-u', $opt{user}, '-P', $opt{password}) : ();
	my $h = IPC::Run::start(
		[ _binary('mosquitto_sub'), '-h', '127.0.0.1', '-p', $self->{port}, '-V', '5', '-q', $opt{qos} // 1,
		  '-c', '-x', '3600', '-i', $id, @auth, '-t', $filter, '-F', '%j' ],
		'<', \undef, '>>', $out, '2>>', "$out.err");
	push @{ $self->{subs} }, $h;
	push @{ $self->{sub_pids} }, $h->{KIDS}[0]{PID};
	# subscribed once the broker logged it
	my $deadline = time() + 10;
	while (time() < $deadline)
	{
		my $log = PostgreSQL::Test::Utils::slurp_file("$self->{dir}/mosquitto/mosquitto-$self->{port}.log");
		return $out if $log =~ /\Q$id\E \d+ \Q$filter\E/;
		usleep(50_000);
	}
	croak "mosquitto_sub $id did not subscribe to $filter";
}

# The messages a subscriber received, each a hash: topic, props (user
# properties), payload (as mosquitto_sub prints it, a string), qos, retain.
sub messages
{
	my ($self, $out) = @_;
	my @m;
	return @m unless -e $out;
	open(my $fh, '<', $out) or die "cannot read $out: $!";
	while (my $line = <$fh>)
	{
		next unless $line =~ /\n\z/;	# a line being written
		my $j = eval { $self->{json}->decode($line) } or next;
		# mosquitto_sub 2.0 prints user properties as an object, 2.1 as an
		# array of one-member objects (a name may repeat)
		my $up = ($j->{properties} // {})->{'user-properties'} // {};
		$up = { map { %$_ } @$up } if ref $up eq 'ARRAY';
		push @m, { topic => $j->{topic}, props => $up,
			payload => $j->{payload}, qos => $j->{qos}, retain => $j->{retain},
			content_type => ($j->{properties} // {})->{'content-type'} };
	}
	close $fh;
	return @m;
}

# The messages a subscriber received by pg_tide message id (from the
# tide-id user property, or with $envelope from the body's message_id,
# the body then decoded in {envelope}): id => [messages, in arrival order].
sub by_id
{
	my ($self, $out, $envelope) = @_;
	my %m;
	for my $msg ($self->messages($out))
	{
		my $id;
		if ($envelope)
		{
			my $e = eval { $self->{json}->decode($msg->{payload}) } or next;
			$id = $e->{message_id};
			$msg->{envelope} = $e;
		}
		else
		{
			($id) = ($msg->{props}{'tide-id'} // '') =~ /:(\d+)$/;
		}
		push @{ $m{$id} }, $msg if defined $id;
	}
	return \%m;
}

# Waits (at most $timeout s) until a subscriber got every id; true if it did.
sub wait_for_ids
{
	my ($self, $out, $ids, $envelope, $timeout) = @_;
	my $deadline = time() + ($timeout // 30);
	while (time() < $deadline)
	{
		my $m = $self->by_id($out, $envelope);
		return 1 unless grep { !$m->{$_} } @$ids;
		usleep(100_000);
	}
	return 0;
}

# The broker's process id (to stop it with SIGSTOP), or undef.
sub pid
{
	my ($self) = @_;
	return $self->{h} ? $self->{h}{KIDS}[0]{PID} : undef;
}

# Stops the subscribers and the broker (a subscriber would otherwise try to
# reconnect for ever). Called by DESTROY too, by process id: at the end of
# the program IPC::Run's harnesses may be gone first.
sub shutdown
{
	my ($self) = @_;
	for my $pid (@{ $self->{sub_pids} // [] })
	{
		kill 'KILL', $pid;
		waitpid($pid, 0);
	}
	$self->{sub_pids} = [];
	$self->{subs} = [];
	if ($self->{h})
	{
		my $pid = $self->pid;
		eval { $self->stop };
		kill 'KILL', $pid if $pid;
	}
	return;
}

sub DESTROY
{
	my ($self) = @_;
	eval { $self->shutdown };
}

1;
