/*
 * client.c
 *		The postgres endpoint's connection to another pg_tide database:
 *		libpq's nonblocking API driven by the relay worker's wait, one
 *		connection per pipeline, kept across batches.
 *
 * 1. A host name is looked up on a thread first (broker.h's
 *	  RelayLookupStart) and the connection made to the address found
 *	  (libpq's hostaddr, the name kept for TLS): libpq would call
 *	  getaddrinfo in the loop, where a slow name server held every
 *	  pipeline of the worker.
 * 2. PQconnectStartParams, then PQconnectPoll each time the socket is
 *	  ready for what the last call asked (reading or writing); the socket
 *	  may change on the way (a retry without TLS), so it is watched anew
 *	  after each call. A connect not done within connect_timeout_ms fails
 *	  with class timeout.
 * 3. Once connected, a server that did not ask for a configured password
 *	  is refused (config.c says why), and the session's statement_timeout
 *	  is set before any query goes.
 *	  The lookup and the connect have connect_timeout_ms each.
 * 4. A query goes with PQsendQueryParams; PQflush sends what is left
 *	  whenever the socket is writable, PQconsumeInput reads whenever it is
 *	  readable, and the answer is taken once PQisBusy says it is whole.
 *
 * 5. A pipeline whose config refers to secrets is closed and opened again
 *	  at each reading of the pipelines (a secret may have changed): its
 *	  idle connection is parked on close and taken again by an open with
 *	  the same parameters (password included), so that a reading costs no
 *	  new connection; one parked for a minute is closed.
 *
 * Nothing here blocks or raises an ERROR: it runs from the loop's event
 * dispatch (events.c) and from the sink's progress, with no transaction
 * open. A failure is noted (class, why, `failed`, which the owner clears
 * once it took it) and the connection dropped; the next batch connects
 * again.
 */
#include "postgres.h"

#include <sys/epoll.h>

#include "lib/stringinfo.h"
#include "utils/timestamp.h"

#include "config_value.h"
#include "remote.h"

/* The most keywords a connection passes: the string's and ours. */
#define REMOTE_MAX_KEYWORDS 40

/* Parked connections: how many at most, and for how long. */
#define REMOTE_PARKED_MAX 16
#define REMOTE_PARKED_MS 60000

/* A connection parked by RemoteClientClose, for an open with the same parameters. */
typedef struct ParkedConnection
{
	PGconn	   *conn;			/* NULL: a free slot */
	char	   *key;			/* malloc'd: the parameters it was made with */
	TimestampTz since;
} ParkedConnection;

static ParkedConnection parked[REMOTE_PARKED_MAX];

static void client_fd_ready(int fd, uint32 events, void *arg);
static void start_connect(RemoteClient *c);

/* Adds a keyword and its value. */
static void
add_keyword(RemoteClient *c, int *n, const char *keyword, const char *value)
{
	if (*n >= REMOTE_MAX_KEYWORDS - 1)
		return;
	c->keywords[*n] = keyword;
	c->values[*n] = value;
	(*n)++;
}

