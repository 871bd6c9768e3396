/*
 * inbox_handler.c
 *		One batch of an inbox's handler, in the caller's transaction: the
 *		step the relay runs for an inbox that processes itself, with the
 *		semantics of tide.inbox_process.
 *
 * 1. Read the handler's row, and ask tide._inbox_handler_problem whether
 *	  it may run: the role that set it may still make it run as run_as, and
 *	  run_as still has the rights to process the inbox. If not, the handler
 *	  is held (not an event's fault: no event is claimed or counted).
 * 2. Take one of the inbox's `concurrency` slots: a transaction-level
 *	  advisory lock (INBOX_HANDLER_SLOT_KEY + slot, the name's hash), tried
 *	  without waiting. When every slot is taken, `concurrency` batches of
 *	  the inbox run already (in the database's other relay workers): this
 *	  one claims nothing. With one slot, batches run one after another,
 *	  each committed before the next claims, so the events are handled in
 *	  id order.
 *	  Claim the oldest pending events (not processed, not dead-lettered, no
 *	  live claim) with FOR UPDATE SKIP LOCKED: concurrent batches, and
 *	  clients calling inbox_process, get disjoint events.
 * 3. Run the handler on each, in a subtransaction of its own, as run_as:
 *	  the user id changed for the call alone (SECURITY_LOCAL_USERID_CHANGE,
 *	  so the handler cannot SET ROLE back to the worker's superuser, and
 *	  SECURITY_RESTRICTED_OPERATION, so that it leaves nothing in the
 *	  session: no temporary object, no held cursor), search_path pinned to
 *	  pg_catalog, pg_temp unless the function sets its own, every
 *	  setting the handler changes undone after it, and no more right to a
 *	  relay pipeline's consumer group than any session has
 *	  (TideInRelayWorker off). An error undoes that event's writes alone
 *	  and is recorded after it.
 * 4. Mark the processed events processed and the failed ones failed
 *	  (retry_count, last_error; dead-lettered at the inbox's max_retries)
 *	  in the same transaction as the handler's writes, and record the
 *	  batch in relay_inbox_handler_health with an operator event
 *	  "inbox.dead_lettered" per dead letter.
 *
 * A cancel of the worker (QUERY_CANCELED) is not an event's failure: it
 * aborts the whole batch, which is claimed again later.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/resowner.h"

#include "inbox_handler.h"
#include "pg_tide.h"

PG_FUNCTION_INFO_V1(tide_inbox_handle);

/* The handler's row, as step 1 reads it. */
typedef struct HandlerRow
{
	Oid			run_as;
	int			batch_size;
	int			concurrency;
	int			max_retries;
	char	   *table;			/* quoted, schema-qualified */
	char	   *function;		/* quoted, schema-qualified; NULL: dropped */
	char	   *problem;		/* why it cannot run, or NULL */
	bool		was_held;
} HandlerRow;

/*
 * An inbox's statements, prepared once and kept while its table and
 * handler function keep their names (a plan of a table dropped and made
 * again is planned again by the plan cache).
 */
typedef struct HandlerPlans
{
	char		inbox[NAMEDATALEN]; /* the hash key */
	char	   *table;			/* in TopMemoryContext */
	char	   *function;
	SPIPlanPtr	claim;
	SPIPlanPtr	call;
	SPIPlanPtr	done;
	SPIPlanPtr	fail;
} HandlerPlans;

static HTAB *plans = NULL;

