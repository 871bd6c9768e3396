# A real Redis server on 127.0.0.1 for the redis sink's TAP tests, started
# in a directory of the test's own and stopped at the end even on failure,
# and the consuming side: test/brokers/redis_read (a hiredis client) and
# redis-cli.
#
#   my $redis = PgTide::Redis->new(dir => $dir, requirepass => 'pw');
#   $redis->start;
#   my @entries = $redis->entries('orders');  # {stream, entry, fields}
#   $redis->cli('XLEN', 'orders');
package PgTide::Redis;

use strict;
use warnings;
use Carp;
use FindBin;
use JSON::PP;
use IPC::Run qw(run);
use Time::HiRes qw(time usleep);

my @started;

# new(dir => ..., requirepass => ..., aclfile => [lines], appendonly => 1,
#     maxmemory => ...): a server to start; no server yet.
sub new
{
	my ($class, %opts) = @_;
	croak 'redis-server is not installed (Debian package redis-server)'
	  unless grep { -x "$_/redis-server" } split /:/, $ENV{PATH};
	my $self = bless { %opts, dir => "$opts{dir}/redis" }, $class;
	mkdir $self->{dir};
	return $self;
}

sub port { return $_[0]{port} }
sub url { return "redis://127.0.0.1:$_[0]{port}" . ($_[1] // '') }

# Starts the server, on a free port picked at random the first time (tried
# again on another if it is taken), on the same port after a stop.
sub start
{
	my ($self) = @_;
	for my $try (1 .. 20)
	{
		my $port = $self->{port} // 20000 + int(rand(30000));
		my @args = ('redis-server', '--bind', '127.0.0.1', '--port', $port,
			'--dir', $self->{dir}, '--save', '', '--daemonize', 'yes',
			'--pidfile', "$self->{dir}/redis.pid", '--logfile', "$self->{dir}/redis.log",
			'--appendonly', $self->{appendonly} ? 'yes' : 'no', '--appendfsync', 'always');
		push @args, '--requirepass', $self->{requirepass} if defined $self->{requirepass};
		if ($self->{aclfile})
		{
			open(my $fh, '>', "$self->{dir}/users.acl") or die "cannot write users.acl: $!";
			print $fh "$_\n" for @{ $self->{aclfile} };
			close $fh;
			push @args, '--aclfile', "$self->{dir}/users.acl";
		}
		unlink "$self->{dir}/redis.pid";
		run(\@args, '>', \my $out, '2>', \my $err);
		my $start = time();
		while (time() - $start < 10)
		{
			if ($self->ping_port($port))
			{
				$self->{port} = $port;
				push @started, $self unless grep { $_ == $self } @started;
				return $self;
			}
			last if $self->_log_says_taken;
			usleep(50_000);
		}
		croak "redis-server did not start on $port: " . $self->log_tail if defined $self->{port};
	}
	croak 'redis-server did not start: ' . $self->log_tail;
}

sub _log_says_taken
{
	my ($self) = @_;
	return $self->log_tail =~ /Address already in use/;
}

sub log_tail
{
	my ($self) = @_;
	open(my $fh, '<', "$self->{dir}/redis.log") or return '';
	my @l = <$fh>;
	return join('', @l[ -5 .. -1 ] // ());
}

sub ping_port
{
	my ($self, $port) = @_;
	my @auth = $self->_auth_args;
	run([ 'redis-cli', '-h', '127.0.0.1', '-p', $port, @auth, 'PING' ],
		'>', \my $out, '2>', \my $err);
	return ($out // '') =~ /PONG/;
}

# redis-cli's authentication: the admin user (requirepass or "admin" of the ACL file).
sub _auth_args
{
	my ($self) = @_;
	return ('--no-auth-warning', '-a', $self->{requirepass}) if defined $self->{requirepass};
	return ('--no-auth-warning', '--user', 'admin', '--pass', 'adminpw') if $self->{aclfile};
	return ();
}

# The server's process id, or undef.
sub pid
{
	my ($self) = @_;
	open(my $fh, '<', "$self->{dir}/redis.pid") or return undef;
	my $pid = <$fh>;
	chomp $pid if defined $pid;
	return $pid;
}

# Stops the server: 'TERM' (a clean shutdown) or 'KILL'; waits until it is gone.
sub stop
{
	my ($self, $signal) = @_;
	my $pid = $self->pid;
	return unless $pid && kill(0, $pid);
	kill($signal // 'TERM', $pid);
	my $start = time();
	usleep(20_000) while kill(0, $pid) && time() - $start < 20;
	unlink "$self->{dir}/redis.pid";
}

# Pauses and resumes the server (SIGSTOP, SIGCONT): it keeps its
# connections but answers nothing.
sub pause  { kill('STOP', $_[0]->pid) }
sub resume { kill('CONT', $_[0]->pid) }

# Runs redis-cli with the admin's credentials; its output, chomped.
sub cli
{
	my ($self, @cmd) = @_;
	run([ 'redis-cli', '-h', '127.0.0.1', '-p', $self->{port}, $self->_auth_args, @cmd ],
		'>', \my $out, '2>', \my $err);
	chomp $out if defined $out;
	return $out;
}

# Every entry of the given streams, read by test/brokers/redis_read: a list
# of {stream, entry, fields}.
sub entries
{
	my ($self, @streams) = @_;
	my $json = JSON::PP->new;
	return map { $json->decode($_) } grep { length } split /\n/, $self->_read(@streams);
}

# The values of one field of every entry of the given streams, in order.
sub field_values
{
	my ($self, $field, @streams) = @_;
	return grep { length } split /\n/, $self->_read('-f', $field, @streams);
}

sub _read
{
	my ($self, @args) = @_;
	my $reader = "$FindBin::Bin/../brokers/redis_read";
	croak "$reader is missing (make installcheck builds it)" unless -x $reader;
	my @auth;
	@auth = ('-a', $self->{requirepass}) if defined $self->{requirepass};
	@auth = ('-u', 'admin', '-a', 'adminpw') if $self->{aclfile};
	my ($out, $err);
	run([ $reader, '127.0.0.1', $self->{port}, @auth, @args ], '>', \$out, '2>', \$err)
	  or croak "redis_read failed: $err";
	return $out;
}

END
{
	# the test's exit status is kept
	local $?;
	for my $s (@started)
	{
		$s->resume if $s->pid;
		$s->stop('KILL');
	}
}

1;
