-- ---------------------------------------------------------------------------
-- Dead letters. A message that fails permanently (an answer other than 2xx,
-- 408, 425, 429 or 5xx) or runs out of retry.max_attempts goes to
-- relay_dlq, and the pipeline moves on (with ordering 'strict' it holds
-- instead). Retrying puts it back into the pipeline's retry queue, due at
-- once, with a fresh count of attempts; the relay worker is woken at commit.
-- A reverse pipeline's dead letter is an event its inbox refused
-- (relay/flow_reverse.c): retrying stores it in that inbox at once, in the
-- caller's transaction and with the caller's rights.
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

-- Refuses to store dead letter p_id in an inbox the caller may not write
-- to: the retry runs with the caller's rights, as tide.inbox_receive does,
-- and says so before it writes anything.
CREATE OR REPLACE FUNCTION tide._relay_dlq_check_inbox_rights(p_cfg tide.tide_inbox_config, p_id bigint)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	tbl oid;
BEGIN
	-- by the catalog: a name lookup would fail on a schema without USAGE
	SELECT c.oid INTO tbl
	  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	 WHERE n.nspname = p_cfg.inbox_schema AND c.relname = p_cfg.inbox_name || '_inbox';
	IF tbl IS NULL THEN
		RETURN;			-- tide.inbox_receive_batch says the table is gone
	END IF;
	IF NOT has_schema_privilege(p_cfg.inbox_schema, 'USAGE') THEN
		tbl := NULL;
	ELSIF NOT has_table_privilege(tbl, 'INSERT') THEN
		tbl := NULL;
	END IF;
	IF tbl IS NULL THEN
		RAISE EXCEPTION 'permission denied to store dead letter % in inbox "%"', p_id, p_cfg.inbox_name
			USING ERRCODE = 'insufficient_privilege',
				  HINT = format('Retrying stores the event with your rights: it needs USAGE on schema %I and INSERT on table %s, which tide_admin and tide_consumer get when the inbox is created.',
								p_cfg.inbox_schema, tide._inbox_table(p_cfg));
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_dlq_check_inbox_rights(tide.tide_inbox_config,bigint) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_dlq_check_inbox_rights(tide.tide_inbox_config,bigint) TO tide_admin;

-- Stores dead letters of reverse pipelines in their inboxes as the
-- pipeline stores an event (relay/flow_reverse.c): tide.inbox_receive_batch
-- with the event's id, the pipeline's name as its source, its payload and
-- headers, so that an event the inbox holds already changes nothing. The
-- dead letters go; returns how many. An inbox that still refuses one fails
-- the whole call with the inbox's SQLSTATE and error, nothing written.
CREATE OR REPLACE FUNCTION tide._relay_dlq_store(p_ids bigint[])
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
	d tide.relay_dlq;
	n bigint := 0;
	st text;
	msg text;
	detail text;
