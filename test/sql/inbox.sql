-- Inboxes: create, drop, receive, claim, mark, process, dead letters,
-- replay, status, retention. No ids or timestamps are shown.
\set VERBOSITY default
\i test/sql/include/try.sql
-- msgs(table): every message of an inbox table with its state, in arrival order.
CREATE FUNCTION pg_temp.msgs(tbl regclass)
RETURNS TABLE (event_id text, source text, payload jsonb, headers jsonb, state text,
			   retry_count int, last_error text)
LANGUAGE plpgsql AS $$
BEGIN
	RETURN QUERY EXECUTE format($q$
		SELECT event_id, source, payload, headers,
			   CASE WHEN processed_at IS NOT NULL THEN 'processed'
					WHEN dead_lettered_at IS NOT NULL THEN 'dead-lettered'
					WHEN claimed_until > clock_timestamp() THEN 'claimed'
					ELSE 'pending' END,
			   retry_count, last_error
		  FROM %s ORDER BY id$q$, tbl);
END
$$;

-- create
SELECT tide.inbox_create('orders');
SELECT inbox_name, inbox_schema, max_retries, processed_retention_hours, dlq_retention_hours
  FROM tide.tide_inbox_config;
SELECT column_name, data_type, is_nullable
  FROM information_schema.columns
 WHERE table_schema = 'tide' AND table_name = 'orders_inbox'
 ORDER BY ordinal_position;
SELECT obj_description('tide.orders_inbox'::regclass, 'pg_class') AS table_comment;
-- names and schemas are identifiers, used exactly as given and quoted
CREATE SCHEMA "App Schema";
SELECT tide.inbox_create('Weird.Name-1', 'App Schema', 2, 0, 1);
SELECT inbox_name, inbox_schema, max_retries, processed_retention_hours, dlq_retention_hours
  FROM tide.tide_inbox_config ORDER BY inbox_name;
SELECT to_regclass('"App Schema"."Weird.Name-1_inbox"') IS NOT NULL AS table_exists;
-- the longest name: 57 bytes, so that "<name>_inbox" has 63
SELECT tide.inbox_create(repeat('n', 57));
SELECT to_regclass(format('tide.%I', repeat('n', 57) || '_inbox')) IS NOT NULL AS table_exists;
SELECT tide.inbox_drop(repeat('n', 57));

-- create errors; none leaves anything behind
SELECT pg_temp.try($$SELECT tide.inbox_create('orders')$$);
SELECT pg_temp.try($$SELECT tide.inbox_create('')$$);
SELECT pg_temp.try($$SELECT tide.inbox_create(NULL)$$);
SELECT pg_temp.try($$SELECT tide.inbox_create(repeat('n', 58))$$);
SELECT pg_temp.try($$SELECT tide.inbox_create('bad', '')$$);
SELECT pg_temp.try($$SELECT tide.inbox_create('bad', NULL)$$);
SELECT pg_temp.try($$SELECT tide.inbox_create('bad', 'no_such_schema')$$);
SELECT pg_temp.try($$SELECT tide.inbox_create('bad', 'app schema')$$);
SELECT pg_temp.try($$SELECT tide.inbox_create('bad', p_max_retries => 0)$$);
SELECT pg_temp.try($$SELECT tide.inbox_create('bad', p_max_retries => NULL)$$);
SELECT pg_temp.try($$SELECT tide.inbox_create('bad', p_processed_retention_hours => -1)$$);
SELECT pg_temp.try($$SELECT tide.inbox_create('bad', p_processed_retention_hours => NULL)$$);
SELECT pg_temp.try($$SELECT tide.inbox_create('bad', p_dlq_retention_hours => -1)$$);
SELECT pg_temp.try($$SELECT tide.inbox_create('bad', p_dlq_retention_hours => NULL)$$);
-- a table of that name exists already: the config row is not kept either
CREATE TABLE public.taken_inbox (id int);
SELECT pg_temp.try($$SELECT tide.inbox_create('taken', 'public')$$);
DROP TABLE public.taken_inbox;
SELECT count(*) AS inboxes FROM tide.tide_inbox_config;
SELECT count(*) AS inbox_tables FROM pg_class WHERE relname LIKE '%\_inbox' AND relkind = 'r';

