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

/* What a pipeline delivers to. */
typedef struct RelaySink
{
	const char *sink_type;
	const char *outbox;			/* names the messages: outbox_<outbox>:<id> */
	union
	{
		RelayFileSinkConfig file;
	}			u;
} RelaySink;

/* The outcome of delivering one batch. */
typedef struct RelayDeliveryResult
{
	bool		ok;
	char		error[256];		/* why it failed, when !ok */
} RelayDeliveryResult;

/* sink_file.c */
extern void RelayFileSinkDeliver(const RelaySink *sink, const RelayMessage *msgs,
								 int nmsgs, RelayDeliveryResult *result);

/* Delivers a batch to the sink it names; the dispatch of every sink type. */
static inline void
RelaySinkDeliver(const RelaySink *sink, const RelayMessage *msgs, int nmsgs,
				 RelayDeliveryResult *result)
{
	result->ok = false;
	result->error[0] = '\0';
	if (strcmp(sink->sink_type, "file") == 0)
		RelayFileSinkDeliver(sink, msgs, nmsgs, result);
	else
		snprintf(result->error, sizeof(result->error),
				 "sink type \"%s\" cannot deliver yet", sink->sink_type);
}

#endif							/* TIDE_SINK_H */
