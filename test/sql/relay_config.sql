-- Relay pipelines: relay_set_outbox, relay_enable, relay_disable,
-- relay_delete, relay_get_config, relay_list_configs; validation of every
-- webhook key, redaction of secrets, replace semantics.
\set VERBOSITY default
\i test/sql/include/try.sql

SELECT tide.outbox_create('rc_orders');
SELECT tide.outbox_create('rc_payments');

-- a minimal webhook pipeline: defaults filled in, its consumer group created
-- with auto_offset_reset 'earliest'
SELECT tide.relay_set_outbox('rc_hook', 'rc_orders', 'rc_hook_group',
							 '{"sink_type": "webhook", "url": "https://example.com/hooks"}');
SELECT jsonb_pretty(tide.relay_get_config('rc_hook'));
SELECT group_name, outbox_name, auto_offset_reset, leased_upto
  FROM tide.tide_consumer_groups WHERE group_name = 'rc_hook_group';
SELECT name, enabled FROM tide.relay_outbox_config ORDER BY name;

-- every key given; secrets redacted, other headers shown
SELECT tide.relay_set_outbox('rc_full', 'rc_orders', 'rc_full_group', $${
	"sink_type": "webhook",
	"url": "http://127.0.0.1:8080/in?x=1",
	"mode": "batch",
	"batch_size": 1000,
	"max_in_flight": 1,
	"timeout_ms": 100,
	"headers": {"Authorization": "Bearer abc", "X-Api-Key": "k1", "X-Auth-Token": "t1",
				"X-Client-Secret": "s1", "Proxy-AUTHORIZATION": "p1", "X-Tenant": "acme"},
	"signing_secret": ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_c2Vjb25k"],
	"signature": "pg-tide",
	"allow_http": true,
	"allow_private_network": true,
	"retry": {"base_ms": 10, "cap_ms": 86400000, "max_attempts": 100}
}$$);
SELECT jsonb_pretty(tide.relay_get_config('rc_full'));
-- the stored config keeps the secrets
SELECT config -> 'signing_secret' AS stored_secrets,
	   config -> 'headers' ->> 'Authorization' AS stored_authorization
  FROM tide.relay_outbox_config WHERE name = 'rc_full';
-- a single secret is redacted too
SELECT tide.relay_set_outbox('rc_one', 'rc_payments', 'rc_one_group',
	'{"sink_type": "webhook", "url": "https://[2001:db8::1]:8443/", "signing_secret": "whsec_c2Vjb25k",
	  "headers": {"token": "x", "monkey": "y", "Accept": "application/json"}}');
SELECT tide.relay_get_config('rc_one') -> 'signing_secret' AS secret,
	   tide.relay_get_config('rc_one') -> 'headers' AS headers;

-- every header that commonly carries a credential is redacted by its name
-- alone (relay/endpoints/redact.c, in any case, {"secret": false} or not);
-- ordinary headers are shown; relay_list_configs redacts the same
BEGIN;
SELECT tide.relay_set_outbox('rc_creds', 'rc_payments', 'rc_creds_group', $${
	"sink_type": "webhook", "url": "https://example.com/hooks",
	"headers": {"Authorization": "Basic dTpw", "proxy-authorization": "Basic cDpx",
				"Cookie": {"value": "sid=1", "secret": false}, "Set-Cookie": "sid=2",
				"X-API-Key": "k", "Api-Key": "k", "apikey": "k", "X-Auth-Token": "t",
				"X-Access-Token": "t", "X-CSRF-Token": "t", "Private-Token": "t",
				"X-Client-Secret": "s", "X-Password": "p", "X-Passwd": "p", "X-Pwd": "p",
				"X-Credentials": "c", "X-Session-Id": "s", "X-Hub-Signature-256": "sha256=0",
				"X-Jwt-Assertion": "j", "X-Authenticated-User": "u",
				"Content-Language": "de", "X-Request-Source": "billing", "Accept": "*/*",
				"X-Tenant": "acme"}
}$$);
SELECT key AS header, value AS shown
  FROM jsonb_each(tide.relay_get_config('rc_creds') -> 'headers') ORDER BY lower(key);
