-- A dropped table's captures go with it; a captured key column cannot be
-- dropped (sql/functions/15_capture.sql).
CREATE EVENT TRIGGER tide_capture_dropped ON sql_drop
	EXECUTE FUNCTION tide._capture_dropped();
