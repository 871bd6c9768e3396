/*
 * worker_memory.c
 *		What a relay worker does with the memory its batches free: it keeps
 *		it while it delivers, and gives it back to the kernel once it has
 *		been idle for a while.
 *
 * Each batch allocates its messages' text and its sink's requests afresh
 * and frees them when recorded. With glibc's defaults, freed blocks above
 * 128 kB go back to the kernel at once and the next batch faults its pages
 * in again: 12% of a worker's time delivering to Redis (perf). So while it
 * delivers the worker keeps what it frees (RelayKeepFreedMemory). But a
 * burst (100 messages fanned out to 1,000 webhook pipelines) frees far more
 * than one batch, and glibc kept it: over 500 MB of the worker's private
 * memory for good, since free() gives back only a free top of the heap
 * larger than M_TRIM_THRESHOLD, never the pages freed below a chunk still
 * in use. So once the worker has had no batch
 * in flight for RELAY_IDLE_TRIM_MS after delivering, malloc_trim(0) returns
 * every free page of every arena (the broker libraries' threads have arenas
 * of their own). Not sooner: a steady stream with short pauses would pay for
 * faulting its pages in again after each, which keep-freed avoids. The trim
 * runs in the loop and is short: 75 ms for the 500 MB of that fan-out, once,
 * and well under a millisecond for a heap of a few megabytes.
 */
#include "postgres.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "utils/timestamp.h"

#include "relay_xact.h"

/* How long the worker is idle before it gives back what it freed. */
#define RELAY_IDLE_TRIM_MS	1000

/* The worker delivered since it last gave memory back. */
static bool used_since_trim = false;
/* When its last batch ended (0: it has one in flight, or never had). */
static TimestampTz idle_since = 0;

/* Makes glibc keep freed memory while the worker delivers (see above). */
void
RelayKeepFreedMemory(void)
{
#ifdef __GLIBC__
	(void) mallopt(M_MMAP_THRESHOLD, 16 * 1024 * 1024);
	(void) mallopt(M_TRIM_THRESHOLD, 64 * 1024 * 1024);
#endif
}

/*
 * Called once a turn before the wait with the number of batches in flight
 * and the wait's timeout in ms (-1: none): gives back the freed memory once
 * the worker has been idle for RELAY_IDLE_TRIM_MS after delivering, and
 * shortens the timeout so that the wait ends then.
 */
void
RelayReturnMemoryWhenIdle(int in_flight, long *timeout)
{
	TimestampTz now;
	long		left;

	if (in_flight > 0)
	{
		used_since_trim = true;
		idle_since = 0;
		return;
	}
	if (!used_since_trim)
		return;
	now = GetCurrentTimestamp();
	if (idle_since == 0)
		idle_since = now;
	left = RELAY_IDLE_TRIM_MS - (long) ((now - idle_since) / 1000);
	if (left > 0)
	{
		if (*timeout < 0 || *timeout > left)
			*timeout = left;
		return;
	}
#ifdef __GLIBC__
	(void) malloc_trim(0);
#endif
	used_since_trim = false;
	idle_since = 0;
}
