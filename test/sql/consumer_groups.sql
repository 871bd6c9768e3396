-- Consumer groups: create, drop, poll, commit, heartbeat, leases, rewind, lag.
\set VERBOSITY default
-- Message ids in this file start at 1, whatever ran before.
SELECT setval('tide.tide_outbox_messages_id_seq', 1, false) \g /dev/null
\i test/sql/include/try.sql
-- ids(group, consumer, n): the payload numbers a poll returns, as one array.
CREATE FUNCTION pg_temp.ids(g text, c text, n int DEFAULT 100, vis int DEFAULT 30)
RETURNS int[] LANGUAGE sql AS $$
	SELECT coalesce(array_agg((payload->>'n')::int ORDER BY id), '{}')
	  FROM tide.poll_outbox(g, c, n, vis)
$$;
-- id_of(n): the message id of payload number n.
CREATE FUNCTION pg_temp.id_of(k int) RETURNS bigint LANGUAGE sql AS $$
	SELECT id FROM tide.tide_outbox_messages WHERE (payload->>'n')::int = k
$$;

SELECT tide.outbox_create('events');
SELECT tide.outbox_create('other');
SELECT tide.outbox_publish_batch('events', ARRAY(SELECT jsonb_build_object('n', i) FROM generate_series(1, 5) i));
-- messages of another outbox in between are never returned
SELECT tide.outbox_publish('other', '{"n": 100}') > 0 AS other_published;
SELECT tide.outbox_publish_batch('events', ARRAY(SELECT jsonb_build_object('n', i) FROM generate_series(6, 10) i));

-- create
SELECT tide.create_consumer_group('billing', 'events');
SELECT tide.create_consumer_group('audit', 'events', 'earliest');
SELECT tide.create_consumer_group('billing', 'events', p_if_not_exists => true);
SELECT pg_temp.try($$SELECT tide.create_consumer_group('billing', 'events')$$);
SELECT pg_temp.try($$SELECT tide.create_consumer_group('x', 'nope')$$);
SELECT pg_temp.try($$SELECT tide.create_consumer_group('x', 'events', 'newest')$$);
SELECT pg_temp.try($$SELECT tide.create_consumer_group('x', 'events', NULL)$$);
SELECT pg_temp.try($$SELECT tide.create_consumer_group('', 'events')$$);
SELECT pg_temp.try($$SELECT tide.create_consumer_group(repeat('g', 64), 'events')$$);
SELECT group_name, outbox_name, auto_offset_reset, leased_upto FROM tide.tide_consumer_groups ORDER BY 1;

-- poll: a batch in id order, leased to the consumer
SELECT pg_temp.ids('billing', 'b1', 3);
SELECT consumer_id, lease_start = pg_temp.id_of(1) AS starts_at_1, lease_end = pg_temp.id_of(3) AS ends_at_3,
	   expires_at > now() AS live
  FROM tide.tide_consumer_leases WHERE group_name = 'billing';
-- another consumer of the group gets the next messages, not the same ones
SELECT pg_temp.ids('billing', 'b2', 4);
-- polling again while holding a lease returns that lease again
SELECT pg_temp.ids('billing', 'b1', 3);
-- every group sees every message
SELECT pg_temp.ids('audit', 'a1');

-- commit_offset
SELECT tide.commit_offset('billing', 'b1', pg_temp.id_of(2));
SELECT lease_start = pg_temp.id_of(2) + 1 AS rest_still_leased FROM tide.tide_consumer_leases
 WHERE group_name = 'billing' AND consumer_id = 'b1';
SELECT pg_temp.ids('billing', 'b1', 3);
SELECT tide.commit_offset('billing', 'b1', pg_temp.id_of(3));
SELECT count(*) AS b1_leases FROM tide.tide_consumer_leases WHERE consumer_id = 'b1';
-- committing the same offset again is a harmless retry
SELECT tide.commit_offset('billing', 'b1', pg_temp.id_of(3));
-- an offset never moves backwards
SELECT pg_temp.try(format('SELECT tide.commit_offset(%L, %L, %s)', 'billing', 'b1', pg_temp.id_of(2)));
SELECT committed_offset = pg_temp.id_of(3) AS committed FROM tide.tide_consumer_offsets
 WHERE group_name = 'billing' AND consumer_id = 'b1';
