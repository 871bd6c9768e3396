-- The id default calls a function, so it comes after the functions.
ALTER TABLE tide.tide_outbox_messages ALTER COLUMN id SET DEFAULT tide._next_message_id();

CREATE TRIGGER relay_outbox_config_notify
	AFTER INSERT OR UPDATE OR DELETE ON tide.relay_outbox_config
	FOR EACH ROW EXECUTE FUNCTION tide._relay_config_notify();

CREATE TRIGGER relay_inbox_config_notify
	AFTER INSERT OR UPDATE OR DELETE ON tide.relay_inbox_config
	FOR EACH ROW EXECUTE FUNCTION tide._relay_config_notify();

-- A change of an outbox's config makes every backend forget what it
-- remembers of it for publishing (src/admission_cache.c) at commit.
CREATE TRIGGER tide_outbox_config_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tide.tide_outbox_config
	FOR EACH STATEMENT EXECUTE FUNCTION tide._rights_changed();

-- Every inbox handler is checked as it is written, and the relay looks at
-- it at commit.
CREATE TRIGGER relay_inbox_handlers_check
	BEFORE INSERT OR UPDATE ON tide.relay_inbox_handlers
	FOR EACH ROW EXECUTE FUNCTION tide._inbox_handler_check();

CREATE TRIGGER relay_inbox_handlers_notify
	AFTER INSERT OR UPDATE OR DELETE ON tide.relay_inbox_handlers
	FOR EACH ROW EXECUTE FUNCTION tide._inbox_handler_notify();

-- A backend remembers which inboxes have a handler (src/inbox_wake.c)
-- until the table changes.
CREATE TRIGGER relay_inbox_handlers_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tide.relay_inbox_handlers
	FOR EACH STATEMENT EXECUTE FUNCTION tide._rights_changed();
