/*
 * backend.c
 *		The relay's backend side, what ordinary backends do to talk to the
 *		relay: ask the launcher to look at a database again after CREATE
 *		EXTENSION and at the commit of a pipeline change (a database without
 *		an enabled pipeline has no worker, on_demand.c), wake a database's
 *		worker at the commit of a pipeline change or of a scheduled message
 *		(telling the launcher when the message is due), get a database to
 *		themselves for DROP DATABASE and the like, and list the running
 *		relay workers.
 *
 * PostgreSQL does not terminate background workers for DROP DATABASE,
 * ALTER DATABASE ... RENAME / SET TABLESPACE or CREATE DATABASE ...
 * TEMPLATE: the database would stay "being accessed by other users". A
 * ProcessUtility hook (every backend has it, the library is preloaded)
 * recognises those commands, pauses the database in shared memory so the
 * launcher does not restart its worker, terminates the worker, and waits,
 * bounded, until it has gone. The same hook notes the sessions that
 * restore a database (restore.c).
 */
#include "postgres.h"

#include <signal.h>

#include "access/xact.h"
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "pgstat.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "pg_tide.h"
#include "launcher.h"
#include "relay_init.h"
#include "relay_xact.h"
#include "schedule_wake.h"

/* CREATE EXTENSION in this transaction asked for a recheck. */
static bool recheck_pending = false;
static bool wake_pending = false;
/* The earliest message this transaction scheduled; 0: none. */
static TimestampTz wake_due_at = 0;
static bool xact_callback_registered = false;

static ProcessUtility_hook_type prev_process_utility_hook = NULL;

PG_FUNCTION_INFO_V1(tide_relay_notify_launcher);
PG_FUNCTION_INFO_V1(tide_relay_wake_worker);
PG_FUNCTION_INFO_V1(tide_relay_workers);

/*
 * Asks the launcher to look at a database again, soon, and, with a due_at,
 * to start a worker for it then (a scheduled message, on_demand.c). A full
 * request table loses the due time: the worker the recheck starts tells
 * the launcher again when it leaves.
 */
void
RelayRequestRecheck(Oid dboid, TimestampTz due_at)
{
	TimestampTz now = GetCurrentTimestamp();
	RelayDbRequest *r;

	SpinLockAcquire(&Relay->mutex);
	r = RelayFindRequest(dboid, true, now);
	if (r != NULL)
	{
		r->recheck_at = now;
		if (due_at != 0 && (r->due_at == 0 || due_at < r->due_at))
			r->due_at = due_at;
	}
	else
		Relay->recheck_all_at = now;
	SpinLockRelease(&Relay->mutex);
	RelayWakeLauncher();
}

/*
 * Sets the latches of a database's relay workers: a worker with no enabled
 * pipeline is not on the commit wake-up's wait list (wake.c), yet must see
 * a pipeline change at once.
 */
static void
wake_workers(Oid dboid)
{
	Latch	   *latches[64];
	size_t		n = 0;

	SpinLockAcquire(&Relay->mutex);
	for (int i = 0; i < Relay->nslots && n < lengthof(latches); i++)
		if (Relay->slots[i].in_use && Relay->slots[i].dboid == dboid &&
			Relay->slots[i].pid != 0 && Relay->slots[i].latch != NULL)
			latches[n++] = Relay->slots[i].latch;
	SpinLockRelease(&Relay->mutex);
	for (size_t i = 0; i < n; i++)
		SetLatch(latches[i]);
}

/*
 * Sends the recheck of CREATE EXTENSION at commit, when a new worker can
 * see the extension; an aborted CREATE EXTENSION sends nothing.
 */
static void
relay_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
			if (recheck_pending)
			{
				recheck_pending = false;
				RelayRequestRecheck(MyDatabaseId, 0);
			}
			if (wake_pending)
			{
				wake_pending = false;
				pg_atomic_fetch_add_u64(&Relay->wake_requests, 1);
				WakeDatabase(MyDatabaseId);
				wake_workers(MyDatabaseId);
				/*
				 * a database without a worker (none enabled before) gets one,
				 * and one again when the message it scheduled is due
				 */
				RelayRequestRecheck(MyDatabaseId, wake_due_at);
				wake_due_at = 0;
			}
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
			recheck_pending = false;
			wake_pending = false;
			wake_due_at = 0;
			break;
		default:
			break;
	}
}

