-- Retention: outbox_sweep and the view outbox_retention_status.
\set VERBOSITY default
-- Message ids in this file start at 1, whatever ran before; the sequence is
-- put back at the end, for the tests that run after this one.
SELECT coalesce(pg_sequence_last_value('tide.tide_outbox_messages_id_seq'), 0) AS seq_before \gset
SELECT setval('tide.tide_outbox_messages_id_seq', 1, false) \g /dev/null
\i test/sql/include/try.sql

-- One line per outbox of a sweep's result.
CREATE FUNCTION pg_temp.sweep(p_outbox text DEFAULT NULL, p_batch int DEFAULT 1000,
							  p_dry boolean DEFAULT false)
RETURNS TABLE (outbox text, retention_hours int, horizon_id bigint, eligible bigint,
			   deleted bigint, batches int, more boolean, blocker jsonb)
LANGUAGE sql AS $$
	SELECT x.* FROM jsonb_to_recordset(tide.outbox_sweep(p_outbox, p_batch, p_dry) -> 'outboxes')
		AS x(outbox text, retention_hours int, horizon_id bigint, eligible bigint,
			 deleted bigint, batches int, more boolean, blocker jsonb)
$$;
-- The messages of an outbox, as id ranges.
CREATE FUNCTION pg_temp.kept(p_outbox text) RETURNS text
LANGUAGE sql AS $$
	SELECT coalesce(string_agg(lo || CASE WHEN hi > lo THEN '-' || hi ELSE '' END, ',' ORDER BY lo), '')
	  FROM (SELECT min(id) AS lo, max(id) AS hi
			  FROM (SELECT id, id - row_number() OVER (ORDER BY id) AS grp
					  FROM tide.tide_outbox_messages WHERE outbox_name = p_outbox) a
			 GROUP BY grp) b
$$;
CREATE FUNCTION pg_temp.status() RETURNS TABLE (outbox_name text, retention_hours int,
		messages bigint, past_retention bigint, deletable bigint, horizon_id bigint,
		blocker_kind text, blocker_name text, blocker_group text, blocker_position bigint)
LANGUAGE sql AS $$
	SELECT outbox_name, retention_hours, messages, past_retention, deletable, horizon_id,
		   blocker_kind, blocker_name, blocker_group, blocker_position
	  FROM tide.outbox_retention_status ORDER BY outbox_name
$$;

-- sw (24 hours) with three groups, one of them a pipeline's; sw_free
-- (48 hours) without any group. Ids 1-30 are sw's, 31-35 sw_free's.
SELECT tide.outbox_create('sw', 24);
SELECT tide.outbox_create('sw_free', 48);
SELECT tide.create_consumer_group('g1', 'sw');
SELECT tide.create_consumer_group('g2', 'sw');
-- The test plays the relay (which is off here): the pipeline lets other
-- consumers read its group.
SELECT tide.relay_set_outbox('pipe', 'sw', 'g_pipe',
							 '{"sink_type": "webhook", "url": "https://example.com/hooks",
							   "allow_other_consumers": true}');
SELECT tide.outbox_publish_batch('sw', array_fill('{}'::jsonb, ARRAY[30]));
SELECT tide.outbox_publish_batch('sw_free', array_fill('{}'::jsonb, ARRAY[5]));
-- Fixed ages: sw 1-25 two days old, 26-30 new; sw_free 31-33 three days,
-- 34-35 one day old.
UPDATE tide.tide_outbox_messages SET created_at = now() - interval '48 hours' WHERE id <= 25;
UPDATE tide.tide_outbox_messages SET created_at = now() - interval '72 hours' WHERE id BETWEEN 31 AND 33;
UPDATE tide.tide_outbox_messages SET created_at = now() - interval '24 hours' WHERE id BETWEEN 34 AND 35;

-- errors: SQLSTATE, message, hint; nothing is deleted
SELECT pg_temp.try($$SELECT tide.outbox_sweep('nope')$$);
SELECT pg_temp.try($$SELECT tide.outbox_sweep('')$$);
SELECT pg_temp.try($$SELECT tide.outbox_sweep(repeat('x', 64))$$);
SELECT pg_temp.try($$SELECT tide.outbox_sweep('sw', 0)$$);
SELECT pg_temp.try($$SELECT tide.outbox_sweep(NULL, -1)$$);
SELECT pg_temp.try($$SELECT tide.outbox_sweep('sw', 10001)$$);
SELECT pg_temp.try($$SELECT tide.outbox_sweep('sw', NULL)$$);
SELECT pg_temp.try($$SELECT tide.outbox_sweep('sw', 10, NULL)$$);
SELECT pg_temp.try($$SELECT tide.outbox_sweep('nope', 0, NULL)$$);
SELECT count(*) AS messages FROM tide.tide_outbox_messages;

-- The whole result of a dry run: every group is at 0, so sw keeps all; the
-- lowest participant is named (by kind, then name, among equals). sw_free
-- has no group: its messages older than 48 hours go by age alone.
SELECT jsonb_pretty(tide.outbox_sweep(p_dry_run => true));
SELECT * FROM pg_temp.status();
SELECT pg_temp.kept('sw') AS sw, pg_temp.kept('sw_free') AS sw_free;
SELECT outbox_name, oldest_message_age >= interval '48 hours' AS two_days,
	   oldest_message_age < interval '73 hours' AS under_73h
  FROM tide.outbox_retention_status ORDER BY 1;

