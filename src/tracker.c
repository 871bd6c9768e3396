/*
 * tracker.c
 *		The publish tracker: never read past a message id that may still
 *		commit, and never make a publisher wait for a reader.
 *
 * Message ids come from one sequence, so a transaction can take id 5, stay
 * open, and commit after id 6 is already visible. A reader that moved past
 * 6 would skip 5 forever. The tracker works in three phases:
 *
 * 1. Register (publisher, first id of a transaction): store in this
 *	  backend's own slot a floor, the sequence's last value read *before*
 *	  nextval, then a full barrier, then nextval. All of the transaction's
 *	  ids are above its floor. Only the publisher writes its slot, with
 *	  atomic stores: it never waits for anyone.
 *
 * 2. Horizon (reader): read the sequence's last value, a full barrier, then
 *	  the floors of every occupied slot of this database. The safe horizon is
 *	  the smallest of them. An id at or below it belongs to a transaction
 *	  that has ended: either it took its id before the reader read the
 *	  sequence and its slot is visible to the reader, or it had left its
 *	  slot already.
 *
 * 3. Clear (publisher, at commit or abort): the slot is emptied in the
 *	  transaction callback, which PostgreSQL runs after the commit became
 *	  visible. A reader therefore reads rows with a snapshot taken after it
 *	  computed the horizon (see consumer.c), never an older one.
 *
 * The sequence is CACHE 1; a per-backend cache would break phase 2.
 * A transaction that published cannot be prepared: a prepared transaction
 * outlives its backend's slot.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "commands/sequence.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "pg_tide.h"

/* One per backend; 0 in floor_plus_one means the slot is empty. */
typedef struct TrackerSlot
{
	pg_atomic_uint64 floor_plus_one;
	pg_atomic_uint64 xact_start;	/* TimestampTz of the publishing xact */
	pg_atomic_uint32 dboid;
} TrackerSlot;

typedef struct TrackerShared
{
	int			nslots;
	TrackerSlot slots[FLEXIBLE_ARRAY_MEMBER];
} TrackerShared;

static TrackerShared *tracker = NULL;

/* Whether the current transaction holds this backend's slot. */
static bool published_in_xact = false;

/* The message id sequence, cached per backend (see sequence_oid()). */
static Oid	cached_sequence = InvalidOid;
static bool sequence_callback_registered = false;

/* Whether this backend has installed its exit hook. */
static bool exit_hook_installed = false;

static void tracker_before_shmem_exit(int code, Datum arg);

PG_FUNCTION_INFO_V1(tide_next_message_id);
PG_FUNCTION_INFO_V1(tide_safe_horizon);
PG_FUNCTION_INFO_V1(tide_oldest_open_publish_age);

/* Shared memory for one slot per backend. */
Size
TrackerShmemSize(void)
{
	return add_size(offsetof(TrackerShared, slots),
					mul_size(MaxBackends, sizeof(TrackerSlot)));
}

/* Lays out the tracker in shared memory on first attach. */
void
TrackerShmemInit(void *place, bool found)
{
	tracker = (TrackerShared *) place;
	if (found)
		return;
	tracker->nslots = MaxBackends;
	for (int i = 0; i < tracker->nslots; i++)
	{
		pg_atomic_init_u64(&tracker->slots[i].floor_plus_one, 0);
		pg_atomic_init_u64(&tracker->slots[i].xact_start, 0);
		pg_atomic_init_u32(&tracker->slots[i].dboid, InvalidOid);
	}
}

/* This backend's slot. */
static TrackerSlot *
my_slot(void)
{
	int			index = TideMyProcIndex();

	if (tracker == NULL || index < 0 || index >= tracker->nslots)
		elog(ERROR, "pg_tide publish tracker has no slot for process index %d", index);
	return &tracker->slots[index];
}

/* Empties this backend's slot; safe to call when it is already empty. */
static void
clear_slot(void)
{
	if (!published_in_xact)
		return;
	pg_atomic_write_u64(&my_slot()->floor_plus_one, 0);
	published_in_xact = false;
}

/* Forgets the cached sequence OID when the sequence may have changed. */
static void
forget_sequence(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == cached_sequence)
		cached_sequence = InvalidOid;
}

/*
 * The OID of the message id sequence of the installed extension, looked up
 * once per backend (every publish and every poll needs it); a relcache
 * invalidation, such as the one DROP EXTENSION sends, clears it.
 */
static Oid
sequence_oid(void)
{
	if (!OidIsValid(cached_sequence))
	{
		Oid			nsp = get_namespace_oid("tide", false);
		Oid			seq = get_relname_relid("tide_outbox_messages_id_seq", nsp);

		if (!OidIsValid(seq))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("sequence \"tide.tide_outbox_messages_id_seq\" does not exist"),
					 errhint("Reinstall the extension with DROP EXTENSION pg_tide; CREATE EXTENSION pg_tide.")));
		if (!sequence_callback_registered)
		{
			CacheRegisterRelcacheCallback(forget_sequence, (Datum) 0);
			sequence_callback_registered = true;
		}
		cached_sequence = seq;
	}
	return cached_sequence;
}