bool
RemoteClientInit(RemoteClient *c, const cJSON *config, char **error)
{
	const char *connstr = cJSON_GetStringValue(RelayConfigMember(config, "connection"));
	PQconninfoOption *opts;
	char	   *password = NULL;
	bool		gssencmode = false;
	int			n = 0;

	memset(c, 0, sizeof(*c));
	c->keywords = palloc0(sizeof(char *) * REMOTE_MAX_KEYWORDS);
	c->values = palloc0(sizeof(char *) * REMOTE_MAX_KEYWORDS);
	c->port = 5432;
	opts = PQconninfoParse(connstr ? connstr : "", NULL);
	if (opts == NULL)
	{
		*error = pstrdup("its \"connection\" is not a valid connection string");
		return false;
	}
	for (PQconninfoOption *o = opts; o->keyword; o++)
	{
		if (o->val == NULL)
			continue;
		add_keyword(c, &n, pstrdup(o->keyword), pstrdup(o->val));
		if (strcmp(o->keyword, "host") == 0 && o->val[0] != '/' && o->val[0] != '@' &&
			!RelayHostIsAddress(o->val))
			strlcpy(c->host, o->val, sizeof(c->host));
		else if (strcmp(o->keyword, "port") == 0)
			c->port = atoi(o->val);
		else if (strcmp(o->keyword, "gssencmode") == 0)
			gssencmode = true;
	}
	PQconninfoFree(opts);
	if (!RelayBrokerCredential(RelayConfigMember(config, "password"), &password, error))
		return false;
	if (password != NULL)
	{
		add_keyword(c, &n, "password", password);
		c->password_given = true;
	}
	add_keyword(c, &n, "sslmode", RelayConfigString(config, "sslmode"));
	add_keyword(c, &n, "sslrootcert", RelayConfigString(config, "sslrootcert"));
	add_keyword(c, &n, "sslcert", RelayConfigString(config, "sslcert"));
	add_keyword(c, &n, "sslkey", RelayConfigString(config, "sslkey"));
	/* Kerberos would ask its servers, blocking, in the loop */
	if (!gssencmode)
		add_keyword(c, &n, "gssencmode", "disable");
	add_keyword(c, &n, "client_encoding", "UTF8");
	add_keyword(c, &n, "fallback_application_name", "pg_tide relay");
	c->hostaddr_slot = n;
	add_keyword(c, &n, "hostaddr", NULL);
	c->keywords[n] = NULL;
	c->connect_timeout_ms = RelayConfigIntOr(config, "connect_timeout_ms", 10000);
	c->statement_timeout_ms = RelayConfigIntOr(config, "statement_timeout_ms", 30000);
	{
		StringInfoData key;

		initStringInfo(&key);
		appendStringInfo(&key, "%d", c->statement_timeout_ms);
		for (int i = 0; c->keywords[i]; i++)
			if (c->values[i] != NULL)
				appendStringInfo(&key, "\x1f%s=%s", c->keywords[i], c->values[i]);
		c->key = key.data;
	}
	return true;
}

/* Closes the parked connections older than REMOTE_PARKED_MS. */
static void
unpark_stale(void)
{
	TimestampTz now = GetCurrentTimestamp();

	for (int i = 0; i < REMOTE_PARKED_MAX; i++)
		if (parked[i].conn != NULL &&
			TimestampDifferenceExceeds(parked[i].since, now, REMOTE_PARKED_MS))
		{
			PQfinish(parked[i].conn);
			free(parked[i].key);
			parked[i].conn = NULL;
			parked[i].key = NULL;
		}
}

/* Parks an idle connection; false when there is no room (it is then closed by the caller). */
static bool
park(RemoteClient *c)
{
	unpark_stale();
	for (int i = 0; i < REMOTE_PARKED_MAX; i++)
		if (parked[i].conn == NULL)
		{
			parked[i].key = strdup(c->key);
			if (parked[i].key == NULL)
				return false;
			parked[i].conn = c->conn;
			parked[i].since = GetCurrentTimestamp();
			return true;
		}
	return false;
}

/*
 * Takes a parked connection made with the client's parameters that is
 * still open and idle; false when there is none.
 */
static bool
unpark(RemoteClient *c)
{
	unpark_stale();
	for (int i = 0; i < REMOTE_PARKED_MAX; i++)
	{
		PGconn	   *conn = parked[i].conn;

		if (conn == NULL || strcmp(parked[i].key, c->key) != 0)
			continue;
		free(parked[i].key);
		parked[i].conn = NULL;
		parked[i].key = NULL;
		/* reads what came meanwhile: the server's end, say */
		if (!PQconsumeInput(conn) || PQstatus(conn) != CONNECTION_OK || PQisBusy(conn) ||
			PQtransactionStatus(conn) != PQTRANS_IDLE)
		{
			PQfinish(conn);
			continue;
		}
		c->conn = conn;
		return true;
	}
	return false;
}

/* Notes a failure for the owner and drops the connection. */
static void
fail(RemoteClient *c, const char *cls, const char *fmt, const char *detail)
{
	char		raw[512];

	/* detail may be libpq's message, which the drop frees */
	snprintf(raw, sizeof(raw), fmt, detail ? detail : "unknown error");
	RemoteClientDrop(c);
	c->failed = true;
	strlcpy(c->fail_class, cls, sizeof(c->fail_class));
	/* libpq's messages end with a line break */
	raw[strcspn(raw, "\n")] = '\0';
	RelayCleanText(c->fail_error, sizeof(c->fail_error), raw, strlen(raw));
	if (c->notify)
		c->notify(c->notify_arg);
}

