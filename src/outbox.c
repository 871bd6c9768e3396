/*
 * outbox.c
 *		Publishing: tide.outbox_publish() and tide.outbox_publish_batch().
 *
 * A publish runs inside the caller's transaction: the messages commit or
 * roll back with the caller's own writes. Before writing, it checks that
 * the outbox exists and is enabled, and applies backpressure: an outbox
 * never holds more unconsumed messages than its inline_threshold. The
 * message ids come from the column default tide._next_message_id(), which
 * registers the transaction with the publish tracker (tracker.c).
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"

#include "pg_tide.h"

PG_FUNCTION_INFO_V1(tide_outbox_publish);
PG_FUNCTION_INFO_V1(tide_outbox_publish_batch);

static SPIPlanPtr admit_plan = NULL;
static SPIPlanPtr count_plan = NULL;
static SPIPlanPtr insert_one_plan = NULL;
static SPIPlanPtr insert_batch_plan = NULL;

/* The outbox name argument, validated. */
static char *
outbox_name_arg(FunctionCallInfo fcinfo)
{
	char	   *name = PG_ARGISNULL(0) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(0));

	TideValidateName("outbox", name);
	return name;
}

/* Refuses a JSON value that is not an object; `what` names it in the message. */
static void
require_object(Jsonb *value, const char *what)
{
	if (!JB_ROOT_IS_OBJECT(value))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a JSON object", what),
				 errhint("Wrap the value in an object, for example {\"value\": ...}.")));
}

/* The optional headers argument at `argno`, validated; NULL when absent. */
static Jsonb *
headers_arg(FunctionCallInfo fcinfo, int argno)
{
	Jsonb	   *headers;

	if (PG_ARGISNULL(argno))
		return NULL;
	headers = PG_GETARG_JSONB_P(argno);
	require_object(headers, "headers");
	return headers;
}

/*
 * Checks that `n` more messages may be published to the outbox: it exists,
 * is enabled, and would not hold more than inline_threshold unconsumed
 * messages. Unconsumed means above the lowest position of its consumer
 * groups (all messages when it has none). The count is exact; it is only
 * taken when the cheap upper bound (last id handed out minus that position)
 * says the threshold could be reached.
 */
static void
outbox_admit(const char *name, int64 n)
{
	Oid			admit_types[1] = {TEXTOID};
	Oid			count_types[3] = {TEXTOID, INT8OID, INT8OID};
	Datum		args[3];
	bool		isnull;
	bool		enabled;
	int64		threshold;
	int64		low;
	int64		unconsumed;

	args[0] = CStringGetTextDatum(name);
	if (SPI_execute_plan(TidePlan(&admit_plan,
								  "SELECT c.enabled, c.inline_threshold::bigint,"
								  "       greatest(tide._outbox_low_water(c.outbox_name),"
								  "                (SELECT min(m.id) - 1 FROM tide.tide_outbox_messages m"
								  "                  WHERE m.outbox_name = c.outbox_name"
								  "                    AND m.consumed_at IS NULL))"
								  "  FROM tide.tide_outbox_config c WHERE c.outbox_name = $1",
								  1, admit_types),
						 args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the configuration of outbox \"%s\"", name);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("outbox \"%s\" does not exist", name),
				 errhint("Create it with tide.outbox_create().")));

	enabled = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	threshold = TideSpiInt64(2, &isnull);
	low = TideSpiInt64(3, &isnull);
	if (!enabled)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox \"%s\" is disabled", name),
				 errhint("Enable it with tide.outbox_enable().")));

	if (TrackerSequenceLastValue() - low + n <= threshold)
		return;

	args[1] = Int64GetDatum(low);
	args[2] = Int64GetDatum(threshold);
	if (SPI_execute_plan(TidePlan(&count_plan,
								  "SELECT count(*) FROM (SELECT 1 FROM tide.tide_outbox_messages m"
								  "  WHERE m.outbox_name = $1 AND m.consumed_at IS NULL AND m.id > $2"
								  "  LIMIT $3) s",
								  3, count_types),
						 args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not count the unconsumed messages of outbox \"%s\"", name);
	unconsumed = TideSpiInt64(1, &isnull);
	if (unconsumed + n > threshold)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("outbox \"%s\" has too many unconsumed messages", name),
				 unconsumed == threshold ?
				 errdetail("It holds at least %lld unconsumed messages and its inline_threshold is %lld.",
						   (long long) unconsumed, (long long) threshold) :
				 errdetail("It holds %lld unconsumed messages and its inline_threshold is %lld; "
						   "publishing %lld more would exceed it.",
						   (long long) unconsumed, (long long) threshold, (long long) n),
				 errhint("Let its consumer groups catch up before publishing more; "
						 "the limit is tide.tide_outbox_config.inline_threshold.")));
}