-- the position of the group waits for b2's lease
SELECT committed_offset = pg_temp.id_of(3) AS position_is_3, pending FROM tide.consumer_lag WHERE group_name = 'billing';

-- commit errors
SELECT pg_temp.try($$SELECT tide.commit_offset('billing', 'b1', pg_temp.id_of(9))$$);
SELECT pg_temp.try(format('SELECT tide.commit_offset(%L, %L, %s)', 'billing', 'b2', pg_temp.id_of(3)));
SELECT pg_temp.try(format('SELECT tide.commit_offset(%L, %L, %s)', 'billing', 'b2', pg_temp.id_of(8)));
SELECT pg_temp.try($$SELECT tide.commit_offset('billing', 'nobody', 1)$$);
SELECT pg_temp.try($$SELECT tide.commit_offset('billing', '', 1)$$);
SELECT pg_temp.try($$SELECT tide.commit_offset('billing', 'b2', NULL)$$);
SELECT pg_temp.try($$SELECT tide.commit_offset('nope', 'b2', 1)$$);
SELECT pg_temp.try($$SELECT tide.commit_offset(NULL, 'b2', 1)$$);

-- b2 acknowledges; the group is at 7, 3 messages to go
SELECT tide.commit_offset('billing', 'b2', pg_temp.id_of(7));
SELECT committed_offset = pg_temp.id_of(7) AS position_is_7, pending FROM tide.consumer_lag WHERE group_name = 'billing';

-- heartbeat and extend_lease
SELECT tide.consumer_heartbeat('billing', 'b1');
SELECT pg_temp.try($$SELECT tide.consumer_heartbeat('billing', 'nobody')$$);
SELECT pg_temp.try($$SELECT tide.consumer_heartbeat('nope', 'b1')$$);
SELECT pg_temp.ids('billing', 'b1', 2, 5);
SELECT tide.extend_lease('billing', 'b1', 600) > now() + interval '5 minutes' AS extended;
SELECT expires_at > now() + interval '5 minutes' AS lease_extended FROM tide.tide_consumer_leases
 WHERE group_name = 'billing' AND consumer_id = 'b1';
SELECT pg_temp.try($$SELECT tide.extend_lease('billing', 'b1', 0)$$);
SELECT pg_temp.try($$SELECT tide.extend_lease('billing', 'b2', 10)$$);
SELECT pg_temp.try($$SELECT tide.extend_lease('nope', 'b1', 10)$$);

-- release_lease: the messages can be polled again at once, by anyone
SELECT tide.release_lease('billing', 'b1');
SELECT pg_temp.ids('billing', 'b2', 10);
SELECT pg_temp.try($$SELECT tide.release_lease('billing', 'b1')$$);
-- b1's commit after its lease went to b2 is refused
SELECT pg_temp.try(format('SELECT tide.commit_offset(%L, %L, %s)', 'billing', 'b1', pg_temp.id_of(9)));
SELECT tide.commit_offset('billing', 'b2', pg_temp.id_of(9));
SELECT pg_temp.ids('billing', 'b2', 10);
SELECT tide.commit_offset('billing', 'b2', pg_temp.id_of(10));
SELECT pg_temp.ids('billing', 'b2', 10);
SELECT committed_offset = pg_temp.id_of(10) AS all_read, pending FROM tide.consumer_lag WHERE group_name = 'billing';

-- an expired lease goes to the next poller, at most a batch of it at a time
SELECT pg_temp.ids('audit', 'a1');
UPDATE tide.tide_consumer_leases SET expires_at = now() - interval '1 second' WHERE group_name = 'audit';
SELECT pg_temp.ids('audit', 'a2', 4);
SELECT consumer_id, lease_start = pg_temp.id_of(5) AS rest_starts_at_5 FROM tide.tide_consumer_leases
 WHERE group_name = 'audit' AND consumer_id = 'a1';