/* The sequence's last value, 0 before its first nextval. */
static int64
sequence_last_value(Oid seq)
{
	LOCAL_FCINFO(fcinfo, 1);
	Datum		result;

	InitFunctionCallInfoData(*fcinfo, NULL, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = ObjectIdGetDatum(seq);
	fcinfo->args[0].isnull = false;
	result = pg_sequence_last_value(fcinfo);
	return fcinfo->isnull ? 0 : DatumGetInt64(result);
}

/* The last message id handed out, 0 when none has been. */
int64
TrackerSequenceLastValue(void)
{
	return sequence_last_value(sequence_oid());
}

/*
 * The next message id: registers the transaction (phase 1) on its first
 * id, then takes the next id. The column default and outbox_publish both
 * take their ids here.
 */
int64
TrackerNextMessageId(void)
{
	Oid			seq;

	TideRequirePreload();
	seq = sequence_oid();

	if (!published_in_xact)
	{
		TrackerSlot *slot = my_slot();
		int64		floor;

		if (!exit_hook_installed)
		{
			before_shmem_exit(tracker_before_shmem_exit, (Datum) 0);
			exit_hook_installed = true;
		}
		floor = sequence_last_value(seq);

		pg_atomic_write_u32(&slot->dboid, MyDatabaseId);
		pg_atomic_write_u64(&slot->xact_start,
							(uint64) GetCurrentTransactionStartTimestamp());
		pg_write_barrier();
		pg_atomic_write_u64(&slot->floor_plus_one, (uint64) floor + 1);
		published_in_xact = true;
		/* The floor must be visible to readers before our id exists. */
		pg_memory_barrier();
	}

	/*
	 * Like an identity column, the right to insert a message carries the
	 * right to take its id: no separate sequence privilege is checked.
	 */
	return nextval_internal(seq, false);
}

/* SQL: tide._next_message_id(), the default of tide_outbox_messages.id */
Datum
tide_next_message_id(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(TrackerNextMessageId());
}

/*
 * The message id sequence's OID: it changes when the extension is created
 * again, and with it every id range a backend remembers.
 */
Oid
TrackerSequenceOid(void)
{
	return sequence_oid();
}

/* Phase 2: the highest id a reader in this database may read up to. */
int64
TrackerSafeHorizon(void)
{
	int64		horizon;

	TideRequirePreload();
	horizon = TrackerSequenceLastValue();
	pg_memory_barrier();

	for (int i = 0; i < tracker->nslots; i++)
	{
		TrackerSlot *slot = &tracker->slots[i];
		uint64		floor_plus_one = pg_atomic_read_u64(&slot->floor_plus_one);

		if (floor_plus_one == 0)
			continue;
		pg_read_barrier();
		if (pg_atomic_read_u32(&slot->dboid) != MyDatabaseId)
			continue;
		if ((int64) floor_plus_one - 1 < horizon)
			horizon = (int64) floor_plus_one - 1;
	}
	return horizon;
}

/* SQL: tide._safe_horizon() */
Datum
tide_safe_horizon(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(TrackerSafeHorizon());
}

/*
 * SQL: tide._oldest_open_publish_age(): seconds since the oldest open
 * publishing transaction of this database began, NULL when there is none.
 * A long one holds back every reader, so status views show it.
 */
Datum
tide_oldest_open_publish_age(PG_FUNCTION_ARGS)
{
	TimestampTz oldest = 0;
	bool		any = false;

	TideRequirePreload();
	for (int i = 0; i < tracker->nslots; i++)
	{
		TrackerSlot *slot = &tracker->slots[i];
		TimestampTz started;

		if (pg_atomic_read_u64(&slot->floor_plus_one) == 0)
			continue;
		pg_read_barrier();
		if (pg_atomic_read_u32(&slot->dboid) != MyDatabaseId)
			continue;
		started = (TimestampTz) pg_atomic_read_u64(&slot->xact_start);
		if (!any || started < oldest)
			oldest = started;
		any = true;
	}
	if (!any)
		PG_RETURN_NULL();
	PG_RETURN_FLOAT8((double) (GetCurrentTimestamp() - oldest) / USECS_PER_SEC);
}

/*
 * Phase 3, and the refusal to prepare. Wakes the database's waiters at
 * commit only, never at abort.
 */
static void
tracker_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			if (published_in_xact)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot prepare a transaction that published to an outbox"),
						 errdetail("A prepared transaction would hold back every reader of the outbox until it is resolved."),
						 errhint("Publish in a transaction that commits directly.")));
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			if (published_in_xact)
			{
				clear_slot();
				WakeDatabase(MyDatabaseId);
			}
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			clear_slot();
			break;
		default:
			break;
	}
}

/* A backend that exits in the middle of a transaction empties its slot. */
static void
tracker_before_shmem_exit(int code, Datum arg)
{
	if (published_in_xact && tracker != NULL)
		clear_slot();
}

/* Installs the transaction callback; runs in the postmaster at preload. */
void
TrackerRegisterXactCallback(void)
{
	RegisterXactCallback(tracker_xact_callback, NULL);
}
