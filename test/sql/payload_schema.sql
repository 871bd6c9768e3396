-- Payload schemas (docs/publishing.md#payload-schemas): set, replaced and
-- dropped by an outbox's admin; a bad schema refused; a payload that does
-- not validate refused at publish with its JSON pointer and keyword, in a
-- batch too, before anything is written; a message type's schema before
-- the outbox's default; the stored payload exactly as passed.
\set VERBOSITY default
\i test/sql/include/try.sql

SELECT tide.outbox_create('ps_orders');
SELECT tide.outbox_create('ps_plain');

-- a schema of draft 2020-12 (the default) and one of draft-07
SELECT tide.outbox_set_schema('ps_orders', NULL, '{
  "type": "object",
  "required": ["order_id", "amount"],
  "properties": {
    "order_id": {"type": "integer", "minimum": 1},
    "amount": {"type": "number"},
    "lines": {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}},
    "customer": {"type": "object", "properties": {"email": {"type": "string", "pattern": "@"}}}
  }
}');
SELECT tide.outbox_set_schema('ps_orders', 'order.refunded', '{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "type": "object", "required": ["refund_id"], "additionalProperties": false,
  "properties": {"refund_id": {"type": "string"}}
}');
SELECT message_type, draft, updated_by::text FROM tide.outbox_schemas ORDER BY 1;
SELECT jsonb_path_query(tide.outbox_status('ps_orders'), '$.payload_schemas[*]') - 'updated_at' AS payload_schemas;
SELECT tide.outbox_status('ps_plain') -> 'payload_schemas' AS none;

-- bad schemas: refused with 22023, why and a hint, nothing stored
SELECT tide.outbox_set_schema('ps_plain', NULL, '{"type": 12}');
SELECT tide.outbox_set_schema('ps_plain', NULL, '{"minLength": -1}');
SELECT tide.outbox_set_schema('ps_plain', NULL, '[1]');
SELECT tide.outbox_set_schema('ps_plain', NULL, '{"$schema": "http://json-schema.org/draft-04/schema#"}');
SELECT tide.outbox_set_schema('ps_plain', NULL, '{"unevaluatedProperties": false}');
SELECT tide.outbox_set_schema('ps_plain', NULL, '{"$ref": "https://example.com/s.json"}');
SELECT tide.outbox_set_schema('ps_plain', NULL, NULL);
SELECT tide.outbox_set_schema('ps_missing', NULL, '{}');
SELECT count(*) AS ps_plain_schemas FROM tide.outbox_schemas WHERE outbox_name = 'ps_plain';

-- a valid payload is stored exactly as passed
SELECT tide.outbox_publish('ps_orders', '{"order_id": 7, "amount": 1.50, "lines": ["a", 1, 2]}') > 0 AS published;
SELECT payload::text FROM tide.tide_outbox_messages WHERE outbox_name = 'ps_orders';

