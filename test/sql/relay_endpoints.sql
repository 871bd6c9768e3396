-- The secrets of a config, redacted from the keys its sink type declares
-- (relay/endpoints/redact.c).
-- A webhook: the signing secret (each element of an array, references
-- shown), the headers whose name says they carry a credential or that are
-- marked secret; numbers keep their text.
SELECT tide._relay_redact('{"sink_type": "webhook", "url": "https://a.example", "timeout_ms": 1.50,
	"signing_secret": ["whsec_a", {"env": "PG_TIDE_SECRET"}],
	"headers": {"Authorization": "Bearer t", "X-Tenant": "acme", "X-Plain": {"value": "v", "secret": true},
				"X-Api-Key": {"env": "PG_TIDE_KEY"}}}');
-- A broker: the members of "auth" whose name says so.
SELECT tide._relay_redact('{"sink_type": "redis", "url": "redis://127.0.0.1:6379", "stream": "s",
	"auth": {"username": "relay", "password": "hunter2"}}');
-- A type this server does not have, or no type at all: every rule, and
-- every string at any depth whose member name says it is a credential.
SELECT tide._relay_redact('{"sink_type": "sqs", "signing_secret": "s", "headers": {"Cookie": "c"},
	"auth": {"user": "u", "password": "p"}, "api_token": "t", "tls": {"key_file": "/k"},
	"brokers": [{"host": "h", "sasl_password": "p"}], "count": 1.50}');
SELECT tide._relay_redact('{"client_secret": "s", "region": "eu"}');
SELECT tide._relay_redact('{"sink_type": "../../tmp/evil", "password": "p"}');
