-- ---------------------------------------------------------------------------
-- Privileges (docs/security.md). Four roles, cluster-wide, created when
-- missing and left in place by DROP EXTENSION:
--   tide_admin      the whole API, and the catalog tables (it is trusted to
--                   run pg_tide; the file-sink trigger above still applies)
--   tide_publisher  outbox_publish(_batch), for the outboxes granted to it
--   tide_consumer   the consumer-group API, for the outboxes granted to it,
--                   and the inbox API
--   tide_reader     the status views and functions
-- PUBLIC gets nothing. Functions that a reader calls but that touch tables
-- it may not touch run as the owner (SECURITY DEFINER); outbox_publish and
-- the consumer-group API run as the caller, check the caller's right, and
-- do their reads and writes as the owner (src/outbox_rights.c). Every
-- function runs with search_path = pg_catalog, pg_temp, so that no name in
-- the extension is resolved through the caller's search_path.
-- ---------------------------------------------------------------------------

REVOKE ALL ON ALL TABLES IN SCHEMA tide FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA tide FROM PUBLIC;
GRANT USAGE ON SCHEMA tide TO tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA tide TO tide_admin;
GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA tide TO tide_admin;
GRANT SELECT ON tide.tide_inbox_config TO tide_consumer;
-- tide_reader: status. The views read their tables as the owner; the
-- functions they call and the tables those read are granted here. The
-- pipeline configs (secrets), the messages, dead letters and attempts
-- (payloads and responses) are not: relay_attempt_log and
-- relay_dead_letters show the attempts and dead letters without them.
GRANT SELECT ON tide.consumer_lag, tide.relay_pipeline_lag, tide.relay_pipeline_status,
	tide.outbox_retention_status, tide.relay_attempt_log, tide.relay_dead_letters,
	tide.tide_outbox_config, tide.tide_consumer_groups, tide.tide_consumer_offsets,
	tide.tide_consumer_leases, tide.tide_inbox_config, tide.relay_consumer_offsets,
	tide.relay_pipeline_health, tide.outbox_publish_grants, tide.outbox_consume_grants,
	tide.inbox_handler_status, tide.relay_inbox_handlers, tide.relay_inbox_handler_health,
	tide.outbox_captures, tide.outbox_backfills TO tide_reader;
-- tide_consumer: inbox_status shows an inbox's handler.
GRANT SELECT ON tide.relay_inbox_handlers, tide.relay_inbox_handler_health TO tide_consumer;
-- tide_consumer: the lag of the groups it may consume from (the view
-- shows a role that is not a reader those alone).
GRANT SELECT ON tide.consumer_lag TO tide_consumer;
