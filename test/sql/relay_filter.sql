-- Routing: a pipeline's "types" and "filter" (relay/filter.c), evaluated
-- with tide.relay_filter_matches; validation of both keys; both stored by
-- relay_set_outbox.
\set VERBOSITY default
\i test/sql/include/try.sql

-- m(filter, payload[, headers]): whether the message passes {"filter": filter}
CREATE FUNCTION pg_temp.m(f jsonb, p jsonb, h jsonb DEFAULT NULL) RETURNS boolean
LANGUAGE sql AS $$ SELECT tide.relay_filter_matches(jsonb_build_object('filter', f), p, h) $$;
-- t(types, headers): whether a message with these headers passes {"types": types}
CREATE FUNCTION pg_temp.t(ty jsonb, h jsonb) RETURNS boolean
LANGUAGE sql AS $$ SELECT tide.relay_filter_matches(jsonb_build_object('types', ty), '{}', h) $$;

-- no routing: every message passes
SELECT tide.relay_filter_matches('{}', '{"a": 1}', NULL) AS no_keys,
	   tide.relay_filter_matches('{"sink_type": "webhook", "url": "https://x.example"}', '1', NULL) AS other_keys,
	   pg_temp.m('{}', '{"a": 1}') AS empty_filter;

-- equality: implicit and $eq; numbers by value, deep equality of objects and arrays
SELECT pg_temp.m('{"status": "paid"}', '{"status": "paid"}') AS t1,
	   pg_temp.m('{"status": "paid"}', '{"status": "open"}') AS f1,
	   pg_temp.m('{"status": {"$eq": "paid"}}', '{"status": "paid"}') AS t2,
	   pg_temp.m('{"n": 1}', '{"n": 1.0}') AS t3,
	   pg_temp.m('{"n": 1}', '{"n": "1"}') AS f2,
	   pg_temp.m('{"n": null}', '{"n": null}') AS t4,
	   pg_temp.m('{"n": null}', '{}') AS f3,
	   pg_temp.m('{"ok": true}', '{"ok": true}') AS t5,
	   pg_temp.m('{"ok": true}', '{"ok": 1}') AS f4,
	   pg_temp.m('{"c": {"x": 1, "y": [1, 2]}}', '{"c": {"y": [1, 2], "x": 1}}') AS t6,
	   pg_temp.m('{"c": {"x": 1}}', '{"c": {"x": 1, "y": 2}}') AS f5,
	   pg_temp.m('{"tags": ["a", "b"]}', '{"tags": ["b", "a"]}') AS f6,
	   pg_temp.m('{"tags": "a"}', '{"tags": ["a"]}') AS f7;

-- $neq: also matches a missing field
SELECT pg_temp.m('{"s": {"$neq": "x"}}', '{"s": "y"}') AS t1,
	   pg_temp.m('{"s": {"$neq": "x"}}', '{"s": "x"}') AS f1,
	   pg_temp.m('{"s": {"$neq": "x"}}', '{}') AS t2,
	   pg_temp.m('{"s": {"$neq": 1}}', '{"s": "1"}') AS t3;

-- $in, $nin
SELECT pg_temp.m('{"c": {"$in": ["EUR", "USD"]}}', '{"c": "USD"}') AS t1,
	   pg_temp.m('{"c": {"$in": ["EUR", "USD"]}}', '{"c": "GBP"}') AS f1,
	   pg_temp.m('{"c": {"$in": ["EUR", "USD"]}}', '{}') AS f2,
	   pg_temp.m('{"c": {"$in": []}}', '{"c": "EUR"}') AS f3,
	   pg_temp.m('{"c": {"$in": [1, {"a": 1}]}}', '{"c": {"a": 1}}') AS t2,
	   pg_temp.m('{"c": {"$nin": ["EUR", "USD"]}}', '{"c": "GBP"}') AS t3,
	   pg_temp.m('{"c": {"$nin": ["EUR", "USD"]}}', '{"c": "EUR"}') AS f4,
	   pg_temp.m('{"c": {"$nin": ["EUR"]}}', '{}') AS t4;

