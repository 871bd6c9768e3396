/*
 * launcher.c
 *		The relay launcher: one background worker, connected to no database,
 *		that keeps pg_tide.relay_workers_per_database relay workers running
 *		per database where pg_tide has an enabled pipeline, starts one now
 *		and then for the periodic jobs of the others (on_demand.c), and the
 *		relay's shared memory and settings. What ordinary backends do to
 *		talk to it is in backend.c.
 *
 * The launcher works in passes, every few seconds, whenever its latch is
 * set (a worker started or ended, CREATE EXTENSION, a paused database),
 * and when a database's scheduled message needs a worker (on_demand.c):
 *
 * 1. Reap: free the slot of every worker that has ended and remember why.
 *	  A worker that found no pg_tide marks its database "without pg_tide",
 *	  unless CREATE EXTENSION asked for a new look after it was started.
 *	  A worker that found no enabled pipeline marks its database idle for
 *	  RelayIdleLookMs(), unless a recheck came after its look began.
 * 2. Requests: take the recheck requests that CREATE EXTENSION and
 *	  pipeline changes left in shared memory (sent at commit, so the new
 *	  worker sees them); a recheck ends a database's idle time.
 * 3. Scan pg_database (a shared catalog, readable without a database) and
 *	  forget the databases that are gone.
 * 4. Start a worker for every connectable, non-template database that has
 *	  none, is not known to lack pg_tide, is not idle, is not paused and
 *	  did not just fail, up to pg_tide.max_relay_workers (an idle
 *	  database whose scheduled message is due within
 *	  RELAY_SCHEDULE_LEAD_MS is not idle); then, with the
 *	  slots left, the further workers of the databases whose worker found
 *	  an enabled pipeline, each with the lowest worker_index missing
 *	  (ownership.c shares out the pipelines).
 *	  A database left without a worker for RELAY_UNSERVED_GRACE_MS is
 *	  logged, once, and again when it gets one.
 *
 * Workers end on their own: SIGTERM, pg_tide.relay_enabled = off, DROP
 * EXTENSION, a pause, or a relay_workers_per_database lowered below their
 * worker_index. A pause is how DROP DATABASE, ALTER DATABASE ...
 * RENAME / SET TABLESPACE and CREATE DATABASE ... TEMPLATE get their
 * database to themselves: PostgreSQL does not terminate background workers
 * for those commands, so a ProcessUtility hook (backend.c) pauses
 * the database, terminates its worker, and waits, bounded, until it has
 * gone before it lets the command run.
 */
#include "postgres.h"


#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "pg_tide.h"
#include "launcher.h"
#include "relay_init.h"
#include "relay_xact.h"

bool		RelayEnabled = true;
char	   *OperatorEventsOutbox = NULL;
int			RelayMaxWorkers = 8;
int			RelayWorkersPerDatabase = 1;

RelayShared *Relay = NULL;

/* What the launcher knows about one database (launcher-local). */
typedef struct LauncherDb
{
	Oid			dboid;			/* hash key */
	bool		seen;			/* found by the current scan */
	bool		no_extension;	/* a worker found no pg_tide; wait for a recheck */
	TimestampTz last_recheck;	/* newest recheck request taken */
	TimestampTz backoff_until;	/* a worker failed: do not restart before */
	bool		has_extension;	/* a worker found pg_tide, or CREATE EXTENSION said so */
	TimestampTz idle_until;		/* no enabled pipeline: no worker before (on_demand.c) */
	TimestampTz due_at;			/* a scheduled message is due: a worker then; 0: none */
	TimestampTz unserved_since; /* 0: not waiting for a free worker */
	bool		unserved_logged;	/* the wait was logged */
	NameData	datname;		/* from the last scan */
} LauncherDb;

/* Launcher-local: the databases and the handle of the worker in each slot. */
static HTAB *launcher_dbs = NULL;
static BackgroundWorkerHandle **launcher_handles = NULL;
static bool launcher_out_of_workers = false;


/* ------------------------------------------------------------------------
 * Settings and shared memory
 * ------------------------------------------------------------------------
 */

/*
 * Defines the settings of the launcher and its workers; called from
 * _PG_init when preloaded. Each other relay module defines its own.
 */
