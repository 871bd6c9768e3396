-- Payload schemas (bench/schema.sh): one message per transaction with a
-- 20-property payload, into the outbox :outbox (with or without a schema).
\set order_id random(1, 100000000)
\set customer_id random(1, 1000000)
\set amount random(100, 100000)
SELECT tide.outbox_publish(:outbox,
		jsonb_build_object('event', 'order.created',
						   'order_id', :order_id::bigint,
						   'customer_id', :customer_id::bigint,
						   'amount_cents', :amount::bigint,
						   'currency', 'EUR',
						   'items', 3,
						   'sku', 'SKU-' || lpad((:order_id::bigint % 100000000)::text, 8, '0'),
						   'created_at', now(),
						   'channel', 'web',
						   'country', 'DE',
						   'coupon', null,
						   'gift', false,
						   'tax_cents', :amount::bigint / 5,
						   'shipping_cents', 499,
						   'email', 'customer' || :customer_id || '@example.com',
						   'tags', jsonb_build_array('new', 'promo'),
						   'address', jsonb_build_object('city', 'Berlin', 'zip', '10115'),
						   'note', 'leave at the door',
						   'priority', 2,
						   'version', 1),
		'{"type": "order.created"}');