-- $gt, $gte, $lt, $lte on numbers and strings; other types never match
SELECT pg_temp.m('{"n": {"$gt": 5}}', '{"n": 6}') AS t1,
	   pg_temp.m('{"n": {"$gt": 5}}', '{"n": 5}') AS f1,
	   pg_temp.m('{"n": {"$gte": 5}}', '{"n": 5}') AS t2,
	   pg_temp.m('{"n": {"$gte": 5}}', '{"n": 4.99}') AS f2,
	   pg_temp.m('{"n": {"$lt": 5}}', '{"n": -1e3}') AS t3,
	   pg_temp.m('{"n": {"$lt": 5}}', '{"n": 5}') AS f3,
	   pg_temp.m('{"n": {"$lte": 5}}', '{"n": 5}') AS t4,
	   pg_temp.m('{"n": {"$lte": 5}}', '{"n": 5.5}') AS f4,
	   pg_temp.m('{"n": {"$gt": 5}}', '{"n": "6"}') AS f5,
	   pg_temp.m('{"n": {"$gt": "5"}}', '{"n": 6}') AS f6,
	   pg_temp.m('{"n": {"$gt": 5}}', '{}') AS f7,
	   pg_temp.m('{"n": {"$lt": 5}}', '{"n": null}') AS f8;
SELECT pg_temp.m('{"d": {"$gte": "2026-01-01", "$lt": "2027-01-01"}}', '{"d": "2026-06-30T12:00:00Z"}') AS t1,
	   pg_temp.m('{"d": {"$gte": "2026-01-01", "$lt": "2027-01-01"}}', '{"d": "2027-01-01"}') AS f1,
	   pg_temp.m('{"s": {"$gt": "B"}}', '{"s": "a"}') AS t2,
	   pg_temp.m('{"s": {"$lt": "é"}}', '{"s": "z"}') AS t3,
	   pg_temp.m('{"n": {"$gt": 1, "$lt": 10}}', '{"n": 10}') AS f2;

-- $exists: present whatever the value, null included
SELECT pg_temp.m('{"a": {"$exists": true}}', '{"a": null}') AS t1,
	   pg_temp.m('{"a": {"$exists": true}}', '{"b": 1}') AS f1,
	   pg_temp.m('{"a": {"$exists": false}}', '{"b": 1}') AS t2,
	   pg_temp.m('{"a": {"$exists": false}}', '{"a": false}') AS f2,
	   pg_temp.m('{"a.b": {"$exists": true}}', '{"a": 1}') AS f3;

-- $startsWith, $endsWith: strings only, case-sensitive
SELECT pg_temp.m('{"e": {"$startsWith": "order."}}', '{"e": "order.paid"}') AS t1,
	   pg_temp.m('{"e": {"$startsWith": "order."}}', '{"e": "Order.paid"}') AS f1,
	   pg_temp.m('{"e": {"$startsWith": "order."}}', '{"e": "order"}') AS f2,
	   pg_temp.m('{"e": {"$endsWith": "@example.com"}}', '{"e": "a@example.com"}') AS t2,
	   pg_temp.m('{"e": {"$endsWith": "@example.com"}}', '{"e": "a@example.org"}') AS f3,
	   pg_temp.m('{"e": {"$startsWith": ""}}', '{"e": ""}') AS t3,
	   pg_temp.m('{"e": {"$startsWith": "1"}}', '{"e": 12}') AS f4;

