/*
 * engine.c
 *		The relay worker's engine: the operations in flight of every unit
 *		(flow.h), moved on together and recorded together, and the cleanup
 *		after a cancel or an ERROR.
 *
 * Each unit has at most one operation in its sink or source at a time
 * (and one prepared ahead of it, and one finished and being recorded):
 * started in the unit's step, moved on with no transaction open whenever
 * what it registered with the worker's one wait (events.h) is ready, then
 * recorded in a short transaction. Between start and record the loop waits
 * on every operation at once, so a destination that never answers holds
 * only its own unit's operation, for its own timeout.
 *
 * The operations that finished in one turn end in three passes: each
 * flow's `finish` (no transaction: the results are taken out of the sink
 * or source), every `record` together in a group of short transactions
 * (xact.c: one transaction per 64 records, each record in a subtransaction
 * of its own, so that an ERROR in one unit's record loses no other's; the
 * group's after-commit callbacks run once it committed), then each
 * `after_record` (prepare the next operation ahead).
 *
 * An ERROR in one unit's step or record is logged, its operations are
 * cancelled (the flow releases what points into their memory before that
 * memory is freed), the unit is held (1 s, doubling up to a minute while
 * the errors go on) and the others go on. The engine knows no flow by name
 * and tests no direction: everything a flow decides goes through its
 * RelayFlowRoutine.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "engine.h"

/*
 * How long a unit whose step ended with an ERROR is passed over: from
 * the first, doubling with each such step in a row, up to the last.
 */
#define RELAY_ERROR_HOLD_MIN_MS 1000
#define RELAY_ERROR_HOLD_MAX_MS 60000

/* Every operation in flight. */
static dlist_head operations = DLIST_STATIC_INIT(operations);
static int	n_operations = 0;
/* Where the units' readings and the operations live. */
static MemoryContext engine_cxt = NULL;
/* What one turn of the loop allocates; reset at the start of each. */
static MemoryContext loop_cxt = NULL;

/*
 * The worker is retired (a lowered relay_workers_per_database, its slot
 * needed elsewhere): it starts nothing new and leaves once its operations
 * in flight are recorded, so that their new owner does not send them again.
 */
static bool retiring = false;

