/*
 * config.c
 *		The webhook sink's keys of a pipeline config: url (with the SSRF
 *		check on an address written in it), mode, max_in_flight,
 *		timeout_ms, headers, signing_secret, signature, allow_http and
 *		allow_private_network; see docs/relay.md#webhook-sink.
 *
 * RelayWebhookValidate is the sink's validate callback: pipeline_config.c
 * has checked the keys every pipeline has and refused unknown ones before
 * it is called, and reads batch_size, retry and ordering, which the
 * webhook sink takes, with the rules common to every sink.
 */
#include "postgres.h"

#include "catalog/pg_collation.h"
#include "regex/regex.h"
#include "utils/builtins.h"

#include "address.h"
#include "cloudevents.h"
#include "config_value.h"
#include "webhook.h"
#include "signature.h"

const char *const RelayWebhookConfigKeys[] = {
	"url", "mode", "batch_size", "max_in_flight", "timeout_ms", "headers", "signing_secret",
	"signature", "allow_http", "allow_private_network", "retry", "ordering", "ordering_key",
	RELAY_CE_CONFIG_KEYS, NULL
};

/* The headers pg_tide sets itself, which "headers" may not name. */
static const char *const reserved_headers[] = {
	"webhook-id", "webhook-timestamp", "webhook-signature", "idempotency-key",
	"content-type", "content-length", "host", NULL
};

/* The groups of a URL: scheme, user info, host, port, the rest. */
#define URL_PATTERN "^([A-Za-z][A-Za-z0-9+.-]*)://([^/?#@]*@)?([A-Za-z0-9._~-]+|\\[[0-9A-Fa-f:.]+\\])" \
	"(:[0-9]*)?([/?#][^[:space:]]*)?$"

/* Group n of a match as a string (in the part of a URL before any non-ASCII byte). */
static char *
url_group(const char *url, const regmatch_t *m, int n)
{
	return pnstrdup(url + m[n].rm_so, m[n].rm_eo - m[n].rm_so);
}

/*
 * Validates a webhook URL: http or https, a host, an optional port, no
 * user name or password (they would not be redacted: use headers), no
 * white space; unless allow_private, a host written as an address must be
 * a public one (a name is checked by the relay once resolved).
 */
static void
check_url(const char *url, bool allow_http, bool allow_private)
{
	const char *hint = "Give \"url\" as an absolute URL such as \"https://example.com/hooks\".";
	regmatch_t	m[6];
	char	   *scheme;
	char	   *host;
	RelayHostClass host_class;

	/* Not repeated in the message: a line break would forge a line of the log. */
	if (RelayConfigMatches(url, "[[:space:][:cntrl:]]"))
		RelayConfigError(psprintf("%s Encode a space in a path or query as %%20.", hint),
						 "config key \"url\" must not contain white space or control characters");
	if (!RE_compile_and_execute(cstring_to_text(URL_PATTERN), unconstify(char *, url), strlen(url),
								REG_ADVANCED, DEFAULT_COLLATION_OID, lengthof(m), m))
		RelayConfigError(hint, "config key \"url\" is not a valid URL: \"%s\"", url);

	/*
	 * The matcher counts characters, not bytes; groups 1, 3 and 4 are
	 * ASCII and, once group 2 is known to be absent, all that precedes
	 * them is too, so the counts are byte offsets.
	 */
	scheme = url_group(url, m, 1);
	if (pg_strcasecmp(scheme, "http") != 0 && pg_strcasecmp(scheme, "https") != 0)
		RelayConfigError("Give \"url\" an https:// URL (or http:// with \"allow_http\": true).",
						 "config key \"url\" has scheme \"%s\"", scheme);
	if (m[2].rm_so >= 0)
		RelayConfigError("Send credentials in \"headers\", for example \"Authorization\"; headers are redacted, URLs are not.",
						 "config key \"url\" must not contain a user name or password");
	if (m[4].rm_so >= 0)
	{
		char	   *port = url_group(url, m, 4);
		size_t		digits = strlen(port) - 1;

		if (digits < 1 || digits > 5 || atoi(port + 1) < 1 || atoi(port + 1) > 65535)
			RelayConfigError("Give \"url\" a port from 1 to 65535, or none.",
							 "config key \"url\" has an invalid port: \"%s\"", url);
	}
	if (pg_strcasecmp(scheme, "http") == 0 && !allow_http)
		RelayConfigError("Use an https:// URL, or set \"allow_http\": true to send over plain http.",
						 "config key \"url\" uses plain http");
	host = url_group(url, m, 3);
	RelayConfigCheckHost("url", host, strlen(host), hint);
	host_class = RelayUrlHostClass(host);
	if (host_class == RELAY_HOST_INVALID)
		RelayConfigError("Write an IPv6 address in brackets, for example \"https://[2001:db8::1]/hooks\".",
						 "config key \"url\" has an invalid IPv6 address: \"%s\"", host);
	if (host_class == RELAY_HOST_PRIVATE && !allow_private)
		RelayConfigError("Loopback, private, link-local (cloud metadata), unspecified and multicast "
						 "addresses are refused; set \"allow_private_network\": true to send to one.",
						 "config key \"url\" points to a non-public address: \"%s\"", host);
}