void
RelayDefineLauncherGucs(void)
{
	DefineCustomBoolVariable("pg_tide.relay_enabled",
							 "Whether the relay workers run.",
							 "Off stops every relay worker without a restart; on starts them again.",
							 &RelayEnabled,
							 true,
							 PGC_SIGHUP, 0,
							 NULL, NULL, NULL);
	DefineCustomStringVariable("pg_tide.operator_events_outbox",
							   "The outbox that relay operator events are published to.",
							   "Events when a pipeline's failures in a row reach 50, 70, 90 and 100 % "
							   "of its alerts.failure_threshold, when retries run out, and when a "
							   "pipeline is disabled or enabled. Empty: no events.",
							   &OperatorEventsOutbox,
							   "",
							   PGC_SUSET, 0,
							   NULL, NULL, NULL);

	DefineCustomIntVariable("pg_tide.max_relay_workers",
							"Most relay workers that run at the same time.",
							"One worker serves one database; each also takes one of "
							"max_worker_processes.",
							&RelayMaxWorkers,
							8, 0, 1024,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("pg_tide.relay_workers_per_database",
							"How many relay workers serve each database with pg_tide.",
							"Each pipeline is served by one of them at a time, chosen by its "
							"name; all count against pg_tide.max_relay_workers.",
							&RelayWorkersPerDatabase,
							1, 1, RELAY_MAX_WORKERS_PER_DATABASE,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);
}

/* Shared memory for the launcher and one slot per relay worker. */
Size
RelayShmemSize(void)
{
	return add_size(offsetof(RelayShared, slots),
					mul_size(RelayMaxWorkers, sizeof(RelayWorkerSlot)));
}

/* Lays out the relay's shared memory on first attach. */
void
RelayShmemInit(void *place, bool found)
{
	Relay = (RelayShared *) place;
	if (found)
		return;
	memset(Relay, 0, RelayShmemSize());
	SpinLockInit(&Relay->mutex);
	Relay->nslots = RelayMaxWorkers;
	pg_atomic_init_u64(&Relay->wake_requests, 0);
	for (int i = 0; i < Relay->nslots; i++)
	{
		pg_atomic_init_u64(&Relay->slots[i].passes, 0);
		pg_atomic_init_u64(&Relay->slots[i].wakeups, 0);
	}
}

/* Registers the launcher with the postmaster; called from _PG_init. */
void
RelayRegisterLauncher(void)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 10;
	strlcpy(worker.bgw_library_name, "pg_tide", sizeof(worker.bgw_library_name));
	strlcpy(worker.bgw_function_name, "RelayLauncherMain", sizeof(worker.bgw_function_name));
	strlcpy(worker.bgw_name, "pg_tide launcher", sizeof(worker.bgw_name));
	strlcpy(worker.bgw_type, "pg_tide launcher", sizeof(worker.bgw_type));
	RegisterBackgroundWorker(&worker);
}

/*
 * The request entry of a database, or NULL; with `create`, a free entry is
 * taken for it. Caller holds Relay->mutex.
 */
RelayDbRequest *
RelayFindRequest(Oid dboid, bool create, TimestampTz now)
{
	RelayDbRequest *free_entry = NULL;
	RelayDbRequest *oldest = NULL;

	for (int i = 0; i < RELAY_MAX_DB_REQUESTS; i++)
	{
		RelayDbRequest *r = &Relay->requests[i];

		if (r->dboid == dboid)
			return r;
		if (r->dboid == InvalidOid ||
			(r->paused_until <= now && r->recheck_at == 0))
		{
			if (free_entry == NULL)
				free_entry = r;
		}
		else if (r->recheck_at == 0 &&
				 (oldest == NULL || r->paused_until < oldest->paused_until))
			oldest = r;
	}
	if (!create)
		return NULL;
	/* Full: a pause that ends soonest gives way (a recheck never does). */
	if (free_entry == NULL)
		free_entry = oldest;
	if (free_entry != NULL)
	{
		free_entry->dboid = dboid;
		free_entry->paused_until = 0;
		free_entry->recheck_at = 0;
	}
	return free_entry;
}

/* Whether a database's worker must stay stopped for now. */
bool
RelayDatabasePaused(Oid dboid, TimestampTz now)
{
	bool		paused = false;

	if (Relay == NULL)
		return false;
	SpinLockAcquire(&Relay->mutex);
	for (int i = 0; i < RELAY_MAX_DB_REQUESTS; i++)
	{
		if (Relay->requests[i].dboid == dboid)
		{
			paused = Relay->requests[i].paused_until > now;
			break;
		}
	}
	SpinLockRelease(&Relay->mutex);
	return paused;
}

