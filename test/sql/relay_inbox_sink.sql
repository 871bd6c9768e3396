-- The inbox sink (docs/sinks/inbox.md): its config keys, a missing inbox,
-- and the rights to write the inbox that the role setting the pipeline
-- must have.
\set VERBOSITY default
\i test/sql/include/try.sql

SELECT tide.outbox_create('ris_orders');
SELECT tide.inbox_create('ris_in');

-- defaults filled in: attempts of failures only, batches of 1000, no event id header
SELECT tide.relay_set_outbox('ris_pipe', 'ris_orders', 'ris_group',
							 '{"sink_type": "inbox", "inbox": "ris_in"}');
SELECT jsonb_pretty(tide.relay_get_config('ris_pipe'));
SELECT tide.relay_set_outbox('ris_pipe', 'ris_orders', 'ris_group',
	'{"sink_type": "inbox", "inbox": "ris_in", "event_id_header": "event-id", "batch_size": 500}');
SELECT tide.relay_get_config('ris_pipe') -> 'event_id_header' AS header,
	   tide.relay_get_config('ris_pipe') -> 'batch_size' AS batch_size;

-- bad configs: refused, nothing written
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('ris_bad', 'ris_orders', 'ris_bad_group', '{"sink_type": "inbox"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('ris_bad', 'ris_orders', 'ris_bad_group', '{"sink_type": "inbox", "inbox": 1}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('ris_bad', 'ris_orders', 'ris_bad_group', '{"sink_type": "inbox", "inbox": ""}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('ris_bad', 'ris_orders', 'ris_bad_group', '{"sink_type": "inbox", "inbox": "ris_nowhere"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('ris_bad', 'ris_orders', 'ris_bad_group', '{"sink_type": "inbox", "inbox": "ris_in", "event_id_header": ""}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('ris_bad', 'ris_orders', 'ris_bad_group', '{"sink_type": "inbox", "inbox": "ris_in", "event_id_header": ["a"]}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('ris_bad', 'ris_orders', 'ris_bad_group', '{"sink_type": "inbox", "inbox": "ris_in", "event_id_header": "a\nb"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('ris_bad', 'ris_orders', 'ris_bad_group', '{"sink_type": "inbox", "inbox": "ris_in", "url": "https://example.com"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('ris_bad', 'ris_orders', 'ris_bad_group', '{"sink_type": "inbox", "inbox": "ris_in", "ordering": "strict"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('ris_bad', 'ris_orders', 'ris_bad_group', '{"sink_type": "inbox", "inbox": "ris_in", "batch_size": 0}')$$);
-- a row written by hand is checked by the same validator
SELECT pg_temp.try($$INSERT INTO tide.relay_outbox_config (name, config)
	VALUES ('ris_bad', '{"sink_type": "inbox", "inbox": "ris_nowhere", "outbox": "ris_orders", "consumer_group": "ris_bad_group"}')$$);
SELECT count(*) AS bad_pipelines FROM tide.relay_outbox_config WHERE name = 'ris_bad';

-- rights: an administrator may write the inboxes tide.inbox_create made
-- (tide_admin has INSERT on their tables); not one whose table it may not
-- write, nor one in a schema it may not use
CREATE ROLE regress_ris_admin IN ROLE tide_admin;
SELECT tide.inbox_create('ris_closed');
REVOKE INSERT ON tide.ris_closed_inbox FROM tide_admin;
CREATE SCHEMA ris_private;
SELECT tide.inbox_create('ris_hidden', 'ris_private');
SET ROLE regress_ris_admin;
SELECT tide.relay_set_outbox('ris_admin_pipe', 'ris_orders', 'ris_admin_group',
							 '{"sink_type": "inbox", "inbox": "ris_in"}');
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('ris_closed_pipe', 'ris_orders', 'ris_closed_group', '{"sink_type": "inbox", "inbox": "ris_closed"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('ris_hidden_pipe', 'ris_orders', 'ris_hidden_group', '{"sink_type": "inbox", "inbox": "ris_hidden"}')$$);
SELECT pg_temp.try($$INSERT INTO tide.relay_outbox_config (name, config)
	VALUES ('ris_closed_pipe', '{"sink_type": "inbox", "inbox": "ris_closed", "outbox": "ris_orders", "consumer_group": "ris_closed_group"}')$$);
RESET ROLE;
SELECT name, owner FROM tide.relay_outbox_config WHERE name LIKE 'ris%' ORDER BY name;
-- a superuser may
SELECT tide.relay_set_outbox('ris_closed_pipe', 'ris_orders', 'ris_closed_group',
							 '{"sink_type": "inbox", "inbox": "ris_closed"}');

SELECT tide.relay_delete('ris_closed_pipe');
SELECT tide.relay_delete('ris_admin_pipe');
SELECT tide.relay_delete('ris_pipe');
SELECT tide.inbox_drop('ris_hidden');
SELECT tide.inbox_drop('ris_closed');
SELECT tide.inbox_drop('ris_in');
SELECT tide.outbox_drop('ris_orders');
DROP SCHEMA ris_private;
DROP ROLE regress_ris_admin;
