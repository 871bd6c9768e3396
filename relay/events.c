/*
 * events.c
 *		The relay worker's own epoll set and the sinks' timers.
 *
 * PostgreSQL's WaitEventSet can add a socket but not remove one, while a
 * library like libcurl opens and closes sockets all the time. So sinks
 * register their descriptors here, in an epoll set of the worker's own,
 * and the worker adds that one epoll descriptor to its WaitEventSet as a
 * readable socket: it turns readable when any descriptor in it is ready.
 * The loop then calls RelayEventsDispatch, which hands each ready
 * descriptor to the callback that registered it.
 *
 * Timers are the sinks' own structs (a libcurl multi handle's timer, say),
 * linked into a list while set; the loop's timeout is the earliest of them
 * and RelayTimersFire calls the ones that are due.
 *
 * Libraries call RelayEventsWatch and RelayTimerSet from inside their own
 * callbacks, so neither allocates with palloc nor raises an ERROR.
 */
#include "postgres.h"

#include <sys/epoll.h>
#include <unistd.h>

#include "utils/timestamp.h"

#include "events.h"

/* Ready descriptors handed out by one RelayEventsDispatch. */
#define RELAY_EVENTS_PER_DISPATCH 64

struct RelayWatch
{
	int			fd;
	uint32		events;
	RelayFdCallback callback;
	void	   *arg;
	bool		gone;			/* unwatched during a dispatch: freed after it */
	struct RelayWatch *next_gone;
};

static int	epoll_fd = -1;
static RelayTimer *timers = NULL;
static bool dispatching = false;
static RelayWatch *gone_watches = NULL;

/* The worker's epoll descriptor, created on first use; -1 when it cannot be. */
int
RelayEventsFd(void)
{
	if (epoll_fd < 0)
		epoll_fd = epoll_create1(EPOLL_CLOEXEC);
	return epoll_fd;
}

RelayWatch *
RelayEventsWatch(RelayWatch *w, int fd, uint32 events, RelayFdCallback callback, void *arg)
{
	struct epoll_event ev;
	bool		added = (w == NULL);

	if (RelayEventsFd() < 0)
		return NULL;
	/* Libraries ask again for what they watch already (hiredis, per command). */
	if (w != NULL && !w->gone && w->fd == fd && w->events == events &&
		w->callback == callback && w->arg == arg)
		return w;
	if (w == NULL)
	{
		w = malloc(sizeof(RelayWatch));
		if (w == NULL)
			return NULL;
	}
	w->fd = fd;
	w->gone = false;
	w->events = events;
	w->callback = callback;
	w->arg = arg;
	memset(&ev, 0, sizeof(ev));
	ev.events = events;
	ev.data.ptr = w;
	if (epoll_ctl(epoll_fd, added ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &ev) != 0)
	{
		if (added)
			free(w);
		return NULL;
	}
	return w;
}

void
RelayEventsUnwatch(RelayWatch *w)
{
	struct epoll_event ev;

	if (w == NULL)
		return;
	/* fails harmlessly when the descriptor is already closed */
	(void) epoll_ctl(epoll_fd, EPOLL_CTL_DEL, w->fd, &ev);
	if (dispatching)
	{
		/* its event may still be among those being handed out */
		w->gone = true;
		w->next_gone = gone_watches;
		gone_watches = w;
	}
	else
		free(w);
}

/*
 * Hands every ready descriptor to its callback, without waiting. A
 * callback may unwatch descriptors, its own or others' (libcurl closes
 * sockets while it works on another): a watch unwatched meanwhile is
 * passed over and freed only after the dispatch.
 */
void
RelayEventsDispatch(void)
{
	struct epoll_event evs[RELAY_EVENTS_PER_DISPATCH];
	int			n;

	if (epoll_fd < 0)
		return;
	n = epoll_wait(epoll_fd, evs, RELAY_EVENTS_PER_DISPATCH, 0);
	dispatching = true;
	for (int i = 0; i < n; i++)
	{
		RelayWatch *w = evs[i].data.ptr;

		if (!w->gone)
			w->callback(w->fd, evs[i].events, w->arg);
	}
	dispatching = false;
	while (gone_watches)
	{
		RelayWatch *w = gone_watches;

		gone_watches = w->next_gone;
		free(w);
	}
}

void
RelayTimerSet(RelayTimer *t, long ms)
{
	if (ms < 0)
	{
		t->due = 0;
		return;
	}
	t->due = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), ms);
	if (!t->registered)
	{
		t->next = timers;
		timers = t;
		t->registered = true;
	}
}

/* When the earliest timer is due, or 0 when none is set. */
TimestampTz
RelayTimersEarliest(void)
{
	TimestampTz earliest = 0;

	for (RelayTimer *t = timers; t; t = t->next)
		if (t->due != 0 && (earliest == 0 || t->due < earliest))
			earliest = t->due;
	return earliest;
}

/* Fires the timers that are due by `now`; each is off until set again. */
void
RelayTimersFire(TimestampTz now)
{
	for (RelayTimer *t = timers; t; t = t->next)
		if (t->due != 0 && t->due <= now)
		{
			t->due = 0;
			t->fire(t->arg);
		}
}
