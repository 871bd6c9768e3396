-- ---------------------------------------------------------------------------
-- Inboxes. Each inbox has its own table "<inbox_schema>"."<inbox_name>_inbox"
-- (see docs/inbox.md). Names go into SQL only through format('%I'); values
-- only as parameters of EXECUTE ... USING.
-- ---------------------------------------------------------------------------

-- Validates an inbox name: not null, non-empty, short enough that its
-- table name "<name>_inbox" fits in 63 bytes, the characters of
-- tide._check_chars().
CREATE OR REPLACE FUNCTION tide._check_inbox_name(p_name text)
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
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._check_inbox_name(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._check_inbox_name(text) TO tide_admin, tide_consumer, tide_reader;

-- Fetches an inbox's config row or raises 42704.
CREATE OR REPLACE FUNCTION tide._inbox_config(p_name text)
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
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._inbox_config(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._inbox_config(text) TO tide_admin, tide_consumer, tide_reader;

-- The inbox's table, quoted and schema-qualified, for format('%s').
CREATE OR REPLACE FUNCTION tide._inbox_table(p_cfg tide.tide_inbox_config)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
	SELECT format('%I.%I', p_cfg.inbox_schema, p_cfg.inbox_name || '_inbox')
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._inbox_table(tide.tide_inbox_config) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._inbox_table(tide.tide_inbox_config) TO tide_admin, tide_consumer, tide_reader;

-- Validates an event id: not null, 1 to 255 bytes, no control characters.
-- Ids come from senders, so anything else is taken as it is (they are
-- values, never part of SQL text).
CREATE OR REPLACE FUNCTION tide._check_event_id(p_event_id text)
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
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._check_event_id(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._check_event_id(text) TO tide_admin, tide_consumer, tide_reader;

-- Raises 54000 when a payload exceeds pg_tide.max_payload_bytes (p_index:
-- its place in a batch, or NULL); src/limits.c.
CREATE OR REPLACE FUNCTION tide._check_payload(p_payload jsonb, p_index int)
RETURNS void
AS 'MODULE_PATHNAME', 'tide_check_payload'
LANGUAGE C STABLE
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._check_payload(jsonb,integer) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._check_payload(jsonb,integer) TO tide_admin, tide_consumer, tide_reader;

-- Refuses a lease or claim duration outside 1 second to a day.
CREATE OR REPLACE FUNCTION tide._check_visibility(p_seconds int)
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
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._check_visibility(integer) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._check_visibility(integer) TO tide_admin, tide_consumer, tide_reader;

-- Refuses a retention in hours that is NULL, negative or above ten years
-- (0 keeps the rows); p_what names it.
CREATE OR REPLACE FUNCTION tide._check_retention_hours(p_what text, p_hours int, p_hint text)
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
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._check_retention_hours(text,integer,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._check_retention_hours(text,integer,text) TO tide_admin, tide_consumer, tide_reader;

CREATE OR REPLACE FUNCTION tide._check_batch_size(p_batch_size int)
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
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._check_batch_size(integer) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._check_batch_size(integer) TO tide_admin, tide_consumer, tide_reader;

-- Wakes the relay at commit when the inbox has a handler, so that the
-- events just stored are processed at once (src/inbox_wake.c). No SET
-- search_path: it runs on every receive, and its one query names
-- everything in full.
CREATE OR REPLACE FUNCTION tide._inbox_wake(p_name text)
RETURNS void
AS 'MODULE_PATHNAME', 'tide_inbox_wake'
LANGUAGE C VOLATILE STRICT;
REVOKE ALL ON FUNCTION tide._inbox_wake(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._inbox_wake(text) TO tide_admin, tide_consumer;

CREATE OR REPLACE FUNCTION tide.inbox_create(p_name text,
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
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.inbox_create(text, text, int, int, int)
	IS 'creates a named inbox with its table "<schema>"."<name>_inbox"';
REVOKE ALL ON FUNCTION tide.inbox_create(text,text,integer,integer,integer) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.inbox_create(text,text,integer,integer,integer) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.inbox_drop(p_name text, p_if_exists boolean DEFAULT false)
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
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.inbox_drop(text, boolean) IS 'drops an inbox with its table and messages';
REVOKE ALL ON FUNCTION tide.inbox_drop(text,boolean) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.inbox_drop(text,boolean) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.inbox_receive(p_name text, p_event_id text, p_payload jsonb,
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
	IF n > 0 THEN
		PERFORM tide._inbox_wake(p_name);
	END IF;
	RETURN n > 0;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.inbox_receive(text, text, jsonb, jsonb, text)
	IS 'stores an event unless its event id is known; returns true when it was new';
REVOKE ALL ON FUNCTION tide.inbox_receive(text,text,jsonb,jsonb,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.inbox_receive(text,text,jsonb,jsonb,text) TO tide_admin, tide_consumer;

CREATE OR REPLACE FUNCTION tide.inbox_receive_batch(p_name text, p_events jsonb)
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
	IF n > 0 THEN
		PERFORM tide._inbox_wake(p_name);
	END IF;
	RETURN n;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.inbox_receive_batch(text, jsonb)
	IS 'stores many events (a JSON array of {event_id, payload, headers, source}); returns how many were new';
REVOKE ALL ON FUNCTION tide.inbox_receive_batch(text,jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.inbox_receive_batch(text,jsonb) TO tide_admin, tide_consumer;

CREATE OR REPLACE FUNCTION tide.inbox_claim(p_name text, p_batch_size int DEFAULT 100,
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
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.inbox_claim(text, int, int)
	IS 'claims the oldest pending messages for p_visibility_seconds; concurrent claimers get disjoint messages';
REVOKE ALL ON FUNCTION tide.inbox_claim(text,integer,integer) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.inbox_claim(text,integer,integer) TO tide_admin, tide_consumer;

-- Fetches a message's state for update, or raises 42704.
CREATE OR REPLACE FUNCTION tide._inbox_lock_message(p_cfg tide.tide_inbox_config, p_event_id text,
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
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._inbox_lock_message(tide.tide_inbox_config,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._inbox_lock_message(tide.tide_inbox_config,text) TO tide_admin, tide_consumer;

CREATE OR REPLACE FUNCTION tide.inbox_mark_processed(p_name text, p_event_id text)
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
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.inbox_mark_processed(text, text)
	IS 'marks a message processed; returns false when it already was';
REVOKE ALL ON FUNCTION tide.inbox_mark_processed(text,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.inbox_mark_processed(text,text) TO tide_admin, tide_consumer;

CREATE OR REPLACE FUNCTION tide.inbox_mark_failed(p_name text, p_event_id text, p_error text)
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
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.inbox_mark_failed(text, text, text)
	IS 'records a failed attempt; returns true when the message was dead-lettered (after max_retries failures)';
REVOKE ALL ON FUNCTION tide.inbox_mark_failed(text,text,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.inbox_mark_failed(text,text,text) TO tide_admin, tide_consumer;

-- Refuses a NULL handler argument (tide.inbox_process and
-- tide.inbox_set_handler); p_hint says what each caller takes instead.
CREATE OR REPLACE FUNCTION tide._check_handler_given(p_handler oid, p_hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	IF p_handler IS NULL THEN
		RAISE EXCEPTION 'handler must not be null'
			USING ERRCODE = 'null_value_not_allowed', HINT = p_hint;
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._check_handler_given(oid,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._check_handler_given(oid,text) TO tide_admin, tide_consumer;

CREATE OR REPLACE FUNCTION tide.inbox_process(p_name text, p_handler regproc, p_batch_size int DEFAULT 100)
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
	PERFORM tide._check_handler_given(p_handler, 'Pass a function that takes the inbox''s row type.');
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
REVOKE ALL ON FUNCTION tide.inbox_process(text,regproc,integer) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.inbox_process(text,regproc,integer) TO tide_admin, tide_consumer;

CREATE OR REPLACE FUNCTION tide.inbox_dlq(p_name text)
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
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.inbox_dlq(text) IS 'lists an inbox''s dead-lettered messages, oldest first';
REVOKE ALL ON FUNCTION tide.inbox_dlq(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.inbox_dlq(text) TO tide_admin, tide_consumer;

CREATE OR REPLACE FUNCTION tide.replay_inbox_messages(p_name text, p_event_ids text[])
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
	IF n > 0 THEN
		PERFORM tide._inbox_wake(p_name);
	END IF;
	RETURN n;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.replay_inbox_messages(text, text[])
	IS 'makes dead-lettered messages pending again with retry_count 0; returns how many';
REVOKE ALL ON FUNCTION tide.replay_inbox_messages(text,text[]) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.replay_inbox_messages(text,text[]) TO tide_admin;

-- One inbox's status object.
CREATE OR REPLACE FUNCTION tide._inbox_status(p_cfg tide.tide_inbox_config)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
	result jsonb;
	handler_status jsonb;
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
	-- An inbox with a handler: what the relay did with it (tide.inbox_handler_status).
	SELECT jsonb_build_object(
			'function', v.handler::text, 'run_as', v.run_as, 'enabled', v.enabled,
			'batch_size', v.batch_size, 'concurrency', v.concurrency,
			'effective_concurrency', v.effective_concurrency, 'running', v.running,
			'processed', v.processed, 'failed', v.failed, 'dead_lettered', v.dead_lettered,
			'last_success_at', v.last_success_at, 'last_failure_at', v.last_failure_at,
			'last_error', v.last_error, 'held_since', v.held_since, 'held_reason', v.held_reason)
	  INTO handler_status
	  FROM tide.inbox_handler_status v
	 WHERE v.inbox = p_cfg.inbox_name;
	IF FOUND THEN
		result := result || jsonb_build_object('handler', handler_status);
	END IF;
	RETURN result;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._inbox_status(tide.tide_inbox_config) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._inbox_status(tide.tide_inbox_config) TO tide_admin, tide_consumer, tide_reader;

CREATE OR REPLACE FUNCTION tide.inbox_status(p_name text DEFAULT NULL)
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
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.inbox_status(text)
	IS 'pending, claimed, processed and dead-lettered counts and oldest pending age of an inbox (NULL: an array of all inboxes)';
REVOKE ALL ON FUNCTION tide.inbox_status(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.inbox_status(text) TO tide_admin, tide_consumer, tide_reader;

CREATE OR REPLACE FUNCTION tide.inbox_truncate_processed(p_name text)
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
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.inbox_truncate_processed(text)
	IS 'deletes processed and dead-lettered messages older than their retention; returns how many';
REVOKE ALL ON FUNCTION tide.inbox_truncate_processed(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.inbox_truncate_processed(text) TO tide_admin;
