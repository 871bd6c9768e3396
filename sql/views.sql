-- The views, created or replaced: after the functions they call.

-- A tide_reader (or tide_admin, the owner, a superuser) sees every group;
-- any other role only the groups it may consume from (src/outbox_rights.c:
-- a consuming right on the group's outbox, by role inheritance, and the
-- group not a relay pipeline's closed to other consumers), so a
-- tide_consumer reads the lag of its own groups. The view reads its tables
-- as its owner, so the position is computed here (as
-- tide._group_position does) rather than by a function the caller would
-- run; security_barrier keeps a caller's own functions from seeing the
-- rows the filter leaves out.
CREATE OR REPLACE VIEW tide.consumer_lag WITH (security_barrier) AS
SELECT g.group_name,
	   g.outbox_name,
	   g.auto_offset_reset,
	   p.position AS committed_offset,
	   (SELECT max(m.id) FROM tide.tide_outbox_messages m
		 WHERE m.outbox_name = g.outbox_name) AS newest_id,
	   CASE WHEN p.position IS NOT NULL THEN
		   (SELECT count(*) FROM tide.tide_outbox_messages m
			 WHERE m.outbox_name = g.outbox_name AND m.consumed_at IS NULL
			   AND m.id > p.position)
	   END AS pending,
	   (SELECT count(*) FROM tide.tide_consumer_offsets o
		 WHERE o.group_name = g.group_name) AS consumers,
	   (SELECT count(*) FROM tide.tide_consumer_leases l
		 WHERE l.group_name = g.group_name AND l.expires_at > clock_timestamp()) AS active_leases,
	   (SELECT coalesce(sum(o.expired), 0) FROM tide.tide_consumer_offsets o
		 WHERE o.group_name = g.group_name)::bigint AS expired
  FROM tide.tide_consumer_groups g,
	   LATERAL (SELECT least(g.leased_upto,
							 (SELECT min(l.lease_start) - 1 FROM tide.tide_consumer_leases l
							   WHERE l.group_name = g.group_name)) AS position) p
 WHERE pg_has_role(current_user, 'tide_reader', 'USAGE')
	OR pg_has_role(current_user, 'tide_admin', 'USAGE')
	OR pg_has_role(current_user, (SELECT c.relowner FROM pg_class c
								   WHERE c.oid = 'tide.tide_outbox_messages'::regclass), 'USAGE')
	OR (EXISTS (SELECT FROM tide.outbox_consume_grants cg
				 WHERE cg.outbox_name = g.outbox_name
				   AND pg_has_role(current_user, cg.grantee, 'USAGE'))
		AND NOT EXISTS (SELECT FROM tide.relay_outbox_config rc
						 WHERE rc.config ->> 'consumer_group' = g.group_name
						   AND (rc.config -> 'allow_other_consumers') IS DISTINCT FROM 'true'::jsonb));

COMMENT ON VIEW tide.consumer_lag
	IS 'per consumer group: committed position, newest message id, messages still to read, expired messages its polls passed; a role that is not a reader sees the groups it may consume from';

-- Both directions' pipelines: a forward pipeline's position is its
-- consumer group's row of relay_consumer_offsets, a reverse one's the row of
-- relay_group_id 'reverse' and its inbox (the source's position in
-- source_position, last_change_id mirroring a numeric one). Lag is an
-- outbox's: a reverse pipeline has none here.
CREATE OR REPLACE VIEW tide.relay_pipeline_lag AS
SELECT c.name AS pipeline,
	   c.config ->> 'outbox' AS outbox,
	   c.config ->> 'consumer_group' AS consumer_group,
	   coalesce(o.last_change_id, 0) AS delivered_upto,
	   (SELECT max(m.id) FROM tide.tide_outbox_messages m
		 WHERE m.outbox_name = c.config ->> 'outbox') AS newest_id,
	   CASE WHEN c.direction = 'forward' THEN
		   (SELECT count(*) FROM tide.tide_outbox_messages m
			 WHERE m.outbox_name = c.config ->> 'outbox'
			   AND m.id > coalesce(o.last_change_id, 0)) END AS lag_messages,
	   (SELECT now() - min(m.created_at) FROM tide.tide_outbox_messages m
		 WHERE m.outbox_name = c.config ->> 'outbox'
		   AND m.id > coalesce(o.last_change_id, 0)) AS lag_age,
	   c.direction,
	   c.config ->> 'inbox' AS inbox,
	   o.source_position
  FROM (SELECT f.name, f.config, 'forward' AS direction FROM tide.relay_outbox_config f
		UNION ALL
		SELECT r.name, r.config, 'reverse' FROM tide.relay_inbox_config r) c
  LEFT JOIN tide.relay_consumer_offsets o
		 ON o.pipeline_id = c.name
		AND o.relay_group_id = CASE c.direction WHEN 'forward' THEN c.config ->> 'consumer_group'
											   ELSE 'reverse' END
		AND o.outbox_name = CASE c.direction WHEN 'forward' THEN c.config ->> 'outbox'
											ELSE c.config ->> 'inbox' END;

COMMENT ON VIEW tide.relay_pipeline_lag
	IS 'per pipeline: the offset it has delivered up to, the newest message, and how many messages (and how old the oldest) wait; a reverse pipeline''s inbox and source position';

-- One state per pipeline in "health", the first that holds of (each
-- explains the ones after it):
--   disabled      enabled is false: nothing is delivered until relay_enable;
--   stopped       no relay worker serves the database (the relay off, no
--                 worker running or no slot for one, the catalog waiting
--                 for ALTER EXTENSION pg_tide UPDATE): tide._relay_serving_state;
--   error         its last turn ended in an ERROR (a full disk, its outbox
--                 dropped, a lost lease); the worker holds it meanwhile;
--   held          the worker holds it (its destination failing, or ordering
--                 'strict' at a failing message) until held_until;
--   breaker_open  its circuit breaker is open;
--   failing       attempts failed since the last success;
--   healthy       none of these.
-- "reason" says why for every state but disabled and healthy, and
-- next_attempt_at when the worker tries again: the end of the hold, else
-- the retry queue's first due message; null while disabled or stopped.
-- Both directions: a reverse pipeline (direction 'reverse') shows its
-- inbox, source type and source position, and its health from the same
-- relay_pipeline_health row, keyed by the name (unique across both).
CREATE OR REPLACE VIEW tide.relay_pipeline_status AS
SELECT c.name AS pipeline,
	   c.enabled,
	   c.config ->> 'sink_type' AS sink_type,
	   c.config ->> 'outbox' AS outbox,
	   CASE WHEN NOT c.enabled THEN 'disabled'
			WHEN s.state = 'stopped' THEN 'stopped'
			WHEN h.turn_error IS NOT NULL THEN 'error'
			WHEN h.held_until > now() THEN 'held'
			WHEN h.breaker = 'open' THEN 'breaker_open'
			WHEN coalesce(h.consecutive_failures, 0) = 0 THEN 'healthy'
			ELSE 'failing' END AS health,
	   CASE WHEN NOT c.enabled THEN NULL
			WHEN s.state = 'stopped' THEN s.reason
			WHEN h.turn_error IS NOT NULL THEN h.turn_error
			WHEN h.held_until > now() THEN h.held_reason
			WHEN h.breaker = 'open' OR coalesce(h.consecutive_failures, 0) > 0 THEN h.last_error
			END AS reason,
	   CASE WHEN h.held_until > now() THEN h.held_since END AS held_since,
	   CASE WHEN h.held_until > now() THEN h.held_until END AS held_until,
	   CASE WHEN NOT c.enabled OR s.state = 'stopped' THEN NULL
			WHEN h.held_until > now() THEN h.held_until
			ELSE (SELECT min(q.next_attempt_at) FROM tide.relay_retry_queue q
				   WHERE q.pipeline_id = c.name) END AS next_attempt_at,
	   h.turn_error,
	   h.turn_error_since,
	   h.breaker,
	   coalesce(h.filtered, 0) AS filtered,
	   coalesce(h.consecutive_failures, 0) AS consecutive_failures,
	   l.delivered_upto AS offset_id,
	   l.lag_messages,
	   l.lag_age,
	   (SELECT coalesce(sum(cl.lease_end - cl.lease_start + 1), 0)
		  FROM tide.tide_consumer_leases cl
		 WHERE cl.group_name = c.config ->> 'consumer_group'
		   AND cl.consumer_id = 'relay:' || c.name) AS in_flight,
	   (SELECT count(*) FROM tide.relay_retry_queue q WHERE q.pipeline_id = c.name) AS retry_queue,
	   (SELECT count(*) FROM tide.relay_dlq d WHERE d.pipeline_id = c.name) AS dead_letters,
	   h.last_success_at,
	   h.last_failure_at,
	   h.last_status,
	   h.last_error_class,
	   h.last_error,
	   -- The deliveries of the last 60 seconds, estimated from the counts of
	   -- this minute and the minute before (relay_pipeline_health), the
	   -- latter weighted by the part of it still within the 60 seconds.
	   round(CASE h.rate_minute
				 WHEN date_trunc('minute', now()) THEN
					 h.delivered_in_minute + h.delivered_minute_before
					 * (1 - extract(epoch FROM now() - h.rate_minute) / 60)
				 WHEN date_trunc('minute', now()) - interval '1 minute' THEN
					 h.delivered_in_minute
					 * (1 - extract(epoch FROM now() - h.rate_minute - interval '1 minute') / 60)
				 ELSE 0 END)::bigint AS delivered_last_minute,
	   coalesce(h.delivered, 0) AS delivered,
	   coalesce(h.failed, 0) AS failed,
	   coalesce(h.failed_by_class, '{}') AS failed_by_class,
	   coalesce(h.retried, 0) AS retried,
	   coalesce(h.dead_lettered, 0) AS dead_lettered,
	   h.counted_since,
	   l.direction,
	   l.inbox,
	   c.config ->> 'source_type' AS source_type,
	   l.source_position,
	   coalesce(h.expired, 0) AS expired
  FROM (SELECT f.name, f.enabled, f.config FROM tide.relay_outbox_config f
		UNION ALL
		SELECT r.name, r.enabled, r.config FROM tide.relay_inbox_config r) c
  JOIN tide.relay_pipeline_lag l ON l.pipeline = c.name
 CROSS JOIN tide._relay_serving_state() s
  LEFT JOIN tide.relay_pipeline_health h ON h.pipeline_id = c.name;

COMMENT ON VIEW tide.relay_pipeline_status
	IS 'per pipeline: health (the first of disabled, stopped, error, held, breaker_open, failing, healthy) and its reason, the hold and the next attempt, the last turn''s error, failures in a row, offset, lag, in flight, retry queue, dead letters, last success and error, deliveries in the last minute; the counters since counted_since: delivered, failed attempts (by class), retried, dead-lettered, expired (dead-lettered unsent); its direction, and a reverse pipeline''s inbox, source type and source position';

-- The attempt log and the dead letters for a tide_reader: what happened,
-- without what a message or an answer held (payload, headers, the answer's
-- first bytes), which may carry personal data or secrets. The error texts
-- are the relay's own, as relay_pipeline_status shows them.
CREATE OR REPLACE VIEW tide.relay_attempt_log AS
SELECT a.id,
	   a.pipeline_id AS pipeline,
	   a.outbox_name AS outbox,
	   a.message_id,
	   a.attempt,
	   a.manual,
	   a.status,
	   a.response_code,
	   a.error_class,
	   a.error,
	   a.latency_ms,
	   a.attempted_at
  FROM tide.relay_attempts a;

COMMENT ON VIEW tide.relay_attempt_log
	IS 'the delivery attempts of tide.relay_attempts without the answers'' text';

CREATE OR REPLACE VIEW tide.relay_dead_letters AS
SELECT d.id,
	   d.pipeline_id AS pipeline,
	   d.outbox_name AS outbox,
	   d.message_id,
	   d.created_at,
	   d.attempts,
	   d.reason,
	   d.last_status,
	   d.last_error_class,
	   d.last_error,
	   d.first_failed_at,
	   d.dead_lettered_at,
	   d.event_id
  FROM tide.relay_dlq d;

COMMENT ON VIEW tide.relay_dead_letters
	IS 'the dead letters of tide.relay_dlq without their payloads and headers';

CREATE OR REPLACE VIEW tide.outbox_retention_status AS
SELECT c.outbox_name,
	   c.retention_hours,
	   s.messages,
	   s.oldest_message_age,
	   s.past_retention,
	   s.deletable,
	   r.bound AS horizon_id,
	   r.blocker ->> 'kind' AS blocker_kind,
	   r.blocker ->> 'name' AS blocker_name,
	   r.blocker ->> 'group' AS blocker_group,
	   (r.blocker ->> 'position')::bigint AS blocker_position
  FROM tide.tide_outbox_config c
 CROSS JOIN LATERAL tide._outbox_retention(c.outbox_name, make_interval(hours => c.retention_hours)) r
 CROSS JOIN LATERAL (
		SELECT count(*) AS messages,
			   now() - min(m.created_at) AS oldest_message_age,
			   count(*) FILTER (WHERE m.created_at < r.cutoff) AS past_retention,
			   count(*) FILTER (WHERE m.created_at < r.cutoff AND m.id <= r.bound) AS deletable
		  FROM tide.tide_outbox_messages m
		 WHERE m.outbox_name = c.outbox_name) s;

COMMENT ON VIEW tide.outbox_retention_status
	IS 'per outbox: messages, past retention, deletable now by tide.outbox_sweep, and what holds the rest back';

CREATE OR REPLACE VIEW tide.inbox_handler_status AS
SELECT h.inbox_name AS inbox,
	   h.handler,
	   h.run_as,
	   h.enabled,
	   (h.config ->> 'batch_size')::int AS batch_size,
	   (h.config ->> 'concurrency')::int AS concurrency,
	   -- one batch per relay worker of the database at most
	   least((h.config ->> 'concurrency')::int,
			 current_setting('pg_tide.relay_workers_per_database', true)::int) AS effective_concurrency,
	   -- the batches that hold one of its slots now (relay/inbox_handler.h)
	   (SELECT count(*)::int FROM pg_catalog.pg_locks l
		 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
		   AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
		   AND l.classid BETWEEN 1953064960 AND 1953064960 + 15
		   AND l.objid = hashtext(h.inbox_name)::oid) AS running,
	   h.owner,
	   coalesce(s.processed, 0) AS processed,
	   coalesce(s.failed, 0) AS failed,
	   coalesce(s.dead_lettered, 0) AS dead_lettered,
	   s.last_success_at,
	   s.last_failure_at,
	   s.last_error,
	   s.held_since,
	   s.held_reason,
	   s.counted_since
  FROM tide.relay_inbox_handlers h
  LEFT JOIN tide.relay_inbox_handler_health s ON s.inbox_name = h.inbox_name;

COMMENT ON VIEW tide.inbox_handler_status
	IS 'per inbox handler: its function and role, how many batches may run and run at once, events processed, failed attempts, dead letters, the last error and the relay''s hold';
