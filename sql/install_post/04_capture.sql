-- A dropped table's captures go with it; a captured key column cannot be
-- dropped (sql/functions/15_capture.sql).
CREATE EVENT TRIGGER tide_capture_dropped ON sql_drop
	EXECUTE FUNCTION tide._capture_dropped();

-- An outbox into which a table is captured cannot be dropped.
CREATE TRIGGER tide_outbox_config_captured
	BEFORE DELETE ON tide.tide_outbox_config
	FOR EACH ROW EXECUTE FUNCTION tide._capture_outbox_deleted();
