/*
 * flow_handler.c
 *		The handler flow (flow.h): an inbox with an enabled handler of
 *		tide.relay_inbox_handlers runs its pending events through the
 *		handler. A unit is an inbox's handler; its work is the inbox's
 *		pending events; one step processes one batch, claimed and run in a
 *		short transaction of its own (relay/inbox_handler.c), with no
 *		operation left in flight: the handler runs inside the transaction
 *		that marks its events.
 *
 * Every relay worker of the database serves every handler; the batch's
 * transaction takes one of the inbox's `concurrency` slots first, so at
 * most that many workers run batches of one inbox at once (one: one after
 * another, in id order), and a worker that finds them all taken leaves the
 * inbox to them.
 *
 * When a unit looks: after a commit that stored events into an inbox with
 * a handler (src/inbox_wake.c counts those apart from the commits that
 * published), after a batch that was full (more may wait), after a
 * reading that changed the handler, and at least every HANDLER_LOOK_MS
 * whenever the engine asks it to look (every pg_tide.relay_naptime_ms at
 * least): events that came without a wake-up (a row inserted by hand) are
 * not left waiting for long, and a commit that only published costs the
 * handlers nothing.
 *
 * What is not an event's fault (the function dropped, a right of run_as or
 * of the handler's owner taken away: tide._inbox_handler_problem) holds the
 * unit: nothing is claimed, the hold is logged once, then at most once a
 * minute, and written where inbox_handler_status shows it, and the unit
 * tries again after 1 s, doubling up to a minute. An ERROR of a step (a
 * column of the inbox's table renamed, a full disk, a deadlock) is the
 * engine's: it holds the unit likewise, and handler_note_error writes it
 * where inbox_handler_status shows it.
 */
#include "postgres.h"

#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "flow.h"
#include "flow_errors.h"
#include "inbox_handler.h"
#include "inbox_wake.h"
#include "pg_tide.h"
#include "relay_xact.h"
#include "sink.h"

/* The longest a unit goes without looking when the engine asks it to. */
#define HANDLER_LOOK_MS 1000
/* Longest step error kept, in bytes (an ERROR's message can be long). */
#define HANDLER_ERROR_MAX_BYTES 1024
/* A held handler's pauses: from 1 s, doubling, to a minute. */
#define HANDLER_HOLD_MIN_MS 1000
#define HANDLER_HOLD_MAX_MS 60000

/* The handler flow's state of a unit, kept across readings. */
typedef struct HandlerUnit
{
	bool		quiet;			/* the last look found the inbox drained */
	uint64		seen_inbox_commits; /* the inbox commit count then */
	TimestampTz looked_at;		/* when it last claimed */
} HandlerUnit;

#define HU(u) ((HandlerUnit *) (u)->flow_private)

/* A reading of a handler's row: the inbox it processes. */
typedef struct HandlerReading
{
	char	   *inbox;
} HandlerReading;

/* The handler flow's `read`: the enabled rows of relay_inbox_handlers. */
static void
handler_read(RelayFlowReading *reading)
{
	static SPIPlanPtr plan = NULL;

	if (!RelayTryLockTable("relay_inbox_handlers", AccessShareLock))
		return;
	SPI_connect();
	if (SPI_execute_plan(TidePlan(&plan,
								  "SELECT h.inbox_name, pg_catalog.md5(h::text) FROM tide.relay_inbox_handlers h"
								  " WHERE h.enabled ORDER BY h.inbox_name",
								  0, NULL),
						 NULL, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read tide.relay_inbox_handlers");
	reading->any_enabled = SPI_processed > 0;
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		char	   *name = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
		char	   *md5 = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2);
		MemoryContext cxt;
		RelayUnitReading *r;
		HandlerReading *h;
		MemoryContext spi_cxt;

		if (!reading->reopen && RelayUnitIsCurrent(&RelayHandlerFlow, name, md5))
		{
			/* the lists live in the reading's context, not SPI's (freed below) */
			spi_cxt = MemoryContextSwitchTo(reading->cxt);
			reading->kept = lappend(reading->kept, pstrdup(name));
			MemoryContextSwitchTo(spi_cxt);
			continue;
		}
		cxt = AllocSetContextCreate(reading->cxt, "pg_tide inbox handler", ALLOCSET_SMALL_SIZES);
		r = MemoryContextAllocZero(cxt, sizeof(RelayUnitReading));
		h = MemoryContextAllocZero(cxt, sizeof(HandlerReading));
		h->inbox = MemoryContextStrdup(cxt, name);
		r->name = h->inbox;
		r->config_md5 = MemoryContextStrdup(cxt, md5);
		r->state = h;
		r->cxt = cxt;
		spi_cxt = MemoryContextSwitchTo(reading->cxt);
		reading->units = lappend(reading->units, r);
		MemoryContextSwitchTo(spi_cxt);
	}
	SPI_finish();
}

/* A changed handler (a fixed grant, another function) is tried at once. */
static void
handler_config_changed(RelayUnit *u)
{
	HU(u)->quiet = false;
}

/* SQL changed a handler: each looks. */
static void
handler_sql_changed(RelayUnit *u)
{
	HU(u)->quiet = false;
}