-- nested paths; a segment of digits indexes an array
SELECT pg_temp.m('{"customer.country": "DE"}', '{"customer": {"country": "DE"}}') AS t1,
	   pg_temp.m('{"customer.country": "DE"}', '{"customer": {"country": "FR"}}') AS f1,
	   pg_temp.m('{"customer.country": "DE"}', '{"customer": "DE"}') AS f2,
	   pg_temp.m('{"customer.address.zip": {"$startsWith": "10"}}',
				 '{"customer": {"address": {"zip": "10115"}}}') AS t2,
	   pg_temp.m('{"items.0.sku": "A1"}', '{"items": [{"sku": "A1"}, {"sku": "B2"}]}') AS t3,
	   pg_temp.m('{"items.1.sku": "A1"}', '{"items": [{"sku": "A1"}, {"sku": "B2"}]}') AS f3,
	   pg_temp.m('{"items.5.sku": {"$exists": false}}', '{"items": []}') AS t4,
	   pg_temp.m('{"a.0": 1}', '{"a": {"0": 1}}') AS t5,
	   pg_temp.m('{"a": 1}', '[1, 2]') AS f4,
	   pg_temp.m('{"a": {"$exists": false}}', 'null') AS t6,
	   pg_temp.m('{"a": 1}', NULL) AS f5;

-- $or, $and, $not; several keys are ANDed
SELECT pg_temp.m('{"$or": [{"c": "EUR"}, {"n": {"$gt": 100}}]}', '{"c": "USD", "n": 150}') AS t1,
	   pg_temp.m('{"$or": [{"c": "EUR"}, {"n": {"$gt": 100}}]}', '{"c": "USD", "n": 50}') AS f1,
	   pg_temp.m('{"$and": [{"c": "EUR"}, {"n": {"$gt": 100}}]}', '{"c": "EUR", "n": 150}') AS t2,
	   pg_temp.m('{"$and": [{"c": "EUR"}, {"n": {"$gt": 100}}]}', '{"c": "EUR", "n": 50}') AS f2,
	   pg_temp.m('{"$not": {"c": "EUR"}}', '{"c": "USD"}') AS t3,
	   pg_temp.m('{"$not": {"c": "EUR"}}', '{"c": "EUR"}') AS f3,
	   pg_temp.m('{"$not": {"c": "EUR"}}', '{}') AS t4,
	   pg_temp.m('{"c": "EUR", "n": {"$gt": 1}}', '{"c": "EUR", "n": 0}') AS f4,
	   pg_temp.m('{"$or": [{"$and": [{"a": 1}, {"b": 2}]}, {"$not": {"c": {"$exists": true}}}]}',
				 '{"a": 1, "b": 3}') AS t5,
	   pg_temp.m('{"$or": [{"$and": [{"a": 1}, {"b": 2}]}, {"$not": {"c": {"$exists": true}}}]}',
				 '{"a": 1, "b": 3, "c": 0}') AS f5;

-- headers: "$headers.<path>", and "$headers" itself
SELECT pg_temp.m('{"$headers.tenant": "acme"}', '{}', '{"tenant": "acme"}') AS t1,
	   pg_temp.m('{"$headers.tenant": "acme"}', '{}', '{"tenant": "other"}') AS f1,
	   pg_temp.m('{"$headers.tenant": "acme"}', '{}', NULL) AS f2,
	   pg_temp.m('{"$headers": {"$exists": false}}', '{}', NULL) AS t2,
	   pg_temp.m('{"$headers.trace.sampled": true, "n": 1}', '{"n": 1}', '{"trace": {"sampled": true}}') AS t3,
	   pg_temp.m('{"headers.tenant": "acme"}', '{"headers": {"tenant": "acme"}}', '{"tenant": "x"}') AS t4;

-- types: exact, "prefix.*" at any depth, "*"; the type is the "type" header
SELECT pg_temp.t('["order.paid"]', '{"type": "order.paid"}') AS t1,
	   pg_temp.t('["order.paid"]', '{"type": "order.paid.late"}') AS f1,
	   pg_temp.t('["order.*"]', '{"type": "order.paid"}') AS t2,
	   pg_temp.t('["order.*"]', '{"type": "order.item.added"}') AS t3,
	   pg_temp.t('["order.*"]', '{"type": "order"}') AS f2,
	   pg_temp.t('["order.*"]', '{"type": "order."}') AS f3,
	   pg_temp.t('["order.*"]', '{"type": "orders.paid"}') AS f4,
	   pg_temp.t('["order.*"]', '{"type": "Order.paid"}') AS f5,
	   pg_temp.t('["invoice.sent", "order.*"]', '{"type": "invoice.sent"}') AS t4,
	   pg_temp.t('["*"]', '{"type": "anything"}') AS t5;