/* Sets the launcher's latch, if there is a launcher. */
void
RelayWakeLauncher(void)
{
	Latch	   *latch;

	SpinLockAcquire(&Relay->mutex);
	latch = Relay->launcher_latch;
	SpinLockRelease(&Relay->mutex);
	if (latch != NULL)
		SetLatch(latch);
}

/* ------------------------------------------------------------------------
 * The launcher
 * ------------------------------------------------------------------------
 */

/* The launcher's entry for a database, created when missing. */
static LauncherDb *
launcher_db(Oid dboid)
{
	bool		found;
	LauncherDb *db = hash_search(launcher_dbs, &dboid, HASH_ENTER, &found);

	if (!found)
	{
		db->no_extension = false;
		db->last_recheck = 0;
		db->backoff_until = 0;
		db->seen = false;
		db->has_extension = false;
		db->idle_until = 0;
		db->due_at = 0;
		db->unserved_since = 0;
		db->unserved_logged = false;
		namestrcpy(&db->datname, "");
	}
	return db;
}

/* Tells the shared memory that there is no launcher any more. */
static void
launcher_exit(int code, Datum arg)
{
	SpinLockAcquire(&Relay->mutex);
	Relay->launcher_pid = 0;
	Relay->launcher_latch = NULL;
	SpinLockRelease(&Relay->mutex);
}

/* The earlier of two due times, where 0 is none. */
static TimestampTz
earlier_due(TimestampTz a, TimestampTz b)
{
	if (a == 0)
		return b;
	if (b == 0)
		return a;
	return Min(a, b);
}

/*
 * A worker left because its database has no enabled pipeline: the
 * database gets none until its periodic jobs are due again or its next
 * scheduled message (due_at, seen by the worker's look) is, unless a
 * recheck (a pipeline changed) was asked after the worker's look began,
 * which that look may have missed: then another starts at once.
 */
static void
launcher_note_idle(LauncherDb *db, TimestampTz looked_at, TimestampTz due_at, TimestampTz now)
{
	if (looked_at < db->last_recheck)
	{
		db->due_at = earlier_due(db->due_at, due_at);
		return;
	}
	db->idle_until = TimestampTzPlusMilliseconds(now, RelayIdleLookMs());
	/* the look saw every message scheduled before it began */
	db->due_at = due_at;
}

/* Pass phase 1: frees the slots of workers that have ended. */
static void
launcher_reap(TimestampTz now)
{
	for (int i = 0; i < Relay->nslots; i++)
	{
		RelayWorkerSlot *slot = &Relay->slots[i];
		bool		in_use;
		bool		exited;
		bool		gone = false;
		Oid			dboid;
		pid_t		pid;
		TimestampTz registered_at;
		RelayExitReason reason;
		bool		serving;
		TimestampTz looked_at;
		TimestampTz due_at;

		SpinLockAcquire(&Relay->mutex);
		in_use = slot->in_use;
		serving = slot->serving;
		exited = slot->exited;
		dboid = slot->dboid;
		pid = slot->pid;
		registered_at = slot->registered_at;
		reason = slot->exit_reason;
		looked_at = slot->looked_at;
		due_at = slot->due_at;
		SpinLockRelease(&Relay->mutex);

		if (!in_use)
			continue;
		if (!exited)
		{
			if (launcher_handles[i] != NULL)
			{
				pid_t		handle_pid;

				/* Stopped without having run: it never reached its exit hook. */
				gone = GetBackgroundWorkerPid(launcher_handles[i], &handle_pid) == BGWH_STOPPED;
			}
			else
			{
				/* Left by an earlier launcher: trust it unless it never started. */
				gone = pid == 0 && TimestampDifferenceExceeds(registered_at, now, 60 * 1000);
			}
			if (!gone)
				continue;
			reason = RELAY_EXIT_STOPPED;
		}

		if (reason == RELAY_EXIT_NO_EXTENSION)
		{
			LauncherDb *db = launcher_db(dboid);

			/* A recheck asked after this worker started wins. */
			if (registered_at >= db->last_recheck)
			{
				db->no_extension = true;
				db->has_extension = false;
			}
		}
		else if (reason == RELAY_EXIT_ERROR)
			launcher_db(dboid)->backoff_until =
				TimestampTzPlusMilliseconds(now, RELAY_ERROR_BACKOFF_MS);
		else if (reason == RELAY_EXIT_IDLE)
			launcher_note_idle(launcher_db(dboid), looked_at, due_at, now);
		if (serving && reason != RELAY_EXIT_NO_EXTENSION)
			launcher_db(dboid)->has_extension = true;

		SpinLockAcquire(&Relay->mutex);
		slot->in_use = false;
		slot->exited = false;
		slot->pid = 0;
		slot->latch = NULL;
		slot->dboid = InvalidOid;
		SpinLockRelease(&Relay->mutex);
		if (launcher_handles[i] != NULL)
		{
			pfree(launcher_handles[i]);
			launcher_handles[i] = NULL;
		}
	}
}

