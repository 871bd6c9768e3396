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

-- Makes every backend forget its cached rights (or pipelines' groups, or
-- what it remembers of an outbox for publishing) at commit: a relcache
-- invalidation of the trigger's table.
CREATE OR REPLACE FUNCTION tide._rights_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'tide_rights_changed'
LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION tide._rights_changed() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._rights_changed() TO tide_admin;

-- The oid of an existing role, or 42704.
CREATE OR REPLACE FUNCTION tide._role(p_role text)
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
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._role(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._role(text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.outbox_grant_publish(p_outbox text, p_role text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._outbox_config(p_outbox);
	INSERT INTO tide.outbox_publish_grants (outbox_name, grantee, granted_by)
	VALUES (p_outbox, tide._role(p_role), current_user::regrole)
	ON CONFLICT (outbox_name, grantee) DO NOTHING;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.outbox_grant_publish(text, text)
	IS 'lets a role and the members that inherit its privileges publish to an outbox';
REVOKE ALL ON FUNCTION tide.outbox_grant_publish(text,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_grant_publish(text,text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.outbox_revoke_publish(p_outbox text, p_role text)
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
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.outbox_revoke_publish(text, text)
	IS 'takes back a role''s right to publish to an outbox';
REVOKE ALL ON FUNCTION tide.outbox_revoke_publish(text,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_revoke_publish(text,text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.outbox_grant_consume(p_outbox text, p_role text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._outbox_config(p_outbox);
	INSERT INTO tide.outbox_consume_grants (outbox_name, grantee, granted_by)
	VALUES (p_outbox, tide._role(p_role), current_user::regrole)
	ON CONFLICT (outbox_name, grantee) DO NOTHING;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.outbox_grant_consume(text, text)
	IS 'lets a role and the members that inherit its privileges consume from an outbox''s consumer groups';
REVOKE ALL ON FUNCTION tide.outbox_grant_consume(text,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_grant_consume(text,text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.outbox_revoke_consume(p_outbox text, p_role text)
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
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.outbox_revoke_consume(text, text)
	IS 'takes back a role''s right to consume from an outbox''s consumer groups';
REVOKE ALL ON FUNCTION tide.outbox_revoke_consume(text,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_revoke_consume(text,text) TO tide_admin;

-- The BEFORE INSERT OR UPDATE trigger of relay_outbox_config: every row
-- written, through relay_set_outbox or by hand, is validated by the one
-- validator (relay/pipeline_config.c) as the role that writes it and
-- stored normalised. A file pipeline appends to a server file as the
-- server's operating system user, so whoever writes one must be a
-- superuser or a member of pg_write_server_files. An UPDATE that leaves
-- the config as it was (relay_enable, relay_disable) is not checked again.
CREATE OR REPLACE FUNCTION tide._relay_config_check()
RETURNS trigger
AS 'MODULE_PATHNAME', 'tide_relay_config_check'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_config_check() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_config_check() TO tide_admin;
