-- pg_tide, :n messages per transaction (pgbench -D n=...): tide_batch.sql
-- with an idempotency key per message, a new UUID each (none repeats).
\set order_id random(1, 100000000)
\set customer_id random(1, 1000000)
\set amount random(100, 100000)
SELECT tide.outbox_publish_batch('bench',
	   ARRAY(SELECT jsonb_build_object('event', 'order.created',
									   'order_id', :order_id::bigint + g,
									   'customer_id', :customer_id::bigint + g,
									   'amount_cents', :amount::bigint + g,
									   'currency', 'EUR',
									   'items', 3,
									   'sku', 'SKU-' || lpad(((:order_id::bigint + g) % 100000000)::text, 8, '0'),
									   'created_at', now())
			   FROM generate_series(1, :n) AS g
			  ORDER BY g),
	   jsonb_build_object('trace_id', md5(:order_id::text),
						  'source', 'checkout-service',
						  'content_type', 'application/json'),
	   ARRAY(SELECT gen_random_uuid()::text FROM generate_series(1, :n)));
