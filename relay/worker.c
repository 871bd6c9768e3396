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
 *	  longer installed (DROP EXTENSION). The first two are decided by
 *	  RelayWorkerShouldStop, which a sink also asks while it waits on a
 *	  batch: it then abandons the batch, nothing of it is recorded, and the
 *	  worker leaves at once (the batch's lease makes the next worker deliver
 *	  it again).
 * 4. The pass itself: read the enabled pipelines in one short transaction
 *	  (pipelines.c),
 *	  then for each: lease a batch (short transaction, lease.c), deliver it
 *	  with no transaction open (sink.h), record it (short transaction), up to
 *	  RELAY_MAX_BATCHES_PER_PASS batches while batches come back full. An
 *	  ERROR in one pipeline is logged, that pipeline is held (1 s, doubling
 *	  up to a minute while the errors go on) and the others go on. It holds no
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
#include "nodes/pg_list.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "common/pg_prng.h"

#include "compat.h"
#include "pg_tide.h"
#include "events.h"
#include "relay.h"

/* Longest single sleep, so SIGHUP and pauses are noticed within it. */
#define RELAY_SLEEP_SLICE_MS 250
/*
 * How long a pipeline whose turn ended with an ERROR is passed over: from
 * the first, doubling with each such turn in a row, up to the last.
 */
#define RELAY_ERROR_HOLD_MIN_MS 1000
#define RELAY_ERROR_HOLD_MAX_MS 60000

static RelayWorkerSlot *my_slot = NULL;
static RelayExitReason my_exit_reason = RELAY_EXIT_STOPPED;
/* Why RelayWorkerShouldStop last said the worker must stop. */
static const char *stop_reason = "asked to stop";

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
 * Whether this worker must stop now: the relay is switched off (a pending
 * reload is taken first, so that a worker waiting on a batch sees it) or a
 * command needs the database to itself (a pause, see launcher.c). The one
 * place that decides it, for the worker loop and for a sink waiting on a
 * batch (which then abandons it, see RelayDeliveryResult.abandoned); the
 * reason is kept for worker_leave. Runs no SQL; outside a relay worker it
 * always says no.
 */
static bool
worker_should_stop(void)
{
	if (my_slot == NULL)
		return false;
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
	}
	if (!RelayEnabled)
		stop_reason = "pg_tide.relay_enabled is off";
	else if (RelayDatabasePaused(MyDatabaseId, GetCurrentTimestamp()))
		stop_reason = "a command needs the database to itself";
	else
		return false;
	return true;
}

/*
 * A pipeline's state in the worker's memory: whether it is held (its
 * destination failing, or with ordering 'strict' a message failing) and
 * until when, and when its retry queue is next looked at. Lost when the
 * worker restarts, which only means an early attempt: what must survive a
 * crash (the retry queue, the dead letters, the offset) is in tables.
 */
typedef struct PipelineState
{
	char	   *name;
	char		config_md5[33]; /* the config the state was reached with */
	TimestampTz held_until;		/* 0: not held */
	int			holds;			/* failed attempts in a row while held */
	int64		held_at;		/* the message it is held at */
	int			errors;			/* turns in a row that ended with an ERROR */
	TimestampTz retry_check_at; /* DT_NOEND: the queue is empty */
	RelayPacing pacing;			/* rate limit and circuit breaker */
} PipelineState;

#define RELAY_MAX_PIPELINE_STATES 256

static PipelineState pipeline_states[RELAY_MAX_PIPELINE_STATES];
static int	n_pipeline_states = 0;

/* When the worker must wake for a held pipeline or a due retry, or 0. */
static TimestampTz earliest_due = 0;

/* Relay->wake_requests when a pass began: SQL changed pipelines or queues. */
static uint64 seen_wake_requests = 0;

/* Notes a time the worker must wake at for a pipeline. */
static void
wake_at(TimestampTz t)
{
	if (t != 0 && t != DT_NOEND && (earliest_due == 0 || t < earliest_due))
		earliest_due = t;
}

