/*
 * flow_reverse.c
 *		The reverse flow (flow.h): a pipeline of relay_inbox_config reads
 *		events from its source (source.h) and stores them in its inbox,
 *		exactly once.
 *
 * A pipeline's step (when it has no fetch in flight and is not held)
 * starts a fetch from the position it has stored: an operation of the
 * engine, moved on by the source with no transaction open (a remote
 * poll, a wait for new messages there). Once it finished, its record is
 * one short transaction of the engine's group:
 *
 *	  tide.inbox_receive_batch(<inbox>, <events>)      the inbox rows
 *	  relay_consumer_offsets ('reverse', <pipeline>, <inbox>):
 *	    source_position, last_change_id                 the new position
 *
 * and only after that transaction committed (the engine's after-commit
 * list) does the position become the one the next fetch starts from and
 * may acknowledge at the source. So the inbox rows and the position are
 * durable together or not at all; a crash before the commit fetches the
 * same events again, one after it has the source acknowledge late, and
 * either way the inbox's event ids make a repeat change nothing.
 *
 * One event never stops its pipeline. When the inbox refuses an event of
 * the fetch (a CHECK or a trigger of its table, its size), the store is
 * undone and made again in a new short transaction event by event, each
 * in a subtransaction; an event refused alone is dead-lettered in
 * relay_dlq with class "record" and its event id (tide.relay_dlq_retry
 * stores it in the inbox once the inbox accepts it), and the position
 * moves past the whole fetch. An ERROR that is not an event's
 * (error_class.c's classes, and an inbox dropped or not writable) is
 * raised instead: the engine holds the pipeline and the same events are
 * fetched again later.
 *
 * A fetch that failed (the source unreachable, its credentials refused)
 * holds the pipeline, with a back-off from 200 ms doubling to 10 s; the
 * hold is logged when it starts, at most once a minute while it lasts, and
 * when it ends (log_repeat.c), and shown in relay_pipeline_health under
 * the pipeline's name (names are unique across both directions).
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "config_value.h"
#include "flow.h"
#include "flow_errors.h"
#include "pg_tide.h"
#include "relay_xact.h"
#include "reverse_config.h"
#include "sink.h"
#include "source.h"

/* The error class of an event dead-lettered because the inbox refused it. */
#define REVERSE_CLASS_RECORD "record"

/* The back-off of a pipeline whose source failed. */
#define REVERSE_HOLD_MIN_MS 200
#define REVERSE_HOLD_MAX_MS 10000

/* A reading of a reverse pipeline (RelayUnitReading.state). */
typedef struct ReverseReading
{
	char	   *name;
	char	   *inbox;
	int			batch_size;
	const RelaySourceRoutine *source;
	void	   *source_state;
	char	   *stored_position;	/* as read with the row: JSON text, or NULL */
} ReverseReading;

/*
 * The flow's state of a pipeline, kept across readings: the position its
 * last committed record stored (malloc'd: an after-commit callback sets it,
 * and may not raise an ERROR), and whether it is known yet.
 */
typedef struct ReverseUnit
{
	bool		position_known;
	char	   *position;		/* JSON text, or NULL: nothing stored */
} ReverseUnit;

#define RU(u) ((ReverseUnit *) (u)->flow_private)

/* A fetch in flight (RelayOperation.flow_private). */
typedef struct ReverseOp
{
	ReverseReading *r;
	bool		in_source;		/* started, not yet finished or cancelled */
	RelaySourceFetch fetch;
} ReverseOp;

#define ROP(op) ((ReverseOp *) (op)->flow_private)

/* The position a committed record stored (an after-commit callback's argument). */
typedef struct StoredPosition
{
	RelayUnit  *unit;
	char		position[FLEXIBLE_ARRAY_MEMBER];
} StoredPosition;

/*
 * The pipelines whose row failed to open, each with the md5 of the row that
 * failed, so that a failure is written once: one entry a pipeline, replaced
 * when another row of it fails, removed when a row of it opens.
 */
typedef struct FailedRow
{
	char	   *name;
	char	   *md5;
} FailedRow;

static List *failed_rows = NIL;

