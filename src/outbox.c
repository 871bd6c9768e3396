/*
 * outbox.c
 *		Publishing: tide.outbox_publish() and tide.outbox_publish_batch().
 *
 * A publish runs inside the caller's transaction: the messages commit or
 * roll back with the caller's own writes. The message ids come from the
 * column default tide._next_message_id(), which registers the transaction
 * with the publish tracker (tracker.c).
 *
 * Publishing is admitted when the outbox exists, is enabled, and would not
 * hold more unconsumed messages than a limit that holds it back (an
 * inline_threshold and a positioned consumer group: src/backpressure.c).
 * To cost little more than an INSERT, a publish in the common case is one
 * plain INSERT:
 *
 * 1. Ids first: the publish takes its ids (tracker.c) and asks
 *	  partitions.c for the table that holds them: a child table of
 *	  tide_outbox_messages, or the parent. It inserts there directly, so
 *	  the row is never routed and retention can drop the child whole; one
 *	  message into a child under READ COMMITTED without the executor
 *	  (src/direct_insert.c), anything else with an INSERT through SPI.
 * 2. Fast path: the backend remembers, for at most ADMISSION_CACHE_MS and
 *	  until tide_outbox_config changes, that the outbox exists and is
 *	  enabled, its position (below it every message is consumed) and the
 *	  span of ids above it that backpressure admits without a look
 *	  (src/admission_cache.c). The publish locks its table, takes in the
 *	  invalidations, and inserts when a cheap upper bound on the unconsumed
 *	  messages is within the span: the ids from the position to the last
 *	  id it takes. Neither the config row nor a
 *	  message table is read (a probe there would lock every child table,
 *	  and retention drops them).
 * 3. Slow path, when the backend remembers nothing it may use or the bound
 *	  is reached: the full check, which raises the error that applies
 *	  (missing, disabled, or too many messages by an exact count above the
 *	  lowest consumer group position), records a crossing of 80 or 100 %
 *	  of the limit, and otherwise admits the publish and yields what step 2
 *	  remembers.
 *
 * A publish with an idempotency key inserts its message only if it claims
 * the key, between steps 2 or 3 and the INSERT (src/idempotency.c). A
 * publish with an expiry writes it into expires_at; one without names no
 * such column, so it costs nothing and a 0.1.0 catalog, which has none,
 * takes it.
 *
 * Messages name their outbox without a foreign key (a key share lock on the
 * config row per message would make concurrent publishers share it through
 * multixacts). The publish holds ROW EXCLUSIVE on its table from step 2
 * until it ends, and outbox_drop takes SHARE ROW EXCLUSIVE on the message
 * tables before it deletes, so a publish either ends before the drop
 * deletes its messages or waits, then processes the drop's invalidation
 * and finds no outbox in the slow path. Under REPEATABLE READ the
 * snapshot is older than the lock, so there the INSERT itself reads and
 * locks the config row (FOR KEY SHARE) and fails with a serialization
 * error if a drop removed it; it inserts nothing when the outbox is
 * disabled or full, and the slow path then raises the error.
 *
 * The statements name every function, operator and type with its schema:
 * they run with the caller's search_path (a fixed one would cost every
 * publish a GUC change), and must not resolve anything through it.
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "admission_cache.h"
#include "backpressure.h"
#include "idempotency.h"
#include "partitions.h"
#include "payload_schema.h"
#include "publish_args.h"
#include "pg_tide.h"

PG_FUNCTION_INFO_V1(tide_outbox_publish);
PG_FUNCTION_INFO_V1(tide_outbox_publish_batch);
PG_FUNCTION_INFO_V1(tide_outbox_publish_moved);

static SPIPlanPtr admit_plan = NULL;
static SPIPlanPtr admit_plan_without_levels = NULL;

/*
 * The slow path's read of the outbox's config row: enabled, threshold, the
 * position, whether a positioned consumer group reads it, and the
 * backpressure level recorded (the expression `level`: a 0.1.0 catalog
 * records none).
 */
