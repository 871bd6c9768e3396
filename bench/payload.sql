-- The payload and headers of bench/tide_single.sql (about 200 and 114
-- bytes) as functions of a message number, for the benches that publish a
-- backlog in bulk (bench/broker_kafka.sh loads it; relay.sh, consume.sh and
-- operations.sh define the same functions inline).
CREATE SCHEMA bench;
CREATE FUNCTION bench.payload(i bigint) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('event', 'order.created',
		'order_id', 10000000 + i, 'customer_id', 100000 + i % 900000,
		'amount_cents', 100 + i % 99900, 'currency', 'EUR', 'items', 3,
		'sku', 'SKU-' || lpad(((10000000 + i) % 100000000)::text, 8, '0'),
		'created_at', now())
$$;
CREATE FUNCTION bench.headers(i bigint) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('trace_id', md5((10000000 + i)::text),
		'source', 'checkout-service', 'content_type', 'application/json')
$$;
