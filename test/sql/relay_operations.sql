-- Delivery operations: relay_retry_message, relay_replay, the alerts key,
-- the status views relay_pipeline_status and relay_pipeline_lag, and
-- operator events published by _relay_after_batch (called here as the
-- relay worker calls it; the relay is off in this cluster; TAP 012 runs it).
\set VERBOSITY default
\i test/sql/include/try.sql

SELECT tide.outbox_create('op_orders');
SELECT tide.outbox_create('op_events');
SELECT tide.relay_set_outbox('op_hook', 'op_orders', 'op_group',
	'{"sink_type": "webhook", "url": "https://example.com/hooks",
	  "alerts": {"failure_threshold": 10, "auto_disable": true}}');
SELECT tide.relay_get_config('op_hook') -> 'alerts' AS alerts;
SELECT count(tide.outbox_publish('op_orders', jsonb_build_object('n', g))) AS published
  FROM generate_series(1, 5) g;

-- alerts: validated like every key
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('op_bad', 'op_orders', 'op_bad_group',
	'{"sink_type": "webhook", "url": "https://example.com/s", "alerts": {"failure_threshold": 0}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('op_bad', 'op_orders', 'op_bad_group',
	'{"sink_type": "webhook", "url": "https://example.com/s", "alerts": {"threshold": 5}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('op_bad', 'op_orders', 'op_bad_group',
	'{"sink_type": "webhook", "url": "https://example.com/s", "alerts": true}')$$);
SELECT count(*) AS bad_pipelines FROM tide.relay_outbox_config WHERE name = 'op_bad';

-- the status views with nothing delivered yet
SELECT pipeline, outbox, consumer_group, delivered_upto, lag_messages, lag_age IS NOT NULL AS has_age
  FROM tide.relay_pipeline_lag;
SELECT pipeline, enabled, sink_type, outbox, health, reason, next_attempt_at, consecutive_failures, offset_id, lag_messages,
	   in_flight, retry_queue, dead_letters, last_success_at, last_error, delivered_last_minute
  FROM tide.relay_pipeline_status;

-- relay_retry_message: one message into the retry queue, manual, due now
SELECT tide.relay_retry_message('op_hook', (SELECT min(id) FROM tide.tide_outbox_messages WHERE outbox_name = 'op_orders'));
SELECT pipeline_id, payload, attempts, manual, next_attempt_at <= now() AS due FROM tide.relay_retry_queue;
-- relay_replay: a range, returns how many; the one already queued stays once
SELECT tide.relay_replay('op_hook', 0, (SELECT max(id) FROM tide.tide_outbox_messages WHERE outbox_name = 'op_orders')) AS replayed;
SELECT count(*) AS queued, bool_and(manual) AS all_manual FROM tide.relay_retry_queue;
SELECT retry_queue, offset_id FROM tide.relay_pipeline_status;
SELECT pg_temp.try($$SELECT tide.relay_retry_message('op_hook', -5)$$);
SELECT pg_temp.try($$SELECT tide.relay_retry_message('op_hook', NULL)$$);
SELECT pg_temp.try($$SELECT tide.relay_retry_message('no_pipeline', 1)$$);
SELECT pg_temp.try($$SELECT tide.relay_replay('op_hook', 10, 5)$$);
SELECT pg_temp.try($$SELECT tide.relay_replay('op_hook', NULL, 5)$$);
SELECT pg_temp.try($$SELECT tide.relay_replay(NULL, 1, 5)$$);
SELECT count(*) AS still_queued FROM tide.relay_retry_queue;
DELETE FROM tide.relay_retry_queue;

-- health and operator events, as the worker records batches: with
-- pg_tide.operator_events_outbox set, events at 50, 70, 90 and 100 % of
-- the threshold (10), auto-disable at 100 %, and a retries_exhausted event
SET pg_tide.operator_events_outbox = 'op_events';
SELECT tide._relay_after_batch('op_hook', 4, 0, 503, 'http_5xx', 'HTTP status 503', '{}');
SELECT health, reason, consecutive_failures, last_status, last_error_class FROM tide.relay_pipeline_status;
SELECT tide._relay_after_batch('op_hook', 1, 0, 503, 'http_5xx', 'HTTP status 503', '{}');
SELECT tide._relay_after_batch('op_hook', 4, 0, 503, 'http_5xx', 'HTTP status 503', '{41}');
SELECT tide._relay_after_batch('op_hook', 1, 0, 503, 'http_5xx', 'HTTP status 503', '{}');
SELECT enabled, health, consecutive_failures FROM tide.relay_pipeline_status;
SELECT payload ->> 'event' AS event, payload ->> 'percent' AS percent,
	   payload ->> 'consecutive_failures' AS failures, payload ->> 'message_id' AS message_id,
	   headers ->> 'type' AS type
  FROM tide.tide_outbox_messages WHERE outbox_name = 'op_events' ORDER BY id;
