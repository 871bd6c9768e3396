/*
 * events.h
 *		The descriptors and timers that sinks register with their relay
 *		worker's wait (events.c): the loop sleeps until one of them, its
 *		latch or the postmaster's death needs it.
 */
#ifndef TIDE_EVENTS_H
#define TIDE_EVENTS_H

#include "postgres.h"

#include "datatype/timestamp.h"

/* Called when a watched descriptor is ready; `events` are epoll's. Never an ERROR. */
typedef void (*RelayFdCallback) (int fd, uint32 events, void *arg);

/* A watched descriptor; opaque. */
typedef struct RelayWatch RelayWatch;

/*
 * A sink's timer: `fire` is called from the loop (never from inside a
 * library's callback) once `due` has come; due 0 is off.
 */
typedef struct RelayTimer
{
	TimestampTz due;
	void		(*fire) (void *arg);
	void	   *arg;
	struct RelayTimer *next;	/* the registered timers */
	bool		registered;
} RelayTimer;

/*
 * Watches fd for `events` (EPOLLIN, EPOLLOUT), or changes what an existing
 * watch waits for; NULL when it cannot (the descriptor is then not waited
 * on, and the sink's own deadline ends its batch). No palloc, no ERROR:
 * libraries call it from their callbacks.
 */
extern PGDLLEXPORT RelayWatch *RelayEventsWatch(RelayWatch *w, int fd, uint32 events,
									RelayFdCallback callback, void *arg);
/* Stops watching (w may be NULL); no ERROR. */
extern PGDLLEXPORT void RelayEventsUnwatch(RelayWatch *w);
/* Sets a timer to fire in ms milliseconds; ms < 0 switches it off. No ERROR. */
extern PGDLLEXPORT void RelayTimerSet(RelayTimer *t, long ms);

/* For the worker loop (worker.c). */
extern PGDLLEXPORT int	RelayEventsFd(void);
extern PGDLLEXPORT void RelayEventsDispatch(void);
extern PGDLLEXPORT TimestampTz RelayTimersEarliest(void);
extern PGDLLEXPORT void RelayTimersFire(TimestampTz now);

#endif							/* TIDE_EVENTS_H */
