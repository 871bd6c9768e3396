# The worker gives back the memory of a burst (relay/worker_memory.c):
# 200 webhook pipelines of one outbox, enabled and idle (the worker's
# resting size), then 50 messages fanned out to all of them; once every
# one is delivered and the worker is idle again, its private memory
# (RssAnon) settles within twice its resting size. Before, it kept what
# the burst took (about 5 times its resting size here; 550 MB after 100
# messages to 1,000 pipelines, bench/RESULTS.md).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use PgTide::Receiver;

my $pipelines = 200;
my $messages = 50;
my $dir = PostgreSQL::Test::Utils::tempdir;
my $rcv = PgTide::Receiver->new(dir => $dir, log => 0);
$rcv->start;
my $node = tide_node('worker_memory', "pg_tide.relay_naptime_ms = '2s'\n");
my $url = $rcv->url('/hook');

# The worker's private (anonymous) memory in kB; shared memory is not in it.
sub worker_kb
{
	my ($pid) = @_;
	open(my $fh, '<', "/proc/$pid/status") or return undef;
	while (my $line = <$fh>)
	{
		return $1 if $line =~ /^RssAnon:\s+(\d+)\s+kB/;
	}
	return undef;
}

$node->safe_psql('postgres', qq{
	SELECT tide.outbox_create('fan', p_inline_threshold => 2000000000);
	SELECT tide.relay_set_outbox('fan_' || i, 'fan', 'fan_' || i,
	         jsonb_build_object('sink_type', 'webhook', 'url', '$url', 'allow_http', true,
	                            'allow_private_network', true, 'mode', 'single',
	                            'batch_size', $messages, 'max_in_flight', 1))
	  FROM generate_series(1, $pipelines) i;
});
my $pid;
ok(defined wait_until(sub {
	$pid = $node->safe_psql('postgres',
		"SELECT pid FROM tide.relay_workers() WHERE database = 'postgres' AND pipelines = $pipelines");
	return $pid =~ /^\d+$/;
}, 30), "a relay worker serves the $pipelines pipelines");

# At rest: the pipelines are read and have looked for work a few times.
sleep(4);
my $rest = worker_kb($pid);
ok(defined $rest && $rest > 0, 'the worker\'s resting memory can be read');
note("at rest: $rest kB");

# The burst: every pipeline delivers every message.
$node->safe_psql('postgres', qq{
	SELECT tide.outbox_publish_batch('fan',
	         (SELECT array_agg(jsonb_build_object('n', i, 'pad', repeat('x', 200)) ORDER BY i)
	            FROM generate_series(1, $messages) i))});
my $last = $node->safe_psql('postgres', q{SELECT max(id) FROM tide.tide_outbox_messages WHERE outbox_name = 'fan'});
my $peak = 0;
my $took = wait_until(sub {
	my $kb = worker_kb($pid) // 0;
	$peak = $kb if $kb > $peak;
	return $node->safe_psql('postgres', qq{
		SELECT count(*) = $pipelines FROM tide.relay_consumer_offsets
		 WHERE pipeline_id LIKE 'fan\\_%' AND last_change_id >= $last}) eq 't';
}, 60, 100_000);
ok(defined $took, "$messages messages fanned out to $pipelines pipelines are delivered");
cmp_ok($rcv->stats->{requests}, '>=', $pipelines * $messages, 'the receiver counted every request');
note(sprintf('burst: %.1f s, peak %d kB', $took // -1, $peak));
# Else the test below could not fail.
cmp_ok($peak, '>', 2 * $rest, 'the burst took more than twice the worker\'s resting memory');

# Settled: the worker is idle again for a few seconds.
my $after;
wait_until(sub {
	$after = worker_kb($pid);
	return $after <= 2 * $rest;
}, 8, 500_000);
note("after the burst: $after kB, " . sprintf('%.2f', $after / $rest) . ' times at rest');
is($node->safe_psql('postgres', q{SELECT pid FROM tide.relay_workers() WHERE database = 'postgres'}), $pid,
	'the same worker served the whole burst');
cmp_ok($after, '<=', 2 * $rest, 'the worker\'s private memory after the burst is within twice its resting size');

$node->stop;
done_testing();
