/*
 * worker_slots.c
 *		tide._relay_check_worker_slots(): a WARNING, when a pipeline is
 *		enabled (relay_set_outbox, relay_enable, a row written by hand), that
 *		no background worker slot is free for its database's relay workers,
 *		so that the pipeline would deliver nothing.
 *
 * A database holds relay workers only while it has an enabled pipeline
 * (on_demand.c), so enabling the first one is when a slot is needed. What
 * pg_tide needs of max_worker_processes now: the launcher, plus
 * pg_tide.relay_workers_per_database workers for each database with an
 * enabled pipeline (the databases whose workers said so in shared memory,
 * and this one). The free slots are max_worker_processes less the
 * background workers that run (of pg_tide and of anything else: parallel
 * query, logical replication, pg_cron), and pg_tide.max_relay_workers less
 * the relay slots in use.
 */
#include "postgres.h"

#include "commands/dbcommands.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "utils/backend_status.h"

#include "pg_tide.h"
#include "launcher.h"
#include "relay_xact.h"

PG_FUNCTION_INFO_V1(tide_relay_check_worker_slots);

#if PG_VERSION_NUM >= 160000
#define local_beentry(i) pgstat_get_local_beentry_by_index(i)
#else
#define local_beentry(i) pgstat_fetch_stat_local_beentry(i)
#endif

/* How many background workers of any kind run in the cluster now. */
static int
running_background_workers(void)
{
	int			n = 0;
	int			nbackends = pgstat_fetch_stat_numbackends();

	for (int i = 1; i <= nbackends; i++)
	{
		LocalPgBackendStatus *local = local_beentry(i);

		if (local != NULL && local->backendStatus.st_backendType == B_BG_WORKER)
			n++;
	}
	return n;
}

/* What the relay's shared memory says of the workers, for the check. */
typedef struct SlotCount
{
	int			mine;			/* this database's relay workers */
	int			in_use;			/* relay slots taken */
	int			busy_databases; /* with an enabled pipeline, this one included */
	bool		launcher;		/* the launcher runs */
} SlotCount;

/* Counts the relay's slots (see SlotCount). */
static SlotCount
count_slots(void)
{
	SlotCount	c = {0};
	Oid		   *busy = palloc(sizeof(Oid) * (Relay->nslots + 1));

	busy[c.busy_databases++] = MyDatabaseId;
	SpinLockAcquire(&Relay->mutex);
	c.launcher = Relay->launcher_pid != 0;
	for (int i = 0; i < Relay->nslots; i++)
	{
		RelayWorkerSlot *slot = &Relay->slots[i];
		bool		known = false;

		if (!slot->in_use)
			continue;
		c.in_use++;
		if (slot->exited)
			continue;
		if (slot->dboid == MyDatabaseId)
			c.mine++;
		if (!slot->busy)
			continue;
		for (int j = 0; j < c.busy_databases; j++)
			known |= busy[j] == slot->dboid;
		if (!known)
			busy[c.busy_databases++] = slot->dboid;
	}
	SpinLockRelease(&Relay->mutex);
	pfree(busy);
	return c;
}

/*
 * tide._relay_check_worker_slots(): called by the trigger on
 * relay_outbox_config for a row that is enabled; warns when this
 * database's relay workers cannot all get a slot (see the top of this
 * file). Nothing while the relay is switched off or not preloaded.
 */
Datum
tide_relay_check_worker_slots(PG_FUNCTION_ARGS)
{
	SlotCount	c;
	int			running;
	int			missing_workers;
	int			missing;
	int			needed;
	int			free_slots;

	if (!TidePreloaded || Relay == NULL || !RelayEnabled)
		PG_RETURN_VOID();

	c = count_slots();
	running = running_background_workers();
	missing_workers = Max(RelayWorkersPerDatabase - c.mine, 0);
	missing = missing_workers + (c.launcher ? 0 : 1);
	needed = 1 + c.busy_databases * RelayWorkersPerDatabase;
	free_slots = Max(max_worker_processes - running, 0);
	if (missing == 0)
		PG_RETURN_VOID();

	if (missing > free_slots)
		ereport(WARNING,
				(errcode(ERRCODE_WARNING),
				 errmsg("no background worker slot is free for the relay of database \"%s\"",
						get_database_name(MyDatabaseId)),
				 errdetail("pg_tide needs %d of max_worker_processes (%d) now: the launcher and %d relay worker%s for each of the %d database%s with an enabled pipeline; %d background workers run.",
						   needed, max_worker_processes, RelayWorkersPerDatabase,
						   RelayWorkersPerDatabase == 1 ? "" : "s",
						   c.busy_databases, c.busy_databases == 1 ? "" : "s", running),
				 errhint("Raise max_worker_processes to at least %d plus what other background workers need, and restart the server; until then the pipeline delivers nothing.",
						 needed)));
	else if (missing_workers > RelayMaxWorkers - c.in_use)
		ereport(WARNING,
				(errcode(ERRCODE_WARNING),
				 errmsg("no relay worker slot is free for database \"%s\"",
						get_database_name(MyDatabaseId)),
				 errdetail("pg_tide needs %d relay workers now (%d for each of the %d database%s with an enabled pipeline); pg_tide.max_relay_workers is %d and %d are in use.",
						   needed - 1, RelayWorkersPerDatabase, c.busy_databases,
						   c.busy_databases == 1 ? "" : "s", RelayMaxWorkers, c.in_use),
				 errhint("Raise pg_tide.max_relay_workers and max_worker_processes and restart the server; until then the pipeline delivers nothing.")));
	PG_RETURN_VOID();
}