/* The state of a pipeline, created when missing. */
static PipelineState *
pipeline_state(const RelayPipeline *p)
{
	PipelineState *st = NULL;
	int			i;

	for (i = 0; i < n_pipeline_states && st == NULL; i++)
		if (strcmp(pipeline_states[i].name, p->name) == 0)
			st = &pipeline_states[i];
	if (st == NULL)
	{
		if (n_pipeline_states == RELAY_MAX_PIPELINE_STATES)
		{
			/* Forget the first; it is only looked at again a little early. */
			pfree(pipeline_states[0].name);
			pipeline_states[0] = pipeline_states[--n_pipeline_states];
		}
		st = &pipeline_states[n_pipeline_states++];
		st->name = MemoryContextStrdup(TopMemoryContext, p->name);
		st->config_md5[0] = '\0';
	}
	/* A new or changed config (a fixed URL, say) is tried at once. */
	if (strcmp(st->config_md5, p->config_md5) != 0)
	{
		strlcpy(st->config_md5, p->config_md5, sizeof(st->config_md5));
		st->held_until = 0;
		st->holds = 0;
		st->errors = 0;
		st->retry_check_at = 0;
		memset(&st->pacing, 0, sizeof(st->pacing));
	}
	return st;
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

	st->holds++;
	st->held_at = m->id;
	delay = at_cap ? p->retry_cap_ms : retry_delay_ms(p, st->holds, o->wait_ms);
	/* No delay (a file sink): the next pass, after the usual naptime, retries. */
	st->held_until = delay > 0 ? TimestampTzPlusMilliseconds(GetCurrentTimestamp(), delay) : 0;
	ereport(LOG,
			(errmsg("pg_tide relay pipeline \"%s\" is held at message " INT64_FORMAT ": %s",
					p->name, m->id, o->error),
			 p->strict ?
			 errdetail("Ordering is strict: no message after it is delivered before it; attempt %d.",
					   st->holds) :
			 errdetail("The destination failed (%s), not the message; attempt %d in a row. Nothing is dead-lettered for it.",
					   o->error_class, st->holds),
			 errhint("The pipeline tries again in %ld ms.", delay)));
}

/*
 * Delivers a batch through the pipeline's sink (sink.h) and waits until it
 * is finished: on the sink's descriptors (events.c), its timers and the
 * batch's wake_at, the latch and the postmaster's death. When the worker
 * must stop meanwhile, the batch is cancelled, nothing of it is recorded,
 * and the worker leaves (the lease sends it again).
 */
static void
sink_deliver(const RelayPipeline *p, const RelayMessage *msgs, int n, RelayDeliveryResult *r)
{
	RelaySinkBatch batch;

	memset(&batch, 0, sizeof(batch));
	batch.msgs = msgs;
	batch.nmsgs = n;
	batch.stop_at_failure = p->strict;
	batch.cxt = CurrentMemoryContext;
	memset(r, 0, sizeof(*r));
	r->each = palloc0(sizeof(RelayMessageOutcome) * Max(n, 1));
	for (int i = 0; i < n; i++)
		r->each[i].wait_ms = -1;
	p->sink->start(p->sink_state, &batch);
	/* progress is due once right after start */
	batch.ready = true;
	for (;;)
	{
		TimestampTz now = GetCurrentTimestamp();
		TimestampTz until;
		long		timeout;
		int			events;

		if (batch.ready || (batch.wake_at != 0 && batch.wake_at <= now))
		{
			batch.ready = false;
			batch.wake_at = 0;
			if (p->sink->progress(p->sink_state, &batch))
				break;
			continue;
		}
		until = RelayTimersEarliest();
		if (batch.wake_at != 0 && (until == 0 || batch.wake_at < until))
			until = batch.wake_at;
		timeout = until == 0 ? 1000 : Max(0, (long) ((until - now + 999) / 1000));
		events = WaitLatchOrSocket(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH |
								   (RelayEventsFd() >= 0 ? WL_SOCKET_READABLE : 0),
								   RelayEventsFd(), timeout, PG_WAIT_EXTENSION);
		if (events & WL_LATCH_SET)
			ResetLatch(MyLatch);
		if (events & WL_SOCKET_READABLE)
			RelayEventsDispatch();
		RelayTimersFire(GetCurrentTimestamp());
		if (worker_should_stop() || ProcDiePending)
		{
			p->sink->cancel(p->sink_state, &batch);
			CHECK_FOR_INTERRUPTS();
			worker_leave(RELAY_EXIT_STOPPED, stop_reason);
		}
	}
	p->sink->outcomes(p->sink_state, &batch, r);
	r->delivered = r->acked = 0;
	for (int i = 0; i < n; i++)
		if (r->each[i].outcome == RELAY_DELIVERED)
		{
			r->delivered++;
			if (r->acked == i)
				r->acked++;
		}
}