SELECT pg_temp.ids('audit', 'a3', 100);
SELECT consumer_id FROM tide.tide_consumer_leases WHERE group_name = 'audit' ORDER BY 1;
-- a consumer that takes over lower ids than it committed before: its
-- offset is the last id it acknowledged, and retrying that is harmless
SELECT tide.commit_offset('audit', 'a3', pg_temp.id_of(10));
UPDATE tide.tide_consumer_leases SET expires_at = '-infinity' WHERE group_name = 'audit' AND consumer_id = 'a2';
SELECT pg_temp.ids('audit', 'a3');
SELECT tide.commit_offset('audit', 'a3', pg_temp.id_of(4));
SELECT tide.commit_offset('audit', 'a3', pg_temp.id_of(4));
SELECT committed_offset = pg_temp.id_of(4) AS last_acknowledged FROM tide.tide_consumer_offsets
 WHERE group_name = 'audit' AND consumer_id = 'a3';
-- the former holders of those leases have nothing left to commit
SELECT pg_temp.try(format('SELECT tide.commit_offset(%L, %L, %s)', 'audit', 'a2', pg_temp.id_of(4)));
SELECT pg_temp.try(format('SELECT tide.commit_offset(%L, %L, %s)', 'audit', 'a1', pg_temp.id_of(2)));
SELECT committed_offset = pg_temp.id_of(10) AS audit_read_all FROM tide.consumer_lag WHERE group_name = 'audit';

-- poll argument errors
SELECT pg_temp.try($$SELECT * FROM tide.poll_outbox('nope', 'c')$$);
SELECT pg_temp.try($$SELECT * FROM tide.poll_outbox('', 'c')$$);
SELECT pg_temp.try($$SELECT * FROM tide.poll_outbox('billing', '')$$);
SELECT pg_temp.try($$SELECT * FROM tide.poll_outbox('billing', NULL)$$);
SELECT pg_temp.try($$SELECT * FROM tide.poll_outbox('billing', 'c', 0)$$);
SELECT pg_temp.try($$SELECT * FROM tide.poll_outbox('billing', 'c', 10001)$$);
SELECT pg_temp.try($$SELECT * FROM tide.poll_outbox('billing', 'c', 10, 0)$$);

-- latest: only messages published after the group was created
SELECT tide.create_consumer_group('fresh', 'events', 'latest');
SELECT pg_temp.ids('fresh', 'f1');
SELECT tide.outbox_publish('events', '{"n": 11}') > 0 AS published;
SELECT pg_temp.ids('fresh', 'f1');

-- none: no polling until an operator sets a position
SELECT tide.create_consumer_group('manual', 'events', 'none');
SELECT pg_temp.try($$SELECT * FROM tide.poll_outbox('manual', 'm1')$$);
SELECT pg_temp.try($$SELECT tide.wait_for_messages('manual', 0)$$);
SELECT committed_offset IS NULL AS no_position FROM tide.consumer_lag WHERE group_name = 'manual';
SELECT pg_temp.try(format('SELECT tide.admin_rewind_offset(%L, %L, %s)', 'manual', 'm1', pg_temp.id_of(8)));
SELECT tide.admin_rewind_offset('manual', 'm1', pg_temp.id_of(8), p_confirm => true);
SELECT pg_temp.ids('manual', 'm1');

-- rewind: a group reads again from the target; outstanding leases are void
SELECT tide.admin_rewind_offset('billing', 'b1', pg_temp.id_of(8), true);
SELECT count(*) AS billing_leases FROM tide.tide_consumer_leases WHERE group_name = 'billing';
SELECT pg_temp.ids('billing', 'b1');
SELECT pg_temp.try($$SELECT tide.admin_rewind_offset('billing', 'b1', -1, true)$$);
SELECT pg_temp.try($$SELECT tide.admin_rewind_offset('billing', 'b1', 1000000, true)$$);
SELECT pg_temp.try($$SELECT tide.admin_rewind_offset('nope', 'b1', 1, true)$$);
SELECT pg_temp.try($$SELECT tide.admin_rewind_offset('billing', '', 1, true)$$);
-- operators only
SELECT has_function_privilege('public', 'tide.admin_rewind_offset(text, text, bigint, boolean)', 'execute') AS public_may_rewind;

