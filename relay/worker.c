/*
 * worker.c
 *		A relay worker: one per database where pg_tide has an enabled
 *		pipeline (on_demand.c). The process: its entry point, its signals,
 *		why it ends, and the loop and its one wait. What the loop drives is
 *		the engine (engine.c: operations in flight; units.c: the table of
 *		units) and, through it, the flows (flow.h: flow_forward.c delivers
 *		outboxes to sinks).
 *
 * The loop, each turn (loop_once):
 *
 * 1. A commit count that moved since the last turn (wake.c tells a
 *	  commit's wake-up from others) makes every unit look for work.
 *	  The worker joins the database's wake-up condition variable's wait
 *	  list right before it waits (step 7) and reads the count after joining,
 *	  so no commit is missed (a broadcast sets the latch of a process on the
 *	  list). Commits wake the worker only while the
 *	  database has an enabled pipeline; without one it just naps, so
 *	  publishing costs it nothing (a pipeline change still sets its latch).
 * 2. Handle signals: SIGHUP reloads the configuration, SIGTERM (die) ends
 *	  the worker at the next CHECK_FOR_INTERRUPTS, SIGINT (pg_cancel_backend)
 *	  abandons the operations in flight: nothing of them is recorded, and
 *	  they are taken again at once (a pipeline's consumer still holds their
 *	  lease); the worker goes on.
 * 3. Leave cleanly when the relay is switched off, when a command needs the
 *	  database to itself (a pause, see launcher.c) or when pg_tide is no
 *	  longer installed (DROP EXTENSION); the operations in flight are
 *	  abandoned first (the lease makes the next worker deliver them again).
 *	  A reading that finds no enabled unit, with nothing in flight, also
 *	  ends the worker once its periodic jobs are done (on_demand.c).
 * 4. Read the enabled units in one short transaction (units.c, each flow
 *	  its own table) when SQL changed pipelines or queues, after a reload,
 *	  and every pg_tide.relay_naptime_ms; a unit with an operation in flight
 *	  takes its new reading once the operation is done. A unit whose config
 *	  md5 is unchanged keeps the reading it has, except after a reload and
 *	  when it read secrets.
 * 5. Look at the units without an operation in flight (RelayScanUnits)
 *	  when something may be due: each that is neither held nor paced takes
 *	  its flow's step.
 * 6. Move on every operation whose sink or source has something to do and
 *	  record each that finished (RelayProgressOperations).
 * 7. Wait, in one WaitEventSet, on the latch, the postmaster's death and
 *	  one epoll descriptor holding every sink's sockets (events.c), until
 *	  the earliest of the sinks' timers, the operations' deadlines, the
 *	  holds, the retries' due times, the pacing's wake-ups and the next
 *	  reading.
 *
 * An ERROR in one unit's step or record is the engine's to handle
 * (engine.c): the unit is held and the others go on. Any other ERROR
 * abandons every operation in flight, is reported and ends the worker
 * cleanly; the launcher starts it again after a back-off, so nothing
 * crash-loops. The worker holds no lock and no transaction while it waits,
 * so DROP EXTENSION never waits for it.
 *
 * Steps 4 to 6 run SQL only under the extension's lock, which every turn
 * that runs SQL takes first, without waiting, and gives back before step
 * 7: DROP EXTENSION takes it first too, so the two never lock the
 * extension's tables in opposite orders (extension_lock.c). While a DROP
 * holds it or waits for it, the turn runs no SQL (a finished operation is
 * recorded in a later turn) and the loop looks again after
 * RELAY_EXTENSION_BUSY_WAIT_MS; once pg_tide is gone the worker leaves.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/condition_variable.h"
#include "storage/ipc.h"
#include "tcop/tcopprot.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "pg_tide.h"
#include "engine.h"
#include "events.h"

/* How long the loop waits when a DROP EXTENSION kept its turn from the database. */
#define RELAY_EXTENSION_BUSY_WAIT_MS 50

