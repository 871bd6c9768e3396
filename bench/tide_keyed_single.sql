-- pg_tide, 1 message per transaction: tide_single.sql with an idempotency
-- key, a new UUID per message (the cost of the key; none repeats).
\set order_id random(1, 100000000)
\set customer_id random(1, 1000000)
\set amount random(100, 100000)
SELECT tide.outbox_publish('bench',
		jsonb_build_object('event', 'order.created',
						   'order_id', :order_id::bigint,
						   'customer_id', :customer_id::bigint,
						   'amount_cents', :amount::bigint,
						   'currency', 'EUR',
						   'items', 3,
						   'sku', 'SKU-' || lpad((:order_id::bigint % 100000000)::text, 8, '0'),
						   'created_at', now()),
		jsonb_build_object('trace_id', md5(:order_id::text),
						   'source', 'checkout-service',
						   'content_type', 'application/json'),
		gen_random_uuid()::text);
