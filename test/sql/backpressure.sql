-- Backpressure, one rule: an outbox is held back only by a limit the user
-- set (inline_threshold, none by default) and only while a consumer group
-- with a position reads it. A refusal names the slowest groups, their
-- pipelines and whether those are disabled; outbox.backpressure announces
-- 80 and 100 % of the limit once per crossing; relay_disable and
-- relay_delete say when a paused group will reach the limit; relay_delete
-- drops the pipeline's group unless asked to keep it; outbox_drop refuses
-- while pipelines read the outbox, unless p_cascade.
\set VERBOSITY default
SELECT coalesce(pg_sequence_last_value('tide.tide_outbox_messages_id_seq'), 0) AS seq_before \gset
\i test/sql/include/try.sql
SELECT tide.outbox_create('bp_ops');
SET pg_tide.operator_events_outbox = 'bp_ops';

-- no limit unless one is set; with none, 100,000 messages that nobody reads
SELECT tide.outbox_create('bp_free');
SELECT inline_threshold, backpressure_level FROM tide.tide_outbox_config WHERE outbox_name = 'bp_free';
SELECT sum(tide.outbox_publish_batch('bp_free',
		   (SELECT array_agg(jsonb_build_object('i', i)) FROM generate_series(1, 10000) i))) AS published
  FROM generate_series(1, 10) b;
SELECT tide.outbox_publish('bp_free', '{"one": "more"}') > 0 AS published;
-- a consumer group does not make a limit either
SELECT tide.create_consumer_group('bp_free_readers', 'bp_free');
SELECT tide.outbox_publish('bp_free', '{"and": "another"}') > 0 AS published;
SELECT count(*) AS unconsumed FROM tide.tide_outbox_messages WHERE outbox_name = 'bp_free';
-- nor under REPEATABLE READ
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT tide.outbox_publish('bp_free', '{"rr": 1}') > 0 AS published;
SELECT tide.outbox_publish_batch('bp_free', ARRAY['{"rr": 2}', '{"rr": 3}']::jsonb[]) AS published;
COMMIT;

-- a limit and no group: nothing waits for the messages, nothing is refused
SELECT tide.outbox_create('bp_alone', p_inline_threshold => 3);
SELECT count(tide.outbox_publish('bp_alone', jsonb_build_object('i', i))) AS published
  FROM generate_series(1, 10) i;
-- nor with a group that has no position yet
SELECT tide.create_consumer_group('bp_alone_none', 'bp_alone', 'none');
SELECT tide.outbox_publish('bp_alone', '{"i": 11}') > 0 AS published;

-- a limit of 10 read by a pipeline's group and a faster group
SELECT tide.outbox_create('bp', 24, 10);
SELECT tide.relay_set_outbox('bp_hook', 'bp', 'bp_hook_group', '{"sink_type": "webhook", "url": "https://a.example"}');
SELECT tide.create_consumer_group('bp_fast', 'bp');
SELECT tide.outbox_publish_batch('bp', (SELECT array_agg(jsonb_build_object('i', i)) FROM generate_series(1, 7) i));
SELECT count(*) AS events FROM tide.tide_outbox_messages WHERE outbox_name = 'bp_ops';
-- the fast group reads five
SELECT tide.commit_offset('bp_fast', 'c1', (SELECT max(id) FROM tide.poll_outbox('bp_fast', 'c1', 5)));
-- the pipeline is paused: the outbox has a limit its group will reach
SELECT tide.relay_disable('bp_hook');
-- 8 of 10: outbox.backpressure at 80 %, once
SELECT tide.outbox_publish('bp', '{"i": 8}') > 0 AS published;
SELECT tide.outbox_publish('bp', '{"i": 9}') > 0 AS published;
-- 10 of 10: at 100 %, once
SELECT tide.outbox_publish('bp', '{"i": 10}') > 0 AS published;
SELECT backpressure_level FROM tide.tide_outbox_config WHERE outbox_name = 'bp';
SELECT headers ->> 'type' AS type, payload ->> 'event' AS event, payload ->> 'outbox' AS outbox,
	   payload -> 'percent' AS percent, payload -> 'unconsumed' AS unconsumed,
	   payload -> 'inline_threshold' AS threshold, payload ? 'pipeline' AS has_pipeline,
	   jsonb_path_query_array(payload -> 'held_back_by', '$[*].group') AS held_back_by
  FROM tide.tide_outbox_messages
 WHERE outbox_name = 'bp_ops' AND payload ->> 'event' = 'outbox.backpressure' ORDER BY id;
-- the 11th is refused: the detail names the slowest group first, its
-- disabled pipeline, and the other group; the hint says what to do
SELECT tide.outbox_publish('bp', '{"i": 11}');
SELECT tide.outbox_publish_batch('bp', ARRAY['{"i": 11}', '{"i": 12}']::jsonb[]);
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT tide.outbox_publish('bp', '{"i": 11}');
ROLLBACK;
-- the same for a role that may only publish
CREATE ROLE regress_bp_publisher IN ROLE tide_publisher;
SELECT tide.outbox_grant_publish('bp', 'regress_bp_publisher');
SET ROLE regress_bp_publisher;
SELECT tide.outbox_publish('bp', '{"i": 11}');
RESET ROLE;
-- no event more: the level is recorded
SELECT count(*) AS events FROM tide.tide_outbox_messages
 WHERE outbox_name = 'bp_ops' AND payload ->> 'event' = 'outbox.backpressure';