/* Pass phase 2: takes the recheck requests of CREATE EXTENSION. */
static void
launcher_take_requests(TimestampTz now)
{
	Oid			rechecks[RELAY_MAX_DB_REQUESTS];
	TimestampTz recheck_times[RELAY_MAX_DB_REQUESTS];
	TimestampTz due_times[RELAY_MAX_DB_REQUESTS];
	int			nrechecks = 0;
	TimestampTz recheck_all;

	SpinLockAcquire(&Relay->mutex);
	recheck_all = Relay->recheck_all_at;
	Relay->recheck_all_at = 0;
	for (int i = 0; i < RELAY_MAX_DB_REQUESTS; i++)
	{
		RelayDbRequest *r = &Relay->requests[i];

		if (r->dboid == InvalidOid)
			continue;
		if (r->recheck_at != 0)
		{
			rechecks[nrechecks] = r->dboid;
			due_times[nrechecks] = r->due_at;
			recheck_times[nrechecks++] = r->recheck_at;
			r->recheck_at = 0;
			r->due_at = 0;
		}
		if (r->paused_until <= now)
			r->dboid = InvalidOid;
	}
	SpinLockRelease(&Relay->mutex);

	for (int i = 0; i < nrechecks; i++)
	{
		LauncherDb *db = launcher_db(rechecks[i]);

		db->no_extension = false;
		db->has_extension = true;	/* CREATE EXTENSION or a pipeline change committed there */
		db->last_recheck = Max(db->last_recheck, recheck_times[i]);
		db->idle_until = 0;
		db->due_at = earlier_due(db->due_at, due_times[i]);
	}
	if (recheck_all != 0)
	{
		HASH_SEQ_STATUS status;
		LauncherDb *db;

		hash_seq_init(&status, launcher_dbs);
		while ((db = hash_seq_search(&status)) != NULL)
		{
			db->no_extension = false;
			db->last_recheck = Max(db->last_recheck, recheck_all);
			db->idle_until = 0;
		}
	}
}

/*
 * Pass phase 3: the connectable, non-template databases, from pg_database;
 * their names are kept for the log.
 */
static List *
launcher_scan_databases(MemoryContext cxt)
{
	List	   *dboids = NIL;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database form = (Form_pg_database) GETSTRUCT(tup);
		MemoryContext old;

		if (form->datistemplate || !form->datallowconn ||
			database_is_invalid_form(form))
			continue;
		launcher_db(form->oid)->datname = form->datname;
		old = MemoryContextSwitchTo(cxt);
		dboids = lappend_oid(dboids, form->oid);
		MemoryContextSwitchTo(old);
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	MemoryContextSwitchTo(cxt);
	return dboids;
}

/*
 * The worker_index bits of the database's workers that have not ended (0:
 * none); *serving tells whether one of them found pg_tide.
 */
static uint32
launcher_db_workers(Oid dboid, bool *serving, bool *busy)
{
	uint32		indexes = 0;

	*serving = false;
	*busy = false;
	SpinLockAcquire(&Relay->mutex);
	for (int i = 0; i < Relay->nslots; i++)
	{
		RelayWorkerSlot *slot = &Relay->slots[i];

		if (slot->in_use && slot->dboid == dboid)
		{
			indexes |= (uint32) 1 << slot->worker_index;
			if (slot->serving)
				*serving = true;
			if (slot->busy)
				*busy = true;
		}
	}
	SpinLockRelease(&Relay->mutex);
	return indexes;
}

