-- PgQ, 1 message per transaction: pgq.insert_event() with the payload of
-- tide_single.sql as the event's data and its headers as extra1.
\set order_id random(1, 100000000)
\set customer_id random(1, 1000000)
\set amount random(100, 100000)
SELECT pgq.insert_event('bench', 'order.created',
		jsonb_build_object('event', 'order.created',
						   'order_id', :order_id::bigint,
						   'customer_id', :customer_id::bigint,
						   'amount_cents', :amount::bigint,
						   'currency', 'EUR',
						   'items', 3,
						   'sku', 'SKU-' || lpad((:order_id::bigint % 100000000)::text, 8, '0'),
						   'created_at', now())::text,
		jsonb_build_object('trace_id', md5(:order_id::text),
						   'source', 'checkout-service',
						   'content_type', 'application/json')::text,
		NULL, NULL, NULL);
