# pg_dump keeps outboxes, messages, groups, offsets and leases, and a restored
# database publishes on with ids above every restored one.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode;

my $node = tide_node('dump');
$node->safe_psql('postgres', 'CREATE DATABASE source');
$node->safe_psql('source', q{
	CREATE EXTENSION pg_tide;
	SELECT tide.outbox_create('orders', 48, 500);
	SELECT tide.create_consumer_group('g', 'orders');
	SELECT tide.outbox_publish_batch('orders',
		ARRAY(SELECT jsonb_build_object('n', i) FROM generate_series(1, 5) i));
	SELECT tide.commit_offset('g', 'c1', max(id)) FROM tide.poll_outbox('g', 'c1', 2);
	SELECT count(*) FROM tide.poll_outbox('g', 'c1', 2);
});

my $dump = PostgreSQL::Test::Utils::tempdir . '/source.sql';
$node->command_ok([ 'pg_dump', '-d', $node->connstr('source'), '-f', $dump ], 'pg_dump');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('restored'), '-f', $dump ],
	'restore');

my $query = q{
	SELECT (SELECT string_agg(outbox_name || ':' || retention_hours || ':' || inline_threshold, ',') FROM tide.tide_outbox_config),
		   (SELECT string_agg(id || '=' || (payload->>'n'), ',' ORDER BY id) FROM tide.tide_outbox_messages),
		   (SELECT string_agg(group_name || ':' || committed_offset || ':' || pending, ',') FROM tide.consumer_lag),
		   (SELECT string_agg(consumer_id || ':' || lease_start || '-' || lease_end, ',') FROM tide.tide_consumer_leases)
};
is($node->safe_psql('restored', $query), $node->safe_psql('source', $query),
	'outboxes, messages, positions and leases are restored');
is($node->safe_psql('restored', q{SELECT tide.outbox_publish('orders', '{"n": 6}')}), '6',
	'publishing continues after the highest restored id');
is($node->safe_psql('restored', q{
	SELECT string_agg(payload->>'n', ',' ORDER BY id) FROM tide.poll_outbox('g', 'c1', 100)}),
	'3,4', 'the restored lease is returned to its consumer');
$node->safe_psql('restored', q{SELECT tide.commit_offset('g', 'c1', 4)});
is($node->safe_psql('restored', q{
	SELECT string_agg(payload->>'n', ',' ORDER BY id) FROM tide.poll_outbox('g', 'c1', 100)}),
	'5,6', 'then the rest, none skipped');

$node->stop;
done_testing();