-- a later relay_disable of a disabled pipeline says it again
SELECT tide.relay_disable('bp_hook');
-- enabling it says nothing
SELECT tide.relay_enable('bp_hook');
-- the limit raised or removed: admitted again, and the level goes back down
SELECT tide.outbox_set_threshold('bp', NULL);
SELECT tide.outbox_publish('bp', '{"i": 11}') > 0 AS published;
SELECT inline_threshold, backpressure_level FROM tide.tide_outbox_config WHERE outbox_name = 'bp';
SELECT tide.outbox_set_threshold('bp', 1000);
SELECT tide.outbox_publish('bp', '{"i": 12}') > 0 AS published;
SELECT s -> 'inline_threshold' AS inline_threshold, s -> 'backpressure_percent' AS backpressure_percent
  FROM tide.outbox_status('bp') s;
SELECT pg_temp.try($$SELECT tide.outbox_set_threshold('bp', -5)$$);
SELECT pg_temp.try($$SELECT tide.outbox_set_threshold('bp_nope', 5)$$);

-- a new crossing is announced again: one batch past 80 and 100 % at once
SELECT tide.outbox_set_threshold('bp', 14);
SET ROLE regress_bp_publisher;
SELECT tide.outbox_publish_batch('bp', ARRAY['{"i": 13}', '{"i": 14}']::jsonb[]);
RESET ROLE;
SELECT payload -> 'percent' AS percent, payload -> 'unconsumed' AS unconsumed
  FROM tide.tide_outbox_messages
 WHERE outbox_name = 'bp_ops' AND payload ->> 'event' = 'outbox.backpressure' ORDER BY id;
-- a refused publish announces nothing (its transaction rolls back)
SELECT tide.outbox_set_threshold('bp', 20);
SELECT pg_temp.try($$SELECT tide.outbox_publish_batch('bp', (SELECT array_agg(jsonb_build_object('i', i)) FROM generate_series(1, 10) i))$$);
SELECT count(*) AS events FROM tide.tide_outbox_messages
 WHERE outbox_name = 'bp_ops' AND payload ->> 'event' = 'outbox.backpressure';

-- relay_delete keeping the group says that the group will reach the limit
SELECT tide.relay_delete('bp_hook', p_keep_group => true);
SELECT count(*) AS kept FROM tide.tide_consumer_groups WHERE group_name = 'bp_hook_group';
-- without p_keep_group the pipeline's group goes with it
SELECT tide.relay_set_outbox('bp_hook', 'bp', 'bp_hook_group', '{"sink_type": "webhook", "url": "https://a.example"}');
SELECT tide.relay_delete('bp_hook');
SELECT count(*) AS dropped FROM tide.tide_consumer_groups WHERE group_name = 'bp_hook_group';
SELECT pg_temp.try($$SELECT tide.relay_delete('bp_hook', NULL)$$);
-- no limit: relay_disable says nothing
SELECT tide.relay_set_outbox('bp_free_hook', 'bp_free', 'bp_free_hook_group', '{"sink_type": "webhook", "url": "https://a.example"}');
SELECT tide.relay_disable('bp_free_hook');

-- outbox_drop refuses while pipelines read the outbox
SELECT tide.relay_set_outbox('bp_hook', 'bp', 'bp_hook_group', '{"sink_type": "webhook", "url": "https://a.example"}');
SELECT tide.relay_set_outbox('bp_file', 'bp', 'bp_file_group', '{"sink_type": "file", "path": "/tmp/bp_file.jsonl"}');
SELECT tide.outbox_drop('bp');
SELECT pg_temp.try($$SELECT tide.outbox_drop('bp', p_cascade => NULL)$$);
SELECT count(*) AS still_there FROM tide.tide_outbox_config WHERE outbox_name = 'bp';
-- p_cascade deletes them with it
SELECT tide.outbox_drop('bp', p_cascade => true);
SELECT count(*) AS pipelines_left FROM tide.relay_outbox_config WHERE config ->> 'outbox' = 'bp';
SELECT count(*) AS groups_left FROM tide.tide_consumer_groups WHERE outbox_name = 'bp';
SELECT count(*) AS messages_left FROM tide.tide_outbox_messages WHERE outbox_name = 'bp';

RESET pg_tide.operator_events_outbox;
SELECT tide.outbox_drop('bp_free', p_cascade => true);
SELECT tide.outbox_drop('bp_alone');
SELECT tide.outbox_drop('bp_ops');
DROP ROLE regress_bp_publisher;
-- the 100,000 deleted messages' index entries would make the tests after
-- this one walk them (on a catalog updated from 0.1.0 they are all in one
-- table)
VACUUM tide.tide_outbox_messages;
SELECT setval('tide.tide_outbox_messages_id_seq', greatest(:seq_before, 1), :seq_before > 0) \g /dev/null
