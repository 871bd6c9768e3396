# A pipeline config that reaches tide.relay_outbox_config without the
# validator: every row written is validated by the table's trigger, but a
# row written while triggers are off (session_replication_role = replica)
# may hold anything: 1e-400, 1e300, strings for numbers. The worker runs the
# same validator on every row it reads, each on its own in a
# subtransaction, so such a row never stops the database's other pipelines
# (an SQL cast of 1e-400 to float8 used to fail every pass of the worker):
# it delivers nothing, shows the validator's message as its error, logged
# once, and delivers once the row is fixed.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode;
use PgTide::TestNode qw(wait_until);
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
# With the trigger on, the row is refused as relay_set_outbox refuses it.
my $odd = q{'{"rate_limit": {"per_second": 1e-400, "burst": 1e300}, "batch_size": 1e300,
              "breaker": {"cooldown_ms": "soon"}}'::jsonb};
my ($rc, $out, $err) = $node->psql('postgres',
	"UPDATE tide.relay_outbox_config SET config = config || $odd WHERE name = 'odd'");
like($err, qr/config key "batch_size" is out of range: 1\.000e\+300/,
	'the trigger refuses the odd row written by hand');
# The row as a replica, or a restore with triggers off, might write it.
$node->safe_psql('postgres', qq{
	SET session_replication_role = replica;
	UPDATE tide.relay_outbox_config SET config = config || $odd WHERE name = 'odd'});
is($node->safe_psql('postgres', "SELECT config -> 'batch_size' FROM tide.relay_outbox_config WHERE name = 'odd'"),
	'1' . ('0' x 300), 'with triggers off, the odd row is stored as written');

# Lines in a file, waiting (bounded) until there are at least $want.
sub lines_in
{
	my ($file, $want, $timeout) = @_;
	my $deadline = time() + ($timeout // 20);
	my $n = 0;
	while (time() < $deadline)
	{
		$n = -e $file ? () = slurp_file($file) =~ /\n/g : 0;
		last if $n >= $want;
		usleep(100_000);
	}
	return $n;
}

my $message = 'config key "batch_size" is out of range: 1.000e+300';
ok(defined wait_until(sub {
	$node->safe_psql('postgres', "SELECT last_error FROM tide.relay_pipeline_status WHERE pipeline = 'odd'")
	  eq $message }, 10, 100_000),
	'the odd pipeline shows the validator\'s message as its last error');
is($node->safe_psql('postgres',
	"SELECT last_error_class || ' ' || health FROM tide.relay_pipeline_status WHERE pipeline = 'odd'"),
	'config failing', 'of class config, and the pipeline counts as failing');
# A row written with triggers off wakes no worker: it is read at the next
# reading (the naptime). Publish once the worker has read it.
$node->safe_psql('postgres', "SELECT tide.outbox_publish('orders', jsonb_build_object('n', g)) FROM generate_series(1, 5) g");

is(lines_in("$dir/healthy.jsonl", 5), 5, 'the healthy pipeline delivers all 5 messages beside the odd row');
ok(defined wait_until(sub {
	$node->safe_psql('postgres',
		"SELECT last_change_id FROM tide.relay_consumer_offsets WHERE pipeline_id = 'healthy'") eq '5' }, 10, 100_000),
	'and records them: its offset is at the last message');

# Some passes of the worker later (naptime 200 ms): still nothing delivered,
# the message logged once.
usleep(2_000_000);
ok(!-e "$dir/odd.jsonl", 'the odd pipeline delivers nothing');
is($node->safe_psql('postgres', "SELECT count(*) FROM tide.relay_consumer_offsets WHERE pipeline_id = 'odd'"),
	'0', 'and records no offset');
my $log = slurp_file($node->logfile);
my $logged = () = $log =~ /pg_tide relay pipeline "odd" is passed over: \Q$message\E/g;
is($logged, 1, 'the odd row is logged once, not at every pass');
unlike($log, qr/out of range for type double precision|invalid input syntax|stopped this pass after an error/,
	'no pass of the worker failed on the odd row');

# Fixed, the row delivers what was published, and its error is cleared.
$node->safe_psql('postgres',
	"SELECT tide.relay_set_outbox('odd', 'orders', 'odd',
	   jsonb_build_object('sink_type', 'file', 'path', '$dir/odd.jsonl', 'rate_limit', jsonb_build_object('per_second', 1000)))");
is(lines_in("$dir/odd.jsonl", 5), 5, 'the fixed pipeline delivers all 5 messages');
ok(defined wait_until(sub {
	$node->safe_psql('postgres',
		"SELECT coalesce(last_error_class, 'none') FROM tide.relay_pipeline_status WHERE pipeline = 'odd'")
	  eq 'none' }, 10, 100_000),
	'and its config error is cleared');

$node->stop;
done_testing();