-- enabled again: an event, and the failures in a row start from 0
SELECT tide.relay_enable('op_hook');
SELECT health, consecutive_failures FROM tide.relay_pipeline_status;
SELECT payload ->> 'event' AS event, payload ->> 'consecutive_failures' AS failures_before
  FROM tide.tide_outbox_messages WHERE outbox_name = 'op_events' ORDER BY id DESC LIMIT 1;
-- a success resets the failures in a row
SELECT tide._relay_after_batch('op_hook', 3, 0, 500, 'http_5xx', 'HTTP status 500', '{}');
SELECT tide._relay_after_batch('op_hook', 1, 2, 500, 'http_5xx', 'HTTP status 500', '{}');
SELECT health, consecutive_failures, last_success_at IS NOT NULL AS succeeded, last_status
  FROM tide.relay_pipeline_status;
-- events to an outbox that does not exist: a warning, nothing else
SET pg_tide.operator_events_outbox = 'op_nowhere';
SELECT tide.relay_disable('op_hook');
RESET pg_tide.operator_events_outbox;
SELECT count(*) AS events FROM tide.tide_outbox_messages WHERE outbox_name = 'op_events';

-- health without a worker: this cluster runs with pg_tide.relay_enabled =
-- off, so an enabled pipeline is 'stopped', with the reason, before the
-- states the worker records (error, held, failing), and a disabled one is
-- 'disabled' before that; neither has a next attempt
SELECT * FROM tide._relay_serving_state();
SELECT tide.relay_enable('op_hook');
SELECT tide._relay_after_batch('op_hook', 2, 0, 503, 'http_5xx', 'HTTP status 503', '{}');
UPDATE tide.relay_pipeline_health
   SET held_since = now(), held_until = now() + interval '1 hour',
	   held_reason = 'the destination failed at message 1: http_5xx: HTTP status 503',
	   turn_error = 'could not extend file', turn_error_since = now(), turn_errors = 1
 WHERE pipeline_id = 'op_hook';
SELECT health, reason, next_attempt_at, held_until > now() AS held_ahead, turn_error, consecutive_failures
  FROM tide.relay_pipeline_status;
SELECT tide.relay_disable('op_hook');
SELECT health, reason, next_attempt_at FROM tide.relay_pipeline_status;
SELECT tide.relay_enable('op_hook');
-- a recorded batch ends the hold (a batch is leased only after it); the
-- turn's error stays until a turn ends without one
SELECT tide._relay_after_batch('op_hook', 0, 1, NULL, NULL, NULL, '{}');
SELECT held_since IS NOT NULL AS held_before, held_until, held_reason, turn_error, turn_errors
  FROM tide.relay_pipeline_health;

-- the counters, whatever attempt_log says: deliveries, failed attempts by
-- class, failures queued again, dead letters, added batch by batch (the
-- batches above counted too); a dead letter without an attempt (its
-- outcome could not be recorded) counts as a dead letter alone
SELECT delivered, failed, failed_by_class, retried, dead_lettered, counted_since <= now() AS counting
  FROM tide.relay_pipeline_status;
SELECT tide.relay_reset_counters('op_hook');
SELECT tide._relay_after_batch('op_hook', 3, 5, 503, 'http_5xx', 'HTTP status 503', '{}', NULL, 0,
							   '{http_5xx,timeout,http_5xx}', 2, 1);
SELECT tide._relay_after_batch('op_hook', 1, 0, 400, 'http_4xx', 'HTTP status 400', '{}', NULL, 0,
							   '{http_4xx}', 0, 1);
SELECT tide._relay_after_batch('op_hook', 0, 0, NULL, NULL, NULL, '{}', NULL, 0, NULL, 0, 1);
SELECT delivered, failed, failed_by_class, retried, dead_lettered, delivered_last_minute
  FROM tide.relay_pipeline_status;
-- delivered_last_minute: the deliveries of this clock minute, plus those of
-- the minute before weighted by its part within the last 60 seconds; the
-- minute before alone, so weighted; nothing older
UPDATE tide.relay_pipeline_health
   SET rate_minute = date_trunc('minute', now()), delivered_in_minute = 10, delivered_minute_before = 30;
SELECT delivered_last_minute = round(10 + 30 * (1 - extract(epoch FROM now() - date_trunc('minute', now())) / 60))
	   AS this_minute_and_weighted_before
  FROM tide.relay_pipeline_status;
