/*
 * worker.c
 *		A relay worker: one per database where pg_tide is installed.
 *
 * The loop, each pass:
 *
 * 1. Prepare to sleep on the database's wake-up condition variable before
 *	  looking, so a commit that happens while the pass runs is not missed.
 * 2. Handle signals: SIGHUP reloads the configuration, SIGTERM (die) ends
 *	  the worker at the next CHECK_FOR_INTERRUPTS.
 * 3. Leave cleanly when the relay is switched off, when a command needs the
 *	  database to itself (a pause, see launcher.c) or when pg_tide is no
 *	  longer installed (DROP EXTENSION).
 * 4. The pass itself: read the enabled pipelines in one short transaction,
 *	  then for each: lease a batch (short transaction, lease.c), deliver it
 *	  with no transaction open (sink.h), record it (short transaction), up to
 *	  RELAY_MAX_BATCHES_PER_PASS batches while batches come back full. An
 *	  ERROR in one pipeline is logged and the others go on. It holds no
 *	  lock and no transaction while it sleeps, so DROP EXTENSION never waits
 *	  for it. When a pipeline still has a backlog, the next pass starts at
 *	  once instead of sleeping.
 * 5. Sleep until a publishing commit broadcasts the condition variable or
 *	  pg_tide.relay_naptime_ms passes, and count the sleeps a commit ended
 *	  (wake.c counts the broadcasts, so other wake-ups are told apart).
 *	  Commits wake the worker only while the database has an enabled
 *	  pipeline; without one it just naps, so publishing costs it nothing.
 *
 * An ERROR in a pass is reported and ends the worker cleanly; the launcher
 * starts it again after a back-off, so nothing crash-loops.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/condition_variable.h"
#include "storage/ipc.h"
#include "tcop/tcopprot.h"
#include "storage/lmgr.h"
#include "utils/guc.h"
#include "nodes/pg_list.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "common/pg_prng.h"

#include "compat.h"
#include "pg_tide.h"
#include "relay.h"

/* Longest single sleep, so SIGHUP and pauses are noticed within it. */
#define RELAY_SLEEP_SLICE_MS 250

static RelayWorkerSlot *my_slot = NULL;
static RelayExitReason my_exit_reason = RELAY_EXIT_STOPPED;

/* Tells the launcher, through the slot, that this worker has ended and why. */
static void
worker_exit(int code, Datum arg)
{
	if (my_slot == NULL)
		return;
	SpinLockAcquire(&Relay->mutex);
	my_slot->exit_reason = my_exit_reason;
	my_slot->exited = true;
	my_slot->pid = 0;
	SpinLockRelease(&Relay->mutex);
}

/* Ends the worker cleanly, telling the launcher why. */
static void
worker_leave(RelayExitReason reason, const char *why)
{
	my_exit_reason = reason;
	ereport(DEBUG1, (errmsg("pg_tide relay worker for database %u stops: %s",
							MyDatabaseId, why)));
	proc_exit(0);
}

/*
 * The database's enabled pipelines that the relay can deliver, copied into
 * cxt; *any_enabled tells whether any pipeline is enabled at all. The
 * table's lock is taken conditionally, so a DROP EXTENSION in progress is
 * passed over, not waited for (and cannot wait for us).
 */
