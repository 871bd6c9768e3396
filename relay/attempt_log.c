/*
 * attempt_log.c
 *		The delivery attempt log, tide.relay_attempts: one row per attempt
 *		(pipeline, message, attempt number, manual or not, success or
 *		failure, HTTP status, error class and error, latency, the first
 *		bytes of the answer), and its retention.
 *
 * The same transaction updates the pipeline's health through
 * tide._relay_after_batch (failures in a row, operator events at 50, 70, 90
 * and 100 % of alerts.failure_threshold and when retries run out,
 * auto-disable) and its counters (deliveries, failed attempts by class,
 * retries, dead letters), which do not depend on the attempt log: they
 * are exact and commit with the offsets, so a crash loses none of them.
 *
 * The rows of a batch are written with one INSERT ... SELECT FROM unnest()
 * inside the transaction that records the batch (lease.c), so the log
 * costs one statement per batch and says exactly what the offsets say. A
 * pipeline with "attempt_log": false writes none, with "failures" only the
 * rows of failed attempts (each row costs about as much as the rest of a
 * message's database work: a broker, which keeps what it was given, logs
 * failures only by default). Once a minute the worker
 * deletes rows older than pg_tide.attempt_log_retention, in bounded chunks.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "pg_tide.h"
#include "forward.h"
#include "relay_init.h"
#include "relay_xact.h"

/* Most bytes of an answer kept in the log. */
#define ATTEMPT_SNIPPET_BYTES	2048
/* Rows the retention deletes per statement, and how often it runs. */
#define ATTEMPT_TRIM_CHUNK		10000
#define ATTEMPT_TRIM_EVERY_MS	60000
/*
 * How much older than the oldest row by id another row may be: a row's id
 * is drawn when its batch is recorded, its attempted_at is when the batch
 * was sent, and a batch is recorded within its timeout_ms (at most 10
 * minutes) of being sent.
 */
#define ATTEMPT_TRIM_SKEW_SECS	3600

int			AttemptLogRetentionSecs = 7 * 24 * 3600;

/* Defines pg_tide.attempt_log_retention; called from _PG_init. */
void
RelayDefineAttemptLogGucs(void)
{
	DefineCustomIntVariable("pg_tide.attempt_log_retention",
							"How long rows of tide.relay_attempts are kept.",
							"Each relay worker deletes older rows once a minute; 0 keeps them.",
							&AttemptLogRetentionSecs,
							7 * 24 * 3600, 0, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);
}

/*
 * The answer's first bytes as text the database can store, at most
 * ATTEMPT_SNIPPET_BYTES: see RelayCleanText (clean_text.c).
 */
static char *
snippet(const char *raw)
{
	size_t		len = strlen(raw);
	char	   *out = palloc(Min(len, ATTEMPT_SNIPPET_BYTES) + 1);

	RelayCleanText(out, Min(len, ATTEMPT_SNIPPET_BYTES) + 1, raw, len);
	return out;
}

/* A one-dimensional array of n Datums of a type, with optional nulls. */
Datum
RelayMakeArray(Datum *elems, bool *nulls, int n, Oid type)
{
	int			dims[1] = {n};
	int			lbs[1] = {1};
	int16		typlen;
	bool		typbyval;
	char		typalign;

	get_typlenbyvalalign(type, &typlen, &typbyval, &typalign);
	return PointerGetDatum(construct_md_array(elems, nulls, 1, dims, lbs, type,
											  typlen, typbyval, typalign));
}

/*
 * Writes one row per attempted message of the settlement (attempt_no > 0)
 * into relay_attempts; the caller's transaction and SPI connection are
 * used. sent_at is when the batch was sent.
 */
