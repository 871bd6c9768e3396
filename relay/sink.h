/*
 * sink.h
 *		The interface between the relay's worker loop and its sinks: a batch
 *		of leased messages goes in, success or a failure with its reason
 *		comes out. A sink runs with no transaction open and never raises an
 *		ERROR for a failed delivery: a failure is returned, logged by the
 *		caller, and the batch is delivered again on a later pass.
 */
#ifndef TIDE_SINK_H
#define TIDE_SINK_H

#include "postgres.h"

#include "lib/stringinfo.h"

/* Room for a message identity, or a batch's "<first identity>-<last id>". */
#define RELAY_IDENTITY_SIZE (NAMEDATALEN * 2 + 64)

/* One leased message, copied out of the lease transaction. */
typedef struct RelayMessage
{
	int64		id;
	char	   *payload;		/* jsonb as JSON text */
	char	   *headers;		/* jsonb as JSON text, or NULL */
	char	   *created_at;		/* timestamptz as a JSON string, quotes included */
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
	const char *outbox;			/* names the messages: outbox_<outbox>:<id> */
	union
	{
		RelayFileSinkConfig file;
		RelayWebhookSinkConfig webhook;
	}			u;
} RelaySink;

/*
 * The outcome of delivering one batch. A sink that can acknowledge part of
 * a batch sets acked to the length of the acknowledged prefix; ok means the
 * whole batch was acknowledged.
 */
typedef struct RelayDeliveryResult
{
	bool		ok;
	int			acked;			/* messages acknowledged, from the first */
	bool		permanent;		/* retrying the same request cannot help */
	bool		gone;			/* the receiver answered 410 Gone */
	long		status;			/* HTTP status of the first failure, or 0 */
	long		retry_after_ms; /* the receiver's Retry-After, or -1 */
	int64		failed_id;		/* first message that failed, or 0 */
	char		error_class[32];	/* http_status, timeout, connection, blocked_ssrf, ... */
	char		error[256];		/* why it failed, when !ok */
} RelayDeliveryResult;

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
	memset(result, 0, sizeof(*result));
	result->retry_after_ms = -1;
	if (strcmp(sink->sink_type, "file") == 0)
	{
		RelayFileSinkDeliver(sink, msgs, nmsgs, result);
		result->acked = result->ok ? nmsgs : 0;
	}
	else if (strcmp(sink->sink_type, "webhook") == 0)
		RelayWebhookSinkDeliver(sink, msgs, nmsgs, result);
	else
		snprintf(result->error, sizeof(result->error),
				 "sink type \"%s\" cannot deliver yet", sink->sink_type);
}

/* message.c */
extern void RelayMessageIdentity(char *buf, size_t size, const char *outbox, int64 id);
extern void RelayAppendMessageJson(StringInfo buf, const char *outbox, const RelayMessage *m);

#endif							/* TIDE_SINK_H */
