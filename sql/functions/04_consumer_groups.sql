-- ---------------------------------------------------------------------------
-- Consumer groups
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION tide.create_consumer_group(p_name text, p_outbox text,
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
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.create_consumer_group(text, text, text, boolean)
	IS 'creates a consumer group that reads every message of an outbox';
REVOKE ALL ON FUNCTION tide.create_consumer_group(text,text,text,boolean) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.create_consumer_group(text,text,text,boolean) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.drop_consumer_group(p_name text, p_if_exists boolean DEFAULT false)
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
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.drop_consumer_group(text, boolean)
	IS 'drops a consumer group with its offsets and leases';
REVOKE ALL ON FUNCTION tide.drop_consumer_group(text,boolean) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.drop_consumer_group(text,boolean) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.poll_outbox(p_group text, p_consumer text,
								 p_batch_size int DEFAULT 100,
								 p_visibility_seconds int DEFAULT 30,
								 p_commit_upto bigint DEFAULT NULL)
RETURNS TABLE (id bigint, payload jsonb, headers jsonb, created_at timestamptz)
AS 'MODULE_PATHNAME', 'tide_poll_outbox'
LANGUAGE C VOLATILE ROWS 100
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.poll_outbox(text, text, int, int, bigint)
	IS 'leases the next batch of committed messages to a consumer of a group, after acknowledging its last batch up to p_commit_upto';
REVOKE ALL ON FUNCTION tide.poll_outbox(text,text,integer,integer,bigint) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.poll_outbox(text,text,integer,integer,bigint) TO tide_admin, tide_consumer;

CREATE OR REPLACE FUNCTION tide.wait_for_messages(p_group text, p_timeout_ms int DEFAULT 10000)
RETURNS boolean
AS 'MODULE_PATHNAME', 'tide_wait_for_messages'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.wait_for_messages(text, int)
	IS 'waits until the group has messages to poll (woken at commit); false on timeout';
REVOKE ALL ON FUNCTION tide.wait_for_messages(text,integer) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.wait_for_messages(text,integer) TO tide_admin, tide_consumer;

-- The consumer API runs as its caller: the C function checks the caller's
-- right to consume from the group (src/outbox_rights.c), then does its work
-- as the catalog's owner: commit_offset's in C (src/commit.c), the others'
-- in the internal function of the same name.
CREATE OR REPLACE FUNCTION tide.commit_offset(p_group text, p_consumer text, p_last_offset bigint)
RETURNS void
AS 'MODULE_PATHNAME', 'tide_commit_offset'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.commit_offset(text, text, bigint)
	IS 'acknowledges a consumer''s lease up to and including a message id';
REVOKE ALL ON FUNCTION tide.commit_offset(text,text,bigint) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.commit_offset(text,text,bigint) TO tide_admin, tide_consumer;

-- Fetches a consumer's lease for update, or raises 55000. Like a commit,
-- it locks only the consumer's offset row, then its lease row.
CREATE OR REPLACE FUNCTION tide._own_lease(p_group text, p_consumer text)
RETURNS tide.tide_consumer_leases
LANGUAGE plpgsql
AS $$
DECLARE
	lease tide.tide_consumer_leases;
BEGIN
	PERFORM tide._lock_consumer(p_group, p_consumer);
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
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._own_lease(text,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._own_lease(text,text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.consumer_heartbeat(p_group text, p_consumer text)
RETURNS void
AS 'MODULE_PATHNAME', 'tide_consumer_heartbeat'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.consumer_heartbeat(text, text) IS 'records that a consumer is alive';
REVOKE ALL ON FUNCTION tide.consumer_heartbeat(text,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.consumer_heartbeat(text,text) TO tide_admin, tide_consumer;

CREATE OR REPLACE FUNCTION tide._consumer_heartbeat(p_group text, p_consumer text)
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
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._consumer_heartbeat(text,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._consumer_heartbeat(text,text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.extend_lease(p_group text, p_consumer text, p_seconds int)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'tide_extend_lease'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.extend_lease(text, text, int)
	IS 'keeps a consumer''s lease for p_seconds from now; returns the new expiry';
REVOKE ALL ON FUNCTION tide.extend_lease(text,text,integer) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.extend_lease(text,text,integer) TO tide_admin, tide_consumer;

CREATE OR REPLACE FUNCTION tide._extend_lease(p_group text, p_consumer text, p_seconds int)
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
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._extend_lease(text,text,integer) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._extend_lease(text,text,integer) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.release_lease(p_group text, p_consumer text)
RETURNS void
AS 'MODULE_PATHNAME', 'tide_release_lease'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.release_lease(text, text)
	IS 'gives a consumer''s leased messages back to the group at once';
REVOKE ALL ON FUNCTION tide.release_lease(text,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.release_lease(text,text) TO tide_admin, tide_consumer;

CREATE OR REPLACE FUNCTION tide._release_lease(p_group text, p_consumer text)
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
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._release_lease(text,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._release_lease(text,text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.admin_rewind_offset(p_group text, p_consumer text,
										 p_target_offset bigint,
										 p_confirm boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	horizon bigint;
BEGIN
	PERFORM tide._lock_consumer(p_group, p_consumer);
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
	-- Locks in the order every consumer call takes them (tide._lock_consumer):
	-- the named consumer's offset row (above), the group's lease rows, then
	-- the group row, which orders this with polls that hand out new messages.
	PERFORM 1 FROM tide.tide_consumer_leases l
	 WHERE l.group_name = p_group ORDER BY l.consumer_id FOR UPDATE;
	PERFORM tide._lock_group(p_group);
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
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.admin_rewind_offset(text, text, bigint, boolean)
	IS 'operator: sets a group''s position (also the first position of an ''none'' group)';
REVOKE ALL ON FUNCTION tide.admin_rewind_offset(text,text,bigint,boolean) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.admin_rewind_offset(text,text,bigint,boolean) TO tide_admin;