-- a message without a (string) type matches only "*"
SELECT pg_temp.t('["*"]', NULL) AS t1,
	   pg_temp.t('["*"]', '{}') AS t2,
	   pg_temp.t('["order.*"]', NULL) AS f1,
	   pg_temp.t('["order.*"]', '{"kind": "order.paid"}') AS f2,
	   pg_temp.t('["1"]', '{"type": 1}') AS f3;
-- types and filter together: both must pass
SELECT tide.relay_filter_matches('{"types": ["order.*"], "filter": {"n": {"$gt": 1}}}',
								 '{"n": 2}', '{"type": "order.paid"}') AS t1,
	   tide.relay_filter_matches('{"types": ["order.*"], "filter": {"n": {"$gt": 1}}}',
								 '{"n": 0}', '{"type": "order.paid"}') AS f1,
	   tide.relay_filter_matches('{"types": ["order.*"], "filter": {"n": {"$gt": 1}}}',
								 '{"n": 2}', '{"type": "invoice.sent"}') AS f2;

-- one call site, a config per row: each row gets its own
SELECT f, tide.relay_filter_matches(jsonb_build_object('filter', f), '{"n": 5}', NULL)
  FROM (VALUES ('{"n": 5}'::jsonb), ('{"n": 6}'), ('{"n": 5}'), ('{"n": {"$gte": 5}}')) v(f);

-- validation: SQLSTATE, message and hint
SELECT pg_temp.try($$SELECT tide.relay_filter_matches(NULL, '{}', NULL)$$);
SELECT pg_temp.try($$SELECT tide.relay_filter_matches('[]', '{}', NULL)$$);
SELECT pg_temp.try($$SELECT tide.relay_filter_matches('{"types": "order.paid"}', '{}', NULL)$$);
SELECT pg_temp.try($$SELECT tide.relay_filter_matches('{"types": null}', '{}', NULL)$$);
SELECT pg_temp.try($$SELECT tide.relay_filter_matches('{"types": []}', '{}', NULL)$$);
SELECT pg_temp.try($$SELECT tide.relay_filter_matches('{"types": ["a", 1]}', '{}', NULL)$$);
SELECT pg_temp.try($$SELECT tide.relay_filter_matches('{"types": [""]}', '{}', NULL)$$);
SELECT pg_temp.try($$SELECT tide.relay_filter_matches('{"types": ["order*"]}', '{}', NULL)$$);
SELECT pg_temp.try($$SELECT tide.relay_filter_matches('{"types": ["*.paid"]}', '{}', NULL)$$);
SELECT pg_temp.try($$SELECT tide.relay_filter_matches('{"types": [".*"]}', '{}', NULL)$$);
SELECT pg_temp.try($$SELECT tide.relay_filter_matches('{"types": ["a.*.*"]}', '{}', NULL)$$);
SELECT pg_temp.try($$SELECT tide.relay_filter_matches('{"filter": [{"a": 1}]}', '{}', NULL)$$);
SELECT pg_temp.try($$SELECT tide.relay_filter_matches('{"filter": null}', '{}', NULL)$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"amount": {"$regex": "^1"}}', '{}')$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"$where": "1"}', '{}')$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"amount": {"$not": {"$gt": 5}}}', '{}')$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"status": {"$in": "EUR"}}', '{}')$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"status": {"$nin": {"a": 1}}}', '{}')$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"n": {"$gt": [1]}}', '{}')$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"n": {"$lte": null}}', '{}')$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"n": {"$exists": 1}}', '{}')$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"n": {"$startsWith": 1}}', '{}')$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"n": {"$endsWith": null}}', '{}')$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"n": {"$gt": 1, "x": 2}}', '{}')$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"$or": []}', '{}')$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"$and": {"a": 1}}', '{}')$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"$or": [{"a": 1}, 2]}', '{}')$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"$or": [{"a": 1}, {"b": {"$size": 2}}]}', '{}')$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"$not": [{"a": 1}]}', '{}')$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"a..b": 1}', '{}')$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"": 1}', '{}')$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"$headers.": 1}', '{}')$$);
SELECT pg_temp.try($$SELECT pg_temp.m('{"$headersX": 1}', '{}')$$);
SELECT pg_temp.try(format('SELECT pg_temp.m(%L, %L)',
	repeat('{"$not": ', 33) || '{"a": 1}' || repeat('}', 33), '{}'));
