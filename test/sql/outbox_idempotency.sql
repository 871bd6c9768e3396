-- Publish-side idempotency keys: tide.outbox_publish(..., p_idempotency_key),
-- tide.outbox_publish_batch(..., p_idempotency_keys), the window.
\set VERBOSITY default
-- Message ids in this file are compared with each other only.
\i test/sql/include/try.sql
SELECT tide.outbox_create('idem_a');
SELECT tide.outbox_create('idem_b');

-- the same key twice: the first id, one message, one key
SELECT tide.outbox_publish('idem_a', '{"n": 1}', NULL, 'order-1') AS first \gset
SELECT tide.outbox_publish('idem_a', '{"n": 1}', NULL, 'order-1') = :first AS same_id;
-- a different payload under the key: still the first id, nothing written
SELECT tide.outbox_publish('idem_a', '{"n": 2}', '{"h": 1}', 'order-1') = :first AS same_id_other_payload;
SELECT payload, headers FROM tide.tide_outbox_messages WHERE outbox_name = 'idem_a' ORDER BY id;
SELECT message_id = :first AS key_records_first FROM tide.outbox_idempotency_keys
 WHERE outbox_name = 'idem_a' AND idempotency_key = 'order-1';

-- the same key in another outbox is another key
SELECT tide.outbox_publish('idem_b', '{"n": 1}', NULL, 'order-1') <> :first AS other_outbox_new_id;
SELECT outbox_name, count(*) FROM tide.tide_outbox_messages
 WHERE outbox_name IN ('idem_a', 'idem_b') GROUP BY 1 ORDER BY 1;

-- no key (NULL): every publish is new, no key is written
SELECT count(DISTINCT tide.outbox_publish('idem_a', '{"n": 3}', NULL, NULL)) AS distinct_ids
  FROM generate_series(1, 3);
SELECT count(*) AS keys FROM tide.outbox_idempotency_keys WHERE outbox_name = 'idem_a';

-- in one transaction: the second publish sees the first's key
BEGIN;
SELECT tide.outbox_publish('idem_a', '{"n": 4}', NULL, 'in-xact') AS in_xact \gset
SELECT tide.outbox_publish('idem_a', '{"n": 4}', NULL, 'in-xact') = :in_xact AS same_in_xact;
ROLLBACK;
-- rolled back: the key is free again
SELECT tide.outbox_publish('idem_a', '{"n": 4}', NULL, 'in-xact') <> :in_xact AS new_after_rollback;

-- bad keys are refused before anything is written and take no id
SELECT last_value AS before FROM tide.tide_outbox_messages_id_seq \gset
SELECT pg_temp.try($$SELECT tide.outbox_publish('idem_a', '{}', NULL, repeat('k', 256))$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish('idem_a', '{}', NULL, '')$$);
SELECT tide.outbox_publish('idem_a', '{}', NULL, repeat('k', 255)) > 0 AS longest_key_ok;
SELECT last_value = :before + 1 AS one_id_taken FROM tide.tide_outbox_messages_id_seq;
SELECT count(*) AS long_keys FROM tide.outbox_idempotency_keys WHERE length(idempotency_key) > 255;
-- a key to an outbox that does not exist leaves no key behind
SELECT pg_temp.try($$SELECT tide.outbox_publish('idem_none', '{}', NULL, 'k')$$);
SELECT count(*) AS keys_of_missing FROM tide.outbox_idempotency_keys WHERE outbox_name = 'idem_none';

-- the window: a key older than it publishes anew, before any sweep
UPDATE tide.outbox_idempotency_keys SET created_at = now() - interval '25 hours'
 WHERE outbox_name = 'idem_a' AND idempotency_key = 'order-1';
SELECT tide.outbox_publish('idem_a', '{"n": 5}', NULL, 'order-1') AS renewed \gset
SELECT :renewed <> :first AS new_id_after_window;
SELECT tide.outbox_publish('idem_a', '{"n": 5}', NULL, 'order-1') = :renewed AS renewed_key_holds;
-- a window of its own, shown by outbox_status
SELECT tide.outbox_set_idempotency_window('idem_a', interval '1 hour');
SELECT tide.outbox_status('idem_a') -> 'idempotency_window_seconds' AS window_seconds;
UPDATE tide.outbox_idempotency_keys SET created_at = now() - interval '2 hours'
 WHERE outbox_name = 'idem_a' AND idempotency_key = 'order-1';
