/*
 * cloudevents.h
 *		A pipeline's "format": "cloudevents" (relay/cloudevents.c): what a
 *		sink sends as a CloudEvent 1.0 instead of pg_tide's own message
 *		object, in structured mode (the event's JSON in the body) or binary
 *		mode (the attributes in the protocol's headers, the payload as the
 *		body), and the W3C trace context headers that every sink with
 *		headers carries in every format. docs/cloudevents.md describes the
 *		mapping for users.
 */
#ifndef TIDE_CLOUDEVENTS_H
#define TIDE_CLOUDEVENTS_H

#include "sink.h"

typedef enum RelayCloudEventsMode
{
	RELAY_CE_NONE = 0,			/* "format": "native": pg_tide's message object */
	RELAY_CE_STRUCTURED,
	RELAY_CE_BINARY
} RelayCloudEventsMode;

/* A pipeline's CloudEvents settings, as RelayCloudEventsOpen reads them. */
typedef struct RelayCloudEvents
{
	RelayCloudEventsMode mode;
	char	   *source;			/* "source", or NULL: /pg_tide/<database>/<outbox> */
	char	   *database;		/* the database's name, for the default source */
	char	   *type;			/* "type", or NULL: pg_tide.<outbox> */
	char	   *type_header;	/* a message header whose value is the type */
	char	   *subject_header; /* a message header whose value is the subject */
	char	   *id_header;		/* a message header whose value is the id, or NULL */
} RelayCloudEvents;

/* The content types of structured mode, one event and a batch of them. */
#define RELAY_CE_CONTENT_TYPE		"application/cloudevents+json; charset=utf-8"
#define RELAY_CE_BATCH_CONTENT_TYPE "application/cloudevents-batch+json; charset=utf-8"
/* The datacontenttype of every event: a payload is JSON. */
#define RELAY_CE_DATA_CONTENT_TYPE	"application/json"

/* The config keys that a sink taking a format adds to its own. */
#define RELAY_CE_CONFIG_KEYS "format", "cloudevents"

/* Called with one attribute or header: value is valid during the call only. */
typedef void (*RelayCloudEventsCallback) (const char *name, const char *value, void *arg);

/*
 * Validates "format" ("native", the default, or "cloudevents") and
 * "cloudevents" ({"mode", "source", "type", "type_header",
 * "subject_header", "id_header"}) and adds them, defaults filled in, to
 * out; 22023 with a hint on bad input. binary_refusal: NULL when the sink
 * can send binary mode, else the hint given when a config asks for it.
 */
extern PGDLLEXPORT void RelayConfigCheckCloudEvents(const cJSON *config, cJSON *out,
													const char *binary_refusal);

/*
 * Reads a validated config's format into ce (strings palloc'd in the
 * current context; a transaction is open, as in a sink's `open`); returns
 * its mode.
 */
extern PGDLLEXPORT RelayCloudEventsMode RelayCloudEventsOpen(const cJSON *config, RelayCloudEvents *ce);

/* Appends message m as a structured CloudEvent (JSON object) to buf. */
extern PGDLLEXPORT void RelayCloudEventsAppendJson(StringInfo buf, const RelayCloudEvents *ce,
												   const RelayMessage *m);

/*
 * Calls cb with each context attribute of m under its bare name (id,
 * source, specversion, type, time, then subject when there is one): a
 * binding adds its prefix. datacontenttype is left to the binding, which
 * maps it to the protocol's content type.
 */
extern PGDLLEXPORT void RelayCloudEventsForEachAttribute(const RelayCloudEvents *ce, const RelayMessage *m,
														 RelayCloudEventsCallback cb, void *arg);

/*
 * What a broker's sink sends: RelayCloudEventsAppendBody appends the body
 * of m (the structured event, the payload in binary mode, or else as the
 * sink's "body" says: the message's JSON object when envelope, its
 * payload when not). RelayCloudEventsForEachHeader calls cb with the
 * headers a format adds: in binary mode each attribute under
 * prefix<name>; and when content_type_header is not NULL, that header
 * with the content type (RelayCloudEventsContentType), which is NULL in
 * the native format.
 */
extern PGDLLEXPORT void RelayCloudEventsAppendBody(StringInfo body, const RelayCloudEvents *ce,
												   const RelayMessage *m, bool envelope);
extern PGDLLEXPORT void RelayCloudEventsForEachHeader(const RelayCloudEvents *ce, const RelayMessage *m,
													  const char *prefix, const char *content_type_header,
													  RelayCloudEventsCallback cb, void *arg);
extern PGDLLEXPORT const char *RelayCloudEventsContentType(const RelayCloudEvents *ce);

/*
 * Calls cb with the W3C trace context headers given at publish
 * ("traceparent", "tracestate" among the message's headers) whose values
 * are strings of printable ASCII; any other value is not passed on.
 */
extern PGDLLEXPORT void RelayForEachTraceHeader(const RelayMessage *m, RelayCloudEventsCallback cb, void *arg);

#endif							/* TIDE_CLOUDEVENTS_H */
