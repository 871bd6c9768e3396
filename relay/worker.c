/*
 * worker.c
 *		A relay worker: one per database where pg_tide has an enabled
 *		pipeline (on_demand.c). It drives the deliveries of all its pipelines
 *		at the same time.
 *
 * Each pipeline has at most one batch in its sink, an operation (Operation
 * below): leased in a short transaction (lease.c), then delivered by the
 * pipeline's sink with no transaction open (sink.h), then recorded in a
 * short transaction. Between lease and record the loop waits on every
 * batch at once, so a destination that never answers holds only its own
 * pipeline's batch, for its own timeout_ms.
 *
 * A pipeline with ordering relaxed and "overlap_batches" that works
 * through a backlog of live messages overlaps its batches, so that its
 * destination never waits for the worker's transactions (lease_ahead).
 * "overlap_batches" is the default of the sinks whose library sends on
 * threads of its own (Kafka, NATS: RelaySinkRoutine.sends_on_own_threads);
 * the others send from the worker's loop, which a lease or a record holds
 * up anyway, and leasing ahead only added work there:
 *
 *	  lease k+1 while k is in flight -> k finishes: its outcomes are taken
 *	  out of the sink -> k+1 starts in the sink -> k is recorded while
 *	  k+1 is in flight -> lease k+2 -> ...
 *
 * The sink still sees one batch at a time, and batches are recorded in
 * the order they were leased: k+1 is recorded only once it finished, after
 * k. k+1 starts only when k's outcomes settle each of its messages
 * (delivered, or failed by the destination's answer and so queued or
 * dead-lettered); when anything would hold the pipeline instead (its
 * destination failed, a message was not sent, a 410, the breaker opened,
 * the rate limit) or a message got no answer (a timeout: the destination
 * may be stalled), k is
 * recorded as it would be without the overlap and k+1 is given back: its
 * messages stay in the pipeline's lease, and the pipeline's next lease
 * hands them out again, after what k left unrecorded. So the offsets still
 * pass only messages recorded in the same commit, in order.
 *
 * The loop, each turn (loop_once):
 *
 * 1. A commit count that moved since the last turn (wake.c tells a
 *	  commit's wake-up from others) makes every pipeline look for messages.
 *	  The worker joins the database's wake-up condition variable's wait
 *	  list right before it waits (step 7) and reads the count after joining,
 *	  so no commit is missed (a broadcast sets the latch of a process on the
 *	  list). Commits wake the worker only while the
 *	  database has an enabled pipeline; without one it just naps, so
 *	  publishing costs it nothing (a pipeline change still sets its latch).
 * 2. Handle signals: SIGHUP reloads the configuration, SIGTERM (die) ends
 *	  the worker at the next CHECK_FOR_INTERRUPTS, SIGINT (pg_cancel_backend)
 *	  abandons the batches in flight: nothing of them is recorded, and they
 *	  are leased and delivered again at once (the pipeline's consumer still
 *	  holds their lease); the worker goes on.
 * 3. Leave cleanly when the relay is switched off, when a command needs the
 *	  database to itself (a pause, see launcher.c) or when pg_tide is no
 *	  longer installed (DROP EXTENSION); the batches in flight are abandoned
 *	  first (the lease makes the next worker deliver them again). A reading
 *	  that finds no enabled pipeline, with nothing in flight, also ends the
 *	  worker once its periodic jobs are done (on_demand.c).
 * 4. Read the enabled pipelines in one short transaction (pipelines.c, each
 *	  with its sink opened) when SQL changed pipelines or queues, after a
 *	  reload, and every pg_tide.relay_naptime_ms; a pipeline with a batch in
 *	  flight takes its new reading once the batch is done. A pipeline whose
 *	  config md5 is unchanged keeps the reading it has (reading_is_current),
 *	  except after a reload and when its sink read secrets.
 * 5. Look at the pipelines without a batch in flight (scan_pipelines) when
 *	  something may be due: each that is not held nor paced takes its step,
 *	  the messages due for another attempt first, else a live batch when it
 *	  is to look for one (after a commit, a reading, a full batch, the end
 *	  of a hold's time), and the batch is started in its sink. The
 *	  pipelines that would only look for live messages look together first,
 *	  in one statement (skip_idle_pipelines, idle_look.c); those that found
 *	  nothing take no step.
 * 6. Move on every batch whose sink has something to do (progress) and
 *	  record each that finished (settle_batch); a full batch looks for more
 *	  at once.
 * 7. Wait, in one WaitEventSet, on the latch, the postmaster's death and
 *	  one epoll descriptor holding every sink's sockets (events.c), until
 *	  the earliest of the sinks' timers, the batches' deadlines, the holds,
 *	  the retries' due times, the pacing's wake-ups and the next reading.
 *
 * An ERROR in one pipeline's step or record is logged, its batch in flight
 * is cancelled (the sink releases what points into the batch's memory
 * before that memory is freed), the pipeline is held (1 s, doubling up to a
 * minute while the errors go on) and the others go on. Any other ERROR
 * abandons every batch in flight the same way, is reported and ends the
 * worker cleanly; the launcher starts it again after a back-off, so
 * nothing crash-loops. The worker holds no lock and no transaction while
 * it waits, so DROP EXTENSION never waits for it.
 *
 * Steps 4 to 6 run SQL only under the extension's lock, which every turn
 * that runs SQL takes first, without waiting, and gives back before step
 * 7: DROP EXTENSION takes it first too, so the two never lock the
 * extension's tables in opposite orders (extension_lock.c). While a DROP
 * holds it or waits for it, the turn runs no SQL (a finished batch is
 * recorded in a later turn) and the loop looks again after
 * RELAY_EXTENSION_BUSY_WAIT_MS; once pg_tide is gone the worker leaves.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "commands/dbcommands.h"
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
#include "utils/hsearch.h"
#include "nodes/pg_list.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "common/hashfn.h"
#include "common/pg_prng.h"
#include "lib/ilist.h"

#include "compat.h"
#include "pg_tide.h"
#include "events.h"
#include "relay.h"

/*
 * How long a pipeline whose step ended with an ERROR is passed over: from
 * the first, doubling with each such step in a row, up to the last.
 */
#define RELAY_ERROR_HOLD_MIN_MS 1000
#define RELAY_ERROR_HOLD_MAX_MS 60000

/* How long the loop waits when a DROP EXTENSION kept its turn from the database. */
#define RELAY_EXTENSION_BUSY_WAIT_MS 50

static RelayWorkerSlot *my_slot = NULL;
static RelayExitReason my_exit_reason = RELAY_EXIT_STOPPED;
/* Why worker_should_stop last said the worker must stop. */
static const char *stop_reason = "asked to stop";

/* A reload happened: read the pipelines again (and take a new naptime). */
static bool reading_needed = true;
/* The next reading opens every pipeline again, changed or not (after a reload). */
static bool reopen_readings = false;

