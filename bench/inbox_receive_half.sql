-- inbox.sh, receive_half: one tide.inbox_receive() per transaction; half
-- the transactions (at random) repeat the id of an event stored before the
-- run ('pre-1' .. 'pre-:preloaded'), the other half send a new id.
\set order_id random(1, 100000000)
\set customer_id random(1, 1000000)
\set amount random(100, 100000)
\set dup random(0, 1)
\set pre random(1, :preloaded)
SELECT tide.inbox_receive('bench',
		CASE WHEN :dup = 1 THEN 'pre-' || :pre ELSE 'evt-' || nextval('bench.event_ids') END,
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
		'checkout-service');
