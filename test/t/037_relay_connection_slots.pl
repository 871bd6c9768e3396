# More pipelines than a destination host gets connections (64): 300
# pipelines of one outbox, max_in_flight 1, deliver 10 messages each to
# one slow receiver (150 ms an answer) with timeout_ms 6000, so that each
# pipeline's turns at a connection take longer than its batch may. A
# request waits for one of the host's connections before it is sent, in
# turn, so none times out unsent (which would count as the destination's
# failure and hold its pipeline), and a batch whose time ran out leaves
# its unsent messages to the next batch without a hold: every message
# arrives at every pipeline's path exactly once, the attempt log holds no
# failure, and no pipeline was held.
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

my $pipelines = 300;
my $messages = 10;

my $node = tide_node('slots', "pg_tide.relay_naptime_ms = 200\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', $_[0]) }

my $rcv = PgTide::Receiver->new(dir => $dir);
$rcv->start;
$rcv->control({ delay_ms => 150 });

sql("SELECT tide.outbox_create('orders')");
my $cfg_of = sub {
	my ($i) = @_;
	return $json->encode({
		sink_type => 'webhook',
		url => $rcv->url("/p$i"),
		allow_http => JSON::PP::true,
		allow_private_network => JSON::PP::true,
		batch_size => $messages,
		max_in_flight => 1,
		timeout_ms => 6000,
		retry => { base_ms => 100, cap_ms => 500, max_attempts => 20 } });
};
sql("BEGIN;"
	  . join('', map { "SELECT tide.relay_set_outbox('p$_', 'orders', 'p$_', '" . $cfg_of->($_) . "'::jsonb);" }
		  1 .. $pipelines)
	  . "SELECT tide.relay_disable(name) FROM tide.relay_outbox_config; COMMIT;");
my @ids = split /\n/, sql("SELECT tide.outbox_publish('orders', jsonb_build_object('n', g)) FROM generate_series(1, $messages) g");
is(scalar(@ids), $messages, "$messages messages published");

# one commit lets every pipeline go at once
sql("UPDATE tide.relay_outbox_config SET enabled = true");
my $want = $pipelines * $messages;
ok(defined wait_until(sub { $rcv->stats->{requests} >= $want }, 120, 200_000),
	"the $want requests arrive");
ok($node->poll_query_until('postgres',
		"SELECT count(*) = $pipelines FROM tide.relay_consumer_offsets WHERE last_change_id >= $ids[-1]"),
	'every pipeline records its last message');

my %seen;
for my $r ($rcv->requests)
{
	next unless $r->{status} == 200;
	$seen{"$r->{path} " . $json->decode($r->{body})->{message_id}}++;
}
my @missing = grep { my $p = $_; grep { !$seen{"/p$p $_"} } @ids } 1 .. $pipelines;
is(scalar(@missing), 0, 'every message arrived at every pipeline') or diag("missing at: @missing[0 .. 9]");
my $twice = grep { $_ > 1 } values %seen;
is($twice, 0, 'no message arrived twice at a pipeline');
is(sql("SELECT count(*) || ' ' || coalesce(string_agg(DISTINCT error_class, ','), '')
		  FROM tide.relay_attempts WHERE status = 'failed'"), '0 ',
	'the attempt log holds no failure: no request timed out waiting for a connection')
  or diag(sql("SELECT pipeline_id, message_id, attempt, latency_ms, error FROM tide.relay_attempts
				WHERE status = 'failed' ORDER BY attempted_at LIMIT 10"));
is(sql("SELECT count(*) FROM tide.relay_pipeline_health WHERE held_since IS NOT NULL"), '0',
	'no pipeline is held');

$rcv->stop;
$node->stop;
done_testing();
