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
 *	  taken (a repeat leaves that id unused); a batch claims every key
 *	  before its admission, not knowing yet which payloads go in, so it
 *	  records their ids afterwards (a HOT update: message_id is not
 *	  indexed).
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

/* Records the id of the message the claim published. */
#define RECORD_SQL \
	"UPDATE tide.outbox_idempotency_keys SET message_id = $3" \
	" WHERE outbox_name OPERATOR(pg_catalog.=) $1 AND idempotency_key OPERATOR(pg_catalog.=) $2"

static SPIPlanPtr claim_plan = NULL;
static SPIPlanPtr lookup_plan = NULL;
static SPIPlanPtr renew_plan = NULL;
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
 * returns the rows it processed.
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
	if (SPI_execute_plan(TidePlan(plan, sql, 3, types), args, nulls, false, 0) < 0)
		elog(ERROR, "could not look up idempotency key in outbox \"%s\"", outbox);
	return SPI_processed;
}

/*
 * Whether this publish may go ahead under the key: it claimed it for the
 * message `id` (0: not known yet; record it with IdempotencyRecord). When
 * not, *first_id is the id of the message published with the key within
 * the window, or 0 when an earlier element of this very batch claimed it.
 * Runs connected to SPI.
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

/* Records the id of the message a claimed key published. */
void
IdempotencyRecord(const char *outbox, const char *key, int64 id)
{
	Oid			types[3] = {TEXTOID, TEXTOID, INT8OID};
	Datum		args[3];

	args[0] = CStringGetTextDatum(outbox);
	args[1] = CStringGetTextDatum(key);
	args[2] = Int64GetDatum(id);
	if (SPI_execute_plan(TidePlan(&record_plan, RECORD_SQL, 3, types), args, NULL, false, 0) != SPI_OK_UPDATE ||
		SPI_processed != 1)
		elog(ERROR, "could not record idempotency key of outbox \"%s\"", outbox);
}
