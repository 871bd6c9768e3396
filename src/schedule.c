/*
 * schedule.c
 *		Scheduling messages: tide.outbox_schedule() and
 *		tide.outbox_unschedule() (docs/scheduled-messages.md).
 *
 * A scheduled message is not in the outbox before its time: it waits as a
 * row of tide.outbox_scheduled, whose id comes from a sequence of its own,
 * and tide.outbox_release_due() (sql/functions/15_schedule.sql) moves it
 * into the outbox through the ordinary publish when deliver_at has come.
 * Both functions here run as their caller for the right to publish to the
 * outbox (src/outbox_rights.c), then write as the catalog's owner.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "payload_schema.h"
#include "pg_tide.h"
#include "publish_args.h"
#include "schedule_wake.h"

PG_FUNCTION_INFO_V1(tide_outbox_schedule);
PG_FUNCTION_INFO_V1(tide_outbox_unschedule);

static SPIPlanPtr schedule_plan = NULL;
static SPIPlanPtr unschedule_plan = NULL;

/*
 * The row goes in only when the outbox exists and is enabled, as a
 * publish would: the refusal is told apart below.
 */
#define SCHEDULE_SQL \
	"INSERT INTO tide.outbox_scheduled (outbox_name, deliver_at, payload, headers, scheduled_by, expires_at)" \
	" SELECT c.outbox_name, $2, $3, $4, $5::pg_catalog.regrole, $6 FROM tide.tide_outbox_config c" \
	"  WHERE c.outbox_name OPERATOR(pg_catalog.=) $1 AND c.enabled" \
	" RETURNING id"

#define OUTBOX_STATE_SQL \
	"SELECT c.enabled FROM tide.tide_outbox_config c WHERE c.outbox_name OPERATOR(pg_catalog.=) $1"

#define UNSCHEDULE_SQL \
	"DELETE FROM tide.outbox_scheduled s" \
	" WHERE s.outbox_name OPERATOR(pg_catalog.=) $1 AND s.id OPERATOR(pg_catalog.=) $2"

/* The error for an outbox that took no scheduled row: missing or disabled. */
static void
refuse_outbox(const char *name)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1];
	static SPIPlanPtr state_plan = NULL;

	args[0] = CStringGetTextDatum(name);
	if (SPI_execute_plan(TidePlan(&state_plan, OUTBOX_STATE_SQL, 1, types),
						 args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the configuration of outbox \"%s\"", name);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("outbox \"%s\" does not exist", name),
				 errhint("Create it with tide.outbox_create().")));
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("outbox \"%s\" is disabled", name),
			 errhint("Enable it with tide.outbox_enable().")));
}

/*
 * SQL: tide.outbox_schedule(p_name, p_payload, p_headers, p_deliver_at,
 * p_expires_at) returns the schedule's id. A time already past is kept
 * too: the next move publishes it, so the answer is always a schedule's
 * id. The expiry is carried into the message at its move.
 */
Datum
tide_outbox_schedule(PG_FUNCTION_ARGS)
{
	Oid			types[6] = {TEXTOID, TIMESTAMPTZOID, JSONBOID, JSONBOID, OIDOID, TIMESTAMPTZOID};
	Datum		args[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', 'n'};
	char	   *name;
	Jsonb	   *payload;
	Jsonb	   *headers;
	TimestampTz deliver_at;
	TimestampTz expiry;
	Oid			save_userid;
	int			save_sec_context;
	bool		isnull;
	int64		id;

	TideRequirePreload();
	name = TideOutboxNameArg(fcinfo);
	payload = TidePayloadArg(fcinfo, 1, "Schedule");
	headers = TideHeadersArg(fcinfo, 2);
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("deliver_at must not be null"),
				 errhint("Give the time from which the message may be delivered, for example now() + interval '10 minutes'; use tide.outbox_publish() for at once.")));
	deliver_at = PG_GETARG_TIMESTAMPTZ(3);
	if (TIMESTAMP_IS_NOEND(deliver_at))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("deliver_at must be a finite time"),
				 errhint("A message scheduled for infinity would never be delivered; give a time.")));
	if (TideExpiryArg(fcinfo, 4, &expiry))
	{
		if (expiry <= deliver_at)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("expires_at must be after deliver_at"),
					 errdetail("expires_at is %s; deliver_at is %s.",
							   timestamptz_to_str(expiry), timestamptz_to_str(deliver_at)),
					 errhint("A message that expires before its time would never be delivered; give a later expires_at.")));
		args[5] = TimestampTzGetDatum(expiry);
		nulls[5] = ' ';
	}

	TidePublishBegin(name, &save_userid, &save_sec_context);
	/* a payload its outbox's schema refuses is refused now, not at its move */
	TidePayloadSchemaCheck(name, headers, (Datum[]) {JsonbPGetDatum(payload)}, 1, false);
	args[0] = CStringGetTextDatum(name);
	args[1] = TimestampTzGetDatum(deliver_at);
	args[2] = JsonbPGetDatum(payload);
	args[3] = headers ? JsonbPGetDatum(headers) : (Datum) 0;
	if (headers == NULL)
		nulls[3] = 'n';
	args[4] = ObjectIdGetDatum(save_userid);
	if (SPI_execute_plan(TidePlan(&schedule_plan, SCHEDULE_SQL, 6, types),
						 args, nulls, false, 1) != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "could not schedule a message for outbox \"%s\"", name);
	if (SPI_processed == 0)
		refuse_outbox(name);
	id = TideSpiInt64(1, &isnull);
	/*
	 * at commit, the relay looks at once and waits for the row's time; a
	 * database whose worker leaves meanwhile gets one then
	 */
	RelayWakeForScheduled(deliver_at);
	TidePublishEnd(save_userid, save_sec_context);

	PG_RETURN_INT64(id);
}

/*
 * SQL: tide.outbox_unschedule(p_name, p_id) returns whether the scheduled
 * message was removed: false when it was moved into the outbox already, or
 * is not the outbox's. A move in flight holds the row: this waits for it.
 */
Datum
tide_outbox_unschedule(PG_FUNCTION_ARGS)
{
	Oid			types[2] = {TEXTOID, INT8OID};
	Datum		args[2];
	char	   *name;
	Oid			save_userid;
	int			save_sec_context;
	bool		removed;

	TideRequirePreload();
	name = TideOutboxNameArg(fcinfo);
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("schedule id must not be null"),
				 errhint("Give the id tide.outbox_schedule() returned.")));

	TidePublishBegin(name, &save_userid, &save_sec_context);
	args[0] = CStringGetTextDatum(name);
	args[1] = PG_GETARG_DATUM(1);
	if (SPI_execute_plan(TidePlan(&unschedule_plan, UNSCHEDULE_SQL, 2, types),
						 args, NULL, false, 0) != SPI_OK_DELETE)
		elog(ERROR, "could not unschedule a message of outbox \"%s\"", name);
	removed = SPI_processed > 0;
	TidePublishEnd(save_userid, save_sec_context);

	PG_RETURN_BOOL(removed);
}
