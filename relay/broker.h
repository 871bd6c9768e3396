/*
 * broker.h
 *		What the sinks of message brokers share (Kafka, NATS JetStream,
 *		Redis Streams, RabbitMQ, MQTT): each is a module of its own
 *		(relay/endpoints/<name>/, loaded by relay/endpoints/registry.c)
 *		that implements sink.h's routine
 *		and uses these, which live in pg_tide.so (relay/broker.c,
 *		relay/send_window.c), so that every broker names, maps, sends and
 *		fails the same way. docs/relay.md describes them for users.
 */
#ifndef TIDE_BROKER_H
#define TIDE_BROKER_H

#include "sink.h"
#include "events.h"

/*
 * Every function here, in config_value.h, sink.h and events.h is marked
 * PGDLLEXPORT: the broker modules call them in pg_tide.so, which
 * PostgreSQL 16 and later build with hidden symbols by default.
 */

/*
 * The headers every broker sink sets where its protocol has headers
 * (Kafka headers, NATS headers, AMQP properties' headers, MQTT 5 user
 * properties), before the message's own headers, each under its name;
 * where it has none, the body is the message's JSON object
 * (RelayAppendMessageJson), which holds all of them.
 */
#define RELAY_HEADER_ID			"tide-id"	/* outbox_<outbox>:<id>: receivers deduplicate by it */
#define RELAY_HEADER_OUTBOX		"tide-outbox"
#define RELAY_HEADER_CREATED_AT "tide-created-at"

/*
 * The error classes of broker failures, in tide.relay_attempts and status.
 * A sink reports each with the outcome beside it:
 *	connection, auth	RELAY_UNREACHABLE: the pipeline is held, nothing dead-lettered
 *	timeout, broker		RELAY_RETRYABLE: tried again with back-off
 *	too_large, unknown_destination, unroutable, refused, template
 *						RELAY_PERMANENT: dead-lettered
 * (except where a broker gives the same answer for a passing state: NATS
 * answers "no responders" both for a subject no stream takes and while
 * it shuts down, so the NATS sink retries that unknown_destination.)
 */
#define RELAY_CLASS_CONNECTION	"connection"	/* broker unreachable, connection lost */
#define RELAY_CLASS_AUTH		"auth"	/* authentication or authorisation refused */
#define RELAY_CLASS_TIMEOUT		"timeout"	/* no acknowledgement in time */
#define RELAY_CLASS_BROKER		"broker"	/* a transient error the broker reported */
#define RELAY_CLASS_TOO_LARGE	"too_large"
#define RELAY_CLASS_UNKNOWN_DESTINATION "unknown_destination"	/* no such topic, stream */
#define RELAY_CLASS_UNROUTABLE	"unroutable"	/* RabbitMQ: no queue bound (mandatory) */
#define RELAY_CLASS_REFUSED		"refused"	/* the broker refused the message for good */
#define RELAY_CLASS_TEMPLATE	"template"	/* its destination template names a header it lacks */

/*
 * Credentials: a config key holding a password, token or other secret is
 * a non-empty string or a reference {"env": "PG_TIDE_..."} / {"file":
 * "..."} read by the worker (secrets.c), and sits in the config's "auth"
 * object, whose secret-named members every output redacts
 * (RelayBrokerSecretKeys). RelayConfigCheckCredential is for validators;
 * RelayBrokerCredential reads one in `open`: the value (palloc'd), or
 * NULL for an absent key; false, with *error, when a reference cannot be
 * read (the pipeline's error, and set opened->read_secrets).
 */
extern PGDLLEXPORT void RelayConfigCheckCredential(const char *key, const cJSON *v);

/*
 * Checks and adds to `out` what most brokers' configs take alike:
 * "max_in_flight" (1 to 10,000, default default_in_flight), "timeout_ms"
 * (min_timeout_ms to 600,000, default 10,000) and "body" ("payload", the
 * default, or "envelope").
 */
extern PGDLLEXPORT void RelayBrokerAddSendSettings(const cJSON *config, cJSON *out,
												   int default_in_flight, int min_timeout_ms);

/* The secret keys of a broker's sink (RelaySinkRoutine): those of "auth". */
extern PGDLLEXPORT const char *const RelayBrokerSecretKeys[];

/*
 * A broker sink's routine and init symbol (RELAY_SINK_ENDPOINT of
 * endpoints/registry.h): failures logged by default (the broker keeps what
 * was delivered), the credentials of "auth" secret, and <type>_close.
 */