/* The entry of failed_rows for pipeline `name`, or NULL. */
static FailedRow *
failed_row(const char *name)
{
	ListCell   *lc;

	foreach(lc, failed_rows)
		if (strcmp(((FailedRow *) lfirst(lc))->name, name) == 0)
			return lfirst(lc);
	return NULL;
}

/* A row of pipeline `name` opened: a later failure of it is written again. */
static void
forget_row_failure(const char *name)
{
	FailedRow  *f = failed_row(name);

	if (f == NULL)
		return;
	failed_rows = list_delete_ptr(failed_rows, f);
	pfree(f->name);
	pfree(f->md5);
	pfree(f);
}

/* Writes a reverse pipeline's failure to read its row into its health. */
static void
note_row_failure(const char *name, const char *md5, const char *cls, const char *error)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[3] = {TEXTOID, TEXTOID, TEXTOID};
	Datum		values[3];
	MemoryContext old;
	FailedRow  *f = failed_row(name);

	if (f != NULL && strcmp(f->md5, md5) == 0)
		return;
	old = MemoryContextSwitchTo(TopMemoryContext);
	if (f == NULL)
	{
		f = palloc0(sizeof(FailedRow));
		f->name = pstrdup(name);
		failed_rows = lappend(failed_rows, f);
	}
	else
		pfree(f->md5);
	f->md5 = pstrdup(md5);
	MemoryContextSwitchTo(old);
	values[0] = CStringGetTextDatum(name);
	values[1] = CStringGetTextDatum(cls);
	values[2] = CStringGetTextDatum(error);
	SPI_execute_plan(TidePlan(&plan,
							  "INSERT INTO tide.relay_pipeline_health AS h"
							  "  (pipeline_id, last_failure_at, last_error_class, last_error)"
							  " VALUES ($1, pg_catalog.now(), $2, $3)"
							  " ON CONFLICT (pipeline_id) DO UPDATE"
							  "   SET last_failure_at = pg_catalog.now(), last_error_class = $2,"
							  "       last_error = $3, updated_at = pg_catalog.now()",
							  3, types),
					 values, NULL, false, 0);
	ereport(LOG,
			(errmsg("pg_tide relay reverse pipeline \"%s\" is passed over: %s", name, error),
			 errhint("Fix it with tide.relay_set_inbox().")));
}

/*
 * A row's config validated with its owner's rights, in a subtransaction so
 * that an invalid row fails alone; NULL, with *error, when it is invalid.
 * An ERROR that is not about the config (a cancel) is raised again.
 */
static cJSON *
validate_row(Jsonb *config, const char *owner, char **error)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner resowner = CurrentResourceOwner;
	Oid			rights = owner ? get_role_oid(owner, true) : InvalidOid;
	cJSON	   *volatile result = NULL;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		Jsonb	   *normalized = RelayNormalizeReverseConfig(NULL, config, rights);

		/* numbers as numbers, as a sink's open reads them (pipelines.c) */
		result = cJSON_Parse(JsonbToCString(NULL, &normalized->root, VARSIZE(normalized)));
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = resowner;
	}
	PG_CATCH();
	{
		ErrorData  *e;

		MemoryContextSwitchTo(cxt);
		e = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = resowner;
		if (ERRCODE_TO_CATEGORY(e->sqlerrcode) != ERRCODE_DATA_EXCEPTION &&
			ERRCODE_TO_CATEGORY(e->sqlerrcode) != ERRCODE_SYNTAX_ERROR_OR_ACCESS_RULE_VIOLATION)
			ReThrowError(e);
		*error = e->message;
	}
	PG_END_TRY();
	return result;
}

