/*
 * sink.c
 *		The Redis Streams sink (pg_tide_redis.so): appends each message to a
 *		stream with XADD over hiredis's asynchronous API, many commands
 *		pipelined on one connection per pipeline, driven by the worker's
 *		loop like every other batch in flight.
 *
 * 1. `open` reads the pipeline's config (validated by config.c) and
 *	  the credentials it refers to. The connection is the pipeline's: it is
 *	  made by the first batch (redisAsyncConnect, which does not wait for
 *	  the connect), kept across batches and dropped in `close`. A host name
 *	  is looked up on a thread first (RelayLookupStart): hiredis would
 *	  call getaddrinfo in the loop, where a slow name server would hold
 *	  every pipeline of the worker.
 * 2. hiredis is told when to read and write through an adapter of our
 *	  own, as its adapters for libevent or libuv do: addRead, delRead,
 *	  addWrite and delWrite change what events.c's epoll set waits for on
 *	  the connection's socket, and cleanup, called before hiredis frees a
 *	  connection, unwatches it. The socket's readiness calls
 *	  redisAsyncHandleRead/Write; nothing here ever blocks.
 * 3. A new connection sends AUTH (with the ACL user when one is given),
 *	  SELECT and CONFIG GET proto-max-bulk-len first; no XADD is sent
 *	  before their answers came back, so a refused password is one
 *	  failure of the destination, not one per message. A message with a
 *	  field over the limit learnt so is never sent (too_large): Redis would
 *	  close the connection on it, often before its error answer could be
 *	  read, and every retry would fail the same way as a lost connection.
 * 4. `start` and `progress` send the messages the send window allows
 *	  (send_window.c: max_in_flight unanswered, id order, ordering 'key'
 *	  and 'strict', the batch's deadline), each as
 *	  XADD <stream> [MAXLEN ~ <n>] * <fields>, where <stream> is the
 *	  "stream" template expanded for the message. A message is delivered
 *	  only when its XADD was answered with an entry id.
 * 5. Failures (the answer's error code, or the connection's):
 *	  NOAUTH, WRONGPASS, NOPERM and the protocol error Redis answers an
 *	  unauthenticated client's long command with
 *	                                     auth        RELAY_UNREACHABLE
 *	  refused, lost, not connected       connection  RELAY_UNREACHABLE
 *	  WRONGTYPE (the key is no stream)   refused     RELAY_PERMANENT
 *	  a field over proto-max-bulk-len    too_large   RELAY_PERMANENT
 *	  (not sent when the limit is known; when it is not, because CONFIG
 *	  is renamed or outside the user's ACL, Redis answers so and closes
 *	  the connection: the others in flight are connection,
 *	  RELAY_UNREACHABLE, and sent again)
 *	  a header its template needs        template    RELAY_PERMANENT
 *	  no answer within timeout_ms        timeout     RELAY_RETRYABLE
 *	  OOM, LOADING, BUSY, any other      broker      RELAY_RETRYABLE
 *	  A destination failure stops the batch: what was not sent yet is
 *	  RELAY_UNREACHABLE too, so the pipeline is held and nothing is
 *	  dead-lettered.
 *
 * The entry's fields (docs/sinks/redis.md): with "body": "payload",
 * tide-id, tide-outbox, tide-created-at, headers (the message's headers
 * as a JSON object, when it has any) and payload (its JSON); with
 * "envelope", tide-id and message (the message's JSON object,
 * RelayAppendMessageJson). XADD cannot be told pg_tide's identity (an
 * explicit entry id must grow), so a message sent again after a crash or
 * a lost answer is a second entry: delivery is at least once and
 * consumers deduplicate by tide-id.
 *
 * hiredis calls back from inside redisAsyncHandleRead/Write, which the
 * loop calls: the callbacks only record outcomes in memory allocated
 * beforehand (no palloc, no ERROR). A connection with commands in flight
 * is dropped when a batch is abandoned or times out, so no answer of an
 * old batch is ever taken for one of the next.
 */
#include "postgres.h"

#include <sys/epoll.h>

#include <hiredis/hiredis.h>
#include <hiredis/async.h>

#include "fmgr.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "broker.h"
#include "cloudevents.h"
#include "endpoints/registry.h"
#include "redis.h"

