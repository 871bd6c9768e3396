/*
 * units.c
 *		The relay worker's table of units (flow.h): one per enabled row of
 *		a flow's catalog table that this worker serves, by flow and name.
 *
 * Reading (RelayReadUnits): in one short transaction, each flow of the
 * table of flows (flows.c) reads its enabled rows; a row whose config md5
 * is unchanged keeps the reading its unit has (RelayUnitIsCurrent). A unit
 * with an operation in flight takes its new reading once the operation is
 * done; one no longer listed is let go of. The readings happen when SQL
 * changed pipelines or queues, after a reload, and every
 * pg_tide.relay_naptime_ms.
 *
 * Scanning (RelayScanUnits): when something may be due, every unit
 * without an operation in flight is looked at: a hold whose time is up
 * lets it try again; one neither held nor paced takes its step. Units
 * that would only look for work may look together first, in one statement
 * per flow (the flow's look_together); those that found nothing take no
 * step.
 *
 * A unit's state (its holds, pacing, errors) lives in the worker's memory
 * and is lost when the worker restarts, which only means an early attempt:
 * what must survive a crash (offsets, positions, queues, dead letters) is
 * in tables.
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "engine.h"
#include "pg_tide.h"
#include "relay_init.h"

/* The key of a unit: its flow and its name, the first fields of RelayUnit. */
typedef struct UnitKey
{
	const RelayFlowRoutine *flow;
	const char *name;
} UnitKey;

/* The units by flow and name. */
static HTAB *units = NULL;

/* pg_tide.relay_naptime_ms: how often the units are read without being asked. */
int			RelayNaptimeMs = 1000;

/* The units are to be read again (SQL changed them, a reload, a unit let go). */
static bool reading_needed = true;
/* The next reading opens every unit again, changed or not (after a reload). */
static bool reopen_readings = false;
/* When the units are read again at the latest (the naptime). */
static TimestampTz next_reading_at = 0;
/* Relay->wake_requests at the last reading: SQL changed pipelines or queues. */
static uint64 seen_wake_requests = 0;
/* Whether an enabled unit exists: only then do commits wake the worker. */
static bool has_work = false;

/* When the loop must look at the units again for a time (a hold, a retry, pacing), or 0. */
static TimestampTz earliest_due = 0;
/* A unit may have something to do now: look at every one. */
static bool scan_needed = true;