/* Tells the launcher, through the slot, that this worker has ended and why. */
static void
worker_exit(int code, Datum arg)
{
	if (my_slot == NULL)
		return;
	/* PostgreSQL keeps a session-level lock past the process's end */
	(void) RelayUnlockExtension();
	SpinLockAcquire(&Relay->mutex);
	my_slot->exit_reason = my_exit_reason;
	my_slot->exited = true;
	my_slot->pid = 0;
	my_slot->latch = NULL;
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
 * Whether this worker must stop now: the relay is switched off (a pending
 * reload is taken first) or a command needs the database to itself (a
 * pause, see launcher.c). The loop then abandons its batches in flight and
 * leaves; the reason is kept for worker_leave. Runs no SQL; outside a relay
 * worker it always says no.
 */
static bool
worker_should_stop(void)
{
	if (my_slot == NULL)
		return false;
	if (ConfigReloadPending)
	{
		/* the database's and role's settings are applied again too (worker_settings.c) */
		RelayReloadConfig();
		/* a new naptime counts from now */
		reading_needed = true;
		/* a sink's open may read a setting: every pipeline is opened again */
		reopen_readings = true;
	}
	if (!RelayEnabled)
		stop_reason = "pg_tide.relay_enabled is off";
	else if (RelayDatabasePaused(MyDatabaseId, GetCurrentTimestamp()))
		stop_reason = "a command needs the database to itself";
	else
		return false;
	return true;
}

/* A SIGINT (pg_cancel_backend) arrived: the loop abandons its batches in flight. */
static volatile sig_atomic_t cancel_pending = false;

struct PipelineState;

/*
 * An operation in flight: a pipeline's batch between its lease and its
 * record, which the loop waits on together with every other. It keeps the
 * reading of the pipeline it started with (p), and all its memory is in
 * cxt, which goes only after the sink has released whatever points into it
 * (end_operation).
 */
typedef struct Operation
{
	dlist_node	node;			/* in `operations`, once started */
	bool		listed;			/* in `operations` */
	bool		in_sink;		/* started, and its outcomes not yet taken */
	bool		finished;		/* the sink said so when it was first moved on */
	struct PipelineState *st;
	RelayPipeline *p;
	MemoryContext cxt;
	RelaySinkBatch batch;		/* what the sink sees: the messages its routing passes */
	RelayMessage *msgs;			/* the batch as leased or taken from the queue */
	int			n;
	int		   *pos;			/* each message's index in batch.msgs; -1: filtered
								 * or parked (msgs[i].blocked) */
	int		   *after;			/* ordering 'key': the message each waits for, or
								 * -1 (ordering.c); NULL: another ordering */
	int			nblocked;		/* messages parked without being sent */
	int			limit;			/* what the pacing allowed when it was leased */
	bool		from_queue;
	TimestampTz sent_at;
	RelayDeliveryResult result;	/* its outcomes, once finished (finish_operation) */
	bool		has_result;
} Operation;

/*
 * A pipeline's state in the worker's memory: whether it is held (its
 * destination failing, or with ordering 'strict' a message failing) and
 * until when, when its retry queue is next looked at, its pacing, the
 * reading of its config it is served with and its batch in flight. Lost
 * when the worker restarts, which only means an early attempt: what must
 * survive a crash (the retry queue, the dead letters, the offset) is in
 * tables.
 */
typedef struct PipelineState
{
	char	   *name;			/* the hash key */
	char		config_md5[33]; /* the config the state was reached with */
	TimestampTz held_until;		/* 0: not held, or the hold's time is up */
	int			holds;			/* failed attempts in a row while held */
	int64		held_at;		/* the message it is held at */
	int			errors;			/* steps in a row that ended with an ERROR */
	RelayRepeat held_log;		/* the hold, as the log tells it (log_repeat.c) */
	RelayRepeat errors_log;		/* the ERRORs in a row, as the log tells them */
	RelayRepeat record_log;		/* failures to record its state (pipeline_state.c) */
	TimestampTz retry_check_at; /* DT_NOEND: the queue is empty */
	RelayPacing pacing;			/* rate limit and circuit breaker */
	TimestampTz paced_until;	/* the pacing lets it send again then; 0: now */
	bool		look;			/* look for live messages at its next step */
	bool		listed;			/* the last reading listed it (enabled) */
	RelayPipeline *p;			/* the reading it is served with; NULL: none */
	RelayPipeline *next_p;		/* a newer reading, taken once `op` is done */
	Operation  *op;				/* its batch in flight, or NULL */
	Operation  *ahead;			/* the next batch, leased while `op` is in
								 * flight and not started yet, or NULL */
	Operation  *recording;		/* a finished batch being recorded while the
								 * next one is in flight, or NULL */
} PipelineState;

/* The pipelines by name. */
static HTAB *pipeline_states = NULL;
/* Every operation in flight. */
static dlist_head operations = DLIST_STATIC_INIT(operations);
static int	n_operations = 0;
/* Where the pipelines' readings and the operations live. */
static MemoryContext engine_cxt = NULL;
/* What one turn of the loop allocates; reset at the start of each. */
static MemoryContext loop_cxt = NULL;

/* When the loop must look at the pipelines again for a time (a hold, a retry, pacing), or 0. */
static TimestampTz earliest_due = 0;
/* A pipeline may have something to do now: look at every one. */
static bool scan_needed = true;
/* When the pipelines are read again at the latest (the naptime). */
static TimestampTz next_reading_at = 0;
/* Relay->wake_requests at the last reading: SQL changed pipelines or queues. */
static uint64 seen_wake_requests = 0;
/* The database's commit count (wake.c) last looked at. */
static uint64 seen_commits = 0;
/* Whether an enabled pipeline exists: only then do commits wake the worker. */
static bool has_work = false;
/* Whether the holds and errors an earlier worker recorded are cleared. */
static bool forgot_earlier_states = false;
/*
 * The worker is retired (a lowered relay_workers_per_database, its slot
 * needed elsewhere): it starts nothing new and leaves once its batches in
 * flight are recorded, so that their new owner does not send them again.
 */
static bool retiring = false;

/* Notes a time the worker must wake at for a pipeline. */
static void
wake_at(TimestampTz t)
{
	if (t != 0 && t != DT_NOEND && (earliest_due == 0 || t < earliest_due))
		earliest_due = t;
}

/* Hashes a pipeline name (the key is a pointer to it). */
static uint32
name_hash(const void *key, Size keysize)
{
	const char *name = *(const char *const *) key;

	return hash_bytes((const unsigned char *) name, strlen(name));
}

/* Compares two pipeline names (the keys are pointers to them). */
static int
name_match(const void *key1, const void *key2, Size keysize)
{
	return strcmp(*(const char *const *) key1, *(const char *const *) key2);
}

/* The state of a pipeline, created when missing. */
static PipelineState *
pipeline_state(const char *name)
{
	PipelineState *st;
	bool		found;

	if (pipeline_states == NULL)
	{
		HASHCTL		ctl;

		memset(&ctl, 0, sizeof(ctl));
		ctl.keysize = sizeof(char *);
		ctl.entrysize = sizeof(PipelineState);
		ctl.hash = name_hash;
		ctl.match = name_match;
		ctl.hcxt = TopMemoryContext;
		pipeline_states = hash_create("pg_tide relay pipelines", 1024, &ctl,
									  HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);
	}
	st = hash_search(pipeline_states, &name, HASH_ENTER, &found);
	if (!found)
	{
		char	   *key = MemoryContextStrdup(TopMemoryContext, name);

		memset(st, 0, sizeof(*st));
		st->name = key;
	}
	return st;
}

/*
 * Logs that a condition of pipeline `name` the log said began is over:
 * `what` (is no longer held, works again) because of `why`, with since
 * when and how many times (`one`, `many`: what a time is called).
 */
static void
log_over(const char *name, RelayRepeat *r, const char *what, const char *why,
		 const char *one, const char *many)
{
	int64		times;
	TimestampTz since;

	if (RelayRepeatEnd(r, &times, &since))
		ereport(LOG,
				(errmsg("pg_tide relay pipeline \"%s\" %s: %s", name, what, why),
				 errdetail("Since %s: " INT64_FORMAT " %s.",
						   timestamptz_to_str(since), times, times == 1 ? one : many)));
}

/* Logs that a pipeline's hold is over (`why`), if the log said it began. */
static void
log_hold_over(PipelineState *st, const char *why)
{
	log_over(st->name, &st->held_log, "is no longer held", why,
			 "failed attempt", "failed attempts");
}

/* Logs that a pipeline's ERRORs in a row are over (`why`), if the log said they began. */
static void
log_errors_over(PipelineState *st, const char *why)
{
	log_over(st->name, &st->errors_log, "works again", why,
			 "step ended in an error", "steps in a row ended in an error");
}

/*
 * Ends a pipeline's hold: a batch went through, the destination asked to
 * be disabled, or the config changed (`why`). The one place where a hold
 * ends (hold_pipeline and hold_after_error are where one begins); a hold
 * whose time is up only lets the pipeline try again, and holds on until
 * then. The log, which said when the hold began, says that it is over.
 */
static void
end_hold(PipelineState *st, const char *why)
{
	st->held_until = 0;
	st->holds = 0;
	log_hold_over(st, why);
}

/*
 * A pipeline's step or record ended without an ERROR after steps that
 * did, or its config changed (`why`): its ERRORs in a row are over.
 */
static void
end_errors(PipelineState *st, const char *why)
{
	st->errors = 0;
	log_errors_over(st, why);
}

/* Ends a reading of a pipeline: its sink's state, then its memory. */
static void
release_pipeline(RelayPipeline *p)
{
	if (p == NULL)
		return;
	if (p->sink->close)
		p->sink->close(p->sink_state);
	MemoryContextDelete(p->cxt);
}

/*
 * Serves a pipeline with a new reading of its config; a new or changed
 * config (a fixed URL, say) is tried at once.
 */
static void
take_reading(PipelineState *st, RelayPipeline *p)
{
	release_pipeline(st->p);
	st->p = p;
	if (strcmp(st->config_md5, p->config_md5) != 0)
	{
		strlcpy(st->config_md5, p->config_md5, sizeof(st->config_md5));
		end_hold(st, "its config changed");
		end_errors(st, "its config changed");
		st->retry_check_at = 0;
		st->paced_until = 0;
		memset(&st->pacing, 0, sizeof(st->pacing));
	}
}
/*
 * How long to wait before attempt `attempts` + 1: exponential from
 * retry.base_ms, capped at retry.cap_ms, with jitter (the upper half of the
 * interval); never sooner than the receiver's Retry-After, which is obeyed
 * up to RELAY_MAX_RETRY_AFTER_MS even beyond the cap.
 */
static long
retry_delay_ms(const RelayPipeline *p, int attempts, long wait_ms)
{
	double		d = p->retry_base_ms;
	long		delay;
	int			i;

	for (i = 1; i < attempts && d < p->retry_cap_ms; i++)
		d *= 2;
	d = Min(d, (double) p->retry_cap_ms);
	delay = p->retry_cap_ms <= 0 ? 0 :
		Max((long) p->retry_base_ms,
			(long) (d / 2 + pg_prng_double(&pg_global_prng_state) * d / 2));
	if (wait_ms > delay)
		delay = Min(wait_ms, (long) RELAY_MAX_RETRY_AFTER_MS);
	return delay;
}

/* Whether a message's attempt failed in a way the message itself answers for. */
static bool
message_failed(RelayOutcome o)
{
	return o == RELAY_RETRYABLE || o == RELAY_PERMANENT;
}

/*
 * Holds a pipeline after a failure that says nothing about the messages
 * behind it: its destination failing, or ordering 'strict' at a failing
 * message. Nothing is sent until the hold ends; what was not recorded is
 * leased again then. A strict hold at a permanent failure, or after
 * max_attempts, waits retry.cap_ms between attempts; nothing is skipped.
 */
static void
hold_pipeline(const RelayPipeline *p, PipelineState *st, const RelayMessage *m,
			  const RelayMessageOutcome *o)
{
	bool		at_cap = o->outcome == RELAY_PERMANENT ||
		(p->strict && st->holds + 1 >= p->retry_max_attempts);
	long		delay;
	int64		unlogged;
	RelayRepeatLine line;

	st->holds++;
	st->held_at = m->id;
	delay = at_cap ? p->retry_cap_ms : retry_delay_ms(p, st->holds, o->wait_ms);
	/* No delay (a file sink): the next look (a commit, the naptime) retries. */
	st->held_until = delay > 0 ? TimestampTzPlusMilliseconds(GetCurrentTimestamp(), delay) : 0;
	/* once when it begins, then at most once a minute (log_repeat.c) */
	line = RelayRepeatNote(&st->held_log, &unlogged);
	if (line == RELAY_REPEAT_FIRST)
		ereport(LOG,
				(errmsg("pg_tide relay pipeline \"%s\" is held at message " INT64_FORMAT ": %s",
						p->name, m->id, o->error),
				 p->strict ?
				 errdetail("Ordering is strict: no message after it is delivered before it; attempt %d.",
						   st->holds) :
				 errdetail("The destination failed (%s), not the message; attempt %d in a row. Nothing is dead-lettered for it.",
						   o->error_class, st->holds),
				 errhint("The pipeline tries again in %ld ms. Until the hold ends, this is logged at most once a minute.",
						 delay)));
	else if (line == RELAY_REPEAT_AGAIN)
		ereport(LOG,
				(errmsg("pg_tide relay pipeline \"%s\" is still held at message " INT64_FORMAT ": %s",
						p->name, m->id, o->error),
				 errdetail(INT64_FORMAT " more failed attempt%s since the last line; " INT64_FORMAT " since the hold began at %s.",
						   unlogged, unlogged == 1 ? "" : "s", st->held_log.times,
						   timestamptz_to_str(st->held_log.since)),
				 errhint("The pipeline tries again in %ld ms.", delay)));
	/* For relay_pipeline_status (pipeline_state.c). */
	RelayRecordHold(p, m, o, st->held_until, st->holds, &st->record_log);
}

/*
 * Makes the texts of a batch's outcomes storable (clean_text.c): whatever
 * a sink puts there may come from the receiver, in any encoding and cut
 * anywhere. Done here, once for every sink, before anything is logged or
 * recorded.
 */
static void
clean_outcomes(RelayDeliveryResult *r, int n)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		RelayMessageOutcome *o = &r->each[i];
		char		buf[Max(sizeof(o->error), sizeof(o->error_class))];

		RelayCleanText(buf, sizeof(o->error), o->error, strlen(o->error));
		strlcpy(o->error, buf, sizeof(o->error));
		RelayCleanText(buf, sizeof(o->error_class), o->error_class, strlen(o->error_class));
		strlcpy(o->error_class, buf, sizeof(o->error_class));
		if (o->response)
		{
			size_t		len = strlen(o->response);
			char	   *clean = palloc(len + 1);

			RelayCleanText(clean, len + 1, o->response, len);
			o->response = clean;
		}
	}
}

