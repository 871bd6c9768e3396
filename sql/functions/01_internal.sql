-- ---------------------------------------------------------------------------
-- Internal C helpers. Their names start with "_"; they are called by the API
-- functions and by the message id default, so they run as the caller.
-- ---------------------------------------------------------------------------
-- ---------------------------------------------------------------------------
-- Internal SQL helpers
-- ---------------------------------------------------------------------------

-- Takes the next message id after registering this transaction in the publish
-- tracker, so that every way of inserting a message is commit-order safe.
CREATE OR REPLACE FUNCTION tide._next_message_id()
RETURNS bigint
AS 'MODULE_PATHNAME', 'tide_next_message_id'
LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION tide._next_message_id() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._next_message_id() TO tide_admin;

-- The highest message id below which every id has either committed or
-- aborted: readers never go past it.
CREATE OR REPLACE FUNCTION tide._safe_horizon()
RETURNS bigint
AS 'MODULE_PATHNAME', 'tide_safe_horizon'
LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION tide._safe_horizon() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._safe_horizon() TO tide_admin;

-- Age in seconds of the oldest transaction in this database that has
-- published and is still open; NULL when there is none.
CREATE OR REPLACE FUNCTION tide._oldest_open_publish_age()
RETURNS double precision
AS 'MODULE_PATHNAME', 'tide_oldest_open_publish_age'
LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION tide._oldest_open_publish_age() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._oldest_open_publish_age() TO tide_admin;

-- Refuses a name or id with a character other than ASCII letters, digits,
-- "_", "-", "." and ":"; p_what names it in the message. Names travel into
-- HTTP headers (webhook-id), logs and file names: nothing in them needs
-- quoting or escaping anywhere. The same rules as check_chars() in
-- src/names.c.
CREATE OR REPLACE FUNCTION tide._check_chars(p_what text, p_value text)
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
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._check_chars(text,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._check_chars(text,text) TO tide_admin, tide_consumer, tide_reader;

-- Validates an outbox, consumer-group or pipeline name: not null, 1 to 63
-- bytes, the characters of tide._check_chars(). The same rules as
-- TideValidateName() in src/names.c.
CREATE OR REPLACE FUNCTION tide._check_name(p_kind text, p_name text)
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
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._check_name(text,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._check_name(text,text) TO tide_admin, tide_consumer, tide_reader;

-- Refuses a NULL flag argument (p_if_exists and the like); p_name names it.
CREATE OR REPLACE FUNCTION tide._check_flag(p_name text, p_value boolean)
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
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._check_flag(text,boolean) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._check_flag(text,boolean) TO tide_admin, tide_consumer, tide_reader;

-- Every message id up to a group's position has been acknowledged: the
-- position is the group's dispatch cursor, held back by its oldest lease.
CREATE OR REPLACE FUNCTION tide._group_position(p_group text)
RETURNS bigint
LANGUAGE sql STABLE
AS $$
	SELECT least(g.leased_upto,
				 (SELECT min(l.lease_start) - 1
					FROM tide.tide_consumer_leases l
				   WHERE l.group_name = g.group_name))
	  FROM tide.tide_consumer_groups g
	 WHERE g.group_name = p_group
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._group_position(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._group_position(text) TO tide_admin, tide_reader;

-- The lowest position among an outbox's positioned consumer groups: the
-- messages above it are unconsumed. 0 when no group has a position, so
-- that every message counts as unconsumed.
CREATE OR REPLACE FUNCTION tide._outbox_low_water(p_outbox text)
RETURNS bigint
LANGUAGE sql STABLE
AS $$
	SELECT coalesce(min(tide._group_position(g.group_name)), 0)
	  FROM tide.tide_consumer_groups g
	 WHERE g.outbox_name = p_outbox
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._outbox_low_water(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._outbox_low_water(text) TO tide_admin;

-- Fetches an outbox's config row or raises 42704.
CREATE OR REPLACE FUNCTION tide._outbox_config(p_name text)
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
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._outbox_config(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._outbox_config(text) TO tide_admin;

-- Locks a consumer group's row and returns it, or raises 42704. A poll that
-- hands out new messages (src/consumer.c), a rewind and relay_set_outbox
-- take it, always with one strength and after the consumer's own rows (see
-- tide._lock_consumer): they run one at a time. FOR NO KEY UPDATE leaves
-- the key share locks of foreign key checks alone.
CREATE OR REPLACE FUNCTION tide._lock_group(p_group text)
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
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._lock_group(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._lock_group(text) TO tide_admin;

-- Validates a consumer id: the same rules as TideValidateConsumerId() in
-- src/names.c.
CREATE OR REPLACE FUNCTION tide._check_consumer(p_consumer text)
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
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._check_consumer(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._check_consumer(text) TO tide_admin, tide_consumer, tide_reader;

-- Locks a consumer's offset row and returns its committed offset: NULL when
-- the consumer is not known in the group, 42704 when the group does not
-- exist. Commits, lease changes and polls of a consumer take their locks in
-- one order: this row, then lease rows, then (a poll that hands out new
-- messages, a rewind) the group row. So they never deadlock, and only
-- polls that move the group's dispatch cursor wait for each other.
CREATE OR REPLACE FUNCTION tide._lock_consumer(p_group text, p_consumer text)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
	committed bigint;
BEGIN
	PERFORM tide._check_name('consumer group', p_group);
	PERFORM tide._check_consumer(p_consumer);
	SELECT o.committed_offset INTO committed
	  FROM tide.tide_consumer_offsets o
	 WHERE o.group_name = p_group AND o.consumer_id = p_consumer
	   FOR NO KEY UPDATE;
	IF NOT FOUND AND NOT EXISTS (SELECT 1 FROM tide.tide_consumer_groups WHERE group_name = p_group) THEN
		RAISE EXCEPTION 'consumer group "%" does not exist', p_group
			USING ERRCODE = 'undefined_object',
				  HINT = 'Create it with tide.create_consumer_group().';
	END IF;
	RETURN committed;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._lock_consumer(text,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._lock_consumer(text,text) TO tide_admin;

-- Raises a WARNING when the server did not preload the library; the install
-- script calls it, so CREATE EXTENSION says what is missing.
CREATE OR REPLACE FUNCTION tide._warn_unless_preloaded()
RETURNS void
AS 'MODULE_PATHNAME', 'tide_warn_unless_preloaded'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._warn_unless_preloaded() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