/* Watches the connection's socket for `events`, anew when it changed. */
static void
watch(RemoteClient *c, uint32 events)
{
	int			fd = PQsocket(c->conn);
	RelayWatch *w;

	if (c->watch != NULL && (c->watched_fd != fd || c->watching != events))
	{
		/* a closed descriptor's number may come back for the new socket */
		RelayEventsUnwatch(c->watch);
		c->watch = NULL;
	}
	if (fd < 0 || c->watch != NULL)
		return;
	w = RelayEventsWatch(NULL, fd, events, client_fd_ready, c);
	/* not watched (out of memory): the deadline ends the wait */
	c->watch = w;
	c->watched_fd = fd;
	c->watching = events;
}

/* The class of a connect that failed, from libpq's message. */
static const char *
connect_failure_class(const char *message)
{
	if (message != NULL &&
		(strstr(message, "authentication") != NULL || strstr(message, "password") != NULL ||
		 strstr(message, "pg_hba.conf") != NULL || strstr(message, "permission denied") != NULL))
		return RELAY_CLASS_AUTH;
	return RELAY_CLASS_CONNECTION;
}

/* The connect is done: checks the password was used, sets the session up. */
static void
connected(RemoteClient *c)
{
	char		timeout[32];
	const char *params[1] = {timeout};

	if (c->password_given && !PQconnectionUsedPassword(c->conn))
	{
		fail(c, RELAY_CLASS_AUTH, "auth: %s",
			 "the remote server did not ask for the configured password; the relay's connections "
			 "must authenticate with it");
		return;
	}
	if (PQsetnonblocking(c->conn, 1) != 0)
	{
		fail(c, RELAY_CLASS_CONNECTION, "connection: %s", PQerrorMessage(c->conn));
		return;
	}
	snprintf(timeout, sizeof(timeout), "%d", c->statement_timeout_ms);
	/* the worker's own search_path and settings mean nothing there */
	if (!PQsendQueryParams(c->conn,
						   "SELECT pg_catalog.set_config('statement_timeout', $1, false), "
						   "pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', false)",
						   1, NULL, params, NULL, NULL, 0))
	{
		fail(c, RELAY_CLASS_CONNECTION, "connection: %s", PQerrorMessage(c->conn));
		return;
	}
	c->state = REMOTE_SETTING_UP;
	c->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), c->connect_timeout_ms);
	watch(c, EPOLLIN | EPOLLOUT);
}

/* Calls PQconnectPoll once, its socket being ready for what it asked. */
static void
poll_connect(RemoteClient *c)
{
	c->polling = PQconnectPoll(c->conn);
	switch (c->polling)
	{
		case PGRES_POLLING_OK:
			connected(c);
			break;
		case PGRES_POLLING_FAILED:
			{
				const char *msg = PQerrorMessage(c->conn);
				char		why[300];

				snprintf(why, sizeof(why), "%s: could not connect to the remote database: %s",
						 connect_failure_class(msg), msg);
				fail(c, connect_failure_class(msg), "%s", why);
				break;
			}
		case PGRES_POLLING_READING:
			watch(c, EPOLLIN);
			break;
		default:
			watch(c, EPOLLOUT);
			break;
	}
}

/*
 * Reads and sends what the socket allows on a set-up connection and takes
 * a whole answer; `events` are epoll's.
 */
static void
exchange(RemoteClient *c, uint32 events)
{
	if ((events & (EPOLLIN | EPOLLERR | EPOLLHUP)) && !PQconsumeInput(c->conn))
	{
		fail(c, RELAY_CLASS_CONNECTION, "connection: the connection to the remote database was lost: %s",
			 PQerrorMessage(c->conn));
		return;
	}
	if (c->state == REMOTE_READY)
	{
		/* nothing was asked: a notice, or the server ending the session */
		if (PQstatus(c->conn) == CONNECTION_BAD)
			fail(c, RELAY_CLASS_CONNECTION, "connection: the remote database ended the connection: %s",
				 PQerrorMessage(c->conn));
		return;
	}
	if (events & EPOLLOUT)
	{
		int			rc = PQflush(c->conn);

		if (rc < 0)
		{
			fail(c, RELAY_CLASS_CONNECTION, "connection: the connection to the remote database was lost: %s",
				 PQerrorMessage(c->conn));
			return;
		}
		watch(c, rc == 0 ? EPOLLIN : EPOLLIN | EPOLLOUT);
	}
	while (!PQisBusy(c->conn))
	{
		PGresult   *res = PQgetResult(c->conn);

		if (res == NULL)
			break;
		/* the last answer counts; only one is expected */
		if (c->result != NULL)
			PQclear(c->result);
		c->result = res;
		/* a COPY or pipeline state never comes: the sink sends neither */
	}
	if (PQisBusy(c->conn) || c->result == NULL)
		return;
	if (c->state == REMOTE_SETTING_UP)
	{
		PGresult   *res = c->result;

		c->result = NULL;
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			char		why[300];

			snprintf(why, sizeof(why), "connection: the remote database refused the session's settings: %s",
					 PQresultErrorMessage(res));
			PQclear(res);
			fail(c, RELAY_CLASS_CONNECTION, "%s", why);
			return;
		}
		PQclear(res);
		c->state = REMOTE_READY;
	}
	else
	{
		c->state = REMOTE_READY;
		c->answered = true;
	}
	watch(c, EPOLLIN);
	if (c->notify)
		c->notify(c->notify_arg);
}

