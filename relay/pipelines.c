/*
 * pipelines.c
 *		Reading a database's enabled pipelines from relay_outbox_config into
 *		RelayPipeline structs, once per pass of its relay worker: the sink's
 *		settings, batch size and lease, retries, ordering, attempt log, rate
 *		limit, circuit breaker and routing.
 *
 * Every row is written through the validator (relay/pipeline_config.c, run
 * by the row's trigger), but a row written while triggers were off
 * (session_replication_role = replica) can hold anything, and it must
 * never stop another pipeline. So each row is validated again here, on
 * its own, inside a subtransaction: an invalid row is passed over, its
 * error recorded as the pipeline's (class 'config', logged once) until the
 * row is fixed; a valid one is read from its normalised config, in which
 * every value is present and within its range. A row's result is kept
 * while its config stays the same, so an unchanged row is validated once,
 * and a pipeline the worker already serves with that config is not read
 * again (unless its sink reads secrets, which may have changed).
 *
 * A row is validated with the rights of its owner (the role that set it,
 * relay_outbox_config.owner), not the worker's: a file it names is one
 * its owner may have the relay read (config_files.c). Its "md5" covers
 * the owner, the owner's rights that validation asks about and
 * pg_tide.secrets_directory besides the config, so a revoked right or a
 * dropped owner has the row validated again at the next pass, and the
 * pipeline closed if it is refused.
 */
#include "postgres.h"

#include <math.h>

#include <cjson/cJSON.h>

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/resowner.h"

#include "endpoints/registry.h"
#include "pg_tide.h"
#include "pipeline_config.h"
#include "forward.h"
#include "relay_xact.h"

/* The statements of every pass, planned once. */
static SPIPlanPtr pipelines_plan = NULL;
static SPIPlanPtr pipeline_failed_plan = NULL;
static SPIPlanPtr pipeline_ok_plan = NULL;

/*
 * Records that a pipeline cannot be read, as its error in
 * relay_pipeline_health (and so relay_pipeline_status) of class
 * error_class, and logs it when it is new; the pipeline is passed over
 * until it can be read.
 */
static void
pipeline_failed(const char *pipeline, const char *error_class, const char *error, const char *hint)
{
	Oid			types[3] = {TEXTOID, TEXTOID, TEXTOID};
	Datum		args[3] = {CStringGetTextDatum(pipeline), CStringGetTextDatum(error),
	CStringGetTextDatum(error_class)};

	if (SPI_execute_plan(TidePlan(&pipeline_failed_plan,
								  "INSERT INTO tide.relay_pipeline_health AS h"
								  "  (pipeline_id, consecutive_failures, last_failure_at, last_error_class, last_error)"
								  " VALUES ($1, 1, pg_catalog.now(), $3, $2)"
								  " ON CONFLICT (pipeline_id) DO UPDATE"
								  "   SET consecutive_failures = greatest(h.consecutive_failures, 1),"
								  "       last_failure_at = pg_catalog.now(), last_error_class = $3,"
								  "       last_error = $2, updated_at = pg_catalog.now()"
								  " WHERE h.last_error IS NULL OR h.last_error_class IS NULL"
								  "    OR h.last_error OPERATOR(pg_catalog.<>) $2"
								  "    OR h.last_error_class OPERATOR(pg_catalog.<>) $3",
								  3, types),
						 args, NULL, false, 0) == SPI_OK_INSERT && SPI_processed > 0)
		ereport(LOG,
				(errmsg("pg_tide relay pipeline \"%s\" is passed over: %s", pipeline, error),
				 errhint("%s", hint)));
}

/* Clears an error of class error_class recorded for a pipeline that can be read again. */
static void
pipeline_ok(const char *pipeline, const char *error_class)
{
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		args[2] = {CStringGetTextDatum(pipeline), CStringGetTextDatum(error_class)};

	SPI_execute_plan(TidePlan(&pipeline_ok_plan,
							  "UPDATE tide.relay_pipeline_health"
							  "   SET consecutive_failures = 0, last_error_class = NULL, last_error = NULL,"
							  "       updated_at = pg_catalog.now()"
							  " WHERE pipeline_id OPERATOR(pg_catalog.=) $1"
							  "   AND last_error_class OPERATOR(pg_catalog.=) $2",
							  2, types),
					 args, NULL, false, 0);
}

/* A secret reference that cannot be read (see pipeline_failed). */
static void
secret_failed(const char *pipeline, const char *error)
{
	pipeline_failed(pipeline, "secret_reference", error,
					"Set the secret it refers to, or change the pipeline with tide.relay_set_outbox().");
}

