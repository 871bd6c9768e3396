/*
 * pipelines.c
 *		Reading a database's enabled pipelines from relay_outbox_config into
 *		RelayPipeline structs, once per pass of its relay worker: the sink's
 *		settings, batch size and lease, retries, ordering, attempt log, rate
 *		limit, circuit breaker and routing. The config was validated when it
 *		was set; the defaults here only cover rows written by hand.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"

#include "pg_tide.h"
#include "relay.h"

/* The statements of every pass, planned once. */
static SPIPlanPtr any_enabled_plan = NULL;
static SPIPlanPtr pipelines_plan = NULL;
static SPIPlanPtr secret_failed_plan = NULL;
static SPIPlanPtr secret_ok_plan = NULL;

/*
 * A header or signing secret value (a jsonb expression v) as the worker
 * gets it: a string as it is, {"value": ...} its value, a reference to a
 * secret marked for secrets.c ("\x01env:NAME", "\x01file:NAME").
 */
#define SECRET_VALUE(v) \
	"CASE WHEN jsonb_typeof(" v ") = 'string' THEN " v " #>> '{}'" \
	"     WHEN " v " ? 'value' THEN " v " ->> 'value'" \
	"     WHEN " v " ? 'env' THEN E'\\x01env:' || (" v " ->> 'env')" \
	"     ELSE E'\\x01file:' || (" v " ->> 'file') END"

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
								  " VALUES ($1, 1, now(), 'secret_reference', $2)"
								  " ON CONFLICT (pipeline_id) DO UPDATE"
								  "   SET consecutive_failures = greatest(h.consecutive_failures, 1),"
								  "       last_failure_at = now(), last_error_class = 'secret_reference',"
								  "       last_error = $2, updated_at = now()"
								  " WHERE h.last_error IS DISTINCT FROM $2"
								  "    OR h.last_error_class IS DISTINCT FROM 'secret_reference'",
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
							  "       updated_at = now()"
							  " WHERE pipeline_id = $1 AND last_error_class = 'secret_reference'",
							  1, types),
					 args, NULL, false, 0);
}

/*
 * The database's enabled pipelines that the relay can deliver, copied into
 * cxt; *any_enabled tells whether any pipeline is enabled at all. The
 * table's lock is taken conditionally, so a DROP EXTENSION in progress is
 * passed over, not waited for (and cannot wait for us).
 */