/* What happens to the batch's messages after their delivery. */
typedef enum BatchEnd
{
	BATCH_DONE,					/* settled; nothing more waits */
	BATCH_FULL,					/* settled, and a full batch: more may wait */
	BATCH_HELD					/* the pipeline is held or disabled */
} BatchEnd;

/*
 * Accounts for a finished batch's attempts in the pipeline's pacing (its
 * rate limit's tokens, its breaker), before anything else is decided.
 */
static void
pace_batch(const RelayPipeline *p, PipelineState *st, const RelayDeliveryResult *r, int n)
{
	int			nsucceeded = 0;
	int			nfailed = 0;

	for (int i = 0; i < n; i++)
		if (r->each[i].outcome == RELAY_DELIVERED)
			nsucceeded++;
		else if (r->each[i].outcome != RELAY_NOT_SENT && r->each[i].outcome != RELAY_FILTERED)
			nfailed++;
	RelayPacingAfterBatch(p, &st->pacing, nsucceeded + nfailed, nfailed, nsucceeded);
}

/*
 * Records what became of each message of a delivered batch (live from the
 * lease, or from the retry queue), in one transaction:
 *
 * - Live, default ordering: the offset moves over every message whose fate
 *	 is known (delivered, or failed by its own answer), and the failed ones
 *	 are queued for retry (or dead-lettered: a permanent failure, or the
 *	 last of max_attempts), so one failing message holds back no other. A
 *	 destination failure stops the offset there and holds the pipeline.
 * - Live, ordering 'strict': the offset moves over the delivered prefix and
 *	 the pipeline is held at the first failure.
 * - Live, ordering 'key': as by default, and a message held back by its
 *	 key (its key blocked, or an earlier message of its key in the batch
 *	 failed or parked) is parked: queued behind it, due at once, its
 *	 attempts unchanged (ordering.c).
 * - From the retry queue: delivered messages leave it, failed ones are
 *	 scheduled again or dead-lettered, the others stay as they were.
 * - A destination that asks to be disabled (410 Gone) has what was
 *	 delivered recorded, and the pipeline disabled.
 */