UPDATE tide.relay_pipeline_health
   SET rate_minute = date_trunc('minute', now()) - interval '1 minute', delivered_in_minute = 60;
SELECT delivered_last_minute = round(60 * (1 - extract(epoch FROM now() - date_trunc('minute', now())) / 60))
	   AS weighted_minute_before
  FROM tide.relay_pipeline_status;
UPDATE tide.relay_pipeline_health SET rate_minute = date_trunc('minute', now()) - interval '2 minutes';
SELECT delivered_last_minute AS older FROM tide.relay_pipeline_status;
-- a batch in a new minute moves this minute's count to the minute before
UPDATE tide.relay_pipeline_health
   SET rate_minute = date_trunc('minute', now()) - interval '1 minute', delivered_in_minute = 7,
	   delivered_minute_before = 99;
SELECT tide._relay_after_batch('op_hook', 0, 2, NULL, NULL, NULL, '{}');
SELECT rate_minute = date_trunc('minute', now()) AS this_minute, delivered_in_minute, delivered_minute_before
  FROM tide.relay_pipeline_health;
-- reset: from 0 again, counted from now
BEGIN;
SELECT tide.relay_reset_counters('op_hook');
SELECT delivered, failed, failed_by_class, retried, dead_lettered, delivered_last_minute,
	   counted_since = now() AS counted_from_now
  FROM tide.relay_pipeline_status;
COMMIT;
SELECT pg_temp.try($$SELECT tide.relay_reset_counters('no_pipeline')$$);
SELECT pg_temp.try($$SELECT tide.relay_reset_counters(NULL)$$);

SELECT tide.relay_delete('op_hook');
SELECT count(*) AS health_rows FROM tide.relay_pipeline_health;
SELECT tide.outbox_drop('op_orders');
SELECT tide.outbox_drop('op_events');

-- rate_limit and breaker: optional, validated, defaults filled in
SELECT tide.outbox_create('op_more');
SELECT tide.relay_set_outbox('op_paced', 'op_more', 'op_paced_group',
	'{"sink_type": "webhook", "url": "https://example.com/s", "rate_limit": {"per_second": 2.5},
	  "breaker": {}}');
SELECT tide.relay_get_config('op_paced') -> 'rate_limit' AS rate_limit,
	   tide.relay_get_config('op_paced') -> 'breaker' AS breaker;
SELECT tide.relay_set_outbox('op_paced', 'op_more', 'op_paced_group',
	'{"sink_type": "webhook", "url": "https://example.com/s"}');
SELECT tide.relay_get_config('op_paced') ?| ARRAY['rate_limit', 'breaker'] AS still_paced;
-- per_second from 0.001 (one message every 1,000 s) to 1000000
SELECT tide.relay_set_outbox('op_paced', 'op_more', 'op_paced_group',
	'{"sink_type": "webhook", "url": "https://example.com/s", "rate_limit": {"per_second": 0.001}}');
SELECT tide.relay_get_config('op_paced') -> 'rate_limit' AS slowest;
SELECT tide.relay_set_outbox('op_paced', 'op_more', 'op_paced_group',
	'{"sink_type": "webhook", "url": "https://example.com/s", "rate_limit": {"per_second": 1e6}}');
SELECT tide.relay_get_config('op_paced') -> 'rate_limit' AS fastest;
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('op_bad', 'op_more', 'op_bad_group',
	'{"sink_type": "webhook", "url": "https://example.com/s", "rate_limit": {"per_second": 1e-400}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('op_bad', 'op_more', 'op_bad_group',
	'{"sink_type": "webhook", "url": "https://example.com/s", "rate_limit": {"burst": 5}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('op_bad', 'op_more', 'op_bad_group',
	'{"sink_type": "webhook", "url": "https://example.com/s", "rate_limit": {"per_second": 0}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('op_bad', 'op_more', 'op_bad_group',
	'{"sink_type": "webhook", "url": "https://example.com/s", "rate_limit": {"per_second": "fast"}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('op_bad', 'op_more', 'op_bad_group',
	'{"sink_type": "webhook", "url": "https://example.com/s", "breaker": {"cooldown_ms": 5}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('op_bad', 'op_more', 'op_bad_group',
	'{"sink_type": "file", "path": "/tmp/x", "breaker": {"open_after": 5}}')$$);
SELECT count(*) AS bad_pipelines FROM tide.relay_outbox_config WHERE name = 'op_bad';
SELECT tide.relay_delete('op_paced');
SELECT tide.outbox_drop('op_more');