List *
RelayReadPipelines(MemoryContext cxt, bool *any_enabled)
{
	List	   *pipelines = NIL;
	uint64		i;

	*any_enabled = false;
	if (!RelayTryLockTable("relay_outbox_config", AccessShareLock))
		return NIL;
	SPI_connect();
	if (SPI_execute_plan(TidePlan(&any_enabled_plan,
								  "SELECT 1 FROM tide.relay_outbox_config WHERE enabled LIMIT 1",
								  0, NULL),
						 NULL, NULL, true, 1) == SPI_OK_SELECT)
		*any_enabled = SPI_processed > 0;

	/*
	 * File and webhook pipelines deliver. The config was validated when it
	 * was set; a row written by hand that lacks a key is passed over.
	 */
	if (*any_enabled &&
		SPI_execute_plan(TidePlan(&pipelines_plan,
					"SELECT name, config ->> 'consumer_group', config ->> 'outbox',"
					"       config ->> 'sink_type', config ->> 'path',"
					"       CASE WHEN jsonb_typeof(config -> 'batch_size') = 'number'"
					"            THEN least(greatest((config ->> 'batch_size')::numeric, 1), 1000)::int"
					"            ELSE 100 END,"
					"       config -> 'fsync' IS DISTINCT FROM 'false'::jsonb,"
					"       config ->> 'url', config ->> 'mode' = 'batch',"
					"       CASE WHEN jsonb_typeof(config -> 'max_in_flight') = 'number'"
					"            THEN least(greatest((config ->> 'max_in_flight')::numeric, 1), 1000)::int"
					"            ELSE 16 END,"
					"       CASE WHEN jsonb_typeof(config -> 'timeout_ms') = 'number'"
					"            THEN least(greatest((config ->> 'timeout_ms')::numeric, 100), 600000)::int"
					"            ELSE 10000 END,"
					"       (SELECT string_agg(key || ': ' || " SECRET_VALUE("value") ", E'\\n' ORDER BY key)"
					"          FROM jsonb_each(CASE WHEN jsonb_typeof(config -> 'headers') = 'object'"
					"                               THEN config -> 'headers' ELSE '{}' END)),"
					"       (SELECT string_agg(CASE jsonb_typeof(e) WHEN 'string' THEN substr(e #>> '{}', 7)"
					"                          ELSE " SECRET_VALUE("e") " END, ' ' ORDER BY n)"
					"          FROM jsonb_array_elements(CASE jsonb_typeof(config -> 'signing_secret')"
					"                 WHEN 'array' THEN config -> 'signing_secret'"
					"                 WHEN 'string' THEN jsonb_build_array(config -> 'signing_secret')"
					"                 WHEN 'object' THEN jsonb_build_array(config -> 'signing_secret')"
					"                 ELSE '[]' END) WITH ORDINALITY AS a (e, n)),"
					"       config ->> 'signature' IS NOT DISTINCT FROM 'pg-tide',"
					"       config -> 'allow_http' IS NOT DISTINCT FROM 'true'::jsonb,"
					"       config -> 'allow_private_network' IS NOT DISTINCT FROM 'true'::jsonb,"
					"       CASE WHEN jsonb_typeof(config #> '{retry,base_ms}') = 'number'"
					"            THEN least(greatest((config #>> '{retry,base_ms}')::numeric, 10), 600000)::int"
					"            ELSE 500 END,"
					"       CASE WHEN jsonb_typeof(config #> '{retry,cap_ms}') = 'number'"
					"            THEN least(greatest((config #>> '{retry,cap_ms}')::numeric, 10), 86400000)::int"
					"            ELSE 60000 END,"
					"       CASE WHEN jsonb_typeof(config #> '{retry,max_attempts}') = 'number'"
					"            THEN least(greatest((config #>> '{retry,max_attempts}')::numeric, 1), 100)::int"
					"            ELSE 10 END,"
					"       md5(config::text),"
					"       config ->> 'ordering' IS NOT DISTINCT FROM 'strict',"
					"       config -> 'attempt_log' IS DISTINCT FROM 'false'::jsonb,"
					"       coalesce((config #>> '{rate_limit,per_second}')::float8, 0),"
					"       coalesce((config #>> '{rate_limit,burst}')::int, 1),"
					"       coalesce((config #>> '{breaker,failure_threshold}')::int, 0),"
					"       coalesce((config #>> '{breaker,cooldown_ms}')::int, 30000),"
					"       config -> 'types', config -> 'filter'"
					"  FROM tide.relay_outbox_config"
					" WHERE enabled AND config ? 'consumer_group' AND config ? 'outbox'"
					"   AND ((config ->> 'sink_type' = 'file' AND config ? 'path')"
					"     OR (config ->> 'sink_type' = 'webhook' AND config ? 'url'))"
					" ORDER BY name", 0, NULL),
						 NULL, NULL, true, 0) == SPI_OK_SELECT)
	{
		/* secret_failed() and secret_ok() run statements of their own */
		SPITupleTable *rows = SPI_tuptable;
		uint64		nrows = SPI_processed;

		for (i = 0; i < nrows; i++)
		{
			HeapTuple	tup = rows->vals[i];
			TupleDesc	desc = rows->tupdesc;
			MemoryContext old = MemoryContextSwitchTo(cxt);
			RelayPipeline *p = palloc0(sizeof(RelayPipeline));
			bool		isnull;
			char	   *v;
			RelayRoutingError routing_error;

			p->name = pstrdup(SPI_getvalue(tup, desc, 1));
			p->consumer_group = pstrdup(SPI_getvalue(tup, desc, 2));
			p->consumer = psprintf("relay:%s", p->name);
			p->outbox = pstrdup(SPI_getvalue(tup, desc, 3));
			p->batch_size = DatumGetInt32(SPI_getbinval(tup, desc, 6, &isnull));
			p->lease_seconds = RELAY_LEASE_MARGIN_SECONDS;
			p->strict = DatumGetBool(SPI_getbinval(tup, desc, 21, &isnull));
			p->sink.stop_at_failure = p->strict;
			p->log_attempts = DatumGetBool(SPI_getbinval(tup, desc, 22, &isnull));
			p->rate_per_second = DatumGetFloat8(SPI_getbinval(tup, desc, 23, &isnull));
			p->rate_burst = Max(DatumGetInt32(SPI_getbinval(tup, desc, 24, &isnull)), 1);
			p->breaker_threshold = DatumGetInt32(SPI_getbinval(tup, desc, 25, &isnull));
			p->breaker_cooldown_ms = DatumGetInt32(SPI_getbinval(tup, desc, 26, &isnull));
			if (!RelayRoutingCompile(SPI_getvalue(tup, desc, 27), SPI_getvalue(tup, desc, 28),
									 &p->routing, &routing_error))
			{
				/* validated when set; a row written by hand is passed over */
				ereport(LOG,
						(errmsg("pg_tide relay pipeline \"%s\" is passed over: %s",
								p->name, routing_error.message),
						 errhint("%s", routing_error.hint)));
				MemoryContextSwitchTo(old);
				continue;
			}
			p->retry_base_ms = DatumGetInt32(SPI_getbinval(tup, desc, 17, &isnull));
			p->retry_cap_ms = Max(p->retry_base_ms,
								  DatumGetInt32(SPI_getbinval(tup, desc, 18, &isnull)));
			p->retry_max_attempts = DatumGetInt32(SPI_getbinval(tup, desc, 19, &isnull));
			p->config_md5 = pstrdup(SPI_getvalue(tup, desc, 20));
			if (strcmp(SPI_getvalue(tup, desc, 4), "file") == 0)
			{
				p->sink.sink_type = "file";
				p->sink.u.file.path = pstrdup(SPI_getvalue(tup, desc, 5));
				p->sink.u.file.fsync = DatumGetBool(SPI_getbinval(tup, desc, 7, &isnull));
				/* a file that cannot be written is retried soon */
				p->retry_base_ms = p->retry_cap_ms = 0;
			}
			else
			{
				RelayWebhookSinkConfig *w = &p->sink.u.webhook;

				p->sink.sink_type = "webhook";
				w->url = pstrdup(SPI_getvalue(tup, desc, 8));
				w->batch_mode = DatumGetBool(SPI_getbinval(tup, desc, 9, &isnull)) && !isnull;
				w->max_in_flight = DatumGetInt32(SPI_getbinval(tup, desc, 10, &isnull));
				w->timeout_ms = DatumGetInt32(SPI_getbinval(tup, desc, 11, &isnull));
				p->lease_seconds += (w->timeout_ms + 999) / 1000;
				v = SPI_getvalue(tup, desc, 12);
				w->headers = v ? pstrdup(v) : NULL;
				v = SPI_getvalue(tup, desc, 13);
				w->secrets = v ? pstrdup(v) : NULL;
				if ((w->headers && strchr(w->headers, '\x01')) || (w->secrets && strchr(w->secrets, '\x01')))
				{
					char	   *error = NULL;

					if (!RelayResolveSecrets(w, &error))
					{
						MemoryContextSwitchTo(old);
						secret_failed(p->name, error);
						continue;
					}
					MemoryContextSwitchTo(old);
					secret_ok(p->name);
					MemoryContextSwitchTo(cxt);
				}
				w->pg_tide_signature = DatumGetBool(SPI_getbinval(tup, desc, 14, &isnull));
				w->allow_http = DatumGetBool(SPI_getbinval(tup, desc, 15, &isnull));
				w->allow_private_network = DatumGetBool(SPI_getbinval(tup, desc, 16, &isnull));
			}
			pipelines = lappend(pipelines, p);
			MemoryContextSwitchTo(old);
		}
	}
	SPI_finish();
	return pipelines;
}
