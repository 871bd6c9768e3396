# Change capture under concurrent writers, a backfill and a crash: a table
# of 5,000 rows is captured; sessions insert, update and delete its rows in
# transactions of their own (some rolled back, some waiting on each other's
# row locks) while tide.outbox_backfill publishes the rows that existed;
# the server is killed with SIGKILL in the middle of both and restarted,
# the writers go on and the backfill resumes; then a consumer that polls
# the outbox and applies each message in id order to an empty copy ends
# with exactly the table's rows, and no row was read twice by the backfill.
# Last, pg_dump and a restore keep the capture and the backfill's progress. The messages of one
# key are in the order of their commits, since a writer of a row waits for
# the writer before it; a message of a rolled-back or crashed transaction
# would put a row into the copy that the table does not have.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode;
use IPC::Run;

my $node = tide_node("capture_replay", "max_connections = 40\nfsync = on\nrestart_after_crash = on");
$node->safe_psql('postgres', q{
	SELECT tide.outbox_create('cdc', 24, 10000000);
	SELECT tide.create_consumer_group('replay', 'cdc');
	CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, note text, big text);
	INSERT INTO items SELECT g, g, 'old', 'x' FROM generate_series(1, 5000) g;
	SELECT tide.outbox_capture('items', 'cdc', '{"ignore": ["big"]}');
	CREATE TABLE copy (LIKE items);
	ALTER TABLE copy ADD PRIMARY KEY (id);
	-- A backfill's "read" of a row that an earlier message already gave
	-- must show the row as those messages left it: a read older than
	-- them (the row read before a change that committed before it) is
	-- recorded here.
	CREATE TABLE stale_reads (message_id bigint);
	-- One poll of the consumer, each message applied in id order.
	CREATE FUNCTION replay() RETURNS int LANGUAGE plpgsql AS $$
	DECLARE
		m record;
		n int := 0;
		last_id bigint;
	BEGIN
		FOR m IN SELECT * FROM tide.poll_outbox('replay', 'r', 500) p ORDER BY p.id LOOP
			IF m.payload->>'op' = 'read' THEN
				INSERT INTO stale_reads SELECT m.id FROM copy c
				 WHERE c.id = (m.payload->'key'->>'id')::int
				   AND (c.v, c.note) IS DISTINCT FROM ((m.payload->'new'->>'v')::int, m.payload->'new'->>'note');
			END IF;
			IF m.payload->>'op' = 'delete' THEN
				DELETE FROM copy WHERE id = (m.payload->'key'->>'id')::int;
			ELSE
				INSERT INTO copy SELECT * FROM jsonb_populate_record(NULL::copy, m.payload->'new')
				ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v, note = EXCLUDED.note;
			END IF;
			n := n + 1;
			last_id := m.id;
		END LOOP;
		IF n > 0 THEN
			PERFORM tide.commit_offset('replay', 'r', last_id);
		END IF;
		RETURN n;
	END $$;
});

my $dir = PostgreSQL::Test::Utils::tempdir;
open my $fh, '>', "$dir/write.sql" or die $!;
print $fh q{
\set a random(1, 60)
\set b random(1, 60)
\set op random(1, 4)
\set fate random(1, 8)
BEGIN;
INSERT INTO items VALUES (:a, :client_id, 'c' || :client_id, repeat('x', 100))
	ON CONFLICT (id) DO UPDATE SET v = items.v + 1, note = 'u' || :client_id;
\if :op = 1
DELETE FROM items WHERE id = :b;
\elif :op = 2
UPDATE items SET v = v * 2 % 1000 WHERE id = :b;
\elif :op = 3
UPDATE items SET big = 'y' WHERE id BETWEEN :b AND :b + 2;
\else
INSERT INTO items VALUES (:b, 0) ON CONFLICT DO NOTHING;
\endif
SELECT pg_sleep(random() / 200);
\if :fate = 1
ROLLBACK;
\else
COMMIT;
\endif
};
close $fh;

# pgbench for `seconds`, 5 clients; returns its handle and output.
sub writers
{
	my ($seconds) = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[ 'pgbench', '-n', '-T', $seconds, '-c', '5', '--max-tries', '20', '-f', "$dir/write.sql",
		  '-h', $node->host, '-p', $node->port, 'postgres' ],
		'>', \$out, '2>', \$err);
	return ($h, \$out, \$err);
}

# The backfill, in chunks of 5 rows, in a session of its own.
sub backfill
{
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[ 'psql', '-X', '-v', 'ON_ERROR_STOP=1', '-h', $node->host, '-p', $node->port, '-d', 'postgres',
		  '-c', q{CALL tide.outbox_backfill('items', 'cdc', '{"chunk_size": 5}')} ],
		'>', \$out, '2>', \$err);
	return ($h, \$err);
}

