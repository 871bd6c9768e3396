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
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "executor/spi.h"
#include "pgstat.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "relay.h"

/* A group is open: short transactions are subtransactions of its transaction. */
static bool group_open = false;
/* The group's transaction has started (at its first short transaction). */
static bool group_started = false;
/* The nesting level of the group's transaction. */
static int	group_level = 0;
/* Short transactions ended in the group's transaction so far. */
static int	group_members = 0;

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
		return;
	}
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