void
RelayLogAttempts(const RelayPipeline *p, const RelaySettlement *s, TimestampTz sent_at)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[13] = {TEXTOID, TIMESTAMPTZOID, TEXTARRAYOID, INT8ARRAYOID,
		INT4ARRAYOID, BOOLARRAYOID, BOOLARRAYOID, INT4ARRAYOID, TEXTARRAYOID,
	TEXTARRAYOID, FLOAT4ARRAYOID, TEXTARRAYOID, INT4OID};
	Datum		values[13];
	Datum	   *cols[10];
	bool	   *nulls[10];
	Oid			types[10] = {TEXTOID, INT8OID, INT4OID, BOOLOID, BOOLOID, INT4OID,
	TEXTOID, TEXTOID, FLOAT4OID, TEXTOID};
	int			n = 0;
	int			c;
	int			i;

	if (!p->log_attempts)
		return;
	for (c = 0; c < 10; c++)
	{
		cols[c] = palloc(sizeof(Datum) * Max(s->n, 1));
		nulls[c] = palloc0(sizeof(bool) * Max(s->n, 1));
	}
	for (i = 0; i < s->n; i++)
	{
		const RelayMessage *m = &s->msgs[i];
		const RelayMessageOutcome *o = &s->each[i];
		bool		ok = o->outcome == RELAY_DELIVERED;

		if (s->attempt_no[i] <= 0 || (ok && !p->log_successes))
			continue;
		cols[0][n] = CStringGetTextDatum(m->outbox);
		cols[1][n] = Int64GetDatum(m->id);
		cols[2][n] = Int32GetDatum(s->attempt_no[i]);
		cols[3][n] = BoolGetDatum(m->manual);
		cols[4][n] = BoolGetDatum(ok);
		cols[5][n] = Int32GetDatum((int32) o->response_code);
		nulls[5][n] = (o->response_code == 0);
		cols[6][n] = CStringGetTextDatum(o->error_class);
		nulls[6][n] = ok || o->error_class[0] == '\0';
		cols[7][n] = CStringGetTextDatum(o->error);
		nulls[7][n] = ok || o->error[0] == '\0';
		cols[8][n] = Float4GetDatum((float4) o->latency_ms);
		cols[9][n] = o->response ? CStringGetTextDatum(snippet(o->response)) : (Datum) 0;
		nulls[9][n] = (o->response == NULL);
		n++;
	}
	if (n == 0)
		return;
	values[0] = CStringGetTextDatum(p->name);
	values[1] = TimestampTzGetDatum(sent_at);
	for (c = 0; c < 10; c++)
		values[2 + c] = RelayMakeArray(cols[c], nulls[c], n, types[c]);
	values[12] = Int32GetDatum(n);
	if (SPI_execute_plan(TidePlan(&plan, "INSERT INTO tide.relay_attempts"
							  "  (pipeline_id, outbox_name, message_id, attempt, manual, status,"
							  "   response_code, error_class, error, latency_ms, response_snippet,"
							  "   attempted_at)"
							  " SELECT $1, u.outbox, u.id, u.attempt, u.manual,"
							  "        CASE WHEN u.ok THEN 'success' ELSE 'failed' END,"
							  "        u.status, u.error_class, u.error, u.latency_ms, u.snippet, $2"
							  "   FROM ROWS FROM (pg_catalog.unnest($3), pg_catalog.unnest($4), pg_catalog.unnest($5), pg_catalog.unnest($6),"
							  "          pg_catalog.unnest($7), pg_catalog.unnest($8), pg_catalog.unnest($9), pg_catalog.unnest($10),"
							  "          pg_catalog.unnest($11), pg_catalog.unnest($12))"
							  "        AS u(outbox, id, attempt, manual, ok, status, error_class, error,"
							  "             latency_ms, snippet)",
								  12, argtypes),
						 values, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not log the delivery attempts of pipeline \"%s\"", p->name);
}

/*
 * Records the batch's effect on the pipeline's health and counters:
 * successes reset the failures in a row, a batch without one adds its
 * failed attempts; the deliveries, failed attempts by class, failures
 * queued again and dead letters are counted whatever "attempt_log" says.
 * See tide._relay_after_batch. The caller's transaction and SPI are used.
 */
void
RelayRecordHealth(const RelayPipeline *p, const RelaySettlement *s)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[13] = {TEXTOID, INT4OID, INT4OID, INT4OID, TEXTOID, TEXTOID, INT8ARRAYOID,
	TEXTOID, INT4OID, TEXTARRAYOID, INT4OID, INT4OID, INT4OID};
	Datum		values[13];
	char		nulls[13] = {' ', ' ', ' ', 'n', 'n', 'n', ' ', 'n', ' ', 'n', ' ', ' ', ' '};
	Datum	   *exhausted = palloc(sizeof(Datum) * Max(s->n, 1));
	Datum	   *classes = palloc(sizeof(Datum) * Max(s->n, 1));
	int			nexhausted = 0;
	int			failures = 0;
	int			successes = 0;
	int			retried = 0;
	int			dead = 0;
	int			expired = 0;
	int			i;

	for (i = 0; i < s->n; i++)
	{
		const RelayMessageOutcome *o = &s->each[i];

		/* a dead letter counts even without an attempt (record_each.c's bare one) */
		if (s->disp[i] == RELAY_DEAD)
			dead++;
		if (o->outcome == RELAY_EXPIRED)
			expired++;
		if (s->attempt_no[i] <= 0)
			continue;
		if (o->outcome == RELAY_DELIVERED)
		{
			successes++;
			continue;
		}
		classes[failures++] = CStringGetTextDatum(o->error_class[0] ? o->error_class : "error");
		if (s->disp[i] == RELAY_REQUEUE)
			retried++;
		values[3] = Int32GetDatum((int32) o->response_code);
		nulls[3] = o->response_code ? ' ' : 'n';
		values[4] = CStringGetTextDatum(o->error_class);
		values[5] = CStringGetTextDatum(o->error);
		nulls[4] = nulls[5] = ' ';
		if (s->disp[i] == RELAY_DEAD && strcmp(s->reason[i], "exhausted") == 0)
			exhausted[nexhausted++] = Int64GetDatum(s->msgs[i].id);
	}
	if (failures == 0 && successes == 0 && dead == 0 && s->filtered == 0)
		return;
	values[0] = CStringGetTextDatum(p->name);
	values[1] = Int32GetDatum(failures);
	values[2] = Int32GetDatum(successes);
	values[6] = RelayMakeArray(exhausted, NULL, nexhausted, INT8OID);
	values[8] = Int32GetDatum(s->filtered);
	if (s->breaker)
	{
		values[7] = CStringGetTextDatum(s->breaker);
		nulls[7] = ' ';
	}
	if (failures > 0)
	{
		values[9] = RelayMakeArray(classes, NULL, failures, TEXTOID);
		nulls[9] = ' ';
	}
	values[10] = Int32GetDatum(retried);
	values[11] = Int32GetDatum(dead);
	values[12] = Int32GetDatum(expired);
	if (SPI_execute_plan(TidePlan(&plan,
								  "SELECT tide._relay_after_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
								  13, argtypes),
						 values, nulls, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not record the health of pipeline \"%s\"", p->name);
}