/* Reads and opens one row into a reading; NULL when it is passed over. */
static RelayUnitReading *
open_row(const char *name, const char *md5, Jsonb *jb, const char *owner, const char *position,
		 MemoryContext parent)
{
	MemoryContext cxt = AllocSetContextCreate(parent, "pg_tide reverse pipeline", ALLOCSET_SMALL_SIZES);
	MemoryContext old = MemoryContextSwitchTo(cxt);
	char	   *error = NULL;
	cJSON	   *config = validate_row(jb, owner, &error);
	ReverseReading *r;
	RelaySourceOpened opened;
	RelayUnitReading *reading;

	if (config == NULL)
	{
		note_row_failure(name, md5, "config", error);
		MemoryContextSwitchTo(old);
		MemoryContextDelete(cxt);
		return NULL;
	}
	r = palloc0(sizeof(ReverseReading));
	r->name = pstrdup(name);
	r->inbox = RelayConfigString(config, "inbox");
	r->batch_size = RelayConfigIntOr(config, "batch_size", 100);
	r->source = RelaySourceFind(RelayConfigString(config, "source_type"));
	r->stored_position = position ? pstrdup(position) : NULL;
	memset(&opened, 0, sizeof(opened));
	opened.pipeline = r->name;
	if (r->source == NULL || r->source->open == NULL || !r->source->open(config, &opened))
	{
		note_row_failure(name, md5, opened.read_secrets ? "secret" : "config",
						 opened.error ? opened.error : "its source type cannot be served");
		cJSON_Delete(config);
		MemoryContextSwitchTo(old);
		MemoryContextDelete(cxt);
		return NULL;
	}
	cJSON_Delete(config);
	forget_row_failure(name);
	r->source_state = opened.state;
	reading = palloc0(sizeof(RelayUnitReading));
	reading->name = r->name;
	reading->config_md5 = pstrdup(md5);
	reading->reads_secrets = opened.read_secrets;
	reading->state = r;
	reading->cxt = cxt;
	MemoryContextSwitchTo(old);
	return reading;
}

/*
 * The reverse flow's `read`: the enabled rows of relay_inbox_config that
 * this worker serves (ownership.c), each with the position it stored.
 */
static void
reverse_read(RelayFlowReading *reading)
{
	static SPIPlanPtr plan = NULL;

	if (!RelayTryLockTable("relay_inbox_config", AccessShareLock))
		return;
	SPI_connect();
	if (SPI_execute_plan(TidePlan(&plan,
								  "SELECT c.name, c.config,"
								  "       pg_catalog.md5(pg_catalog.concat_ws(E'\\n', c.config::text, c.owner,"
								  "         r.rolsuper,"
								  "         pg_catalog.pg_has_role(r.oid, 'pg_read_server_files', 'USAGE'),"
								  "         pg_catalog.current_setting('pg_tide.secrets_directory'))),"
								  "       c.owner, o.source_position::text"
								  "  FROM tide.relay_inbox_config c"
								  "  LEFT JOIN pg_catalog.pg_roles r ON r.rolname OPERATOR(pg_catalog.=) c.owner"
								  "  LEFT JOIN tide.relay_consumer_offsets o"
								  "    ON o.relay_group_id OPERATOR(pg_catalog.=) 'reverse'"
								  "   AND o.pipeline_id OPERATOR(pg_catalog.=) c.name"
								  "   AND o.outbox_name OPERATOR(pg_catalog.=) (c.config OPERATOR(pg_catalog.->>) 'inbox')"
								  " WHERE c.enabled ORDER BY c.name",
								  0, NULL),
						 NULL, NULL, false, 0) == SPI_OK_SELECT)
	{
		SPITupleTable *rows = SPI_tuptable;
		uint64		nrows = SPI_processed;

		reading->any_enabled = reading->any_enabled || nrows > 0;
		for (uint64 i = 0; i < nrows; i++)
		{
			HeapTuple	tuple = rows->vals[i];
			char	   *name = SPI_getvalue(tuple, rows->tupdesc, 1);
			char	   *md5 = SPI_getvalue(tuple, rows->tupdesc, 3);
			bool		isnull;
			Jsonb	   *jb;
			RelayUnitReading *r;

			if (!RelayServesPipeline(name))
				continue;
			if (!reading->reopen && RelayUnitIsCurrent(&RelayReverseFlow, name, md5))
			{
				MemoryContext old = MemoryContextSwitchTo(reading->cxt);

				reading->kept = lappend(reading->kept, pstrdup(name));
				MemoryContextSwitchTo(old);
				continue;
			}
			jb = DatumGetJsonbP(SPI_getbinval(tuple, rows->tupdesc, 2, &isnull));
			r = open_row(name, md5, jb, SPI_getvalue(tuple, rows->tupdesc, 4),
						 SPI_getvalue(tuple, rows->tupdesc, 5), reading->cxt);
			if (r != NULL)
			{
				MemoryContext old = MemoryContextSwitchTo(reading->cxt);

				reading->units = lappend(reading->units, r);
				MemoryContextSwitchTo(old);
			}
		}
	}
	SPI_finish();
}

