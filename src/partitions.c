/*
 * partitions.c
 *		Where a publish writes: the child table of tide_outbox_messages that
 *		holds its id, or the parent table when none does.
 *
 * The message table has children, one range of ids each, listed in
 * tide.tide_outbox_partitions (sql/install/01_catalog.sql). They are made
 * ahead of the ids handed out by tide._outbox_partitions_maintain() and
 * dropped whole by retention (sql/functions/12_retention.sql), so that
 * retention never deletes row by row. A publish takes its ids first
 * (tracker.c), then asks here for the table to insert them into:
 *
 * 1. Cached: each backend remembers a few children (their ranges and
 *	  names) and the saved INSERT plans for them; a child that holds the
 *	  ids and still exists is the answer, without a query.
 * 2. Looked up: when the ids lie beyond what the backend last looked up,
 *	  it reads tide_outbox_partitions again (an index scan; once per child,
 *	  or once per RECHECK_IDS ids while there is none).
 * 3. Otherwise the parent table: a publish never waits for a child to be
 *	  made and never fails for lack of one, and a database whose relay
 *	  worker does not run (or a 0.1.0 catalog, which has no children) keeps
 *	  publishing into the parent, where retention deletes row by row.
 *
 * A child is dropped only once all its ids were handed out by transactions
 * that have ended, so an id taken now is never in a dropped child; the
 * existence check covers a sequence that was reset below old ranges (a
 * remembered child that is gone makes the backend look up again).
 *
 * Also tide._outbox_partition_adopt(), which ties a new child to the
 * extension (TidePartitionAdopt; a restore's children too).
 */
#include "postgres.h"

#include "catalog/dependency.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"

#include "pg_tide.h"
#include "partitions.h"

PG_FUNCTION_INFO_V1(tide_outbox_partition_adopt);

/* Ids per child table, read by tide._outbox_partitions_maintain(). */
int			TidePartitionSize = 1000000;

/* How many ids a backend publishes into the parent before looking again. */
#define RECHECK_IDS 1000

/* How many children a backend remembers. */
#define CACHED_CHILDREN 4

static PublishTarget parent_target = {0, PG_INT64_MAX, "tide_outbox_messages", InvalidOid, {NULL}};
static PublishTarget children[CACHED_CHILDREN];
static int	nchildren = 0;

/* Ids up to this were looked up in tide_outbox_partitions. */
static int64 looked_up_to = 0;

/* The sequence the cache belongs to (a new extension starts it anew). */
static Oid	cache_sequence = InvalidOid;

static SPIPlanPtr lookup_plan = NULL;

/* Defines pg_tide.partition_size; called by _PG_init. */
void
TideDefinePartitionGucs(void)
{
	DefineCustomIntVariable("pg_tide.partition_size",
							"Message ids per child table of tide.tide_outbox_messages.",
							"Retention drops a child table whole once every consumer has passed "
							"it; smaller children free space sooner, larger ones mean fewer tables.",
							&TidePartitionSize,
							1000000, 1000, INT_MAX / 4,
							PGC_SUSET, 0,
							NULL, NULL, NULL);
}

/* Frees a target's saved plans. */
static void
forget_plans(PublishTarget *target)
{
	for (int i = 0; i < PUBLISH_PLANS; i++)
	{
		if (target->plans[i] != NULL)
			SPI_freeplan(target->plans[i]);
		target->plans[i] = NULL;
	}
}

/* Forgets every child. */
static void
forget_children(void)
{
	for (int i = 0; i < nchildren; i++)
		forget_plans(&children[i]);
	nchildren = 0;
	looked_up_to = 0;
}

/* The OID of the table tide.<name>, InvalidOid when it does not exist. */
static Oid
tide_table(const char *name)
{
	Oid			nsp = get_namespace_oid("tide", true);

	return OidIsValid(nsp) ? get_relname_relid(name, nsp) : InvalidOid;
}

/*
 * The remembered child that holds ids first to last and still exists.
 * *gone tells that the one remembered for them no longer exists.
 */
