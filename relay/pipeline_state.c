/*
 * pipeline_state.c
 *		What only the relay worker knows about a pipeline, written where
 *		relay_pipeline_status can read it (relay_pipeline_health): that the
 *		worker holds the pipeline (since when, until when, why) and that
 *		the pipeline's last turn ended in an ERROR (the message, since when,
 *		how many turns in a row).
 *
 * The worker keeps this state in its memory (units.c); these functions
 * copy its changes into the catalog, each in a short transaction of its own,
 * and only when the state changes: a hold starts (or is renewed after
 * another failed attempt), a turn ends in an ERROR, the first turn without
 * one follows. A hold ends when the next batch is recorded: that record's
 * transaction clears it (tide._relay_after_batch), since a batch is only
 * leased once the hold is over. A worker that starts has no holds and no
 * errors in memory, so it clears what an earlier worker recorded for the
 * pipelines it serves.
 *
 * After an ERROR the turn's transaction is aborted and the cause may still
 * be there (a full disk): a write that fails here is logged and given up,
 * never raised, so it cannot turn one pipeline's trouble into the worker's;
 * while such failures go on, the log says so at most once a minute per
 * pipeline (log_repeat.c).
 * Nothing is written while a DROP EXTENSION holds the table. The other
 * flows write their units' states the same way (RelayRecordInOwnXact).
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "pg_tide.h"
#include "flow_errors.h"
#include "forward.h"
#include "relay_xact.h"

/* Longest turn error kept, in bytes (an ERROR's message can be long). */
#define TURN_ERROR_MAX_BYTES	1024

/* The statements, planned once. */
static SPIPlanPtr hold_plan = NULL;
static SPIPlanPtr turn_error_plan = NULL;
static SPIPlanPtr turn_ok_plan = NULL;
static SPIPlanPtr forget_plan = NULL;

/* The failures to clear an earlier worker's states, as the log tells them. */
static RelayRepeat forget_log;

/*
 * Runs one planned statement that writes `table` in a short transaction of
 * its own; the caller's memory context is kept. An ERROR is logged with
 * what was being recorded and then dropped, and false returned. `log` is
 * the unit's record of such failures: the log says when they begin, at
 * most once a minute while they go on (log_repeat.c), and when a record
 * works again. For every flow's state (flow_errors.h).
 */
bool
RelayRecordInOwnXact(const char *table, SPIPlanPtr *plan, const char *sql, int nargs, Oid *types,
					 Datum *values, const char *what, RelayRepeat *log)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile bool done = false;
	int64		times;
	int64		unlogged;
	RelayRepeatLine line;
	TimestampTz since;

	PG_TRY();
	{
		RelayBeginShortXact("pg_tide relay: recording a unit's state");
		if (RelayTryLockTable(table, RowExclusiveLock))
		{
			if (SPI_execute_plan(TidePlan(plan, sql, nargs, types), values, NULL,
								 false, 0) < 0)
				elog(ERROR, "could not record %s", what);
			done = true;
		}
		RelayEndShortXact(cxt);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		/* in a group of records (xact.c), only this one is undone */
		RelayAbortShortXact();
		MemoryContextSwitchTo(cxt);
		line = RelayRepeatNote(log, &unlogged);
		if (line == RELAY_REPEAT_FIRST)
			ereport(LOG,
					(errmsg("pg_tide relay could not record %s: %s", what, edata->message),
					 errdetail("The status views may not show it until the next change."),
					 errhint("Until a record works again, this is logged at most once a minute.")));
		else if (line == RELAY_REPEAT_AGAIN)
			ereport(LOG,
					(errmsg("pg_tide relay still cannot record %s: %s", what, edata->message),
					 errdetail(INT64_FORMAT " more failure%s since the last line; " INT64_FORMAT " since %s.",
							   unlogged, unlogged == 1 ? "" : "s", log->times,
							   timestamptz_to_str(log->since))));
		FreeErrorData(edata);
		done = false;
	}
	PG_END_TRY();
	if (done && RelayRepeatEnd(log, &times, &since))
		ereport(LOG,
				(errmsg("pg_tide relay records %s again", what),
				 errdetail("Recording failed " INT64_FORMAT " time%s since %s.",
						   times, times == 1 ? "" : "s", timestamptz_to_str(since))));
	return done;
}

/*
 * Records that the worker holds pipeline `p` at message `m`, whose attempt
 * ended as `o`, until `until` (0: until its next pass, after the naptime);
 * `holds` is the attempt in a row while held, the first starts held_since.
 */
void
RelayRecordHold(const RelayPipeline *p, const RelayMessage *m, const RelayMessageOutcome *o,
				TimestampTz until, int holds, RelayRepeat *log)
{
	Oid			types[4] = {TEXTOID, TIMESTAMPTZOID, INT4OID, TEXTOID};
	Datum		values[4];
	char	   *reason;
	char	   *what = psprintf("the hold of pipeline \"%s\"", p->name);

	if (until == 0)
		until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), RelayNaptimeMs);
	if (p->strict && o->outcome != RELAY_UNREACHABLE)
		reason = psprintf("ordering is strict and message " INT64_FORMAT " failed: %s",
						  m->id, o->error);
	else
		reason = psprintf("the destination failed at message " INT64_FORMAT ": %s",
						  m->id, o->error);
	values[0] = CStringGetTextDatum(p->name);
	values[1] = TimestampTzGetDatum(until);
	values[2] = Int32GetDatum(holds);
	values[3] = CStringGetTextDatum(reason);
	RelayRecordInOwnXact("relay_pipeline_health", &hold_plan,
						 "INSERT INTO tide.relay_pipeline_health AS h"
						 "  (pipeline_id, held_since, held_until, held_reason)"
						 " VALUES ($1, pg_catalog.now(), $2, $4)"
						 " ON CONFLICT (pipeline_id) DO UPDATE"
						 "   SET held_since = CASE WHEN $3 OPERATOR(pg_catalog.<=) 1 OR h.held_since IS NULL"
						 "                         THEN pg_catalog.now() ELSE h.held_since END,"
						 "       held_until = $2, held_reason = $4, updated_at = pg_catalog.now()",
						 4, types, values, what, log);
}