-- privileges: creating an inbox needs CREATE on its schema (42501)
CREATE ROLE regress_tide_inbox_user;
CREATE SCHEMA regress_inbox_open;
GRANT USAGE ON SCHEMA tide TO regress_tide_inbox_user;
GRANT USAGE, CREATE ON SCHEMA regress_inbox_open TO regress_tide_inbox_user;
GRANT USAGE ON SCHEMA "App Schema" TO regress_tide_inbox_user;
GRANT tide_admin TO regress_tide_inbox_user;
SET ROLE regress_tide_inbox_user;
SELECT pg_temp.try($$SELECT tide.inbox_create('mine')$$);
SELECT pg_temp.try($$SELECT tide.inbox_create('mine', 'App Schema')$$);
SELECT pg_temp.try($$SELECT tide.inbox_create('mine', 'regress_inbox_open')$$);
SELECT tide.inbox_receive('mine', 'm-1', '{}');
RESET ROLE;
SELECT tableowner FROM pg_tables WHERE schemaname = 'regress_inbox_open' AND tablename = 'mine_inbox';
SELECT tide.inbox_drop('mine');
DROP SCHEMA regress_inbox_open;
REVOKE ALL ON SCHEMA tide FROM regress_tide_inbox_user;
REVOKE ALL ON SCHEMA "App Schema" FROM regress_tide_inbox_user;
REVOKE tide_admin FROM regress_tide_inbox_user;
DROP ROLE regress_tide_inbox_user;

-- receive: true when new, false for a duplicate, which changes nothing
SELECT tide.inbox_receive('orders', 'o-1', '{"order": 1}');
SELECT tide.inbox_receive('orders', 'o-2', '{"order": 2}', '{"type": "order.paid"}', 'shop');
SELECT tide.inbox_receive('orders', 'o-1', '{"order": "changed"}', '{"x": 1}', 'elsewhere');
SELECT tide.inbox_receive(p_name => 'orders', p_event_id => 'o-3', p_payload => '[3]');
SELECT * FROM pg_temp.msgs('tide.orders_inbox');
SELECT tide.inbox_receive('Weird.Name-1', 'w-1', '"text payload"');
SELECT * FROM pg_temp.msgs('"App Schema"."Weird.Name-1_inbox"');
-- receive errors write nothing
SELECT pg_temp.try($$SELECT tide.inbox_receive('nope', 'x', '{}')$$);
SELECT pg_temp.try($$SELECT tide.inbox_receive('', 'x', '{}')$$);
SELECT pg_temp.try($$SELECT tide.inbox_receive(repeat('n', 58), 'x', '{}')$$);
SELECT pg_temp.try($$SELECT tide.inbox_receive('orders', '', '{}')$$);
SELECT pg_temp.try($$SELECT tide.inbox_receive('orders', NULL, '{}')$$);
SELECT pg_temp.try($$SELECT tide.inbox_receive('orders', 'x', NULL)$$);
SELECT pg_temp.try($$SELECT tide.inbox_receive('orders', 'x', '{}', '[]')$$);
SELECT count(*) AS orders_messages FROM tide.orders_inbox;
-- a rolled-back receive leaves nothing, and the id is new again
BEGIN;
SELECT tide.inbox_receive('orders', 'o-4', '{"order": 4}');
ROLLBACK;
SELECT count(*) AS o4 FROM tide.orders_inbox WHERE event_id = 'o-4';