/* The reading a unit is served with. */
static inline ReverseReading *
unit_reading(RelayUnit *u)
{
	return u->reading != NULL ? (ReverseReading *) u->reading->state : NULL;
}

/* A pipeline's step: a fetch from the position it has stored. */
static void
reverse_step(RelayUnit *u)
{
	ReverseReading *r = unit_reading(u);
	RelayOperation *op;
	ReverseOp  *rop;

	u->look = false;
	if (!RU(u)->position_known)
	{
		free(RU(u)->position);
		RU(u)->position = r->stored_position ? strdup(r->stored_position) : NULL;
		RU(u)->position_known = true;
	}
	op = RelayNewOperation(u);
	rop = MemoryContextAllocZero(op->cxt, sizeof(ReverseOp));
	op->flow_private = rop;
	rop->r = r;
	rop->fetch.max_events = r->batch_size;
	rop->fetch.cxt = op->cxt;
	rop->fetch.position = RU(u)->position ? MemoryContextStrdup(op->cxt, RU(u)->position) : NULL;
	op->ready = &rop->fetch.ready;
	op->wake_at = &rop->fetch.wake_at;
	rop->in_source = true;
	r->source->start(r->source_state, &rop->fetch);
}

/* Moves a fetch on in its source; true when it is finished. */
static bool
reverse_progress(RelayOperation *op)
{
	ReverseOp  *rop = ROP(op);

	return rop->r->source->progress(rop->r->source_state, &rop->fetch);
}

/* A fetch finished: its events are to be recorded. */
static void
reverse_finish(RelayUnit *u)
{
	RelayOperation *op = u->op;

	ROP(op)->in_source = false;
	op->n = ROP(op)->fetch.nevents;
	op->to_record = true;
}

/* After commit: the stored position is the one the next fetch starts from. */
static void
position_stored(void *arg)
{
	StoredPosition *sp = arg;
	char	   *copy = strdup(sp->position);

	/* out of memory: the next reading reads it from the table */
	if (copy == NULL)
	{
		RU(sp->unit)->position_known = false;
		return;
	}
	free(RU(sp->unit)->position);
	RU(sp->unit)->position = copy;
	RU(sp->unit)->position_known = true;
}

/* Events of a fetch as tide.inbox_receive_batch's JSON array. */
static char *
events_json(const ReverseReading *r, const RelaySourceEvent *events, int n)
{
	StringInfoData buf;

	initStringInfo(&buf);
	appendStringInfoChar(&buf, '[');
	for (int i = 0; i < n; i++)
	{
		const RelaySourceEvent *e = &events[i];

		appendStringInfoString(&buf, i > 0 ? ", {\"event_id\": " : "{\"event_id\": ");
		escape_json(&buf, e->event_id);
		appendStringInfoString(&buf, ", \"source\": ");
		escape_json(&buf, r->name);
		appendStringInfoString(&buf, ", \"payload\": ");
		appendStringInfoString(&buf, e->payload ? e->payload : "null");
		if (e->headers != NULL)
		{
			appendStringInfoString(&buf, ", \"headers\": ");
			appendStringInfoString(&buf, e->headers);
		}
		appendStringInfoChar(&buf, '}');
	}
	appendStringInfoChar(&buf, ']');
	return buf.data;
}

/* Writes n events into the pipeline's inbox (in the transaction open). */
static void
store_events(const ReverseReading *r, const RelaySourceEvent *events, int n)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		values[2];

	values[0] = CStringGetTextDatum(r->inbox);
	values[1] = CStringGetTextDatum(events_json(r, events, n));
	if (SPI_execute_plan(TidePlan(&plan,
								  "SELECT tide.inbox_receive_batch($1, $2::pg_catalog.jsonb)",
								  2, types),
						 values, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not store the events of reverse pipeline \"%s\"", r->name);
}