/* Clears a secret reference error recorded for a pipeline that can be read again. */
static void
secret_ok(const char *pipeline)
{
	pipeline_ok(pipeline, "secret_reference");
}

/*
 * The config's JSON text with every number of more than 60 characters
 * rewritten as the nearest double: cJSON cannot read a longer one, which a
 * valid config may hold (a rate of 0.0010000...01, a number in a filter;
 * the routing is compiled from the text as it is).
 */
static char *
shorten_numbers(const char *json)
{
	StringInfoData out;
	bool		in_string = false;
	const char *p = json;

	initStringInfo(&out);
	while (*p)
	{
		size_t		len;

		if (in_string)
		{
			if (*p == '\\' && p[1])
				appendStringInfoChar(&out, *p++);
			else if (*p == '"')
				in_string = false;
			appendStringInfoChar(&out, *p++);
			continue;
		}
		if (*p == '"')
			in_string = true;
		len = strspn(p, "-+0123456789.eE");
		if (len > 60)
		{
			char	   *number = pnstrdup(p, len);
			double		d = strtod(number, NULL);

			if (isinf(d))
				d = d > 0 ? 1e308 : -1e308;
			appendStringInfo(&out, "%.17g", d);
			p += len;
			continue;
		}
		if (len == 0)
			len = 1;
		appendBinaryStringInfo(&out, p, len);
		p += len;
	}
	return out.data;
}

/*
 * Opens the pipeline's sink from its config; false when it is passed over.
 * A secret reference that cannot be read is the pipeline's error in
 * relay_pipeline_health until it can be read again.
 */
static bool
open_sink(RelayPipeline *p, const cJSON *config, MemoryContext spi_cxt)
{
	RelaySinkOpened opened;
	bool		ok;
	MemoryContext cxt = CurrentMemoryContext;

	memset(&opened, 0, sizeof(opened));
	opened.pipeline = p->name;
	ok = p->sink->open(config, &opened);
	if (opened.read_secrets)
	{
		MemoryContextSwitchTo(spi_cxt);
		if (ok)
			secret_ok(p->name);
		else
			secret_failed(p->name, opened.error);
		MemoryContextSwitchTo(cxt);
	}
	if (!ok)
		return false;
	p->sink_state = opened.state;
	p->reads_secrets = opened.read_secrets;
	p->lease_seconds += opened.longest_batch_seconds;
	if (opened.retry_at_once)
		p->retry_base_ms = p->retry_cap_ms = 0;
	return true;
}

/*
 * One pipeline from its row, in a memory context of its own under the
 * current one (p->cxt, which the worker keeps for as long as it serves
 * this reading of the pipeline); NULL when it is passed over (see the top
 * of this file).
 */
static RelayPipeline *
read_pipeline(const char *name, const char *config_text, const char *md5,
			  MemoryContext spi_cxt)
{
	MemoryContext pcxt = AllocSetContextCreate(CurrentMemoryContext, "pg_tide relay pipeline",
											   ALLOCSET_SMALL_SIZES);
	MemoryContext old = MemoryContextSwitchTo(pcxt);
	cJSON	   *config = cJSON_Parse(shorten_numbers(config_text));
	RelayPipeline *p = NULL;
	const cJSON *retry = RelayConfigMember(config, "retry");
	const cJSON *rate = RelayConfigMember(config, "rate_limit");
	const cJSON *breaker = RelayConfigMember(config, "breaker");
	const RelaySinkRoutine *sink = RelaySinkLookup(RelayConfigString(config, "sink_type"));
	RelayRoutingError routing_error;

	if (config == NULL)
	{
		ereport(LOG, (errmsg("pg_tide relay pipeline \"%s\" is passed over: its config cannot be read", name)));
		goto done;
	}
	if (sink == NULL || !cJSON_IsString(RelayConfigMember(config, "consumer_group")) ||
		!cJSON_IsString(RelayConfigMember(config, "outbox")))
		goto done;

	p = palloc0(sizeof(RelayPipeline));
	p->cxt = pcxt;
	p->sink = sink;
	p->name = pstrdup(name);
	p->consumer_group = RelayConfigString(config, "consumer_group");
	p->consumer = psprintf("relay:%s", p->name);
	p->outbox = RelayConfigString(config, "outbox");
	p->config_md5 = pstrdup(md5);
	p->batch_size = RelayConfigIntOr(config, "batch_size", 100);
	p->lease_seconds = RELAY_LEASE_MARGIN_SECONDS;
	p->strict = RelayConfigStringIs(config, "ordering", "strict");
	p->overlap = RelayConfigIs(config, "overlap_batches", true);
	if (RelayConfigStringIs(config, "ordering", "key"))
		p->ordering_key = RelayConfigString(config, "ordering_key");
	p->log_attempts = !RelayConfigIs(config, "attempt_log", false);
	p->log_successes = p->log_attempts && !RelayConfigStringIs(config, "attempt_log", "failures");
	p->retry_base_ms = RelayConfigIntOr(retry, "base_ms", 500);
	p->retry_cap_ms = RelayConfigIntOr(retry, "cap_ms", 60000);
	p->retry_max_attempts = RelayConfigIntOr(retry, "max_attempts", 10);
	/* No rate limit unless one is given, no breaker either. */
	p->rate_per_second = RelayConfigNumberOr(rate, "per_second", 0);
	p->rate_burst = RelayConfigIntOr(rate, "burst", 1);
	p->breaker_threshold = RelayConfigIntOr(breaker, "failure_threshold", 0);
	p->breaker_cooldown_ms = RelayConfigIntOr(breaker, "cooldown_ms", 30000);
	if (!RelayRoutingCompile(RelayConfigJsonText(config, "types"),
							 RelayConfigJsonText(config, "filter"),
							 &p->routing, &routing_error))
	{
		/* the validator compiled it: only memory can be short here */
		ereport(LOG,
				(errmsg("pg_tide relay pipeline \"%s\" is passed over: %s",
						p->name, routing_error.message),
				 errhint("%s", routing_error.hint)));
		p = NULL;
		goto done;
	}
	if (!open_sink(p, config, spi_cxt))
		p = NULL;
done:
	cJSON_Delete(config);
	MemoryContextSwitchTo(old);
	if (p == NULL)
		MemoryContextDelete(pcxt);
	return p;
}

