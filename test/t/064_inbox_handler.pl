# Inboxes that process themselves: the relay runs an inbox's handler
# (tide.inbox_set_handler) on its events as they commit.
#  1. An event is handled soon after the transaction that stored it
#     commits, as run_as, not as the worker's superuser; a rolled-back one
#     never.
#  2. A handler that fails for an event: retried, its failed attempts'
#     writes undone, then dead-lettered with the operator event
#     inbox.dead_lettered; one that fails once then succeeds runs once more
#     and never again; a relay pipeline's consumer group is closed to it.
#  3. Exactly once: 3,000 events while the worker is terminated (SIGTERM)
#     and the postmaster killed (-9) during processing: every event is
#     processed, and the handler's writes are there once per event.
#  4. Role rules at run time: a handler whose owner lost the right to act
#     as run_as is held (no event claimed, failed or dead-lettered, the
#     hold logged once and shown), and runs again when the right is back.
#  5. Retention: processed events past processed_retention_hours are
#     deleted by the relay.
#  6. Events that the relay's inbox sink writes wake the handler at their
#     commit.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until exited);
use Time::HiRes qw(time usleep);

my $node = tide_node('handler', "restart_after_crash = on\npg_tide.relay_naptime_ms = 200\n"
	  . "pg_tide.sweep_interval = 1\npg_tide.operator_events_outbox = 'ops'\n");

sub sql { return $node->safe_psql('postgres', $_[0]); }

sql(q{
	CREATE ROLE hd_app;
	CREATE ROLE hd_admin LOGIN IN ROLE tide_admin;
	GRANT tide_consumer TO hd_app;
	CREATE SCHEMA app AUTHORIZATION hd_app;
	GRANT USAGE ON SCHEMA app TO hd_admin;
	SELECT tide.inbox_create('jobs', 'tide', 3);
	SELECT tide.outbox_create('ops');
	-- every call of the handler that committed: no key, so a second call
	-- for an event would show
	CREATE TABLE app.calls (event_id text NOT NULL, run_as text NOT NULL,
	                        at timestamptz NOT NULL DEFAULT clock_timestamp());
	ALTER TABLE app.calls OWNER TO hd_app;
	-- {"fail": n}: fails while the event has failed fewer than n times
	CREATE FUNCTION app.handle(m tide.jobs_inbox) RETURNS void LANGUAGE plpgsql AS $$
	BEGIN
		INSERT INTO app.calls (event_id, run_as) VALUES (m.event_id, current_user);
		IF m.retry_count < coalesce((m.payload ->> 'fail')::int, 0) THEN
			RAISE EXCEPTION 'event % refused', m.event_id;
		END IF;
		IF m.payload ? 'poll' THEN
			PERFORM count(*) FROM tide.poll_outbox(m.payload ->> 'poll', 'handler', 1);
		END IF;
		IF m.payload ? 'slow' THEN
			PERFORM pg_sleep((m.payload ->> 'slow')::float8);
		END IF;
	END $$;
	ALTER FUNCTION app.handle(tide.jobs_inbox) OWNER TO hd_app;
	SELECT tide.inbox_set_handler('jobs', 'app.handle(tide.jobs_inbox)', '{"run_as": "hd_app", "batch_size": 50}');
});

