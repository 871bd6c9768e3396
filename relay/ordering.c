/*
 * ordering.c
 *		Ordered delivery per key ("ordering": "key"): messages with the same
 *		key arrive in id order, at most one in flight per key, and a failing
 *		message holds back only its own key's later messages. Everything
 *		that decides keys, dependencies and parking is here; flow_forward.c,
 *		lease.c and the sinks call it.
 *
 * - The key ("ordering_key") is a header name, or an RFC 6901 JSON pointer
 *	 into the payload when it starts with "/". The validator (called from
 *	 pipeline_config.c) checks it; the lease's SQL computes each message's
 *	 key (headers ->> name, or payload #>> path), so the key is what the
 *	 database sees; NULL (no such header or member) means no key, and the
 *	 message is delivered as with "relaxed".
 * - A key is blocked while the pipeline's retry queue holds an entry of
 *	 it: a live message of a blocked key is not sent but parked, queued
 *	 behind that entry (its attempts unchanged, due at once), in the
 *	 record transaction that moves the offset over it, so nothing is lost
 *	 and the offset is not held up by one key.
 * - Within a batch, each message waits for the previous one of its key
 *	 (RelayOrderingDependencies): the sink starts it only once that one was
 *	 delivered; when that one failed or was parked, it is not sent, and
 *	 parked too.
 * - From the retry queue only the entries of a key with no earlier entry
 *	 still waiting for its time are taken, in id order (lease.c), so the
 *	 head of each key goes first and the entries parked behind it follow
 *	 once it has left the queue (delivered or dead-lettered).
 * - A key is a message's value, of any length: the queue's index holds its
 *	 hash (sql/install/01_catalog.sql), which the queries compare first to
 *	 use the index and then the keys in full, so two keys whose hashes
 *	 collide are still two keys; in memory keys are compared in full
 *	 (strcmp), never cut to a fixed size.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"

#include "config_value.h"
#include "pg_tide.h"
#include "forward.h"
#include "relay_xact.h"

/* What the hints say a key is. */
#define KEY_HINT "Give \"ordering_key\" as a header name such as \"aggregate-id\", or a JSON " \
	"pointer into the payload such as \"/order/id\"."

/*
 * The segments of a JSON pointer ("/a/b~1c" is a, b/c), in *segments;
 * false when it is not one (it must start with "/", and "~" must be
 * followed by 0 or 1).
 */
static bool
pointer_segments(const char *pointer, List **segments)
{
	StringInfoData seg;
	const char *c;

	*segments = NIL;
	if (pointer[0] != '/')
		return false;
	initStringInfo(&seg);
	for (c = pointer + 1;; c++)
	{
		if (*c == '/' || *c == '\0')
		{
			*segments = lappend(*segments, pstrdup(seg.data));
			resetStringInfo(&seg);
			if (*c == '\0')
				break;
		}
		else if (*c == '~')
		{
			if (c[1] != '0' && c[1] != '1')
				return false;
			appendStringInfoChar(&seg, c[1] == '0' ? '~' : '/');
			c++;
		}
		else
			appendStringInfoChar(&seg, *c);
	}
	return true;
}

/*
 * The validator of "ordering_key" (pipeline_config.c calls it with the
 * chosen ordering): required with "key", refused otherwise; a JSON pointer
 * must parse. Raises 22023 with a hint; adds the key to `out`.
 */
void
RelayOrderingValidate(const cJSON *config, const char *ordering, cJSON *out)
{
	const cJSON *key = cJSON_GetObjectItemCaseSensitive(config, "ordering_key");
	List	   *segments;

	if (strcmp(ordering, "key") != 0)
	{
		if (key != NULL)
			RelayConfigError("Leave \"ordering_key\" out, or set \"ordering\": \"key\" to deliver each key's messages in order.",
							 "config key \"ordering_key\" is only for \"ordering\": \"key\", not \"%s\"",
							 ordering);
		return;
	}
	if (key == NULL)
		RelayConfigError(KEY_HINT, "config key \"ordering_key\" is missing: \"ordering\": \"key\" needs it");
	RelayConfigCheckType("ordering_key", key, "string", KEY_HINT);
	if (key->valuestring[0] == '\0')
		RelayConfigError(KEY_HINT, "config key \"ordering_key\" must not be empty");
	if (strlen(key->valuestring) > 1000)
		RelayConfigError(KEY_HINT, "config key \"ordering_key\" is longer than 1000 bytes");
	/* Not repeated in the message: a line break would forge a line of the log. */
	if (RelayConfigMatches(key->valuestring, "[[:cntrl:]]"))
		RelayConfigError(KEY_HINT, "config key \"ordering_key\" must not contain control characters");
	if (key->valuestring[0] == '/' && !pointer_segments(key->valuestring, &segments))
		RelayConfigError("In a JSON pointer, write \"~0\" for \"~\" and \"~1\" for \"/\" inside a member name (RFC 6901).",
						 "config key \"ordering_key\" is not a valid JSON pointer: \"%s\"",
						 key->valuestring);
	RelayConfigAddCopy(out, "ordering_key", key);
}

/*
 * The lease query's arguments that compute each message's key: the header
 * name, or the pointer as a text[] path for #>>; both NULL (no key at all)
 * without ordering 'key'.
 */
