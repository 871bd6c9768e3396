/*
 * sink.c
 *		The postgres sink (pg_tide_postgres.so): a forward pipeline that
 *		writes its outbox's messages into an inbox of another pg_tide
 *		database, exactly once, over libpq.
 *
 * 1. `start` gives each message its event id: the value of the header
 *	  "event_id_header" names, or the message's identity
 *	  outbox_<outbox>:<id> (the one every sink sends). A message whose
 *	  header is missing or no usable id is refused (permanent, refused)
 *	  without being sent.
 * 2. The batch is one call, SELECT tide.inbox_receive_batch(<inbox>,
 *	  <events>), on the pipeline's connection (client.c), each event with
 *	  its payload, headers and the pipeline's name as source. The call
 *	  runs in a transaction of its own on the remote (autocommit), so the
 *	  events are committed there before the answer comes and before the
 *	  worker moves the pipeline's offset. A crash between the two leases
 *	  the batch again and sends it again: the remote inbox stores an event
 *	  id once (ON CONFLICT DO NOTHING), so the repeat changes nothing.
 * 3. An answer with an error is classified by its SQLSTATE (client.c's
 *	  RemoteClassifyError): the remote's failure (connection, auth, no
 *	  such inbox) holds the pipeline, a transient one is retried, the
 *	  refusal of the data (22xxx, 23xxx, 54000) is some message's own:
 *	  the batch is then sent again one message per call, so that only the
 *	  refused ones are dead-lettered.
 *
 * Nothing here raises an ERROR or blocks between `start` and `outcomes`.
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "utils/json.h"
#include "utils/timestamp.h"

#include "remote.h"

static const char receive_sql[] = "SELECT tide.inbox_receive_batch($1, $2::jsonb)";

struct PgBatch;

/* A pipeline's state: its settings and its connection. */
typedef struct PostgresSink
{
	RemoteClient client;
	char	   *inbox;
	char	   *event_id_header;	/* or NULL: the message's identity */
	char	   *source;			/* the pipeline's name */
	struct PgBatch *pb;			/* the batch in flight, or NULL */
} PostgresSink;

/* A batch in flight. */
typedef struct PgBatch
{
	RelaySinkBatch *batch;
	RelayMessageOutcome *each;	/* in batch->cxt */
	char	  **event_id;		/* NULL: refused before sending */
	bool	   *settled;		/* each[i] is final */
	bool		one_by_one;		/* a refusal came: one message per call */
	int			next;			/* one by one: the next message to send */
	int			in_flight;		/* one by one: the message sent; -1 the whole batch */
	bool		calling;		/* a call is in flight */
	TimestampTz sent_at;
	TimestampTz deadline;		/* no call starts after it */
} PgBatch;

/* client.c: something happened, the batch is due a turn. */
static void
batch_ready(void *arg)
{
	PostgresSink *s = arg;

	if (s->pb != NULL)
		s->pb->batch->ready = true;
}

/* Milliseconds since t. */
static double
ms_since(TimestampTz t)
{
	return (GetCurrentTimestamp() - t) / 1000.0;
}

/* Settles message i with an outcome. */
static void
settle(PgBatch *pb, int i, RelayOutcome outcome, const char *cls, const char *error)
{
	if (outcome == RELAY_DELIVERED)
		pb->each[i].outcome = RELAY_DELIVERED;
	else
		RelaySetFailure(&pb->each[i], outcome, cls, 0, error);
	pb->settled[i] = true;
}

/*
 * Message i's event id: its header's value, or its identity; NULL, with
 * the message refused, when the header gives none.
 */
static char *
event_id_of(PostgresSink *s, PgBatch *pb, int i)
{
	const RelayMessage *m = &pb->batch->msgs[i];
	char		id[RELAY_IDENTITY_SIZE];
	cJSON	   *headers;
	const cJSON *v;
	char	   *result = NULL;

	if (s->event_id_header == NULL)
	{
		RelayMessageIdentity(id, sizeof(id), m->outbox, m->id);
		return MemoryContextStrdup(pb->batch->cxt, id);
	}
	headers = m->headers ? cJSON_Parse(m->headers) : NULL;
	v = cJSON_GetObjectItemCaseSensitive(headers, s->event_id_header);
	if (cJSON_IsString(v) && v->valuestring[0] != '\0' && strlen(v->valuestring) <= 255 &&
		strcspn(v->valuestring, "\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"
				"\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f\x7f") ==
		strlen(v->valuestring))
		result = MemoryContextStrdup(pb->batch->cxt, v->valuestring);
	cJSON_Delete(headers);
	if (result == NULL)
	{
		char		error[256];

		snprintf(error, sizeof(error),
				 "refused: header \"%.64s\" (event_id_header) is missing, not a string, empty, longer than 255 bytes or has control characters",
				 s->event_id_header);
		settle(pb, i, RELAY_PERMANENT, RELAY_CLASS_REFUSED, error);
	}
	return result;
}

