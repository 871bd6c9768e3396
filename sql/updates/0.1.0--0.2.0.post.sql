-- State changes from 0.1.0 to 0.2.0 that need the functions (CONTRIBUTING.md).

-- Every row of relay_outbox_config is validated as it is written.
CREATE TRIGGER relay_outbox_config_check
	BEFORE INSERT OR UPDATE ON tide.relay_outbox_config
	FOR EACH ROW EXECUTE FUNCTION tide._relay_config_check();

-- A change of an outbox's config makes every backend forget what it
-- remembers of it for publishing (src/admission_cache.c) at commit.
CREATE TRIGGER tide_outbox_config_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tide.tide_outbox_config
	FOR EACH STATEMENT EXECUTE FUNCTION tide._rights_changed();

-- Every row of relay_inbox_config is validated as it is written.
CREATE TRIGGER relay_inbox_config_check
	BEFORE INSERT OR UPDATE ON tide.relay_inbox_config
	FOR EACH ROW EXECUTE FUNCTION tide._relay_config_check();

-- Inbox handlers (sql/install_post/01_catalog.sql).
CREATE TRIGGER relay_inbox_handlers_check
	BEFORE INSERT OR UPDATE ON tide.relay_inbox_handlers
	FOR EACH ROW EXECUTE FUNCTION tide._inbox_handler_check();

CREATE TRIGGER relay_inbox_handlers_notify
	AFTER INSERT OR UPDATE OR DELETE ON tide.relay_inbox_handlers
	FOR EACH ROW EXECUTE FUNCTION tide._inbox_handler_notify();

CREATE TRIGGER relay_inbox_handlers_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tide.relay_inbox_handlers
	FOR EACH STATEMENT EXECUTE FUNCTION tide._rights_changed();

-- Change capture (sql/install_post/04_capture.sql).
CREATE EVENT TRIGGER tide_capture_dropped ON sql_drop
	EXECUTE FUNCTION tide._capture_dropped();

CREATE TRIGGER tide_outbox_config_captured
	BEFORE DELETE ON tide.tide_outbox_config
	FOR EACH ROW EXECUTE FUNCTION tide._capture_outbox_deleted();

-- Payload schemas (sql/install_post/04_payload_schemas.sql).
CREATE TRIGGER outbox_schemas_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tide.outbox_schemas
	FOR EACH STATEMENT EXECUTE FUNCTION tide._rights_changed();