/* Makes the engine's memory contexts and enters the loop's. */
void
RelayEngineInit(void)
{
	loop_cxt = AllocSetContextCreate(TopMemoryContext, "pg_tide relay worker loop",
									 ALLOCSET_DEFAULT_SIZES);
	engine_cxt = AllocSetContextCreate(TopMemoryContext, "pg_tide relay engine",
									   ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(loop_cxt);
}

/* What one turn of the engine allocates; reset every turn. */
MemoryContext
RelayLoopContext(void)
{
	return loop_cxt;
}

/* Where the units' readings and the operations live. */
MemoryContext
RelayEngineContext(void)
{
	return engine_cxt;
}

/* How many operations are in flight. */
int
RelayOperationsInFlight(void)
{
	return n_operations;
}

/* The worker is retired: it starts nothing new. */
void
RelayEngineRetire(void)
{
	retiring = true;
}

/* Whether the worker is retired and starts nothing new. */
bool
RelayEngineRetiring(void)
{
	return retiring;
}

/*
 * Logs that a condition of unit `u` the log said began is over: `what`
 * (is no longer held, works again) because of `why`, with since when and
 * how many times (`one`, `many`: what a time is called).
 */
static void
log_over(RelayUnit *u, RelayRepeat *r, const char *what, const char *why,
		 const char *one, const char *many)
{
	int64		times;
	TimestampTz since;

	if (RelayRepeatEnd(r, &times, &since))
		ereport(LOG,
				(errmsg("pg_tide relay %s \"%s\" %s: %s", u->flow->unit_noun, u->name, what, why),
				 errdetail("Since %s: " INT64_FORMAT " %s.",
						   timestamptz_to_str(since), times, times == 1 ? one : many)));
}

/*
 * Ends a unit's hold: an operation went through, the destination asked to
 * be disabled, or the config changed (`why`). The one place where a hold
 * ends (a flow and RelayRunForUnit are where one begins); a hold whose
 * time is up only lets the unit try again, and holds on until then. The
 * log, which said when the hold began, says that it is over.
 */
void
RelayEndHold(RelayUnit *u, const char *why)
{
	u->held_until = 0;
	u->holds = 0;
	log_over(u, &u->held_log, "is no longer held", why,
			 "failed attempt", "failed attempts");
}

/*
 * A unit's step or record ended without an ERROR after steps that did, or
 * its config changed (`why`): its ERRORs in a row are over.
 */
void
RelayEndErrors(RelayUnit *u, const char *why)
{
	u->errors = 0;
	log_over(u, &u->errors_log, "works again", why,
			 "step ended in an error", "steps in a row ended in an error");
}

/*
 * The unit is no longer served (`why`): what the log said of its hold and
 * its ERRORs must not go on forever (log_repeat.c).
 */
void
RelayLogUnitLetGo(RelayUnit *u, const char *why)
{
	log_over(u, &u->held_log, "is no longer held", why,
			 "failed attempt", "failed attempts");
	log_over(u, &u->errors_log, "works again", why,
			 "step ended in an error", "steps in a row ended in an error");
}

/*
 * A unit's step or record ended without an ERROR: whatever failed before
 * works again, and the status views say so (the flow's note_ok).
 */
void
RelayUnitOk(RelayUnit *u)
{
	if (u->errors > 0 && u->flow->note_ok)
		u->flow->note_ok(u);
	RelayEndErrors(u, "its last step ended without an error");
}

/*
 * A new operation of a unit, with a memory context of its own; not in
 * `operations` until it is started (RelayListOperation).
 */
RelayOperation *
RelayMakeOperation(RelayUnit *u)
{
	MemoryContext cxt = AllocSetContextCreate(engine_cxt, "pg_tide relay batch",
											  ALLOCSET_DEFAULT_SIZES);
	RelayOperation *op = MemoryContextAllocZero(cxt, sizeof(RelayOperation));

	op->cxt = cxt;
	op->unit = u;
	op->ready = &op->ready_self;
	op->wake_at = &op->wake_at_self;
	return op;
}

/* Puts an operation among those the loop moves on and waits for. */
void
RelayListOperation(RelayOperation *op)
{
	dlist_push_tail(&operations, &op->node);
	op->listed = true;
	n_operations++;
}

/* A new operation of a unit, its operation in flight, among `operations`. */
RelayOperation *
RelayNewOperation(RelayUnit *u)
{
	RelayOperation *op = RelayMakeOperation(u);

	u->op = op;
	RelayListOperation(op);
	return op;
}

/*
 * Frees one operation: with `cancel`, what its sink or source still holds
 * of it is released first (the flow's cancel), so that nothing points
 * into the memory freed; never an ERROR.
 */
void
RelayFreeOperation(RelayOperation *op, bool cancel)
{
	if (cancel)
		op->unit->flow->cancel(op);
	if (op->listed)
	{
		dlist_delete(&op->node);
		n_operations--;
	}
	MemoryContextSwitchTo(loop_cxt);
	MemoryContextDelete(op->cxt);
}

/*
 * Ends a unit's operations (the one in flight, the one prepared ahead of
 * it, the one being recorded): with `cancel` (the worker stops, a cancel,
 * an ERROR) the flow first releases whatever its sink or source still
 * holds of them; never an ERROR. Only then is their memory freed. The
 * unit then takes a newer reading of its config if one came meanwhile, or
 * lets go of its reading when it is no longer enabled.
 */
void
RelayEndOperations(RelayUnit *u, bool cancel)
{
	RelayOperation *ops[3] = {u->recording, u->op, u->ahead};
	bool		took = false;
	bool		any = false;

	u->recording = NULL;
	u->op = NULL;
	u->ahead = NULL;
	for (int i = 0; i < (int) lengthof(ops); i++)
		if (ops[i] != NULL)
		{
			any = true;
			took |= ops[i]->n > 0;
			RelayFreeOperation(ops[i], cancel);
		}
	if (!any)
		return;
	MemoryContextSwitchTo(loop_cxt);
	if (u->next_reading)
	{
		RelayUnitTakeReading(u, u->next_reading);
		u->next_reading = NULL;
	}
	if (!u->listed)
	{
		RelayUnitReleaseReading(u->reading);
		u->reading = NULL;
		/* moved or disabled while in flight: the next reading lets it go (ownership.c) */
		RelayReadUnitsAgain(false);
	}
	/* what it does after an operation is decided by the next look at the units */
	if (took)
		RelayScanNeeded();
}

/*
 * Abandons every operation in flight (and those prepared ahead of them):
 * nothing of them is recorded, and their units take their items again at
 * the next look (the flow's abandoned). For a cancel, for the worker's
 * stop and on the way out of an ERROR: never raises one. Returns how many
 * operations were abandoned.
 */
int
RelayAbandonOperations(void)
{
	int			n = 0;

	/* one unit's end may take more than one listed operation with it */
	while (!dlist_is_empty(&operations))
	{
		RelayOperation *op = dlist_head_element(RelayOperation, node, &operations);
		RelayUnit  *u = op->unit;

		u->flow->abandoned(op);
		n += (u->recording != NULL) + (u->op != NULL) + (u->ahead != NULL);
		RelayEndOperations(u, true);
	}
	return n;
}

/*
 * Holds a unit whose step ended with an ERROR (a full disk, its outbox
 * dropped, its lease lost): without a hold, an operation done but not
 * recorded would be done again at every look, and the error logged each
 * time, for as long as the cause lasts. Returns the hold in ms.
 */
static long
hold_after_error(RelayUnit *u)
{
	long		delay = RELAY_ERROR_HOLD_MIN_MS;
	int			i;

	u->errors++;
	for (i = 1; i < u->errors && delay < RELAY_ERROR_HOLD_MAX_MS; i++)
		delay *= 2;
	delay = Min(delay, RELAY_ERROR_HOLD_MAX_MS);
	u->held_until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), delay);
	/* what it had not recorded is taken again when the hold is up */
	u->look = true;
	RelayWakeAt(u->held_until);
	return delay;
}

