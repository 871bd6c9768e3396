/*
 * extension_lock.c
 *		The one lock order between a relay worker and DROP EXTENSION pg_tide.
 *
 * DROP EXTENSION locks the extension first (AccessExclusiveLock on the
 * pg_extension object), then, one by one, its schema, tables, sequences
 * and functions. A worker's transactions lock the same tables in orders of
 * their own: a lease locks tide_consumer_leases, then
 * tide_consumer_groups; a record, the offsets, the retry queue, the dead
 * letters and the health table; the making of message partitions, the
 * schema. Had DROP taken one of them while the worker held another, each
 * would wait for the other (seen: the lease against DROP, in 4 of 7 runs
 * during broker delivery).
 *
 * So every turn of the worker's loop that touches the database takes the
 * extension's lock first, AccessShareLock at session level, without
 * waiting, and keeps it until the turn ends (RelayUnlockExtension, before
 * the loop waits); every transaction of the turn (reading the pipelines,
 * leases, records, partitions, the sweep, the health table, the ownership
 * locks' bookkeeping) runs under it. The order is then always extension
 * first, as DROP's:
 *
 * - the worker holds it: a DROP waits for the end of the turn (a few short
 *	 transactions; no turn waits on the network), then proceeds;
 * - a DROP holds it or waits for it: the worker cannot take it, does no
 *	 SQL this turn and tries again shortly (RELAY_EXTENSION_BUSY);
 * - it is gone: the worker leaves, as for any database without pg_tide.
 *
 * A session-level lock outlives the commits of the turn's transactions,
 * but not the abort of a top-level transaction (PostgreSQL then releases
 * every lock of the session's default lock method): after one, the next
 * transaction of the turn takes it again, or refuses to start
 * (RelayExtensionLockedForXact). And PostgreSQL does not release a
 * session-level lock when a process exits; the worker does, on its way
 * out.
 *
 * What this does not order: a transaction that locks one of the
 * extension's tables before its DROP EXTENSION (the DROP then waits for
 * the worker's turn, which may wait for that table), and ALTER EXTENSION
 * UPDATE, whose script locks tables in an order of its own and takes no
 * lock that conflicts with the worker's on the extension. PostgreSQL's
 * deadlock check ends such a cycle after deadlock_timeout by failing one
 * of the two.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/snapmgr.h"

#include "compat.h"
#include "relay_xact.h"

typedef enum TurnLock
{
	TURN_UNLOCKED,				/* not taken this turn */
	TURN_LOCKED,				/* held */
	TURN_LOST,					/* held, then released by a top-level abort */
	TURN_BUSY					/* could not be taken this turn */
} TurnLock;

static TurnLock turn_lock = TURN_UNLOCKED;
static LOCKTAG turn_tag;

/* The OID of the extension pg_tide, looked up afresh; needs a transaction. */
static Oid
current_extension(void)
{
	InvalidateCatalogSnapshot();
	return get_extension_oid("pg_tide", true);
}

/*
 * Takes the extension's lock for the rest of the turn, at session level,
 * without waiting; false when a DROP EXTENSION (or another holder of a
 * conflicting lock) holds it or waits for it. Needs a transaction.
 */
static bool
take_lock(Oid extension)
{
	SET_LOCKTAG_OBJECT(turn_tag, MyDatabaseId, ExtensionRelationId, extension, 0);
	if (LockAcquire(&turn_tag, AccessShareLock, true, true) == LOCKACQUIRE_NOT_AVAIL)
		return false;
	/* dropped (and maybe created anew) between the look and the lock */
	if (current_extension() != extension)
	{
		LockRelease(&turn_tag, AccessShareLock, true);
		return false;
	}
	return true;
}

/*
 * Locks the extension for the worker's turn (see the top of this file),
 * once per turn: RELAY_EXTENSION_LOCKED, RELAY_EXTENSION_BUSY when a DROP
 * EXTENSION holds it or waits for it (the turn does no SQL), or
 * RELAY_EXTENSION_ABSENT when pg_tide is not installed. Call it with no
 * transaction open.
 */
RelayExtensionTurn
RelayLockExtensionForTurn(void)
{
	MemoryContext cxt = CurrentMemoryContext;
	Oid			extension;
	RelayExtensionTurn result;

	if (turn_lock == TURN_LOCKED)
		return RELAY_EXTENSION_LOCKED;
	if (turn_lock == TURN_BUSY)
		return RELAY_EXTENSION_BUSY;
	Assert(!IsTransactionState());
	StartTransactionCommand();
	extension = current_extension();
	if (!OidIsValid(extension))
		result = RELAY_EXTENSION_ABSENT;
	else if (take_lock(extension))
		result = RELAY_EXTENSION_LOCKED;
	else
		result = RELAY_EXTENSION_BUSY;
	CommitTransactionCommand();
	MemoryContextSwitchTo(cxt);
	turn_lock = result == RELAY_EXTENSION_LOCKED ? TURN_LOCKED :
		result == RELAY_EXTENSION_BUSY ? TURN_BUSY : TURN_UNLOCKED;
	return result;
}

/*
 * Whether a transaction of the turn may start: yes outside a locked turn
 * (the worker's first look, before it knows the extension); in one whose
 * lock a top-level abort released, only once it is taken again. Called
 * by xact.c right after it starts a transaction.
 */
bool
RelayExtensionLockedForXact(void)
{
	if (turn_lock != TURN_LOST)
		return turn_lock != TURN_BUSY;
	if (current_extension() != turn_tag.locktag_field3 ||
		LockAcquire(&turn_tag, AccessShareLock, true, true) == LOCKACQUIRE_NOT_AVAIL)
	{
		/* the rest of the turn does no SQL */
		turn_lock = TURN_BUSY;
		return false;
	}
	turn_lock = TURN_LOCKED;
	return true;
}

/*
 * A top-level transaction was aborted: the turn's lock went with it, if
 * one was open (an ERROR between two transactions aborts none).
 */
void
RelayExtensionLockAborted(void)
{
	if (turn_lock == TURN_LOCKED && !TideLockHeldByMe(&turn_tag, AccessShareLock))
		turn_lock = TURN_LOST;
}

/*
 * Ends the turn: gives the extension's lock back, if held; returns whether
 * the turn could not take it (a DROP EXTENSION held or awaited it). Never
 * an ERROR.
 */
bool
RelayUnlockExtension(void)
{
	bool		busy = turn_lock == TURN_BUSY;

	if (turn_lock == TURN_LOCKED)
		LockRelease(&turn_tag, AccessShareLock, true);
	turn_lock = TURN_UNLOCKED;
	return busy;
}