/* Stores a fetch's position (in the short transaction open). */
static void
store_position(const ReverseReading *r, const RelaySourceFetch *f)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[4] = {TEXTOID, TEXTOID, INT8OID, TEXTOID};
	Datum		values[4];

	values[0] = CStringGetTextDatum(r->name);
	values[1] = CStringGetTextDatum(r->inbox);
	values[2] = Int64GetDatum(f->position_id);
	values[3] = CStringGetTextDatum(f->position_after);
	if (SPI_execute_plan(TidePlan(&plan,
								  "INSERT INTO tide.relay_consumer_offsets AS o"
								  "  (relay_group_id, pipeline_id, outbox_name, last_change_id, source_position, updated_at)"
								  " VALUES ('reverse', $1, $2, $3, $4::pg_catalog.jsonb, pg_catalog.now())"
								  " ON CONFLICT (relay_group_id, pipeline_id, outbox_name) DO UPDATE"
								  "   SET last_change_id = EXCLUDED.last_change_id,"
								  "       source_position = EXCLUDED.source_position, updated_at = EXCLUDED.updated_at",
								  4, types),
						 values, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not store the position of reverse pipeline \"%s\"", r->name);
}

/*
 * Whether an ERROR of writing into the inbox is the inbox's, not an
 * event's: the inbox was dropped (its name is unknown, its table gone) or
 * may not be written. It holds the pipeline until that is mended.
 */
static bool
error_is_inboxs(int sqlerrcode)
{
	return sqlerrcode == ERRCODE_UNDEFINED_OBJECT ||
		sqlerrcode == ERRCODE_UNDEFINED_TABLE ||
		sqlerrcode == ERRCODE_UNDEFINED_FUNCTION ||
		sqlerrcode == ERRCODE_INSUFFICIENT_PRIVILEGE;
}

/* Whether an ERROR of storing a fetch holds the pipeline rather than dead-letter an event. */
static bool
error_holds(int sqlerrcode)
{
	return RelayErrorIsEnvironmental(sqlerrcode) || error_is_inboxs(sqlerrcode);
}

/*
 * Dead-letters event e, which the inbox refused with `error`, into
 * relay_dlq (in the transaction open): the pipeline's name, the inbox's
 * name as its outbox_name, the event's number at the source as its
 * message_id, its event id (which tide.relay_dlq_retry stores it under),
 * its payload and headers, reason "permanent" and class "record"; and
 * counts it in the pipeline's health. An ERROR here is not caught: the
 * whole store is undone and the pipeline held.
 */
