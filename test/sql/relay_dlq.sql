-- Dead letters and the retry queue: relay_dlq_list, relay_dlq_retry,
-- relay_dlq_retry_all, relay_dlq_discard, relay_dlq_purge, relay_dlq_stats,
-- the 'ordering' key, what relay_set_outbox and relay_delete do to a
-- pipeline's queue, and retrying a reverse pipeline's dead letters.
-- The rows a relay worker would write are inserted here directly (the
-- relay is off in this cluster); TAP 011 has the worker write them.
\set VERBOSITY default
\i test/sql/include/try.sql
-- dead letters' ids depend on the tests run before in the same database:
-- the errors show them as N
ALTER FUNCTION pg_temp.try(text) RENAME TO try_with_ids;
CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE sql
	AS $$SELECT regexp_replace(pg_temp.try_with_ids(q), 'dead letter [0-9]+', 'dead letter N', 'g')$$;

SELECT tide.outbox_create('dl_orders');
SELECT tide.relay_set_outbox('dl_hook', 'dl_orders', 'dl_group',
							 '{"sink_type": "webhook", "url": "https://example.com/hooks"}');

-- ordering: 'relaxed' by default, 'strict' on request, nothing else
SELECT tide.relay_get_config('dl_hook') ->> 'ordering' AS default_ordering;
SELECT tide.relay_set_outbox('dl_strict', 'dl_orders', 'dl_strict_group',
							 '{"sink_type": "webhook", "url": "https://example.com/s", "ordering": "strict"}');
SELECT tide.relay_get_config('dl_strict') ->> 'ordering' AS strict_ordering;
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('dl_bad', 'dl_orders', 'dl_bad_group',
	'{"sink_type": "webhook", "url": "https://example.com/s", "ordering": "fifo"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('dl_bad', 'dl_orders', 'dl_bad_group',
	'{"sink_type": "webhook", "url": "https://example.com/s", "ordering": true}')$$);
SELECT count(*) AS bad_pipelines FROM tide.relay_outbox_config WHERE name = 'dl_bad';

-- three dead letters of dl_hook, one of dl_strict, as the worker writes them
INSERT INTO tide.relay_dlq (pipeline_id, outbox_name, message_id, payload, headers, created_at,
							attempts, reason, last_status, last_error_class, last_error,
							first_failed_at, dead_lettered_at)
VALUES ('dl_hook', 'dl_orders', 11, '{"n": 11}', NULL, '2026-01-01', 1, 'permanent', 400,
		'http_4xx', 'HTTP status 400', '2026-01-01 00:00', now() - interval '10 days'),
	   ('dl_hook', 'dl_orders', 12, '{"n": 12}', '{"type": "x"}', '2026-01-01', 10, 'exhausted', 503,
		'http_5xx', 'HTTP status 503', '2026-01-01 00:00', now() - interval '2 days'),
	   ('dl_hook', 'dl_orders', 13, '{"n": 13}', NULL, '2026-01-01', 1, 'permanent', 422,
		'http_4xx', 'HTTP status 422', '2026-01-01 00:00', now()),
	   ('dl_strict', 'dl_orders', 14, '{"n": 14}', NULL, '2026-01-01', 1, 'permanent', 400,
		'http_4xx', 'HTTP status 400', '2026-01-01 00:00', now());

SELECT pipeline, outbox, message_id, reason, attempts, last_status, last_error_class, payload, headers
  FROM tide.relay_dlq_list();
SELECT message_id FROM tide.relay_dlq_list('dl_hook', 2);
SELECT count(*) AS none FROM tide.relay_dlq_list('no_such_pipeline');
SELECT pipeline, dead_letters, permanent, exhausted, retry_queue FROM tide.relay_dlq_stats();

