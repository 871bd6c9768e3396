-- ---------------------------------------------------------------------------
-- Outboxes
-- ---------------------------------------------------------------------------

-- Refuses an inline_threshold that is not NULL (no limit) or positive.
CREATE OR REPLACE FUNCTION tide._check_threshold(p_inline_threshold int)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	IF p_inline_threshold <= 0 THEN
		RAISE EXCEPTION 'inline_threshold must be positive'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give the number of unconsumed messages at which publishing is refused, at least 1, or NULL for no limit.';
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._check_threshold(integer) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._check_threshold(integer) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.outbox_create_if_not_exists(p_name text,
												 p_retention_hours int DEFAULT 24,
												 p_inline_threshold int DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
	created boolean;
BEGIN
	PERFORM tide._check_name('outbox', p_name);
	IF p_retention_hours IS NULL THEN
		RAISE EXCEPTION 'retention_hours must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give the number of hours consumed messages are kept, from 1 to 87600 (ten years).';
	END IF;
	IF p_retention_hours <= 0 THEN
		RAISE EXCEPTION 'retention_hours must be positive'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give the number of hours consumed messages are kept, at least 1.';
	END IF;
	-- Retention subtracts the hours from now(): far beyond this, timestamps
	-- overflow and every sweep would fail.
	IF p_retention_hours > 87600 THEN
		RAISE EXCEPTION 'retention_hours must be at most 87600, not %', p_retention_hours
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give the number of hours consumed messages are kept, from 1 to 87600 (ten years).';
	END IF;
	PERFORM tide._check_threshold(p_inline_threshold);
	INSERT INTO tide.tide_outbox_config (outbox_name, retention_hours, inline_threshold)
	VALUES (p_name, p_retention_hours, p_inline_threshold)
	ON CONFLICT (outbox_name) DO NOTHING;
	GET DIAGNOSTICS created = ROW_COUNT;
	RETURN created;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.outbox_create_if_not_exists(text, int, int)
	IS 'creates an outbox unless it exists; returns whether it was created';
REVOKE ALL ON FUNCTION tide.outbox_create_if_not_exists(text,integer,integer) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_create_if_not_exists(text,integer,integer) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.outbox_create(p_name text,
								   p_retention_hours int DEFAULT 24,
								   p_inline_threshold int DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	IF NOT tide.outbox_create_if_not_exists(p_name, p_retention_hours, p_inline_threshold) THEN
		RAISE EXCEPTION 'outbox "%" already exists', p_name
			USING ERRCODE = 'duplicate_object',
				  HINT = 'Use tide.outbox_create_if_not_exists() to accept an existing outbox.';
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.outbox_create(text, int, int) IS 'creates a named outbox';
REVOKE ALL ON FUNCTION tide.outbox_create(text,integer,integer) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_create(text,integer,integer) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.outbox_set_threshold(p_name text, p_inline_threshold int)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._outbox_config(p_name);
	PERFORM tide._check_threshold(p_inline_threshold);
	-- A new limit starts without an announced level: the next publish at
	-- 80 or 100 % of it announces it.
	UPDATE tide.tide_outbox_config SET inline_threshold = p_inline_threshold, backpressure_level = 0
	 WHERE outbox_name = p_name AND inline_threshold IS DISTINCT FROM p_inline_threshold;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.outbox_set_threshold(text, int)
	IS 'sets the most unconsumed messages an outbox with consumer groups may hold (NULL: no limit)';
REVOKE ALL ON FUNCTION tide.outbox_set_threshold(text,integer) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_set_threshold(text,integer) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.outbox_drop(p_name text, p_if_exists boolean DEFAULT false,
								 p_cascade boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	readers text[];
	pipeline text;
BEGIN
	PERFORM tide._check_name('outbox', p_name);
	PERFORM tide._check_flag('p_if_exists', p_if_exists);
	PERFORM tide._check_flag('p_cascade', p_cascade);
	-- The messages must be deleted with a snapshot taken after the lock
	-- below, which a REPEATABLE READ transaction does not take.
	IF current_setting('transaction_isolation') <> 'read committed' THEN
		RAISE EXCEPTION 'cannot drop an outbox in a % transaction', current_setting('transaction_isolation')
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'Drop it in a READ COMMITTED transaction.';
	END IF;
	-- Publishers hold ROW EXCLUSIVE on the message table until they end:
	-- this waits for those in flight, and new ones wait until the drop has
	-- committed, after which they no longer find the outbox.
	LOCK TABLE tide.tide_outbox_messages IN SHARE ROW EXCLUSIVE MODE;
	-- A pipeline of a dropped outbox would fail every pass: it goes with
	-- the outbox when asked, or the drop is refused. Its row lock keeps it
	-- from being changed meanwhile.
	SELECT array_agg(c.name ORDER BY c.name) INTO readers
	  FROM (SELECT c.name FROM tide.relay_outbox_config c
			 WHERE c.config ->> 'outbox' = p_name ORDER BY c.name FOR UPDATE) c;
	IF readers IS NOT NULL AND NOT p_cascade THEN
		RAISE EXCEPTION 'cannot drop outbox "%" because pipelines read it', p_name
			USING ERRCODE = 'dependent_objects_still_exist',
				  DETAIL = format('Pipelines %s read outbox "%s".',
								  (SELECT string_agg(format('"%s"', r), ', ') FROM unnest(readers) r), p_name),
				  HINT = 'Delete them with tide.relay_delete() first, or pass p_cascade => true to delete them with the outbox.';
	END IF;
	FOREACH pipeline IN ARRAY coalesce(readers, '{}') LOOP
		PERFORM tide.relay_delete(pipeline);
	END LOOP;
	-- Its consumer groups go with it (ON DELETE CASCADE), its messages here.
	DELETE FROM tide.tide_outbox_config WHERE outbox_name = p_name;
	IF FOUND THEN
		DELETE FROM tide.tide_outbox_messages WHERE outbox_name = p_name;
		DELETE FROM tide.outbox_idempotency_keys WHERE outbox_name = p_name;
	ELSE
		IF p_if_exists THEN
			RAISE NOTICE 'outbox "%" does not exist, skipping', p_name;
		ELSE
			RAISE EXCEPTION 'outbox "%" does not exist', p_name
				USING ERRCODE = 'undefined_object',
					  HINT = 'Pass p_if_exists => true to ignore a missing outbox.';
		END IF;
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.outbox_drop(text, boolean, boolean)
	IS 'drops an outbox with its messages and consumer groups, and with p_cascade the pipelines that read it';
REVOKE ALL ON FUNCTION tide.outbox_drop(text,boolean,boolean) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_drop(text,boolean,boolean) TO tide_admin;

CREATE OR REPLACE FUNCTION tide._outbox_set_enabled(p_name text, p_enabled boolean)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._outbox_config(p_name);
	UPDATE tide.tide_outbox_config SET enabled = p_enabled
	 WHERE outbox_name = p_name AND enabled IS DISTINCT FROM p_enabled;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._outbox_set_enabled(text,boolean) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._outbox_set_enabled(text,boolean) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.outbox_enable(p_name text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT tide._outbox_set_enabled(p_name, true);
END;
COMMENT ON FUNCTION tide.outbox_enable(text) IS 'allows publishing to an outbox again';
REVOKE ALL ON FUNCTION tide.outbox_enable(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_enable(text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.outbox_disable(p_name text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT tide._outbox_set_enabled(p_name, false);
END;
COMMENT ON FUNCTION tide.outbox_disable(text)
	IS 'refuses further publishing to an outbox; consumers keep reading';
REVOKE ALL ON FUNCTION tide.outbox_disable(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_disable(text) TO tide_admin;

-- p_idempotency_key: a second publish of the key to the outbox within its
-- idempotency_window returns the first message's id and writes nothing
-- (docs/publishing.md). p_expires_at: after it the message is passed, not
-- delivered (docs/scheduled-messages.md#expiring-messages).
CREATE OR REPLACE FUNCTION tide.outbox_publish(p_name text, p_payload jsonb, p_headers jsonb DEFAULT NULL,
											   p_idempotency_key text DEFAULT NULL,
											   p_expires_at timestamptz DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'tide_outbox_publish'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION tide.outbox_publish(text, jsonb, jsonb, text, timestamptz)
	IS 'publishes one message inside the caller''s transaction; returns its id, or the id of the message an earlier publish of the idempotency key published';
REVOKE ALL ON FUNCTION tide.outbox_publish(text,jsonb,jsonb,text,timestamptz) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_publish(text,jsonb,jsonb,text,timestamptz) TO tide_admin, tide_publisher;

-- p_idempotency_keys: one key (or NULL) per payload; a payload whose key
-- was published within the window is left out. p_expires_at: one expiry
-- for every message of the batch.
CREATE OR REPLACE FUNCTION tide.outbox_publish_batch(p_name text, p_payloads jsonb[], p_headers jsonb DEFAULT NULL,
													 p_idempotency_keys text[] DEFAULT NULL,
													 p_expires_at timestamptz DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'tide_outbox_publish_batch'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION tide.outbox_publish_batch(text, jsonb[], jsonb, text[], timestamptz)
	IS 'publishes many messages in array order inside the caller''s transaction, leaving out those whose idempotency key was published; returns how many it published';
REVOKE ALL ON FUNCTION tide.outbox_publish_batch(text,jsonb[],jsonb,text[],timestamptz) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_publish_batch(text,jsonb[],jsonb,text[],timestamptz) TO tide_admin, tide_publisher;

-- The publish of a scheduled message at its move (tide.outbox_release_due):
-- tide.outbox_publish, except that an expiry already past is kept, so that
-- the message expires in the outbox as any other (docs/scheduled-messages.md).
CREATE OR REPLACE FUNCTION tide._outbox_publish_moved(p_name text, p_payload jsonb, p_headers jsonb,
													  p_expires_at timestamptz)
RETURNS bigint
AS 'MODULE_PATHNAME', 'tide_outbox_publish_moved'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION tide._outbox_publish_moved(text, jsonb, jsonb, timestamptz)
	IS 'publishes a scheduled message at its move, keeping an expiry already past';
REVOKE ALL ON FUNCTION tide._outbox_publish_moved(text,jsonb,jsonb,timestamptz) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._outbox_publish_moved(text,jsonb,jsonb,timestamptz) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.outbox_set_idempotency_window(p_name text, p_window interval)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._outbox_config(p_name);
	IF p_window IS NULL OR p_window <= interval '0' OR p_window > interval '87600 hours' THEN
		RAISE EXCEPTION 'idempotency window must be positive and at most 87600 hours, not %',
				coalesce(p_window::text, 'null')
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give how long an idempotency key is remembered, for example interval ''24 hours''.';
	END IF;
	UPDATE tide.tide_outbox_config SET idempotency_window = p_window
	 WHERE outbox_name = p_name AND idempotency_window IS DISTINCT FROM p_window;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.outbox_set_idempotency_window(text, interval)
	IS 'sets how long an outbox remembers the idempotency key of a publish';
REVOKE ALL ON FUNCTION tide.outbox_set_idempotency_window(text,interval) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_set_idempotency_window(text,interval) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.outbox_status(p_name text)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
	cfg tide.tide_outbox_config;
	low bigint;
	result jsonb;
BEGIN
	cfg := tide._outbox_config(p_name);
	low := tide._outbox_low_water(p_name);
	SELECT jsonb_build_object(
			'outbox', cfg.outbox_name,
			'enabled', cfg.enabled,
			'retention_hours', cfg.retention_hours,
			'inline_threshold', cfg.inline_threshold,
			'backpressure_percent', cfg.backpressure_level,
			'idempotency_window_seconds', extract(epoch FROM cfg.idempotency_window)::bigint,
			'pending', (SELECT count(*) FROM tide.tide_outbox_messages m
						 WHERE m.outbox_name = p_name AND m.consumed_at IS NULL AND m.id > low),
			'oldest_pending_age_seconds',
				(SELECT round(extract(epoch FROM clock_timestamp() - min(m.created_at))::numeric, 3)
				   FROM tide.tide_outbox_messages m
				  WHERE m.outbox_name = p_name AND m.consumed_at IS NULL AND m.id > low),
			'newest_id', (SELECT max(m.id) FROM tide.tide_outbox_messages m
						   WHERE m.outbox_name = p_name),
			'safe_horizon', tide._safe_horizon(),
			'oldest_open_publish_age_seconds',
				round(tide._oldest_open_publish_age()::numeric, 3),
			'payload_schemas', coalesce((
				SELECT jsonb_agg(jsonb_build_object(
						'message_type', nullif(s.message_type, ''),
						'draft', s.draft,
						'updated_at', s.updated_at,
						'updated_by', s.updated_by::text)
						ORDER BY s.message_type)
				  FROM tide.outbox_schemas s
				 WHERE s.outbox_name = p_name), '[]'::jsonb),
			'consumer_groups', coalesce((
				SELECT jsonb_agg(jsonb_build_object(
						'group', l.group_name,
						'auto_offset_reset', l.auto_offset_reset,
						'position', l.committed_offset,
						'lag', l.pending,
						'consumers', l.consumers,
						'active_leases', l.active_leases)
						ORDER BY l.group_name)
				  FROM tide.consumer_lag l
				 WHERE l.outbox_name = p_name), '[]'::jsonb))
	  INTO result;
	RETURN result;
END
$$
SET search_path = pg_catalog, pg_temp
SECURITY DEFINER;
COMMENT ON FUNCTION tide.outbox_status(text)
	IS 'pending count and age, newest id, consumer groups with position and lag, oldest open publishing transaction, payload schemas';
REVOKE ALL ON FUNCTION tide.outbox_status(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_status(text) TO tide_admin, tide_reader;
