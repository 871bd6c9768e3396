/*
 * backpressure.h
 *		An outbox's inline_threshold at publish time (src/backpressure.c).
 */
#ifndef TIDE_BACKPRESSURE_H
#define TIDE_BACKPRESSURE_H

extern int64 BackpressureAdmit(const char *name, int64 n, bool held, int64 threshold,
							   int64 low, int level);

#endif