void
RelayOrderingKeyArgs(const RelayPipeline *p, Datum *header, bool *header_null,
					 Datum *path, bool *path_null)
{
	List	   *segments;
	Datum	   *elems;
	int			n = 0;
	ListCell   *lc;

	*header_null = *path_null = true;
	if (p->ordering_key == NULL)
		return;
	if (!pointer_segments(p->ordering_key, &segments))
	{
		*header = CStringGetTextDatum(p->ordering_key);
		*header_null = false;
		return;
	}
	elems = palloc(sizeof(Datum) * Max(list_length(segments), 1));
	foreach(lc, segments)
		elems[n++] = CStringGetTextDatum((char *) lfirst(lc));
	*path = RelayMakeArray(elems, NULL, n, TEXTOID);
	*path_null = false;
}

/*
 * Marks the leased messages whose key is blocked (the retry queue holds an
 * entry of it), in one query, in the lease's transaction: they are parked,
 * not sent.
 */
void
RelayOrderingFindBlocked(const RelayPipeline *p, RelayMessage *msgs, int n)
{
	Oid			argtypes[2] = {TEXTOID, TEXTARRAYOID};
	Datum		values[2];
	Datum	   *keys;
	bool	   *nulls;
	bool		any = false;
	bool		isnull;

	if (p->ordering_key == NULL)
		return;
	keys = palloc(sizeof(Datum) * Max(n, 1));
	nulls = palloc(sizeof(bool) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		nulls[i] = msgs[i].key == NULL;
		keys[i] = nulls[i] ? (Datum) 0 : CStringGetTextDatum(msgs[i].key);
		any |= !nulls[i];
	}
	if (!any)
		return;
	values[0] = CStringGetTextDatum(p->name);
	values[1] = RelayMakeArray(keys, nulls, n, TEXTOID);
	if (SPI_execute_with_args("SELECT u.i FROM pg_catalog.unnest($2) WITH ORDINALITY AS u(k, i)"
							  " WHERE EXISTS (SELECT FROM tide.relay_retry_queue q"
							  "                WHERE q.pipeline_id OPERATOR(pg_catalog.=) $1"
							  "                  AND pg_catalog.hashtextextended(q.ordering_key, 0)"
							  "                      OPERATOR(pg_catalog.=) pg_catalog.hashtextextended(u.k, 0)"
							  "                  AND q.ordering_key OPERATOR(pg_catalog.=) u.k)",
							  2, argtypes, values, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the retry queue of pipeline \"%s\"", p->name);
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		int64		i = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc,
													1, &isnull));

		if (i >= 1 && i <= n)
			msgs[i - 1].blocked = true;
	}
}

/* The messages of a batch sorted by key, then position (qsort). */
static const RelayMessage *sort_msgs;

static int
compare_by_key(const void *a, const void *b)
{
	int			ia = *(const int *) a;
	int			ib = *(const int *) b;
	int			c = strcmp(sort_msgs[ia].key, sort_msgs[ib].key);

	return c != 0 ? c : (ia > ib) - (ia < ib);
}

/*
 * after[i]: the previous message of msgs[i]'s key among those included
 * (include NULL: all), or -1; what the sink waits for (sink.h).
 */
void
RelayOrderingDependencies(const RelayMessage *msgs, int n, const bool *include, int *after)
{
	int		   *idx = palloc(sizeof(int) * Max(n, 1));
	int			m = 0;

	for (int i = 0; i < n; i++)
	{
		after[i] = -1;
		if (msgs[i].key != NULL && (include == NULL || include[i]))
			idx[m++] = i;
	}
	sort_msgs = msgs;
	qsort(idx, m, sizeof(int), compare_by_key);
	for (int k = 1; k < m; k++)
		if (strcmp(msgs[idx[k]].key, msgs[idx[k - 1]].key) == 0)
			after[idx[k]] = idx[k - 1];
	pfree(idx);
}

/* Whether an outcome is a failure the message answers for (flow_forward.c's rule). */
static bool
failed(RelayOutcome o)
{
	return o == RELAY_RETRYABLE || o == RELAY_PERMANENT;
}

/*
 * Which NOT_SENT messages of a live batch are parked (*parked, their
 * outcome's error saying why): those of a blocked key, and those whose
 * previous message of their key in the batch failed or was parked. The
 * others not sent are not settled and are leased again. Returns how many.
 */
int
RelayOrderingParked(const RelayMessage *msgs, int n, const int *after,
					RelayMessageOutcome *each, bool *parked)
{
	int			nparked = 0;

	for (int i = 0; i < n; i++)
	{
		int			j = after[i];

		parked[i] = false;
		if (msgs[i].key == NULL || each[i].outcome != RELAY_NOT_SENT)
			continue;
		if (msgs[i].blocked)
			RelaySetFailure(&each[i], RELAY_NOT_SENT, "parked", 0,
							"parked: an earlier message of its ordering key waits in the retry queue");
		else if (j >= 0 && (parked[j] || failed(each[j].outcome)))
		{
			char		error[sizeof(each[i].error)];

			snprintf(error, sizeof(error),
					 "parked: waits for message " INT64_FORMAT " of its ordering key, which %s",
					 msgs[j].id, parked[j] ? "is parked" : "failed");
			RelaySetFailure(&each[i], RELAY_NOT_SENT, "parked", 0, error);
		}
		else
			continue;
		parked[i] = true;
		nparked++;
	}
	return nparked;
}
