-- ---------------------------------------------------------------------------
-- Payload schemas (docs/publishing.md#payload-schemas): set and dropped by
-- an outbox's admin (tide_admin, like its grants: docs/security.md).
-- ---------------------------------------------------------------------------

-- The draft of a schema the JSON Schema module accepts, or 22023; 55000
-- when the module is not installed.
CREATE OR REPLACE FUNCTION tide._schema_draft(p_schema jsonb)
RETURNS text
AS 'MODULE_PATHNAME', 'tide_schema_draft'
LANGUAGE C STRICT VOLATILE;
REVOKE ALL ON FUNCTION tide._schema_draft(jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._schema_draft(jsonb) TO tide_admin;

-- Whether a payload validates against a schema, checked as a publish checks
-- it (the jsonb read in place); 22023 when the schema is refused. The
-- conformance test runs the JSON-Schema-Test-Suite through it.
CREATE OR REPLACE FUNCTION tide._schema_validates(p_schema jsonb, p_payload jsonb)
RETURNS boolean
AS 'MODULE_PATHNAME', 'tide_schema_validates'
LANGUAGE C STRICT VOLATILE;
REVOKE ALL ON FUNCTION tide._schema_validates(jsonb, jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._schema_validates(jsonb, jsonb) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.outbox_set_schema(p_outbox text, p_type text, p_schema jsonb)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
	d text;
BEGIN
	PERFORM tide._outbox_config(p_outbox);
	IF p_schema IS NULL THEN
		RAISE EXCEPTION 'schema must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give a JSON Schema; tide.outbox_drop_schema() removes one.';
	END IF;
	d := tide._schema_draft(p_schema);
	INSERT INTO tide.outbox_schemas (outbox_name, message_type, schema, draft, updated_by)
	VALUES (p_outbox, coalesce(p_type, ''), p_schema, d, current_user::regrole)
	ON CONFLICT (outbox_name, message_type) DO UPDATE
		SET schema = EXCLUDED.schema, draft = EXCLUDED.draft,
			updated_at = now(), updated_by = EXCLUDED.updated_by;
	RETURN d;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.outbox_set_schema(text, text, jsonb)
	IS 'sets the JSON Schema the payloads of an outbox (p_type NULL or '''') or of one message type (header "type") must validate against; returns its draft';
REVOKE ALL ON FUNCTION tide.outbox_set_schema(text,text,jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_set_schema(text,text,jsonb) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.outbox_drop_schema(p_outbox text, p_type text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._outbox_config(p_outbox);
	DELETE FROM tide.outbox_schemas
	 WHERE outbox_name = p_outbox AND message_type = coalesce(p_type, '');
	IF NOT FOUND THEN
		RAISE NOTICE 'outbox "%" had no schema for %', p_outbox,
			CASE WHEN coalesce(p_type, '') = '' THEN 'its default'
				 ELSE format('message type "%s"', p_type) END;
		RETURN false;
	END IF;
	RETURN true;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.outbox_drop_schema(text, text)
	IS 'removes the JSON Schema of an outbox (p_type NULL or '''') or of one of its message types';
REVOKE ALL ON FUNCTION tide.outbox_drop_schema(text,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_drop_schema(text,text) TO tide_admin;