-- receive_batch: returns how many were new; in array order; a repeated id
-- (within the batch or already stored) is stored once
SELECT tide.inbox_receive_batch('orders', $$[
	{"event_id": "o-4", "payload": {"order": 4}},
	{"event_id": "o-1", "payload": {"order": "again"}},
	{"event_id": "o-5", "payload": {"order": 5}, "headers": {"type": "order.paid"}, "source": "shop"},
	{"event_id": "o-4", "payload": {"order": "twice in one batch"}},
	{"event_id": "o-6", "payload": {"order": 6}, "headers": null, "source": null}
]$$);
SELECT * FROM pg_temp.msgs('tide.orders_inbox');
SELECT tide.inbox_receive_batch('orders', '[]');
SELECT tide.inbox_receive_batch('orders', '[{"event_id": "o-1", "payload": {}}]');
-- every element is checked before anything is written
SELECT pg_temp.try($$SELECT tide.inbox_receive_batch('orders', NULL)$$);
SELECT pg_temp.try($$SELECT tide.inbox_receive_batch('orders', '{"event_id": "x", "payload": {}}')$$);
SELECT pg_temp.try($$SELECT tide.inbox_receive_batch('orders', '[{"event_id": "x", "payload": {}}, 7]')$$);
SELECT pg_temp.try($$SELECT tide.inbox_receive_batch('orders', '[{"event_id": "x", "payload": {}}, {"payload": {}}]')$$);
SELECT pg_temp.try($$SELECT tide.inbox_receive_batch('orders', '[{"event_id": "", "payload": {}}]')$$);
SELECT pg_temp.try($$SELECT tide.inbox_receive_batch('orders', '[{"event_id": 12, "payload": {}}]')$$);
SELECT pg_temp.try($$SELECT tide.inbox_receive_batch('orders', '[{"event_id": "x"}]')$$);
SELECT pg_temp.try($$SELECT tide.inbox_receive_batch('orders', '[{"event_id": "x", "payload": null}]')$$);
SELECT pg_temp.try($$SELECT tide.inbox_receive_batch('orders', '[{"event_id": "x", "payload": {}, "headers": [1]}]')$$);
SELECT pg_temp.try($$SELECT tide.inbox_receive_batch('orders', '[{"event_id": "x", "payload": {}, "source": 1}]')$$);
SELECT pg_temp.try($$SELECT tide.inbox_receive_batch('nope', '[]')$$);
SELECT count(*) AS orders_messages FROM tide.orders_inbox;

-- claim: pending messages, oldest first, each to one claimer only
SELECT event_id, payload, retry_count, claimed_until > clock_timestamp() + interval '50 seconds' AS for_60s
  FROM tide.inbox_claim('orders', 2, 60);
SELECT event_id, claimed_until > clock_timestamp() AS claimed FROM tide.inbox_claim('orders', 3);
SELECT event_id FROM tide.inbox_claim('orders');
SELECT event_id FROM tide.inbox_claim('orders');
SELECT event_id, state FROM pg_temp.msgs('tide.orders_inbox');
-- an expired claim can be claimed again
UPDATE tide.orders_inbox SET claimed_until = clock_timestamp() - interval '1 second'
 WHERE event_id IN ('o-1', 'o-2');
SELECT event_id FROM tide.inbox_claim('orders', p_batch_size => 10, p_visibility_seconds => 1);
SELECT pg_temp.try($$SELECT tide.inbox_claim('orders', 0)$$);
SELECT pg_temp.try($$SELECT tide.inbox_claim('orders', NULL)$$);
SELECT pg_temp.try($$SELECT tide.inbox_claim('orders', 10001)$$);
SELECT pg_temp.try($$SELECT tide.inbox_claim('orders', 10, 0)$$);
SELECT pg_temp.try($$SELECT tide.inbox_claim('orders', 10, NULL)$$);
SELECT pg_temp.try($$SELECT tide.inbox_claim('nope')$$);

-- mark_processed: true the first time, false after (idempotent)
SELECT tide.inbox_mark_processed('orders', 'o-1');
SELECT tide.inbox_mark_processed('orders', 'o-1');
SELECT pg_temp.try($$SELECT tide.inbox_mark_processed('orders', 'o-99')$$);
SELECT pg_temp.try($$SELECT tide.inbox_mark_processed('orders', '')$$);
SELECT pg_temp.try($$SELECT tide.inbox_mark_processed('nope', 'o-1')$$);
-- a processed message is never claimed again, and its id stays a duplicate
UPDATE tide.orders_inbox SET claimed_until = NULL;
SELECT event_id FROM tide.inbox_claim('orders');
SELECT tide.inbox_receive('orders', 'o-1', '{}') AS o1_new;

