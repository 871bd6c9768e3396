# Changing a relay pipeline row notifies channel tide_relay_config.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode;

my $node = tide_node('notify');

my (undef, $out, $err) = $node->psql('postgres', q{
	LISTEN tide_relay_config;
	INSERT INTO tide.relay_outbox_config (name, enabled, config)
	VALUES ('p1', false, '{"sink_type": "file", "path": "/dev/null", "outbox": "o1", "consumer_group": "g1"}');
	UPDATE tide.relay_outbox_config SET enabled = false WHERE name = 'p1';
	DELETE FROM tide.relay_outbox_config WHERE name = 'p1';
	-- a reverse row without a source this server has is refused by the
	-- row's check; written as a restore writes it, its deletion is notified
	SET session_replication_role = replica;
	INSERT INTO tide.relay_inbox_config (name, config) VALUES ('r1', '{}');
	RESET session_replication_role;
	DELETE FROM tide.relay_inbox_config WHERE name = 'r1';
});
my @payloads = $out =~ /Asynchronous notification "tide_relay_config" with payload "(.*?)" received/g;
is_deeply(
	\@payloads,
	[
		'{"table" : "relay_outbox_config", "op" : "INSERT", "name" : "p1"}',
		'{"table" : "relay_outbox_config", "op" : "UPDATE", "name" : "p1"}',
		'{"table" : "relay_outbox_config", "op" : "DELETE", "name" : "p1"}',
		'{"table" : "relay_inbox_config", "op" : "DELETE", "name" : "r1"}',
	],
	'every change of either table is notified') or diag("stdout: $out\nstderr: $err");

$node->stop;
done_testing();
