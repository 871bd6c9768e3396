CREATE TRIGGER outbox_publish_grants_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tide.outbox_publish_grants
	FOR EACH STATEMENT EXECUTE FUNCTION tide._rights_changed();

CREATE TRIGGER outbox_consume_grants_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tide.outbox_consume_grants
	FOR EACH STATEMENT EXECUTE FUNCTION tide._rights_changed();

CREATE TRIGGER relay_outbox_config_rights_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tide.relay_outbox_config
	FOR EACH STATEMENT EXECUTE FUNCTION tide._rights_changed();

CREATE TRIGGER relay_outbox_config_check
	BEFORE INSERT OR UPDATE ON tide.relay_outbox_config
	FOR EACH ROW EXECUTE FUNCTION tide._relay_config_check();

CREATE TRIGGER relay_inbox_config_check
	BEFORE INSERT OR UPDATE ON tide.relay_inbox_config
	FOR EACH ROW EXECUTE FUNCTION tide._relay_config_check();
