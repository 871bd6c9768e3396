/*
 * record_each.c
 *		Recording a delivered batch so that no message can stop its
 *		pipeline. A message's values (its payload, headers, ordering key, the
 *		answer to it) are data from a publisher or a receiver; should one of
 *		them make the record transaction fail (a value too large for an index
 *		or an array, a row a trigger refuses, an inbox row that a sink of
 *		this database writes in it and a CHECK of the inbox's table refuses:
 *		sink.h's `store`), the batch would be delivered
 *		again and fail again, for ever, with every message behind it waiting.
 *
 * 1. The batch is recorded in one short transaction (lease.c's
 *	  RelayRecord): the normal path, and the only one while nothing fails.
 * 2. When that raises an ERROR, its short transaction is undone and the
 *	  batch is recorded again message by message, in id order, each in a
 *	  short transaction of its own, the offset moved up to that message.
 * 3. A message whose record fails alone is dead-lettered instead, with
 *	  error class "record" and the error's text, its attempt counted; should
 *	  that fail too, it is dead-lettered without its payload, headers,
 *	  the answer's text and attempt row. Either way the offset moves over it and the
 *	  pipeline goes on with the others. (A message the batch leaves as it
 *	  was, to be delivered again, has only its attempt to log: it is not
 *	  dead-lettered for that.)
 * 4. When even the dead letter without any of the message's values cannot
 *	  be written, the error is not the message's (a full disk, a lost lease):
 *	  it is raised again, as are at once the errors that never come from a
 *	  value (a full disk, a cancel, a deadlock, a lost connection); the
 *	  worker holds the pipeline and delivers what was not recorded again
 *	  later. What steps 2 and 3 recorded before it stays recorded: the
 *	  offset passes only messages whose fate was committed with it.
 */
#include "postgres.h"

#include "utils/elog.h"
#include "utils/memutils.h"

#include "flow_errors.h"
#include "forward.h"
#include "relay_xact.h"

/* The error class of a message dead-lettered because its outcome could not be recorded. */
#define RELAY_CLASS_RECORD "record"

/*
 * Runs RelayRecord for settlement s; on an ERROR, undoes its short
 * transaction and returns the error (in cxt), else NULL.
 */
static ErrorData *
try_record(const RelayPipeline *p, const RelaySettlement *s, MemoryContext cxt)
{
	ErrorData  *volatile edata = NULL;

	PG_TRY();
	{
		RelayRecord(p, s, cxt);
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		/* in a group of records, only this record's subtransaction (xact.c) */
		RelayAbortShortXact();
		MemoryContextSwitchTo(cxt);
	}
	PG_END_TRY();
	return edata;
}

/*
 * The settlement of message i of s alone, in *one (its arrays pointing into
 * s's): the offset up to it when s moved the offset over it; the pipeline's
 * routing count with the first message, its disabling with the last.
 */
static void
one_message(const RelaySettlement *s, int i, RelaySettlement *one)
{
	*one = *s;
	one->n = 1;
	one->msgs = &s->msgs[i];
	one->each = &s->each[i];
	one->disp = &s->disp[i];
	one->attempts = &s->attempts[i];
	one->attempt_no = &s->attempt_no[i];
	one->delay_ms = &s->delay_ms[i];
	one->reason = &s->reason[i];
	one->offset_id = s->offset_id > 0 && s->msgs[i].id <= s->offset_id ? s->msgs[i].id : 0;
	one->filtered = i == 0 ? s->filtered : 0;
	one->disable = i == s->n - 1 ? s->disable : false;
	one->unrecorded = NULL;
}

/*
 * Dead-letters message i of s, whose record failed with `error`: with its
 * payload and headers and its attempt logged, or (bare) without them,
 * without the answer's text and without an attempt row, so that nothing of
 * the message's own values is written. NULL when it was written, else the
 * error that stopped it.
 */