/*
 * Delivers the messages of a batch that the pipeline's routing lets pass
 * (live batches only: a message queued for retry or by an operator was
 * chosen already) and marks the others RELAY_FILTERED, as if passed over
 * and acknowledged; *filtered counts them.
 */
static void
deliver_routed(const RelayPipeline *p, const RelayMessage *msgs, int n, bool from_queue,
			   RelayDeliveryResult *r, int *filtered)
{
	RelayDeliveryResult sub;
	RelayMessage *pass;
	int		   *pos;
	int			npass = 0;
	int			i;

	*filtered = 0;
	if (from_queue || p->routing == NULL)
	{
		sink_deliver(p, msgs, n, r);
		return;
	}
	pass = palloc(sizeof(RelayMessage) * n);
	pos = palloc(sizeof(int) * n);
	for (i = 0; i < n; i++)
	{
		pos[i] = -1;
		if (RelayRoutingMatches(p->routing, msgs[i].payload, msgs[i].headers))
		{
			pos[i] = npass;
			pass[npass++] = msgs[i];
		}
	}
	*filtered = n - npass;
	memset(&sub, 0, sizeof(sub));
	if (npass > 0)
		sink_deliver(p, pass, npass, &sub);
	memset(r, 0, sizeof(*r));
	r->each = palloc0(sizeof(RelayMessageOutcome) * n);
	r->disable = sub.disable;
	strlcpy(r->disable_reason, sub.disable_reason, sizeof(r->disable_reason));
	for (i = 0; i < n; i++)
	{
		if (pos[i] >= 0)
			r->each[i] = sub.each[pos[i]];
		else
			r->each[i].outcome = RELAY_FILTERED;
		if (r->each[i].outcome == RELAY_DELIVERED)
			r->delivered++;
		if (r->acked == i && (r->each[i].outcome == RELAY_DELIVERED ||
							  r->each[i].outcome == RELAY_FILTERED))
			r->acked++;
	}
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
 * Delivers a batch (live from the lease, or from the retry queue) and
 * records what became of each message, in one transaction:
 *
 * - Live, default ordering: the offset moves over every message whose fate
 *	 is known (delivered, or failed by its own answer), and the failed ones
 *	 are queued for retry (or dead-lettered: a permanent failure, or the
 *	 last of max_attempts), so one failing message holds back no other. A
 *	 destination failure stops the offset there and holds the pipeline.
 * - Live, ordering 'strict': the offset moves over the delivered prefix and
 *	 the pipeline is held at the first failure.
 * - From the retry queue: delivered messages leave it, failed ones are
 *	 scheduled again or dead-lettered, the others stay as they were.
 * - 410 Gone records what was delivered and disables the pipeline.
 */
static BatchEnd
deliver_batch(const RelayPipeline *p, PipelineState *st, RelayMessage *msgs, int n,
			  bool from_queue, MemoryContext cxt)
{
	RelayDeliveryResult r;
	RelaySettlement s;
	int			settled;
	int			i;
	int			ndead = 0;
	int			nqueued = 0;
	int			nsucceeded = 0;
	int			nfailed = 0;
	long		first_delay = -1;

	memset(&s, 0, sizeof(s));
	s.sent_at = GetCurrentTimestamp();
	pgstat_report_activity(STATE_RUNNING, "pg_tide relay: delivering a batch");
	deliver_routed(p, msgs, n, from_queue, &r, &s.filtered);
	pgstat_report_activity(STATE_IDLE, NULL);
	clean_outcomes(&r, n);

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
	RelayPacingAfterBatch(p, &st->pacing, nsucceeded + nfailed, nfailed, nsucceeded);
	s.breaker = RelayBreakerStateName(p, &st->pacing);

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
				!message_failed(r.each[settled].outcome))
				break;

	for (i = 0; i < settled; i++)
	{
		const RelayMessageOutcome *o = &r.each[i];

		if (o->outcome == RELAY_DELIVERED)
			s.disp[i] = from_queue ? RELAY_DONE : RELAY_KEEP;
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
	RelayRecord(p, &s, cxt);

	/*
	 * A queued message left as it was (not sent, or its destination failed)
	 * is still due: look at the queue again on the next turn (after the
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
			if (s.disp[i] == RELAY_DEAD)
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
		st->held_until = 0;
		st->holds = 0;
		return BATCH_HELD;
	}

	/* Live: the first message not settled holds the pipeline. */
	if (!from_queue && settled < n)
	{
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
	st->held_until = 0;
	st->holds = 0;
	/* An open breaker ends the pipeline's turn (pacing.c). */
	if (st->pacing.breaker == RELAY_BREAKER_OPEN)
		return BATCH_HELD;
	return n == p->batch_size ? BATCH_FULL : BATCH_DONE;
}

/*
 * Delivers a pipeline's messages due for another attempt, one batch, if
 * its retry queue may hold any by now. Returns how the batch ended.
 */
static BatchEnd
deliver_retries(const RelayPipeline *p, PipelineState *st, MemoryContext cxt)
{
	RelayMessage *msgs;
	TimestampTz next_due;
	TimestampTz wake;
	int			limit;
	int			n;

	if (st->retry_check_at > GetCurrentTimestamp())
		return BATCH_DONE;
	limit = RelayPacingAllowance(p, &st->pacing, p->batch_size, &wake);
	if (limit == 0)
	{
		wake_at(wake);
		return BATCH_HELD;
	}
	n = RelayTakeRetries(p, limit, cxt, &msgs, &next_due);
	/* Empty: looked at again when the worker queues one, or SQL asks. */
	st->retry_check_at = next_due != 0 ? next_due : DT_NOEND;
	if (n == 0)
		return BATCH_DONE;
	if (n == limit)
		st->retry_check_at = 0;
	return deliver_batch(p, st, msgs, n, true, cxt);
}

/*
 * A pipeline's turn: the messages due for another attempt, then live
 * batches, each leased, delivered with no transaction open and recorded;
 * at most RELAY_MAX_BATCHES_PER_PASS live batches, so other pipelines get
 * their turn. A held pipeline is passed over until its hold ends. Returns
 * true when the pipeline has more to deliver at once.
 */
static bool
deliver_pipeline(const RelayPipeline *p, MemoryContext cxt)
{
	PipelineState *st = pipeline_state(p);
	BatchEnd	end;
	int			batch;
	bool		more;

	if (st->held_until > GetCurrentTimestamp())
	{
		wake_at(st->held_until);
		return false;
	}

	end = deliver_retries(p, st, cxt);
	more = (end == BATCH_FULL);
	for (batch = 0; end != BATCH_HELD && batch < RELAY_MAX_BATCHES_PER_PASS; batch++)
	{
		RelayMessage *msgs;
		TimestampTz wake;
		int			limit;
		int			n;

		CHECK_FOR_INTERRUPTS();
		RelayExitIfPostmasterDied();
		/* A backlog does not keep a stopped worker: it leaves between batches. */
		if (worker_should_stop())
			worker_leave(RELAY_EXIT_STOPPED, stop_reason);
		limit = RelayPacingAllowance(p, &st->pacing, p->batch_size, &wake);
		if (limit == 0)
		{
			wake_at(wake);
			end = BATCH_HELD;
			break;
		}
		n = RelayLeaseBatch(p, limit, cxt, &msgs);
		if (n == 0)
			break;
		end = deliver_batch(p, st, msgs, n, false, cxt);
		/* A short lease: nothing more waits (unless the rate cut it short). */
		if (end == BATCH_HELD || n < limit)
			break;
		if (batch == RELAY_MAX_BATCHES_PER_PASS - 1)
			more = true;
	}
	if (end == BATCH_HELD)
		more = false;
	/* The turn ended without an ERROR: whatever failed before works again. */
	st->errors = 0;
	wake_at(st->held_until);
	wake_at(st->retry_check_at);
	return more;
}

/*
 * Holds a pipeline whose turn ended with an ERROR (a full disk, its outbox
 * dropped, its lease lost): without a hold, a batch delivered but not
 * recorded would be delivered again on every pass, and the error logged
 * each time, for as long as the cause lasts. Returns the hold in ms.
 */
static long
hold_after_error(const RelayPipeline *p)
{
	PipelineState *st = pipeline_state(p);
	long		delay = RELAY_ERROR_HOLD_MIN_MS;
	int			i;

	st->errors++;
	for (i = 1; i < st->errors && delay < RELAY_ERROR_HOLD_MAX_MS; i++)
		delay *= 2;
	delay = Min(delay, RELAY_ERROR_HOLD_MAX_MS);
	st->held_until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), delay);
	wake_at(st->held_until);
	return delay;
}

