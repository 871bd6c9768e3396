-- ---------------------------------------------------------------------------
-- Catalog (seed 003: names and types kept exactly; additions documented in
-- docs/catalog.md)
-- ---------------------------------------------------------------------------

-- Wakes the database's relay worker at commit, so that a changed pipeline
-- or a queued retry is acted on at once (relay/backend.c).
CREATE OR REPLACE FUNCTION tide._relay_wake_worker()
RETURNS void
AS 'MODULE_PATHNAME', 'tide_relay_wake_worker'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION tide._relay_wake_worker()
	IS 'internal: wakes the relay worker at commit to look at its pipelines and retry queues';
REVOKE ALL ON FUNCTION tide._relay_wake_worker() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_wake_worker() TO tide_admin;

-- Warns when no background worker slot is free for this database's relay
-- workers, as a pipeline is enabled (relay/worker_slots.c).
CREATE OR REPLACE FUNCTION tide._relay_check_worker_slots()
RETURNS void
AS 'MODULE_PATHNAME', 'tide_relay_check_worker_slots'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide._relay_check_worker_slots()
	IS 'internal: warns when no background worker slot is free for the relay workers of this database';
REVOKE ALL ON FUNCTION tide._relay_check_worker_slots() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_check_worker_slots() TO tide_admin;

-- A changed pipeline, forward (relay_outbox_config) or reverse
-- (relay_inbox_config), is announced on channel tide_relay_config, and the
-- relay worker acts on it at commit.
CREATE OR REPLACE FUNCTION tide._relay_config_notify()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM pg_notify('tide_relay_config',
					  json_build_object('table', TG_TABLE_NAME,
										'op', TG_OP,
										'name', CASE WHEN TG_OP = 'DELETE' THEN OLD.name ELSE NEW.name END)::text);
	PERFORM tide._relay_wake_worker();
	-- A pipeline that is to run: a WARNING now if no worker can serve it.
	IF TG_OP <> 'DELETE' AND NEW.enabled THEN
		PERFORM tide._relay_check_worker_slots();
	END IF;
	IF TG_OP = 'UPDATE' AND OLD.enabled IS DISTINCT FROM NEW.enabled THEN
		PERFORM tide._relay_operator_event(
			CASE WHEN NEW.enabled THEN 'pipeline.enabled' ELSE 'pipeline.disabled' END,
			NEW.name,
			jsonb_build_object('consecutive_failures',
				(SELECT consecutive_failures FROM tide.relay_pipeline_health
				  WHERE pipeline_id = NEW.name)));
		-- Enabled again: the failures before do not count toward the threshold.
		IF NEW.enabled THEN
			UPDATE tide.relay_pipeline_health SET consecutive_failures = 0
			 WHERE pipeline_id = NEW.name;
		END IF;
	END IF;
	RETURN NULL;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_config_notify() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_config_notify() TO tide_admin;
