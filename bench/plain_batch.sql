-- Baseline, :n messages per transaction (pgbench -D n=...): one multi-row
-- INSERT ... SELECT from generate_series into bench.plain_messages. Payloads are built the
-- same way as in tide_batch.sql; the headers, one value for the whole batch
-- as outbox_publish_batch() takes them, are computed once.
\set order_id random(1, 100000000)
\set customer_id random(1, 1000000)
\set amount random(100, 100000)
WITH h AS MATERIALIZED (
	SELECT jsonb_build_object('trace_id', md5(:order_id::text),
							  'source', 'checkout-service',
							  'content_type', 'application/json') AS headers)
INSERT INTO bench.plain_messages (outbox_name, payload, headers)
SELECT 'bench',
	   jsonb_build_object('event', 'order.created',
						  'order_id', :order_id::bigint + g,
						  'customer_id', :customer_id::bigint + g,
						  'amount_cents', :amount::bigint + g,
						  'currency', 'EUR',
						  'items', 3,
						  'sku', 'SKU-' || lpad(((:order_id::bigint + g) % 100000000)::text, 8, '0'),
						  'created_at', now()),
	   h.headers
  FROM h, generate_series(1, :n) AS g;
