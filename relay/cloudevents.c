/*
 * cloudevents.c
 *		A message as a CloudEvent 1.0, for sinks whose pipeline config says
 *		"format": "cloudevents", and the W3C trace context headers given at
 *		publish, which every sink with headers carries in every format.
 *
 * The mapping (docs/cloudevents.md):
 *	id				the message header named by "id_header" when it is a
 *					non-empty string, else the message's identity
 *					outbox_<outbox>:<id>, which stays the same across retries
 *	source			"source", else /pg_tide/<database>/<outbox>
 *	specversion		1.0
 *	type			the header named by "type_header" ("type"), else "type",
 *					else pg_tide.<outbox>
 *	time			the message's created_at (RFC 3339)
 *	subject			the header named by "subject_header" ("subject"), else
 *					the ordering key when the pipeline orders by key, else none
 *	datacontenttype application/json
 *	data			the payload
 *	traceparent, tracestate  the message's headers of those names, in
 *					structured mode (the Distributed Tracing extension)
 *
 * Everything after validation runs in a sink's `start` (no transaction,
 * no ERROR for a failure): it reads only what validation passed.
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/dbcommands.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/json.h"

#include "cloudevents.h"
#include "config_value.h"

/* The longest attribute value a config gives (a source, a type). */
#define CE_MAX_CONFIG_VALUE 1024

/* Refuses a config string that is not a non-empty string of printable characters. */
static void
check_text(const char *key, const cJSON *v, const char *hint)
{
	RelayConfigCheckType(key, v, "string", hint);
	if (v->valuestring[0] == '\0' || strlen(v->valuestring) > CE_MAX_CONFIG_VALUE)
		RelayConfigError(hint, "config key \"%s\" must be a non-empty string of at most %d bytes",
						 key, CE_MAX_CONFIG_VALUE);
	for (const unsigned char *p = (const unsigned char *) v->valuestring; *p; p++)
		if (*p < 0x20 || *p == 0x7f)
			RelayConfigError(hint, "config key \"%s\" must not contain control characters", key);
}

/* Validates and normalises a config's "format" and "cloudevents" (cloudevents.h). */
void
RelayConfigCheckCloudEvents(const cJSON *config, cJSON *out, const char *binary_refusal)
{
	static const char *const formats[] = {"native", "cloudevents", NULL};
	static const char *const keys[] = {
		"mode", "source", "type", "type_header", "subject_header", "id_header", NULL
	};
	const cJSON *ce = cJSON_GetObjectItemCaseSensitive(config, "cloudevents");
	const char *format = RelayConfigChoice(config, "format", formats, "native");
	const cJSON *mode;
	const cJSON *v;
	cJSON	   *ce_out;

	if (strcmp(format, "native") == 0)
	{
		if (ce != NULL)
			RelayConfigError("Set \"format\": \"cloudevents\" to send CloudEvents, or remove \"cloudevents\".",
							 "config key \"cloudevents\" is given without \"format\": \"cloudevents\"");
		/* absent means native: configs written before formats read the same */
		return;
	}
	if (RelayConfigStringIs(config, "body", "envelope"))
		RelayConfigError("With \"format\": \"cloudevents\" the body is the event (structured) or the payload (binary): remove \"body\".",
						 "config key \"body\" cannot be \"envelope\" with \"format\": \"cloudevents\"");
	RelayConfigAddString(out, "format", format);
	ce_out = RelayConfigAddObject(out, "cloudevents");
	if (ce == NULL)
	{
		RelayConfigAddString(ce_out, "mode", "structured");
		RelayConfigAddString(ce_out, "type_header", "type");
		RelayConfigAddString(ce_out, "subject_header", "subject");
		return;
	}
	RelayConfigCheckType("cloudevents", ce, "object",
						 "Give \"cloudevents\" as an object such as {\"mode\": \"binary\", \"source\": \"/orders\"}.");
	RelayConfigCheckKeys(ce, keys, NULL, "cloudevents.");
	mode = cJSON_GetObjectItemCaseSensitive(ce, "mode");
	if (mode != NULL)
	{
		const char *hint = "Give \"cloudevents.mode\" as \"structured\" or \"binary\".";

		RelayConfigCheckType("cloudevents.mode", mode, "string", hint);
		if (strcmp(mode->valuestring, "structured") != 0 && strcmp(mode->valuestring, "binary") != 0)
			RelayConfigError(hint, "config key \"cloudevents.mode\" has an invalid value: \"%s\"",
							 mode->valuestring);
		if (strcmp(mode->valuestring, "binary") == 0 && binary_refusal != NULL)
			RelayConfigError(binary_refusal,
							 "config key \"cloudevents.mode\" cannot be \"binary\" for this sink");
	}
	RelayConfigAddString(ce_out, "mode", mode ? mode->valuestring : "structured");
	if ((v = cJSON_GetObjectItemCaseSensitive(ce, "source")) != NULL)
	{
		check_text("cloudevents.source", v,
				   "Give \"cloudevents.source\" as a URI reference such as \"/orders\" or "
				   "\"https://example.com/shop\", or leave it out for /pg_tide/<database>/<outbox>.");
		RelayConfigAddCopy(ce_out, "source", v);
	}
	if ((v = cJSON_GetObjectItemCaseSensitive(ce, "type")) != NULL)
	{
		check_text("cloudevents.type", v,
				   "Give \"cloudevents.type\" as a string such as \"com.example.order.created\".");
		RelayConfigAddCopy(ce_out, "type", v);
	}
	if ((v = cJSON_GetObjectItemCaseSensitive(ce, "type_header")) != NULL)
		RelayConfigCheckHeaderName("cloudevents.type_header", v,
								   "Give \"cloudevents.type_header\" as the name of a message header, such as \"type\".");
	RelayConfigAddString(ce_out, "type_header", v ? v->valuestring : "type");
	if ((v = cJSON_GetObjectItemCaseSensitive(ce, "subject_header")) != NULL)
		RelayConfigCheckHeaderName("cloudevents.subject_header", v,
								   "Give \"cloudevents.subject_header\" as the name of a message header, such as \"subject\".");
	RelayConfigAddString(ce_out, "subject_header", v ? v->valuestring : "subject");
	if ((v = cJSON_GetObjectItemCaseSensitive(ce, "id_header")) != NULL)
	{
		RelayConfigCheckHeaderName("cloudevents.id_header", v,
								   "Give \"cloudevents.id_header\" as the name of a message header, such as \"event_id\".");
		RelayConfigAddCopy(ce_out, "id_header", v);
	}
}

