# An inbox handler's concurrency, with three relay workers in the database,
# each of which serves every handler.
#  1. concurrency 1: the batches of the inbox never overlap in time, and
#     the events are handled in id order.
#  2. concurrency 2: two batches do run at once, never three.
#  3. An ERROR of a step that is no event's fault (a column of the inbox's
#     table renamed) is shown in inbox_handler_status as the hold of the
#     handler; once the table is restored the hold ends and the events are
#     handled.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use Time::HiRes qw(usleep);

my $node = tide_node('handler_concurrency',
	"pg_tide.relay_naptime_ms = 200\npg_tide.relay_workers_per_database = 3\n");

sub sql { return $node->safe_psql('postgres', $_[0]); }

# Each call records its batch (the transaction), its worker (the backend)
# and when it began and ended; it sleeps so that batches last long enough
# to overlap when they may.
sql(q{
	CREATE ROLE cc_app IN ROLE tide_consumer;
	CREATE SCHEMA app AUTHORIZATION cc_app;
	CREATE TABLE app.calls (inbox text NOT NULL, id bigint NOT NULL, batch bigint NOT NULL,
	                        worker int NOT NULL, began timestamptz NOT NULL, ended timestamptz NOT NULL);
	ALTER TABLE app.calls OWNER TO cc_app;
	SELECT tide.inbox_create('serial');
	SELECT tide.inbox_create('parallel');
	CREATE FUNCTION app.record_call(p_inbox text, p_id bigint) RETURNS void LANGUAGE plpgsql AS $$
	DECLARE
		began timestamptz := clock_timestamp();
	BEGIN
		PERFORM pg_sleep(0.03);
		INSERT INTO app.calls VALUES (p_inbox, p_id, txid_current(), pg_backend_pid(), began, clock_timestamp());
	END $$;
	CREATE FUNCTION app.handle_serial(m tide.serial_inbox) RETURNS void LANGUAGE sql
		AS $$ SELECT app.record_call('serial', m.id) $$;
	CREATE FUNCTION app.handle_parallel(m tide.parallel_inbox) RETURNS void LANGUAGE sql
		AS $$ SELECT app.record_call('parallel', m.id) $$;
	ALTER FUNCTION app.record_call(text, bigint) OWNER TO cc_app;
	ALTER FUNCTION app.handle_serial(tide.serial_inbox) OWNER TO cc_app;
	ALTER FUNCTION app.handle_parallel(tide.parallel_inbox) OWNER TO cc_app;
	SELECT tide.inbox_set_handler('serial', 'app.handle_serial(tide.serial_inbox)', '{"batch_size": 3}');
	SELECT tide.inbox_set_handler('parallel', 'app.handle_parallel(tide.parallel_inbox)',
	                              '{"batch_size": 3, "concurrency": 2}');
});

ok(wait_until(sub { sql("SELECT count(*) FROM tide.relay_workers()") == 3 }, 30),
	'three relay workers serve the database');
# after each worker has read the handlers
usleep(1_000_000);

# 60 events into each inbox in one commit, which wakes every worker.
sub receive
{
	my ($inbox, $prefix, $n) = @_;
	sql(qq{SELECT tide.inbox_receive_batch('$inbox',
	        (SELECT jsonb_agg(jsonb_build_object('event_id', '$prefix' || i, 'payload', '{}'::jsonb))
	           FROM generate_series(1, $n) i))});
}
receive('serial', 's', 60);
receive('parallel', 'p', 60);
ok(wait_until(sub { sql(q{SELECT count(*) FROM app.calls}) == 120 }, 60, 100_000),
	'every event of both inboxes is handled');

# The batches of an inbox, each with when it began and ended.
sub batches
{
	my ($inbox) = @_;
	return qq{(SELECT batch, min(worker) AS worker, min(began) AS began, max(ended) AS ended
	             FROM app.calls WHERE inbox = '$inbox' GROUP BY batch)};
}

# Pairs of batches of the inbox that ran at the same time.
sub overlaps
{
	my ($inbox) = @_;
	my $b = batches($inbox);
	return sql(qq{SELECT count(*) FROM $b x JOIN $b y
	               ON x.batch < y.batch AND x.began < y.ended AND y.began < x.ended});
}

###########################################################################
# 1. concurrency 1: one batch at a time, in id order.
###########################################################################
is(overlaps('serial'), '0', 'test 1: no two batches of the concurrency-1 inbox overlap');
is(sql(q{SELECT count(*) FROM (SELECT id, lag(id) OVER (ORDER BY began) AS before
                                 FROM app.calls WHERE inbox = 'serial') c
          WHERE c.id < c.before}),
	'0', 'test 1: its events are handled in id order');
note('test 1: batches of the concurrency-1 inbox ran in '
	  . sql(q{SELECT count(DISTINCT worker) FROM app.calls WHERE inbox = 'serial'}) . ' worker(s)');

###########################################################################
# 2. concurrency 2: two at once, never three.
###########################################################################
cmp_ok(overlaps('parallel'), '>', 0, 'test 2: batches of the concurrency-2 inbox overlap');
my $b = batches('parallel');
is(sql(qq{SELECT count(*) FROM $b x JOIN $b y ON x.batch < y.batch JOIN $b z ON y.batch < z.batch
           WHERE greatest(x.began, y.began, z.began) < least(x.ended, y.ended, z.ended)}),
	'0', 'test 2: never three at once');
is(sql(q{SELECT count(*) || ' ' || count(DISTINCT (inbox, id)) FROM app.calls}), '120 120',
	'test 2: each event handled once');
is(sql(q{SELECT concurrency || ' ' || effective_concurrency FROM tide.inbox_handler_status
          WHERE inbox = 'parallel'}),
	'2 2', 'test 2: inbox_handler_status shows concurrency 2, all of it effective');

###########################################################################
# 3. An ERROR of a step: shown as the hold, cleared when it works again.
###########################################################################
sql(q{ALTER TABLE tide.serial_inbox RENAME COLUMN processed_at TO processed_at_renamed});
ok(wait_until(sub { sql(q{SELECT held_since IS NOT NULL FROM tide.inbox_handler_status WHERE inbox = 'serial'}) eq 't' },
		20),
	'test 3: the handler whose step ends in an ERROR is shown held');
like(sql(q{SELECT held_reason FROM tide.inbox_handler_status WHERE inbox = 'serial'}),
	qr/^its last step ended in an error \(\d+ in a row\): column .*processed_at does not exist$/,
	'test 3: with the error');
is(sql(q{SELECT held_since IS NULL FROM tide.inbox_handler_status WHERE inbox = 'parallel'}),
	't', 'test 3: the other inbox\'s handler is not held');
sql(q{ALTER TABLE tide.serial_inbox RENAME COLUMN processed_at_renamed TO processed_at});
receive('serial', 'after', 3);
ok(wait_until(sub { sql(q{SELECT count(*) FROM tide.serial_inbox WHERE processed_at IS NULL}) eq '0' }, 90, 100_000),
	'test 3: restored, the events are handled');
# a worker whose step failed as the table was restored may record its
# error after another's batch: the hold ends with its own next batch
ok(wait_until(sub { sql(q{SELECT held_since IS NULL AND held_reason IS NULL FROM tide.inbox_handler_status
                           WHERE inbox = 'serial'}) eq 't' }, 60, 100_000),
	'test 3: and the hold is over');

$node->stop;
done_testing();
