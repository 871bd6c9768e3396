/*
 * send_window.c
 *		Which messages of a batch a broker's sink may send now (broker.h):
 *		the pipeline's in-flight limit, id order, ordering 'key' (a message
 *		waits for the previous one of its key, sink.h's batch->after) and
 *		'strict' (nothing after a failure), and the batch's deadline.
 *
 * One place for these rules, so that every sink that sends messages one by
 * one keeps the guarantees the same way: a message that waits for one that
 * failed is never sent in this batch (it keeps RELAY_NOT_SENT and is
 * leased again, after its key's earlier message), so no key is ever
 * overtaken.
 */
#include "postgres.h"

#include "utils/timestamp.h"

#include "broker.h"

void
RelaySendWindowInit(RelaySendWindow *w, RelaySinkBatch *batch, int max_in_flight, long timeout_ms)
{
	memset(w, 0, sizeof(*w));
	w->batch = batch;
	w->state = MemoryContextAllocZero(batch->cxt, sizeof(RelaySendState) * Max(batch->nmsgs, 1));
	w->max_in_flight = Max(max_in_flight, 1);
	w->timeout_ms = Max(timeout_ms, 1);
	w->started_at = GetCurrentTimestamp();
	w->deadline = TimestampTzPlusMilliseconds(w->started_at, w->timeout_ms);
}

/*
 * Whether message i may be sent now; marks it skipped when it never will
 * be (the message it waits for failed or was skipped).
 */
static bool
may_send(RelaySendWindow *w, int i)
{
	const int  *after = w->batch->after;
	RelaySendState dep;

	if (after == NULL || after[i] < 0)
		return true;
	dep = w->state[after[i]];
	if (dep == RELAY_SEND_FAILED || dep == RELAY_SEND_SKIPPED)
		w->state[i] = RELAY_SEND_SKIPPED;
	return dep == RELAY_SEND_ACKED;
}

/* Whether the window lets new messages go: not stopped, not in the last tenth. */
static bool
window_open(const RelaySendWindow *w)
{
	/* a message sent in the last tenth could hardly be acknowledged in time */
	long		left_ms = (long) ((w->deadline - GetCurrentTimestamp()) / 1000);

	return !w->stopped && left_ms > 0 && left_ms >= w->timeout_ms / 10;
}

int
RelaySendWindowNext(RelaySendWindow *w)
{
	if (w->in_flight >= w->max_in_flight || !window_open(w))
		return -1;
	for (int i = w->next; i < w->batch->nmsgs; i++)
	{
		if (w->state[i] != RELAY_SEND_WAITING || !may_send(w, i))
			continue;
		w->state[i] = RELAY_SEND_IN_FLIGHT;
		w->in_flight++;
		while (w->next < w->batch->nmsgs && w->state[w->next] != RELAY_SEND_WAITING)
			w->next++;
		return i;
	}
	return -1;
}

void
RelaySendWindowDone(RelaySendWindow *w, int i, bool acked, bool stop)
{
	if (i < 0 || i >= w->batch->nmsgs || w->state[i] != RELAY_SEND_IN_FLIGHT)
		return;
	w->state[i] = acked ? RELAY_SEND_ACKED : RELAY_SEND_FAILED;
	w->in_flight--;
	if (stop || (!acked && w->batch->stop_at_failure))
		w->stopped = true;
}

bool
RelaySendWindowFinished(RelaySendWindow *w)
{
	if (w->in_flight > 0)
		return false;
	if (!window_open(w))
		return true;
	/* nothing in flight: a waiting message either may go now or never will */
	for (int i = w->next; i < w->batch->nmsgs; i++)
		if (w->state[i] == RELAY_SEND_WAITING && may_send(w, i))
			return false;
	return true;
}

void
RelaySendWindowNotSent(const RelaySendWindow *w, int i, RelayMessageOutcome *o)
{
	RelaySetFailure(o, RELAY_NOT_SENT, "not_sent", 0,
					w->state[i] == RELAY_SEND_SKIPPED ?
					"not sent: the earlier message of its ordering key failed" :
					"not sent: an earlier failure or the batch's timeout_ms came first");
}
