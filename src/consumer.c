/*
 * consumer.c
 *		Consumer groups over SQL: tide.poll_outbox() and
 *		tide.wait_for_messages() (and its pg_tide.wait_recheck_ms);
 *		tide.commit_offset() (whose work is src/commit.c's),
 *		consumer_heartbeat(), extend_lease() and release_lease() (whose work
 *		is SQL in the install script: tide._consumer_heartbeat(), ...).
 *
 * Every one of them runs as its caller, checks that the caller may consume
 * from the group (src/outbox_rights.c), and then reads and writes as the
 * catalog's owner, as publishing does.
 *
 * A group reads every message of its outbox; its consumers share the work
 * through leases, at most one per consumer, each an id range [lease_start,
 * lease_end] held until expires_at. The group row's leased_upto is the
 * highest id handed out so far; every id up to it is either acknowledged or
 * inside some lease. A poll, after acknowledging the consumer's last batch
 * up to p_commit_upto when given (src/commit.c, in the same transaction:
 * one commit per batch):
 *
 * 1. returns the consumer's own lease again, with a fresh expiry, if it
 *	  holds one (a consumer that restarts gets its batch back at once);
 * 2. otherwise takes over the expired lease of the group with the lowest
 *	  ids, or its first p_batch_size messages, leaving the rest expired;
 * 3. otherwise leases the next messages above leased_upto, never above the
 *	  publish tracker's safe horizon, read with a snapshot taken after the
 *	  horizon was computed, and moves leased_upto to the last of them.
 *
 * Locks, always in this order, so that no two calls deadlock: the
 * consumer's offset row (its polls, commits and lease changes run one at a
 * time), then lease rows (its own; an expired one it takes over, skipping
 * those another call holds), then, for step 3 only, the group row. Only
 * polls that hand out new messages, and rewinds, wait for each other;
 * commits, takeovers and a consumer's own lease never wait for another
 * consumer's poll. A takeover and the old holder's commit meet on the
 * lease row: whichever comes second sees what the first left (publishers
 * never touch these rows).
 *
 * Expired messages (expires_at at or before the poll's clock) are passed,
 * not returned: they stay in the lease, so that the consumer's commit of
 * the messages after them moves the offset past them as past returned ones,
 * and the consumer's offset row counts them (expired) when they are leased
 * for the first time (step 3), not when a lease is handed out again: a
 * consumer commits up to the last message it was shown, so the expired
 * ones after it come back in its lease. A poll whose leased messages all
 * expired commits them itself and polls again, so that a consumer never
 * holds a lease it was shown nothing of. The relay's polls (TidePoll,
 * TidePollAhead) get them marked instead: it dead-letters them
 * (relay/flow_forward.c).
 *
 * TidePollAhead(), for the relay alone, leases a consumer's next batch
 * while it still works on the one it holds: the messages of its lease after
 * the batch, or else new messages that lengthen its lease at its end (only
 * when the lease ends at leased_upto and no lease of the group is expired,
 * so that nothing is taken out of turn). A consumer keeps holding one
 * lease; committing the first batch shrinks it to the next one.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "pg_tide.h"

PG_FUNCTION_INFO_V1(tide_poll_outbox);
PG_FUNCTION_INFO_V1(tide_wait_for_messages);
PG_FUNCTION_INFO_V1(tide_commit_offset);
PG_FUNCTION_INFO_V1(tide_consumer_heartbeat);
PG_FUNCTION_INFO_V1(tide_extend_lease);
PG_FUNCTION_INFO_V1(tide_release_lease);

#define MAX_BATCH_SIZE 10000
/* A lease lasts at most a day: a consumer that died holds it no longer. */
#define MAX_VISIBILITY_SECONDS 86400
/* tide.wait_for_messages waits at most an hour. */
#define MAX_WAIT_MS (3600 * 1000)
/* Batches of expired messages one poll passes at most before it returns. */
#define MAX_EXPIRED_BATCHES 10

/* pg_tide.wait_recheck_ms */
static int	wait_recheck_ms = 1000;

static SPIPlanPtr lock_group_plan = NULL;
static SPIPlanPtr peek_group_plan = NULL;
static SPIPlanPtr read_group_plan = NULL;
static SPIPlanPtr join_plan = NULL;
static SPIPlanPtr join_quiet_plan = NULL;
static SPIPlanPtr own_lease_plan = NULL;
static SPIPlanPtr expired_lease_plan = NULL;
static SPIPlanPtr fetch_plan = NULL;
static SPIPlanPtr fetch_expiry_plan = NULL;
static SPIPlanPtr count_expired_plan = NULL;
static SPIPlanPtr groups_with_messages_plan = NULL;
static SPIPlanPtr set_lease_plan = NULL;
static SPIPlanPtr shrink_lease_plan = NULL;
static SPIPlanPtr delete_lease_plan = NULL;
static SPIPlanPtr advance_plan = NULL;
static SPIPlanPtr others_expired_plan = NULL;
static SPIPlanPtr heartbeat_plan = NULL;
static SPIPlanPtr extend_lease_plan = NULL;
static SPIPlanPtr release_lease_plan = NULL;

