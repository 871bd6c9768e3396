/*
 * sink.c
 *		The NATS JetStream sink (pg_tide_nats.so, linked with nats.c's
 *		libnats): publishes each message to a subject with JetStream's
 *		publish acknowledgements, many in flight, and counts a message
 *		delivered only once its PubAck came back without an error.
 *
 * 1. `open` reads the pipeline's config (validated by config.c) and
 *	  its credentials (broker.h); the connection is made by the first batch
 *	  and kept for the pipeline's life: nats.c reconnects by itself.
 *	  natsConnection_Connect blocks (up to NATS_CONNECT_TIMEOUT_MS a
 *	  server), and with TLS natsOptions_SetSecure reads the system's CA
 *	  certificates and the others the TLS files, so they run on a thread
 *	  of its own (connector_main), which
 *	  hands the connection over through the shared part and the notifier:
 *	  the loop, every other pipeline of the worker, never waits for a
 *	  server that does not answer.
 * 2. `start` and `progress` publish what the send window allows
 *	  (send_window.c: max_in_flight, ordering 'key' and 'strict', the
 *	  deadline timeout_ms), each message with js_PublishMsgAsync: the
 *	  subject expanded from its template, the body the payload (or the
 *	  envelope), pg_tide's headers and the message's own as NATS headers,
 *	  and Nats-Msg-Id set to the message's identity, so that the stream
 *	  drops a message it already holds (sent again after a crash, a
 *	  timeout or a lost connection) inside its duplicate window;
 *	  Nats-Expected-Stream when the config names the stream.
 * 3. nats.c calls the ack handler on its own thread. The handler only
 *	  copies the result into a queue under a mutex and signals the
 *	  pipeline's RelayNotifier; the loop's `progress` takes the results
 *	  (no PostgreSQL function runs on a library thread). The connection's
 *	  disconnected, reconnected and closed events go the same way.
 * 4. A batch ends when every message was answered, when the deadline
 *	  came, or at once when the connection was lost: the messages still in
 *	  flight are taken back from nats.c (js_PublishAsyncGetPendingList, so
 *	  no late answer refers to them) and fail, to be leased or retried
 *	  again; nothing is delivered that was not acknowledged.
 *
 * Classes (broker.h; docs/sinks/nats.md): no connection, a lost one, or a
 * connection refused for authentication is the destination's failure
 * (connection, auth); a subject outside the named stream is
 * unknown_destination, a message over the server's max_payload or the
 * stream's max_msg_size too_large, a sealed stream or a header NATS
 * cannot carry refused: permanent; "no responders" (no stream takes the
 * subject, or none does for the moment: a server shutting down answers
 * it) is unknown_destination too but retryable, dead-lettered once
 * retry.max_attempts ran out; no answer in time is timeout and a
 * JetStream storage error (stream full with discard new, storage
 * resources) or any other JetStream API error broker: retryable.
 */
#include "postgres.h"

#include <pthread.h>

#include <nats/nats.h>

#include "fmgr.h"
#include "lib/stringinfo.h"
#include "utils/timestamp.h"

#include "broker.h"
#include "cloudevents.h"
#include "endpoints/registry.h"
#include "nats_sink.h"

PG_MODULE_MAGIC;

/* The connect timeout, per server (on the connector's thread, not the loop's). */
#define NATS_CONNECT_TIMEOUT_MS 2000

/* One publish answer, as the ack handler copies it from its thread. */
typedef struct NatsAnswer
{
	int64		id;				/* the message's id, from its Nats-Msg-Id */
	bool		ok;
	bool		duplicate;		/* the stream held it already */
	natsStatus	err;
	int			js_code;		/* JetStream's error code, or 0 */
	char		text[160];
} NatsAnswer;

/*
 * What nats.c's threads touch, in malloc'd memory under its own mutex.
 * Never freed: a callback may still run on a library thread after the
 * connection was destroyed, and finds `closed` then (see nats_close).
 */
typedef struct NatsShared
{
	pthread_mutex_t lock;
	bool		closed;			/* the pipeline is closed: touch nothing */
	NatsAnswer *answers;
	int			nanswers;
	int			room;
	int			disconnects;	/* disconnected events so far */
	RelayNotifier notifier;
	/* a connect on the connector's thread (connector_main) */
	bool		connecting;		/* started, its result not taken yet */
	bool		connect_done;	/* the result below is there */
	natsOptions *connect_opts;	/* the connector's, which destroys them */
	/*
	 * TLS, set on the connector's thread: natsOptions_SetSecure reads the
	 * system's CA certificates (100 to 300 ms with OpenSSL 3), the others
	 * read files. The files' names are malloc'd; the connector frees them.
	 */
	bool		connect_tls;
	bool		connect_verify;
	char	   *connect_ca_file;
	char	   *connect_cert_file;
	char	   *connect_key_file;
	natsConnection *connect_nc; /* the connection made, or NULL */
	natsStatus	connect_status;
	char		connect_error[200];
} NatsShared;