#define ADMIT_SQL(level) \
	"SELECT c.enabled, c.inline_threshold::bigint," \
	"       greatest(tide._outbox_low_water(c.outbox_name)," \
	"                (SELECT m.id OPERATOR(pg_catalog.-) 1 FROM tide.tide_outbox_messages m" \
	"                  WHERE m.outbox_name OPERATOR(pg_catalog.=) c.outbox_name" \
	"                    AND m.consumed_at IS NULL" \
	"                  ORDER BY m.outbox_name, m.id LIMIT 1))," \
	"       EXISTS (SELECT FROM tide.tide_consumer_groups g" \
	"                WHERE g.outbox_name OPERATOR(pg_catalog.=) c.outbox_name" \
	"                  AND tide._group_position(g.group_name) IS NOT NULL)," \
	"       " level \
	"  FROM tide.tide_outbox_config c WHERE c.outbox_name OPERATOR(pg_catalog.=) $1"

/*
 * The REPEATABLE READ INSERT's admission, as a condition on the config row
 * c: $4 skips it (the slow path admitted the publish), $6 is the outbox's
 * position, $7 the last id the publish takes, $8 the span admitted above
 * the position. Every unconsumed message lies between the position and the
 * last id handed out, so their distance bounds the count.
 */
#define ADMITTED_BY_BOUND \
	"c.enabled AND ($4 OR $7 OPERATOR(pg_catalog.-) $6 OPERATOR(pg_catalog.<=) $8)"

/*
 * The INSERTs into the table named by %s (in schema tide; partitions.c):
 * $1 outbox, $2 payload (jsonb[] for a batch), $3 headers, $5 the id
 * (bigint[] for a batch), $9 the expiry, named only by the plans of a
 * publish that has one (EXPIRY_COLUMN, EXPIRY_VALUE). Under READ COMMITTED
 * the admission was decided before (step 2 at the top of the file); under
 * REPEATABLE READ the INSERT reads and locks the config row itself.
 */
#define EXPIRY_COLUMN ", expires_at"
#define EXPIRY_VALUE ", $9"
#define INSERT_ONE_SQL(column, value) \
	"INSERT INTO tide.\"%s\" (id, outbox_name, payload, headers" column ")" \
	" VALUES ($5, $1, $2, $3" value ")"
#define INSERT_BATCH_SQL(column, value) \
	"INSERT INTO tide.\"%s\" (id, outbox_name, payload, headers" column ")" \
	" SELECT p.id, $1, p.payload, $3" value \
	"   FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($5)) WITH ORDINALITY AS p (payload, id, n)" \
	"  ORDER BY p.n"
#define INSERT_ONE_LOCKING_SQL(column, value) \
	"INSERT INTO tide.\"%s\" (id, outbox_name, payload, headers" column ")" \
	" SELECT $5, c.outbox_name, $2, $3" value " FROM tide.tide_outbox_config c" \
	"  WHERE c.outbox_name OPERATOR(pg_catalog.=) $1 AND " ADMITTED_BY_BOUND \
	"  FOR KEY SHARE OF c"
#define INSERT_BATCH_LOCKING_SQL(column, value) \
	"INSERT INTO tide.\"%s\" (id, outbox_name, payload, headers" column ")" \
	" SELECT p.id, c.outbox_name, p.payload, $3" value \
	"   FROM tide.tide_outbox_config c," \
	"        ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($5)) WITH ORDINALITY AS p (payload, id, n)" \
	"  WHERE c.outbox_name OPERATOR(pg_catalog.=) $1 AND " ADMITTED_BY_BOUND \
	"  ORDER BY p.n FOR KEY SHARE OF c"