PG_MODULE_MAGIC;

/* Room for an entry id as Redis answers it: "<ms>-<seq>". */
#define REDIS_ENTRY_ID_SIZE 48

/* A pipeline's settings, from its config. */
typedef struct RedisSinkConfig
{
	RedisAddress addr;
	char	   *stream;			/* the stream key's template */
	int			maxlen;			/* MAXLEN ~ <maxlen>, or 0: none */
	int			max_in_flight;
	int			timeout_ms;
	bool		envelope;		/* body 'envelope': one "message" field */
	RelayCloudEvents ce;		/* "format": CloudEvents or pg_tide's own */
	char	   *username;		/* ACL user, or NULL: AUTH with the password only */
	char	   *password;		/* or NULL: no AUTH */
} RedisSinkConfig;

typedef enum RedisConnState
{
	REDIS_DOWN = 0,				/* no connection */
	REDIS_LOOKING_UP,			/* the host name's lookup is on its thread */
	REDIS_CONNECTING,			/* connecting, or AUTH/SELECT unanswered */
	REDIS_READY					/* XADDs may go */
} RedisConnState;

struct RedisBatch;

/* A pipeline's state: its settings and its connection. */
typedef struct RedisSink
{
	RedisSinkConfig cfg;
	redisAsyncContext *ac;		/* NULL: none */
	RedisConnState conn;
	int			setup_pending;	/* AUTH/SELECT/CONFIG answers still awaited */
	long long	max_bulk;		/* the server's proto-max-bulk-len, or 0: unknown */
	RelayWatch *watch;			/* the connection's socket in events.c's set */
	uint32		watching;		/* EPOLLIN, EPOLLOUT: what hiredis asked for */
	bool		failed;			/* the connection failed: why, for the batch */
	char		fail_class[32];
	char		fail_error[256];
	struct RedisBatch *rb;		/* the batch in flight, or NULL */
	MemoryContext scratch;		/* one command's arguments, reset after it */
	RelayLookup *lookup;		/* the host name's lookup, while it runs */
	bool		have_address;	/* address is the host's, for the next connect */
	char		address[64];
} RedisSink;

/* A batch in flight: the send window and each message's outcome so far. */
typedef struct RedisBatch
{
	RelaySinkBatch *batch;
	RelaySendWindow window;
	RelayMessageOutcome *each;	/* in batch->cxt, one per message */
	TimestampTz *sent_at;
	char		(*entry_id)[REDIS_ENTRY_ID_SIZE];
} RedisBatch;

static void redis_fd_ready(int fd, uint32 events, void *arg);

/* Tells events.c what hiredis waits for now on the connection's socket. */
static void
update_watch(RedisSink *s)
{
	RelayWatch *w;

	if (s->ac == NULL)
		return;
	w = RelayEventsWatch(s->watch, s->ac->c.fd, s->watching, redis_fd_ready, s);
	/* not watched (out of memory): the batch's deadline ends it */
	if (w != NULL)
		s->watch = w;
}

/* The adapter's hooks (see the adapters in hiredis/adapters/). */
static void
ev_add_read(void *privdata)
{
	RedisSink  *s = privdata;

	s->watching |= EPOLLIN;
	update_watch(s);
}

static void
ev_del_read(void *privdata)
{
	RedisSink  *s = privdata;

	s->watching &= ~EPOLLIN;
	update_watch(s);
}

static void
ev_add_write(void *privdata)
{
	RedisSink  *s = privdata;

	s->watching |= EPOLLOUT;
	update_watch(s);
}

static void
ev_del_write(void *privdata)
{
	RedisSink  *s = privdata;

	s->watching &= ~EPOLLOUT;
	update_watch(s);
}

/* hiredis is about to free the connection (and close its socket). */
static void
ev_cleanup(void *privdata)
{
	RedisSink  *s = privdata;

	RelayEventsUnwatch(s->watch);
	s->watch = NULL;
	s->watching = 0;
	s->ac = NULL;
	s->conn = REDIS_DOWN;
	s->setup_pending = 0;
}