static RelayWorkerSlot *my_slot = NULL;
static RelayExitReason my_exit_reason = RELAY_EXIT_STOPPED;
/* Why worker_should_stop last said the worker must stop. */
static const char *stop_reason = "asked to stop";
/* A SIGINT (pg_cancel_backend) arrived: the loop abandons its operations in flight. */
static volatile sig_atomic_t cancel_pending = false;
/* The database's commit count (wake.c) last looked at. */
static uint64 seen_commits = 0;

/* Tells the launcher, through the slot, that this worker has ended and why. */
static void
worker_exit(int code, Datum arg)
{
	if (my_slot == NULL)
		return;
	/* PostgreSQL keeps a session-level lock past the process's end */
	(void) RelayUnlockExtension();
	SpinLockAcquire(&Relay->mutex);
	my_slot->exit_reason = my_exit_reason;
	my_slot->exited = true;
	my_slot->pid = 0;
	my_slot->latch = NULL;
	SpinLockRelease(&Relay->mutex);
}

/* Ends the worker cleanly, telling the launcher why. */
void
RelayWorkerLeave(RelayExitReason reason, const char *why)
{
	my_exit_reason = reason;
	ereport(DEBUG1, (errmsg("pg_tide relay worker for database %u stops: %s",
							MyDatabaseId, why)));
	proc_exit(0);
}

/*
 * Whether this worker must stop now: the relay is switched off (a pending
 * reload is taken first) or a command needs the database to itself (a
 * pause, see launcher.c). The loop then abandons its operations in flight
 * and leaves; the reason is kept for RelayWorkerLeave. Runs no SQL;
 * outside a relay worker it always says no.
 */
static bool
worker_should_stop(void)
{
	if (my_slot == NULL)
		return false;
	if (ConfigReloadPending)
	{
		/* the database's and role's settings are applied again too (worker_settings.c) */
		RelayReloadConfig();

		/*
		 * A new naptime counts from now, and a sink's open may read a
		 * setting: every unit is read and opened again.
		 */
		RelayReadUnitsAgain(true);
	}
	if (!RelayEnabled)
		stop_reason = "pg_tide.relay_enabled is off";
	else if (RelayDatabasePaused(MyDatabaseId, GetCurrentTimestamp()))
		stop_reason = "a command needs the database to itself";
	else
		return false;
	return true;
}

/* SIGINT: a cancel (pg_cancel_backend), which the loop handles (see the top of this file). */
static void
worker_cancel_handler(SIGNAL_ARGS)
{
	int			save_errno = errno;

	cancel_pending = true;
	SetLatch(MyLatch);
	errno = save_errno;
}

/* Milliseconds from now until t, rounded up; 0 once passed. */
static long
ms_until(TimestampTz now, TimestampTz t)
{
	return t <= now ? 0 : (long) Min((t - now + 999) / 1000, (TimestampTz) INT_MAX);
}

/*
 * How long the loop may sleep: until the earliest of the next reading
 * (the naptime), the sinks' timers, each operation's wake_at and the
 * units' holds, retries and pacing; not at all when something is to be
 * done now.
 */
static long
sleep_ms(void)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz until = RelayNextReadingAt();
	TimestampTz t;

	t = RelayScanWakeAt();
	if (t == 0 || cancel_pending)
		return 0;
	if (t != DT_NOEND && t < until)
		until = t;
	t = RelayTimersEarliest();
	if (t != 0 && t < until)
		until = t;
	until = RelayOperationsDueBy(until);
	if (until == 0)
		return 0;
	return ms_until(now, until);
}

/*
 * The worker's wait: its latch, the postmaster's death and the epoll
 * descriptor that holds every sink's sockets (events.c), in one set made
 * once.
 */
static WaitEventSet *
make_wait_set(void)
{
	WaitEventSet *set = TideCreateLongLivedWaitEventSet(3);

	AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
	AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
	if (RelayEventsFd() < 0)
		ereport(ERROR,
				(errcode_for_socket_access(),
				 errmsg("could not create an epoll descriptor for the relay worker: %m")));
	AddWaitEventToSet(set, WL_SOCKET_READABLE, RelayEventsFd(), NULL, NULL);
	return set;
}