/* A NATS pipeline's settings and connection. */
typedef struct NatsPipeline
{
	const char **servers;
	int			nservers;
	char	   *subject;		/* template */
	char	   *stream;			/* expected stream, or NULL */
	int			max_in_flight;
	int			timeout_ms;
	bool		envelope;		/* body "envelope" rather than "payload" */
	RelayCloudEvents ce;		/* "format": CloudEvents or pg_tide's own */
	char	   *username;
	char	   *password;
	char	   *token;
	char	   *credentials_file;
	bool		tls;
	char	   *ca_file;
	char	   *cert_file;
	char	   *key_file;
	bool		verify;
	natsConnection *nc;
	jsCtx	   *js;
	NatsShared *shared;
	RelaySinkBatch *batch;		/* the batch in flight, or NULL */
} NatsPipeline;

/* A batch in flight. */
typedef struct NatsBatch
{
	RelaySendWindow w;
	RelayMessageOutcome *each;	/* the failures so far, by message */
	TimestampTz *sent_at;
	int		   *slots;			/* open addressing: message id -> index + 1 */
	int			nslots;
	int			disconnects;	/* shared->disconnects when it started */
	bool		lost;			/* the connection was lost during the batch */
	bool		connecting;		/* waits for the connector (connect_if_needed) */
	bool		reclaimed;		/* what was in flight was taken back */
	const char *failed_class;	/* nothing could be sent: why */
	char		failed[256];
} NatsBatch;

/*
 * The library's threads: copy, queue, signal; nothing else. Only the first
 * answer into an empty queue signals: the worker drains the notifier
 * before it takes the answers, and takes them all, so one signal covers
 * every answer queued until then (a write per answer cost a system call
 * and a wake-up of the worker per message).
 */
static void
queue_answer(NatsShared *sh, const NatsAnswer *a)
{
	pthread_mutex_lock(&sh->lock);
	if (!sh->closed)
	{
		bool		was_empty = (sh->nanswers == 0);

		if (sh->nanswers == sh->room)
		{
			int			room = sh->room ? sh->room * 2 : 256;
			NatsAnswer *grown = realloc(sh->answers, sizeof(NatsAnswer) * room);

			/* out of memory: the answer is lost, the message times out */
			if (grown != NULL)
			{
				sh->answers = grown;
				sh->room = room;
			}
		}
		if (sh->nanswers < sh->room)
			sh->answers[sh->nanswers++] = *a;
		if (was_empty)
			RelayNotifierSignal(&sh->notifier);
	}
	pthread_mutex_unlock(&sh->lock);
}

/* jsPubAckHandler, on a nats.c thread. */
static void
ack_handler(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure)
{
	NatsShared *sh = closure;
	NatsAnswer	a;
	const char *id = NULL;
	const char *colon;

	memset(&a, 0, sizeof(a));
	if (natsMsgHeader_Get(msg, "Nats-Msg-Id", &id) == NATS_OK && id != NULL &&
		(colon = strrchr(id, ':')) != NULL)
	{
		a.id = strtoll(colon + 1, NULL, 10);
		a.ok = pa != NULL;
		a.duplicate = pa != NULL && pa->Duplicate;
		if (pae != NULL)
		{
			a.err = pae->Err;
			a.js_code = (int) pae->ErrCode;
			snprintf(a.text, sizeof(a.text), "%s",
					 pae->ErrText ? pae->ErrText : natsStatus_GetText(pae->Err));
		}
		queue_answer(sh, &a);
	}
	natsMsg_Destroy(msg);
}

/* natsConnectionHandler for disconnected, reconnected and closed, on a nats.c thread. */
static void
connection_event(natsConnection *nc, void *closure)
{
	NatsShared *sh = closure;

	pthread_mutex_lock(&sh->lock);
	if (!sh->closed)
	{
		if (natsConnection_Status(nc) != NATS_CONN_STATUS_CONNECTED)
			sh->disconnects++;
		RelayNotifierSignal(&sh->notifier);
	}
	pthread_mutex_unlock(&sh->lock);
}

/* events.c: the notifier was signalled; `progress` takes what came. */
static void
notified(int fd, uint32 events, void *arg)
{
	NatsPipeline *p = arg;

	RelayNotifierDrain(&p->shared->notifier);
	if (p->batch != NULL)
		p->batch->ready = true;
}

/*
 * The text of nats.c's last error on this thread, without the source
 * position it starts with ("(conn.c:2088): "), or of the status.
 */
static const char *
last_error(natsStatus s)
{
	const char *text = nats_GetLastError(NULL);
	const char *after;

	if (text == NULL || text[0] == '\0')
		return natsStatus_GetText(s);
	if (text[0] == '(' && (after = strstr(text, "): ")) != NULL)
		return after + 3;
	return text;
}

