-- pg_tide 0.1.0: catalog, outboxes, consumer groups, inboxes
\echo Use "CREATE EXTENSION pg_tide" to load this file. \quit

-- The schema belongs to the extension, so DROP EXTENSION removes it.
CREATE SCHEMA tide;
COMMENT ON SCHEMA tide IS 'pg_tide: outboxes, consumer groups, inboxes and relay pipelines';

-- ---------------------------------------------------------------------------
-- Internal C helpers. Their names start with "_"; they are called by the API
-- functions and by the message id default, so they run as the caller.
-- ---------------------------------------------------------------------------

-- Takes the next message id after registering this transaction in the publish
-- tracker, so that every way of inserting a message is commit-order safe.
CREATE FUNCTION tide._next_message_id()
RETURNS bigint
AS 'MODULE_PATHNAME', 'tide_next_message_id'
LANGUAGE C VOLATILE;

-- The highest message id below which every id has either committed or
-- aborted: readers never go past it.
CREATE FUNCTION tide._safe_horizon()
RETURNS bigint
AS 'MODULE_PATHNAME', 'tide_safe_horizon'
LANGUAGE C VOLATILE;

-- Age in seconds of the oldest transaction in this database that has
-- published and is still open; NULL when there is none.
CREATE FUNCTION tide._oldest_open_publish_age()
RETURNS double precision
AS 'MODULE_PATHNAME', 'tide_oldest_open_publish_age'
LANGUAGE C VOLATILE;

-- ---------------------------------------------------------------------------
-- Catalog (seed 003: names and types kept exactly; additions documented in
-- docs/catalog.md)
-- ---------------------------------------------------------------------------

CREATE TABLE tide.tide_outbox_config (
	outbox_name			text PRIMARY KEY,
	retention_hours		int NOT NULL DEFAULT 24,
	inline_threshold	int NOT NULL DEFAULT 10000,
	enabled				boolean NOT NULL DEFAULT true,
	created_at			timestamptz NOT NULL DEFAULT now(),
	CONSTRAINT tide_outbox_config_retention_check CHECK (retention_hours > 0),
	CONSTRAINT tide_outbox_config_threshold_check CHECK (inline_threshold > 0)
);
COMMENT ON TABLE tide.tide_outbox_config IS 'One row per named outbox';

-- CACHE 1 matters: a per-backend cache would let a backend hold ids far
-- below the value a reader sees, and the safe horizon would not cover them.
CREATE SEQUENCE tide.tide_outbox_messages_id_seq CACHE 1;

-- outbox_name names a row of tide_outbox_config. A foreign key would lock
-- that row for every message published (concurrent publishers of one outbox
-- then share the lock through multixacts): outbox_publish and outbox_drop
-- keep the reference instead (see outbox_drop and src/outbox.c).
CREATE TABLE tide.tide_outbox_messages (
	id				bigint PRIMARY KEY DEFAULT tide._next_message_id(),
	outbox_name		text NOT NULL,
	payload			jsonb NOT NULL,
	headers			jsonb,
	created_at		timestamptz NOT NULL DEFAULT now(),
	consumed_at		timestamptz,
	consumer_group	text
);
ALTER SEQUENCE tide.tide_outbox_messages_id_seq OWNED BY tide.tide_outbox_messages.id;
COMMENT ON TABLE tide.tide_outbox_messages IS 'Shared message store for all outboxes';

CREATE INDEX idx_tide_outbox_messages_pending
	ON tide.tide_outbox_messages (outbox_name, id)
	WHERE consumed_at IS NULL;

CREATE TABLE tide.tide_consumer_groups (
	group_name			text PRIMARY KEY,
	outbox_name			text NOT NULL
		REFERENCES tide.tide_outbox_config (outbox_name) ON DELETE CASCADE,
	auto_offset_reset	text NOT NULL DEFAULT 'earliest',
	created_at			timestamptz NOT NULL DEFAULT now(),
	-- Highest message id ever handed out to a consumer of the group; NULL
	-- while a group created with 'none' has no position yet.
	leased_upto			bigint,
	CONSTRAINT tide_consumer_groups_reset_check
		CHECK (auto_offset_reset IN ('earliest', 'latest', 'none'))
);
CREATE INDEX tide_consumer_groups_outbox_idx ON tide.tide_consumer_groups (outbox_name);
COMMENT ON TABLE tide.tide_consumer_groups IS 'Named consumer groups with offset reset policy';

CREATE TABLE tide.tide_consumer_offsets (
	group_name			text NOT NULL
		REFERENCES tide.tide_consumer_groups (group_name) ON DELETE CASCADE,
	consumer_id			text NOT NULL,
	committed_offset	bigint NOT NULL DEFAULT 0,
	last_heartbeat		timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (group_name, consumer_id)
);
COMMENT ON TABLE tide.tide_consumer_offsets IS 'Per-consumer committed offsets and heartbeats';

CREATE TABLE tide.tide_consumer_leases (
	group_name		text NOT NULL,
	consumer_id		text NOT NULL,
	lease_start		bigint NOT NULL,
	lease_end		bigint NOT NULL,
	expires_at		timestamptz NOT NULL,
	PRIMARY KEY (group_name, consumer_id),
	FOREIGN KEY (group_name, consumer_id)
		REFERENCES tide.tide_consumer_offsets (group_name, consumer_id) ON DELETE CASCADE,
	CONSTRAINT tide_consumer_leases_range_check CHECK (lease_start <= lease_end)
);
COMMENT ON TABLE tide.tide_consumer_leases IS 'Visibility leases for in-flight message batches';

