/*
 * pipelines.c
 *		Reading a database's enabled pipelines from relay_outbox_config into
 *		RelayPipeline structs, once per pass of its relay worker: the sink's
 *		settings, batch size and lease, retries, ordering, attempt log, rate
 *		limit, circuit breaker and routing. The config was validated when it
 *		was set; the defaults here only cover rows written by hand.
 */
#include "postgres.h"

#include "executor/spi.h"

#include "pg_tide.h"
#include "relay.h"

/* The statements of every pass, planned once. */
static SPIPlanPtr any_enabled_plan = NULL;
static SPIPlanPtr pipelines_plan = NULL;

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
					"       (SELECT string_agg(key || ': ' || value, E'\\n' ORDER BY key)"
					"          FROM jsonb_each_text(CASE WHEN jsonb_typeof(config -> 'headers') = 'object'"
					"                                    THEN config -> 'headers' ELSE '{}' END)),"
					"       (SELECT string_agg(substr(e, 7), ' ')"
					"          FROM jsonb_array_elements_text(CASE jsonb_typeof(config -> 'signing_secret')"
					"                 WHEN 'array' THEN config -> 'signing_secret'"
					"                 WHEN 'string' THEN jsonb_build_array(config -> 'signing_secret')"
					"                 ELSE '[]' END) e),"
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
		for (i = 0; i < SPI_processed; i++)
		{
			HeapTuple	tup = SPI_tuptable->vals[i];
			TupleDesc	desc = SPI_tuptable->tupdesc;
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