/* What launcher_start_worker did. */
typedef enum LauncherStart
{
	LAUNCHER_STARTED,			/* registered */
	LAUNCHER_PAUSED,			/* the database is paused: nothing to do */
	LAUNCHER_NO_WORKER			/* no slot, or no background worker, is free */
} LauncherStart;

/* Starts relay worker `index` of a database. */
static LauncherStart
launcher_start_worker(Oid dboid, int index, TimestampTz now)
{
	BackgroundWorker worker;
	RelayWorkerSlot *slot = NULL;
	int			slotno = -1;
	uint32		generation = 0;
	bool		paused = false;
	bool		registered;
	MemoryContext old_cxt;

	SpinLockAcquire(&Relay->mutex);
	for (int i = 0; i < Relay->nslots; i++)
	{
		if (!Relay->slots[i].in_use)
		{
			slotno = i;
			break;
		}
	}
	/* Checked under the mutex, so a pause set now is seen by the worker. */
	for (int i = 0; i < RELAY_MAX_DB_REQUESTS; i++)
		if (Relay->requests[i].dboid == dboid && Relay->requests[i].paused_until > now)
			paused = true;
	if (slotno >= 0 && !paused)
	{
		slot = &Relay->slots[slotno];
		slot->in_use = true;
		slot->exited = false;
		slot->serving = false;
		slot->retiring = false;
		slot->dboid = dboid;
		slot->worker_index = index;
		slot->npipelines = 0;
		slot->busy = false;
		slot->looked_at = 0;
		slot->due_at = 0;
		slot->generation = generation = ++Relay->next_generation;
		slot->pid = 0;
		slot->latch = NULL;
		slot->registered_at = now;
		slot->started_at = 0;
		slot->exit_reason = RELAY_EXIT_STOPPED;
		pg_atomic_write_u64(&slot->passes, 0);
		pg_atomic_write_u64(&slot->wakeups, 0);
	}
	SpinLockRelease(&Relay->mutex);
	if (paused)
		return LAUNCHER_PAUSED;
	if (slot == NULL)
		return LAUNCHER_NO_WORKER;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	strlcpy(worker.bgw_library_name, "pg_tide", sizeof(worker.bgw_library_name));
	strlcpy(worker.bgw_function_name, "RelayWorkerMain", sizeof(worker.bgw_function_name));
	if (index == 0)
		snprintf(worker.bgw_name, sizeof(worker.bgw_name),
				 "pg_tide relay worker for database %u", dboid);
	else
		snprintf(worker.bgw_name, sizeof(worker.bgw_name),
				 "pg_tide relay worker %d for database %u", index, dboid);
	strlcpy(worker.bgw_type, "pg_tide relay worker", sizeof(worker.bgw_type));
	worker.bgw_main_arg = Int32GetDatum(slotno);
	memcpy(worker.bgw_extra, &generation, sizeof(generation));
	worker.bgw_notify_pid = MyProcPid;

	/* The handle outlives the pass: keep it out of the pass context. */
	old_cxt = MemoryContextSwitchTo(TopMemoryContext);
	registered = RegisterDynamicBackgroundWorker(&worker, &launcher_handles[slotno]);
	MemoryContextSwitchTo(old_cxt);
	if (!registered)
	{
		SpinLockAcquire(&Relay->mutex);
		slot->in_use = false;
		slot->dboid = InvalidOid;
		Relay->out_of_bgworkers = true;
		SpinLockRelease(&Relay->mutex);
		launcher_handles[slotno] = NULL;
		if (!launcher_out_of_workers)
			ereport(LOG,
					(errmsg("pg_tide launcher could not start a relay worker: out of background worker slots"),
					 errhint("Raise max_worker_processes; each database with an enabled pipeline needs pg_tide.relay_workers_per_database relay workers.")));
		launcher_out_of_workers = true;
		return LAUNCHER_NO_WORKER;
	}
	if (launcher_out_of_workers)
	{
		SpinLockAcquire(&Relay->mutex);
		Relay->out_of_bgworkers = false;
		SpinLockRelease(&Relay->mutex);
	}
	launcher_out_of_workers = false;
	return LAUNCHER_STARTED;
}

/*
 * A database is left without a worker because none is free: logged once,
 * after RELAY_UNSERVED_GRACE_MS (a worker that looks at a database without
 * pg_tide frees its slot within moments).
 */