-- retry one: it leaves relay_dlq for the retry queue, due now, attempts 0,
-- keeping when it first failed and its copy of the message
SELECT tide.relay_dlq_retry(id) FROM tide.relay_dlq WHERE message_id = 12;
SELECT pipeline_id, outbox_name, message_id, payload, headers, attempts,
	   next_attempt_at <= now() AS due, first_failed_at, last_status
  FROM tide.relay_retry_queue;
SELECT count(*) AS still_dead FROM tide.relay_dlq WHERE message_id = 12;
SELECT pipeline, dead_letters, retry_queue FROM tide.relay_dlq_stats();

-- retry all of a pipeline: returns how many; the other pipeline's stay
SELECT tide.relay_dlq_retry_all('dl_hook') AS queued;
SELECT tide.relay_dlq_retry_all('dl_hook') AS queued_again;
SELECT pipeline_id, message_id FROM tide.relay_retry_queue ORDER BY message_id;
SELECT pipeline_id, message_id FROM tide.relay_dlq ORDER BY message_id;

-- a changed config makes queued messages due at once; an unchanged one
-- writes nothing
UPDATE tide.relay_retry_queue SET next_attempt_at = now() + interval '1 hour';
SELECT tide.relay_set_outbox('dl_hook', 'dl_orders', 'dl_group',
							 '{"sink_type": "webhook", "url": "https://example.com/hooks"}');
SELECT count(*) FILTER (WHERE next_attempt_at <= now()) AS due_after_same_config
  FROM tide.relay_retry_queue;
SELECT tide.relay_set_outbox('dl_hook', 'dl_orders', 'dl_group',
							 '{"sink_type": "webhook", "url": "https://example.com/fixed"}');
SELECT count(*) FILTER (WHERE next_attempt_at <= now()) AS due_after_new_config
  FROM tide.relay_retry_queue;

-- purge by age: interval '0' removes all
INSERT INTO tide.relay_dlq (pipeline_id, outbox_name, message_id, payload, created_at, attempts,
							reason, first_failed_at, dead_lettered_at)
VALUES ('dl_strict', 'dl_orders', 15, '{}', now(), 3, 'exhausted', now(), now() - interval '8 days');
SELECT tide.relay_dlq_purge(interval '7 days') AS purged_older_than_a_week;
SELECT message_id FROM tide.relay_dlq ORDER BY message_id;
SELECT tide.relay_dlq_purge(interval '0') AS purged_all;
SELECT count(*) AS left_over FROM tide.relay_dlq;

-- bad input: clear errors, nothing written
INSERT INTO tide.relay_dlq (pipeline_id, outbox_name, message_id, payload, created_at, attempts,
							reason, first_failed_at)
VALUES ('gone_pipeline', 'dl_orders', 16, '{}', now(), 1, 'permanent', now());
SELECT pg_temp.try($$SELECT tide.relay_dlq_retry(NULL)$$);
SELECT pg_temp.try($$SELECT tide.relay_dlq_retry(-1)$$);
SELECT pg_temp.try($$SELECT tide.relay_dlq_retry(id) FROM tide.relay_dlq WHERE pipeline_id = 'gone_pipeline'$$);
SELECT pg_temp.try($$SELECT tide.relay_dlq_retry_all('no_such_pipeline')$$);
SELECT pg_temp.try($$SELECT tide.relay_dlq_retry_all(NULL)$$);
SELECT pg_temp.try($$SELECT tide.relay_dlq_purge(NULL)$$);
SELECT pg_temp.try($$SELECT tide.relay_dlq_purge(interval '-1 day')$$);
SELECT pg_temp.try($$SELECT * FROM tide.relay_dlq_list('dl_hook', 0)$$);
SELECT pg_temp.try($$SELECT * FROM tide.relay_dlq_list('', 10)$$);
SELECT pg_temp.try($$INSERT INTO tide.relay_dlq (pipeline_id, outbox_name, message_id, payload,
	created_at, attempts, reason, first_failed_at) VALUES ('dl_hook', 'dl_orders', 17, '{}', now(), 1, 'lost', now())$$);