/*
 * Records that a pipeline's turn ended in an ERROR with `message` (turn
 * `errors` in a row: the first starts turn_error_since), and that the
 * worker holds the pipeline until `until` because of it.
 */
void
RelayRecordTurnError(const char *pipeline, const char *message, int errors, TimestampTz until,
					 RelayRepeat *log)
{
	Oid			types[4] = {TEXTOID, TEXTOID, INT4OID, TIMESTAMPTZOID};
	Datum		values[4];
	char		clean[TURN_ERROR_MAX_BYTES];
	char	   *what = psprintf("the error of pipeline \"%s\"", pipeline);

	RelayCleanText(clean, sizeof(clean), message, strlen(message));
	values[0] = CStringGetTextDatum(pipeline);
	values[1] = CStringGetTextDatum(clean);
	values[2] = Int32GetDatum(errors);
	values[3] = TimestampTzGetDatum(until);
	RelayRecordInOwnXact("relay_pipeline_health", &turn_error_plan,
						 "INSERT INTO tide.relay_pipeline_health AS h"
						 "  (pipeline_id, turn_error, turn_error_since, turn_errors,"
						 "   held_since, held_until, held_reason)"
						 " VALUES ($1, $2, pg_catalog.now(), $3, pg_catalog.now(), $4,"
						 "         'its last turn ended in an error')"
						 " ON CONFLICT (pipeline_id) DO UPDATE"
						 "   SET turn_error = $2, turn_errors = $3,"
						 "       turn_error_since = CASE WHEN $3 OPERATOR(pg_catalog.<=) 1"
						 "                                 OR h.turn_error_since IS NULL"
						 "                               THEN pg_catalog.now() ELSE h.turn_error_since END,"
						 "       held_since = pg_catalog.now(), held_until = $4,"
						 "       held_reason = 'its last turn ended in an error', updated_at = pg_catalog.now()",
						 4, types, values, what, log);
}

/*
 * Records that a pipeline's turn ended without an ERROR, after turns that
 * did: its error is cleared. The worker calls it only then.
 */
void
RelayRecordTurnOk(const char *pipeline, RelayRepeat *log)
{
	Oid			types[1] = {TEXTOID};
	Datum		values[1];
	char	   *what = psprintf("the recovery of pipeline \"%s\"", pipeline);

	values[0] = CStringGetTextDatum(pipeline);
	RelayRecordInOwnXact("relay_pipeline_health", &turn_ok_plan,
						 "UPDATE tide.relay_pipeline_health"
						 "   SET turn_error = NULL, turn_error_since = NULL, turn_errors = 0,"
						 "       updated_at = pg_catalog.now()"
						 " WHERE pipeline_id OPERATOR(pg_catalog.=) $1 AND turn_error IS NOT NULL",
						 1, types, values, what, log);
}

/*
 * Clears the holds and turn errors an earlier worker recorded for the
 * pipelines this worker serves, and for those no worker serves (disabled
 * or gone): a worker that starts holds nothing and knows of no error. Not
 * the others: with several workers per database (ownership.c) their holds
 * are another worker's; a pipeline that moves here later has its record
 * cleared by its next batch. Returns false when it could not, or served
 * no pipeline yet (the caller tries again on its next pass).
 */
bool
RelayForgetPipelineStates(List *pipelines)
{
	Oid			types[1] = {TEXTARRAYOID};
	Datum		values[1];
	Datum	   *names;
	ListCell   *lc;
	int			n = 0;
	bool		done;

	names = palloc(sizeof(Datum) * Max(list_length(pipelines), 1));
	foreach(lc, pipelines)
		names[n++] = CStringGetTextDatum(((RelayPipeline *) lfirst(lc))->name);
	/* text's length, by-value and alignment: no catalog look-up, no transaction is open */
	values[0] = PointerGetDatum(construct_array(names, n, TEXTOID, -1, false, TYPALIGN_INT));
	done = RelayRecordInOwnXact("relay_pipeline_health", &forget_plan,
								"UPDATE tide.relay_pipeline_health h"
								"   SET held_since = NULL, held_until = NULL, held_reason = NULL,"
								"       turn_error = NULL, turn_error_since = NULL, turn_errors = 0,"
								"       updated_at = pg_catalog.now()"
								" WHERE (h.held_until IS NOT NULL OR h.turn_error IS NOT NULL)"
								"   AND (h.pipeline_id OPERATOR(pg_catalog.=) ANY ($1)"
								"        OR NOT EXISTS (SELECT FROM tide.relay_outbox_config c"
								"                        WHERE c.name OPERATOR(pg_catalog.=) h.pipeline_id AND c.enabled))",
								1, types, values, "the end of an earlier worker's holds", &forget_log);
	return done && n > 0;
}