/* Defines pg_tide.relay_naptime_ms; called from _PG_init. */
void
RelayDefineUnitsGucs(void)
{
	DefineCustomIntVariable("pg_tide.relay_naptime_ms",
							"How long a relay worker sleeps when no commit wakes it.",
							"A publishing commit wakes its database's worker at once; this "
							"is only the fallback look.",
							&RelayNaptimeMs,
							1000, 10, 24 * 3600 * 1000,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/* Notes a time the worker must wake at for a unit. */
void
RelayWakeAt(TimestampTz t)
{
	if (t != 0 && t != DT_NOEND && (earliest_due == 0 || t < earliest_due))
		earliest_due = t;
}

/* A unit may have something to do now: the next turn looks at every one. */
void
RelayScanNeeded(void)
{
	scan_needed = true;
}

/* Whether the units are to be looked at now. */
bool
RelayScanDue(TimestampTz now)
{
	return scan_needed || (earliest_due != 0 && now >= earliest_due);
}

/* When the units are to be looked at: 0 now, else the earliest time noted, or DT_NOEND. */
TimestampTz
RelayScanWakeAt(void)
{
	if (scan_needed || reading_needed)
		return 0;
	return earliest_due != 0 ? earliest_due : DT_NOEND;
}

/* The units are read again at the next turn; with `reopen`, every one is opened again. */
void
RelayReadUnitsAgain(bool reopen)
{
	reading_needed = true;
	if (reopen)
		reopen_readings = true;
}

/* Whether the units are to be read now. */
bool
RelayReadingDue(TimestampTz now)
{
	if (pg_atomic_read_u64(&Relay->wake_requests) != seen_wake_requests)
		reading_needed = true;
	return reading_needed || now >= next_reading_at;
}

/* When the units are read again at the latest. */
TimestampTz
RelayNextReadingAt(void)
{
	return next_reading_at;
}

/* Whether the last reading found an enabled unit. */
bool
RelayUnitsEnabled(void)
{
	return has_work;
}

/* Hashes a unit's key: its flow and name. */
static uint32
unit_hash(const void *key, Size keysize)
{
	const UnitKey *k = key;

	return hash_combine(hash_bytes((const unsigned char *) &k->flow, sizeof(k->flow)),
						hash_bytes((const unsigned char *) k->name, strlen(k->name)));
}

/* Compares two units' keys. */
static int
unit_match(const void *key1, const void *key2, Size keysize)
{
	const UnitKey *a = key1;
	const UnitKey *b = key2;

	if (a->flow != b->flow)
		return 1;
	return strcmp(a->name, b->name);
}

/* The unit of `flow` named `name`, or NULL. */
RelayUnit *
RelayUnitFind(const RelayFlowRoutine *flow, const char *name)
{
	UnitKey		key = {flow, name};

	if (units == NULL)
		return NULL;
	return hash_search(units, &key, HASH_FIND, NULL);
}

/* The unit of `flow` named `name`, created when missing. */
static RelayUnit *
unit_get(const RelayFlowRoutine *flow, const char *name)
{
	UnitKey		key = {flow, name};
	RelayUnit  *u;
	bool		found;

	StaticAssertStmt(offsetof(RelayUnit, flow) == offsetof(UnitKey, flow) &&
					 offsetof(RelayUnit, name) == offsetof(UnitKey, name),
					 "a unit begins with its key");
	if (units == NULL)
	{
		HASHCTL		ctl;

		memset(&ctl, 0, sizeof(ctl));
		ctl.keysize = sizeof(UnitKey);
		ctl.entrysize = sizeof(RelayUnit);
		ctl.hash = unit_hash;
		ctl.match = unit_match;
		ctl.hcxt = TopMemoryContext;
		units = hash_create("pg_tide relay units", 1024, &ctl,
							HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);
	}
	u = hash_search(units, &key, HASH_ENTER, &found);
	if (!found)
	{
		char	   *stored = MemoryContextStrdup(TopMemoryContext, name);

		memset(u, 0, sizeof(*u));
		u->flow = flow;
		u->name = stored;
		if (flow->unit_size > 0)
			u->flow_private = MemoryContextAllocZero(TopMemoryContext, flow->unit_size);
	}
	return u;
}

/* Ends a reading of a unit: the flow's state of it, then its memory. */
void
RelayUnitReleaseReading(RelayUnitReading *r)
{
	MemoryContext cxt;

	if (r == NULL)
		return;
	cxt = r->cxt;
	r->flow->close(r);
	MemoryContextDelete(cxt);
}

/*
 * Serves a unit with a new reading of its config; a new or changed config
 * (a fixed URL, say) is tried at once.
 */
void
RelayUnitTakeReading(RelayUnit *u, RelayUnitReading *r)
{
	RelayUnitReleaseReading(u->reading);
	u->reading = r;
	if (strcmp(u->config_md5, r->config_md5) != 0)
	{
		strlcpy(u->config_md5, r->config_md5, sizeof(u->config_md5));
		RelayEndHold(u, "its config changed");
		RelayEndErrors(u, "its config changed");
		u->paced_until = 0;
		if (u->flow->config_changed)
			u->flow->config_changed(u);
	}
}

/*
 * Whether the reading unit `name` of `flow` is served with (or takes after
 * its operation in flight) has config md5 `md5`, so that the reading keeps
 * it instead of parsing and opening it again. One that read secrets is
 * read again: a secret may have changed.
 */
bool
RelayUnitIsCurrent(const RelayFlowRoutine *flow, const char *name, const char *md5)
{
	RelayUnit  *u = RelayUnitFind(flow, name);
	const RelayUnitReading *r;

	if (u == NULL)
		return false;
	r = u->next_reading != NULL ? u->next_reading : u->reading;
	return r != NULL && !r->reads_secrets && strcmp(r->config_md5, md5) == 0;
}

/*
 * Whether this database's pg_tide catalog is the version the library was
 * built for (see src/catalog_version.c); needs a transaction. While it is
 * not, the worker delivers nothing and says why once: an older catalog
 * lacks what the library's statements use until ALTER EXTENSION pg_tide
 * UPDATE, a newer one needs the newer library.
 */
static bool
catalog_is_current(void)
{
	static char reported[NAMEDATALEN] = "";
	char	   *installed = TideInstalledVersion();
	int			cmp;

	if (installed == NULL)
		return false;
	cmp = TideCompareVersions(installed, TIDE_CATALOG_VERSION);
	if (cmp == 0)
	{
		if (reported[0] != '\0')
			ereport(LOG,
					(errmsg("pg_tide relay worker for database \"%s\" delivers again: its catalog is version %s",
							get_database_name(MyDatabaseId), installed)));
		reported[0] = '\0';
		return true;
	}
	if (strcmp(reported, installed) != 0)
	{
		strlcpy(reported, installed, sizeof(reported));
		ereport(LOG,
				(errmsg("pg_tide relay worker for database \"%s\" waits: its pg_tide catalog is version %s, the library's is %s",
						get_database_name(MyDatabaseId), installed, TIDE_CATALOG_VERSION),
				 cmp < 0 ?
				 errhint("Run ALTER EXTENSION pg_tide UPDATE in that database; nothing is delivered until then.") :
				 errhint("Install pg_tide %s (or later) and restart the server; nothing is delivered until then.",
						 installed)));
	}
	return false;
}

/* The number of flows in the table of flows. */
static int
count_flows(void)
{
	int			n = 0;

	while (RelayFlows[n] != NULL)
		n++;
	return n;
}

/*
 * Reads the units in a short transaction (nothing while the catalog is
 * not the library's version), each flow its own table, and serves each
 * unit with its new reading: one with an operation in flight takes it once
 * the operation is done, one no longer listed is let go of. Every unit
 * then looks for work, as after a commit. Returns false when pg_tide is no
 * longer installed in this database. Not inlined into the PG_TRY of
 * RelayWorkerMain, where its locals could be clobbered by the longjmp of
 * an ERROR.
 */
pg_noinline bool
RelayReadUnits(RelayWorkerSlot *slot)
{
	MemoryContext loop_cxt = RelayLoopContext();
	int			nflows = count_flows();
	RelayFlowReading *readings = palloc0(sizeof(RelayFlowReading) * Max(nflows, 1));
	bool		installed;
	bool		current;
	bool		asked;
	ListCell   *lc;
	HASH_SEQ_STATUS seq;
	RelayUnit  *u;

	reading_needed = false;
	next_reading_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), RelayNaptimeMs);
	asked = pg_atomic_read_u64(&Relay->wake_requests) != seen_wake_requests;
	seen_wake_requests = pg_atomic_read_u64(&Relay->wake_requests);

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "pg_tide relay: looking for work");

	installed = OidIsValid(get_extension_oid("pg_tide", true));
	if (installed && !slot->serving)
	{
		SpinLockAcquire(&Relay->mutex);
		slot->serving = true;
		SpinLockRelease(&Relay->mutex);
	}
	has_work = false;
	/* while a restore loads the database, the worker writes nothing there (restore.c) */
	current = installed && catalog_is_current() && !RelayRestoreInProgress();
	if (current)
	{
		for (int f = 0; f < nflows; f++)
		{
			readings[f].cxt = loop_cxt;
			readings[f].reopen = reopen_readings;
			/* what a flow allocates without choosing lives until the reading is done */
			MemoryContextSwitchTo(loop_cxt);
			RelayFlows[f]->read(&readings[f]);
			MemoryContextSwitchTo(loop_cxt);
			has_work |= readings[f].any_enabled;
		}
		reopen_readings = false;
	}

	/*
	 * Give up the units now served elsewhere (ownership.c), but not one
	 * whose operation is still in flight: it goes at a reading after its
	 * record.
	 */
	if (units != NULL)
	{
		hash_seq_init(&seq, units);
		while ((u = hash_seq_search(&seq)) != NULL)
			if (u->op != NULL)
				RelayKeepPipeline(u->name);
	}
	RelayReleaseUnservedPipelines();

	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	MemoryContextSwitchTo(loop_cxt);

	if (units != NULL)
	{
		hash_seq_init(&seq, units);
		while ((u = hash_seq_search(&seq)) != NULL)
			u->listed = false;
	}
	for (int f = 0; f < nflows; f++)
	{
		/* an unchanged unit keeps the reading it is served with */
		foreach(lc, readings[f].kept)
			unit_get(RelayFlows[f], lfirst(lc))->listed = true;
		foreach(lc, readings[f].units)
		{
			RelayUnitReading *r = lfirst(lc);

			r->flow = RelayFlows[f];
			u = unit_get(RelayFlows[f], r->name);
			u->listed = true;
			MemoryContextSetParent(r->cxt, RelayEngineContext());
			if (u->op != NULL)
			{
				RelayUnitReleaseReading(u->next_reading);
				u->next_reading = r;
			}
			else
				RelayUnitTakeReading(u, r);
		}
	}
	if (units != NULL)
	{
		hash_seq_init(&seq, units);
		while ((u = hash_seq_search(&seq)) != NULL)
		{
			/* SQL changed pipelines or queued retries: every queue is looked at */
			if (asked && u->flow->sql_changed)
				u->flow->sql_changed(u);
			u->look = true;
			if (!u->listed && u->op == NULL)
			{
				RelayUnitReleaseReading(u->reading);
				u->reading = NULL;
				RelayLogUnitLetGo(u, "this worker no longer serves it (disabled, deleted or moved)");
				if (u->flow->let_go)
					u->flow->let_go(u);
			}
		}
	}
	scan_needed = true;
	/* with no transaction open: what a flow does once it has read (its periodic jobs) */
	for (int f = 0; current && f < nflows; f++)
		if (RelayFlows[f]->after_read != NULL)
		{
			RelayFlows[f]->after_read(readings[f].units);
			MemoryContextSwitchTo(loop_cxt);
		}
	MemoryContextReset(loop_cxt);
	return installed;
}

