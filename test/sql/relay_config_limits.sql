-- The limits of the protocols in every sink's config (ports, host names,
-- topics, subjects, MQTT's strings, AMQP's short strings), and the server
-- files a config may make the relay read (relay/config_files.c): any, for
-- a superuser or a role with the privileges of pg_read_server_files; for
-- other roles only files in pg_tide.secrets_directory, which is not set
-- here (TAP test 051 sets it), with one error for a file that exists and
-- one that does not.
\set VERBOSITY default
\i test/sql/include/try.sql

SELECT tide.outbox_create('lim_orders');

-- check(config): what the validator says of a config of pipeline
-- lim_orders / lim_group, a run of over 40 equal characters shortened
CREATE FUNCTION pg_temp.check(c jsonb) RETURNS text LANGUAGE sql AS $$
	SELECT regexp_replace(pg_temp.try(format('SELECT tide._relay_normalize_config(%L, %L, %L)',
											 'lim_orders', 'lim_group', c)),
						  '(.)\1{40,}', '<\1 x many>', 'g')
$$;

-- ports: 1 to 65535 everywhere; NATS's used to wrap (84387 is 18851)
SELECT pg_temp.check('{"sink_type": "nats", "servers": "nats://127.0.0.1:0", "subject": "s"}');
SELECT pg_temp.check('{"sink_type": "nats", "servers": "nats://127.0.0.1:70000", "subject": "s"}');
SELECT pg_temp.check('{"sink_type": "nats", "servers": ["nats://127.0.0.1:4222", "nats://127.0.0.1:84387"], "subject": "s"}');
SELECT pg_temp.check('{"sink_type": "nats", "servers": "tls://[::1]:65536", "subject": "s"}');
SELECT pg_temp.check('{"sink_type": "nats", "servers": "nats://127.0.0.1:65535", "subject": "s"}') = 'ok';
SELECT pg_temp.check('{"sink_type": "nats", "servers": "nats://n1:1", "subject": "s"}') = 'ok';
SELECT pg_temp.check('{"sink_type": "kafka", "bootstrap_servers": "k1:9092,k2:0", "topic": "t"}');
SELECT pg_temp.check('{"sink_type": "kafka", "bootstrap_servers": "k1:65536", "topic": "t"}');
SELECT pg_temp.check('{"sink_type": "mqtt", "host": "m", "port": 0, "topic": "t"}');
SELECT pg_temp.check('{"sink_type": "mqtt", "host": "m", "port": 65536, "topic": "t"}');
SELECT pg_temp.check('{"sink_type": "rabbitmq", "host": "r", "port": 70000, "routing_key": "k"}');
SELECT pg_temp.check('{"sink_type": "redis", "url": "redis://r:0", "stream": "s"}');
SELECT pg_temp.check('{"sink_type": "webhook", "url": "https://example.com:65536/"}');

-- host names: at most 253 bytes, labels of 1 to 63 bytes; a 1 MB one too
SELECT pg_temp.check(jsonb_build_object('sink_type', 'nats', 'subject', 's',
	'servers', 'nats://' || repeat('a', 1000000) || ':4222'));
SELECT pg_temp.check(jsonb_build_object('sink_type', 'nats', 'subject', 's',
	'servers', 'nats://' || repeat('a', 64) || '.example.com'));
SELECT pg_temp.check('{"sink_type": "nats", "servers": "nats://a..b:4222", "subject": "s"}');
SELECT pg_temp.check(jsonb_build_object('sink_type', 'kafka', 'topic', 't',
	'bootstrap_servers', 'k1:9092,' || repeat(repeat('b', 63) || '.', 3) || repeat('b', 62) || ':9092'));
SELECT pg_temp.check(jsonb_build_object('sink_type', 'kafka', 'topic', 't',
	'bootstrap_servers', repeat(repeat('b', 63) || '.', 3) || repeat('b', 61) || ':9092')) = 'ok';
SELECT pg_temp.check(jsonb_build_object('sink_type', 'mqtt', 'topic', 't',
	'host', repeat(repeat('m', 63) || '.', 3) || repeat('m', 62)));
