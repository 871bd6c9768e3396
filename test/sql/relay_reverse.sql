-- Reverse pipelines (source -> inbox) in the catalog: tide.relay_set_inbox
-- and its validation, the row trigger on tide.relay_inbox_config, names
-- unique across both directions, relay_enable/disable/delete/get_config/
-- list_configs and the status views on a reverse row, privileges.
--
-- No source type is built into pg_tide.so: the success path of
-- relay_set_inbox needs an endpoint that provides one (the postgres
-- source). A reverse row is written here as a restore writes it, with the
-- triggers off (session_replication_role = replica).
\set VERBOSITY default
\i test/sql/include/try.sql

SELECT tide.outbox_create('rr_orders');
SELECT tide.inbox_create('rr_in');
CREATE ROLE regress_rr_admin IN ROLE tide_admin;
CREATE ROLE regress_rr_consumer IN ROLE tide_consumer;
CREATE ROLE regress_rr_nobody;

-- bad input: an SQLSTATE, a message and a hint; nothing written
SELECT pg_temp.try($$SELECT tide.relay_set_inbox(NULL, 'rr_in', '{"source_type": "x"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('', 'rr_in', '{"source_type": "x"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_a', 'rr_missing', '{"source_type": "x"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_a', NULL, '{"source_type": "x"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_a', 'rr_in', NULL)$$);
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_a', 'rr_in', '[1]')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_a', 'rr_in', '"postgres"')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_a', 'rr_in', '{"inbox": "rr_other", "source_type": "x"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_a', 'rr_in', '{"inbox": 7, "source_type": "x"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_a', 'rr_in', '{"batch_size": 0, "source_type": "x"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_a', 'rr_in', '{"batch_size": 10001, "source_type": "x"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_a', 'rr_in', '{"batch_size": 1.5, "source_type": "x"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_a', 'rr_in', '{"batch_size": "10", "source_type": "x"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_a', 'rr_in', '{}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_a', 'rr_in', '{"source_type": 1}')$$);
-- a source type no endpoint provides: unknown, with the package that
-- would bring it; a name that cannot be a type's
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_a', 'rr_in', '{"source_type": "carrier_pigeon"}')$$);
SELECT tide.relay_set_inbox('rr_a', 'rr_in', '{"source_type": "carrier_pigeon"}');
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_a', 'rr_in', '{"source_type": "../pg_tide"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_a', 'rr_in', '{"source_type": ""}')$$);
-- an endpoint of pg_tide without a source (a sink's module) is no source
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_a', 'rr_in', '{"source_type": "webhook"}')$$);
SELECT count(*) AS reverse_rows FROM tide.relay_inbox_config;

-- a row written by hand is checked by the row trigger: refused, nothing written
SELECT pg_temp.try($$INSERT INTO tide.relay_inbox_config (name, config) VALUES ('rr_hand', '{"source_type": "kafka", "inbox": "rr_in"}')$$);
SELECT pg_temp.try($$INSERT INTO tide.relay_inbox_config (name, config) VALUES ('rr_hand', '{"source_type": "kafka"}')$$);
SELECT pg_temp.try($$INSERT INTO tide.relay_inbox_config (name, config) VALUES ('rr_hand', '{"inbox": "rr_missing", "source_type": "kafka"}')$$);
SELECT pg_temp.try($$INSERT INTO tide.relay_inbox_config (name, config) VALUES ('', '{"inbox": "rr_in", "source_type": "kafka"}')$$);
SELECT pg_temp.try($$INSERT INTO tide.relay_inbox_config (name, config) VALUES ('rr_hand', '{"inbox": "rr_in", "batch_size": 0}')$$);
SELECT count(*) AS reverse_rows FROM tide.relay_inbox_config;

-- a reverse row as a restore writes it (triggers off); its position
SET session_replication_role = replica;
INSERT INTO tide.relay_inbox_config (name, config, owner)
VALUES ('rr_rev', '{"inbox": "rr_in", "source_type": "carrier_pigeon", "batch_size": 100,
				   "connection": "host=db2 password=hunter2", "auth": {"token": "t0k", "tries": 3},
				   "password": {"env": "PG_TIDE_RR_PASSWORD"}}', 'regress_rr_admin');
INSERT INTO tide.relay_consumer_offsets (relay_group_id, pipeline_id, outbox_name, last_change_id, source_position)
VALUES ('reverse', 'rr_rev', 'rr_in', 42, '{"remote_id": 42}');
RESET session_replication_role;

-- the trigger wakes the worker for both directions, as it announces both
SELECT tgname, tgenabled FROM pg_trigger
 WHERE tgrelid = 'tide.relay_inbox_config'::regclass AND NOT tgisinternal ORDER BY tgname;

-- names are unique across both directions, either way round
SELECT tide.relay_set_outbox('rr_fwd', 'rr_orders', 'rr_fwd_group',
							 '{"sink_type": "webhook", "url": "https://example.com/hooks"}');
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_fwd', 'rr_in', '{"source_type": "carrier_pigeon"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('rr_rev', 'rr_orders', 'rr_rev_group', '{"sink_type": "webhook", "url": "https://example.com/hooks"}')$$);
SELECT pg_temp.try($$INSERT INTO tide.relay_outbox_config (name, config) VALUES ('rr_rev', '{"sink_type": "webhook", "url": "https://example.com/hooks", "outbox": "rr_orders", "consumer_group": "rr_x"}')$$);
SELECT name FROM tide.relay_outbox_config ORDER BY name;
SELECT group_name FROM tide.tide_consumer_groups WHERE group_name LIKE 'rr\_%' ORDER BY 1;

-- list and get: both directions; the secrets of a source type this server
-- does not have are unknown, so every string is redacted but the inbox,
-- the source type and secret references
SELECT pipeline, direction, enabled, outbox, consumer_group, sink_type, inbox, source_type
  FROM tide.relay_list_configs();
SELECT config FROM tide.relay_list_configs() WHERE pipeline = 'rr_rev';
SELECT tide.relay_get_config('rr_rev');
-- the stored config keeps them
SELECT config ->> 'connection' AS stored FROM tide.relay_inbox_config WHERE name = 'rr_rev';

-- status and lag: both directions, the reverse row with its position
SELECT pipeline, direction, enabled, health, sink_type, outbox, inbox, source_type, offset_id,
	   lag_messages, source_position, retry_queue, dead_letters
  FROM tide.relay_pipeline_status ORDER BY pipeline;
SELECT pipeline, direction, outbox, inbox, delivered_upto, lag_messages, source_position
  FROM tide.relay_pipeline_lag ORDER BY pipeline;

-- disable and enable: the flag changes, the config is not checked again
-- (its source type is unknown here)
SELECT tide.relay_disable('rr_rev');
SELECT name, enabled FROM tide.relay_inbox_config;
SELECT health FROM tide.relay_pipeline_status WHERE pipeline = 'rr_rev';
SELECT tide.relay_enable('rr_rev');
SELECT name, enabled FROM tide.relay_inbox_config;
-- a changed config is checked: refused, nothing written
SELECT pg_temp.try($$UPDATE tide.relay_inbox_config SET config = config || '{"batch_size": 5}' WHERE name = 'rr_rev'$$);
SELECT config ->> 'batch_size' AS batch_size FROM tide.relay_inbox_config WHERE name = 'rr_rev';

-- privileges: tide_admin may set, enable, disable and list; others not
SET ROLE regress_rr_admin;
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_b', 'rr_in', '{"source_type": "carrier_pigeon"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_disable('rr_rev')$$);
SELECT pg_temp.try($$SELECT tide.relay_enable('rr_rev')$$);
SELECT count(*) FROM tide.relay_list_configs() WHERE direction = 'reverse';
RESET ROLE;
SET ROLE regress_rr_consumer;
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_b', 'rr_in', '{"source_type": "carrier_pigeon"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_disable('rr_rev')$$);
SELECT pg_temp.try($$SELECT tide.relay_delete('rr_rev')$$);
SELECT pg_temp.try($$SELECT tide.relay_get_config('rr_rev')$$);
SELECT pg_temp.try($$SELECT * FROM tide.relay_list_configs()$$);
SELECT pg_temp.try($$SELECT * FROM tide.relay_inbox_config$$);
SELECT pg_temp.try($$INSERT INTO tide.relay_inbox_config (name, config) VALUES ('rr_c', '{}')$$);
RESET ROLE;
SET ROLE regress_rr_nobody;
SELECT pg_temp.try($$SELECT tide.relay_set_inbox('rr_b', 'rr_in', '{"source_type": "carrier_pigeon"}')$$);
SELECT pg_temp.try($$SELECT tide._relay_normalize_reverse_config('rr_in', '{}')$$);
SELECT pg_temp.try($$SELECT tide._relay_redact_source('{}')$$);
SELECT pg_temp.try($$SELECT tide._relay_check_pipeline_name('rr_x', true)$$);
RESET ROLE;
SELECT name, enabled FROM tide.relay_inbox_config;

-- delete: the row and its position go; the forward pipeline stays
SELECT tide.relay_delete('rr_rev');
SELECT count(*) AS reverse_rows FROM tide.relay_inbox_config;
SELECT pipeline_id FROM tide.relay_consumer_offsets ORDER BY 1;
SELECT pipeline, direction FROM tide.relay_list_configs();
SELECT pg_temp.try($$SELECT tide.relay_delete('rr_rev')$$);
SELECT pg_temp.try($$SELECT tide.relay_enable('rr_rev')$$);
SELECT pg_temp.try($$SELECT tide.relay_get_config('rr_rev')$$);
-- the name is free again for the other direction
SELECT tide.relay_set_outbox('rr_rev', 'rr_orders', 'rr_rev_group',
							 '{"sink_type": "webhook", "url": "https://example.com/hooks"}');
SELECT pipeline, direction FROM tide.relay_list_configs();

SELECT tide.relay_delete('rr_rev');
SELECT tide.relay_delete('rr_fwd');
SELECT tide.inbox_drop('rr_in');
SELECT tide.outbox_drop('rr_orders');
DROP ROLE regress_rr_admin, regress_rr_consumer, regress_rr_nobody;