/* Defines the settings of this file; called by _PG_init. */
void
TideDefineConsumerGucs(void)
{
	DefineCustomIntVariable("pg_tide.wait_recheck_ms",
							"How often tide.wait_for_messages() looks again without a wake-up.",
							"Commits wake waiters at once; this only bounds how late a waiter "
							"notices a lease that expired.",
							&wait_recheck_ms,
							1000, 10, 3600 * 1000,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/* The caller's identity while a consumer API function runs as the owner. */
typedef struct Caller
{
	Oid			userid;
	int			sec_context;
} Caller;

/*
 * Connects SPI, becomes the catalog's owner and checks that the caller may
 * consume from the group; returns the outbox it reads (NULL: no such group,
 * for a caller who may know). An error resets the user with the
 * (sub)transaction.
 */
static char *
consume_begin(const char *group, Caller *caller)
{
	GetUserIdAndSecContext(&caller->userid, &caller->sec_context);
	SPI_connect();
	SetUserIdAndSecContext(TideCatalogOwner(), caller->sec_context | SECURITY_LOCAL_USERID_CHANGE);
	return TideCheckConsumeRight(caller->userid, group);
}

/* Ends what consume_begin started. */
static void
consume_end(const Caller *caller)
{
	SPI_finish();
	SetUserIdAndSecContext(caller->userid, caller->sec_context);
}

/* A group's state as a poll sees it. */
typedef struct GroupRead
{
	char	   *outbox;
	int64		leased_upto;
	bool		has_expired_lease;
} GroupRead;

/* Refuses a group that has no position yet ('none' and never set). */
static void
require_position(const char *group, bool position_isnull)
{
	if (position_isnull)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("consumer group \"%s\" has no position", group),
				 errdetail("It was created with auto_offset_reset 'none'."),
				 errhint("An operator sets its position with tide.admin_rewind_offset().")));
}

/* Refuses a group that does not exist. */
static void
no_such_group(const char *group)
{
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("consumer group \"%s\" does not exist", group),
			 errhint("Create it with tide.create_consumer_group().")));
}

/*
 * Reads the group row, locked for update when `lock` (step 3: the dispatch
 * cursor), otherwise plainly (a poll's first look, made once the
 * consumer's offset row is locked, which keeps the group from being dropped
 * and created again until the poll ends). Under READ COMMITTED the locked
 * read returns the row's latest version, with the cursor another poll just
 * moved.
 */
static GroupRead
read_group(const char *group, bool lock)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(group)};
	GroupRead	state = {0};
	bool		isnull;
	SPIPlanPtr	plan;

	if (lock)
		plan = TidePlan(&lock_group_plan,
						"SELECT outbox_name, leased_upto FROM tide.tide_consumer_groups"
						" WHERE group_name OPERATOR(pg_catalog.=) $1 FOR NO KEY UPDATE",
						1, types);
	else
		plan = TidePlan(&read_group_plan,
						"SELECT outbox_name, leased_upto FROM tide.tide_consumer_groups"
						" WHERE group_name OPERATOR(pg_catalog.=) $1",
						1, types);
	if (SPI_execute_plan(plan, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read consumer group \"%s\"", group);
	if (SPI_processed == 0)
		no_such_group(group);
	state.outbox = TideSpiText(1);
	state.leased_upto = TideSpiInt64(2, &isnull);
	require_position(group, isnull);
	return state;
}

/* Reads the group without locking it, for waiters. */
static GroupRead
peek_group(const char *group)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(group)};
	GroupRead	state = {0};
	bool		isnull;

	if (SPI_execute_plan(TidePlan(&peek_group_plan,
								  "SELECT g.outbox_name, g.leased_upto,"
								  "       EXISTS (SELECT 1 FROM tide.tide_consumer_leases l"
								  "                WHERE l.group_name OPERATOR(pg_catalog.=) g.group_name"
								  "                  AND l.expires_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp())"
								  "  FROM tide.tide_consumer_groups g WHERE g.group_name OPERATOR(pg_catalog.=) $1",
								  1, types),
						 args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read consumer group \"%s\"", group);
	if (SPI_processed == 0)
		no_such_group(group);
	state.outbox = TideSpiText(1);
	state.leased_upto = TideSpiInt64(2, &isnull);
	require_position(group, isnull);
	state.has_expired_lease = TideSpiBool(3);
	return state;
}

/*
 * Reads up to `limit` messages of the outbox with after < id <= upto, in id
 * order, into SPI_tuptable. The snapshot is taken now, even under
 * REPEATABLE READ: a publisher leaves the tracker only after its commit is
 * visible, so only a snapshot newer than the horizon is sure to see every
 * message at or below it.
 *
 * The outbox is named as a range and the order includes it so that only the
 * (outbox_name, id) index can return the rows in order without a sort. With
 * "outbox_name = $1 ORDER BY id" the planner often walks the primary key
 * instead and filters: for an outbox that has nothing new while another
 * outbox is busy, that read every message published since (170,000 index
 * entries and 27 ms per look, measured, against 6 buffers and 0.05 ms).
 *
 * With `expiry` (a catalog with expires_at) a fifth column says whether the
 * message expired at `now`, the poll's clock.
 */
#define FETCH_SQL(expired) \
	"SELECT id, payload, headers, created_at" expired \
	"  FROM tide.tide_outbox_messages" \
	" WHERE outbox_name OPERATOR(pg_catalog.>=) $1 AND outbox_name OPERATOR(pg_catalog.<=) $1" \
	"   AND consumed_at IS NULL AND id OPERATOR(pg_catalog.>) $2" \
	"   AND id OPERATOR(pg_catalog.<=) $3" \
	" ORDER BY outbox_name, id LIMIT $4"