SELECT pg_temp.check(jsonb_build_object('sink_type', 'mqtt', 'topic', 't', 'host', repeat('m', 64)));
SELECT pg_temp.check(jsonb_build_object('sink_type', 'rabbitmq', 'routing_key', 'k',
	'host', repeat(repeat('r', 63) || '.', 3) || repeat('r', 62)));
SELECT pg_temp.check(jsonb_build_object('sink_type', 'rabbitmq', 'routing_key', 'k',
	'host', repeat('r', 64) || '.example.com'));
SELECT pg_temp.check(jsonb_build_object('sink_type', 'redis', 'stream', 's',
	'url', 'redis://' || repeat(repeat('r', 63) || '.', 3) || repeat('r', 62) || ':6379'));
SELECT pg_temp.check(jsonb_build_object('sink_type', 'redis', 'stream', 's',
	'url', 'redis://' || repeat('r', 64) || ':6379/0'));
SELECT pg_temp.check(jsonb_build_object('sink_type', 'webhook',
	'url', 'https://' || repeat(repeat('w', 63) || '.', 3) || repeat('w', 62) || '/hooks'));
SELECT pg_temp.check(jsonb_build_object('sink_type', 'webhook', 'url', 'https://' || repeat('w', 64) || '.example.com/'));
-- a final dot is the root; addresses are not host names
SELECT pg_temp.check('{"sink_type": "mqtt", "host": "broker.example.com.", "topic": "t"}') = 'ok';
SELECT pg_temp.check('{"sink_type": "rabbitmq", "host": "::1", "routing_key": "k"}') = 'ok';

-- Kafka topics: [A-Za-z0-9._-], 1 to 249 characters, not "." or ".."
SELECT pg_temp.check('{"sink_type": "kafka", "bootstrap_servers": "k:9092", "topic": ".."}');
SELECT pg_temp.check('{"sink_type": "kafka", "bootstrap_servers": "k:9092", "topic": "."}');
SELECT pg_temp.check('{"sink_type": "kafka", "bootstrap_servers": "k:9092", "topic": "a/b"}');
SELECT pg_temp.check(jsonb_build_object('sink_type', 'kafka', 'bootstrap_servers', 'k:9092', 'topic', repeat('t', 250)));
SELECT pg_temp.check(jsonb_build_object('sink_type', 'kafka', 'bootstrap_servers', 'k:9092', 'topic', repeat('t', 249))) = 'ok';
SELECT pg_temp.check('{"sink_type": "kafka", "bootstrap_servers": "k:9092", "topic": "...a"}') = 'ok';

-- NATS subjects: tokens, no wildcard or white space, at most 1,024 bytes
SELECT pg_temp.check(jsonb_build_object('sink_type', 'nats', 'servers', 'nats://n:4222', 'subject', repeat('s', 1000000)));
SELECT pg_temp.check(jsonb_build_object('sink_type', 'nats', 'servers', 'nats://n:4222', 'subject', repeat('s', 1025)));
SELECT pg_temp.check(jsonb_build_object('sink_type', 'nats', 'servers', 'nats://n:4222', 'subject', repeat('s', 1024))) = 'ok';
SELECT pg_temp.check('{"sink_type": "nats", "servers": "nats://n:4222", "subject": "a.*"}');
SELECT pg_temp.check('{"sink_type": "nats", "servers": "nats://n:4222", "subject": "a..b"}');

-- MQTT: topic, client id, user name and password at most 65,535 bytes; no wildcard in a topic
SELECT pg_temp.check(jsonb_build_object('sink_type', 'mqtt', 'host', 'm', 'topic', repeat('t', 70000)));
SELECT pg_temp.check(jsonb_build_object('sink_type', 'mqtt', 'host', 'm', 'topic', repeat('t', 65535))) = 'ok';
SELECT pg_temp.check(jsonb_build_object('sink_type', 'mqtt', 'host', 'm', 'topic', 't', 'client_id', repeat('c', 70000)));
SELECT pg_temp.check(jsonb_build_object('sink_type', 'mqtt', 'host', 'm', 'topic', 't', 'client_id', repeat('c', 65535))) = 'ok';
SELECT pg_temp.check(jsonb_build_object('sink_type', 'mqtt', 'host', 'm', 'topic', 't',
	'auth', jsonb_build_object('username', repeat('u', 65536), 'password', 'p')));