/* Drops the connection (a closed one, or at close). */
static void
disconnect(NatsPipeline *p)
{
	if (p->js != NULL)
	{
		natsMsgList pending;

		if (js_PublishAsyncGetPendingList(&pending, p->js) == NATS_OK)
			natsMsgList_Destroy(&pending);
		jsCtx_Destroy(p->js);
		p->js = NULL;
	}
	if (p->nc != NULL)
	{
		natsConnection_Destroy(p->nc);
		p->nc = NULL;
	}
}

/*
 * The connector's thread: connects with the options made by
 * connect_if_needed, and hands the result over. Only nats.c's functions
 * and the C library here, no PostgreSQL function; after the pipeline was
 * closed (the shared part is never freed) it drops what it made.
 */
static void *
connector_main(void *arg)
{
	NatsShared *sh = arg;
	natsOptions *opts = sh->connect_opts;
	natsConnection *nc = NULL;
	natsStatus	s = NATS_OK;
	char		error[sizeof(sh->connect_error)];

	if (sh->connect_tls)
		s = natsOptions_SetSecure(opts, true);
	if (s == NATS_OK && sh->connect_ca_file != NULL)
		s = natsOptions_LoadCATrustedCertificates(opts, sh->connect_ca_file);
	if (s == NATS_OK && sh->connect_cert_file != NULL)
		s = natsOptions_LoadCertificatesChain(opts, sh->connect_cert_file, sh->connect_key_file);
	if (s == NATS_OK && sh->connect_tls && !sh->connect_verify)
		s = natsOptions_SkipServerVerification(opts, true);
	if (s == NATS_OK)
		s = natsConnection_Connect(&nc, opts);
	/* nats.c's last error is this thread's */
	snprintf(error, sizeof(error), "%s", s == NATS_OK ? "" : last_error(s));
	free(sh->connect_ca_file);
	free(sh->connect_cert_file);
	free(sh->connect_key_file);
	natsOptions_Destroy(opts);
	pthread_mutex_lock(&sh->lock);
	sh->connect_opts = NULL;
	if (!sh->closed)
	{
		sh->connect_nc = nc;
		sh->connect_status = s;
		memcpy(sh->connect_error, error, sizeof(error));
		sh->connect_done = true;
		RelayNotifierSignal(&sh->notifier);
		nc = NULL;
	}
	pthread_mutex_unlock(&sh->lock);
	/* outside the lock: its closed event takes it */
	if (nc != NULL)
		natsConnection_Destroy(nc);
	return NULL;
}

typedef enum NatsLink
{
	NATS_LINK_UP,				/* p->nc is there (nats.c may be reconnecting) */
	NATS_LINK_PENDING,			/* the connector is at work */
	NATS_LINK_FAILED			/* nb->failed says why */
} NatsLink;

/* The connector's result, once there: the connection, or its failure in nb. */
static NatsLink
take_connection(NatsPipeline *p, NatsBatch *nb)
{
	NatsShared *sh = p->shared;
	natsStatus	s;
	char		error[sizeof(sh->connect_error)];
	jsOptions	jo;

	pthread_mutex_lock(&sh->lock);
	if (!sh->connect_done)
	{
		pthread_mutex_unlock(&sh->lock);
		return NATS_LINK_PENDING;
	}
	p->nc = sh->connect_nc;
	s = sh->connect_status;
	memcpy(error, sh->connect_error, sizeof(error));
	sh->connect_nc = NULL;
	sh->connect_done = false;
	sh->connecting = false;
	pthread_mutex_unlock(&sh->lock);
	if (s == NATS_OK)
	{
		jsOptions_Init(&jo);
		jo.Wait = p->timeout_ms;
		jo.PublishAsync.MaxPending = 100000;	/* the send window limits it */
		jo.PublishAsync.AckHandler = ack_handler;
		jo.PublishAsync.AckHandlerClosure = p->shared;
		s = natsConnection_JetStream(&p->js, p->nc, &jo);
		if (s != NATS_OK)
			snprintf(error, sizeof(error), "%s", last_error(s));
	}
	if (s != NATS_OK)
	{
		nb->failed_class = (s == NATS_CONNECTION_AUTH_FAILED || s == NATS_NOT_PERMITTED) ?
			RELAY_CLASS_AUTH : RELAY_CLASS_CONNECTION;
		snprintf(nb->failed, sizeof(nb->failed), "%s: cannot connect to NATS: %s",
				 nb->failed_class, error);
		disconnect(p);
		return NATS_LINK_FAILED;
	}
	return NATS_LINK_UP;
}

/*
 * Connects when there is no connection (or nats.c closed it for good):
 * starts the connector, or takes its result.
 */