/* The INSERTs of a publish, by batch, locking and expiry (insert_plan's index). */
static const char *const insert_sql[PUBLISH_PLANS] = {
	INSERT_ONE_SQL("", ""),
	INSERT_ONE_LOCKING_SQL("", ""),
	INSERT_BATCH_SQL("", ""),
	INSERT_BATCH_LOCKING_SQL("", ""),
	INSERT_ONE_SQL(EXPIRY_COLUMN, EXPIRY_VALUE),
	INSERT_ONE_LOCKING_SQL(EXPIRY_COLUMN, EXPIRY_VALUE),
	INSERT_BATCH_SQL(EXPIRY_COLUMN, EXPIRY_VALUE),
	INSERT_BATCH_LOCKING_SQL(EXPIRY_COLUMN, EXPIRY_VALUE),
};

/* The outbox name argument, validated. */
char *
TideOutboxNameArg(FunctionCallInfo fcinfo)
{
	char	   *name = PG_ARGISNULL(0) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(0));

	TideValidateName("outbox", name);
	return name;
}

/* Refuses a JSON value that is not an object; `what` names it in the message. */
void
TideRequireObject(Jsonb *value, const char *what)
{
	if (!JB_ROOT_IS_OBJECT(value))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a JSON object", what),
				 errhint("Wrap the value in an object, for example {\"value\": ...}.")));
}

/*
 * The payload argument at `argno`: not null, an object, within
 * pg_tide.max_payload_bytes; `verb` ("Publish", "Schedule") begins the
 * hint of a null one.
 */
Jsonb *
TidePayloadArg(FunctionCallInfo fcinfo, int argno, const char *verb)
{
	Jsonb	   *payload;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payload must not be null"),
				 errhint("%s a JSON object; use {} for an empty message.", verb)));
	payload = PG_GETARG_JSONB_P(argno);
	TideRequireObject(payload, "payload");
	TideCheckPayloadSize(VARSIZE(payload) - VARHDRSZ, 0);
	return payload;
}

/* The optional headers argument at `argno`, validated; NULL when absent. */
Jsonb *
TideHeadersArg(FunctionCallInfo fcinfo, int argno)
{
	Jsonb	   *headers;

	if (PG_ARGISNULL(argno))
		return NULL;
	headers = PG_GETARG_JSONB_P(argno);
	TideRequireObject(headers, "headers");
	return headers;
}

/*
 * The optional expiry at argument `argno` into *expiry; false when it is
 * null, or absent from the function of an older catalog. An expiry not
 * after the publish's clock_timestamp() is refused: the message would be
 * expired when it is written.
 */
bool
TideExpiryArg(FunctionCallInfo fcinfo, int argno, TimestampTz *expiry)
{
	TimestampTz now;

	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return false;
	*expiry = PG_GETARG_TIMESTAMPTZ(argno);
	now = GetCurrentTimestamp();
	if (*expiry <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("expires_at must be after the time of the publish"),
				 errdetail("expires_at is %s; the time is %s.",
						   timestamptz_to_str(*expiry), timestamptz_to_str(now)),
				 errhint("Give a time still ahead, or no expires_at for a message that does not expire.")));
	return true;
}

/*
 * Whether the catalog records backpressure levels: not a 0.1.0 catalog,
 * which the library serves until ALTER EXTENSION pg_tide UPDATE.
 */
static bool
catalog_records_levels(void)
{
	Oid			nsp = get_namespace_oid("tide", true);
	Oid			relid = OidIsValid(nsp) ? get_relname_relid("tide_outbox_config", nsp) : InvalidOid;

	return OidIsValid(relid) && get_attnum(relid, "backpressure_level") != InvalidAttrNumber;
}

/*
 * The slow path's check that `n` more messages may be published to the
 * outbox: it exists, is enabled, and backpressure admits them
 * (src/backpressure.c). Raises the error that applies; returns the
 * position (see the top of the file) when the publish is admitted, and the
 * span the fast path may admit above it in *span_out. Reads with a new
 * snapshot (under READ COMMITTED), so that run under the publish's lock it
 * sees a drop the lock waited for.
 */
