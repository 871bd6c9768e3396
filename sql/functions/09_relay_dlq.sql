-- ---------------------------------------------------------------------------
-- Dead letters. A message that fails permanently (an answer other than 2xx,
-- 408, 425, 429 or 5xx) or runs out of retry.max_attempts goes to
-- relay_dlq, and the pipeline moves on (with ordering 'strict' it holds
-- instead). Retrying puts it back into the pipeline's retry queue, due at
-- once, with a fresh count of attempts; the relay worker is woken at commit.
-- ---------------------------------------------------------------------------

-- Refuses an age that is negative or, at more than 100 years, would take
-- now() out of the range of timestamps.
CREATE OR REPLACE FUNCTION tide._check_age(p_age interval, p_hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	IF p_age < interval '0' THEN
		RAISE EXCEPTION 'age must not be negative, not %', p_age
			USING ERRCODE = 'invalid_parameter_value', HINT = p_hint;
	END IF;
	IF p_age > interval '100 years' THEN
		RAISE EXCEPTION 'age must be at most 100 years, not %', p_age
			USING ERRCODE = 'invalid_parameter_value', HINT = p_hint;
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._check_age(interval,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._check_age(interval,text) TO tide_admin, tide_consumer, tide_reader;

-- Moves dead letters back into their pipelines' retry queues; returns how many.
CREATE OR REPLACE FUNCTION tide._relay_dlq_requeue(p_ids bigint[])
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
	n bigint;
BEGIN
	WITH d AS (
		DELETE FROM tide.relay_dlq WHERE id = ANY (p_ids)
		RETURNING pipeline_id, outbox_name, message_id, payload, headers, created_at,
				  first_failed_at, last_status, last_error_class, last_error)
	INSERT INTO tide.relay_retry_queue AS q
		(pipeline_id, outbox_name, message_id, payload, headers, created_at, attempts,
		 next_attempt_at, manual, first_failed_at, last_status, last_error_class, last_error)
	SELECT pipeline_id, outbox_name, message_id, payload, headers, created_at, 0,
		   now(), true, first_failed_at, last_status, last_error_class, last_error
	  FROM d
	ON CONFLICT (pipeline_id, message_id) DO UPDATE
	   SET attempts = 0, next_attempt_at = now(), manual = true;
	GET DIAGNOSTICS n = ROW_COUNT;
	IF n > 0 THEN
		PERFORM tide._relay_wake_worker();
	END IF;
	RETURN n;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_dlq_requeue(bigint[]) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_dlq_requeue(bigint[]) TO tide_admin;

-- A dead letter of a reverse pipeline is an event its inbox refused
-- (relay/flow_reverse.c): there is no retry queue to put it back into, so
-- retrying it is refused rather than handed to a forward pipeline.
CREATE OR REPLACE FUNCTION tide._relay_dlq_forward_pipeline(p_pipeline text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM tide.relay_inbox_config WHERE name = p_pipeline) THEN
		RAISE EXCEPTION 'dead letters of reverse pipeline "%" cannot be retried', p_pipeline
			USING ERRCODE = 'wrong_object_type',
				  HINT = 'They are events its inbox refused: once the inbox accepts them, store them with tide.inbox_receive(); tide.relay_dlq_purge() removes old dead letters.';
	END IF;
	PERFORM tide._relay_pipeline(p_pipeline);
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_dlq_forward_pipeline(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_dlq_forward_pipeline(text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_dlq_list(p_pipeline text DEFAULT NULL, p_limit int DEFAULT 100)
RETURNS TABLE (id bigint, pipeline text, outbox text, message_id bigint, reason text,
			   attempts int, last_status int, last_error_class text, last_error text,
			   first_failed_at timestamptz, dead_lettered_at timestamptz,
			   payload jsonb, headers jsonb, created_at timestamptz)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
	IF p_pipeline IS NOT NULL THEN
		PERFORM tide._check_name('pipeline', p_pipeline);
	END IF;
	IF p_limit IS NULL THEN
		RAISE EXCEPTION 'limit must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give p_limit, the most dead letters to list, as a positive number.';
	END IF;
	IF p_limit <= 0 THEN
		RAISE EXCEPTION 'limit must be positive, not %', p_limit
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give p_limit, the most dead letters to list, as a positive number.';
	END IF;
	RETURN QUERY
		SELECT d.id, d.pipeline_id, d.outbox_name, d.message_id, d.reason, d.attempts,
			   d.last_status, d.last_error_class, d.last_error, d.first_failed_at,
			   d.dead_lettered_at, d.payload, d.headers, d.created_at
		  FROM tide.relay_dlq d
		 WHERE p_pipeline IS NULL OR d.pipeline_id = p_pipeline
		 ORDER BY d.id
		 LIMIT p_limit;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.relay_dlq_list(text, int)
	IS 'dead letters, oldest first, of one pipeline or all: the message, why it failed and after how many attempts';
REVOKE ALL ON FUNCTION tide.relay_dlq_list(text,integer) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_dlq_list(text,integer) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_dlq_retry(p_id bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	d tide.relay_dlq;
BEGIN
	IF p_id IS NULL THEN
		RAISE EXCEPTION 'dead letter id must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give an id that tide.relay_dlq_list() shows.';
	END IF;
	SELECT * INTO d FROM tide.relay_dlq WHERE id = p_id FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'dead letter % does not exist', p_id
			USING ERRCODE = 'undefined_object',
				  HINT = 'tide.relay_dlq_list() shows the dead letters; one that was retried or purged is gone.';
	END IF;
	PERFORM tide._relay_dlq_forward_pipeline(d.pipeline_id);
	PERFORM tide._relay_dlq_requeue(ARRAY[p_id]);
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.relay_dlq_retry(bigint)
	IS 'delivers a dead letter again: back into its pipeline''s retry queue, due at once, with fresh attempts';
REVOKE ALL ON FUNCTION tide.relay_dlq_retry(bigint) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_dlq_retry(bigint) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_dlq_retry_all(p_pipeline text)
RETURNS bigint
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._relay_dlq_forward_pipeline(p_pipeline);
	RETURN tide._relay_dlq_requeue(ARRAY(
		SELECT id FROM tide.relay_dlq WHERE pipeline_id = p_pipeline ORDER BY id FOR UPDATE));
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.relay_dlq_retry_all(text)
	IS 'delivers every dead letter of a pipeline again; returns how many were queued';
REVOKE ALL ON FUNCTION tide.relay_dlq_retry_all(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_dlq_retry_all(text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_dlq_purge(p_older_than interval)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
	n bigint;
BEGIN
	IF p_older_than IS NULL THEN
		RAISE EXCEPTION 'age must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give how old dead letters must be to go, for example interval ''7 days''; interval ''0'' removes them all.';
	END IF;
	PERFORM tide._check_age(p_older_than,
		'Give how old dead letters must be to go, for example interval ''7 days''; interval ''0'' removes them all.');
	DELETE FROM tide.relay_dlq WHERE dead_lettered_at <= now() - p_older_than;
	GET DIAGNOSTICS n = ROW_COUNT;
	RETURN n;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.relay_dlq_purge(interval)
	IS 'removes dead letters that were dead-lettered at least the given time ago; returns how many';
REVOKE ALL ON FUNCTION tide.relay_dlq_purge(interval) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_dlq_purge(interval) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_dlq_stats()
RETURNS TABLE (pipeline text, dead_letters bigint, permanent bigint, exhausted bigint,
			   oldest_at timestamptz, newest_at timestamptz, retry_queue bigint)
LANGUAGE sql STABLE
AS $$
	WITH d AS (
		SELECT pipeline_id, count(*) AS n,
			   count(*) FILTER (WHERE reason = 'permanent') AS permanent,
			   count(*) FILTER (WHERE reason = 'exhausted') AS exhausted,
			   min(dead_lettered_at) AS oldest_at, max(dead_lettered_at) AS newest_at
		  FROM tide.relay_dlq GROUP BY pipeline_id),
	q AS (
		SELECT pipeline_id, count(*) AS n FROM tide.relay_retry_queue GROUP BY pipeline_id),
	p AS (
		SELECT name AS pipeline_id FROM tide.relay_outbox_config
		UNION SELECT pipeline_id FROM d
		UNION SELECT pipeline_id FROM q)
	SELECT p.pipeline_id, coalesce(d.n, 0), coalesce(d.permanent, 0), coalesce(d.exhausted, 0),
		   d.oldest_at, d.newest_at, coalesce(q.n, 0)
	  FROM p LEFT JOIN d USING (pipeline_id) LEFT JOIN q USING (pipeline_id)
	 ORDER BY p.pipeline_id
$$
SET search_path = pg_catalog, pg_temp
SECURITY DEFINER;
COMMENT ON FUNCTION tide.relay_dlq_stats()
	IS 'per pipeline: dead letters (permanent failures, exhausted retries), the oldest and newest, and messages waiting in its retry queue';
REVOKE ALL ON FUNCTION tide.relay_dlq_stats() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_dlq_stats() TO tide_admin, tide_reader;