static NatsLink
connect_if_needed(NatsPipeline *p, NatsBatch *nb)
{
	natsOptions *opts = NULL;
	natsStatus	s;
	int			rc;

	if (p->nc != NULL && natsConnection_Status(p->nc) == NATS_CONN_STATUS_CLOSED)
		disconnect(p);
	if (p->nc != NULL)
		return NATS_LINK_UP;
	if (p->shared->connecting)
		return take_connection(p, nb);

	s = natsOptions_Create(&opts);
	if (s == NATS_OK)
		s = natsOptions_SetServers(opts, p->servers, p->nservers);
	if (s == NATS_OK)
		s = natsOptions_SetName(opts, "pg_tide");
	if (s == NATS_OK)
		s = natsOptions_SetTimeout(opts, Min(p->timeout_ms, NATS_CONNECT_TIMEOUT_MS));
	if (s == NATS_OK)
		s = natsOptions_SetNoRandomize(opts, true);
	/* once connected, reconnect for ever: the pipeline is held meanwhile */
	if (s == NATS_OK)
		s = natsOptions_SetMaxReconnect(opts, -1);
	if (s == NATS_OK)
		s = natsOptions_SetReconnectWait(opts, 500);
	if (s == NATS_OK)
		s = natsOptions_SetDisconnectedCB(opts, connection_event, p->shared);
	if (s == NATS_OK)
		s = natsOptions_SetReconnectedCB(opts, connection_event, p->shared);
	if (s == NATS_OK)
		s = natsOptions_SetClosedCB(opts, connection_event, p->shared);
	if (s == NATS_OK && p->username != NULL)
		s = natsOptions_SetUserInfo(opts, p->username, p->password);
	if (s == NATS_OK && p->token != NULL)
		s = natsOptions_SetToken(opts, p->token);
	if (s == NATS_OK && p->credentials_file != NULL)
		s = natsOptions_SetUserCredentialsFromFiles(opts, p->credentials_file, NULL);
	if (s != NATS_OK)
	{
		nb->failed_class = RELAY_CLASS_CONNECTION;
		snprintf(nb->failed, sizeof(nb->failed), "%s: cannot set up the connection: %s",
				 nb->failed_class, last_error(s));
		natsOptions_Destroy(opts);
		return NATS_LINK_FAILED;
	}
	p->shared->connect_opts = opts;
	p->shared->connect_tls = p->tls;
	p->shared->connect_verify = p->verify;
	p->shared->connect_ca_file = p->ca_file ? strdup(p->ca_file) : NULL;
	p->shared->connect_cert_file = p->cert_file ? strdup(p->cert_file) : NULL;
	p->shared->connect_key_file = p->key_file ? strdup(p->key_file) : NULL;
	p->shared->connect_done = false;
	p->shared->connecting = true;
	rc = ((p->ca_file && !p->shared->connect_ca_file) || (p->cert_file && !p->shared->connect_cert_file) ||
		  (p->key_file && !p->shared->connect_key_file)) ? ENOMEM :
		RelayBrokerStartThread(connector_main, p->shared);
	if (rc != 0)
	{
		p->shared->connecting = false;
		p->shared->connect_opts = NULL;
		free(p->shared->connect_ca_file);
		free(p->shared->connect_cert_file);
		free(p->shared->connect_key_file);
		natsOptions_Destroy(opts);
		nb->failed_class = RELAY_CLASS_CONNECTION;
		snprintf(nb->failed, sizeof(nb->failed), "connection: could not start a thread to connect: %s",
				 strerror(rc));
		return NATS_LINK_FAILED;
	}
	return NATS_LINK_PENDING;
}

/* The slot of message id in the batch's table. */
static int
slot_of(const NatsBatch *nb, int64 id)
{
	uint64		h = (uint64) id * UINT64CONST(0x9E3779B97F4A7C15);

	return (int) (h >> 32) & (nb->nslots - 1);
}

/* The index of message id in the batch, or -1. */
static int
index_of(const NatsBatch *nb, const RelaySinkBatch *batch, int64 id)
{
	for (int s = slot_of(nb, id); nb->slots[s] != 0; s = (s + 1) & (nb->nslots - 1))
		if (batch->msgs[nb->slots[s] - 1].id == id)
			return nb->slots[s] - 1;
	return -1;
}

/* Message i failed before or while it was sent; stop: send nothing more. */
static void
fail(NatsBatch *nb, int i, RelayOutcome outcome, const char *cls, const char *error, bool stop)
{
	RelaySetFailure(&nb->each[i], outcome, cls, 0, error);
	RelaySendWindowDone(&nb->w, i, false, stop);
}

/*
 * nats-server's JSStreamHeaderExceedsMaximumErr (headers over 64 kB), which
 * nats.c's jsErrCode does not name: the message's own headers, never
 * accepted however often it is sent.
 */
#define NATS_JS_HEADER_TOO_LARGE 10097