/* Step 1: reads the inbox's enabled handler; false when it has none. */
static bool
read_handler(const char *inbox, HandlerRow *row)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1];
	InboxHandlerProblem p;

	args[0] = CStringGetTextDatum(inbox);
	if (SPI_execute_plan(TidePlan(&plan,
								  "SELECT r.oid, (h.config OPERATOR(pg_catalog.->>) 'batch_size')::int,"
								  "       (h.config OPERATOR(pg_catalog.->>) 'concurrency')::int, c.max_retries,"
								  "       tide._inbox_table(c), pg_catalog.to_regclass(tide._inbox_table(c))::oid,"
								  "       CASE WHEN p.oid IS NOT NULL THEN pg_catalog.format('%I.%I', n.nspname, p.proname) END,"
								  "       h.handler::oid, h.run_as,"
								  "       (h.config OPERATOR(pg_catalog.->>) 'allow_superuser')::boolean, h.owner,"
								  "       s.held_since IS NOT NULL"
								  "  FROM tide.relay_inbox_handlers h"
								  "  JOIN tide.tide_inbox_config c ON c.inbox_name OPERATOR(pg_catalog.=) h.inbox_name"
								  "  LEFT JOIN pg_catalog.pg_roles r ON r.rolname OPERATOR(pg_catalog.=) h.run_as"
								  "  LEFT JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) h.handler"
								  "  LEFT JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace"
								  "  LEFT JOIN tide.relay_inbox_handler_health s ON s.inbox_name OPERATOR(pg_catalog.=) h.inbox_name"
								  " WHERE h.inbox_name OPERATOR(pg_catalog.=) $1 AND h.enabled",
								  1, argtypes),
						 args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the handler of inbox \"%s\"", inbox);
	if (SPI_processed == 0)
		return false;
	row->run_as = DatumGetObjectId(TideSpiDatum(1));
	row->batch_size = DatumGetInt32(TideSpiDatum(2));
	row->concurrency = DatumGetInt32(TideSpiDatum(3));
	row->max_retries = DatumGetInt32(TideSpiDatum(4));
	row->table = TideSpiText(5);
	row->function = TideSpiText(7);
	row->was_held = TideSpiBool(12);
	row->problem = InboxHandlerCheck(inbox, DatumGetObjectId(TideSpiDatum(6)), DatumGetObjectId(TideSpiDatum(8)),
									 TideSpiText(9), TideSpiBool(10), TideSpiText(11), &p);
	return true;
}

/* A plan kept for as long as the worker runs. */
static SPIPlanPtr
keep_plan(const char *sql, int nargs, Oid *argtypes)
{
	SPIPlanPtr	plan = SPI_prepare(sql, nargs, argtypes);

	if (plan == NULL)
		elog(ERROR, "could not prepare \"%s\": %s", sql, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "could not keep the plan of \"%s\"", sql);
	return plan;
}

/* The inbox's statements (see HandlerPlans), prepared when missing. */
static HandlerPlans *
inbox_plans(const char *inbox, const HandlerRow *row)
{
	HandlerPlans *hp;
	bool		found;
	char		key[NAMEDATALEN];
	Oid			int4_type[1] = {INT4OID};
	Oid			int8_type[1] = {INT8OID};
	Oid			done_types[1] = {INT8ARRAYOID};
	Oid			fail_types[3] = {INT8ARRAYOID, TEXTARRAYOID, INT4OID};

	if (plans == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = NAMEDATALEN;
		ctl.entrysize = sizeof(HandlerPlans);
		plans = hash_create("pg_tide inbox handler plans", 16, &ctl, HASH_ELEM | HASH_STRINGS);
	}
	memset(key, 0, sizeof(key));
	strlcpy(key, inbox, NAMEDATALEN);
	hp = hash_search(plans, key, HASH_ENTER, &found);
	if (found && strcmp(hp->table, row->table) == 0 && strcmp(hp->function, row->function) == 0)
		return hp;
	if (found)
	{
		SPIPlanPtr	old[4] = {hp->claim, hp->call, hp->done, hp->fail};

		for (int i = 0; i < 4; i++)
			if (old[i] != NULL)
				SPI_freeplan(old[i]);
		pfree(hp->table);
		pfree(hp->function);
	}
	hp->claim = hp->call = hp->done = hp->fail = NULL;
	hp->table = MemoryContextStrdup(TopMemoryContext, row->table);
	hp->function = MemoryContextStrdup(TopMemoryContext, row->function);
	hp->claim = keep_plan(psprintf("SELECT t.id FROM %s t"
								   " WHERE t.processed_at IS NULL AND t.dead_lettered_at IS NULL"
								   "   AND (t.claimed_until IS NULL OR t.claimed_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp())"
								   " ORDER BY t.id LIMIT $1 FOR UPDATE SKIP LOCKED", row->table),
						  1, int4_type);
	hp->call = keep_plan(psprintf("SELECT %s(t) FROM %s t WHERE t.id OPERATOR(pg_catalog.=) $1", row->function, row->table),
						 1, int8_type);
	hp->done = keep_plan(psprintf("UPDATE %s SET processed_at = pg_catalog.clock_timestamp(), claimed_until = NULL,"
								  " dead_lettered_at = NULL WHERE id OPERATOR(pg_catalog.=) ANY ($1)", row->table),
						 1, done_types);
	hp->fail = keep_plan(psprintf("UPDATE %s t SET retry_count = t.retry_count OPERATOR(pg_catalog.+) 1, last_error = f.error,"
								  " claimed_until = NULL,"
								  " dead_lettered_at = CASE WHEN t.retry_count OPERATOR(pg_catalog.+) 1 OPERATOR(pg_catalog.>=) $3"
								  "                         THEN pg_catalog.clock_timestamp() END"
								  "  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS f(id, error) WHERE t.id OPERATOR(pg_catalog.=) f.id"
								  " RETURNING t.event_id, t.dead_lettered_at IS NOT NULL, t.last_error",
								  row->table),
						 3, fail_types);
	return hp;
}

