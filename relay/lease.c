/*
 * lease.c
 *		Leasing a batch for a pipeline and recording its delivery, each in a
 *		short transaction of its own, so that no transaction is open while
 *		the sink delivers.
 *
 * 1. Lease: a read-only look first (does the pipeline hold a lease, or
 *	  would a poll of its group find anything), so that an idle pipeline
 *	  writes nothing; then
 *	  tide.poll_outbox(consumer_group, 'relay:<pipeline>', batch_size,
 *	  lease_seconds) claims the next batch for the pipeline's consumer (or
 *	  hands back the lease it already holds), and the rows are copied into
 *	  the caller's memory before the transaction commits. That commit does
 *	  not wait for its WAL to reach disk: a lease lost in a crash only means
 *	  the batch in flight is leased and delivered again, and the record's
 *	  commit, which waits, makes the lease durable with it. Messages due
 *	  for another attempt are taken from the pipeline's retry queue.
 *	  With ordering relaxed and a backlog, the worker leases the next batch
 *	  while one is in flight (RelayLeaseAhead, tide's TidePollAhead): the
 *	  pipeline's consumer keeps holding one lease, lengthened at its end, so
 *	  the record of the first batch, which commits up to its last id,
 *	  leaves it holding the next batch alone; a next batch that is not
 *	  started stays in the lease and is leased again from it.
 * 2. The caller delivers with no transaction open.
 * 3. Record, all in one transaction: a sink whose destination is this
 *	  database (an inbox) writes the delivered messages first (its `store`,
 *	  sink.h), so they commit with the offset; tide.commit_offset acknowledges the
 *	  lease up to the last message whose fate is known (an ERROR when the
 *	  lease is no longer the consumer's) and relay_consumer_offsets keeps
 *	  the pipeline's durable offset, which only moves forward; the failed
 *	  messages among them go into the retry queue or relay_dlq with a copy
 *	  of the message, and queued messages that were delivered leave the
 *	  queue. The offset never passes a message that is not delivered,
 *	  queued or dead-lettered in the same commit, and what is not recorded
 *	  is leased again: every message is delivered at least once.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/guc.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/fmgrprotos.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "pg_tide.h"
#include "forward.h"
#include "relay_xact.h"

static SPIPlanPtr own_lease_plan = NULL;
static SPIPlanPtr commit_offset_plan = NULL;
static SPIPlanPtr durable_offset_plan = NULL;

/* A column's text copied into cxt, or NULL. */
static char *
copy_value(HeapTuple tup, TupleDesc desc, int col, MemoryContext cxt)
{
	char	   *v = SPI_getvalue(tup, desc, col);

	return v ? MemoryContextStrdup(cxt, v) : NULL;
}

/* Where TidePoll puts a lease's messages (copy_polled). */
typedef struct LeaseCopy
{
	const RelayPipeline *p;
	MemoryContext cxt;
	RelayMessage *out;
	int			n;
	/* ordering 'key': from a header, or a JSON pointer's path into the payload */
	Datum		key_header;
	bool		key_header_null;
	Datum		key_path;
	bool		key_path_null;
} LeaseCopy;