/* events.c: the connection's socket is ready. */
static void
client_fd_ready(int fd, uint32 events, void *arg)
{
	RemoteClient *c = arg;

	if (c->conn == NULL)
		return;
	if (c->state == REMOTE_CONNECTING)
		poll_connect(c);
	else
		exchange(c, events);
	if (c->notify)
		c->notify(c->notify_arg);
}

/* The host name's lookup finished (called in the loop). */
static void
lookup_done(void *arg)
{
	RemoteClient *c = arg;
	char		error[256];
	bool		found = RelayLookupResult(c->lookup, c->address, sizeof(c->address),
										  error, sizeof(error));

	RelayLookupEnd(c->lookup);
	c->lookup = NULL;
	c->state = REMOTE_DOWN;
	if (found)
		start_connect(c);
	else
		fail(c, RELAY_CLASS_CONNECTION, "connection: could not connect to the remote database: %s", error);
}

/* Starts the lookup or the connect. */
static void
start_connect(RemoteClient *c)
{
	char		error[256];

	/* the lookup and the connect have connect_timeout_ms each */
	c->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), c->connect_timeout_ms);
	if (c->host[0] != '\0' && c->address[0] == '\0')
	{
		c->lookup = RelayLookupStart(c->host, c->port, lookup_done, c, error, sizeof(error));
		if (c->lookup == NULL)
			fail(c, RELAY_CLASS_CONNECTION, "connection: could not connect to the remote database: %s", error);
		else
			c->state = REMOTE_LOOKING_UP;
		return;
	}
	c->values[c->hostaddr_slot] = c->address[0] ? c->address : NULL;
	c->conn = PQconnectStartParams(c->keywords, c->values, 0);
	/* each connect looks the name up again */
	c->address[0] = '\0';
	c->values[c->hostaddr_slot] = NULL;
	if (c->conn == NULL)
	{
		fail(c, RELAY_CLASS_CONNECTION, "connection: could not connect to the remote database: %s",
			 "out of memory");
		return;
	}
	if (PQstatus(c->conn) == CONNECTION_BAD)
	{
		fail(c, RELAY_CLASS_CONNECTION, "connection: could not connect to the remote database: %s",
			 PQerrorMessage(c->conn));
		return;
	}
	c->state = REMOTE_CONNECTING;
	watch(c, EPOLLOUT);
}

void
RemoteClientConnect(RemoteClient *c)
{
	if (c->state == REMOTE_DOWN && unpark(c))
	{
		c->state = REMOTE_READY;
		watch(c, EPOLLIN);
	}
	else if (c->state == REMOTE_DOWN)
		start_connect(c);
	else if (c->state == REMOTE_LOOKING_UP)
		c->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), c->connect_timeout_ms);
}

bool
RemoteClientSend(RemoteClient *c, const char *sql, int nparams, const char *const *params, long timeout_ms)
{
	if (c->state != REMOTE_READY)
		return false;
	if (c->result != NULL)
		PQclear(c->result);
	c->result = NULL;
	c->answered = false;
	if (!PQsendQueryParams(c->conn, sql, nparams, NULL, params, NULL, NULL, 0))
	{
		fail(c, RELAY_CLASS_CONNECTION, "connection: the connection to the remote database was lost: %s",
			 PQerrorMessage(c->conn));
		return false;
	}
	c->state = REMOTE_BUSY;
	c->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout_ms);
	watch(c, EPOLLIN | EPOLLOUT);
	return true;
}