/*
 * Runs `what` (a step or a completion) for one unit; an ERROR in it (its
 * outbox dropped, its lease lost, a full disk) is logged, the unit's
 * operations are cancelled (their memory freed only after the flow
 * released them), the unit is held for a while (hold_after_error) and the
 * others go on.
 */
void
RelayRunForUnit(RelayUnit *u, void (*what) (RelayUnit *u))
{
	PG_TRY();
	{
		what(u);
		MemoryContextSwitchTo(loop_cxt);
	}
	PG_CATCH();
	{
		ErrorData  *edata;
		long		delay;
		int64		unlogged;
		RelayRepeatLine line;
		const char *noun = u->flow->unit_noun;
		const char *note = u->flow->error_retry_note;

		MemoryContextSwitchTo(loop_cxt);
		edata = CopyErrorData();
		FlushErrorState();
		/* in a group of records, only this unit's is undone (xact.c) */
		RelayAbortShortXact();
		MemoryContextSwitchTo(loop_cxt);
		RelayEndOperations(u, true);
		delay = hold_after_error(u);
		/* once when they begin, then at most once a minute (log_repeat.c) */
		line = RelayRepeatNote(&u->errors_log, &unlogged);
		if (line == RELAY_REPEAT_FIRST)
			ereport(LOG,
					(errmsg("pg_tide relay %s \"%s\" stopped this pass after an error: %s",
							noun, u->name, edata->message),
					 errdetail("The %s is tried again in %ld ms (error %d in a row).%s%s",
							   noun, delay, u->errors, note ? " " : "", note ? note : ""),
					 errhint("Until a pass ends without an error, this is logged at most once a minute.")));
		else if (line == RELAY_REPEAT_AGAIN)
			ereport(LOG,
					(errmsg("pg_tide relay %s \"%s\" still stops after an error: %s",
							noun, u->name, edata->message),
					 errdetail(INT64_FORMAT " more error%s since the last line; error %d in a row since %s. The %s is tried again in %ld ms.",
							   unlogged, unlogged == 1 ? "" : "s", u->errors,
							   timestamptz_to_str(u->errors_log.since), noun, delay)));
		/* For the status views; never raises. */
		if (u->flow->note_error)
			u->flow->note_error(u, edata->message);
		FreeErrorData(edata);
	}
	PG_END_TRY();
}