/* Holds a handler that cannot run (see the top of this file). */
static void
hold_handler(RelayUnit *u, const char *why)
{
	long		delay = HANDLER_HOLD_MIN_MS;
	int64		unlogged;
	RelayRepeatLine line;

	u->holds++;
	for (int i = 1; i < u->holds && delay < HANDLER_HOLD_MAX_MS; i++)
		delay *= 2;
	delay = Min(delay, HANDLER_HOLD_MAX_MS);
	u->held_until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), delay);
	HU(u)->quiet = false;
	line = RelayRepeatNote(&u->held_log, &unlogged);
	if (line == RELAY_REPEAT_FIRST)
		ereport(LOG,
				(errmsg("pg_tide relay inbox handler \"%s\" is held: %s", u->name, why),
				 errdetail("No event is claimed or counted as failed while it cannot run."),
				 errhint("It tries again in %ld ms, and later less often. Until the hold ends, this is logged at most once a minute.",
						 delay)));
	else if (line == RELAY_REPEAT_AGAIN)
		ereport(LOG,
				(errmsg("pg_tide relay inbox handler \"%s\" is still held: %s", u->name, why),
				 errdetail(INT64_FORMAT " more attempt%s since the last line; " INT64_FORMAT " since the hold began at %s.",
						   unlogged, unlogged == 1 ? "" : "s", u->held_log.times,
						   timestamptz_to_str(u->held_log.since)),
				 errhint("It tries again in %ld ms.", delay)));
}

/*
 * A unit's step: when it is to look (see the top of this file), one batch
 * of the inbox's pending events in a short transaction; a full batch makes
 * it look again at once, after the other units' turns.
 */
static void
handler_step(RelayUnit *u)
{
	HandlerReading *h = u->reading->state;
	uint64		inbox_commits = WakeInboxCommitCount(MyDatabaseId);
	TimestampTz now = GetCurrentTimestamp();
	InboxHandlerOutcome out;

	if (!u->look)
		return;
	u->look = false;
	if (HU(u)->quiet && inbox_commits == HU(u)->seen_inbox_commits &&
		!TimestampDifferenceExceeds(HU(u)->looked_at, now, HANDLER_LOOK_MS))
		return;
	HU(u)->seen_inbox_commits = inbox_commits;
	HU(u)->looked_at = now;
	HU(u)->quiet = false;
	RelayBeginShortXact("pg_tide relay: running an inbox handler");
	InboxHandlerRunBatch(h->inbox, &out);
	RelayEndShortXact(RelayLoopContext());
	if (out.held != NULL)
	{
		hold_handler(u, out.held);
		return;
	}
	if (u->holds > 0)
	{
		u->holds = 0;
		RelayEndHold(u, "the handler runs again");
	}

	/*
	 * Disabled or removed since the reading (the next reading lets it go),
	 * drained, or every slot taken by the batches of the database's other
	 * workers, which look again themselves after a full batch.
	 */
	if (!out.found || out.busy || out.claimed < out.batch_size)
		HU(u)->quiet = true;
	else
	{
		u->look = true;
		RelayWakeAt(GetCurrentTimestamp());
	}
	RelayUnitOk(u);
	RelayEndOperations(u, false);
}

/* Nothing stays in flight: a step's batches end in its transactions. */
static bool
handler_progress(RelayOperation *op)
{
	return true;
}

/* Nothing to take out of an operation: a handler has none in flight. */
static void
handler_finish(RelayUnit *u)
{
}

/* Nothing to record after a step: its transactions recorded it. */
static void
handler_record(RelayUnit *u)
{
	RelayEndOperations(u, false);
}

/* Nothing points into an operation's memory. */
static void
handler_cancel(RelayOperation *op)
{
}

/* An abandoned step is taken again at the unit's next look. */
static void
handler_abandoned(RelayOperation *op)
{
	op->unit->look = true;
	HU(op->unit)->quiet = false;
}

/*
 * A step ended in an ERROR (the engine logs it and holds the unit): the
 * hold and the message go where inbox_handler_status shows them, until a
 * batch commits (its transaction ends the hold, as after any hold); the
 * unit looks again when the hold ends, whatever was committed meanwhile.
 * Never raises.
 */
static void
handler_note_error(RelayUnit *u, const char *message)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		values[2];
	char		clean[HANDLER_ERROR_MAX_BYTES];

	HU(u)->quiet = false;
	RelayCleanText(clean, sizeof(clean), message, strlen(message));
	values[0] = CStringGetTextDatum(u->name);
	values[1] = CStringGetTextDatum(psprintf("its last step ended in an error (%d in a row): %s",
											 u->errors, clean));
	RelayRecordInOwnXact("relay_inbox_handler_health", &plan,
						 "SELECT tide._inbox_handler_hold($1, $2)", 2, types, values,
						 psprintf("the error of the handler of inbox \"%s\"", u->name), &u->record_log);
}

/* A reading holds nothing outside its memory. */
static void
handler_close(RelayUnitReading *r)
{
}

const RelayFlowRoutine RelayHandlerFlow = {
	.name = "handler",
	.unit_noun = "inbox handler",
	.error_retry_note = "No event was marked: the batch's events are claimed again then.",
	.unit_size = sizeof(HandlerUnit),
	.units_table = "relay_inbox_handlers",
	.read = handler_read,
	.sql_changed = handler_sql_changed,
	.config_changed = handler_config_changed,
	.step = handler_step,
	.progress = handler_progress,
	.finish = handler_finish,
	.record = handler_record,
	.cancel = handler_cancel,
	.abandoned = handler_abandoned,
	.note_error = handler_note_error,
	.close = handler_close,
};