static List *
read_pipelines(MemoryContext cxt, bool *any_enabled)
{
	Oid			nsp = get_namespace_oid("tide", true);
	Oid			rel = OidIsValid(nsp) ? get_relname_relid("relay_outbox_config", nsp) : InvalidOid;
	List	   *pipelines = NIL;
	uint64		i;

	*any_enabled = false;
	if (!OidIsValid(rel) || !ConditionalLockRelationOid(rel, AccessShareLock))
		return NIL;
	if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(rel)))
		return NIL;
	SPI_connect();
	if (SPI_execute("SELECT 1 FROM tide.relay_outbox_config WHERE enabled LIMIT 1",
					true, 1) == SPI_OK_SELECT)
		*any_enabled = SPI_processed > 0;

	/*
	 * File and webhook pipelines deliver. The config was validated when it
	 * was set; a row written by hand that lacks a key is passed over.
	 */
	if (*any_enabled &&
		SPI_execute("SELECT name, config ->> 'consumer_group', config ->> 'outbox',"
					"       config ->> 'sink_type', config ->> 'path',"
					"       CASE WHEN jsonb_typeof(config -> 'batch_size') = 'number'"
					"            THEN least(greatest((config ->> 'batch_size')::numeric, 1), 1000)::int"
					"            ELSE 100 END,"
					"       config -> 'fsync' IS DISTINCT FROM 'false'::jsonb,"
					"       config ->> 'url', config ->> 'mode' = 'batch',"
					"       CASE WHEN jsonb_typeof(config -> 'max_in_flight') = 'number'"
					"            THEN least(greatest((config ->> 'max_in_flight')::numeric, 1), 1000)::int"
					"            ELSE 16 END,"
					"       CASE WHEN jsonb_typeof(config -> 'timeout_ms') = 'number'"
					"            THEN least(greatest((config ->> 'timeout_ms')::numeric, 100), 600000)::int"
					"            ELSE 10000 END,"
					"       (SELECT string_agg(key || ': ' || value, E'\\n' ORDER BY key)"
					"          FROM jsonb_each_text(CASE WHEN jsonb_typeof(config -> 'headers') = 'object'"
					"                                    THEN config -> 'headers' ELSE '{}' END)),"
					"       (SELECT string_agg(substr(e, 7), ' ')"
					"          FROM jsonb_array_elements_text(CASE jsonb_typeof(config -> 'signing_secret')"
					"                 WHEN 'array' THEN config -> 'signing_secret'"
					"                 WHEN 'string' THEN jsonb_build_array(config -> 'signing_secret')"
					"                 ELSE '[]' END) e),"
					"       config ->> 'signature' IS NOT DISTINCT FROM 'pg-tide',"
					"       config -> 'allow_http' IS NOT DISTINCT FROM 'true'::jsonb,"
					"       config -> 'allow_private_network' IS NOT DISTINCT FROM 'true'::jsonb,"
					"       CASE WHEN jsonb_typeof(config #> '{retry,base_ms}') = 'number'"
					"            THEN least(greatest((config #>> '{retry,base_ms}')::numeric, 10), 600000)::int"
					"            ELSE 500 END,"
					"       CASE WHEN jsonb_typeof(config #> '{retry,cap_ms}') = 'number'"
					"            THEN least(greatest((config #>> '{retry,cap_ms}')::numeric, 10), 86400000)::int"
					"            ELSE 60000 END,"
					"       CASE WHEN jsonb_typeof(config #> '{retry,max_attempts}') = 'number'"
					"            THEN least(greatest((config #>> '{retry,max_attempts}')::numeric, 1), 100)::int"
					"            ELSE 10 END,"
					"       md5(config::text)"
					"  FROM tide.relay_outbox_config"
					" WHERE enabled AND config ? 'consumer_group' AND config ? 'outbox'"
					"   AND ((config ->> 'sink_type' = 'file' AND config ? 'path')"
					"     OR (config ->> 'sink_type' = 'webhook' AND config ? 'url'))"
					" ORDER BY name",
					true, 0) == SPI_OK_SELECT)
	{
		for (i = 0; i < SPI_processed; i++)
		{
			HeapTuple	tup = SPI_tuptable->vals[i];
			TupleDesc	desc = SPI_tuptable->tupdesc;
			MemoryContext old = MemoryContextSwitchTo(cxt);
			RelayPipeline *p = palloc0(sizeof(RelayPipeline));
			bool		isnull;
			char	   *v;

			p->name = pstrdup(SPI_getvalue(tup, desc, 1));
			p->consumer_group = pstrdup(SPI_getvalue(tup, desc, 2));
			p->consumer = psprintf("relay:%s", p->name);
			p->sink.outbox = pstrdup(SPI_getvalue(tup, desc, 3));
			p->batch_size = DatumGetInt32(SPI_getbinval(tup, desc, 6, &isnull));
			p->retry_base_ms = DatumGetInt32(SPI_getbinval(tup, desc, 17, &isnull));
			p->retry_cap_ms = Max(p->retry_base_ms,
								  DatumGetInt32(SPI_getbinval(tup, desc, 18, &isnull)));
			p->retry_max_attempts = DatumGetInt32(SPI_getbinval(tup, desc, 19, &isnull));
			p->config_md5 = pstrdup(SPI_getvalue(tup, desc, 20));
			if (strcmp(SPI_getvalue(tup, desc, 4), "file") == 0)
			{
				p->sink.sink_type = "file";
				p->sink.u.file.path = pstrdup(SPI_getvalue(tup, desc, 5));
				p->sink.u.file.fsync = DatumGetBool(SPI_getbinval(tup, desc, 7, &isnull));
				/* a file that cannot be written is retried soon */
				p->retry_base_ms = p->retry_cap_ms = 0;
			}
			else
			{
				RelayWebhookSinkConfig *w = &p->sink.u.webhook;

				p->sink.sink_type = "webhook";
				w->url = pstrdup(SPI_getvalue(tup, desc, 8));
				w->batch_mode = DatumGetBool(SPI_getbinval(tup, desc, 9, &isnull)) && !isnull;
				w->max_in_flight = DatumGetInt32(SPI_getbinval(tup, desc, 10, &isnull));
				w->timeout_ms = DatumGetInt32(SPI_getbinval(tup, desc, 11, &isnull));
				v = SPI_getvalue(tup, desc, 12);
				w->headers = v ? pstrdup(v) : NULL;
				v = SPI_getvalue(tup, desc, 13);
				w->secrets = v ? pstrdup(v) : NULL;
				w->pg_tide_signature = DatumGetBool(SPI_getbinval(tup, desc, 14, &isnull));
				w->allow_http = DatumGetBool(SPI_getbinval(tup, desc, 15, &isnull));
				w->allow_private_network = DatumGetBool(SPI_getbinval(tup, desc, 16, &isnull));
			}
			pipelines = lappend(pipelines, p);
			MemoryContextSwitchTo(old);
		}
	}
	SPI_finish();
	return pipelines;
}

