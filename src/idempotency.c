/*
 * idempotency.c
 *		Publish-side idempotency keys of tide.outbox_publish() and
 *		tide.outbox_publish_batch() (docs/publishing.md).
 *
 * A publish that gives a key runs, inside the caller's transaction and
 * before its message is inserted:
 *
 * 1. Claim: an INSERT of (outbox, key, the message's id) into
 *	  outbox_idempotency_keys, ON CONFLICT DO NOTHING. Its primary key makes
 *	  a concurrent publish of the same key wait for the outcome of the
 *	  transaction that inserted it first: if that one rolled back, the
 *	  claim inserts; if it committed, the claim inserts nothing. A claim
 *	  that inserted publishes. A single publish claims with the id it has
 *	  taken (a repeat leaves that id unused); a batch claims all its keys
 *	  in one statement before its admission, not knowing yet which
 *	  payloads go in, and records their ids in another afterwards (HOT
 *	  updates: message_id is not indexed).
 * 2. Lookup, when the key is taken: a key within the outbox's
 *	  idempotency_window answers with the id it recorded, and nothing is
 *	  written. A key older than the window is taken over (its row renewed),
 *	  whether or not the sweep deleted it yet; a concurrent take-over waits
 *	  on the row lock and then finds the key renewed, so only one publishes.
 *
 * A publish without a key comes nowhere near this file. Under REPEATABLE
 * READ a key committed after the snapshot makes the claim fail with a
 * serialization error, which the caller retries.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "idempotency.h"
#include "pg_tide.h"

/* Longest idempotency key, in bytes. */
#define MAX_KEY_BYTES 255

/* Claims the key for this transaction with the id $3; nothing when it is taken. */
#define CLAIM_SQL \
	"INSERT INTO tide.outbox_idempotency_keys (outbox_name, idempotency_key, message_id)" \
	" VALUES ($1, $2, $3) ON CONFLICT DO NOTHING"

/* The id a taken key recorded (NULL: claimed by this very call) and whether it is within the window. */
#define LOOKUP_SQL \
	"SELECT k.message_id, k.created_at OPERATOR(pg_catalog.>=)" \
	"       (pg_catalog.now() OPERATOR(pg_catalog.-) c.idempotency_window)" \
	"  FROM tide.outbox_idempotency_keys k, tide.tide_outbox_config c" \
	" WHERE c.outbox_name OPERATOR(pg_catalog.=) k.outbox_name" \
	"   AND k.outbox_name OPERATOR(pg_catalog.=) $1 AND k.idempotency_key OPERATOR(pg_catalog.=) $2"

/* Takes over a key older than the window; nothing when another publish renewed it meanwhile. */
#define RENEW_SQL \
	"UPDATE tide.outbox_idempotency_keys k SET message_id = $3, created_at = pg_catalog.now()" \
	"  FROM tide.tide_outbox_config c" \
	" WHERE c.outbox_name OPERATOR(pg_catalog.=) k.outbox_name" \
	"   AND k.outbox_name OPERATOR(pg_catalog.=) $1 AND k.idempotency_key OPERATOR(pg_catalog.=) $2" \
	"   AND k.created_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) c.idempotency_window)"

/*
 * A batch's claim of its keys $2 (text[], NULLs skipped) in one statement:
 * the position (from 1) of the first element of each key it claimed.
 */
#define CLAIM_BATCH_SQL \
	"WITH claimed AS (" \
	" INSERT INTO tide.outbox_idempotency_keys (outbox_name, idempotency_key)" \
	" SELECT $1, k.key FROM ROWS FROM (pg_catalog.unnest($2)) WITH ORDINALITY AS k (key, n)" \
	"  WHERE k.key IS NOT NULL ORDER BY k.n" \
	" ON CONFLICT DO NOTHING RETURNING idempotency_key)" \
	"SELECT pg_catalog.min(k.n)" \
	"  FROM ROWS FROM (pg_catalog.unnest($2)) WITH ORDINALITY AS k (key, n), claimed c" \
	" WHERE k.key OPERATOR(pg_catalog.=) c.idempotency_key GROUP BY k.key"

/* Records the ids $3 (bigint[]) of the messages a batch's keys $2 (text[], NULLs skipped) published. */
#define RECORD_SQL \
	"UPDATE tide.outbox_idempotency_keys k SET message_id = r.id" \
	"  FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3)) AS r (key, id)" \
	" WHERE k.outbox_name OPERATOR(pg_catalog.=) $1 AND k.idempotency_key OPERATOR(pg_catalog.=) r.key"

static SPIPlanPtr claim_plan = NULL;
static SPIPlanPtr lookup_plan = NULL;
static SPIPlanPtr renew_plan = NULL;
static SPIPlanPtr claim_batch_plan = NULL;
static SPIPlanPtr record_plan = NULL;

/*
 * Refuses a key that is empty or too long, before anything is written;
 * `index` is its position in a batch's array, 0 for a single publish.
 */
void
IdempotencyCheckKey(const char *key, int index)
{
	char	   *what = index > 0 ? psprintf("idempotency key %d", index) : "idempotency key";

	if (key[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", what),
				 errhint("Give a key that names the operation, or NULL to publish without one.")));
	if (strlen(key) > MAX_KEY_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is too long", what),
				 errhint("Idempotency keys have at most %d bytes; this one has %zu. Hash a longer key first.",
						 MAX_KEY_BYTES, strlen(key))));
}

/*
 * Runs one of the statements above on (outbox, key, id: NULL when 0);
 * returns the rows it processed. All but the claim, an INSERT, find their
 * rows by the primary key: they are planned for each run (see
 * TidePlanWithOptions), so that a plan made while the table was empty
 * never scans it whole.
 */
