# The webhook receiver (test/receiver, built from test/receiver.c by
# `make test/receiver`; installcheck builds it) for the TAP tests in test/t.
#
#   my $rcv = PgTide::Receiver->new(dir => $dir);   # log => 0: no request log
#   $rcv->start;                 # waits until /__health answers (dies after 5 s)
#   $rcv->url('/hook');          # http://127.0.0.1:<port>/hook
#   $rcv->control({ fail => [ 503 ], retry_after => 1 });
#   $rcv->wait_for(sub { grep { $_->{status} == 200 } @{ $_[0] } }, 10);
#   my @reqs = $rcv->requests;   # hashrefs: method, path, headers, body,
#                                # status, t, sig, concurrent
#   my $stats = $rcv->stats;     # {requests, status => {code => n}, sig_ok, sig_bad,
#                                #  max_concurrent}
#   my $w = $rcv->commit_waits($node, 'orders', 'round1', 40, 0.05);
#                                # commit-to-receipt seconds, sorted
#   $rcv->stop;                  # start again later: same port, same log
#
# The log is decoded as bytes: body and header values are byte strings (the
# raw UTF-8 as sent), so HMACs over them match what the sender signed.
# See test/receiver.c for the control keys.
package PgTide::Receiver;

use strict;
use warnings;
use Carp;
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use HTTP::Tiny;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils ();
use Time::HiRes qw(time usleep);

my $binary = abs_path(dirname(abs_path(__FILE__)) . '/../../receiver');

# new(dir => $dir, log => 1): a receiver on a free port, not started.
sub new
{
	my ($class, %args) = @_;
	croak 'PgTide::Receiver->new needs dir' unless defined $args{dir};
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $self = bless {
		dir => $args{dir},
		port => $port,
		log => (!exists $args{log} || $args{log}) ? "$args{dir}/requests-$port.jsonl" : undef,
		json => JSON::PP->new,
		http => HTTP::Tiny->new(timeout => 5, keep_alive => 0),
		h => undef,
	}, $class;
	return $self;
}

sub port { return $_[0]{port} }

# The log file, or undef with log => 0.
sub logfile { return $_[0]{log} }

sub url
{
	my ($self, $path) = @_;
	return "http://127.0.0.1:$self->{port}" . ($path // '/hook');
}

# Starts test/receiver and waits until /__health answers.
sub start
{
	my ($self) = @_;
	croak 'the receiver is already running' if $self->{h};
	croak "$binary is missing: run make test/receiver (make installcheck builds it)"
	  unless defined $binary && -x $binary;
	my $err = "$self->{dir}/receiver-$self->{port}.err";
	$self->{h} = IPC::Run::start(
		[ $binary, $self->{port}, $self->{log} // '-' ],
		'<', \undef, '>>', "$self->{dir}/receiver-$self->{port}.out", '2>>', $err);
	my $deadline = time() + 5;
	while (time() < $deadline)
	{
		return $self if $self->{http}->get($self->url('/__health'))->{success};
		last unless $self->{h}->pumpable;
		usleep(20_000);
	}
	$self->stop;
	my $msg = -e $err ? PostgreSQL::Test::Utils::slurp_file($err) : '';
	croak "the receiver on port $self->{port} did not start: $msg";
}

# Kills it (SIGKILL) and waits.
sub stop
{
	my ($self) = @_;
	return unless $self->{h};
	$self->{h}->kill_kill;
	$self->{h} = undef;
	return;
}

# POSTs to /__control; dies unless it answers 2xx.
sub control
{
	my ($self, $ctl) = @_;
	my $r = $self->{http}->post($self->url('/__control'),
		{ content => $self->{json}->encode($ctl), headers => { 'Content-Type' => 'application/json' } });
	croak "receiver control failed: $r->{status} $r->{content}" unless $r->{success};
	return;
}

# Every request logged so far (empty with log => 0).
sub requests
{
	my ($self) = @_;
	my @r;
	return @r unless defined $self->{log} && -e $self->{log};
	open(my $fh, '<', $self->{log}) or croak "cannot open $self->{log}: $!";
	while (my $l = <$fh>)
	{
		# a line still being written is left for the next call
		last unless $l =~ /\n\z/;
		push @r, $self->{json}->decode($l);
	}
	close $fh;
	return @r;
}

# GET /__stats, decoded.
sub stats
{
	my ($self) = @_;
	my $r = $self->{http}->get($self->url('/__stats'));
	croak "receiver stats failed: $r->{status} $r->{content}" unless $r->{success};
	return $self->{json}->decode($r->{content});
}

# Polls requests() every 50 ms until $cond->(\@requests) is true; whether it
# became true within $timeout seconds (default 10).
sub wait_for
{
	my ($self, $cond, $timeout) = @_;
	my $deadline = time() + ($timeout // 10);
	while (1)
	{
		return 1 if $cond->([ $self->requests ]);
		return 0 if time() >= $deadline;
		usleep(50_000);
	}
}

# commit_waits($node, $outbox, $round, $n, $gap): publishes $n messages to
# $outbox of $node's database postgres, $gap seconds apart, one commit
# each (recorded in a table published_$round), and waits up to 30 s for a
# pipeline to deliver each to this receiver. Returns the commit-to-receipt
# waits in seconds, sorted, or undef when some did not arrive.
sub commit_waits
{
	my ($self, $node, $outbox, $round, $n, $gap) = @_;
	my $json = $self->{json};
	$node->safe_psql('postgres', "CREATE TABLE published_$round (id bigint, at double precision)");
	$node->safe_psql('postgres', qq{DO \$\$
BEGIN
	FOR i IN 1 .. $n LOOP
		INSERT INTO published_$round
			SELECT tide.outbox_publish('$outbox', '{"n": 1}'), extract(epoch FROM clock_timestamp());
		COMMIT;
		PERFORM pg_sleep($gap);
	END LOOP;
END \$\$});
	my %published_at = map { split /\|/ } split /\n/, $node->safe_psql('postgres', "SELECT id, at FROM published_$round");
	my %received_at;
	$self->wait_for(
		sub {
			%received_at = ();
			for my $r (@{ $_[0] })
			{
				next unless $r->{status} == 200;
				my $b = $json->decode($r->{body});
				$received_at{ $_->{message_id} } //= $r->{t} for (ref $b eq 'ARRAY' ? @$b : ($b));
			}
			!grep { !defined $received_at{$_} } keys %published_at;
		},
		30) or return undef;
	return [ sort { $a <=> $b } map { $received_at{$_} - $published_at{$_} } keys %published_at ];
}

sub DESTROY
{
	my ($self) = @_;
	local ($@, $!, $?);
	eval { $self->stop };
	return;
}

1;