-- wait_for_messages: false after the timeout when there is nothing to poll,
-- true as soon as there is
SELECT tide.commit_offset('fresh', 'f1', pg_temp.id_of(11));
SELECT tide.wait_for_messages('fresh', 0) AS fresh_has_something;
SELECT clock_timestamp() AS before_wait \gset
SELECT tide.wait_for_messages('fresh', 300) AS fresh_has_something,
	   clock_timestamp() - :'before_wait'::timestamptz >= interval '300 milliseconds' AS waited_for_timeout;
SELECT tide.outbox_publish('events', '{"n": 12}') > 0 AS published;
SELECT tide.wait_for_messages('fresh', 5000) AS fresh_has_something;
SELECT pg_temp.ids('fresh', 'f1');
-- an expired lease counts as something to poll
UPDATE tide.tide_consumer_leases SET expires_at = '-infinity' WHERE group_name = 'fresh';
SELECT tide.wait_for_messages('fresh', 0) AS fresh_has_something;
SELECT pg_temp.try($$SELECT tide.wait_for_messages('fresh', -1)$$);
SELECT pg_temp.try($$SELECT tide.wait_for_messages('nope', 0)$$);

-- consumer_lag
SELECT group_name, outbox_name, auto_offset_reset, newest_id = pg_temp.id_of(12) AS newest_ok, pending, consumers
  FROM tide.consumer_lag ORDER BY group_name;

-- drop
SELECT tide.drop_consumer_group('fresh');
SELECT pg_temp.try($$SELECT tide.drop_consumer_group('fresh')$$);
SELECT tide.drop_consumer_group('fresh', true);
SELECT pg_temp.try($$SELECT tide.drop_consumer_group('')$$);
SELECT count(*) AS fresh_offsets FROM tide.tide_consumer_offsets WHERE group_name = 'fresh';
SELECT tide.outbox_drop('events');
SELECT tide.outbox_drop('other');
SELECT count(*) AS groups_left FROM tide.tide_consumer_groups;

-- An idle group's look for new messages reads only its own outbox's index
-- entries, however much another outbox has published since: the buffers one
-- wait_for_messages and one empty poll touch stay a handful with 20,000 newer
-- messages of another outbox (walking them costs hundreds).
SELECT tide.outbox_create('quiet'), tide.outbox_create('busy', p_inline_threshold => 100000);
SELECT tide.create_consumer_group('quiet_g', 'quiet');
SELECT tide.outbox_publish('quiet', '{"n": 1}') > 0 AS published;
SELECT tide.commit_offset('quiet_g', 'q1', max(id)) FROM tide.poll_outbox('quiet_g', 'q1', 10);
SELECT tide.outbox_publish_batch('busy',
	(SELECT array_agg(jsonb_build_object('n', i)) FROM generate_series(1, 10000) i)) IS NOT NULL AS published
  FROM generate_series(1, 2);
ANALYZE tide.tide_outbox_messages;
CREATE FUNCTION pg_temp.buffers_of(q text) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
	plan json;
BEGIN
	EXECUTE 'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ' || q INTO plan;
	RETURN (plan->0->'Plan'->>'Shared Hit Blocks')::int + (plan->0->'Plan'->>'Shared Read Blocks')::int;
END
$$;
SELECT tide.wait_for_messages('quiet_g', 0) AS quiet_has_something;
SELECT pg_temp.buffers_of($$SELECT tide.wait_for_messages('quiet_g', 0)$$) < 40 AS quiet_look_is_cheap;
SELECT pg_temp.buffers_of($$SELECT * FROM tide.poll_outbox('quiet_g', 'q1', 10)$$) < 40 AS quiet_poll_is_cheap;
SELECT tide.outbox_drop('quiet'), tide.outbox_drop('busy');

