/*
 * pacing.c
 *		Whether, and how much, a pipeline may send now: its rate limit and its
 *		circuit breaker. Both live in the worker's memory (a restart starts
 *		them afresh, which only means an early attempt).
 *
 * Rate limit ("rate_limit": {"per_second", "burst"}): a token bucket that
 * fills at per_second tokens a second up to burst; each message sent takes
 * a token, so a batch is never larger than the tokens at hand.
 *
 * Circuit breaker ("breaker": {"failure_threshold", "cooldown_ms"}):
 * closed, it counts failed attempts in a row (a batch with a success resets
 * them, as the pipeline's health does); at failure_threshold it opens and
 * nothing is sent, live or from the retry queue, for cooldown_ms; then it is
 * half-open and one message is sent as a probe: a success closes it, a
 * failure opens it again for twice the cooldown (at most ten times it).
 *
 * The values come from the pipeline's config, which tide.relay_set_outbox
 * validated; a row written by hand can hold anything, so every value is
 * brought into the validator's range here and every wait is bounded: no
 * config can make the worker wake up in the past (and spin) or never.
 */
#include "postgres.h"

#include <math.h>

#include "utils/timestamp.h"

#include "forward.h"

/* The largest burst the validator accepts (the rate's range is in forward.h). */
#define RELAY_BURST_MAX				1000000
/* The longest wait for a token: one token at the slowest rate. */
#define RELAY_PACING_MAX_WAIT_MS	1000000.0
/* The range of breaker.cooldown_ms the validator accepts. */
#define RELAY_COOLDOWN_MIN_MS		100
#define RELAY_COOLDOWN_MAX_MS		86400000

/* The pipeline's rate, within the validator's range; 0 (or NaN): no limit. */
static double
pacing_rate(const RelayPipeline *p)
{
	if (!(p->rate_per_second > 0))
		return 0;
	return Min(Max(p->rate_per_second, RELAY_MIN_RATE_PER_SECOND), RELAY_MAX_RATE_PER_SECOND);
}

/* Names of the breaker's states, as relay_pipeline_status shows them. */
const char *
RelayBreakerStateName(const RelayPipeline *p, const RelayPacing *pc)
{
	if (p->breaker_threshold <= 0)
		return NULL;
	switch (pc->breaker)
	{
		case RELAY_BREAKER_OPEN:
			return "open";
		case RELAY_BREAKER_HALF_OPEN:
			return "half_open";
		default:
			return "closed";
	}
}

/*
 * How many messages the pipeline may send now, at most `want`; 0 when none,
 * with *wake set to when it may send again.
 */
int
RelayPacingAllowance(const RelayPipeline *p, RelayPacing *pc, int want, TimestampTz *wake)
{
	TimestampTz now = GetCurrentTimestamp();
	int			allowed = want;

	*wake = 0;
	if (p->breaker_threshold > 0)
	{
		if (pc->breaker == RELAY_BREAKER_OPEN)
		{
			if (now < pc->breaker_until)
			{
				*wake = pc->breaker_until;
				return 0;
			}
			pc->breaker = RELAY_BREAKER_HALF_OPEN;
			/* the first probe after it opened; the later ones as the openings say (log_repeat.c) */
			ereport(pc->opened.times <= 1 ? LOG : DEBUG1,
					(errmsg("pg_tide relay pipeline \"%s\": circuit breaker half-open, sending one message as a probe",
							p->name)));
		}
		if (pc->breaker == RELAY_BREAKER_HALF_OPEN)
			allowed = 1;
	}
	if (pacing_rate(p) > 0)
	{
		double		rate = pacing_rate(p);
		double		burst = Min(Max(p->rate_burst, 1), RELAY_BURST_MAX);
		/* a clock set back refills nothing */
		double		elapsed = pc->refilled_at == 0 || now < pc->refilled_at ? 0 :
			(double) (now - pc->refilled_at) / USECS_PER_SEC;

		if (pc->refilled_at == 0)
			pc->tokens = burst;
		pc->tokens = Min(burst, pc->tokens + elapsed * rate);
		if (!(pc->tokens >= -burst))
			pc->tokens = -burst;
		pc->refilled_at = now;
		if (pc->tokens < 1)
		{
			/* computed in double and bounded before it becomes a long */
			double		wait_ms = ceil((1 - pc->tokens) * 1000 / rate);

			wait_ms = Min(Max(wait_ms, 1), RELAY_PACING_MAX_WAIT_MS);
			*wake = TimestampTzPlusMilliseconds(now, (long) wait_ms);
			return 0;
		}
		allowed = Min(allowed, (int) pc->tokens);
	}
	return allowed;
}