/*
 * Step 2's slot: takes one of the inbox's `concurrency` slots for the rest
 * of the transaction, without waiting; false when every one is taken. The
 * hash is hashtext's of the name, so that SQL can find the locks.
 */
static bool
take_slot(const char *inbox, int concurrency)
{
	uint32		hash = hash_bytes((const unsigned char *) inbox, strlen(inbox));

	for (int slot = 0; slot < concurrency; slot++)
	{
		LOCKTAG		tag;

		SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, INBOX_HANDLER_SLOT_KEY + slot, hash, 2);
		if (LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL)
			return true;
	}
	return false;
}

/* Records the relay's hold of a handler, or its end (reason NULL). */
static void
record_hold(const char *inbox, const char *reason)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[2] = {TEXTOID, TEXTOID};
	Datum		args[2];
	char		nulls[2] = {' ', reason == NULL ? 'n' : ' '};

	args[0] = CStringGetTextDatum(inbox);
	args[1] = reason == NULL ? (Datum) 0 : CStringGetTextDatum(reason);
	if (SPI_execute_plan(TidePlan(&plan, "SELECT tide._inbox_handler_hold($1, $2)", 2, argtypes),
						 args, nulls, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not record the hold of the handler of inbox \"%s\"", inbox);
}

/*
 * Step 3 for one event: runs the handler on it as run_as in a
 * subtransaction; returns NULL, or the error it raised as "SQLSTATE:
 * message". A cancel is raised again.
 */
static char *
run_one(SPIPlanPtr call, Datum id, Oid run_as)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	Oid			save_user;
	int			save_sec;
	char	   *volatile error = NULL;
	bool		in_worker = TideInRelayWorker;

	GetUserIdAndSecContext(&save_user, &save_sec);
	/* the handler is an ordinary session's code: no pipeline's group for it */
	TideInRelayWorker = false;
	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		int			nest;

		SetUserIdAndSecContext(run_as, save_sec | SECURITY_LOCAL_USERID_CHANGE |
							   SECURITY_RESTRICTED_OPERATION);
		nest = NewGUCNestLevel();
		(void) set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
		if (SPI_execute_plan(call, &id, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not run the handler");
		/* whatever the handler set, SET or SET LOCAL, ends with its call */
		AtEOXact_GUC(false, nest);
		SetUserIdAndSecContext(save_user, save_sec);
		TideInRelayWorker = in_worker;
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		/* also gives back the user id and the settings of before */
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
		SetUserIdAndSecContext(save_user, save_sec);
		TideInRelayWorker = in_worker;
		if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED)
			ReThrowError(edata);
		error = psprintf("%s: %s", unpack_sql_state(edata->sqlerrcode), edata->message);
		FreeErrorData(edata);
	}
	PG_END_TRY();
	return error;
}

