# "ordering": "key": 3,000 messages of 100 keys (a few without a key) go to
# a receiver that answers 503 at random and in bursts, and now and then
# answers only after timeout_ms, while the relay worker is terminated
# (pg_terminate_backend) and the postmaster is killed with SIGKILL. Then:
#  - for every key, when a message first arrives (is answered 200), every
#    earlier message of its key has arrived already (a redelivery may
#    repeat an earlier one, never let a later one overtake it);
#  - every message arrived, none was dead-lettered, and nothing is left
#    in the retry queue;
#  - a failing key held back only itself: while a message waited for its
#    next attempt, messages of other keys arrived;
#  - with "types" routing, a message of another type is never sent, even
#    when its key is blocked;
#  - a key taken from a header ("ordering_key": "aggregate-id") keeps the
#    same order through failures.
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

my $node = tide_node('keyorder', "pg_tide.relay_naptime_ms = 100\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', $_[0]) }

my $rcv = PgTide::Receiver->new(dir => $dir);
$rcv->start;
# 4 % of the answers are 503; 1 request in 400 is answered after 1.5 s,
# past the batch's timeout_ms of 1 s.
my %faults = (fail_rate => 0.04, fail_code => 503, seed => 35, delay_ms => 1500,
	delay_rate => 0.0025);
$rcv->control({%faults});

sql("SELECT tide.outbox_create('orders')");
my $cfg = $json->encode({
	sink_type => 'webhook',
	url => $rcv->url,
	allow_http => JSON::PP::true,
	allow_private_network => JSON::PP::true,
	batch_size => 100,
	max_in_flight => 16,
	timeout_ms => 1000,
	ordering => 'key',
	ordering_key => '/agg',
	retry => { base_ms => 20, cap_ms => 200, max_attempts => 100 } });
sql("SELECT tide.relay_set_outbox('hook', 'orders', 'hook', '$cfg'::jsonb)");

my $worker = "SELECT pid FROM tide.relay_workers() WHERE database = 'postgres'";
ok(defined wait_until(sub { sql($worker) ne '' }, 20), 'the relay worker runs');

# Every message parked (queued behind its key's failure), as a trigger on
# the retry queue sees it: parked entries leave the queue within moments,
# so looking at the queue now and then can miss them all.
sql(q{CREATE TABLE public.parked_seen (message_id bigint);
	CREATE FUNCTION public.note_parked() RETURNS trigger LANGUAGE plpgsql
	  SET search_path = pg_catalog AS $$
	  BEGIN INSERT INTO public.parked_seen VALUES (NEW.message_id); RETURN NULL; END $$;
	CREATE TRIGGER note_parked AFTER INSERT OR UPDATE ON tide.relay_retry_queue
	  FOR EACH ROW WHEN (NEW.last_error_class = 'parked') EXECUTE FUNCTION public.note_parked()});

# The most messages seen parked at once, for the log.
my $parked_max = 0;
sub look_at_parked
{
	my $n = $node->psql('postgres',
		"SELECT count(*) FROM tide.relay_retry_queue WHERE last_error_class = 'parked'",
		stdout => \my $out);
	$parked_max = $out if $n == 0 && $out =~ /^\d+$/ && $out > $parked_max;
}

# Waits $us microseconds, looking at the retry queue meanwhile.
sub pause
{
	my ($us) = @_;
	my $until = time() + $us / 1e6;
	while (time() < $until)
	{
		look_at_parked();
		usleep(50_000);
	}
}

# 600 messages: key k<g % 100>, every 19th without a key.
my $published = 0;
sub publish
{
	my $from = $published + 1;
	my $to = $published + 600;
	sql("SELECT tide.outbox_publish('orders',
		   CASE WHEN g % 19 = 0 THEN jsonb_build_object('n', g)
		        ELSE jsonb_build_object('n', g, 'agg', 'k' || (g % 100)) END)
		   FROM generate_series($from, $to) g");
	$published = $to;
}

publish();
pause(300_000);
# a burst: every request answers 503 for 400 ms
$rcv->control({ always => 503 });
pause(400_000);
$rcv->control({ always => undef });
publish();
pause(300_000);

# the worker is terminated while it delivers; the launcher starts another
my $pid = sql($worker);
is(sql("SELECT pg_terminate_backend($pid)"), 't', 'the relay worker is terminated');
publish();
ok(defined wait_until(sub { my $p = sql($worker); $p ne '' && $p ne $pid }, 30),
	'a new relay worker runs');
pause(300_000);
$rcv->control({ always => 503 });
pause(300_000);
$rcv->control({ always => undef });
publish();
pause(200_000);

# the postmaster is killed with SIGKILL while batches are in flight
$node->kill9;
# (a start fails while the old server's processes still hold its shared
# memory; the node then believes it runs, so it is told otherwise)
my $started = wait_until(sub { $node->{_pid} = undef; $node->start(fail_ok => 1) }, 30, 500_000);
ok(defined $started, 'the server starts again after SIGKILL of the postmaster');
publish();

my @ids = split /\n/, sql("SELECT id FROM tide.tide_outbox_messages ORDER BY id");
is(scalar(@ids), 3000, '3000 messages were published');

# Message id => its key (undef: none), from the outbox.
my %key_of;
for my $row (split /\n/, sql("SELECT id, payload->>'agg' FROM tide.tide_outbox_messages"))
{
	my ($id, $key) = split /\|/, $row, -1;
	$key_of{$id} = $key eq '' ? undef : $key;
}

sub arrived
{
	my %seen;
	for my $r ($rcv->requests)
	{
		$seen{ $json->decode($r->{body})->{message_id} } = 1 if $r->{status} == 200;
	}
	return \%seen;
}
my $all = wait_until(sub { look_at_parked(); my $a = arrived(); !grep { !$a->{$_} } @ids }, 60, 200_000);
ok(defined $all, 'every message arrived');
note("the most messages seen parked at once: $parked_max");
cmp_ok(sql('SELECT count(DISTINCT message_id) FROM public.parked_seen'), '>', 0,
	'messages were parked behind a failed message of their key');
$rcv->control({ reset => JSON::PP::true });

my @requests = $rcv->requests;
my %answers;
$answers{ $_->{status} }++ for @requests;
note(sprintf('%d requests: %s', scalar(@requests),
	join(', ', map { "$_: $answers{$_}" } sort keys %answers)));
cmp_ok($answers{503} // 0, '>', 50, 'many requests were answered 503');

# For each key, its ids in order; when an id first arrives, every earlier id
# of its key must have arrived already.
my %ids_of_key;
push @{ $ids_of_key{ $key_of{$_} } }, $_ for grep { defined $key_of{$_} } @ids;
my %rank;
for my $k (keys %ids_of_key)
{
	my $i = 0;
	$rank{$_} = $i++ for @{ $ids_of_key{$k} };
}
my %arrived_prefix;		# key => how many of its first ids have arrived
my %seen;
my @overtakes;
my $redelivered = 0;
for my $r (@requests)
{
	next unless $r->{status} == 200;
	my $id = $json->decode($r->{body})->{message_id};
	my $k = $key_of{$id};
	if ($seen{$id}++)
	{
		$redelivered++;
		next;
	}
	next unless defined $k;
	my $prefix = $arrived_prefix{$k} // 0;
	if ($rank{$id} != $prefix)
	{
		push @overtakes, "key $k: message $id arrived before message $ids_of_key{$k}[$prefix]";
	}
	# the prefix of the key's ids that have arrived
	$prefix++ while $prefix < @{ $ids_of_key{$k} } && $seen{ $ids_of_key{$k}[$prefix] };
	$arrived_prefix{$k} = $prefix;
}
is(scalar(@overtakes), 0, 'no message arrived before an earlier message of its key')
	or diag(join("\n", @overtakes[0 .. ($#overtakes < 9 ? $#overtakes : 9)]));
note("messages that arrived more than once: $redelivered");
is(scalar(keys %ids_of_key), 100, 'the messages had 100 keys');

# While a message of a key waited between a 503 and its acknowledgement,
# messages of other keys were acknowledged: one key held back only itself.
my %first_fail;
my %first_ok;
for my $i (0 .. $#requests)
{
	my $r = $requests[$i];
	my $id = $json->decode($r->{body})->{message_id};
	next unless defined $key_of{$id};
	$first_fail{$id} //= $i if $r->{status} == 503;
	$first_ok{$id} //= $i if $r->{status} == 200;
}
my $others_flowed = 0;
for my $id (keys %first_fail)
{
	next unless defined $first_ok{$id} && $first_ok{$id} > $first_fail{$id};
	for my $i ($first_fail{$id} + 1 .. $first_ok{$id} - 1)
	{
		my $r = $requests[$i];
		next unless $r->{status} == 200;
		my $other = $json->decode($r->{body})->{message_id};
		if (defined $key_of{$other} && $key_of{$other} ne $key_of{$id})
		{
			$others_flowed++;
			last;
		}
	}
}
cmp_ok($others_flowed, '>', 20, 'other keys were delivered while a failed message waited');

is(sql('SELECT count(*) FROM tide.relay_dlq'), '0', 'nothing was dead-lettered');
ok(defined wait_until(sub { sql('SELECT count(*) FROM tide.relay_retry_queue') eq '0' }, 10),
	'the retry queue is empty');
my $timeouts = sql("SELECT count(*) FROM tide.relay_attempts
	WHERE pipeline_id = 'hook' AND error_class = 'timeout'");
note("attempts that timed out: $timeouts");
cmp_ok($timeouts, '>', 0, 'some attempts timed out (their answer came after timeout_ms)');

# How many messages of the requests (those answered 200) arrived for the
# first time after a later message of their key (%$key_of: id => key).
sub overtakes
{
	my ($requests, $key_of) = @_;
	my (%last, %seen);
	my $n = 0;
	for my $r (grep { $_->{status} == 200 } @$requests)
	{
		my $id = $json->decode($r->{body})->{message_id};
		my $k = $key_of->{$id};
		next if !defined $k || $seen{$id}++;
		$n++ if defined $last{$k} && $id < $last{$k};
		$last{$k} = $id if !defined $last{$k} || $id > $last{$k};
	}
	return $n;
}

# With routing: a message its "types" pass over is never sent, not even once
# parked or blocked behind a failing message of its key. 10 keys, whose
# messages are of type order.kept and order.skipped in turn; 30 % of the
# answers are 503.
$rcv->control({ reset => JSON::PP::true });
$rcv->control({ fail_rate => 0.3, fail_code => 503, seed => 7 });
my $typed = $json->decode($cfg);
$typed->{url} = $rcv->url('/typed');
$typed->{types} = ['order.kept'];
sql("SELECT tide.relay_set_outbox('typed', 'orders', 'typed', '" . $json->encode($typed) . "'::jsonb)");
my %typed_key;
my %kept;
for my $row (split /\n/, sql("SELECT tide.outbox_publish('orders', jsonb_build_object('agg', 't' || (g % 10)),
		jsonb_build_object('type', CASE WHEN (g / 10) % 2 = 0 THEN 'order.kept' ELSE 'order.skipped' END)),
		g % 10, (g / 10) % 2 = 0 FROM generate_series(1, 200) g"))
{
	my ($id, $k, $keep) = split /\|/, $row;
	$typed_key{$id} = "t$k";
	$kept{$id} = 1 if $keep eq 't';
}
my %typed_seen;
ok(defined wait_until(sub {
	%typed_seen = ();
	for my $r ($rcv->requests)
	{
		next unless $r->{path} eq '/typed' && $r->{status} == 200;
		$typed_seen{ $json->decode($r->{body})->{message_id} } = 1;
	}
	!grep { !$typed_seen{$_} } keys %kept }, 60, 200_000), 'every message of the routed type arrived');
my @typed_requests = grep { $_->{path} eq '/typed' } $rcv->requests;
is(scalar(grep { !$kept{ $json->decode($_->{body})->{message_id} } } @typed_requests), 0,
	'no message of another type was sent');
is(overtakes(\@typed_requests, \%typed_key), 0, 'with routing too, each key arrived in id order');
cmp_ok(scalar(grep { $_->{status} == 503 } @typed_requests), '>', 10, 'the routed pipeline saw failures');
ok(defined wait_until(sub { sql("SELECT count(*) FROM tide.relay_retry_queue WHERE pipeline_id = 'typed'") eq '0' }, 10),
	'its retry queue is empty');

# The key from a header: "ordering_key": "aggregate-id", 5 keys.
$rcv->control({ reset => JSON::PP::true });
$rcv->control({ fail_rate => 0.3, fail_code => 503, seed => 11 });
my $by_header = $json->decode($cfg);
$by_header->{url} = $rcv->url('/by_header');
$by_header->{ordering_key} = 'aggregate-id';
sql("SELECT tide.outbox_create('accounts')");
sql("SELECT tide.relay_set_outbox('by_header', 'accounts', 'by_header', '" . $json->encode($by_header) . "'::jsonb)");
my %header_key;
for my $row (split /\n/, sql("SELECT tide.outbox_publish('accounts', jsonb_build_object('n', g),
		jsonb_build_object('aggregate-id', 'h' || (g % 5))), g % 5 FROM generate_series(1, 200) g"))
{
	my ($id, $k) = split /\|/, $row;
	$header_key{$id} = "h$k";
}
my @header_requests;
my $header_keys_queued = 0;
ok(defined wait_until(sub {
	$header_keys_queued ||= sql("SELECT count(*) FROM tide.relay_retry_queue
		WHERE pipeline_id = 'by_header' AND ordering_key ~ '^h[0-4]\$'") > 0;
	@header_requests = grep { $_->{path} eq '/by_header' } $rcv->requests;
	my %ok = map { $json->decode($_->{body})->{message_id} => 1 } grep { $_->{status} == 200 } @header_requests;
	!grep { !$ok{$_} } keys %header_key }, 60, 200_000), 'keyed by a header: every message arrived');
is(overtakes(\@header_requests, \%header_key), 0, 'keyed by a header: each key arrived in id order');
cmp_ok(scalar(grep { $_->{status} == 503 } @header_requests), '>', 10, 'keyed by a header: through failures');
ok($header_keys_queued, 'keyed by a header: queued entries carry the header\'s value as their key');
ok(defined wait_until(sub { sql("SELECT count(*) FROM tide.relay_retry_queue WHERE pipeline_id = 'by_header'") eq '0' }, 10),
	'keyed by a header: its retry queue is empty');

$rcv->stop;
$node->stop;
done_testing();