/* Reads a validated config's CloudEvents settings; returns the mode. */
RelayCloudEventsMode
RelayCloudEventsOpen(const cJSON *config, RelayCloudEvents *ce)
{
	const cJSON *obj = RelayConfigMember(config, "cloudevents");

	memset(ce, 0, sizeof(*ce));
	if (!RelayConfigStringIs(config, "format", "cloudevents") || !cJSON_IsObject(obj))
		return RELAY_CE_NONE;
	ce->mode = RelayConfigStringIs(obj, "mode", "binary") ? RELAY_CE_BINARY : RELAY_CE_STRUCTURED;
	ce->source = RelayConfigString(obj, "source");
	ce->type = RelayConfigString(obj, "type");
	ce->type_header = RelayConfigString(obj, "type_header");
	ce->subject_header = RelayConfigString(obj, "subject_header");
	ce->id_header = RelayConfigString(obj, "id_header");
	ce->database = IsTransactionState() ? get_database_name(MyDatabaseId) : NULL;
	if (ce->database == NULL)
		ce->database = pstrdup("");
	return ce->mode;
}

/* The message's header `name` when it is a non-empty string, else NULL. */
static const char *
string_header(const cJSON *headers, const char *name)
{
	const cJSON *h;

	if (name == NULL || headers == NULL)
		return NULL;
	h = cJSON_GetObjectItemCaseSensitive(headers, name);
	return cJSON_IsString(h) && h->valuestring[0] != '\0' ? h->valuestring : NULL;
}

/* The W3C trace context headers, in the order they are passed on. */
static const char *const trace_headers[] = {"traceparent", "tracestate", NULL};

/* Whether a value is printable ASCII, as a header of any protocol can carry it. */
static bool
printable_ascii(const char *s)
{
	for (const unsigned char *p = (const unsigned char *) s; *p; p++)
		if (*p < 0x20 || *p > 0x7e)
			return false;
	return s[0] != '\0';
}

/* Calls cb with each trace context header of a message's parsed headers. */
static void
each_trace_header(const cJSON *headers, RelayCloudEventsCallback cb, void *arg)
{
	const char *v;

	for (const char *const *t = trace_headers; *t; t++)
		if ((v = string_header(headers, *t)) != NULL && printable_ascii(v))
			cb(*t, v, arg);
}

/*
 * Calls cb with each attribute of m; the message's headers are parsed
 * once for all. with_trace: the trace context attributes too (structured).
 */
