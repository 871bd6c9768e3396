/*
 * flow_forward.c
 *		The forward flow (flow.h): a pipeline of relay_outbox_config
 *		delivers its outbox's messages to its sink. Its policy: what a batch
 *		is (leased live, or taken from the retry queue), what becomes of each
 *		message after its delivery (settle_batch: the offset, retries, dead
 *		letters), when a pipeline is held (hold_pipeline), its retries'
 *		back-off (retry_delay_ms), its pacing (pace_batch) and the overlap of
 *		its batches (lease_ahead, may_start_ahead).
 *
 * Each pipeline has at most one batch in its sink, an operation of the
 * engine (engine.c): leased in a short transaction (lease.c), then
 * delivered by the pipeline's sink with no transaction open (sink.h), then
 * recorded in a short transaction of the engine's group.
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
 * may be stalled), k is recorded as it would be without the overlap and
 * k+1 is given back: its messages stay in the pipeline's lease, and the
 * pipeline's next lease hands them out again, after what k left
 * unrecorded. So the offsets still pass only messages recorded in the same
 * commit, in order.
 *
 * A pipeline's step (when it has no batch in flight and is neither held
 * nor paced): the messages due for another attempt first, else a live
 * batch when it is to look for one (after a commit, a reading, a full
 * batch, the end of a hold's time). The pipelines that would only look
 * for live messages look together first, in one statement
 * (skip_idle_pipelines, idle_look.c); those that found nothing take no
 * step.
 */
#include "postgres.h"

#include "common/pg_prng.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "events.h"
#include "flow.h"
#include "flow_errors.h"
#include "forward.h"
#include "relay_xact.h"

/*
 * The forward flow's state of a pipeline, kept across readings: its retry
 * queue's next due time, its rate limit and breaker, the message it is held
 * at. Lost when the worker restarts, which only means an early attempt:
 * the retry queue, the dead letters and the offset are in tables.
 */
typedef struct ForwardUnit
{
	int64		held_at;		/* the message it is held at */
	TimestampTz retry_check_at; /* DT_NOEND: the queue is empty */
	RelayPacing pacing;			/* rate limit and circuit breaker */
} ForwardUnit;

#define FW(u) ((ForwardUnit *) (u)->flow_private)

/*
 * A pipeline's batch in flight (RelayOperation.flow_private): it keeps the
 * reading of the pipeline it started with (p), and all its memory is in
 * the operation's cxt.
 */
typedef struct ForwardOp
{
	RelayPipeline *p;
	bool		in_sink;		/* started, and its outcomes not yet taken */
	RelaySinkBatch batch;		/* what the sink sees: the messages its routing passes */
	RelayMessage *msgs;			/* the batch as leased or taken from the queue */
	int		   *pos;			/* each message's index in batch.msgs; -1: filtered
								 * or parked (msgs[i].blocked) */
	int		   *after;			/* ordering 'key': the message each waits for, or
								 * -1 (ordering.c); NULL: another ordering */
	int			nblocked;		/* messages parked without being sent */
	int			limit;			/* what the pacing allowed when it was leased */
	bool		from_queue;
	TimestampTz sent_at;
	RelayDeliveryResult result; /* its outcomes, once finished (finish_operation) */
} ForwardOp;

#define FOP(op) ((ForwardOp *) (op)->flow_private)

/* The reading of its config a pipeline is served with, or NULL. */
static inline RelayPipeline *
unit_pipeline(RelayUnit *u)
{
	return u->reading != NULL ? (RelayPipeline *) u->reading->state : NULL;
}

/*
 * A new operation of a pipeline with its forward state; with `listed`,
 * the pipeline's batch in flight among the engine's operations.
 */
