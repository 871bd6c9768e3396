-- ---------------------------------------------------------------------------
-- Relay pipelines. A forward pipeline is a row of relay_outbox_config; its
-- config jsonb holds the outbox, the consumer group it reads through and the
-- sink's settings, validated and completed with defaults whenever a row is
-- written (relay/pipeline_config.c; see docs/relay.md#pipelines). The relay
-- delivers them through the sinks of relay/endpoints/. A reverse pipeline (source -> inbox) is a row of
-- relay_inbox_config, validated the same way (relay/reverse_config.c).
-- A name is unique across both directions (relay/pipeline_names.c), so
-- relay_enable, relay_disable, relay_delete, relay_get_config and
-- relay_list_configs serve both.
-- ---------------------------------------------------------------------------

-- Validates a pipeline config and returns it as stored: every default
-- filled in, outbox and consumer group included (relay/pipeline_config.c,
-- the one validator: relay_set_outbox, the trigger on relay_outbox_config
-- and the relay worker run it). NULL p_outbox or p_consumer_group takes the
-- config's key. A file pipeline needs the caller to be a superuser or a
-- member of pg_write_server_files.
CREATE OR REPLACE FUNCTION tide._relay_normalize_config(p_outbox text, p_consumer_group text, p_config jsonb)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'tide_relay_normalize_config'
LANGUAGE C STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_normalize_config(text,text,jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_normalize_config(text,text,jsonb) TO tide_admin;

-- Validates a reverse pipeline's config and returns it as stored: every
-- default filled in, inbox included (relay/reverse_config.c, the one
-- validator: relay_set_inbox, the trigger on relay_inbox_config and the
-- relay worker run it). NULL p_inbox takes the config's key.
CREATE OR REPLACE FUNCTION tide._relay_normalize_reverse_config(p_inbox text, p_config jsonb)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'tide_relay_normalize_reverse_config'
LANGUAGE C STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_normalize_reverse_config(text,jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_normalize_reverse_config(text,jsonb) TO tide_admin;

-- Refuses (23505) a pipeline name that the other direction already has:
-- p_reverse true for a name relay_inbox_config is to hold. It waits for a
-- transaction creating the same name (relay/pipeline_names.c).
CREATE OR REPLACE FUNCTION tide._relay_check_pipeline_name(p_name text, p_reverse boolean)
RETURNS void
AS 'MODULE_PATHNAME', 'tide_relay_check_pipeline_name'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_check_pipeline_name(text,boolean) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_check_pipeline_name(text,boolean) TO tide_admin;

-- A reverse pipeline's config with the secrets its source type declares
-- shown as ********; when no endpoint on this server provides the type,
-- every string but inbox and source_type (relay/endpoints/redact.c).
CREATE OR REPLACE FUNCTION tide._relay_redact_source(p_config jsonb)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'tide_relay_redact_source'
LANGUAGE C STABLE STRICT
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_redact_source(jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_redact_source(jsonb) TO tide_admin;

-- The config with its secrets replaced by "********": the keys that the
-- routine of its sink type declares, such as a webhook's
-- signing_secret and the headers whose name says they carry a credential
-- or that are marked {"secret": true}, or a broker's "auth" members
-- (relay/endpoints/redact.c). A type whose module cannot be loaded is
-- redacted conservatively. References to secrets ({"env": ...},
-- {"file": ...}) are shown: they are names, not secrets. STABLE: the
-- result depends on the modules installed.
CREATE OR REPLACE FUNCTION tide._relay_redact(p_config jsonb)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'tide_relay_redact'
LANGUAGE C STABLE STRICT
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_redact(jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_redact(jsonb) TO tide_admin;

-- Locks a pipeline's row and returns it, or raises 42704.
CREATE OR REPLACE FUNCTION tide._relay_pipeline(p_name text)
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
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_pipeline(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_pipeline(text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_set_outbox(p_name text, p_outbox text, p_consumer_group text, p_config jsonb)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	cfg jsonb;
	g tide.tide_consumer_groups;
	other text;
BEGIN
	PERFORM tide._check_name('pipeline', p_name);
	PERFORM tide._relay_check_pipeline_name(p_name, false);
	PERFORM tide._check_name('consumer group', p_consumer_group);
	PERFORM tide._outbox_config(p_outbox);

	-- Validated and completed with defaults in C (relay/pipeline_config.c);
	-- the row's trigger checks it again as it is written.
	cfg := tide._relay_normalize_config(p_outbox, p_consumer_group, p_config);

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

	-- The caller owns the pipeline: the files its config names are
	-- checked with the caller's rights, now and by the relay worker.
	INSERT INTO tide.relay_outbox_config AS c (name, config, owner)
	VALUES (p_name, cfg, current_user)
	ON CONFLICT (name) DO UPDATE SET config = EXCLUDED.config, owner = EXCLUDED.owner
	 WHERE c.config IS DISTINCT FROM EXCLUDED.config OR c.owner IS DISTINCT FROM EXCLUDED.owner;
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
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.relay_set_outbox(text, text, text, jsonb)
	IS 'creates or replaces a forward pipeline from an outbox, read through a consumer group (created if missing), to a sink';
REVOKE ALL ON FUNCTION tide.relay_set_outbox(text,text,text,jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_set_outbox(text,text,text,jsonb) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_set_inbox(p_name text, p_inbox text, p_config jsonb)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	cfg jsonb;
	old_type text;
BEGIN
	PERFORM tide._check_name('pipeline', p_name);
	PERFORM tide._relay_check_pipeline_name(p_name, true);
	PERFORM tide._inbox_config(p_inbox);

	-- Validated and completed with defaults in C (relay/reverse_config.c);
	-- the row's trigger checks it again as it is written.
	cfg := tide._relay_normalize_reverse_config(p_inbox, p_config);

	SELECT config ->> 'source_type' INTO old_type FROM tide.relay_inbox_config
	 WHERE name = p_name FOR UPDATE;
	-- The caller owns the pipeline, as relay_set_outbox's caller does.
	INSERT INTO tide.relay_inbox_config AS c (name, config, owner)
	VALUES (p_name, cfg, current_user)
	ON CONFLICT (name) DO UPDATE SET config = EXCLUDED.config, owner = EXCLUDED.owner
	 WHERE c.config IS DISTINCT FROM EXCLUDED.config OR c.owner IS DISTINCT FROM EXCLUDED.owner;
	-- A position kept for another inbox or another type of source no
	-- longer applies.
	DELETE FROM tide.relay_consumer_offsets
	 WHERE pipeline_id = p_name
	   AND ((relay_group_id, outbox_name) IS DISTINCT FROM ('reverse', p_inbox)
			OR old_type IS DISTINCT FROM cfg ->> 'source_type');
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.relay_set_inbox(text, text, jsonb)
	IS 'creates or replaces a reverse pipeline from a source to an inbox';
REVOKE ALL ON FUNCTION tide.relay_set_inbox(text,text,jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_set_inbox(text,text,jsonb) TO tide_admin;

-- Sets a pipeline's enabled flag, forward or reverse; an unchanged flag
-- writes nothing.
CREATE OR REPLACE FUNCTION tide._relay_set_enabled(p_name text, p_enabled boolean)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	p tide.relay_outbox_config;
BEGIN
	PERFORM tide._check_name('pipeline', p_name);
	PERFORM FROM tide.relay_inbox_config WHERE name = p_name FOR UPDATE;
	IF FOUND THEN
		UPDATE tide.relay_inbox_config SET enabled = p_enabled
		 WHERE name = p_name AND enabled IS DISTINCT FROM p_enabled;
		RETURN;
	END IF;
	p := tide._relay_pipeline(p_name);
	UPDATE tide.relay_outbox_config SET enabled = p_enabled
	 WHERE name = p_name AND enabled IS DISTINCT FROM p_enabled;
	IF NOT p_enabled THEN
		PERFORM tide._outbox_paused_group_notice(p.config ->> 'outbox', p.config ->> 'consumer_group',
												 p_name, 'disabled');
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_set_enabled(text,boolean) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_set_enabled(text,boolean) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_enable(p_name text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT tide._relay_set_enabled(p_name, true);
END;
COMMENT ON FUNCTION tide.relay_enable(text) IS 'lets the relay run a pipeline, forward or reverse, again';
REVOKE ALL ON FUNCTION tide.relay_enable(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_enable(text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_disable(p_name text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT tide._relay_set_enabled(p_name, false);
END;
COMMENT ON FUNCTION tide.relay_disable(text)
	IS 'stops the relay running a pipeline, forward or reverse; its position is kept';
REVOKE ALL ON FUNCTION tide.relay_disable(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_disable(text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_delete(p_name text, p_keep_group boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	p tide.relay_outbox_config;
BEGIN
	PERFORM tide._check_flag('p_keep_group', p_keep_group);
	PERFORM tide._check_name('pipeline', p_name);
	-- A reverse pipeline has its position, health and counters; no group.
	DELETE FROM tide.relay_inbox_config WHERE name = p_name;
	IF FOUND THEN
		DELETE FROM tide.relay_consumer_offsets WHERE pipeline_id = p_name;
		DELETE FROM tide.relay_pipeline_health WHERE pipeline_id = p_name;
		RETURN;
	END IF;
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
	-- The group is the pipeline's position, and it holds back the outbox:
	-- left behind, it would count every message published after as
	-- unconsumed. It is kept only when asked, so that a pipeline set again
	-- with it resumes.
	IF NOT p_keep_group THEN
		DELETE FROM tide.tide_consumer_groups WHERE group_name = p.config ->> 'consumer_group';
	ELSIF EXISTS (SELECT 1 FROM tide.tide_consumer_groups WHERE group_name = p.config ->> 'consumer_group') THEN
		RAISE NOTICE 'consumer group "%" of pipeline "%" is kept', p.config ->> 'consumer_group', p_name
			USING HINT = 'Drop it with tide.drop_consumer_group() unless a pipeline or consumer will read through it again: its unread messages count as pending.';
		PERFORM tide._outbox_paused_group_notice(p.config ->> 'outbox', p.config ->> 'consumer_group',
												 p_name, 'deleted');
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.relay_delete(text, boolean)
	IS 'deletes a pipeline: a forward one with its retry queue and, unless p_keep_group, its consumer group (its dead letters are kept); a reverse one with its source position';
REVOKE ALL ON FUNCTION tide.relay_delete(text,boolean) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_delete(text,boolean) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_get_config(p_name text)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	cfg jsonb;
BEGIN
	PERFORM tide._check_name('pipeline', p_name);
	SELECT tide._relay_redact_source(config) INTO cfg FROM tide.relay_inbox_config WHERE name = p_name;
	IF FOUND THEN
		RETURN cfg;
	END IF;
	SELECT config INTO cfg FROM tide.relay_outbox_config WHERE name = p_name;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'pipeline "%" does not exist', p_name
			USING ERRCODE = 'undefined_object',
				  HINT = 'Create it with tide.relay_set_outbox(); tide.relay_list_configs() lists the pipelines.';
	END IF;
	RETURN tide._relay_redact(cfg);
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.relay_get_config(text)
	IS 'a pipeline''s effective config, forward or reverse, defaults filled in, secrets shown as ********';
REVOKE ALL ON FUNCTION tide.relay_get_config(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_get_config(text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_list_configs()
RETURNS TABLE (pipeline text, enabled boolean, outbox text, consumer_group text, sink_type text, config jsonb,
			   direction text, inbox text, source_type text)
LANGUAGE sql STABLE
AS $$
	SELECT c.name, c.enabled, c.config ->> 'outbox', c.config ->> 'consumer_group',
		   c.config ->> 'sink_type', tide._relay_redact(c.config), 'forward', c.config ->> 'inbox', NULL
	  FROM tide.relay_outbox_config c
	UNION ALL
	SELECT r.name, r.enabled, NULL, NULL, NULL, tide._relay_redact_source(r.config), 'reverse',
		   r.config ->> 'inbox', r.config ->> 'source_type'
	  FROM tide.relay_inbox_config r
	 ORDER BY 1
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.relay_list_configs()
	IS 'every pipeline, forward (outbox, consumer group, sink type) and reverse (inbox, source type), with its config, secrets shown as ********';
REVOKE ALL ON FUNCTION tide.relay_list_configs() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_list_configs() TO tide_admin;