/* A row's validation as kept from pass to pass: its normalised config or its error. */
typedef struct ValidatedRow
{
	char	   *name;
	char		md5[33];
	char	   *config;			/* the normalised config as JSON text, or NULL */
	char	   *error;			/* why it is invalid, when config is NULL */
} ValidatedRow;

/*
 * The rows of the last pass, in validated_cxt; the next pass's are built in
 * next_validated_cxt, which an ERROR during a pass leaves to the next one
 * to delete.
 */
static MemoryContext validated_cxt = NULL;
static MemoryContext next_validated_cxt = NULL;
static ValidatedRow *validated = NULL;
static uint64 nvalidated = 0;

/*
 * The result kept for row i of this pass if its config is unchanged, or
 * NULL; the rows come in the same order every pass, so row i of the last
 * pass is tried first.
 */
static ValidatedRow *
validated_before(uint64 i, const char *name, const char *md5)
{
	if (i < nvalidated && strcmp(validated[i].name, name) == 0)
		return strcmp(validated[i].md5, md5) == 0 ? &validated[i] : NULL;
	for (uint64 j = 0; j < nvalidated; j++)
		if (strcmp(validated[j].name, name) == 0 && strcmp(validated[j].md5, md5) == 0)
			return &validated[j];
	return NULL;
}

/*
 * Runs the validator on a row's config inside a subtransaction, so that an
 * invalid row fails alone: fills in row->config, or row->error with the
 * validator's message. An error that is not about the config (a cancel,
 * memory) is raised again.
 */
static void
validate_row(Jsonb *config, const char *pipeline_owner, ValidatedRow *row)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;

	/* with the owner's rights, not the worker's: a dropped owner has none */
	Oid			rights = pipeline_owner ? get_role_oid(pipeline_owner, true) : InvalidOid;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		Jsonb	   *normalized = RelayNormalizeConfig(NULL, NULL, config, rights);

		row->config = JsonbToCString(NULL, &normalized->root, VARSIZE(normalized));
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		ErrorData  *error;

		MemoryContextSwitchTo(cxt);
		error = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
		if (ERRCODE_TO_CATEGORY(error->sqlerrcode) != ERRCODE_DATA_EXCEPTION &&
			ERRCODE_TO_CATEGORY(error->sqlerrcode) != ERRCODE_SYNTAX_ERROR_OR_ACCESS_RULE_VIOLATION)
			ReThrowError(error);
		row->error = error->message;
	}
	PG_END_TRY();
}

/*
 * The database's enabled pipelines that the relay can deliver and this
 * worker serves (ownership.c), each in a memory context of its own under
 * cxt (RelayPipeline.cxt); *any_enabled tells whether
 * any pipeline is enabled at all. A pipeline whose reading the caller
 * holds is still current (is_current, when given, says so of its name and
 * config md5) is not read and opened again: its name goes into *kept (in
 * cxt) instead, so that an unchanged pipeline costs no parse and no open
 * at every pass. The table's lock is taken conditionally,
 * so a DROP EXTENSION in progress is passed over, not waited for (and
 * cannot wait for us).
 */
