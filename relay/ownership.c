/*
 * ownership.c
 *		Which of a database's relay workers serves which pipeline, with
 *		pg_tide.relay_workers_per_database above 1.
 *
 * Each pipeline has one owner, chosen stably: the FNV-1a hash of its name,
 * modulo the number of the database's workers, picks one of them in the
 * order of their worker_index (the workers that the launcher has registered
 * and that have not ended or retired). When the setting or the set of
 * workers changes, some pipelines get another owner.
 *
 * "One owner" must also hold while a pipeline moves: the worker that loses
 * it may still be delivering a batch of it, and the lease of that batch
 * belongs to the pipeline's consumer, not to a worker, so the new owner
 * would be handed the same lease and send it at the same time. So a worker
 * serves a pipeline only while it holds a session-level advisory lock on it
 * (RELAY_PIPELINE_LOCK_KEY and the name's hash, taken without waiting in
 * the pass's short transaction; it outlives the transaction). It takes the
 * lock when it first serves the pipeline and gives it up only between
 * batches, when a later pass finds the pipeline is no longer its own (or no
 * longer enabled); a pipeline whose lock another worker still holds is
 * passed over until that worker lets it go. Letting go wakes the database's
 * workers, so the new owner does not wait for its naptime. A worker that
 * ends, however, releases all of its locks with its session.
 *
 * The calls, at each reading of the pipelines: RelayServesPipeline() for
 * each enabled pipeline (pipelines.c), RelayKeepPipeline() for each that
 * still has a batch in flight, then RelayReleaseUnservedPipelines() once
 * (units.c); between readings, RelayWorkerRetired() tells a
 * worker to leave whose worker_index the lowered setting no longer covers,
 * or whose slot the launcher needs for a database without a worker.
 * Two names with the same hash share one lock; they also share an owner,
 * and the lock counts each of them, so nothing is released early.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/lock.h"
#include "common/hashfn.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "launcher.h"
#include "relay_xact.h"

/* A pipeline whose lock this worker holds, by name (the hash key). */
typedef struct HeldPipeline
{
	char	   *name;			/* in TopMemoryContext; the key is this pointer's target */
	uint32		hash;
	bool		served;			/* RelayServesPipeline said yes since the last release */
} HeldPipeline;

/*
 * The pipelines whose locks this worker holds: a hash table, since every
 * reading asks about each enabled pipeline (a list searched from the start
 * cost a thousand pipelines half a million name comparisons per reading).
 */
static HTAB *held = NULL;

/* This worker's slot, found by its pid; NULL outside a relay worker. */
static RelayWorkerSlot *own_slot = NULL;

/* The pass's view of the workers: computed by its first question. */
static bool view_valid = false;
static int	view_nworkers = 0;
static int	view_position = -1; /* this worker's rank among them; -1: none */

/* The 32-bit FNV-1a hash of a pipeline's name: stable across restarts and platforms. */
static uint32
pipeline_hash(const char *name)
{
	uint32		h = 2166136261u;

	for (const unsigned char *c = (const unsigned char *) name; *c; c++)
	{
		h ^= *c;
		h *= 16777619u;
	}
	return h;
}

/* The slot of this relay worker, or NULL. */
static RelayWorkerSlot *
find_own_slot(void)
{
	if (own_slot == NULL && Relay != NULL)
	{
		SpinLockAcquire(&Relay->mutex);
		for (int i = 0; i < Relay->nslots; i++)
			if (Relay->slots[i].in_use && Relay->slots[i].pid == MyProcPid)
				own_slot = &Relay->slots[i];
		SpinLockRelease(&Relay->mutex);
	}
	return own_slot;
}

/*
 * Whether this worker must leave: its worker_index is not below
 * pg_tide.relay_workers_per_database (as this process last reloaded it),
 * or the launcher needs its slot for a database that has no worker.
 */
bool
RelayWorkerRetired(void)
{
	RelayWorkerSlot *slot = find_own_slot();
	bool		retiring;

	if (slot == NULL)
		return false;
	SpinLockAcquire(&Relay->mutex);
	retiring = slot->retiring;
	SpinLockRelease(&Relay->mutex);
	return retiring || slot->worker_index >= RelayWorkersPerDatabase;
}

/*
 * Computes how many workers share the database and this worker's rank
 * among them, by worker_index: the slots of the database that are in use,
 * have not ended and whose index the setting covers (one just registered
 * counts: it starts within moments).
 */
static void
compute_view(void)
{
	RelayWorkerSlot *slot = find_own_slot();
	int			rank = 0;
	int			n = 0;

	view_valid = true;
	view_nworkers = 0;
	view_position = -1;
	if (slot == NULL || RelayWorkerRetired())
		return;
	SpinLockAcquire(&Relay->mutex);
	for (int i = 0; i < Relay->nslots; i++)
	{
		RelayWorkerSlot *s = &Relay->slots[i];

		if (!s->in_use || s->exited || s->retiring || s->dboid != MyDatabaseId ||
			s->worker_index >= RelayWorkersPerDatabase)
			continue;
		n++;
		if (s->worker_index < slot->worker_index)
			rank++;
	}
	SpinLockRelease(&Relay->mutex);
	view_nworkers = n;
	view_position = rank;
}