static uint64
fetch_messages(const char *outbox, int64 after, int64 upto, int limit, bool expiry,
			   TimestampTz now)
{
	Oid			types[5] = {TEXTOID, INT8OID, INT8OID, INT4OID, TIMESTAMPTZOID};
	Datum		args[5];

	args[0] = CStringGetTextDatum(outbox);
	args[1] = Int64GetDatum(after);
	args[2] = Int64GetDatum(upto);
	args[3] = Int32GetDatum(limit);
	args[4] = TimestampTzGetDatum(now);
	if (SPI_execute_snapshot(expiry ?
							 TidePlan(&fetch_expiry_plan,
									  FETCH_SQL(", expires_at IS NOT NULL AND expires_at OPERATOR(pg_catalog.<=) $5"),
									  5, types) :
							 TidePlan(&fetch_plan, FETCH_SQL(""), 4, types),
							 args, NULL, GetLatestSnapshot(), InvalidSnapshot,
							 false, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read messages of outbox \"%s\"", outbox);
	return SPI_processed;
}

/* The id of fetched row `row`. */
static int64
fetched_id(uint64 row)
{
	bool		isnull;

	return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, 1, &isnull));
}

/* Runs a saved plan that takes (group, consumer[, extra...]) and writes. */
static void
run_write(SPIPlanPtr plan, Datum *args)
{
	int			rc = SPI_execute_plan(plan, args, NULL, false, 0);

	if (rc < 0)
		elog(ERROR, "pg_tide lease update failed: %s", SPI_result_code_string(rc));
}

/* Gives the consumer the lease [start, end] for `visibility` seconds. */
static void
set_lease(Datum group, Datum consumer, int64 start, int64 end, int visibility)
{
	Oid			types[5] = {TEXTOID, TEXTOID, INT8OID, INT8OID, INT4OID};
	Datum		args[5] = {group, consumer, Int64GetDatum(start), Int64GetDatum(end),
	Int32GetDatum(visibility)};

	run_write(TidePlan(&set_lease_plan,
					   "INSERT INTO tide.tide_consumer_leases"
					   "   (group_name, consumer_id, lease_start, lease_end, expires_at)"
					   " VALUES ($1, $2, $3, $4, pg_catalog.clock_timestamp()"
					   "         OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => $5))"
					   " ON CONFLICT (group_name, consumer_id) DO UPDATE"
					   "   SET lease_start = EXCLUDED.lease_start, lease_end = EXCLUDED.lease_end,"
					   "       expires_at = EXCLUDED.expires_at",
					   5, types),
			  args);
}

/* Drops a consumer's lease. */
static void
delete_lease(Datum group, Datum consumer)
{
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		args[2] = {group, consumer};

	run_write(TidePlan(&delete_lease_plan,
					   "DELETE FROM tide.tide_consumer_leases"
					   " WHERE group_name OPERATOR(pg_catalog.=) $1 AND consumer_id OPERATOR(pg_catalog.=) $2",
					   2, types),
			  args);
}

/* A poll in progress: what the steps share. */
typedef struct Poll
{
	GroupRead	group_state;
	Datum		group;
	Datum		consumer;
	int			batch_size;
	int			visibility;
	/* where the leased rows go: the SQL function's result, or a C caller's callback */
	ReturnSetInfo *rsinfo;
	TidePolledMessage each;
	void	   *each_arg;
	int			count;
	bool		expiry;			/* the catalog has expires_at */
	TimestampTz now;			/* the poll's clock, for expiry */
	bool		first_lease;	/* the messages read are leased for the first time */
	int64		expired;		/* expired messages first leased and passed (SQL callers) */
	int64		last_read;		/* the last id read; 0: none */
} Poll;

/*
 * Hands the fetched rows to the poll's caller: to a C caller all of them,
 * each marked expired or not; to an SQL caller the rows that have not
 * expired, counting the others.
 */
static void
emit_rows(Poll *poll, uint64 count)
{
	for (uint64 row = 0; row < count; row++)
	{
		Datum		values[5];
		bool		nulls[5];
		bool		expired = false;

		for (int col = 0; col < 4; col++)
			values[col] = SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc,
										col + 1, &nulls[col]);
		if (poll->expiry)
			expired = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc,
												 5, &nulls[4]));
		if (poll->each != NULL)
			poll->each(poll->each_arg, DatumGetInt64(values[0]), values[1],
					   nulls[2] ? (Datum) 0 : values[2], DatumGetTimestampTz(values[3]), expired);
		else if (expired)
		{
			if (poll->first_lease)
				poll->expired++;
			continue;
		}
		else
			tuplestore_putvalues(poll->rsinfo->setResult, poll->rsinfo->setDesc, values, nulls);
		poll->count++;
	}
}

/*
 * Reads up to the batch size of messages in (after, upto] and hands them to
 * the caller at once (later statements replace SPI_tuptable). Sets the
 * first and last id read; returns how many were read, expired ones
 * included.
 */
static uint64
take_messages(Poll *poll, int64 after, int64 upto, int64 *first, int64 *last)
{
	uint64		count = fetch_messages(poll->group_state.outbox, after, upto, poll->batch_size,
									   poll->expiry, poll->now);

	if (count > 0)
	{
		*first = fetched_id(0);
		*last = fetched_id(count - 1);
		poll->last_read = *last;
		emit_rows(poll, count);
	}
	return count;
}

