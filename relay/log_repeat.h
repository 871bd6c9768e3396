/*
 * log_repeat.h
 *		A condition of a unit that repeats while it lasts (a hold, turns that
 *		end in an ERROR, a breaker that opens), as the log tells it: once when
 *		it starts, at most once a minute while it goes on, once when it ends
 *		(log_repeat.c).
 */
#ifndef TIDE_LOG_REPEAT_H
#define TIDE_LOG_REPEAT_H

#include "postgres.h"

#include "datatype/timestamp.h"

/* A condition that repeats, as the log tells it. */
typedef struct RelayRepeat
{
	TimestampTz since;			/* when it started; 0: it is not going on */
	TimestampTz logged_at;		/* its last line */
	int64		times;			/* how often it happened since it started */
	int64		unlogged;		/* how often since its last line, not logged */
} RelayRepeat;

/* What the log says of one more time of a condition. */
typedef enum RelayRepeatLine
{
	RELAY_REPEAT_QUIET,			/* nothing: a line was written less than a minute ago */
	RELAY_REPEAT_FIRST,			/* that it starts */
	RELAY_REPEAT_AGAIN			/* that it goes on, with how often since the last line */
} RelayRepeatLine;

extern RelayRepeatLine RelayRepeatNote(RelayRepeat *r, int64 *unlogged);
extern bool RelayRepeatEnd(RelayRepeat *r, int64 *times, TimestampTz *since);

#endif							/* TIDE_LOG_REPEAT_H */
