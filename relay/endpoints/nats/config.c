/*
 * config.c
 *		The NATS JetStream sink's keys of a pipeline config: servers,
 *		subject, stream, max_in_flight, timeout_ms, auth, tls and body; see
 *		docs/sinks/nats.md.
 *
 * RelayNatsValidate is the sink's validate callback (pipeline_config.c has
 * checked the keys every pipeline has, refused unknown ones and reads
 * batch_size, retry and ordering, which this sink takes). It is the only
 * validator of these keys: nats.c reads the normalised config it builds,
 * in which "servers" is always an array and "tls" always an object or
 * false.
 */
#include "postgres.h"

#include "broker.h"
#include "cloudevents.h"
#include "config_value.h"
#include "nats_sink.h"

const char *const RelayNatsConfigKeys[] = {
	"servers", "subject", "stream", "max_in_flight", "timeout_ms", "auth", "tls", "body",
	"batch_size", "retry", "ordering", "ordering_key",
	RELAY_CE_CONFIG_KEYS, NULL
};

/*
 * The longest subject: a publish's control line (subject, reply subject
 * and sizes) must fit in the server's max_control_line, 4,096 bytes by
 * default.
 */
#define NATS_SUBJECT_MAX_BYTES 1024

/* One server URL: nats:// or tls://, a host, an optional port, nothing else. */
static void
check_server(const cJSON *v)
{
	const char *hint = "Give \"servers\" as \"nats://host:4222\" or a list of such URLs (tls:// for TLS); "
		"put credentials in \"auth\".";
	const char *host;
	size_t		len;

	RelayConfigCheckType("servers", v, "string", hint);
	if (RelayConfigMatches(v->valuestring, "[[:space:][:cntrl:]]"))
		RelayConfigError(hint, "config key \"servers\" must not contain white space or control characters");
	if (strchr(v->valuestring, '@') != NULL)
		RelayConfigError(hint, "config key \"servers\" must not contain a user name, password or token");
	if (!RelayConfigMatches(v->valuestring,
							"^(nats|tls)://([A-Za-z0-9._-]+|\\[[0-9A-Fa-f:.]+\\])(:[0-9]{1,5})?$"))
		RelayConfigError(hint, "config key \"servers\" has an invalid server URL: \"%s\"", v->valuestring);
	host = strstr(v->valuestring, "://") + 3;
	len = host[0] == '[' ? strcspn(host, "]") + 1 : strcspn(host, ":");
	RelayConfigCheckHost("servers", host, len, hint);
	/* nats.c's client parses the port into 16 bits: 84387 would be 18851 */
	if (host[len] == ':')
		RelayConfigCheckPort("servers", host + len + 1, strlen(host + len + 1), hint);
}

/*
 * subject: a template whose fixed part is a valid NATS subject (tokens
 * separated by ".", no wildcard, no white space); what a placeholder
 * brings is checked once expanded (nats.c).
 */
static void
check_subject(const cJSON *v)
{
	const char *hint = "Give \"subject\" as a NATS subject such as \"orders.created\", or a template "
		"such as \"orders.{type}\" whose placeholders name message headers.";
	const char *s;

	if (v == NULL)
		RelayConfigError(hint, "config key \"subject\" is missing");
	RelayConfigCheckTemplate("subject", v, hint);
	s = v->valuestring;
	if (strlen(s) > NATS_SUBJECT_MAX_BYTES)
		RelayConfigError(hint, "config key \"subject\" is longer than %d bytes", NATS_SUBJECT_MAX_BYTES);
	if (RelayConfigMatches(s, "[[:space:]*>]"))
		RelayConfigError(hint, "config key \"subject\" must not contain white space or the wildcards \"*\" and \">\": \"%s\"", s);
	if (s[0] == '.' || s[strlen(s) - 1] == '.' || strstr(s, "..") != NULL)
		RelayConfigError(hint, "config key \"subject\" has an empty token: \"%s\"", s);
}

/*
 * An absolute file name (a credentials file, a certificate or key) that
 * the role setting the pipeline may have the relay read (config_files.c).
 */
static void
check_path(const char *key, const cJSON *v)
{
	RelayConfigCheckFile(key, v,
						 psprintf("Give \"%s\" as the absolute name of a file the server can read.", key));
}

/* auth: {"username", "password"}, {"token"} or {"credentials_file"}. */
static void
check_auth(const cJSON *auth)
{
	static const char *const keys[] = {"username", "password", "token", "credentials_file", NULL};
	const char *hint = "Give \"auth\" as {\"username\": ..., \"password\": ...}, {\"token\": ...} or "
		"{\"credentials_file\": \"/absolute/path.creds\"}.";
	const cJSON *user = cJSON_GetObjectItemCaseSensitive(auth, "username");
	const cJSON *password = cJSON_GetObjectItemCaseSensitive(auth, "password");
	const cJSON *token = cJSON_GetObjectItemCaseSensitive(auth, "token");
	const cJSON *creds = cJSON_GetObjectItemCaseSensitive(auth, "credentials_file");

	RelayConfigCheckType("auth", auth, "object", hint);
	RelayConfigCheckKeys(auth, keys, NULL, "auth.");
	if ((user != NULL || password != NULL) + (token != NULL) + (creds != NULL) != 1)
		RelayConfigError(hint, "config key \"auth\" must hold exactly one of a username and password, a token or a credentials file");
	if (user != NULL || password != NULL)
	{
		if (user == NULL || password == NULL)
			RelayConfigError(hint, "config key \"auth\" needs both \"username\" and \"password\"");
		RelayConfigCheckType("auth.username", user, "string", hint);
		if (user->valuestring[0] == '\0' || RelayConfigMatches(user->valuestring, "[[:cntrl:]]"))
			RelayConfigError(hint, "config key \"auth.username\" must be a non-empty string without control characters");
		RelayConfigCheckCredential("auth.password", password);
	}
	if (token != NULL)
		RelayConfigCheckCredential("auth.token", token);
	if (creds != NULL)
		check_path("auth.credentials_file", creds);
}

