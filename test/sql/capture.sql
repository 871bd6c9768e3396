-- Change capture: outbox_capture / outbox_uncapture, every option and error.
\set VERBOSITY default
SELECT setval('tide.tide_outbox_messages_id_seq', 1, false) \g /dev/null
\i test/sql/include/try.sql
CREATE FUNCTION pg_temp.messages() RETURNS TABLE (id bigint, payload jsonb, headers jsonb)
LANGUAGE sql AS $$
	SELECT id, payload, headers FROM tide.tide_outbox_messages
	 WHERE outbox_name = 'cap' ORDER BY id
$$;
CREATE FUNCTION pg_temp.clear() RETURNS void LANGUAGE sql AS $$
	DELETE FROM tide.tide_outbox_messages WHERE outbox_name = 'cap'
$$;

SELECT tide.outbox_create('cap');
CREATE TABLE cap_orders (id int PRIMARY KEY, status text NOT NULL, note text, touched timestamptz);

-- defaults: every operation, the primary key, no old row
SELECT tide.outbox_capture('cap_orders', 'cap');
SELECT table_name, outbox_name, options, owner FROM tide.outbox_captures;
INSERT INTO cap_orders VALUES (1, 'new', 'n1', '2026-01-01');
UPDATE cap_orders SET status = 'paid' WHERE id = 1;
DELETE FROM cap_orders WHERE id = 1;
SELECT * FROM pg_temp.messages();
-- a rolled-back write publishes nothing
BEGIN;
INSERT INTO cap_orders VALUES (2, 'new');
ROLLBACK;
SELECT count(*) AS after_rollback FROM pg_temp.messages();
-- TRUNCATE is refused by default, and nothing is lost
SELECT pg_temp.try($$TRUNCATE cap_orders$$);
-- a capture exists once per table and outbox
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_orders', 'cap')$$);
SELECT tide.outbox_uncapture('cap_orders', 'cap');
INSERT INTO cap_orders VALUES (3, 'new');
SELECT count(*) AS after_uncapture FROM pg_temp.messages();
SELECT count(*) AS triggers_left FROM pg_trigger WHERE tgrelid = 'cap_orders'::regclass;
SELECT pg_temp.clear();

-- options: operations, key, ignore, ignore_changes_of, old_row, type, truncate
SELECT tide.outbox_capture('cap_orders', 'cap', '{"operations": ["update", "delete"], "key": ["status", "id"],
	"ignore": ["note"], "ignore_changes_of": ["touched"], "old_row": true, "type": "shop.order",
	"truncate": "publish"}');
SELECT options FROM tide.outbox_captures;
INSERT INTO cap_orders VALUES (4, 'new', 'n4');
UPDATE cap_orders SET touched = now() WHERE id = 4;
UPDATE cap_orders SET note = 'changed', touched = now() WHERE id = 4;
UPDATE cap_orders SET status = 'paid' WHERE id = 4;
DELETE FROM cap_orders WHERE id = 4;
TRUNCATE cap_orders;
SELECT payload - '{new,old}'::text[] AS payload, (payload->'new') - 'touched' AS new,
	(payload->'old') - 'touched' AS old, headers FROM pg_temp.messages();
SELECT tide.outbox_uncapture('cap_orders');
SELECT pg_temp.clear();

-- when: a trigger WHEN condition over NEW and OLD
SELECT tide.outbox_capture('cap_orders', 'cap', '{"operations": ["update"], "when": "NEW.status IS DISTINCT FROM OLD.status"}');
INSERT INTO cap_orders VALUES (5, 'new');
UPDATE cap_orders SET note = 'x' WHERE id = 5;
UPDATE cap_orders SET status = 'sent' WHERE id = 5;
SELECT payload->>'op' AS op, payload->'new'->>'status' AS status FROM pg_temp.messages();
SELECT tide.outbox_uncapture('cap_orders', 'cap');
SELECT pg_temp.clear();

-- columns added and dropped after the capture began are read as the table is now
SELECT tide.outbox_capture('cap_orders', 'cap', '{"operations": ["insert"], "ignore": ["note"]}');
ALTER TABLE cap_orders ADD COLUMN amount numeric;
INSERT INTO cap_orders VALUES (6, 'new', 'n', NULL, 9.5);
ALTER TABLE cap_orders DROP COLUMN note;
ALTER TABLE cap_orders DROP COLUMN amount;
INSERT INTO cap_orders VALUES (7, 'new');
SELECT payload->'new' AS new FROM pg_temp.messages();
-- a key column cannot be dropped while captured
SELECT pg_temp.try($$ALTER TABLE cap_orders DROP COLUMN id$$);
-- dropping the table removes its capture
DROP TABLE cap_orders;
SELECT count(*) AS captures_left FROM tide.outbox_captures;
SELECT pg_temp.clear();