SELECT tide.outbox_publish('idem_a', '{"n": 6}', NULL, 'order-1') <> :renewed AS new_id_after_own_window;
SELECT pg_temp.try($$SELECT tide.outbox_set_idempotency_window('idem_a', interval '0')$$);
SELECT pg_temp.try($$SELECT tide.outbox_set_idempotency_window('idem_a', NULL)$$);
SELECT pg_temp.try($$SELECT tide.outbox_set_idempotency_window('idem_none', interval '1 hour')$$);
-- a message deleted by retention while its key is in the window: its id still answers
SELECT tide.outbox_publish('idem_b', '{"n": 7}', NULL, 'swept') AS swept \gset
DELETE FROM tide.tide_outbox_messages WHERE id = :swept;
SELECT tide.outbox_publish('idem_b', '{"n": 7}', NULL, 'swept') = :swept AS id_of_deleted_message;
-- the sweep forgets the keys older than the window, and only those
UPDATE tide.outbox_idempotency_keys SET created_at = now() - interval '3 hours'
 WHERE outbox_name = 'idem_a' AND idempotency_key = 'in-xact';
SELECT (tide.outbox_sweep('idem_a') ->> 'deleted') IS NOT NULL AS swept;
SELECT left(idempotency_key, 12) AS key FROM tide.outbox_idempotency_keys
 WHERE outbox_name = 'idem_a' ORDER BY idempotency_key COLLATE "C";

-- batch: one key or NULL per payload; a payload whose key is known is left out
SELECT tide.outbox_publish_batch('idem_b', ARRAY['{"b": 1}', '{"b": 2}', '{"b": 3}']::jsonb[], NULL,
								 ARRAY['b-1', NULL, 'b-3']) AS published;
SELECT tide.outbox_publish_batch('idem_b', ARRAY['{"b": 1}', '{"b": 2}', '{"b": 3}', '{"b": 4}']::jsonb[], NULL,
								 ARRAY['b-1', NULL, 'b-3', 'b-4']) AS published;
-- a key twice in one batch: its first payload only
SELECT tide.outbox_publish_batch('idem_b', ARRAY['{"b": 5}', '{"b": 6}']::jsonb[], NULL,
								 ARRAY['b-5', 'b-5']) AS published;
SELECT tide.outbox_publish_batch('idem_b', ARRAY['{"b": 1}']::jsonb[], NULL, ARRAY['b-1']) AS published;
SELECT payload FROM tide.tide_outbox_messages
 WHERE outbox_name = 'idem_b' AND payload ? 'b' ORDER BY id;
-- each key records its own message
SELECT k.idempotency_key, m.payload FROM tide.outbox_idempotency_keys k
  JOIN tide.tide_outbox_messages m ON m.id = k.message_id
 WHERE k.outbox_name = 'idem_b' AND k.idempotency_key LIKE 'b-%' ORDER BY 1;
-- a batch key from outbox_publish answers a single publish and the reverse
SELECT tide.outbox_publish('idem_b', '{"b": 1}', NULL, 'b-1') =
	   (SELECT message_id FROM tide.outbox_idempotency_keys
		 WHERE outbox_name = 'idem_b' AND idempotency_key = 'b-1') AS single_after_batch;
-- a batch takes over a key older than the window, once
UPDATE tide.outbox_idempotency_keys SET created_at = now() - interval '25 hours'
 WHERE outbox_name = 'idem_b' AND idempotency_key = 'b-3';
SELECT tide.outbox_publish_batch('idem_b', ARRAY['{"b": 33}', '{"b": 34}', '{"b": 35}']::jsonb[], NULL,
								 ARRAY['b-3', 'b-3', 'b-1']) AS published;
SELECT m.payload FROM tide.outbox_idempotency_keys k JOIN tide.tide_outbox_messages m ON m.id = k.message_id
 WHERE k.outbox_name = 'idem_b' AND k.idempotency_key = 'b-3';
SELECT pg_temp.try($$SELECT tide.outbox_publish_batch('idem_b', ARRAY['{}', '{}']::jsonb[], NULL, ARRAY['x'])$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish_batch('idem_b', ARRAY['{}']::jsonb[], NULL, ARRAY[repeat('k', 256)])$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish_batch('idem_b', ARRAY['{}']::jsonb[], NULL, ARRAY[['x']])$$);
SELECT tide.outbox_publish_batch('idem_b', ARRAY[]::jsonb[], NULL, ARRAY[]::text[]) AS published_empty;

-- a publisher: keys work through the function, the table stays closed
CREATE ROLE regress_idem_pub;
GRANT tide_publisher TO regress_idem_pub;
SELECT tide.outbox_grant_publish('idem_a', 'regress_idem_pub');
SET ROLE regress_idem_pub;
SELECT tide.outbox_publish('idem_a', '{"n": 8}', NULL, 'pub-1') AS by_publisher \gset
SELECT tide.outbox_publish('idem_a', '{"n": 8}', NULL, 'pub-1') = :by_publisher AS publisher_same_id;
SELECT pg_temp.try($$SELECT count(*) FROM tide.outbox_idempotency_keys$$);
RESET ROLE;

-- dropping the outbox forgets its keys
SELECT tide.outbox_drop('idem_a');
SELECT tide.outbox_drop('idem_b');
SELECT count(*) AS keys_left FROM tide.outbox_idempotency_keys;
DROP ROLE regress_idem_pub;