/* Registers this backend's transaction callback, once. */
static void
register_xact_callback(void)
{
	if (!xact_callback_registered)
	{
		RegisterXactCallback(relay_xact_callback, NULL);
		xact_callback_registered = true;
	}
}

/*
 * tide._relay_notify_launcher(): called by the install script, so that the
 * new extension gets its relay worker within a second. Does nothing when
 * pg_tide is not preloaded (there is no relay then).
 */
Datum
tide_relay_notify_launcher(PG_FUNCTION_ARGS)
{
	if (!TidePreloaded || Relay == NULL)
		PG_RETURN_VOID();
	register_xact_callback();
	recheck_pending = true;
	PG_RETURN_VOID();
}

/*
 * tide._relay_wake_worker(): called when a transaction changes a pipeline
 * (the trigger on relay_outbox_config) or puts messages back into a retry
 * queue (relay_dlq_retry), so that at its commit the relay worker looks at
 * once, even when a long naptime or no enabled pipeline let it sleep.
 */
Datum
tide_relay_wake_worker(PG_FUNCTION_ARGS)
{
	if (!TidePreloaded || Relay == NULL)
		PG_RETURN_VOID();
	register_xact_callback();
	wake_pending = true;
	PG_RETURN_VOID();
}

/*
 * A message is scheduled for deliver_at (src/schedule.c): at this
 * transaction's commit the relay is woken as by tide._relay_wake_worker(),
 * and the launcher is told the earliest such time, so that a database
 * whose worker has left gets one then.
 */
void
RelayWakeForScheduled(TimestampTz deliver_at)
{
	if (!TidePreloaded || Relay == NULL)
		return;
	register_xact_callback();
	wake_pending = true;
	if (wake_due_at == 0 || deliver_at < wake_due_at)
		wake_due_at = deliver_at;
}

/*
 * Stops a database's relay worker and keeps it stopped for a while, then
 * waits (bounded) until it has gone. If it has not gone in time, the
 * command that asked fails as it would have without pg_tide.
 */
static void
stop_database_worker(Oid dboid)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz deadline = TimestampTzPlusMilliseconds(now, RELAY_STOP_WAIT_MS);
	RelayDbRequest *r;

	SpinLockAcquire(&Relay->mutex);
	r = RelayFindRequest(dboid, true, now);
	if (r != NULL)
		r->paused_until = TimestampTzPlusMilliseconds(now, RELAY_PAUSE_MS);
	SpinLockRelease(&Relay->mutex);

	for (;;)
	{
		pid_t		pids[64];
		int			npids = 0;
		bool		live = false;

		SpinLockAcquire(&Relay->mutex);
		for (int i = 0; i < Relay->nslots; i++)
		{
			RelayWorkerSlot *slot = &Relay->slots[i];

			if (slot->in_use && !slot->exited && slot->dboid == dboid)
			{
				live = true;
				if (slot->pid != 0 && npids < (int) lengthof(pids))
					pids[npids++] = slot->pid;
			}
		}
		SpinLockRelease(&Relay->mutex);

		if (!live || GetCurrentTimestamp() >= deadline)
			break;
		/* A worker not yet started sees the pause itself and leaves. */
		for (int i = 0; i < npids; i++)
			(void) kill(pids[i], SIGTERM);

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 10L, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
	RelayWakeLauncher();
}

/* The database a utility statement needs to itself, or InvalidOid. */
static Oid
database_needed_alone(Node *parsetree)
{
	ListCell   *lc;

	switch (nodeTag(parsetree))
	{
		case T_DropdbStmt:
			return get_database_oid(((DropdbStmt *) parsetree)->dbname, true);
		case T_RenameStmt:
			{
				RenameStmt *stmt = (RenameStmt *) parsetree;

				if (stmt->renameType == OBJECT_DATABASE && stmt->subname != NULL)
					return get_database_oid(stmt->subname, true);
				break;
			}
		case T_AlterDatabaseStmt:
			{
				AlterDatabaseStmt *stmt = (AlterDatabaseStmt *) parsetree;

				foreach(lc, stmt->options)
				{
					DefElem    *def = lfirst_node(DefElem, lc);

					if (strcmp(def->defname, "tablespace") == 0)
						return get_database_oid(stmt->dbname, true);
				}
				break;
			}
		case T_CreatedbStmt:
			{
				CreatedbStmt *stmt = (CreatedbStmt *) parsetree;

				foreach(lc, stmt->options)
				{
					DefElem    *def = lfirst_node(DefElem, lc);

					if (strcmp(def->defname, "template") == 0 && def->arg != NULL)
						return get_database_oid(defGetString(def), true);
				}
				break;
			}
		default:
			break;
	}
	return InvalidOid;
}