-- Commit and poll in one call (p_commit_upto): the batch is acknowledged and
-- the next one leased in the same transaction. Retrying a call whose answer
-- was lost acknowledges nothing more and returns the same batch again (the
-- consumer's own lease); a refused commit part leases nothing. Messages are
-- shown by payload, offsets relative to the first id.
SELECT tide.outbox_create('cp1');
SELECT tide.create_consumer_group('cp1_g', 'cp1');
CREATE TEMP TABLE cp1_ids AS
	SELECT tide.outbox_publish('cp1', jsonb_build_object('m', m)) AS id
	  FROM unnest(ARRAY['a', 'b', 'c', 'd', 'e']) m;
CREATE FUNCTION pg_temp.cp1_rel(o bigint) RETURNS bigint LANGUAGE sql
	RETURN o - (SELECT min(id) - 1 FROM cp1_ids);
CREATE FUNCTION pg_temp.cp1_state() RETURNS TABLE (committed bigint, lease_start bigint, lease_end bigint)
LANGUAGE sql AS $$
	SELECT pg_temp.cp1_rel(o.committed_offset), pg_temp.cp1_rel(l.lease_start), pg_temp.cp1_rel(l.lease_end)
	  FROM tide.tide_consumer_offsets o
	  LEFT JOIN tide.tide_consumer_leases l USING (group_name, consumer_id)
	 WHERE o.group_name = 'cp1_g' AND o.consumer_id = 'k1'
$$;
-- A consumer's first call: nothing to acknowledge yet (0 is its initial offset).
SELECT payload->>'m' AS m FROM tide.poll_outbox('cp1_g', 'k1', 2, p_commit_upto => 0);
-- Acknowledges a and b, takes c and d.
SELECT payload->>'m' AS m FROM tide.poll_outbox('cp1_g', 'k1', 2,
	p_commit_upto => (SELECT min(id) + 1 FROM cp1_ids));
SELECT * FROM pg_temp.cp1_state();
-- The same call again (its answer was lost): c and d again, b stays acknowledged.
SELECT payload->>'m' AS m FROM tide.poll_outbox('cp1_g', 'k1', 2,
	p_commit_upto => (SELECT min(id) + 1 FROM cp1_ids));
SELECT * FROM pg_temp.cp1_state();
-- A partial commit (c): d stays leased and comes back.
SELECT payload->>'m' AS m FROM tide.poll_outbox('cp1_g', 'k1', 2,
	p_commit_upto => (SELECT min(id) + 2 FROM cp1_ids));
SELECT * FROM pg_temp.cp1_state();
-- Refused commit parts change nothing and lease nothing (ids in the
-- messages shown as N).
SELECT regexp_replace(pg_temp.try($$SELECT * FROM tide.poll_outbox('cp1_g', 'k1', 2, p_commit_upto => (SELECT max(id) + 1 FROM cp1_ids))$$),
					  '(offset|at) [0-9]+', '\1 N', 'g') AS refused;
SELECT regexp_replace(pg_temp.try($$SELECT * FROM tide.poll_outbox('cp1_g', 'k1', 2, p_commit_upto => (SELECT min(id) FROM cp1_ids))$$),
					  '(offset|at) [0-9]+', '\1 N', 'g') AS refused;
SELECT * FROM pg_temp.cp1_state();
-- After its lease was released and taken over by k2, k1's call is refused
-- with 55000, and k2's range is untouched.
SELECT tide.release_lease('cp1_g', 'k1');
SELECT payload->>'m' AS m FROM tide.poll_outbox('cp1_g', 'k2', 2);
SELECT pg_temp.try($$SELECT * FROM tide.poll_outbox('cp1_g', 'k1', 2, p_commit_upto => (SELECT min(id) + 3 FROM cp1_ids))$$);
SELECT * FROM pg_temp.cp1_state();
SELECT consumer_id, pg_temp.cp1_rel(lease_start) AS lease_start, pg_temp.cp1_rel(lease_end) AS lease_end
  FROM tide.tide_consumer_leases WHERE group_name = 'cp1_g' ORDER BY consumer_id;
-- k2 acknowledges d and takes e in one call; a missing group is reported.
SELECT payload->>'m' AS m FROM tide.poll_outbox('cp1_g', 'k2', 2,
	p_commit_upto => (SELECT min(id) + 3 FROM cp1_ids));
SELECT pg_temp.try($$SELECT * FROM tide.poll_outbox('cp1_nope', 'k1', 2, p_commit_upto => 1)$$);
SELECT tide.outbox_drop('cp1');
