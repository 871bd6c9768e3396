/*
 * backpressure.c
 *		Whether an outbox may take n more messages, by its inline_threshold:
 *		the rule of the slow path of outbox.c, and the operator events at
 *		80 and 100 % of the threshold.
 *
 * The rule: an outbox is held back only when it has an inline_threshold
 * (NULL, the default, is no limit) and at least one consumer group with a
 * position (with none, nothing waits for its messages). Then a publish is
 * refused when the messages above the lowest group position, not yet
 * consumed, would be more than the threshold; the error names the slowest
 * groups and their pipelines (tide._outbox_holders).
 *
 * Phases, each taken only when the one before says it may matter:
 * 1. The bound: the last id handed out minus the position, plus n. Below
 *	  80 % of the threshold neither a refusal nor an event can be due.
 * 2. The exact count of unconsumed messages, at most the threshold.
 * 3. The level (0, 80 or 100 %) after the publish, compared with the one the
 *	  outbox recorded: a change goes through tide._outbox_backpressure,
 *	  which records it and announces a rise as outbox.backpressure.
 *
 * The returned span tells the fast path of outbox.c how far above the
 * position it may publish without asking again: under 80 % of the
 * threshold, so that every crossing is seen here.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"

#include "backpressure.h"
#include "pg_tide.h"

static SPIPlanPtr count_plan = NULL;
static SPIPlanPtr level_plan = NULL;
static SPIPlanPtr holders_plan = NULL;

/*
 * Has tide._outbox_backpressure record the outbox's level, and announce it
 * when it rose.
 */
static void
record_level(const char *name, int level, int64 unconsumed, int64 threshold)
{
	Oid			types[4] = {TEXTOID, INT4OID, INT8OID, INT8OID};
	Datum		args[4];

	args[0] = CStringGetTextDatum(name);
	args[1] = Int32GetDatum(level);
	args[2] = Int64GetDatum(unconsumed);
	args[3] = Int64GetDatum(threshold);
	if (SPI_execute_plan(TidePlan(&level_plan, "SELECT tide._outbox_backpressure($1, $2, $3, $4)", 4, types),
						 args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not record the backpressure level of outbox \"%s\"", name);
}

/*
 * The unconsumed messages of the outbox above `low`, counted up to
 * `threshold`.
 */
static int64
count_unconsumed(const char *name, int64 low, int64 threshold)
{
	Oid			types[3] = {TEXTOID, INT8OID, INT8OID};
	Datum		args[3];
	bool		isnull;

	args[0] = CStringGetTextDatum(name);
	args[1] = Int64GetDatum(low);
	args[2] = Int64GetDatum(threshold);
	if (SPI_execute_plan(TidePlan(&count_plan,
								  "SELECT pg_catalog.count(*) FROM (SELECT 1 FROM tide.tide_outbox_messages m"
								  "  WHERE m.outbox_name OPERATOR(pg_catalog.=) $1 AND m.consumed_at IS NULL"
								  "    AND m.id OPERATOR(pg_catalog.>) $2"
								  "  LIMIT $3) s",
								  3, types),
						 args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not count the unconsumed messages of outbox \"%s\"", name);
	return TideSpiInt64(1, &isnull);
}

/*
 * " Held back by <the slowest groups>." for the DETAIL of a refusal, or ""
 * when no group has a position.
 */
static char *
holders_sentence(const char *name)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1];
	Datum		phrase;
	bool		isnull;

	args[0] = CStringGetTextDatum(name);
	if (SPI_execute_plan(TidePlan(&holders_plan,
								  "SELECT tide._outbox_holders_text(tide._outbox_holders($1))",
								  1, types),
						 args, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not read the consumer groups of outbox \"%s\"", name);
	phrase = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return isnull ? "" : psprintf(" Held back by %s.", TextDatumGetCString(phrase));
}

/*
 * Refuses a publish of `n` messages to an outbox that holds `unconsumed`
 * of at most `threshold`, naming the groups that hold it back when `named`
 * (a 0.1.0 catalog has no tide._outbox_holders).
 */
static void
refuse(const char *name, int64 unconsumed, int64 threshold, int64 n, bool named)
{
	char	   *holders = named ? holders_sentence(name) : "";

	ereport(ERROR,
			(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
			 errmsg("outbox \"%s\" has too many unconsumed messages", name),
			 unconsumed >= threshold ?
			 errdetail("It holds at least %lld unconsumed messages and its inline_threshold is %lld.%s",
					   (long long) unconsumed, (long long) threshold, holders) :
			 errdetail("It holds %lld unconsumed messages and its inline_threshold is %lld; "
					   "publishing %lld more would exceed it.%s",
					   (long long) unconsumed, (long long) threshold, (long long) n, holders),
			 errhint("Let those groups catch up (enable a disabled pipeline with tide.relay_enable()), "
					 "drop a group no one reads any more with tide.drop_consumer_group(), "
					 "or raise or remove the limit with tide.outbox_set_threshold().")));
}

/*
 * Admits `n` more messages to the outbox or raises 53400; records and
 * announces a change of its backpressure level. `held` says whether a
 * limit applies (an inline_threshold and a positioned consumer group),
 * `low` is the position, `level` the level the outbox recorded (-1: a 0.1.0
 * catalog, which records none and cannot name the groups). Returns the
 * span the fast path may admit above `low` (see the top of the file).
 */
int64
BackpressureAdmit(const char *name, int64 n, bool held, int64 threshold, int64 low, int level)
{
	int64		warn;
	int64		after = 0;
	int			now_level = 0;

	if (!held)
	{
		/* nothing holds it back: a level announced before is over */
		if (level > 0)
			record_level(name, 0, 0, threshold);
		return PG_INT64_MAX;
	}

	/* 80 % of the threshold, rounded up */
	warn = threshold - threshold / 5;
	if (TrackerSequenceLastValue() - low + n >= warn)
	{
		after = count_unconsumed(name, low, threshold) + n;
		if (after > threshold)
			refuse(name, after - n, threshold, n, level >= 0);
		now_level = after >= threshold ? 100 : after >= warn ? 80 : 0;
	}
	if (level >= 0 && now_level != level)
		record_level(name, now_level, after, threshold);
	return warn - 1;
}