/* A JetStream negative answer as a failure of its message. */
static void
classify_answer(NatsBatch *nb, int i, const NatsAnswer *a)
{
	char		error[256];

	/*
	 * Retryable, not permanent: JetStream answers it for a subject no
	 * stream takes, but also while a server shuts down (its streams stop
	 * before its connections close) or a stream has no leader yet.
	 */
	if (a->err == NATS_NO_RESPONDERS)
	{
		fail(nb, i, RELAY_RETRYABLE, RELAY_CLASS_UNKNOWN_DESTINATION,
			 "unknown_destination: no JetStream stream takes the message's subject (no responders)", false);
		return;
	}
	if (a->err == NATS_TIMEOUT)
	{
		fail(nb, i, RELAY_RETRYABLE, RELAY_CLASS_TIMEOUT, "timeout: no acknowledgement from JetStream", false);
		return;
	}
	switch (a->js_code)
	{
		case JSStreamMessageExceedsMaximumErr:
		case NATS_JS_HEADER_TOO_LARGE:
			snprintf(error, sizeof(error), "too_large: JetStream error %d: %s", a->js_code, a->text);
			fail(nb, i, RELAY_PERMANENT, RELAY_CLASS_TOO_LARGE, error, false);
			return;
		case JSStreamNotMatchErr:
		case JSStreamNotFoundErr:
			snprintf(error, sizeof(error), "unknown_destination: JetStream error %d: %s", a->js_code, a->text);
			fail(nb, i, RELAY_PERMANENT, RELAY_CLASS_UNKNOWN_DESTINATION, error, false);
			return;
		case JSStreamSealedErr:
			snprintf(error, sizeof(error), "refused: JetStream error %d: %s", a->js_code, a->text);
			fail(nb, i, RELAY_PERMANENT, RELAY_CLASS_REFUSED, error, false);
			return;
		default:
			break;
	}
	/* storage full (discard new), resources, or any other API error: transient */
	if (a->js_code != 0)
		snprintf(error, sizeof(error), "broker: JetStream error %d: %s", a->js_code, a->text);
	else
		snprintf(error, sizeof(error), "broker: %s", a->text);
	fail(nb, i, RELAY_RETRYABLE, RELAY_CLASS_BROKER, error, false);
}

/* Takes the answers the ack handler queued, for the batch in flight. */
static void
take_answers(NatsPipeline *p, RelaySinkBatch *batch, NatsBatch *nb)
{
	NatsShared *sh = p->shared;
	NatsAnswer *answers;
	int			n;

	pthread_mutex_lock(&sh->lock);
	answers = sh->answers;
	n = sh->nanswers;
	sh->answers = NULL;
	sh->nanswers = 0;
	sh->room = 0;
	if (sh->disconnects != nb->disconnects)
		nb->lost = true;
	pthread_mutex_unlock(&sh->lock);

	for (int k = 0; k < n; k++)
	{
		const NatsAnswer *a = &answers[k];
		int			i = index_of(nb, batch, a->id);

		/* an answer to an earlier batch's message: it was taken back */
		if (i < 0 || nb->w.state[i] != RELAY_SEND_IN_FLIGHT)
			continue;
		nb->each[i].latency_ms = (GetCurrentTimestamp() - nb->sent_at[i]) / 1000.0;
		if (a->ok)
		{
			nb->each[i].outcome = RELAY_DELIVERED;
			nb->each[i].response = a->duplicate ? "duplicate" : NULL;
			RelaySendWindowDone(&nb->w, i, true, false);
		}
		else
			classify_answer(nb, i, a);
	}
	free(answers);
}

/* What RelayBrokerForEachHeader's callback adds headers to. */
typedef struct HeaderTarget
{
	natsMsg    *msg;
	const char *bad;			/* a header NATS cannot carry, or NULL */
	natsStatus	s;
} HeaderTarget;

/* Whether a header name is one a NATS header line can carry. */
static bool
valid_header_name(const char *name)
{
	if (name[0] == '\0')
		return false;
	for (const unsigned char *c = (const unsigned char *) name; *c; c++)
		if (*c <= ' ' || *c == ':' || *c >= 0x7f)
			return false;
	return true;
}

static void
add_header(const char *name, const char *value, void *arg)
{
	HeaderTarget *t = arg;

	if (t->bad != NULL || t->s != NATS_OK)
		return;
	if (!valid_header_name(name) || strpbrk(value, "\r\n") != NULL)
	{
		t->bad = pstrdup(name);
		return;
	}
	t->s = natsMsgHeader_Add(t->msg, name, value);
}

/* Whether an expanded subject is a valid NATS subject to publish to. */
static bool
valid_subject(const char *s)
{
	size_t		len = strlen(s);

	if (len == 0 || s[0] == '.' || s[len - 1] == '.' || strstr(s, "..") != NULL)
		return false;
	for (const unsigned char *c = (const unsigned char *) s; *c; c++)
		if (*c <= ' ' || *c == 0x7f || *c == '*' || *c == '>')
			return false;
	return true;
}