BEGIN
	FOR d IN SELECT * FROM tide.relay_dlq WHERE id = ANY (p_ids) ORDER BY id LOOP
		PERFORM tide._relay_dlq_check_inbox_rights(tide._inbox_config(d.outbox_name), d.id);
	END LOOP;
	-- d, a variable, still names the dead letter being stored when the
	-- inbox refuses it (the block's writes are undone, its variables not)
	BEGIN
		FOR d IN SELECT * FROM tide.relay_dlq WHERE id = ANY (p_ids) ORDER BY id LOOP
			PERFORM tide.inbox_receive_batch(d.outbox_name, jsonb_build_array(jsonb_build_object(
				'event_id', d.event_id, 'source', d.pipeline_id, 'payload', d.payload, 'headers', d.headers)));
		END LOOP;
	EXCEPTION WHEN OTHERS THEN
		GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, detail = PG_EXCEPTION_DETAIL;
		RAISE EXCEPTION 'inbox "%" still refuses dead letter %: %', d.outbox_name, d.id, msg
			USING ERRCODE = st,
				  DETAIL = concat_ws(' ', format('It is event "%s" of pipeline "%s".', d.event_id, d.pipeline_id),
									 nullif(detail, '')),
				  HINT = 'Nothing was stored and the dead letter is kept: mend what refuses it (a CHECK, a trigger, a limit of the inbox''s table), then retry it; tide.relay_dlq_discard() removes it without storing it.';
	END;
	DELETE FROM tide.relay_dlq WHERE id = ANY (p_ids);
	GET DIAGNOSTICS n = ROW_COUNT;
	RETURN n;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_dlq_store(bigint[]) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_dlq_store(bigint[]) TO tide_admin;

-- Retries dead letters of either direction (their rows locked by the
-- caller): a forward pipeline's back into its retry queue, a reverse
-- pipeline's into its inbox; returns how many.
CREATE OR REPLACE FUNCTION tide._relay_dlq_retry(p_ids bigint[])
RETURNS bigint
LANGUAGE plpgsql
AS $$
BEGIN
	RETURN tide._relay_dlq_store(ARRAY(
			   SELECT id FROM tide.relay_dlq WHERE id = ANY (p_ids) AND event_id IS NOT NULL))
		 + tide._relay_dlq_requeue(ARRAY(
			   SELECT id FROM tide.relay_dlq WHERE id = ANY (p_ids) AND event_id IS NULL));
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_dlq_retry(bigint[]) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_dlq_retry(bigint[]) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_dlq_list(p_pipeline text DEFAULT NULL, p_limit int DEFAULT 100)
RETURNS TABLE (id bigint, pipeline text, outbox text, message_id bigint, event_id text, reason text,
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
		SELECT d.id, d.pipeline_id, d.outbox_name, d.message_id, d.event_id, d.reason, d.attempts,
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
	IS 'dead letters, oldest first, of one pipeline or all: the message (a reverse pipeline''s: the event and its inbox), why it failed and after how many attempts';
REVOKE ALL ON FUNCTION tide.relay_dlq_list(text,integer) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_dlq_list(text,integer) TO tide_admin;

-- Dead letter p_id, locked, or an ERROR saying there is none.
CREATE OR REPLACE FUNCTION tide._relay_dlq_row(p_id bigint)
RETURNS tide.relay_dlq
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
	RETURN d;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_dlq_row(bigint) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_dlq_row(bigint) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_dlq_retry(p_id bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	d tide.relay_dlq := tide._relay_dlq_row(p_id);
BEGIN
	IF d.event_id IS NULL THEN
		PERFORM tide._relay_pipeline(d.pipeline_id);
	END IF;
	PERFORM tide._relay_dlq_retry(ARRAY[p_id]);
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.relay_dlq_retry(bigint)
	IS 'delivers a dead letter again: back into its pipeline''s retry queue, due at once, with fresh attempts; a reverse pipeline''s is stored in its inbox at once';
REVOKE ALL ON FUNCTION tide.relay_dlq_retry(bigint) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_dlq_retry(bigint) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_dlq_retry_all(p_pipeline text)
RETURNS bigint
LANGUAGE plpgsql
AS $$
BEGIN
	-- a reverse pipeline's dead letters name their inbox: they are stored
	-- there even when the pipeline was deleted; a forward pipeline's go
	-- back to its retry queue, which only a forward pipeline reads
	IF EXISTS (SELECT 1 FROM tide.relay_dlq WHERE pipeline_id = p_pipeline AND event_id IS NULL)
	   OR (NOT EXISTS (SELECT 1 FROM tide.relay_inbox_config WHERE name = p_pipeline)
		   AND NOT EXISTS (SELECT 1 FROM tide.relay_dlq WHERE pipeline_id = p_pipeline AND event_id IS NOT NULL)) THEN
		PERFORM tide._relay_pipeline(p_pipeline);
	END IF;
	RETURN tide._relay_dlq_retry(ARRAY(
		SELECT id FROM tide.relay_dlq WHERE pipeline_id = p_pipeline ORDER BY id FOR UPDATE));
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.relay_dlq_retry_all(text)
	IS 'delivers every dead letter of a pipeline again (a reverse pipeline''s: into its inbox, all or none); returns how many were queued or stored';
REVOKE ALL ON FUNCTION tide.relay_dlq_retry_all(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_dlq_retry_all(text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_dlq_discard(p_id bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._relay_dlq_row(p_id);
	DELETE FROM tide.relay_dlq WHERE id = p_id;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.relay_dlq_discard(bigint)
	IS 'removes one dead letter, of either direction, without delivering or storing it';
REVOKE ALL ON FUNCTION tide.relay_dlq_discard(bigint) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_dlq_discard(bigint) TO tide_admin;

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