static int64
outbox_admit(const char *name, int64 n, int64 *span_out)
{
	Oid			admit_types[1] = {TEXTOID};
	Datum		args[1];
	bool		isnull;
	bool		threshold_isnull;
	bool		enabled;
	int64		threshold;
	int64		low;
	bool		grouped;
	int			level;

	args[0] = CStringGetTextDatum(name);
	if (SPI_execute_plan(catalog_records_levels() ?
						 TidePlan(&admit_plan, ADMIT_SQL("c.backpressure_level::bigint"), 1, admit_types) :
						 TidePlan(&admit_plan_without_levels, ADMIT_SQL("'-1'::bigint"), 1, admit_types),
						 args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the configuration of outbox \"%s\"", name);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("outbox \"%s\" does not exist", name),
				 errhint("Create it with tide.outbox_create().")));

	enabled = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	threshold = TideSpiInt64(2, &threshold_isnull);
	low = TideSpiInt64(3, &isnull);
	grouped = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 4, &isnull));
	level = (int) TideSpiInt64(5, &isnull);
	if (!enabled)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox \"%s\" is disabled", name),
				 errhint("Enable it with tide.outbox_enable().")));

	*span_out = BackpressureAdmit(name, n, grouped && !threshold_isnull, threshold, low, level);
	return low;
}

/*
 * The slow path, remembering what it read for the fast path of the next
 * publishes of this backend (src/admission_cache.c).
 */
static int64
admit_and_remember(const char *name, int64 n)
{
	uint64		generation = AdmissionGeneration();
	int64		span;
	int64		position = outbox_admit(name, n, &span);

	AdmissionRemember(name, position, span, generation);
	return position;
}

/* The saved INSERT of a target table, prepared on first use. */
static SPIPlanPtr
insert_plan(PublishTarget *target, bool batch, bool locking, bool expiring)
{
	Oid			types[9] = {TEXTOID, batch ? JSONBARRAYOID : JSONBOID, JSONBOID, BOOLOID,
		batch ? INT8ARRAYOID : INT8OID, INT8OID, INT8OID, INT8OID, TIMESTAMPTZOID};
	int			which = (expiring ? 4 : 0) + (batch ? 2 : 0) + (locking ? 1 : 0);

	if (target->plans[which] != NULL)
		return target->plans[which];
	return TidePlan(&target->plans[which], psprintf(insert_sql[which], target->table), 9, types);
}

/*
 * Step 2 under READ COMMITTED, once the ids first to last are taken: holds
 * the lock of the table they go to (the one outbox_drop waits for) and
 * takes in every change of tide_outbox_config committed before. What the
 * backend knew before the lock (`position`, and `span` unless the
 * slow path just `admitted` the publish) still holds when no invalidation
 * arrived since `generation`; otherwise, or when the bound leaves no room,
 * the slow path decides, now under the lock.
 */
static void
admit_under_lock(const char *name, int64 n, PublishTarget *target, int64 first, int64 last,
				 uint64 generation, bool admitted, int64 position, int64 span)
{
	LockRelationOid(target->relid, RowExclusiveLock);
	AcceptInvalidationMessages();
	if (generation == AdmissionGeneration() && first > position &&
		(admitted || last - position <= span))
		return;
	admit_and_remember(name, n);
}

/*
 * Inserts `n` messages into the outbox, admitted by the fast path or else
 * by the slow path (see the top of the file). `payload` is one jsonb, or a
 * jsonb[] of n for a batch. Returns their ids. With an idempotency `key`
 * (one message), the message goes in only if it claims the key; otherwise
 * the id returned is the one the key published (src/idempotency.c). Every
 * message expires at `expiry` unless it is NULL.
 */