static BatchEnd
settle_batch(const RelayPipeline *p, PipelineState *st, const RelayMessage *msgs, int n,
			 const int *after, bool from_queue, RelayDeliveryResult *result, int filtered,
			 TimestampTz sent_at, MemoryContext cxt)
{
	RelayDeliveryResult r = *result;
	RelaySettlement s;
	int			settled;
	int			i;
	int			ndead = 0;
	int			nqueued = 0;
	int			nparked = 0;
	bool		key_left_queue = false;
	bool	   *parked = palloc0(sizeof(bool) * Max(n, 1));
	int			nsucceeded = 0;
	int			nfailed = 0;
	long		first_delay = -1;

	memset(&s, 0, sizeof(s));
	s.sent_at = sent_at;
	s.filtered = filtered;

	s.n = n;
	s.msgs = msgs;
	s.each = r.each;
	s.disp = palloc0(sizeof(RelayDisposition) * n);
	s.attempts = palloc0(sizeof(int) * n);
	s.delay_ms = palloc0(sizeof(long) * n);
	s.reason = palloc0(sizeof(char *) * n);
	s.attempt_no = palloc0(sizeof(int) * n);

	/* Every request made is an attempt; a message held at counts its holds. */
	for (i = 0; i < n; i++)
		if (r.each[i].outcome != RELAY_NOT_SENT && r.each[i].outcome != RELAY_FILTERED)
		{
			s.attempt_no[i] = msgs[i].attempts + 1 +
				(!from_queue && st->holds > 0 && msgs[i].id == st->held_at ? st->holds : 0);
			if (r.each[i].outcome == RELAY_DELIVERED)
				nsucceeded++;
			else
				nfailed++;
		}
	/* the batch moved the pacing already (pace_batch) */
	s.breaker = RelayBreakerStateName(p, &st->pacing);

	/*
	 * Ordering 'key', live: a message held back by its key is parked, its
	 * fate known as much as a failed one's (ordering.c).
	 */
	if (!from_queue && after != NULL)
		nparked = RelayOrderingParked(msgs, n, after, r.each, parked);

	/* How many messages, from the first, this record may settle. */
	if (r.disable)
		settled = from_queue ? n : r.acked;
	else if (from_queue)
		settled = n;
	else if (p->strict)
		settled = r.acked;
	else
		for (settled = 0; settled < n; settled++)
			if (r.each[settled].outcome != RELAY_DELIVERED &&
				r.each[settled].outcome != RELAY_FILTERED &&
				!message_failed(r.each[settled].outcome) && !parked[settled])
				break;

	for (i = 0; i < settled; i++)
	{
		const RelayMessageOutcome *o = &r.each[i];

		if (o->outcome == RELAY_DELIVERED)
			s.disp[i] = from_queue ? RELAY_DONE : RELAY_KEEP;
		else if (parked[i] && !r.disable)
		{
			/* queued behind its key's failure, due at once: no attempt counted */
			s.disp[i] = RELAY_REQUEUE;
			s.attempts[i] = msgs[i].attempts;
			s.delay_ms[i] = 0;
		}
		else if (message_failed(o->outcome) && !r.disable)
		{
			s.attempts[i] = msgs[i].attempts + 1;
			if (o->outcome == RELAY_PERMANENT || s.attempts[i] >= p->retry_max_attempts)
			{
				s.disp[i] = RELAY_DEAD;
				s.reason[i] = o->outcome == RELAY_PERMANENT ? "permanent" : "exhausted";
				ndead++;
			}
			else
			{
				s.disp[i] = RELAY_REQUEUE;
				s.delay_ms[i] = retry_delay_ms(p, s.attempts[i], o->wait_ms);
				if (first_delay < 0 || s.delay_ms[i] < first_delay)
					first_delay = s.delay_ms[i];
				nqueued++;
			}
		}
	}
	if (!from_queue && settled > 0)
		s.offset_id = msgs[settled - 1].id;
	s.disable = r.disable;
	/* a message whose outcome cannot be recorded is dead-lettered (record_each.c) */
	RelayRecordEach(p, &s, cxt);

	/*
	 * Ordering 'key': a parked message is due now, as are the entries of a
	 * key whose earlier entry left the queue: look at the queue at once.
	 */
	for (i = 0; p->ordering_key != NULL && i < n; i++)
		if (msgs[i].key != NULL && (s.disp[i] == RELAY_DONE || s.disp[i] == RELAY_DEAD))
			key_left_queue = true;
	if (nparked > 0 || key_left_queue)
		st->retry_check_at = 0;

	/*
	 * A queued message left as it was (not sent, or its destination failed)
	 * is still due: look at the queue again at its next step (after the
	 * hold), or nothing would until another failure queues a message.
	 */
	for (i = 0; from_queue && i < n; i++)
		if (s.disp[i] == RELAY_KEEP)
			st->retry_check_at = 0;

	if (nqueued > 0)
	{
		TimestampTz due = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), first_delay);

		if (st->retry_check_at == DT_NOEND || due < st->retry_check_at)
			st->retry_check_at = due;
		ereport(DEBUG1,
				(errmsg("pg_tide relay pipeline \"%s\" queued %d of %d messages for another attempt",
						p->name, nqueued, n)));
	}
	if (ndead > 0)
		for (i = 0; i < n; i++)
			if (s.disp[i] == RELAY_DEAD && (s.unrecorded == NULL || !s.unrecorded[i]))
				ereport(LOG,
						(errmsg("pg_tide relay pipeline \"%s\" dead-lettered message " INT64_FORMAT " of outbox \"%s\" after %d attempt%s: %s",
								p->name, msgs[i].id, msgs[i].outbox, s.attempts[i],
								s.attempts[i] == 1 ? "" : "s", r.each[i].error),
						 errhint("tide.relay_dlq_list() shows it; tide.relay_dlq_retry() delivers it again.")));

	if (r.disable)
	{
		ereport(LOG,
				(errmsg("pg_tide relay pipeline \"%s\" is disabled: %s",
						p->name, r.disable_reason),
				 errhint("Enable it again with tide.relay_enable() once the receiver accepts deliveries.")));
		end_hold(st, "it is disabled");
		return BATCH_HELD;
	}

	/*
	 * Live: the first message not settled holds the pipeline; unless it was
	 * only not sent, in a batch that sent others (its time ran out: the
	 * requests waited their turn for connections): nothing failed, and the
	 * rest is leased again at once.
	 */
	if (!from_queue && settled < n)
	{
		if (r.each[settled].outcome == RELAY_NOT_SENT && nsucceeded + nfailed > 0)
		{
			end_hold(st, "its destination answers again");
			st->look = true;
			return BATCH_FULL;
		}
		hold_pipeline(p, st, &msgs[settled], &r.each[settled]);
		return BATCH_HELD;
	}
	/* From the queue: a destination failure left messages as they were. */
	for (i = 0; from_queue && i < n; i++)
		if (r.each[i].outcome == RELAY_UNREACHABLE)
		{
			hold_pipeline(p, st, &msgs[i], &r.each[i]);
			return BATCH_HELD;
		}
	end_hold(st, "its destination answers again");
	/* An open breaker stops the pipeline until it turns half-open (pacing.c). */
	if (st->pacing.breaker == RELAY_BREAKER_OPEN)
		return BATCH_HELD;
	return n == p->batch_size ? BATCH_FULL : BATCH_DONE;
}

/*
 * A pipeline's step or record ended without an ERROR: whatever failed
 * before works again, and relay_pipeline_status says so (pipeline_state.c).
 */
static void
turn_ok(PipelineState *st)
{
	if (st->errors > 0)
		RelayRecordTurnOk(st->name, &st->record_log);
	end_errors(st, "its last step ended without an error");
}

/*
 * Starts a batch as an operation in flight: the messages the pipeline's
 * routing lets pass (live batches only: a message queued for retry or by
 * an operator was chosen already) go to the sink; the others are passed
 * over, as if acknowledged (RELAY_FILTERED when recorded). With ordering
 * 'key', a message whose key is blocked (ordering.c) is not sent either,
 * and is parked when recorded; the sink gets each message's dependency on
 * the previous one of its key that it sends (RelaySinkBatch.after).
 */
static void
start_operation(PipelineState *st, Operation *op, RelayMessage *msgs, int n, bool from_queue,
				int limit)
{
	const RelayPipeline *p = st->p;
	RelayMessage *pass = palloc(sizeof(RelayMessage) * Max(n, 1));
	int			npass = 0;

	op->msgs = msgs;
	op->n = n;
	op->from_queue = from_queue;
	op->limit = limit;
	op->pos = palloc(sizeof(int) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		op->pos[i] = -1;
		if (!from_queue && p->routing != NULL &&
			!RelayRoutingMatches(p->routing, msgs[i].payload, msgs[i].headers))
			msgs[i].blocked = false;	/* not for this pipeline: passed over, never parked */
		else if (msgs[i].blocked)
			op->nblocked++;
		else
		{
			op->pos[i] = npass;
			pass[npass++] = msgs[i];
		}
	}
	op->batch.msgs = pass;
	op->batch.nmsgs = npass;
	op->batch.stop_at_failure = p->strict;
	if (p->ordering_key != NULL)
	{
		bool	   *sent = palloc(sizeof(bool) * Max(n, 1));
		int		   *after = palloc(sizeof(int) * Max(npass, 1));

		/* each message waits for the previous one of its key that the sink sends */
		for (int i = 0; i < n; i++)
			sent[i] = op->pos[i] >= 0;
		op->after = palloc(sizeof(int) * Max(n, 1));
		RelayOrderingDependencies(msgs, n, sent, op->after);
		for (int i = 0; i < n; i++)
			if (op->pos[i] >= 0)
				after[op->pos[i]] = op->after[i] >= 0 ? op->pos[op->after[i]] : -1;
		op->batch.after = after;
	}
	op->batch.cxt = op->cxt;
	/* progress is due once right after start */
	op->batch.ready = true;
	op->sent_at = GetCurrentTimestamp();
	if (npass > 0)
	{
		op->in_sink = true;
		p->sink->start(p->sink_state, &op->batch);
	}
}

/*
 * A new operation of a pipeline, with a memory context of its own; not in
 * `operations` until it is started (list_operation).
 */
static Operation *
make_operation(PipelineState *st)
{
	MemoryContext cxt = AllocSetContextCreate(engine_cxt, "pg_tide relay batch",
											  ALLOCSET_DEFAULT_SIZES);
	Operation  *op = MemoryContextAllocZero(cxt, sizeof(Operation));

	op->cxt = cxt;
	op->st = st;
	op->p = st->p;
	return op;
}

/* Puts an operation among those the loop moves on and waits for. */
static void
list_operation(Operation *op)
{
	dlist_push_tail(&operations, &op->node);
	op->listed = true;
	n_operations++;
}

/* A new operation of a pipeline, its batch in flight, among `operations`. */
static Operation *
new_operation(PipelineState *st)
{
	Operation  *op = make_operation(st);

	st->op = op;
	list_operation(op);
	return op;
}

/*
 * Frees one operation: with `cancel`, a batch still in its sink is
 * abandoned first, so that nothing the sink keeps points into the memory
 * freed; never an ERROR.
 */
static void
free_operation(Operation *op, bool cancel)
{
	if (op->in_sink && cancel)
		op->p->sink->cancel(op->p->sink_state, &op->batch);
	op->in_sink = false;
	if (op->listed)
	{
		dlist_delete(&op->node);
		n_operations--;
	}
	MemoryContextSwitchTo(loop_cxt);
	MemoryContextDelete(op->cxt);
}