static RelayOperation *
forward_operation(RelayUnit *u, bool listed)
{
	RelayOperation *op = listed ? RelayNewOperation(u) : RelayMakeOperation(u);
	ForwardOp  *fop = MemoryContextAllocZero(op->cxt, sizeof(ForwardOp));

	fop->p = unit_pipeline(u);
	op->flow_private = fop;
	/* the sink says on the batch when progress is due */
	op->ready = &fop->batch.ready;
	op->wake_at = &fop->batch.wake_at;
	return op;
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

/*
 * Whether a message was passed over without being sent: not for the
 * pipeline (its routing), or expired. Its fate is known, and it is no
 * attempt.
 */
static bool
passed_over(RelayOutcome o)
{
	return o == RELAY_FILTERED || o == RELAY_EXPIRED;
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
hold_pipeline(const RelayPipeline *p, RelayUnit *u, const RelayMessage *m,
			  const RelayMessageOutcome *o)
{
	bool		at_cap = o->outcome == RELAY_PERMANENT ||
		(p->strict && u->holds + 1 >= p->retry_max_attempts);
	long		delay;
	int64		unlogged;
	RelayRepeatLine line;

	u->holds++;
	FW(u)->held_at = m->id;
	delay = at_cap ? p->retry_cap_ms : retry_delay_ms(p, u->holds, o->wait_ms);
	/* No delay (a file sink): the next look (a commit, the naptime) retries. */
	u->held_until = delay > 0 ? TimestampTzPlusMilliseconds(GetCurrentTimestamp(), delay) : 0;
	/* once when it begins, then at most once a minute (log_repeat.c) */
	line = RelayRepeatNote(&u->held_log, &unlogged);
	if (line == RELAY_REPEAT_FIRST)
		ereport(LOG,
				(errmsg("pg_tide relay pipeline \"%s\" is held at message " INT64_FORMAT ": %s",
						p->name, m->id, o->error),
				 p->strict ?
				 errdetail("Ordering is strict: no message after it is delivered before it; attempt %d.",
						   u->holds) :
				 errdetail("The destination failed (%s), not the message; attempt %d in a row. Nothing is dead-lettered for it.",
						   o->error_class, u->holds),
				 errhint("The pipeline tries again in %ld ms. Until the hold ends, this is logged at most once a minute.",
						 delay)));
	else if (line == RELAY_REPEAT_AGAIN)
		ereport(LOG,
				(errmsg("pg_tide relay pipeline \"%s\" is still held at message " INT64_FORMAT ": %s",
						p->name, m->id, o->error),
				 errdetail(INT64_FORMAT " more failed attempt%s since the last line; " INT64_FORMAT " since the hold began at %s.",
						   unlogged, unlogged == 1 ? "" : "s", u->held_log.times,
						   timestamptz_to_str(u->held_log.since)),
				 errhint("The pipeline tries again in %ld ms.", delay)));
	/* For relay_pipeline_status (pipeline_state.c). */
	RelayRecordHold(p, m, o, u->held_until, u->holds, &u->record_log);
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
pace_batch(const RelayPipeline *p, RelayUnit *u, const RelayDeliveryResult *r, int n)
{
	int			nsucceeded = 0;
	int			nfailed = 0;

	for (int i = 0; i < n; i++)
		if (r->each[i].outcome == RELAY_DELIVERED)
			nsucceeded++;
		else if (r->each[i].outcome != RELAY_NOT_SENT && !passed_over(r->each[i].outcome))
			nfailed++;
	RelayPacingAfterBatch(p, &FW(u)->pacing, nsucceeded + nfailed, nfailed, nsucceeded);
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
settle_batch(const RelayPipeline *p, RelayUnit *u, const RelayMessage *msgs, int n,
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
		if (r.each[i].outcome != RELAY_NOT_SENT && !passed_over(r.each[i].outcome))
		{
			s.attempt_no[i] = msgs[i].attempts + 1 +
				(!from_queue && u->holds > 0 && msgs[i].id == FW(u)->held_at ? u->holds : 0);
			if (r.each[i].outcome == RELAY_DELIVERED)
				nsucceeded++;
			else
				nfailed++;
		}
	/* the batch moved the pacing already (pace_batch) */
	s.breaker = RelayBreakerStateName(p, &FW(u)->pacing);

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
				!passed_over(r.each[settled].outcome) &&
				!message_failed(r.each[settled].outcome) && !parked[settled])
				break;

	for (i = 0; i < settled; i++)
	{
		const RelayMessageOutcome *o = &r.each[i];

		if (o->outcome == RELAY_DELIVERED)
			s.disp[i] = from_queue ? RELAY_DONE : RELAY_KEEP;
		else if (o->outcome == RELAY_EXPIRED)
		{
			/* into the dead letters, out of the retry queue; no attempt made */
			s.disp[i] = RELAY_DEAD;
			s.reason[i] = "expired";
			s.attempts[i] = msgs[i].attempts;
		}
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
		FW(u)->retry_check_at = 0;

	/*
	 * A queued message left as it was (not sent, or its destination failed)
	 * is still due: look at the queue again at its next step (after the
	 * hold), or nothing would until another failure queues a message.
	 */
	for (i = 0; from_queue && i < n; i++)
		if (s.disp[i] == RELAY_KEEP)
			FW(u)->retry_check_at = 0;

	if (nqueued > 0)
	{
		TimestampTz due = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), first_delay);

		if (FW(u)->retry_check_at == DT_NOEND || due < FW(u)->retry_check_at)
			FW(u)->retry_check_at = due;
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
		RelayEndHold(u, "it is disabled");
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
			RelayEndHold(u, "its destination answers again");
			u->look = true;
			return BATCH_FULL;
		}
		hold_pipeline(p, u, &msgs[settled], &r.each[settled]);
		return BATCH_HELD;
	}
	/* From the queue: a destination failure left messages as they were. */
	for (i = 0; from_queue && i < n; i++)
		if (r.each[i].outcome == RELAY_UNREACHABLE)
		{
			hold_pipeline(p, u, &msgs[i], &r.each[i]);
			return BATCH_HELD;
		}
	RelayEndHold(u, "its destination answers again");
	/* An open breaker stops the pipeline until it turns half-open (pacing.c). */
	if (FW(u)->pacing.breaker == RELAY_BREAKER_OPEN)
		return BATCH_HELD;
	return n == p->batch_size ? BATCH_FULL : BATCH_DONE;
}

/*
 * Starts a batch as an operation in flight: the messages the pipeline's
 * routing lets pass (live batches only: a message queued for retry or by
 * an operator was chosen already) go to the sink; the others are passed
 * over, as if acknowledged (RELAY_FILTERED when recorded). An expired
 * message is not sent either, live or queued: it is dead-lettered when
 * recorded (RELAY_EXPIRED, error class "expired"). With ordering
 * 'key', a message whose key is blocked (ordering.c) is not sent either,
 * and is parked when recorded; the sink gets each message's dependency on
 * the previous one of its key that it sends (RelaySinkBatch.after).
 */
static void
start_operation(RelayUnit *u, RelayOperation *op, RelayMessage *msgs, int n, bool from_queue,
				int limit)
{
	ForwardOp  *fop = FOP(op);
	const RelayPipeline *p = unit_pipeline(u);
	RelayMessage *pass = palloc(sizeof(RelayMessage) * Max(n, 1));
	int			npass = 0;

	fop->msgs = msgs;
	op->n = n;
	fop->from_queue = from_queue;
	fop->limit = limit;
	fop->pos = palloc(sizeof(int) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		fop->pos[i] = -1;
		if (msgs[i].expired)
			msgs[i].blocked = false;	/* never sent, nor parked: dead-lettered */
		else if (!from_queue && p->routing != NULL &&
			!RelayRoutingMatches(p->routing, msgs[i].payload, msgs[i].headers))
			msgs[i].blocked = false;	/* not for this pipeline: passed over, never parked */
		else if (msgs[i].blocked)
			fop->nblocked++;
		else
		{
			fop->pos[i] = npass;
			pass[npass++] = msgs[i];
		}
	}
	fop->batch.msgs = pass;
	fop->batch.nmsgs = npass;
	fop->batch.stop_at_failure = p->strict;
	if (p->ordering_key != NULL)
	{
		bool	   *sent = palloc(sizeof(bool) * Max(n, 1));
		int		   *after = palloc(sizeof(int) * Max(npass, 1));

		/* each message waits for the previous one of its key that the sink sends */
		for (int i = 0; i < n; i++)
			sent[i] = fop->pos[i] >= 0;
		fop->after = palloc(sizeof(int) * Max(n, 1));
		RelayOrderingDependencies(msgs, n, sent, fop->after);
		for (int i = 0; i < n; i++)
			if (fop->pos[i] >= 0)
				after[fop->pos[i]] = fop->after[i] >= 0 ? fop->pos[fop->after[i]] : -1;
		fop->batch.after = after;
	}
	fop->batch.cxt = op->cxt;
	/* progress is due once right after start */
	fop->batch.ready = true;
	fop->sent_at = GetCurrentTimestamp();
	if (npass > 0)
	{
		fop->in_sink = true;
		p->sink->start(p->sink_state, &fop->batch);
	}
}

/*
 * Moves a batch on once, right after its start, so that its first sends
 * are out before the worker opens a transaction: its sink's progress, then
 * what the sinks asked to be done at once (a library's timer set to 0, a
 * socket ready to write), as the loop's wait would do next. A batch the
 * sink says is finished already is completed at the loop's next look at it.
 */
static void
kick_operation(RelayOperation *op)
{
	ForwardOp  *fop = FOP(op);

	fop->batch.ready = false;
	fop->batch.wake_at = 0;
	if (fop->batch.nmsgs == 0 || fop->p->sink->progress(fop->p->sink_state, &fop->batch))
	{
		op->finished = true;
		fop->batch.ready = true;
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
lease_ahead(RelayUnit *u)
{
	RelayOperation *op = u->op;
	const RelayPipeline *p = FOP(op)->p;
	RelayOperation *ahead;
	RelayMessage *msgs;
	TimestampTz wake;
	int			n;

	if (!p->overlap || FOP(op)->from_queue || p->strict || p->ordering_key != NULL ||
		op->n < p->batch_size || FOP(op)->limit < p->batch_size ||
		RelayEngineRetiring() || !u->listed || u->next_reading != NULL || u->ahead != NULL ||
		FW(u)->retry_check_at <= GetCurrentTimestamp())
		return;
	if (RelayPacingAllowance(p, &FW(u)->pacing, op->n + p->batch_size, &wake) < op->n + p->batch_size)
		return;
	ahead = forward_operation(u, false);
	/* from here on, an ERROR frees it with the pipeline's other batches */
	u->ahead = ahead;
	n = RelayLeaseAhead(p, FOP(op)->msgs[op->n - 1].id, p->batch_size, ahead->cxt, &msgs);
	MemoryContextSwitchTo(RelayLoopContext());
	if (n == 0)
	{
		u->ahead = NULL;
		RelayFreeOperation(ahead, false);
		return;
	}
	FOP(ahead)->msgs = msgs;
	ahead->n = n;
	FOP(ahead)->limit = p->batch_size;
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
may_start_ahead(RelayUnit *u, const RelayOperation *done, const RelayDeliveryResult *r,
				const RelayOperation *next)
{
	TimestampTz wake;

	if (r->disable || RelayEngineRetiring() || !u->listed || u->next_reading != NULL ||
		FW(u)->retry_check_at <= GetCurrentTimestamp())
		return false;
	for (int i = 0; i < done->n; i++)
		if (r->each[i].outcome != RELAY_DELIVERED && !passed_over(r->each[i].outcome) &&
			!failed_by_answer(&r->each[i]))
			return false;
	return RelayPacingAllowance(FOP(done)->p, &FW(u)->pacing, next->n, &wake) >= next->n;
}

/*
 * Takes a finished batch's outcomes out of its sink into the operation's
 * memory, for the whole batch (filtered and parked messages included), its
 * texts made storable; the sink then holds nothing of it.
 */
static void
take_outcomes(RelayOperation *op, RelayDeliveryResult *r)
{
	ForwardOp  *fop = FOP(op);
	const RelayPipeline *p = fop->p;
	RelayDeliveryResult sub;

	MemoryContextSwitchTo(op->cxt);
	memset(&sub, 0, sizeof(sub));
	sub.each = palloc0(sizeof(RelayMessageOutcome) * Max(fop->batch.nmsgs, 1));
	for (int i = 0; i < fop->batch.nmsgs; i++)
		sub.each[i].wait_ms = -1;
	if (fop->in_sink)
		p->sink->outcomes(p->sink_state, &fop->batch, &sub);
	fop->in_sink = false;

	memset(r, 0, sizeof(*r));
	r->each = palloc0(sizeof(RelayMessageOutcome) * Max(op->n, 1));
	r->disable = sub.disable;
	strlcpy(r->disable_reason, sub.disable_reason, sizeof(r->disable_reason));
	for (int i = 0; i < op->n; i++)
	{
		if (fop->pos[i] >= 0)
			r->each[i] = sub.each[fop->pos[i]];
		else if (fop->msgs[i].expired)
			RelaySetFailure(&r->each[i], RELAY_EXPIRED, "expired", 0,
							"the message expired before it was sent");
		else if (fop->msgs[i].blocked)
			r->each[i].outcome = RELAY_NOT_SENT;
		else
			r->each[i].outcome = RELAY_FILTERED;
		if (r->each[i].outcome == RELAY_DELIVERED)
			r->delivered++;
		if (r->acked == i && (r->each[i].outcome == RELAY_DELIVERED ||
							  passed_over(r->each[i].outcome)))
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
finish_operation(RelayUnit *u)
{
	RelayOperation *op = u->op;
	RelayOperation *next = u->ahead;

	take_outcomes(op, &FOP(op)->result);
	op->to_record = true;
	pace_batch(FOP(op)->p, u, &FOP(op)->result, op->n);

	u->ahead = NULL;
	if (next != NULL && !may_start_ahead(u, op, &FOP(op)->result, next))
	{
		RelayFreeOperation(next, false);
		next = NULL;
	}
	if (next != NULL)
	{
		/* the finished batch is recorded while the next one is in flight */
		u->recording = op;
		u->op = next;
		RelayListOperation(next);
		MemoryContextSwitchTo(next->cxt);
		start_operation(u, next, FOP(next)->msgs, next->n, false, FOP(next)->limit);
		kick_operation(next);
	}
	MemoryContextSwitchTo(RelayLoopContext());
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
record_operation(RelayUnit *u)
{
	RelayOperation *op = u->recording != NULL ? u->recording : u->op;
	ForwardOp  *fop = FOP(op);
	BatchEnd	end;

	MemoryContextSwitchTo(op->cxt);
	end = settle_batch(fop->p, u, fop->msgs, op->n, fop->after, fop->from_queue, &fop->result,
					   op->n - fop->batch.nmsgs - fop->nblocked, fop->sent_at, op->cxt);
	/* A short lease: nothing more waits (unless the rate cut it short). */
	if (!fop->from_queue && end != BATCH_HELD && op->n == fop->limit)
		u->look = true;
	if (fop->from_queue && end == BATCH_FULL)
		FW(u)->retry_check_at = 0;
	RelayUnitOk(u);
	MemoryContextSwitchTo(RelayLoopContext());
	if (op != u->recording)
	{
		RelayEndOperations(u, false);
		return;
	}
	u->recording = NULL;
	RelayFreeOperation(op, false);
}

/*
 * A pipeline's step while it has no batch in flight: the messages due for
 * another attempt, else a live batch if it is to look for one, each leased
 * in a short transaction and started as an operation in flight.
 */
static void
step_pipeline(RelayUnit *u)
{
	const RelayPipeline *p = unit_pipeline(u);
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz wake;
	RelayMessage *msgs;
	RelayOperation *op;
	bool		retries_due = FW(u)->retry_check_at <= now;
	int			limit;
	int			n;

	if (!retries_due && !u->look)
		return;
	limit = RelayPacingAllowance(p, &FW(u)->pacing, p->batch_size, &wake);
	if (limit == 0)
	{
		u->paced_until = wake;
		RelayWakeAt(wake);
		return;
	}
	op = forward_operation(u, true);
	if (retries_due)
	{
		TimestampTz next_due;

		n = RelayTakeRetries(p, limit, op->cxt, &msgs, &next_due);
		/* Empty: looked at again when the worker queues one, or SQL asks. */
		FW(u)->retry_check_at = next_due != 0 ? next_due : DT_NOEND;
		if (n > 0)
		{
			if (n == limit)
				FW(u)->retry_check_at = 0;
			MemoryContextSwitchTo(op->cxt);
			start_operation(u, op, msgs, n, true, limit);
			MemoryContextSwitchTo(RelayLoopContext());
			return;
		}
	}
	if (u->look)
	{
		u->look = false;
		n = RelayLeaseBatch(p, limit, op->cxt, &msgs);
		if (n > 0)
		{
			MemoryContextSwitchTo(op->cxt);
			start_operation(u, op, msgs, n, false, limit);
			MemoryContextSwitchTo(RelayLoopContext());
			/* a backlog: the next batch is leased while this one is out */
			if (n == p->batch_size && p->overlap && !p->strict && p->ordering_key == NULL)
			{
				kick_operation(op);
				lease_ahead(u);
			}
			return;
		}
	}
	RelayUnitOk(u);
	RelayEndOperations(u, false);
}

/*
 * Of the pipelines about to take their step, those that would only look
 * for live messages are asked about in one statement (idle_look.c); each
 * that has nothing has looked, and takes no step. Should the
 * look fail, every pipeline takes its step and looks on its own.
 */
pg_noinline static void
skip_idle_pipelines(RelayUnit **all, int n, TimestampTz now)
{
	RelayPipeline **lookers = palloc(sizeof(RelayPipeline *) * Max(n, 1));
	RelayUnit **states = palloc(sizeof(RelayUnit *) * Max(n, 1));
	bool	   *found;
	int			nlook = 0;

	for (long i = 0; i < n; i++)
	{
		RelayUnit *u = all[i];

		if (u->held_until > now || u->paced_until > now ||
			!u->look || FW(u)->retry_check_at <= now)
			continue;
		states[nlook] = u;
		lookers[nlook++] = unit_pipeline(u);
	}
	/* one pipeline alone looks in its step, as cheaply */
	if (nlook < 2)
		return;
	found = palloc(sizeof(bool) * nlook);
	PG_TRY();
	{
		RelayLookForWork(lookers, nlook, found);
		MemoryContextSwitchTo(RelayLoopContext());
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(RelayLoopContext());
		edata = CopyErrorData();
		FlushErrorState();
		RelayAbortShortXact();
		MemoryContextSwitchTo(RelayLoopContext());
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
 * Whether the pipelines' reading of pipeline `name` has config md5 `md5`
 * and can be kept (pipelines.c).
 */
static bool forward_is_current(const char *name, const char *md5);

/* Whether the holds and errors an earlier worker recorded are cleared. */
static bool forgot_earlier_states = false;

/* The forward flow's `read`: the enabled rows of relay_outbox_config (pipelines.c). */
static void
forward_read(RelayFlowReading *reading)
{
	List	   *pipelines;
	List	   *kept;
	ListCell   *lc;
	MemoryContext old = MemoryContextSwitchTo(reading->cxt);

	/* until an earlier worker's holds are cleared, every pipeline is read (after_read) */
	pipelines = RelayReadPipelines(reading->cxt, &reading->any_enabled,
								   forgot_earlier_states && !reading->reopen ? forward_is_current : NULL,
								   &kept);
	MemoryContextSwitchTo(reading->cxt);
	reading->kept = kept;
	foreach(lc, pipelines)
	{
		RelayPipeline *p = lfirst(lc);
		RelayUnitReading *r = MemoryContextAllocZero(p->cxt, sizeof(RelayUnitReading));

		r->name = p->name;
		r->config_md5 = p->config_md5;
		r->reads_secrets = p->reads_secrets;
		r->state = p;
		r->cxt = p->cxt;
		reading->units = lappend(reading->units, r);
	}
	MemoryContextSwitchTo(old);
}

/* The forward flow's is_current for pipelines.c. */
static bool
forward_is_current(const char *name, const char *md5)
{
	return RelayUnitIsCurrent(&RelayForwardFlow, name, md5);
}

/* This worker holds nothing yet: an earlier one's holds are over (pipeline_state.c). */
static void
forget_earlier_states(List *units)
{
	List	   *pipelines = NIL;
	ListCell   *lc;

	if (forgot_earlier_states)
		return;
	foreach(lc, units)
		pipelines = lappend(pipelines, ((RelayUnitReading *) lfirst(lc))->state);
	forgot_earlier_states = RelayForgetPipelineStates(pipelines);
}

/*
 * After each reading: the periodic jobs of the outboxes' side, each in
 * short transactions of its own (attempt_log.c, retention.c).
 */
static void
forward_after_read(List *units)
{
	forget_earlier_states(units);
	RelayTrimAttemptLog();
	RelaySweepOutboxes();
}

/* A changed config (a fixed URL, say) is tried at once, its pacing anew. */
static void
forward_config_changed(RelayUnit *u)
{
	FW(u)->retry_check_at = 0;
	memset(&FW(u)->pacing, 0, sizeof(FW(u)->pacing));
}

/* SQL changed pipelines or queued retries: every queue is looked at. */
static void
forward_sql_changed(RelayUnit *u)
{
	FW(u)->retry_check_at = 0;
}

/* When its retry queue is next due. */
static TimestampTz
forward_next_due(RelayUnit *u)
{
	return FW(u)->retry_check_at;
}

/* Moves a batch on in its sink; true when it is finished. */
static bool
forward_progress(RelayOperation *op)
{
	const RelayPipeline *p = FOP(op)->p;

	return FOP(op)->batch.nmsgs == 0 || p->sink->progress(p->sink_state, &FOP(op)->batch);
}

/* Abandons a batch still in its sink: the sink releases what points into it. */
static void
forward_cancel(RelayOperation *op)
{
	ForwardOp  *fop = FOP(op);

	if (fop != NULL && fop->in_sink)
		fop->p->sink->cancel(fop->p->sink_state, &fop->batch);
	if (fop != NULL)
		fop->in_sink = false;
}

/*
 * An abandoned batch is taken again: from the retry queue at once, or
 * leased again (its consumer still holds the lease).
 */
static void
forward_abandoned(RelayOperation *op)
{
	RelayUnit  *u = op->unit;

	if (FOP(op) != NULL && FOP(op)->from_queue)
		FW(u)->retry_check_at = 0;
	else
		u->look = true;
}

/* For relay_pipeline_status (pipeline_state.c); never raises. */
static void
forward_note_error(RelayUnit *u, const char *message)
{
	RelayRecordTurnError(u->name, message, u->errors, u->held_until, &u->record_log);
}

/* For relay_pipeline_status: the pipeline's steps end without an ERROR again. */
static void
forward_note_ok(RelayUnit *u)
{
	RelayRecordTurnOk(u->name, &u->record_log);
}

/* Ends a reading of a pipeline: its sink's state (its memory is the engine's to free). */
static void
forward_close(RelayUnitReading *r)
{
	RelayPipeline *p = r->state;

	if (p->sink->close)
		p->sink->close(p->sink_state);
}

const RelayFlowRoutine RelayForwardFlow = {
	.name = "forward",
	.unit_noun = "pipeline",
	.error_retry_note = "Messages it sent but could not record are sent again then.",
	.unit_size = sizeof(ForwardUnit),
	.units_table = "relay_outbox_config",
	.read = forward_read,
	.after_read = forward_after_read,
	.sql_changed = forward_sql_changed,
	.config_changed = forward_config_changed,
	.look_together = skip_idle_pipelines,
	.step = step_pipeline,
	.next_due = forward_next_due,
	.progress = forward_progress,
	.finish = finish_operation,
	.record = record_operation,
	.after_record = lease_ahead,
	.cancel = forward_cancel,
	.abandoned = forward_abandoned,
	.note_error = forward_note_error,
	.note_ok = forward_note_ok,
	.close = forward_close,
};
