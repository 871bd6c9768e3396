-- State changes from 0.1.0 to 0.2.0, run before the functions, views and
-- privileges (which the update script re-creates from the same files as a
-- fresh install). A new table, column or index of 0.2.0 is written here
-- once, and into sql/install/ for fresh installs.

-- What only the relay worker knows, for relay_pipeline_status: its hold of
-- a pipeline and the ERROR that ended the pipeline's last turn
-- (relay/pipeline_state.c).
ALTER TABLE tide.relay_pipeline_health
	ADD COLUMN held_since timestamptz,
	ADD COLUMN held_until timestamptz,
	ADD COLUMN held_reason text,
	ADD COLUMN turn_error text,
	ADD COLUMN turn_error_since timestamptz,
	ADD COLUMN turn_errors int NOT NULL DEFAULT 0;

COMMENT ON TABLE tide.relay_pipeline_health
	IS 'Per pipeline: consecutive failed attempts, last success, last failure and its error, the worker''s hold and the error that ended its last turn';

-- Every view and function output names the pipeline "pipeline": the
-- column "name" of relay_list_configs is renamed, which changes its
-- return type.
DROP FUNCTION tide.relay_list_configs();

-- relay_pipeline_status gains columns after "health" (a changed column
-- list, which CREATE OR REPLACE VIEW cannot make).
DROP VIEW tide.relay_pipeline_status;