/* A publishing commit: every unit looks for its work. */
void
RelayUnitsLookForWork(void)
{
	HASH_SEQ_STATUS seq;
	RelayUnit  *u;

	if (units != NULL)
	{
		hash_seq_init(&seq, units);
		while ((u = hash_seq_search(&seq)) != NULL)
			u->look = true;
	}
	scan_needed = true;
}

/*
 * Of the units about to take their step, each flow asks about those that
 * would only look for work together (its look_together).
 */
static void
look_together(RelayUnit **all, long n, TimestampTz now)
{
	RelayUnit **mine = palloc(sizeof(RelayUnit *) * Max(n, 1));

	for (int f = 0; RelayFlows[f] != NULL; f++)
	{
		int			nmine = 0;

		if (RelayFlows[f]->look_together == NULL)
			continue;
		for (long i = 0; i < n; i++)
			if (all[i]->flow == RelayFlows[f])
				mine[nmine++] = all[i];
		if (nmine > 0)
			RelayFlows[f]->look_together(mine, nmine, now);
		MemoryContextSwitchTo(RelayLoopContext());
	}
	pfree(mine);
}

/* A unit's step: its flow's. */
static void
step_unit(RelayUnit *u)
{
	u->flow->step(u);
}

/*
 * Looks at every unit without an operation in flight: a hold whose time
 * is up lets it try again; one that may start (not held, not paced) takes
 * its step. Notes when the next look is due for a time.
 */
