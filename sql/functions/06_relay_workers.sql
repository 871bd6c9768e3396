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

-- Whether a relay worker serves this database, and why not: the one place
-- that decides it (relay/serving.c), for relay_pipeline_status.
CREATE OR REPLACE FUNCTION tide._relay_serving_state(OUT state text, OUT reason text)
RETURNS record
AS 'MODULE_PATHNAME', 'tide_relay_serving_state'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION tide._relay_serving_state()
	IS 'internal: ''serving'' when a relay worker delivers in this database, else ''stopped'' and the reason (the relay off, no worker, the catalog waiting for ALTER EXTENSION pg_tide UPDATE)';
REVOKE ALL ON FUNCTION tide._relay_serving_state() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_serving_state() TO tide_admin, tide_reader;