/*
 * Ends a pipeline's operations (the batch in flight, the one leased ahead
 * of it, the one being recorded): with `cancel` (the worker stops, a
 * cancel, an ERROR) the sink first releases whatever of its batch it still
 * holds; never an ERROR. Only then is the batches' memory freed. The
 * pipeline then takes a newer reading of its config if one came meanwhile,
 * or lets go of its reading when it is no longer enabled.
 */
static void
end_operation(PipelineState *st, bool cancel)
{
	Operation  *ops[3] = {st->recording, st->op, st->ahead};
	bool		leased = false;
	bool		any = false;

	st->recording = NULL;
	st->op = NULL;
	st->ahead = NULL;
	for (int i = 0; i < (int) lengthof(ops); i++)
		if (ops[i] != NULL)
		{
			any = true;
			leased |= ops[i]->n > 0;
			free_operation(ops[i], cancel);
		}
	if (!any)
		return;
	MemoryContextSwitchTo(loop_cxt);
	if (st->next_p)
	{
		take_reading(st, st->next_p);
		st->next_p = NULL;
	}
	if (!st->listed)
	{
		release_pipeline(st->p);
		st->p = NULL;
		/* moved or disabled while in flight: the next reading lets it go (ownership.c) */
		reading_needed = true;
	}
	/* what it does after a batch is decided by the next look at the pipelines */
	if (leased)
		scan_needed = true;
}

/*
 * Abandons every batch in flight (and those leased ahead of them): nothing
 * of them is recorded, and their messages are leased (or taken from the
 * retry queue) again at the next look. For a cancel, for the worker's stop
 * and on the way out of an ERROR: never raises one.
 */
static int
abandon_operations(void)
{
	int			n = 0;

	/* one pipeline's end may take more than one listed batch with it */
	while (!dlist_is_empty(&operations))
	{
		Operation  *op = dlist_head_element(Operation, node, &operations);
		PipelineState *st = op->st;

		if (op->from_queue)
			st->retry_check_at = 0;
		else
			st->look = true;
		n += (st->recording != NULL) + (st->op != NULL) + (st->ahead != NULL);
		end_operation(st, true);
	}
	return n;
}

/*
 * Moves a batch on once, right after its start, so that its first sends
 * are out before the worker opens a transaction: its sink's progress, then
 * what the sinks asked to be done at once (a library's timer set to 0, a
 * socket ready to write), as the loop's wait would do next. A batch the
 * sink says is finished already is completed at the loop's next look at it.
 */
static void
kick_operation(Operation *op)
{
	op->batch.ready = false;
	op->batch.wake_at = 0;
	if (op->batch.nmsgs == 0 || op->p->sink->progress(op->p->sink_state, &op->batch))
	{
		op->finished = true;
		op->batch.ready = true;
		return;
	}
	RelayTimersFire(GetCurrentTimestamp());
	RelayEventsDispatch();
}

/*
 * Leases the batch after the pipeline's batch in flight, as long as that
 * one is delivered, when they may overlap (see the top of this file): a
 * live batch, with ordering relaxed, that was full (a backlog; a batch that
 * is not full leases nothing ahead, so low rates wait for nothing), while
 * nothing else is due first (retries, a newer reading, a retirement) and
 * the rate limit has tokens for both batches. One lease holds both (the
 * consumer lengthens its lease at its end, TidePollAhead): a second
 * consumer would need the group's rules, the check of other consumers, the
 * status views and the retention to know it, while the one lease keeps
 * them as they are and gives back a batch not started by itself.
 */
static void
lease_ahead(PipelineState *st)
{
	Operation  *op = st->op;
	const RelayPipeline *p = op->p;
	Operation  *ahead;
	RelayMessage *msgs;
	TimestampTz wake;
	int			n;

	if (!p->overlap || op->from_queue || p->strict || p->ordering_key != NULL ||
		op->n < p->batch_size || op->limit < p->batch_size ||
		retiring || !st->listed || st->next_p != NULL || st->ahead != NULL ||
		st->retry_check_at <= GetCurrentTimestamp())
		return;
	if (RelayPacingAllowance(p, &st->pacing, op->n + p->batch_size, &wake) < op->n + p->batch_size)
		return;
	ahead = make_operation(st);
	/* from here on, an ERROR frees it with the pipeline's other batches */
	st->ahead = ahead;
	n = RelayLeaseAhead(p, op->msgs[op->n - 1].id, p->batch_size, ahead->cxt, &msgs);
	MemoryContextSwitchTo(loop_cxt);
	if (n == 0)
	{
		st->ahead = NULL;
		free_operation(ahead, false);
		return;
	}
	ahead->msgs = msgs;
	ahead->n = n;
	ahead->limit = p->batch_size;
}

/*
 * Whether a message's failure is the destination's answer to it (an HTTP
 * status, a broker's refusal), which says nothing of the messages after
 * it; not a silence (a timeout, a connection broken once sent), which may
 * be a stalled destination that the next batch should not be sent into.
 */
static bool
failed_by_answer(const RelayMessageOutcome *o)
{
	return message_failed(o->outcome) &&
		strcmp(o->error_class, "timeout") != 0 && strcmp(o->error_class, "connection") != 0;
}

/*
 * Whether the batch leased ahead of a finished batch may start before the
 * finished one is recorded: when its outcomes settle every message of it
 * (delivered, or failed by the destination's answer, so queued or
 * dead-lettered: failed_by_answer) and
 * nothing holds the pipeline (a 410, a destination failure, a message not
 * sent, the breaker, the rate limit), nothing else is due first (retries,
 * a newer reading of the config, a retirement) and it is still served.
 * Its pacing has counted the finished batch already (pace_batch).
 */
static bool
may_start_ahead(PipelineState *st, const Operation *done, const RelayDeliveryResult *r,
				const Operation *next)
{
	TimestampTz wake;

	if (r->disable || retiring || !st->listed || st->next_p != NULL ||
		st->retry_check_at <= GetCurrentTimestamp())
		return false;
	for (int i = 0; i < done->n; i++)
		if (r->each[i].outcome != RELAY_DELIVERED && r->each[i].outcome != RELAY_FILTERED &&
			!failed_by_answer(&r->each[i]))
			return false;
	return RelayPacingAllowance(done->p, &st->pacing, next->n, &wake) >= next->n;
}

/*
 * Takes a finished batch's outcomes out of its sink into the operation's
 * memory, for the whole batch (filtered and parked messages included), its
 * texts made storable; the sink then holds nothing of it.
 */
static void
take_outcomes(Operation *op, RelayDeliveryResult *r)
{
	const RelayPipeline *p = op->p;
	RelayDeliveryResult sub;

	MemoryContextSwitchTo(op->cxt);
	memset(&sub, 0, sizeof(sub));
	sub.each = palloc0(sizeof(RelayMessageOutcome) * Max(op->batch.nmsgs, 1));
	for (int i = 0; i < op->batch.nmsgs; i++)
		sub.each[i].wait_ms = -1;
	if (op->in_sink)
		p->sink->outcomes(p->sink_state, &op->batch, &sub);
	op->in_sink = false;

	memset(r, 0, sizeof(*r));
	r->each = palloc0(sizeof(RelayMessageOutcome) * Max(op->n, 1));
	r->disable = sub.disable;
	strlcpy(r->disable_reason, sub.disable_reason, sizeof(r->disable_reason));
	for (int i = 0; i < op->n; i++)
	{
		if (op->pos[i] >= 0)
			r->each[i] = sub.each[op->pos[i]];
		else if (op->msgs[i].blocked)
			r->each[i].outcome = RELAY_NOT_SENT;
		else
			r->each[i].outcome = RELAY_FILTERED;
		if (r->each[i].outcome == RELAY_DELIVERED)
			r->delivered++;
		if (r->acked == i && (r->each[i].outcome == RELAY_DELIVERED ||
							  r->each[i].outcome == RELAY_FILTERED))
			r->acked++;
	}
	clean_outcomes(r, op->n);
}

/*
 * The first half of a finished operation's end, with no transaction open
 * (the sink may connect, send and wait): its outcomes are taken out of the
 * sink and counted in the pacing, and a batch leased ahead of it starts in
 * the sink when it may (may_start_ahead), else it is given back: its
 * messages stay in the lease and are leased again. The finished batch is
 * recorded next (record_operation), with the others of the loop's turn.
 */
static void
finish_operation(PipelineState *st)
{
	Operation  *op = st->op;
	Operation  *next = st->ahead;

	take_outcomes(op, &op->result);
	op->has_result = true;
	pace_batch(op->p, st, &op->result, op->n);

	st->ahead = NULL;
	if (next != NULL && !may_start_ahead(st, op, &op->result, next))
	{
		free_operation(next, false);
		next = NULL;
	}
	if (next != NULL)
	{
		/* the finished batch is recorded while the next one is in flight */
		st->recording = op;
		st->op = next;
		list_operation(next);
		MemoryContextSwitchTo(next->cxt);
		start_operation(st, next, next->msgs, next->n, false, next->limit);
		kick_operation(next);
	}
	MemoryContextSwitchTo(loop_cxt);
}

