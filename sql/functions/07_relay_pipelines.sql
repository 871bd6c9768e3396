-- ---------------------------------------------------------------------------
-- Relay pipelines. A forward pipeline is a row of relay_outbox_config; its
-- config jsonb holds the outbox, the consumer group it reads through and the
-- sink's settings, validated and completed with defaults when it is set (see
-- docs/relay.md#pipelines). The relay delivers webhook and file pipelines
-- (relay/sink_webhook.c, relay/sink_file.c).
-- ---------------------------------------------------------------------------

-- Raises 22023 for a relay config key.
CREATE OR REPLACE FUNCTION tide._relay_bad_config(p_message text, p_hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	RAISE EXCEPTION '%', p_message
		USING ERRCODE = 'invalid_parameter_value', HINT = p_hint;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_bad_config(text,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_bad_config(text,text) TO tide_admin;

-- Checks that a config value has the JSON type expected for it.
CREATE OR REPLACE FUNCTION tide._relay_check_type(p_key text, p_value jsonb, p_type text, p_hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	IF jsonb_typeof(p_value) IS DISTINCT FROM p_type THEN
		PERFORM tide._relay_bad_config(
			format('config key "%s" must be %s, not %s', p_key,
				   CASE p_type WHEN 'object' THEN 'an object' WHEN 'array' THEN 'an array'
				   ELSE 'a ' || p_type END,
				   coalesce(jsonb_typeof(p_value), 'missing')),
			p_hint);
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_check_type(text,jsonb,text,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_check_type(text,jsonb,text,text) TO tide_admin;

-- A number as a message shows it: as written when short, else in
-- scientific notation (1e-400 written out has 402 characters).
CREATE OR REPLACE FUNCTION tide._relay_number_text(p_n numeric)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT
AS $$
	SELECT CASE WHEN length(p_n::text) <= 20 THEN p_n::text
				ELSE btrim(to_char(p_n, '9.999EEEE')) END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_number_text(numeric) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_number_text(numeric) TO tide_admin;

-- An integer config value within [p_min, p_max], or p_default when absent.
-- Every caller's range lies within int4, which is what the relay reads.
CREATE OR REPLACE FUNCTION tide._relay_int(p_obj jsonb, p_field text, p_key text,
								p_min bigint, p_max bigint, p_default bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	v jsonb := p_obj -> p_field;
	n numeric;
	hint text := format('Give "%s" an integer from %s to %s.', p_key, p_min, p_max);
BEGIN
	IF v IS NULL THEN
		RETURN p_default;
	END IF;
	IF jsonb_typeof(v) <> 'number' OR v::numeric <> trunc(v::numeric) THEN
		PERFORM tide._relay_bad_config(
			format('config key "%s" must be an integer, not %s', p_key,
				   CASE WHEN jsonb_typeof(v) = 'number' THEN tide._relay_number_text(v::numeric)
				   ELSE jsonb_typeof(v) END),
			hint);
	END IF;
	n := v::numeric;
	IF n < p_min OR n > p_max THEN
		PERFORM tide._relay_bad_config(
			format('config key "%s" is out of range: %s', p_key, tide._relay_number_text(n)), hint);
	END IF;
	RETURN n::bigint;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_int(jsonb,text,text,bigint,bigint,bigint) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_int(jsonb,text,text,bigint,bigint,bigint) TO tide_admin;

-- A boolean config value, or p_default when absent.
CREATE OR REPLACE FUNCTION tide._relay_bool(p_obj jsonb, p_key text, p_default boolean)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	IF NOT p_obj ? p_key THEN
		RETURN p_default;
	END IF;
	PERFORM tide._relay_check_type(p_key, p_obj -> p_key, 'boolean',
								   format('Give "%s" as true or false.', p_key));
	RETURN (p_obj -> p_key)::boolean;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_bool(jsonb,text,boolean) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_bool(jsonb,text,boolean) TO tide_admin;

-- A string config value that is one of p_allowed, or p_default when absent.
CREATE OR REPLACE FUNCTION tide._relay_choice(p_obj jsonb, p_key text, p_allowed text[], p_default text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	hint text := format('Give "%s" one of: %s.', p_key,
						(SELECT string_agg(quote_literal(a), ', ') FROM unnest(p_allowed) a));
BEGIN
	IF NOT p_obj ? p_key THEN
		IF p_default IS NULL THEN
			PERFORM tide._relay_bad_config(format('config key "%s" is missing', p_key), hint);
		END IF;
		RETURN p_default;
	END IF;
	PERFORM tide._relay_check_type(p_key, p_obj -> p_key, 'string', hint);
	IF NOT (p_obj ->> p_key) = ANY (p_allowed) THEN
		PERFORM tide._relay_bad_config(
			format('invalid value "%s" for config key "%s"', p_obj ->> p_key, p_key), hint);
	END IF;
	RETURN p_obj ->> p_key;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_choice(jsonb,text,text[],text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_choice(jsonb,text,text[],text) TO tide_admin;

-- Refuses keys of p_obj that are not in p_known; p_prefix names the parent
-- object in messages ("retry.").
CREATE OR REPLACE FUNCTION tide._relay_check_keys(p_obj jsonb, p_known text[], p_prefix text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	k text;
BEGIN
	SELECT min(key) INTO k FROM jsonb_object_keys(p_obj) AS key WHERE key <> ALL (p_known);
	IF k IS NOT NULL THEN
		PERFORM tide._relay_bad_config(
			format('unknown config key "%s%s"', p_prefix, k),
			format('Remove "%s%s"; the known keys are: %s.', p_prefix, k,
				   array_to_string(ARRAY(SELECT unnest(p_known) ORDER BY 1), ', ')));
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_check_keys(jsonb,text[],text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_check_keys(jsonb,text[],text) TO tide_admin;

-- What the host of a URL is for the SSRF check: 'name', 'public',
-- 'private' or 'invalid' (relay/address.c, the rules the relay applies
-- when it connects).
CREATE OR REPLACE FUNCTION tide._relay_url_host_class(p_host text)
RETURNS text
AS 'MODULE_PATHNAME', 'tide_relay_url_host_class'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_url_host_class(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_url_host_class(text) TO tide_admin;

-- Validates a webhook URL: http or https, a host, an optional port, no
-- user name or password (they would not be redacted: use headers), no
-- white space; unless p_allow_private, a host written as an address must
-- be a public one (a name is checked by the relay once resolved).
CREATE OR REPLACE FUNCTION tide._relay_check_url(p_url text, p_allow_http boolean, p_allow_private boolean)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	host_class text;
	m text[];
	hint text := 'Give "url" as an absolute URL such as "https://example.com/hooks".';
BEGIN
	-- Not repeated in the message: a line break would forge a line of the log.
	IF p_url ~ '[[:space:][:cntrl:]]' THEN
		PERFORM tide._relay_bad_config('config key "url" must not contain white space or control characters',
			hint || ' Encode a space in a path or query as %20.');
	END IF;
	m := regexp_match(p_url,
		'^([A-Za-z][A-Za-z0-9+.-]*)://([^/?#@]*@)?([A-Za-z0-9._~-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]*)?([/?#][^[:space:]]*)?$');
	IF m IS NULL THEN
		PERFORM tide._relay_bad_config(format('config key "url" is not a valid URL: "%s"', p_url), hint);
	END IF;
	IF lower(m[1]) NOT IN ('http', 'https') THEN
		PERFORM tide._relay_bad_config(
			format('config key "url" has scheme "%s"', m[1]),
			'Give "url" an https:// URL (or http:// with "allow_http": true).');
	END IF;
	IF m[2] IS NOT NULL THEN
		PERFORM tide._relay_bad_config('config key "url" must not contain a user name or password',
			'Send credentials in "headers", for example "Authorization"; headers are redacted, URLs are not.');
	END IF;
	IF m[4] IS NOT NULL AND (m[4] !~ '^:[0-9]{1,5}$' OR substr(m[4], 2)::int NOT BETWEEN 1 AND 65535) THEN
		PERFORM tide._relay_bad_config(format('config key "url" has an invalid port: "%s"', p_url),
			'Give "url" a port from 1 to 65535, or none.');
	END IF;
	IF lower(m[1]) = 'http' AND NOT p_allow_http THEN
		PERFORM tide._relay_bad_config('config key "url" uses plain http',
			'Use an https:// URL, or set "allow_http": true to send over plain http.');
	END IF;
	host_class := tide._relay_url_host_class(m[3]);
	IF host_class = 'invalid' THEN
		PERFORM tide._relay_bad_config(format('config key "url" has an invalid IPv6 address: "%s"', m[3]),
			'Write an IPv6 address in brackets, for example "https://[2001:db8::1]/hooks".');
	END IF;
	IF host_class = 'private' AND NOT p_allow_private THEN
		PERFORM tide._relay_bad_config(
			format('config key "url" points to a non-public address: "%s"', m[3]),
			'Loopback, private, link-local (cloud metadata), unspecified and multicast addresses are refused; '
			'set "allow_private_network": true to send to one.');
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_check_url(text,boolean,boolean) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_check_url(text,boolean,boolean) TO tide_admin;

-- Validates a reference to a secret kept outside the database: {"env":
-- "PG_TIDE_..."} names an environment variable of the server, {"file":
-- "name"} a file in pg_tide.secrets_directory. The relay reads it when it
-- reads the pipeline (relay/secrets.c); docs/security.md#secret-references.
CREATE OR REPLACE FUNCTION tide._relay_check_secret_ref(p_key text, p_ref jsonb)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	hint text := format('Give "%s" as {"env": "PG_TIDE_<NAME>"} or {"file": "<file name in pg_tide.secrets_directory>"}.', p_key);
BEGIN
	IF (SELECT count(*) FROM jsonb_object_keys(p_ref)) <> 1
	   OR NOT (p_ref ? 'env' OR p_ref ? 'file') THEN
		PERFORM tide._relay_bad_config(format('config key "%s" is not a valid secret reference', p_key), hint);
	END IF;
	IF jsonb_typeof(p_ref -> 'env') = 'string' THEN
		IF (p_ref ->> 'env') !~ '^PG_TIDE_[A-Za-z0-9_]+$' THEN
			PERFORM tide._relay_bad_config(
				format('environment variable "%s" in config key "%s" does not start with "PG_TIDE_"', p_ref ->> 'env', p_key),
				'Only environment variables named PG_TIDE_<letters, digits, _> can hold secrets.');
		END IF;
	ELSIF jsonb_typeof(p_ref -> 'file') = 'string' THEN
		IF (p_ref ->> 'file') !~ '^[A-Za-z0-9_][A-Za-z0-9._-]*$' OR octet_length(p_ref ->> 'file') > 255 THEN
			PERFORM tide._relay_bad_config(
				format('file "%s" in config key "%s" is not a plain file name', p_ref ->> 'file', p_key),
				'Give the name of a file in pg_tide.secrets_directory: letters, digits, ".", "_" and "-", no "/", not starting with ".".');
		END IF;
	ELSE
		PERFORM tide._relay_bad_config(format('config key "%s" is not a valid secret reference', p_key), hint);
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_check_secret_ref(text,jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_check_secret_ref(text,jsonb) TO tide_admin;

-- Validates one signing secret: "whsec_" and base64 of at least one byte,
-- or a reference (the relay checks the form of what it refers to).
CREATE OR REPLACE FUNCTION tide._relay_check_secret(p_secret jsonb)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	hint text := 'Give "signing_secret" as "whsec_<base64>" or {"env": ...} / {"file": ...}, or an array of such to rotate secrets.';
	ok boolean;
BEGIN
	IF jsonb_typeof(p_secret) = 'object' THEN
		PERFORM tide._relay_check_secret_ref('signing_secret', p_secret);
		RETURN;
	END IF;
	PERFORM tide._relay_check_type('signing_secret', p_secret, 'string', hint);
	IF (p_secret #>> '{}') !~ '^whsec_' THEN
		PERFORM tide._relay_bad_config('config key "signing_secret" must start with "whsec_"', hint);
	END IF;
	BEGIN
		ok := length(decode(substr(p_secret #>> '{}', 7), 'base64')) > 0;
	EXCEPTION WHEN invalid_parameter_value OR data_exception THEN
		ok := false;
	END;
	IF NOT ok THEN
		-- The secret itself is not repeated in the message.
		PERFORM tide._relay_bad_config('config key "signing_secret" is not valid base64 after "whsec_"', hint);
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_check_secret(jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_check_secret(jsonb) TO tide_admin;

-- Validates the "alerts" object of a pipeline config and returns it with its
-- defaults: failure_threshold (failed attempts in a row that count as 100 %)
-- and auto_disable (disable the pipeline when they reach it).
CREATE OR REPLACE FUNCTION tide._relay_alerts_config(p_config jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	a jsonb := coalesce(p_config -> 'alerts', '{}');
BEGIN
	PERFORM tide._relay_check_type('alerts', a, 'object',
		'Give "alerts" as an object with failure_threshold and auto_disable.');
	PERFORM tide._relay_check_keys(a, ARRAY['failure_threshold', 'auto_disable'], 'alerts.');
	RETURN jsonb_build_object(
		'failure_threshold', tide._relay_int(a, 'failure_threshold', 'alerts.failure_threshold', 1, 1000000, 100),
		'auto_disable', tide._relay_bool(a, 'auto_disable', false));
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_alerts_config(jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_alerts_config(jsonb) TO tide_admin;

-- Validates the optional "rate_limit" and "breaker" objects of a pipeline
-- config and returns them with their defaults ({} when neither is given):
-- rate_limit.per_second (messages a second, fractions allowed, from 0.001
-- to 1000000) and rate_limit.burst (messages at once, default per_second
-- rounded up);
-- breaker.failure_threshold (failed attempts in a row that open it, default
-- 20) and breaker.cooldown_ms (how long it stays open, default 30000).
CREATE OR REPLACE FUNCTION tide._relay_pacing_config(p_config jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	r jsonb := p_config -> 'rate_limit';
	b jsonb := p_config -> 'breaker';
	result jsonb := '{}';
	per_second numeric;
	rate_hint text := 'Give "rate_limit.per_second" as a number from 0.001 (one message every 1,000 s) '
					  'to 1000000; tide.relay_disable() stops a pipeline.';
BEGIN
	IF r IS NOT NULL THEN
		PERFORM tide._relay_check_type('rate_limit', r, 'object',
			'Give "rate_limit" as an object with per_second and burst.');
		PERFORM tide._relay_check_keys(r, ARRAY['per_second', 'burst'], 'rate_limit.');
		IF NOT r ? 'per_second' THEN
			PERFORM tide._relay_bad_config('config key "rate_limit.per_second" is missing',
				'Give "rate_limit.per_second", the messages a second the pipeline may send, for example 50.');
		END IF;
		PERFORM tide._relay_check_type('rate_limit.per_second', r -> 'per_second', 'number', rate_hint);
		per_second := (r ->> 'per_second')::numeric;
		-- At least 0.001, one message every 1,000 s: the relay computes the
		-- bucket in float8, which cannot hold every numeric above 0 (1e-400
		-- is none), and a slower pipeline is better disabled than woken up
		-- for a message a day; the relay bounds its wait to match
		-- (relay/pacing.c). At most 1000000, beyond what a worker sends.
		IF per_second < 0.001 OR per_second > 1000000 THEN
			PERFORM tide._relay_bad_config(
				format('config key "rate_limit.per_second" is out of range: %s',
					   tide._relay_number_text(per_second)),
				rate_hint);
		END IF;
		result := result || jsonb_build_object('rate_limit', jsonb_build_object(
			'per_second', per_second,
			'burst', tide._relay_int(r, 'burst', 'rate_limit.burst', 1, 1000000, ceil(per_second)::int)));
	END IF;
	IF b IS NOT NULL THEN
		PERFORM tide._relay_check_type('breaker', b, 'object',
			'Give "breaker" as an object with failure_threshold and cooldown_ms.');
		PERFORM tide._relay_check_keys(b, ARRAY['failure_threshold', 'cooldown_ms'], 'breaker.');
		result := result || jsonb_build_object('breaker', jsonb_build_object(
			'failure_threshold', tide._relay_int(b, 'failure_threshold', 'breaker.failure_threshold', 1, 1000000, 20),
			'cooldown_ms', tide._relay_int(b, 'cooldown_ms', 'breaker.cooldown_ms', 100, 86400000, 30000)));
	END IF;
	RETURN result;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_pacing_config(jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_pacing_config(jsonb) TO tide_admin;

-- Validates a webhook sink config and returns it with every default filled
-- in (outbox and consumer group are added by the caller).
CREATE OR REPLACE FUNCTION tide._relay_webhook_config(p_config jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	known text[] := ARRAY['sink_type', 'outbox', 'consumer_group', 'url', 'mode', 'batch_size',
						  'max_in_flight', 'timeout_ms', 'headers', 'signing_secret', 'signature',
						  'allow_http', 'allow_private_network', 'retry', 'ordering', 'attempt_log',
						  'alerts', 'types', 'filter', 'rate_limit', 'breaker', 'allow_other_consumers'];
	reserved text[] := ARRAY['webhook-id', 'webhook-timestamp', 'webhook-signature',
							 'idempotency-key', 'content-type', 'content-length', 'host'];
	allow_http boolean;
	allow_private boolean;
	retry jsonb;
	base_ms bigint;
	h record;
	s jsonb;
	result jsonb;
BEGIN
	PERFORM tide._relay_check_keys(p_config, known, '');

	allow_http := tide._relay_bool(p_config, 'allow_http', false);
	allow_private := tide._relay_bool(p_config, 'allow_private_network', false);
	IF NOT p_config ? 'url' THEN
		PERFORM tide._relay_bad_config('config key "url" is missing',
			'Give "url", the https:// URL the webhook is sent to.');
	END IF;
	PERFORM tide._relay_check_type('url', p_config -> 'url', 'string',
		'Give "url" as a string such as "https://example.com/hooks".');
	PERFORM tide._relay_check_url(p_config ->> 'url', allow_http, allow_private);

	result := jsonb_build_object(
		'sink_type', 'webhook',
		'url', p_config -> 'url',
		'mode', tide._relay_choice(p_config, 'mode', ARRAY['single', 'batch'], 'single'),
		'batch_size', tide._relay_int(p_config, 'batch_size', 'batch_size', 1, 1000, 100),
		'max_in_flight', tide._relay_int(p_config, 'max_in_flight', 'max_in_flight', 1, 1000, 16),
		'timeout_ms', tide._relay_int(p_config, 'timeout_ms', 'timeout_ms', 100, 600000, 10000),
		'signature', tide._relay_choice(p_config, 'signature', ARRAY['standard', 'pg-tide'], 'standard'),
		'ordering', tide._relay_choice(p_config, 'ordering', ARRAY['relaxed', 'strict'], 'relaxed'),
		'attempt_log', tide._relay_bool(p_config, 'attempt_log', true),
		'alerts', tide._relay_alerts_config(p_config),
		'allow_other_consumers', tide._relay_bool(p_config, 'allow_other_consumers', false),
		'allow_http', allow_http,
		'allow_private_network', allow_private);

	-- headers: an object of strings; pg_tide's own headers are refused.
	IF p_config ? 'headers' THEN
		PERFORM tide._relay_check_type('headers', p_config -> 'headers', 'object',
			'Give "headers" as an object of header names and string values.');
		FOR h IN SELECT key, value FROM jsonb_each(p_config -> 'headers') ORDER BY key LOOP
			IF h.key !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' THEN
				PERFORM tide._relay_bad_config(format('invalid header name "%s" in config key "headers"', h.key),
					'Header names in "headers" are HTTP tokens: letters, digits and !#$%&''*+-.^_`|~.');
			END IF;
			IF (SELECT count(*) FROM jsonb_object_keys(p_config -> 'headers') k
				 WHERE lower(k) = lower(h.key)) > 1 THEN
				PERFORM tide._relay_bad_config(format('header "%s" is given twice in config key "headers"', h.key),
					format('Header names are compared without regard to case; give "%s" once.', h.key));
			END IF;
			IF lower(h.key) = ANY (reserved) THEN
				PERFORM tide._relay_bad_config(format('header "%s" in config key "headers" is set by pg_tide', h.key),
					format('Remove "%s" from "headers"; pg_tide sets %s itself.', h.key,
						   array_to_string(reserved, ', ')));
			END IF;
			-- A value marked secret is redacted; a reference is read by the relay.
			IF jsonb_typeof(h.value) = 'object' AND NOT h.value ? 'value' THEN
				PERFORM tide._relay_check_secret_ref(format('headers.%s', h.key), h.value);
				CONTINUE;
			END IF;
			IF jsonb_typeof(h.value) = 'object' THEN
				PERFORM tide._relay_check_keys(h.value, ARRAY['value', 'secret'], format('headers.%s.', h.key));
				IF h.value ? 'secret' THEN
					PERFORM tide._relay_check_type(format('headers.%s.secret', h.key), h.value -> 'secret', 'boolean',
						'Give "secret" as true or false.');
				END IF;
				h.value := h.value -> 'value';
			END IF;
			IF jsonb_typeof(h.value) <> 'string' OR (h.value #>> '{}') ~ '[\r\n\x01-\x08\x0b\x0c\x0e-\x1f\x7f]' THEN
				PERFORM tide._relay_bad_config(format('header "%s" in config key "headers" must have a string value', h.key),
					'Give each header in "headers" a string value without line breaks or control characters.');
			END IF;
		END LOOP;
		result := result || jsonb_build_object('headers', p_config -> 'headers');
	ELSE
		result := result || '{"headers": {}}';
	END IF;

	-- signing_secret: one secret, or several while rotating (all sign).
	IF p_config ? 'signing_secret' THEN
		s := p_config -> 'signing_secret';
		IF jsonb_typeof(s) = 'array' THEN
			IF jsonb_array_length(s) = 0 THEN
				PERFORM tide._relay_bad_config('config key "signing_secret" must not be an empty array',
					'Give "signing_secret" at least one "whsec_<base64>" string, or leave it out to send unsigned.');
			END IF;
			PERFORM tide._relay_check_secret(e) FROM jsonb_array_elements(s) e;
		ELSE
			PERFORM tide._relay_check_secret(s);
		END IF;
		result := result || jsonb_build_object('signing_secret', s);
	END IF;

	-- retry: exponential backoff with jitter between base_ms and cap_ms.
	retry := coalesce(p_config -> 'retry', '{}');
	PERFORM tide._relay_check_type('retry', retry, 'object',
		'Give "retry" as an object with base_ms, cap_ms and max_attempts.');
	PERFORM tide._relay_check_keys(retry, ARRAY['base_ms', 'cap_ms', 'max_attempts'], 'retry.');
	base_ms := tide._relay_int(retry, 'base_ms', 'retry.base_ms', 10, 600000, 500);
	result := result || jsonb_build_object('retry', jsonb_build_object(
		'base_ms', base_ms,
		'cap_ms', tide._relay_int(retry, 'cap_ms', 'retry.cap_ms', base_ms, 86400000, greatest(60000, base_ms)),
		'max_attempts', tide._relay_int(retry, 'max_attempts', 'retry.max_attempts', 1, 100, 10)));
	-- types, filter: which messages are delivered (relay/filter.c).
	result := result || tide._relay_routing(p_config) || tide._relay_pacing_config(p_config);
	RETURN result;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_webhook_config(jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_webhook_config(jsonb) TO tide_admin;

-- Validates a file sink config and returns it with every default filled in
-- (outbox and consumer group are added by the caller). The relay appends
-- to the file as the server's operating system user, so only those who may
-- write server files may name one.
CREATE OR REPLACE FUNCTION tide._relay_file_config(p_config jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	known text[] := ARRAY['sink_type', 'outbox', 'consumer_group', 'path', 'batch_size', 'fsync',
						  'attempt_log', 'alerts', 'types', 'filter', 'rate_limit', 'breaker',
						  'allow_other_consumers'];
	hint text := 'Give "path" as an absolute file name such as "/var/log/pg_tide/orders.jsonl".';
BEGIN
	PERFORM tide._relay_check_keys(p_config, known, '');
	IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user)
	   AND NOT pg_catalog.pg_has_role(current_user, 'pg_write_server_files', 'MEMBER') THEN
		RAISE EXCEPTION 'permission denied to set a file pipeline'
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = 'The relay writes the file as the operating system user of the server.',
				  HINT = 'Only superusers and members of pg_write_server_files may set a file pipeline.';
	END IF;
	IF NOT p_config ? 'path' THEN
		PERFORM tide._relay_bad_config('config key "path" is missing', hint);
	END IF;
	PERFORM tide._relay_check_type('path', p_config -> 'path', 'string', hint);
	IF left(p_config ->> 'path', 1) <> '/' THEN
		PERFORM tide._relay_bad_config(
			format('config key "path" must be an absolute path: "%s"', p_config ->> 'path'), hint);
	END IF;
	IF (p_config ->> 'path') ~ '[[:cntrl:]]' THEN
		PERFORM tide._relay_bad_config('config key "path" must not contain control characters', hint);
	END IF;
	RETURN jsonb_build_object(
		'sink_type', 'file',
		'path', p_config -> 'path',
		'batch_size', tide._relay_int(p_config, 'batch_size', 'batch_size', 1, 1000, 100),
		'fsync', tide._relay_bool(p_config, 'fsync', true),
		'attempt_log', tide._relay_bool(p_config, 'attempt_log', true),
		'alerts', tide._relay_alerts_config(p_config),
		'allow_other_consumers', tide._relay_bool(p_config, 'allow_other_consumers', false))
		|| tide._relay_routing(p_config) || tide._relay_pacing_config(p_config);
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_file_config(jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_file_config(jsonb) TO tide_admin;

-- Whether a header's value is a secret by the header's name alone: the
-- headers that carry credentials (Authorization, Proxy-Authorization,
-- Cookie, Set-Cookie, X-Api-Key, X-Auth-Token, X-Session-Id,
-- X-Hub-Signature, ...), that is any name that contains auth, cookie,
-- token, secret, key, passw (password, passwd), pwd, credential, session,
-- signature or jwt, in any case. The one place of this rule: every output
-- that shows a config redacts through tide._relay_redact, which asks here.
CREATE OR REPLACE FUNCTION tide._relay_secret_header(p_name text)
RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
RETURN pg_catalog.lower(p_name)
	   OPERATOR(pg_catalog.~) '(auth|cookie|token|secret|key|passw|pwd|credential|session|signature|jwt)';
COMMENT ON FUNCTION tide._relay_secret_header(text)
	IS 'internal: whether a header of this name carries a credential, so that its value is redacted';
REVOKE ALL ON FUNCTION tide._relay_secret_header(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_secret_header(text) TO tide_admin;

-- The config with secrets replaced by "********": signing_secret, the
-- values of headers marked {"secret": true}, and the values of headers
-- whose name says they carry a credential (tide._relay_secret_header).
-- References to secrets ({"env": ...}, {"file": ...}) are shown: they are
-- names, not secrets.
CREATE OR REPLACE FUNCTION tide._relay_redact(p_config jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
	SELECT p_config
		|| CASE WHEN p_config ? 'signing_secret' THEN
				jsonb_build_object('signing_secret',
					CASE WHEN jsonb_typeof(p_config -> 'signing_secret') = 'array'
						 THEN (SELECT jsonb_agg(CASE WHEN jsonb_typeof(e) = 'object' THEN e
													 ELSE '"********"' END ORDER BY n)
								 FROM jsonb_array_elements(p_config -> 'signing_secret') WITH ORDINALITY AS a (e, n))
						 WHEN jsonb_typeof(p_config -> 'signing_secret') = 'object'
						 THEN p_config -> 'signing_secret'
						 ELSE '"********"' END)
		   ELSE '{}' END
		|| CASE WHEN jsonb_typeof(p_config -> 'headers') = 'object' THEN
				jsonb_build_object('headers', coalesce((
					SELECT jsonb_object_agg(key,
							CASE WHEN jsonb_typeof(value) = 'object' AND value ? 'value'
									  AND (value -> 'secret' = 'true' OR tide._relay_secret_header(key))
								 THEN value || '{"value": "********"}'
								 WHEN jsonb_typeof(value) = 'object' THEN value
								 WHEN tide._relay_secret_header(key)
								 THEN '"********"' ELSE value END)
					  FROM jsonb_each(p_config -> 'headers')), '{}'))
		   ELSE '{}' END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_redact(jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_redact(jsonb) TO tide_admin;

-- Locks a pipeline's row and returns it, or raises 42704.
CREATE OR REPLACE FUNCTION tide._relay_pipeline(p_name text)
RETURNS tide.relay_outbox_config
LANGUAGE plpgsql
AS $$
DECLARE
	p tide.relay_outbox_config;
BEGIN
	PERFORM tide._check_name('pipeline', p_name);
	SELECT * INTO p FROM tide.relay_outbox_config WHERE name = p_name FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'pipeline "%" does not exist', p_name
			USING ERRCODE = 'undefined_object',
				  HINT = 'Create it with tide.relay_set_outbox(); tide.relay_list_configs() lists the pipelines.';
	END IF;
	RETURN p;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_pipeline(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_pipeline(text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_set_outbox(p_name text, p_outbox text, p_consumer_group text, p_config jsonb)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	cfg jsonb;
	g tide.tide_consumer_groups;
	other text;
BEGIN
	PERFORM tide._check_name('pipeline', p_name);
	PERFORM tide._check_name('consumer group', p_consumer_group);
	PERFORM tide._outbox_config(p_outbox);

	IF p_config IS NULL THEN
		RAISE EXCEPTION 'pipeline config must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give a config such as {"sink_type": "webhook", "url": "https://example.com/hooks"}.';
	END IF;
	IF jsonb_typeof(p_config) <> 'object' THEN
		RAISE EXCEPTION 'pipeline config must be a JSON object, not %', jsonb_typeof(p_config)
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give a config such as {"sink_type": "webhook", "url": "https://example.com/hooks"}.';
	END IF;
	-- outbox and consumer_group are the parameters; the keys are accepted
	-- when they agree, so that relay_get_config's output can be set again.
	IF p_config ? 'outbox' AND p_config -> 'outbox' IS DISTINCT FROM to_jsonb(p_outbox) THEN
		PERFORM tide._relay_bad_config('config key "outbox" does not match p_outbox',
			'The outbox is given by p_outbox; leave "outbox" out of the config or give the same name.');
	END IF;
	IF p_config ? 'consumer_group' AND p_config -> 'consumer_group' IS DISTINCT FROM to_jsonb(p_consumer_group) THEN
		PERFORM tide._relay_bad_config('config key "consumer_group" does not match p_consumer_group',
			'The consumer group is given by p_consumer_group; leave "consumer_group" out of the config or give the same name.');
	END IF;
	cfg := jsonb_build_object('outbox', p_outbox, 'consumer_group', p_consumer_group)
		   || CASE tide._relay_choice(p_config, 'sink_type', ARRAY['webhook', 'file'], NULL)
				  WHEN 'file' THEN tide._relay_file_config(p_config)
				  ELSE tide._relay_webhook_config(p_config)
			  END;

	-- The pipeline reads through its own consumer group, created on first
	-- use. The group's row lock serialises two pipelines naming one group.
	PERFORM tide.create_consumer_group(p_consumer_group, p_outbox, 'earliest', true)
	  FROM (SELECT 1) x
	 WHERE NOT EXISTS (SELECT 1 FROM tide.tide_consumer_groups WHERE group_name = p_consumer_group);
	g := tide._lock_group(p_consumer_group);
	IF g.outbox_name <> p_outbox THEN
		RAISE EXCEPTION 'consumer group "%" reads outbox "%", not "%"', p_consumer_group, g.outbox_name, p_outbox
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = format('Name a consumer group of outbox "%s", or a new one to have it created.', p_outbox);
	END IF;
	SELECT min(name) INTO other FROM tide.relay_outbox_config
	 WHERE config ->> 'consumer_group' = p_consumer_group AND name <> p_name;
	IF other IS NOT NULL THEN
		RAISE EXCEPTION 'consumer group "%" is already used by pipeline "%"', p_consumer_group, other
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'Each pipeline reads through a consumer group of its own; name another one.';
	END IF;

	INSERT INTO tide.relay_outbox_config AS c (name, config)
	VALUES (p_name, cfg)
	ON CONFLICT (name) DO UPDATE SET config = EXCLUDED.config
	 WHERE c.config IS DISTINCT FROM EXCLUDED.config;
	-- A changed config (a fixed URL, say) tries the queued messages at once
	-- (the row's trigger wakes the worker at commit).
	IF FOUND THEN
		UPDATE tide.relay_retry_queue SET next_attempt_at = now()
		 WHERE pipeline_id = p_name AND next_attempt_at > now();
	END IF;
	-- An offset kept for another group or outbox no longer applies.
	DELETE FROM tide.relay_consumer_offsets
	 WHERE pipeline_id = p_name
	   AND (relay_group_id, outbox_name) IS DISTINCT FROM (p_consumer_group, p_outbox);
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.relay_set_outbox(text, text, text, jsonb)
	IS 'creates or replaces a forward pipeline from an outbox, read through a consumer group (created if missing), to a sink';
REVOKE ALL ON FUNCTION tide.relay_set_outbox(text,text,text,jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_set_outbox(text,text,text,jsonb) TO tide_admin;

-- Sets a pipeline's enabled flag; an unchanged flag writes nothing.
CREATE OR REPLACE FUNCTION tide._relay_set_enabled(p_name text, p_enabled boolean)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._relay_pipeline(p_name);
	UPDATE tide.relay_outbox_config SET enabled = p_enabled
	 WHERE name = p_name AND enabled IS DISTINCT FROM p_enabled;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_set_enabled(text,boolean) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_set_enabled(text,boolean) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_enable(p_name text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT tide._relay_set_enabled(p_name, true);
END;
COMMENT ON FUNCTION tide.relay_enable(text) IS 'lets the relay deliver through a pipeline again';
REVOKE ALL ON FUNCTION tide.relay_enable(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_enable(text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_disable(p_name text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT tide._relay_set_enabled(p_name, false);
END;
COMMENT ON FUNCTION tide.relay_disable(text)
	IS 'stops the relay delivering through a pipeline; its position is kept';
REVOKE ALL ON FUNCTION tide.relay_disable(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_disable(text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_delete(p_name text)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	p tide.relay_outbox_config;
BEGIN
	p := tide._relay_pipeline(p_name);
	DELETE FROM tide.relay_outbox_config WHERE name = p_name;
	DELETE FROM tide.relay_consumer_offsets WHERE pipeline_id = p_name;
	DELETE FROM tide.relay_retry_queue WHERE pipeline_id = p_name;
	DELETE FROM tide.relay_pipeline_health WHERE pipeline_id = p_name;
	-- Dead letters are the operator's to look at: kept until purged.
	IF EXISTS (SELECT 1 FROM tide.relay_dlq WHERE pipeline_id = p_name) THEN
		RAISE NOTICE 'the dead letters of pipeline "%" are kept', p_name
			USING HINT = 'tide.relay_dlq_list() shows them; tide.relay_dlq_purge() removes them.';
	END IF;
	-- The group is the pipeline's position: kept, so that a pipeline set
	-- again with it resumes; but it holds back the outbox's pending count.
	IF EXISTS (SELECT 1 FROM tide.tide_consumer_groups WHERE group_name = p.config ->> 'consumer_group') THEN
		RAISE NOTICE 'consumer group "%" of pipeline "%" is kept', p.config ->> 'consumer_group', p_name
			USING HINT = 'Drop it with tide.drop_consumer_group() unless a pipeline or consumer will read through it again: its unread messages count as pending.';
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.relay_delete(text)
	IS 'deletes a forward pipeline and its retry queue; its consumer group and dead letters are kept';
REVOKE ALL ON FUNCTION tide.relay_delete(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_delete(text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_get_config(p_name text)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	cfg jsonb;
BEGIN
	PERFORM tide._check_name('pipeline', p_name);
	SELECT config INTO cfg FROM tide.relay_outbox_config WHERE name = p_name;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'pipeline "%" does not exist', p_name
			USING ERRCODE = 'undefined_object',
				  HINT = 'Create it with tide.relay_set_outbox(); tide.relay_list_configs() lists the pipelines.';
	END IF;
	RETURN tide._relay_redact(cfg);
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.relay_get_config(text)
	IS 'a pipeline''s effective config, defaults filled in, secrets shown as ********';
REVOKE ALL ON FUNCTION tide.relay_get_config(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_get_config(text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_list_configs()
RETURNS TABLE (pipeline text, enabled boolean, outbox text, consumer_group text, sink_type text, config jsonb)
LANGUAGE sql STABLE
AS $$
	SELECT c.name, c.enabled, c.config ->> 'outbox', c.config ->> 'consumer_group',
		   c.config ->> 'sink_type', tide._relay_redact(c.config)
	  FROM tide.relay_outbox_config c
	 ORDER BY c.name
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.relay_list_configs()
	IS 'every forward pipeline with its outbox, consumer group, sink type and config, secrets shown as ********';
REVOKE ALL ON FUNCTION tide.relay_list_configs() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_list_configs() TO tide_admin;