void
RelayScanUnits(RelayWorkerSlot *slot)
{
	HASH_SEQ_STATUS seq;
	RelayUnit  *u;
	RelayUnit **all;
	long		n = 0;
	TimestampTz now = GetCurrentTimestamp();

	scan_needed = false;
	earliest_due = 0;
	pg_atomic_fetch_add_u64(&slot->passes, 1);
	if (units == NULL || RelayEngineRetiring())
		return;

	/*
	 * The steps run transactions, which end any hash_seq_search scan: the
	 * units to look at are taken first.
	 */
	all = MemoryContextAlloc(RelayEngineContext(),
							 sizeof(RelayUnit *) * Max(hash_get_num_entries(units), 1));
	hash_seq_init(&seq, units);
	while ((u = hash_seq_search(&seq)) != NULL)
		if (u->reading != NULL && u->op == NULL)
			all[n++] = u;
	for (long i = 0; i < n; i++)
	{
		u = all[i];
		if (u->held_until > now)
		{
			RelayWakeAt(u->held_until);
			continue;
		}
		if (u->held_until != 0)
		{
			/* the hold's time is up: try again, new work too */
			u->held_until = 0;
			u->look = true;
		}
		if (u->paced_until > now)
		{
			RelayWakeAt(u->paced_until);
			continue;
		}
		u->paced_until = 0;
	}
	look_together(all, n, now);
	for (long i = 0; i < n; i++)
	{
		u = all[i];
		if (u->held_until > now || u->paced_until > now)
			continue;
		RelayRunForUnit(u, step_unit);
		if (u->op == NULL)
		{
			RelayWakeAt(u->held_until);
			RelayWakeAt(u->paced_until);
			if (u->flow->next_due)
				RelayWakeAt(u->flow->next_due(u));
		}
	}
	pfree(all);
}