/*
 * Publishes message i (the window marked it in flight); its failure to be
 * sent is recorded, and a lost connection stops the batch.
 */
static void
publish(NatsPipeline *p, RelaySinkBatch *batch, NatsBatch *nb, int i)
{
	const RelayMessage *m = &batch->msgs[i];
	StringInfoData subject;
	StringInfoData body;
	char		error[256];
	char		id[RELAY_IDENTITY_SIZE];
	natsMsg    *msg = NULL;
	HeaderTarget t;
	natsStatus	s;

	initStringInfo(&subject);
	if (!RelayBrokerExpand(p->subject, m, &subject, error, sizeof(error)))
	{
		fail(nb, i, RELAY_PERMANENT, RELAY_CLASS_TEMPLATE, error, false);
		return;
	}
	if (!valid_subject(subject.data))
	{
		char		clean[128];

		RelayCleanText(clean, sizeof(clean), subject.data, subject.len);
		snprintf(error, sizeof(error), "template: subject \"%s\" from template \"%s\" is not a valid NATS subject",
				 clean, p->subject);
		fail(nb, i, RELAY_PERMANENT, RELAY_CLASS_TEMPLATE, error, false);
		return;
	}
	initStringInfo(&body);
	RelayCloudEventsAppendBody(&body, &p->ce, m, p->envelope);

	RelayMessageIdentity(id, sizeof(id), m->outbox, m->id);
	s = natsMsg_Create(&msg, subject.data, NULL, body.data, body.len);
	memset(&t, 0, sizeof(t));
	t.msg = msg;
	if (s == NATS_OK)
	{
		RelayBrokerForEachHeader(m, add_header, &t);
		/* the NATS binding: ce-<attribute> headers and content-type */
		RelayCloudEventsForEachHeader(&p->ce, m, "ce-", "content-type", add_header, &t);
		s = t.s;
	}
	if (s == NATS_OK && t.bad == NULL)
		s = natsMsgHeader_Set(msg, "Nats-Msg-Id", id);
	if (s == NATS_OK && t.bad == NULL && p->stream != NULL)
		s = natsMsgHeader_Set(msg, "Nats-Expected-Stream", p->stream);
	if (t.bad != NULL)
	{
		char		clean[64];

		RelayCleanText(clean, sizeof(clean), t.bad, strlen(t.bad));
		snprintf(error, sizeof(error), "refused: header \"%s\" cannot be a NATS header (its name has a space, "
				 "a colon or a control character, or its value a line break)", clean);
		natsMsg_Destroy(msg);
		fail(nb, i, RELAY_PERMANENT, RELAY_CLASS_REFUSED, error, false);
		return;
	}
	nb->sent_at[i] = GetCurrentTimestamp();
	if (s == NATS_OK)
		s = js_PublishMsgAsync(p->js, &msg, NULL);
	/* taken by nats.c on success (msg is NULL then) */
	natsMsg_Destroy(msg);
	pfree(body.data);
	pfree(subject.data);
	if (s == NATS_OK)
		return;
	if (s == NATS_MAX_PAYLOAD)
	{
		snprintf(error, sizeof(error), "too_large: the message (%d bytes with its headers) is over the server's max_payload of " INT64_FORMAT " bytes",
				 body.len, (int64) natsConnection_GetMaxPayload(p->nc));
		fail(nb, i, RELAY_PERMANENT, RELAY_CLASS_TOO_LARGE, error, false);
	}
	else if (s == NATS_CONNECTION_CLOSED || s == NATS_CONNECTION_DISCONNECTED ||
			 s == NATS_NO_SERVER || s == NATS_STALE_CONNECTION)
	{
		snprintf(error, sizeof(error), "connection: %s", last_error(s));
		nb->lost = true;
		fail(nb, i, RELAY_UNREACHABLE, RELAY_CLASS_CONNECTION, error, true);
	}
	else
	{
		snprintf(error, sizeof(error), "broker: cannot publish: %s", last_error(s));
		fail(nb, i, RELAY_RETRYABLE, RELAY_CLASS_BROKER, error, false);
	}
}

/* Whether the connection is up: while nats.c reconnects, nothing is sent. */
static bool
connected(NatsPipeline *p)
{
	return p->nc != NULL && natsConnection_Status(p->nc) == NATS_CONN_STATUS_CONNECTED;
}

/*
 * Takes back from nats.c what is still in flight (no answer will come for
 * it), then the answers that came meanwhile.
 */
static void
reclaim(NatsPipeline *p, RelaySinkBatch *batch, NatsBatch *nb)
{
	natsMsgList pending;

	if (nb->reclaimed || p->js == NULL || nb->w.in_flight == 0)
		return;
	nb->reclaimed = true;
	if (js_PublishAsyncGetPendingList(&pending, p->js) == NATS_OK)
		natsMsgList_Destroy(&pending);
	take_answers(p, batch, nb);
}