SELECT config = tide.relay_get_config('rc_creds') AS list_redacts_the_same
  FROM tide.relay_list_configs() WHERE pipeline = 'rc_creds';
ROLLBACK;

-- list
SELECT pipeline, enabled, outbox, consumer_group, sink_type,
	   config -> 'signing_secret' AS secret, config -> 'headers' ->> 'X-Tenant' AS tenant
  FROM tide.relay_list_configs();

-- the output of relay_get_config (without secrets) can be set again
SELECT pg_temp.try(format('SELECT tide.relay_set_outbox(%L, %L, %L, %L)', 'rc_hook', 'rc_orders',
						  'rc_hook_group', tide.relay_get_config('rc_hook')));

-- replace: set twice; the config is replaced, not merged, and the enabled
-- flag is kept
SELECT tide.relay_disable('rc_hook');
SELECT tide.relay_set_outbox('rc_hook', 'rc_orders', 'rc_hook_group',
							 '{"sink_type": "webhook", "url": "https://example.com/v2", "mode": "batch",
							   "retry": {"max_attempts": 3}}');
SELECT name, enabled, config ->> 'url' AS url, config ->> 'mode' AS mode, config -> 'retry' AS retry
  FROM tide.relay_outbox_config WHERE name = 'rc_hook';
-- setting the same config again writes nothing (the row is not updated, so
-- the trigger sends no notification)
SELECT xmin::text AS row_version FROM tide.relay_outbox_config WHERE name = 'rc_hook' \gset
SELECT tide.relay_set_outbox('rc_hook', 'rc_orders', 'rc_hook_group',
							 '{"sink_type": "webhook", "url": "https://example.com/v2", "mode": "batch",
							   "retry": {"max_attempts": 3}}');
SELECT xmin::text = :'row_version' AS unchanged FROM tide.relay_outbox_config WHERE name = 'rc_hook';
-- moving a pipeline to another outbox and a new group
SELECT tide.relay_set_outbox('rc_hook', 'rc_payments', 'rc_hook_group2',
							 '{"sink_type": "webhook", "url": "https://example.com/v3"}');
SELECT pipeline, outbox, consumer_group FROM tide.relay_list_configs() WHERE pipeline = 'rc_hook';

-- enable, disable
SELECT tide.relay_enable('rc_hook');
SELECT tide.relay_enable('rc_hook');
SELECT tide.relay_disable('rc_full');
SELECT tide.relay_disable('rc_full');
SELECT pipeline, enabled FROM tide.relay_list_configs();
SELECT pg_temp.try($$SELECT tide.relay_enable('nope')$$);
SELECT pg_temp.try($$SELECT tide.relay_disable('nope')$$);
SELECT pg_temp.try($$SELECT tide.relay_enable(NULL)$$);
SELECT pg_temp.try($$SELECT tide.relay_get_config('nope')$$);
SELECT pg_temp.try($$SELECT tide.relay_get_config('')$$);
SELECT pg_temp.try($$SELECT tide.relay_delete('nope')$$);
SELECT pg_temp.try($$SELECT tide.relay_delete(repeat('p', 64))$$);

-- names, outbox and consumer group
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'nope', 'g', '{"sink_type": "webhook", "url": "https://a.example"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', NULL, 'g', '{"sink_type": "webhook", "url": "https://a.example"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', NULL, '{"sink_type": "webhook", "url": "https://a.example"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'rc_one_group', '{"sink_type": "webhook", "url": "https://a.example"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'rc_full_group', '{"sink_type": "webhook", "url": "https://a.example"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "outbox": "rc_payments"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "consumer_group": "h"}')$$);
-- an existing group of the right outbox is used as it is
SELECT tide.create_consumer_group('rc_existing', 'rc_orders', 'latest');
SELECT tide.relay_set_outbox('rc_reuse', 'rc_orders', 'rc_existing', '{"sink_type": "webhook", "url": "https://a.example"}');
SELECT group_name, auto_offset_reset FROM tide.tide_consumer_groups WHERE group_name = 'rc_existing';