static PublishTarget *
cached_child(int64 first, int64 last, bool *gone)
{
	*gone = false;
	for (int i = 0; i < nchildren; i++)
	{
		PublishTarget *child = &children[i];

		if (child->first_id <= first && last <= child->last_id)
		{
			Oid			relid = tide_table(child->table);

			if (!OidIsValid(relid))
			{
				*gone = true;
				return NULL;
			}
			/* A table made anew under the same name: new plans. */
			if (relid != child->relid)
			{
				forget_plans(child);
				child->relid = relid;
			}
			return child;
		}
	}
	return NULL;
}

/* Reads the children that hold ids from `first` on (phase 2). */
static void
look_up_children(int64 first, int64 last)
{
	Oid			types[1] = {INT8OID};
	Datum		args[1];

	forget_children();
	looked_up_to = last + RECHECK_IDS;
	/* A catalog without children (0.1.0) publishes into the parent. */
	if (!OidIsValid(tide_table("tide_outbox_partitions")))
		return;

	args[0] = Int64GetDatum(first);
	if (SPI_execute_plan(TidePlan(&lookup_plan,
								  "SELECT p.first_id, p.last_id, p.table_name FROM tide.tide_outbox_partitions p"
								  " WHERE p.last_id OPERATOR(pg_catalog.>=) $1 ORDER BY p.first_id LIMIT 4",
								  1, types),
						 args, NULL, true, CACHED_CHILDREN) != SPI_OK_SELECT)
		elog(ERROR, "could not read tide.tide_outbox_partitions");
	for (uint64 i = 0; i < SPI_processed && nchildren < CACHED_CHILDREN; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		PublishTarget *child = &children[nchildren++];
		bool		isnull;
		char	   *name;

		child->first_id = DatumGetInt64(SPI_getbinval(row, desc, 1, &isnull));
		child->last_id = DatumGetInt64(SPI_getbinval(row, desc, 2, &isnull));
		name = SPI_getvalue(row, desc, 3);
		strlcpy(child->table, name, NAMEDATALEN);
		child->relid = tide_table(child->table);
		memset(child->plans, 0, sizeof(child->plans));
		if (child->last_id > looked_up_to)
			looked_up_to = child->last_id;
	}
}

/*
 * The table to insert the messages with ids first to last (in that order)
 * into: a child table that holds them all, else the parent. Runs inside the
 * publish's SPI connection.
 */
PublishTarget *
PartitionTargetFor(int64 first, int64 last)
{
	PublishTarget *child;
	Oid			seq = TrackerSequenceOid();
	bool		gone;

	if (seq != cache_sequence)
	{
		forget_children();
		forget_plans(&parent_target);
		parent_target.relid = InvalidOid;
		cache_sequence = seq;
	}
	child = cached_child(first, last, &gone);
	if (child == NULL && (gone || last > looked_up_to))
	{
		look_up_children(first, last);
		child = cached_child(first, last, &gone);
	}
	if (child)
		return child;
	if (!OidIsValid(parent_target.relid))
	{
		parent_target.relid = tide_table(parent_target.table);
		if (!OidIsValid(parent_target.relid))
			elog(ERROR, "relation tide.%s does not exist", parent_target.table);
	}
	return &parent_target;
}

/*
 * SQL: tide._outbox_partition_adopt(p_child regclass). A child table made
 * after CREATE EXTENSION is not a member of the extension (pg_dump then
 * dumps it with its rows, and restores it under the restored parent); an
 * automatic dependency on the extension lets DROP EXTENSION drop it with
 * the parent rather than refuse.
 */
Datum
tide_outbox_partition_adopt(PG_FUNCTION_ARGS)
{
	TidePartitionAdopt(PG_GETARG_OID(0));
	PG_RETURN_VOID();
}

/*
 * Makes child table `relid` depend on the extension (automatically), so
 * that DROP EXTENSION drops it; for tide._outbox_partition_adopt() and
 * for a child that a restore creates (relay/restore.c).
 */
void
TidePartitionAdopt(Oid relid)
{
	ObjectAddress child;
	ObjectAddress extension;

	ObjectAddressSet(child, RelationRelationId, relid);
	ObjectAddressSet(extension, ExtensionRelationId, get_extension_oid("pg_tide", false));
	recordDependencyOn(&child, &extension, DEPENDENCY_AUTO);
}
