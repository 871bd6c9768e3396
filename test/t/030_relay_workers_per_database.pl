# Several relay workers per database (pg_tide.relay_workers_per_database):
# the launcher keeps that many, each pipeline is served by one of them at a
# time, and the pipelines move when the setting changes on reload, while
# deliveries run. Twelve webhook pipelines with max_in_flight 1 deliver to a
# receiver that answers each request after 40 ms; the receiver counts, per
# path (one per pipeline), the requests in flight at each receipt: two
# workers sending one pipeline's batch at once would show as 2. Every
# message must arrive, and after each change the pipelines are spread over
# the new number of workers, each holding the advisory lock of the
# pipelines it serves.
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

my $node = tide_node('per_database',
	"pg_tide.relay_naptime_ms = 100\npg_tide.relay_workers_per_database = 2\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $rcv = PgTide::Receiver->new(dir => $dir);
$rcv->start;
my $port = $rcv->port;
$rcv->control({ delay_ms => 40 });

sub sql { return $node->safe_psql('postgres', $_[0]) }

my @pipelines = map { sprintf('p%02d', $_) } 1 .. 12;
my $lock_key = 0x74696465;	# RELAY_PIPELINE_LOCK_KEY, relay/relay_xact.h

sql("SELECT tide.outbox_create('orders')");
for my $p (@pipelines)
{
	sql("SELECT tide.relay_set_outbox('$p', 'orders', 'g_$p', jsonb_build_object(
		  'sink_type', 'webhook', 'url', 'http://127.0.0.1:$port/$p', 'allow_http', true,
		  'allow_private_network', true, 'max_in_flight', 1, 'batch_size', 5))");
}