/* Moves the group's dispatch cursor (leased_upto) to `last`, which the poll leased. */
static void
advance_cursor(Poll *poll, int64 last)
{
	Oid			types[2] = {TEXTOID, INT8OID};
	Datum		args[2] = {poll->group, Int64GetDatum(last)};

	run_write(TidePlan(&advance_plan,
					   "UPDATE tide.tide_consumer_groups SET leased_upto = $2"
					   " WHERE group_name OPERATOR(pg_catalog.=) $1",
					   2, types),
			  args);
}

/*
 * Reads and locks (FOR UPDATE) a consumer's own lease row: false when it
 * holds none, else its range in *start and *end. Polls and commits
 * (commit.c) both lock it this way.
 */
bool
TideLockOwnLease(Datum group, Datum consumer, int64 *start, int64 *end)
{
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		args[2] = {group, consumer};
	bool		isnull;

	if (SPI_execute_plan(TidePlan(&own_lease_plan,
								  "SELECT lease_start, lease_end FROM tide.tide_consumer_leases"
								  " WHERE group_name OPERATOR(pg_catalog.=) $1 AND consumer_id OPERATOR(pg_catalog.=) $2"
								  " FOR UPDATE",
								  2, types),
						 args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read a consumer lease");
	if (SPI_processed == 0)
		return false;
	*start = TideSpiInt64(1, &isnull);
	*end = TideSpiInt64(2, &isnull);
	return true;
}

/* Step 1: the consumer's own lease again. Returns whether it held one. */
static bool
poll_own_lease(Poll *poll)
{
	int64		start;
	int64		end;
	int64		first;
	int64		last;

	if (!TideLockOwnLease(poll->group, poll->consumer, &start, &end))
		return false;

	if (take_messages(poll, start - 1, end, &first, &last) == 0)
	{
		/* Its messages are gone (the outbox was emptied): nothing to redo. */
		delete_lease(poll->group, poll->consumer);
		return false;
	}
	set_lease(poll->group, poll->consumer, start, end, poll->visibility);
	return true;
}

/*
 * Step 2: takes over the group's expired lease with the lowest ids, or as
 * much of it as the batch size allows; the rest stays with its holder, expired, for
 * the next poll. Returns whether it found one. A lease whose row another
 * call holds is skipped: its holder is committing, extending or releasing
 * it, or another poll is taking it over; neither waits for the other.
 */
static bool
poll_expired_lease(Poll *poll)
{
	Oid			types[1] = {TEXTOID};
	Oid			shrink_types[3] = {TEXTOID, TEXTOID, INT8OID};
	Datum		args[1] = {poll->group};

	for (;;)
	{
		Datum		holder;
		int64		start;
		int64		end;
		int64		first;
		int64		last;
		bool		isnull;

		if (SPI_execute_plan(TidePlan(&expired_lease_plan,
									  "SELECT consumer_id, lease_start, lease_end"
									  "  FROM tide.tide_consumer_leases"
									  " WHERE group_name OPERATOR(pg_catalog.=) $1"
									  "   AND expires_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()"
									  " ORDER BY lease_start LIMIT 1 FOR UPDATE SKIP LOCKED",
									  1, types),
							 args, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not read expired leases");
		if (SPI_processed == 0)
			return false;
		holder = CStringGetTextDatum(TideSpiText(1));
		start = TideSpiInt64(2, &isnull);
		end = TideSpiInt64(3, &isnull);

		if (take_messages(poll, start - 1, end, &first, &last) == 0)
		{
			delete_lease(poll->group, holder);
			continue;
		}
		if (last < end)
		{
			Datum		shrink_args[3] = {poll->group, holder, Int64GetDatum(last + 1)};

			run_write(TidePlan(&shrink_lease_plan,
							   "UPDATE tide.tide_consumer_leases SET lease_start = $3"
							   " WHERE group_name OPERATOR(pg_catalog.=) $1 AND consumer_id OPERATOR(pg_catalog.=) $2",
							   3, shrink_types),
					  shrink_args);
		}
		else
			delete_lease(poll->group, holder);
		set_lease(poll->group, poll->consumer, first, last, poll->visibility);
		return true;
	}
}

/*
 * Step 3: new messages above leased_upto, up to the safe horizon, under the
 * group row's lock: polls that move the cursor run one at a time. The
 * horizon is computed once the lock is held, so that a poll that waited
 * for it also takes what became safe to read meanwhile.
 */
static void
poll_new_messages(Poll *poll, const char *group)
{
	int64		horizon;
	int64		first;
	int64		last;

	poll->group_state = read_group(group, true);
	horizon = TrackerSafeHorizon();
	if (horizon <= poll->group_state.leased_upto)
		return;
	poll->first_lease = true;
	if (take_messages(poll, poll->group_state.leased_upto, horizon, &first, &last) == 0)
		return;
	set_lease(poll->group, poll->consumer, first, last, poll->visibility);
	advance_cursor(poll, last);
}

/*
 * Whether the group has an expired lease of a consumer other than
 * `consumer`: a poll would take that over before any new message.
 */
static bool
others_lease_expired(Datum group, Datum consumer)
{
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		args[2] = {group, consumer};

	if (SPI_execute_plan(TidePlan(&others_expired_plan,
								  "SELECT FROM tide.tide_consumer_leases"
								  " WHERE group_name OPERATOR(pg_catalog.=) $1"
								  "   AND consumer_id OPERATOR(pg_catalog.<>) $2"
								  "   AND expires_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()",
								  2, types),
						 args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read expired leases");
	return SPI_processed > 0;
}

/*
 * TidePollAhead's lease: the messages after `after` of the consumer's own
 * lease (which must reach `after`), or else new messages above leased_upto
 * that lengthen the lease at its end, with a fresh expiry; nothing when the
 * consumer holds no such lease, when another consumer's lease was handed
 * out behind it, or when a lease of the group is expired.
 */
static void
poll_ahead_of(Poll *poll, const char *group, int64 after)
{
	int64		start;
	int64		end;
	int64		first;
	int64		last;
	int64		horizon;

	if (!TideLockOwnLease(poll->group, poll->consumer, &start, &end))
		return;
	/* the batch in hand must lie in the lease, or the lease is not that batch's */
	if (after < start || after > end)
		return;
	if (after < end)
	{
		/* the lease holds more than the batch in hand (it was leased again after a hold) */
		if (take_messages(poll, after, end, &first, &last) > 0)
			set_lease(poll->group, poll->consumer, start, end, poll->visibility);
		return;
	}
	poll->group_state = read_group(group, true);
	if (poll->group_state.leased_upto != end || others_lease_expired(poll->group, poll->consumer))
		return;
	horizon = TrackerSafeHorizon();
	if (horizon <= end)
		return;
	if (take_messages(poll, end, horizon, &first, &last) == 0)
		return;
	set_lease(poll->group, poll->consumer, start, last, poll->visibility);
	advance_cursor(poll, last);
}

/* The consumer id argument at `argno`, validated. */
static char *
consumer_arg(FunctionCallInfo fcinfo, int argno)
{
	char	   *consumer = PG_ARGISNULL(argno) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(argno));

	TideValidateConsumerId(consumer);
	return consumer;
}

/* The group name argument at 0, validated. */
static char *
group_arg(FunctionCallInfo fcinfo)
{
	char	   *group = PG_ARGISNULL(0) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(0));

	TideValidateName("consumer group", group);
	return group;
}

/*
 * Records the consumer in the group (its first poll is how it joins) and
 * its heartbeat, which locks its offset row until the transaction ends.
 *
 * With `commit_next`, a known consumer's row is left alone here: the
 * commit that follows locks it, sets the heartbeat and reports a missing
 * group. Without, a row whose heartbeat this transaction already set (a
 * commit_offset before the poll) is only locked. A second update of
 * a row this transaction already updated would run the foreign key check
 * against the group row (PostgreSQL checks a row its own transaction
 * wrote), a key share lock beside the polls' lock on that row: a
 * MultiXact on every version of the group row, which made every later
 * read of it resolve MultiXact members (39% of a 4-client one-call
 * consumer's CPU, measured with perf).
 */
static void
join_group(const char *group, Datum group_datum, Datum consumer, bool commit_next)
{
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		args[2] = {group_datum, consumer};
	SPIPlanPtr	plan;

	if (commit_next)
		plan = TidePlan(&join_quiet_plan,
						"INSERT INTO tide.tide_consumer_offsets (group_name, consumer_id)"
						" SELECT g.group_name, $2 FROM tide.tide_consumer_groups g"
						"  WHERE g.group_name OPERATOR(pg_catalog.=) $1"
						" ON CONFLICT (group_name, consumer_id) DO NOTHING",
						2, types);
	else
		plan = TidePlan(&join_plan,
						"INSERT INTO tide.tide_consumer_offsets (group_name, consumer_id)"
						" SELECT g.group_name, $2 FROM tide.tide_consumer_groups g"
						"  WHERE g.group_name OPERATOR(pg_catalog.=) $1"
						" ON CONFLICT (group_name, consumer_id) DO UPDATE SET last_heartbeat = pg_catalog.now()"
						"  WHERE tide_consumer_offsets.last_heartbeat OPERATOR(pg_catalog.<>) pg_catalog.now()",
						2, types);
	/* No row written: no group (read_group reports it), or nothing to do. */
	if (SPI_execute_plan(plan, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not record consumer in group \"%s\"", group);
}

/* Adds the expired messages the poll leased first and passed to the consumer's count. */
static void
count_expired(Poll *poll)
{
	Oid			types[3] = {TEXTOID, TEXTOID, INT8OID};
	Datum		args[3] = {poll->group, poll->consumer, Int64GetDatum(poll->expired)};

	run_write(TidePlan(&count_expired_plan,
					   "UPDATE tide.tide_consumer_offsets SET expired = expired OPERATOR(pg_catalog.+) $3"
					   " WHERE group_name OPERATOR(pg_catalog.=) $1 AND consumer_id OPERATOR(pg_catalog.=) $2",
					   3, types),
			  args);
}

/*
 * A poll's work once its arguments are checked: the rights, the group's
 * membership and heartbeat, the commit first when asked (commit_upto), then
 * the steps at the top of the file.
 */
static void
run_poll(Poll *poll, const char *group, bool commit_first, int64 commit_upto)
{
	Caller		caller;
	char	   *checked;

	checked = consume_begin(group, &caller);
	if (checked == NULL)
		no_such_group(group);
	join_group(group, poll->group, poll->consumer, commit_first);
	/*
	 * The commit first, with the rules and errors of tide.commit_offset(): a
	 * lease another consumer took over meanwhile is refused (55000 or
	 * 22023) and the whole call with it, so the poll leases nothing and
	 * nobody else's range is acknowledged.
	 */
	if (commit_first)
		TideCommitOffset(poll->group, poll->consumer, false, commit_upto);
	/*
	 * The consumer's offset row is locked now: the group cannot be dropped
	 * until this transaction ends. Its outbox is checked again in case it
	 * was dropped and created again for another outbox since the check
	 * (what the commit wrote in it then goes with the error).
	 */
	poll->group_state = read_group(group, false);
	if (strcmp(checked, poll->group_state.outbox) != 0)
		TideCheckConsumeOutbox(caller.userid, group, poll->group_state.outbox);

	for (int round = 0; round < MAX_EXPIRED_BATCHES; round++)
	{
		poll->last_read = 0;
		poll->first_lease = false;
		poll->now = GetCurrentTimestamp();
		if (!poll_own_lease(poll) && !poll_expired_lease(poll))
			poll_new_messages(poll, group);
		/* an SQL caller shown nothing of what it leased: every message expired */
		if (poll->each != NULL || poll->count > 0 || poll->last_read == 0)
			break;
		TideCommitOffset(poll->group, poll->consumer, false, poll->last_read);
	}
	if (poll->expired > 0)
		count_expired(poll);
	consume_end(&caller);
}

/*
 * SQL: tide.poll_outbox(p_group, p_consumer, p_batch_size,
 * p_visibility_seconds[, p_commit_upto]) returns TABLE(id, payload,
 * headers, created_at), the leased messages. A 0.1.0 catalog defines it
 * without p_commit_upto.
 */
Datum
tide_poll_outbox(PG_FUNCTION_ARGS)
{
	Poll		poll;
	char	   *group;
	char	   *consumer;
	bool		commit_first = PG_NARGS() > 4 && !PG_ARGISNULL(4);

	TideRequirePreload();
	group = group_arg(fcinfo);
	consumer = consumer_arg(fcinfo, 1);
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("batch size must not be null"),
				 errhint("Give the largest number of messages to take at once, from 1 to %d.",
						 MAX_BATCH_SIZE)));
	if (PG_GETARG_INT32(2) < 1 || PG_GETARG_INT32(2) > MAX_BATCH_SIZE)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch size must be between 1 and %d", MAX_BATCH_SIZE),
				 errhint("Poll more often for more messages.")));
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("visibility must not be null"),
				 errhint("Give the seconds a consumer needs to process a batch, from 1 to %d.",
						 MAX_VISIBILITY_SECONDS)));
	if (PG_GETARG_INT32(3) < 1 || PG_GETARG_INT32(3) > MAX_VISIBILITY_SECONDS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("visibility must be between 1 and %d seconds", MAX_VISIBILITY_SECONDS),
				 errhint("Give the seconds a consumer needs to process a batch; extend_lease() adds more.")));

	InitMaterializedSRF(fcinfo, 0);
	memset(&poll, 0, sizeof(poll));
	poll.rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	poll.group = CStringGetTextDatum(group);
	poll.consumer = CStringGetTextDatum(consumer);
	poll.batch_size = PG_GETARG_INT32(2);
	poll.visibility = PG_GETARG_INT32(3);
	/* a 0.1.0 catalog, which has no expires_at, defines no p_commit_upto */
	poll.expiry = PG_NARGS() > 4;
	run_poll(&poll, group, commit_first, commit_first ? PG_GETARG_INT64(4) : 0);

	return (Datum) 0;
}