/*
 * Deletes attempt rows older than pg_tide.attempt_log_retention (0 keeps
 * them), a chunk at a time, at most once a minute; in its own transaction.
 * Runs between passes, so a large backlog of old rows is worked off over
 * several passes without holding up delivery.
 */
void
RelayTrimAttemptLog(void)
{
	static TimestampTz last_trim = 0;
	static SPIPlanPtr oldest_plan = NULL;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz cutoff;
	Oid			argtypes[2] = {TIMESTAMPTZOID, INT4OID};
	Datum		values[2];
	bool		isnull;

	if (AttemptLogRetentionSecs <= 0 ||
		!TimestampDifferenceExceeds(last_trim, now, ATTEMPT_TRIM_EVERY_MS))
		return;
	last_trim = now;

	RelayBeginShortXact("pg_tide relay: trimming the attempt log");
	if (!RelayTryLockTable("relay_attempts", RowExclusiveLock))
	{
		RelayEndShortXact(CurrentMemoryContext);
		return;
	}
	/* the cutoff is computed here, so the statement needs no arithmetic */
	cutoff = now - (TimestampTz) AttemptLogRetentionSecs * USECS_PER_SEC;

	/*
	 * Nothing is due while the oldest row by id (one probe of the primary
	 * key) is younger than the cutoff by more than ATTEMPT_TRIM_SKEW_SECS.
	 * The DELETE below would find that out only by reading every row
	 * inserted since the last VACUUM: the BRIN index on attempted_at
	 * excludes only the ranges VACUUM has summarized, so after a few
	 * million deliveries that was 0.25 to 0.5 s of the worker's CPU once a
	 * minute with nothing to delete (1.5 million rows since the last
	 * VACUUM: a worker with 1,000 idle pipelines at 0.033 cores over a 20 s
	 * window holding the trim, 0.009 over one without).
	 */
	if (SPI_execute_plan(TidePlan(&oldest_plan,
								  "SELECT attempted_at FROM tide.relay_attempts ORDER BY id LIMIT 1",
								  0, NULL),
						 NULL, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the oldest row of tide.relay_attempts");
	if (SPI_processed == 0 ||
		DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)) >
		cutoff + (TimestampTz) ATTEMPT_TRIM_SKEW_SECS * USECS_PER_SEC)
	{
		RelayEndShortXact(CurrentMemoryContext);
		return;
	}
	values[0] = TimestampTzGetDatum(cutoff);
	values[1] = Int32GetDatum(ATTEMPT_TRIM_CHUNK);
	if (SPI_execute_with_args("DELETE FROM tide.relay_attempts WHERE id OPERATOR(pg_catalog.=) ANY ("
							  " SELECT id FROM tide.relay_attempts"
							  "  WHERE attempted_at OPERATOR(pg_catalog.<) $1"
							  "  LIMIT $2)",
							  2, argtypes, values, NULL, false, 0) != SPI_OK_DELETE)
		elog(ERROR, "could not trim tide.relay_attempts");
	/* More than a chunk was due: the next pass goes on. */
	if (SPI_processed == ATTEMPT_TRIM_CHUNK)
		last_trim = 0;
	RelayEndShortXact(CurrentMemoryContext);
}