/*
 * Records a finished operation (settle_batch, after finish_operation) and
 * ends it; what the pipeline does next: a full batch (or one the rate cut
 * short) looks for more at once, a held one waits for its hold. When the
 * batch leased ahead of it is in flight already, only the finished one
 * ends, and the pipeline leases its next batch after the record
 * (progress_operations).
 */
static void
record_operation(PipelineState *st)
{
	Operation  *op = st->recording != NULL ? st->recording : st->op;
	const RelayPipeline *p = op->p;
	BatchEnd	end;

	MemoryContextSwitchTo(op->cxt);
	end = settle_batch(p, st, op->msgs, op->n, op->after, op->from_queue, &op->result,
					   op->n - op->batch.nmsgs - op->nblocked, op->sent_at, op->cxt);
	/* A short lease: nothing more waits (unless the rate cut it short). */
	if (!op->from_queue && end != BATCH_HELD && op->n == op->limit)
		st->look = true;
	if (op->from_queue && end == BATCH_FULL)
		st->retry_check_at = 0;
	turn_ok(st);
	MemoryContextSwitchTo(loop_cxt);
	if (op != st->recording)
	{
		end_operation(st, false);
		return;
	}
	st->recording = NULL;
	free_operation(op, false);
}

/*
 * Holds a pipeline whose step ended with an ERROR (a full disk, its outbox
 * dropped, its lease lost): without a hold, a batch delivered but not
 * recorded would be delivered again at every look, and the error logged
 * each time, for as long as the cause lasts. Returns the hold in ms.
 */
static long
hold_after_error(PipelineState *st)
{
	long		delay = RELAY_ERROR_HOLD_MIN_MS;
	int			i;

	st->errors++;
	for (i = 1; i < st->errors && delay < RELAY_ERROR_HOLD_MAX_MS; i++)
		delay *= 2;
	delay = Min(delay, RELAY_ERROR_HOLD_MAX_MS);
	st->held_until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), delay);
	/* what it had not recorded is leased again when the hold is up */
	st->look = true;
	wake_at(st->held_until);
	return delay;
}

/*
 * A pipeline's step while it has no batch in flight: the messages due for
 * another attempt, else a live batch if it is to look for one, each leased
 * in a short transaction and started as an operation in flight.
 */
static void
step_pipeline(PipelineState *st)
{
	const RelayPipeline *p = st->p;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz wake;
	RelayMessage *msgs;
	Operation  *op;
	bool		retries_due = st->retry_check_at <= now;
	int			limit;
	int			n;

	if (!retries_due && !st->look)
		return;
	limit = RelayPacingAllowance(p, &st->pacing, p->batch_size, &wake);
	if (limit == 0)
	{
		st->paced_until = wake;
		wake_at(wake);
		return;
	}
	op = new_operation(st);
	if (retries_due)
	{
		TimestampTz next_due;

		n = RelayTakeRetries(p, limit, op->cxt, &msgs, &next_due);
		/* Empty: looked at again when the worker queues one, or SQL asks. */
		st->retry_check_at = next_due != 0 ? next_due : DT_NOEND;
		if (n > 0)
		{
			if (n == limit)
				st->retry_check_at = 0;
			MemoryContextSwitchTo(op->cxt);
			start_operation(st, op, msgs, n, true, limit);
			MemoryContextSwitchTo(loop_cxt);
			return;
		}
	}
	if (st->look)
	{
		st->look = false;
		n = RelayLeaseBatch(p, limit, op->cxt, &msgs);
		if (n > 0)
		{
			MemoryContextSwitchTo(op->cxt);
			start_operation(st, op, msgs, n, false, limit);
			MemoryContextSwitchTo(loop_cxt);
			/* a backlog: the next batch is leased while this one is out */
			if (n == p->batch_size && p->overlap && !p->strict && p->ordering_key == NULL)
			{
				kick_operation(op);
				lease_ahead(st);
			}
			return;
		}
	}
	turn_ok(st);
	end_operation(st, false);
}

/*
 * Runs `what` (a step or a completion) for one pipeline; an ERROR in it
 * (its outbox dropped, its lease lost, a full disk) is logged, the
 * pipeline's batch in flight is cancelled (its memory freed only after the
 * sink released it), the pipeline is held for a while (hold_after_error)
 * and the others go on.
 */
