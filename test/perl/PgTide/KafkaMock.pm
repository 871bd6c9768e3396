# A Kafka cluster for the Kafka sink's TAP tests: librdkafka's mock cluster
# (test/brokers/kafka_mock, on 127.0.0.1, ports chosen by the system), and
# the consumer that reads a topic back (test/brokers/kafka_consume, a real
# librdkafka consumer, not the sink's code). installcheck builds both.
#
#   my $kafka = PgTide::KafkaMock->new;        # started; dies if it cannot start
#   $kafka->bootstrap;                        # "127.0.0.1:<port>"
#   $kafka->command('create orders 3');       # see kafka_mock.c for the commands
#   my @msgs = $kafka->consume('orders');     # hashrefs: topic, partition, offset,
#                                             # key, headers ({name => value}), body
#   $kafka->stop;                             # also at exit
package PgTide::KafkaMock;

use strict;
use warnings;
use Carp;
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use IPC::Run;
use JSON::PP;

my $dir = abs_path(dirname(abs_path(__FILE__)) . '/../../brokers');
my @running;

sub new
{
	my ($class, %args) = @_;
	my $self = bless { in => '', out => '', err => '' }, $class;
	croak "$dir/kafka_mock is missing: make installcheck builds it" unless -x "$dir/kafka_mock";
	$self->{h} = IPC::Run::start([ "$dir/kafka_mock", $args{brokers} // 1 ],
		'<', \$self->{in}, '>', \$self->{out}, '2>', \$self->{err},
		IPC::Run::timeout(600));
	$self->{h}->pump until $self->{out} =~ /\n/ || !$self->{h}->pumpable;
	croak "kafka_mock did not start: $self->{err}" unless $self->{out} =~ s/^(\S+)\n//;
	$self->{bootstrap} = $1;
	push @running, $self;
	return $self;
}

sub bootstrap { return $_[0]{bootstrap} }

# Sends a command and waits for its answer; dies unless it is "ok".
sub command
{
	my ($self, $cmd) = @_;
	$self->{in} .= "$cmd\n";
	$self->{h}->pump until $self->{out} =~ /\n/ || !$self->{h}->pumpable;
	$self->{out} =~ s/^([^\n]*)\n//;
	croak "kafka_mock: $cmd: " . ($1 // 'no answer') unless ($1 // '') eq 'ok';
	return 1;
}

# Every message of a topic, in partition and offset order.
sub consume
{
	my ($self, $topic) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ "$dir/kafka_consume", $self->{bootstrap}, $topic, 20000 ],
		'>', \$out, '2>', \$err, IPC::Run::timeout(60))
	  or croak "kafka_consume $topic failed: $err";
	my $json = JSON::PP->new;
	my @msgs;
	for my $line (split /\n/, $out)
	{
		my $m = $json->decode($line);
		$m->{header_list} = $m->{headers};
		$m->{headers} = { map { $_->[0] => $_->[1] } @{ $m->{header_list} } };
		push @msgs, $m;
	}
	return sort { $a->{partition} <=> $b->{partition} || $a->{offset} <=> $b->{offset} } @msgs;
}

sub stop
{
	my ($self) = @_;
	return unless $self->{h};
	$self->{in} .= "quit\n";
	eval { $self->{h}->finish; 1 } or $self->{h}->kill_kill;
	$self->{h} = undef;
}

END { $_->stop for @running }

1;
