# A pipeline with ordering relaxed and "overlap_batches" (the default of
# Kafka and NATS; given here to a webhook pipeline) that works through a
# backlog overlaps its batches: it leases batch k+1 while batch k is in flight, starts k+1 as
# soon as k finished and records k while k+1 is in flight. Shown here with
# a webhook receiver that answers after a delay and a record that takes at
# least 50 ms (a trigger on the offset tables sleeps, and notes each offset
# the relay writes with the time it wrote it):
#
# 1. Deliveries of batch k+1 reach the receiver before batch k was recorded
#    (for most batches of the backlog); every message arrives; the durable
#    offset and the group's committed offset only move forward, one batch
#    after the other, in lease order.
# 2. A batch that could not send all its messages (timeout_ms ran out while
#    requests waited for max_in_flight) does not start the batch leased
#    ahead: the next deliveries come only after its record, and nothing is
#    skipped (the batch leased ahead is leased again after the rest).
# 3. A backlog goes through a pg_terminate_backend of the worker and a
#    kill -9 of the postmaster while it is being delivered, and still every
#    message arrives and the offsets never went backwards.
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

my $node = tide_node('overlap', "pg_tide.relay_naptime_ms = 200\nrestart_after_crash = on\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new;
my $rcv = PgTide::Receiver->new(dir => $dir);
$rcv->start;

sub sql { return $node->safe_psql('postgres', $_[0]) }

# Every offset the relay writes, with the time it wrote it (after a 50 ms
# sleep, so that each record lasts at least that long). Only committed
# records stay in the log.
sql(q{
	CREATE TABLE public.offset_log (seq bigserial, kind text, consumer text, v bigint, t double precision);
	CREATE FUNCTION public.note_offset() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		IF TG_TABLE_NAME = 'relay_consumer_offsets' THEN
			PERFORM pg_catalog.pg_sleep(0.05);
			INSERT INTO public.offset_log (kind, consumer, v, t)
			VALUES ('durable', NEW.pipeline_id, NEW.last_change_id,
					extract(epoch FROM pg_catalog.clock_timestamp()));
		ELSIF NEW.committed_offset IS NOT NULL
			AND (TG_OP = 'INSERT' OR NEW.committed_offset IS DISTINCT FROM OLD.committed_offset) THEN
			INSERT INTO public.offset_log (kind, consumer, v, t)
			VALUES ('group', NEW.consumer_id, NEW.committed_offset,
					extract(epoch FROM pg_catalog.clock_timestamp()));
		END IF;
		RETURN NULL;
	END $$;
	CREATE TRIGGER note_offset AFTER INSERT OR UPDATE ON tide.relay_consumer_offsets
		FOR EACH ROW EXECUTE FUNCTION public.note_offset();
	CREATE TRIGGER note_offset AFTER INSERT OR UPDATE ON tide.tide_consumer_offsets
		FOR EACH ROW EXECUTE FUNCTION public.note_offset();
});

# Makes pipeline $name (outbox $name, path /$name), disabled, with the given
# webhook settings.
sub make_pipeline
{
	my ($name, $extra) = @_;
	my $cfg = $json->encode({
		sink_type => 'webhook', url => $rcv->url("/$name"),
		allow_http => JSON::PP::true, allow_private_network => JSON::PP::true,
		batch_size => 20, max_in_flight => 20, timeout_ms => 10000, overlap_batches => JSON::PP::true,
		retry => { base_ms => 100, cap_ms => 1000, max_attempts => 100 },
		%$extra });
	sql("SELECT tide.outbox_create('$name')");
	sql("SELECT tide.relay_set_outbox('$name', '$name', '$name', '$cfg'::jsonb)");
	sql("SELECT tide.relay_disable('$name')");
}

# Publishes n messages to outbox $name in one transaction; their ids.
sub publish
{
	my ($name, $n) = @_;
	return split /\n/, sql("SELECT tide.outbox_publish('$name', jsonb_build_object('n', g))
		FROM generate_series(1, $n) g");
}

# The receipts at path /$name answered 200: [id, unix time in seconds].
sub receipts
{
	my ($name) = @_;
	my @out;
	for my $r ($rcv->requests)
	{
		next unless $r->{path} eq "/$name" && $r->{status} == 200;
		my $b = $json->decode($r->{body});
		push @out, [ $b->{message_id}, $r->{t} ];
	}
	return @out;
}

# Ids received at /$name, each once.
sub distinct_ids
{
	my %seen = map { $_->[0] => 1 } receipts($_[0]);
	return \%seen;
}

# Waits until every id arrived at /$name; whether they did within $timeout s.
sub wait_for_all
{
	my ($name, $ids, $timeout) = @_;
	return defined wait_until(sub {
		my $seen = distinct_ids($name);
		!grep { !$seen->{$_} } @$ids;
	}, $timeout, 100_000);
}

# Waits until the pipeline recorded its last message (the receiver sees a
# batch before its record commits); whether it did within $timeout s.
sub wait_recorded
{
	my ($name, $last, $timeout) = @_;
	return defined wait_until(sub {
		sql("SELECT coalesce(max(last_change_id), 0) FROM tide.relay_consumer_offsets WHERE pipeline_id = '$name'") == $last;
	}, $timeout, 100_000);
}

# The offsets written for a pipeline, in the order written: [v, t].
sub offsets
{
	my ($kind, $consumer) = @_;
	return map { [ split /\|/ ] } split /\n/,
	  sql("SELECT v, t FROM public.offset_log WHERE kind = '$kind' AND consumer = '$consumer' ORDER BY seq");
}

# Whether the values only move forward (strictly, when $strict).
sub forward
{
	my ($strict, @v) = @_;
	for my $i (1 .. $#v)
	{
		return 0 if $v[$i] < $v[ $i - 1 ] || ($strict && $v[$i] == $v[ $i - 1 ]);
	}
	return 1;
}

# For each record of a pipeline (its durable offset v at time t) but the
# last: [v, t, the first receipt of a message after v, messages the record
# settled].
sub transitions
{
	my ($name) = @_;
	my @recs = offsets('durable', $name);
	my @rcpt = receipts($name);
	my @out;
	for my $k (0 .. $#recs - 1)
	{
		my ($v, $t) = @{ $recs[$k] };
		my $next = $recs[ $k + 1 ][0];
		my ($first) = sort { $a <=> $b } map { $_->[1] } grep { $_->[0] > $v && $_->[0] <= $next } @rcpt;
		my $prev = $k == 0 ? 0 : $recs[ $k - 1 ][0];
		my $settled = grep { $_->[0] > $prev && $_->[0] <= $v } @rcpt;
		push @out, [ $v, $t, $first, $settled ];
	}
	return @out;
}

# 1. A backlog of 10 full batches to a receiver answering after 100 ms.
make_pipeline('ov', {});
my @ids = publish('ov', 200);
$rcv->control({ delay_ms => 100 });
sql("SELECT tide.relay_enable('ov')");
ok(wait_for_all('ov', \@ids, 60), 'every message of the backlog arrived');
is(scalar(keys %{ distinct_ids('ov') }), 200, '200 distinct messages arrived');
ok(wait_recorded('ov', $ids[-1], 30), 'the last batch was recorded');

my @durable = map { $_->[0] } offsets('durable', 'ov');
my @group = map { $_->[0] } offsets('group', 'relay:ov');
ok(forward(1, @durable), 'the durable offset moved forward at every record: ' . join(' ', @durable));
ok(forward(1, @group), 'the group\'s committed offset moved forward at every record');
is($durable[-1], $ids[-1], 'the durable offset reached the last message');
is(scalar(@durable), 10, 'ten records, one per batch of 20');
my @overlapped = grep { defined $_->[2] && $_->[2] < $_->[1] } transitions('ov');
note(sprintf "%d of %d batches began before the batch before them was recorded",
	scalar(@overlapped), scalar(@durable) - 1);
cmp_ok(scalar(@overlapped), '>=', 5,
	'deliveries of batch k+1 began before batch k was recorded (most batches)');
unlike(slurp_file($node->logfile), qr/stopped this pass after an error/,
	'no record failed (each was in lease order)');

# 2. At most 4 requests in flight, answered after 300 ms, within 1000 ms:
# each batch of 20 delivers 12 and does not send 8.
make_pipeline('ns', { max_in_flight => 4, timeout_ms => 1000 });
@ids = publish('ns', 100);
$rcv->control({ delay_ms => 300 });
sql("SELECT tide.relay_enable('ns')");
ok(wait_for_all('ns', \@ids, 90), 'every message arrived although batches left messages unsent');
is(scalar(keys %{ distinct_ids('ns') }), 100, '100 distinct messages arrived');
ok(wait_recorded('ns', $ids[-1], 30), 'the last batch of "ns" was recorded');
my @short = grep { $_->[3] < 20 } transitions('ns');
cmp_ok(scalar(@short), '>', 0, 'some batches were recorded with messages not sent');
my @early = grep { defined $_->[2] && $_->[2] < $_->[1] } @short;
is(scalar(@early), 0,
	'after a batch with messages not sent, nothing was delivered before its record');
ok(forward(1, map { $_->[0] } offsets('durable', 'ns')), 'the durable offset of "ns" moved forward');
ok(forward(1, map { $_->[0] } offsets('group', 'relay:ns')), 'its group offset moved forward');

# 3. A backlog of 100 batches through a terminated worker and a killed postmaster.
# Five requests at a time: the backlog lasts some seconds, so the kill
# comes before its end on a loaded machine too.
make_pipeline('cr', { max_in_flight => 5 });
@ids = publish('cr', 2000);
$rcv->control({ delay_ms => 30 });
sql("SELECT tide.relay_enable('cr')");
ok(defined wait_until(sub { scalar(keys %{ distinct_ids('cr') }) >= 100 }, 60),
	'the backlog is being delivered');
my $old = sql("SELECT pid FROM tide.relay_workers() WHERE database = 'postgres'");
is(sql("SELECT pg_terminate_backend($old)"), 't', 'the worker is terminated mid-stream');
ok(defined wait_until(sub {
	my $pid = sql("SELECT pid FROM tide.relay_workers() WHERE database = 'postgres'");
	$pid ne '' && $pid ne $old;
}, 60), 'another worker started');
my $before_kill = scalar(keys %{ distinct_ids('cr') });
ok(defined wait_until(sub { scalar(keys %{ distinct_ids('cr') }) >= $before_kill + 40 }, 60),
	'the new worker delivers');
$node->kill9;
my $at_kill = scalar(keys %{ distinct_ids('cr') });
note("the postmaster was killed with $at_kill of 2000 messages received");
cmp_ok($at_kill, '<', 2000, 'the kill came while messages were still undelivered');
# The old children leave once they see the postmaster gone; until then a
# start fails (the shared memory is in use) and leaves the dead
# postmaster's pid behind, which the next try must not take for a server.
ok(defined wait_until(sub {
	$node->{_pid} = undef;
	$node->start(fail_ok => 1);
}, 60, 500_000), 'the server starts again');
ok(wait_for_all('cr', \@ids, 120), 'every message arrived after the crash');
is(scalar(keys %{ distinct_ids('cr') }), 2000, '2000 distinct messages arrived');
ok(wait_recorded('cr', $ids[-1], 30), 'the last batch of "cr" was recorded');
my @after = map { $_->[0] } offsets('durable', 'cr');
ok(forward(0, @after), 'the durable offset of "cr" never went backwards');
ok(forward(0, map { $_->[0] } offsets('group', 'relay:cr')), 'nor its group offset');

$rcv->stop;
done_testing();
