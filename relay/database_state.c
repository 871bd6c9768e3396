/*
 * database_state.c
 *		tide._relay_database_state(): whether the relay serves the current
 *		database, and if not, why.
 *
 * A database the relay does not serve delivers nothing, and nothing in the
 * database itself says so: its pipelines are enabled, its messages wait.
 * This function tells it from the relay's shared memory and the catalog,
 * for the status views and for an operator. Its contract:
 *
 *	 state		'served': at least one relay worker serves the database;
 *				anything else means none does, and names why:
 *				'not_preloaded'   pg_tide is not in shared_preload_libraries
 *				'standby'         the server is in recovery (workers run on a primary)
 *				'relay_off'       pg_tide.relay_enabled is off
 *				'paused'          DROP DATABASE and the like stopped the worker for a while
 *				'update_needed'   the catalog is older than the library: ALTER EXTENSION pg_tide UPDATE
 *				'library_older'   the catalog is newer than the library
 *				'no_worker_slot'  every one of pg_tide.max_relay_workers (or of
 *								  max_worker_processes) is taken by other databases
 *				'starting'        a worker is being started, or will be within seconds
 *	 workers	how many relay workers serve the database now
 *	 wanted		pg_tide.relay_workers_per_database
 *	 detail		a sentence for a person
 *
 * It reads shared memory under the relay's spinlock and runs no SQL.
 */
#include "postgres.h"

#include "access/xlog.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "pg_tide.h"
#include "relay.h"

PG_FUNCTION_INFO_V1(tide_relay_database_state);

/* How many of this database's workers run (and serve), and whether a slot is free. */
static void
count_workers(int *live, int *serving, bool *slot_free, bool *out_of_bgworkers)
{
	*live = 0;
	*serving = 0;
	*slot_free = false;
	SpinLockAcquire(&Relay->mutex);
	for (int i = 0; i < Relay->nslots; i++)
	{
		RelayWorkerSlot *slot = &Relay->slots[i];

		if (!slot->in_use)
			*slot_free = true;
		else if (slot->dboid == MyDatabaseId && !slot->exited)
		{
			(*live)++;
			if (slot->serving && slot->pid != 0)
				(*serving)++;
		}
	}
	*out_of_bgworkers = Relay->out_of_bgworkers;
	SpinLockRelease(&Relay->mutex);
}

/* The state and its detail (see the top of this file); *workers the serving ones. */
static const char *
database_state(int *workers, char **detail)
{
	char	   *installed;
	int			cmp;
	int			live;
	bool		slot_free;
	bool		out_of_bgworkers;

	*workers = 0;
	if (!TidePreloaded || Relay == NULL)
	{
		*detail = pstrdup("pg_tide is not in shared_preload_libraries: there is no relay.");
		return "not_preloaded";
	}
	if (RecoveryInProgress())
	{
		*detail = pstrdup("The server is in recovery; relay workers run only on a primary.");
		return "standby";
	}
	if (!RelayEnabled)
	{
		*detail = pstrdup("pg_tide.relay_enabled is off.");
		return "relay_off";
	}
	if (RelayDatabasePaused(MyDatabaseId, GetCurrentTimestamp()))
	{
		*detail = pstrdup("A command that needs the database to itself stopped its relay workers for a few seconds.");
		return "paused";
	}
	installed = TideInstalledVersion();
	cmp = installed ? TideCompareVersions(installed, TIDE_CATALOG_VERSION) : 0;
	if (cmp < 0)
	{
		*detail = psprintf("The database's pg_tide catalog is version %s, the library's is %s: run ALTER EXTENSION pg_tide UPDATE.",
						   installed, TIDE_CATALOG_VERSION);
		return "update_needed";
	}
	if (cmp > 0)
	{
		*detail = psprintf("The database's pg_tide catalog is version %s, the library's is %s: install the newer library and restart the server.",
						   installed, TIDE_CATALOG_VERSION);
		return "library_older";
	}

	count_workers(&live, workers, &slot_free, &out_of_bgworkers);
	if (*workers > 0)
	{
		*detail = psprintf("Served by %d of the %d relay workers pg_tide.relay_workers_per_database asks for.",
						   *workers, RelayWorkersPerDatabase);
		return "served";
	}
	if (live > 0)
	{
		*detail = pstrdup("Its relay worker is starting.");
		return "starting";
	}
	if (RelayMaxWorkers == 0 || !slot_free)
	{
		*detail = psprintf("All %d relay workers (pg_tide.max_relay_workers) serve other databases; raise pg_tide.max_relay_workers and max_worker_processes.",
						   RelayMaxWorkers);
		return "no_worker_slot";
	}
	if (out_of_bgworkers)
	{
		*detail = pstrdup("No background worker is free; raise max_worker_processes.");
		return "no_worker_slot";
	}
	*detail = pstrdup("The launcher starts its relay worker within a few seconds.");
	return "starting";
}

/*
 * tide._relay_database_state(): one row, whether and why the relay serves
 * the current database.
 */
Datum
tide_relay_database_state(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4] = {false};
	int			workers;
	char	   *detail;
	const char *state;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	state = database_state(&workers, &detail);
	values[0] = CStringGetTextDatum(state);
	values[1] = Int32GetDatum(workers);
	values[2] = Int32GetDatum(TidePreloaded ? RelayWorkersPerDatabase : 0);
	values[3] = CStringGetTextDatum(detail);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc), values, nulls)));
}
