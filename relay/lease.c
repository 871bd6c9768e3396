/*
 * lease.c
 *		Leasing a batch for a pipeline and recording its delivery, each in a
 *		short transaction of its own, so that no transaction is open while
 *		the sink delivers.
 *
 * 1. Lease: tide.poll_outbox(consumer_group, 'relay:<pipeline>', batch_size,
 *	  RELAY_LEASE_SECONDS) claims the next batch for the pipeline's consumer
 *	  (or hands back the lease it already holds), and the rows are copied
 *	  into the caller's memory before the transaction commits.
 * 2. The caller delivers with no transaction open.
 * 3. Record: tide.commit_offset acknowledges the batch up to its last id,
 *	  which fails when the lease is no longer the consumer's, and
 *	  relay_consumer_offsets keeps the pipeline's durable offset, which only
 *	  moves forward. A failed delivery records nothing: the same consumer's
 *	  next poll returns the lease again, so every message is delivered at
 *	  least once.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "pgstat.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "relay.h"

/* Starts a short transaction with a snapshot and SPI. */
static void
begin_short_xact(const char *activity)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);
}

/* Ends the short transaction and returns to the caller's memory context. */
static void
end_short_xact(MemoryContext cxt)
{
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	MemoryContextSwitchTo(cxt);
}

/* A column's text copied into cxt, or NULL. */
static char *
copy_value(HeapTuple tup, TupleDesc desc, int col, MemoryContext cxt)
{
	char	   *v = SPI_getvalue(tup, desc, col);

	return v ? MemoryContextStrdup(cxt, v) : NULL;
}

/*
 * Leases the pipeline's next batch; returns how many messages it holds, in
 * id order, copied into cxt as *msgs.
 */
int
RelayLeaseBatch(const RelayPipeline *p, MemoryContext cxt, RelayMessage **msgs)
{
	Oid			argtypes[4] = {TEXTOID, TEXTOID, INT4OID, INT4OID};
	Datum		values[4];
	int			n;
	int			i;
	RelayMessage *out;

	begin_short_xact("pg_tide relay: leasing a batch");
	values[0] = CStringGetTextDatum(p->consumer_group);
	values[1] = CStringGetTextDatum(p->consumer);
	values[2] = Int32GetDatum(p->batch_size);
	values[3] = Int32GetDatum(RELAY_LEASE_SECONDS);
	if (SPI_execute_with_args("SELECT id, payload::text, headers::text, to_json(created_at)::text"
							  "  FROM tide.poll_outbox($1, $2, $3, $4) ORDER BY id",
							  4, argtypes, values, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not lease a batch for pipeline \"%s\"", p->name);

	n = (int) SPI_processed;
	out = MemoryContextAllocZero(cxt, sizeof(RelayMessage) * Max(n, 1));
	for (i = 0; i < n; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;

		out[i].id = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
		out[i].payload = copy_value(tup, desc, 2, cxt);
		out[i].headers = copy_value(tup, desc, 3, cxt);
		out[i].created_at = copy_value(tup, desc, 4, cxt);
	}
	end_short_xact(cxt);
	*msgs = out;
	return n;
}

/*
 * Records that the pipeline delivered its lease up to last_id: commits the
 * consumer's offset (an ERROR when the lease is no longer its own) and moves
 * the pipeline's durable offset forward. last_id 0 records no offset.
 * With disable (the receiver answered 410 Gone) the same transaction also
 * disables the pipeline.
 */
void
RelayRecordDelivered(const RelayPipeline *p, int64 last_id, bool disable, MemoryContext cxt)
{
	Oid			argtypes[5] = {TEXTOID, TEXTOID, INT8OID, TEXTOID, TEXTOID};
	Datum		values[5];

	begin_short_xact("pg_tide relay: recording a delivery");
	values[0] = CStringGetTextDatum(p->consumer_group);
	values[1] = CStringGetTextDatum(p->consumer);
	values[2] = Int64GetDatum(last_id);
	values[3] = CStringGetTextDatum(p->name);
	values[4] = CStringGetTextDatum(p->sink.outbox);
	if (disable &&
		SPI_execute_with_args("UPDATE tide.relay_outbox_config SET enabled = false WHERE name = $4",
							  5, argtypes, values, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not disable pipeline \"%s\"", p->name);
	if (last_id <= 0)
	{
		end_short_xact(cxt);
		return;
	}
	if (SPI_execute_with_args("SELECT tide.commit_offset($1, $2, $3)",
							  3, argtypes, values, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not commit the offset of pipeline \"%s\"", p->name);
	/* relay_group_id is the consumer group, as relay_set_outbox keeps it. */
	if (SPI_execute_with_args("INSERT INTO tide.relay_consumer_offsets AS o"
							  "  (relay_group_id, pipeline_id, outbox_name, last_change_id, updated_at)"
							  " VALUES ($1, $4, $5, $3, now())"
							  " ON CONFLICT (relay_group_id, pipeline_id, outbox_name) DO UPDATE"
							  "   SET last_change_id = greatest(o.last_change_id, EXCLUDED.last_change_id),"
							  "       updated_at = now()",
							  5, argtypes, values, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not record the offset of pipeline \"%s\"", p->name);
	end_short_xact(cxt);
}