/* qsort comparator of cJSON members by name. */
static int
compare_members(const void *a, const void *b)
{
	return strcmp((*(const cJSON *const *) a)->string, (*(const cJSON *const *) b)->string);
}

/* Whether a header value has a byte a header line cannot carry (tab is fine). */
static bool
has_control_char(const char *s)
{
	for (const unsigned char *p = (const unsigned char *) s; *p; p++)
		if ((*p < 0x20 && *p != '\t') || *p == 0x7f)
			return true;
	return false;
}

/* headers: an object of strings; pg_tide's own headers are refused. */
static void
check_headers(const cJSON *headers)
{
	int			n = cJSON_GetArraySize(headers);
	const cJSON **sorted = palloc(sizeof(cJSON *) * Max(n, 1));
	const cJSON *h;
	int			i = 0;

	RelayConfigCheckType("headers", headers, "object",
						 "Give \"headers\" as an object of header names and string values.");
	cJSON_ArrayForEach(h, headers)
		sorted[i++] = h;
	qsort(sorted, n, sizeof(cJSON *), compare_members);
	for (i = 0; i < n; i++)
	{
		const char *name = sorted[i]->string;
		const cJSON *value = sorted[i];
		int			same = 0;

		if (name[0] == '\0' ||
			strspn(name, "!#$%&'*+.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-")
			!= strlen(name))
			RelayConfigError("Header names in \"headers\" are HTTP tokens: letters, digits and !#$%&'*+-.^_`|~.",
							 "invalid header name \"%s\" in config key \"headers\"", name);
		for (int j = 0; j < n; j++)
			same += pg_strcasecmp(sorted[j]->string, name) == 0;
		if (same > 1)
			RelayConfigError(psprintf("Header names are compared without regard to case; give \"%s\" once.", name),
							 "header \"%s\" is given twice in config key \"headers\"", name);
		for (const char *const *r = reserved_headers; *r; r++)
			if (pg_strcasecmp(name, *r) == 0)
				RelayConfigError(psprintf("Remove \"%s\" from \"headers\"; pg_tide sets webhook-id, "
										  "webhook-timestamp, webhook-signature, idempotency-key, "
										  "content-type, content-length, host itself.", name),
								 "header \"%s\" in config key \"headers\" is set by pg_tide", name);
		/* A value marked secret is redacted; a reference is read by the relay. */
		if (cJSON_IsObject(value) && !cJSON_HasObjectItem(value, "value"))
		{
			RelayConfigCheckSecretRef(psprintf("headers.%s", name), value);
			continue;
		}
		if (cJSON_IsObject(value))
		{
			static const char *const keys[] = {"value", "secret", NULL};
			const cJSON *secret = cJSON_GetObjectItemCaseSensitive(value, "secret");

			RelayConfigCheckKeys(value, keys, NULL, psprintf("headers.%s.", name));
			if (secret != NULL)
				RelayConfigCheckType(psprintf("headers.%s.secret", name), secret, "boolean",
									 "Give \"secret\" as true or false.");
			value = cJSON_GetObjectItemCaseSensitive(value, "value");
		}
		if (!cJSON_IsString(value) || has_control_char(value->valuestring))
			RelayConfigError("Give each header in \"headers\" a string value without line breaks or control characters.",
							 "header \"%s\" in config key \"headers\" must have a string value", name);
	}
}

/*
 * One signing secret: "whsec_" and base64 of at least one byte (decoded as
 * the relay decodes it to sign), or a reference (the relay checks the form
 * of what it refers to).
 */
