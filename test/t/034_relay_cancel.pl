# pg_cancel_backend on the relay worker while it delivers to a slow
# receiver: each cancel abandons the batches in flight (their requests are
# released before their memory is freed), nothing of them is recorded, and
# they are delivered again. After 50 cancels during delivery the server
# has never crashed (no process terminated by a signal, no restart), the
# worker is the same process, and every message arrived at least once.
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
use Time::HiRes qw(time usleep);

my $node = tide_node('cancel', "pg_tide.relay_naptime_ms = 100\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', $_[0]) }

my $rcv = PgTide::Receiver->new(dir => $dir);
$rcv->start;
# Slow: every request waits 200 ms, so a cancel finds requests in flight.
$rcv->control({ delay_ms => 200 });

sql("SELECT tide.outbox_create('orders')");
my $cfg = $json->encode({
	sink_type => 'webhook',
	url => $rcv->url,
	allow_http => JSON::PP::true,
	allow_private_network => JSON::PP::true,
	batch_size => 20,
	max_in_flight => 8,
	timeout_ms => 5000 });
sql("SELECT tide.relay_set_outbox('hook', 'orders', 'hook', '$cfg'::jsonb)");

my $start_time = sql('SELECT pg_postmaster_start_time()');
my $worker = "SELECT pid FROM tide.relay_workers() WHERE database = 'postgres'";
ok(defined wait_until(sub { sql($worker) ne '' }, 10), 'the relay worker runs');
my $pid = sql($worker);

my @ids = split /\n/, sql(
	"SELECT tide.outbox_publish('orders', jsonb_build_object('n', g)) FROM generate_series(1, 400) g");

# id => times acknowledged.
sub delivered
{
	my %seen;
	for my $r ($rcv->requests)
	{
		next unless $r->{status} == 200;
		$seen{ $json->decode($r->{body})->{message_id} }++;
	}
	return \%seen;
}

# 50 cancels while the worker delivers, 150 ms apart (each one while
# requests wait on the receiver).
my $cancelled = 0;
for (1 .. 50)
{
	$cancelled++ if sql("SELECT pg_cancel_backend($pid)") eq 't';
	usleep(150_000);
}
is($cancelled, 50, 'the worker was sent 50 cancels');
my $during = scalar keys %{ delivered() };
note("messages delivered during the cancels: $during of " . scalar(@ids));

$rcv->control({ delay_ms => 0 });
ok(defined wait_until(sub { my $d = delivered(); !grep { !$d->{$_} } @ids }, 60),
	'every message arrived at least once');
is(sql($worker), $pid, 'the worker went on: the same process');

my $log = slurp_file($node->logfile);
unlike($log, qr/terminated by signal/, 'no server process was terminated by a signal');
unlike($log, qr/all server processes terminated; reinitializing/, 'the server did not restart');
is(sql('SELECT pg_postmaster_start_time()'), $start_time, 'the postmaster is the same');
like($log, qr/was asked to cancel: \d+ batch(es)? in flight abandoned/, 'the log says what a cancel did');

$rcv->stop;
$node->stop;
done_testing();