static int64 *
insert_messages(const char *name, Datum payload, bool batch, int64 n, Jsonb *headers,
				const char *key, const TimestampTz *expiry)
{
	Datum		args[9];
	char		nulls[9] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	int64	   *ids = palloc(sizeof(int64) * n);
	bool		locking = IsolationUsesXactSnapshot();
	uint64		generation = AdmissionGeneration();
	int64		position = 0;
	int64		span = 0;
	bool		admitted;
	PublishTarget *target;
	SPIPlanPtr	plan;

	/*
	 * Without a recent position the slow path runs first, so that a refused
	 * publish takes no id. With one, only an outbox disabled, dropped or
	 * full since is refused after its ids were taken.
	 */
	admitted = !AdmissionRemembered(name, &position, &span);
	if (admitted)
		position = admit_and_remember(name, n);

	/* Step 1: the ids, in the order of the payloads, and their table. */
	for (int64 i = 0; i < n; i++)
		ids[i] = TrackerNextMessageId();
	target = PartitionTargetFor(ids[0], ids[n - 1]);
	plan = insert_plan(target, batch, locking, expiry != NULL);
	if (!locking)
		admit_under_lock(name, n, target, ids[0], ids[n - 1], generation, admitted, position, span);
	else if (!admitted && ids[0] <= position)
	{
		/* A sequence set back below the position: read it again. */
		position = admit_and_remember(name, n);
		admitted = true;
	}
	if (key != NULL && !IdempotencyClaim(name, key, ids[0], &ids[0]))
		return ids;

	args[0] = CStringGetTextDatum(name);
	args[1] = payload;
	args[2] = headers ? JsonbPGetDatum(headers) : (Datum) 0;
	if (headers == NULL)
		nulls[2] = 'n';
	args[3] = BoolGetDatum(admitted);
	if (batch)
	{
		Datum	   *elems = palloc(sizeof(Datum) * n);

		for (int64 i = 0; i < n; i++)
			elems[i] = Int64GetDatum(ids[i]);
		args[4] = PointerGetDatum(construct_array(elems, (int) n, INT8OID, sizeof(int64),
												  FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	}
	else
		args[4] = Int64GetDatum(ids[0]);
	args[5] = Int64GetDatum(position);
	args[6] = Int64GetDatum(ids[n - 1]);
	args[7] = Int64GetDatum(span);
	args[8] = expiry ? TimestampTzGetDatum(*expiry) : (Datum) 0;
	if (expiry == NULL)
		nulls[8] = 'n';

	/* READ COMMITTED, admitted above: one message goes in without the executor when it can */
	if (!batch && !locking &&
		TideDirectInsert(target->relid, ids[0], args[0], payload, args[2], headers == NULL,
						 args[8], expiry == NULL))
		return ids;
	for (int attempt = 0; attempt < 2; attempt++)
	{
		if (SPI_execute_plan(plan, args, nulls, false, 0) < 0)
			elog(ERROR, "could not insert messages into outbox \"%s\"", name);
		if (SPI_processed == (uint64) n)
			return ids;
		/* REPEATABLE READ: the slow path raises the error that applies, or admits. */
		args[5] = Int64GetDatum(admit_and_remember(name, n));
		args[3] = BoolGetDatum(true);
	}
	elog(ERROR, "outbox \"%s\" was admitted but its messages were not inserted", name);
	return NULL;				/* keep the compiler quiet */
}

/*
 * Connects SPI, checks that the caller may publish to the outbox and
 * becomes the catalog's owner for the writes (src/outbox_rights.c). An
 * error on the way resets the user with the (sub)transaction.
 */
void
TidePublishBegin(const char *name, Oid *save_userid, int *save_sec_context)
{
	GetUserIdAndSecContext(save_userid, save_sec_context);
	SPI_connect();
	SetUserIdAndSecContext(TideCatalogOwner(), *save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
	TideCheckPublishRight(*save_userid, name);
}

/* Ends what TidePublishBegin started. */
void
TidePublishEnd(Oid save_userid, int save_sec_context)
{
	SPI_finish();
	SetUserIdAndSecContext(save_userid, save_sec_context);
}

/*
 * The idempotency keys argument of a batch of `count` payloads, validated
 * before anything is written: NULL, or one key or NULL per payload.
 */
static char **
batch_keys_arg(FunctionCallInfo fcinfo, int argno, int count)
{
	ArrayType  *array;
	Datum	   *elems;
	bool	   *elem_nulls;
	int			nkeys;
	char	  **keys = palloc0(sizeof(char *) * Max(count, 1));

	/* A 0.1.0 catalog's function has no keys argument. */
	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return NULL;
	array = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idempotency keys must be a one-dimensional array"),
				 errhint("Pass text[] with one key, or NULL, per payload.")));
	deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT, &elems, &elem_nulls, &nkeys);
	if (nkeys != count)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idempotency keys must be as many as the payloads"),
				 errdetail("There are %d payloads and %d keys.", count, nkeys),
				 errhint("Pass one key, or NULL, per payload.")));
	for (int i = 0; i < count; i++)
	{
		if (elem_nulls[i])
			continue;
		keys[i] = TextDatumGetCString(elems[i]);
		IdempotencyCheckKey(keys[i], i + 1);
	}
	return keys;
}