static void
run_for_pipeline(PipelineState *st, void (*what) (PipelineState *st))
{
	PG_TRY();
	{
		what(st);
		MemoryContextSwitchTo(loop_cxt);
	}
	PG_CATCH();
	{
		ErrorData  *edata;
		long		delay;
		int64		unlogged;
		RelayRepeatLine line;

		MemoryContextSwitchTo(loop_cxt);
		edata = CopyErrorData();
		FlushErrorState();
		/* in a group of records, only this pipeline's is undone (xact.c) */
		RelayAbortShortXact();
		MemoryContextSwitchTo(loop_cxt);
		end_operation(st, true);
		delay = hold_after_error(st);
		/* once when they begin, then at most once a minute (log_repeat.c) */
		line = RelayRepeatNote(&st->errors_log, &unlogged);
		if (line == RELAY_REPEAT_FIRST)
			ereport(LOG,
					(errmsg("pg_tide relay pipeline \"%s\" stopped this pass after an error: %s",
							st->name, edata->message),
					 errdetail("The pipeline is tried again in %ld ms (error %d in a row). Messages it sent but could not record are sent again then.",
							   delay, st->errors),
					 errhint("Until a pass ends without an error, this is logged at most once a minute.")));
		else if (line == RELAY_REPEAT_AGAIN)
			ereport(LOG,
					(errmsg("pg_tide relay pipeline \"%s\" still stops after an error: %s",
							st->name, edata->message),
					 errdetail(INT64_FORMAT " more error%s since the last line; error %d in a row since %s. The pipeline is tried again in %ld ms.",
							   unlogged, unlogged == 1 ? "" : "s", st->errors,
							   timestamptz_to_str(st->errors_log.since), delay)));
		/* For relay_pipeline_status (pipeline_state.c); never raises. */
		RelayRecordTurnError(st->name, edata->message, st->errors, st->held_until,
							 &st->record_log);
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
static bool
database_turn(void)
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
	abandon_operations();
	worker_leave(RELAY_EXIT_NO_EXTENSION, "pg_tide is not installed");
	return false;
}

/*
 * Of the pipelines about to take their step, those that would only look
 * for live messages are asked about in one statement (idle_look.c); each
 * that has nothing has looked, and takes no step. Should the
 * look fail, every pipeline takes its step and looks on its own.
 */
pg_noinline static void
skip_idle_pipelines(PipelineState **all, long n, TimestampTz now)
{
	RelayPipeline **lookers = palloc(sizeof(RelayPipeline *) * Max(n, 1));
	PipelineState **states = palloc(sizeof(PipelineState *) * Max(n, 1));
	bool	   *found;
	int			nlook = 0;

	for (long i = 0; i < n; i++)
	{
		PipelineState *st = all[i];

		if (st->held_until > now || st->paced_until > now ||
			!st->look || st->retry_check_at <= now)
			continue;
		states[nlook] = st;
		lookers[nlook++] = st->p;
	}
	/* one pipeline alone looks in its step, as cheaply */
	if (nlook < 2)
		return;
	found = palloc(sizeof(bool) * nlook);
	PG_TRY();
	{
		RelayLookForWork(lookers, nlook, found);
		MemoryContextSwitchTo(loop_cxt);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(loop_cxt);
		edata = CopyErrorData();
		FlushErrorState();
		RelayAbortShortXact();
		MemoryContextSwitchTo(loop_cxt);
		ereport(LOG,
				(errmsg("pg_tide relay could not look for messages of %d pipelines at once: %s",
						nlook, edata->message),
				 errdetail("Each pipeline looks on its own this pass.")));
		FreeErrorData(edata);
		return;
	}
	PG_END_TRY();
	/* one whose errors are to be cleared (turn_ok) takes its step */
	for (int i = 0; i < nlook; i++)
		if (!found[i] && states[i]->errors == 0)
			states[i]->look = false;
}

/*
 * Looks at every pipeline without a batch in flight: a hold whose time is
 * up lets it try again; one that may send (not held, not paced) takes its
 * step. Notes when the next look is due for a time.
 */
static void
scan_pipelines(void)
{
	HASH_SEQ_STATUS seq;
	PipelineState *st;
	PipelineState **all;
	long		n = 0;
	TimestampTz now = GetCurrentTimestamp();

	scan_needed = false;
	earliest_due = 0;
	pg_atomic_fetch_add_u64(&my_slot->passes, 1);
	if (pipeline_states == NULL || retiring)
		return;
	/*
	 * The steps run transactions, which end any hash_seq_search scan: the
	 * pipelines to look at are taken first.
	 */
	all = MemoryContextAlloc(engine_cxt,
							 sizeof(PipelineState *) * Max(hash_get_num_entries(pipeline_states), 1));
	hash_seq_init(&seq, pipeline_states);
	while ((st = hash_seq_search(&seq)) != NULL)
		if (st->p != NULL && st->op == NULL)
			all[n++] = st;
	for (long i = 0; i < n; i++)
	{
		st = all[i];
		if (st->held_until > now)
		{
			wake_at(st->held_until);
			continue;
		}
		if (st->held_until != 0)
		{
			/* the hold's time is up: try again, live messages too */
			st->held_until = 0;
			st->look = true;
		}
		if (st->paced_until > now)
		{
			wake_at(st->paced_until);
			continue;
		}
		st->paced_until = 0;
	}
	skip_idle_pipelines(all, n, now);
	for (long i = 0; i < n; i++)
	{
		st = all[i];
		if (st->held_until > now || st->paced_until > now)
			continue;
		run_for_pipeline(st, step_pipeline);
		if (st->op == NULL)
		{
			wake_at(st->held_until);
			wake_at(st->paced_until);
			wake_at(st->retry_check_at);
		}
	}
	pfree(all);
}

/*
 * Moves on every operation whose sink has something to do (its sockets or
 * timers fired, or its wake_at came), and ends those that finished, in
 * three passes: each gives its outcomes and starts the batch leased ahead
 * of it, with no transaction open (finish_operation); all are recorded
 * together, in a group of short transactions (xact.c: one transaction per
 * 64 records, each record in a subtransaction of its own, so that an ERROR
 * in one pipeline's record loses no other's); then each pipeline whose
 * next batch is in flight leases the one after it (lease_ahead).
 */
static void
progress_operations(void)
{
	dlist_iter	iter;
	TimestampTz now = GetCurrentTimestamp();
	PipelineState **finished = palloc(sizeof(PipelineState *) * Max(n_operations, 1));
	int			nfinished = 0;

	dlist_foreach(iter, &operations)
	{
		Operation  *op = dlist_container(Operation, node, iter.cur);

		if (!op->batch.ready && (op->batch.wake_at == 0 || op->batch.wake_at > now))
			continue;
		op->batch.ready = false;
		op->batch.wake_at = 0;
		if (op->finished || op->batch.nmsgs == 0 ||
			op->p->sink->progress(op->p->sink_state, &op->batch))
		{
			if (!database_turn())
			{
				/* finished, recorded in a later turn */
				op->finished = true;
				op->batch.ready = true;
				continue;
			}
			finished[nfinished++] = op->st;
		}
	}
	if (nfinished == 0)
		return;
	for (int i = 0; i < nfinished; i++)
		run_for_pipeline(finished[i], finish_operation);
	RelayBeginXactGroup();
	for (int i = 0; i < nfinished; i++)
	{
		PipelineState *st = finished[i];

		/* (an ERROR in its first half ended every batch of it) */
		if (st->recording != NULL || (st->op != NULL && st->op->has_result))
			run_for_pipeline(st, record_operation);
	}
	RelayEndXactGroup();
	MemoryContextSwitchTo(loop_cxt);
	for (int i = 0; i < nfinished; i++)
		if (finished[i]->op != NULL)
			run_for_pipeline(finished[i], lease_ahead);
}
/*
 * Whether this database's pg_tide catalog is the version the library was
 * built for (see src/catalog_version.c); needs a transaction. While it is
 * not, the worker delivers nothing and says why once: an older catalog
 * lacks what the library's statements use until ALTER EXTENSION pg_tide
 * UPDATE, a newer one needs the newer library.
 */
static bool
catalog_is_current(void)
{
	static char reported[NAMEDATALEN] = "";
	char	   *installed = TideInstalledVersion();
	int			cmp;

	if (installed == NULL)
		return false;
	cmp = TideCompareVersions(installed, TIDE_CATALOG_VERSION);
	if (cmp == 0)
	{
		if (reported[0] != '\0')
			ereport(LOG,
					(errmsg("pg_tide relay worker for database \"%s\" delivers again: its catalog is version %s",
							get_database_name(MyDatabaseId), installed)));
		reported[0] = '\0';
		return true;
	}
	if (strcmp(reported, installed) != 0)
	{
		strlcpy(reported, installed, sizeof(reported));
		ereport(LOG,
				(errmsg("pg_tide relay worker for database \"%s\" waits: its pg_tide catalog is version %s, the library's is %s",
						get_database_name(MyDatabaseId), installed, TIDE_CATALOG_VERSION),
				 cmp < 0 ?
				 errhint("Run ALTER EXTENSION pg_tide UPDATE in that database; nothing is delivered until then.") :
				 errhint("Install pg_tide %s (or later) and restart the server; nothing is delivered until then.",
						 installed)));
	}
	return false;
}

/*
 * Whether the reading pipeline `name` is served with (or takes after its
 * batch in flight) has config md5 `md5`, so that the pipelines' reading
 * keeps it instead of parsing and opening it again (pipelines.c). One
 * whose sink read secrets is read again: a secret may have changed.
 */
static bool
reading_is_current(const char *name, const char *md5)
{
	PipelineState *st;
	const RelayPipeline *p;

	if (pipeline_states == NULL)
		return false;
	st = hash_search(pipeline_states, &name, HASH_FIND, NULL);
	if (st == NULL)
		return false;
	p = st->next_p != NULL ? st->next_p : st->p;
	return p != NULL && !p->reads_secrets && strcmp(p->config_md5, md5) == 0;
}

/*
 * Reads the pipelines in a short transaction (nothing while the catalog is
 * not the library's version) and serves each with its new reading: one
 * with a batch in flight takes it once the batch is done, one no longer
 * listed is let go of. Every pipeline then looks for messages, as after a
 * commit. Returns false when pg_tide is no longer installed in this
 * database. Not inlined into the PG_TRY of RelayWorkerMain, where its
 * locals could be clobbered by the longjmp of an ERROR.
 */
pg_noinline static bool
read_pipelines(void)
{
	bool		installed;
	bool		current;
	List	   *pipelines = NIL;
	List	   *kept = NIL;
	ListCell   *lc;
	HASH_SEQ_STATUS seq;
	PipelineState *st;

	bool		asked;

	reading_needed = false;
	next_reading_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), RelayNaptimeMs);
	asked = pg_atomic_read_u64(&Relay->wake_requests) != seen_wake_requests;
	seen_wake_requests = pg_atomic_read_u64(&Relay->wake_requests);

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "pg_tide relay: looking for work");

	installed = OidIsValid(get_extension_oid("pg_tide", true));
	if (installed && !my_slot->serving)
	{
		SpinLockAcquire(&Relay->mutex);
		my_slot->serving = true;
		SpinLockRelease(&Relay->mutex);
	}
	has_work = false;
	/* while a restore loads the database, the worker writes nothing there (restore.c) */
	current = installed && catalog_is_current() && !RelayRestoreInProgress();
	if (current)
	{
		pipelines = RelayReadPipelines(loop_cxt, &has_work,
									   forgot_earlier_states && !reopen_readings ? reading_is_current : NULL,
									   &kept);
		reopen_readings = false;
	}
	/*
	 * Give up the pipelines now served elsewhere (ownership.c), but not one
	 * whose batch is still in flight: it goes at a reading after its record.
	 */
	if (pipeline_states != NULL)
	{
		hash_seq_init(&seq, pipeline_states);
		while ((st = hash_seq_search(&seq)) != NULL)
			if (st->op != NULL)
				RelayKeepPipeline(st->name);
	}
	RelayReleaseUnservedPipelines();

	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	MemoryContextSwitchTo(loop_cxt);

	/* This worker holds nothing yet: an earlier one's holds are over (pipeline_state.c). */
	if (current && !forgot_earlier_states)
		forgot_earlier_states = RelayForgetPipelineStates(pipelines);

	if (pipeline_states != NULL)
	{
		hash_seq_init(&seq, pipeline_states);
		while ((st = hash_seq_search(&seq)) != NULL)
			st->listed = false;
	}
	/* an unchanged pipeline keeps the reading it is served with */
	foreach(lc, kept)
		pipeline_state(lfirst(lc))->listed = true;
	foreach(lc, pipelines)
	{
		RelayPipeline *p = lfirst(lc);

		st = pipeline_state(p->name);
		st->listed = true;
		MemoryContextSetParent(p->cxt, engine_cxt);
		if (st->op != NULL)
		{
			release_pipeline(st->next_p);
			st->next_p = p;
		}
		else
			take_reading(st, p);
	}
	if (pipeline_states != NULL)
	{
		hash_seq_init(&seq, pipeline_states);
		while ((st = hash_seq_search(&seq)) != NULL)
		{
			/* SQL changed pipelines or queued retries: every queue is looked at */
			if (asked)
				st->retry_check_at = 0;
			st->look = true;
			if (!st->listed && st->op == NULL)
			{
				release_pipeline(st->p);
				st->p = NULL;
				/* what the log said of it must not go on forever (log_repeat.c) */
				log_hold_over(st, "this worker no longer serves it (disabled, deleted or moved)");
				log_errors_over(st, "this worker no longer serves it (disabled, deleted or moved)");
			}
		}
	}
	MemoryContextReset(loop_cxt);
	scan_needed = true;

	if (current)
	{
		RelayTrimAttemptLog();
		RelaySweepOutboxes();
		MemoryContextSwitchTo(loop_cxt);
	}
	return installed;
}

