/*
 * sink.h
 *		The interface between the relay's worker loop and its sinks, in the
 *		manner of PostgreSQL's FdwRoutine: each sink type is a table of
 *		callbacks (RelaySinkRoutine) that the loop calls through, and never
 *		names an implementation. A new sink is a folder,
 *		relay/endpoints/<name>/, whose init symbol registers its routine
 *		(relay/endpoints/registry.h); a broker's sink is a module of its own
 *		(relay/broker.h).
 *
 * A pipeline's life: `open` turns its config into the sink's own state
 * (a struct private to the sink's file), kept for as long as the worker
 * serves that reading of the pipeline. A batch is then an operation in
 * flight: `start` sends it, `progress` is called right after it and then
 * whenever the sockets or timers the sink registered with the worker's wait
 * (events.h) are ready or the batch's wake_at has come, until it says the
 * batch is finished;
 * `outcomes` then reports what became of each message. `cancel` abandons
 * a batch in flight: the worker stops, a cancel, an ERROR. `close` ends
 * the pipeline's state.
 *
 * Everything from `start` to `outcomes` runs with no transaction open and
 * never raises an ERROR for a failed delivery: a failure is data, and the
 * worker decides whether the message is retried, dead-lettered or leased
 * again. `cancel` and `close` never raise an ERROR either: they run on the
 * way out of one.
 */
#ifndef TIDE_SINK_H
#define TIDE_SINK_H

#include "postgres.h"

#include <cjson/cJSON.h>

#include "datatype/timestamp.h"
#include "lib/stringinfo.h"

/* Room for a message identity, or a batch's "<first identity>-<last id>". */
#define RELAY_IDENTITY_SIZE (NAMEDATALEN * 2 + 64)

/*
 * One message to deliver: leased from the outbox, or taken from the
 * pipeline's retry queue (then attempts counts its failed attempts so far).
 */
typedef struct RelayMessage
{
	int64		id;
	const char *outbox;			/* names it: outbox_<outbox>:<id> */
	char	   *payload;		/* jsonb as JSON text */
	char	   *headers;		/* jsonb as JSON text, or NULL */
	char	   *created_at;		/* timestamptz as a JSON string, quotes included */
	int			attempts;		/* failed attempts before this one */
	bool		manual;			/* queued again by an operator (relay_dlq_retry) */
	char	   *key;			/* ordering 'key': its ordering key, or NULL: none */
	bool		blocked;		/* ordering 'key': an earlier message of its key
								 * waits in the retry queue, so it is parked */
	bool		expired;		/* its expires_at had passed when it was leased
								 * or taken from the retry queue: never sent */
} RelayMessage;

/*
 * What became of one message. A failure is either the message's own (the
 * receiver answered it, or it timed out once sent) or the destination's
 * (nothing could be sent: the name did not resolve, the connection was
 * refused, the address is not allowed, the file cannot be written), which
 * says nothing about the message.
 */
typedef enum RelayOutcome
{
	RELAY_NOT_SENT = 0,			/* not attempted: a failure came first */
	RELAY_DELIVERED,			/* acknowledged */
	RELAY_RETRYABLE,			/* the destination asks to try again later */
	RELAY_PERMANENT,			/* trying again cannot help */
	RELAY_UNREACHABLE,			/* the destination's failure, not the message's */
	RELAY_FILTERED,				/* not for this pipeline (its routing): passed over */
	RELAY_EXPIRED				/* expired before it was sent: dead-lettered, never sent */
} RelayOutcome;

typedef struct RelayMessageOutcome
{
	RelayOutcome outcome;
	double		latency_ms;		/* from sending to the answer or the failure */
	const char *response;		/* the answer's first bytes, raw, or NULL */
	long		response_code;	/* the destination's code for its answer (an HTTP
								 * status), or 0 */
	long		wait_ms;		/* how long the destination asked to be left
								 * alone before another attempt, or -1 */
	char		error_class[32];	/* http_4xx, http_5xx, timeout, connection, blocked_ssrf, ... */
	char		error[256];		/* why it failed */
} RelayMessageOutcome;

