-- The id default calls a function, so it comes after the functions.
ALTER TABLE tide.tide_outbox_messages ALTER COLUMN id SET DEFAULT tide._next_message_id();

CREATE TRIGGER relay_outbox_config_notify
	AFTER INSERT OR UPDATE OR DELETE ON tide.relay_outbox_config
	FOR EACH ROW EXECUTE FUNCTION tide._relay_config_notify();

CREATE TRIGGER relay_inbox_config_notify
	AFTER INSERT OR UPDATE OR DELETE ON tide.relay_inbox_config
	FOR EACH ROW EXECUTE FUNCTION tide._relay_config_notify();