/* SQL: tide.outbox_publish(p_name, p_payload, p_headers) returns the new id */
Datum
tide_outbox_publish(PG_FUNCTION_ARGS)
{
	Oid			types[3] = {TEXTOID, JSONBOID, JSONBOID};
	char	   *name;
	Jsonb	   *payload;
	Jsonb	   *headers;
	Datum		args[3];
	char		nulls[3] = {' ', ' ', ' '};
	bool		isnull;
	int64		id;

	TideRequirePreload();
	name = outbox_name_arg(fcinfo);
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payload must not be null"),
				 errhint("Publish a JSON object; use {} for an empty message.")));
	payload = PG_GETARG_JSONB_P(1);
	require_object(payload, "payload");
	headers = headers_arg(fcinfo, 2);

	SPI_connect();
	outbox_admit(name, 1);

	args[0] = CStringGetTextDatum(name);
	args[1] = JsonbPGetDatum(payload);
	args[2] = headers ? JsonbPGetDatum(headers) : (Datum) 0;
	if (headers == NULL)
		nulls[2] = 'n';
	if (SPI_execute_plan(TidePlan(&insert_one_plan,
								  "INSERT INTO tide.tide_outbox_messages (outbox_name, payload, headers)"
								  " VALUES ($1, $2, $3) RETURNING id",
								  3, types),
						 args, nulls, false, 1) != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "could not insert a message into outbox \"%s\"", name);
	id = TideSpiInt64(1, &isnull);
	SPI_finish();

	PG_RETURN_INT64(id);
}

/*
 * SQL: tide.outbox_publish_batch(p_name, p_payloads, p_headers) returns the
 * number published. Every payload is checked before anything is written;
 * ids follow the array's order.
 */
Datum
tide_outbox_publish_batch(PG_FUNCTION_ARGS)
{
	Oid			types[3] = {TEXTOID, JSONBARRAYOID, JSONBOID};
	char	   *name;
	ArrayType  *payloads;
	Jsonb	   *headers;
	Datum	   *elems;
	bool	   *elem_nulls;
	int			count;
	Datum		args[3];
	char		nulls[3] = {' ', ' ', ' '};
	int16		typlen;
	bool		typbyval;
	char		typalign;

	TideRequirePreload();
	name = outbox_name_arg(fcinfo);
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payloads must not be null"),
				 errhint("Pass an array of JSON objects; an empty array publishes nothing.")));
	payloads = PG_GETARG_ARRAYTYPE_P(1);
	if (ARR_NDIM(payloads) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("payloads must be a one-dimensional array"),
				 errhint("Pass jsonb[] with one element per message.")));
	headers = headers_arg(fcinfo, 2);

	get_typlenbyvalalign(JSONBOID, &typlen, &typbyval, &typalign);
	deconstruct_array(payloads, JSONBOID, typlen, typbyval, typalign,
					  &elems, &elem_nulls, &count);
	for (int i = 0; i < count; i++)
	{
		if (elem_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("payload %d must not be null", i + 1),
					 errhint("Every element of the array must be a JSON object; nothing was published.")));
		if (!JB_ROOT_IS_OBJECT(DatumGetJsonbP(elems[i])))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("payload %d must be a JSON object", i + 1),
					 errhint("Every element of the array must be a JSON object; nothing was published.")));
	}

	SPI_connect();
	outbox_admit(name, count);
	if (count > 0)
	{
		args[0] = CStringGetTextDatum(name);
		args[1] = PointerGetDatum(payloads);
		args[2] = headers ? JsonbPGetDatum(headers) : (Datum) 0;
		if (headers == NULL)
			nulls[2] = 'n';
		if (SPI_execute_plan(TidePlan(&insert_batch_plan,
									  "INSERT INTO tide.tide_outbox_messages (outbox_name, payload, headers)"
									  " SELECT $1, p.payload, $3"
									  "   FROM unnest($2) WITH ORDINALITY AS p (payload, n)"
									  "  ORDER BY p.n",
									  3, types),
							 args, nulls, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "could not insert messages into outbox \"%s\"", name);
	}
	SPI_finish();

	PG_RETURN_INT64(count);
}
