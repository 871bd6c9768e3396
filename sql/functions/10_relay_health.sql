-- ---------------------------------------------------------------------------
-- Destination health and operator events. The relay worker calls
-- _relay_after_batch in the transaction that records each batch: it keeps
-- relay_pipeline_health, publishes operator events when the failures in a
-- row reach 50, 70, 90 and 100 % of the pipeline's alerts.failure_threshold
-- and when retries run out, and disables the pipeline at the threshold when
-- alerts.auto_disable is set. A recorded batch also ends the worker's hold
-- of the pipeline (relay/pipeline_state.c). Events go to the outbox that
-- pg_tide.operator_events_outbox names (none when empty), with the header
-- "type" so that a pipeline can route them, for example to a pager. It
-- also counts the batch's deliveries, failed attempts by class, retries
-- and dead letters, and the expired messages among them
-- (relay_pipeline_health's counters).
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION tide._relay_operator_event(p_type text, p_pipeline text, p_detail jsonb)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	target text := nullif(current_setting('pg_tide.operator_events_outbox', true), '');
BEGIN
	IF target IS NULL THEN
		RETURN;
	END IF;
	IF NOT EXISTS (SELECT FROM tide.tide_outbox_config WHERE outbox_name = target AND enabled) THEN
		RAISE WARNING 'operator event % of % not published: outbox "%" does not exist or is disabled',
			p_type, coalesce(format('pipeline "%s"', p_pipeline), format('outbox "%s"', p_detail ->> 'outbox')),
			target
			USING HINT = 'Create the outbox that pg_tide.operator_events_outbox names, or set the setting to an empty string.';
		RETURN;
	END IF;
	PERFORM tide.outbox_publish(target,
		jsonb_strip_nulls(jsonb_build_object('event', p_type, 'pipeline', p_pipeline, 'at', now()))
			|| coalesce(p_detail, '{}'),
		jsonb_build_object('type', 'pg_tide.' || p_type));
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_operator_event(text,text,jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_operator_event(text,text,jsonb) TO tide_admin;

CREATE OR REPLACE FUNCTION tide._relay_after_batch(p_pipeline text, p_failures int, p_successes int,
										p_status int, p_error_class text, p_error text,
										p_exhausted bigint[], p_breaker text DEFAULT NULL,
										p_filtered int DEFAULT 0, p_failed_classes text[] DEFAULT NULL,
										p_retried int DEFAULT 0, p_dead_lettered int DEFAULT 0,
										p_expired int DEFAULT 0)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	cfg jsonb;
	threshold int;
	before int;
	now_failing int;
	pct int;
	id bigint;
	batch_classes jsonb;
BEGIN
	IF p_failed_classes IS NOT NULL THEN
		SELECT jsonb_object_agg(c, n) INTO batch_classes
		  FROM (SELECT c, count(*) AS n FROM unnest(p_failed_classes) c GROUP BY c) x;
	END IF;
	INSERT INTO tide.relay_pipeline_health AS h
		(pipeline_id, consecutive_failures, last_success_at, last_failure_at, last_status,
		 last_error_class, last_error, breaker, filtered, updated_at,
		 delivered, failed, failed_by_class, retried, dead_lettered, expired,
		 rate_minute, delivered_in_minute)
	VALUES (p_pipeline, CASE WHEN p_successes > 0 THEN 0 ELSE p_failures END,
			CASE WHEN p_successes > 0 THEN now() END, CASE WHEN p_failures > 0 THEN now() END,
			p_status, p_error_class, p_error, p_breaker, coalesce(p_filtered, 0), now(),
			p_successes, p_failures,
			coalesce(batch_classes, '{}'),
			coalesce(p_retried, 0), coalesce(p_dead_lettered, 0), coalesce(p_expired, 0),
			date_trunc('minute', now()), p_successes)
	ON CONFLICT (pipeline_id) DO UPDATE
	   SET consecutive_failures = CASE WHEN p_successes > 0 THEN 0
									   ELSE h.consecutive_failures + p_failures END,
		   last_success_at = coalesce(EXCLUDED.last_success_at, h.last_success_at),
		   last_failure_at = coalesce(EXCLUDED.last_failure_at, h.last_failure_at),
		   last_status = CASE WHEN p_failures > 0 THEN p_status ELSE h.last_status END,
		   last_error_class = CASE WHEN p_failures > 0 THEN p_error_class ELSE h.last_error_class END,
		   last_error = CASE WHEN p_failures > 0 THEN p_error ELSE h.last_error END,
		   breaker = EXCLUDED.breaker,
		   filtered = h.filtered + EXCLUDED.filtered,
		   -- A batch is leased only once the worker's hold is over (and
		   -- a hold this batch starts is recorded after it).
		   held_until = NULL,
		   held_reason = NULL,
		   updated_at = now(),
		   delivered = h.delivered + EXCLUDED.delivered,
		   failed = h.failed + EXCLUDED.failed,
		   failed_by_class = CASE WHEN batch_classes IS NULL THEN h.failed_by_class
								  ELSE h.failed_by_class
									   || (SELECT jsonb_object_agg(b.k, coalesce((h.failed_by_class ->> b.k)::bigint, 0)
																		+ b.n::bigint)
											 FROM jsonb_each_text(batch_classes) b (k, n)) END,
		   retried = h.retried + EXCLUDED.retried,
		   dead_lettered = h.dead_lettered + EXCLUDED.dead_lettered,
		   expired = h.expired + EXCLUDED.expired,
		   -- the deliveries of this minute and of the one before it
		   rate_minute = EXCLUDED.rate_minute,
		   delivered_minute_before = CASE h.rate_minute
										 WHEN EXCLUDED.rate_minute THEN h.delivered_minute_before
										 WHEN EXCLUDED.rate_minute - interval '1 minute' THEN h.delivered_in_minute
										 ELSE 0 END,
		   delivered_in_minute = CASE WHEN h.rate_minute = EXCLUDED.rate_minute
									  THEN h.delivered_in_minute ELSE 0 END + EXCLUDED.delivered_in_minute
	RETURNING consecutive_failures INTO now_failing;

	SELECT config INTO cfg FROM tide.relay_outbox_config WHERE name = p_pipeline;
	FOREACH id IN ARRAY coalesce(p_exhausted, '{}') LOOP
		PERFORM tide._relay_operator_event('pipeline.retries_exhausted', p_pipeline,
			jsonb_build_object('message_id', id, 'outbox', cfg ->> 'outbox', 'last_error', p_error));
	END LOOP;
	IF p_successes > 0 OR p_failures = 0 OR cfg IS NULL THEN
		RETURN;
	END IF;
	threshold := coalesce((cfg #>> '{alerts,failure_threshold}')::int, 100);
	before := now_failing - p_failures;
	FOREACH pct IN ARRAY ARRAY[50, 70, 90, 100] LOOP
		IF before < ceil(threshold * pct / 100.0) AND now_failing >= ceil(threshold * pct / 100.0) THEN
			PERFORM tide._relay_operator_event('pipeline.failing', p_pipeline,
				jsonb_build_object('percent', pct, 'consecutive_failures', now_failing,
								   'threshold', threshold, 'last_status', p_status,
								   'last_error_class', p_error_class, 'last_error', p_error));
		END IF;
	END LOOP;
	IF before < threshold AND now_failing >= threshold
	   AND (cfg #> '{alerts,auto_disable}') = 'true'::jsonb THEN
		-- The trigger on relay_outbox_config publishes pipeline.disabled.
		UPDATE tide.relay_outbox_config SET enabled = false WHERE name = p_pipeline AND enabled;
		RAISE LOG 'pg_tide relay pipeline "%" disabled after % failed attempts in a row',
			p_pipeline, now_failing;
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_after_batch(text,integer,integer,integer,text,text,bigint[],text,integer,text[],integer,integer,integer) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_after_batch(text,integer,integer,integer,text,text,bigint[],text,integer,text[],integer,integer,integer) TO tide_admin;

-- Starts a pipeline's counters again from 0 (relay_pipeline_status's
-- delivered, failed, failed_by_class, retried, dead_lettered, expired and
-- delivered_last_minute), counted_since now. The worker's next record adds
-- to the reset row: the row lock orders the two.
CREATE OR REPLACE FUNCTION tide.relay_reset_counters(p_name text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._relay_pipeline(p_name);
	UPDATE tide.relay_pipeline_health
	   SET delivered = 0, failed = 0, failed_by_class = '{}', retried = 0, dead_lettered = 0,
		   expired = 0, counted_since = now(), rate_minute = NULL, delivered_in_minute = 0,
		   delivered_minute_before = 0
	 WHERE pipeline_id = p_name;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.relay_reset_counters(text)
	IS 'starts a pipeline''s delivery counters again from 0';
REVOKE ALL ON FUNCTION tide.relay_reset_counters(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_reset_counters(text) TO tide_admin;
