/*
 * commit.c
 *		Acknowledging a consumer's lease up to an offset: the work of
 *		tide.commit_offset() and of the commit that tide.poll_outbox(...,
 *		p_commit_upto) makes before it polls (src/consumer.c), and of the
 *		relay's record (relay/lease.c, through tide.commit_offset()).
 *
 * The caller has connected SPI, become the catalog's owner and checked the
 * caller's right and the group's name (consume_begin). Then, as one step of
 * the caller's transaction:
 *
 * 1. the consumer's offset row is locked (FOR NO KEY UPDATE): its polls,
 *	  commits and lease changes run one at a time; no group lock is taken,
 *	  as a commit changes only the consumer's own rows;
 * 2. its lease row is locked; after a takeover that waited for the offset
 *	  row, this reads what the other poll left: no row, or the part of the
 *	  lease it did not take;
 * 3. the offset the consumer committed last, committed again, is a
 *	  harmless retry (only its heartbeat moves); any other offset must lie
 *	  within the lease, which then shrinks to what follows the offset, or
 *	  goes, and the committed offset moves to it. An offset never moves
 *	  backwards.
 *
 * Errors, with their SQLSTATEs and hints, are those of docs/consumer-groups.md.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"

#include "pg_tide.h"

static SPIPlanPtr lock_offset_plan = NULL;
static SPIPlanPtr group_exists_plan = NULL;
static SPIPlanPtr heartbeat_plan = NULL;
static SPIPlanPtr drop_lease_plan = NULL;
static SPIPlanPtr shrink_lease_plan = NULL;
static SPIPlanPtr move_offset_plan = NULL;

/* Runs a plan over (group, consumer[, offset]); an ERROR when it fails. */
static void
run(SPIPlanPtr plan, Datum *args, int expect)
{
	if (SPI_execute_plan(plan, args, NULL, false, 0) != expect)
		elog(ERROR, "pg_tide could not acknowledge a lease");
}

/*
 * Locks the consumer's offset row; returns whether it exists, with its
 * committed offset. An unknown group is an error here, before anything
 * else is looked at.
 */
static bool
lock_offset(Datum *args, const char *group, int64 *committed)
{
	Oid			types[2] = {TEXTOID, TEXTOID};
	bool		isnull;

	run(TidePlan(&lock_offset_plan,
				 "SELECT committed_offset FROM tide.tide_consumer_offsets"
				 " WHERE group_name OPERATOR(pg_catalog.=) $1 AND consumer_id OPERATOR(pg_catalog.=) $2"
				 " FOR NO KEY UPDATE",
				 2, types),
		args, SPI_OK_SELECT);
	if (SPI_processed > 0)
	{
		*committed = TideSpiInt64(1, &isnull);
		return !isnull;
	}
	run(TidePlan(&group_exists_plan,
				 "SELECT FROM tide.tide_consumer_groups WHERE group_name OPERATOR(pg_catalog.=) $1",
				 1, types),
		args, SPI_OK_SELECT);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("consumer group \"%s\" does not exist", group),
				 errhint("Create it with tide.create_consumer_group().")));
	return false;
}

/* Refuses an offset the lease [start, end] does not allow (step 3). */
static void
check_offset(const char *group, const char *consumer, int64 last, int64 committed,
			 bool has_lease, int64 start, int64 end)
{
	if (!has_lease)
	{
		if (last < committed)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("offset " INT64_FORMAT " is behind the committed offset " INT64_FORMAT " of consumer \"%s\"",
							last, committed, consumer),
					 errhint("Offsets only move forward; an operator can use tide.admin_rewind_offset().")));
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("consumer \"%s\" holds no lease in group \"%s\"", consumer, group),
				 errhint("The lease expired and was handed to another consumer, or was released; poll again.")));
	}
	if (last < start)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("offset " INT64_FORMAT " is behind the lease of consumer \"%s\", which starts at " INT64_FORMAT,
						last, consumer, start),
				 errhint("Offsets only move forward; what lies before the lease was acknowledged, "
						 "or handed to another consumer when the lease expired.")));
	if (last > end)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("offset " INT64_FORMAT " is beyond the lease of consumer \"%s\", which ends at " INT64_FORMAT,
						last, consumer, end),
				 errhint("Commit the id of the last message tide.poll_outbox() returned to you.")));
}

/*
 * Acknowledges the consumer's lease up to `last` (the steps at the top of
 * the file); `last_isnull` for an offset given as null, an error once the
 * group is known to exist.
 */
void
TideCommitOffset(Datum group_datum, Datum consumer_datum, bool last_isnull, int64 last)
{
	Oid			types[3] = {TEXTOID, TEXTOID, INT8OID};
	Datum		args[3] = {group_datum, consumer_datum, Int64GetDatum(last)};
	char	   *group = TextDatumGetCString(group_datum);
	char	   *consumer = TextDatumGetCString(consumer_datum);
	int64		committed = 0;
	bool		known;
	bool		has_lease;
	int64		start = 0;
	int64		end = 0;

	known = lock_offset(args, group, &committed);
	if (last_isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("offset must not be null"),
				 errhint("Pass the id of the last message you processed.")));
	if (!known)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("consumer \"%s\" is not known in group \"%s\"", consumer, group),
				 errhint("A consumer joins its group with its first tide.poll_outbox().")));

	has_lease = TideLockOwnLease(args[0], args[1], &start, &end);
	if (last == committed && (!has_lease || last < start))
	{
		run(TidePlan(&heartbeat_plan,
					 "UPDATE tide.tide_consumer_offsets SET last_heartbeat = pg_catalog.now()"
					 " WHERE group_name OPERATOR(pg_catalog.=) $1 AND consumer_id OPERATOR(pg_catalog.=) $2",
					 2, types),
			args, SPI_OK_UPDATE);
		return;
	}
	check_offset(group, consumer, last, committed, has_lease, start, end);

	if (last == end)
		run(TidePlan(&drop_lease_plan,
					 "DELETE FROM tide.tide_consumer_leases"
					 " WHERE group_name OPERATOR(pg_catalog.=) $1 AND consumer_id OPERATOR(pg_catalog.=) $2",
					 2, types),
			args, SPI_OK_DELETE);
	else
		run(TidePlan(&shrink_lease_plan,
					 "UPDATE tide.tide_consumer_leases SET lease_start = $3 OPERATOR(pg_catalog.+) 1"
					 " WHERE group_name OPERATOR(pg_catalog.=) $1 AND consumer_id OPERATOR(pg_catalog.=) $2",
					 3, types),
			args, SPI_OK_UPDATE);
	run(TidePlan(&move_offset_plan,
				 "UPDATE tide.tide_consumer_offsets"
				 "   SET committed_offset = $3, last_heartbeat = pg_catalog.now()"
				 " WHERE group_name OPERATOR(pg_catalog.=) $1 AND consumer_id OPERATOR(pg_catalog.=) $2",
				 3, types),
		args, SPI_OK_UPDATE);
}
