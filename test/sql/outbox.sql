-- Outboxes: create, drop, enable, disable, publish, status, backpressure.
\set VERBOSITY default
-- Message ids in this file start at 1, whatever ran before.
SELECT setval('tide.tide_outbox_messages_id_seq', 1, false) \g /dev/null
\i test/sql/include/try.sql

-- create
SELECT tide.outbox_create('orders');
SELECT outbox_name, retention_hours, inline_threshold, enabled FROM tide.tide_outbox_config;
SELECT tide.outbox_create_if_not_exists('orders');
SELECT tide.outbox_create_if_not_exists('payments', 48, 500);
SELECT outbox_name, retention_hours, inline_threshold FROM tide.tide_outbox_config ORDER BY 1;
SELECT pg_temp.try($$SELECT tide.outbox_create('orders')$$);
SELECT pg_temp.try($$SELECT tide.outbox_create('')$$);
SELECT pg_temp.try($$SELECT tide.outbox_create(NULL)$$);
SELECT pg_temp.try($$SELECT tide.outbox_create(repeat('x', 64))$$);
SELECT pg_temp.try($$SELECT tide.outbox_create(repeat('x', 63))$$);
SELECT pg_temp.try($$SELECT tide.outbox_create('bad', 0)$$);
SELECT pg_temp.try($$SELECT tide.outbox_create('bad', 24, 0)$$);
SELECT pg_temp.try($$SELECT tide.outbox_create('bad', NULL)$$);
SELECT count(*) AS outboxes FROM tide.tide_outbox_config;

-- publish
SELECT tide.outbox_publish('orders', '{"order": 1}');
SELECT tide.outbox_publish('orders', '{"order": 2}', '{"type": "order.paid"}');
SELECT tide.outbox_publish(p_name => 'orders', p_payload => '{}', p_headers => NULL);
SELECT id, outbox_name, payload, headers, consumed_at, consumer_group
  FROM tide.tide_outbox_messages ORDER BY id;