sub state
{
	my ($id) = @_;
	return sql("SELECT CASE WHEN processed_at IS NOT NULL THEN 'processed'
	                        WHEN dead_lettered_at IS NOT NULL THEN 'dead' ELSE 'pending' END
	              FROM tide.jobs_inbox WHERE event_id = '$id'");
}

sub calls { return sql("SELECT count(*) FROM app.calls WHERE event_id = '$_[0]'"); }

###########################################################################
# 1. Handled as it commits, as run_as.
###########################################################################
ok(wait_until(sub { sql("SELECT count(*) FROM tide.relay_workers()") >= 1 }, 20),
	'test 1: a relay worker serves the database whose only work is a handler');
# after the worker has read the handler
usleep(500_000);
my $t0 = time();
sql(q{SELECT tide.inbox_receive('jobs', 'a1', '{}')});
my $took = wait_until(sub { state('a1') eq 'processed' }, 10, 5_000);
ok(defined $took, 'test 1: the event is processed after its commit');
note(sprintf('test 1: processed %.3f s after the receive returned', $took)) if defined $took;
is(sql(q{SELECT run_as FROM app.calls WHERE event_id = 'a1'}), 'hd_app', 'test 1: the handler ran as run_as');
sql(q{BEGIN; SELECT tide.inbox_receive('jobs', 'a2', '{}'); ROLLBACK});
sql(q{SELECT tide.inbox_receive('jobs', 'a3', '{}')});
ok(wait_until(sub { state('a3') eq 'processed' }, 10), 'test 1: the next event too');
is(calls('a2'), '0', 'test 1: a rolled-back event is never handled');

###########################################################################
# 2. Failures: retried, then dead-lettered with an operator event.
###########################################################################
sql(q{SELECT tide.inbox_receive('jobs', 'f_always', '{"fail": 100}')});
sql(q{SELECT tide.inbox_receive('jobs', 'f_once', '{"fail": 1}')});
ok(wait_until(sub { state('f_always') eq 'dead' && state('f_once') eq 'processed' }, 10),
	'test 2: the failing event is dead-lettered, the one that failed once is processed');
is(sql(q{SELECT retry_count || ' ' || last_error FROM tide.jobs_inbox WHERE event_id = 'f_always'}),
	'3 P0001: event f_always refused', 'test 2: after max_retries (3) attempts, with its last error');
is(calls('f_always'), '0', 'test 2: the failed attempts\' writes are undone');
is(calls('f_once'), '1', 'test 2: the event that failed once: its successful call alone committed');
is(sql(q{SELECT payload ->> 'event_id' FROM tide.tide_outbox_messages
          WHERE outbox_name = 'ops' AND payload ->> 'event' = 'inbox.dead_lettered'}),
	'f_always', 'test 2: one operator event inbox.dead_lettered, for that event');
# more commits: nothing processed runs again
sql(q{SELECT tide.inbox_receive('jobs', 'a4', '{}')});
ok(wait_until(sub { state('a4') eq 'processed' }, 10), 'test 2: later events are processed');
usleep(500_000);
is(sql(q{SELECT count(*) || ' ' || count(DISTINCT event_id) FROM app.calls}), '4 4',
	'test 2: no event handled twice (a1, a3, a4, f_once, and none of the others)');
is(sql(q{SELECT processed || ' ' || failed || ' ' || dead_lettered FROM tide.inbox_handler_status}),
	'4 4 1', 'test 2: inbox_handler_status counts 4 processed, 4 failed attempts, 1 dead letter');

# The handler runs in the relay's worker but is no relay: a pipeline's
# consumer group is closed to it, as to any session of run_as.
my $dir = PostgreSQL::Test::Utils::tempdir;
chmod 0777, $dir;
sql(qq{SELECT tide.outbox_create('feed');
	SELECT tide.outbox_grant_consume('feed', 'hd_app');
	SELECT tide.relay_set_outbox('to_file', 'feed', 'feed_group',
		jsonb_build_object('sink_type', 'file', 'path', '$dir/feed.jsonl'));
	SELECT tide.inbox_receive('jobs', 'g1', '{"poll": "feed_group"}')});
ok(wait_until(sub { state('g1') eq 'dead' }, 10), 'test 2: a handler that polls a pipeline\'s group fails');
like(sql(q{SELECT last_error FROM tide.jobs_inbox WHERE event_id = 'g1'}),
	qr/^42501: permission denied to consume from consumer group "feed_group"/, 'test 2: refused as to any session');
sql(q{SELECT tide.relay_delete('to_file')});

###########################################################################
# 3. Exactly once across a worker's SIGTERM and the postmaster's kill -9.
###########################################################################
sql(q{TRUNCATE app.calls});
my $n = 3000;
sql(qq{SELECT tide.inbox_receive_batch('jobs', (SELECT jsonb_agg(jsonb_build_object(
		'event_id', 'x' || g, 'payload', jsonb_build_object('slow', 0.001)))
	  FROM generate_series(s, s + 499) g)) FROM generate_series(1, $n, 500) s});
sub processed_x { return sql(q{SELECT count(*) FROM tide.jobs_inbox WHERE event_id LIKE 'x%' AND processed_at IS NOT NULL}); }
ok(wait_until(sub { processed_x() >= 300 }, 30, 20_000), 'test 3: the events are being processed');
my $worker = sql(q{SELECT pid FROM tide.relay_workers() WHERE database = 'postgres'});
sql("SELECT pg_terminate_backend($worker)");
my $at_term = processed_x();
note("test 3: worker terminated with $at_term of $n processed");
ok(wait_until(sub { my $p = sql(q{SELECT pid FROM tide.relay_workers() WHERE database = 'postgres'});
		$p ne '' && $p ne $worker }, 30),
	'test 3: the launcher starts another worker');
ok(wait_until(sub { processed_x() >= $at_term + 300 }, 30, 20_000), 'test 3: it goes on processing');
my %procs = map { $_ => 1 } split /\n/, sql(q{SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()});
my ($postmaster) = split /\n/, slurp_file($node->data_dir . '/postmaster.pid');
my $at_kill = processed_x();
$node->kill9;
note("test 3: postmaster killed with $at_kill of $n processed");
cmp_ok($at_kill, '<', $n, 'test 3: the kill came while events were still pending');
# the old server's processes, a zombie postmaster included, must be gone
ok(defined wait_until(sub { !grep { !exited($_) } keys %procs }, 20), 'test 3: the old server\'s processes exit');
wait_until(sub { !kill(0, $postmaster) }, 60);
ok($node->start(fail_ok => 1), 'test 3: the node starts again');
ok(wait_until(sub { processed_x() == $n }, 60, 100_000), "test 3: after the restart all $n events are processed");
is(sql(q{SELECT count(*) || ' ' || count(DISTINCT event_id) FROM app.calls WHERE event_id LIKE 'x%'}), "$n $n",
	'test 3: the handler\'s writes are there exactly once per event');
is(sql(q{SELECT count(*) FROM tide.jobs_inbox WHERE event_id LIKE 'x%' AND (retry_count > 0 OR dead_lettered_at IS NOT NULL)}),
	'0', 'test 3: no event failed or was dead-lettered');

###########################################################################
# 4. The right to act as run_as, checked before every batch.
###########################################################################
sql(q{
	CREATE ROLE hd_other;
	CREATE ROLE hd_third;
	GRANT tide_consumer TO hd_other;
	GRANT USAGE ON SCHEMA app TO hd_other;
	GRANT INSERT ON app.calls TO hd_other;
	GRANT EXECUTE ON FUNCTION app.handle(tide.jobs_inbox) TO hd_other;
	GRANT hd_other TO hd_admin;
});
# an administrator that may act as hd_other sets it; another role it may
# not act as, or a superuser, it cannot name
$node->safe_psql('postgres', q{SET ROLE hd_admin;
	SELECT tide.inbox_set_handler('jobs', 'app.handle(tide.jobs_inbox)', '{"run_as": "hd_other"}')});
my ($rc, $out, $err) = $node->psql('postgres', q{SET ROLE hd_admin;
	SELECT tide.inbox_set_handler('jobs', 'app.handle(tide.jobs_inbox)', '{"run_as": "postgres"}')});
like($err, qr/cannot run as superuser/, 'test 4: an administrator cannot name a superuser');
($rc, $out, $err) = $node->psql('postgres', q{SET ROLE hd_admin;
	UPDATE tide.relay_inbox_handlers SET run_as = 'hd_third', owner = 'postgres'});
like($err, qr/cannot make the handler of inbox "jobs" run as role "hd_third"/,
	'test 4: nor, writing the row by hand, a role it cannot act as');
is(sql(q{SELECT run_as || ' ' || owner FROM tide.relay_inbox_handlers}), 'hd_other hd_admin',
	'test 4: the handler runs as hd_other, set by hd_admin');
sql(q{SELECT tide.inbox_receive('jobs', 'r1', '{}')});
ok(wait_until(sub { state('r1') eq 'processed' }, 10), 'test 4: processed as hd_other');
is(sql(q{SELECT run_as FROM app.calls WHERE event_id = 'r1'}), 'hd_other', 'test 4: the call ran as hd_other');
# the administrator loses the membership: the relay holds the handler
sql(q{REVOKE hd_other FROM hd_admin});
sql(q{SELECT tide.inbox_receive('jobs', 'r2', '{}')});
ok(wait_until(sub { sql(q{SELECT held_reason FROM tide.inbox_handler_status}) ne '' }, 10),
	'test 4: the handler is held once its owner may no longer act as run_as');
like(sql(q{SELECT held_reason FROM tide.inbox_handler_status}),
	qr/role "hd_admin" cannot make the handler of inbox "jobs" run as role "hd_other"/, 'test 4: and says why');
usleep(1_500_000);
is(sql(q{SELECT retry_count || ' ' || (processed_at IS NULL) || ' ' || (dead_lettered_at IS NULL)
          FROM tide.jobs_inbox WHERE event_id = 'r2'}), '0 true true', 'test 4: the event is neither processed nor failed');
is(calls('r2'), '0', 'test 4: the handler did not run');
my $held_lines = () = slurp_file($node->logfile) =~ /inbox handler "jobs" is held/g;
is($held_lines, 1, 'test 4: the hold is logged once');
sql(q{GRANT hd_other TO hd_admin});
ok(wait_until(sub { state('r2') eq 'processed' }, 15), 'test 4: with the right back it runs again');
is(sql(q{SELECT held_reason IS NULL FROM tide.inbox_handler_status}), 't', 'test 4: the hold is over');

###########################################################################
# 5. Retention, run by the relay.
###########################################################################
sql(q{UPDATE tide.tide_inbox_config SET processed_retention_hours = 1 WHERE inbox_name = 'jobs';
	  UPDATE tide.jobs_inbox SET processed_at = processed_at - interval '2 hours' WHERE event_id LIKE 'x%'});
ok(wait_until(sub { sql(q{SELECT count(*) FROM tide.jobs_inbox WHERE event_id LIKE 'x%'}) == 0 }, 20),
	'test 5: processed events past the retention are deleted');
is(sql(q{SELECT count(*) FROM tide.jobs_inbox WHERE event_id IN ('r1', 'r2', 'f_always')}), '3',
	'test 5: newer ones and the dead letter (dlq_retention_hours 0) are kept');

###########################################################################
# 6. Events written by the relay itself (the inbox sink of a forward
# pipeline) wake the handler at the commit that writes them: with a naptime
# of a minute, nothing else would.
###########################################################################
sql(q{ALTER SYSTEM SET pg_tide.relay_naptime_ms = 60000; SELECT pg_reload_conf()});
sql(q{SELECT tide.outbox_create('orders');
	SELECT tide.relay_set_outbox('to_jobs', 'orders', 'to_jobs', '{"sink_type": "inbox", "inbox": "jobs"}')});
# the worker has read the pipeline (its row's trigger woke it) and is idle
usleep(1_500_000);
my $mid = sql(q{SELECT tide.outbox_publish('orders', '{"from": "outbox"}')});
my $handled = wait_until(sub { state("outbox_orders:$mid") eq 'processed' }, 20);
ok(defined $handled && $handled < 5, 'test 6: an event the inbox sink wrote is handled at once');
note(sprintf('test 6: handled %.3f s after the publish', $handled)) if defined $handled;
is(calls("outbox_orders:$mid"), '1', 'test 6: once');
sql(q{ALTER SYSTEM RESET pg_tide.relay_naptime_ms; SELECT pg_reload_conf()});

unlike(slurp_file($node->logfile), qr/stops after an error|stopped this pass after an error/,
	'no ERROR stopped the worker or a unit');
$node->stop;
done_testing();