/*
 * Whether this turn of the loop may run SQL: it holds the extension's
 * lock, which every DROP EXTENSION takes before anything else
 * (extension_lock.c); false while a DROP holds it or waits for it. Leaves
 * the worker when pg_tide is gone. The first call of a turn takes the
 * lock; the turn gives it back before the loop waits.
 */
bool
RelayDatabaseTurn(void)
{
	switch (RelayLockExtensionForTurn())
	{
		case RELAY_EXTENSION_LOCKED:
			return true;
		case RELAY_EXTENSION_BUSY:
			return false;
		case RELAY_EXTENSION_ABSENT:
			break;
	}
	RelayAbandonOperations();
	RelayWorkerLeave(RELAY_EXIT_NO_EXTENSION, "pg_tide is not installed");
	return false;
}

/* The first pass of an operation's end: its flow's `finish`. */
static void
finish_unit(RelayUnit *u)
{
	u->flow->finish(u);
}

/* The second pass: its flow's `record`. */
static void
record_unit(RelayUnit *u)
{
	u->flow->record(u);
}

/* The third pass: its flow's `after_record`. */
static void
after_record_unit(RelayUnit *u)
{
	u->flow->after_record(u);
}

/*
 * Moves on every operation whose sink or source has something to do (its
 * sockets or timers fired, or its wake_at came), and ends those that
 * finished, in three passes (see the top of this file): finish with no
 * transaction open, record in a group of short transactions, then
 * after_record once the group committed and its after-commit callbacks
 * ran.
 */
void
RelayProgressOperations(void)
{
	dlist_iter	iter;
	TimestampTz now = GetCurrentTimestamp();
	RelayUnit **finished = palloc(sizeof(RelayUnit *) * Max(n_operations, 1));
	int			nfinished = 0;

	dlist_foreach(iter, &operations)
	{
		RelayOperation *op = dlist_container(RelayOperation, node, iter.cur);

		if (!*op->ready && (*op->wake_at == 0 || *op->wake_at > now))
			continue;
		*op->ready = false;
		*op->wake_at = 0;
		if (op->finished || op->unit->flow->progress(op))
		{
			if (!RelayDatabaseTurn())
			{
				/* finished, recorded in a later turn */
				op->finished = true;
				*op->ready = true;
				continue;
			}
			finished[nfinished++] = op->unit;
		}
	}
	if (nfinished == 0)
		return;
	for (int i = 0; i < nfinished; i++)
		RelayRunForUnit(finished[i], finish_unit);
	RelayBeginXactGroup();
	for (int i = 0; i < nfinished; i++)
	{
		RelayUnit  *u = finished[i];

		/* (an ERROR in its first half ended every operation of it) */
		if (u->recording != NULL || (u->op != NULL && u->op->to_record))
			RelayRunForUnit(u, record_unit);
	}
	RelayEndXactGroup();
	MemoryContextSwitchTo(loop_cxt);
	for (int i = 0; i < nfinished; i++)
		if (finished[i]->op != NULL && finished[i]->flow->after_record != NULL)
			RelayRunForUnit(finished[i], after_record_unit);
}

/*
 * The earliest of `until` and the operations' wake_at; `now` (0) when an
 * operation is ready to be moved on already.
 */
TimestampTz
RelayOperationsDueBy(TimestampTz until)
{
	dlist_iter	iter;

	dlist_foreach(iter, &operations)
	{
		RelayOperation *op = dlist_container(RelayOperation, node, iter.cur);

		if (*op->ready)
			return 0;
		if (*op->wake_at != 0 && *op->wake_at < until)
			until = *op->wake_at;
	}
	return until;
}