-- the config itself
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', NULL)$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '[]')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '"webhook"')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "sqs", "url": "https://a.example"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": 1, "url": "https://a.example"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "uri": "x"}')$$);

-- url
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": 5}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": null}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "example.com/hooks"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https:///path"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a b.example/"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example/a b"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "ftp://a.example/"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://user:pw@a.example/"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example:0/"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example:65536/"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example:/"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "http://a.example/"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "http://a.example/", "allow_http": false}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('rc_upper', 'rc_orders', 'rc_upper_group', '{"sink_type": "webhook", "url": "HTTPS://A.example:443/x?a=1#y"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('rc_http', 'rc_orders', 'rc_http_group', '{"sink_type": "webhook", "url": "http://localhost:8080", "allow_http": true}')$$);
SELECT pipeline, config ->> 'url' AS url FROM tide.relay_list_configs() WHERE pipeline IN ('rc_upper', 'rc_http');

-- mode, signature
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "mode": "stream"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "mode": 1}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "signature": "hmac"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "signature": null}')$$);

-- numbers
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "batch_size": 0}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "batch_size": 1001}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "batch_size": 1.5}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "batch_size": "10"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "max_in_flight": 0}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "max_in_flight": 1e30}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "timeout_ms": 99}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "timeout_ms": 600001}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "timeout_ms": true}')$$);

-- booleans
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "allow_http": "yes"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "allow_private_network": 1}')$$);

-- headers
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "headers": ["a"]}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "headers": {"X-N": 1}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "headers": {"X-N": "a\r\nX-Evil: 1"}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "headers": {"Bad Name": "v"}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "headers": {"": "v"}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "headers": {"X-Tenant": "a", "x-tenant": "b"}}')$$);
SELECT pg_temp.try(format('SELECT tide.relay_set_outbox(%L, %L, %L, %L)', 'p', 'rc_orders', 'g',
					  jsonb_build_object('sink_type', 'webhook', 'url', 'https://a.example',
										 'headers', jsonb_build_object(h, 'v'))))
  FROM unnest(ARRAY['webhook-id', 'Webhook-Timestamp', 'WEBHOOK-SIGNATURE', 'Idempotency-Key',
					'Content-Type', 'content-length', 'Host']) h;

-- signing_secret
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "signing_secret": 42}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "signing_secret": "c2Vjb25k"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "signing_secret": "whsec_"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "signing_secret": "whsec_not*base64"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "signing_secret": "whsec_abc"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "signing_secret": []}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "signing_secret": ["whsec_c2Vjb25k", "whsec_!!"]}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "signing_secret": ["whsec_c2Vjb25k", 7]}')$$);

-- retry
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "retry": 3}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "retry": {"attempts": 3}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "retry": {"base_ms": 9}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "retry": {"base_ms": 600001}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "retry": {"base_ms": 1000, "cap_ms": 999}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "retry": {"cap_ms": 86400001}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "retry": {"cap_ms": 100}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "retry": {"max_attempts": 0}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "retry": {"max_attempts": 101}}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "retry": {"max_attempts": "5"}}')$$);
-- ordering: "key" with ordering_key, a header name or a JSON pointer
SELECT tide.relay_set_outbox('rc_keyed', 'rc_payments', 'rc_keyed_group',
							 '{"sink_type": "webhook", "url": "https://a.example", "ordering": "key", "ordering_key": "aggregate-id"}');
SELECT tide.relay_get_config('rc_keyed') -> 'ordering' AS ordering, tide.relay_get_config('rc_keyed') -> 'ordering_key' AS ordering_key;
SELECT tide.relay_set_outbox('rc_keyed', 'rc_payments', 'rc_keyed_group',
							 '{"sink_type": "webhook", "url": "https://a.example", "ordering": "key", "ordering_key": "/order/a~1b~0c"}');