List *
RelayReadPipelines(MemoryContext cxt, bool *any_enabled, RelayReadingIsCurrent is_current,
				   List **kept)
{
	List	   *pipelines = NIL;

	*any_enabled = false;
	*kept = NIL;
	if (!RelayTryLockTable("relay_outbox_config", AccessShareLock))
		return NIL;
	SPI_connect();
	if (SPI_execute_plan(TidePlan(&pipelines_plan,
								  "SELECT c.name, c.config,"
								  "       pg_catalog.md5(pg_catalog.concat_ws(E'\\n', c.config::text, c.owner,"
								  "         r.rolsuper,"
								  "         pg_catalog.pg_has_role(r.oid, 'pg_read_server_files', 'USAGE'),"
								  "         pg_catalog.pg_has_role(r.oid, 'pg_write_server_files', 'USAGE'),"
								  "         pg_catalog.current_setting('pg_tide.secrets_directory'))),"
								  "       h.last_error_class OPERATOR(pg_catalog.=) 'config', c.owner"
								  "  FROM tide.relay_outbox_config c"
								  "  LEFT JOIN pg_catalog.pg_roles r ON r.rolname OPERATOR(pg_catalog.=) c.owner"
								  "  LEFT JOIN tide.relay_pipeline_health h"
								  "    ON h.pipeline_id OPERATOR(pg_catalog.=) c.name"
								  " WHERE c.enabled ORDER BY c.name",
								  0, NULL),
						 NULL, NULL, true, 0) == SPI_OK_SELECT)
	{
		/* secret_failed() and secret_ok() run statements of their own */
		SPITupleTable *rows = SPI_tuptable;
		uint64		nrows = SPI_processed;
		MemoryContext spi_cxt = CurrentMemoryContext;
		MemoryContext next_cxt;
		ValidatedRow *next;

		if (next_validated_cxt != NULL)
			MemoryContextDelete(next_validated_cxt);
		next_cxt = next_validated_cxt = AllocSetContextCreate(TopMemoryContext, "pg_tide validated pipelines",
															  ALLOCSET_SMALL_SIZES);
		next = MemoryContextAllocZero(next_cxt, sizeof(ValidatedRow) * Max(nrows, 1));

		*any_enabled = nrows > 0;
		for (uint64 i = 0; i < nrows; i++)
		{
			HeapTuple	tuple = rows->vals[i];
			char	   *name = SPI_getvalue(tuple, rows->tupdesc, 1);
			char	   *md5 = SPI_getvalue(tuple, rows->tupdesc, 3);
			bool		isnull;
			bool		error_recorded = DatumGetBool(SPI_getbinval(tuple, rows->tupdesc, 4, &isnull)) && !isnull;
			ValidatedRow *before = validated_before(i, name, md5);
			ValidatedRow row = {0};
			MemoryContext old;

			/*
			 * Whether this worker serves it (ownership.c). Every worker keeps
			 * every row's validation, so a pipeline that moves here is known;
			 * only the one serving it records what the validation found.
			 */
			bool		serves = RelayServesPipeline(name);

			if (before != NULL)
				row = *before;
			else
			{
				validate_row(DatumGetJsonbP(SPI_getbinval(tuple, rows->tupdesc, 2, &isnull)),
							 SPI_getvalue(tuple, rows->tupdesc, 5), &row);
				if (row.error != NULL && serves)
					pipeline_failed(name, "config", row.error,
									"Fix its config with tide.relay_set_outbox().");
			}
			if (row.config != NULL && error_recorded && serves)
				pipeline_ok(name, "config");

			next[i].name = MemoryContextStrdup(next_cxt, name);
			strlcpy(next[i].md5, md5, sizeof(next[i].md5));
			next[i].config = row.config ? MemoryContextStrdup(next_cxt, row.config) : NULL;
			next[i].error = row.error ? MemoryContextStrdup(next_cxt, row.error) : NULL;
			if (row.config == NULL || !serves)
				continue;

			old = MemoryContextSwitchTo(cxt);
			if (before != NULL && is_current != NULL && is_current(name, md5))
			{
				*kept = lappend(*kept, pstrdup(name));
				MemoryContextSwitchTo(old);
				continue;
			}
			{
				RelayPipeline *p = read_pipeline(name, next[i].config, md5, spi_cxt);

				if (p)
					pipelines = lappend(pipelines, p);
			}
			MemoryContextSwitchTo(old);
		}
		if (validated_cxt != NULL)
			MemoryContextDelete(validated_cxt);
		validated_cxt = next_cxt;
		next_validated_cxt = NULL;
		validated = next;
		nvalidated = nrows;
	}
	SPI_finish();
	return pipelines;
}
