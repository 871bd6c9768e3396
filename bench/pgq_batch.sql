-- PgQ, :n messages per transaction (pgbench -D n=...): one statement calling
-- pgq.insert_event() :n times, payloads built like the rows of
-- plain_batch.sql, the headers (extra1) one value for the batch.
\set order_id random(1, 100000000)
\set customer_id random(1, 1000000)
\set amount random(100, 100000)
WITH h AS MATERIALIZED (
	SELECT jsonb_build_object('trace_id', md5(:order_id::text),
							  'source', 'checkout-service',
							  'content_type', 'application/json')::text AS headers)
SELECT count(pgq.insert_event('bench', 'order.created',
		jsonb_build_object('event', 'order.created',
						   'order_id', :order_id::bigint + g,
						   'customer_id', :customer_id::bigint + g,
						   'amount_cents', :amount::bigint + g,
						   'currency', 'EUR',
						   'items', 3,
						   'sku', 'SKU-' || lpad(((:order_id::bigint + g) % 100000000)::text, 8, '0'),
						   'created_at', now())::text,
		h.headers, NULL, NULL, NULL))
  FROM h, generate_series(1, :n) AS g;
