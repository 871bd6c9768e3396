/*
 * config.c
 *		The postgres endpoint's keys of a pipeline config (another pg_tide
 *		database, reached over libpq): the connection keys its sink and its
 *		source share, and the sink's own (inbox, event_id_header); see
 *		docs/sinks/postgres.md.
 *
 * "connection" is a libpq connection string (key=value or a postgresql://
 * URI) of one host without a password: a password goes in "password",
 * inline or as a secret reference, which every output redacts (connection
 * strings are not). The TLS files are keys of their own, under the rule of
 * relay/config_files.c (the relay reads them as the server's user), and
 * the libpq keywords that would make the relay read any other server file
 * (passfile, service) are refused.
 *
 * The worker is a superuser and connects as the server's operating system
 * user: a connection that needs no password (trust, peer over the local
 * socket, a password file) would let any pipeline owner act as whoever
 * the server can be. So, as dblink and postgres_fdw do, a role that is not
 * a superuser must give a password, and client.c refuses a connection for
 * which the remote server did not ask for it. No network rule applies to
 * the host beyond the limits of every broker (config_limits.c): databases
 * live on private networks, and reaching one takes its credentials.
 */
#include "postgres.h"

#include "catalog/pg_authid.h"

#include "config_value.h"
#include "remote.h"

/* The libpq keywords "connection" may set; the others are refused. */
static const char *const allowed_keywords[] = {
	"host", "port", "dbname", "user", "application_name", "options",
	"keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
	"tcp_user_timeout", "target_session_attrs", "channel_binding", "gssencmode", "sslsni",
	NULL
};

/* The keywords that are config keys of their own. */
static const char *const own_key_keywords[] = {
	"sslmode", "sslrootcert", "sslcert", "sslkey", NULL
};

static const char *const sslmodes[] = {
	"disable", "allow", "prefer", "require", "verify-ca", "verify-full", NULL
};

/* The keys every output of a sink's or a source's config redacts. */
const char *const RemoteSecretKeys[] = {"password", NULL};

const char *const RemoteSourceConfigKeys[] = {
	"outbox", "consumer_group", REMOTE_CONNECTION_KEYS, NULL
};

const char *const RemoteSinkConfigKeys[] = {
	"inbox", "event_id_header", REMOTE_CONNECTION_KEYS, "batch_size", "retry", NULL
};

#define CONNECTION_HINT "Give \"connection\" as a libpq connection string of one host without a password, " \
	"such as \"host=db2.internal port=5432 dbname=app user=relay\", and the password in \"password\"."

/* Whether name is in the NULL-ended list. */
static bool
listed(const char *const *list, const char *name)
{
	for (; *list; list++)
		if (strcmp(*list, name) == 0)
			return true;
	return false;
}

/* Checks one keyword of "connection" that has a value. */
static void
check_keyword(const PQconninfoOption *o)
{
	if (strcmp(o->keyword, "password") == 0)
		RelayConfigError("Give the password in \"password\", as a string or as {\"env\": \"PG_TIDE_<NAME>\"}: "
						 "the config shows it as ********, a connection string is shown as it is.",
						 "config key \"connection\" must not contain a password");
	if (listed(own_key_keywords, o->keyword))
		RelayConfigError(psprintf("Give \"%s\" as a config key of its own.", o->keyword),
						 "config key \"connection\" must not set \"%s\"", o->keyword);
	if (strcmp(o->keyword, "connect_timeout") == 0)
		RelayConfigError("Give \"connect_timeout_ms\" as a config key of its own.",
						 "config key \"connection\" must not set \"connect_timeout\"");
	if (!listed(allowed_keywords, o->keyword))
		RelayConfigError("A connection string may set host, port, dbname, user, application_name, options, "
						 "keepalives, keepalives_idle, keepalives_interval, keepalives_count, tcp_user_timeout, "
						 "target_session_attrs, channel_binding, gssencmode and sslsni.",
						 "config key \"connection\" must not set \"%s\"", o->keyword);
	if (strcmp(o->keyword, "host") == 0)
	{
		if (strchr(o->val, ',') != NULL)
			RelayConfigError(CONNECTION_HINT, "config key \"connection\" must name one host");
		/* a socket directory is no network name */
		if (o->val[0] != '/' && o->val[0] != '@')
			RelayConfigCheckHost("connection", o->val, strlen(o->val), CONNECTION_HINT);
	}
	if (strcmp(o->keyword, "port") == 0)
		RelayConfigCheckPort("connection", o->val, strlen(o->val), CONNECTION_HINT);
}