/* fn(a, b) for a strict function of two arguments that may return null. */
static Datum
call_or_null(PGFunction fn, Datum a, Datum b, bool *isnull)
{
	LOCAL_FCINFO(fcinfo, 2);
	Datum		result;

	InitFunctionCallInfoData(*fcinfo, NULL, 2, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = a;
	fcinfo->args[0].isnull = false;
	fcinfo->args[1].value = b;
	fcinfo->args[1].isnull = false;
	result = fn(fcinfo);
	*isnull = fcinfo->isnull;
	return result;
}

/*
 * A message's ordering key, as coalesce(headers ->> header, payload #>>
 * path) would give it, as text in the current memory context, or NULL.
 */
static char *
ordering_key(const LeaseCopy *lc, Datum payload, Datum headers)
{
	Datum		key;
	bool		isnull = true;

	if (!lc->key_header_null && headers != (Datum) 0)
		key = call_or_null(jsonb_object_field_text, headers, lc->key_header, &isnull);
	if (isnull && !lc->key_path_null)
		key = call_or_null(jsonb_extract_path_text, payload, lc->key_path, &isnull);
	return isnull ? NULL : text_to_cstring(DatumGetTextPP(key));
}

/* A jsonb datum as its text in cxt (detoasted in the caller's context). */
static char *
jsonb_text(Datum d, MemoryContext cxt)
{
	return RelayJsonbText(DatumGetJsonbP(d), cxt);
}

/*
 * TidePoll's callback: copies one leased message into the lease's memory,
 * its payload and headers as JSON text and its created_at as a JSON string,
 * as payload::text, headers::text and to_json(created_at)::text give them.
 */
static void
copy_polled(void *arg, int64 id, Datum payload, Datum headers, TimestampTz created_at,
			bool expired)
{
	LeaseCopy  *lc = arg;
	RelayMessage *m = &lc->out[lc->n++];
	char		buf[MAXDATELEN + 1];

	m->id = id;
	m->expired = expired;
	m->outbox = lc->p->outbox;
	m->payload = jsonb_text(payload, lc->cxt);
	m->headers = headers != (Datum) 0 ? jsonb_text(headers, lc->cxt) : NULL;
	m->created_at = MemoryContextStrdup(lc->cxt,
										psprintf("\"%s\"",
												 JsonEncodeDateTime(buf, TimestampTzGetDatum(created_at),
																	TIMESTAMPTZOID, NULL)));
	if (lc->p->ordering_key != NULL)
	{
		char	   *key = ordering_key(lc, payload, headers);

		m->key = key ? MemoryContextStrdup(lc->cxt, key) : NULL;
	}
}

/*
 * Readies lc for a lease of up to `limit` messages of pipeline p, copied
 * into cxt, in a transaction whose commit does not wait for its WAL to
 * reach disk (see the top of this file).
 */
static void
start_lease_copy(LeaseCopy *lc, const RelayPipeline *p, MemoryContext cxt, int limit)
{
	(void) set_config_option("synchronous_commit", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_LOCAL, true, 0, false);
	memset(lc, 0, sizeof(*lc));
	lc->p = p;
	lc->cxt = cxt;
	lc->out = MemoryContextAllocZero(cxt, sizeof(RelayMessage) * Max(limit, 1));
}

/*
 * Leases the pipeline's next batch; returns how many messages it holds, in
 * id order, copied into cxt as *msgs.
 */
int
RelayLeaseBatch(const RelayPipeline *p, int limit, MemoryContext cxt, RelayMessage **msgs)
{
	Oid			argtypes[2] = {TEXTOID, TEXTOID};
	Datum		values[2];
	LeaseCopy	lc;

	RelayBeginShortXact("pg_tide relay: leasing a batch");
	values[0] = CStringGetTextDatum(p->consumer_group);
	values[1] = CStringGetTextDatum(p->consumer);
	if (SPI_execute_plan(TidePlan(&own_lease_plan,
								  "SELECT FROM tide.tide_consumer_leases"
								  " WHERE group_name OPERATOR(pg_catalog.=) $1 AND consumer_id OPERATOR(pg_catalog.=) $2",
								  2, argtypes),
						 values, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look for messages of pipeline \"%s\"", p->name);
	if (SPI_processed == 0 && !TideGroupHasMessages(p->consumer_group))
	{
		RelayEndShortXact(cxt);
		*msgs = NULL;
		return 0;
	}
	start_lease_copy(&lc, p, cxt, limit);
	RelayOrderingKeyArgs(p, &lc.key_header, &lc.key_header_null, &lc.key_path, &lc.key_path_null);
	(void) TidePoll(p->consumer_group, p->consumer, limit, p->lease_seconds, copy_polled, &lc);

	/* in the same transaction: the keys held back by the retry queue */
	RelayOrderingFindBlocked(p, lc.out, lc.n);
	RelayEndShortXact(cxt);
	*msgs = lc.out;
	return lc.n;
}

/*
 * Leases the pipeline's batch after the one in flight, whose last message
 * is `after`, while that one is delivered (see the top of this file);
 * returns how many messages it holds, in id order, copied into cxt as
 * *msgs. Ordering relaxed only: it finds no blocked keys.
 */
int
RelayLeaseAhead(const RelayPipeline *p, int64 after, int limit, MemoryContext cxt,
				RelayMessage **msgs)
{
	LeaseCopy	lc;

	Assert(p->ordering_key == NULL && !p->strict);
	RelayBeginShortXact("pg_tide relay: leasing the next batch");
	/*
	 * The end of a backlog writes nothing (a poll writes the consumer's
	 * heartbeat). Messages of the lease behind the batch in flight (after a
	 * hold) are not looked for here: they are leased again after it.
	 */
	if (!TideGroupHasMessages(p->consumer_group))
	{
		RelayEndShortXact(cxt);
		*msgs = NULL;
		return 0;
	}
	start_lease_copy(&lc, p, cxt, limit);
	lc.key_header_null = lc.key_path_null = true;
	(void) TidePollAhead(p->consumer_group, p->consumer, after, limit, p->lease_seconds,
						 copy_polled, &lc);
	RelayEndShortXact(cxt);
	*msgs = lc.out;
	return lc.n;
}

/*
 * Takes the pipeline's queued messages that are due for another attempt
 * (each marked expired when its message's expires_at has passed),
 * at most batch_size, oldest due first (with ordering 'key': only those of
 * a key with no earlier entry still waiting for its time, in id order, so
 * that each key's entries go in order, see ordering.c), copied into cxt as *msgs; sets
 * *next_due to when the next of the others falls due (0: none queued).
 * The queue is its pipeline's worker's alone (ownership.c), so nothing is locked.
 */
int
RelayTakeRetries(const RelayPipeline *p, int limit, MemoryContext cxt, RelayMessage **msgs,
				 TimestampTz *next_due)
{
	Oid			argtypes[4] = {TEXTOID, INT4OID, BOOLOID, TIMESTAMPTZOID};
	Datum		values[4];
	int			n;
	int			i;
	bool		isnull;
	RelayMessage *out;

	RelayBeginShortXact("pg_tide relay: taking messages to retry");
	values[0] = CStringGetTextDatum(p->name);
	values[1] = Int32GetDatum(limit);
	values[2] = BoolGetDatum(p->ordering_key != NULL);
	/*
	 * One "now" for both statements: with clock_timestamp() read per row,
	 * an earlier entry could fall due between the look at it and the look
	 * at a later entry of its key, which would then go without it; and an
	 * entry is either taken or counted in *next_due.
	 */
	values[3] = TimestampTzGetDatum(GetCurrentTimestamp());
	if (SPI_execute_with_args("SELECT pg_catalog.min(next_attempt_at) FROM tide.relay_retry_queue"
							  " WHERE pipeline_id OPERATOR(pg_catalog.=) $1"
							  "   AND next_attempt_at OPERATOR(pg_catalog.>) $4",
							  4, argtypes, values, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the retry queue of pipeline \"%s\"", p->name);
	*next_due = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
												  1, &isnull));
	if (isnull)
		*next_due = 0;
	if (SPI_execute_with_args("SELECT q.message_id, q.payload::text, q.headers::text,"
							  "       pg_catalog.to_json(q.created_at)::text, q.attempts, q.outbox_name, q.manual,"
							  "       q.ordering_key,"
							  "       EXISTS (SELECT FROM tide.tide_outbox_messages m"
							  "                WHERE m.outbox_name OPERATOR(pg_catalog.=) q.outbox_name"
							  "                  AND m.id OPERATOR(pg_catalog.=) q.message_id"
							  "                  AND m.expires_at OPERATOR(pg_catalog.<=) $4)"
							  "  FROM tide.relay_retry_queue q"
							  " WHERE q.pipeline_id OPERATOR(pg_catalog.=) $1"
							  "   AND q.next_attempt_at OPERATOR(pg_catalog.<=) $4"
							  "   AND (NOT $3 OR q.ordering_key IS NULL OR NOT EXISTS"
							  "        (SELECT FROM tide.relay_retry_queue e"
							  "          WHERE e.pipeline_id OPERATOR(pg_catalog.=) q.pipeline_id"
							  "            AND pg_catalog.hashtextextended(e.ordering_key, 0)"
							  "                OPERATOR(pg_catalog.=) pg_catalog.hashtextextended(q.ordering_key, 0)"
							  "            AND e.ordering_key OPERATOR(pg_catalog.=) q.ordering_key"
							  "            AND e.message_id OPERATOR(pg_catalog.<) q.message_id"
							  "            AND e.next_attempt_at OPERATOR(pg_catalog.>) $4))"
							  " ORDER BY CASE WHEN $3 THEN NULL ELSE q.next_attempt_at END, q.message_id LIMIT $2",
							  4, argtypes, values, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the retry queue of pipeline \"%s\"", p->name);

	n = (int) SPI_processed;
	out = MemoryContextAllocZero(cxt, sizeof(RelayMessage) * Max(n, 1));
	for (i = 0; i < n; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;

		out[i].id = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
		out[i].payload = copy_value(tup, desc, 2, cxt);
		out[i].headers = copy_value(tup, desc, 3, cxt);
		out[i].created_at = copy_value(tup, desc, 4, cxt);
		out[i].attempts = DatumGetInt32(SPI_getbinval(tup, desc, 5, &isnull));
		out[i].outbox = copy_value(tup, desc, 6, cxt);
		out[i].manual = DatumGetBool(SPI_getbinval(tup, desc, 7, &isnull));
		out[i].key = copy_value(tup, desc, 8, cxt);
		out[i].expired = DatumGetBool(SPI_getbinval(tup, desc, 9, &isnull));
	}
	RelayEndShortXact(cxt);
	*msgs = out;
	return n;
}

/* Columns of the messages a settlement requeues or dead-letters, as arrays. */
typedef struct SettledColumns
{
	int			n;
	Datum	   *outbox;
	Datum	   *id;
	Datum	   *payload;
	Datum	   *headers;
	Datum	   *created_at;
	Datum	   *attempts;
	Datum	   *delay_or_reason;
	Datum	   *status;
	Datum	   *error_class;
	Datum	   *error;
	Datum	   *key;
	bool	   *headers_null;
	bool	   *key_null;
} SettledColumns;

/* The messages of the settlement with disposition d, column by column. */
static void
settled_columns(const RelaySettlement *s, RelayDisposition d, SettledColumns *c)
{
	int			i;

	memset(c, 0, sizeof(*c));
	c->outbox = palloc(sizeof(Datum) * s->n);
	c->id = palloc(sizeof(Datum) * s->n);
	c->payload = palloc(sizeof(Datum) * s->n);
	c->headers = palloc(sizeof(Datum) * s->n);
	c->created_at = palloc(sizeof(Datum) * s->n);
	c->attempts = palloc(sizeof(Datum) * s->n);
	c->delay_or_reason = palloc(sizeof(Datum) * s->n);
	c->status = palloc(sizeof(Datum) * s->n);
	c->error_class = palloc(sizeof(Datum) * s->n);
	c->error = palloc(sizeof(Datum) * s->n);
	c->key = palloc(sizeof(Datum) * s->n);
	c->headers_null = palloc(sizeof(bool) * s->n);
	c->key_null = palloc(sizeof(bool) * s->n);
	for (i = 0; i < s->n; i++)
	{
		const RelayMessage *m = &s->msgs[i];
		const RelayMessageOutcome *o = &s->each[i];
		int			k = c->n;

		if (s->disp[i] != d)
			continue;
		c->outbox[k] = CStringGetTextDatum(m->outbox);
		c->id[k] = Int64GetDatum(m->id);
		c->payload[k] = CStringGetTextDatum(m->payload ? m->payload : "null");
		c->headers_null[k] = (m->headers == NULL);
		c->headers[k] = m->headers ? CStringGetTextDatum(m->headers) : (Datum) 0;
		c->created_at[k] = CStringGetTextDatum(m->created_at ? m->created_at : "null");
		c->attempts[k] = Int32GetDatum(s->attempts[i]);
		c->delay_or_reason[k] = d == RELAY_DEAD ? CStringGetTextDatum(s->reason[i]) :
			Int32GetDatum((int32) Min(s->delay_ms[i], (long) PG_INT32_MAX));
		c->status[k] = Int32GetDatum((int32) o->response_code);
		c->error_class[k] = CStringGetTextDatum(o->error_class[0] ? o->error_class : "error");
		c->error[k] = CStringGetTextDatum(o->error);
		c->key_null[k] = (m->key == NULL);
		c->key[k] = m->key ? CStringGetTextDatum(m->key) : (Datum) 0;
		c->n++;
	}
}

/*
 * Writes the settled messages with disposition d (RELAY_REQUEUE: into the
 * retry queue, or its row updated; RELAY_DEAD: out of the retry queue into
 * relay_dlq, keeping when it first failed).
 */
static void
record_failures(const RelayPipeline *p, const RelaySettlement *s, RelayDisposition d)
{
	Oid			argtypes[12] = {TEXTOID, TEXTARRAYOID, INT8ARRAYOID, TEXTARRAYOID, TEXTARRAYOID,
		TEXTARRAYOID, INT4ARRAYOID, d == RELAY_DEAD ? TEXTARRAYOID : INT4ARRAYOID,
	INT4ARRAYOID, TEXTARRAYOID, TEXTARRAYOID, TEXTARRAYOID};
	Datum		values[12];
	SettledColumns c;
	int			ret;

	settled_columns(s, d, &c);
	if (c.n == 0)
		return;
	values[0] = CStringGetTextDatum(p->name);
	values[1] = RelayMakeArray(c.outbox, NULL, c.n, TEXTOID);
	values[2] = RelayMakeArray(c.id, NULL, c.n, INT8OID);
	values[3] = RelayMakeArray(c.payload, NULL, c.n, TEXTOID);
	values[4] = RelayMakeArray(c.headers, c.headers_null, c.n, TEXTOID);
	values[5] = RelayMakeArray(c.created_at, NULL, c.n, TEXTOID);
	values[6] = RelayMakeArray(c.attempts, NULL, c.n, INT4OID);
	values[7] = RelayMakeArray(c.delay_or_reason, NULL, c.n, d == RELAY_DEAD ? TEXTOID : INT4OID);
	values[8] = RelayMakeArray(c.status, NULL, c.n, INT4OID);
	values[9] = RelayMakeArray(c.error_class, NULL, c.n, TEXTOID);
	values[10] = RelayMakeArray(c.error, NULL, c.n, TEXTOID);
	values[11] = RelayMakeArray(c.key, c.key_null, c.n, TEXTOID);

	if (d == RELAY_REQUEUE)
		ret = SPI_execute_with_args(
			"INSERT INTO tide.relay_retry_queue AS q"
			"  (pipeline_id, outbox_name, message_id, payload, headers, created_at, attempts,"
			"   next_attempt_at, last_status, last_error_class, last_error, ordering_key)"
			" SELECT $1, u.outbox, u.id, u.payload::jsonb, u.headers::jsonb,"
			"        (u.created_at::jsonb OPERATOR(pg_catalog.#>>) '{}')::timestamptz, u.attempts,"
			"        pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+)"
			"          (u.delay_ms::float8 OPERATOR(pg_catalog.*) interval '1 millisecond'),"
			"        CASE WHEN u.status OPERATOR(pg_catalog.<>) 0 THEN u.status END, u.error_class, u.error, u.key"
			"   FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3), pg_catalog.unnest($4), pg_catalog.unnest($5),"
			"          pg_catalog.unnest($6), pg_catalog.unnest($7), pg_catalog.unnest($8), pg_catalog.unnest($9),"
			"          pg_catalog.unnest($10), pg_catalog.unnest($11), pg_catalog.unnest($12))"
			"        AS u(outbox, id, payload, headers, created_at, attempts, delay_ms, status, error_class, error, key)"
			" ON CONFLICT (pipeline_id, message_id) DO UPDATE"
			"    SET attempts = EXCLUDED.attempts, next_attempt_at = EXCLUDED.next_attempt_at,"
			"        manual = false, last_status = EXCLUDED.last_status, last_error_class = EXCLUDED.last_error_class,"
			"        last_error = EXCLUDED.last_error, ordering_key = EXCLUDED.ordering_key",
			12, argtypes, values, NULL, false, 0);
	else
		ret = SPI_execute_with_args(
			"WITH u AS (SELECT * FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3), pg_catalog.unnest($4), pg_catalog.unnest($5),"
			"          pg_catalog.unnest($6), pg_catalog.unnest($7), pg_catalog.unnest($8), pg_catalog.unnest($9),"
			"          pg_catalog.unnest($10), pg_catalog.unnest($11))"
			"             AS u(outbox, id, payload, headers, created_at, attempts, reason, status, error_class, error)),"
			"     q AS (DELETE FROM tide.relay_retry_queue q USING u"
			"            WHERE q.pipeline_id OPERATOR(pg_catalog.=) $1"
			"              AND q.message_id OPERATOR(pg_catalog.=) u.id"
			"        RETURNING q.message_id, q.first_failed_at)"
			" INSERT INTO tide.relay_dlq AS d"
			"  (pipeline_id, outbox_name, message_id, payload, headers, created_at, attempts, reason,"
			"   last_status, last_error_class, last_error, first_failed_at)"
			" SELECT $1, u.outbox, u.id, u.payload::jsonb, u.headers::jsonb,"
			"        (u.created_at::jsonb OPERATOR(pg_catalog.#>>) '{}')::timestamptz, u.attempts, u.reason,"
			"        CASE WHEN u.status OPERATOR(pg_catalog.<>) 0 THEN u.status END, u.error_class, u.error,"
			"        coalesce(q.first_failed_at, pg_catalog.now())"
			"   FROM u LEFT JOIN q ON q.message_id OPERATOR(pg_catalog.=) u.id"
			" ON CONFLICT (pipeline_id, message_id) DO UPDATE"
			"    SET attempts = EXCLUDED.attempts, reason = EXCLUDED.reason,"
			"        last_status = EXCLUDED.last_status, last_error_class = EXCLUDED.last_error_class,"
			"        last_error = EXCLUDED.last_error, dead_lettered_at = pg_catalog.now()",
			11, argtypes, values, NULL, false, 0);
	if (ret != SPI_OK_INSERT)
		elog(ERROR, "could not record the failed deliveries of pipeline \"%s\"", p->name);
}

/*
 * Hands the messages that settlement s settles as delivered (live ones up
 * to its offset, queued ones that leave the queue) to the sink's `store`,
 * in the record's transaction (sink.h).
 */
static void
store_delivered(const RelayPipeline *p, const RelaySettlement *s)
{
	RelayMessage *msgs = palloc(sizeof(RelayMessage) * Max(s->n, 1));
	int			n = 0;

	for (int i = 0; i < s->n; i++)
		if (s->each[i].outcome == RELAY_DELIVERED &&
			(s->disp[i] == RELAY_DONE ||
			 (s->disp[i] == RELAY_KEEP && s->offset_id > 0 && s->msgs[i].id <= s->offset_id)))
			msgs[n++] = s->msgs[i];
	if (n > 0)
		p->sink->store(p->sink_state, p->name, msgs, n);
	pfree(msgs);
}

/*
 * Records a delivered batch in one transaction (see the top of this file):
 * stores what a sink of this database delivers (its `store`), disables the
 * pipeline after 410 Gone, commits the live lease up to
 * offset_id (an ERROR when the lease is no longer the consumer's) and moves
 * the durable offset forward, queues and dead-letters the failures, takes
 * delivered messages out of the retry queue and logs the attempts.
 */
void
RelayRecord(const RelayPipeline *p, const RelaySettlement *s, MemoryContext cxt)
{
	Oid			argtypes[5] = {TEXTOID, TEXTOID, INT8OID, TEXTOID, TEXTOID};
	Datum		values[5];
	Datum	   *done = palloc(sizeof(Datum) * Max(s->n, 1));
	int			ndone = 0;
	int			i;

	RelayBeginShortXact("pg_tide relay: recording a delivery");
	if (p->sink->store != NULL)
		store_delivered(p, s);
	values[0] = CStringGetTextDatum(p->consumer_group);
	values[1] = CStringGetTextDatum(p->consumer);
	values[2] = Int64GetDatum(s->offset_id);
	values[3] = CStringGetTextDatum(p->name);
	values[4] = CStringGetTextDatum(p->outbox);
	if (s->disable &&
		SPI_execute_with_args("UPDATE tide.relay_outbox_config SET enabled = false"
							  " WHERE name OPERATOR(pg_catalog.=) $4",
							  5, argtypes, values, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not disable pipeline \"%s\"", p->name);
	if (s->offset_id > 0)
	{
		if (SPI_execute_plan(TidePlan(&commit_offset_plan, "SELECT tide.commit_offset($1, $2, $3)",
									  3, argtypes),
							 values, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not commit the offset of pipeline \"%s\"", p->name);
		/* relay_group_id is the consumer group, as relay_set_outbox keeps it. */
		if (SPI_execute_plan(TidePlan(&durable_offset_plan,
									  "INSERT INTO tide.relay_consumer_offsets AS o"
									  "  (relay_group_id, pipeline_id, outbox_name, last_change_id, updated_at)"
									  " VALUES ($1, $4, $5, $3, pg_catalog.now())"
									  " ON CONFLICT (relay_group_id, pipeline_id, outbox_name) DO UPDATE"
									  "   SET last_change_id = greatest(o.last_change_id, EXCLUDED.last_change_id),"
									  "       updated_at = pg_catalog.now()",
									  5, argtypes),
							 values, NULL, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "could not record the offset of pipeline \"%s\"", p->name);
	}
	record_failures(p, s, RELAY_REQUEUE);
	record_failures(p, s, RELAY_DEAD);
	RelayLogAttempts(p, s, s->sent_at);
	RelayRecordHealth(p, s);
	for (i = 0; i < s->n; i++)
		if (s->disp[i] == RELAY_DONE)
			done[ndone++] = Int64GetDatum(s->msgs[i].id);
	if (ndone > 0)
	{
		static SPIPlanPtr done_plan = NULL;
		Oid			types[2] = {TEXTOID, INT8ARRAYOID};
		Datum		args[2];

		args[0] = values[3];
		args[1] = RelayMakeArray(done, NULL, ndone, INT8OID);
		if (SPI_execute_plan(TidePlan(&done_plan, "DELETE FROM tide.relay_retry_queue"
									  " WHERE pipeline_id OPERATOR(pg_catalog.=) $1"
									  "   AND message_id OPERATOR(pg_catalog.=) ANY ($2)",
									  2, types),
							 args, NULL, false, 0) != SPI_OK_DELETE)
			elog(ERROR, "could not update the retry queue of pipeline \"%s\"", p->name);
	}
	RelayEndShortXact(cxt);
}