CREATE TABLE tide.tide_inbox_config (
	inbox_name					text PRIMARY KEY,
	inbox_schema				text NOT NULL DEFAULT 'tide',
	max_retries					int NOT NULL DEFAULT 3,
	processed_retention_hours	int NOT NULL DEFAULT 72,
	dlq_retention_hours			int NOT NULL DEFAULT 0,
	created_at					timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE tide.tide_inbox_config IS 'Named inbox configurations';

CREATE TABLE tide.relay_outbox_config (
	name		text PRIMARY KEY,
	enabled		boolean NOT NULL DEFAULT true,
	config		jsonb NOT NULL
);
COMMENT ON TABLE tide.relay_outbox_config IS 'Forward relay pipeline definitions (outbox to sink)';

CREATE TABLE tide.relay_inbox_config (
	name		text PRIMARY KEY,
	enabled		boolean NOT NULL DEFAULT true,
	config		jsonb NOT NULL
);
COMMENT ON TABLE tide.relay_inbox_config IS 'Reverse relay pipeline definitions (source to inbox)';

CREATE TABLE tide.relay_consumer_offsets (
	relay_group_id	text NOT NULL,
	pipeline_id		text NOT NULL,
	outbox_name		text NOT NULL,
	last_change_id	bigint NOT NULL DEFAULT 0,
	updated_at		timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (relay_group_id, pipeline_id, outbox_name)
);
COMMENT ON TABLE tide.relay_consumer_offsets IS 'Durable per-pipeline delivery offset';

-- A message whose delivery failed by its own answer waits here for its next
-- attempt (relay/worker.c), with a copy of the message, so the pipeline's
-- offset can move past it. pipeline_id is the pipeline's name.
CREATE TABLE tide.relay_retry_queue (
	pipeline_id			text NOT NULL,
	outbox_name			text NOT NULL,
	message_id			bigint NOT NULL,
	payload				jsonb NOT NULL,
	headers				jsonb,
	created_at			timestamptz NOT NULL,
	attempts			int NOT NULL,
	next_attempt_at		timestamptz NOT NULL,
	manual				boolean NOT NULL DEFAULT false,
	first_failed_at		timestamptz NOT NULL DEFAULT now(),
	last_status			int,
	last_error_class	text,
	last_error			text,
	PRIMARY KEY (pipeline_id, message_id)
);
CREATE INDEX relay_retry_queue_due ON tide.relay_retry_queue (pipeline_id, next_attempt_at);
COMMENT ON TABLE tide.relay_retry_queue
	IS 'Messages waiting for another delivery attempt, per pipeline';

-- A message that failed permanently or ran out of attempts, with a copy of
-- the message and the last failure.
CREATE TABLE tide.relay_dlq (
	id					bigserial PRIMARY KEY,
	pipeline_id			text NOT NULL,
	outbox_name			text NOT NULL,
	message_id			bigint NOT NULL,
	payload				jsonb NOT NULL,
	headers				jsonb,
	created_at			timestamptz NOT NULL,
	attempts			int NOT NULL,
	reason				text NOT NULL,
	last_status			int,
	last_error_class	text,
	last_error			text,
	first_failed_at		timestamptz NOT NULL,
	dead_lettered_at	timestamptz NOT NULL DEFAULT now(),
	CONSTRAINT relay_dlq_message_key UNIQUE (pipeline_id, message_id),
	CONSTRAINT relay_dlq_reason_check CHECK (reason IN ('permanent', 'exhausted'))
);
CREATE INDEX relay_dlq_dead_lettered_at ON tide.relay_dlq (dead_lettered_at);
COMMENT ON TABLE tide.relay_dlq
	IS 'Dead letters: messages a pipeline could not deliver, kept until retried or purged';

-- One row per delivery attempt, written by the relay worker in the
-- transaction that records the batch (relay/attempt_log.c), unless the
-- pipeline's config says "attempt_log": false. Rows older than
-- pg_tide.attempt_log_retention are deleted by the worker.
CREATE TABLE tide.relay_attempts (
	id					bigserial PRIMARY KEY,
	pipeline_id			text NOT NULL,
	outbox_name			text NOT NULL,
	message_id			bigint NOT NULL,
	attempt				int NOT NULL,
	manual				boolean NOT NULL DEFAULT false,
	status				text NOT NULL,
	response_code		int,
	error_class			text,
	error				text,
	latency_ms			real,
	response_snippet	text,
	attempted_at		timestamptz NOT NULL DEFAULT now(),
	CONSTRAINT relay_attempts_status_check CHECK (status IN ('success', 'failed'))
);
-- the attempts of a message; the failures of a pipeline; retention
CREATE INDEX relay_attempts_message ON tide.relay_attempts (pipeline_id, message_id);
CREATE INDEX relay_attempts_failures ON tide.relay_attempts (pipeline_id, attempted_at)
	WHERE status = 'failed';
CREATE INDEX relay_attempts_attempted_at ON tide.relay_attempts USING brin (attempted_at);
COMMENT ON TABLE tide.relay_attempts
	IS 'Delivery attempts: one row per request a pipeline made, with its outcome';

-- A pipeline's health as its relay worker last recorded it, in the
-- transaction that records each batch: failures in a row since the last
-- success, when each last happened, the last error.
CREATE TABLE tide.relay_pipeline_health (
	pipeline_id				text PRIMARY KEY,
	consecutive_failures	int NOT NULL DEFAULT 0,
	last_success_at			timestamptz,
	last_failure_at			timestamptz,
	last_status				int,
	last_error_class		text,
	last_error				text,
	breaker					text,
	filtered				bigint NOT NULL DEFAULT 0,
	updated_at				timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE tide.relay_pipeline_health
	IS 'Per pipeline: consecutive failed attempts, last success, last failure and its error';

-- Wakes the database's relay worker at commit, so that a changed pipeline
-- or a queued retry is acted on at once (relay/backend.c).
CREATE FUNCTION tide._relay_wake_worker()
RETURNS void
AS 'MODULE_PATHNAME', 'tide_relay_wake_worker'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION tide._relay_wake_worker()
	IS 'internal: wakes the relay worker at commit to look at its pipelines and retry queues';

-- A changed pipeline is announced on channel tide_relay_config, and the
-- relay worker acts on it at commit.
CREATE FUNCTION tide._relay_config_notify()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM pg_notify('tide_relay_config',
					  json_build_object('table', TG_TABLE_NAME,
										'op', TG_OP,
										'name', CASE WHEN TG_OP = 'DELETE' THEN OLD.name ELSE NEW.name END)::text);
	IF TG_TABLE_NAME = 'relay_outbox_config' THEN
		PERFORM tide._relay_wake_worker();
		IF TG_OP = 'UPDATE' AND OLD.enabled IS DISTINCT FROM NEW.enabled THEN
			PERFORM tide._relay_operator_event(
				CASE WHEN NEW.enabled THEN 'pipeline.enabled' ELSE 'pipeline.disabled' END,
				NEW.name,
				jsonb_build_object('consecutive_failures',
					(SELECT consecutive_failures FROM tide.relay_pipeline_health
					  WHERE pipeline_id = NEW.name)));
			-- Enabled again: the failures before do not count toward the threshold.
			IF NEW.enabled THEN
				UPDATE tide.relay_pipeline_health SET consecutive_failures = 0
				 WHERE pipeline_id = NEW.name;
			END IF;
		END IF;
	END IF;
	RETURN NULL;
END
$$;

CREATE TRIGGER relay_outbox_config_notify
	AFTER INSERT OR UPDATE OR DELETE ON tide.relay_outbox_config
	FOR EACH ROW EXECUTE FUNCTION tide._relay_config_notify();

CREATE TRIGGER relay_inbox_config_notify
	AFTER INSERT OR UPDATE OR DELETE ON tide.relay_inbox_config
	FOR EACH ROW EXECUTE FUNCTION tide._relay_config_notify();

-- User data survives pg_dump.
SELECT pg_catalog.pg_extension_config_dump('tide.tide_outbox_config', '');
SELECT pg_catalog.pg_extension_config_dump('tide.tide_outbox_messages', '');
SELECT pg_catalog.pg_extension_config_dump('tide.tide_outbox_messages_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('tide.tide_consumer_groups', '');
SELECT pg_catalog.pg_extension_config_dump('tide.tide_consumer_offsets', '');
SELECT pg_catalog.pg_extension_config_dump('tide.tide_consumer_leases', '');
SELECT pg_catalog.pg_extension_config_dump('tide.tide_inbox_config', '');
SELECT pg_catalog.pg_extension_config_dump('tide.relay_outbox_config', '');
SELECT pg_catalog.pg_extension_config_dump('tide.relay_inbox_config', '');
SELECT pg_catalog.pg_extension_config_dump('tide.relay_consumer_offsets', '');
SELECT pg_catalog.pg_extension_config_dump('tide.relay_retry_queue', '');
SELECT pg_catalog.pg_extension_config_dump('tide.relay_dlq', '');
SELECT pg_catalog.pg_extension_config_dump('tide.relay_dlq_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('tide.relay_attempts', '');
SELECT pg_catalog.pg_extension_config_dump('tide.relay_attempts_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('tide.relay_pipeline_health', '');

-- ---------------------------------------------------------------------------
-- Internal SQL helpers
-- ---------------------------------------------------------------------------

-- Refuses a name or id with a character other than ASCII letters, digits,
-- "_", "-", "." and ":"; p_what names it in the message. Names travel into
-- HTTP headers (webhook-id), logs and file names: nothing in them needs
-- quoting or escaping anywhere. The same rules as check_chars() in
-- src/names.c.
CREATE FUNCTION tide._check_chars(p_what text, p_value text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	bad text := substring(p_value FROM '[^A-Za-z0-9_.:-]');
BEGIN
	IF bad IS NOT NULL THEN
		RAISE EXCEPTION '%', CASE WHEN bad ~ '^[!-~]$' THEN format('%s must not contain "%s"', p_what, bad)
								  ELSE format('%s must not contain white space, control or non-ASCII characters', p_what) END
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Names and ids consist of ASCII letters, digits, "_", "-", "." and ":".';
	END IF;
END
$$;

-- Validates an outbox, consumer-group or pipeline name: not null, 1 to 63
-- bytes, the characters of tide._check_chars(). The same rules as
-- TideValidateName() in src/names.c.
CREATE FUNCTION tide._check_name(p_kind text, p_name text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	IF p_name IS NULL THEN
		RAISE EXCEPTION '% name must not be null', p_kind
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = format('Give the %s a name of 1 to 63 bytes.', p_kind);
	END IF;
	IF p_name = '' THEN
		RAISE EXCEPTION '% name must not be empty', p_kind
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = format('Give the %s a name of 1 to 63 bytes.', p_kind);
	END IF;
	IF octet_length(p_name) > 63 THEN
		RAISE EXCEPTION '% name "%" is too long', p_kind, p_name
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = format('Names have at most 63 bytes; this one has %s.',
								octet_length(p_name));
	END IF;
	PERFORM tide._check_chars(p_kind || ' name', p_name);
END
$$;

-- Refuses a NULL flag argument (p_if_exists and the like); p_name names it.
CREATE FUNCTION tide._check_flag(p_name text, p_value boolean)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	IF p_value IS NULL THEN
		RAISE EXCEPTION '% must not be null', p_name
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = format('Pass %s => true or false, or leave it out.', p_name);
	END IF;
END
$$;

-- Every message id up to a group's position has been acknowledged: the
-- position is the group's dispatch cursor, held back by its oldest lease.
CREATE FUNCTION tide._group_position(p_group text)
RETURNS bigint
LANGUAGE sql STABLE
AS $$
	SELECT least(g.leased_upto,
				 (SELECT min(l.lease_start) - 1
					FROM tide.tide_consumer_leases l
				   WHERE l.group_name = g.group_name))
	  FROM tide.tide_consumer_groups g
	 WHERE g.group_name = p_group
$$;

-- The lowest position among an outbox's positioned consumer groups: the
-- messages above it are unconsumed. 0 when no group has a position, so
-- that every message counts as unconsumed.
CREATE FUNCTION tide._outbox_low_water(p_outbox text)
RETURNS bigint
LANGUAGE sql STABLE
AS $$
	SELECT coalesce(min(tide._group_position(g.group_name)), 0)
	  FROM tide.tide_consumer_groups g
	 WHERE g.outbox_name = p_outbox
$$;

-- Fetches an outbox's config row or raises 42704.
CREATE FUNCTION tide._outbox_config(p_name text)
RETURNS tide.tide_outbox_config
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	cfg tide.tide_outbox_config;
BEGIN
	PERFORM tide._check_name('outbox', p_name);
	SELECT * INTO cfg FROM tide.tide_outbox_config WHERE outbox_name = p_name;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'outbox "%" does not exist', p_name
			USING ERRCODE = 'undefined_object',
				  HINT = 'Create it with tide.outbox_create().';
	END IF;
	RETURN cfg;
END
$$;

-- Locks a consumer group's row and returns it, or raises 42704. Every
-- function that reads or changes a group's leases takes this one lock, of
-- one strength, first: polls, commits and lease changes of a group run one
-- at a time, and a transaction that commits and then polls never has to
-- upgrade its lock (two such transactions would deadlock). FOR NO KEY
-- UPDATE leaves the key share locks of foreign key checks alone.
CREATE FUNCTION tide._lock_group(p_group text)
RETURNS tide.tide_consumer_groups
LANGUAGE plpgsql
AS $$
DECLARE
	g tide.tide_consumer_groups;
BEGIN
	PERFORM tide._check_name('consumer group', p_group);
	SELECT * INTO g FROM tide.tide_consumer_groups WHERE group_name = p_group FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'consumer group "%" does not exist', p_group
			USING ERRCODE = 'undefined_object',
				  HINT = 'Create it with tide.create_consumer_group().';
	END IF;
	RETURN g;
END
$$;

-- Validates a consumer id: the same rules as TideValidateConsumerId() in
-- src/names.c.
CREATE FUNCTION tide._check_consumer(p_consumer text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	IF p_consumer IS NULL THEN
		RAISE EXCEPTION 'consumer id must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Each consumer of a group identifies itself with a stable, non-empty id.';
	END IF;
	IF p_consumer = '' THEN
		RAISE EXCEPTION 'consumer id must not be empty'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Each consumer of a group identifies itself with a stable, non-empty id.';
	END IF;
	IF octet_length(p_consumer) > 255 THEN
		RAISE EXCEPTION 'consumer id is too long'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = format('Consumer ids have at most 255 bytes; this one has %s.',
								octet_length(p_consumer));
	END IF;
	PERFORM tide._check_chars('consumer id', p_consumer);
END
$$;

-- ---------------------------------------------------------------------------
-- Outboxes
-- ---------------------------------------------------------------------------

CREATE FUNCTION tide.outbox_create_if_not_exists(p_name text,
												 p_retention_hours int DEFAULT 24,
												 p_inline_threshold int DEFAULT 10000)
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
	IF p_inline_threshold IS NULL THEN
		RAISE EXCEPTION 'inline_threshold must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give the number of unconsumed messages at which publishing is refused, at least 1.';
	END IF;
	IF p_inline_threshold <= 0 THEN
		RAISE EXCEPTION 'inline_threshold must be positive'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give the number of unconsumed messages at which publishing is refused, at least 1.';
	END IF;
	INSERT INTO tide.tide_outbox_config (outbox_name, retention_hours, inline_threshold)
	VALUES (p_name, p_retention_hours, p_inline_threshold)
	ON CONFLICT (outbox_name) DO NOTHING;
	GET DIAGNOSTICS created = ROW_COUNT;
	RETURN created;
END
$$;
COMMENT ON FUNCTION tide.outbox_create_if_not_exists(text, int, int)
	IS 'creates an outbox unless it exists; returns whether it was created';

CREATE FUNCTION tide.outbox_create(p_name text,
								   p_retention_hours int DEFAULT 24,
								   p_inline_threshold int DEFAULT 10000)
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
$$;
COMMENT ON FUNCTION tide.outbox_create(text, int, int) IS 'creates a named outbox';

CREATE FUNCTION tide.outbox_drop(p_name text, p_if_exists boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._check_name('outbox', p_name);
	PERFORM tide._check_flag('p_if_exists', p_if_exists);
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
	-- Its consumer groups go with it (ON DELETE CASCADE), its messages here.
	DELETE FROM tide.tide_outbox_config WHERE outbox_name = p_name;
	IF FOUND THEN
		DELETE FROM tide.tide_outbox_messages WHERE outbox_name = p_name;
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
$$;
COMMENT ON FUNCTION tide.outbox_drop(text, boolean)
	IS 'drops an outbox with its messages and consumer groups';

CREATE FUNCTION tide._outbox_set_enabled(p_name text, p_enabled boolean)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._outbox_config(p_name);
	UPDATE tide.tide_outbox_config SET enabled = p_enabled
	 WHERE outbox_name = p_name AND enabled IS DISTINCT FROM p_enabled;
END
$$;

CREATE FUNCTION tide.outbox_enable(p_name text)
RETURNS void
LANGUAGE sql
BEGIN ATOMIC
	SELECT tide._outbox_set_enabled(p_name, true);
END;
COMMENT ON FUNCTION tide.outbox_enable(text) IS 'allows publishing to an outbox again';

CREATE FUNCTION tide.outbox_disable(p_name text)
RETURNS void
LANGUAGE sql
BEGIN ATOMIC
	SELECT tide._outbox_set_enabled(p_name, false);
END;
COMMENT ON FUNCTION tide.outbox_disable(text)
	IS 'refuses further publishing to an outbox; consumers keep reading';

CREATE FUNCTION tide.outbox_publish(p_name text, p_payload jsonb, p_headers jsonb DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'tide_outbox_publish'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION tide.outbox_publish(text, jsonb, jsonb)
	IS 'publishes one message inside the caller''s transaction; returns its id';

CREATE FUNCTION tide.outbox_publish_batch(p_name text, p_payloads jsonb[], p_headers jsonb DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'tide_outbox_publish_batch'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION tide.outbox_publish_batch(text, jsonb[], jsonb)
	IS 'publishes many messages in array order inside the caller''s transaction; returns how many';

CREATE FUNCTION tide.outbox_status(p_name text)
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
$$;
COMMENT ON FUNCTION tide.outbox_status(text)
	IS 'pending count and age, newest id, consumer groups with position and lag, oldest open publishing transaction';

-- ---------------------------------------------------------------------------
-- Consumer groups
-- ---------------------------------------------------------------------------

CREATE FUNCTION tide.create_consumer_group(p_name text, p_outbox text,
										   p_auto_offset_reset text DEFAULT 'earliest',
										   p_if_not_exists boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	start_at bigint;
	pipeline tide.relay_outbox_config;
BEGIN
	PERFORM tide._check_name('consumer group', p_name);
	PERFORM tide._outbox_config(p_outbox);
	IF p_auto_offset_reset IS NULL THEN
		RAISE EXCEPTION 'auto_offset_reset must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Use ''earliest'', ''latest'' or ''none''.';
	END IF;
	PERFORM tide._check_flag('p_if_not_exists', p_if_not_exists);
	IF p_auto_offset_reset NOT IN ('earliest', 'latest', 'none') THEN
		RAISE EXCEPTION 'invalid auto_offset_reset "%"', p_auto_offset_reset
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Use ''earliest'', ''latest'' or ''none''.';
	END IF;
	IF EXISTS (SELECT 1 FROM tide.tide_consumer_groups WHERE group_name = p_name) THEN
		IF p_if_not_exists THEN
			RAISE NOTICE 'consumer group "%" already exists, skipping', p_name;
			RETURN;
		END IF;
		RAISE EXCEPTION 'consumer group "%" already exists', p_name
			USING ERRCODE = 'duplicate_object',
				  HINT = 'Pass p_if_not_exists => true to accept an existing group.';
	END IF;
	-- A pipeline that names the group (it was dropped) would read it: only
	-- for the pipeline's own outbox, and it stays the relay's group
	-- (src/outbox_rights.c).
	SELECT * INTO pipeline FROM tide.relay_outbox_config c
	 WHERE c.config ->> 'consumer_group' = p_name
	   AND c.config ->> 'outbox' IS DISTINCT FROM p_outbox
	 ORDER BY c.name LIMIT 1;
	IF FOUND THEN
		RAISE EXCEPTION 'consumer group "%" is the group of pipeline "%", which reads outbox "%"',
						p_name, pipeline.name, pipeline.config ->> 'outbox'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = format('Name another group, or create it for outbox "%s".', pipeline.config ->> 'outbox');
	END IF;
	-- 'latest' starts at the safe horizon: every message whose transaction
	-- commits after this moment has an id above it.
	start_at := CASE p_auto_offset_reset
					WHEN 'earliest' THEN 0
					WHEN 'latest' THEN tide._safe_horizon()
				END;
	INSERT INTO tide.tide_consumer_groups (group_name, outbox_name, auto_offset_reset, leased_upto)
	VALUES (p_name, p_outbox, p_auto_offset_reset, start_at);
END
$$;
COMMENT ON FUNCTION tide.create_consumer_group(text, text, text, boolean)
	IS 'creates a consumer group that reads every message of an outbox';

CREATE FUNCTION tide.drop_consumer_group(p_name text, p_if_exists boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._check_name('consumer group', p_name);
	PERFORM tide._check_flag('p_if_exists', p_if_exists);
	DELETE FROM tide.tide_consumer_groups WHERE group_name = p_name;
	IF NOT FOUND THEN
		IF p_if_exists THEN
			RAISE NOTICE 'consumer group "%" does not exist, skipping', p_name;
		ELSE
			RAISE EXCEPTION 'consumer group "%" does not exist', p_name
				USING ERRCODE = 'undefined_object',
					  HINT = 'Pass p_if_exists => true to ignore a missing group.';
		END IF;
	END IF;
END
$$;
COMMENT ON FUNCTION tide.drop_consumer_group(text, boolean)
	IS 'drops a consumer group with its offsets and leases';

CREATE FUNCTION tide.poll_outbox(p_group text, p_consumer text,
								 p_batch_size int DEFAULT 100,
								 p_visibility_seconds int DEFAULT 30)
RETURNS TABLE (id bigint, payload jsonb, headers jsonb, created_at timestamptz)
AS 'MODULE_PATHNAME', 'tide_poll_outbox'
LANGUAGE C VOLATILE ROWS 100;
COMMENT ON FUNCTION tide.poll_outbox(text, text, int, int)
	IS 'leases the next batch of committed messages to a consumer of a group';

CREATE FUNCTION tide.wait_for_messages(p_group text, p_timeout_ms int DEFAULT 10000)
RETURNS boolean
AS 'MODULE_PATHNAME', 'tide_wait_for_messages'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION tide.wait_for_messages(text, int)
	IS 'waits until the group has messages to poll (woken at commit); false on timeout';

-- The consumer API runs as its caller: the C function checks the caller's
-- right to consume from the group (src/outbox_rights.c), then runs the
-- internal function of the same name as the catalog's owner.
CREATE FUNCTION tide.commit_offset(p_group text, p_consumer text, p_last_offset bigint)
RETURNS void
AS 'MODULE_PATHNAME', 'tide_commit_offset'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION tide.commit_offset(text, text, bigint)
	IS 'acknowledges a consumer''s lease up to and including a message id';

CREATE FUNCTION tide._commit_offset(p_group text, p_consumer text, p_last_offset bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	lease tide.tide_consumer_leases;
	has_lease boolean;
	committed bigint;
BEGIN
	-- The group lock orders this with polls, which hand expired leases to
	-- other consumers.
	PERFORM tide._lock_group(p_group);
	PERFORM tide._check_consumer(p_consumer);
	IF p_last_offset IS NULL THEN
		RAISE EXCEPTION 'offset must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Pass the id of the last message you processed.';
	END IF;

	SELECT o.committed_offset INTO committed
	  FROM tide.tide_consumer_offsets o
	 WHERE o.group_name = p_group AND o.consumer_id = p_consumer
	   FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'consumer "%" is not known in group "%"', p_consumer, p_group
			USING ERRCODE = 'undefined_object',
				  HINT = 'A consumer joins its group with its first tide.poll_outbox().';
	END IF;

	SELECT * INTO lease FROM tide.tide_consumer_leases l
	 WHERE l.group_name = p_group AND l.consumer_id = p_consumer;
	has_lease := FOUND;

	-- Committing the offset this consumer committed last is a harmless retry.
	IF p_last_offset = committed AND (NOT has_lease OR p_last_offset < lease.lease_start) THEN
		UPDATE tide.tide_consumer_offsets SET last_heartbeat = now()
		 WHERE group_name = p_group AND consumer_id = p_consumer;
		RETURN;
	END IF;

	IF NOT has_lease THEN
		IF p_last_offset < committed THEN
			RAISE EXCEPTION 'offset % is behind the committed offset % of consumer "%"',
							p_last_offset, committed, p_consumer
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'Offsets only move forward; an operator can use tide.admin_rewind_offset().';
		END IF;
		RAISE EXCEPTION 'consumer "%" holds no lease in group "%"', p_consumer, p_group
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'The lease expired and was handed to another consumer, or was released; poll again.';
	END IF;

	IF p_last_offset < lease.lease_start THEN
		RAISE EXCEPTION 'offset % is behind the lease of consumer "%", which starts at %',
						p_last_offset, p_consumer, lease.lease_start
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Offsets only move forward; what lies before the lease was acknowledged, '
					  'or handed to another consumer when the lease expired.';
	END IF;
	IF p_last_offset > lease.lease_end THEN
		RAISE EXCEPTION 'offset % is beyond the lease of consumer "%", which ends at %',
						p_last_offset, p_consumer, lease.lease_end
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Commit the id of the last message tide.poll_outbox() returned to you.';
	END IF;

	IF p_last_offset = lease.lease_end THEN
		DELETE FROM tide.tide_consumer_leases
		 WHERE group_name = p_group AND consumer_id = p_consumer;
	ELSE
		UPDATE tide.tide_consumer_leases SET lease_start = p_last_offset + 1
		 WHERE group_name = p_group AND consumer_id = p_consumer;
	END IF;
	UPDATE tide.tide_consumer_offsets
	   SET committed_offset = p_last_offset,
		   last_heartbeat = now()
	 WHERE group_name = p_group AND consumer_id = p_consumer;
END
$$;

-- Fetches a consumer's lease for update, or raises 55000.
CREATE FUNCTION tide._own_lease(p_group text, p_consumer text)
RETURNS tide.tide_consumer_leases
LANGUAGE plpgsql
AS $$
DECLARE
	lease tide.tide_consumer_leases;
BEGIN
	PERFORM tide._lock_group(p_group);
	PERFORM tide._check_consumer(p_consumer);
	SELECT * INTO lease FROM tide.tide_consumer_leases l
	 WHERE l.group_name = p_group AND l.consumer_id = p_consumer
	   FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'consumer "%" holds no lease in group "%"', p_consumer, p_group
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'Poll first with tide.poll_outbox().';
	END IF;
	RETURN lease;
END
$$;

CREATE FUNCTION tide.consumer_heartbeat(p_group text, p_consumer text)
RETURNS void
AS 'MODULE_PATHNAME', 'tide_consumer_heartbeat'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION tide.consumer_heartbeat(text, text) IS 'records that a consumer is alive';

CREATE FUNCTION tide._consumer_heartbeat(p_group text, p_consumer text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	-- Touches only the consumer's own row: no group lock, so heartbeats
	-- never wait for polls.
	PERFORM tide._check_name('consumer group', p_group);
	PERFORM tide._check_consumer(p_consumer);
	UPDATE tide.tide_consumer_offsets SET last_heartbeat = now()
	 WHERE group_name = p_group AND consumer_id = p_consumer;
	IF NOT FOUND THEN
		IF NOT EXISTS (SELECT 1 FROM tide.tide_consumer_groups WHERE group_name = p_group) THEN
			RAISE EXCEPTION 'consumer group "%" does not exist', p_group
				USING ERRCODE = 'undefined_object',
					  HINT = 'Create it with tide.create_consumer_group().';
		END IF;
		RAISE EXCEPTION 'consumer "%" is not known in group "%"', p_consumer, p_group
			USING ERRCODE = 'undefined_object',
				  HINT = 'A consumer joins its group with its first tide.poll_outbox().';
	END IF;
END
$$;

CREATE FUNCTION tide.extend_lease(p_group text, p_consumer text, p_seconds int)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'tide_extend_lease'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION tide.extend_lease(text, text, int)
	IS 'keeps a consumer''s lease for p_seconds from now; returns the new expiry';

CREATE FUNCTION tide._extend_lease(p_group text, p_consumer text, p_seconds int)
RETURNS timestamptz
LANGUAGE plpgsql
AS $$
DECLARE
	lease tide.tide_consumer_leases;
BEGIN
	lease := tide._own_lease(p_group, p_consumer);
	IF p_seconds IS NULL THEN
		RAISE EXCEPTION 'lease extension must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give the number of seconds from now the lease should last, from 1 to 86400.';
	END IF;
	IF p_seconds <= 0 THEN
		RAISE EXCEPTION 'lease extension must be positive'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give the number of seconds from now the lease should last, at least 1.';
	END IF;
	-- As for poll_outbox: a consumer that died holds a lease no longer than a day.
	IF p_seconds > 86400 THEN
		RAISE EXCEPTION 'lease extension must be at most 86400 seconds, not %', p_seconds
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Extend the lease again later; a lease lasts at most a day from now.';
	END IF;
	UPDATE tide.tide_consumer_leases
	   SET expires_at = clock_timestamp() + make_interval(secs => p_seconds)
	 WHERE group_name = p_group AND consumer_id = p_consumer
	RETURNING expires_at INTO lease.expires_at;
	UPDATE tide.tide_consumer_offsets SET last_heartbeat = now()
	 WHERE group_name = p_group AND consumer_id = p_consumer;
	RETURN lease.expires_at;
END
$$;

CREATE FUNCTION tide.release_lease(p_group text, p_consumer text)
RETURNS void
AS 'MODULE_PATHNAME', 'tide_release_lease'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION tide.release_lease(text, text)
	IS 'gives a consumer''s leased messages back to the group at once';

CREATE FUNCTION tide._release_lease(p_group text, p_consumer text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._own_lease(p_group, p_consumer);
	-- Expired, not deleted: the range stays unacknowledged and the next
	-- poll of any consumer of the group takes it first.
	UPDATE tide.tide_consumer_leases SET expires_at = '-infinity'
	 WHERE group_name = p_group AND consumer_id = p_consumer;
END
$$;

CREATE FUNCTION tide.admin_rewind_offset(p_group text, p_consumer text,
										 p_target_offset bigint,
										 p_confirm boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	horizon bigint;
BEGIN
	PERFORM tide._lock_group(p_group);
	PERFORM tide._check_consumer(p_consumer);
	IF p_target_offset IS NULL THEN
		RAISE EXCEPTION 'target offset must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give 0 or a message id; 0 re-reads the outbox from its first message.';
	END IF;
	PERFORM tide._check_flag('p_confirm', p_confirm);
	IF p_target_offset < 0 THEN
		RAISE EXCEPTION 'target offset must be zero or a message id'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = '0 re-reads the outbox from its first message.';
	END IF;
	-- Beyond the safe horizon are ids whose transactions may still commit:
	-- moving past them would skip messages nobody has seen.
	horizon := tide._safe_horizon();
	IF p_target_offset > horizon THEN
		RAISE EXCEPTION 'target offset % is beyond the safe horizon %', p_target_offset, horizon
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Ids above the safe horizon have not been handed out or belong to transactions that are still open.';
	END IF;
	IF NOT p_confirm THEN
		RAISE EXCEPTION 'moving the offset of group "%" needs confirmation', p_group
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = 'Messages after the target are delivered again; messages up to it are skipped.',
				  HINT = 'Call it again with p_confirm => true.';
	END IF;
	-- Every outstanding lease is void: the group reads on from the target.
	DELETE FROM tide.tide_consumer_leases WHERE group_name = p_group;
	UPDATE tide.tide_consumer_groups SET leased_upto = p_target_offset
	 WHERE group_name = p_group;
	INSERT INTO tide.tide_consumer_offsets (group_name, consumer_id, committed_offset)
	VALUES (p_group, p_consumer, p_target_offset)
	ON CONFLICT (group_name, consumer_id)
	DO UPDATE SET committed_offset = EXCLUDED.committed_offset, last_heartbeat = now();
	RAISE NOTICE 'consumer group "%" now reads after message id %', p_group, p_target_offset;
END
$$;
COMMENT ON FUNCTION tide.admin_rewind_offset(text, text, bigint, boolean)
	IS 'operator: sets a group''s position (also the first position of an ''none'' group)';

CREATE VIEW tide.consumer_lag AS
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
		 WHERE l.group_name = g.group_name AND l.expires_at > clock_timestamp()) AS active_leases
  FROM tide.tide_consumer_groups g,
	   LATERAL (SELECT tide._group_position(g.group_name) AS position) p;
COMMENT ON VIEW tide.consumer_lag
	IS 'per consumer group: committed position, newest message id, messages still to read';

-- ---------------------------------------------------------------------------
-- Inboxes. Each inbox has its own table "<inbox_schema>"."<inbox_name>_inbox"
-- (see docs/inbox.md). Names go into SQL only through format('%I'); values
-- only as parameters of EXECUTE ... USING.
-- ---------------------------------------------------------------------------

-- Additions to tide_inbox_config: the values inbox_create accepts.
ALTER TABLE tide.tide_inbox_config
	ADD CONSTRAINT tide_inbox_config_max_retries_check CHECK (max_retries > 0),
	ADD CONSTRAINT tide_inbox_config_processed_retention_check CHECK (processed_retention_hours >= 0),
	ADD CONSTRAINT tide_inbox_config_dlq_retention_check CHECK (dlq_retention_hours >= 0);

-- Validates an inbox name: not null, non-empty, short enough that its
-- table name "<name>_inbox" fits in 63 bytes, the characters of
-- tide._check_chars().
CREATE FUNCTION tide._check_inbox_name(p_name text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	IF p_name IS NULL THEN
		RAISE EXCEPTION 'inbox name must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give the inbox a name of 1 to 57 bytes.';
	END IF;
	IF p_name = '' THEN
		RAISE EXCEPTION 'inbox name must not be empty'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give the inbox a name of 1 to 57 bytes.';
	END IF;
	IF octet_length(p_name) > 57 THEN
		RAISE EXCEPTION 'inbox name "%" is too long', p_name
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = format('Inbox names have at most 57 bytes, so that the table name '
								'"<name>_inbox" fits in 63; this one has %s.',
								octet_length(p_name));
	END IF;
	PERFORM tide._check_chars('inbox name', p_name);
END
$$;

-- Fetches an inbox's config row or raises 42704.
CREATE FUNCTION tide._inbox_config(p_name text)
RETURNS tide.tide_inbox_config
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	cfg tide.tide_inbox_config;
BEGIN
	PERFORM tide._check_inbox_name(p_name);
	SELECT * INTO cfg FROM tide.tide_inbox_config WHERE inbox_name = p_name;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'inbox "%" does not exist', p_name
			USING ERRCODE = 'undefined_object',
				  HINT = 'Create it with tide.inbox_create().';
	END IF;
	RETURN cfg;
END
$$;

-- The inbox's table, quoted and schema-qualified, for format('%s').
CREATE FUNCTION tide._inbox_table(p_cfg tide.tide_inbox_config)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
	SELECT format('%I.%I', p_cfg.inbox_schema, p_cfg.inbox_name || '_inbox')
$$;

-- Validates an event id: not null, 1 to 255 bytes, no control characters.
-- Ids come from senders, so anything else is taken as it is (they are
-- values, never part of SQL text).
CREATE FUNCTION tide._check_event_id(p_event_id text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	IF p_event_id IS NULL THEN
		RAISE EXCEPTION 'event id must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Every event needs the stable id its sender gave it: duplicates are recognised by it.';
	END IF;
	IF p_event_id = '' THEN
		RAISE EXCEPTION 'event id must not be empty'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Every event needs the stable id its sender gave it: duplicates are recognised by it.';
	END IF;
	IF octet_length(p_event_id) > 255 THEN
		RAISE EXCEPTION 'event id is too long'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = format('Event ids have at most 255 bytes; this one has %s.', octet_length(p_event_id));
	END IF;
	IF p_event_id ~ '[[:cntrl:]]' THEN
		RAISE EXCEPTION 'event id must not contain control characters'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give the id its sender gave the event, without line breaks or other control characters.';
	END IF;
END
$$;

-- Raises 54000 when a payload exceeds pg_tide.max_payload_bytes (p_index:
-- its place in a batch, or NULL); src/limits.c.
CREATE FUNCTION tide._check_payload(p_payload jsonb, p_index int)
RETURNS void
AS 'MODULE_PATHNAME', 'tide_check_payload'
LANGUAGE C STABLE;

-- Refuses a lease or claim duration outside 1 second to a day.
CREATE FUNCTION tide._check_visibility(p_seconds int)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	IF p_seconds IS NULL THEN
		RAISE EXCEPTION 'visibility must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give the seconds a claim lasts before others may claim the messages again, from 1 to 86400.';
	END IF;
	IF p_seconds < 1 OR p_seconds > 86400 THEN
		RAISE EXCEPTION 'visibility must be between 1 and 86400 seconds'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give the seconds a claim lasts before others may claim the messages again.';
	END IF;
END
$$;

-- Refuses a retention in hours that is NULL, negative or above ten years
-- (0 keeps the rows); p_what names it.
CREATE FUNCTION tide._check_retention_hours(p_what text, p_hours int, p_hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	IF p_hours IS NULL THEN
		RAISE EXCEPTION '% must not be null', p_what
			USING ERRCODE = 'null_value_not_allowed', HINT = p_hint;
	END IF;
	IF p_hours < 0 THEN
		RAISE EXCEPTION '% must not be negative', p_what
			USING ERRCODE = 'invalid_parameter_value', HINT = p_hint;
	END IF;
	IF p_hours > 87600 THEN
		RAISE EXCEPTION '% must be at most 87600, not %', p_what, p_hours
			USING ERRCODE = 'invalid_parameter_value', HINT = p_hint || ' At most 87600 (ten years).';
	END IF;
END
$$;

CREATE FUNCTION tide._check_batch_size(p_batch_size int)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	IF p_batch_size IS NULL THEN
		RAISE EXCEPTION 'batch size must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give the largest number of messages to take at once, from 1 to 10000.';
	END IF;
	IF p_batch_size < 1 OR p_batch_size > 10000 THEN
		RAISE EXCEPTION 'batch size must be between 1 and 10000'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give the largest number of messages to take at once.';
	END IF;
END
$$;

CREATE FUNCTION tide.inbox_create(p_name text,
								  p_schema text DEFAULT 'tide',
								  p_max_retries int DEFAULT 3,
								  p_processed_retention_hours int DEFAULT 72,
								  p_dlq_retention_hours int DEFAULT 0)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	nsp oid;
	tbl text := p_name || '_inbox';
BEGIN
	PERFORM tide._check_inbox_name(p_name);
	IF p_schema IS NULL THEN
		RAISE EXCEPTION 'inbox schema must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Name an existing schema, or leave the default tide.';
	END IF;
	IF p_schema = '' THEN
		RAISE EXCEPTION 'inbox schema must not be empty'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Name an existing schema, or leave the default tide.';
	END IF;
	IF p_max_retries IS NULL THEN
		RAISE EXCEPTION 'max_retries must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give the number of failures after which a message is dead-lettered, at least 1.';
	END IF;
	IF p_max_retries <= 0 THEN
		RAISE EXCEPTION 'max_retries must be positive'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give the number of failures after which a message is dead-lettered, at least 1.';
	END IF;
	PERFORM tide._check_retention_hours('processed_retention_hours', p_processed_retention_hours,
		'Give the hours processed messages are kept to recognise duplicates; 0 keeps them.');
	PERFORM tide._check_retention_hours('dlq_retention_hours', p_dlq_retention_hours,
		'Give the hours dead-lettered messages are kept; 0 keeps them.');
	nsp := to_regnamespace(quote_ident(p_schema));
	IF nsp IS NULL THEN
		RAISE EXCEPTION 'schema "%" does not exist', p_schema
			USING ERRCODE = 'invalid_schema_name',
				  HINT = 'Create the schema first, or leave the default tide.';
	END IF;
	IF NOT has_schema_privilege(nsp, 'CREATE') THEN
		RAISE EXCEPTION 'permission denied to create inbox "%" in schema "%"', p_name, p_schema
			USING ERRCODE = 'insufficient_privilege',
				  HINT = 'The inbox''s table is created in that schema: ask its owner for CREATE on it, or use a schema you may create tables in.';
	END IF;
	-- The primary key makes a concurrent create of the same name wait and
	-- then find this row.
	INSERT INTO tide.tide_inbox_config (inbox_name, inbox_schema, max_retries,
										processed_retention_hours, dlq_retention_hours)
	VALUES (p_name, p_schema, p_max_retries, p_processed_retention_hours, p_dlq_retention_hours)
	ON CONFLICT (inbox_name) DO NOTHING;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'inbox "%" already exists', p_name
			USING ERRCODE = 'duplicate_object',
				  HINT = 'Choose another name, or drop the inbox first with tide.inbox_drop().';
	END IF;
	IF to_regclass(format('%I.%I', p_schema, tbl)) IS NOT NULL THEN
		RAISE EXCEPTION 'relation "%" already exists in schema "%"', tbl, p_schema
			USING ERRCODE = 'duplicate_table',
				  HINT = 'The inbox''s table needs that name: choose another inbox name or schema.';
	END IF;
	-- id orders messages by arrival (received_at is the receiving
	-- transaction's start, the same for a whole batch). A message is
	-- pending while processed_at and dead_lettered_at are NULL, and claimed
	-- while claimed_until is in the future.
	EXECUTE format($sql$
		CREATE TABLE %I.%I (
			id					bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			event_id			text NOT NULL UNIQUE,
			source				text,
			payload				jsonb NOT NULL,
			headers				jsonb,
			received_at			timestamptz NOT NULL DEFAULT now(),
			processed_at		timestamptz,
			retry_count			int NOT NULL DEFAULT 0,
			last_error			text,
			claimed_until		timestamptz,
			dead_lettered_at	timestamptz
		)$sql$, p_schema, tbl);
	EXECUTE format('CREATE INDEX ON %I.%I (id) WHERE processed_at IS NULL AND dead_lettered_at IS NULL',
				   p_schema, tbl);
	EXECUTE format('COMMENT ON TABLE %I.%I IS %L', p_schema, tbl,
				   format('pg_tide inbox %s', p_name));
	-- The inbox functions run as their caller (docs/security.md).
	EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I.%I TO tide_admin, tide_consumer',
				   p_schema, tbl);
	EXECUTE format('GRANT SELECT ON %I.%I TO tide_reader', p_schema, tbl);
END
$$;
COMMENT ON FUNCTION tide.inbox_create(text, text, int, int, int)
	IS 'creates a named inbox with its table "<schema>"."<name>_inbox"';

CREATE FUNCTION tide.inbox_drop(p_name text, p_if_exists boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	cfg tide.tide_inbox_config;
	det text;
BEGIN
	PERFORM tide._check_inbox_name(p_name);
	PERFORM tide._check_flag('p_if_exists', p_if_exists);
	DELETE FROM tide.tide_inbox_config WHERE inbox_name = p_name RETURNING * INTO cfg;
	IF NOT FOUND THEN
		IF p_if_exists THEN
			RAISE NOTICE 'inbox "%" does not exist, skipping', p_name;
			RETURN;
		END IF;
		RAISE EXCEPTION 'inbox "%" does not exist', p_name
			USING ERRCODE = 'undefined_object',
				  HINT = 'Pass p_if_exists => true to ignore a missing inbox.';
	END IF;
	-- Never CASCADE: that would drop the application's handler functions,
	-- which take the table's row type.
	BEGIN
		EXECUTE format('DROP TABLE IF EXISTS %s', tide._inbox_table(cfg));
	EXCEPTION WHEN dependent_objects_still_exist THEN
		GET STACKED DIAGNOSTICS det = PG_EXCEPTION_DETAIL;
		RAISE EXCEPTION 'cannot drop inbox "%" because other objects depend on its table', p_name
			USING ERRCODE = 'dependent_objects_still_exist',
				  DETAIL = det,
				  HINT = 'Drop those objects first, for example handler functions that take the inbox''s row type.';
	END;
END
$$;
COMMENT ON FUNCTION tide.inbox_drop(text, boolean) IS 'drops an inbox with its table and messages';

CREATE FUNCTION tide.inbox_receive(p_name text, p_event_id text, p_payload jsonb,
								   p_headers jsonb DEFAULT NULL, p_source text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
	cfg tide.tide_inbox_config;
	n bigint;
BEGIN
	cfg := tide._inbox_config(p_name);
	PERFORM tide._check_event_id(p_event_id);
	IF p_payload IS NULL THEN
		RAISE EXCEPTION 'payload must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Pass the event''s body as a JSON value.';
	END IF;
	PERFORM tide._check_payload(p_payload, NULL);
	IF p_headers IS NOT NULL AND jsonb_typeof(p_headers) <> 'object' THEN
		RAISE EXCEPTION 'headers must be a JSON object'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Pass headers as a JSON object, or NULL.';
	END IF;
	-- A concurrent receive of the same id waits on the unique index for
	-- this transaction, then inserts nothing (or inserts, if it aborted).
	EXECUTE format('INSERT INTO %s (event_id, source, payload, headers) VALUES ($1, $2, $3, $4) '
				   'ON CONFLICT (event_id) DO NOTHING', tide._inbox_table(cfg))
		USING p_event_id, p_source, p_payload, p_headers;
	GET DIAGNOSTICS n = ROW_COUNT;
	RETURN n > 0;
END
$$;
COMMENT ON FUNCTION tide.inbox_receive(text, text, jsonb, jsonb, text)
	IS 'stores an event unless its event id is known; returns true when it was new';

CREATE FUNCTION tide.inbox_receive_batch(p_name text, p_events jsonb)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
	cfg tide.tide_inbox_config;
	ev jsonb;
	i int := 0;
	n bigint;
BEGIN
	cfg := tide._inbox_config(p_name);
	IF p_events IS NULL THEN
		RAISE EXCEPTION 'events must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Pass a JSON array of objects with keys event_id, payload, and optionally headers and source.';
	END IF;
	IF jsonb_typeof(p_events) <> 'array' THEN
		RAISE EXCEPTION 'events must be a JSON array'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Pass a JSON array of objects with keys event_id, payload, and optionally headers and source.';
	END IF;
	IF jsonb_array_length(p_events) > 10000 THEN
		RAISE EXCEPTION 'cannot receive more than 10000 events in one batch'
			USING ERRCODE = 'program_limit_exceeded',
				  DETAIL = format('The array has %s elements.', jsonb_array_length(p_events)),
				  HINT = 'Split the array into batches of at most 10000; they may share one transaction.';
	END IF;
	-- Every element is checked before anything is written.
	FOR ev IN SELECT e FROM jsonb_array_elements(p_events) e LOOP
		i := i + 1;
		IF jsonb_typeof(ev) <> 'object' THEN
			RAISE EXCEPTION 'event % must be a JSON object', i
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'Each element is an object with keys event_id, payload, and optionally headers and source.';
		END IF;
		IF jsonb_typeof(ev->'event_id') IS DISTINCT FROM 'string' OR ev->>'event_id' = '' THEN
			RAISE EXCEPTION 'event % has no event_id', i
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'Give each event its id as a non-empty JSON string under key event_id.';
		END IF;
		IF octet_length(ev->>'event_id') > 255 OR (ev->>'event_id') ~ '[[:cntrl:]]' THEN
			RAISE EXCEPTION 'event_id of event % is too long or has control characters', i
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'Event ids have at most 255 bytes and no line breaks or other control characters.';
		END IF;
		IF NOT ev ? 'payload' OR jsonb_typeof(ev->'payload') = 'null' THEN
			RAISE EXCEPTION 'event % has no payload', i
				USING ERRCODE = 'null_value_not_allowed',
					  HINT = 'Give each event its body under key payload.';
		END IF;
		PERFORM tide._check_payload(ev->'payload', i);
		IF coalesce(jsonb_typeof(ev->'headers'), 'null') NOT IN ('object', 'null') THEN
			RAISE EXCEPTION 'headers of event % must be a JSON object', i
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'Pass headers as a JSON object, or leave the key out.';
		END IF;
		IF coalesce(jsonb_typeof(ev->'source'), 'null') NOT IN ('string', 'null') THEN
			RAISE EXCEPTION 'source of event % must be a JSON string', i
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'Pass the source as a JSON string, or leave the key out.';
		END IF;
	END LOOP;
	-- In array order; an id repeated within the batch is stored once, the
	-- first time.
	EXECUTE format($sql$
		INSERT INTO %s (event_id, source, payload, headers)
		SELECT e->>'event_id', e->>'source', e->'payload',
			   CASE WHEN jsonb_typeof(e->'headers') = 'object' THEN e->'headers' END
		  FROM jsonb_array_elements($1) WITH ORDINALITY AS a(e, ord)
		 ORDER BY ord
		ON CONFLICT (event_id) DO NOTHING$sql$, tide._inbox_table(cfg))
		USING p_events;
	GET DIAGNOSTICS n = ROW_COUNT;
	RETURN n;
END
$$;
COMMENT ON FUNCTION tide.inbox_receive_batch(text, jsonb)
	IS 'stores many events (a JSON array of {event_id, payload, headers, source}); returns how many were new';

CREATE FUNCTION tide.inbox_claim(p_name text, p_batch_size int DEFAULT 100,
								 p_visibility_seconds int DEFAULT 30)
RETURNS TABLE (event_id text, source text, payload jsonb, headers jsonb,
			   received_at timestamptz, retry_count int, claimed_until timestamptz)
LANGUAGE plpgsql
ROWS 100
AS $$
DECLARE
	cfg tide.tide_inbox_config;
BEGIN
	cfg := tide._inbox_config(p_name);
	PERFORM tide._check_batch_size(p_batch_size);
	PERFORM tide._check_visibility(p_visibility_seconds);
	-- SKIP LOCKED: rows another transaction is claiming or processing are
	-- passed over, never waited for. A claim that committed is seen through
	-- claimed_until (rechecked on the newest row version when locking).
	RETURN QUERY EXECUTE format($sql$
		WITH c AS (
			SELECT t.id FROM %1$s t
			 WHERE t.processed_at IS NULL AND t.dead_lettered_at IS NULL
			   AND (t.claimed_until IS NULL OR t.claimed_until <= clock_timestamp())
			 ORDER BY t.id
			 LIMIT $1
			   FOR UPDATE SKIP LOCKED),
		u AS (
			UPDATE %1$s t SET claimed_until = clock_timestamp() + make_interval(secs => $2)
			  FROM c WHERE t.id = c.id
			RETURNING t.id, t.event_id, t.source, t.payload, t.headers, t.received_at,
					  t.retry_count, t.claimed_until)
		SELECT u.event_id, u.source, u.payload, u.headers, u.received_at, u.retry_count,
			   u.claimed_until
		  FROM u ORDER BY u.id$sql$, tide._inbox_table(cfg))
		USING p_batch_size, p_visibility_seconds;
END
$$;
COMMENT ON FUNCTION tide.inbox_claim(text, int, int)
	IS 'claims the oldest pending messages for p_visibility_seconds; concurrent claimers get disjoint messages';

-- Fetches a message's state for update, or raises 42704.
CREATE FUNCTION tide._inbox_lock_message(p_cfg tide.tide_inbox_config, p_event_id text,
										 OUT processed boolean, OUT dead_lettered boolean,
										 OUT retry_count int)
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._check_event_id(p_event_id);
	EXECUTE format('SELECT processed_at IS NOT NULL, dead_lettered_at IS NOT NULL, retry_count '
				   'FROM %s WHERE event_id = $1 FOR UPDATE', tide._inbox_table(p_cfg))
		INTO processed, dead_lettered, retry_count
		USING p_event_id;
	IF processed IS NULL THEN
		RAISE EXCEPTION 'event "%" is not in inbox "%"', p_event_id, p_cfg.inbox_name
			USING ERRCODE = 'undefined_object',
				  HINT = 'Receive it first with tide.inbox_receive(); processed messages are deleted after their retention.';
	END IF;
END
$$;

CREATE FUNCTION tide.inbox_mark_processed(p_name text, p_event_id text)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
	cfg tide.tide_inbox_config;
	st record;
BEGIN
	cfg := tide._inbox_config(p_name);
	st := tide._inbox_lock_message(cfg, p_event_id);
	IF st.processed THEN
		RETURN false;
	END IF;
	EXECUTE format('UPDATE %s SET processed_at = clock_timestamp(), claimed_until = NULL, '
				   'dead_lettered_at = NULL WHERE event_id = $1', tide._inbox_table(cfg))
		USING p_event_id;
	RETURN true;
END
$$;
COMMENT ON FUNCTION tide.inbox_mark_processed(text, text)
	IS 'marks a message processed; returns false when it already was';

CREATE FUNCTION tide.inbox_mark_failed(p_name text, p_event_id text, p_error text)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
	cfg tide.tide_inbox_config;
	st record;
	dead boolean;
BEGIN
	cfg := tide._inbox_config(p_name);
	st := tide._inbox_lock_message(cfg, p_event_id);
	IF st.processed THEN
		RAISE EXCEPTION 'event "%" in inbox "%" is already processed', p_event_id, p_name
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'A processed message cannot fail any more.';
	END IF;
	IF st.dead_lettered THEN
		RAISE EXCEPTION 'event "%" in inbox "%" is dead-lettered', p_event_id, p_name
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'Replay it with tide.replay_inbox_messages() to process it again.';
	END IF;
	dead := st.retry_count + 1 >= cfg.max_retries;
	-- The claim ends: unless dead-lettered, the next claim can take it.
	EXECUTE format('UPDATE %s SET retry_count = retry_count + 1, last_error = $2, '
				   'claimed_until = NULL, '
				   'dead_lettered_at = CASE WHEN $3 THEN clock_timestamp() END '
				   'WHERE event_id = $1', tide._inbox_table(cfg))
		USING p_event_id, p_error, dead;
	RETURN dead;
END
$$;
COMMENT ON FUNCTION tide.inbox_mark_failed(text, text, text)
	IS 'records a failed attempt; returns true when the message was dead-lettered (after max_retries failures)';

CREATE FUNCTION tide.inbox_process(p_name text, p_handler regproc, p_batch_size int DEFAULT 100)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
	cfg tide.tide_inbox_config;
	tbl text;
	rowtype oid;
	h record;
	call text;
	ids text[];
	ev text;
	n bigint := 0;
	st text;
	msg text;
BEGIN
	cfg := tide._inbox_config(p_name);
	IF p_handler IS NULL THEN
		RAISE EXCEPTION 'handler must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Pass a function that takes the inbox''s row type.';
	END IF;
	PERFORM tide._check_batch_size(p_batch_size);
	tbl := tide._inbox_table(cfg);
	rowtype := (SELECT c.reltype FROM pg_catalog.pg_class c WHERE c.oid = tbl::regclass);
	SELECT n.nspname, p.proname, p.pronargs, p.proargtypes[0] AS argtype, p.prokind, p.pronamespace
	  INTO h
	  FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
	 WHERE p.oid = p_handler;
	IF NOT FOUND OR h.prokind <> 'f' OR h.pronargs <> 1 OR h.argtype <> rowtype THEN
		RAISE EXCEPTION 'handler % must be a function of one argument of type %',
						p_handler, rowtype::regtype
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = format('Declare it as CREATE FUNCTION ...(m %s) RETURNS void ...', rowtype::regtype);
	END IF;
	-- The caller's missing right is the caller's error, not the events':
	-- refused before any event is claimed, or every one would fail with
	-- 42501 and be dead-lettered in the end.
	IF NOT pg_catalog.has_schema_privilege(h.pronamespace, 'USAGE') THEN
		RAISE EXCEPTION 'permission denied for schema % of handler %', h.nspname, p_handler::regprocedure
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = 'No event was claimed or changed.',
				  HINT = pg_catalog.format('Grant USAGE on schema %I to role %I, or process the inbox as a role that has it.',
										   h.nspname, current_user);
	END IF;
	IF NOT pg_catalog.has_function_privilege(p_handler::oid, 'EXECUTE') THEN
		RAISE EXCEPTION 'permission denied for handler %', p_handler::regprocedure
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = 'No event was claimed or changed.',
				  HINT = pg_catalog.format('Grant EXECUTE on function %s to role %I, or process the inbox as a role that has it.',
										   p_handler::regprocedure, current_user);
	END IF;
	call := format('SELECT %I.%I(t) FROM %s t WHERE t.event_id = $1', h.nspname, h.proname, tbl);

	-- The batch is locked up front and stays locked until the caller's
	-- transaction ends: other claimers and processors skip it.
	EXECUTE format($sql$
		SELECT coalesce(array_agg(s.event_id ORDER BY s.id), '{}') FROM (
			SELECT t.id, t.event_id FROM %s t
			 WHERE t.processed_at IS NULL AND t.dead_lettered_at IS NULL
			   AND (t.claimed_until IS NULL OR t.claimed_until <= clock_timestamp())
			 ORDER BY t.id
			 LIMIT $1
			   FOR UPDATE SKIP LOCKED) s$sql$, tbl)
		INTO ids
		USING p_batch_size;

	FOREACH ev IN ARRAY ids LOOP
		-- One subtransaction per message: a handler error undoes that
		-- message's writes only, and the failure is recorded after it.
		BEGIN
			EXECUTE call USING ev;
			PERFORM tide.inbox_mark_processed(p_name, ev);
			n := n + 1;
		EXCEPTION WHEN OTHERS THEN
			GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
			PERFORM tide.inbox_mark_failed(p_name, ev, st || ': ' || msg);
		END;
	END LOOP;
	RETURN n;
END
$$;
COMMENT ON FUNCTION tide.inbox_process(text, regproc, int)
	IS 'claims a batch and runs a handler on each message; the handler''s writes and the processed mark commit together; returns how many were processed';

CREATE FUNCTION tide.inbox_dlq(p_name text)
RETURNS TABLE (event_id text, source text, payload jsonb, headers jsonb,
			   received_at timestamptz, retry_count int, last_error text,
			   dead_lettered_at timestamptz)
LANGUAGE plpgsql
AS $$
DECLARE
	cfg tide.tide_inbox_config;
BEGIN
	cfg := tide._inbox_config(p_name);
	RETURN QUERY EXECUTE format($sql$
		SELECT t.event_id, t.source, t.payload, t.headers, t.received_at, t.retry_count,
			   t.last_error, t.dead_lettered_at
		  FROM %s t
		 WHERE t.dead_lettered_at IS NOT NULL AND t.processed_at IS NULL
		 ORDER BY t.id$sql$, tide._inbox_table(cfg));
END
$$;
COMMENT ON FUNCTION tide.inbox_dlq(text) IS 'lists an inbox''s dead-lettered messages, oldest first';

CREATE FUNCTION tide.replay_inbox_messages(p_name text, p_event_ids text[])
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
	cfg tide.tide_inbox_config;
	n bigint;
BEGIN
	cfg := tide._inbox_config(p_name);
	IF p_event_ids IS NULL THEN
		RAISE EXCEPTION 'event ids must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Pass the ids to replay, for example ARRAY(SELECT event_id FROM tide.inbox_dlq(...)).';
	END IF;
	EXECUTE format('UPDATE %s SET dead_lettered_at = NULL, retry_count = 0, claimed_until = NULL '
				   'WHERE event_id = ANY ($1) AND dead_lettered_at IS NOT NULL AND processed_at IS NULL',
				   tide._inbox_table(cfg))
		USING p_event_ids;
	GET DIAGNOSTICS n = ROW_COUNT;
	RETURN n;
END
$$;
COMMENT ON FUNCTION tide.replay_inbox_messages(text, text[])
	IS 'makes dead-lettered messages pending again with retry_count 0; returns how many';

-- One inbox's status object.
CREATE FUNCTION tide._inbox_status(p_cfg tide.tide_inbox_config)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
	result jsonb;
BEGIN
	EXECUTE format($sql$
		SELECT jsonb_build_object(
				'inbox', $1,
				'schema', $2,
				'table', $3,
				'max_retries', $4,
				'processed_retention_hours', $5,
				'dlq_retention_hours', $6,
				'pending', count(*) FILTER (WHERE live AND NOT claimed),
				'claimed', count(*) FILTER (WHERE live AND claimed),
				'processed', count(*) FILTER (WHERE t.processed_at IS NOT NULL),
				'dlq_count', count(*) FILTER (WHERE t.processed_at IS NULL AND t.dead_lettered_at IS NOT NULL),
				'oldest_pending_age_seconds',
					round(extract(epoch FROM clock_timestamp() - min(t.received_at) FILTER (WHERE live))::numeric, 3))
		  FROM %s t,
			   LATERAL (SELECT t.processed_at IS NULL AND t.dead_lettered_at IS NULL AS live,
							   coalesce(t.claimed_until > clock_timestamp(), false) AS claimed) s$sql$,
		tide._inbox_table(p_cfg))
		INTO result
		USING p_cfg.inbox_name, p_cfg.inbox_schema, p_cfg.inbox_name || '_inbox', p_cfg.max_retries,
			  p_cfg.processed_retention_hours, p_cfg.dlq_retention_hours;
	RETURN result;
END
$$;

CREATE FUNCTION tide.inbox_status(p_name text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
	cfg tide.tide_inbox_config;
	result jsonb := '[]';
BEGIN
	IF p_name IS NOT NULL THEN
		RETURN tide._inbox_status(tide._inbox_config(p_name));
	END IF;
	FOR cfg IN SELECT * FROM tide.tide_inbox_config ORDER BY inbox_name LOOP
		result := result || jsonb_build_array(tide._inbox_status(cfg));
	END LOOP;
	RETURN result;
END
$$;
COMMENT ON FUNCTION tide.inbox_status(text)
	IS 'pending, claimed, processed and dead-lettered counts and oldest pending age of an inbox (NULL: an array of all inboxes)';

CREATE FUNCTION tide.inbox_truncate_processed(p_name text)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
	cfg tide.tide_inbox_config;
	n bigint;
BEGIN
	cfg := tide._inbox_config(p_name);
	-- A retention of 0 keeps those rows. A processed message's row is what
	-- recognises a late duplicate: once deleted, the same id is new again.
	EXECUTE format($sql$
		DELETE FROM %s t
		 WHERE ($1 > 0 AND t.processed_at < clock_timestamp() - make_interval(hours => $1))
			OR ($2 > 0 AND t.processed_at IS NULL
				AND t.dead_lettered_at < clock_timestamp() - make_interval(hours => $2))$sql$,
		tide._inbox_table(cfg))
		USING cfg.processed_retention_hours, cfg.dlq_retention_hours;
	GET DIAGNOSTICS n = ROW_COUNT;
	RETURN n;
END
$$;
COMMENT ON FUNCTION tide.inbox_truncate_processed(text)
	IS 'deletes processed and dead-lettered messages older than their retention; returns how many';

-- ---------------------------------------------------------------------------
-- Relay workers (relay/launcher.c). The launcher runs one relay worker per
-- database where pg_tide is installed; delivery to sinks comes later.
-- ---------------------------------------------------------------------------

-- Asks the launcher, at commit, to look at this database again, so the new
-- extension gets its relay worker within a second. Does nothing without
-- preloading.
CREATE FUNCTION tide._relay_notify_launcher()
RETURNS void
AS 'MODULE_PATHNAME', 'tide_relay_notify_launcher'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION tide._relay_notify_launcher()
	IS 'internal: asks the relay launcher to start a worker for this database at commit';

SELECT tide._relay_notify_launcher();

CREATE FUNCTION tide.relay_workers(
	OUT database name,
	OUT pid integer,
	OUT started_at timestamptz,
	OUT passes bigint,
	OUT wakeups bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'tide_relay_workers'
LANGUAGE C VOLATILE ROWS 8;
COMMENT ON FUNCTION tide.relay_workers()
	IS 'one row per running relay worker in the cluster: its database, pid, start time, passes and wake-ups by commits';

-- ---------------------------------------------------------------------------
-- Relay pipelines. A forward pipeline is a row of relay_outbox_config; its
-- config jsonb holds the outbox, the consumer group it reads through and the
-- sink's settings, validated and completed with defaults when it is set (see
-- docs/relay.md#pipelines). The relay delivers webhook and file pipelines
-- (relay/sink_webhook.c, relay/sink_file.c).
-- ---------------------------------------------------------------------------

-- Raises 22023 for a relay config key.
CREATE FUNCTION tide._relay_bad_config(p_message text, p_hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	RAISE EXCEPTION '%', p_message
		USING ERRCODE = 'invalid_parameter_value', HINT = p_hint;
END
$$;

-- Checks that a config value has the JSON type expected for it.
CREATE FUNCTION tide._relay_check_type(p_key text, p_value jsonb, p_type text, p_hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	IF jsonb_typeof(p_value) IS DISTINCT FROM p_type THEN
		PERFORM tide._relay_bad_config(
			format('config key "%s" must be %s, not %s', p_key,
				   CASE p_type WHEN 'object' THEN 'an object' WHEN 'array' THEN 'an array'
				   ELSE 'a ' || p_type END,
				   coalesce(jsonb_typeof(p_value), 'missing')),
			p_hint);
	END IF;
END
$$;

-- A number as a message shows it: as written when short, else in
-- scientific notation (1e-400 written out has 402 characters).
CREATE FUNCTION tide._relay_number_text(p_n numeric)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT
AS $$
	SELECT CASE WHEN length(p_n::text) <= 20 THEN p_n::text
				ELSE btrim(to_char(p_n, '9.999EEEE')) END
$$;

-- An integer config value within [p_min, p_max], or p_default when absent.
-- Every caller's range lies within int4, which is what the relay reads.
CREATE FUNCTION tide._relay_int(p_obj jsonb, p_field text, p_key text,
								p_min bigint, p_max bigint, p_default bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	v jsonb := p_obj -> p_field;
	n numeric;
	hint text := format('Give "%s" an integer from %s to %s.', p_key, p_min, p_max);
BEGIN
	IF v IS NULL THEN
		RETURN p_default;
	END IF;
	IF jsonb_typeof(v) <> 'number' OR v::numeric <> trunc(v::numeric) THEN
		PERFORM tide._relay_bad_config(
			format('config key "%s" must be an integer, not %s', p_key,
				   CASE WHEN jsonb_typeof(v) = 'number' THEN tide._relay_number_text(v::numeric)
				   ELSE jsonb_typeof(v) END),
			hint);
	END IF;
	n := v::numeric;
	IF n < p_min OR n > p_max THEN
		PERFORM tide._relay_bad_config(
			format('config key "%s" is out of range: %s', p_key, tide._relay_number_text(n)), hint);
	END IF;
	RETURN n::bigint;
END
$$;

-- A boolean config value, or p_default when absent.
CREATE FUNCTION tide._relay_bool(p_obj jsonb, p_key text, p_default boolean)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	IF NOT p_obj ? p_key THEN
		RETURN p_default;
	END IF;
	PERFORM tide._relay_check_type(p_key, p_obj -> p_key, 'boolean',
								   format('Give "%s" as true or false.', p_key));
	RETURN (p_obj -> p_key)::boolean;
END
$$;

-- A string config value that is one of p_allowed, or p_default when absent.
CREATE FUNCTION tide._relay_choice(p_obj jsonb, p_key text, p_allowed text[], p_default text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	hint text := format('Give "%s" one of: %s.', p_key,
						(SELECT string_agg(quote_literal(a), ', ') FROM unnest(p_allowed) a));
BEGIN
	IF NOT p_obj ? p_key THEN
		IF p_default IS NULL THEN
			PERFORM tide._relay_bad_config(format('config key "%s" is missing', p_key), hint);
		END IF;
		RETURN p_default;
	END IF;
	PERFORM tide._relay_check_type(p_key, p_obj -> p_key, 'string', hint);
	IF NOT (p_obj ->> p_key) = ANY (p_allowed) THEN
		PERFORM tide._relay_bad_config(
			format('invalid value "%s" for config key "%s"', p_obj ->> p_key, p_key), hint);
	END IF;
	RETURN p_obj ->> p_key;
END
$$;

-- Refuses keys of p_obj that are not in p_known; p_prefix names the parent
-- object in messages ("retry.").
CREATE FUNCTION tide._relay_check_keys(p_obj jsonb, p_known text[], p_prefix text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	k text;
BEGIN
	SELECT min(key) INTO k FROM jsonb_object_keys(p_obj) AS key WHERE key <> ALL (p_known);
	IF k IS NOT NULL THEN
		PERFORM tide._relay_bad_config(
			format('unknown config key "%s%s"', p_prefix, k),
			format('Remove "%s%s"; the known keys are: %s.', p_prefix, k,
				   array_to_string(ARRAY(SELECT unnest(p_known) ORDER BY 1), ', ')));
	END IF;
END
$$;

-- What the host of a URL is for the SSRF check: 'name', 'public',
-- 'private' or 'invalid' (relay/address.c, the rules the relay applies
-- when it connects).
CREATE FUNCTION tide._relay_url_host_class(p_host text)
RETURNS text
AS 'MODULE_PATHNAME', 'tide_relay_url_host_class'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- Validates a webhook URL: http or https, a host, an optional port, no
-- user name or password (they would not be redacted: use headers), no
-- white space; unless p_allow_private, a host written as an address must
-- be a public one (a name is checked by the relay once resolved).
CREATE FUNCTION tide._relay_check_url(p_url text, p_allow_http boolean, p_allow_private boolean)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	host_class text;
	m text[];
	hint text := 'Give "url" as an absolute URL such as "https://example.com/hooks".';
BEGIN
	-- Not repeated in the message: a line break would forge a line of the log.
	IF p_url ~ '[[:space:][:cntrl:]]' THEN
		PERFORM tide._relay_bad_config('config key "url" must not contain white space or control characters',
			hint || ' Encode a space in a path or query as %20.');
	END IF;
	m := regexp_match(p_url,
		'^([A-Za-z][A-Za-z0-9+.-]*)://([^/?#@]*@)?([A-Za-z0-9._~-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]*)?([/?#][^[:space:]]*)?$');
	IF m IS NULL THEN
		PERFORM tide._relay_bad_config(format('config key "url" is not a valid URL: "%s"', p_url), hint);
	END IF;
	IF lower(m[1]) NOT IN ('http', 'https') THEN
		PERFORM tide._relay_bad_config(
			format('config key "url" has scheme "%s"', m[1]),
			'Give "url" an https:// URL (or http:// with "allow_http": true).');
	END IF;
	IF m[2] IS NOT NULL THEN
		PERFORM tide._relay_bad_config('config key "url" must not contain a user name or password',
			'Send credentials in "headers", for example "Authorization"; headers are redacted, URLs are not.');
	END IF;
	IF m[4] IS NOT NULL AND (m[4] !~ '^:[0-9]{1,5}$' OR substr(m[4], 2)::int NOT BETWEEN 1 AND 65535) THEN
		PERFORM tide._relay_bad_config(format('config key "url" has an invalid port: "%s"', p_url),
			'Give "url" a port from 1 to 65535, or none.');
	END IF;
	IF lower(m[1]) = 'http' AND NOT p_allow_http THEN
		PERFORM tide._relay_bad_config('config key "url" uses plain http',
			'Use an https:// URL, or set "allow_http": true to send over plain http.');
	END IF;
	host_class := tide._relay_url_host_class(m[3]);
	IF host_class = 'invalid' THEN
		PERFORM tide._relay_bad_config(format('config key "url" has an invalid IPv6 address: "%s"', m[3]),
			'Write an IPv6 address in brackets, for example "https://[2001:db8::1]/hooks".');
	END IF;
	IF host_class = 'private' AND NOT p_allow_private THEN
		PERFORM tide._relay_bad_config(
			format('config key "url" points to a non-public address: "%s"', m[3]),
			'Loopback, private, link-local (cloud metadata), unspecified and multicast addresses are refused; '
			'set "allow_private_network": true to send to one.');
	END IF;
END
$$;

-- Validates a reference to a secret kept outside the database: {"env":
-- "PG_TIDE_..."} names an environment variable of the server, {"file":
-- "name"} a file in pg_tide.secrets_directory. The relay reads it when it
-- reads the pipeline (relay/secrets.c); docs/security.md#secret-references.
CREATE FUNCTION tide._relay_check_secret_ref(p_key text, p_ref jsonb)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	hint text := format('Give "%s" as {"env": "PG_TIDE_<NAME>"} or {"file": "<file name in pg_tide.secrets_directory>"}.', p_key);
BEGIN
	IF (SELECT count(*) FROM jsonb_object_keys(p_ref)) <> 1
	   OR NOT (p_ref ? 'env' OR p_ref ? 'file') THEN
		PERFORM tide._relay_bad_config(format('config key "%s" is not a valid secret reference', p_key), hint);
	END IF;
	IF jsonb_typeof(p_ref -> 'env') = 'string' THEN
		IF (p_ref ->> 'env') !~ '^PG_TIDE_[A-Za-z0-9_]+$' THEN
			PERFORM tide._relay_bad_config(
				format('environment variable "%s" in config key "%s" does not start with "PG_TIDE_"', p_ref ->> 'env', p_key),
				'Only environment variables named PG_TIDE_<letters, digits, _> can hold secrets.');
		END IF;
	ELSIF jsonb_typeof(p_ref -> 'file') = 'string' THEN
		IF (p_ref ->> 'file') !~ '^[A-Za-z0-9_][A-Za-z0-9._-]*$' OR octet_length(p_ref ->> 'file') > 255 THEN
			PERFORM tide._relay_bad_config(
				format('file "%s" in config key "%s" is not a plain file name', p_ref ->> 'file', p_key),
				'Give the name of a file in pg_tide.secrets_directory: letters, digits, ".", "_" and "-", no "/", not starting with ".".');
		END IF;
	ELSE
		PERFORM tide._relay_bad_config(format('config key "%s" is not a valid secret reference', p_key), hint);
	END IF;
END
$$;

-- Validates one signing secret: "whsec_" and base64 of at least one byte,
-- or a reference (the relay checks the form of what it refers to).
CREATE FUNCTION tide._relay_check_secret(p_secret jsonb)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	hint text := 'Give "signing_secret" as "whsec_<base64>" or {"env": ...} / {"file": ...}, or an array of such to rotate secrets.';
	ok boolean;
BEGIN
	IF jsonb_typeof(p_secret) = 'object' THEN
		PERFORM tide._relay_check_secret_ref('signing_secret', p_secret);
		RETURN;
	END IF;
	PERFORM tide._relay_check_type('signing_secret', p_secret, 'string', hint);
	IF (p_secret #>> '{}') !~ '^whsec_' THEN
		PERFORM tide._relay_bad_config('config key "signing_secret" must start with "whsec_"', hint);
	END IF;
	BEGIN
		ok := length(decode(substr(p_secret #>> '{}', 7), 'base64')) > 0;
	EXCEPTION WHEN invalid_parameter_value OR data_exception THEN
		ok := false;
	END;
	IF NOT ok THEN
		-- The secret itself is not repeated in the message.
		PERFORM tide._relay_bad_config('config key "signing_secret" is not valid base64 after "whsec_"', hint);
	END IF;
END
$$;

-- Validates the "alerts" object of a pipeline config and returns it with its
-- defaults: failure_threshold (failed attempts in a row that count as 100 %)
-- and auto_disable (disable the pipeline when they reach it).
CREATE FUNCTION tide._relay_alerts_config(p_config jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	a jsonb := coalesce(p_config -> 'alerts', '{}');
BEGIN
	PERFORM tide._relay_check_type('alerts', a, 'object',
		'Give "alerts" as an object with failure_threshold and auto_disable.');
	PERFORM tide._relay_check_keys(a, ARRAY['failure_threshold', 'auto_disable'], 'alerts.');
	RETURN jsonb_build_object(
		'failure_threshold', tide._relay_int(a, 'failure_threshold', 'alerts.failure_threshold', 1, 1000000, 100),
		'auto_disable', tide._relay_bool(a, 'auto_disable', false));
END
$$;

-- Validates the optional "rate_limit" and "breaker" objects of a pipeline
-- config and returns them with their defaults ({} when neither is given):
-- rate_limit.per_second (messages a second, fractions allowed, from 0.001
-- to 1000000) and rate_limit.burst (messages at once, default per_second
-- rounded up);
-- breaker.failure_threshold (failed attempts in a row that open it, default
-- 20) and breaker.cooldown_ms (how long it stays open, default 30000).
CREATE FUNCTION tide._relay_pacing_config(p_config jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	r jsonb := p_config -> 'rate_limit';
	b jsonb := p_config -> 'breaker';
	result jsonb := '{}';
	per_second numeric;
	rate_hint text := 'Give "rate_limit.per_second" as a number from 0.001 (one message every 1,000 s) '
					  'to 1000000; tide.relay_disable() stops a pipeline.';
BEGIN
	IF r IS NOT NULL THEN
		PERFORM tide._relay_check_type('rate_limit', r, 'object',
			'Give "rate_limit" as an object with per_second and burst.');
		PERFORM tide._relay_check_keys(r, ARRAY['per_second', 'burst'], 'rate_limit.');
		IF NOT r ? 'per_second' THEN
			PERFORM tide._relay_bad_config('config key "rate_limit.per_second" is missing',
				'Give "rate_limit.per_second", the messages a second the pipeline may send, for example 50.');
		END IF;
		PERFORM tide._relay_check_type('rate_limit.per_second', r -> 'per_second', 'number', rate_hint);
		per_second := (r ->> 'per_second')::numeric;
		-- At least 0.001, one message every 1,000 s: the relay computes the
		-- bucket in float8, which cannot hold every numeric above 0 (1e-400
		-- is none), and a slower pipeline is better disabled than woken up
		-- for a message a day; the relay bounds its wait to match
		-- (relay/pacing.c). At most 1000000, beyond what a worker sends.
		IF per_second < 0.001 OR per_second > 1000000 THEN
			PERFORM tide._relay_bad_config(
				format('config key "rate_limit.per_second" is out of range: %s',
					   tide._relay_number_text(per_second)),
				rate_hint);
		END IF;
		result := result || jsonb_build_object('rate_limit', jsonb_build_object(
			'per_second', per_second,
			'burst', tide._relay_int(r, 'burst', 'rate_limit.burst', 1, 1000000, ceil(per_second)::int)));
	END IF;
	IF b IS NOT NULL THEN
		PERFORM tide._relay_check_type('breaker', b, 'object',
			'Give "breaker" as an object with failure_threshold and cooldown_ms.');
		PERFORM tide._relay_check_keys(b, ARRAY['failure_threshold', 'cooldown_ms'], 'breaker.');
		result := result || jsonb_build_object('breaker', jsonb_build_object(
			'failure_threshold', tide._relay_int(b, 'failure_threshold', 'breaker.failure_threshold', 1, 1000000, 20),
			'cooldown_ms', tide._relay_int(b, 'cooldown_ms', 'breaker.cooldown_ms', 100, 86400000, 30000)));
	END IF;
	RETURN result;
END
$$;

-- Validates a webhook sink config and returns it with every default filled
-- in (outbox and consumer group are added by the caller).
CREATE FUNCTION tide._relay_webhook_config(p_config jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	known text[] := ARRAY['sink_type', 'outbox', 'consumer_group', 'url', 'mode', 'batch_size',
						  'max_in_flight', 'timeout_ms', 'headers', 'signing_secret', 'signature',
						  'allow_http', 'allow_private_network', 'retry', 'ordering', 'attempt_log',
						  'alerts', 'types', 'filter', 'rate_limit', 'breaker', 'allow_other_consumers'];
	reserved text[] := ARRAY['webhook-id', 'webhook-timestamp', 'webhook-signature',
							 'idempotency-key', 'content-type', 'content-length', 'host'];
	allow_http boolean;
	allow_private boolean;
	retry jsonb;
	base_ms bigint;
	h record;
	s jsonb;
	result jsonb;
BEGIN
	PERFORM tide._relay_check_keys(p_config, known, '');

	allow_http := tide._relay_bool(p_config, 'allow_http', false);
	allow_private := tide._relay_bool(p_config, 'allow_private_network', false);
	IF NOT p_config ? 'url' THEN
		PERFORM tide._relay_bad_config('config key "url" is missing',
			'Give "url", the https:// URL the webhook is sent to.');
	END IF;
	PERFORM tide._relay_check_type('url', p_config -> 'url', 'string',
		'Give "url" as a string such as "https://example.com/hooks".');
	PERFORM tide._relay_check_url(p_config ->> 'url', allow_http, allow_private);

	result := jsonb_build_object(
		'sink_type', 'webhook',
		'url', p_config -> 'url',
		'mode', tide._relay_choice(p_config, 'mode', ARRAY['single', 'batch'], 'single'),
		'batch_size', tide._relay_int(p_config, 'batch_size', 'batch_size', 1, 1000, 100),
		'max_in_flight', tide._relay_int(p_config, 'max_in_flight', 'max_in_flight', 1, 1000, 16),
		'timeout_ms', tide._relay_int(p_config, 'timeout_ms', 'timeout_ms', 100, 600000, 10000),
		'signature', tide._relay_choice(p_config, 'signature', ARRAY['standard', 'pg-tide'], 'standard'),
		'ordering', tide._relay_choice(p_config, 'ordering', ARRAY['relaxed', 'strict'], 'relaxed'),
		'attempt_log', tide._relay_bool(p_config, 'attempt_log', true),
		'alerts', tide._relay_alerts_config(p_config),
		'allow_other_consumers', tide._relay_bool(p_config, 'allow_other_consumers', false),
		'allow_http', allow_http,
		'allow_private_network', allow_private);

	-- headers: an object of strings; pg_tide's own headers are refused.
	IF p_config ? 'headers' THEN
		PERFORM tide._relay_check_type('headers', p_config -> 'headers', 'object',
			'Give "headers" as an object of header names and string values.');
		FOR h IN SELECT key, value FROM jsonb_each(p_config -> 'headers') ORDER BY key LOOP
			IF h.key !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' THEN
				PERFORM tide._relay_bad_config(format('invalid header name "%s" in config key "headers"', h.key),
					'Header names in "headers" are HTTP tokens: letters, digits and !#$%&''*+-.^_`|~.');
			END IF;
			IF (SELECT count(*) FROM jsonb_object_keys(p_config -> 'headers') k
				 WHERE lower(k) = lower(h.key)) > 1 THEN
				PERFORM tide._relay_bad_config(format('header "%s" is given twice in config key "headers"', h.key),
					format('Header names are compared without regard to case; give "%s" once.', h.key));
			END IF;
			IF lower(h.key) = ANY (reserved) THEN
				PERFORM tide._relay_bad_config(format('header "%s" in config key "headers" is set by pg_tide', h.key),
					format('Remove "%s" from "headers"; pg_tide sets %s itself.', h.key,
						   array_to_string(reserved, ', ')));
			END IF;
			-- A value marked secret is redacted; a reference is read by the relay.
			IF jsonb_typeof(h.value) = 'object' AND NOT h.value ? 'value' THEN
				PERFORM tide._relay_check_secret_ref(format('headers.%s', h.key), h.value);
				CONTINUE;
			END IF;
			IF jsonb_typeof(h.value) = 'object' THEN
				PERFORM tide._relay_check_keys(h.value, ARRAY['value', 'secret'], format('headers.%s.', h.key));
				IF h.value ? 'secret' THEN
					PERFORM tide._relay_check_type(format('headers.%s.secret', h.key), h.value -> 'secret', 'boolean',
						'Give "secret" as true or false.');
				END IF;
				h.value := h.value -> 'value';
			END IF;
			IF jsonb_typeof(h.value) <> 'string' OR (h.value #>> '{}') ~ '[\r\n\x01-\x08\x0b\x0c\x0e-\x1f\x7f]' THEN
				PERFORM tide._relay_bad_config(format('header "%s" in config key "headers" must have a string value', h.key),
					'Give each header in "headers" a string value without line breaks or control characters.');
			END IF;
		END LOOP;
		result := result || jsonb_build_object('headers', p_config -> 'headers');
	ELSE
		result := result || '{"headers": {}}';
	END IF;

	-- signing_secret: one secret, or several while rotating (all sign).
	IF p_config ? 'signing_secret' THEN
		s := p_config -> 'signing_secret';
		IF jsonb_typeof(s) = 'array' THEN
			IF jsonb_array_length(s) = 0 THEN
				PERFORM tide._relay_bad_config('config key "signing_secret" must not be an empty array',
					'Give "signing_secret" at least one "whsec_<base64>" string, or leave it out to send unsigned.');
			END IF;
			PERFORM tide._relay_check_secret(e) FROM jsonb_array_elements(s) e;
		ELSE
			PERFORM tide._relay_check_secret(s);
		END IF;
		result := result || jsonb_build_object('signing_secret', s);
	END IF;

	-- retry: exponential backoff with jitter between base_ms and cap_ms.
	retry := coalesce(p_config -> 'retry', '{}');
	PERFORM tide._relay_check_type('retry', retry, 'object',
		'Give "retry" as an object with base_ms, cap_ms and max_attempts.');
	PERFORM tide._relay_check_keys(retry, ARRAY['base_ms', 'cap_ms', 'max_attempts'], 'retry.');
	base_ms := tide._relay_int(retry, 'base_ms', 'retry.base_ms', 10, 600000, 500);
	result := result || jsonb_build_object('retry', jsonb_build_object(
		'base_ms', base_ms,
		'cap_ms', tide._relay_int(retry, 'cap_ms', 'retry.cap_ms', base_ms, 86400000, greatest(60000, base_ms)),
		'max_attempts', tide._relay_int(retry, 'max_attempts', 'retry.max_attempts', 1, 100, 10)));
	-- types, filter: which messages are delivered (relay/filter.c).
	result := result || tide._relay_routing(p_config) || tide._relay_pacing_config(p_config);
	RETURN result;
END
$$;

-- Validates a file sink config and returns it with every default filled in
-- (outbox and consumer group are added by the caller). The relay appends
-- to the file as the server's operating system user, so only those who may
-- write server files may name one.
CREATE FUNCTION tide._relay_file_config(p_config jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	known text[] := ARRAY['sink_type', 'outbox', 'consumer_group', 'path', 'batch_size', 'fsync',
						  'attempt_log', 'alerts', 'types', 'filter', 'rate_limit', 'breaker',
						  'allow_other_consumers'];
	hint text := 'Give "path" as an absolute file name such as "/var/log/pg_tide/orders.jsonl".';
BEGIN
	PERFORM tide._relay_check_keys(p_config, known, '');
	IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user)
	   AND NOT pg_catalog.pg_has_role(current_user, 'pg_write_server_files', 'MEMBER') THEN
		RAISE EXCEPTION 'permission denied to set a file pipeline'
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = 'The relay writes the file as the operating system user of the server.',
				  HINT = 'Only superusers and members of pg_write_server_files may set a file pipeline.';
	END IF;
	IF NOT p_config ? 'path' THEN
		PERFORM tide._relay_bad_config('config key "path" is missing', hint);
	END IF;
	PERFORM tide._relay_check_type('path', p_config -> 'path', 'string', hint);
	IF left(p_config ->> 'path', 1) <> '/' THEN
		PERFORM tide._relay_bad_config(
			format('config key "path" must be an absolute path: "%s"', p_config ->> 'path'), hint);
	END IF;
	IF (p_config ->> 'path') ~ '[[:cntrl:]]' THEN
		PERFORM tide._relay_bad_config('config key "path" must not contain control characters', hint);
	END IF;
	RETURN jsonb_build_object(
		'sink_type', 'file',
		'path', p_config -> 'path',
		'batch_size', tide._relay_int(p_config, 'batch_size', 'batch_size', 1, 1000, 100),
		'fsync', tide._relay_bool(p_config, 'fsync', true),
		'attempt_log', tide._relay_bool(p_config, 'attempt_log', true),
		'alerts', tide._relay_alerts_config(p_config),
		'allow_other_consumers', tide._relay_bool(p_config, 'allow_other_consumers', false))
		|| tide._relay_routing(p_config) || tide._relay_pacing_config(p_config);
END
$$;

-- Whether a header's value is a secret by the header's name alone: the
-- headers that carry credentials (Authorization, Proxy-Authorization,
-- Cookie, Set-Cookie, X-Api-Key, X-Auth-Token, X-Session-Id,
-- X-Hub-Signature, ...), that is any name that contains auth, cookie,
-- token, secret, key, passw (password, passwd), pwd, credential, session,
-- signature or jwt, in any case. The one place of this rule: every output
-- that shows a config redacts through tide._relay_redact, which asks here.
CREATE FUNCTION tide._relay_secret_header(p_name text)
RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT
RETURN pg_catalog.lower(p_name)
	   OPERATOR(pg_catalog.~) '(auth|cookie|token|secret|key|passw|pwd|credential|session|signature|jwt)';
COMMENT ON FUNCTION tide._relay_secret_header(text)
	IS 'internal: whether a header of this name carries a credential, so that its value is redacted';

-- The config with secrets replaced by "********": signing_secret, the
-- values of headers marked {"secret": true}, and the values of headers
-- whose name says they carry a credential (tide._relay_secret_header).
-- References to secrets ({"env": ...}, {"file": ...}) are shown: they are
-- names, not secrets.
CREATE FUNCTION tide._relay_redact(p_config jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
	SELECT p_config
		|| CASE WHEN p_config ? 'signing_secret' THEN
				jsonb_build_object('signing_secret',
					CASE WHEN jsonb_typeof(p_config -> 'signing_secret') = 'array'
						 THEN (SELECT jsonb_agg(CASE WHEN jsonb_typeof(e) = 'object' THEN e
													 ELSE '"********"' END ORDER BY n)
								 FROM jsonb_array_elements(p_config -> 'signing_secret') WITH ORDINALITY AS a (e, n))
						 WHEN jsonb_typeof(p_config -> 'signing_secret') = 'object'
						 THEN p_config -> 'signing_secret'
						 ELSE '"********"' END)
		   ELSE '{}' END
		|| CASE WHEN jsonb_typeof(p_config -> 'headers') = 'object' THEN
				jsonb_build_object('headers', coalesce((
					SELECT jsonb_object_agg(key,
							CASE WHEN jsonb_typeof(value) = 'object' AND value ? 'value'
									  AND (value -> 'secret' = 'true' OR tide._relay_secret_header(key))
								 THEN value || '{"value": "********"}'
								 WHEN jsonb_typeof(value) = 'object' THEN value
								 WHEN tide._relay_secret_header(key)
								 THEN '"********"' ELSE value END)
					  FROM jsonb_each(p_config -> 'headers')), '{}'))
		   ELSE '{}' END
$$;

-- Locks a pipeline's row and returns it, or raises 42704.
CREATE FUNCTION tide._relay_pipeline(p_name text)
RETURNS tide.relay_outbox_config
LANGUAGE plpgsql
AS $$
DECLARE
	p tide.relay_outbox_config;
BEGIN
	PERFORM tide._check_name('pipeline', p_name);
	SELECT * INTO p FROM tide.relay_outbox_config WHERE name = p_name FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'pipeline "%" does not exist', p_name
			USING ERRCODE = 'undefined_object',
				  HINT = 'Create it with tide.relay_set_outbox(); tide.relay_list_configs() lists the pipelines.';
	END IF;
	RETURN p;
END
$$;

CREATE FUNCTION tide.relay_set_outbox(p_name text, p_outbox text, p_consumer_group text, p_config jsonb)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	cfg jsonb;
	g tide.tide_consumer_groups;
	other text;
BEGIN
	PERFORM tide._check_name('pipeline', p_name);
	PERFORM tide._check_name('consumer group', p_consumer_group);
	PERFORM tide._outbox_config(p_outbox);

	IF p_config IS NULL THEN
		RAISE EXCEPTION 'pipeline config must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give a config such as {"sink_type": "webhook", "url": "https://example.com/hooks"}.';
	END IF;
	IF jsonb_typeof(p_config) <> 'object' THEN
		RAISE EXCEPTION 'pipeline config must be a JSON object, not %', jsonb_typeof(p_config)
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give a config such as {"sink_type": "webhook", "url": "https://example.com/hooks"}.';
	END IF;
	-- outbox and consumer_group are the parameters; the keys are accepted
	-- when they agree, so that relay_get_config's output can be set again.
	IF p_config ? 'outbox' AND p_config -> 'outbox' IS DISTINCT FROM to_jsonb(p_outbox) THEN
		PERFORM tide._relay_bad_config('config key "outbox" does not match p_outbox',
			'The outbox is given by p_outbox; leave "outbox" out of the config or give the same name.');
	END IF;
	IF p_config ? 'consumer_group' AND p_config -> 'consumer_group' IS DISTINCT FROM to_jsonb(p_consumer_group) THEN
		PERFORM tide._relay_bad_config('config key "consumer_group" does not match p_consumer_group',
			'The consumer group is given by p_consumer_group; leave "consumer_group" out of the config or give the same name.');
	END IF;
	cfg := jsonb_build_object('outbox', p_outbox, 'consumer_group', p_consumer_group)
		   || CASE tide._relay_choice(p_config, 'sink_type', ARRAY['webhook', 'file'], NULL)
				  WHEN 'file' THEN tide._relay_file_config(p_config)
				  ELSE tide._relay_webhook_config(p_config)
			  END;

	-- The pipeline reads through its own consumer group, created on first
	-- use. The group's row lock serialises two pipelines naming one group.
	PERFORM tide.create_consumer_group(p_consumer_group, p_outbox, 'earliest', true)
	  FROM (SELECT 1) x
	 WHERE NOT EXISTS (SELECT 1 FROM tide.tide_consumer_groups WHERE group_name = p_consumer_group);
	g := tide._lock_group(p_consumer_group);
	IF g.outbox_name <> p_outbox THEN
		RAISE EXCEPTION 'consumer group "%" reads outbox "%", not "%"', p_consumer_group, g.outbox_name, p_outbox
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = format('Name a consumer group of outbox "%s", or a new one to have it created.', p_outbox);
	END IF;
	SELECT min(name) INTO other FROM tide.relay_outbox_config
	 WHERE config ->> 'consumer_group' = p_consumer_group AND name <> p_name;
	IF other IS NOT NULL THEN
		RAISE EXCEPTION 'consumer group "%" is already used by pipeline "%"', p_consumer_group, other
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'Each pipeline reads through a consumer group of its own; name another one.';
	END IF;

	INSERT INTO tide.relay_outbox_config AS c (name, config)
	VALUES (p_name, cfg)
	ON CONFLICT (name) DO UPDATE SET config = EXCLUDED.config
	 WHERE c.config IS DISTINCT FROM EXCLUDED.config;
	-- A changed config (a fixed URL, say) tries the queued messages at once
	-- (the row's trigger wakes the worker at commit).
	IF FOUND THEN
		UPDATE tide.relay_retry_queue SET next_attempt_at = now()
		 WHERE pipeline_id = p_name AND next_attempt_at > now();
	END IF;
	-- An offset kept for another group or outbox no longer applies.
	DELETE FROM tide.relay_consumer_offsets
	 WHERE pipeline_id = p_name
	   AND (relay_group_id, outbox_name) IS DISTINCT FROM (p_consumer_group, p_outbox);
END
$$;
COMMENT ON FUNCTION tide.relay_set_outbox(text, text, text, jsonb)
	IS 'creates or replaces a forward pipeline from an outbox, read through a consumer group (created if missing), to a sink';

-- Sets a pipeline's enabled flag; an unchanged flag writes nothing.
CREATE FUNCTION tide._relay_set_enabled(p_name text, p_enabled boolean)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._relay_pipeline(p_name);
	UPDATE tide.relay_outbox_config SET enabled = p_enabled
	 WHERE name = p_name AND enabled IS DISTINCT FROM p_enabled;
END
$$;

CREATE FUNCTION tide.relay_enable(p_name text)
RETURNS void
LANGUAGE sql
BEGIN ATOMIC
	SELECT tide._relay_set_enabled(p_name, true);
END;
COMMENT ON FUNCTION tide.relay_enable(text) IS 'lets the relay deliver through a pipeline again';

CREATE FUNCTION tide.relay_disable(p_name text)
RETURNS void
LANGUAGE sql
BEGIN ATOMIC
	SELECT tide._relay_set_enabled(p_name, false);
END;
COMMENT ON FUNCTION tide.relay_disable(text)
	IS 'stops the relay delivering through a pipeline; its position is kept';

CREATE FUNCTION tide.relay_delete(p_name text)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	p tide.relay_outbox_config;
BEGIN
	p := tide._relay_pipeline(p_name);
	DELETE FROM tide.relay_outbox_config WHERE name = p_name;
	DELETE FROM tide.relay_consumer_offsets WHERE pipeline_id = p_name;
	DELETE FROM tide.relay_retry_queue WHERE pipeline_id = p_name;
	DELETE FROM tide.relay_pipeline_health WHERE pipeline_id = p_name;
	-- Dead letters are the operator's to look at: kept until purged.
	IF EXISTS (SELECT 1 FROM tide.relay_dlq WHERE pipeline_id = p_name) THEN
		RAISE NOTICE 'the dead letters of pipeline "%" are kept', p_name
			USING HINT = 'tide.relay_dlq_list() shows them; tide.relay_dlq_purge() removes them.';
	END IF;
	-- The group is the pipeline's position: kept, so that a pipeline set
	-- again with it resumes; but it holds back the outbox's pending count.
	IF EXISTS (SELECT 1 FROM tide.tide_consumer_groups WHERE group_name = p.config ->> 'consumer_group') THEN
		RAISE NOTICE 'consumer group "%" of pipeline "%" is kept', p.config ->> 'consumer_group', p_name
			USING HINT = 'Drop it with tide.drop_consumer_group() unless a pipeline or consumer will read through it again: its unread messages count as pending.';
	END IF;
END
$$;
COMMENT ON FUNCTION tide.relay_delete(text)
	IS 'deletes a forward pipeline and its retry queue; its consumer group and dead letters are kept';

CREATE FUNCTION tide.relay_get_config(p_name text)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	cfg jsonb;
BEGIN
	PERFORM tide._check_name('pipeline', p_name);
	SELECT config INTO cfg FROM tide.relay_outbox_config WHERE name = p_name;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'pipeline "%" does not exist', p_name
			USING ERRCODE = 'undefined_object',
				  HINT = 'Create it with tide.relay_set_outbox(); tide.relay_list_configs() lists the pipelines.';
	END IF;
	RETURN tide._relay_redact(cfg);
END
$$;
COMMENT ON FUNCTION tide.relay_get_config(text)
	IS 'a pipeline''s effective config, defaults filled in, secrets shown as ********';

CREATE FUNCTION tide.relay_list_configs()
RETURNS TABLE (name text, enabled boolean, outbox text, consumer_group text, sink_type text, config jsonb)
LANGUAGE sql STABLE
AS $$
	SELECT c.name, c.enabled, c.config ->> 'outbox', c.config ->> 'consumer_group',
		   c.config ->> 'sink_type', tide._relay_redact(c.config)
	  FROM tide.relay_outbox_config c
	 ORDER BY c.name
$$;
COMMENT ON FUNCTION tide.relay_list_configs()
	IS 'every forward pipeline with its outbox, consumer group, sink type and config, secrets shown as ********';

-- ---------------------------------------------------------------------------
-- Routing (relay/filter.c). A pipeline's "types" (patterns matched against
-- the message's "type" header) and "filter" (a content filter on payload
-- and headers) choose the messages it delivers; the relay passes the others
-- over without delivery (see docs/relay.md#routing). Validation and
-- tide.relay_filter_matches use the compiler and evaluator the relay uses.
-- ---------------------------------------------------------------------------

-- Raises 22023 when "types" or "filter" is invalid; NULL: the key is absent.
CREATE FUNCTION tide._relay_routing_check(p_types jsonb, p_filter jsonb)
RETURNS void
AS 'MODULE_PATHNAME', 'tide_relay_routing_check'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

-- The "types" and "filter" of a config, validated, as the object merged
-- into the stored config ('{}' when neither is given).
CREATE FUNCTION tide._relay_routing(p_config jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	PERFORM tide._relay_routing_check(p_config -> 'types', p_config -> 'filter');
	RETURN CASE WHEN p_config ? 'types' THEN jsonb_build_object('types', p_config -> 'types')
				ELSE '{}' END
		|| CASE WHEN p_config ? 'filter' THEN jsonb_build_object('filter', p_config -> 'filter')
				ELSE '{}' END;
END
$$;

CREATE FUNCTION tide.relay_filter_matches(p_config jsonb, p_payload jsonb, p_headers jsonb DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'tide_relay_filter_matches'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION tide.relay_filter_matches(jsonb, jsonb, jsonb)
	IS 'whether a message with this payload and headers passes the "types" and "filter" of a pipeline config';

-- ---------------------------------------------------------------------------
-- Dead letters. A message that fails permanently (an answer other than 2xx,
-- 408, 425, 429 or 5xx) or runs out of retry.max_attempts goes to
-- relay_dlq, and the pipeline moves on (with ordering 'strict' it holds
-- instead). Retrying puts it back into the pipeline's retry queue, due at
-- once, with a fresh count of attempts; the relay worker is woken at commit.
-- ---------------------------------------------------------------------------
-- Refuses an age that is negative or, at more than 100 years, would take
-- now() out of the range of timestamps.
CREATE FUNCTION tide._check_age(p_age interval, p_hint text)
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
$$;

-- Moves dead letters back into their pipelines' retry queues; returns how many.
CREATE FUNCTION tide._relay_dlq_requeue(p_ids bigint[])
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
$$;

CREATE FUNCTION tide.relay_dlq_list(p_pipeline text DEFAULT NULL, p_limit int DEFAULT 100)
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
$$;
COMMENT ON FUNCTION tide.relay_dlq_list(text, int)
	IS 'dead letters, oldest first, of one pipeline or all: the message, why it failed and after how many attempts';

CREATE FUNCTION tide.relay_dlq_retry(p_id bigint)
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
	PERFORM tide._relay_pipeline(d.pipeline_id);
	PERFORM tide._relay_dlq_requeue(ARRAY[p_id]);
END
$$;
COMMENT ON FUNCTION tide.relay_dlq_retry(bigint)
	IS 'delivers a dead letter again: back into its pipeline''s retry queue, due at once, with fresh attempts';

CREATE FUNCTION tide.relay_dlq_retry_all(p_pipeline text)
RETURNS bigint
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._relay_pipeline(p_pipeline);
	RETURN tide._relay_dlq_requeue(ARRAY(
		SELECT id FROM tide.relay_dlq WHERE pipeline_id = p_pipeline ORDER BY id FOR UPDATE));
END
$$;
COMMENT ON FUNCTION tide.relay_dlq_retry_all(text)
	IS 'delivers every dead letter of a pipeline again; returns how many were queued';

CREATE FUNCTION tide.relay_dlq_purge(p_older_than interval)
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
$$;
COMMENT ON FUNCTION tide.relay_dlq_purge(interval)
	IS 'removes dead letters that were dead-lettered at least the given time ago; returns how many';

CREATE FUNCTION tide.relay_dlq_stats()
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
$$;
COMMENT ON FUNCTION tide.relay_dlq_stats()
	IS 'per pipeline: dead letters (permanent failures, exhausted retries), the oldest and newest, and messages waiting in its retry queue';

-- ---------------------------------------------------------------------------
-- Destination health and operator events. The relay worker calls
-- _relay_after_batch in the transaction that records each batch: it keeps
-- relay_pipeline_health, publishes operator events when the failures in a
-- row reach 50, 70, 90 and 100 % of the pipeline's alerts.failure_threshold
-- and when retries run out, and disables the pipeline at the threshold when
-- alerts.auto_disable is set. Events go to the outbox that
-- pg_tide.operator_events_outbox names (none when empty), with the header
-- "type" so that a pipeline can route them, for example to a pager.
-- ---------------------------------------------------------------------------
CREATE FUNCTION tide._relay_operator_event(p_type text, p_pipeline text, p_detail jsonb)
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
		RAISE WARNING 'operator event % of pipeline "%" not published: outbox "%" does not exist or is disabled',
			p_type, p_pipeline, target
			USING HINT = 'Create the outbox that pg_tide.operator_events_outbox names, or set the setting to an empty string.';
		RETURN;
	END IF;
	PERFORM tide.outbox_publish(target,
		jsonb_build_object('event', p_type, 'pipeline', p_pipeline, 'at', now()) || coalesce(p_detail, '{}'),
		jsonb_build_object('type', 'pg_tide.' || p_type));
END
$$;

CREATE FUNCTION tide._relay_after_batch(p_pipeline text, p_failures int, p_successes int,
										p_status int, p_error_class text, p_error text,
										p_exhausted bigint[], p_breaker text DEFAULT NULL,
										p_filtered int DEFAULT 0)
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
BEGIN
	INSERT INTO tide.relay_pipeline_health AS h
		(pipeline_id, consecutive_failures, last_success_at, last_failure_at, last_status,
		 last_error_class, last_error, breaker, filtered, updated_at)
	VALUES (p_pipeline, CASE WHEN p_successes > 0 THEN 0 ELSE p_failures END,
			CASE WHEN p_successes > 0 THEN now() END, CASE WHEN p_failures > 0 THEN now() END,
			p_status, p_error_class, p_error, p_breaker, coalesce(p_filtered, 0), now())
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
		   updated_at = now()
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
$$;

-- ---------------------------------------------------------------------------
-- Manual redelivery. Both put messages into the pipeline's retry queue as
-- manual, due at once (the worker is woken at commit); the live offset does
-- not move. The message must still be in its outbox.
-- ---------------------------------------------------------------------------
CREATE FUNCTION tide._relay_queue_manual(p_pipeline text, p_from_id bigint, p_to_id bigint)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
	p tide.relay_outbox_config;
	n bigint;
BEGIN
	p := tide._relay_pipeline(p_pipeline);
	INSERT INTO tide.relay_retry_queue AS q
		(pipeline_id, outbox_name, message_id, payload, headers, created_at, attempts,
		 next_attempt_at, manual)
	SELECT p_pipeline, m.outbox_name, m.id, m.payload, m.headers, m.created_at, 0, now(), true
	  FROM tide.tide_outbox_messages m
	 WHERE m.outbox_name = p.config ->> 'outbox' AND m.id BETWEEN p_from_id AND p_to_id
	ON CONFLICT (pipeline_id, message_id) DO UPDATE
	   SET next_attempt_at = now(), manual = true;
	GET DIAGNOSTICS n = ROW_COUNT;
	IF n > 0 THEN
		PERFORM tide._relay_wake_worker();
	END IF;
	RETURN n;
END
$$;

CREATE FUNCTION tide.relay_retry_message(p_pipeline text, p_message_id bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	p tide.relay_outbox_config;
BEGIN
	p := tide._relay_pipeline(p_pipeline);
	IF p_message_id IS NULL THEN
		RAISE EXCEPTION 'message id must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give the id of a message of the pipeline''s outbox.';
	END IF;
	IF tide._relay_queue_manual(p_pipeline, p_message_id, p_message_id) = 0 THEN
		RAISE EXCEPTION 'message % is not in outbox "%"', p_message_id, p.config ->> 'outbox'
			USING ERRCODE = 'undefined_object',
				  HINT = 'Only a message still kept by the pipeline''s outbox can be delivered again; a dead letter is retried with tide.relay_dlq_retry().';
	END IF;
END
$$;
COMMENT ON FUNCTION tide.relay_retry_message(text, bigint)
	IS 'delivers one message of the pipeline''s outbox again, as a manual attempt, without moving the offset';

CREATE FUNCTION tide.relay_replay(p_pipeline text, p_from_id bigint, p_to_id bigint)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
	p tide.relay_outbox_config;
	n bigint;
BEGIN
	p := tide._relay_pipeline(p_pipeline);
	IF p_from_id IS NULL OR p_to_id IS NULL THEN
		RAISE EXCEPTION 'replay range must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give p_from_id <= p_to_id, for example the ids tide.relay_attempts shows.';
	END IF;
	IF p_from_id > p_to_id THEN
		RAISE EXCEPTION 'replay range must be two ids, the first not above the second'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give p_from_id <= p_to_id, for example the ids tide.relay_attempts shows.';
	END IF;
	SELECT count(*) INTO n FROM tide.tide_outbox_messages
	 WHERE outbox_name = p.config ->> 'outbox' AND id BETWEEN p_from_id AND p_to_id;
	IF n > 100000 THEN
		RAISE EXCEPTION 'replay range holds % messages, more than 100000', n
			USING ERRCODE = 'program_limit_exceeded',
				  HINT = 'Replay a narrower range at a time.';
	END IF;
	RETURN tide._relay_queue_manual(p_pipeline, p_from_id, p_to_id);
END
$$;
COMMENT ON FUNCTION tide.relay_replay(text, bigint, bigint)
	IS 'delivers a range of the pipeline''s messages again, as manual attempts, without moving the live offset; returns how many';

-- ---------------------------------------------------------------------------
-- Status views.
-- ---------------------------------------------------------------------------
CREATE VIEW tide.relay_pipeline_lag AS
SELECT c.name AS pipeline,
	   c.config ->> 'outbox' AS outbox,
	   c.config ->> 'consumer_group' AS consumer_group,
	   coalesce(o.last_change_id, 0) AS delivered_upto,
	   (SELECT max(m.id) FROM tide.tide_outbox_messages m
		 WHERE m.outbox_name = c.config ->> 'outbox') AS newest_id,
	   (SELECT count(*) FROM tide.tide_outbox_messages m
		 WHERE m.outbox_name = c.config ->> 'outbox'
		   AND m.id > coalesce(o.last_change_id, 0)) AS lag_messages,
	   (SELECT now() - min(m.created_at) FROM tide.tide_outbox_messages m
		 WHERE m.outbox_name = c.config ->> 'outbox'
		   AND m.id > coalesce(o.last_change_id, 0)) AS lag_age
  FROM tide.relay_outbox_config c
  LEFT JOIN tide.relay_consumer_offsets o
		 ON o.pipeline_id = c.name AND o.relay_group_id = c.config ->> 'consumer_group'
		AND o.outbox_name = c.config ->> 'outbox';
COMMENT ON VIEW tide.relay_pipeline_lag
	IS 'per pipeline: the offset it has delivered up to, the newest message, and how many messages (and how old the oldest) wait';

CREATE VIEW tide.relay_pipeline_status AS
SELECT c.name AS pipeline,
	   c.enabled,
	   c.config ->> 'sink_type' AS sink_type,
	   c.config ->> 'outbox' AS outbox,
	   CASE WHEN NOT c.enabled THEN 'disabled'
			WHEN h.breaker = 'open' THEN 'breaker_open'
			WHEN coalesce(h.consecutive_failures, 0) = 0 THEN 'healthy'
			ELSE 'failing' END AS health,
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
	   (SELECT count(*) FROM tide.relay_attempts a
		 WHERE a.pipeline_id = c.name AND a.status = 'success'
		   AND a.attempted_at > now() - interval '1 minute') AS delivered_last_minute
  FROM tide.relay_outbox_config c
  JOIN tide.relay_pipeline_lag l ON l.pipeline = c.name
  LEFT JOIN tide.relay_pipeline_health h ON h.pipeline_id = c.name;
COMMENT ON VIEW tide.relay_pipeline_status
	IS 'per pipeline: health, failures in a row, offset, lag, in flight, retry queue, dead letters, last success and error, deliveries in the last minute';

-- ---------------------------------------------------------------------------
-- Retention. tide.outbox_sweep deletes an outbox's messages that are older
-- than its retention_hours and that every participant has passed: each
-- consumer group of the outbox (a relay pipeline reads through one, and a
-- live lease holds its group's position back), never above the publish
-- tracker's safe horizon. An outbox without consumer groups loses its
-- messages by age alone: nobody reads them. The relay worker runs it.
--
-- Why no group is locked. A group's position, least(leased_upto, lowest
-- lease_start - 1), is read in one statement, so from one snapshot, and
-- every id up to it is acknowledged in that snapshot. Polls, commits and
-- lease changes only ever move a committed position forward: a poll leases
-- ids above leased_upto and moves leased_upto to the last of them, a
-- takeover splits a lease at its start, a commit raises a lease's start or
-- deletes the lease, a release only changes the expiry. So whatever
-- commits while a sweep runs, the ids at or below the position it read
-- stay acknowledged, and no poll reads them again: polls fetch ids above
-- leased_upto or inside a lease, all above the position. The sweep takes
-- no group lock, and consumers never wait for it, nor it for them. Two
-- things move a position back: tide.admin_rewind_offset and a new group
-- ('earliest' starts at 0). Each behaves as if it had run after the sweep
-- (neither reads messages): a rewind below what retention deleted, or a
-- group created during a sweep, starts at the oldest message still kept.
-- A group with no position yet ('none') holds every message.
--
-- The deletion takes ROW EXCLUSIVE on the message table, as publishers do:
-- publishers never wait for it. outbox_drop's SHARE ROW EXCLUSIVE waits for
-- a running sweep, as for a publisher. Rows are deleted in id order,
-- p_batch_size per statement, at most 100 statements per call; the rows a
-- concurrent sweep has locked are skipped.
-- ---------------------------------------------------------------------------

-- The participants of an outbox: one row per consumer group with its
-- position (NULL when it has none yet), named as the pipeline that reads
-- through it, else as the consumer whose lease holds the position below the
-- group's dispatch cursor, else as the group.
CREATE FUNCTION tide._retention_participants(p_outbox text)
RETURNS TABLE (kind text, name text, group_name text, passed_upto bigint)
LANGUAGE sql STABLE
AS $$
	SELECT CASE WHEN p.name IS NOT NULL THEN 'pipeline'
				WHEN l.lease_start - 1 < g.leased_upto THEN 'lease'
				ELSE 'consumer_group' END,
		   CASE WHEN p.name IS NOT NULL THEN p.name
				WHEN l.lease_start - 1 < g.leased_upto THEN l.consumer_id
				ELSE g.group_name END,
		   g.group_name,
		   CASE WHEN g.leased_upto IS NOT NULL THEN least(g.leased_upto, l.lease_start - 1) END
	  FROM tide.tide_consumer_groups g
	  LEFT JOIN LATERAL (SELECT x.consumer_id, x.lease_start
						   FROM tide.tide_consumer_leases x
						  WHERE x.group_name = g.group_name
						  ORDER BY x.lease_start, x.consumer_id LIMIT 1) l ON true
	  LEFT JOIN LATERAL (SELECT min(r.name) AS name
						   FROM tide.relay_outbox_config r
						  WHERE r.config ->> 'consumer_group' = g.group_name) p ON true
	 WHERE g.outbox_name = p_outbox
$$;

-- What retention may delete from an outbox now: its messages created before
-- cutoff with ids up to bound (the lowest participant position, capped by
-- the safe horizon); and, when messages past retention lie above bound, the
-- blocker: the participant with the lowest position, or the safe horizon
-- when no participant is below it (an open publishing transaction).
CREATE FUNCTION tide._outbox_retention(p_outbox text, p_keep interval,
									   OUT cutoff timestamptz, OUT safe_horizon bigint,
									   OUT bound bigint, OUT blocker jsonb)
LANGUAGE plpgsql
AS $$
DECLARE
	low record;
	has_low boolean;
BEGIN
	cutoff := now() - p_keep;
	-- The horizon first: the positions and the messages are read by later
	-- statements, with later snapshots.
	safe_horizon := tide._safe_horizon();
	SELECT * INTO low FROM tide._retention_participants(p_outbox) r
	 ORDER BY r.passed_upto NULLS FIRST, r.kind, r.name LIMIT 1;
	has_low := FOUND;
	IF NOT has_low THEN
		bound := safe_horizon;
	ELSE
		bound := least(coalesce(low.passed_upto, 0), safe_horizon);
	END IF;
	IF EXISTS (SELECT 1 FROM tide.tide_outbox_messages m
				WHERE m.outbox_name = p_outbox AND m.id > bound AND m.created_at < cutoff) THEN
		IF has_low AND coalesce(low.passed_upto, -1) < safe_horizon THEN
			blocker := jsonb_build_object('kind', low.kind, 'name', low.name,
										  'group', low.group_name, 'position', low.passed_upto);
		ELSE
			blocker := jsonb_build_object('kind', 'safe_horizon', 'name', NULL,
										  'group', NULL, 'position', safe_horizon);
		END IF;
	END IF;
END
$$;

CREATE FUNCTION tide.outbox_sweep(p_outbox_name text DEFAULT NULL,
								  p_batch_size int DEFAULT 1000,
								  p_dry_run boolean DEFAULT false,
								  p_older_than interval DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
	max_batches constant int := 100;
	cfg tide.tide_outbox_config;
	r record;
	eligible bigint;
	deleted bigint;
	batches int;
	more boolean;
	after_id bigint;
	n bigint;
	last_id bigint;
	total bigint := 0;
	total_batches int := 0;
	any_more boolean := false;
	items jsonb := '[]';
BEGIN
	IF p_outbox_name IS NOT NULL THEN
		PERFORM tide._outbox_config(p_outbox_name);
	END IF;
	IF p_batch_size IS NULL THEN
		RAISE EXCEPTION 'batch size must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give the most messages to delete with one statement, from 1 to 10000.';
	END IF;
	IF p_batch_size < 1 OR p_batch_size > 10000 THEN
		RAISE EXCEPTION 'batch size must be between 1 and 10000'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give the most messages to delete with one statement.';
	END IF;
	IF p_dry_run IS NULL THEN
		RAISE EXCEPTION 'dry_run must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Pass true to count what would be deleted, false to delete it.';
	END IF;
	PERFORM tide._check_age(p_older_than,
		'Give p_older_than, to sweep messages older than it instead of the outbox''s retention_hours, or leave it NULL.');

	FOR cfg IN SELECT * FROM tide.tide_outbox_config c
				WHERE p_outbox_name IS NULL OR c.outbox_name = p_outbox_name
				ORDER BY c.outbox_name
	LOOP
		r := tide._outbox_retention(cfg.outbox_name,
									coalesce(p_older_than, make_interval(hours => cfg.retention_hours)));
		-- Every id up to r.bound belongs to a transaction that has ended
		-- (bound <= safe horizon), so this snapshot sees the whole set, and
		-- nothing joins it later.
		SELECT count(*) INTO eligible FROM tide.tide_outbox_messages m
		 WHERE m.outbox_name = cfg.outbox_name AND m.id <= r.bound AND m.created_at < r.cutoff;
		deleted := 0;
		batches := 0;
		more := false;
		after_id := 0;
		IF NOT p_dry_run THEN
			WHILE deleted < eligible LOOP
				IF total_batches >= max_batches THEN
					more := true;
					EXIT;
				END IF;
				WITH b AS (
					SELECT m.id FROM tide.tide_outbox_messages m
					 WHERE m.outbox_name = cfg.outbox_name AND m.id > after_id AND m.id <= r.bound
					   AND m.created_at < r.cutoff
					 ORDER BY m.id LIMIT p_batch_size
					   FOR UPDATE SKIP LOCKED),
				d AS (
					DELETE FROM tide.tide_outbox_messages m USING b WHERE m.id = b.id
					RETURNING m.id)
				SELECT count(*), max(d.id) INTO n, last_id FROM d;
				batches := batches + 1;
				total_batches := total_batches + 1;
				deleted := deleted + n;
				EXIT WHEN n < p_batch_size;
				after_id := last_id;
			END LOOP;
		END IF;
		total := total + deleted;
		any_more := any_more OR more;
		items := items || jsonb_build_object(
					'outbox', cfg.outbox_name,
					'retention_hours', cfg.retention_hours,
					'safe_horizon', r.safe_horizon,
					'horizon_id', r.bound,
					'eligible', eligible,
					'deleted', deleted,
					'batches', batches,
					'more', more,
					'blocker', r.blocker);
	END LOOP;
	RETURN jsonb_build_object('outboxes', items, 'deleted', total, 'batches', total_batches,
							  'more', any_more, 'dry_run', p_dry_run);
END
$$;
COMMENT ON FUNCTION tide.outbox_sweep(text, int, boolean, interval)
	IS 'deletes messages older than retention_hours (or p_older_than) that every consumer group has passed, in batches; names what holds retention back';

CREATE VIEW tide.outbox_retention_status AS
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

-- ---------------------------------------------------------------------------
-- Publishing and consuming rights (docs/security.md#publishing-rights,
-- #consuming-rights). A role may publish to an outbox, or consume from its
-- consumer groups, when it has the privileges of a grantee listed in
-- outbox_publish_grants or outbox_consume_grants (role membership with
-- INHERIT), of tide_admin, of the extension's owner, or is a superuser.
-- tide.outbox_publish and the consumer API check it in C
-- (src/outbox_rights.c) against the caller's identity; each backend caches
-- the answers until a grants table or a role membership changes. A relay
-- pipeline's consumer group is consumed by the relay alone unless its
-- config has "allow_other_consumers": true; the cache of the pipelines'
-- groups is cleared when relay_outbox_config changes.
-- ---------------------------------------------------------------------------
CREATE TABLE tide.outbox_publish_grants (
	outbox_name	text NOT NULL REFERENCES tide.tide_outbox_config (outbox_name) ON DELETE CASCADE,
	grantee		regrole NOT NULL,
	granted_by	regrole,
	granted_at	timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (outbox_name, grantee)
);
COMMENT ON TABLE tide.outbox_publish_grants
	IS 'Per outbox: the roles (and, by inheritance, their members) that may publish to it';
SELECT pg_catalog.pg_extension_config_dump('tide.outbox_publish_grants', '');

CREATE TABLE tide.outbox_consume_grants (
	outbox_name	text NOT NULL REFERENCES tide.tide_outbox_config (outbox_name) ON DELETE CASCADE,
	grantee		regrole NOT NULL,
	granted_by	regrole,
	granted_at	timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (outbox_name, grantee)
);
COMMENT ON TABLE tide.outbox_consume_grants
	IS 'Per outbox: the roles (and, by inheritance, their members) that may consume from its consumer groups';
SELECT pg_catalog.pg_extension_config_dump('tide.outbox_consume_grants', '');

-- Makes every backend forget its cached rights (or pipelines' groups) at commit.
CREATE FUNCTION tide._rights_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'tide_rights_changed'
LANGUAGE C VOLATILE;
CREATE TRIGGER outbox_publish_grants_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tide.outbox_publish_grants
	FOR EACH STATEMENT EXECUTE FUNCTION tide._rights_changed();
CREATE TRIGGER outbox_consume_grants_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tide.outbox_consume_grants
	FOR EACH STATEMENT EXECUTE FUNCTION tide._rights_changed();
CREATE TRIGGER relay_outbox_config_rights_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tide.relay_outbox_config
	FOR EACH STATEMENT EXECUTE FUNCTION tide._rights_changed();

-- The oid of an existing role, or 42704.
CREATE FUNCTION tide._role(p_role text)
RETURNS regrole
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	r oid;
BEGIN
	IF p_role IS NULL THEN
		RAISE EXCEPTION 'role must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give the name of an existing role, as in pg_roles.rolname.';
	END IF;
	SELECT a.oid INTO r FROM pg_catalog.pg_roles a WHERE a.rolname = p_role;
	IF r IS NULL THEN
		RAISE EXCEPTION 'role "%" does not exist', p_role
			USING ERRCODE = 'undefined_object',
				  HINT = 'Give the name of an existing role, as in pg_roles.rolname.';
	END IF;
	RETURN r::regrole;
END
$$;

CREATE FUNCTION tide.outbox_grant_publish(p_outbox text, p_role text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._outbox_config(p_outbox);
	INSERT INTO tide.outbox_publish_grants (outbox_name, grantee, granted_by)
	VALUES (p_outbox, tide._role(p_role), current_user::regrole)
	ON CONFLICT (outbox_name, grantee) DO NOTHING;
END
$$;
COMMENT ON FUNCTION tide.outbox_grant_publish(text, text)
	IS 'lets a role and the members that inherit its privileges publish to an outbox';

CREATE FUNCTION tide.outbox_revoke_publish(p_outbox text, p_role text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._outbox_config(p_outbox);
	DELETE FROM tide.outbox_publish_grants
	 WHERE outbox_name = p_outbox AND grantee = tide._role(p_role);
	IF NOT FOUND THEN
		RAISE NOTICE 'role "%" had no right to publish to outbox "%"', p_role, p_outbox;
	END IF;
END
$$;
COMMENT ON FUNCTION tide.outbox_revoke_publish(text, text)
	IS 'takes back a role''s right to publish to an outbox';

CREATE FUNCTION tide.outbox_grant_consume(p_outbox text, p_role text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._outbox_config(p_outbox);
	INSERT INTO tide.outbox_consume_grants (outbox_name, grantee, granted_by)
	VALUES (p_outbox, tide._role(p_role), current_user::regrole)
	ON CONFLICT (outbox_name, grantee) DO NOTHING;
END
$$;
COMMENT ON FUNCTION tide.outbox_grant_consume(text, text)
	IS 'lets a role and the members that inherit its privileges consume from an outbox''s consumer groups';

CREATE FUNCTION tide.outbox_revoke_consume(p_outbox text, p_role text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._outbox_config(p_outbox);
	DELETE FROM tide.outbox_consume_grants
	 WHERE outbox_name = p_outbox AND grantee = tide._role(p_role);
	IF NOT FOUND THEN
		RAISE NOTICE 'role "%" had no right to consume from outbox "%"', p_role, p_outbox;
	END IF;
END
$$;
COMMENT ON FUNCTION tide.outbox_revoke_consume(text, text)
	IS 'takes back a role''s right to consume from an outbox''s consumer groups';

-- A file pipeline appends to a server file as the server's operating
-- system user: whoever writes such a row, through relay_set_outbox or by
-- hand, must be a superuser or a member of pg_write_server_files. Runs as
-- the role that writes the row.
CREATE FUNCTION tide._relay_check_file_sink()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
	IF NEW.config ->> 'sink_type' = 'file'
	   AND (TG_OP = 'INSERT'
			OR OLD.config ->> 'sink_type' IS DISTINCT FROM 'file'
			OR OLD.config -> 'path' IS DISTINCT FROM NEW.config -> 'path')
	   AND NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = current_user::regrole)
	   AND NOT pg_catalog.pg_has_role(current_user, 'pg_write_server_files', 'MEMBER') THEN
		RAISE EXCEPTION 'permission denied to set a file pipeline'
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = 'The relay writes the file as the operating system user of the server.',
				  HINT = 'Only superusers and members of pg_write_server_files may set a file pipeline.';
	END IF;
	RETURN NEW;
END
$$;
CREATE TRIGGER relay_outbox_config_file_sink
	BEFORE INSERT OR UPDATE ON tide.relay_outbox_config
	FOR EACH ROW EXECUTE FUNCTION tide._relay_check_file_sink();

-- ---------------------------------------------------------------------------
-- Privileges (docs/security.md). Four roles, cluster-wide, created when
-- missing and left in place by DROP EXTENSION:
--   tide_admin      the whole API, and the catalog tables (it is trusted to
--                   run pg_tide; the file-sink trigger above still applies)
--   tide_publisher  outbox_publish(_batch), for the outboxes granted to it
--   tide_consumer   the consumer-group API, for the outboxes granted to it,
--                   and the inbox API
--   tide_reader     the status views and functions
-- PUBLIC gets nothing. Functions that a reader calls but that touch tables
-- it may not touch run as the owner (SECURITY DEFINER); outbox_publish and
-- the consumer-group API run as the caller, check the caller's right, and
-- do their reads and writes as the owner (src/outbox_rights.c). Every
-- function runs with search_path = pg_catalog, pg_temp, so that no name in
-- the extension is resolved through the caller's search_path.
-- ---------------------------------------------------------------------------
DO $$
DECLARE
	r text;
BEGIN
	FOREACH r IN ARRAY ARRAY['tide_admin', 'tide_publisher', 'tide_consumer', 'tide_reader'] LOOP
		IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
			EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
		END IF;
	END LOOP;
END
$$;

REVOKE ALL ON ALL TABLES IN SCHEMA tide FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA tide FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA tide FROM PUBLIC;
GRANT USAGE ON SCHEMA tide TO tide_admin, tide_publisher, tide_consumer, tide_reader;

-- tide_admin: every function and every table.
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA tide TO tide_admin;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA tide TO tide_admin;
GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA tide TO tide_admin;

-- tide_publisher: publishing, subject to the per-outbox rights.
GRANT EXECUTE ON FUNCTION tide.outbox_publish(text, jsonb, jsonb),
	tide.outbox_publish_batch(text, jsonb[], jsonb) TO tide_publisher;

-- tide_consumer: consumer groups, subject to the per-outbox rights (these
-- check the caller, then write offsets and leases as the owner; their
-- internal functions, tide._commit_offset and the like, are not granted)
-- and inboxes (these run as the caller: inbox_process calls the caller's
-- handler; inbox_create grants each inbox table to tide_consumer).
GRANT EXECUTE ON FUNCTION tide.poll_outbox(text, text, int, int),
	tide.wait_for_messages(text, int),
	tide.commit_offset(text, text, bigint),
	tide.consumer_heartbeat(text, text),
	tide.extend_lease(text, text, int),
	tide.release_lease(text, text),
	tide.inbox_receive(text, text, jsonb, jsonb, text),
	tide.inbox_receive_batch(text, jsonb),
	tide.inbox_claim(text, int, int),
	tide.inbox_mark_processed(text, text),
	tide.inbox_mark_failed(text, text, text),
	tide.inbox_process(text, regproc, int),
	tide.inbox_dlq(text),
	tide.inbox_status(text),
	tide._inbox_config(text),
	tide._inbox_table(tide.tide_inbox_config),
	tide._inbox_lock_message(tide.tide_inbox_config, text),
	tide._inbox_status(tide.tide_inbox_config) TO tide_consumer;
-- The validators that the functions running as their caller (the inbox's,
-- the status functions) call: they only check their arguments and raise.
GRANT EXECUTE ON FUNCTION tide._check_chars(text, text),
	tide._check_name(text, text),
	tide._check_flag(text, boolean),
	tide._check_consumer(text),
	tide._check_inbox_name(text),
	tide._check_event_id(text),
	tide._check_payload(jsonb, int),
	tide._check_visibility(int),
	tide._check_batch_size(int),
	tide._check_retention_hours(text, int, text),
	tide._check_age(interval, text) TO tide_consumer, tide_reader;
GRANT SELECT ON tide.tide_inbox_config TO tide_consumer;

-- tide_reader: status. The views read their tables as the owner; the
-- functions they call and the tables those read are granted here. The
-- pipeline configs (secrets), the messages, dead letters and attempts
-- (payloads and responses) are not.
GRANT SELECT ON tide.consumer_lag, tide.relay_pipeline_lag, tide.relay_pipeline_status,
	tide.outbox_retention_status,
	tide.tide_outbox_config, tide.tide_consumer_groups, tide.tide_consumer_offsets,
	tide.tide_consumer_leases, tide.tide_inbox_config, tide.relay_consumer_offsets,
	tide.relay_pipeline_health, tide.outbox_publish_grants, tide.outbox_consume_grants TO tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_status(text),
	tide.inbox_status(text),
	tide.relay_workers(),
	tide.relay_dlq_stats(),
	tide._group_position(text),
	tide._outbox_retention(text, interval),
	tide._inbox_config(text),
	tide._inbox_status(tide.tide_inbox_config),
	tide._inbox_table(tide.tide_inbox_config) TO tide_reader;
ALTER FUNCTION tide.outbox_status(text) SECURITY DEFINER;
ALTER FUNCTION tide.relay_dlq_stats() SECURITY DEFINER;
ALTER FUNCTION tide._outbox_retention(text, interval) SECURITY DEFINER;

-- Every function: a fixed search_path.
DO $$
DECLARE
	f regprocedure;
BEGIN
	FOR f IN SELECT p.oid FROM pg_catalog.pg_proc p
			  WHERE p.pronamespace = 'tide'::regnamespace LOOP
		-- Left as they are: C functions that run no SQL (the id default runs
		-- once per message); publishing, the hot path, whose statements name
		-- every object with its schema (src/outbox.c); inbox_process, which
		-- runs the caller's handler in the caller's setting (its own
		-- statements name pg_catalog explicitly).
		CONTINUE WHEN f IN ('tide.inbox_process(text, regproc, int)'::regprocedure,
							'tide.outbox_publish(text, jsonb, jsonb)'::regprocedure,
							'tide.outbox_publish_batch(text, jsonb[], jsonb)'::regprocedure,
							'tide._next_message_id()'::regprocedure, 'tide._safe_horizon()'::regprocedure,
							'tide._oldest_open_publish_age()'::regprocedure,
							'tide._relay_wake_worker()'::regprocedure,
							'tide._relay_notify_launcher()'::regprocedure,
							'tide.relay_workers()'::regprocedure,
							'tide._relay_routing_check(jsonb, jsonb)'::regprocedure,
							'tide.relay_filter_matches(jsonb, jsonb, jsonb)'::regprocedure,
							'tide._rights_changed()'::regprocedure);
		EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp', f);
	END LOOP;
END
$$;