/*
 * A poll of a C caller (TidePoll, TidePollAhead), its arguments checked:
 * the relay passes what its validated config holds, so a bad one is a bug.
 */
static void
c_poll_init(Poll *poll, const char *group, const char *consumer, int batch_size,
			int visibility, TidePolledMessage each, void *each_arg)
{
	if (batch_size < 1 || batch_size > MAX_BATCH_SIZE ||
		visibility < 1 || visibility > MAX_VISIBILITY_SECONDS)
		elog(ERROR, "poll of consumer group \"%s\" out of range: batch size %d, visibility %d s",
			 group, batch_size, visibility);
	memset(poll, 0, sizeof(*poll));
	poll->each = each;
	poll->each_arg = each_arg;
	poll->group = CStringGetTextDatum(group);
	poll->consumer = CStringGetTextDatum(consumer);
	poll->batch_size = batch_size;
	poll->visibility = visibility;
	/* the relay runs on the catalog it was built for (catalog_version.c) */
	poll->expiry = true;
	poll->now = GetCurrentTimestamp();
}

/*
 * tide.poll_outbox() for C callers (the relay worker), with the same
 * checks, locks and steps, without a commit first: each leased message goes
 * to `each` as it is read (its datums valid only during the call), in id
 * order. Returns how many were leased. Saves the SQL function's
 * tuplestore, and its caller's query that turns each row into text, which
 * were most of a relay worker's time per message (measured with perf).
 */