/*
 * A pipeline's retry state, kept in the worker's memory: when its next
 * attempt may start and how many attempts in a row have failed. Lost when
 * the worker restarts, which only means an early retry.
 */
typedef struct PipelineRetry
{
	char	   *name;
	char		config_md5[33]; /* the config the failures happened with */
	TimestampTz next_attempt_at;
	int			attempts;
} PipelineRetry;

#define RELAY_MAX_RETRY_STATES 256

static PipelineRetry retry_states[RELAY_MAX_RETRY_STATES];
static int	n_retry_states = 0;

/* The earliest next attempt of a pipeline waiting to retry, or 0. */
static TimestampTz earliest_retry = 0;

/* The retry state of a pipeline, created (in TopMemoryContext) when asked. */
static PipelineRetry *
pipeline_retry(const char *name, bool create)
{
	int			i;

	for (i = 0; i < n_retry_states; i++)
		if (strcmp(retry_states[i].name, name) == 0)
			return &retry_states[i];
	if (!create)
		return NULL;
	if (n_retry_states == RELAY_MAX_RETRY_STATES)
	{
		/* Forget the one with the earliest next attempt: it waits least. */
		int			oldest = 0;

		for (i = 1; i < n_retry_states; i++)
			if (retry_states[i].next_attempt_at < retry_states[oldest].next_attempt_at)
				oldest = i;
		pfree(retry_states[oldest].name);
		retry_states[oldest] = retry_states[--n_retry_states];
	}
	retry_states[n_retry_states].name = MemoryContextStrdup(TopMemoryContext, name);
	retry_states[n_retry_states].config_md5[0] = '\0';
	retry_states[n_retry_states].next_attempt_at = 0;
	retry_states[n_retry_states].attempts = 0;
	return &retry_states[n_retry_states++];
}

/*
 * How long a pipeline waits after its attempts-th failure in a row:
 * exponential from retry.base_ms, capped at retry.cap_ms, with jitter (the
 * upper half of the interval), or what Retry-After asked, within the cap;
 * at the cap once the failure is permanent or the attempts are used up.
 */
static long
retry_delay_ms(const RelayPipeline *p, int attempts, const RelayDeliveryResult *r, bool held)
{
	double		d = p->retry_base_ms;
	int			i;

	if (p->retry_cap_ms <= 0)
		return 0;
	if (held)
		return p->retry_cap_ms;
	if (r->retry_after_ms >= 0)
		return Max(Min(r->retry_after_ms, (long) p->retry_cap_ms), 1L);
	for (i = 1; i < attempts && d < p->retry_cap_ms; i++)
		d *= 2;
	d = Min(d, (double) p->retry_cap_ms);
	return Max((long) p->retry_base_ms,
			   (long) (d / 2 + pg_prng_double(&pg_global_prng_state) * d / 2));
}