SELECT pg_temp.check(jsonb_build_object('sink_type', 'mqtt', 'host', 'm', 'topic', 't',
	'auth', jsonb_build_object('username', 'u', 'password', repeat('p', 65536))));
SELECT pg_temp.check('{"sink_type": "mqtt", "host": "m", "topic": "a/+/b"}');
SELECT pg_temp.check('{"sink_type": "mqtt", "host": "m", "topic": "a/#"}');
-- jsonb cannot hold a NUL, so no topic has one
SELECT pg_temp.try($$SELECT '{"topic": "a\u0000b"}'::jsonb$$);

-- RabbitMQ: exchange, routing key, vhost and host are AMQP short strings (255 bytes)
SELECT pg_temp.check(jsonb_build_object('sink_type', 'rabbitmq', 'host', 'r', 'routing_key', 'k', 'exchange', repeat('e', 256)));
SELECT pg_temp.check(jsonb_build_object('sink_type', 'rabbitmq', 'host', 'r', 'routing_key', repeat('k', 256)));
SELECT pg_temp.check(jsonb_build_object('sink_type', 'rabbitmq', 'host', 'r', 'routing_key', repeat('k', 255), 'exchange', repeat('e', 255))) = 'ok';

-- Redis stream keys: at most 1,024 bytes
SELECT pg_temp.check(jsonb_build_object('sink_type', 'redis', 'url', 'redis://r', 'stream', repeat('s', 1025)));
SELECT pg_temp.check(jsonb_build_object('sink_type', 'redis', 'url', 'redis://r', 'stream', repeat('s', 1024))) = 'ok';

-- Server files. A superuser may name any file, existing or not.
SELECT current_setting('config_file') AS conf_file, current_user AS superuser_name \gset
SELECT pg_temp.check(jsonb_build_object('sink_type', 'nats', 'servers', 'nats://127.0.0.1:4222', 'subject', 's',
	'auth', jsonb_build_object('credentials_file', :'conf_file'))) = 'ok';
SELECT pg_temp.check('{"sink_type": "nats", "servers": "nats://127.0.0.1:4222", "subject": "s", "auth": {"credentials_file": "/no/such/file.creds"}}') = 'ok';
SELECT pg_temp.check('{"sink_type": "kafka", "bootstrap_servers": "k:9092", "topic": "t", "tls": {"ca_file": "/no/such/ca.pem"}}') = 'ok';

CREATE ROLE regress_lim_admin;
GRANT tide_admin TO regress_lim_admin;
SET ROLE regress_lim_admin;
-- A tide_admin may not: the same error for the server's 0600 postgresql.conf
-- and for a file that does not exist, so it cannot tell which exist
SELECT replace(pg_temp.check(jsonb_build_object('sink_type', 'nats', 'servers', 'nats://127.0.0.1:4222', 'subject', 's',
	'auth', jsonb_build_object('credentials_file', :'conf_file'))), :'conf_file', '<file>') AS existing_file;
SELECT replace(pg_temp.check('{"sink_type": "nats", "servers": "nats://127.0.0.1:4222", "subject": "s", "auth": {"credentials_file": "/no/such/file.creds"}}'),
	'/no/such/file.creds', '<file>') AS missing_file;