-- refused payloads, with the failing JSON pointer and keyword
SELECT pg_temp.try($$SELECT tide.outbox_publish('ps_orders', '{"order_id": 7}')$$);
\set ON_ERROR_STOP 0
SELECT tide.outbox_publish('ps_orders', '{"order_id": 0, "amount": 1}');
SELECT tide.outbox_publish('ps_orders', '{"order_id": 7, "amount": 1, "lines": ["a", "b"]}');
SELECT tide.outbox_publish('ps_orders', '{"order_id": 7, "amount": 1, "customer": {"email": "nobody"}}');
-- the message type's schema applies instead of the default
SELECT tide.outbox_publish('ps_orders', '{"refund_id": 5}', '{"type": "order.refunded"}');
SELECT tide.outbox_publish('ps_orders', '{"refund_id": "r1", "x/y~": 1}', '{"type": "order.refunded"}');
-- in a batch: the first payload that does not validate, and nothing written
SELECT tide.outbox_publish_batch('ps_orders', ARRAY['{"order_id": 8, "amount": 2}', '{"order_id": "9", "amount": 2}']::jsonb[]);
-- a schema with a pattern refuses a string too long to match safely (std::regex
-- recurses per character: 100,000 would exhaust the backend's stack)
SELECT tide.outbox_create('ps_pattern');
SELECT tide.outbox_set_schema('ps_pattern', NULL, '{"properties": {"ab": {"type": "string", "pattern": "^(a|b)*$"}}}');
SELECT tide.outbox_publish('ps_pattern', jsonb_build_object('ab', repeat('ab', 500))) > 0 AS long_enough;
SELECT tide.outbox_publish('ps_pattern', jsonb_build_object('ab', repeat('a', 100000)));
SELECT tide.outbox_publish('ps_pattern', jsonb_build_object('other', jsonb_build_array(1, repeat('a', 1001))));
SELECT tide.outbox_drop('ps_pattern');
\set ON_ERROR_STOP 1
SELECT tide.outbox_publish('ps_orders', '{"refund_id": "r1"}', '{"type": "order.refunded"}') > 0 AS refund_published;
-- another type: the default schema
SELECT pg_temp.try($$SELECT tide.outbox_publish('ps_orders', '{"refund_id": "r1"}', '{"type": "order.paid"}')$$);
SELECT tide.outbox_publish_batch('ps_orders', ARRAY['{"order_id": 8, "amount": 2}', '{"order_id": 9, "amount": 3}']::jsonb[]) AS batch;
SELECT count(*) AS stored FROM tide.tide_outbox_messages WHERE outbox_name = 'ps_orders';

-- an outbox without a schema is not checked
SELECT tide.outbox_publish('ps_plain', '{"anything": [1, "x"]}') > 0 AS plain_published;

-- a replaced schema applies to the next publish; a dropped one no more
SELECT tide.outbox_set_schema('ps_orders', '', '{"type": "object", "required": ["v2"]}');
SELECT pg_temp.try($$SELECT tide.outbox_publish('ps_orders', '{"order_id": 10, "amount": 1}')$$);
SELECT tide.outbox_drop_schema('ps_orders');
SELECT tide.outbox_drop_schema('ps_orders');
SELECT tide.outbox_publish('ps_orders', '{"order_id": "any"}') > 0 AS published_after_drop;
SELECT pg_temp.try($$SELECT tide.outbox_publish('ps_orders', '{}', '{"type": "order.refunded"}')$$);

-- rights: an outbox's admin sets and drops schemas; a publisher or reader cannot
CREATE ROLE regress_ps_admin IN ROLE tide_admin;
CREATE ROLE regress_ps_publisher IN ROLE tide_publisher;
SET ROLE regress_ps_publisher;
SELECT pg_temp.try($$SELECT tide.outbox_set_schema('ps_plain', NULL, '{}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_drop_schema('ps_orders', 'order.refunded')$$);
SELECT pg_temp.try($$DELETE FROM tide.outbox_schemas$$);
RESET ROLE;
SET ROLE regress_ps_admin;
SELECT tide.outbox_set_schema('ps_plain', NULL, '{"type": "object"}');
SELECT tide.outbox_drop_schema('ps_plain', NULL);
RESET ROLE;

-- scheduled messages: a payload the schema refuses is refused when it is
-- scheduled; one refused at its move (the schema set after it) is kept
-- aside with the reason, and the outbox's other due rows still move
SELECT tide.outbox_create('ps_later');
SELECT tide.outbox_set_schema('ps_later', NULL, '{"required": ["n"]}');
SELECT pg_temp.try($$SELECT tide.outbox_schedule('ps_later', '{"x": 1}', NULL, now())$$);
SELECT tide.outbox_drop_schema('ps_later');
SELECT tide.outbox_schedule('ps_later', '{"n": 1}', NULL, now() - interval '2 seconds') > 0 AS first;
SELECT tide.outbox_schedule('ps_later', '{"x": 2}', NULL, now() - interval '1 second') > 0 AS second;
SELECT tide.outbox_schedule('ps_later', '{"n": 3}', NULL, now()) > 0 AS third;
SELECT tide.outbox_set_schema('ps_later', NULL, '{"required": ["n"]}');
SELECT tide.outbox_release_due('ps_later') AS moved;
SELECT payload FROM tide.tide_outbox_messages WHERE outbox_name = 'ps_later' ORDER BY id;
SELECT payload, refused_at IS NOT NULL AS refused, refused_reason
  FROM tide.outbox_scheduled WHERE outbox_name = 'ps_later';
SELECT tide.outbox_release_due('ps_later') AS moved_again;
SELECT tide.outbox_drop('ps_later');

-- dropping the outbox drops its schemas
SELECT tide.outbox_drop('ps_orders');
SELECT tide.outbox_drop('ps_plain');
SELECT count(*) AS schemas_left FROM tide.outbox_schemas;
DROP ROLE regress_ps_admin, regress_ps_publisher;