SELECT pg_temp.m((repeat('{"$not": ', 31) || '{"a": 1}' || repeat('}', 31))::jsonb, '{}') AS depth_31;
-- the checker the config validation uses
SELECT pg_temp.try($$SELECT tide._relay_routing_check(NULL, NULL)$$);
SELECT pg_temp.try($$SELECT tide._relay_routing_check('["a.*"]', '{"a": {"$in": [1]}}')$$);
SELECT pg_temp.try($$SELECT tide._relay_routing_check(NULL, '{"a": {"$in": 1}}')$$);

-- relay_set_outbox validates and stores types and filter, both sinks
SELECT tide.outbox_create('rf_orders');
SELECT tide.relay_set_outbox('rf_hook', 'rf_orders', 'rf_hook_group',
	'{"sink_type": "webhook", "url": "https://example.com/hooks",
	  "types": ["order.*", "invoice.sent"],
	  "filter": {"$or": [{"currency": "EUR"}, {"amount": {"$gte": 100}}], "test": {"$neq": true}}}');
SELECT c -> 'types' AS types, c -> 'filter' AS filter
  FROM tide.relay_get_config('rf_hook') c;
SELECT tide.relay_filter_matches(tide.relay_get_config('rf_hook'), '{"currency": "EUR"}', '{"type": "order.paid"}') AS t1,
	   tide.relay_filter_matches(tide.relay_get_config('rf_hook'), '{"currency": "EUR", "test": true}', '{"type": "order.paid"}') AS f1;
SELECT pg_temp.try(format('SELECT tide.relay_set_outbox(%L, %L, %L, %L)', 'rf_hook', 'rf_orders',
						  'rf_hook_group', tide.relay_get_config('rf_hook')));
-- the filter is stored as given: a null inside it survives
SELECT tide.relay_set_outbox('rf_hook', 'rf_orders', 'rf_hook_group',
	'{"sink_type": "webhook", "url": "https://example.com/hooks", "filter": {"coupon": null}}');
SELECT tide.relay_get_config('rf_hook') -> 'filter' AS filter,
	   tide.relay_get_config('rf_hook') ? 'types' AS has_types;
-- set again without them: gone
SELECT tide.relay_set_outbox('rf_hook', 'rf_orders', 'rf_hook_group',
	'{"sink_type": "webhook", "url": "https://example.com/hooks"}');
SELECT tide.relay_get_config('rf_hook') ?| ARRAY['types', 'filter'] AS has_routing;
SELECT tide.relay_set_outbox('rf_file', 'rf_orders', 'rf_file_group',
	'{"sink_type": "file", "path": "/tmp/rf.jsonl", "types": ["*"], "filter": {"$headers.tenant": "acme"}}');
SELECT c -> 'types' AS types, c -> 'filter' AS filter FROM tide.relay_get_config('rf_file') c;
-- refused: nothing written
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('rf_bad', 'rf_orders', 'rf_bad_group',
	'{"sink_type": "webhook", "url": "https://example.com/hooks", "filter": {"amount": {"$regex": "^1"}}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('rf_bad', 'rf_orders', 'rf_bad_group',
	'{"sink_type": "webhook", "url": "https://example.com/hooks", "types": "order.paid"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('rf_bad', 'rf_orders', 'rf_bad_group',
	'{"sink_type": "file", "path": "/tmp/rf.jsonl", "types": ["order.*"], "filter": {"$in": [1]}}')$$);
SELECT count(*) AS bad_rows FROM tide.relay_outbox_config WHERE name = 'rf_bad';

SELECT tide.relay_delete('rf_hook');
SELECT tide.relay_delete('rf_file');
SELECT tide.outbox_drop('rf_orders');