/*
 * The outcome of delivering a batch: one entry per message in `each`, the
 * acknowledged prefix, and whether the destination asks that the pipeline
 * be disabled (a webhook's 410 Gone), with a reason the worker logs.
 */
typedef struct RelayDeliveryResult
{
	RelayMessageOutcome *each;
	int			delivered;		/* messages acknowledged */
	int			acked;			/* length of the acknowledged prefix */
	bool		disable;		/* the destination asks to be disabled */
	char		disable_reason[128];
} RelayDeliveryResult;

/*
 * A batch in flight, as the worker hands it to its sink. The messages and
 * everything the sink allocates for the batch live in `cxt`, which the
 * worker deletes after `outcomes` or `cancel`: nothing the sink leaves
 * registered anywhere (a curl handle, a callback) may point into it then.
 */
typedef struct RelaySinkBatch
{
	const RelayMessage *msgs;
	int			nmsgs;
	bool		stop_at_failure;	/* ordering 'strict': send nothing after a failure */
	/*
	 * Ordering 'key': after[i] is the message that msgs[i] waits for (the
	 * previous one of its key), -1 none. msgs[i] is sent only once that one
	 * was delivered, and not at all (RELAY_NOT_SENT) when it failed or was
	 * not sent. NULL: no message waits for another.
	 */
	const int  *after;
	MemoryContext cxt;
	/* set by the sink */
	bool		ready;			/* something happened: `progress` is due */
	TimestampTz wake_at;		/* call `progress` by then even if nothing happens; 0: no need */
	void	   *sink_private;	/* the sink's own state of the batch */
} RelaySinkBatch;

/* What `open` tells the worker about a pipeline's sink, besides its state. */
typedef struct RelaySinkOpened
{
	const char *pipeline;		/* set by the worker before `open`: the
								 * pipeline's name */
	void	   *state;			/* the sink's state of the pipeline */
	int			longest_batch_seconds;	/* the longest a batch can take: the
										 * lease outlasts it */
	bool		retry_at_once;	/* a failure is tried again at the next look,
								 * without back-off (a file) */
	bool		read_secrets;	/* the config refers to secrets, which `open`
								 * read (secrets.c): a failure to read them is
								 * recorded as the pipeline's error, and a
								 * success clears it */
	const char *error;			/* when `open` fails: why the pipeline is passed over */
} RelaySinkOpened;