/* An int8[] of n ids. */
static Datum
id_array(Datum *ids, int n)
{
	return PointerGetDatum(construct_array(ids, n, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

/* A text[] of n C strings. */
static Datum
text_array(char **texts, int n)
{
	Datum	   *d = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
		d[i] = CStringGetTextDatum(texts[i]);
	return PointerGetDatum(construct_array(d, n, TEXTOID, -1, false, TYPALIGN_INT));
}

/*
 * Step 4: marks the events, counts the batch and publishes the operator
 * events of its dead letters.
 */
static void
record_batch(const char *inbox, const HandlerRow *row, HandlerPlans *hp, Datum *done, int ndone,
			 Datum *failed, char **errors, int nfailed, InboxHandlerOutcome *out)
{
	static SPIPlanPtr after_plan = NULL;
	Oid			after_types[6] = {TEXTOID, INT4OID, INT4OID, TEXTOID, TEXTARRAYOID, TEXTARRAYOID};
	Datum		after_args[6];
	char		after_nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	char	  **dead = palloc(sizeof(char *) * Max(nfailed, 1));
	char	  **dead_errors = palloc(sizeof(char *) * Max(nfailed, 1));
	int			ndead = 0;

	if (ndone > 0)
	{
		Datum		args[1] = {id_array(done, ndone)};

		if (SPI_execute_plan(hp->done, args, NULL, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "could not mark the events of inbox \"%s\" processed", inbox);
	}
	if (nfailed > 0)
	{
		Datum		args[3] = {id_array(failed, nfailed), text_array(errors, nfailed),
		Int32GetDatum(row->max_retries)};

		if (SPI_execute_plan(hp->fail, args, NULL, false, 0) != SPI_OK_UPDATE_RETURNING)
			elog(ERROR, "could not count the failed events of inbox \"%s\"", inbox);
		for (uint64 i = 0; i < SPI_processed; i++)
		{
			bool		isnull;

			if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &isnull)))
			{
				dead[ndead] = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
				dead_errors[ndead] = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 3);
				ndead++;
			}
		}
	}
	out->dead_lettered = ndead;

	after_args[0] = CStringGetTextDatum(inbox);
	after_args[1] = Int32GetDatum(ndone);
	after_args[2] = Int32GetDatum(nfailed);
	if (nfailed > 0)
		after_args[3] = CStringGetTextDatum(errors[nfailed - 1]);
	else
		after_nulls[3] = 'n';
	after_args[4] = text_array(dead, ndead);
	after_args[5] = text_array(dead_errors, ndead);
	if (SPI_execute_plan(TidePlan(&after_plan, "SELECT tide._inbox_handler_after_batch($1, $2, $3, $4, $5, $6)",
								  6, after_types),
						 after_args, after_nulls, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not record a batch of the handler of inbox \"%s\"", inbox);
}

/*
 * Runs one batch of an inbox's handler in the current transaction, under
 * SPI (see the top of this file); fills *out.
 */
void
InboxHandlerRunBatch(const char *inbox, InboxHandlerOutcome *out)
{
	HandlerRow	row;
	HandlerPlans *hp;
	Datum		claim_args[1];
	Datum	   *ids;
	Datum	   *done;
	Datum	   *failed;
	char	  **errors;
	int			n;
	int			ndone = 0;
	int			nfailed = 0;

	memset(out, 0, sizeof(*out));
	if (!read_handler(inbox, &row))
		return;
	out->found = true;
	out->batch_size = row.batch_size;
	if (row.problem != NULL)
	{
		out->held = row.problem;
		record_hold(inbox, row.problem);
		return;
	}

	/* Step 2 */
	if (!take_slot(inbox, row.concurrency))
	{
		out->busy = true;
		return;
	}
	/* it runs again: undone with the batch, should the batch fail */
	if (row.was_held)
		record_hold(inbox, NULL);
	hp = inbox_plans(inbox, &row);
	claim_args[0] = Int32GetDatum(row.batch_size);
	if (SPI_execute_plan(hp->claim, claim_args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not claim the events of inbox \"%s\"", inbox);
	n = (int) SPI_processed;
	out->claimed = n;
	if (n == 0)
		return;
	ids = palloc(sizeof(Datum) * n);
	for (int i = 0; i < n; i++)
	{
		bool		isnull;

		ids[i] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull);
	}

	/* Step 3 */
	done = palloc(sizeof(Datum) * n);
	failed = palloc(sizeof(Datum) * n);
	errors = palloc(sizeof(char *) * n);
	for (int i = 0; i < n; i++)
	{
		char	   *error = run_one(hp->call, ids[i], row.run_as);

		if (error == NULL)
			done[ndone++] = ids[i];
		else
		{
			errors[nfailed] = error;
			failed[nfailed++] = ids[i];
		}
	}
	out->processed = ndone;
	out->failed = nfailed;

	/* Step 4 */
	record_batch(inbox, &row, hp, done, ndone, failed, errors, nfailed, out);
}

/*
 * tide._inbox_handle(inbox): one batch of the inbox's handler now, in the
 * caller's transaction, as the relay runs it; returns how many events were
 * processed, NULL when the inbox has no enabled handler. A held handler is
 * reported with a WARNING; a batch that finds every slot of the inbox
 * taken (step 2) processes nothing and returns 0. Superuser only: it runs code as other roles.
 */
Datum
tide_inbox_handle(PG_FUNCTION_ARGS)
{
	char	   *inbox = text_to_cstring(PG_GETARG_TEXT_PP(0));
	InboxHandlerOutcome out;

	if (!superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to run the handler of inbox \"%s\"", inbox),
				 errhint("The relay runs handlers; call tide.inbox_process() to process an inbox yourself.")));
	SPI_connect();
	InboxHandlerRunBatch(inbox, &out);
	SPI_finish();
	if (!out.found)
		PG_RETURN_NULL();
	if (out.held != NULL)
		ereport(WARNING,
				(errmsg("handler of inbox \"%s\" is held: %s", inbox, out.held)));
	PG_RETURN_INT64(out.processed);
}