int
TidePoll(const char *group, const char *consumer, int batch_size, int visibility,
		 TidePolledMessage each, void *each_arg)
{
	Poll		poll;

	c_poll_init(&poll, group, consumer, batch_size, visibility, each, each_arg);
	run_poll(&poll, group, false, 0);
	return poll.count;
}

/*
 * For the relay worker, which delivers the batch it leased up to id `after`
 * and records it later: leases the consumer's next batch now (see the top
 * of this file), with the checks and locks of a poll and without a commit.
 * Each leased message goes to `each`, in id order; returns how many.
 * Committing up to `after` later leaves the consumer holding the new batch
 * alone; not committing it leaves both leased, and the consumer's next poll
 * hands them back from the first.
 */
int
TidePollAhead(const char *group, const char *consumer, int64 after, int batch_size,
			  int visibility, TidePolledMessage each, void *each_arg)
{
	Poll		poll;
	Caller		caller;
	char	   *checked;

	c_poll_init(&poll, group, consumer, batch_size, visibility, each, each_arg);

	checked = consume_begin(group, &caller);
	if (checked == NULL)
		no_such_group(group);
	join_group(group, poll.group, poll.consumer, false);
	poll.group_state = read_group(group, false);
	if (strcmp(checked, poll.group_state.outbox) != 0)
		TideCheckConsumeOutbox(caller.userid, group, poll.group_state.outbox);
	poll_ahead_of(&poll, group, after);
	consume_end(&caller);
	return poll.count;
}

