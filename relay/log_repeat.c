/*
 * log_repeat.c
 *		How often the relay worker logs a condition that repeats for as long
 *		as it lasts: a pipeline held at a destination that is down, its
 *		turns ending in an ERROR, its circuit breaker opening again.
 *
 * Each failed attempt used to log its three lines (message, detail, hint):
 * 200 pipelines to brokers that are down wrote about 36,000 lines an hour,
 * and what started the trouble scrolled away. Now a condition is logged
 * when it starts, then at most once every RELAY_REPEAT_LOG_MS per pipeline
 * with how often it happened since the last line, and once when it ends.
 * relay_pipeline_status still shows every attempt as it happens.
 *
 * The state lives in the pipeline's state in the worker's memory: a worker
 * that starts again logs a condition that goes on as starting.
 */
#include "postgres.h"

#include "utils/timestamp.h"

#include "log_repeat.h"

/* The shortest time between two lines about one condition of one pipeline. */
#define RELAY_REPEAT_LOG_MS		60000

/*
 * Notes that the condition happened once more, and says what the log says
 * of it: that it starts (the first time), that it goes on (the first time
 * a minute or more after the last line: *unlogged is then how many times
 * since that line were not logged), or nothing.
 */
RelayRepeatLine
RelayRepeatNote(RelayRepeat *r, int64 *unlogged)
{
	TimestampTz now = GetCurrentTimestamp();

	*unlogged = 0;
	if (r->since == 0)
	{
		r->since = now;
		r->logged_at = now;
		r->times = 1;
		r->unlogged = 0;
		return RELAY_REPEAT_FIRST;
	}
	r->times++;
	/* a clock set back logs at once rather than never */
	if (now >= r->logged_at &&
		!TimestampDifferenceExceeds(r->logged_at, now, RELAY_REPEAT_LOG_MS))
	{
		r->unlogged++;
		return RELAY_REPEAT_QUIET;
	}
	*unlogged = r->unlogged;
	r->unlogged = 0;
	r->logged_at = now;
	return RELAY_REPEAT_AGAIN;
}

/*
 * Ends the condition. Returns true when it was going on (its end is to be
 * logged), with how many times it happened and since when.
 */
bool
RelayRepeatEnd(RelayRepeat *r, int64 *times, TimestampTz *since)
{
	bool		was_on = r->since != 0;

	*times = r->times;
	*since = r->since;
	memset(r, 0, sizeof(*r));
	return was_on;
}