-- a key of a table without a primary key; multi-column key header
CREATE TABLE cap_lines (order_id int, line int, qty int);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_lines', 'cap')$$);
SELECT tide.outbox_capture('cap_lines', 'cap', '{"key": ["order_id", "line"]}');
INSERT INTO cap_lines VALUES (1, 2, 3);
SELECT payload, headers FROM pg_temp.messages();
SELECT pg_temp.clear();

-- a partitioned table: its partitions' rows are published as the captured table's
CREATE TABLE cap_parted (id int PRIMARY KEY, region text) PARTITION BY LIST (id);
CREATE TABLE cap_parted_a PARTITION OF cap_parted FOR VALUES IN (1, 2);
CREATE TABLE cap_parted_b PARTITION OF cap_parted FOR VALUES IN (3, 4);
SELECT tide.outbox_capture('cap_parted', 'cap', '{"truncate": "publish"}');
INSERT INTO cap_parted VALUES (1, 'a'), (3, 'b');
UPDATE cap_parted SET region = 'a2' WHERE id = 1;
UPDATE cap_parted SET id = 4 WHERE id = 1;
TRUNCATE cap_parted;
SELECT payload, headers FROM pg_temp.messages();
SELECT tide.outbox_uncapture('cap_parted');
SELECT count(*) AS triggers_left FROM pg_trigger
 WHERE tgrelid IN ('cap_parted'::regclass, 'cap_parted_a'::regclass, 'cap_parted_b'::regclass);
DROP TABLE cap_parted;
SELECT pg_temp.clear();

-- a key column renamed: the writes fail, nothing is lost, until the table is captured again
CREATE TABLE cap_renamed (id int PRIMARY KEY);
SELECT tide.outbox_capture('cap_renamed', 'cap');
ALTER TABLE cap_renamed RENAME COLUMN id TO ident;
SELECT pg_temp.try($$INSERT INTO cap_renamed VALUES (1)$$);
SELECT count(*) AS rows FROM cap_renamed;
DROP TABLE cap_renamed;

-- bad input: 22023 and nothing written
CREATE TABLE cap_bad (id int PRIMARY KEY, v text);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'cap', '[]')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'cap', '{"nope": 1}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'cap', '{"operations": []}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'cap', '{"operations": ["merge"]}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'cap', '{"operations": "insert"}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'cap', '{"key": []}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'cap', '{"key": ["missing"]}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'cap', '{"ignore": [1]}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'cap', '{"ignore": ["missing"]}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'cap', '{"ignore_changes_of": ["missing"]}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'cap', '{"old_row": "yes"}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'cap', '{"type": ""}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'cap', '{"truncate": "ignore"}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'cap', '{"when": ""}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'cap', '{"when": "true) EXECUTE FUNCTION pg_catalog.now(); --"}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'cap', '{"when": "true); DROP TABLE cap_bad; SELECT (true"}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'cap', '{"when": "1 FROM cap_bad"}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'cap', '{"when": "OLD.v = ''x''"}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'cap', '{"when": "NEW.nope"}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', 'nope')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_bad', '')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture(NULL, 'cap')$$);
SELECT pg_temp.try($$SELECT tide.outbox_capture('tide.tide_outbox_config', 'cap')$$);
CREATE VIEW cap_view AS SELECT 1 AS id;
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_view', 'cap')$$);
SELECT pg_temp.try($$SELECT tide.outbox_uncapture('cap_bad', 'cap')$$);
SELECT pg_temp.try($$SELECT tide.outbox_uncapture('cap_bad')$$);
SELECT count(*) AS captures, (SELECT count(*) FROM pg_trigger WHERE tgrelid = 'cap_bad'::regclass) AS triggers
  FROM tide.outbox_captures;
-- an outbox with a capture cannot be dropped until the capture ends
SELECT tide.outbox_capture('cap_lines', 'cap', '{"key": ["order_id"], "operations": ["delete"]}') \g /dev/null
SELECT pg_temp.try($$SELECT tide.outbox_drop('cap')$$);

