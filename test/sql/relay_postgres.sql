-- The postgres sink's config (relay/endpoints/postgres/config.c): another
-- pg_tide database's inbox over libpq. Each refusal has SQLSTATE 22023
-- (42501 for a file the role may not have the relay read), a message
-- naming the key and a hint; a valid config is stored with its defaults
-- and its password shown as ********; the source likewise. TAP tests 068
-- (the sink) and 069 (the source) deliver.
\set VERBOSITY default
\i test/sql/include/try.sql

SELECT tide.outbox_create('pg_orders');

-- check(config): what the validator says of a config
CREATE FUNCTION pg_temp.check(c jsonb) RETURNS text LANGUAGE sql AS $$
	SELECT pg_temp.try(format('SELECT tide._relay_normalize_config(%L, %L, %L)', 'pg_orders', 'pg_group', c))
$$;

-- the required keys
SELECT pg_temp.check('{"sink_type": "postgres", "connection": "host=db2 dbname=app", "password": "x"}');
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "password": "x"}');
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": 7, "connection": "host=db2", "password": "x"}');
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "a b", "connection": "host=db2", "password": "x"}');
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": ["host=db2"], "password": "x"}');
-- a connection string: parsed by libpq, one host, no password, no file
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": "host=db2 dbname=''app", "password": "x"}');
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": "host=db2 colour=blue", "password": "x"}');
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": "host=db2 password=secret"}');
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": "postgresql://relay:secret@db2/app"}');
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": "host=db2 passfile=/etc/passwd", "password": "x"}');
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": "service=app", "password": "x"}');
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": "host=db2 sslrootcert=/etc/ssl/ca.pem", "password": "x"}');
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": "host=db2 connect_timeout=3", "password": "x"}');
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": "host=db2,db3", "password": "x"}');
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": "host=db2 port=70000", "password": "x"}');
SELECT pg_temp.check(jsonb_build_object('sink_type', 'postgres', 'inbox', 'in', 'password', 'x',
										'connection', 'host=' || repeat('a', 64) || '.example'));
SELECT pg_temp.check(jsonb_build_object('sink_type', 'postgres', 'inbox', 'in', 'password', 'x',
										'connection', E'host=db2\ndbname=app'));
-- the password: a non-empty string or a secret reference
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": "host=db2", "password": ""}');
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": "host=db2", "password": {"env": "HOME"}}');
-- TLS: a mode of libpq's, files in pairs, absolute
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": "host=db2", "password": "x", "sslmode": "strict"}');
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": "host=db2", "password": "x", "sslcert": "/c.pem"}');
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": "host=db2", "password": "x", "sslrootcert": "ca.pem"}');
-- timeouts, the event id's header, keys the sink does not take
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": "host=db2", "password": "x", "connect_timeout_ms": 10}');
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": "host=db2", "password": "x", "statement_timeout_ms": 3600001}');
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": "host=db2", "password": "x", "event_id_header": ""}');
SELECT pg_temp.check('{"sink_type": "postgres", "inbox": "in", "connection": "host=db2", "password": "x", "ordering": "key"}');

-- a valid config: the defaults filled in
SELECT tide._relay_normalize_config('pg_orders', 'pg_group',
	'{"sink_type": "postgres", "inbox": "payments", "connection": "host=db2.internal port=5433 dbname=app user=relay",
	  "password": {"env": "PG_TIDE_DB2_PASSWORD"}}') - 'alerts' - 'retry' - 'breaker';
SELECT tide._relay_normalize_config('pg_orders', 'pg_group',
	'{"sink_type": "postgres", "inbox": "payments", "connection": "postgresql://relay@[::1]:5433/app?sslsni=1",
	  "password": "pw", "sslmode": "verify-full", "event_id_header": "event-id", "batch_size": 500,
	  "connect_timeout_ms": 2000, "statement_timeout_ms": 5000}') ->> 'statement_timeout_ms';

-- an inline password is stored and shown as ********
SELECT tide.relay_set_outbox('to_db2', 'pg_orders', 'pg_group',
	'{"sink_type": "postgres", "inbox": "payments", "connection": "host=db2 dbname=app user=relay", "password": "hunter2"}');
SELECT tide.relay_get_config('to_db2') ->> 'password' AS shown,
	   (SELECT config ->> 'password' FROM tide.relay_outbox_config WHERE name = 'to_db2') AS stored;
SELECT config ->> 'password' FROM tide.relay_list_configs() WHERE pipeline = 'to_db2';

-- a role that is not a superuser must give a password, and a TLS file
-- it names must be one it may have the relay read
CREATE ROLE remote_sink_admin IN ROLE tide_admin;
SET ROLE remote_sink_admin;
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('to_db3', 'pg_orders', 'pg_group3',
	'{"sink_type": "postgres", "inbox": "payments", "connection": "host=/var/run/postgresql user=postgres"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('to_db3', 'pg_orders', 'pg_group3',
	'{"sink_type": "postgres", "inbox": "payments", "connection": "host=db3", "password": "pw", "sslrootcert": "/etc/ssl/certs/ca-certificates.crt"}')$$);
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('to_db3', 'pg_orders', 'pg_group3',
	'{"sink_type": "postgres", "inbox": "payments", "connection": "host=db3", "password": "pw"}')$$);
RESET ROLE;
SELECT name, owner FROM tide.relay_outbox_config WHERE name LIKE 'to_db%' ORDER BY name;

-- the source: a reverse pipeline reading a remote consumer group into an inbox
SELECT tide.inbox_create('pg_in');
CREATE FUNCTION pg_temp.check_source(c jsonb) RETURNS text LANGUAGE sql AS $$
	SELECT pg_temp.try(format('SELECT tide.relay_set_inbox(%L, %L, %L)', 'from_db2', 'pg_in', c))
$$;
SELECT pg_temp.check_source('{"source_type": "postgres", "consumer_group": "g", "connection": "host=db2", "password": "x"}');
SELECT pg_temp.check_source('{"source_type": "postgres", "outbox": "orders", "connection": "host=db2", "password": "x"}');
SELECT pg_temp.check_source('{"source_type": "postgres", "outbox": "or ders", "consumer_group": "g", "connection": "host=db2", "password": "x"}');
SELECT pg_temp.check_source('{"source_type": "postgres", "outbox": "orders", "consumer_group": "g", "password": "x"}');
SELECT pg_temp.check_source('{"source_type": "postgres", "outbox": "orders", "consumer_group": "g", "connection": "host=db2 password=y"}');
SELECT pg_temp.check_source('{"source_type": "postgres", "outbox": "orders", "consumer_group": "g", "connection": "host=db2", "password": "x", "inbox_name": "pg_in"}');
SELECT pg_temp.check_source('{"source_type": "postgres", "outbox": "orders", "consumer_group": "g", "connection": "host=db2", "password": "x", "batch_size": 20000}');
SELECT pg_temp.check_source('{"source_type": "postgres", "outbox": "orders", "consumer_group": "g",
	"connection": "host=db2 dbname=app user=relay", "password": "hunter2"}');
SELECT tide.relay_get_config('from_db2') - 'connection';
SELECT (SELECT config ->> 'password' FROM tide.relay_inbox_config WHERE name = 'from_db2') AS stored;
SELECT tide.relay_delete('from_db2');
SELECT tide.inbox_drop('pg_in');

SELECT tide.relay_delete('to_db2');
SELECT tide.relay_delete('to_db3');
DROP ROLE remote_sink_admin;
SELECT tide.outbox_drop('pg_orders');
