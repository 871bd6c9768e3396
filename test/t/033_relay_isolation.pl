# One pipeline's destination that accepts connections and never answers
# holds only that pipeline: a healthy pipeline beside it, on the same
# outbox and in the same worker, delivers each of 50 messages promptly
# while the hanging pipeline's first batch is still within its timeout_ms
# (20 s), and the hanging pipeline's messages all arrive once its
# destination answers again (nothing lost).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use PgTide::Receiver;
use IO::Socket::INET;
use JSON::PP;
use Time::HiRes qw(time);

my $node = tide_node('isolation', "pg_tide.relay_naptime_ms = 100\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', $_[0]) }

my $healthy = PgTide::Receiver->new(dir => $dir);
$healthy->start;
# The hanging destination's port: first a socket that listens and never
# reads (the kernel completes the connections; nothing ever answers), later
# a receiver on the same port.
my $later = PgTide::Receiver->new(dir => $dir);
my $hang = IO::Socket::INET->new(
	LocalAddr => '127.0.0.1',
	LocalPort => $later->port,
	Listen => 128,
	ReuseAddr => 1) or die "cannot listen on port " . $later->port . ": $!";

sub set_pipeline
{
	my ($name, $url, $extra) = @_;
	my $cfg = $json->encode({
		sink_type => 'webhook',
		url => $url,
		allow_http => JSON::PP::true,
		allow_private_network => JSON::PP::true,
		retry => { base_ms => 100, cap_ms => 1000, max_attempts => 10 },
		%$extra });
	sql("SELECT tide.relay_set_outbox('$name', 'orders', '$name', '$cfg'::jsonb)");
}

# id => times acknowledged at a receiver.
sub delivered
{
	my ($rcv) = @_;
	my %seen;
	for my $r ($rcv->requests)
	{
		next unless $r->{status} == 200;
		my $b = $json->decode($r->{body});
		$seen{ $_->{message_id} }++ for (ref $b eq 'ARRAY' ? @$b : ($b));
	}
	return \%seen;
}

sub publish_one
{
	return sql("SELECT tide.outbox_publish('orders', '{\"n\": 1}')");
}

sql("SELECT tide.outbox_create('orders')");
set_pipeline('hang', $later->url, { timeout_ms => 20000, batch_size => 10, max_in_flight => 4 });
set_pipeline('healthy', $healthy->url, {});

# The first message starts the hanging pipeline's batch.
my $t0 = time();
my @ids = (publish_one());
ok(defined wait_until(sub { delivered($healthy)->{ $ids[0] } }, 5),
	'the healthy pipeline delivers the first message');

# 50 more, one commit each, 20 ms apart, in one session (51 psql calls
# took longer than the hanging batch's timeout on a loaded machine); each
# message's publishing time is kept beside it.
sql("CREATE TABLE published (id bigint, at double precision)");
sql(q{DO $$
BEGIN
	FOR i IN 1 .. 50 LOOP
		INSERT INTO published
			SELECT tide.outbox_publish('orders', '{"n": 1}'), extract(epoch FROM clock_timestamp());
		COMMIT;
		PERFORM pg_sleep(0.02);
	END LOOP;
END $$});
my %published_at = map { split /\|/ } split /\n/, sql("SELECT id, at FROM published ORDER BY id");
push @ids, sort { $a <=> $b } keys %published_at;
my $all_healthy = wait_until(sub { my $d = delivered($healthy); !grep { !$d->{$_} } @ids }, 30);
my $t_all = time();
ok(defined $all_healthy, 'the healthy pipeline delivers all 51 messages');
cmp_ok($t_all - $t0, '<', 16,
	'... while the hanging pipeline\'s first batch is still within its timeout_ms of 20 s');
is(sql("SELECT coalesce(max(last_change_id), 0) < $ids[0] FROM tide.relay_consumer_offsets WHERE pipeline_id = 'hang'"), 't',
	'the hanging pipeline has recorded nothing yet: its batch is still in flight');

# Each message's wait: from its commit to its receipt by the healthy receiver.
my %received_at;
for my $r ($healthy->requests)
{
	my $b = $json->decode($r->{body});
	for my $m (ref $b eq 'ARRAY' ? @$b : ($b))
	{
		$received_at{ $m->{message_id} } //= $r->{t};
	}
}
my @waits = sort { $a <=> $b } map { $received_at{$_} - $published_at{$_} } keys %published_at;
note(sprintf('healthy pipeline beside a hanging one: wait p50 %.1f ms, max %.1f ms',
		$waits[ int(@waits / 2) ] * 1000, $waits[-1] * 1000));
cmp_ok($waits[-1], '<', 2, 'no message of the healthy pipeline waited 2 s or more');

# The destination answers again: every message reaches it.
close($hang);
$later->start;
ok(defined wait_until(sub { my $d = delivered($later); !grep { !$d->{$_} } @ids }, 60),
	'the hanging pipeline delivers all 51 messages once its destination answers');
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM tide.relay_retry_queue WHERE pipeline_id = 'hang'"),
	'its retry queue empties');

my $log = slurp_file($node->logfile);
unlike($log, qr/terminated by signal/, 'no server process crashed');

$healthy->stop;
$later->stop;
$node->stop;
done_testing();