#define RELAY_BROKER_SINK_ENDPOINT(type, keys, validator, ...) \
	RELAY_SINK_ENDPOINT(type, keys, validator, \
						.log_failures_by_default = true, \
						.secret_keys = RelayBrokerSecretKeys, \
						.close = type##_close, \
						__VA_ARGS__)
extern PGDLLEXPORT bool RelayBrokerCredential(const cJSON *v, char **value, char **error);

/*
 * "tls": true, false (the default), or {"ca_file", "cert_file", "key_file",
 * "verify"} with absolute file names, a client certificate's file and key
 * together; normalised to false or to the object with "verify" filled in
 * (true unless given). Whether TLS is on.
 */
extern PGDLLEXPORT bool RelayConfigCheckTls(const cJSON *config, cJSON *out);

/*
 * Destination templates such as "orders.{type}": each {name} is the value
 * of the message's header `name` (a string as it is, a number or boolean
 * as its JSON text). RelayConfigCheckTemplate refuses a template that is
 * not a non-empty string of well-formed placeholders (name: letters,
 * digits, "_", "-", "."); RelayBrokerExpand appends the destination of m
 * to out, or returns false with error set (class "template", permanent)
 * when a header is missing, null, an object or an array, or empty.
 */
extern PGDLLEXPORT void RelayConfigCheckTemplate(const char *key, const cJSON *v, const char *hint);
extern PGDLLEXPORT bool RelayBrokerExpand(const char *tmpl, const RelayMessage *m, StringInfo out,
							  char *error, size_t errsize);

/*
 * Calls cb with each header a broker message carries: RELAY_HEADER_ID,
 * RELAY_HEADER_OUTBOX, RELAY_HEADER_CREATED_AT (without quotes), then the
 * message's own headers in their order (a string as it is, any other
 * value as its JSON text). value is valid during the call only.
 */
typedef void (*RelayHeaderCallback) (const char *name, const char *value, void *arg);
extern PGDLLEXPORT void RelayBrokerForEachHeader(const RelayMessage *m, RelayHeaderCallback cb, void *arg);

/*
 * Waking the loop from a client library's own thread (librdkafka, nats.c,
 * libmosquitto's): the thread calls RelayNotifierSignal only (no palloc,
 * no PostgreSQL function; write(2) on an eventfd), and `callback` runs in
 * the loop, which drains the library's results. Open it in `open`
 * (false when it cannot be), close it in `close`.
 *
 * A notifier shared with a thread that may outlive the loop's interest in
 * it (a lookup or a connect still running when its pipeline closes): the
 * loop stops watching it (RelayNotifierStopWatching) and the fd is closed
 * by whichever of the two lets go last (RelayNotifierClose, which then
 * finds no watch: it must not unwatch on a thread of its own).
 */
typedef struct RelayNotifier
{
	int			fd;
	RelayWatch *watch;
} RelayNotifier;

extern PGDLLEXPORT bool RelayNotifierOpen(RelayNotifier *n, RelayFdCallback callback, void *arg);
extern PGDLLEXPORT void RelayNotifierSignal(RelayNotifier *n);
extern PGDLLEXPORT void RelayNotifierDrain(RelayNotifier *n);
extern PGDLLEXPORT void RelayNotifierStopWatching(RelayNotifier *n);
extern PGDLLEXPORT void RelayNotifierClose(RelayNotifier *n);

/*
 * A call that a client library only makes blocking (a connect) runs on a
 * thread of the sink's own: RelayBrokerStartThread starts thread_main(arg)
 * detached, with every signal blocked there (they are the worker's), and
 * returns 0 or pthread_create's error number. The thread follows the rule
 * above (no PostgreSQL function) and hands its result over through a
 * RelayNotifier.
 */
extern PGDLLEXPORT int RelayBrokerStartThread(void *(*thread_main) (void *), void *arg);

/*
 * A connect that a client library makes only blocking, on a thread of its
 * own (connector.c), so that a broker that accepts connections and never
 * answers holds only its own pipeline. arg is the sink's malloc'd struct:
 * the settings the connect needs (copied: the pipeline may close
 * meanwhile) and room for its result. connect(arg) runs on the thread and
 * follows the rule above; done(arg) runs in the loop once it returned,
 * and takes the result; discard(arg) destroys a result nobody took (the
 * connector given up), on either side; release(arg) frees arg, once both
 * let go. RelayConnectorStart returns NULL with error (arg released) when
 * it cannot start; RelayConnectorAbandon gives a connector up (its
 * pipeline closes) until which done has not run.
 */