void
RemoteValidateConnection(const cJSON *config, cJSON *out)
{
	const cJSON *conn = RelayConfigRequiredString(config, "connection", CONNECTION_HINT);
	const cJSON *password = cJSON_GetObjectItemCaseSensitive(config, "password");
	const char *file_hint = "Give the TLS files as absolute file names, a client certificate "
		"(\"sslcert\") with its key (\"sslkey\").";
	PQconninfoOption *opts;
	char	   *parse_error = NULL;

	if (RelayConfigMatches(conn->valuestring, "[[:cntrl:]]"))
		RelayConfigError(CONNECTION_HINT, "config key \"connection\" must not contain control characters");
	opts = PQconninfoParse(conn->valuestring, &parse_error);
	if (opts == NULL)
	{
		char	   *why = pstrdup(parse_error ? parse_error : "out of memory");

		if (parse_error)
			PQfreemem(parse_error);
		/* libpq's message ends with a line break */
		why[strcspn(why, "\n")] = '\0';
		RelayConfigError(CONNECTION_HINT, "config key \"connection\" is not a valid connection string: %s", why);
	}
	PG_TRY();
	{
		for (PQconninfoOption *o = opts; o->keyword; o++)
			if (o->val != NULL)
				check_keyword(o);
	}
	PG_FINALLY();
	{
		PQconninfoFree(opts);
	}
	PG_END_TRY();
	RelayConfigAddCopy(out, "connection", conn);

	if (password != NULL)
	{
		RelayConfigCheckCredential("password", password);
		RelayConfigAddCopy(out, "password", password);
	}
	else if (!RelayConfigRoleHas(BOOTSTRAP_SUPERUSERID))
		RelayConfigError("Give \"password\", inline or as {\"env\": \"PG_TIDE_<NAME>\"}: the relay connects as "
						 "the server's superuser, so only a superuser may set a connection that needs no password.",
						 "config key \"password\" is missing");

	RelayConfigAddString(out, "sslmode", RelayConfigChoice(config, "sslmode", sslmodes, "prefer"));
	for (const char *const *k = own_key_keywords + 1; *k; k++)
	{
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(config, *k);

		if (v == NULL)
			continue;
		RelayConfigCheckFile(*k, v, file_hint);
		RelayConfigAddCopy(out, *k, v);
	}
	if (cJSON_HasObjectItem(config, "sslcert") != cJSON_HasObjectItem(config, "sslkey"))
		RelayConfigError("A client certificate needs its key: give both \"sslcert\" and \"sslkey\", or neither.",
						 "config key \"%s\" is missing",
						 cJSON_HasObjectItem(config, "sslcert") ? "sslkey" : "sslcert");
	RelayConfigAddInt(out, "connect_timeout_ms",
					  RelayConfigInt(config, "connect_timeout_ms", "connect_timeout_ms", 100, 600000, 10000));
	RelayConfigAddInt(out, "statement_timeout_ms",
					  RelayConfigInt(config, "statement_timeout_ms", "statement_timeout_ms", 100, 3600000, 30000));
}

void
RemoteSinkValidate(const cJSON *config, cJSON *out)
{
	const char *inbox_hint = "Give \"inbox\", the name of an inbox of the remote database.";
	const char *header_hint = "Give \"event_id_header\" as the name of a header whose value is the event id, "
		"or leave it out to use the message's identity outbox_<outbox>:<id>.";
	const cJSON *inbox = RelayConfigRequiredString(config, "inbox", inbox_hint);

	if (!RelayConfigMatches(inbox->valuestring, "^[A-Za-z0-9_.:-]{1,63}$"))
		RelayConfigError("Inbox names have 1 to 63 bytes of ASCII letters, digits, \"_\", \"-\", \".\" and \":\".",
						 "config key \"inbox\" is not an inbox name: \"%s\"", inbox->valuestring);
	RelayConfigAddCopy(out, "inbox", inbox);
	RelayConfigAddHeaderName(config, out, "event_id_header", header_hint);
	RemoteValidateConnection(config, out);
}

/* A name of the remote's (an outbox, a consumer group) under `key`. */
static void
check_remote_name(const cJSON *config, cJSON *out, const char *key, const char *hint)
{
	const cJSON *v = RelayConfigRequiredString(config, key, hint);

	if (!RelayConfigMatches(v->valuestring, "^[A-Za-z0-9_.:-]{1,63}$"))
		RelayConfigError("Names have 1 to 63 bytes of ASCII letters, digits, \"_\", \"-\", \".\" and \":\".",
						 "config key \"%s\" is not a name: \"%s\"", key, v->valuestring);
	RelayConfigAddCopy(out, key, v);
}

void
RemoteSourceValidate(const cJSON *config, cJSON *out)
{
	check_remote_name(config, out, "outbox",
					  "Give \"outbox\", the remote outbox whose messages the pipeline reads: the event ids are outbox_<outbox>:<id>.");
	check_remote_name(config, out, "consumer_group",
					  "Give \"consumer_group\", a consumer group of that outbox on the remote database (tide.create_consumer_group() there).");
	RemoteValidateConnection(config, out);
}