static void
for_each_attribute(const RelayCloudEvents *ce, const RelayMessage *m, bool with_trace,
				   RelayCloudEventsCallback cb, void *arg)
{
	cJSON	   *headers = m->headers ? cJSON_Parse(m->headers) : NULL;
	char		identity[RELAY_IDENTITY_SIZE];
	StringInfoData s;
	const char *v;

	initStringInfo(&s);
	if ((v = string_header(headers, ce->id_header)) == NULL)
	{
		RelayMessageIdentity(identity, sizeof(identity), m->outbox, m->id);
		v = identity;
	}
	cb("id", v, arg);
	if (ce->source != NULL)
		cb("source", ce->source, arg);
	else
	{
		appendStringInfo(&s, "/pg_tide/%s/%s", ce->database, m->outbox);
		cb("source", s.data, arg);
	}
	cb("specversion", "1.0", arg);
	if ((v = string_header(headers, ce->type_header)) == NULL && (v = ce->type) == NULL)
	{
		resetStringInfo(&s);
		appendStringInfo(&s, "pg_tide.%s", m->outbox);
		v = s.data;
	}
	cb("type", v, arg);
	if (m->created_at != NULL && m->created_at[0] == '"')
	{
		/* created_at is a JSON string of the ISO 8601 form RFC 3339 takes */
		char	   *created = pnstrdup(m->created_at + 1, strlen(m->created_at) - 2);

		cb("time", created, arg);
		pfree(created);
	}
	if ((v = string_header(headers, ce->subject_header)) != NULL || (v = m->key) != NULL)
		cb("subject", v, arg);
	if (with_trace)
		each_trace_header(headers, cb, arg);
	if (headers)
		cJSON_Delete(headers);
	pfree(s.data);
}

/* Calls cb with each context attribute of m, for a binary binding. */
void
RelayCloudEventsForEachAttribute(const RelayCloudEvents *ce, const RelayMessage *m,
								 RelayCloudEventsCallback cb, void *arg)
{
	for_each_attribute(ce, m, false, cb, arg);
}

/* RelayCloudEventsCallback: appends one attribute as a JSON member. */
static void
append_member(const char *name, const char *value, void *arg)
{
	StringInfo	buf = arg;

	if (buf->data[buf->len - 1] != '{')
		appendStringInfoString(buf, ", ");
	escape_json(buf, name);
	appendStringInfoString(buf, ": ");
	escape_json(buf, value);
}

/* Appends m as a structured CloudEvent. */
void
RelayCloudEventsAppendJson(StringInfo buf, const RelayCloudEvents *ce, const RelayMessage *m)
{
	appendStringInfoChar(buf, '{');
	for_each_attribute(ce, m, true, append_member, buf);
	appendStringInfoString(buf, ", \"datacontenttype\": \"" RELAY_CE_DATA_CONTENT_TYPE "\", \"data\": ");
	appendStringInfoString(buf, m->payload ? m->payload : "null");
	appendStringInfoChar(buf, '}');
}

/* Calls cb with the trace context headers given at publish. */
void
RelayForEachTraceHeader(const RelayMessage *m, RelayCloudEventsCallback cb, void *arg)
{
	cJSON	   *headers;

	/* most messages carry no trace context: no parse for them */
	if (m->headers == NULL || strstr(m->headers, "trace") == NULL ||
		(headers = cJSON_Parse(m->headers)) == NULL)
		return;
	each_trace_header(headers, cb, arg);
	cJSON_Delete(headers);
}

/* Appends the body a broker sends for m in the pipeline's format. */
void
RelayCloudEventsAppendBody(StringInfo body, const RelayCloudEvents *ce, const RelayMessage *m,
						   bool envelope)
{
	if (ce->mode == RELAY_CE_STRUCTURED)
		RelayCloudEventsAppendJson(body, ce, m);
	else if (ce->mode == RELAY_CE_NONE && envelope)
		RelayAppendMessageJson(body, m);
	else
		appendStringInfoString(body, m->payload ? m->payload : "null");
}

/* The content type of the format, or NULL for the native one. */
const char *
RelayCloudEventsContentType(const RelayCloudEvents *ce)
{
	if (ce->mode == RELAY_CE_STRUCTURED)
		return RELAY_CE_CONTENT_TYPE;
	return ce->mode == RELAY_CE_BINARY ? RELAY_CE_DATA_CONTENT_TYPE : NULL;
}

/* A callback and the prefix it puts before each attribute's name. */
typedef struct PrefixedCallback
{
	const char *prefix;
	RelayCloudEventsCallback cb;
	void	   *arg;
} PrefixedCallback;

/* RelayCloudEventsCallback: calls the wrapped one with the name prefixed. */
static void
call_prefixed(const char *name, const char *value, void *arg)
{
	PrefixedCallback *p = arg;
	char	   *prefixed = psprintf("%s%s", p->prefix, name);

	p->cb(prefixed, value, p->arg);
	pfree(prefixed);
}

/* Calls cb with the headers a broker binding adds for m. */
void
RelayCloudEventsForEachHeader(const RelayCloudEvents *ce, const RelayMessage *m, const char *prefix,
							  const char *content_type_header, RelayCloudEventsCallback cb, void *arg)
{
	PrefixedCallback p = {prefix, cb, arg};

	if (ce->mode == RELAY_CE_BINARY)
		for_each_attribute(ce, m, false, call_prefixed, &p);
	if (content_type_header != NULL && ce->mode != RELAY_CE_NONE)
		cb(content_type_header, RelayCloudEventsContentType(ce), arg);
}