-- mark_failed: retry_count goes up and the claim ends; at max_retries the
-- message is dead-lettered (returns true) and never claimed again
SELECT tide.inbox_create('fragile', p_max_retries => 2);
SELECT tide.inbox_receive_batch('fragile', '[{"event_id": "f-1", "payload": {}}, {"event_id": "f-2", "payload": {}}]');
SELECT event_id FROM tide.inbox_claim('fragile');
SELECT tide.inbox_mark_failed('fragile', 'f-1', 'timeout');
SELECT event_id, state, retry_count, last_error FROM pg_temp.msgs('tide.fragile_inbox');
SELECT event_id FROM tide.inbox_claim('fragile');
SELECT tide.inbox_mark_failed('fragile', 'f-1', 'timeout again');
SELECT event_id, state, retry_count, last_error FROM pg_temp.msgs('tide.fragile_inbox');
UPDATE tide.fragile_inbox SET claimed_until = NULL;
SELECT event_id FROM tide.inbox_claim('fragile');
SELECT tide.inbox_mark_failed('fragile', 'f-2', NULL);
SELECT pg_temp.try($$SELECT tide.inbox_mark_failed('fragile', 'f-1', 'once more')$$);
SELECT pg_temp.try($$SELECT tide.inbox_mark_failed('orders', 'o-1', 'too late')$$);
SELECT pg_temp.try($$SELECT tide.inbox_mark_failed('orders', 'o-99', 'x')$$);
SELECT pg_temp.try($$SELECT tide.inbox_mark_failed('orders', NULL, 'x')$$);
SELECT pg_temp.try($$SELECT tide.inbox_mark_failed('nope', 'o-1', 'x')$$);

-- dlq
SELECT event_id, retry_count, last_error, dead_lettered_at IS NOT NULL AS dead FROM tide.inbox_dlq('fragile');
SELECT count(*) AS orders_dlq FROM tide.inbox_dlq('orders');
SELECT pg_temp.try($$SELECT tide.inbox_dlq('nope')$$);

-- replay: dead-lettered messages become pending again with retry_count 0;
-- other ids are ignored
SELECT tide.replay_inbox_messages('fragile', ARRAY['f-1', 'f-2', 'f-99']);
SELECT event_id, state, retry_count, last_error FROM pg_temp.msgs('tide.fragile_inbox');
SELECT tide.inbox_mark_failed('fragile', 'f-1', 'after replay');
SELECT tide.replay_inbox_messages('fragile', ARRAY(SELECT event_id FROM tide.inbox_dlq('fragile')));
SELECT tide.replay_inbox_messages('fragile', '{}');
SELECT pg_temp.try($$SELECT tide.replay_inbox_messages('fragile', NULL)$$);
SELECT pg_temp.try($$SELECT tide.replay_inbox_messages('nope', '{}')$$);

-- mark_processed also takes a message out of the dead-letter queue
SELECT tide.inbox_mark_failed('fragile', 'f-1', 'x');
SELECT tide.inbox_mark_processed('fragile', 'f-1');
SELECT event_id, state FROM pg_temp.msgs('tide.fragile_inbox');

