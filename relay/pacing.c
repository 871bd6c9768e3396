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
 */
#include "postgres.h"

#include <math.h>

#include "utils/timestamp.h"

#include "relay.h"

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
			ereport(LOG,
					(errmsg("pg_tide relay pipeline \"%s\": circuit breaker half-open, sending one message as a probe",
							p->name)));
		}
		if (pc->breaker == RELAY_BREAKER_HALF_OPEN)
			allowed = 1;
	}
	if (p->rate_per_second > 0)
	{
		double		elapsed = pc->refilled_at == 0 ? 0 :
			(double) (now - pc->refilled_at) / USECS_PER_SEC;

		if (pc->refilled_at == 0)
			pc->tokens = p->rate_burst;
		pc->tokens = Min((double) p->rate_burst, pc->tokens + elapsed * p->rate_per_second);
		pc->refilled_at = now;
		if (pc->tokens < 1)
		{
			*wake = TimestampTzPlusMilliseconds(now,
												(long) ceil((1 - pc->tokens) * 1000 / p->rate_per_second));
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

	if (p->rate_per_second > 0)
		pc->tokens -= sent;
	if (p->breaker_threshold <= 0 || (failures == 0 && successes == 0))
		return;
	if (successes > 0)
	{
		if (pc->breaker != RELAY_BREAKER_CLOSED)
			ereport(LOG,
					(errmsg("pg_tide relay pipeline \"%s\": circuit breaker closed, the probe succeeded",
							p->name)));
		pc->breaker = RELAY_BREAKER_CLOSED;
		pc->failures_in_row = 0;
		pc->cooldown_ms = 0;
		return;
	}
	pc->failures_in_row += failures;
	if (pc->breaker == RELAY_BREAKER_HALF_OPEN ||
		(pc->breaker == RELAY_BREAKER_CLOSED && pc->failures_in_row >= p->breaker_threshold))
	{
		pc->cooldown_ms = pc->cooldown_ms == 0 ? p->breaker_cooldown_ms :
			Min(pc->cooldown_ms * 2, (long) p->breaker_cooldown_ms * 10);
		pc->breaker = RELAY_BREAKER_OPEN;
		pc->breaker_until = TimestampTzPlusMilliseconds(now, pc->cooldown_ms);
		ereport(LOG,
				(errmsg("pg_tide relay pipeline \"%s\": circuit breaker open after %d failed attempts in a row",
						p->name, pc->failures_in_row),
				 errdetail("Nothing is sent for %ld ms; then one message is sent as a probe.",
						   pc->cooldown_ms)));
	}
}