/*
 * Accounts for a batch: `sent` messages took tokens; the attempts that
 * failed and succeeded move the breaker.
 */
void
RelayPacingAfterBatch(const RelayPipeline *p, RelayPacing *pc, int sent, int failures,
					  int successes)
{
	TimestampTz now = GetCurrentTimestamp();
	int64		unlogged;
	RelayRepeatLine line;

	if (pacing_rate(p) > 0)
		pc->tokens -= sent;
	if (p->breaker_threshold <= 0 || (failures == 0 && successes == 0))
		return;
	if (successes > 0)
	{
		int64		times;
		TimestampTz since;

		if (RelayRepeatEnd(&pc->opened, &times, &since) || pc->breaker != RELAY_BREAKER_CLOSED)
			ereport(LOG,
					(errmsg("pg_tide relay pipeline \"%s\": circuit breaker closed, the probe succeeded",
							p->name),
					 since != 0 ?
					 errdetail("It opened " INT64_FORMAT " time%s since %s.",
							   times, times == 1 ? "" : "s", timestamptz_to_str(since)) : 0));
		pc->breaker = RELAY_BREAKER_CLOSED;
		pc->failures_in_row = 0;
		pc->cooldown_ms = 0;
		return;
	}
	pc->failures_in_row = (int) Min((int64) pc->failures_in_row + failures, PG_INT32_MAX);
	if (pc->breaker == RELAY_BREAKER_HALF_OPEN ||
		(pc->breaker == RELAY_BREAKER_CLOSED && pc->failures_in_row >= p->breaker_threshold))
	{
		long		cooldown = Min(Max(p->breaker_cooldown_ms, RELAY_COOLDOWN_MIN_MS),
								   RELAY_COOLDOWN_MAX_MS);

		pc->cooldown_ms = pc->cooldown_ms == 0 ? cooldown :
			Min(pc->cooldown_ms * 2, cooldown * 10);
		pc->breaker = RELAY_BREAKER_OPEN;
		pc->breaker_until = TimestampTzPlusMilliseconds(now, pc->cooldown_ms);
		/* once when it first opens, then at most once a minute (log_repeat.c) */
		line = RelayRepeatNote(&pc->opened, &unlogged);
		if (line == RELAY_REPEAT_FIRST)
			ereport(LOG,
					(errmsg("pg_tide relay pipeline \"%s\": circuit breaker open after %d failed attempts in a row",
							p->name, pc->failures_in_row),
					 errdetail("Nothing is sent for %ld ms; then one message is sent as a probe.",
							   pc->cooldown_ms),
					 errhint("Until a probe succeeds, its openings are logged at most once a minute.")));
		else if (line == RELAY_REPEAT_AGAIN)
			ereport(LOG,
					(errmsg("pg_tide relay pipeline \"%s\": circuit breaker open again, a probe failed",
							p->name),
					 errdetail(INT64_FORMAT " more opening%s since the last line; " INT64_FORMAT " since %s. Nothing is sent for %ld ms.",
							   unlogged, unlogged == 1 ? "" : "s", pc->opened.times,
							   timestamptz_to_str(pc->opened.since), pc->cooldown_ms)));
	}
}