/*
 * Runs every pipeline's turn; an ERROR in one (its outbox dropped, its
 * lease lost, a full disk) is logged, the pipeline is held for a while
 * (hold_after_error) and the others go on. Returns true when a pipeline
 * has more to deliver at once.
 */
static bool
deliver_pipelines(List *pipelines, MemoryContext loop_cxt)
{
	ListCell   *lc;
	volatile bool more = false;

	earliest_due = 0;
	/* SQL changed pipelines or queued retries: every queue is looked at. */
	if (pg_atomic_read_u64(&Relay->wake_requests) != seen_wake_requests)
	{
		seen_wake_requests = pg_atomic_read_u64(&Relay->wake_requests);
		for (int i = 0; i < n_pipeline_states; i++)
			pipeline_states[i].retry_check_at = 0;
	}
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
			long		delay;

			MemoryContextSwitchTo(loop_cxt);
			edata = CopyErrorData();
			FlushErrorState();
			AbortCurrentTransaction();
			delay = hold_after_error(p);
			ereport(LOG,
					(errmsg("pg_tide relay pipeline \"%s\" stopped this pass after an error: %s",
							p->name, edata->message),
					 errdetail("The pipeline is tried again in %ld ms (error %d in a row). Messages it sent but could not record are sent again then.",
							   delay, pipeline_state(p)->errors)));
			FreeErrorData(edata);
		}
		PG_END_TRY();
		MemoryContextSwitchTo(loop_cxt);
		MemoryContextDelete(batch_cxt);
	}
	return more;
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
 * One pass: reads the pipelines in a short transaction, then gives each its
 * turn (see deliver_pipelines); nothing while the catalog is not the
 * library's version. Returns false when pg_tide is no longer installed in
 * this database. Sets *has_work when an enabled pipeline exists: only then
 * do publishing commits wake the worker; and *more when a pipeline has more
 * to deliver at once, so the worker does not sleep. Not inlined into the
 * PG_TRY of RelayWorkerMain, where its locals could be clobbered by the
 * longjmp of an ERROR.
 */