/*
 * Whether a poll of the group would return something now, other than a
 * consumer's own lease; reads only (the relay asks before it leases).
 */
bool
TideGroupHasMessages(const char *group)
{
	GroupRead	state;
	int64		horizon;
	bool		found;

	SPI_connect();
	state = peek_group(group);
	if (state.has_expired_lease)
		found = true;
	else
	{
		horizon = TrackerSafeHorizon();
		found = horizon > state.leased_upto &&
			fetch_messages(state.outbox, state.leased_upto, horizon, 1, false, 0) > 0;
	}
	SPI_finish();
	return found;
}

/*
 * TideGroupHasMessages for many consumers at once, in one statement, for a
 * relay worker whose pipelines are idle: found[i] tells whether consumer
 * consumers[i] holds a lease in group groups[i], or a poll of that group
 * would return something now. A group that does not exist or has no
 * position counts as found, so that the poll itself reports it. The
 * horizon is read before the snapshot is taken, as in fetch_messages, so
 * every message at or below it is seen; reads only. The leases are read
 * once (hashed, not once per group), and the outbox is looked into once
 * per distinct (outbox, position): the idle pipelines of one outbox mostly
 * stand at the same position, so a thousand of them cost one index probe.
 * (The LIMIT keeps that probe an index scan per position: as a semi-join
 * the planner may read every pending message of every outbox instead.)
 */
void
TideGroupsWithMessages(int n, const char *const *groups, const char *const *consumers,
					   bool *found)
{
	Oid			types[3] = {TEXTARRAYOID, TEXTARRAYOID, INT8OID};
	Datum		args[3];
	Datum	   *g = palloc(sizeof(Datum) * Max(n, 1));
	Datum	   *c = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
	{
		g[i] = CStringGetTextDatum(groups[i]);
		c[i] = CStringGetTextDatum(consumers[i]);
		found[i] = false;
	}
	if (n == 0)
		return;
	args[0] = PointerGetDatum(construct_array(g, n, TEXTOID, -1, false, TYPALIGN_INT));
	args[1] = PointerGetDatum(construct_array(c, n, TEXTOID, -1, false, TYPALIGN_INT));
	SPI_connect();
	args[2] = Int64GetDatum(TrackerSafeHorizon());
	if (SPI_execute_snapshot(TidePlan(&groups_with_messages_plan,
									  "WITH u AS (SELECT u.i, u.grp, u.consumer, g.group_name, g.outbox_name, g.leased_upto"
									  "             FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) WITH ORDINALITY AS u(grp, consumer, i)"
									  "             LEFT JOIN tide.tide_consumer_groups g ON g.group_name OPERATOR(pg_catalog.=) u.grp),"
									  "     pending AS (SELECT h.outbox_name, h.leased_upto"
									  "                   FROM (SELECT DISTINCT outbox_name, leased_upto FROM u"
									  "                          WHERE leased_upto OPERATOR(pg_catalog.<) $3) h,"
									  "                        LATERAL (SELECT 1 FROM tide.tide_outbox_messages m"
									  "                                  WHERE m.outbox_name OPERATOR(pg_catalog.>=) h.outbox_name"
									  "                                    AND m.outbox_name OPERATOR(pg_catalog.<=) h.outbox_name"
									  "                                    AND m.consumed_at IS NULL"
									  "                                    AND m.id OPERATOR(pg_catalog.>) h.leased_upto"
									  "                                    AND m.id OPERATOR(pg_catalog.<=) $3 LIMIT 1) m)"
									  "SELECT u.i::int4 FROM u"
									  " WHERE u.group_name IS NULL OR u.leased_upto IS NULL"
									  "    OR (u.grp, u.consumer) OPERATOR(pg_catalog.=) ANY"
									  "       (SELECT l.group_name, l.consumer_id FROM tide.tide_consumer_leases l)"
									  "    OR u.grp OPERATOR(pg_catalog.=) ANY"
									  "       (SELECT l.group_name FROM tide.tide_consumer_leases l"
									  "         WHERE l.expires_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp())"
									  "    OR (u.outbox_name, u.leased_upto) OPERATOR(pg_catalog.=) ANY"
									  "       (SELECT p.outbox_name, p.leased_upto FROM pending p)",
									  3, types),
							 args, NULL, GetLatestSnapshot(), InvalidSnapshot,
							 true, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not look for messages of %d consumer groups", n);
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		bool		isnull;
		int			i = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1, &isnull));

		found[i - 1] = true;
	}
	SPI_finish();
}

