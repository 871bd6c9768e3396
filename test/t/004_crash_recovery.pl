# A crash loses and skips nothing: committed messages and committed offsets
# survive, an uncommitted publish never appears, a lease that was in flight
# is delivered again, and publishing and polling go on after the restart.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode;

my $node = tide_node('crash', "restart_after_crash = on");
$node->safe_psql('postgres', q{
	SELECT tide.outbox_create('orders');
	SELECT tide.create_consumer_group('g', 'orders');
	SELECT tide.outbox_publish_batch('orders',
		ARRAY(SELECT jsonb_build_object('n', i) FROM generate_series(1, 100) i));
});

# The consumer acknowledges 1..40, then leases 41..60 and is still working.
$node->safe_psql('postgres', q{
	SELECT tide.commit_offset('g', 'c1', max(id)) FROM tide.poll_outbox('g', 'c1', 40);
	SELECT count(*) FROM tide.poll_outbox('g', 'c1', 20);
});

# A publisher is in the middle of its transaction when the server crashes.
my $publisher = $node->background_psql('postgres');
$publisher->query_safe(q{BEGIN; SELECT tide.outbox_publish('orders', '{"n": "uncommitted"}')});
my $pid = $publisher->query_safe('SELECT pg_backend_pid()');
chomp $pid;
kill 'KILL', $pid;
$publisher->{run}->kill_kill;

# The postmaster reinitialises shared memory and restarts.
$node->poll_query_until('postgres', 'SELECT 1', '1') or die 'server did not come back';

my $position = $node->safe_psql('postgres',
	q{SELECT committed_offset = (SELECT id FROM tide.tide_outbox_messages WHERE payload->>'n' = '40')
	  FROM tide.consumer_lag WHERE group_name = 'g'});
is($position, 't', 'the committed offset survived the crash');

is($node->safe_psql('postgres', q{SELECT count(*) FROM tide.tide_outbox_messages WHERE payload->>'n' = 'uncommitted'}),
	'0', 'the uncommitted message is not there');
is($node->safe_psql('postgres', 'SELECT tide._oldest_open_publish_age() IS NULL'),
	't', 'no publish tracker slot is left occupied after the restart');

# Publishing goes on, with ids above every id handed out before the crash.
$node->safe_psql('postgres', q{SELECT tide.outbox_publish_batch('orders',
	ARRAY(SELECT jsonb_build_object('n', i) FROM generate_series(101, 110) i))});

# The in-flight lease comes back to its consumer, then everything else, in
# order: every committed message from 41 on, none skipped.
my $got = $node->safe_psql('postgres', q{
	SELECT string_agg(payload->>'n', ',' ORDER BY id) FROM tide.poll_outbox('g', 'c1', 20);
});
is($got, join(',', 41 .. 60), 'the lease that was in flight is delivered again');
$node->safe_psql('postgres', q{SELECT tide.commit_offset('g', 'c1', max(id)) FROM tide.poll_outbox('g', 'c1', 20)});
$got = $node->safe_psql('postgres', q{
	SELECT string_agg(payload->>'n', ',' ORDER BY id) FROM tide.poll_outbox('g', 'c1', 1000);
});
is($got, join(',', 61 .. 110), 'the rest follows, none skipped, none from the aborted transaction');

$node->stop;
done_testing();