-- rights: the table's owner, allowed to publish; the trigger publishes as the owner
CREATE ROLE regress_cap_owner;
CREATE ROLE regress_cap_writer;
CREATE ROLE regress_cap_stranger;
GRANT tide_publisher TO regress_cap_owner, regress_cap_stranger;
CREATE TABLE cap_owned (id int PRIMARY KEY, v text);
ALTER TABLE cap_owned OWNER TO regress_cap_owner;
GRANT INSERT, UPDATE, DELETE, SELECT ON cap_owned TO regress_cap_writer;
GRANT USAGE ON SCHEMA tide TO regress_cap_writer;
SET ROLE regress_cap_stranger;
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_owned', 'cap')$$);
SET ROLE regress_cap_owner;
SELECT pg_temp.try($$SELECT tide.outbox_capture('cap_owned', 'cap')$$);
RESET ROLE;
SELECT tide.outbox_grant_publish('cap', 'regress_cap_owner');
SET ROLE regress_cap_owner;
SELECT tide.outbox_capture('cap_owned', 'cap');
SET ROLE regress_cap_writer;
-- the writer may not publish, but its write is published as the owner's
SELECT pg_temp.try($$SELECT tide.outbox_publish('cap', '{}')$$);
INSERT INTO cap_owned VALUES (1, 'a');
RESET ROLE;
SELECT payload FROM pg_temp.messages();
-- the owner's right taken back: the write fails with nothing published
SELECT tide.outbox_revoke_publish('cap', 'regress_cap_owner');
SET ROLE regress_cap_writer;
SELECT pg_temp.try($$INSERT INTO cap_owned VALUES (2, 'b')$$);
RESET ROLE;
SELECT count(*) AS messages, (SELECT count(*) FROM cap_owned) AS rows FROM pg_temp.messages();
SET ROLE regress_cap_stranger;
SELECT pg_temp.try($$SELECT tide.outbox_uncapture('cap_owned')$$);
RESET ROLE;
SELECT tide.outbox_uncapture('cap_owned');

-- backfill: the rows that existed before the capture, in key order, as "read"
SELECT pg_temp.clear();
CREATE TABLE cap_old (id int PRIMARY KEY, v text, secret text);
INSERT INTO cap_old SELECT g, 'v' || g, 's' FROM generate_series(5, 1, -1) g;
SELECT pg_temp.try($$CALL tide.outbox_backfill('cap_old', 'cap')$$);
SELECT tide.outbox_capture('cap_old', 'cap', '{"ignore": ["secret"], "operations": ["insert"]}');
CALL tide.outbox_backfill('cap_old', 'cap', '{"chunk_size": 2}');
SELECT payload, headers FROM pg_temp.messages();
SELECT last_key, rows_published, finished_at IS NOT NULL AS finished FROM tide.outbox_backfills;
-- a finished backfill publishes nothing more; "restart" publishes every row again
CALL tide.outbox_backfill('cap_old', 'cap');
SELECT count(*) AS after_second_call FROM pg_temp.messages();
CALL tide.outbox_backfill('cap_old', 'cap', '{"restart": true, "chunk_size": 10}');
SELECT count(*) AS after_restart FROM pg_temp.messages();
-- bad options and tables: 22023 or 55000, nothing written
SELECT pg_temp.try($$CALL tide.outbox_backfill('cap_old', 'cap', '{"chunk_size": 0}')$$);
SELECT pg_temp.try($$CALL tide.outbox_backfill('cap_old', 'cap', '{"chunk_size": 1.5}')$$);
SELECT pg_temp.try($$CALL tide.outbox_backfill('cap_old', 'cap', '{"chunk_size": "10"}')$$);
SELECT pg_temp.try($$CALL tide.outbox_backfill('cap_old', 'cap', '{"chunk_size": 100001}')$$);
SELECT pg_temp.try($$CALL tide.outbox_backfill('cap_old', 'cap', '{"restart": 1}')$$);
SELECT pg_temp.try($$CALL tide.outbox_backfill('cap_old', 'cap', '{"nope": 1}')$$);
SELECT pg_temp.try($$CALL tide.outbox_backfill('cap_old', 'cap', '[]')$$);
SELECT pg_temp.try($$CALL tide.outbox_backfill('cap_lines', 'cap')$$);
SELECT count(*) AS messages_after_bad_input FROM pg_temp.messages();
-- ending the capture ends its backfill's progress
SELECT tide.outbox_uncapture('cap_old');
SELECT count(*) AS backfills_left FROM tide.outbox_backfills;
DROP TABLE cap_old;