static void
launcher_note_unserved(LauncherDb *db, TimestampTz now)
{
	if (db->unserved_since == 0)
		db->unserved_since = now;
	if (db->unserved_logged ||
		!TimestampDifferenceExceeds(db->unserved_since, now, RELAY_UNSERVED_GRACE_MS))
		return;
	db->unserved_logged = true;
	if (db->has_extension)
		ereport(LOG,
				(errmsg("pg_tide relay has no worker for database \"%s\": all %d relay workers are in use",
						NameStr(db->datname), RelayMaxWorkers),
				 errdetail("Its pipelines deliver nothing until a relay worker is free."),
				 errhint("Raise pg_tide.max_relay_workers and max_worker_processes (a restart), or disable the pipelines of a database that does not need them.")));
	else
		ereport(LOG,
				(errmsg("pg_tide relay cannot look whether database \"%s\" has pg_tide: all %d relay workers are in use",
						NameStr(db->datname), RelayMaxWorkers),
				 errdetail("If it has, its pipelines deliver nothing until a relay worker is free."),
				 errhint("Raise pg_tide.max_relay_workers and max_worker_processes (a restart), or disable the pipelines of a database that does not need them.")));
}

/* A database has a worker (again); a logged wait is logged as over. */
static void
launcher_note_served(LauncherDb *db)
{
	if (db->unserved_logged)
		ereport(LOG,
				(errmsg("pg_tide relay has a worker for database \"%s\" again",
						NameStr(db->datname))));
	db->unserved_logged = false;
	db->unserved_since = 0;
}

/*
 * A database waits for a worker while another has more than one: asks the
 * highest worker_index of the database with the most workers to leave
 * between its passes (ownership.c), so that every database gets one before
 * any gets a second. One at a time, and none while one is still leaving.
 */
static void
launcher_retire_one_extra(void)
{
	RelayWorkerSlot *victim = NULL;
	int			victim_count = 1;

	SpinLockAcquire(&Relay->mutex);
	for (int i = 0; i < Relay->nslots; i++)
		if (Relay->slots[i].in_use && Relay->slots[i].retiring)
		{
			SpinLockRelease(&Relay->mutex);
			return;
		}
	for (int i = 0; i < Relay->nslots; i++)
	{
		RelayWorkerSlot *slot = &Relay->slots[i];
		int			count = 0;

		if (!slot->in_use || slot->exited)
			continue;
		for (int j = 0; j < Relay->nslots; j++)
			if (Relay->slots[j].in_use && !Relay->slots[j].exited &&
				Relay->slots[j].dboid == slot->dboid)
				count++;
		if (count > victim_count ||
			(count == victim_count && victim != NULL && victim->dboid == slot->dboid &&
			 slot->worker_index > victim->worker_index))
		{
			victim = slot;
			victim_count = count;
		}
	}
	if (victim != NULL)
		victim->retiring = true;
	SpinLockRelease(&Relay->mutex);
}