SELECT tide.relay_get_config('rc_keyed') -> 'ordering_key' AS ordering_key;
SELECT tide.relay_set_outbox('rc_keyed', 'rc_payments', 'rc_keyed_group',
							 '{"sink_type": "webhook", "url": "https://a.example", "ordering": "key", "ordering_key": "/"}');
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "ordering": "key"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "ordering": "key", "ordering_key": ""}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "ordering": "key", "ordering_key": 7}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "ordering": "key", "ordering_key": null}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "ordering": "key", "ordering_key": "/order/~2"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "ordering": "key", "ordering_key": "/order~"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "ordering": "key", "ordering_key": "a\nb"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "ordering_key": "aggregate-id"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "ordering": "strict", "ordering_key": "aggregate-id"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('p', 'rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "ordering": "keyed"}')$$);
-- a refused change leaves the keyed pipeline as it was
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('rc_keyed', 'rc_payments', 'rc_keyed_group', '{"sink_type": "webhook", "url": "https://a.example", "ordering": "key"}')$$);
SELECT tide.relay_get_config('rc_keyed') -> 'ordering_key' AS ordering_key;
SELECT tide.relay_delete('rc_keyed');

-- a base above the default cap raises the default cap with it
SELECT tide.relay_set_outbox('rc_slow', 'rc_payments', 'rc_slow_group',
							 '{"sink_type": "webhook", "url": "https://a.example", "retry": {"base_ms": 120000}}');
SELECT tide.relay_get_config('rc_slow') -> 'retry' AS retry;

-- nothing was written by the refused calls: no pipeline "p", no group "g"
SELECT count(*) AS pipeline_p FROM tide.relay_outbox_config WHERE name = 'p';
SELECT count(*) AS group_g FROM tide.tide_consumer_groups WHERE group_name = 'g';
-- a refused replace leaves the old config
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('rc_one', 'rc_payments', 'rc_one_group', '{"sink_type": "webhook", "url": "http://a.example"}')$$);
SELECT config ->> 'url' AS url FROM tide.relay_outbox_config WHERE name = 'rc_one';

-- delete: the pipeline and its offsets go, the consumer group is kept when asked
INSERT INTO tide.relay_consumer_offsets (relay_group_id, pipeline_id, outbox_name, last_change_id)
VALUES ('rc_one_group', 'rc_one', 'rc_payments', 5);
SELECT tide.relay_delete('rc_one', p_keep_group => true);
SELECT count(*) AS offsets FROM tide.relay_consumer_offsets WHERE pipeline_id = 'rc_one';
SELECT count(*) AS group_kept FROM tide.tide_consumer_groups WHERE group_name = 'rc_one_group';
SELECT pg_temp.try($$SELECT tide.relay_delete('rc_one')$$);
-- the kept group can be used by a new pipeline
SELECT tide.relay_set_outbox('rc_one_again', 'rc_payments', 'rc_one_group', '{"sink_type": "webhook", "url": "https://a.example"}');
SELECT tide.drop_consumer_group('rc_one_group');
SELECT tide.relay_delete('rc_one_again');
SELECT tide.relay_delete('rc_hook');
SELECT tide.relay_delete('rc_full');
SELECT tide.relay_delete('rc_reuse');
SELECT tide.relay_delete('rc_slow');
SELECT tide.relay_delete('rc_upper');
SELECT tide.relay_delete('rc_http');
SELECT * FROM tide.relay_list_configs();

-- file sink: defaults filled in, every key checked
SELECT tide.relay_set_outbox('rc_file', 'rc_orders', 'rc_file_group',
							 '{"sink_type": "file", "path": "/tmp/rc_file.jsonl"}');
SELECT tide.relay_get_config('rc_file');
SELECT tide.relay_set_outbox('rc_file', 'rc_orders', 'rc_file_group',
							 '{"sink_type": "file", "path": "/tmp/rc_file.jsonl", "batch_size": 1000, "fsync": false}');