SELECT pipeline_id, message_id FROM tide.relay_dlq ORDER BY message_id;
SELECT count(*) AS queued FROM tide.relay_retry_queue;

-- relay_delete drops the pipeline's retry queue and keeps its dead letters
INSERT INTO tide.relay_dlq (pipeline_id, outbox_name, message_id, payload, created_at, attempts,
							reason, first_failed_at)
VALUES ('dl_hook', 'dl_orders', 18, '{}', now(), 1, 'permanent', now());
SELECT tide.relay_delete('dl_hook');
SELECT count(*) AS queued_after_delete FROM tide.relay_retry_queue WHERE pipeline_id = 'dl_hook';
SELECT message_id FROM tide.relay_dlq WHERE pipeline_id = 'dl_hook';

-- A reverse pipeline's dead letters: events its inbox refused, with their
-- event ids (relay/flow_reverse.c writes them; TAP 070 has the worker do
-- it). Retrying stores one in its inbox as the pipeline would.
SELECT tide.inbox_create('dl_in');
ALTER TABLE tide.dl_in_inbox ADD CONSTRAINT not_seven CHECK ((payload ->> 'n')::int <> 7);
INSERT INTO tide.relay_dlq (pipeline_id, outbox_name, message_id, event_id, payload, headers,
							created_at, attempts, reason, last_error_class, last_error, first_failed_at)
VALUES ('dl_rev', 'dl_in', 7, 'orders:7', '{"n": 7}', '{"type": "t"}', now(), 1, 'permanent',
		'record', 'record: new row violates check constraint "not_seven"', now()),
	   ('dl_rev', 'dl_in', 8, 'orders:8', '{"n": 8}', NULL, now(), 1, 'permanent',
		'record', 'record: a trigger refused it', now()),
	   ('dl_rev', 'dl_in', 9, 'orders:9', '{"n": 7}', NULL, now(), 1, 'permanent',
		'record', 'record: new row violates check constraint "not_seven"', now());
SELECT pipeline, outbox, message_id, event_id, payload, headers FROM tide.relay_dlq_list('dl_rev');
SELECT pipeline, message_id, event_id FROM tide.relay_dead_letters WHERE pipeline = 'dl_rev' ORDER BY id;
SELECT id AS dl_rev_8 FROM tide.relay_dlq WHERE pipeline_id = 'dl_rev' AND message_id = 8 \gset
-- the inbox still refuses it: its SQLSTATE and error, nothing written, the
-- dead letter kept; retrying all of the pipeline is all or nothing
SELECT pg_temp.try($$SELECT tide.relay_dlq_retry(id) FROM tide.relay_dlq
					  WHERE pipeline_id = 'dl_rev' AND message_id = 7$$);
SELECT pg_temp.try($$SELECT tide.relay_dlq_retry_all('dl_rev')$$);
SELECT count(*) AS in_inbox FROM tide.dl_in_inbox;
SELECT message_id FROM tide.relay_dlq WHERE pipeline_id = 'dl_rev' ORDER BY message_id;
-- one the inbox accepts: stored once under its event id, the pipeline as
-- its source, with its payload and headers; the dead letter goes
SELECT tide.relay_dlq_retry(:dl_rev_8);
SELECT event_id, source, payload, headers, processed_at IS NULL AS pending FROM tide.dl_in_inbox;
SELECT message_id FROM tide.relay_dlq WHERE pipeline_id = 'dl_rev' ORDER BY message_id;
-- retried again: it is gone, and the inbox holds it once
SELECT pg_temp.try($$SELECT tide.relay_dlq_retry($$ || :dl_rev_8 || $$)$$);
SELECT count(*) AS orders_8 FROM tide.dl_in_inbox WHERE event_id = 'orders:8';
-- the refusal mended: retrying all stores them, and an event the inbox
-- holds already (received by hand) changes nothing
ALTER TABLE tide.dl_in_inbox DROP CONSTRAINT not_seven;
SELECT tide.inbox_receive('dl_in', 'orders:9', '{"n": 9}', NULL, 'by hand');
SELECT tide.relay_dlq_retry_all('dl_rev') AS retried;
SELECT event_id, source, payload FROM tide.dl_in_inbox ORDER BY id;
SELECT count(*) AS dl_rev_left FROM tide.relay_dlq WHERE pipeline_id = 'dl_rev';
SELECT pg_temp.try($$SELECT tide.relay_dlq_retry_all('dl_rev')$$);