static uint64
run_on_key(SPIPlanPtr *plan, const char *sql, const char *outbox, const char *key, int64 id)
{
	Oid			types[3] = {TEXTOID, TEXTOID, INT8OID};
	Datum		args[3];
	char		nulls[3] = {' ', ' ', id == 0 ? 'n' : ' '};

	args[0] = CStringGetTextDatum(outbox);
	args[1] = CStringGetTextDatum(key);
	args[2] = Int64GetDatum(id);
	if (SPI_execute_plan(TidePlanWithOptions(plan, sql, 3, types,
											 plan == &claim_plan ? 0 : CURSOR_OPT_CUSTOM_PLAN),
						 args, nulls, false, 0) < 0)
		elog(ERROR, "could not look up idempotency key in outbox \"%s\"", outbox);
	return SPI_processed;
}

/*
 * Whether this publish may go ahead under the key: it claimed it for the
 * message `id` (0: not known yet, for a batch). When not, *first_id is the
 * id of the message published with the key within the window, or 0 when
 * an earlier element of this very batch claimed it. Runs connected to SPI.
 */
bool
IdempotencyClaim(const char *outbox, const char *key, int64 id, int64 *first_id)
{
	/*
	 * Each pass ends unless a row found taken is gone (the sweep deleted it)
	 * or renewed by a publish that rolled back; a few passes suffice.
	 */
	for (int attempt = 0; attempt < 3; attempt++)
	{
		bool		isnull;
		bool		within;
		int64		found;

		if (run_on_key(&claim_plan, CLAIM_SQL, outbox, key, id) == 1)
			return true;
		if (run_on_key(&lookup_plan, LOOKUP_SQL, outbox, key, 0) == 0)
		{
			/* Deleted by the sweep since the claim: claim again. */
			continue;
		}
		within = TideSpiBool(2);
		found = TideSpiInt64(1, &isnull);
		if (within)
		{
			*first_id = isnull ? 0 : found;
			return false;
		}
		if (run_on_key(&renew_plan, RENEW_SQL, outbox, key, id) == 1)
			return true;
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not claim idempotency key \"%s\" of outbox \"%s\"", key, outbox),
			 errdetail("Concurrent publishes of the key kept changing it."),
			 errhint("Retry the transaction.")));
	return false;				/* keep the compiler quiet */
}

/* The text[] of `count` keys, NULL where a key is NULL. */
static Datum
keys_array(char **keys, int count)
{
	Datum	   *elems = palloc0(sizeof(Datum) * Max(count, 1));
	bool	   *nulls = palloc(sizeof(bool) * Max(count, 1));
	int			dims[1] = {count};
	int			lbs[1] = {1};

	for (int i = 0; i < count; i++)
	{
		nulls[i] = keys[i] == NULL;
		if (!nulls[i])
			elems[i] = CStringGetTextDatum(keys[i]);
	}
	return PointerGetDatum(construct_md_array(elems, nulls, 1, dims, lbs, TEXTOID, -1, false,
											  TYPALIGN_INT));
}

/*
 * Which of a batch's `count` payloads may go in under their `keys` (NULL:
 * no key): those without one, and the first of each key the batch claims.
 * One statement claims the keys no one has; only a key taken already (a
 * repeat, or older than the window) or repeated in the batch is looked at
 * alone. Record the ids with IdempotencyRecordBatch. Runs connected to SPI.
 */
bool *
IdempotencyClaimBatch(const char *outbox, char **keys, int count)
{
	Oid			types[2] = {TEXTOID, TEXTARRAYOID};
	Datum		args[2];
	bool	   *publish = palloc0(sizeof(bool) * Max(count, 1));
	bool	   *claimed = palloc0(sizeof(bool) * Max(count, 1));

	args[0] = CStringGetTextDatum(outbox);
	args[1] = keys_array(keys, count);
	if (SPI_execute_plan(TidePlan(&claim_batch_plan, CLAIM_BATCH_SQL, 2, types), args, NULL, false, 0) !=
		SPI_OK_SELECT)
		elog(ERROR, "could not claim idempotency keys in outbox \"%s\"", outbox);
	for (uint64 row = 0; row < SPI_processed; row++)
	{
		bool		isnull;
		int64		position = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[row],
														   SPI_tuptable->tupdesc, 1, &isnull));

		claimed[position - 1] = true;
	}
	for (int i = 0; i < count; i++)
	{
		int64		first_id;

		publish[i] = keys[i] == NULL || claimed[i] ||
			IdempotencyClaim(outbox, keys[i], 0, &first_id);
	}
	return publish;
}

/*
 * Records the `ids` of the `n` messages a batch published under `keys`
 * (NULL: no key).
 */
void
IdempotencyRecordBatch(const char *outbox, char **keys, int64 *ids, int n)
{
	Oid			types[3] = {TEXTOID, TEXTARRAYOID, INT8ARRAYOID};
	Datum		args[3];
	Datum	   *id_elems = palloc(sizeof(Datum) * n);
	uint64		keyed = 0;

	for (int i = 0; i < n; i++)
	{
		id_elems[i] = Int64GetDatum(ids[i]);
		keyed += keys[i] != NULL;
	}
	args[0] = CStringGetTextDatum(outbox);
	args[1] = keys_array(keys, n);
	args[2] = PointerGetDatum(construct_array(id_elems, n, INT8OID, sizeof(int64), FLOAT8PASSBYVAL,
											  TYPALIGN_DOUBLE));
	if (SPI_execute_plan(TidePlanWithOptions(&record_plan, RECORD_SQL, 3, types, CURSOR_OPT_CUSTOM_PLAN),
						 args, NULL, false, 0) != SPI_OK_UPDATE ||
		SPI_processed != keyed)
		elog(ERROR, "could not record idempotency keys of outbox \"%s\"", outbox);
}
