/*
 * flow_schedule.c
 *		The schedule flow (flow.h): the relay moves the database's scheduled
 *		messages (tide.outbox_scheduled, docs/scheduled-messages.md) into
 *		their outboxes when they are due. Its one unit is the database's
 *		schedule; a step moves the due rows through
 *		tide.outbox_release_due, 1,000 at a time, each chunk a short
 *		transaction of its own, with no operation left in flight.
 *
 * When a unit looks: when the earliest deliver_at comes (next_due: the
 * engine's wait ends then), after a commit that scheduled a row (its
 * tide._relay_wake_worker: the worker reads its units and the flow is told
 * by sql_changed), after a chunk that was full, and at least every
 * SCHEDULE_LOOK_MS whenever the engine asks it to look, so that rows
 * written without a wake-up are not left waiting for long while a
 * publishing commit costs the schedule nothing more.
 *
 * The unit keeps the database's worker (any_enabled, and units_wanted for
 * the worker's last look before it leaves: on_demand.c) while a row is due
 * within RELAY_SCHEDULE_STAY_MS. A later row does not: the worker may
 * leave, telling the launcher when the earliest row is due (units_due_at),
 * and the launcher starts a worker RELAY_SCHEDULE_LEAD_MS before then. So
 * a message scheduled for next month holds no worker slot for a month,
 * and is not late for it.
 */
#include "postgres.h"

#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "flow.h"
#include "launcher.h"
#include "pg_tide.h"
#include "relay_xact.h"

/* The most messages one short transaction moves. */
#define SCHEDULE_CHUNK 1000
/* The longest the unit goes without looking when the engine asks it to. */
#define SCHEDULE_LOOK_MS 1000
/*
 * When due rows were left (another move holds them, their outbox is
 * disabled or refused them for backpressure): look again after this.
 */
#define SCHEDULE_BUSY_MS 1000

/*
 * The rows that need a worker: due within RELAY_SCHEDULE_STAY_MS, not
 * refused. The time is the statement's (the reading's and the look's
 * transactions set it as they begin): clock_timestamp() is volatile, and a
 * volatile bound cannot use the index on deliver_at, so every look would
 * read the whole schedule.
 */
#define SCHEDULE_WANTED \
	"refused_at IS NULL AND deliver_at OPERATOR(pg_catalog.<=) (pg_catalog.statement_timestamp() OPERATOR(pg_catalog.+)" \
	" '" CppAsString2(RELAY_SCHEDULE_STAY_MS) " ms'::pg_catalog.interval)"

/* When a row will next need a worker: the earliest not refused. */
#define SCHEDULE_DUE_AT \
	"SELECT pg_catalog.min(deliver_at) FROM tide.outbox_scheduled WHERE refused_at IS NULL"

/* The schedule flow's state of its unit, kept across readings. */
typedef struct ScheduleUnit
{
	bool		changed;		/* SQL scheduled a row since the last look */
	TimestampTz next_at;		/* the earliest deliver_at seen; 0: none */
	TimestampTz looked_at;		/* when it last looked */
} ScheduleUnit;

#define SU(u) ((ScheduleUnit *) (u)->flow_private)

