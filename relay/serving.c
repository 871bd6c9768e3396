/*
 * serving.c
 *		Whether a relay worker serves the current database, and why not:
 *		tide._relay_serving_state(), which relay_pipeline_status asks once
 *		per query to tell a pipeline that no worker serves ('stopped') from
 *		one that is delivering.
 *
 * The one place that decides it, from what a backend can see: the relay's
 * setting and shared memory (is pg_tide preloaded, is the server a
 * primary, is the relay on, is the database paused, does a slot hold a
 * worker of this database that has found pg_tide, is every slot taken, did
 * the launcher find no background worker free) and the catalog's version
 * against the library's (src/catalog_version.c), since a worker delivers
 * nothing while they differ. The checks go from the cause an operator fixes first
 * to the last, so the reason names the first thing to fix.
 */
#include "postgres.h"

#include "access/xlog.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "pg_tide.h"
#include "launcher.h"
#include "relay_xact.h"

PG_FUNCTION_INFO_V1(tide_relay_serving_state);

/* What the slots say about this database's worker. */
typedef enum WorkerPresence
{
	WORKER_NONE,				/* no slot holds a worker of this database */
	WORKER_STARTING,			/* it has not yet found pg_tide here */
	WORKER_SERVING				/* it runs and has found pg_tide */
} WorkerPresence;

/*
 * Looks at the slots; *slots_full says whether every slot is taken, and
 * *out_of_bgworkers whether the launcher's last start found no background
 * worker free.
 */
static WorkerPresence
worker_presence(bool *slots_full, bool *out_of_bgworkers)
{
	WorkerPresence presence = WORKER_NONE;
	int			used = 0;

	SpinLockAcquire(&Relay->mutex);
	for (int i = 0; i < Relay->nslots; i++)
	{
		RelayWorkerSlot *slot = &Relay->slots[i];

		if (!slot->in_use)
			continue;
		used++;
		if (slot->dboid != MyDatabaseId || slot->exited)
			continue;
		if (slot->pid != 0 && slot->started_at != 0 && slot->serving)
			presence = WORKER_SERVING;
		else if (presence == WORKER_NONE)
			presence = WORKER_STARTING;
	}
	*slots_full = (used >= Relay->nslots);
	*out_of_bgworkers = Relay->out_of_bgworkers;
	SpinLockRelease(&Relay->mutex);
	return presence;
}

/*
 * The reason no worker delivers in this database, or NULL when one does.
 * Needs a transaction (the catalog's version is read).
 */
static char *
not_served_reason(void)
{
	char	   *installed;
	bool		slots_full;
	bool		out_of_bgworkers;
	WorkerPresence presence;

	if (Relay == NULL)
		return pstrdup("pg_tide is not in shared_preload_libraries");
	if (RecoveryInProgress())
		return pstrdup("the server is in recovery: relay workers run only on a primary");
	if (!RelayEnabled)
		return pstrdup("pg_tide.relay_enabled is off");
	installed = TideInstalledVersion();
	if (installed != NULL && TideCompareVersions(installed, TIDE_CATALOG_VERSION) < 0)
		return psprintf("the catalog is version %s and waits for ALTER EXTENSION pg_tide UPDATE to %s",
						installed, TIDE_CATALOG_VERSION);
	if (installed != NULL && TideCompareVersions(installed, TIDE_CATALOG_VERSION) > 0)
		return psprintf("the catalog is version %s and the library only %s",
						installed, TIDE_CATALOG_VERSION);
	if (RelayDatabasePaused(MyDatabaseId, GetCurrentTimestamp()))
		return pstrdup("a command needs the database to itself (paused)");
	presence = worker_presence(&slots_full, &out_of_bgworkers);
	if (presence == WORKER_SERVING)
		return NULL;
	if (presence == WORKER_STARTING)
		return pstrdup("the relay worker for this database is starting");
	if (slots_full)
		return psprintf("no relay worker slot is free (pg_tide.max_relay_workers = %d)",
						Relay->nslots);
	if (out_of_bgworkers)
		return pstrdup("no background worker is free (max_worker_processes)");
	return pstrdup("no relay worker is running for this database");
}

/*
 * tide._relay_serving_state(): one row, state 'serving' or 'stopped', and
 * the reason when stopped. Works without preloading (and says so), so the
 * status view never fails for it.
 */
Datum
tide_relay_serving_state(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[2];
	bool		nulls[2] = {false, false};
	char	   *reason;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	reason = not_served_reason();
	values[0] = CStringGetTextDatum(reason == NULL ? "serving" : "stopped");
	if (reason != NULL)
		values[1] = CStringGetTextDatum(reason);
	else
		nulls[1] = true;
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc), values, nulls)));
}