/* events.c: the connection's socket is ready. */
static void
redis_fd_ready(int fd, uint32 events, void *arg)
{
	RedisSink  *s = arg;

	if (s->ac != NULL && (s->watching & EPOLLOUT) &&
		(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
		redisAsyncHandleWrite(s->ac);
	/* the write may have ended the connection (ev_cleanup) */
	if (s->ac != NULL && (events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
		redisAsyncHandleRead(s->ac);
	if (s->rb != NULL)
		s->rb->batch->ready = true;
}

/* Notes that the connection failed (class, why) for the batch in flight. */
static void
note_failure(RedisSink *s, const char *cls, const char *fmt, const char *detail)
{
	if (s->failed)
		return;
	s->failed = true;
	strlcpy(s->fail_class, cls, sizeof(s->fail_class));
	snprintf(s->fail_error, sizeof(s->fail_error), fmt, detail ? detail : "unknown error");
	if (s->rb != NULL)
		s->rb->batch->ready = true;
}

/* Milliseconds since t. */
static double
ms_since(TimestampTz t)
{
	return (GetCurrentTimestamp() - t) / 1000.0;
}

/*
 * The class and outcome of an error answer, by its code (its first word):
 * true when Redis ends the connection after it (the destination's
 * failure, or a message too large), which stops the batch.
 */
static bool
classify_error(const char *err, RelayMessageOutcome *o)
{
	static const char *const auth_codes[] = {"NOAUTH", "WRONGPASS", "NOPERM", NULL};
	char		error[256];
	size_t		code_len = strcspn(err, " ");

	RelayCleanText(error, sizeof(error), err, strlen(err));
	for (const char *const *c = auth_codes; *c; c++)
		if (code_len == strlen(*c) && strncmp(err, *c, code_len) == 0)
		{
			RelaySetFailure(o, RELAY_UNREACHABLE, RELAY_CLASS_AUTH, 0, error);
			return true;
		}
	/*
	 * A field over Redis's proto-max-bulk-len: this message is never
	 * taken, whatever is retried. Redis closes the connection after it,
	 * which the caller makes the failure of what else was in flight.
	 */
	if (strncmp(err, "ERR Protocol error: invalid bulk length", 39) == 0)
	{
		char		large[340];

		snprintf(large, sizeof(large), "too_large: a field is over Redis's proto-max-bulk-len: %s", error);
		RelaySetFailure(o, RELAY_PERMANENT, RELAY_CLASS_TOO_LARGE, 0, large);
		return true;
	}
	/* Redis answers so, then closes the connection */
	if (strncmp(err, "ERR Protocol error", 18) == 0)
	{
		RelaySetFailure(o, RELAY_UNREACHABLE,
						strstr(err, "unauthenticated") ? RELAY_CLASS_AUTH : RELAY_CLASS_CONNECTION,
						0, error);
		return true;
	}
	if (code_len == 9 && strncmp(err, "WRONGTYPE", 9) == 0)
		RelaySetFailure(o, RELAY_PERMANENT, RELAY_CLASS_REFUSED, 0, error);
	else
		RelaySetFailure(o, RELAY_RETRYABLE, RELAY_CLASS_BROKER, 0, error);
	return false;
}

/* The answer to a message's XADD: an entry id, an error, or none (connection lost). */
static void
xadd_answered(redisAsyncContext *ac, void *r, void *privdata)
{
	RedisSink  *s = ac->data;
	RedisBatch *rb = s->rb;
	redisReply *reply = r;
	int			i = (int) (intptr_t) privdata;
	RelayMessageOutcome *o;
	bool		stop = false;

	/* an abandoned batch's answer (its connection is being dropped) */
	if (rb == NULL || i < 0 || i >= rb->batch->nmsgs ||
		rb->window.state[i] != RELAY_SEND_IN_FLIGHT)
		return;
	o = &rb->each[i];
	o->latency_ms = ms_since(rb->sent_at[i]);
	if (reply == NULL && s->failed)
	{
		/* the connection ends after a failure of its own (an answer said why) */
		RelaySetFailure(o, RELAY_UNREACHABLE, s->fail_class, 0, s->fail_error);
		stop = true;
	}
	else if (reply == NULL)
	{
		char		error[256];

		snprintf(error, sizeof(error),
				 "connection: the connection to Redis was lost before XADD was answered: %s",
				 ac->errstr[0] ? ac->errstr : "closed");
		RelaySetFailure(o, RELAY_UNREACHABLE, RELAY_CLASS_CONNECTION, 0, error);
		stop = true;
	}
	else if (reply->type == REDIS_REPLY_STRING || reply->type == REDIS_REPLY_STATUS)
	{
		o->outcome = RELAY_DELIVERED;
		RelayCleanText(rb->entry_id[i], REDIS_ENTRY_ID_SIZE, reply->str, reply->len);
	}
	else if (reply->type == REDIS_REPLY_ERROR)
	{
		/* a failure of the destination is the connection's: the rest fail alike */
		stop = classify_error(reply->str, o);
		if (stop && o->outcome == RELAY_UNREACHABLE)
			note_failure(s, o->error_class, "%s", o->error);
		else if (stop)
			note_failure(s, RELAY_CLASS_CONNECTION,
						 "connection: Redis closed the connection after refusing another message: %s", o->error);
	}
	else
		RelaySetFailure(o, RELAY_RETRYABLE, RELAY_CLASS_BROKER, 0,
						"broker: XADD was answered with something other than an entry id");
	RelaySendWindowDone(&rb->window, i, o->outcome == RELAY_DELIVERED, stop);
	rb->batch->ready = true;
}

/*
 * The privdata of CONFIG GET proto-max-bulk-len on a new connection, whose
 * answer is the longest argument Redis takes: longer ones make it close
 * the connection, often before its error answer can be read, so they are
 * never sent. An error answer (CONFIG is renamed, or not in the user's
 * ACL) leaves the limit unknown; that is no failure.
 */
static const char limit_query[] = "CONFIG GET proto-max-bulk-len";

/* The answer to AUTH, SELECT or CONFIG GET (privdata limit_query) on a new connection. */
static void
setup_answered(redisAsyncContext *ac, void *r, void *privdata)
{
	RedisSink  *s = ac->data;
	redisReply *reply = r;

	if (reply == NULL)
	{
		note_failure(s, RELAY_CLASS_CONNECTION, "connection: the connection to Redis was lost: %s",
					 ac->errstr[0] ? ac->errstr : "closed");
		return;
	}
	if (privdata == limit_query)
	{
		s->max_bulk = 0;
		if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 &&
			reply->element[1]->type == REDIS_REPLY_STRING)
			s->max_bulk = Max(strtoll(reply->element[1]->str, NULL, 10), 0);
	}
	else if (reply->type == REDIS_REPLY_ERROR)
	{
		RelayMessageOutcome o;
		char		what[256];

		memset(&o, 0, sizeof(o));
		RelayCleanText(what, sizeof(what), reply->str, reply->len);
		/* "ERR invalid password" (before Redis 6) and "ERR AUTH ..." are refusals too */
		if (classify_error(reply->str, &o) || strstr(reply->str, "password") != NULL ||
			strncmp(reply->str, "ERR AUTH", 8) == 0)
			note_failure(s, RELAY_CLASS_AUTH, "auth: Redis refused the credentials: %s", what);
		else
			note_failure(s, RELAY_CLASS_CONNECTION, "connection: Redis refused the connection's set-up: %s", what);
		return;
	}
	if (--s->setup_pending == 0 && s->conn == REDIS_CONNECTING)
	{
		s->conn = REDIS_READY;
		if (s->rb != NULL)
			s->rb->batch->ready = true;
	}
}

/* hiredis: the connect finished, or failed (then the context is freed). */
static void
connected(const redisAsyncContext *ac, int status)
{
	RedisSink  *s = ac->data;

	if (status != REDIS_OK)
	{
		note_failure(s, RELAY_CLASS_CONNECTION, "connection: could not connect to Redis: %s",
					 ac->errstr[0] ? ac->errstr : "unknown error");
		return;
	}
	if (s->setup_pending == 0 && s->conn == REDIS_CONNECTING)
	{
		s->conn = REDIS_READY;
		if (s->rb != NULL)
			s->rb->batch->ready = true;
	}
}

/* hiredis: a connection that was made has ended (its context is being freed). */
static void
disconnected(const redisAsyncContext *ac, int status)
{
	RedisSink  *s = ac->data;

	if (status != REDIS_OK)
		note_failure(s, RELAY_CLASS_CONNECTION, "connection: the connection to Redis was lost: %s",
					 ac->errstr[0] ? ac->errstr : "closed");
}

static void start_connect(RedisSink *s);

/*
 * The host name's lookup finished (called in the loop): connects to its
 * address if a batch waits, or keeps it for the next batch.
 */
static void
lookup_done(void *arg)
{
	RedisSink  *s = arg;
	char		error[256];
	bool		found = RelayLookupResult(s->lookup, s->address, sizeof(s->address),
										  error, sizeof(error));

	RelayLookupEnd(s->lookup);
	s->lookup = NULL;
	s->conn = REDIS_DOWN;
	s->have_address = found;
	if (s->rb == NULL)
		return;
	if (found)
		start_connect(s);
	else
		note_failure(s, RELAY_CLASS_CONNECTION, "connection: could not connect to Redis: %s", error);
}

/*
 * Starts connecting, with AUTH and SELECT queued behind the connect; a
 * failure that is known at once is noted for the batch. A host name is
 * looked up first on a thread (broker.h's RelayLookupStart), so that a
 * slow name server holds this pipeline only; each new connection looks
 * it up again.
 */
static void
start_connect(RedisSink *s)
{
	const RedisSinkConfig *cfg = &s->cfg;
	redisAsyncContext *ac;
	const char *host = cfg->addr.host;
	char		error[256];

	s->failed = false;
	s->conn = REDIS_DOWN;
	s->setup_pending = 0;
	if (s->have_address)
	{
		host = s->address;
		s->have_address = false;
	}
	else if (!RelayHostIsAddress(host))
	{
		s->lookup = RelayLookupStart(host, cfg->addr.port, lookup_done, s, error, sizeof(error));
		if (s->lookup == NULL)
			note_failure(s, RELAY_CLASS_CONNECTION, "connection: could not connect to Redis: %s", error);
		else
			s->conn = REDIS_LOOKING_UP;
		return;
	}
	ac = redisAsyncConnect(host, cfg->addr.port);
	if (ac == NULL)
	{
		note_failure(s, RELAY_CLASS_CONNECTION, "connection: could not connect to Redis: %s",
					 "out of memory");
		return;
	}
	if (ac->err)
	{
		note_failure(s, RELAY_CLASS_CONNECTION, "connection: could not connect to Redis: %s", ac->errstr);
		redisAsyncFree(ac);
		return;
	}
	s->ac = ac;
	s->conn = REDIS_CONNECTING;
	ac->data = s;
	ac->ev.data = s;
	ac->ev.addRead = ev_add_read;
	ac->ev.delRead = ev_del_read;
	ac->ev.addWrite = ev_add_write;
	ac->ev.delWrite = ev_del_write;
	ac->ev.cleanup = ev_cleanup;
	redisAsyncSetConnectCallback(ac, connected);
	redisAsyncSetDisconnectCallback(ac, disconnected);
	/* writable: the connect is done (or failed); readable or hung up: failed */
	s->watching = EPOLLIN | EPOLLOUT;
	update_watch(s);

	if (cfg->password != NULL)
	{
		const char *argv[3] = {"AUTH", cfg->username ? cfg->username : cfg->password, cfg->password};
		size_t		lens[3] = {4, strlen(argv[1]), strlen(cfg->password)};

		if (redisAsyncCommandArgv(ac, setup_answered, NULL, cfg->username ? 3 : 2, argv, lens) == REDIS_OK)
			s->setup_pending++;
	}
	if (cfg->addr.db != 0)
	{
		char		db[16];
		const char *argv[2] = {"SELECT", db};
		size_t		lens[2];

		snprintf(db, sizeof(db), "%d", cfg->addr.db);
		lens[0] = 6;
		lens[1] = strlen(db);
		if (redisAsyncCommandArgv(ac, setup_answered, NULL, 2, argv, lens) == REDIS_OK)
			s->setup_pending++;
	}
	if (redisAsyncCommand(ac, setup_answered, (void *) limit_query, limit_query) == REDIS_OK)
		s->setup_pending++;
}

/*
 * Drops the connection, answering nothing of what it still has in flight
 * (the batch is detached meanwhile, so its callbacks pass them over).
 */
static void
drop_connection(RedisSink *s)
{
	RedisBatch *rb = s->rb;

	s->rb = NULL;
	if (s->ac != NULL)
		redisAsyncFree(s->ac);	/* calls ev_cleanup */
	s->ac = NULL;
	/* a lookup goes on: its answer serves the next batch */
	if (s->conn != REDIS_LOOKING_UP)
		s->conn = REDIS_DOWN;
	/* the NULL answers it gave the set-up's callbacks are no failure */
	s->failed = false;
	s->rb = rb;
}

/*
 * Sends message i's XADD; false, with its outcome set, when it cannot be
 * (its template lacks a header: permanent; the connection is closing).
 */
static bool
send_xadd(RedisSink *s, RedisBatch *rb, int i)
{
	const RedisSinkConfig *cfg = &s->cfg;
	const RelayMessage *m = &rb->batch->msgs[i];
	MemoryContext old = MemoryContextSwitchTo(s->scratch);
	StringInfoData key;
	StringInfoData envelope;
	char		id[RELAY_IDENTITY_SIZE];
	char		maxlen[16];
	char		error[256];
	const char *argv[16];
	size_t		lens[16];
	int			argc = 0;
	bool		ok = true;

#define ADD_ARG(s_, len_) (argv[argc] = (s_), lens[argc] = (len_), argc++)
#define ADD_STR(s_) ADD_ARG((s_), strlen(s_))

	initStringInfo(&key);
	if (!RelayBrokerExpand(cfg->stream, m, &key, error, sizeof(error)))
	{
		char		msg[256];

		snprintf(msg, sizeof(msg), "template: %s", error);
		RelaySetFailure(&rb->each[i], RELAY_PERMANENT, RELAY_CLASS_TEMPLATE, 0, msg);
		ok = false;
	}
	else
	{
		RelayMessageIdentity(id, sizeof(id), m->outbox, m->id);
		ADD_STR("XADD");
		ADD_ARG(key.data, key.len);
		if (cfg->maxlen > 0)
		{
			snprintf(maxlen, sizeof(maxlen), "%d", cfg->maxlen);
			ADD_STR("MAXLEN");
			ADD_STR("~");
			ADD_STR(maxlen);
		}
		ADD_STR("*");
		ADD_STR("tide-id");
		ADD_STR(id);
		if (cfg->envelope || cfg->ce.mode != RELAY_CE_NONE)
		{
			/* a structured CloudEvent (the only mode a stream takes) or the envelope */
			initStringInfo(&envelope);
			RelayCloudEventsAppendBody(&envelope, &cfg->ce, m, true);
			if (cfg->ce.mode != RELAY_CE_NONE)
			{
				ADD_STR("content-type");
				ADD_STR(RelayCloudEventsContentType(&cfg->ce));
			}
			ADD_STR("message");
			ADD_ARG(envelope.data, envelope.len);
		}
		else
		{
			ADD_STR("tide-outbox");
			ADD_STR(m->outbox);
			if (m->created_at != NULL && m->created_at[0] == '"' && strlen(m->created_at) >= 2)
			{
				/* a JSON string: its quotes are dropped */
				ADD_STR("tide-created-at");
				ADD_ARG(m->created_at + 1, strlen(m->created_at) - 2);
			}
			if (m->headers != NULL)
			{
				ADD_STR("headers");
				ADD_STR(m->headers);
			}
			ADD_STR("payload");
			ADD_STR(m->payload);
		}
		/* an argument Redis would refuse, closing the connection: not sent */
		for (int k = 0; ok && s->max_bulk > 0 && k < argc; k++)
			if (lens[k] > (size_t) s->max_bulk)
			{
				char		msg[256];

				snprintf(msg, sizeof(msg),
						 "too_large: an XADD argument of %zu bytes is over Redis's proto-max-bulk-len (%lld)",
						 lens[k], s->max_bulk);
				RelaySetFailure(&rb->each[i], RELAY_PERMANENT, RELAY_CLASS_TOO_LARGE, 0, msg);
				ok = false;
			}
		/* hiredis copies the command into its output buffer */
		if (ok && redisAsyncCommandArgv(s->ac, xadd_answered, (void *) (intptr_t) i, argc, argv, lens) != REDIS_OK)
		{
			RelaySetFailure(&rb->each[i], RELAY_UNREACHABLE, RELAY_CLASS_CONNECTION, 0,
							"connection: the connection to Redis is closing");
			ok = false;
		}
		else if (ok)
			rb->sent_at[i] = GetCurrentTimestamp();
	}
#undef ADD_ARG
#undef ADD_STR
	MemoryContextSwitchTo(old);
	MemoryContextReset(s->scratch);
	return ok;
}

/* Sends what the window allows, then writes what it can at once. */
static void
send_more(RedisSink *s, RedisBatch *rb)
{
	int			i;
	bool		queued = false;

	while (s->conn == REDIS_READY && !s->failed && (i = RelaySendWindowNext(&rb->window)) >= 0)
	{
		if (send_xadd(s, rb, i))
			queued = true;
		else
			RelaySendWindowDone(&rb->window, i, false,
								rb->each[i].outcome == RELAY_UNREACHABLE);
	}
	/* a write now saves a turn of the loop; a failure is noted by the callbacks */
	if (queued && s->ac != NULL)
		redisAsyncHandleWrite(s->ac);
}

/*
 * Ends a batch on a failure of the destination: what was not answered is
 * the destination's failure, with the class and error noted.
 */
static void
fail_rest(RedisBatch *rb, RelayOutcome outcome, const char *cls, const char *error)
{
	RelaySendWindow *w = &rb->window;

	for (int i = 0; i < rb->batch->nmsgs; i++)
	{
		RelaySendState st = w->state[i];

		if (st == RELAY_SEND_IN_FLIGHT)
		{
			rb->each[i].latency_ms = ms_since(rb->sent_at[i]);
			RelaySetFailure(&rb->each[i], outcome, cls, 0, error);
			RelaySendWindowDone(w, i, false, true);
		}
		else if (st == RELAY_SEND_WAITING && outcome == RELAY_UNREACHABLE)
		{
			RelaySetFailure(&rb->each[i], outcome, cls, 0, error);
			w->state[i] = RELAY_SEND_SKIPPED;
		}
	}
	w->stopped = true;
}

static void
redis_start(void *state, RelaySinkBatch *batch)
{
	RedisSink  *s = state;
	RedisBatch *rb = MemoryContextAllocZero(batch->cxt, sizeof(RedisBatch));
	int			n = Max(batch->nmsgs, 1);

	rb->batch = batch;
	rb->each = MemoryContextAllocZero(batch->cxt, sizeof(RelayMessageOutcome) * n);
	rb->sent_at = MemoryContextAllocZero(batch->cxt, sizeof(TimestampTz) * n);
	rb->entry_id = MemoryContextAllocZero(batch->cxt, REDIS_ENTRY_ID_SIZE * n);
	for (int i = 0; i < batch->nmsgs; i++)
		rb->each[i].wait_ms = -1;
	RelaySendWindowInit(&rb->window, batch, s->cfg.max_in_flight, s->cfg.timeout_ms);
	batch->sink_private = rb;
	s->rb = rb;
	if (s->ac == NULL && s->conn != REDIS_LOOKING_UP)
		start_connect(s);
	send_more(s, rb);
	batch->wake_at = rb->window.deadline;
}

static bool
redis_progress(void *state, RelaySinkBatch *batch)
{
	RedisSink  *s = state;
	RedisBatch *rb = batch->sink_private;
	RelaySendWindow *w = &rb->window;
	bool		past = GetCurrentTimestamp() >= w->deadline;

	if (s->failed)
	{
		/* the connection failed: the rest waits with the pipeline */
		fail_rest(rb, RELAY_UNREACHABLE, s->fail_class, s->fail_error);
		drop_connection(s);
		s->failed = false;
		return true;
	}
	if (past && s->conn != REDIS_READY)
	{
		fail_rest(rb, RELAY_UNREACHABLE, RELAY_CLASS_TIMEOUT,
				  s->conn == REDIS_LOOKING_UP ?
				  "timeout: the Redis host name was not looked up within the batch's timeout_ms" :
				  "timeout: no connection to Redis within the batch's timeout_ms");
		drop_connection(s);
		return true;
	}
	if (past && w->in_flight > 0)
	{
		fail_rest(rb, RELAY_RETRYABLE, RELAY_CLASS_TIMEOUT,
				  "timeout: XADD was not answered within the batch's timeout_ms");
		/* its answers must not be taken for the next batch's */
		drop_connection(s);
		return true;
	}
	send_more(s, rb);
	if (s->failed)
		return redis_progress(state, batch);
	if (s->conn != REDIS_READY && !past)
	{
		/* still connecting: the window waits for the connection */
		batch->wake_at = w->deadline;
		return false;
	}
	if (RelaySendWindowFinished(w))
		return true;
	batch->wake_at = w->deadline;
	return false;
}

static void
redis_outcomes(void *state, RelaySinkBatch *batch, RelayDeliveryResult *result)
{
	RedisSink  *s = state;
	RedisBatch *rb = batch->sink_private;

	for (int i = 0; i < batch->nmsgs; i++)
	{
		RelayMessageOutcome *o = &result->each[i];

		*o = rb->each[i];
		if (o->outcome == RELAY_DELIVERED && rb->entry_id[i][0] != '\0')
			o->response = rb->entry_id[i];
		else if (o->outcome == RELAY_NOT_SENT)
			RelaySendWindowNotSent(&rb->window, i, o);
	}
	s->rb = NULL;
}

static void
redis_cancel(void *state, RelaySinkBatch *batch)
{
	RedisSink  *s = state;

	/* answers still due would belong to this batch, whose memory goes */
	s->rb = NULL;
	if (s->ac != NULL && batch->sink_private != NULL &&
		((RedisBatch *) batch->sink_private)->window.in_flight > 0)
		drop_connection(s);
	s->failed = false;
}

static void
redis_close(void *state)
{
	RedisSink  *s = state;

	s->rb = NULL;
	drop_connection(s);
	RelayLookupEnd(s->lookup);
	s->lookup = NULL;
}

/*
 * The pipeline's settings from its config, with the credentials it refers
 * to read; false when they cannot be (the pipeline's error).
 */
static bool
redis_open(const cJSON *config, RelaySinkOpened *opened)
{
	RedisSink  *s = palloc0(sizeof(RedisSink));
	RedisSinkConfig *cfg = &s->cfg;
	const cJSON *auth = RelayConfigMember(config, "auth");
	const cJSON *user = RelayConfigMember(auth, "username");
	const cJSON *password = RelayConfigMember(auth, "password");
	const char *why = NULL;
	char	   *error = NULL;

	if (!RedisParseUrl(cJSON_GetStringValue(RelayConfigMember(config, "url")) ?
					   cJSON_GetStringValue(RelayConfigMember(config, "url")) : "",
					   &cfg->addr, &why))
	{
		opened->error = psprintf("its \"url\" is not a Redis URL: %s", why);
		return false;
	}
	cfg->stream = RelayConfigString(config, "stream");
	cfg->maxlen = RelayConfigIntOr(config, "maxlen", 0);
	cfg->max_in_flight = RelayConfigIntOr(config, "max_in_flight", 100);
	cfg->timeout_ms = RelayConfigIntOr(config, "timeout_ms", 10000);
	cfg->envelope = RelayConfigStringIs(config, "body", "envelope");
	RelayCloudEventsOpen(config, &cfg->ce);
	opened->longest_batch_seconds = (cfg->timeout_ms + 999) / 1000;
	opened->read_secrets = cJSON_IsObject(user) || cJSON_IsObject(password);
	if (!RelayBrokerCredential(user, &cfg->username, &error) ||
		!RelayBrokerCredential(password, &cfg->password, &error))
	{
		opened->error = error;
		return false;
	}
	if (cfg->stream == NULL)
	{
		opened->error = "its config has no \"stream\"";
		return false;
	}
	s->scratch = AllocSetContextCreate(CurrentMemoryContext, "pg_tide redis command",
									   ALLOCSET_SMALL_SIZES);
	opened->state = s;
	return true;
}

/* The routine and init symbol of the Redis Streams sink, a module (endpoints/registry.h). */
RELAY_BROKER_SINK_ENDPOINT(redis, RedisConfigKeys, RedisValidate);