static void
nats_start(void *state, RelaySinkBatch *batch)
{
	NatsPipeline *p = state;
	MemoryContext old = MemoryContextSwitchTo(batch->cxt);
	NatsBatch  *nb = palloc0(sizeof(NatsBatch));

	batch->sink_private = nb;
	RelaySendWindowInit(&nb->w, batch, p->max_in_flight, p->timeout_ms);
	nb->each = palloc0(sizeof(RelayMessageOutcome) * Max(batch->nmsgs, 1));
	nb->sent_at = palloc0(sizeof(TimestampTz) * Max(batch->nmsgs, 1));
	for (nb->nslots = 16; nb->nslots < batch->nmsgs * 2; nb->nslots *= 2)
		;
	nb->slots = palloc0(sizeof(int) * nb->nslots);
	for (int i = 0; i < batch->nmsgs; i++)
	{
		int			s = slot_of(nb, batch->msgs[i].id);

		while (nb->slots[s] != 0)
			s = (s + 1) & (nb->nslots - 1);
		nb->slots[s] = i + 1;
	}
	MemoryContextSwitchTo(old);

	p->batch = batch;
	switch (connect_if_needed(p, nb))
	{
		case NATS_LINK_UP:
			if (!connected(p))
			{
				nb->failed_class = RELAY_CLASS_CONNECTION;
				snprintf(nb->failed, sizeof(nb->failed), "connection: the connection to NATS is lost; reconnecting");
			}
			break;
		case NATS_LINK_PENDING:
			nb->connecting = true;
			break;
		case NATS_LINK_FAILED:
			break;
	}
	/*
	 * Answers still queued were to messages of earlier batches, taken
	 * back; a loss of the connection counts from here on.
	 */
	pthread_mutex_lock(&p->shared->lock);
	p->shared->nanswers = 0;
	nb->disconnects = p->shared->disconnects;
	pthread_mutex_unlock(&p->shared->lock);
	batch->ready = true;
}

static bool
nats_progress(void *state, RelaySinkBatch *batch)
{
	NatsPipeline *p = state;
	NatsBatch  *nb = batch->sink_private;
	MemoryContext old;
	int			i;

	if (nb->failed_class != NULL)
		return true;
	if (nb->connecting)
	{
		NatsLink	link = connect_if_needed(p, nb);

		if (link == NATS_LINK_FAILED)
			return true;
		if (link == NATS_LINK_PENDING)
		{
			if (GetCurrentTimestamp() < nb->w.deadline)
			{
				batch->wake_at = nb->w.deadline;
				return false;
			}
			/* the connector goes on; the next batch takes its result */
			nb->failed_class = RELAY_CLASS_CONNECTION;
			snprintf(nb->failed, sizeof(nb->failed),
					 "connection: no connection to NATS within the batch's timeout_ms");
			return true;
		}
		nb->connecting = false;
	}
	take_answers(p, batch, nb);
	if (!connected(p))
		nb->lost = true;
	old = MemoryContextSwitchTo(batch->cxt);
	while (!nb->lost && (i = RelaySendWindowNext(&nb->w)) >= 0)
		publish(p, batch, nb, i);
	MemoryContextSwitchTo(old);
	if (nb->lost)
		nb->w.stopped = true;
	if (RelaySendWindowFinished(&nb->w))
		return true;
	if (nb->lost || GetCurrentTimestamp() >= nb->w.deadline)
	{
		reclaim(p, batch, nb);
		return true;
	}
	batch->wake_at = nb->w.deadline;
	return false;
}

static void
nats_outcomes(void *state, RelaySinkBatch *batch, RelayDeliveryResult *result)
{
	NatsPipeline *p = state;
	NatsBatch  *nb = batch->sink_private;

	for (int i = 0; i < batch->nmsgs; i++)
	{
		RelayMessageOutcome *o = &result->each[i];

		if (nb->failed_class != NULL)
		{
			RelaySetFailure(o, RELAY_UNREACHABLE, nb->failed_class, 0, nb->failed);
			continue;
		}
		switch (nb->w.state[i])
		{
			case RELAY_SEND_ACKED:
			case RELAY_SEND_FAILED:
				*o = nb->each[i];
				o->wait_ms = -1;
				break;
			case RELAY_SEND_IN_FLIGHT:
				o->latency_ms = (GetCurrentTimestamp() - nb->sent_at[i]) / 1000.0;
				if (nb->lost)
					RelaySetFailure(o, RELAY_UNREACHABLE, RELAY_CLASS_CONNECTION, 0,
									"connection: the connection to NATS was lost before the acknowledgement");
				else
					RelaySetFailure(o, RELAY_RETRYABLE, RELAY_CLASS_TIMEOUT, 0,
									"timeout: no acknowledgement from JetStream within the batch's timeout_ms");
				break;
			case RELAY_SEND_SKIPPED:
				RelaySendWindowNotSent(&nb->w, i, o);
				break;
			case RELAY_SEND_WAITING:
				RelaySetFailure(o, RELAY_NOT_SENT, "not_sent", 0,
								nb->lost ? "not sent: the connection to NATS was lost" :
								"not sent: an earlier failure or the batch's timeout_ms came first");
				break;
		}
	}
	p->batch = NULL;
}