-- g1's consumer leases 1-10 and acknowledges 1-5: its lease holds g1 at 5.
-- g2 acknowledges everything; the pipeline's group 1-20.
SELECT count(*) FROM tide.poll_outbox('g1', 'c1', 10);
SELECT tide.commit_offset('g1', 'c1', 5);
SELECT count(*) FROM tide.poll_outbox('g2', 'c2', 100);
SELECT tide.commit_offset('g2', 'c2', 30);
SELECT count(*) FROM tide.poll_outbox('g_pipe', 'relay:pipe', 20);
SELECT tide.commit_offset('g_pipe', 'relay:pipe', 20);
SELECT group_name, committed_offset FROM tide.consumer_lag WHERE outbox_name = 'sw' ORDER BY 1;
SELECT * FROM pg_temp.sweep('sw', p_dry => true);
SELECT * FROM pg_temp.status() WHERE outbox_name = 'sw';

-- A batch size of 2 deletes the 5 eligible messages with 3 statements.
SELECT * FROM pg_temp.sweep('sw', 2);
SELECT pg_temp.kept('sw') AS sw, pg_temp.kept('sw_free') AS sw_free;
-- Nothing more to do: the lease still holds g1 at 5.
SELECT * FROM pg_temp.sweep('sw', 2);

-- g1 acknowledges the rest: now the pipeline holds retention back at 20.
SELECT tide.commit_offset('g1', 'c1', 10);
SELECT count(*) FROM tide.poll_outbox('g1', 'c1', 100);
SELECT tide.commit_offset('g1', 'c1', 30);
SELECT * FROM pg_temp.status() WHERE outbox_name = 'sw';
SELECT * FROM pg_temp.sweep('sw', 10);
SELECT pg_temp.kept('sw') AS sw;

-- The pipeline catches up: 21-25 go; 26-30 are younger than 24 hours and
-- stay, which holds nothing back (no blocker). sw_free's old messages go.
SELECT count(*) FROM tide.poll_outbox('g_pipe', 'relay:pipe', 100);
SELECT tide.commit_offset('g_pipe', 'relay:pipe', 30);
SELECT * FROM pg_temp.sweep(p_batch => 10);
SELECT pg_temp.kept('sw') AS sw, pg_temp.kept('sw_free') AS sw_free;
SELECT * FROM pg_temp.status();

-- A group without a position ('none') holds every message, and is named
-- with no position until an operator gives it one.
SELECT tide.create_consumer_group('g_none', 'sw', 'none');
UPDATE tide.tide_outbox_messages SET created_at = now() - interval '25 hours' WHERE id BETWEEN 26 AND 30;
SELECT * FROM pg_temp.sweep('sw');
SELECT * FROM pg_temp.status() WHERE outbox_name = 'sw';
SELECT tide.admin_rewind_offset('g_none', 'op', 27, p_confirm => true);
SELECT * FROM pg_temp.sweep('sw');
SELECT pg_temp.kept('sw') AS sw;
SELECT tide.drop_consumer_group('g_none');
SELECT * FROM pg_temp.sweep('sw');
SELECT pg_temp.kept('sw') AS sw;

-- A changed retention applies at the next sweep: sw_free's one-day-old
-- messages go once it keeps messages for 12 hours.
UPDATE tide.tide_outbox_config SET retention_hours = 12 WHERE outbox_name = 'sw_free';
SELECT * FROM pg_temp.sweep('sw_free');
SELECT pg_temp.kept('sw_free') AS sw_free;

-- One call runs at most 100 statements: with a batch size of 1, 150
-- eligible messages take two calls ("more" says there is more to do).
SELECT tide.outbox_publish_batch('sw_free', array_fill('{}'::jsonb, ARRAY[150]));
UPDATE tide.tide_outbox_messages SET created_at = now() - interval '13 hours' WHERE outbox_name = 'sw_free';
SELECT s ->> 'deleted' AS deleted, s ->> 'batches' AS batches, s ->> 'more' AS more
  FROM tide.outbox_sweep('sw_free', 1) s;
SELECT s ->> 'deleted' AS deleted, s ->> 'batches' AS batches, s ->> 'more' AS more
  FROM tide.outbox_sweep('sw_free', 1) s;
SELECT count(*) FROM tide.tide_outbox_messages WHERE outbox_name = 'sw_free';

-- the view's columns
SELECT attname, format_type(atttypid, atttypmod)
  FROM pg_attribute WHERE attrelid = 'tide.outbox_retention_status'::regclass AND attnum > 0
 ORDER BY attnum;

SELECT tide.relay_delete('pipe');
SELECT tide.outbox_drop('sw');
SELECT tide.outbox_drop('sw_free');
SELECT setval('tide.tide_outbox_messages_id_seq', greatest(:seq_before, 1), :seq_before > 0) \g /dev/null

-- p_older_than overrides retention_hours for one call; a negative age is refused
SELECT tide.outbox_create('sw_age', p_retention_hours => 24);
SELECT count(tide.outbox_publish('sw_age', jsonb_build_object('n', g))) FROM generate_series(1, 4) g;
UPDATE tide.tide_outbox_messages SET created_at = now() - interval '2 minutes' WHERE outbox_name = 'sw_age';
SELECT (tide.outbox_sweep('sw_age') -> 'deleted')::int AS by_retention_hours,
	   (tide.outbox_sweep('sw_age', p_dry_run => true, p_older_than => interval '1 minute') #> '{outboxes,0,eligible}')::int AS dry_run_by_age;
SELECT (tide.outbox_sweep('sw_age', p_older_than => interval '1 minute') -> 'deleted')::int AS by_age;
SELECT pg_temp.try($$SELECT tide.outbox_sweep('sw_age', p_older_than => interval '-1 minute')$$);
SELECT tide.outbox_drop('sw_age');

