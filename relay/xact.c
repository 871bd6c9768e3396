/*
 * xact.c
 *		The relay worker's short transactions: each step (lease, record, trim,
 *		sweep) runs in a transaction of its own with a snapshot and SPI, so
 *		no transaction is ever open while a sink delivers or the worker
 *		sleeps. And the conditional lock that keeps a worker from waiting for
 *		a DROP EXTENSION (which would otherwise wait for the worker); every
 *		transaction starts under the turn's lock on the extension
 *		(extension_lock.c).
 *
 * Short transactions can also share one transaction (a group): the worker
 * records the batches that finished in the same turn of its loop together,
 * so that a thousand pipelines finishing together pay a commit (and a wait
 * for the WAL to reach disk) per 64 records instead of one each. Inside a
 * group each short transaction is a subtransaction of the group's
 * transaction, begun and ended by the same calls, so an ERROR in one
 * pipeline's record rolls back that record alone (RelayAbortShortXact) and
 * the others are committed with the group. Until the group commits nothing
 * of it is visible: a crash or a failed commit loses all of its records, as
 * a crash before each record would, and their batches are leased and
 * delivered again (their consumers still hold the leases). A group commits
 * after at most PGPROC_MAX_CACHED_SUBXIDS (64) short transactions and goes
 * on in a new transaction: beyond that many subtransaction ids, every
 * snapshot taken in the cluster while the group is open would have to look
 * them up in pg_subtrans.
 *
 * A short transaction can ask for callbacks to run once it is durable
 * (RelayAfterCommit, flow.h: a source's acknowledgement). They run after
 * the commit of its transaction (in a group: the group's), with no
 * transaction open, in the order they were asked for; a short transaction
 * undone (RelayAbortShortXact) or a transaction aborted discards the ones
 * it asked for, so nothing runs for what was not committed.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "executor/spi.h"
#include "pgstat.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "flow.h"
#include "flow.h"
#include "relay_xact.h"

/* A group is open: short transactions are subtransactions of its transaction. */
static bool group_open = false;
/* The group's transaction has started (at its first short transaction). */
static bool group_started = false;
/* The nesting level of the group's transaction. */
static int	group_level = 0;
/* Short transactions ended in the group's transaction so far. */
static int	group_members = 0;

/* A callback to run once the transaction that asked for it has committed. */
typedef struct AfterCommit
{
	RelayAfterCommitFn fn;
	void	   *arg;
	bool		kept;			/* its short transaction ended: only an abort
								 * of the whole transaction discards it */
} AfterCommit;

/* The callbacks asked for in the open transaction, in order. */
static List *after_commit = NIL;
/* Where they and their arguments live until they ran or were discarded. */
static MemoryContext after_commit_cxt = NULL;

/* The memory that lives until the after-commit callbacks ran or were discarded. */
MemoryContext
RelayAfterCommitContext(void)
{
	if (after_commit_cxt == NULL)
		after_commit_cxt = AllocSetContextCreate(TopMemoryContext, "pg_tide relay after commit",
												 ALLOCSET_SMALL_SIZES);
	return after_commit_cxt;
}

/* Runs fn(arg) once the open short transaction has committed (flow.h). */
void
RelayAfterCommit(RelayAfterCommitFn fn, void *arg)
{
	AfterCommit *a = MemoryContextAllocZero(RelayAfterCommitContext(), sizeof(AfterCommit));
	MemoryContext old = MemoryContextSwitchTo(RelayAfterCommitContext());

	a->fn = fn;
	a->arg = arg;
	after_commit = lappend(after_commit, a);
	MemoryContextSwitchTo(old);
}

/* The short transaction ended: its callbacks wait for its transaction's commit. */
static void
keep_after_commit(void)
{
	ListCell   *lc;

	foreach(lc, after_commit)
		((AfterCommit *) lfirst(lc))->kept = true;
}

/*
 * Discards the callbacks that a short transaction being undone asked for
 * (every one when `all`: the whole transaction is aborted).
 */
static void
discard_after_commit(bool all)
{
	List	   *keep = NIL;
	ListCell   *lc;
	MemoryContext old;

	if (after_commit == NIL)
		return;
	if (all)
	{
		after_commit = NIL;
		MemoryContextReset(after_commit_cxt);
		return;
	}
	old = MemoryContextSwitchTo(after_commit_cxt);
	foreach(lc, after_commit)
		if (((AfterCommit *) lfirst(lc))->kept)
			keep = lappend(keep, lfirst(lc));
	after_commit = keep;
	MemoryContextSwitchTo(old);
}