static void
nats_cancel(void *state, RelaySinkBatch *batch)
{
	NatsPipeline *p = state;
	NatsBatch  *nb = batch->sink_private;

	if (nb != NULL && nb->failed_class == NULL)
		reclaim(p, batch, nb);
	p->batch = NULL;
}

/*
 * Ends the pipeline: no callback of a nats.c thread touches anything but
 * the shared part once `closed` is set, and that part is left allocated
 * for a callback still running.
 */
static void
nats_close(void *state)
{
	NatsPipeline *p = state;
	natsConnection *made;

	pthread_mutex_lock(&p->shared->lock);
	p->shared->closed = true;
	/* made by the connector and not taken; a connector still at work drops its own */
	made = p->shared->connect_nc;
	p->shared->connect_nc = NULL;
	free(p->shared->answers);
	p->shared->answers = NULL;
	p->shared->nanswers = p->shared->room = 0;
	RelayNotifierClose(&p->shared->notifier);
	pthread_mutex_unlock(&p->shared->lock);
	if (made != NULL)
		natsConnection_Destroy(made);
	disconnect(p);
}

/* A string member of a validated object, or NULL. */
static char *
string_or_null(const cJSON *obj, const char *key)
{
	const cJSON *v = RelayConfigMember(obj, key);

	return cJSON_IsString(v) ? pstrdup(v->valuestring) : NULL;
}

static bool
nats_open(const cJSON *config, RelaySinkOpened *opened)
{
	NatsPipeline *p = palloc0(sizeof(NatsPipeline));
	const cJSON *servers = RelayConfigMember(config, "servers");
	const cJSON *auth = RelayConfigMember(config, "auth");
	const cJSON *tls = RelayConfigMember(config, "tls");
	const cJSON *s;
	char	   *error = NULL;
	int			n = 0;

	if (!cJSON_IsArray(servers) || !cJSON_IsString(RelayConfigMember(config, "subject")))
	{
		opened->error = "its config has no \"servers\" or \"subject\"";
		return false;
	}
	p->servers = palloc(sizeof(char *) * Max(cJSON_GetArraySize(servers), 1));
	cJSON_ArrayForEach(s, servers)
		if (cJSON_IsString(s))
		p->servers[n++] = pstrdup(s->valuestring);
	p->nservers = n;
	p->subject = RelayConfigString(config, "subject");
	p->stream = string_or_null(config, "stream");
	p->max_in_flight = RelayConfigIntOr(config, "max_in_flight", 100);
	p->timeout_ms = RelayConfigIntOr(config, "timeout_ms", 10000);
	p->envelope = RelayConfigStringIs(config, "body", "envelope");
	RelayCloudEventsOpen(config, &p->ce);
	p->username = string_or_null(auth, "username");
	p->credentials_file = string_or_null(auth, "credentials_file");
	p->tls = cJSON_IsObject(tls);
	p->ca_file = string_or_null(tls, "ca_file");
	p->cert_file = string_or_null(tls, "cert_file");
	p->key_file = string_or_null(tls, "key_file");
	p->verify = !RelayConfigIs(tls, "verify", false);
	opened->longest_batch_seconds = (p->timeout_ms + NATS_CONNECT_TIMEOUT_MS + 999) / 1000;
	opened->read_secrets = cJSON_IsObject(RelayConfigMember(auth, "password")) ||
		cJSON_IsObject(RelayConfigMember(auth, "token"));
	if (!RelayBrokerCredential(RelayConfigMember(auth, "password"), &p->password, &error) ||
		!RelayBrokerCredential(RelayConfigMember(auth, "token"), &p->token, &error))
	{
		opened->error = error;
		return false;
	}

	p->shared = calloc(1, sizeof(NatsShared));
	if (p->shared == NULL)
	{
		opened->error = "out of memory";
		return false;
	}
	pthread_mutex_init(&p->shared->lock, NULL);
	if (!RelayNotifierOpen(&p->shared->notifier, notified, p))
	{
		opened->error = "cannot open an eventfd for nats.c's callbacks";
		return false;
	}
	opened->state = p;
	return true;
}

/* The routine and init symbol of the NATS JetStream sink, a module (endpoints/registry.h). */
RELAY_BROKER_SINK_ENDPOINT(nats, RelayNatsConfigKeys, RelayNatsValidate,
					.sends_on_own_threads = true);