/* Appends message i as an event of tide.inbox_receive_batch. */
static void
append_event(PostgresSink *s, PgBatch *pb, int i, StringInfo buf)
{
	const RelayMessage *m = &pb->batch->msgs[i];

	appendStringInfoString(buf, "{\"event_id\": ");
	escape_json(buf, pb->event_id[i]);
	appendStringInfoString(buf, ", \"source\": ");
	escape_json(buf, s->source);
	appendStringInfoString(buf, ", \"payload\": ");
	appendStringInfoString(buf, m->payload ? m->payload : "null");
	if (m->headers != NULL)
	{
		appendStringInfoString(buf, ", \"headers\": ");
		appendStringInfoString(buf, m->headers);
	}
	appendStringInfoChar(buf, '}');
}

/*
 * Sends the next call when the connection is ready: the whole batch, or
 * the next message one by one. False when nothing is left to send.
 */
static bool
send_next(PostgresSink *s, PgBatch *pb)
{
	RemoteClient *c = &s->client;
	StringInfoData events;
	const char *params[2];
	int			n = 0;
	bool		sent;

	if (pb->calling)
		return true;
	if (pb->one_by_one)
	{
		while (pb->next < pb->batch->nmsgs && pb->settled[pb->next])
			pb->next++;
		if (pb->next >= pb->batch->nmsgs)
			return false;
		if (GetCurrentTimestamp() >= pb->deadline)
			return false;		/* the rest is leased again */
	}
	if (c->state != REMOTE_READY)
		return true;
	initStringInfo(&events);
	appendStringInfoChar(&events, '[');
	for (int i = pb->one_by_one ? pb->next : 0; i < pb->batch->nmsgs; i++)
	{
		if (pb->settled[i])
			continue;
		if (n++ > 0)
			appendStringInfoString(&events, ", ");
		append_event(s, pb, i, &events);
		if (pb->one_by_one)
			break;
	}
	appendStringInfoChar(&events, ']');
	if (n == 0)
	{
		pfree(events.data);
		return false;
	}
	params[0] = s->inbox;
	params[1] = events.data;
	pb->in_flight = pb->one_by_one ? pb->next : -1;
	pb->sent_at = GetCurrentTimestamp();
	sent = RemoteClientSend(c, receive_sql, 2, params,
							c->statement_timeout_ms + REMOTE_ANSWER_SLACK_MS);
	pfree(events.data);
	/* a failure to send is noted by the client */
	pb->calling = sent;
	return true;
}

/* Settles what the call in flight carried. */
static void
settle_call(PgBatch *pb, RelayOutcome outcome, const char *cls, const char *error)
{
	double		latency = ms_since(pb->sent_at);

	for (int i = 0; i < pb->batch->nmsgs; i++)
	{
		if (pb->settled[i] || (pb->in_flight >= 0 && i != pb->in_flight))
			continue;
		pb->each[i].latency_ms = latency;
		settle(pb, i, outcome, cls, error);
	}
	pb->calling = false;
}

/*
 * Ends the batch on the remote's failure: what is not settled waits with
 * the pipeline (a call in flight that timed out is retried).
 */
static void
fail_rest(PgBatch *pb, RelayOutcome outcome, const char *cls, const char *error)
{
	for (int i = 0; i < pb->batch->nmsgs; i++)
		if (!pb->settled[i])
			settle(pb, i, outcome, cls, error);
	pb->calling = false;
}

/* Takes the answer of the call in flight. */
static void
take_answer(PgBatch *pb, PGresult *res)
{
	char		cls[32];
	char		error[256];
	RelayOutcome outcome;
	int			carried = 0;

	if (PQresultStatus(res) == PGRES_TUPLES_OK)
	{
		settle_call(pb, RELAY_DELIVERED, NULL, NULL);
		return;
	}
	outcome = RemoteClassifyError(res, cls, sizeof(cls), error, sizeof(error));
	for (int i = 0; i < pb->batch->nmsgs; i++)
		if (!pb->settled[i])
			carried++;
	if (outcome == RELAY_PERMANENT && pb->in_flight < 0 && carried > 1)
	{
		/* some message's own refusal: which one is found by sending them one by one */
		pb->one_by_one = true;
		pb->next = 0;
		pb->calling = false;
		return;
	}
	if (outcome == RELAY_UNREACHABLE)
		fail_rest(pb, outcome, cls, error);
	else
		settle_call(pb, outcome, cls, error);
}

