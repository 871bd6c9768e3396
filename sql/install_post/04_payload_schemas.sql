-- A change of the payload schemas makes every backend forget the schemas
-- it compiled (src/payload_schema.c) at commit.
CREATE TRIGGER outbox_schemas_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tide.outbox_schemas
	FOR EACH STATEMENT EXECUTE FUNCTION tide._rights_changed();