/* The advisory lock tag of a pipeline hash, in this database. */
static void
pipeline_lock_tag(LOCKTAG *tag, uint32 hash)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, RELAY_PIPELINE_LOCK_KEY, hash, 2);
}

/* Hashes a held pipeline's name (the key is a pointer to it). */
static uint32
held_name_hash(const void *key, Size keysize)
{
	const char *name = *(const char *const *) key;

	return hash_bytes((const unsigned char *) name, strlen(name));
}

/* Compares two held pipelines' names (the keys are pointers to them). */
static int
held_name_match(const void *key1, const void *key2, Size keysize)
{
	return strcmp(*(const char *const *) key1, *(const char *const *) key2);
}

/* The table of held pipelines, made on first use. */
static HTAB *
held_table(void)
{
	if (held == NULL)
	{
		HASHCTL		ctl;

		memset(&ctl, 0, sizeof(ctl));
		ctl.keysize = sizeof(char *);
		ctl.entrysize = sizeof(HeldPipeline);
		ctl.hash = held_name_hash;
		ctl.match = held_name_match;
		ctl.hcxt = TopMemoryContext;
		held = hash_create("pg_tide relay held pipelines", 256, &ctl,
						   HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);
	}
	return held;
}

/* The held entry of a pipeline, or NULL. */
static HeldPipeline *
find_held(const char *name)
{
	if (held == NULL)
		return NULL;
	return hash_search(held, &name, HASH_FIND, NULL);
}

/*
 * Whether this worker serves the pipeline in this pass: it is the
 * pipeline's owner and holds (or has just taken) its lock. Needs a
 * transaction. Outside a relay worker every pipeline is served.
 */
bool
RelayServesPipeline(const char *name)
{
	uint32		hash = pipeline_hash(name);
	HeldPipeline *h;
	LOCKTAG		tag;

	if (find_own_slot() == NULL)
		return true;
	if (!view_valid)
		compute_view();
	if (view_position < 0 || (int) (hash % (uint32) view_nworkers) != view_position)
		return false;

	h = find_held(name);
	if (h == NULL)
	{
		pipeline_lock_tag(&tag, hash);
		if (LockAcquire(&tag, ExclusiveLock, true, true) == LOCKACQUIRE_NOT_AVAIL)
			return false;		/* its former owner still has it */
		{
			char	   *key = MemoryContextStrdup(TopMemoryContext, name);

			h = hash_search(held_table(), &key, HASH_ENTER, NULL);
			h->name = key;
			h->hash = hash;
		}
	}
	h->served = true;
	return true;
}

/*
 * Keeps the lock of a pipeline that has a batch in flight although this
 * reading did not serve it (it moved, or was disabled): it is let go of
 * at a reading after that batch is recorded, never while it is in flight.
 */
void
RelayKeepPipeline(const char *name)
{
	HeldPipeline *h = find_held(name);

	if (h != NULL)
		h->served = true;
}

/*
 * Gives up the pipelines the pass did not serve (moved to another worker,
 * disabled, dropped), wakes the workers if it gave any up, and tells the
 * slot how many it serves; the next question computes a new view. Call it
 * once per reading, after the pipelines were read and those with a batch
 * in flight kept (RelayKeepPipeline), in a transaction.
 */
void
RelayReleaseUnservedPipelines(void)
{
	RelayWorkerSlot *slot = find_own_slot();
	bool		released = false;
	int			kept = 0;
	HASH_SEQ_STATUS seq;
	HeldPipeline *h;

	view_valid = false;
	if (slot == NULL)
		return;
	if (held != NULL)
	{
		hash_seq_init(&seq, held);
		while ((h = hash_seq_search(&seq)) != NULL)
		{
			LOCKTAG		tag;
			char	   *name = h->name;

			if (h->served)
			{
				h->served = false;
				kept++;
				continue;
			}
			pipeline_lock_tag(&tag, h->hash);
			LockRelease(&tag, ExclusiveLock, true);
			/* removing the entry the scan stands on is allowed (dynahash) */
			hash_search(held, &name, HASH_REMOVE, NULL);
			pfree(name);
			released = true;
		}
	}
	SpinLockAcquire(&Relay->mutex);
	slot->npipelines = kept;
	SpinLockRelease(&Relay->mutex);
	/* The new owner sleeps on; a wake request ends its sleep (worker.c). */
	if (released)
		pg_atomic_fetch_add_u64(&Relay->wake_requests, 1);
}
