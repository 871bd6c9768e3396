/*
 * message.c
 *		How every sink writes a message: its stable identity
 *		outbox_<outbox>:<id>, which receivers deduplicate by, and its JSON
 *		object {"id", "outbox", "message_id", "payload", "headers",
 *		"created_at"}. One place, so that a file line and a webhook body of
 *		the same message are the same object.
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "utils/json.h"

#include "sink.h"

/* Writes the identity of message `id` of `outbox` into buf. */
void
RelayMessageIdentity(char *buf, size_t size, const char *outbox, int64 id)
{
	snprintf(buf, size, "outbox_%s:" INT64_FORMAT, outbox, id);
}

/* Appends the message's JSON object to buf. */
void
RelayAppendMessageJson(StringInfo buf, const RelayMessage *m)
{
	char		idbuf[RELAY_IDENTITY_SIZE];

	RelayMessageIdentity(idbuf, sizeof(idbuf), m->outbox, m->id);
	appendStringInfoString(buf, "{\"id\": ");
	escape_json(buf, idbuf);
	appendStringInfoString(buf, ", \"outbox\": ");
	escape_json(buf, m->outbox);
	appendStringInfo(buf, ", \"message_id\": " INT64_FORMAT ", \"payload\": ", m->id);
	appendStringInfoString(buf, m->payload ? m->payload : "null");
	appendStringInfoString(buf, ", \"headers\": ");
	appendStringInfoString(buf, m->headers ? m->headers : "null");
	appendStringInfoString(buf, ", \"created_at\": ");
	appendStringInfoString(buf, m->created_at ? m->created_at : "null");
	appendStringInfoChar(buf, '}');
}