/*
 * Deals with a delivery that was not acknowledged in full: records the
 * acknowledged prefix (and, after 410 Gone, disables the pipeline in the
 * same transaction), logs, and sets the pipeline's next attempt.
 */
static void
delivery_failed(const RelayPipeline *p, const RelayMessage *msgs, int n,
				const RelayDeliveryResult *result, MemoryContext cxt)
{
	PipelineRetry *st = pipeline_retry(p->name, true);
	int64		from = result->acked > 0 ? msgs[result->acked].id : msgs[0].id;
	bool		held;
	long		delay;

	if (result->acked > 0 || result->gone)
		RelayRecordDelivered(p, result->acked > 0 ? msgs[result->acked - 1].id : 0,
							 result->gone, cxt);
	if (result->gone)
	{
		ereport(LOG,
				(errmsg("pg_tide relay pipeline \"%s\" is disabled: the receiver answered 410 Gone for messages " INT64_FORMAT " to " INT64_FORMAT,
						p->name, from, msgs[n - 1].id),
				 errdetail("%s", result->error),
				 errhint("Enable it again with tide.relay_enable() once the receiver accepts deliveries.")));
		st->attempts = 0;
		st->next_attempt_at = 0;
		return;
	}
	strlcpy(st->config_md5, p->config_md5, sizeof(st->config_md5));
	st->attempts++;
	held = result->permanent || st->attempts >= p->retry_max_attempts;
	delay = retry_delay_ms(p, st->attempts, result, held);
	/* No delay (a file sink): the next pass, after the usual naptime, retries. */
	st->next_attempt_at = delay > 0 ?
		TimestampTzPlusMilliseconds(GetCurrentTimestamp(), delay) : 0;
	if (held)
		ereport(LOG,
				(errmsg("pg_tide relay pipeline \"%s\" is held at message " INT64_FORMAT ": %s failure (%s, status %ld) delivering messages " INT64_FORMAT " to " INT64_FORMAT ", attempt %d",
						p->name, from, result->permanent ? "permanent" : "repeated",
						result->error_class[0] ? result->error_class : "error",
						result->status, from, msgs[n - 1].id, st->attempts),
				 errdetail("%s", result->error),
				 errhint("Nothing is dropped: the pipeline retries every %d ms and does not advance until the receiver accepts; dead letters are not implemented yet.",
						 p->retry_cap_ms)));
	else
		ereport(LOG,
				(errmsg("pg_tide relay pipeline \"%s\" could not deliver messages " INT64_FORMAT " to " INT64_FORMAT " (%s, status %ld): %s",
						p->name, from, msgs[n - 1].id,
						result->error_class[0] ? result->error_class : "error",
						result->status, result->error),
				 delay > 0 ?
				 errdetail("Attempt %d of %d; the batch is delivered again in %ld ms.",
						   st->attempts, p->retry_max_attempts, delay) :
				 errdetail("The batch is delivered again on a later pass.")));
}

/*
 * Delivers a pipeline's batches, each leased, delivered with no transaction
 * open and recorded; at most RELAY_MAX_BATCHES_PER_PASS of them, so other
 * pipelines get their turn. Returns true when the last batch was full: the
 * pipeline has more to deliver at once. A pipeline whose next attempt lies
 * in the future is passed over; a failed delivery records its acknowledged
 * prefix, is logged and ends the pipeline's turn; its lease is returned to
 * it on a later pass.
 */
static bool
deliver_pipeline(const RelayPipeline *p, MemoryContext cxt)
{
	int			batch;
	PipelineRetry *st = pipeline_retry(p->name, false);

	/* A changed config (a fixed URL, say) is tried at once, from attempt 1. */
	if (st && strcmp(st->config_md5, p->config_md5) != 0)
	{
		st->attempts = 0;
		st->next_attempt_at = 0;
	}
	if (st && st->next_attempt_at > GetCurrentTimestamp())
	{
		if (earliest_retry == 0 || st->next_attempt_at < earliest_retry)
			earliest_retry = st->next_attempt_at;
		return false;
	}

	for (batch = 0; batch < RELAY_MAX_BATCHES_PER_PASS; batch++)
	{
		RelayMessage *msgs;
		RelayDeliveryResult result;
		int			n;

		CHECK_FOR_INTERRUPTS();
		n = RelayLeaseBatch(p, cxt, &msgs);
		if (n == 0)
			return false;

		pgstat_report_activity(STATE_RUNNING, "pg_tide relay: delivering a batch");
		RelaySinkDeliver(&p->sink, msgs, n, &result);
		pgstat_report_activity(STATE_IDLE, NULL);
		if (!result.ok)
		{
			delivery_failed(p, msgs, n, &result, cxt);
			st = pipeline_retry(p->name, false);
			if (st && st->next_attempt_at > 0 &&
				(earliest_retry == 0 || st->next_attempt_at < earliest_retry))
				earliest_retry = st->next_attempt_at;
			return false;
		}
		RelayRecordDelivered(p, msgs[n - 1].id, false, cxt);
		if (st)
		{
			st->attempts = 0;
			st->next_attempt_at = 0;
		}
		if (n < p->batch_size)
			return false;
	}
	return true;
}