-- process: the handler's writes and the processed mark commit together; a
-- handler error undoes that message's writes and marks it failed
CREATE TABLE shipped (event_id text, n int);
CREATE FUNCTION ship(m tide.orders_inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO shipped VALUES (m.event_id, m.retry_count);
	IF m.payload->>'order' = '5' THEN
		RAISE EXCEPTION 'order % cannot ship', m.payload->>'order';
	END IF;
END
$$;
UPDATE tide.orders_inbox SET claimed_until = NULL;
SELECT event_id, state FROM pg_temp.msgs('tide.orders_inbox');
SELECT tide.inbox_process('orders', 'ship', 3);
SELECT * FROM shipped ORDER BY event_id;
SELECT event_id, state, retry_count, last_error FROM pg_temp.msgs('tide.orders_inbox');
SELECT tide.inbox_process('orders', 'ship');
SELECT tide.inbox_process('orders', 'ship');
SELECT * FROM shipped ORDER BY event_id;
SELECT event_id, state, retry_count, last_error FROM pg_temp.msgs('tide.orders_inbox');
-- the third failure of o-5 dead-letters it
SELECT tide.inbox_process('orders', 'ship');
SELECT event_id, retry_count, last_error FROM tide.inbox_dlq('orders');
-- claimed messages are left to their claimer
SELECT tide.inbox_receive('orders', 'o-7', '{"order": 7}');
SELECT event_id FROM tide.inbox_claim('orders');
SELECT tide.inbox_process('orders', 'ship');
-- a rolled-back process leaves neither the handler's writes nor the marks
UPDATE tide.orders_inbox SET claimed_until = NULL;
BEGIN;
SELECT tide.inbox_process('orders', 'ship');
ROLLBACK;
SELECT count(*) AS shipped_o7 FROM shipped WHERE event_id = 'o-7';
SELECT event_id, state FROM pg_temp.msgs('tide.orders_inbox') WHERE event_id = 'o-7';
-- the handler may be named with its argument type, or schema-qualified
SELECT tide.inbox_process('orders', 'ship(tide.orders_inbox)'::regprocedure, 1);
-- process errors
CREATE FUNCTION wrong_arg(m text) RETURNS void LANGUAGE sql AS $$ SELECT $$;
CREATE FUNCTION wrong_args(m tide.orders_inbox, n int) RETURNS void LANGUAGE sql AS $$ SELECT $$;
CREATE PROCEDURE wrong_kind(m tide.orders_inbox) LANGUAGE sql AS $$ SELECT $$;
SELECT pg_temp.try($$SELECT tide.inbox_process('orders', 'wrong_arg')$$);
SELECT pg_temp.try($$SELECT tide.inbox_process('orders', 'wrong_args')$$);
SELECT pg_temp.try($$SELECT tide.inbox_process('orders', 'wrong_kind')$$);
SELECT pg_temp.try($$SELECT tide.inbox_process('fragile', 'ship')$$);
SELECT pg_temp.try($$SELECT tide.inbox_process('orders', NULL)$$);
SELECT pg_temp.try($$SELECT tide.inbox_process('orders', 'ship', 0)$$);
SELECT pg_temp.try($$SELECT tide.inbox_process('nope', 'ship')$$);
SELECT pg_temp.try($$SELECT tide.inbox_process('orders', 'no_such_function')$$);
DROP FUNCTION wrong_arg(text), wrong_args(tide.orders_inbox, int);
DROP PROCEDURE wrong_kind(tide.orders_inbox);

-- a caller without the right to run the handler is refused up front
-- (42501, with a hint): no event is claimed, counted or dead-lettered; with
-- the right it processes them
SELECT tide.inbox_create('guarded', p_max_retries => 1);
SELECT tide.inbox_receive('guarded', 'g-' || i, jsonb_build_object('n', i)) FROM generate_series(1, 3) i;
SELECT tide.inbox_mark_failed('guarded', 'g-3', 'once');
CREATE ROLE regress_tide_processor IN ROLE tide_consumer;
CREATE SCHEMA regress_app;
CREATE FUNCTION regress_app.handle(m tide.guarded_inbox) RETURNS void LANGUAGE sql AS $$ SELECT $$;
REVOKE EXECUTE ON FUNCTION regress_app.handle(tide.guarded_inbox) FROM PUBLIC;
CREATE TEMP TABLE guarded_before AS SELECT * FROM tide.guarded_inbox;
GRANT SELECT ON guarded_before TO regress_tide_processor;
SET ROLE regress_tide_processor;
-- no USAGE on the handler's schema (its name does not even resolve; given
-- by oid, inbox_process refuses it), then no EXECUTE on the handler
SELECT pg_temp.try($$SELECT tide.inbox_process('guarded', 'regress_app.handle')$$);
SELECT pg_temp.try(format('SELECT tide.inbox_process(%L, %s::regproc)', 'guarded',
	(SELECT p.oid FROM pg_proc p WHERE p.proname = 'handle' AND p.pronamespace = 'regress_app'::regnamespace)));
RESET ROLE;
GRANT USAGE ON SCHEMA regress_app TO regress_tide_processor;
SET ROLE regress_tide_processor;
SELECT pg_temp.try($$SELECT tide.inbox_process('guarded', 'regress_app.handle')$$);
SELECT pg_temp.try($$SELECT tide.inbox_process('guarded', 'regress_app.handle(tide.guarded_inbox)'::regprocedure)$$);
-- every event exactly as it was: retry_count, state, claim, no dead letter
SELECT (SELECT count(*) FROM (TABLE tide.guarded_inbox EXCEPT TABLE guarded_before) a) AS changed,
	   (SELECT count(*) FROM (TABLE guarded_before EXCEPT TABLE tide.guarded_inbox) b) AS gone;
