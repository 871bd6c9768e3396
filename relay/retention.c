/*
 * retention.c
 *		The relay worker runs tide.outbox_sweep() on its own: every
 *		pg_tide.sweep_interval, in a short transaction of its own, it deletes
 *		the messages past their outbox's retention_hours that every
 *		participant has passed (see the Retention section of the install
 *		script). When a sweep stops at its cap with more to do, the next pass
 *		goes on instead of waiting for the interval.
 *
 *		Before that, at most once a second, it runs
 *		tide._outbox_partitions_maintain(), which makes the child tables of
 *		tide_outbox_messages ahead of the ids handed out (src/partitions.c):
 *		publishes find their child made, and a child that no participant
 *		needs any more is dropped whole by the sweep.
 *
 *		With the sweep, it deletes every inbox's processed and
 *		dead-lettered events past the inbox's processed_retention_hours and
 *		dlq_retention_hours (0 keeps them), at most INBOX_TRIM_LIMIT per
 *		inbox in a pass, in a short transaction of its own.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "pg_tide.h"
#include "relay_init.h"
#include "relay_xact.h"

int			SweepIntervalSecs = 60;

/* Defines pg_tide.sweep_interval; called from _PG_init. */
void
RelayDefineRetentionGucs(void)
{
	DefineCustomIntVariable("pg_tide.sweep_interval",
							"How often each relay worker runs tide.outbox_sweep().",
							"It deletes messages past their outbox's retention_hours that every "
							"consumer group has passed; 0 leaves sweeping to the operator.",
							&SweepIntervalSecs,
							60, 0, 86400,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);
}

/* The last sweep stopped at its cap with more to do. */
static bool sweep_more = false;

/* The last trim of the inboxes stopped at its cap with more to do. */
static bool inbox_trim_more = false;

/* The most events one pass deletes from one inbox. */
#define INBOX_TRIM_LIMIT 10000

/* How often the child tables are made ahead, at most. */
#define MAINTAIN_INTERVAL_MS 1000

/* Makes the child tables ahead of the ids handed out, when it is due. */
static void
maintain_partitions(TimestampTz now)
{
	static TimestampTz last_maintained = 0;
	static SPIPlanPtr plan = NULL;

	if (!TimestampDifferenceExceeds(last_maintained, now, MAINTAIN_INTERVAL_MS))
		return;
	last_maintained = now;

	/*
	 * Under the turn's lock on the extension, taken before the schema that
	 * CREATE TABLE locks, as DROP EXTENSION takes them (extension_lock.c;
	 * TAP 011 saw the two deadlock when the worker took the schema first).
	 */
	RelayBeginShortXact("pg_tide relay: making message partitions");
	if (RelayTryLockTable("tide_outbox_partitions", AccessShareLock))
	{
		if (SPI_execute_plan(TidePlan(&plan, "SELECT tide._outbox_partitions_maintain()", 0, NULL),
							 NULL, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not make the partitions of tide.tide_outbox_messages");
	}
	RelayEndShortXact(CurrentMemoryContext);
}

/* Deletes the inboxes' events past their retention; see the top of this file. */
static void
trim_inboxes(void)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[1] = {INT4OID};
	Datum		args[1] = {Int32GetDatum(INBOX_TRIM_LIMIT)};
	bool		isnull;

	RelayBeginShortXact("pg_tide relay: deleting old inbox events");
	if (RelayTryLockTable("tide_inbox_config", AccessShareLock))
	{
		if (SPI_execute_plan(TidePlan(&plan, "SELECT tide._inbox_retention($1)", 1, argtypes),
							 args, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not delete the old events of the inboxes");
		inbox_trim_more = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)) &&
			!isnull;
	}
	RelayEndShortXact(CurrentMemoryContext);
}

/* Runs tide.outbox_sweep() when it is due; see the top of this file. */
void
RelaySweepOutboxes(void)
{
	static TimestampTz last_sweep = 0;
	static SPIPlanPtr plan = NULL;
	TimestampTz now = GetCurrentTimestamp();
	bool		isnull;

	maintain_partitions(now);

	if (SweepIntervalSecs <= 0 ||
		!TimestampDifferenceExceeds(last_sweep, now, SweepIntervalSecs * 1000))
		return;
	last_sweep = now;

	RelayBeginShortXact("pg_tide relay: sweeping outboxes");
	if (RelayTryLockTable("tide_outbox_messages", RowExclusiveLock))
	{
		if (SPI_execute_plan(TidePlan(&plan, "SELECT tide.outbox_sweep() OPERATOR(pg_catalog.->>) 'more'"
									  "  OPERATOR(pg_catalog.=) 'true'",
									  0, NULL),
							 NULL, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not sweep the outboxes");
		/* Stopped at its cap: the next pass goes on. */
		sweep_more = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)) &&
			!isnull;
	}
	RelayEndShortXact(CurrentMemoryContext);
	trim_inboxes();
	if (sweep_more || inbox_trim_more)
		last_sweep = 0;
}

/*
 * Whether the last sweep stopped at its cap with more to do: a worker
 * without pipelines stays until it has finished (on_demand.c).
 */
bool
RelaySweepHasMore(void)
{
	return (sweep_more || inbox_trim_more) && SweepIntervalSecs > 0;
}