/*
 * Runs every pipeline's turn; an ERROR in one (its outbox dropped, its
 * lease lost) is logged and the others go on. Returns true when a pipeline
 * has more to deliver at once.
 */
static bool
deliver_pipelines(List *pipelines, MemoryContext loop_cxt)
{
	ListCell   *lc;
	volatile bool more = false;

	earliest_retry = 0;
	foreach(lc, pipelines)
	{
		RelayPipeline *p = lfirst(lc);
		MemoryContext batch_cxt = AllocSetContextCreate(loop_cxt, "pg_tide relay batch",
														ALLOCSET_DEFAULT_SIZES);

		MemoryContextSwitchTo(batch_cxt);
		PG_TRY();
		{
			if (deliver_pipeline(p, batch_cxt))
				more = true;
		}
		PG_CATCH();
		{
			ErrorData  *edata;

			MemoryContextSwitchTo(loop_cxt);
			edata = CopyErrorData();
			FlushErrorState();
			AbortCurrentTransaction();
			ereport(LOG,
					(errmsg("pg_tide relay pipeline \"%s\" stopped this pass after an error: %s",
							p->name, edata->message),
					 errdetail("The pipeline is tried again on the next pass.")));
			FreeErrorData(edata);
		}
		PG_END_TRY();
		MemoryContextSwitchTo(loop_cxt);
		MemoryContextDelete(batch_cxt);
	}
	return more;
}

/*
 * One pass: reads the pipelines in a short transaction, then gives each its
 * turn (see deliver_pipelines). Returns false when pg_tide is no longer
 * installed in this database. Sets *has_work when an enabled pipeline
 * exists: only then do publishing commits wake the worker; and *more when a
 * pipeline has more to deliver at once, so the worker does not sleep.
 */
static bool
worker_pass(MemoryContext loop_cxt, bool *has_work, bool *more)
{
	bool		installed;
	List	   *pipelines = NIL;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "pg_tide relay: looking for work");

	installed = OidIsValid(get_extension_oid("pg_tide", true));
	*has_work = false;
	if (installed)
		pipelines = read_pipelines(loop_cxt, has_work);

	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	MemoryContextSwitchTo(loop_cxt);

	*more = deliver_pipelines(pipelines, loop_cxt);
	return installed;
}

/*
 * Sleeps until a publishing commit in this database wakes the worker or
 * the naptime has passed; true when a commit woke it. `seen` is the commit
 * count read before the pass looked: a commit since then ends the sleep at
 * once, any other wake-up (a signal, a barrier) sleeps on. Sleeps in
 * slices, so a reload (a new naptime, relay_enabled = off) or a pause is
 * noticed soon even during a long naptime; the worker stays on the
 * condition variable's wait list between slices, so no broadcast is missed.
 * Without `wake_on_commit` (no enabled pipeline: nothing to deliver) it
 * leaves the wait list and only naps, so commits cost it nothing.
 */