static void
check_secret(const cJSON *secret)
{
	const char *hint = "Give \"signing_secret\" as \"whsec_<base64>\" or {\"env\": ...} / {\"file\": ...}, "
		"or an array of such to rotate secrets.";
	const char *base64;
	unsigned char *bytes;

	if (cJSON_IsObject(secret))
	{
		RelayConfigCheckSecretRef("signing_secret", secret);
		return;
	}
	RelayConfigCheckType("signing_secret", secret, "string", hint);
	if (strncmp(secret->valuestring, "whsec_", 6) != 0)
		RelayConfigError(hint, "config key \"signing_secret\" must start with \"whsec_\"");
	base64 = secret->valuestring + 6;
	bytes = palloc(RelayBase64DecLen(strlen(base64)) + 1);
	/* The secret itself is not repeated in the message. */
	if (RelayBase64Decode(base64, strlen(base64), bytes, RelayBase64DecLen(strlen(base64)) + 1) <= 0)
		RelayConfigError(hint, "config key \"signing_secret\" is not valid base64 after \"whsec_\"");
}

void
RelayWebhookValidate(const cJSON *config, cJSON *out)
{
	static const char *const modes[] = {"single", "batch", NULL};
	static const char *const signatures[] = {"standard", "pg-tide", NULL};
	bool		allow_http = RelayConfigBool(config, "allow_http", false);
	bool		allow_private = RelayConfigBool(config, "allow_private_network", false);
	const cJSON *url = cJSON_GetObjectItemCaseSensitive(config, "url");
	const cJSON *headers = cJSON_GetObjectItemCaseSensitive(config, "headers");
	const cJSON *secret = cJSON_GetObjectItemCaseSensitive(config, "signing_secret");

	if (url == NULL)
		RelayConfigError("Give \"url\", the https:// URL the webhook is sent to.",
						 "config key \"url\" is missing");
	RelayConfigCheckType("url", url, "string", "Give \"url\" as a string such as \"https://example.com/hooks\".");
	check_url(url->valuestring, allow_http, allow_private);
	RelayConfigAddCopy(out, "url", url);
	RelayConfigAddString(out, "mode", RelayConfigChoice(config, "mode", modes, "single"));
	RelayConfigAddInt(out, "max_in_flight", RelayConfigInt(config, "max_in_flight", "max_in_flight", 1, 1000, 16));
	RelayConfigAddInt(out, "timeout_ms", RelayConfigInt(config, "timeout_ms", "timeout_ms", 100, 600000, 10000));
	RelayConfigAddString(out, "signature", RelayConfigChoice(config, "signature", signatures, "standard"));
	RelayConfigAddBool(out, "allow_http", allow_http);
	RelayConfigAddBool(out, "allow_private_network", allow_private);
	RelayConfigCheckCloudEvents(config, out, NULL);
	if (RelayConfigStringIs(RelayConfigMember(out, "cloudevents"), "mode", "binary") &&
		RelayConfigStringIs(out, "mode", "batch"))
		RelayConfigError("Binary mode sends one event per request: use \"mode\": \"single\", or "
						 "\"cloudevents\": {\"mode\": \"structured\"} for batches.",
						 "config key \"cloudevents.mode\" cannot be \"binary\" with \"mode\": \"batch\"");
	/* in binary mode the ce- headers are the event's attributes */
	if (RelayConfigStringIs(RelayConfigMember(out, "cloudevents"), "mode", "binary") && headers != NULL)
	{
		const cJSON *h;

		cJSON_ArrayForEach(h, headers)
			if (pg_strncasecmp(h->string, "ce-", 3) == 0)
				RelayConfigError(psprintf("Remove \"%s\" from \"headers\"; in binary mode pg_tide sets the ce- headers "
										  "from the message.", h->string),
								 "header \"%s\" in config key \"headers\" is set by pg_tide in binary mode", h->string);
	}

	if (headers != NULL)
	{
		check_headers(headers);
		RelayConfigAddCopy(out, "headers", headers);
	}
	else
		RelayConfigAddObject(out, "headers");

	/* signing_secret: one secret, or several while rotating (all sign). */
	if (secret != NULL)
	{
		if (cJSON_IsArray(secret))
		{
			const cJSON *e;

			if (cJSON_GetArraySize(secret) == 0)
				RelayConfigError("Give \"signing_secret\" at least one \"whsec_<base64>\" string, or leave it out to send unsigned.",
								 "config key \"signing_secret\" must not be an empty array");
			cJSON_ArrayForEach(e, secret)
				check_secret(e);
		}
		else
			check_secret(secret);
		RelayConfigAddCopy(out, "signing_secret", secret);
	}
}
