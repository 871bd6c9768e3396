/*
 * pipelines.c
 *		Reading a database's enabled pipelines from relay_outbox_config into
 *		RelayPipeline structs, once per pass of its relay worker: the sink's
 *		settings, batch size and lease, retries, ordering, attempt log, rate
 *		limit, circuit breaker and routing.
 *
 * The statement reads each config as JSON text and this file takes it
 * apart in C, one pipeline at a time: tide.relay_set_outbox validated the
 * config when it was set, but a row written by hand can hold anything, and
 * it must never stop another pipeline (an SQL cast that fails would fail
 * the whole statement). So every number is clamped to the range the
 * worker can use, a missing value takes its default, and a row without
 * what it needs (its outbox, group, sink type, URL or path) is passed over.
 */
#include "postgres.h"

#include <math.h>

#include <cjson/cJSON.h>

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#include "pg_tide.h"
#include "relay.h"

/* The statements of every pass, planned once. */
static SPIPlanPtr pipelines_plan = NULL;
static SPIPlanPtr secret_failed_plan = NULL;
static SPIPlanPtr secret_ok_plan = NULL;

/*
 * Records that a pipeline's secret reference cannot be read, as its error
 * in relay_pipeline_health (and so relay_pipeline_status), and logs it
 * when it is new; the pipeline is passed over until it can be read.
 */
static void
secret_failed(const char *pipeline, const char *error)
{
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		args[2] = {CStringGetTextDatum(pipeline), CStringGetTextDatum(error)};

	if (SPI_execute_plan(TidePlan(&secret_failed_plan,
								  "INSERT INTO tide.relay_pipeline_health AS h"
								  "  (pipeline_id, consecutive_failures, last_failure_at, last_error_class, last_error)"
								  " VALUES ($1, 1, pg_catalog.now(), 'secret_reference', $2)"
								  " ON CONFLICT (pipeline_id) DO UPDATE"
								  "   SET consecutive_failures = greatest(h.consecutive_failures, 1),"
								  "       last_failure_at = pg_catalog.now(), last_error_class = 'secret_reference',"
								  "       last_error = $2, updated_at = pg_catalog.now()"
								  " WHERE h.last_error IS NULL OR h.last_error_class IS NULL"
								  "    OR h.last_error OPERATOR(pg_catalog.<>) $2"
								  "    OR h.last_error_class OPERATOR(pg_catalog.<>) 'secret_reference'",
								  2, types),
						 args, NULL, false, 0) == SPI_OK_INSERT && SPI_processed > 0)
		ereport(LOG,
				(errmsg("pg_tide relay pipeline \"%s\" is passed over: %s", pipeline, error),
				 errhint("Set the secret it refers to, or change the pipeline with tide.relay_set_outbox().")));
}

/* Clears a secret reference error recorded for a pipeline that can be read again. */
static void
secret_ok(const char *pipeline)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(pipeline)};

	SPI_execute_plan(TidePlan(&secret_ok_plan,
							  "UPDATE tide.relay_pipeline_health"
							  "   SET consecutive_failures = 0, last_error_class = NULL, last_error = NULL,"
							  "       updated_at = pg_catalog.now()"
							  " WHERE pipeline_id OPERATOR(pg_catalog.=) $1"
							  "   AND last_error_class OPERATOR(pg_catalog.=) 'secret_reference'",
							  1, types),
					 args, NULL, false, 0);
}

/*
 * The config's JSON text with every number of more than 60 characters
 * rewritten as the nearest double (jsonb prints 1e-400 with all its
 * zeros, which cJSON cannot read); numbers beyond a double's range become
 * +-1e308 or 0, which the clamps then bring into range.
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
	p->batch_size = RelayConfigInt(config, "batch_size", 1, 1000, 100);
	p->lease_seconds = RELAY_LEASE_MARGIN_SECONDS;
	p->strict = RelayConfigStringIs(config, "ordering", "strict");
	p->log_attempts = !RelayConfigIs(config, "attempt_log", false);
	p->retry_base_ms = RelayConfigInt(retry, "base_ms", 10, 600000, 500);
	p->retry_cap_ms = Max(p->retry_base_ms, RelayConfigInt(retry, "cap_ms", 10, 86400000, 60000));
	p->retry_max_attempts = RelayConfigInt(retry, "max_attempts", 1, 100, 10);
	/* No rate limit unless one is given; then at least the slowest allowed. */
	p->rate_per_second = rate ? RelayConfigNumber(rate, "per_second", RELAY_MIN_RATE_PER_SECOND,
												  RELAY_MAX_RATE_PER_SECOND, 0) : 0;
	p->rate_burst = RelayConfigInt(rate, "burst", 1, 1000000, 1);
	p->breaker_threshold = breaker ? RelayConfigInt(breaker, "failure_threshold", 1, 1000000, 20) : 0;
	p->breaker_cooldown_ms = RelayConfigInt(breaker, "cooldown_ms", 100, 86400000, 30000);
	if (!RelayRoutingCompile(RelayConfigJsonText(config, "types"),
							 RelayConfigJsonText(config, "filter"),
							 &p->routing, &routing_error))
	{
		/* validated when set; a row written by hand is passed over */
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

/*
 * The database's enabled pipelines that the relay can deliver, each in a
 * memory context of its own under cxt (RelayPipeline.cxt); *any_enabled tells whether any pipeline is enabled at all. The
 * table's lock is taken conditionally, so a DROP EXTENSION in progress is
 * passed over, not waited for (and cannot wait for us).
 */
List *
RelayReadPipelines(MemoryContext cxt, bool *any_enabled)
{
	List	   *pipelines = NIL;

	*any_enabled = false;
	if (!RelayTryLockTable("relay_outbox_config", AccessShareLock))
		return NIL;
	SPI_connect();
	if (SPI_execute_plan(TidePlan(&pipelines_plan,
								  "SELECT c.name, c.config::text, pg_catalog.md5(c.config::text)"
								  "  FROM tide.relay_outbox_config c WHERE c.enabled ORDER BY c.name",
								  0, NULL),
						 NULL, NULL, true, 0) == SPI_OK_SELECT)
	{
		/* secret_failed() and secret_ok() run statements of their own */
		SPITupleTable *rows = SPI_tuptable;
		uint64		nrows = SPI_processed;
		MemoryContext spi_cxt = CurrentMemoryContext;

		*any_enabled = nrows > 0;
		for (uint64 i = 0; i < nrows; i++)
		{
			MemoryContext old = MemoryContextSwitchTo(cxt);
			RelayPipeline *p = read_pipeline(SPI_getvalue(rows->vals[i], rows->tupdesc, 1),
											 SPI_getvalue(rows->vals[i], rows->tupdesc, 2),
											 SPI_getvalue(rows->vals[i], rows->tupdesc, 3),
											 spi_cxt);

			if (p)
				pipelines = lappend(pipelines, p);
			MemoryContextSwitchTo(old);
		}
	}
	SPI_finish();
	return pipelines;
}