/*
 * One turn of the loop (see the top of this file). Not inlined into the
 * PG_TRY of RelayWorkerMain, where its locals could be clobbered by the
 * longjmp of an ERROR.
 */
pg_noinline static void
loop_once(WaitEventSet *set, ConditionVariable *cv)
{
	WaitEvent	events[3];
	int			nevents;
	uint64		commits;
	long		timeout;
	bool		busy;

	MemoryContextSwitchTo(RelayLoopContext());
	MemoryContextReset(RelayLoopContext());

	commits = WakeCommitCount(MyDatabaseId);
	if (commits != seen_commits)
	{
		/* a publishing commit: every unit looks for its work */
		seen_commits = commits;
		if (RelayUnitsEnabled())
		{
			pg_atomic_fetch_add_u64(&my_slot->wakeups, 1);
			RelayUnitsLookForWork();
		}
	}

	CHECK_FOR_INTERRUPTS();
	RelayExitIfPostmasterDied();
	if (cancel_pending)
	{
		int			n;

		cancel_pending = false;
		n = RelayAbandonOperations();
		ereport(LOG,
				(errmsg("pg_tide relay worker for database %u was asked to cancel: %d batch%s in flight abandoned",
						MyDatabaseId, n, n == 1 ? "" : "es"),
				 errdetail("Nothing of them was recorded; they are leased and delivered again at once. The worker goes on."),
				 errhint("pg_terminate_backend() stops the worker; the launcher starts another.")));
	}
	if (worker_should_stop())
	{
		/* stopped while operations were in flight: nothing is recorded, the lease sends them again */
		RelayAbandonOperations();
		RelayWorkerLeave(RELAY_EXIT_STOPPED, stop_reason);
	}
	if (RelayWorkerRetired())
	{
		if (RelayOperationsInFlight() == 0)
			RelayWorkerLeave(RELAY_EXIT_STOPPED, "retired: relay_workers_per_database lowered, or its slot needed");
		RelayEngineRetire();
	}
	/* After a reload: the database's and role's settings again (worker_settings.c). */
	RelayApplyDatabaseSettings();
	if (RelayReadingDue(GetCurrentTimestamp()) && RelayDatabaseTurn())
	{
		if (!RelayReadUnits(my_slot))
		{
			RelayAbandonOperations();
			RelayWorkerLeave(RELAY_EXIT_NO_EXTENSION, "pg_tide is not installed");
		}
		/* no enabled unit: the periodic jobs are done, the slot is given back (on_demand.c) */
		if (RelayLeaveWhenIdle(my_slot, RelayUnitsEnabled(), RelayOperationsInFlight()))
			RelayWorkerLeave(RELAY_EXIT_IDLE, "no enabled pipeline");
	}
	if (RelayScanDue(GetCurrentTimestamp()) && RelayDatabaseTurn())
		RelayScanUnits(my_slot);
	RelayProgressOperations();
	/* the turn's SQL is done: a DROP EXTENSION waiting for it goes on */
	busy = RelayUnlockExtension();

	/* (the short transactions of the turn reported their own activity) */
	if (RelayOperationsInFlight() > 0)
		pgstat_report_activity(STATE_RUNNING, "pg_tide relay: delivering a batch");
	else
		pgstat_report_activity(STATE_IDLE, NULL);
	timeout = sleep_ms();
	/* what a DROP EXTENSION kept from this turn is tried again shortly, not at once */
	if (busy && timeout < RELAY_EXTENSION_BUSY_WAIT_MS)
		timeout = RELAY_EXTENSION_BUSY_WAIT_MS;
	/* a burst's freed memory goes back to the kernel once idle (worker_memory.c) */
	RelayReturnMemoryWhenIdle(RelayOperationsInFlight(), &timeout);

	/*
	 * On the wait list right before the wait, and the commit count read
	 * after joining it, so no commit is missed: one from now on sets the
	 * latch, one before shows in the count. Not earlier in the turn: any
	 * ConditionVariableBroadcast this process makes (PostgreSQL's own, at
	 * the end of a buffer's I/O, say) takes it off every wait list.
	 */
	if (RelayUnitsEnabled())
	{
		ConditionVariablePrepareToSleep(cv);
		if (WakeCommitCount(MyDatabaseId) != seen_commits)
			timeout = 0;
	}
	else
		ConditionVariableCancelSleep();
	nevents = WaitEventSetWait(set, timeout, events, lengthof(events), PG_WAIT_EXTENSION);
	for (int i = 0; i < nevents; i++)
	{
		if (events[i].events & WL_LATCH_SET)
			ResetLatch(MyLatch);
		if (events[i].events & WL_SOCKET_READABLE)
			RelayEventsDispatch();
	}
	RelayTimersFire(GetCurrentTimestamp());
}