typedef struct RelayConnector RelayConnector;
typedef void (*RelayConnectorFn) (void *arg);

extern PGDLLEXPORT RelayConnector *RelayConnectorStart(RelayConnectorFn connect, RelayConnectorFn done,
													   RelayConnectorFn discard, RelayConnectorFn release,
													   void *arg, char *error, size_t errsize);
extern PGDLLEXPORT void RelayConnectorAbandon(RelayConnector *c);

/*
 * A broker's host name looked up without blocking the loop
 * (host_lookup.c): client libraries would call getaddrinfo inside their
 * connect, so that a slow or silent name server held every pipeline of
 * the worker. RelayLookupStart looks host up on a thread of its own and
 * calls done(arg) in the loop once it has an answer (NULL, with error,
 * when it cannot start); RelayLookupResult then gives the address as
 * text (an IPv4 one when there is one) or, false, why there is none.
 * RelayLookupEnd forgets a lookup, finished or not, and must be called
 * once for each (a thread still waiting frees it when it returns). A
 * sink connects to the address, and keeps the host name for TLS's
 * server name. RelayHostIsAddress: whether host is an IPv4 or IPv6
 * address already, which needs no lookup.
 */
typedef struct RelayLookup RelayLookup;
typedef void (*RelayLookupDone) (void *arg);

extern PGDLLEXPORT bool RelayHostIsAddress(const char *host);
extern PGDLLEXPORT RelayLookup *RelayLookupStart(const char *host, int port, RelayLookupDone done,
												 void *arg, char *error, size_t errsize);
extern PGDLLEXPORT bool RelayLookupResult(const RelayLookup *l, char *address, size_t size,
										  char *error, size_t errsize);
extern PGDLLEXPORT void RelayLookupEnd(RelayLookup *l);

/*
 * Which messages of a batch may be sent now (send_window.c): at most
 * max_in_flight unacknowledged, in id order, a message that waits for an
 * earlier one of its key (batch->after) only once that one was
 * acknowledged, and never one that could not be acknowledged before the
 * batch's deadline (its last tenth is left to the ones in flight). Every
 * sink that sends messages one by one keeps its batch's state here; a
 * message never sent keeps RELAY_NOT_SENT and is leased again.
 */
typedef enum RelaySendState
{
	RELAY_SEND_WAITING = 0,
	RELAY_SEND_IN_FLIGHT,
	RELAY_SEND_ACKED,
	RELAY_SEND_FAILED,
	RELAY_SEND_SKIPPED			/* never to be sent in this batch */
} RelaySendState;

typedef struct RelaySendWindow
{
	const RelaySinkBatch *batch;
	RelaySendState *state;		/* one per message, in batch->cxt */
	int			max_in_flight;
	int			in_flight;
	int			next;			/* no message before it is WAITING */
	bool		stopped;		/* nothing more is sent (a destination failure) */
	TimestampTz started_at;
	TimestampTz deadline;
	long		timeout_ms;
} RelaySendWindow;

extern PGDLLEXPORT void RelaySendWindowInit(RelaySendWindow *w, RelaySinkBatch *batch,
								int max_in_flight, long timeout_ms);
/* The next message to send now (marked in flight), or -1. */
extern PGDLLEXPORT int	RelaySendWindowNext(RelaySendWindow *w);
/*
 * Message i's answer: acknowledged or not; stop: no more messages are
 * sent (the destination failed, or ordering 'strict' after a failure,
 * which RelaySendWindowDone applies by itself).
 */
extern PGDLLEXPORT void RelaySendWindowDone(RelaySendWindow *w, int i, bool acked, bool stop);
/* Whether nothing is in flight and nothing more will be sent. */
extern PGDLLEXPORT bool RelaySendWindowFinished(RelaySendWindow *w);
/*
 * Sets the outcome of message i, which the batch did not deliver, to
 * not_sent, saying why: the earlier message of its ordering key failed
 * (RELAY_SEND_SKIPPED), or an earlier failure or the batch's timeout_ms
 * came first.
 */
extern PGDLLEXPORT void RelaySendWindowNotSent(const RelaySendWindow *w, int i, RelayMessageOutcome *o);

#endif							/* TIDE_BROKER_H */