static ErrorData *
dead_letter(const RelayPipeline *p, const RelaySettlement *s, int i, const ErrorData *error,
			bool bare, MemoryContext cxt)
{
	RelaySettlement one;
	RelayMessage msg = s->msgs[i];
	RelayMessageOutcome outcome = s->each[i];
	RelayDisposition disp = RELAY_DEAD;
	int			no_attempt = 0;
	const char *reason = "permanent";
	int			attempts = Max(s->attempts[i], msg.attempts + (s->attempt_no[i] > 0 ? 1 : 0));
	char		text[sizeof(outcome.error)];

	one_message(s, i, &one);
	snprintf(text, sizeof(text), "record: %s", error->message ? error->message : "unknown error");
	RelayCleanText(outcome.error, sizeof(outcome.error), text, strlen(text));
	strlcpy(outcome.error_class, RELAY_CLASS_RECORD, sizeof(outcome.error_class));
	outcome.outcome = RELAY_PERMANENT;
	if (bare)
	{
		msg.payload = NULL;
		msg.headers = NULL;
		msg.key = NULL;
		outcome.response = NULL;
		/* nor an attempt row, which the failing record may have been about */
		one.attempt_no = &no_attempt;
	}
	one.msgs = &msg;
	one.each = &outcome;
	one.disp = &disp;
	one.attempts = &attempts;
	one.reason = &reason;
	return try_record(p, &one, cxt);
}

/*
 * Whether s decides message i's fate (delivered, queued, dead-lettered),
 * rather than leaving it as it was, to be delivered again (a live message
 * beyond the offset, a queued one not sent): only its attempt is logged.
 */
static bool
settles(const RelaySettlement *s, int i)
{
	return s->disp[i] != RELAY_KEEP || (s->offset_id > 0 && s->msgs[i].id <= s->offset_id);
}

/*
 * Records the batch message by message after its record as a whole failed
 * with `batch_error` (steps 2 to 4 at the top of this file).
 */
static void
record_each(const RelayPipeline *p, RelaySettlement *s, ErrorData *batch_error,
			MemoryContext cxt)
{
	for (int i = 0; i < s->n; i++)
	{
		RelaySettlement one;
		ErrorData  *error;

		one_message(s, i, &one);
		error = try_record(p, &one, cxt);
		if (error == NULL)
			continue;
		if (!RelayErrorIsEnvironmental(error->sqlerrcode) && !settles(s, i))
		{
			/* nothing to lose: it is delivered again, and its attempt logged then */
			ereport(LOG,
					(errmsg("pg_tide relay pipeline \"%s\" could not log the attempt of message " INT64_FORMAT ": %s",
							p->name, s->msgs[i].id, error->message)));
			FreeErrorData(error);
			continue;
		}
		if (RelayErrorIsEnvironmental(error->sqlerrcode) ||
			(dead_letter(p, s, i, error, false, cxt) != NULL &&
			 dead_letter(p, s, i, error, true, cxt) != NULL))
		{
			FreeErrorData(batch_error);
			ReThrowError(error);
		}
		if (s->unrecorded == NULL)
			s->unrecorded = MemoryContextAllocZero(cxt, sizeof(bool) * s->n);
		s->unrecorded[i] = true;
		s->disp[i] = RELAY_DEAD;
		ereport(LOG,
				(errmsg("pg_tide relay pipeline \"%s\" could not record the outcome of message " INT64_FORMAT " of outbox \"%s\": %s",
						p->name, s->msgs[i].id, s->msgs[i].outbox, error->message),
				 errdetail("The message is dead-lettered with error class \"%s\"; the pipeline goes on with the others.",
						   RELAY_CLASS_RECORD),
				 errhint("tide.relay_dlq_list() shows it; tide.relay_dlq_retry() delivers it again.")));
		FreeErrorData(error);
	}
	FreeErrorData(batch_error);
}

/*
 * Records a delivered batch (see the top of this file): in one short
 * transaction, or, when that fails with an ERROR a message may have caused,
 * message by message, dead-lettering with error class "record" each message
 * whose outcome cannot be recorded (marked in s->unrecorded, its
 * disposition RELAY_DEAD). An ERROR that is not a message's is raised.
 */
void
RelayRecordEach(const RelayPipeline *p, RelaySettlement *s, MemoryContext cxt)
{
	ErrorData  *error = try_record(p, s, cxt);

	if (error == NULL)
		return;
	if (RelayErrorIsEnvironmental(error->sqlerrcode))
		ReThrowError(error);
	ereport(LOG,
			(errmsg("pg_tide relay pipeline \"%s\" could not record a batch of %d messages: %s",
					p->name, s->n, error->message),
			 errdetail("The messages are recorded one by one; one whose outcome cannot be recorded is dead-lettered.")));
	record_each(p, s, error, cxt);
}