static void
dead_letter_event(const ReverseReading *r, const RelaySourceEvent *e, const ErrorData *error)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[7] = {TEXTOID, TEXTOID, INT8OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID};
	Datum		values[7];
	bool		nulls[7] = {false, false, false, false, e->headers == NULL, false, false};
	char		clean[1024];
	char	   *text = psprintf("record: %s", error->message ? error->message : "unknown error");

	RelayCleanText(clean, sizeof(clean), text, strlen(text));
	values[0] = CStringGetTextDatum(r->name);
	values[1] = CStringGetTextDatum(r->inbox);
	values[2] = Int64GetDatum(e->id);
	values[3] = CStringGetTextDatum(e->payload ? e->payload : "null");
	values[4] = e->headers ? CStringGetTextDatum(e->headers) : (Datum) 0;
	values[5] = CStringGetTextDatum(clean);
	values[6] = CStringGetTextDatum(e->event_id);
	if (SPI_execute_plan(TidePlan(&plan,
								  "WITH d AS ("
								  "  INSERT INTO tide.relay_dlq AS d"
								  "    (pipeline_id, outbox_name, message_id, payload, headers, created_at, attempts,"
								  "     reason, last_error_class, last_error, first_failed_at, event_id)"
								  "  VALUES ($1, $2, $3, $4::pg_catalog.jsonb, $5::pg_catalog.jsonb, pg_catalog.now(), 1,"
								  "          'permanent', '" REVERSE_CLASS_RECORD "', $6, pg_catalog.now(), $7)"
								  "  ON CONFLICT (pipeline_id, message_id) DO UPDATE"
								  "    SET outbox_name = EXCLUDED.outbox_name, event_id = EXCLUDED.event_id,"
								  "        payload = EXCLUDED.payload,"
								  "        headers = EXCLUDED.headers, attempts = d.attempts OPERATOR(pg_catalog.+) 1,"
								  "        reason = EXCLUDED.reason, last_error_class = EXCLUDED.last_error_class,"
								  "        last_error = EXCLUDED.last_error, dead_lettered_at = pg_catalog.now()"
								  "  RETURNING 1)"
								  " INSERT INTO tide.relay_pipeline_health AS h"
								  "   (pipeline_id, dead_lettered, last_failure_at, last_error_class, last_error)"
								  " SELECT $1, 1, pg_catalog.now(), '" REVERSE_CLASS_RECORD "', $6 FROM d"
								  " ON CONFLICT (pipeline_id) DO UPDATE"
								  "   SET dead_lettered = h.dead_lettered OPERATOR(pg_catalog.+) 1,"
								  "       last_failure_at = pg_catalog.now(), last_error_class = EXCLUDED.last_error_class,"
								  "       last_error = EXCLUDED.last_error, updated_at = pg_catalog.now()",
								  7, types),
						 values, nulls[4] ? "    n  " : NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not dead-letter an event of reverse pipeline \"%s\"", r->name);
	ereport(LOG,
			(errmsg("pg_tide relay reverse pipeline \"%s\" could not store event \"%s\" in inbox \"%s\": %s",
					r->name, e->event_id, r->inbox, error->message),
			 errdetail("The event is dead-lettered with error class \"%s\"; the pipeline goes on with the others.",
					   REVERSE_CLASS_RECORD),
			 errhint("tide.relay_dlq_list() shows it; tide.relay_dlq_retry() stores it once the inbox accepts it.")));
}

/*
 * Writes event e into the inbox in a subtransaction (in the short
 * transaction open): NULL when it was written, else the ERROR that undid
 * it (in cxt).
 */
static ErrorData *
try_store_event(const ReverseReading *r, const RelaySourceEvent *e, MemoryContext cxt)
{
	ResourceOwner resowner = CurrentResourceOwner;
	ErrorData  *volatile error = NULL;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		store_events(r, e, 1);
		ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		error = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	CurrentResourceOwner = resowner;
	return error;
}

/*
 * Writes the events of a fetch one by one (in the short transaction open):
 * an event the inbox refuses with an ERROR of its own is dead-lettered; an
 * ERROR that holds the pipeline is raised again.
 */
static void
store_each(const ReverseReading *r, const RelaySourceFetch *f)
{
	MemoryContext cxt = CurrentMemoryContext;

	for (int i = 0; i < f->nevents; i++)
	{
		ErrorData  *error = try_store_event(r, &f->events[i], cxt);

		if (error == NULL)
			continue;
		if (error_holds(error->sqlerrcode))
			ReThrowError(error);
		dead_letter_event(r, &f->events[i], error);
		FreeErrorData(error);
	}
}

/* Records in the short transaction open that a pipeline's source answers (its hold is over). */
static void
note_success(const ReverseReading *r)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[1] = {TEXTOID};
	Datum		values[1];

	values[0] = CStringGetTextDatum(r->name);
	if (SPI_execute_plan(TidePlan(&plan,
								  "INSERT INTO tide.relay_pipeline_health AS h (pipeline_id, last_success_at)"
								  " VALUES ($1, pg_catalog.now())"
								  " ON CONFLICT (pipeline_id) DO UPDATE"
								  "   SET last_success_at = pg_catalog.now(), consecutive_failures = 0,"
								  "       held_since = NULL, held_until = NULL, held_reason = NULL,"
								  "       updated_at = pg_catalog.now()",
								  1, types),
						 values, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not record the health of reverse pipeline \"%s\"", r->name);
}