-- every sink's TLS files
SELECT pg_temp.check('{"sink_type": "nats", "servers": "tls://n:4222", "subject": "s", "tls": {"ca_file": "/etc/ssl/certs/ca-certificates.crt"}}');
SELECT pg_temp.check('{"sink_type": "kafka", "bootstrap_servers": "k:9092", "topic": "t", "tls": {"ca_file": "/no/ca.pem"}}');
SELECT pg_temp.check('{"sink_type": "rabbitmq", "host": "r", "routing_key": "k", "tls": {"cert_file": "/no/c.pem", "key_file": "/no/k.pem"}}');
SELECT pg_temp.check('{"sink_type": "mqtt", "host": "m", "topic": "t", "tls": {"cert_file": "/no/c.pem", "key_file": "/no/k.pem"}}');
-- relay_set_outbox refuses it and writes nothing
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('lim_nats', 'lim_orders', 'lim_group', '{"sink_type": "nats", "servers": "nats://127.0.0.1:4222", "subject": "s", "auth": {"credentials_file": "/no/such/file.creds"}}')$$);
SELECT count(*) FROM tide.relay_outbox_config WHERE name = 'lim_nats';
-- a row written by hand cannot borrow a superuser's rights by naming it as
-- its owner: the writer becomes the owner, and is checked
SELECT pg_temp.try(format($$INSERT INTO tide.relay_outbox_config (name, config, owner) VALUES ('lim_nats', %L, %L)$$,
	'{"sink_type": "nats", "servers": "nats://127.0.0.1:4222", "subject": "s", "outbox": "lim_orders", "consumer_group": "lim_group", "auth": {"credentials_file": "/no/such/file.creds"}}',
	:'superuser_name'));
SELECT pg_temp.try(format($$INSERT INTO tide.relay_outbox_config (name, config, owner) VALUES ('lim_hook', %L, %L)$$,
	'{"sink_type": "webhook", "url": "https://example.com/", "outbox": "lim_orders", "consumer_group": "lim_hook_group"}',
	:'superuser_name'));
SELECT owner FROM tide.relay_outbox_config WHERE name = 'lim_hook';
-- nor by changing the owner of a row
SELECT pg_temp.try(format($$UPDATE tide.relay_outbox_config SET owner = %L WHERE name = 'lim_hook'$$, :'superuser_name'));
SELECT owner FROM tide.relay_outbox_config WHERE name = 'lim_hook';
RESET ROLE;

-- with the privileges of pg_read_server_files, any file
GRANT pg_read_server_files TO regress_lim_admin;
SET ROLE regress_lim_admin;
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('lim_nats', 'lim_orders', 'lim_group', '{"sink_type": "nats", "servers": "nats://127.0.0.1:4222", "subject": "s", "auth": {"credentials_file": "/no/such/file.creds"}}')$$);
SELECT owner FROM tide.relay_outbox_config WHERE name = 'lim_nats';
RESET ROLE;
-- a superuser who sets it again owns it
SELECT tide.relay_set_outbox('lim_nats', 'lim_orders', 'lim_group', '{"sink_type": "nats", "servers": "nats://127.0.0.1:4222", "subject": "s", "auth": {"credentials_file": "/no/such/file.creds"}}');
SELECT owner = current_user AS superuser_owns FROM tide.relay_outbox_config WHERE name = 'lim_nats';
-- a superuser may write a row naming another owner (a restore does)
UPDATE tide.relay_outbox_config SET owner = 'regress_lim_admin' WHERE name = 'lim_nats';
SELECT owner FROM tide.relay_outbox_config WHERE name = 'lim_nats';
-- which the relay worker checks the row with (TAP test 051), while the
-- row is checked with the writer's rights, so that a restore restores it
REVOKE pg_read_server_files FROM regress_lim_admin;
SELECT pg_temp.try($$UPDATE tide.relay_outbox_config SET config = config || '{"timeout_ms": 5000}' WHERE name = 'lim_nats'$$);
SELECT owner, config -> 'timeout_ms' AS timeout_ms FROM tide.relay_outbox_config WHERE name = 'lim_nats';
-- and that owner, writing the row itself, is checked with its own rights
SET ROLE regress_lim_admin;
SELECT pg_temp.try($$UPDATE tide.relay_outbox_config SET config = config || '{"timeout_ms": 6000}' WHERE name = 'lim_nats'$$);
RESET ROLE;

SELECT tide.relay_delete('lim_nats');
SELECT tide.relay_delete('lim_hook');
SELECT tide.drop_consumer_group('lim_hook_group', true);
SELECT tide.outbox_drop('lim_orders');
REVOKE tide_admin FROM regress_lim_admin;
DROP ROLE regress_lim_admin;