/* Entry point of a relay worker; main_arg is its slot number. */
void
RelayWorkerMain(Datum main_arg)
{
	int			slotno = DatumGetInt32(main_arg);
	uint32		generation;
	Oid			dboid = InvalidOid;
	bool		mine = false;
	ConditionVariable *cv;
	WaitEventSet *set;

	/* Only this process may consume from the pipelines' groups (src/outbox_rights.c). */
	TideInRelayWorker = true;
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	pqsignal(SIGINT, worker_cancel_handler);
	BackgroundWorkerUnblockSignals();
	RelayKeepFreedMemory();

	memcpy(&generation, MyBgworkerEntry->bgw_extra, sizeof(generation));
	if (Relay == NULL || slotno < 0 || slotno >= Relay->nslots)
		proc_exit(0);

	/* The slot must still be the one the launcher claimed for this worker. */
	SpinLockAcquire(&Relay->mutex);
	if (Relay->slots[slotno].in_use && !Relay->slots[slotno].exited &&
		Relay->slots[slotno].generation == generation)
	{
		my_slot = &Relay->slots[slotno];
		my_slot->pid = MyProcPid;
		my_slot->latch = MyLatch;
		dboid = my_slot->dboid;
		mine = true;
	}
	SpinLockRelease(&Relay->mutex);
	if (!mine)
		proc_exit(0);
	on_shmem_exit(worker_exit, (Datum) 0);

	/* A command that wants the database alone may have asked already. */
	if (RelayDatabasePaused(dboid, GetCurrentTimestamp()))
		proc_exit(0);

	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);
	/* Before any SQL: the database's settings must not steer the worker. */
	RelayPinSessionSettings();

	SpinLockAcquire(&Relay->mutex);
	my_slot->started_at = GetCurrentTimestamp();
	SpinLockRelease(&Relay->mutex);

	RelayEngineInit();
	cv = WakeConditionVariable(MyDatabaseId);
	set = make_wait_set();
	seen_commits = WakeCommitCount(MyDatabaseId);

	for (;;)
	{
		bool		failed = false;

		PG_TRY();
		{
			loop_once(set, cv);
		}
		PG_CATCH();
		{
			/* before anything frees the memory the sinks point into */
			RelayAbandonOperations();
			MemoryContextSwitchTo(RelayLoopContext());
			EmitErrorReport();
			FlushErrorState();
			RelayAfterCommitAborted();
			AbortCurrentTransaction();
			RelayExtensionLockAborted();
			failed = true;
		}
		PG_END_TRY();

		if (failed)
		{
			ereport(LOG,
					(errmsg("pg_tide relay worker for database %u stops after an error", MyDatabaseId),
					 errdetail("The launcher starts it again in %d seconds.", RELAY_ERROR_BACKOFF_MS / 1000)));
			RelayWorkerLeave(RELAY_EXIT_ERROR, "error");
		}
	}
}