/* The schedule flow's `read`: one unit, and whether a row needs a worker. */
static void
schedule_read(RelayFlowReading *reading)
{
	static SPIPlanPtr plan = NULL;
	MemoryContext cxt;
	RelayUnitReading *r;
	bool		isnull;

	if (!RelayTryLockTable("outbox_scheduled", AccessShareLock))
		return;
	SPI_connect();
	if (SPI_execute_plan(TidePlan(&plan,
								  "SELECT EXISTS (SELECT FROM tide.outbox_scheduled WHERE " SCHEDULE_WANTED ")",
								  0, NULL),
						 NULL, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read tide.outbox_scheduled");
	reading->any_enabled = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	if (!reading->reopen && RelayUnitIsCurrent(&RelayScheduleFlow, "schedule", "schedule"))
	{
		reading->kept = lappend(reading->kept, MemoryContextStrdup(reading->cxt, "schedule"));
		return;
	}
	cxt = AllocSetContextCreate(reading->cxt, "pg_tide schedule", ALLOCSET_SMALL_SIZES);
	r = MemoryContextAllocZero(cxt, sizeof(RelayUnitReading));
	r->name = MemoryContextStrdup(cxt, "schedule");
	r->config_md5 = r->name;
	r->cxt = cxt;
	reading->units = lappend(reading->units, r);
}

/* SQL scheduled a row (or changed a pipeline): the unit looks. */
static void
schedule_sql_changed(RelayUnit *u)
{
	SU(u)->changed = true;
}

/*
 * The next time the unit is due: the earliest deliver_at still ahead of $1
 * (now, a parameter so that the index on deliver_at serves), or sooner,
 * after SCHEDULE_BUSY_MS, when due rows were left behind.
 */
#define SCHEDULE_NEXT_SQL \
	"SELECT (SELECT pg_catalog.min(s.deliver_at) FROM tide.outbox_scheduled s" \
	"         WHERE s.refused_at IS NULL" \
	"           AND s.deliver_at OPERATOR(pg_catalog.>) $1)," \
	"       EXISTS (SELECT FROM tide.outbox_scheduled s" \
	"                WHERE s.refused_at IS NULL" \
	"                  AND s.deliver_at OPERATOR(pg_catalog.<=) $1)"

/*
 * Moves one chunk of due rows in a short transaction and sets when the
 * unit is next due; returns how many it moved.
 */
static int64
move_chunk(RelayUnit *u)
{
	static SPIPlanPtr move_plan = NULL;
	static SPIPlanPtr next_plan = NULL;
	Oid			types[1] = {INT4OID};
	Oid			next_types[1] = {TIMESTAMPTZOID};
	Datum		args[1];
	int64		moved = 0;
	bool		isnull;
	Datum		ahead;
	TimestampTz retry_at;

	RelayBeginShortXact("pg_tide relay: moving scheduled messages");
	SU(u)->next_at = 0;
	if (RelayTryLockTable("outbox_scheduled", RowExclusiveLock))
	{
		SPI_connect();
		args[0] = Int32GetDatum(SCHEDULE_CHUNK);
		if (SPI_execute_plan(TidePlan(&move_plan, "SELECT tide.outbox_release_due(NULL, $1)", 1, types),
							 args, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not move the scheduled messages");
		moved = TideSpiInt64(1, &isnull);
		args[0] = TimestampTzGetDatum(GetCurrentTimestamp());
		if (SPI_execute_plan(TidePlan(&next_plan, SCHEDULE_NEXT_SQL, 1, next_types),
							 args, NULL, true, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not read tide.outbox_scheduled");
		ahead = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		if (!isnull)
			SU(u)->next_at = DatumGetTimestampTz(ahead);
		if (TideSpiBool(2))
		{
			retry_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), SCHEDULE_BUSY_MS);
			if (SU(u)->next_at == 0 || retry_at < SU(u)->next_at)
				SU(u)->next_at = retry_at;
		}
		SPI_finish();
	}
	RelayEndShortXact(RelayLoopContext());
	return moved;
}

/*
 * The unit's step: when a row is due or the unit is to look (see the top
 * of this file), one chunk; a full chunk makes it look again at once,
 * after the other units' turns.
 */
static void
schedule_step(RelayUnit *u)
{
	TimestampTz now = GetCurrentTimestamp();
	bool		due = SU(u)->next_at != 0 && SU(u)->next_at <= now;
	bool		look = u->look &&
		(SU(u)->changed || TimestampDifferenceExceeds(SU(u)->looked_at, now, SCHEDULE_LOOK_MS));
	int64		moved;

	u->look = false;
	if (!due && !look)
		return;
	SU(u)->changed = false;
	SU(u)->looked_at = now;
	moved = move_chunk(u);
	if (moved >= SCHEDULE_CHUNK)
	{
		u->look = true;
		SU(u)->changed = true;
		RelayWakeAt(GetCurrentTimestamp());
	}
	RelayUnitOk(u);
	RelayEndOperations(u, false);
}

/* When the earliest scheduled row is due. */
static TimestampTz
schedule_next_due(RelayUnit *u)
{
	return SU(u)->next_at;
}

/* Nothing stays in flight: a step's moves end in its transactions. */
static bool
schedule_progress(RelayOperation *op)
{
	return true;
}

/* Nothing to take out of an operation: the schedule has none in flight. */
static void
schedule_finish(RelayUnit *u)
{
}

/* Nothing to record after a step: its transactions recorded it. */
static void
schedule_record(RelayUnit *u)
{
	RelayEndOperations(u, false);
}

/* Nothing points into an operation's memory. */
static void
schedule_cancel(RelayOperation *op)
{
}

/* An abandoned step is taken again at the unit's next look. */
static void
schedule_abandoned(RelayOperation *op)
{
	op->unit->look = true;
	SU(op->unit)->changed = true;
}

/* A step that ended in an ERROR (the engine holds the unit) looks again after it. */
static void
schedule_note_error(RelayUnit *u, const char *message)
{
	SU(u)->changed = true;
}

/* A reading holds nothing outside its memory. */
static void
schedule_close(RelayUnitReading *r)
{
}

const RelayFlowRoutine RelayScheduleFlow = {
	.name = "schedule",
	.unit_noun = "schedule",
	.error_retry_note = "Nothing of the chunk was moved: its messages stay scheduled and are moved then.",
	.unit_size = sizeof(ScheduleUnit),
	.units_table = "outbox_scheduled",
	.units_wanted = SCHEDULE_WANTED,
	.units_due_at = SCHEDULE_DUE_AT,
	.read = schedule_read,
	.sql_changed = schedule_sql_changed,
	.step = schedule_step,
	.next_due = schedule_next_due,
	.progress = schedule_progress,
	.finish = schedule_finish,
	.record = schedule_record,
	.cancel = schedule_cancel,
	.abandoned = schedule_abandoned,
	.note_error = schedule_note_error,
	.close = schedule_close,
};