static bool
worker_sleep(ConditionVariable *cv, uint64 seen, bool wake_on_commit)
{
	TimestampTz start = GetCurrentTimestamp();

	if (!wake_on_commit)
		ConditionVariableCancelSleep();

	for (;;)
	{
		long		secs;
		int			usecs;
		long		elapsed_ms;
		long		remaining;

		TimestampDifference(start, GetCurrentTimestamp(), &secs, &usecs);
		elapsed_ms = secs * 1000 + usecs / 1000;
		remaining = RelayNaptimeMs - elapsed_ms;
		if (earliest_retry != 0)
		{
			long		until_retry;

			TimestampDifference(GetCurrentTimestamp(), earliest_retry, &secs, &usecs);
			until_retry = secs * 1000 + (usecs + 999) / 1000;
			remaining = Min(remaining, until_retry);
		}
		if (remaining <= 0)
			return false;
		if (!wake_on_commit)
		{
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 Min(remaining, RELAY_SLEEP_SLICE_MS), PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
			CHECK_FOR_INTERRUPTS();
		}
		else
		{
			if (WakeCommitCount(MyDatabaseId) != seen)
				return true;
			(void) ConditionVariableTimedSleep(cv, Min(remaining, RELAY_SLEEP_SLICE_MS),
											   PG_WAIT_EXTENSION);
			if (WakeCommitCount(MyDatabaseId) != seen)
				return true;
		}
		if (ConfigReloadPending || !RelayEnabled ||
			RelayDatabasePaused(MyDatabaseId, GetCurrentTimestamp()))
			return false;
	}
}

/* Entry point of a relay worker; main_arg is its slot number. */
void
RelayWorkerMain(Datum main_arg)
{
	int			slotno = DatumGetInt32(main_arg);
	uint32		generation;
	Oid			dboid = InvalidOid;
	bool		mine = false;
	MemoryContext loop_cxt;
	ConditionVariable *cv;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	memcpy(&generation, MyBgworkerEntry->bgw_extra, sizeof(generation));
	if (Relay == NULL || slotno < 0 || slotno >= Relay->nslots)
		proc_exit(0);

	/* The slot must still be the one the launcher claimed for this worker. */
	SpinLockAcquire(&Relay->mutex);
	if (Relay->slots[slotno].in_use && !Relay->slots[slotno].exited &&
		Relay->slots[slotno].generation == generation)
	{
		my_slot = &Relay->slots[slotno];
		my_slot->pid = MyProcPid;
		dboid = my_slot->dboid;
		mine = true;
	}
	SpinLockRelease(&Relay->mutex);
	if (!mine)
		proc_exit(0);
	on_shmem_exit(worker_exit, (Datum) 0);

	/* A command that wants the database alone may have asked already. */
	if (RelayDatabasePaused(dboid, GetCurrentTimestamp()))
		proc_exit(0);

	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);

	SpinLockAcquire(&Relay->mutex);
	my_slot->started_at = GetCurrentTimestamp();
	SpinLockRelease(&Relay->mutex);

	loop_cxt = AllocSetContextCreate(TopMemoryContext, "pg_tide relay worker loop",
									 ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(loop_cxt);
	cv = WakeConditionVariable(MyDatabaseId);

	for (;;)
	{
		bool		installed = false;
		bool		has_work = false;
		bool		failed = false;
		bool		more = false;
		uint64		seen;

		/* Before looking, so a commit during the pass still wakes the sleep. */
		ConditionVariablePrepareToSleep(cv);
		seen = WakeCommitCount(MyDatabaseId);

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		if (!RelayEnabled)
			worker_leave(RELAY_EXIT_STOPPED, "pg_tide.relay_enabled is off");
		if (RelayDatabasePaused(MyDatabaseId, GetCurrentTimestamp()))
			worker_leave(RELAY_EXIT_STOPPED, "a command needs the database to itself");

		PG_TRY();
		{
			installed = worker_pass(loop_cxt, &has_work, &more);
		}
		PG_CATCH();
		{
			MemoryContextSwitchTo(loop_cxt);
			EmitErrorReport();
			FlushErrorState();
			AbortCurrentTransaction();
			failed = true;
		}
		PG_END_TRY();

		if (failed)
		{
			ereport(LOG,
					(errmsg("pg_tide relay worker for database %u stops after an error", MyDatabaseId),
					 errdetail("The launcher starts it again in %d seconds.", RELAY_ERROR_BACKOFF_MS / 1000)));
			worker_leave(RELAY_EXIT_ERROR, "error");
		}
		if (!installed)
			worker_leave(RELAY_EXIT_NO_EXTENSION, "pg_tide is not installed");

		pg_atomic_fetch_add_u64(&my_slot->passes, 1);
		pgstat_report_activity(STATE_IDLE, NULL);
		MemoryContextReset(loop_cxt);

		/* A pipeline with a backlog goes on at once, after the checks above. */
		if (!more && worker_sleep(cv, seen, has_work))
			pg_atomic_fetch_add_u64(&my_slot->wakeups, 1);
	}
}
