# Expiring messages through a webhook pipeline whose receiver answers 503
# for a while (docs/scheduled-messages.md):
#
#  1. Messages that expire in 4 s, published with others that expire in an
#     hour and others without an expiry, all fail (503) and wait in the
#     retry queue; the expiry passes; the next attempt dead-letters the
#     short ones with reason and error class "expired" instead of sending
#     them again.
#  2. Messages that expired before the pipeline leased them (published
#     while it was disabled) are dead-lettered the same way and never sent.
#  3. The receiver answers 200 again: the unexpired messages and those
#     without an expiry arrive, each acknowledged exactly once; no expired
#     message is ever acknowledged; the offset passes every message; the
#     pipeline's counters (relay_pipeline_status: delivered, dead_lettered,
#     expired) agree with the dead letters and with the receiver's log.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use PgTide::Receiver;
use JSON::PP;

my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new->canonical;
my $rcv = PgTide::Receiver->new(dir => $dir);
$rcv->start;
my $node = tide_node('expiring', "pg_tide.relay_naptime_ms = 100\n");

sub sql { return $node->safe_psql('postgres', $_[0]) }

# The receiver's answers by message id: { id => { status => count } }.
sub answers_by_id
{
	my %by_id;
	for my $r (grep { $_->{path} eq '/exp' } $rcv->requests)
	{
		my $b = $json->decode($r->{body});
		$by_id{ $_->{message_id} }{ $r->{status} }++ for (ref $b eq 'ARRAY' ? @$b : ($b));
	}
	return \%by_id;
}

# The ids of the messages published by `sql`, in order.
sub published
{
	return [ split /\n/, sql($_[0]) ];
}

sql("SELECT tide.outbox_create('exp')");
sql("SELECT tide.relay_set_outbox('exp', 'exp', 'exp', jsonb_build_object(
	  'sink_type', 'webhook', 'url', '" . $rcv->url('/exp') . "', 'allow_http', true,
	  'allow_private_network', true, 'batch_size', 20,
	  'retry', jsonb_build_object('base_ms', 100, 'cap_ms', 500, 'max_attempts', 100)))");
$rcv->control({ always => 503 });

###########################################################################
# 1. Short, long and no expiry, all refused for a while
###########################################################################
my $short = published("SELECT tide.outbox_publish('exp', jsonb_build_object('kind', 'short', 'n', g),
						   p_expires_at => clock_timestamp() + interval '4 seconds')
					  FROM generate_series(1, 5) g");
my $long = published("SELECT tide.outbox_publish('exp', jsonb_build_object('kind', 'long', 'n', g),
						  p_expires_at => clock_timestamp() + interval '1 hour')
					 FROM generate_series(1, 5) g");
my $none = published("SELECT tide.outbox_publish('exp', jsonb_build_object('kind', 'none', 'n', g))
					 FROM generate_series(1, 5) g");
ok(defined wait_until(sub { sql("SELECT retry_queue = 15 FROM tide.relay_pipeline_status WHERE pipeline = 'exp'") eq 't' }, 30),
	'the 15 messages failed with 503 and wait in the retry queue');
my $before = answers_by_id();
ok(!grep({ !$before->{$_}{503} } @$short), 'each short-lived message was sent and refused before it expired');

###########################################################################
# 2. Expired before the pipeline leased them
###########################################################################
sql("SELECT tide.relay_disable('exp')");
my $stale = published("SELECT tide.outbox_publish('exp', jsonb_build_object('kind', 'stale', 'n', g),
						   p_expires_at => clock_timestamp() + interval '300 ms')
					  FROM generate_series(1, 3) g");
my $last = sql("SELECT max(id) FROM tide.tide_outbox_messages WHERE outbox_name = 'exp'");
# past every expiry of 1 and 2, by more than a retry's cap and an attempt's round trip
ok(defined wait_until(sub { sql("SELECT clock_timestamp() > max(expires_at) + interval '1 second'
								   FROM tide.tide_outbox_messages WHERE payload ->> 'kind' IN ('short', 'stale')") eq 't' }, 30),
	'the short and stale messages have expired');
sql("SELECT tide.relay_enable('exp')");
ok(defined wait_until(sub { sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'exp'") eq '8' }, 30),
	'the 5 short and 3 stale messages are dead-lettered');
is(sql("SELECT string_agg(DISTINCT reason || '/' || last_error_class, ',') FROM tide.relay_dlq WHERE pipeline_id = 'exp'"),
	'expired/expired', 'with reason and error class "expired"');
is(sql("SELECT string_agg(message_id::text, ',' ORDER BY message_id) FROM tide.relay_dlq WHERE pipeline_id = 'exp'"),
	join(',', @$short, @$stale), 'exactly the expired messages');

###########################################################################
# 3. The receiver answers again
###########################################################################
$rcv->control({ always => undef });
ok(defined wait_until(sub { sql("SELECT offset_id = $last AND retry_queue = 0 FROM tide.relay_pipeline_status
								  WHERE pipeline = 'exp'") eq 't' }, 30),
	'the offset passes every message and the retry queue is empty');
my $after = answers_by_id();
is(scalar(grep { ($after->{$_}{200} // 0) == 1 } @$long, @$none), 10,
	'each unexpired message and each message without an expiry is acknowledged exactly once');
is(scalar(grep { $after->{$_}{200} } @$short), 0, 'no short-lived message is acknowledged');
is(scalar(grep { exists $after->{$_} } @$stale), 0, 'no message that expired before its lease is sent');
is(sql("SELECT delivered || ' ' || dead_lettered || ' ' || expired FROM tide.relay_pipeline_status WHERE pipeline = 'exp'"),
	'10 8 8', 'the counters: 10 delivered, 8 dead-lettered, all 8 expired');
is(sql("SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 'exp' AND message_id IN (" . join(',', @$stale) . ")"),
	'0', 'the stale messages have no attempt logged');

$node->stop;
done_testing();