/*
 * Publishes the `count` payloads `elems` of a batch whose `keys` were given,
 * leaving out those whose key was published (src/idempotency.c): claims
 * every key first, then publishes the others and records their ids.
 * Returns how many it published.
 */
static int
publish_keyed_batch(const char *name, Datum *elems, int count, char **keys, Jsonb *headers,
					const TimestampTz *expiry)
{
	bool	   *publish = IdempotencyClaimBatch(name, keys, count);
	Datum	   *kept = palloc(sizeof(Datum) * count);
	char	  **kept_keys = palloc(sizeof(char *) * count);
	int			nkept = 0;
	int64	   *ids;

	for (int i = 0; i < count; i++)
	{
		if (!publish[i])
			continue;
		kept_keys[nkept] = keys[i];
		kept[nkept++] = elems[i];
	}
	if (nkept == 0)
		return 0;
	ids = insert_messages(name, PointerGetDatum(construct_array(kept, nkept, JSONBOID, -1, false,
																 TYPALIGN_INT)),
						  true, nkept, headers, NULL, expiry);
	IdempotencyRecordBatch(name, kept_keys, ids, nkept);
	return nkept;
}

/*
 * One message's publish once its arguments are checked: the right to
 * publish, the payload schema, the insert. Returns its id.
 */
static int64
publish_one(const char *name, Jsonb *payload, Jsonb *headers, const char *key,
			const TimestampTz *expiry)
{
	int64		id;
	Oid			save_userid;
	int			save_sec_context;

	TidePublishBegin(name, &save_userid, &save_sec_context);
	TidePayloadSchemaCheck(name, headers, (Datum[]) {JsonbPGetDatum(payload)}, 1, false);
	id = insert_messages(name, JsonbPGetDatum(payload), false, 1, headers, key, expiry)[0];
	TidePublishEnd(save_userid, save_sec_context);
	return id;
}

/*
 * SQL: tide.outbox_publish(p_name, p_payload, p_headers, p_idempotency_key,
 * p_expires_at) returns the new id, or the id an earlier publish of the key
 * published
 */
Datum
tide_outbox_publish(PG_FUNCTION_ARGS)
{
	char	   *name;
	Jsonb	   *payload;
	Jsonb	   *headers;
	char	   *key = NULL;
	TimestampTz expiry;
	bool		expiring;

	TideRequirePreload();
	name = TideOutboxNameArg(fcinfo);
	payload = TidePayloadArg(fcinfo, 1, "Publish");
	headers = TideHeadersArg(fcinfo, 2);
	/* A 0.1.0 catalog's function has no key argument. */
	if (PG_NARGS() > 3 && !PG_ARGISNULL(3))
	{
		key = text_to_cstring(PG_GETARG_TEXT_PP(3));
		IdempotencyCheckKey(key, 0);
	}
	expiring = TideExpiryArg(fcinfo, 4, &expiry);

	PG_RETURN_INT64(publish_one(name, payload, headers, key, expiring ? &expiry : NULL));
}