# "index:pipelines" of the database's workers, by index, e.g. "0:6 1:6".
sub spread
{
	return sql("SELECT string_agg(worker_index || ':' || pipelines, ' ' ORDER BY worker_index)
				  FROM tide.relay_workers() WHERE database = 'postgres'");
}

# Waits until $n workers serve the twelve pipelines between them, each some.
sub wait_for_spread
{
	my ($n) = @_;
	return wait_until(
		sub {
			sql("SELECT count(*) = $n AND sum(pipelines) = 12 AND min(pipelines) > 0
				   FROM tide.relay_workers() WHERE database = 'postgres'") eq 't';
		},
		30, 100_000);
}

# Publishes $n messages; returns their ids.
sub publish
{
	my ($n) = @_;
	return split /\n/,
	  sql("SELECT tide.outbox_publish('orders', jsonb_build_object('n', g)) FROM generate_series(1, $n) g");
}

# Whether every pipeline has received every id with a 200.
sub all_delivered
{
	my (@ids) = @_;
	my %got;
	for my $r ($rcv->requests)
	{
		next unless $r->{status} == 200;
		$got{ $r->{path} }{ decode_json($r->{body})->{message_id} } = 1;
	}
	for my $p (@pipelines)
	{
		for my $id (@ids)
		{
			return 0 unless $got{"/$p"}{$id};
		}
	}
	return 1;
}

# The requests that arrived while another of the same pipeline was in flight.
sub overlapping
{
	return grep { $_->{concurrent} > 1 } $rcv->requests;
}

# Sets relay_workers_per_database and reloads.
sub set_workers
{
	my ($n) = @_;
	sql("ALTER SYSTEM SET pg_tide.relay_workers_per_database = $n");
	sql('SELECT pg_reload_conf()');
}

ok(wait_for_spread(2), 'two workers serve the database, the pipelines spread over both: ' . spread());
is(sql("SELECT count(*) || ' ' || count(DISTINCT pid) FROM pg_locks
		 WHERE locktype = 'advisory' AND classid = $lock_key AND objsubid = 2 AND granted"),
	'12 2', 'each pipeline has its advisory lock, held by the two workers');

# 2 -> 3 while the first messages are delivered.
my @ids = publish(20);
ok(wait_until(sub { scalar($rcv->requests) >= 40 }, 30), 'deliveries run');
set_workers(3);
ok(wait_until(sub { all_delivered(@ids) }, 60, 200_000),
	'every message reached every pipeline across the change to 3 workers');
ok(wait_for_spread(3), 'three workers, the pipelines spread over them: ' . spread());
is(sql("SELECT count(*) || ' ' || count(DISTINCT l.pid) FROM pg_locks l
		  JOIN tide.relay_workers() w ON w.pid = l.pid
		 WHERE l.locktype = 'advisory' AND l.classid = $lock_key AND l.objsubid = 2 AND l.granted"),
	'12 3', 'the twelve locks are held by the three workers');
my @overlaps = overlapping();
is(scalar(@overlaps), 0, 'no request of a pipeline overlapped another of the same pipeline (2 -> 3)')
  or diag(join("\n", map { "$_->{path} at $_->{t}: $_->{concurrent} in flight" } @overlaps[0 .. ($#overlaps < 9 ? $#overlaps : 9)]));

# 3 -> 1: two workers leave between their batches, one serves everything.
# (counted before the publish: the deliveries may be over before its psql returns)
my $before = scalar($rcv->requests);
@ids = publish(20);
ok(wait_until(sub { scalar($rcv->requests) >= $before + 40 }, 30), 'deliveries run again');
set_workers(1);
ok(wait_until(sub { all_delivered(@ids) }, 60, 200_000),
	'every message reached every pipeline across the change to 1 worker');
ok(wait_until(sub { spread() eq '0:12' }, 30, 100_000), 'one worker serves the twelve pipelines: ' . spread());
@overlaps = overlapping();
is(scalar(@overlaps), 0, 'no request of a pipeline overlapped another of the same pipeline (3 -> 1)');
is($rcv->stats->{max_concurrent}, 1, 'the receiver never saw two requests of one path at once');

# A pipeline's owner is its name's hash modulo the workers: the same after a
# restart of the server.
set_workers(2);
ok(wait_for_spread(2), 'two workers again: ' . spread());
my $owners = sql("SELECT string_agg(w.worker_index::text, ',' ORDER BY l.objid)
				    FROM pg_locks l JOIN tide.relay_workers() w ON w.pid = l.pid
				   WHERE l.locktype = 'advisory' AND l.classid = $lock_key AND l.objsubid = 2");
$node->restart;
ok(wait_for_spread(2), 'after a restart: ' . spread());
ok( wait_until(
		sub {
			sql("SELECT string_agg(w.worker_index::text, ',' ORDER BY l.objid)
				   FROM pg_locks l JOIN tide.relay_workers() w ON w.pid = l.pid
				  WHERE l.locktype = 'advisory' AND l.classid = $lock_key AND l.objsubid = 2") eq $owners;
		},
		10),
	'each pipeline has the same owner after the restart');

# A worker that starts clears what earlier workers recorded for its own
# pipelines only: the hold of a pipeline another worker keeps stays in
# relay_pipeline_health. 'held0' hashes to worker 0 of 1 and of 2.
set_workers(1);
ok(wait_for_spread(1) || spread() =~ /^0:\d+$/, 'one worker again: ' . spread());
my $nobody = PostgreSQL::Test::Cluster::get_free_port();
sql("SELECT tide.relay_set_outbox('held0', 'orders', 'g_held0', jsonb_build_object(
	  'sink_type', 'webhook', 'url', 'http://127.0.0.1:$nobody/held0', 'allow_http', true,
	  'allow_private_network', true, 'retry', jsonb_build_object('base_ms', 60000, 'cap_ms', 60000)))");
publish(1);
ok( wait_until(
		sub { sql("SELECT held_until > now() FROM tide.relay_pipeline_health WHERE pipeline_id = 'held0'") eq 't' },
		20),
	'held0 is held by worker 0');
set_workers(2);
ok( wait_until(
		sub { sql("SELECT coalesce(min(passes), 0) > 3 FROM tide.relay_workers() WHERE database = 'postgres' HAVING count(*) = 2") eq 't' },
		30),
	'worker 1 has started and made its passes');
is(sql("SELECT held_until > now() FROM tide.relay_pipeline_health WHERE pipeline_id = 'held0'"), 't',
	'the hold of held0, still worker 0\'s, is still recorded');
is(sql("SELECT health FROM tide.relay_pipeline_status WHERE pipeline = 'held0'"), 'held',
	'relay_pipeline_status says held');

$rcv->stop;
done_testing();
