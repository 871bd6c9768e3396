/*
 * sink.h
 *		The interface between the relay's worker loop and its sinks: a batch
 *		of messages goes in, an outcome for each message comes out. A sink
 *		runs with no transaction open and never raises an ERROR for a failed
 *		delivery: a failure is returned as data, and the worker decides
 *		whether the message is retried, dead-lettered or leased again.
 */
#ifndef TIDE_SINK_H
#define TIDE_SINK_H

#include "postgres.h"

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
} RelayMessage;

/* A file pipeline's settings, from its config. */
typedef struct RelayFileSinkConfig
{
	char	   *path;
	bool		fsync;
} RelayFileSinkConfig;

/* A webhook pipeline's settings, from its config. */
typedef struct RelayWebhookSinkConfig
{
	char	   *url;
	bool		batch_mode;		/* mode 'batch': one JSON array per request */
	int			max_in_flight;
	int			timeout_ms;		/* bounds the whole batch */
	char	   *headers;		/* custom "Name: value" lines, '\n'-separated, or NULL */
	char	   *secrets;		/* base64 after whsec_, space-separated, or NULL */
	bool		pg_tide_signature;	/* signature 'pg-tide' rather than 'standard' */
	bool		allow_http;
	bool		allow_private_network;
} RelayWebhookSinkConfig;

/* What a pipeline delivers to. */
typedef struct RelaySink
{
	const char *sink_type;
	bool		stop_at_failure;	/* ordering 'strict': send nothing after a failure */
	union
	{
		RelayFileSinkConfig file;
		RelayWebhookSinkConfig webhook;
	}			u;
} RelaySink;

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
	RELAY_RETRYABLE,			/* 408, 425, 429, 5xx, a timeout: try again later */
	RELAY_PERMANENT,			/* any other answer: trying again cannot help */
	RELAY_UNREACHABLE,			/* the destination's failure, not the message's */
	RELAY_FILTERED				/* not for this pipeline (its routing): passed over */
} RelayOutcome;

typedef struct RelayMessageOutcome
{
	RelayOutcome outcome;
	double		latency_ms;		/* from sending to the answer or the failure */
	const char *response;		/* the answer's first bytes, raw, or NULL */
	long		status;			/* HTTP status, or 0 */
	long		retry_after_ms; /* the receiver's Retry-After, or -1 */
	char		error_class[32];	/* http_4xx, http_5xx, timeout, connection, blocked_ssrf, ... */
	char		error[256];		/* why it failed */
} RelayMessageOutcome;

/*
 * The outcome of delivering a batch: one entry per message in `each`
 * (allocated by RelaySinkDeliver), the acknowledged prefix, and whether the
 * receiver answered 410 Gone. A sink that waits asks RelayWorkerShouldStop
 * (below) between waits; when it says yes, the sink stops waiting,
 * releases what it holds and sets `abandoned`: the worker then records
 * nothing of the batch and leaves (the lease sends it again).
 */
typedef struct RelayDeliveryResult
{
	RelayMessageOutcome *each;
	int			delivered;		/* messages acknowledged */
	int			acked;			/* length of the acknowledged prefix */
	bool		gone;			/* the receiver answered 410 Gone */
	bool		abandoned;		/* the worker must stop: the outcomes mean nothing */
} RelayDeliveryResult;

/* Sets one message's failure. */
static inline void
RelaySetFailure(RelayMessageOutcome *o, RelayOutcome outcome, const char *error_class,
				long status, const char *error)
{
	o->outcome = outcome;
	o->status = status;
	strlcpy(o->error_class, error_class, sizeof(o->error_class));
	strlcpy(o->error, error, sizeof(o->error));
}

/*
 * worker.c: whether the worker must stop (the relay switched off, a pause);
 * a sink that waits asks it between waits.
 */
extern bool RelayWorkerShouldStop(void);

/* sink_file.c */
extern void RelayFileSinkDeliver(const RelaySink *sink, const RelayMessage *msgs,
								 int nmsgs, RelayDeliveryResult *result);

/* sink_webhook.c */
extern void RelayWebhookSinkDeliver(const RelaySink *sink, const RelayMessage *msgs,
									int nmsgs, RelayDeliveryResult *result);

/* Delivers a batch to the sink it names; the dispatch of every sink type. */
static inline void
RelaySinkDeliver(const RelaySink *sink, const RelayMessage *msgs, int nmsgs,
				 RelayDeliveryResult *result)
{
	int			i;

	memset(result, 0, sizeof(*result));
	result->each = palloc0(sizeof(RelayMessageOutcome) * Max(nmsgs, 1));
	for (i = 0; i < nmsgs; i++)
		result->each[i].retry_after_ms = -1;
	if (strcmp(sink->sink_type, "file") == 0)
		RelayFileSinkDeliver(sink, msgs, nmsgs, result);
	else if (strcmp(sink->sink_type, "webhook") == 0)
		RelayWebhookSinkDeliver(sink, msgs, nmsgs, result);
	else
		for (i = 0; i < nmsgs; i++)
			RelaySetFailure(&result->each[i], RELAY_UNREACHABLE, "internal", 0,
							"this sink type cannot deliver yet");
	result->delivered = result->acked = 0;
	for (i = 0; i < nmsgs; i++)
		if (result->each[i].outcome == RELAY_DELIVERED)
		{
			result->delivered++;
			if (result->acked == i)
				result->acked++;
		}
}

/*
 * clean_text.c: text from outside (an answer, an error built around it) as
 * the database can store it; no palloc, no ERROR.
 */
extern size_t RelayCleanText(char *dst, size_t dstsize, const char *src, size_t srclen);

/* message.c */
extern void RelayMessageIdentity(char *buf, size_t size, const char *outbox, int64 id);
extern void RelayAppendMessageJson(StringInfo buf, const RelayMessage *m);

#endif							/* TIDE_SINK_H */