pg_noinline static bool
worker_pass(MemoryContext loop_cxt, bool *has_work, bool *more)
{
	bool		installed;
	bool		current;
	List	   *pipelines = NIL;

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
	*has_work = false;
	current = installed && catalog_is_current();
	if (current)
		pipelines = RelayReadPipelines(loop_cxt, has_work);

	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	MemoryContextSwitchTo(loop_cxt);

	*more = deliver_pipelines(pipelines, loop_cxt);
	if (current)
	{
		RelayTrimAttemptLog();
		RelaySweepOutboxes();
	}
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
 * leaves the wait list and only naps, so commits cost it nothing. Either
 * way a changed pipeline or a queued retry ends the sleep within a slice.
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
		if (earliest_due != 0)
		{
			long		until_retry;

			TimestampDifference(GetCurrentTimestamp(), earliest_due, &secs, &usecs);
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
		/*
		 * The worker must stop (a reload is taken here: a new naptime counts
		 * from the next slice), or SQL changed a pipeline or queued retries
		 * (backend.c).
		 */
		if (worker_should_stop() ||
			pg_atomic_read_u64(&Relay->wake_requests) != seen_wake_requests)
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

	/* Only this process may consume from the pipelines' groups (src/outbox_rights.c). */
	TideInRelayWorker = true;
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
	/* Before any SQL: the database's settings must not steer the worker. */
	RelayPinSessionSettings();

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
		if (worker_should_stop())
			worker_leave(RELAY_EXIT_STOPPED, stop_reason);

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
