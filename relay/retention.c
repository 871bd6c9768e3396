/*
 * retention.c
 *		The relay worker runs tide.outbox_sweep() on its own: every
 *		pg_tide.sweep_interval, in a short transaction of its own, it deletes
 *		the messages past their outbox's retention_hours that every
 *		participant has passed (see the Retention section of the install
 *		script). When a sweep stops at its cap with more to do, the next pass
 *		goes on instead of waiting for the interval.
 */
#include "postgres.h"

#include "executor/spi.h"
#include "utils/timestamp.h"

#include "pg_tide.h"
#include "relay.h"

int			SweepIntervalSecs = 60;

/* Runs tide.outbox_sweep() when it is due; see the top of this file. */
void
RelaySweepOutboxes(void)
{
	static TimestampTz last_sweep = 0;
	static SPIPlanPtr plan = NULL;
	TimestampTz now = GetCurrentTimestamp();
	bool		isnull;

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
		if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)) &&
			!isnull)
			last_sweep = 0;
	}
	RelayEndShortXact(CurrentMemoryContext);
}
