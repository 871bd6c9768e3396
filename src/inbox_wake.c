/*
 * inbox_wake.c
 *		Wake on commit for inboxes that process themselves: a transaction
 *		that stored events into an inbox with an enabled handler wakes the
 *		relay of its database at COMMIT (never at abort), as a publishing
 *		commit does (src/wake.c), so the handler runs on them at once.
 *
 * Which inboxes have an enabled handler is read once and remembered by the
 * backend until tide.relay_inbox_handlers changes: the table's statement
 * trigger sends a relcache invalidation of it at commit (tide_rights_changed),
 * which every backend processes before it next takes a lock it does not
 * hold. A receive always takes the inbox table's lock first, so it sees a
 * handler whose setting committed before; a handler set while a receive is
 * in flight is woken for by its own trigger (tide._relay_wake_worker), and
 * the relay then finds every pending event.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "inbox_wake.h"
#include "pg_tide.h"

PG_FUNCTION_INFO_V1(tide_inbox_wake);

/* The inboxes with an enabled handler, in TopMemoryContext; valid when loaded. */
static List *handled_inboxes = NIL;
static bool handled_loaded = false;
static Oid	handlers_relid = InvalidOid;
static bool callbacks_registered = false;
/* Bumped by every invalidation: a list read while one arrived is not kept. */
static uint64 handlers_generation = 0;

/* A commit of this transaction is to wake the relay. */
static bool wake_at_commit = false;

/* Relcache callback: relay_inbox_handlers changed, or every relation did. */
static void
handlers_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == handlers_relid)
	{
		handled_loaded = false;
		handlers_relid = InvalidOid;
		handlers_generation++;
	}
}

/* Wakes the relay at commit when this transaction asked for it. */
static void
inbox_wake_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			if (wake_at_commit)
				WakeDatabaseInboxes(MyDatabaseId);
			wake_at_commit = false;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			wake_at_commit = false;
			break;
		default:
			break;
	}
}

/* Reads the inboxes with an enabled handler into handled_inboxes. */
static void
load_handled_inboxes(void)
{
	static SPIPlanPtr plan = NULL;
	Oid			nsp = get_namespace_oid("tide", true);
	MemoryContext old;
	List	   *names = NIL;
	uint64		generation = handlers_generation;

	list_free_deep(handled_inboxes);
	handled_inboxes = NIL;
	handled_loaded = false;
	handlers_relid = OidIsValid(nsp) ? get_relname_relid("relay_inbox_handlers", nsp) : InvalidOid;
	/* an older catalog has no handlers */
	if (!OidIsValid(handlers_relid))
		return;

	SPI_connect();
	if (SPI_execute_plan(TidePlan(&plan, "SELECT h.inbox_name FROM tide.relay_inbox_handlers h WHERE h.enabled",
								  0, NULL),
						 NULL, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read tide.relay_inbox_handlers");
	old = MemoryContextSwitchTo(TopMemoryContext);
	for (uint64 i = 0; i < SPI_processed; i++)
		names = lappend(names, SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1));
	MemoryContextSwitchTo(old);
	SPI_finish();
	handled_inboxes = names;
	handled_loaded = generation == handlers_generation;
}

/*
 * Wakes the relay at this transaction's commit when the inbox has an
 * enabled handler: for the inbox functions, and for the relay's own writes
 * into an inbox.
 */
void
InboxWakeAtCommit(const char *inbox)
{
	ListCell   *lc;

	if (!TidePreloaded || wake_at_commit)
		return;
	if (!callbacks_registered)
	{
		CacheRegisterRelcacheCallback(handlers_relcache_callback, (Datum) 0);
		RegisterXactCallback(inbox_wake_xact_callback, NULL);
		callbacks_registered = true;
	}
	if (!handled_loaded)
		load_handled_inboxes();
	foreach(lc, handled_inboxes)
	{
		if (strcmp((char *) lfirst(lc), inbox) == 0)
		{
			wake_at_commit = true;
			return;
		}
	}
}

/* tide._inbox_wake(inbox): see InboxWakeAtCommit. */
Datum
tide_inbox_wake(PG_FUNCTION_ARGS)
{
	char	   *inbox = text_to_cstring(PG_GETARG_TEXT_PP(0));

	InboxWakeAtCommit(inbox);
	PG_RETURN_VOID();
}