/*
 * SQL: tide.wait_for_messages(p_group, p_timeout_ms) returns whether the
 * group has messages to poll, waiting up to the timeout for a publishing
 * transaction of this database to commit. Getting ready to sleep before
 * looking means a commit in between is never missed. Leases expire without
 * a wake-up, so it also looks again every pg_tide.wait_recheck_ms.
 */
Datum
tide_wait_for_messages(PG_FUNCTION_ARGS)
{
	ConditionVariable *cv;
	Caller		caller;
	char	   *group;
	TimestampTz deadline;
	bool		found = false;

	TideRequirePreload();
	group = group_arg(fcinfo);
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("timeout must not be null"),
				 errhint("Give the longest wait in milliseconds; 0 only looks.")));
	if (PG_GETARG_INT32(1) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("timeout must not be negative"),
				 errhint("Give the longest wait in milliseconds; 0 only looks.")));
	if (PG_GETARG_INT32(1) > MAX_WAIT_MS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("timeout must be at most %d milliseconds", MAX_WAIT_MS),
				 errhint("Wait again after a timeout; a long poll needs no longer wait than an hour.")));
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), PG_GETARG_INT32(1));
	cv = WakeConditionVariable(MyDatabaseId);
	consume_begin(group, &caller);

	for (;;)
	{
		long		remaining;

		ConditionVariablePrepareToSleep(cv);
		found = TideGroupHasMessages(group);
		remaining = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
		if (found || remaining <= 0)
			break;
		ConditionVariableTimedSleep(cv, Min(remaining, wait_recheck_ms), PG_WAIT_EXTENSION);
	}
	ConditionVariableCancelSleep();
	consume_end(&caller);
	PG_RETURN_BOOL(found);
}

/*
 * Checks the group argument and the caller's right, then runs the internal
 * function `sql` with the call's arguments (types `types`) as the owner;
 * returns its result, a by-value datum, and sets *isnull.
 */
static Datum
call_as_owner(FunctionCallInfo fcinfo, SPIPlanPtr *plan, const char *sql, Oid *types,
			  bool *isnull)
{
	Caller		caller;
	Datum		args[3];
	char		nulls[3];
	int			nargs = PG_NARGS();
	Datum		result;
	char	   *group;

	Assert(nargs <= 3);
	group = group_arg(fcinfo);
	for (int i = 0; i < nargs; i++)
	{
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
		args[i] = PG_ARGISNULL(i) ? (Datum) 0 : PG_GETARG_DATUM(i);
	}
	consume_begin(group, &caller);
	if (SPI_execute_plan(TidePlan(plan, sql, nargs, types), args, nulls, false, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "could not run \"%s\"", sql);
	result = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, isnull);
	consume_end(&caller);
	return result;
}

/*
 * SQL: tide.commit_offset(p_group, p_consumer, p_last_offset) acknowledges
 * the consumer's lease up to p_last_offset (src/commit.c).
 */
Datum
tide_commit_offset(PG_FUNCTION_ARGS)
{
	Caller		caller;
	char	   *group = group_arg(fcinfo);

	consume_begin(group, &caller);
	TideValidateConsumerId(PG_ARGISNULL(1) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(1)));
	TideCommitOffset(CStringGetTextDatum(group), PG_GETARG_DATUM(1),
					 PG_ARGISNULL(2), PG_ARGISNULL(2) ? 0 : PG_GETARG_INT64(2));
	consume_end(&caller);
	PG_RETURN_VOID();
}

/* SQL: tide.consumer_heartbeat(p_group, p_consumer) (tide._consumer_heartbeat()). */
Datum
tide_consumer_heartbeat(PG_FUNCTION_ARGS)
{
	Oid			types[2] = {TEXTOID, TEXTOID};
	bool		isnull;

	call_as_owner(fcinfo, &heartbeat_plan,
				  "SELECT tide._consumer_heartbeat($1, $2)", types, &isnull);
	PG_RETURN_VOID();
}

/*
 * SQL: tide.extend_lease(p_group, p_consumer, p_seconds) returns the
 * lease's new expiry (tide._extend_lease()).
 */
Datum
tide_extend_lease(PG_FUNCTION_ARGS)
{
	Oid			types[3] = {TEXTOID, TEXTOID, INT4OID};
	bool		isnull;
	Datum		expiry = call_as_owner(fcinfo, &extend_lease_plan,
									   "SELECT tide._extend_lease($1, $2, $3)", types, &isnull);

	if (isnull)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(expiry);
}

/* SQL: tide.release_lease(p_group, p_consumer) (tide._release_lease()). */
Datum
tide_release_lease(PG_FUNCTION_ARGS)
{
	Oid			types[2] = {TEXTOID, TEXTOID};
	bool		isnull;

	call_as_owner(fcinfo, &release_lease_plan,
				  "SELECT tide._release_lease($1, $2)", types, &isnull);
	PG_RETURN_VOID();
}
