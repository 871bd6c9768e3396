# Without shared_preload_libraries, CREATE EXTENSION still works, says in a
# WARNING (with a hint naming shared_preload_libraries) that the library is
# not preloaded, and the functions that need shared memory refuse with
# SQLSTATE 55000 and a hint. Preloaded, CREATE EXTENSION warns of nothing.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;

my $current = (slurp_file("$FindBin::Bin/../../pg_tide.control") =~ /^default_version = '([^']+)'/m)[0];
my $node = PostgreSQL::Test::Cluster->new('no_preload');
$node->init;
$node->start;

my ($ret, $stdout, $stderr) =
  $node->psql('postgres', "\\set VERBOSITY verbose\nCREATE EXTENSION pg_tide");
is($ret, 0, 'CREATE EXTENSION succeeds without preloading');
like($stderr, qr/WARNING:  01000: pg_tide is not loaded via "shared_preload_libraries"/,
	'CREATE EXTENSION warns that the library is not preloaded');
like($stderr, qr/HINT:  Add pg_tide to shared_preload_libraries in postgresql.conf and restart the server\./,
	'the warning\'s hint names shared_preload_libraries');
is(scalar(() = $stderr =~ /WARNING:/g), 1, 'one warning');
is($node->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'pg_tide'"),
	$current, 'extension created without preloading');

# Configuration functions need no shared memory.
$node->safe_psql('postgres', "SELECT tide.outbox_create('orders')");

foreach my $call (
	"SELECT tide.outbox_publish('orders', '{}')",
	"SELECT tide.outbox_publish_batch('orders', ARRAY['{}']::jsonb[])",
	"SELECT tide.create_consumer_group('g', 'orders', 'latest')",
	"SELECT * FROM tide.poll_outbox('g', 'c')",
	"SELECT tide.wait_for_messages('g', 0)",
	"SELECT tide.outbox_status('orders')",
	"SELECT * FROM tide.relay_workers()")
{
	my ($ret, $stdout, $stderr) =
	  $node->psql('postgres', "\\set VERBOSITY verbose\n$call");
	isnt($ret, 0, "refused: $call");
	like($stderr, qr/ERROR:  55000: pg_tide must be loaded via "shared_preload_libraries"/,
		"55000 with the message: $call");
	like($stderr, qr/HINT:  Add pg_tide to shared_preload_libraries/, "hint: $call");
}

# The status view works and says why nothing is delivered.
$node->safe_psql('postgres',
	q{SELECT tide.relay_set_outbox('to_file', 'orders', 'to_file', '{"sink_type": "file", "path": "/dev/null"}')});
is($node->safe_psql('postgres', "SELECT health || ': ' || reason FROM tide.relay_pipeline_status"),
	'stopped: pg_tide is not in shared_preload_libraries', 'relay_pipeline_status: stopped, and why');
$node->safe_psql('postgres', "SELECT tide.relay_delete('to_file')");

is($node->safe_psql('postgres', 'SELECT count(*) FROM tide.tide_outbox_messages'),
	'0', 'nothing was written');

$node->safe_psql('postgres', 'DROP EXTENSION pg_tide');
is($node->safe_psql('postgres', "SELECT count(*) FROM pg_namespace WHERE nspname = 'tide'"),
	'0', 'DROP EXTENSION removes schema tide');

# Preloaded, the same CREATE EXTENSION warns of nothing.
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'pg_tide'\n");
$node->restart;
($ret, $stdout, $stderr) = $node->psql('postgres', 'CREATE EXTENSION pg_tide');
is($ret, 0, 'CREATE EXTENSION succeeds with the library preloaded');
unlike($stderr, qr/WARNING/, 'preloaded, CREATE EXTENSION warns of nothing');

$node->stop;
done_testing();