-- every column type is published as to_jsonb(row) makes it, before and after ALTER TABLE
SELECT pg_temp.clear();
CREATE DOMAIN cap_positive AS int CHECK (VALUE > 0);
CREATE TYPE cap_mood AS ENUM ('calm', 'busy');
CREATE TYPE cap_pair AS (a int, b text);
CREATE TABLE cap_types (id int PRIMARY KEY, b bool, i2 int2, i8 int8, n numeric, f float8, r real,
	t text, vc varchar(5), c char(3), nm name, d date, ts timestamp, tz timestamptz, tm time,
	iv interval, u uuid, j json, jb jsonb, arr int[], tarr text[], pair cap_pair, mood cap_mood,
	pos cap_positive, bin bytea, addr inet);
SELECT tide.outbox_capture('cap_types', 'cap', '{"old_row": true}');
INSERT INTO cap_types VALUES
	(1, true, -32768, 9223372036854775807, 12.500, 'Infinity', 'NaN', 'a "quoted" é\ text', 'ab', 'x',
	 'nm', '2026-02-03', '2026-02-03 04:05:06.789', '2026-02-03 04:05:06+02', '04:05', '1 day 2 hours',
	 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"k": [1, 2.50]}', '{"k": [1, 2.50]}', '{1,NULL,3}',
	 '{"x","y z"}', ROW(1, 'p'), 'busy', 7, '\x00ff', '10.0.0.1/8'),
	(2, false, 0, 0, 'NaN', '-Infinity', 1.5, '', NULL, NULL, NULL, 'infinity', '-infinity', 'infinity',
	 NULL, NULL, NULL, 'null', '"s"', '{}', NULL, ROW(NULL, NULL), NULL, NULL, NULL, NULL),
	(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
	 NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
CREATE TEMP TABLE cap_inserted AS SELECT cap_row.id, to_jsonb(cap_row)::text AS row FROM cap_types cap_row;
UPDATE cap_types SET n = n * 2, i2 = 5 WHERE id = 1;
DELETE FROM cap_types WHERE id = 2;
-- compared as text: the same keys, values and number scales
SELECT m.payload->>'op' AS op, m.payload->'key' AS key,
	   CASE m.payload->>'op'
		   WHEN 'insert' THEN (m.payload->'new')::text = i.row
		   WHEN 'update' THEN (m.payload->'new')::text = (SELECT to_jsonb(cap_row)::text FROM cap_types cap_row
													   WHERE cap_row.id = i.id)
							  AND (m.payload->'old')::text = i.row
		   WHEN 'delete' THEN (m.payload->'old')::text = i.row AND NOT m.payload ? 'new'
	   END AS as_to_jsonb
  FROM pg_temp.messages() m JOIN cap_inserted i ON i.id = (m.payload->'key'->>'id')::int
 ORDER BY m.id;
SELECT payload->'new' AS inserted FROM pg_temp.messages() ORDER BY id LIMIT 1;
-- the columns' types change: the next row is read with the new ones
ALTER TABLE cap_types ALTER COLUMN i8 TYPE text, ALTER COLUMN t TYPE int USING length(t),
	ADD COLUMN extra int2 DEFAULT 4, DROP COLUMN tm;
UPDATE cap_types SET b = NOT b WHERE id = 1;
SELECT payload->'new'->'i8' AS i8, payload->'new'->'t' AS t, payload->'new'->'extra' AS extra,
	   payload->'new' ? 'tm' AS has_tm, payload->'old'->'i8' AS old_i8,
	   (payload->'new')::text = (SELECT to_jsonb(cap_row)::text FROM cap_types cap_row WHERE cap_row.id = 1) AS new_as_to_jsonb
  FROM pg_temp.messages() ORDER BY id DESC LIMIT 1;
SELECT tide.outbox_uncapture('cap_types');
DROP TABLE cap_types, cap_inserted;
DROP TYPE cap_pair, cap_mood;
DROP DOMAIN cap_positive;
SELECT pg_temp.clear();

-- clean up
SELECT tide.outbox_uncapture('cap_lines');
DROP TABLE cap_owned, cap_lines, cap_bad;
DROP VIEW cap_view;
REVOKE USAGE ON SCHEMA tide FROM regress_cap_writer;
DROP ROLE regress_cap_owner, regress_cap_writer, regress_cap_stranger;
SELECT pg_temp.clear();
SELECT tide.outbox_drop('cap');
