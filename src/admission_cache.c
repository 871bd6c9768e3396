/*
 * admission_cache.c
 *		What a backend remembers of the last outbox it admitted a publish to:
 *		its position, how far above it the fast path may publish (below
 *		80 % of its inline_threshold, or without bound when no limit holds
 *		it back), and that it exists and is enabled; and when it must
 *		forget it.
 *
 * outbox.c's slow path reads the outbox's config row and position; with
 * them remembered, the next publishes of the backend under READ COMMITTED
 * insert without reading the config row (see the top of outbox.c). An
 * answer is trusted for at most ADMISSION_CACHE_MS, and not at all once
 * tide_outbox_config changed: its statement trigger sends a relcache
 * invalidation of the table at commit, which every backend processes
 * before it next takes a lock it does not hold, and outbox.c asks for them
 * after locking the table it inserts into (outbox_drop locks that table
 * before it deletes the config row, so a publish waiting for the drop sees
 * the invalidation). An answer read while an invalidation arrived is not
 * kept: the generation counter tells.
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "admission_cache.h"
#include "pg_tide.h"

/* How long a backend trusts an outbox's position it read. */
#define ADMISSION_CACHE_MS 1000

typedef struct AdmissionCache
{
	bool		valid;
	char		outbox[NAMEDATALEN];
	int64		position;
	int64		span;			/* the most ids from the position to the last */
	TimestampTz read_at;
	Oid			sequence;		/* the message id sequence it belongs to */
	Oid			config_relid;	/* tide.tide_outbox_config, whose changes clear it */
} AdmissionCache;

static AdmissionCache admission = {false, "", 0, 0, 0, InvalidOid, InvalidOid};

/* Bumped by every invalidation that clears the cache. */
static uint64 admission_generation = 0;
static bool callback_registered = false;

/*
 * Relcache callback: tide_outbox_config changed, or every relation did.
 * The table's oid is looked up again (the extension may have been made
 * anew).
 */
static void
admission_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == admission.config_relid)
	{
		admission.valid = false;
		admission.config_relid = InvalidOid;
		admission_generation++;
	}
}

/*
 * The generation to pass to AdmissionRemember; take it before reading the
 * config row, so that a change of the table during the read is noticed.
 */
uint64
AdmissionGeneration(void)
{
	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(admission_relcache_callback, (Datum) 0);
		callback_registered = true;
	}
	if (!OidIsValid(admission.config_relid))
	{
		Oid			nsp = get_namespace_oid("tide", true);

		if (OidIsValid(nsp))
			admission.config_relid = get_relname_relid("tide_outbox_config", nsp);
	}
	return admission_generation;
}

/*
 * Remembers that the outbox admitted a publish, with its position and the
 * span the fast path may admit above it, read after AdmissionGeneration
 * returned `generation`; forgets instead when an invalidation arrived since.
 */
void
AdmissionRemember(const char *outbox, int64 position, int64 span, uint64 generation)
{
	admission.valid = false;
	if (generation != admission_generation || !OidIsValid(admission.config_relid))
		return;
	strlcpy(admission.outbox, outbox, NAMEDATALEN);
	admission.position = position;
	admission.span = span;
	admission.read_at = GetCurrentTimestamp();
	admission.sequence = TrackerSequenceOid();
	admission.valid = true;
}

/*
 * The outbox's position and admitted span this backend read less than
 * ADMISSION_CACHE_MS ago, with no change to tide_outbox_config processed
 * since. Positions only move forward while a backend remembers one (a
 * rewind or a new group is seen within ADMISSION_CACHE_MS), so an old one
 * only overstates the count.
 */
bool
AdmissionRemembered(const char *outbox, int64 *position, int64 *span)
{
	if (!admission.valid || strcmp(admission.outbox, outbox) != 0 ||
		admission.sequence != TrackerSequenceOid() ||
		TimestampDifferenceExceeds(admission.read_at, GetCurrentTimestamp(), ADMISSION_CACHE_MS))
		return false;
	*position = admission.position;
	*span = admission.span;
	return true;
}