/* One pass of the launcher (see the file header). */
static void
launcher_pass(MemoryContext cxt)
{
	TimestampTz now = GetCurrentTimestamp();
	List	   *dboids;
	ListCell   *lc;
	HASH_SEQ_STATUS status;
	LauncherDb *db;
	bool		serving;
	bool		busy;
	bool		out_of_workers = false;
	bool		some_unserved = false;

	launcher_reap(now);
	launcher_take_requests(now);

	dboids = launcher_scan_databases(cxt);
	hash_seq_init(&status, launcher_dbs);
	while ((db = hash_seq_search(&status)) != NULL)
		db->seen = false;
	foreach(lc, dboids)
		launcher_db(lfirst_oid(lc))->seen = true;
	hash_seq_init(&status, launcher_dbs);
	while ((db = hash_seq_search(&status)) != NULL)
		if (!db->seen && launcher_db_workers(db->dboid, &serving, &busy) == 0)
			hash_search(launcher_dbs, &db->dboid, HASH_REMOVE, NULL);

	if (!RelayEnabled)
		return;

	/* A first worker for every database that has none. */
	foreach(lc, dboids)
	{
		Oid			dboid = lfirst_oid(lc);
		bool		due;

		db = launcher_db(dboid);
		/* a worker that starts now stays until the message's time */
		due = db->due_at != 0 &&
			db->due_at <= TimestampTzPlusMilliseconds(now, RELAY_SCHEDULE_LEAD_MS);
		if (db->no_extension || db->backoff_until > now || (db->idle_until > now && !due))
		{
			db->unserved_since = 0;
			continue;
		}
		if (launcher_db_workers(dboid, &serving, &busy) != 0)
		{
			if (serving)
				db->has_extension = true;
			launcher_note_served(db);
			/* it moves the message; when it leaves, it tells the next */
			if (due)
				db->due_at = 0;
			continue;
		}
		if (!out_of_workers)
		{
			LauncherStart started = launcher_start_worker(dboid, 0, now);

			if (started == LAUNCHER_STARTED)
			{
				launcher_note_served(db);
				if (due)
					db->due_at = 0;
				continue;
			}
			if (started == LAUNCHER_PAUSED)
				continue;
			out_of_workers = true;
		}
		launcher_note_unserved(db, now);
		some_unserved = true;
	}
	if (some_unserved)
	{
		launcher_retire_one_extra();
		return;
	}

	/* Then the further workers of the databases that have pg_tide. */
	foreach(lc, dboids)
	{
		Oid			dboid = lfirst_oid(lc);
		uint32		indexes;

		db = launcher_db(dboid);
		if (!db->has_extension || db->no_extension || db->backoff_until > now)
			continue;
		indexes = launcher_db_workers(dboid, &serving, &busy);
		/* only a database with an enabled pipeline gets more than one */
		if (indexes == 0 || !busy)
			continue;
		for (int index = 1; index < RelayWorkersPerDatabase; index++)
			if ((indexes & ((uint32) 1 << index)) == 0 &&
				launcher_start_worker(dboid, index, now) != LAUNCHER_STARTED)
				return;
	}
}

/*
 * How long the launcher naps: RELAY_LAUNCHER_NAP_MS, or less when a
 * database's scheduled message needs a worker sooner. A due time already
 * passed is not waited for: the pass just made could not start its worker
 * (paused, failed, no worker free), and the next one tries again.
 */
static long
launcher_nap_ms(void)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz wake_at = TimestampTzPlusMilliseconds(now, RELAY_LAUNCHER_NAP_MS);
	HASH_SEQ_STATUS status;
	LauncherDb *db;

	hash_seq_init(&status, launcher_dbs);
	while ((db = hash_seq_search(&status)) != NULL)
	{
		TimestampTz start_at;

		if (db->due_at == 0)
			continue;
		start_at = TimestampTzPlusMilliseconds(db->due_at, -RELAY_SCHEDULE_LEAD_MS);
		if (start_at > now && start_at < wake_at)
			wake_at = start_at;
	}
	/* rounded up: a nap that ends early would pass without starting it */
	return (long) ((wake_at - now + 999) / 1000);
}

/* Entry point of the launcher. */
void
RelayLauncherMain(Datum main_arg)
{
	HASHCTL		ctl;
	MemoryContext pass_cxt;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	/* No database: pg_database is a shared catalog. */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	SpinLockAcquire(&Relay->mutex);
	Relay->launcher_pid = MyProcPid;
	Relay->launcher_latch = MyLatch;
	SpinLockRelease(&Relay->mutex);
	on_shmem_exit(launcher_exit, (Datum) 0);

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(Oid);
	ctl.entrysize = sizeof(LauncherDb);
	launcher_dbs = hash_create("pg_tide launcher databases", 64, &ctl,
							   HASH_ELEM | HASH_BLOBS);
	launcher_handles = MemoryContextAllocZero(TopMemoryContext,
											  sizeof(BackgroundWorkerHandle *) * Max(Relay->nslots, 1));
	pass_cxt = AllocSetContextCreate(TopMemoryContext, "pg_tide launcher pass",
									 ALLOCSET_DEFAULT_SIZES);

	ereport(LOG, (errmsg("pg_tide launcher started")));

	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		MemoryContextSwitchTo(pass_cxt);
		pgstat_report_activity(STATE_RUNNING, "pg_tide launcher: scanning databases");
		launcher_pass(pass_cxt);
		pgstat_report_activity(STATE_IDLE, NULL);
		MemoryContextSwitchTo(TopMemoryContext);
		MemoryContextReset(pass_cxt);

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 launcher_nap_ms(), PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