-- the retry stores with the caller's rights: a tide_admin who may not
-- insert into the inbox's table is refused, nothing written
CREATE ROLE regress_dlq_ops;
GRANT tide_admin TO regress_dlq_ops;
INSERT INTO tide.relay_dlq (pipeline_id, outbox_name, message_id, event_id, payload, created_at,
							attempts, reason, last_error_class, first_failed_at)
VALUES ('dl_rev', 'dl_in', 10, 'orders:10', '{"n": 10}', now(), 1, 'permanent', 'record', now());
REVOKE INSERT ON tide.dl_in_inbox FROM tide_admin;
SET ROLE regress_dlq_ops;
SELECT pg_temp.try($$SELECT tide.relay_dlq_retry(id) FROM tide.relay_dlq WHERE event_id = 'orders:10'$$);
SELECT pg_temp.try($$SELECT tide.relay_dlq_retry_all('dl_rev')$$);
RESET ROLE;
SELECT count(*) AS orders_10 FROM tide.dl_in_inbox WHERE event_id = 'orders:10';
SELECT count(*) AS kept FROM tide.relay_dlq WHERE event_id = 'orders:10';
GRANT INSERT ON tide.dl_in_inbox TO tide_admin;
SET ROLE regress_dlq_ops;
SELECT tide.relay_dlq_retry(id) FROM tide.relay_dlq WHERE event_id = 'orders:10';
RESET ROLE;
SELECT count(*) AS orders_10 FROM tide.dl_in_inbox WHERE event_id = 'orders:10';

-- a forward pipeline's dead letter of the same name, that pipeline gone:
-- retrying all of the name refuses, nothing stored or queued
INSERT INTO tide.relay_dlq (pipeline_id, outbox_name, message_id, event_id, payload, created_at,
							attempts, reason, first_failed_at)
VALUES ('dl_rev', 'dl_in', 11, 'orders:11', '{"n": 11}', now(), 1, 'permanent', now()),
	   ('dl_rev', 'dl_orders', 19, NULL, '{"n": 19}', now(), 1, 'permanent', now());
SELECT pg_temp.try($$SELECT tide.relay_dlq_retry_all('dl_rev')$$);
SELECT count(*) AS dl_rev_kept FROM tide.relay_dlq WHERE pipeline_id = 'dl_rev';

-- discard: one dead letter of either direction, without delivering it
SELECT tide.relay_dlq_discard(id) FROM tide.relay_dlq WHERE message_id IN (11, 19);
SELECT count(*) AS discarded_left FROM tide.relay_dlq WHERE message_id IN (11, 19);
SELECT count(*) AS orders_11 FROM tide.dl_in_inbox WHERE event_id = 'orders:11';
SELECT count(*) AS queued_19 FROM tide.relay_retry_queue WHERE message_id = 19;
SELECT pg_temp.try($$SELECT tide.relay_dlq_discard(-1)$$);
SELECT pg_temp.try($$SELECT tide.relay_dlq_discard(NULL)$$);
SELECT tide.inbox_drop('dl_in');
DROP ROLE regress_dlq_ops;

SELECT tide.relay_delete('dl_strict');
SELECT tide.relay_dlq_purge(interval '0');
SELECT tide.outbox_drop('dl_orders');