/*
 * Stores a fetch's events (all at once, or one by one: `each`), its
 * position and the pipeline's success in one short transaction, the
 * position handed to the next fetch once it committed. NULL when it
 * committed, else the ERROR that undid it (in cxt).
 */
static ErrorData *
try_store(RelayUnit *u, const ReverseReading *r, const RelaySourceFetch *f, bool was_held,
		  bool each, MemoryContext cxt)
{
	ErrorData  *volatile edata = NULL;

	PG_TRY();
	{
		RelayBeginShortXact("pg_tide reverse pipeline store");
		if (f->position_after != NULL)
		{
			StoredPosition *sp;

			if (f->nevents > 0 && each)
				store_each(r, f);
			else if (f->nevents > 0)
				store_events(r, f->events, f->nevents);
			store_position(r, f);
			sp = MemoryContextAlloc(RelayAfterCommitContext(),
									offsetof(StoredPosition, position) + strlen(f->position_after) + 1);
			sp->unit = u;
			strcpy(sp->position, f->position_after);
			RelayAfterCommit(position_stored, sp);
		}
		if (f->nevents > 0 || was_held)
			note_success(r);
		RelayEndShortXact(RelayLoopContext());
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		/* in a group of records, only this record's subtransaction (xact.c) */
		RelayAbortShortXact();
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	return edata;
}

/*
 * Stores a fetch (try_store); when that fails with an ERROR an event may
 * have caused, stores it again event by event, dead-lettering each event
 * the inbox refuses, and the position moves past the whole fetch. An
 * ERROR that is not an event's (error_holds) is raised: the pipeline is
 * held and fetches the same events again later.
 */
static void
store_fetch(RelayUnit *u, const ReverseReading *r, const RelaySourceFetch *f, bool was_held)
{
	MemoryContext cxt = CurrentMemoryContext;
	ErrorData  *error = try_store(u, r, f, was_held, false, cxt);

	if (error == NULL)
		return;
	if (f->nevents == 0 || error_holds(error->sqlerrcode))
		ReThrowError(error);
	ereport(LOG,
			(errmsg("pg_tide relay reverse pipeline \"%s\" could not store a batch of %d events: %s",
					r->name, f->nevents, error->message),
			 errdetail("The events are stored one by one; one the inbox refuses is dead-lettered.")));
	FreeErrorData(error);
	error = try_store(u, r, f, was_held, true, cxt);
	if (error != NULL)
		ReThrowError(error);
}

/* Holds a pipeline whose fetch failed, and says so in the log and its health. */
static void
hold_pipeline(RelayUnit *u, const ReverseReading *r, const RelaySourceFetch *f)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[4] = {TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID};
	Datum		values[4];
	long		delay = REVERSE_HOLD_MIN_MS;
	int64		unlogged;
	RelayRepeatLine line;

	u->holds++;
	for (int i = 1; i < u->holds && delay < REVERSE_HOLD_MAX_MS; i++)
		delay *= 2;
	delay = Min(delay, REVERSE_HOLD_MAX_MS);
	u->held_until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), delay);
	RelayWakeAt(u->held_until);
	line = RelayRepeatNote(&u->held_log, &unlogged);
	if (line == RELAY_REPEAT_FIRST)
		ereport(LOG,
				(errmsg("pg_tide relay pipeline \"%s\" is held: its source failed: %s", r->name, f->error),
				 errdetail("Nothing was fetched (%s); attempt %d in a row.", f->error_class, u->holds),
				 errhint("The pipeline fetches again in %ld ms. Until the hold ends, this is logged at most once a minute.",
						 delay)));
	else if (line == RELAY_REPEAT_AGAIN)
		ereport(LOG,
				(errmsg("pg_tide relay pipeline \"%s\" is still held: its source failed: %s", r->name, f->error),
				 errdetail(INT64_FORMAT " more failed attempt%s since the last line; " INT64_FORMAT " since the hold began at %s.",
						   unlogged, unlogged == 1 ? "" : "s", u->held_log.times,
						   timestamptz_to_str(u->held_log.since)),
				 errhint("The pipeline fetches again in %ld ms.", delay)));
	values[0] = CStringGetTextDatum(r->name);
	values[1] = CStringGetTextDatum(f->error_class);
	values[2] = CStringGetTextDatum(f->error);
	values[3] = TimestampTzGetDatum(u->held_until);
	RelayBeginShortXact("pg_tide reverse pipeline hold");
	if (SPI_execute_plan(TidePlan(&plan,
								  "INSERT INTO tide.relay_pipeline_health AS h"
								  "  (pipeline_id, consecutive_failures, last_failure_at, last_error_class, last_error,"
								  "   held_since, held_until, held_reason)"
								  " VALUES ($1, 1, pg_catalog.now(), $2, $3, pg_catalog.now(), $4, 'its source failed')"
								  " ON CONFLICT (pipeline_id) DO UPDATE"
								  "   SET consecutive_failures = h.consecutive_failures OPERATOR(pg_catalog.+) 1,"
								  "       last_failure_at = pg_catalog.now(), last_error_class = $2, last_error = $3,"
								  "       held_since = coalesce(h.held_since, pg_catalog.now()),"
								  "       held_until = $4, held_reason = 'its source failed',"
								  "       updated_at = pg_catalog.now()",
								  4, types),
						 values, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not record the hold of reverse pipeline \"%s\"", r->name);
	RelayEndShortXact(RelayLoopContext());
}

