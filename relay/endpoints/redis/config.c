/*
 * config.c
 *		The Redis Streams sink's keys of a pipeline config: url, stream,
 *		maxlen, max_in_flight, timeout_ms, auth, tls and body; see
 *		docs/sinks/redis.md.
 *
 * RedisValidate is the sink's validate callback: pipeline_config.c has
 * checked the keys every pipeline has and refused unknown ones, and reads
 * batch_size, retry and ordering, which this sink takes, with the rules
 * common to every sink. A password is never part of "url" (URLs are not
 * redacted): it goes in "auth", whose secret members every output
 * redacts.
 */
#include "postgres.h"

#include <hiredis/hiredis.h>

#include "broker.h"
#include "cloudevents.h"
#include "config_value.h"
#include "redis.h"

/* The longest stream key (template) a pipeline may name. */
#define REDIS_STREAM_MAX_BYTES 1024

const char *const RedisConfigKeys[] = {
	"url", "stream", "maxlen", "max_in_flight", "timeout_ms", "auth", "tls", "body",
	"batch_size", "retry", "ordering", "ordering_key",
	RELAY_CE_CONFIG_KEYS, NULL
};

bool
RedisParseUrl(const char *url, RedisAddress *addr, const char **why)
{
	const char *p = url;
	const char *host;
	size_t		len;

	memset(addr, 0, sizeof(*addr));
	addr->port = REDIS_DEFAULT_PORT;
	if (pg_strncasecmp(p, "rediss://", 9) == 0)
	{
		*why = "rediss:// asks for TLS, which this build of the redis sink does not have";
		return false;
	}
	if (pg_strncasecmp(p, "redis://", 8) != 0)
	{
		*why = "it does not start with redis://";
		return false;
	}
	p += 8;
	len = strcspn(p, "/");
	if (memchr(p, '@', len) != NULL)
	{
		*why = "it must not contain a user name or password";
		return false;
	}
	if (*p == '[')
	{
		host = p + 1;
		len = strspn(host, "0123456789abcdefABCDEF:.");
		if (host[len] != ']' || len == 0)
		{
			*why = "its IPv6 address is not closed by \"]\"";
			return false;
		}
		p = host + len + 1;
	}
	else
	{
		host = p;
		len = strspn(host, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-_");
		p = host + len;
	}
	if (len == 0 || len >= sizeof(addr->host))
	{
		*why = len == 0 ? "it has no host" : "its host is too long";
		return false;
	}
	memcpy(addr->host, host, len);
	addr->host[len] = '\0';
	if (*p == ':')
	{
		char	   *end;
		long		port = strtol(p + 1, &end, 10);

		if (end == p + 1 || end - (p + 1) > 5 || port < 1 || port > 65535)
		{
			*why = "its port is not a number from 1 to 65535";
			return false;
		}
		addr->port = (int) port;
		p = end;
	}
	if (*p == '/' && p[1] != '\0')
	{
		char	   *end;
		long		db;

		errno = 0;
		db = strtol(p + 1, &end, 10);
		if (end == p + 1 || *end != '\0' || errno != 0 || db < 0 || db > PG_INT32_MAX ||
			!isdigit((unsigned char) p[1]))
		{
			*why = "its path is not a database number such as /0";
			return false;
		}
		addr->db = (int) db;
		p = end;
	}
	else if (*p == '/')
		p++;
	if (*p != '\0')
	{
		*why = "it has something after the host, port and database number";
		return false;
	}
	return true;
}

/* auth: {"username", "password"}, each inline or a secret reference. */
static void
check_auth(const cJSON *auth)
{
	static const char *const keys[] = {"username", "password", NULL};
	const cJSON *user;
	const cJSON *password;

	RelayConfigCheckType("auth", auth, "object",
						 "Give \"auth\" as {\"password\": ...} (Redis AUTH) or {\"username\": ..., \"password\": ...} (an ACL user).");
	RelayConfigCheckKeys(auth, keys, NULL, "auth.");
	user = cJSON_GetObjectItemCaseSensitive(auth, "username");
	password = cJSON_GetObjectItemCaseSensitive(auth, "password");
	if (password == NULL)
		RelayConfigError("Give \"auth.password\", inline or as {\"env\": \"PG_TIDE_<NAME>\"}; an ACL user needs one too.",
						 "config key \"auth.password\" is missing");
	RelayConfigCheckCredential("auth.password", password);
	if (user != NULL)
		RelayConfigCheckCredential("auth.username", user);
}

void
RedisValidate(const cJSON *config, cJSON *out)
{
	const char *url_hint = "Give \"url\" as \"redis://<host>[:<port>][/<database number>]\", "
		"for example \"redis://127.0.0.1:6379/0\".";
	const cJSON *url;
	const cJSON *stream = cJSON_GetObjectItemCaseSensitive(config, "stream");
	const cJSON *auth = cJSON_GetObjectItemCaseSensitive(config, "auth");
	RedisAddress addr;
	const char *why;
	int			maxlen;

	if (cJSON_GetObjectItemCaseSensitive(config, "tls") != NULL)
		RelayConfigError(psprintf("This build of pg_tide_redis%s uses hiredis %d.%d without its TLS library "
								  "(hiredis_ssl, hiredis 1.0 and later); leave \"tls\" out and reach Redis "
								  "over a private network or a TLS tunnel such as stunnel.",
								  DLSUFFIX, HIREDIS_MAJOR, HIREDIS_MINOR),
						 "config key \"tls\" is not supported by the redis sink");
	url = RelayConfigRequiredString(config, "url", url_hint);
	if (RelayConfigMatches(url->valuestring, "[[:space:][:cntrl:]]"))
		RelayConfigError(url_hint, "config key \"url\" must not contain white space or control characters");
	if (!RedisParseUrl(url->valuestring, &addr, &why))
	{
		if (strstr(why, "password") != NULL)
			RelayConfigError("Give the password in \"auth\": {\"password\": ...} (and \"username\" for an ACL user); "
							 "auth is redacted, URLs are not.",
							 "config key \"url\" must not contain a user name or password");
		RelayConfigError(url_hint, "config key \"url\" is not a valid Redis URL: %s", why);
	}
	RelayConfigCheckHost("url", addr.host, strlen(addr.host), url_hint);
	RelayConfigAddCopy(out, "url", url);

	if (stream == NULL)
		RelayConfigError("Give \"stream\", the stream's key, such as \"orders\" or \"orders.{type}\" (from a header).",
						 "config key \"stream\" is missing");
	RelayConfigCheckTemplate("stream", stream,
							 "Give \"stream\" as a key such as \"orders\", or a template such as \"orders.{type}\" "
							 "whose placeholders name headers.");
	/* a key is sent with every XADD: a long one costs every message */
	if (strlen(stream->valuestring) > REDIS_STREAM_MAX_BYTES)
		RelayConfigError("Give \"stream\" as a key of at most 1,024 bytes.",
						 "config key \"stream\" is longer than %d bytes", REDIS_STREAM_MAX_BYTES);
	RelayConfigAddCopy(out, "stream", stream);

	maxlen = RelayConfigInt(config, "maxlen", "maxlen", 1, PG_INT32_MAX, 0);
	if (maxlen > 0)
		RelayConfigAddInt(out, "maxlen", maxlen);
	RelayBrokerAddSendSettings(config, out, 100, 100);
	RelayConfigCheckCloudEvents(config, out, "A Redis stream entry has fields, not headers: use \"cloudevents\": {\"mode\": \"structured\"}.");
	if (auth != NULL)
	{
		check_auth(auth);
		RelayConfigAddCopy(out, "auth", auth);
	}
}