# Writers, then the backfill once they run, killed with the server after
# a few seconds.
my ($h, $out, $err) = writers(30);
foreach my $i (1 .. 300)
{
	last if $node->safe_psql('postgres',
		q{SELECT count(*) FROM tide.tide_outbox_messages WHERE outbox_name = 'cdc'}) >= 50;
	select(undef, undef, undef, 0.1);
}
my ($bh, $berr) = backfill();
my ($before, $read_before) = (0, 0);
foreach my $i (1 .. 300)
{
	($before, $read_before) = split /\|/, $node->safe_psql('postgres', q{
		SELECT (SELECT count(*) FROM tide.tide_outbox_messages WHERE outbox_name = 'cdc'),
			   (SELECT coalesce(sum(rows_published), 0) FROM tide.outbox_backfills)});
	last if $before >= 300 && $read_before >= 100;
	select(undef, undef, undef, 0.1);
}
cmp_ok($before, '>=', 300, "the writers published $before messages before the crash");
cmp_ok($read_before, '>=', 100, "the backfill published $read_before rows before the crash");
cmp_ok($read_before, '<', 5000, 'the backfill had not finished');
# SIGKILL of the backfill's backend: the postmaster ends every session
# and recovers the database from its WAL, as after a crash. (A SIGKILL of
# the postmaster alone would let a busy backend finish its work.)
my $backfill_pid = $node->safe_psql('postgres', q{
	SELECT pid FROM pg_stat_activity WHERE query LIKE 'CALL tide.outbox_backfill%'});
like($backfill_pid, qr/^\d+$/, 'the backfill runs in its session');
kill 'KILL', $backfill_pid;
$h->finish;
$bh->finish;
isnt($h->result(0), 0, 'the writers lost their server');
isnt($bh->result(0), 0, 'the backfill lost its server');
my $started = 0;
foreach my $i (1 .. 60)
{
	if (eval { $node->safe_psql('postgres', 'SELECT 1'); 1 })
	{
		$started = 1;
		last;
	}
	sleep 1;
}
ok($started, 'the server recovered from the crash');

# The writers again, after the restart, to the end, and the backfill
# resumes after the last chunk that committed.
($h, $out, $err) = writers(4);
($bh, $berr) = backfill();
$h->finish;
$bh->finish;
is($h->result(0), 0, 'the writers ran after the restart') or diag($$err);
is($bh->result(0), 0, 'the backfill resumed and finished') or diag($$berr);
is($node->safe_psql('postgres', q{SELECT finished_at IS NOT NULL FROM tide.outbox_backfills}),
	't', 'the backfill is recorded as finished');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM (SELECT payload->'key' FROM tide.tide_outbox_messages
		WHERE outbox_name = 'cdc' AND payload->>'op' = 'read' GROUP BY 1 HAVING count(*) > 1) d}),
	'0', 'no row was read twice by the backfill across the crash');
# Rows the writers never touch (61 and above) are each read exactly once.
is($node->safe_psql('postgres', q{
	SELECT count(DISTINCT payload->'key') FROM tide.tide_outbox_messages
	 WHERE outbox_name = 'cdc' AND payload->>'op' = 'read' AND (payload->'key'->>'id')::int > 63}),
	'4937', 'every untouched row was read once');

# The consumer replays everything.
my $applied = 0;
foreach my $i (1 .. 2000)
{
	my $n = $node->safe_psql('postgres', 'SELECT replay()');
	last if $n == 0;
	$applied += $n;
}
my $published = $node->safe_psql('postgres',
	q{SELECT count(*) FROM tide.tide_outbox_messages WHERE outbox_name = 'cdc'});
is($applied, $published, "the consumer applied every one of the $published messages");
cmp_ok($published, '>', $before, 'messages were published after the restart too');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM (
		(SELECT id, v, note FROM items EXCEPT SELECT id, v, note FROM copy)
		UNION ALL
		(SELECT id, v, note FROM copy EXCEPT SELECT id, v, note FROM items)) d}),
	'0', 'the replayed copy equals the table');
cmp_ok($node->safe_psql('postgres', 'SELECT count(*) FROM items'), '>', 0, 'the table has rows');
is($node->safe_psql('postgres', 'SELECT count(*) FROM stale_reads'), '0',
	'every backfill read of a row shows it as the messages before it left it');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM tide.tide_outbox_messages
	 WHERE outbox_name = 'cdc' AND (payload->'new' ? 'big' OR payload->'old' ? 'big')}),
	'0', 'no payload holds the ignored column');
# A change of the ignored column alone is still published: only
# ignore_changes_of holds it back.
$node->safe_psql('postgres', q{UPDATE items SET big = 'z' WHERE id = (SELECT min(id) FROM items)});
is($node->safe_psql('postgres', 'SELECT replay()'), '1', 'an update of the ignored column alone is published');

# pg_dump keeps the capture: its triggers with the table (created after
# the rows are loaded, so the restore publishes nothing), its row and the
# backfill's progress with the extension's data.
my $dump = PostgreSQL::Test::Utils::tempdir . '/capture.sql';
$node->command_ok([ 'pg_dump', '-d', $node->connstr('postgres'), '-f', $dump ], 'pg_dump');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('restored'), '-f', $dump ],
	'restore');
my $state = q{
	SELECT (SELECT string_agg(table_name::text || ':' || outbox_name || ':' || options::text, ',') FROM tide.outbox_captures),
		   (SELECT string_agg(last_key::text || ':' || rows_published || ':' || (finished_at IS NOT NULL), ',') FROM tide.outbox_backfills),
		   (SELECT count(*) FROM tide.tide_outbox_messages WHERE outbox_name = 'cdc')};
is($node->safe_psql('restored', $state), $node->safe_psql('postgres', $state),
	'the capture, the backfill\'s progress and the messages are restored');
is($node->safe_psql('restored', q{
	INSERT INTO items VALUES (9999, 1);
	SELECT payload->>'op' || ':' || (payload->'key'->>'id') FROM tide.tide_outbox_messages
	 WHERE outbox_name = 'cdc' ORDER BY id DESC LIMIT 1}),
	'insert:9999', 'the restored table is captured');

$node->stop;
done_testing();