SELECT config FROM tide.relay_outbox_config WHERE name = 'rc_file';
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('rc_file', 'rc_orders', 'rc_file_group', '{"sink_type": "file"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('rc_file', 'rc_orders', 'rc_file_group', '{"sink_type": "file", "path": "relative.jsonl"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('rc_file', 'rc_orders', 'rc_file_group', '{"sink_type": "file", "path": 7}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('rc_file', 'rc_orders', 'rc_file_group', '{"sink_type": "file", "path": "/tmp/x", "batch_size": 0}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('rc_file', 'rc_orders', 'rc_file_group', '{"sink_type": "file", "path": "/tmp/x", "batch_size": 1001}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('rc_file', 'rc_orders', 'rc_file_group', '{"sink_type": "file", "path": "/tmp/x", "fsync": "no"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('rc_file', 'rc_orders', 'rc_file_group', '{"sink_type": "file", "path": "/tmp/x", "url": "https://a.example"}')$$);
-- a file is written in id order anyway: it takes no ordering, nor ordering_key
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('rc_file', 'rc_orders', 'rc_file_group', '{"sink_type": "file", "path": "/tmp/x", "ordering": "key", "ordering_key": "aggregate-id"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('rc_file', 'rc_orders', 'rc_file_group', '{"sink_type": "file", "path": "/tmp/x", "ordering_key": "aggregate-id"}')$$);
-- the refused calls left the config as it was
SELECT config ->> 'path' AS path, config -> 'batch_size' AS batch_size FROM tide.relay_outbox_config WHERE name = 'rc_file';
-- a file pipeline writes as the server's OS user: superusers and pg_write_server_files only
CREATE ROLE regress_tide_file_user;
GRANT USAGE ON SCHEMA tide TO regress_tide_file_user;
GRANT tide_admin TO regress_tide_file_user;
SET ROLE regress_tide_file_user;
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('rc_file2', 'rc_orders', 'rc_file2_group', '{"sink_type": "file", "path": "/tmp/x"}')$$);
-- tide_admin may write the table, but not a file pipeline (the table's trigger)
SELECT pg_temp.try($$INSERT INTO tide.relay_outbox_config (name, config) VALUES ('rc_file3', '{"sink_type": "file", "path": "/tmp/x", "outbox": "rc_orders", "consumer_group": "rc_file3_group"}')$$);
SELECT pg_temp.try($$UPDATE tide.relay_outbox_config SET config = config || '{"path": "/tmp/y"}' WHERE name = 'rc_file'$$);
-- nor change any key of one; but enabling and disabling leave the config as
-- it is, and are not checked again
SELECT pg_temp.try($$UPDATE tide.relay_outbox_config SET config = config || '{"batch_size": 5}' WHERE name = 'rc_file'$$);
SELECT pg_temp.try($$SELECT tide.relay_disable('rc_file')$$);
SELECT pg_temp.try($$SELECT tide.relay_enable('rc_file')$$);
-- every row written by hand goes through the validator of relay_set_outbox,
-- as the role that writes it, and is stored normalised
SELECT pg_temp.try($$INSERT INTO tide.relay_outbox_config (name, config) VALUES ('rc_hand', '{"sink_type": "webhook", "url": "https://a.example", "outbox": "rc_orders", "consumer_group": "rc_hand_group", "batch_size": 1e-400}')$$);
SELECT pg_temp.try($$INSERT INTO tide.relay_outbox_config (name, config) VALUES ('rc_hand', '{"sink_type": "webhook", "url": "https://10.0.0.1/", "outbox": "rc_orders", "consumer_group": "rc_hand_group"}')$$);
SELECT pg_temp.try($$INSERT INTO tide.relay_outbox_config (name, config) VALUES ('rc_hand', '{"sink_type": "webhook", "url": "https://a.example", "consumer_group": "rc_hand_group"}')$$);
SELECT pg_temp.try($$INSERT INTO tide.relay_outbox_config (name, config) VALUES ('rc_hand', '{"sink_type": "webhook", "url": "https://a.example", "outbox": "rc_orders", "consumer_group": 7}')$$);
SELECT pg_temp.try($$INSERT INTO tide.relay_outbox_config (name, config) VALUES ('rc_hand', '{"sink_type": "webhook", "url": "https://a.example", "outbox": "rc orders", "consumer_group": "rc_hand_group"}')$$);
SELECT pg_temp.try($$INSERT INTO tide.relay_outbox_config (name, config) VALUES ('rc hand', '{"sink_type": "webhook", "url": "https://a.example", "outbox": "rc_orders", "consumer_group": "rc_hand_group"}')$$);
SELECT pg_temp.try($$INSERT INTO tide.relay_outbox_config (name, config) VALUES ('rc_hand', '[]')$$);
SELECT pg_temp.try($$INSERT INTO tide.relay_outbox_config (name, config) VALUES ('rc_hand', '{"sink_type": "webhook", "url": "https://a.example", "outbox": "rc_orders", "consumer_group": "rc_hand_group"}')$$);
SELECT config FROM tide.relay_outbox_config WHERE name = 'rc_hand';
SELECT pg_temp.try($$UPDATE tide.relay_outbox_config SET config = config || '{"retry": {"cap_ms": 1}}' WHERE name = 'rc_hand'$$);
SELECT pg_temp.try($$UPDATE tide.relay_outbox_config SET config = config - 'timeout_ms' || '{"batch_size": 7.0}' WHERE name = 'rc_hand'$$);
SELECT config -> 'batch_size' AS batch_size, config -> 'timeout_ms' AS timeout_ms FROM tide.relay_outbox_config WHERE name = 'rc_hand';
DELETE FROM tide.relay_outbox_config WHERE name = 'rc_hand';
RESET ROLE;
REVOKE tide_admin FROM regress_tide_file_user;
REVOKE ALL ON SCHEMA tide FROM regress_tide_file_user;
DROP ROLE regress_tide_file_user;
SELECT tide.relay_delete('rc_file');

-- tide._relay_normalize_config, the validator relay_set_outbox and the
-- trigger call: the config with its defaults filled in, or the error
SELECT tide._relay_normalize_config('rc_orders', 'rc_n_group', '{"sink_type": "file", "path": "/tmp/rc_n.jsonl"}') ->> 'fsync' AS fsync;
SELECT pg_temp.try($$SELECT tide._relay_normalize_config('rc_orders', 'rc_n_group', '{"sink_type": "file", "path": "/tmp/rc_n.jsonl", "outbox": "other"}')$$);
SELECT pg_temp.try($$SELECT tide._relay_normalize_config('rc_orders', 'rc_n_group', NULL)$$);

-- clean up
SELECT tide.outbox_drop('rc_orders');
SELECT tide.outbox_drop('rc_payments');

-- tide.relay_workers(): the regress cluster runs with pg_tide.relay_enabled
-- = off, so no worker is listed; the columns are those documented.
SELECT current_setting('pg_tide.relay_enabled') AS relay_enabled;
SELECT count(*) AS workers FROM tide.relay_workers();
SELECT pg_get_function_arguments('tide.relay_workers()'::regprocedure) AS columns;

-- A broker's credentials sit in "auth": secret-named strings are redacted,
-- references and other members are shown.
SELECT tide._relay_redact('{"sink_type": "kafka", "topic": "orders", "auth": {"mechanism": "SCRAM-SHA-256", "username": "relay", "password": "hunter2", "token": {"env": "PG_TIDE_TOKEN"}}}');

-- "attempt_log": true, false or "failures" (failed attempts only)
SELECT tide._relay_normalize_config('rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "attempt_log": "failures"}') -> 'attempt_log';
SELECT tide._relay_normalize_config('rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example"}') -> 'attempt_log';
SELECT pg_temp.try($$SELECT tide._relay_normalize_config('rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "attempt_log": "sometimes"}')$$);
SELECT pg_temp.try($$SELECT tide._relay_normalize_config('rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "attempt_log": 1}')$$);

-- "overlap_batches": by default true for the sinks whose library sends on
-- threads of its own (kafka, nats), false for the others; or as given
SELECT tide._relay_normalize_config('rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example"}') -> 'overlap_batches';
SELECT tide._relay_normalize_config('rc_orders', 'g', '{"sink_type": "kafka", "bootstrap_servers": "127.0.0.1:9092", "topic": "orders"}') -> 'overlap_batches';
SELECT tide._relay_normalize_config('rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "overlap_batches": true}') -> 'overlap_batches';
SELECT pg_temp.try($$SELECT tide._relay_normalize_config('rc_orders', 'g', '{"sink_type": "webhook", "url": "https://a.example", "overlap_batches": "yes"}')$$);