SELECT count(*) AS dead_letters FROM tide.inbox_dlq('guarded');
RESET ROLE;
SELECT event_id, state, retry_count, last_error FROM pg_temp.msgs('tide.guarded_inbox');
GRANT EXECUTE ON FUNCTION regress_app.handle(tide.guarded_inbox) TO regress_tide_processor;
SET ROLE regress_tide_processor;
SELECT tide.inbox_process('guarded', 'regress_app.handle') AS processed;
RESET ROLE;
SELECT event_id, state, retry_count, last_error FROM pg_temp.msgs('tide.guarded_inbox');
DROP TABLE guarded_before;
DROP SCHEMA regress_app CASCADE;
DROP ROLE regress_tide_processor;
SELECT tide.inbox_drop('guarded');

-- status
SELECT tide.inbox_receive('orders', 'o-8', '{"order": 8}');
SELECT tide.inbox_receive('orders', 'o-9', '{"order": 9}');
SELECT count(*) AS claimed FROM tide.inbox_claim('orders', 1);
SELECT s - 'oldest_pending_age_seconds' AS status,
	   (s->>'oldest_pending_age_seconds')::numeric >= 0 AS age_ok
  FROM tide.inbox_status('orders') s;
SELECT s->'pending' AS pending, (s->>'oldest_pending_age_seconds')::numeric >= 0 AS age_ok
  FROM tide.inbox_status('Weird.Name-1') s;
SELECT jsonb_path_query_array(tide.inbox_status(), '$[*].inbox') AS inboxes;
SELECT jsonb_path_query_array(tide.inbox_status(NULL), '$[*].dlq_count') AS dlq_counts;
SELECT pg_temp.try($$SELECT tide.inbox_status('nope')$$);
SELECT pg_temp.try($$SELECT tide.inbox_status('')$$);

-- truncate: processed rows past processed_retention_hours (72), dead
-- letters past dlq_retention_hours (0 keeps them)
SELECT tide.inbox_mark_failed('orders', 'o-8', 'x');
SELECT tide.inbox_mark_failed('orders', 'o-8', 'x');
SELECT tide.inbox_mark_failed('orders', 'o-8', 'x');
UPDATE tide.orders_inbox SET processed_at = processed_at - interval '73 hours'
 WHERE event_id IN ('o-1', 'o-2');
UPDATE tide.orders_inbox SET dead_lettered_at = dead_lettered_at - interval '1000 hours'
 WHERE event_id = 'o-8';
SELECT tide.inbox_truncate_processed('orders');
SELECT event_id, state FROM pg_temp.msgs('tide.orders_inbox');
-- once its row is gone, an id is new again
SELECT tide.inbox_receive('orders', 'o-1', '{"order": "late duplicate"}') AS o1_new_again;
-- "Weird.Name-1" keeps processed rows (0) and dead letters for 1 hour
SELECT tide.inbox_mark_processed('Weird.Name-1', 'w-1');
SELECT tide.inbox_receive('Weird.Name-1', 'w-2', '{}');
SELECT tide.inbox_mark_failed('Weird.Name-1', 'w-2', 'x');
SELECT tide.inbox_mark_failed('Weird.Name-1', 'w-2', 'x');
UPDATE "App Schema"."Weird.Name-1_inbox"
   SET processed_at = processed_at - interval '10000 hours',
	   dead_lettered_at = dead_lettered_at - interval '2 hours';
SELECT tide.inbox_truncate_processed('Weird.Name-1');
SELECT event_id, state FROM pg_temp.msgs('"App Schema"."Weird.Name-1_inbox"');
SELECT pg_temp.try($$SELECT tide.inbox_truncate_processed('nope')$$);

-- drop
SELECT pg_temp.try($$SELECT tide.inbox_drop('orders')$$);
DROP FUNCTION ship(tide.orders_inbox);
SELECT tide.inbox_drop('orders');
SELECT pg_temp.try($$SELECT tide.inbox_drop('orders')$$);
SELECT tide.inbox_drop('orders', true);
SELECT pg_temp.try($$SELECT tide.inbox_drop('')$$);
SELECT pg_temp.try($$SELECT tide.inbox_drop(repeat('n', 58), true)$$);
SELECT tide.inbox_drop('fragile');
SELECT tide.inbox_drop('Weird.Name-1');
SELECT count(*) AS inboxes FROM tide.tide_inbox_config;
SELECT count(*) AS inbox_tables FROM pg_class WHERE relname LIKE '%\_inbox' AND relkind = 'r';
SELECT tide.inbox_status() AS no_inboxes;
DROP SCHEMA "App Schema";
DROP TABLE shipped;