/*
 * ProcessUtility hook: gets the relay worker out of the way of the commands
 * that need a database to themselves, then runs the command.
 */
static void
relay_process_utility(PlannedStmt *pstmt, const char *queryString,
					  bool readOnlyTree, ProcessUtilityContext context,
					  ParamListInfo params, QueryEnvironment *queryEnv,
					  DestReceiver *dest, QueryCompletion *qc)
{
	int			copy_nest;

	if (Relay != NULL && pstmt->utilityStmt != NULL)
	{
		Oid			dboid = database_needed_alone(pstmt->utilityStmt);

		/*
		 * Only for a caller who may run the command (it needs ownership of
		 * the database, a template aside, and templates have no worker);
		 * anyone else would only stop the relay, then fail.
		 */
		if (OidIsValid(dboid) && TideDatabaseOwnerCheck(dboid))
			stop_database_worker(dboid);
	}

	/* a restore's COPY into the extension's tables (restore.c) */
	copy_nest = Relay != NULL && pstmt->utilityStmt != NULL ?
		RelayBeginRestoreCopy(pstmt->utilityStmt) : -1;

	if (prev_process_utility_hook)
		prev_process_utility_hook(pstmt, queryString, readOnlyTree, context,
								  params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);

	RelayEndRestoreCopy(copy_nest);
	/*
	 * a restore's session keeps the relay out of its database, and the
	 * child tables it creates join the extension (restore.c)
	 */
	if (Relay != NULL && pstmt->utilityStmt != NULL)
	{
		RelayAdoptRestoredChild(pstmt->utilityStmt);
		RelayNoteSessionSetting(pstmt->utilityStmt);
	}
}

/* Installs the ProcessUtility hook; called from _PG_init when preloaded. */
void
RelayInstallHooks(void)
{
	prev_process_utility_hook = ProcessUtility_hook;
	ProcessUtility_hook = relay_process_utility;
}

/*
 * tide.relay_workers(): one row per running relay worker in the cluster,
 * with its counters, its worker_index and how many pipelines it serves. A
 * worker that is still looking whether its database has pg_tide (and
 * leaves at once if not) is not shown. A catalog of 0.1.0 declares only
 * the first five columns; the library fills what the catalog declares.
 */
Datum
tide_relay_workers(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	TideRequirePreload();
	InitMaterializedSRF(fcinfo, 0);

	for (int i = 0; i < Relay->nslots; i++)
	{
		RelayWorkerSlot *slot = &Relay->slots[i];
		Datum		values[7];
		bool		nulls[7] = {false};
		bool		running;
		Oid			dboid;
		pid_t		pid;
		TimestampTz started_at;
		int			worker_index;
		int			npipelines;
		char	   *datname;

		SpinLockAcquire(&Relay->mutex);
		running = slot->in_use && !slot->exited && slot->pid != 0 && slot->started_at != 0 &&
			slot->serving;
		dboid = slot->dboid;
		pid = slot->pid;
		started_at = slot->started_at;
		worker_index = slot->worker_index;
		npipelines = slot->npipelines;
		SpinLockRelease(&Relay->mutex);
		/* A worker shows once its first pass found pg_tide in its database. */
		if (!running)
			continue;

		datname = get_database_name(dboid);
		if (datname != NULL)
			values[0] = DirectFunctionCall1(namein, CStringGetDatum(datname));
		else
			nulls[0] = true;
		values[1] = Int32GetDatum((int32) pid);
		values[2] = TimestampTzGetDatum(started_at);
		values[3] = Int64GetDatum((int64) pg_atomic_read_u64(&slot->passes));
		values[4] = Int64GetDatum((int64) pg_atomic_read_u64(&slot->wakeups));
		values[5] = Int32GetDatum(worker_index);
		values[6] = Int32GetDatum(npipelines);
		Assert(rsinfo->setDesc->natts <= (int) lengthof(values));
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