/*
 * SQL: tide._outbox_publish_moved(p_name, p_payload, p_headers,
 * p_expires_at), the publish of a scheduled message at its move: an expiry
 * already past is kept, and the message expires where it is read.
 */
Datum
tide_outbox_publish_moved(PG_FUNCTION_ARGS)
{
	char	   *name;
	Jsonb	   *payload;
	Jsonb	   *headers;
	TimestampTz expiry;

	TideRequirePreload();
	name = TideOutboxNameArg(fcinfo);
	payload = TidePayloadArg(fcinfo, 1, "Publish");
	headers = TideHeadersArg(fcinfo, 2);
	if (!PG_ARGISNULL(3))
		expiry = PG_GETARG_TIMESTAMPTZ(3);

	PG_RETURN_INT64(publish_one(name, payload, headers, NULL, PG_ARGISNULL(3) ? NULL : &expiry));
}

/*
 * SQL: tide.outbox_publish_batch(p_name, p_payloads, p_headers,
 * p_idempotency_keys, p_expires_at) returns the number published. Every
 * payload and key, and the expiry, is checked before anything is written;
 * ids follow the array's order.
 */
Datum
tide_outbox_publish_batch(PG_FUNCTION_ARGS)
{
	char	   *name;
	ArrayType  *payloads;
	Jsonb	   *headers;
	Datum	   *elems;
	bool	   *elem_nulls;
	int			count;
	char	  **keys;
	TimestampTz expiry;
	bool		expiring;
	int16		typlen;
	bool		typbyval;
	char		typalign;
	Oid			save_userid;
	int			save_sec_context;

	TideRequirePreload();
	name = TideOutboxNameArg(fcinfo);
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
	if (ArrayGetNItems(ARR_NDIM(payloads), ARR_DIMS(payloads)) > TIDE_MAX_BATCH_MESSAGES)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("cannot publish more than %d messages in one batch", TIDE_MAX_BATCH_MESSAGES),
				 errdetail("The array has %d elements.",
						   ArrayGetNItems(ARR_NDIM(payloads), ARR_DIMS(payloads))),
				 errhint("Split the array into batches of at most %d; they may share one transaction.",
						 TIDE_MAX_BATCH_MESSAGES)));
	headers = TideHeadersArg(fcinfo, 2);

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
		TideCheckPayloadSize(VARSIZE_ANY_EXHDR(DatumGetPointer(elems[i])), i + 1);
		if (!JB_ROOT_IS_OBJECT(DatumGetJsonbP(elems[i])))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("payload %d must be a JSON object", i + 1),
					 errhint("Every element of the array must be a JSON object; nothing was published.")));
	}

	keys = batch_keys_arg(fcinfo, 3, count);
	expiring = TideExpiryArg(fcinfo, 4, &expiry);

	TidePublishBegin(name, &save_userid, &save_sec_context);
	TidePayloadSchemaCheck(name, headers, elems, count, true);
	if (keys != NULL)
		count = publish_keyed_batch(name, elems, count, keys, headers, expiring ? &expiry : NULL);
	if (keys == NULL && count > 0)
		insert_messages(name, PointerGetDatum(payloads), true, count, headers, NULL,
						expiring ? &expiry : NULL);
	else if (count == 0)
	{
		int64		span;

		outbox_admit(name, 0, &span);	/* publishes nothing, but checks the outbox */
	}
	TidePublishEnd(save_userid, save_sec_context);

	PG_RETURN_INT64(count);
}
