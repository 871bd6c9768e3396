-- ---------------------------------------------------------------------------
-- Relay workers (relay/launcher.c). The launcher runs one relay worker per
-- database where pg_tide is installed; the workers deliver to the sinks.
-- ---------------------------------------------------------------------------

-- Asks the launcher, at commit, to look at this database again, so the new
-- extension gets its relay worker within a second. Does nothing without
-- preloading.
CREATE OR REPLACE FUNCTION tide._relay_notify_launcher()
RETURNS void
AS 'MODULE_PATHNAME', 'tide_relay_notify_launcher'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION tide._relay_notify_launcher()
	IS 'internal: asks the relay launcher to start a worker for this database at commit';
REVOKE ALL ON FUNCTION tide._relay_notify_launcher() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_notify_launcher() TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_workers(
	OUT database name,
	OUT pid integer,
	OUT started_at timestamptz,
	OUT passes bigint,
	OUT wakeups bigint,
	OUT worker_index integer,
	OUT pipelines integer)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'tide_relay_workers'
LANGUAGE C VOLATILE ROWS 8;
COMMENT ON FUNCTION tide.relay_workers()
	IS 'one row per running relay worker in the cluster: its database, pid, start time, passes, wake-ups by commits, its index among the database''s workers and how many pipelines it serves';
REVOKE ALL ON FUNCTION tide.relay_workers() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_workers() TO tide_admin, tide_reader;

-- Whether the relay serves this database, and if not why (relay/database_state.c):
-- state 'served' when at least one relay worker serves it; otherwise one of
-- 'not_preloaded', 'standby', 'relay_off', 'paused', 'update_needed',
-- 'library_older', 'no_worker_slot', 'starting'. Reads shared memory only.
CREATE OR REPLACE FUNCTION tide._relay_database_state(
	OUT state text,
	OUT workers integer,
	OUT wanted integer,
	OUT detail text)
RETURNS record
AS 'MODULE_PATHNAME', 'tide_relay_database_state'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide._relay_database_state()
	IS 'whether the relay serves the current database: state ''served'', or why not (not_preloaded, standby, relay_off, paused, update_needed, library_older, no_worker_slot, starting); workers serving it, workers wanted, and a detail';
REVOKE ALL ON FUNCTION tide._relay_database_state() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_database_state() TO tide_admin, tide_reader;
