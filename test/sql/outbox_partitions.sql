-- The child tables of tide_outbox_messages: publishes go into the child that
-- holds their id (the parent when none does), and retention drops a child
-- whole only once every participant of every outbox with messages in it
-- has passed it.
\set VERBOSITY default
SELECT coalesce(pg_sequence_last_value('tide.tide_outbox_messages_id_seq'), 0) AS seq_before \gset
SELECT setval('tide.tide_outbox_messages_id_seq', 1, false) \g /dev/null
SET pg_tide.partition_size = 1000;

-- Helpers, in a schema of their own (they outlive the reconnection below).
CREATE SCHEMA parts_test;
-- Where each message of an outbox is, as "table: first-last".
CREATE FUNCTION parts_test.placed(p_outbox text) RETURNS SETOF text
LANGUAGE sql AS $$
	SELECT m.tableoid::regclass || ': ' || min(m.id) || '-' || max(m.id)
	  FROM tide.tide_outbox_messages m WHERE m.outbox_name = p_outbox
	 GROUP BY m.tableoid ORDER BY min(m.id)
$$;
-- What a sweep did to the children.
CREATE FUNCTION parts_test.sweep_children(p_older_than interval DEFAULT '1 microsecond')
RETURNS TABLE (dropped jsonb, blocked_table text, reason text, outbox text)
LANGUAGE sql AS $$
	SELECT s -> 'dropped', s -> 'blocked' ->> 'table', s -> 'blocked' ->> 'reason',
		   s -> 'blocked' ->> 'outbox'
	  FROM (SELECT tide.outbox_sweep(p_older_than => p_older_than) -> 'partitions' AS s) x
$$;
CREATE FUNCTION parts_test.children() RETURNS TABLE (first_id bigint, last_id bigint, table_name text,
												   closed boolean, present boolean)
LANGUAGE sql AS $$
	SELECT p.first_id, p.last_id, p.table_name, p.closed_at IS NOT NULL,
		   to_regclass('tide.' || p.table_name) IS NOT NULL
	  FROM tide.tide_outbox_partitions p ORDER BY p.first_id
$$;

SELECT tide.outbox_create('parts');
SELECT tide.outbox_create('parts_free');
SELECT tide.create_consumer_group('pg1', 'parts');

-- Without children every publish goes into the parent.
SELECT tide.outbox_publish('parts', '{"n": 1}');
SELECT * FROM parts_test.placed('parts');

-- Made ahead: two children's worth above the ids handed out; a second run
-- has nothing to do.
SELECT tide._outbox_partitions_maintain();
SELECT tide._outbox_partitions_maintain();
SELECT * FROM parts_test.children();
\c
SET pg_tide.partition_size = 1000;

-- A new backend looks them up: one message, a batch, and a batch across
-- the boundary of two children, which goes into the parent.
SELECT tide.outbox_publish('parts', '{"n": 2}');
SELECT tide.outbox_publish_batch('parts', array_fill('{}'::jsonb, ARRAY[3]));
SELECT tide.outbox_publish_batch('parts_free', array_fill('{}'::jsonb, ARRAY[2]));
SELECT setval('tide.tide_outbox_messages_id_seq', 999) \g /dev/null
SELECT tide.outbox_publish_batch('parts', array_fill('{}'::jsonb, ARRAY[4]));
SELECT tide.outbox_publish('parts', '{"n": 3}');
SELECT * FROM parts_test.placed('parts');
SELECT * FROM parts_test.placed('parts_free');

-- Every id of the first child is handed out; the children ahead follow.
SELECT tide._outbox_partitions_maintain();
SELECT * FROM parts_test.children();

-- The first sweep marks the first child closed, and its messages are only
-- as old as that: it stays. The parent's messages go row by row as before.
SELECT * FROM parts_test.sweep_children();
SELECT * FROM parts_test.placed('parts');

-- pg1 has read nothing: the child stays, and with it parts_free's
-- messages, which nobody holds.
SELECT * FROM parts_test.sweep_children();
SELECT count(*) AS kept FROM tide.tide_outbox_messages_2;

-- pg1 reads and commits four (1 in the parent, 2-4 in the child): one
-- unconsumed message is still in the child.
SELECT id FROM tide.poll_outbox('pg1', 'c1', 4);
SELECT tide.commit_offset('pg1', 'c1', 4);
SELECT * FROM parts_test.sweep_children();

-- A lease on the last of them holds it too, until its commit.
SELECT id FROM tide.poll_outbox('pg1', 'c1', 1);
SELECT * FROM parts_test.sweep_children();
SELECT count(*) AS kept FROM tide.tide_outbox_messages_2;
SELECT tide.commit_offset('pg1', 'c1', 5);

-- A retention longer than the child's age keeps it.
SELECT * FROM parts_test.sweep_children('1 hour');

-- A dry run names it and drops nothing.
SELECT tide.outbox_sweep(p_older_than => '1 microsecond', p_dry_run => true) -> 'partitions' -> 'dropped';
SELECT * FROM parts_test.children();

-- Now it goes, whole; the next child is still open. Every message pg1 has
-- not read is still there for it.
SELECT * FROM parts_test.sweep_children();
SELECT * FROM parts_test.children();
SELECT * FROM parts_test.placed('parts');
SELECT id FROM tide.poll_outbox('pg1', 'c1', 10);
SELECT tide.commit_offset('pg1', 'c1', 1004);

