/*
 * xact.c
 *		The relay worker's short transactions: each step (lease, record, trim,
 *		sweep) runs in a transaction of its own with a snapshot and SPI, so
 *		no transaction is ever open while a sink delivers or the worker
 *		sleeps. And the conditional lock that keeps a worker from waiting for
 *		a DROP EXTENSION (which would otherwise wait for the worker).
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "executor/spi.h"
#include "pgstat.h"
#include "storage/lmgr.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "relay.h"

/* Starts a short transaction with a snapshot and SPI. */
void
RelayBeginShortXact(const char *activity)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);
}

/* Ends the short transaction and returns to the caller's memory context. */
void
RelayEndShortXact(MemoryContext cxt)
{
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	MemoryContextSwitchTo(cxt);
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