static void
postgres_start(void *state, RelaySinkBatch *batch)
{
	PostgresSink *s = state;
	RemoteClient *c = &s->client;
	PgBatch    *pb = MemoryContextAllocZero(batch->cxt, sizeof(PgBatch));
	int			n = Max(batch->nmsgs, 1);

	pb->batch = batch;
	pb->each = MemoryContextAllocZero(batch->cxt, sizeof(RelayMessageOutcome) * n);
	pb->event_id = MemoryContextAllocZero(batch->cxt, sizeof(char *) * n);
	pb->settled = MemoryContextAllocZero(batch->cxt, sizeof(bool) * n);
	pb->in_flight = -1;
	pb->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
											   c->connect_timeout_ms + c->statement_timeout_ms);
	for (int i = 0; i < batch->nmsgs; i++)
	{
		pb->each[i].wait_ms = -1;
		pb->event_id[i] = event_id_of(s, pb, i);
	}
	batch->sink_private = pb;
	s->pb = pb;
	/* a failure noted while no batch was in flight is old news */
	c->failed = false;
	c->notify = batch_ready;
	c->notify_arg = s;
	RemoteClientConnect(c);
	batch->ready = true;
}

static bool
postgres_progress(void *state, RelaySinkBatch *batch)
{
	PostgresSink *s = state;
	RemoteClient *c = &s->client;
	PgBatch    *pb = batch->sink_private;
	PGresult   *res;

	RemoteClientPump(c);
	if ((res = RemoteClientTakeResult(c)) != NULL)
	{
		take_answer(pb, res);
		PQclear(res);
	}
	if (c->failed)
	{
		/* a call that went and timed out is retried; nothing sent waits */
		bool		timed_out = pb->calling && strcmp(c->fail_class, RELAY_CLASS_TIMEOUT) == 0;

		fail_rest(pb, timed_out ? RELAY_RETRYABLE : RELAY_UNREACHABLE, c->fail_class, c->fail_error);
		c->failed = false;
		return true;
	}
	if (!send_next(s, pb))
		return true;
	if (c->failed)
		return postgres_progress(state, batch);
	batch->wake_at = c->deadline;
	return false;
}

static void
postgres_outcomes(void *state, RelaySinkBatch *batch, RelayDeliveryResult *result)
{
	PostgresSink *s = state;
	PgBatch    *pb = batch->sink_private;

	for (int i = 0; i < batch->nmsgs; i++)
	{
		result->each[i] = pb->each[i];
		if (!pb->settled[i])
			RelaySetFailure(&result->each[i], RELAY_NOT_SENT, "not_sent", 0,
							"not sent: an earlier failure or the batch's time came first");
	}
	s->pb = NULL;
}

static void
postgres_cancel(void *state, RelaySinkBatch *batch)
{
	PostgresSink *s = state;
	PgBatch    *pb = batch->sink_private;

	s->pb = NULL;
	/* an answer still due belongs to this batch */
	if (pb != NULL && pb->calling)
		RemoteClientDrop(&s->client);
	s->client.failed = false;
}

static void
postgres_close(void *state)
{
	PostgresSink *s = state;

	s->pb = NULL;
	RemoteClientClose(&s->client);
}

/*
 * The pipeline's settings from its config, with the password it refers
 * to read; false when it cannot be (the pipeline's error).
 */
static bool
postgres_open(const cJSON *config, RelaySinkOpened *opened)
{
	PostgresSink *s = palloc0(sizeof(PostgresSink));
	char	   *error = NULL;

	opened->read_secrets = cJSON_IsObject(RelayConfigMember(config, "password"));
	if (!RemoteClientInit(&s->client, config, &error))
	{
		opened->error = error;
		return false;
	}
	s->inbox = RelayConfigString(config, "inbox");
	s->event_id_header = RelayConfigString(config, "event_id_header");
	s->source = pstrdup(opened->pipeline ? opened->pipeline : "");
	if (s->inbox == NULL)
	{
		opened->error = "its config has no \"inbox\"";
		return false;
	}
	/* a lookup, a connect and a set-up, then calls until the batch's deadline and one more */
	opened->longest_batch_seconds =
		(3 * s->client.connect_timeout_ms + 2 * s->client.statement_timeout_ms + 2 * REMOTE_ANSWER_SLACK_MS) / 1000 + 1;
	opened->state = s;
	return true;
}

const RelaySinkRoutine RemoteSinkRoutine = {
	.name = "postgres",
	.log_failures_by_default = true,
	.config_keys = RemoteSinkConfigKeys,
	.secret_keys = RemoteSecretKeys,
	.validate = RemoteSinkValidate,
	.open = postgres_open,
	.start = postgres_start,
	.progress = postgres_progress,
	.outcomes = postgres_outcomes,
	.cancel = postgres_cancel,
	.close = postgres_close,
};