-- bad input writes nothing and takes no id
SELECT last_value AS last_id_before FROM tide.tide_outbox_messages_id_seq \gset
SELECT pg_temp.try($$SELECT tide.outbox_publish('nope', '{}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish('orders', NULL)$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish('orders', '[1, 2]')$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish('orders', '"text"')$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish('orders', 'null')$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish('orders', '{}', '[]')$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish('orders', '{}', '7')$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish('', '{}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish(NULL, '{}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish(repeat('y', 64), '{}')$$);
SELECT last_value = :last_id_before AS no_id_taken FROM tide.tide_outbox_messages_id_seq;
SELECT count(*) AS messages FROM tide.tide_outbox_messages;

-- a rolled-back publish leaves nothing
BEGIN;
SELECT tide.outbox_publish('orders', '{"order": "rolled back"}') > 0 AS published;
ROLLBACK;
SELECT count(*) AS messages FROM tide.tide_outbox_messages WHERE payload ? 'order' AND payload->>'order' = 'rolled back';

-- the message commits with the caller's own write
CREATE TABLE app_orders (id int PRIMARY KEY, status text);
BEGIN;
INSERT INTO app_orders VALUES (42, 'paid');
SELECT tide.outbox_publish('orders', jsonb_build_object('order', 42, 'status', 'paid')) > 0 AS published;
COMMIT;
SELECT o.status, m.payload FROM app_orders o
  JOIN tide.tide_outbox_messages m ON (m.payload->>'order')::int = o.id;

-- disable and enable
SELECT tide.outbox_disable('orders');
SELECT enabled FROM tide.tide_outbox_config WHERE outbox_name = 'orders';
SELECT pg_temp.try($$SELECT tide.outbox_publish('orders', '{}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish_batch('orders', ARRAY['{}']::jsonb[])$$);
SELECT tide.outbox_disable('orders');
SELECT tide.outbox_enable('orders');
SELECT tide.outbox_publish('orders', '{"order": 3}') > 0 AS published_again;
SELECT pg_temp.try($$SELECT tide.outbox_enable('nope')$$);
SELECT pg_temp.try($$SELECT tide.outbox_disable('')$$);

-- batch: ids follow the array order, headers go on every message
SELECT tide.outbox_publish_batch('payments',
		ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}']::jsonb[], '{"type": "payment"}');
SELECT payload->>'n' AS n, headers FROM tide.tide_outbox_messages
 WHERE outbox_name = 'payments' ORDER BY id;
SELECT tide.outbox_publish_batch('payments', ARRAY[]::jsonb[]);
SELECT last_value AS last_id_before FROM tide.tide_outbox_messages_id_seq \gset
SELECT pg_temp.try($$SELECT tide.outbox_publish_batch('payments', NULL)$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish_batch('payments', ARRAY['{}', NULL]::jsonb[])$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish_batch('payments', ARRAY['{}', '{}', '[]']::jsonb[])$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish_batch('payments', ARRAY[['{}'], ['{}']]::jsonb[])$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish_batch('payments', ARRAY['{}']::jsonb[], '"h"')$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish_batch('nope', ARRAY['{}']::jsonb[])$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish_batch('', ARRAY['{}']::jsonb[])$$);
SELECT last_value = :last_id_before AS no_id_taken FROM tide.tide_outbox_messages_id_seq;
SELECT count(*) AS payments FROM tide.tide_outbox_messages WHERE outbox_name = 'payments';

-- a transaction that published cannot be prepared
BEGIN;
SELECT tide.outbox_publish('orders', '{"order": "prepared"}') > 0 AS published;
PREPARE TRANSACTION 'tide_regress';
SELECT count(*) AS prepared FROM pg_prepared_xacts WHERE gid = 'tide_regress';
SELECT count(*) AS messages FROM tide.tide_outbox_messages WHERE payload->>'order' = 'prepared';
-- one that did not publish still can
BEGIN;
SELECT count(*) >= 0 AS read_only FROM tide.tide_outbox_messages;
PREPARE TRANSACTION 'tide_regress_plain';
COMMIT PREPARED 'tide_regress_plain';

-- backpressure: an outbox with an inline_threshold and a consumer group
-- never holds more unconsumed messages than its threshold
SELECT tide.outbox_create('small', 24, 3);
SELECT tide.create_consumer_group('small_readers', 'small');
SELECT tide.outbox_publish_batch('small', ARRAY['{"i": 1}', '{"i": 2}']::jsonb[]);
SELECT pg_temp.try($$SELECT tide.outbox_publish_batch('small', ARRAY['{}', '{}']::jsonb[])$$);
SELECT tide.outbox_publish('small', '{"i": 3}') > 0 AS third;
SELECT pg_temp.try($$SELECT tide.outbox_publish('small', '{"i": 4}')$$);
SELECT count(*) AS small_messages FROM tide.tide_outbox_messages WHERE outbox_name = 'small';
-- the group reads and commits: room again
SELECT count(*) AS polled FROM tide.poll_outbox('small_readers', 'c1', 2);
SELECT pg_temp.try($$SELECT tide.outbox_publish('small', '{"i": 4}')$$);
SELECT tide.commit_offset('small_readers', 'c1', (SELECT max(id) FROM tide.poll_outbox('small_readers', 'c1', 2)));
SELECT tide.outbox_publish('small', '{"i": 4}') > 0 AS fourth;
SELECT tide.outbox_publish('small', '{"i": 5}') > 0 AS fifth;
SELECT pg_temp.try($$SELECT tide.outbox_publish('small', '{"i": 6}')$$);
-- the slowest group holds the space: a second group at the start blocks again
SELECT tide.create_consumer_group('small_late', 'small');
SELECT pg_temp.try($$SELECT tide.outbox_publish('small', '{"i": 6}')$$);
SELECT tide.drop_consumer_group('small_late');

-- status
SELECT s->'outbox' AS outbox, s->'enabled' AS enabled, s->'pending' AS pending,
	   s->'newest_id' = to_jsonb((SELECT max(id) FROM tide.tide_outbox_messages WHERE outbox_name = 'small')) AS newest_ok,
	   (s->>'oldest_pending_age_seconds')::numeric >= 0 AS age_ok,
	   s->'oldest_open_publish_age_seconds' AS open_publish_age,
	   jsonb_path_query_array(s->'consumer_groups', '$[*].group') AS groups,
	   s->'consumer_groups'->0->'lag' AS lag
  FROM tide.outbox_status('small') s;
SELECT jsonb_object_keys(tide.outbox_status('orders')) ORDER BY 1;
SELECT pg_temp.try($$SELECT tide.outbox_status('nope')$$);

-- drop
SELECT pg_temp.try($$SELECT tide.outbox_drop('nope')$$);
SELECT tide.outbox_drop('nope', true);
SELECT pg_temp.try($$SELECT tide.outbox_drop('')$$);
SELECT tide.outbox_drop('small');
SELECT count(*) AS small_left FROM tide.tide_outbox_messages WHERE outbox_name = 'small';
SELECT count(*) AS groups_left FROM tide.tide_consumer_groups WHERE outbox_name = 'small';
SELECT tide.outbox_drop('payments');
SELECT tide.outbox_drop('orders');
SELECT tide.outbox_drop(repeat('x', 63));
SELECT count(*) AS messages_left FROM tide.tide_outbox_messages;
DROP TABLE app_orders;
