# The log of a condition that repeats: pipelines whose destination is down
# are held again and again, and a circuit breaker opens again after each
# failed probe; each used to write its lines at every attempt (3 for a
# hold). Now the log says when it starts, then at most once a minute per
# pipeline, and once when it ends, with how many attempts it took. Three
# pipelines to a closed port (retries every 100 to 300 ms) and one with a
# breaker that opens after one failure (cooldown 100 ms) for 20 s: each
# writes at most a few lines; then the destination comes up, every
# message is delivered and each pipeline's log says its hold is over. A
# fourth held pipeline, disabled, has its hold logged as over too.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use PgTide::Receiver;
use JSON::PP;
use Time::HiRes qw(time);

my $t_start = time();
my $dir = PostgreSQL::Test::Utils::tempdir;
# Its port is free and nothing listens there until it starts.
my $rcv = PgTide::Receiver->new(dir => $dir);
# One that never starts, for a pipeline disabled while held.
my $never = PgTide::Receiver->new(dir => $dir);
my $node = tide_node('log_throttle', "pg_tide.relay_naptime_ms = 200\n");
my $json = JSON::PP->new->canonical;
my @held = qw(down1 down2 down3);

$node->safe_psql('postgres', "SELECT tide.outbox_create('orders')");
for my $name (@held, 'brk', 'gone')
{
	my $cfg = $json->encode({
		sink_type => 'webhook',
		url => ($name eq 'gone' ? $never : $rcv)->url("/$name"),
		allow_http => JSON::PP::true,
		allow_private_network => JSON::PP::true,
		retry => { base_ms => 100, cap_ms => 300 },
		($name eq 'brk' ? (breaker => { failure_threshold => 1, cooldown_ms => 100 }) : ()) });
	$node->safe_psql('postgres', "SELECT tide.relay_set_outbox('$name', 'orders', '$name', '$cfg')");
}
my $log_offset = -s $node->logfile;
my @ids = split /\n/, $node->safe_psql('postgres',
	"SELECT tide.outbox_publish('orders', jsonb_build_object('n', g)) FROM generate_series(1, 3) g");

# The LOG lines that name pipeline $name since $log_offset.
sub lines_of
{
	my ($name) = @_;
	return grep { /LOG:  .*pipeline "\Q$name\E"/ } split /\n/, slurp_file($node->logfile, $log_offset);
}

# Held from the first attempt on.
ok(defined wait_until(sub { scalar(lines_of('down1')) > 0 }, 20),
	'the first hold of a pipeline to a closed port is logged');
like((lines_of('down1'))[0], qr/pipeline "down1" is held at message $ids[0]: .*conn/,
	'it says where and why');
my $t_down = time();
sleep(20);
my $seconds = time() - $t_down;
for my $name (@held, 'gone')
{
	my @lines = lines_of($name);
	cmp_ok(scalar(@lines), '<=', 2, "pipeline $name held for ${\ int($seconds)} s: at most 2 LOG lines")
	  or diag(join("\n", @lines[ 0 .. ($#lines < 9 ? $#lines : 9) ]));
}
my @brk = lines_of('brk');
cmp_ok(scalar(@brk), '<=', 4, 'the pipeline whose breaker opens again and again: at most 4 LOG lines')
  or diag(join("\n", @brk[ 0 .. ($#brk < 9 ? $#brk : 9) ]));
like(join("\n", @brk), qr/pipeline "brk": circuit breaker open after \d+ failed attempts in a row/,
	'its breaker\'s first opening is logged');
like(join("\n", @brk), qr/pipeline "brk": circuit breaker half-open/, 'and its first probe');

# The destination comes back: every message reaches every pipeline.
$rcv->start;
ok($rcv->wait_for(sub {
	my %got;
	for my $r (@{ $_[0] })
	{
		next unless $r->{status} == 200;
		$got{ $r->{path} }{ $json->decode($r->{body})->{message_id} } = 1;
	}
	for my $name (@held, 'brk')
	{
		return 0 if grep { !$got{"/$name"}{$_} } @ids;
	}
	return 1;
}, 30), 'the destination up again, every pipeline delivers every message');
my $log;
ok(defined wait_until(sub {
	$log = slurp_file($node->logfile, $log_offset);
	return !grep { $log !~ /pipeline "$_" is no longer held/ } @held;
}, 10), 'each held pipeline\'s log says its hold is over');
for my $name (@held)
{
	my ($attempts) = $log =~ /pipeline "$name" is no longer held: its destination answers again\n.*DETAIL:  Since [^:]+:[^:]+:[^:]+: (\d+) failed attempts\./;
	cmp_ok($attempts // 0, '>=', 10, "pipeline $name: the line says how many attempts failed (at least 10 in 20 s)");
}
ok(defined wait_until(sub {
	slurp_file($node->logfile, $log_offset) =~ /pipeline "brk": circuit breaker closed, the probe succeeded\n.*DETAIL:  It opened (\d+) times since/
	  && $1 >= 5;
}, 10), 'the breaker\'s closing says how often it opened (at least 5 times)');

# A held pipeline disabled: the log does not leave its hold open.
$node->safe_psql('postgres', "SELECT tide.relay_disable('gone')");
ok(defined wait_until(sub {
	slurp_file($node->logfile, $log_offset) =~ /pipeline "gone" is no longer held: this worker no longer serves it/ }, 10),
	'a held pipeline disabled: the log says its hold is over for this worker');

note(sprintf('test took %.1f s', time() - $t_start));
$rcv->stop;
$node->stop;
done_testing();
