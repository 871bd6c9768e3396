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

# No relay worker: the child tables of the message table are made by this
# test's own calls of tide._outbox_partitions_maintain() (the worker's), so
# that the source and the restored database hold the same ones.
my $node = tide_node('dump', "pg_tide.relay_enabled = off\n");
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
# Child tables of the message table, and a message in one of them (a new
# connection looks the children up).
$node->safe_psql('source', 'SELECT tide._outbox_partitions_maintain()');
is($node->safe_psql('source', q{SELECT tide.outbox_publish('orders', '{"n": 6}');
	SELECT tableoid::regclass FROM tide.tide_outbox_messages WHERE id = 6}),
	"6\ntide.tide_outbox_messages_6", 'a message in a child table before the dump');

my $dump = PostgreSQL::Test::Utils::tempdir . '/source.sql';
$node->command_ok([ 'pg_dump', '-d', $node->connstr('source'), '-f', $dump ], 'pg_dump');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('restored'), '-f', $dump ],
	'restore');

my $query = q{
	SELECT (SELECT string_agg(outbox_name || ':' || retention_hours || ':' || coalesce(inline_threshold::text, 'none'), ',' ORDER BY outbox_name) FROM tide.tide_outbox_config),
		   (SELECT string_agg(id || '=' || (payload->>'n'), ',' ORDER BY id) FROM tide.tide_outbox_messages),
		   (SELECT string_agg(group_name || ':' || committed_offset || ':' || pending, ',') FROM tide.consumer_lag),
		   (SELECT string_agg(consumer_id || ':' || lease_start || '-' || lease_end, ',') FROM tide.tide_consumer_leases)
};
is($node->safe_psql('restored', $query), $node->safe_psql('source', $query),
	'outboxes, messages, positions and leases are restored');
is($node->safe_psql('restored', q{SELECT tableoid::regclass FROM tide.tide_outbox_messages WHERE id = 6}),
	'tide.tide_outbox_messages_6', 'the child table is restored with its message');
is($node->safe_psql('restored', q{SELECT string_agg(table_name, ',' ORDER BY first_id) FROM tide.tide_outbox_partitions}),
	$node->safe_psql('source', q{SELECT string_agg(table_name, ',' ORDER BY first_id) FROM tide.tide_outbox_partitions}),
	'and the list of child tables');
is($node->safe_psql('restored', q{SELECT tide.outbox_publish('orders', '{"n": 7}');
	SELECT tableoid::regclass FROM tide.tide_outbox_messages WHERE id = 7}),
	"7\ntide.tide_outbox_messages_6", 'publishing continues after the highest restored id, into the restored child');
is($node->safe_psql('restored', q{
	SELECT string_agg(payload->>'n', ',' ORDER BY id) FROM tide.poll_outbox('g', 'c1', 100)}),
	'3,4', 'the restored lease is returned to its consumer');
$node->safe_psql('restored', q{SELECT tide.commit_offset('g', 'c1', 4)});
is($node->safe_psql('restored', q{
	SELECT string_agg(payload->>'n', ',' ORDER BY id) FROM tide.poll_outbox('g', 'c1', 100)}),
	'5,6,7', 'then the rest, none skipped');

# The restore ties the children it creates to the extension (no relay
# worker, no maintenance ran here), so DROP EXTENSION drops them.
$node->safe_psql('restored', 'DROP EXTENSION pg_tide');
is($node->safe_psql('restored', q{SELECT count(*) FROM pg_class WHERE relname LIKE 'tide_outbox_messages%'}),
	'0', 'DROP EXTENSION drops the restored child tables');

$node->stop;
done_testing();