/* The worker aborted its transaction after an ERROR: nothing of it runs. */
void
RelayAfterCommitAborted(void)
{
	discard_after_commit(true);
}

/* Runs the callbacks of a transaction that has just committed, then forgets them. */
static void
run_after_commit(void)
{
	List	   *run = after_commit;
	ListCell   *lc;

	if (run == NIL)
		return;
	after_commit = NIL;
	foreach(lc, run)
	{
		AfterCommit *a = lfirst(lc);

		a->fn(a->arg);
	}
	MemoryContextReset(after_commit_cxt);
}

/* Commits the group's transaction; the caller's memory context is kept. */
static void
commit_group(void)
{
	MemoryContext cxt = CurrentMemoryContext;

	group_members = 0;
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	MemoryContextSwitchTo(cxt);
	run_after_commit();
}

/*
 * Opens a group: the short transactions that follow, up to
 * RelayEndXactGroup, share one transaction (see the top of this file).
 */
void
RelayBeginXactGroup(void)
{
	Assert(!group_open);
	group_open = true;
	group_started = false;
}

/*
 * Commits the group's transaction, if any short transaction ran in it, and
 * closes the group. An ERROR of the commit is the caller's.
 */
void
RelayEndXactGroup(void)
{
	bool		started = group_started;

	group_open = false;
	group_started = false;
	if (!started)
		return;
	commit_group();
}

/*
 * Starts a transaction of the worker's (see extension_lock.c): refused
 * with an ERROR when the turn's lock on the extension, released by an
 * earlier abort, cannot be taken again (a DROP EXTENSION holds or awaits
 * it).
 */
static void
start_transaction(void)
{
	StartTransactionCommand();
	if (!RelayExtensionLockedForXact())
		ereport(ERROR,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("could not lock extension \"pg_tide\""),
				 errdetail("A DROP EXTENSION holds or awaits its lock; the relay worker tries again in its next turn.")));
}

/*
 * Starts a short transaction with a snapshot and SPI: a transaction of its
 * own, or in a group a subtransaction of the group's.
 */
void
RelayBeginShortXact(const char *activity)
{
	SetCurrentStatementStartTimestamp();
	if (group_open)
	{
		MemoryContext cxt = CurrentMemoryContext;

		if (!group_started)
		{
			start_transaction();
			group_started = true;
			group_level = GetCurrentTransactionNestLevel();
		}
		BeginInternalSubTransaction(NULL);
		MemoryContextSwitchTo(cxt);
	}
	else
		start_transaction();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);
}

/*
 * Ends the short transaction (in a group: its subtransaction, which the
 * group's commit makes durable) and returns to the caller's memory context.
 */
void
RelayEndShortXact(MemoryContext cxt)
{
	SPI_finish();
	PopActiveSnapshot();
	if (group_open && group_started)
	{
		ReleaseCurrentSubTransaction();
		keep_after_commit();
		/* the next short transaction of the group starts a new one */
		if (++group_members >= PGPROC_MAX_CACHED_SUBXIDS)
		{
			group_started = false;
			commit_group();
		}
		MemoryContextSwitchTo(cxt);
		return;
	}
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	MemoryContextSwitchTo(cxt);
	keep_after_commit();
	run_after_commit();
}

/*
 * Undoes a short transaction after an ERROR was caught: in a group only
 * its subtransaction, so that what the group's other short transactions
 * did stays to be committed; else the whole transaction. An ERROR caught
 * outside any short transaction of the group (between them, in the
 * worker's own code) leaves the group's transaction as it is.
 */
void
RelayAbortShortXact(void)
{
	if (group_open && group_started)
	{
		while (GetCurrentTransactionNestLevel() > group_level)
			RollbackAndReleaseCurrentSubTransaction();
		discard_after_commit(false);
		return;
	}
	discard_after_commit(true);
	AbortCurrentTransaction();
	RelayExtensionLockAborted();
}

/*
 * Locks table tide.<relname> in the given mode if that can be done at once;
 * false when the table is missing or its lock is taken (a DROP EXTENSION in
 * progress is passed over, not waited for).
 */
bool
RelayTryLockTable(const char *relname, LOCKMODE mode)
{
	Oid			nsp = get_namespace_oid("tide", true);
	Oid			rel = OidIsValid(nsp) ? get_relname_relid(relname, nsp) : InvalidOid;

	if (!OidIsValid(rel) || !ConditionalLockRelationOid(rel, mode))
		return false;
	/* Dropped while we waited for nothing: the lock is of no use. */
	return SearchSysCacheExists1(RELOID, ObjectIdGetDatum(rel));
}
