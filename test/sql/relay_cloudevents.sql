-- "format": "cloudevents" in pipeline configs (relay/cloudevents.c): the
-- normalised config of each mode, and every refusal, for the webhook and
-- the Kafka sink.
\set VERBOSITY default
\i test/sql/include/try.sql

SELECT tide.outbox_create('ce_orders');

-- check(config): what the validator says of a config
CREATE FUNCTION pg_temp.check(c jsonb) RETURNS text LANGUAGE sql AS $$
	SELECT pg_temp.try(format('SELECT tide._relay_normalize_config(%L, %L, %L)',
							  'ce_orders', 'ce_group', c))
$$;
-- normalized(config): the config's format and cloudevents members once normalised
CREATE FUNCTION pg_temp.normalized(c jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('format', n -> 'format', 'cloudevents', n -> 'cloudevents',
							  'body', n -> 'body')
	  FROM tide._relay_normalize_config('ce_orders', 'ce_group', c) AS n
$$;

-- native is the default and leaves no trace; cloudevents fills the defaults in
SELECT pg_temp.normalized('{"sink_type": "webhook", "url": "https://a.example"}');
SELECT pg_temp.normalized('{"sink_type": "webhook", "url": "https://a.example", "format": "native"}');
SELECT pg_temp.normalized('{"sink_type": "webhook", "url": "https://a.example", "format": "cloudevents"}');
SELECT pg_temp.normalized('{"sink_type": "webhook", "url": "https://a.example", "format": "cloudevents",
	"cloudevents": {"mode": "binary", "source": "https://shop.example/orders", "type": "com.example.order",
					"type_header": "kind", "subject_header": "order_id", "id_header": "event_id"}}');
SELECT pg_temp.normalized('{"sink_type": "kafka", "bootstrap_servers": "k:9092", "topic": "t",
	"format": "cloudevents", "cloudevents": {"mode": "binary"}}');

-- refusals
SELECT pg_temp.check('{"sink_type": "webhook", "url": "https://a.example", "format": "xml"}');
SELECT pg_temp.check('{"sink_type": "webhook", "url": "https://a.example", "format": 1}');
SELECT pg_temp.check('{"sink_type": "webhook", "url": "https://a.example", "cloudevents": {}}');
SELECT pg_temp.check('{"sink_type": "webhook", "url": "https://a.example", "format": "cloudevents", "cloudevents": []}');
SELECT pg_temp.check('{"sink_type": "webhook", "url": "https://a.example", "format": "cloudevents", "cloudevents": {"modus": "binary"}}');
SELECT pg_temp.check('{"sink_type": "webhook", "url": "https://a.example", "format": "cloudevents", "cloudevents": {"mode": "both"}}');
SELECT pg_temp.check('{"sink_type": "webhook", "url": "https://a.example", "format": "cloudevents", "cloudevents": {"mode": true}}');
SELECT pg_temp.check('{"sink_type": "webhook", "url": "https://a.example", "format": "cloudevents", "cloudevents": {"source": ""}}');
SELECT pg_temp.check('{"sink_type": "webhook", "url": "https://a.example", "format": "cloudevents", "cloudevents": {"source": "/a\nb"}}');
SELECT pg_temp.check('{"sink_type": "webhook", "url": "https://a.example", "format": "cloudevents", "cloudevents": {"type": 5}}');
SELECT pg_temp.check(jsonb_build_object('sink_type', 'webhook', 'url', 'https://a.example', 'format', 'cloudevents',
										'cloudevents', jsonb_build_object('type', repeat('t', 1025))));
SELECT pg_temp.check('{"sink_type": "webhook", "url": "https://a.example", "format": "cloudevents", "cloudevents": {"type_header": ""}}');
SELECT pg_temp.check('{"sink_type": "webhook", "url": "https://a.example", "format": "cloudevents", "cloudevents": {"subject_header": 1}}');
SELECT pg_temp.check('{"sink_type": "webhook", "url": "https://a.example", "format": "cloudevents", "cloudevents": {"id_header": "a\tb"}}');
-- binary mode sends one event per request
SELECT pg_temp.check('{"sink_type": "webhook", "url": "https://a.example", "mode": "batch", "format": "cloudevents", "cloudevents": {"mode": "binary"}}');
SELECT pg_temp.check('{"sink_type": "webhook", "url": "https://a.example", "mode": "batch", "format": "cloudevents"}');
-- in binary mode the ce- headers are the attributes
SELECT pg_temp.check('{"sink_type": "webhook", "url": "https://a.example", "headers": {"CE-Source": "x"},
	"format": "cloudevents", "cloudevents": {"mode": "binary"}}');
SELECT pg_temp.check('{"sink_type": "webhook", "url": "https://a.example", "headers": {"CE-Source": "x"},
	"format": "cloudevents"}');
-- Kafka: the body is the event or the payload
SELECT pg_temp.check('{"sink_type": "kafka", "bootstrap_servers": "k:9092", "topic": "t", "body": "envelope", "format": "cloudevents"}');
SELECT pg_temp.check('{"sink_type": "kafka", "bootstrap_servers": "k:9092", "topic": "t", "format": "cloudevents", "cloudevents": {"mode": "x"}}');
-- the broker sinks: each binding's modes; a Redis stream entry has fields,
-- not headers, and MQTT 3.1.1 no user properties, so no binary mode there
SELECT pg_temp.normalized('{"sink_type": "rabbitmq", "host": "r", "exchange": "x", "routing_key": "k",
	"format": "cloudevents", "cloudevents": {"mode": "binary"}}');
SELECT pg_temp.normalized('{"sink_type": "nats", "servers": "nats://n:4222", "subject": "s",
	"format": "cloudevents", "cloudevents": {"mode": "binary"}}');
SELECT pg_temp.normalized('{"sink_type": "mqtt", "host": "m", "topic": "t", "format": "cloudevents",
	"cloudevents": {"mode": "binary"}}');
SELECT pg_temp.normalized('{"sink_type": "mqtt", "host": "m", "topic": "t", "protocol": "3.1.1",
	"format": "cloudevents"}');
SELECT pg_temp.check('{"sink_type": "mqtt", "host": "m", "topic": "t", "protocol": "3.1.1",
	"format": "cloudevents", "cloudevents": {"mode": "binary"}}');
SELECT pg_temp.normalized('{"sink_type": "redis", "url": "redis://r:6379", "stream": "s", "format": "cloudevents"}');
SELECT pg_temp.check('{"sink_type": "redis", "url": "redis://r:6379", "stream": "s", "format": "cloudevents",
	"cloudevents": {"mode": "binary"}}');
SELECT pg_temp.check('{"sink_type": "nats", "servers": "nats://n:4222", "subject": "s", "body": "envelope",
	"format": "cloudevents"}');
-- a sink without formats refuses the keys
SELECT pg_temp.check('{"sink_type": "file", "path": "/tmp/x", "format": "cloudevents"}');
-- nothing was written
SELECT count(*) FROM tide.relay_outbox_config;
SELECT tide.outbox_drop('ce_orders');