typedef struct RelaySinkRoutine
{
	const char *name;			/* sink_type in a pipeline's config */
	const char *const *config_keys; /* the keys of the config it reads, NULL-ended */

	/*
	 * The keys whose values are secrets, NULL-ended (NULL: none): every
	 * output of a config redacts them (relay/endpoints/redact.c). "a.b" is
	 * member b of object a; "a.*" is each member of object a whose name
	 * says it carries a credential (auth, token, secret, key, passw, ...),
	 * or that is an object marked {"secret": true}.
	 */
	const char *const *secret_keys;
	bool		log_failures_by_default;	/* "attempt_log" defaults to "failures":
											 * the destination keeps what was
											 * delivered (a broker) */
	int			default_batch_size; /* "batch_size" when a config takes it and
									 * gives none; 0: 100 */
	bool		sends_on_own_threads;	/* its library sends and takes answers
										 * on threads of its own (librdkafka,
										 * nats.c), not in the worker's loop:
										 * "overlap_batches" defaults to true
										 * (flow_forward.c's lease_ahead) */

	/*
	 * Reads the sink's keys of a user's config object; raises an ERROR
	 * (SQLSTATE 22023, with a hint) on bad input; adds the sink's keys with
	 * defaults filled in to `out`. The only validator of the sink's keys:
	 * tide.relay_set_outbox, the row trigger and the worker run it
	 * (pipeline_config.c), so `open` reads only what it passed.
	 */
	void		(*validate) (const cJSON *config, cJSON *out);

	/*
	 * The sink's state of a pipeline from its config, which `validate` has
	 * passed and normalised, allocated in the current memory context;
	 * false, with opened->error, when the pipeline cannot be served now (a
	 * secret reference that cannot be read).
	 */
	bool		(*open) (const cJSON *config, RelaySinkOpened *opened);

	/* Starts delivering a batch; never raises an ERROR for a failure. */
	void		(*start) (void *state, RelaySinkBatch *batch);

	/* Moves a batch on; true when it is finished. Never raises an ERROR. */
	bool		(*progress) (void *state, RelaySinkBatch *batch);

	/*
	 * The outcome of each message of a finished batch (result->each holds
	 * nmsgs entries, zeroed, wait_ms -1), and releases what the batch held.
	 */
	void		(*outcomes) (void *state, RelaySinkBatch *batch, RelayDeliveryResult *result);

	/* Abandons a batch in flight and releases what it held; never an ERROR. */
	void		(*cancel) (void *state, RelaySinkBatch *batch);

	/* Ends a pipeline's state (no batch in flight); NULL: nothing to do. */
	void		(*close) (void *state);

	/*
	 * Optional: for a sink whose destination is this database (an inbox),
	 * whose `start` and `progress` send nothing and whose `outcomes` report
	 * messages delivered. Writes those delivered messages that the record
	 * settles (nmsgs of them, in id order) inside the transaction that
	 * records the batch, before the pipeline's offset moves over them, so
	 * that they and the offset commit together or not at all. Runs with
	 * SPI connected and a snapshot; may raise an ERROR, which undoes the
	 * record: the batch is then recorded message by message and a message
	 * that cannot be written alone is dead-lettered with error class
	 * "record" (record_each.c), while an ERROR of an environmental class (a
	 * missing destination, 55000) holds the pipeline. NULL: `start` and
	 * `progress` deliver.
	 */
	void		(*store) (void *state, const char *pipeline, const RelayMessage *msgs, int nmsgs);
} RelaySinkRoutine;

/* Sets one message's failure. */
static inline void
RelaySetFailure(RelayMessageOutcome *o, RelayOutcome outcome, const char *error_class,
				long response_code, const char *error)
{
	o->outcome = outcome;
	o->response_code = response_code;
	strlcpy(o->error_class, error_class, sizeof(o->error_class));
	strlcpy(o->error, error, sizeof(o->error));
}

/*
 * clean_text.c: text from outside (an answer, an error built around it) as
 * the database can store it; no palloc, no ERROR.
 */
extern PGDLLEXPORT size_t RelayCleanText(char *dst, size_t dstsize, const char *src, size_t srclen);

/* message.c */
extern PGDLLEXPORT void RelayMessageIdentity(char *buf, size_t size, const char *outbox, int64 id);
extern PGDLLEXPORT void RelayAppendMessageJson(StringInfo buf, const RelayMessage *m);

/* config_read.c: members of a validated pipeline config as the relay reads them. */
extern PGDLLEXPORT const cJSON *RelayConfigMember(const cJSON *obj, const char *key);
extern PGDLLEXPORT char *RelayConfigString(const cJSON *obj, const char *key);
extern PGDLLEXPORT bool RelayConfigStringIs(const cJSON *obj, const char *key, const char *value);
extern PGDLLEXPORT bool RelayConfigIs(const cJSON *obj, const char *key, bool want_true);
extern PGDLLEXPORT double RelayConfigNumberOr(const cJSON *obj, const char *key, double dflt);
extern PGDLLEXPORT int	RelayConfigIntOr(const cJSON *obj, const char *key, int dflt);
extern PGDLLEXPORT char *RelayConfigJsonText(const cJSON *obj, const char *key);

#endif							/* TIDE_SINK_H */