/*
 * Records a finished fetch: its events and position in one short
 * transaction, the position handed to the next fetch once it committed;
 * a failed fetch holds the pipeline.
 */
static void
reverse_record(RelayUnit *u)
{
	RelayOperation *op = u->op;
	ReverseReading *r = ROP(op)->r;
	RelaySourceFetch *f = &ROP(op)->fetch;

	if (f->failed)
		hold_pipeline(u, r, f);
	else
	{
		bool		was_held = u->holds > 0;

		if (f->position_after != NULL || was_held)
			store_fetch(u, r, f, was_held);
		if (was_held)
		{
			u->holds = 0;
			RelayEndHold(u, "its source answers again");
		}
		/* the next fetch at once: it waits on the source for what comes */
		u->look = true;
		RelayWakeAt(GetCurrentTimestamp());
	}
	RelayUnitOk(u);
	RelayEndOperations(u, false);
}

/* Abandons a fetch still in its source. */
static void
reverse_cancel(RelayOperation *op)
{
	ReverseOp  *rop = ROP(op);

	if (rop != NULL && rop->in_source)
		rop->r->source->cancel(rop->r->source_state, &rop->fetch);
	if (rop != NULL)
		rop->in_source = false;
}

/* An abandoned fetch is made again from the stored position. */
static void
reverse_abandoned(RelayOperation *op)
{
	op->unit->look = true;
}

/* A changed config (another inbox, say): the position is read again. */
static void
reverse_config_changed(RelayUnit *u)
{
	RU(u)->position_known = false;
}

/* For relay_pipeline_status: its step or record ended in an ERROR. */
static void
reverse_note_error(RelayUnit *u, const char *message)
{
	RelayRecordTurnError(u->name, message, u->errors, u->held_until, &u->record_log);
}

/* For relay_pipeline_status: its steps end without an ERROR again. */
static void
reverse_note_ok(RelayUnit *u)
{
	RelayRecordTurnOk(u->name, &u->record_log);
}

/* Ends a reading of a pipeline: its source's state. */
static void
reverse_close(RelayUnitReading *reading)
{
	ReverseReading *r = reading->state;

	if (r->source->close)
		r->source->close(r->source_state);
}

const RelayFlowRoutine RelayReverseFlow = {
	.name = "reverse",
	.unit_noun = "pipeline",
	.error_retry_note = "What it had fetched and not stored is fetched again from its stored position.",
	.unit_size = sizeof(ReverseUnit),
	.units_table = "relay_inbox_config",
	.read = reverse_read,
	.config_changed = reverse_config_changed,
	.step = reverse_step,
	.progress = reverse_progress,
	.finish = reverse_finish,
	.record = reverse_record,
	.cancel = reverse_cancel,
	.abandoned = reverse_abandoned,
	.note_error = reverse_note_error,
	.note_ok = reverse_note_ok,
	.close = reverse_close,
};
