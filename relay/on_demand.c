/*
 * on_demand.c
 *		Relay workers only where there is work: a worker whose database has
 *		no enabled pipeline does the database's periodic jobs and leaves, so
 *		that a database without pipelines holds no background worker slot at
 *		rest.
 *
 * The launcher is connected to no database and cannot read a database's
 * pipelines, so the workers tell it, and nothing is left without a worker:
 *
 * 1. After every server start (and launcher start) the launcher knows
 *	  nothing and starts a worker for every database, as it always did; that
 *	  worker reads the pipelines. With none enabled it runs the periodic jobs
 *	  (partitions made ahead, the attempt-log trim, the sweep: they are due
 *	  at a worker's first reading), looks once more (below), and leaves with
 *	  RELAY_EXIT_IDLE.
 * 2. A worker leaves idle only after a look that saw no enabled pipeline
 *	  under a lock on relay_outbox_config (a look that cannot take the lock
 *	  keeps the worker), and it records when that look began (looked_at,
 *	  before its snapshot).
 * 3. Every transaction that changes a pipeline (relay_set_outbox,
 *	  relay_enable, a row written by hand: the row's trigger) asks the
 *	  launcher, at its commit, to look at the database again (backend.c);
 *	  the launcher then starts a worker for it at once. A recheck asked
 *	  after a leaving worker's look began may not have been seen by that
 *	  look: the launcher does not count that worker's exit as idle and
 *	  starts another at once (launcher.c, launcher_note_idle).
 * 4. A flow whose rows need a worker at a time (a scheduled message:
 *	  units_due_at) is told by the leaving worker's look, which gives the
 *	  launcher the earliest such time in its slot; a commit that scheduled
 *	  a message gives it with its recheck. The launcher starts a worker
 *	  RELAY_SCHEDULE_LEAD_MS before that time, which stays until it.
 * 5. An idle database gets a worker again after RelayIdleLookMs() for its
 *	  periodic jobs; that look also catches anything the steps above could
 *	  miss (a full request table falls back to looking at every database,
 *	  a launcher started anew knows no due time and starts a worker for
 *	  every database, whose look tells it again).
 *
 * Publishing never needs a worker: without a child table made ahead it
 * writes into the parent table (src/partitions.c).
 */
#include "postgres.h"

#include "executor/spi.h"
#include "storage/lockdefs.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "flow.h"
#include "pg_tide.h"
#include "launcher.h"
#include "relay_xact.h"

/* How long a database without an enabled pipeline goes without a worker. */
long
RelayIdleLookMs(void)
{
	if (SweepIntervalSecs > 0)
		return Min((long) SweepIntervalSecs * 1000L, (long) RELAY_IDLE_LOOK_MAX_MS);
	return RELAY_IDLE_LOOK_MAX_MS;
}

/*
 * The earliest time a flow's table will next need a worker (units_due_at),
 * read in the look's transaction after no_enabled_unit saw none now; 0:
 * none.
 */
static TimestampTz
units_next_due(void)
{
	static SPIPlanPtr plans[RELAY_MAX_FLOWS];
	TimestampTz due_at = 0;

	for (int i = 0; RelayFlows[i] != NULL; i++)
	{
		bool		isnull;
		Datum		at;

		if (RelayFlows[i]->units_due_at == NULL)
			continue;
		if (SPI_execute_plan(TidePlan(&plans[i], RelayFlows[i]->units_due_at, 0, NULL),
							 NULL, NULL, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "could not read when tide.%s next needs a relay worker",
				 RelayFlows[i]->units_table);
		at = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		if (!isnull && (due_at == 0 || DatumGetTimestampTz(at) < due_at))
			due_at = DatumGetTimestampTz(at);
	}
	return due_at;
}

/*
 * Whether the database has no enabled unit of any flow (flows.c: forward
 * pipelines, and the units of the flows of the second direction), seen
 * under a lock on each flow's table; false when a lock cannot be had now,
 * and while the catalog is not the library's version: that worker waits
 * for ALTER EXTENSION pg_tide UPDATE and says so once (units.c), and an
 * older catalog's trigger may not ask the launcher to look again. When
 * none, *due_at is when a unit will next need a worker (0: none known).
 */
static bool
no_enabled_unit(TimestampTz *due_at)
{
	static SPIPlanPtr plans[RELAY_MAX_FLOWS];
	bool		none = false;
	char	   *installed;

	RelayBeginShortXact("pg_tide relay: looking for enabled pipelines");
	installed = TideInstalledVersion();
	if (installed != NULL && TideCompareVersions(installed, TIDE_CATALOG_VERSION) == 0)
	{
		none = true;
		for (int i = 0; none && RelayFlows[i] != NULL; i++)
		{
			const char *table = RelayFlows[i]->units_table;
			bool		isnull;

			Assert(i < RELAY_MAX_FLOWS);
			if (table == NULL)
				continue;
			if (!RelayTryLockTable(table, AccessShareLock))
			{
				none = false;
				break;
			}
			if (plans[i] == NULL)
				TidePlan(&plans[i], psprintf("SELECT NOT EXISTS (SELECT FROM tide.%s WHERE %s)",
											 quote_identifier(table),
											 RelayFlows[i]->units_wanted ? RelayFlows[i]->units_wanted : "enabled"),
						 0, NULL);
			if (SPI_execute_plan(plans[i], NULL, NULL, true, 1) != SPI_OK_SELECT)
				elog(ERROR, "could not read tide.%s", table);
			none = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)) &&
				!isnull;
		}
		if (none)
			*due_at = units_next_due();
	}
	RelayEndShortXact(CurrentMemoryContext);
	return none;
}

/*
 * Called after each reading of the pipelines: records in the worker's slot
 * whether the database has an enabled pipeline, and says whether the
 * worker is to leave because it has none, nothing in flight and no sweep
 * left unfinished (see the top of this file).
 */
bool
RelayLeaveWhenIdle(RelayWorkerSlot *slot, bool any_enabled, int in_flight)
{
	TimestampTz looked_at;
	TimestampTz due_at = 0;

	SpinLockAcquire(&Relay->mutex);
	slot->busy = any_enabled;
	SpinLockRelease(&Relay->mutex);
	if (any_enabled || in_flight > 0 || RelaySweepHasMore())
		return false;

	/* before the look's snapshot: a pipeline committed earlier is seen */
	looked_at = GetCurrentTimestamp();
	if (!no_enabled_unit(&due_at))
		return false;
	SpinLockAcquire(&Relay->mutex);
	slot->looked_at = looked_at;
	slot->due_at = due_at;
	SpinLockRelease(&Relay->mutex);
	return true;
}