/* SIGINT: a cancel (pg_cancel_backend), which the loop handles (see the top of this file). */
static void
worker_cancel_handler(SIGNAL_ARGS)
{
	int			save_errno = errno;

	cancel_pending = true;
	SetLatch(MyLatch);
	errno = save_errno;
}

/* Milliseconds from now until t, rounded up; 0 once passed. */
static long
ms_until(TimestampTz now, TimestampTz t)
{
	return t <= now ? 0 : (long) Min((t - now + 999) / 1000, (TimestampTz) INT_MAX);
}

/*
 * How long the loop may sleep: until the earliest of the next reading
 * (the naptime), the sinks' timers, each batch's wake_at and the
 * pipelines' holds, retries and pacing; not at all when something is to
 * be done now.
 */
static long
sleep_ms(void)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz until = next_reading_at;
	TimestampTz t;
	dlist_iter	iter;

	if (scan_needed || reading_needed || cancel_pending)
		return 0;
	if (earliest_due != 0 && earliest_due < until)
		until = earliest_due;
	t = RelayTimersEarliest();
	if (t != 0 && t < until)
		until = t;
	dlist_foreach(iter, &operations)
	{
		Operation  *op = dlist_container(Operation, node, iter.cur);

		if (op->batch.ready)
			return 0;
		if (op->batch.wake_at != 0 && op->batch.wake_at < until)
			until = op->batch.wake_at;
	}
	return ms_until(now, until);
}

/*
 * The worker's wait: its latch, the postmaster's death and the epoll
 * descriptor that holds every sink's sockets (events.c), in one set made
 * once.
 */
static WaitEventSet *
make_wait_set(void)
{
	WaitEventSet *set = TideCreateLongLivedWaitEventSet(3);

	AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
	AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
	if (RelayEventsFd() < 0)
		ereport(ERROR,
				(errcode_for_socket_access(),
				 errmsg("could not create an epoll descriptor for the relay worker: %m")));
	AddWaitEventToSet(set, WL_SOCKET_READABLE, RelayEventsFd(), NULL, NULL);
	return set;
}

/*
 * One turn of the loop (see the top of this file). Not inlined into the
 * PG_TRY of RelayWorkerMain, where its locals could be clobbered by the
 * longjmp of an ERROR.
 */
pg_noinline static void
loop_once(WaitEventSet *set, ConditionVariable *cv)
{
	WaitEvent	events[3];
	int			nevents;
	uint64		commits;
	long		timeout;
	bool		busy;

	MemoryContextSwitchTo(loop_cxt);
	MemoryContextReset(loop_cxt);

	commits = WakeCommitCount(MyDatabaseId);
	if (commits != seen_commits)
	{
		/* a publishing commit: every pipeline looks for its messages */
		HASH_SEQ_STATUS seq;
		PipelineState *st;

		seen_commits = commits;
		if (has_work)
		{
			pg_atomic_fetch_add_u64(&my_slot->wakeups, 1);
			if (pipeline_states != NULL)
			{
				hash_seq_init(&seq, pipeline_states);
				while ((st = hash_seq_search(&seq)) != NULL)
					st->look = true;
			}
			scan_needed = true;
		}
	}

	CHECK_FOR_INTERRUPTS();
	RelayExitIfPostmasterDied();
	if (cancel_pending)
	{
		int			n;

		cancel_pending = false;
		n = abandon_operations();
		ereport(LOG,
				(errmsg("pg_tide relay worker for database %u was asked to cancel: %d batch%s in flight abandoned",
						MyDatabaseId, n, n == 1 ? "" : "es"),
				 errdetail("Nothing of them was recorded; they are leased and delivered again at once. The worker goes on."),
				 errhint("pg_terminate_backend() stops the worker; the launcher starts another.")));
	}
	if (worker_should_stop())
	{
		/* stopped while batches were in flight: nothing is recorded, the lease sends them again */
		abandon_operations();
		worker_leave(RELAY_EXIT_STOPPED, stop_reason);
	}
	if (RelayWorkerRetired())
	{
		if (n_operations == 0)
			worker_leave(RELAY_EXIT_STOPPED, "retired: relay_workers_per_database lowered, or its slot needed");
		retiring = true;
	}
	/* After a reload: the database's and role's settings again (worker_settings.c). */
	RelayApplyDatabaseSettings();
	if (pg_atomic_read_u64(&Relay->wake_requests) != seen_wake_requests)
		reading_needed = true;
	if ((reading_needed || GetCurrentTimestamp() >= next_reading_at) && database_turn())
	{
		if (!read_pipelines())
		{
			abandon_operations();
			worker_leave(RELAY_EXIT_NO_EXTENSION, "pg_tide is not installed");
		}
		/* no enabled pipeline: the periodic jobs are done, the slot is given back (on_demand.c) */
		if (RelayLeaveWhenIdle(my_slot, has_work, n_operations))
			worker_leave(RELAY_EXIT_IDLE, "no enabled pipeline");
	}
	if ((scan_needed || (earliest_due != 0 && GetCurrentTimestamp() >= earliest_due)) &&
		database_turn())
		scan_pipelines();
	progress_operations();
	/* the turn's SQL is done: a DROP EXTENSION waiting for it goes on */
	busy = RelayUnlockExtension();

	/* (the short transactions of the turn reported their own activity) */
	if (n_operations > 0)
		pgstat_report_activity(STATE_RUNNING, "pg_tide relay: delivering a batch");
	else
		pgstat_report_activity(STATE_IDLE, NULL);
	timeout = sleep_ms();
	/* what a DROP EXTENSION kept from this turn is tried again shortly, not at once */
	if (busy && timeout < RELAY_EXTENSION_BUSY_WAIT_MS)
		timeout = RELAY_EXTENSION_BUSY_WAIT_MS;
	/* a burst's freed memory goes back to the kernel once idle (worker_memory.c) */
	RelayReturnMemoryWhenIdle(n_operations, &timeout);

	/*
	 * On the wait list right before the wait, and the commit count read
	 * after joining it, so no commit is missed: one from now on sets the
	 * latch, one before shows in the count. Not earlier in the turn: any
	 * ConditionVariableBroadcast this process makes (PostgreSQL's own, at
	 * the end of a buffer's I/O, say) takes it off every wait list.
	 */
	if (has_work)
	{
		ConditionVariablePrepareToSleep(cv);
		if (WakeCommitCount(MyDatabaseId) != seen_commits)
			timeout = 0;
	}
	else
		ConditionVariableCancelSleep();
	nevents = WaitEventSetWait(set, timeout, events, lengthof(events), PG_WAIT_EXTENSION);
	for (int i = 0; i < nevents; i++)
	{
		if (events[i].events & WL_LATCH_SET)
			ResetLatch(MyLatch);
		if (events[i].events & WL_SOCKET_READABLE)
			RelayEventsDispatch();
	}
	RelayTimersFire(GetCurrentTimestamp());
}

/* Entry point of a relay worker; main_arg is its slot number. */
void
RelayWorkerMain(Datum main_arg)
{
	int			slotno = DatumGetInt32(main_arg);
	uint32		generation;
	Oid			dboid = InvalidOid;
	bool		mine = false;
	ConditionVariable *cv;
	WaitEventSet *set;

	/* Only this process may consume from the pipelines' groups (src/outbox_rights.c). */
	TideInRelayWorker = true;
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	pqsignal(SIGINT, worker_cancel_handler);
	BackgroundWorkerUnblockSignals();
	RelayKeepFreedMemory();

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
		my_slot->latch = MyLatch;
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
	/* Before any SQL: the database's settings must not steer the worker. */
	RelayPinSessionSettings();

	SpinLockAcquire(&Relay->mutex);
	my_slot->started_at = GetCurrentTimestamp();
	SpinLockRelease(&Relay->mutex);

	loop_cxt = AllocSetContextCreate(TopMemoryContext, "pg_tide relay worker loop",
									 ALLOCSET_DEFAULT_SIZES);
	engine_cxt = AllocSetContextCreate(TopMemoryContext, "pg_tide relay engine",
									   ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(loop_cxt);
	cv = WakeConditionVariable(MyDatabaseId);
	set = make_wait_set();
	seen_commits = WakeCommitCount(MyDatabaseId);

	for (;;)
	{
		bool		failed = false;

		PG_TRY();
		{
			loop_once(set, cv);
		}
		PG_CATCH();
		{
			/* before anything frees the memory the sinks point into */
			abandon_operations();
			MemoryContextSwitchTo(loop_cxt);
			EmitErrorReport();
			FlushErrorState();
			AbortCurrentTransaction();
			RelayExtensionLockAborted();
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
	}
}