void
RemoteClientPump(RemoteClient *c)
{
	TimestampTz now = GetCurrentTimestamp();

	if (c->state == REMOTE_DOWN || c->state == REMOTE_READY || now < c->deadline)
		return;
	if (c->state == REMOTE_BUSY)
		fail(c, RELAY_CLASS_TIMEOUT, "timeout: %s",
			 "the remote database did not answer within statement_timeout_ms");
	else
		fail(c, RELAY_CLASS_TIMEOUT, "timeout: %s",
			 c->state == REMOTE_LOOKING_UP ?
			 "the remote host name was not looked up within connect_timeout_ms" :
			 "no connection to the remote database within connect_timeout_ms");
}

PGresult *
RemoteClientTakeResult(RemoteClient *c)
{
	PGresult   *res;

	if (!c->answered)
		return NULL;
	res = c->result;
	c->result = NULL;
	c->answered = false;
	return res;
}

void
RemoteClientDrop(RemoteClient *c)
{
	RelayEventsUnwatch(c->watch);
	c->watch = NULL;
	c->watching = 0;
	if (c->result != NULL)
		PQclear(c->result);
	c->result = NULL;
	c->answered = false;
	if (c->conn != NULL)
		PQfinish(c->conn);
	c->conn = NULL;
	/* a lookup goes on: its answer serves the next connect */
	if (c->state != REMOTE_LOOKING_UP)
		c->state = REMOTE_DOWN;
}

void
RemoteClientClose(RemoteClient *c)
{
	c->notify = NULL;
	if (c->state == REMOTE_READY && c->result == NULL && park(c))
	{
		RelayEventsUnwatch(c->watch);
		c->watch = NULL;
		c->conn = NULL;
	}
	RemoteClientDrop(c);
	RelayLookupEnd(c->lookup);
	c->lookup = NULL;
	c->state = REMOTE_DOWN;
}

/* Whether an SQLSTATE is in the list. */
static bool
state_in(const char *sqlstate, const char *const *list)
{
	for (; *list; list++)
		if (strncmp(sqlstate, *list, strlen(*list)) == 0)
			return true;
	return false;
}

RelayOutcome
RemoteClassifyError(const PGresult *res, char *error_class, size_t class_size, char *error, size_t error_size)
{
	/* the server cannot take anything now, whatever the message */
	static const char *const down[] = {"08", "57P", "53300", "25006", NULL};
	static const char *const auth[] = {"28", "42501", NULL};
	/* no such inbox, no pg_tide there (or one too old) */
	static const char *const missing[] = {"42704", "42883", "3F000", "55000", NULL};
	static const char *const refused[] = {"22", "23", NULL};
	const char *sqlstate = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	const char *message = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
	const char *cls;
	RelayOutcome outcome;
	char		raw[512];

	if (sqlstate == NULL || state_in(sqlstate, down))
		cls = RELAY_CLASS_CONNECTION, outcome = RELAY_UNREACHABLE;
	else if (state_in(sqlstate, auth))
		cls = RELAY_CLASS_AUTH, outcome = RELAY_UNREACHABLE;
	else if (state_in(sqlstate, missing))
		cls = RELAY_CLASS_UNKNOWN_DESTINATION, outcome = RELAY_UNREACHABLE;
	else if (strcmp(sqlstate, "57014") == 0)
		cls = RELAY_CLASS_TIMEOUT, outcome = RELAY_RETRYABLE;
	else if (strcmp(sqlstate, "54000") == 0)
		cls = RELAY_CLASS_TOO_LARGE, outcome = RELAY_PERMANENT;
	else if (state_in(sqlstate, refused))
		cls = RELAY_CLASS_REFUSED, outcome = RELAY_PERMANENT;
	else
		cls = RELAY_CLASS_BROKER, outcome = RELAY_RETRYABLE;
	strlcpy(error_class, cls, class_size);
	snprintf(raw, sizeof(raw), "%s: the remote database answered %s: %s", cls,
			 sqlstate ? sqlstate : "no SQLSTATE",
			 message ? message : PQresultErrorMessage(res));
	raw[strcspn(raw, "\n")] = '\0';
	RelayCleanText(error, error_size, raw, strlen(raw));
	return outcome;
}