-- Closed by this sweep, the next child is as old as the sweep.
SELECT setval('tide.tide_outbox_messages_id_seq', 2001) \g /dev/null
SELECT * FROM parts_test.sweep_children();

-- A reader still scanning a child keeps it for the next sweep, and the
-- sweep does not wait for it.
CREATE EXTENSION dblink;
SELECT dblink_connect('other', 'dbname=' || current_database());
BEGIN;
SELECT count(*) FROM tide.tide_outbox_messages_1002;
SELECT * FROM dblink('other', $$SELECT tide.outbox_sweep(p_older_than => '1 microsecond') -> 'partitions' -> 'blocked' ->> 'reason'$$)
	AS x(blocked text);
COMMIT;
SELECT * FROM parts_test.sweep_children();
SELECT * FROM parts_test.children();
SELECT dblink_disconnect('other');
DROP EXTENSION dblink;

-- One sweep marks every child closed since the last one, not only the
-- first of them, which pg1 holds here: the age of each counts from when it
-- closed, so they go one after another as they pass the retention.
SELECT tide.outbox_publish('parts', '{"n": 4}');
SELECT setval('tide.tide_outbox_messages_id_seq', 4001) \g /dev/null
SELECT * FROM parts_test.sweep_children();
SELECT * FROM parts_test.children();

-- One message into a child goes in without the executor
-- (src/direct_insert.c): the row the INSERT writes (created_at the
-- transaction's now(), the columns it does not name null), in the child's
-- index (amcheck finds an index entry for every row), a large payload
-- moved to TOAST and read back whole, seen by the rest of its transaction
-- and gone with its rollback.
CREATE EXTENSION amcheck;
SELECT setval('tide.tide_outbox_messages_id_seq', 4100) \g /dev/null
SELECT tide._outbox_partitions_maintain() \g /dev/null
BEGIN;
SELECT tide.outbox_publish('parts', '{"n": 5}', '{"h": "v"}') AS direct_id \gset
SELECT m.tableoid::regclass AS in_table, m.outbox_name, m.payload, m.headers,
	   m.created_at = now() AS created_now, m.consumed_at IS NULL AND m.consumer_group IS NULL AS rest_null
  FROM tide.tide_outbox_messages m WHERE m.id = :direct_id;
COMMIT;
SELECT m.tableoid::regclass AS child, i.indexrelid::regclass AS child_index
  FROM tide.tide_outbox_messages m JOIN pg_index i ON i.indrelid = m.tableoid
 WHERE m.id = :direct_id \gset
SELECT tide.outbox_publish('parts', jsonb_build_object('s', string_agg(md5(g::text), '')))
  FROM generate_series(1, 4000) g \g /dev/null
SELECT tide.outbox_publish('parts', '{"n": 6}') AS no_headers_id \gset
SELECT m.id - :direct_id AS after_first, length(m.payload ->> 's') AS payload_chars, m.headers IS NULL AS no_headers
  FROM :child m WHERE m.id > :direct_id ORDER BY m.id;
SELECT pg_total_relation_size(c.reltoastrelid) > 8192 AS toasted FROM pg_class c WHERE c.oid = :'child'::regclass;
SELECT bt_index_check(:'child_index', true);
BEGIN;
SELECT tide.outbox_publish('parts', '{"n": 7}') AS rolled_back_id \gset
SELECT count(*) AS seen_in_its_transaction FROM tide.tide_outbox_messages WHERE id = :rolled_back_id;
ROLLBACK;
SELECT count(*) AS after_rollback FROM tide.tide_outbox_messages WHERE id = :rolled_back_id;
-- A child the extension did not make so (here: with a trigger) gets the
-- INSERT through the executor, which fires the trigger.
CREATE FUNCTION parts_test.noticed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	RAISE NOTICE 'trigger fired for id %', NEW.id - current_setting('parts.base')::bigint;
	RETURN NEW;
END $$;
SELECT set_config('parts.base', :'direct_id', false) \g /dev/null
CREATE TRIGGER noticed BEFORE INSERT ON :child FOR EACH ROW EXECUTE FUNCTION parts_test.noticed();
SELECT tide.outbox_publish('parts', '{"n": 8}') - :direct_id AS with_trigger;
DROP TRIGGER noticed ON :child;
SELECT bt_index_check(:'child_index', true);
DROP EXTENSION amcheck;

-- tide_admin drops an outbox while children exist (outbox_drop locks them
-- with the parent) and sweeps.
CREATE ROLE regress_parts_admin IN ROLE tide_admin;
SET ROLE regress_parts_admin;
SELECT tide.outbox_drop('parts_free');
SELECT tide.outbox_sweep(p_older_than => '1 microsecond') -> 'partitions' -> 'blocked' ->> 'reason' AS kept_for;
RESET ROLE;
DROP ROLE regress_parts_admin;

-- DROP EXTENSION drops the children with their parent; the next tests get a
-- fresh install.
DROP EXTENSION pg_tide;
SELECT count(*) AS children_left FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'tide' AND c.relname LIKE 'tide_outbox_messages_%';
CREATE EXTENSION pg_tide;
DROP SCHEMA parts_test CASCADE;
SELECT setval('tide.tide_outbox_messages_id_seq', greatest(:seq_before, 1), :seq_before > 0) \g /dev/null