/*
 * tls: true, false, or {"ca_file", "cert_file", "key_file", "verify"};
 * normalised to false or an object with "verify" filled in.
 */
static void
add_tls(cJSON *out, const cJSON *tls, bool tls_url)
{
	static const char *const keys[] = {"ca_file", "cert_file", "key_file", "verify", NULL};
	const char *hint = "Give \"tls\" as true, or as {\"ca_file\": ..., \"cert_file\": ..., \"key_file\": ..., \"verify\": true}.";
	cJSON	   *o;
	const cJSON *cert;
	const cJSON *key;

	if (tls == NULL || cJSON_IsBool(tls))
	{
		if (tls != NULL && cJSON_IsFalse(tls) && tls_url)
			RelayConfigError("Leave \"tls\" out, or give the servers as nats:// URLs.",
							 "config key \"tls\" is false but \"servers\" has a tls:// URL");
		if ((tls == NULL || cJSON_IsFalse(tls)) && !tls_url)
		{
			RelayConfigAddBool(out, "tls", false);
			return;
		}
		o = RelayConfigAddObject(out, "tls");
		RelayConfigAddBool(o, "verify", true);
		return;
	}
	RelayConfigCheckType("tls", tls, "object", hint);
	RelayConfigCheckKeys(tls, keys, NULL, "tls.");
	cert = cJSON_GetObjectItemCaseSensitive(tls, "cert_file");
	key = cJSON_GetObjectItemCaseSensitive(tls, "key_file");
	if ((cert == NULL) != (key == NULL))
		RelayConfigError(hint, "config key \"tls\" needs both \"cert_file\" and \"key_file\", or neither");
	o = RelayConfigAddObject(out, "tls");
	for (int i = 0; i < 3; i++)
	{
		const cJSON *f = cJSON_GetObjectItemCaseSensitive(tls, keys[i]);

		if (f == NULL)
			continue;
		check_path(psprintf("tls.%s", keys[i]), f);
		RelayConfigAddCopy(o, keys[i], f);
	}
	RelayConfigAddBool(o, "verify", RelayConfigBool(tls, "verify", true));
}

void
RelayNatsValidate(const cJSON *config, cJSON *out)
{
	static const char *const bodies[] = {"payload", "envelope", NULL};
	const cJSON *servers = cJSON_GetObjectItemCaseSensitive(config, "servers");
	const cJSON *stream = cJSON_GetObjectItemCaseSensitive(config, "stream");
	const cJSON *auth = cJSON_GetObjectItemCaseSensitive(config, "auth");
	cJSON	   *list;
	const cJSON *s;
	bool		tls_url = false;

	if (servers == NULL)
		RelayConfigError("Give \"servers\", such as \"nats://127.0.0.1:4222\" or a list of such URLs.",
						 "config key \"servers\" is missing");
	if (cJSON_IsArray(servers))
	{
		if (cJSON_GetArraySize(servers) == 0)
			RelayConfigError("Give \"servers\" at least one URL such as \"nats://127.0.0.1:4222\".",
							 "config key \"servers\" must not be an empty array");
		cJSON_ArrayForEach(s, servers)
			check_server(s);
		RelayConfigAddCopy(out, "servers", servers);
	}
	else
	{
		check_server(servers);
		list = cJSON_AddArrayToObject(out, "servers");
		cJSON_AddItemToArray(list, cJSON_CreateString(servers->valuestring));
	}
	cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(out, "servers"))
		tls_url |= strncmp(s->valuestring, "tls://", 6) == 0;

	check_subject(cJSON_GetObjectItemCaseSensitive(config, "subject"));
	RelayConfigAddCopy(out, "subject", cJSON_GetObjectItemCaseSensitive(config, "subject"));
	if (stream != NULL)
	{
		const char *hint = "Give \"stream\" as the name of the JetStream stream the subject belongs to, or leave it out.";

		RelayConfigCheckType("stream", stream, "string", hint);
		if (stream->valuestring[0] == '\0' ||
			RelayConfigMatches(stream->valuestring, "[[:space:][:cntrl:]*>./\\\\]"))
			RelayConfigError(hint, "config key \"stream\" is not a valid stream name: \"%s\"", stream->valuestring);
		RelayConfigAddCopy(out, "stream", stream);
	}
	RelayConfigAddInt(out, "max_in_flight",
					  RelayConfigInt(config, "max_in_flight", "max_in_flight", 1, 10000, 100));
	RelayConfigAddInt(out, "timeout_ms",
					  RelayConfigInt(config, "timeout_ms", "timeout_ms", 100, 600000, 10000));
	if (auth != NULL)
	{
		check_auth(auth);
		RelayConfigAddCopy(out, "auth", auth);
	}
	add_tls(out, cJSON_GetObjectItemCaseSensitive(config, "tls"), tls_url);
	RelayConfigAddString(out, "body", RelayConfigChoice(config, "body", bodies, "payload"));
	RelayConfigCheckCloudEvents(config, out, NULL);
}
