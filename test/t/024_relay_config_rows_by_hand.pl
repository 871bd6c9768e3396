# A pipeline config written into tide.relay_outbox_config by hand (not
# through tide.relay_set_outbox, which validates it) may hold values no
# validator would pass: 1e-400, 1e300, strings for numbers, a negative rate.
# The worker reads each row on its own and clamps what it reads, so such a
# row never stops the database's other pipelines (an SQL cast of 1e-400 to
# float8 used to fail every pass of the worker), and the row's own pipeline
# still delivers within the bounds the worker can use.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode;
use Time::HiRes qw(time usleep);

my $node = tide_node('config_rows_by_hand', "pg_tide.relay_naptime_ms = 200\n");
my $dir = PostgreSQL::Test::Utils::tempdir;

$node->safe_psql('postgres', "SELECT tide.outbox_create('orders')");
for my $p (qw(healthy odd))
{
	$node->safe_psql('postgres',
		"SELECT tide.relay_set_outbox('$p', 'orders', '$p',
		   jsonb_build_object('sink_type', 'file', 'path', '$dir/$p.jsonl'))");
}
# The row as someone might write it by hand.
$node->safe_psql('postgres', q{
	UPDATE tide.relay_outbox_config
	   SET config = config || '{"rate_limit": {"per_second": 1e-400, "burst": 1e300},
	                            "batch_size": "many", "retry": {"base_ms": -5, "cap_ms": 1e40,
	                            "max_attempts": 1e-400}, "breaker": {"cooldown_ms": "soon"},
	                            "timeout_ms": 1e300}'::jsonb
	 WHERE name = 'odd'});
$node->safe_psql('postgres', "SELECT tide.outbox_publish('orders', jsonb_build_object('n', g)) FROM generate_series(1, 5) g");

# Lines in a file, waiting (bounded) until there are at least $want.
sub lines_in
{
	my ($file, $want) = @_;
	my $deadline = time() + 20;
	my $n = 0;
	while (time() < $deadline)
	{
		$n = -e $file ? () = slurp_file($file) =~ /\n/g : 0;
		last if $n >= $want;
		usleep(100_000);
	}
	return $n;
}

is(lines_in("$dir/healthy.jsonl", 5), 5, 'the healthy pipeline delivers all 5 messages beside the odd row');
# 1e-400 messages a second is read as the slowest rate allowed, with a
# burst of 1e300 read as the largest allowed.
ok(lines_in("$dir/odd.jsonl", 5) >= 1, 'the odd row\'s own pipeline delivers within its clamped values')
  or diag($node->safe_psql('postgres', 'SELECT * FROM tide.relay_pipeline_status'));
my $recorded = '';
my $deadline = time() + 10;
while (time() < $deadline)
{
	$recorded = $node->safe_psql('postgres',
		"SELECT last_change_id FROM tide.relay_consumer_offsets WHERE pipeline_id = 'healthy'");
	last if $recorded ne '' && $recorded >= 5;
	usleep(100_000);
}
is($recorded, 5, 'and records them: its offset is at the last message');
my $log = slurp_file($node->logfile);
unlike($log, qr/out of range for type double precision|invalid input syntax|stopped this pass after an error/,
	'no pass of the worker failed on the odd row');

$node->stop;
done_testing();
