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

/* The member `key` of a JSON object, or NULL. */
static const cJSON *
member(const cJSON *obj, const char *key)
{
	return cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
}

/* A string member copied into the current memory context, or NULL. */
static char *
string_member(const cJSON *obj, const char *key)
{
	const cJSON *v = member(obj, key);

	return cJSON_IsString(v) ? pstrdup(v->valuestring) : NULL;
}

/* Whether a member is the string `value`. */
static bool
string_is(const cJSON *obj, const char *key, const char *value)
{
	const char *s = cJSON_GetStringValue(member(obj, key));

	return s != NULL && strcmp(s, value) == 0;
}

/* Whether a member is the JSON value true (or, want_false, false). */
static bool
member_is(const cJSON *obj, const char *key, bool want_true)
{
	const cJSON *v = member(obj, key);

	return want_true ? cJSON_IsTrue(v) : cJSON_IsFalse(v);
}

/* A number member clamped to [min, max] (NaN and absent: the default). */
static double
number_member(const cJSON *obj, const char *key, double min, double max, double dflt)
{
	const cJSON *v = member(obj, key);

	if (!cJSON_IsNumber(v) || isnan(v->valuedouble))
		return dflt;
	return Min(Max(v->valuedouble, min), max);
}

/* An integer member clamped to [min, max], rounded as numeric::int rounds. */
static int
int_member(const cJSON *obj, const char *key, int min, int max, int dflt)
{
	return (int) rint(number_member(obj, key, min, max, dflt));
}

/*
 * A header or signing secret value as the worker gets it: a string as it
 * is, {"value": ...} its value, a reference to a secret marked for
 * secrets.c ("\x01env:NAME", "\x01file:NAME"); NULL when it is none of
 * these. `strip` is dropped from the front of a plain string.
 */
static char *
secret_value(const cJSON *v, const char *strip)
{
	const char *s;

	if (cJSON_IsString(v))
	{
		s = v->valuestring;
		if (strip && strncmp(s, strip, strlen(strip)) == 0)
			s += strlen(strip);
		return pstrdup(s);
	}
	if ((s = cJSON_GetStringValue(member(v, "value"))) != NULL)
		return pstrdup(s);
	if ((s = cJSON_GetStringValue(member(v, "env"))) != NULL)
		return psprintf("\x01" "env:%s", s);
	if ((s = cJSON_GetStringValue(member(v, "file"))) != NULL)
		return psprintf("\x01" "file:%s", s);
	return NULL;
}

/* qsort comparator of header lines by name. */
static int
compare_strings(const void *a, const void *b)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

/* The custom headers as "Name: value" lines, '\n'-separated, or NULL. */
static char *
header_lines(const cJSON *headers)
{
	const cJSON *h;
	char	  **lines;
	int			n = 0;
	StringInfoData buf;

	if (!cJSON_IsObject(headers) || cJSON_GetArraySize(headers) == 0)
		return NULL;
	lines = palloc(sizeof(char *) * cJSON_GetArraySize(headers));
	cJSON_ArrayForEach(h, headers)
	{
		char	   *value = secret_value(h, NULL);

		if (value)
			lines[n++] = psprintf("%s: %s", h->string, value);
	}
	if (n == 0)
		return NULL;
	qsort(lines, n, sizeof(char *), compare_strings);
	initStringInfo(&buf);
	for (int i = 0; i < n; i++)
		appendStringInfo(&buf, "%s%s", i > 0 ? "\n" : "", lines[i]);
	return buf.data;
}

/* The signing secrets (base64 after whsec_, or references), space-separated, or NULL. */
static char *
signing_secrets(const cJSON *secret)
{
	StringInfoData buf;
	const cJSON *e;

	if (secret == NULL || cJSON_IsNull(secret))
		return NULL;
	initStringInfo(&buf);
	if (cJSON_IsArray(secret))
	{
		cJSON_ArrayForEach(e, secret)
		{
			char	   *v = secret_value(e, "whsec_");

			if (v)
				appendStringInfo(&buf, "%s%s", buf.len > 0 ? " " : "", v);
		}
	}
	else
	{
		char	   *v = secret_value(secret, "whsec_");

		if (v)
			appendStringInfoString(&buf, v);
	}
	return buf.len > 0 ? buf.data : NULL;
}

/* A member as JSON text (for the routing compiler), or NULL when absent. */
static char *
json_text_member(const cJSON *obj, const char *key)
{
	const cJSON *v = member(obj, key);
	char	   *text;
	char	   *copy;

	if (v == NULL)
		return NULL;
	text = cJSON_PrintUnformatted(v);
	if (text == NULL)
		return NULL;
	copy = pstrdup(text);
	cJSON_free(text);
	return copy;
}

/*
 * The webhook sink's settings from its config; false when its secret
 * references cannot be read (recorded as the pipeline's error).
 */
static bool
read_webhook(RelayPipeline *p, const cJSON *config, MemoryContext spi_cxt)
{
	RelayWebhookSinkConfig *w = &p->sink.u.webhook;

	p->sink.sink_type = "webhook";
	w->url = string_member(config, "url");
	w->batch_mode = string_is(config, "mode", "batch");
	w->max_in_flight = int_member(config, "max_in_flight", 1, 1000, 16);
	w->timeout_ms = int_member(config, "timeout_ms", 100, 600000, 10000);
	p->lease_seconds += (w->timeout_ms + 999) / 1000;
	w->headers = header_lines(member(config, "headers"));
	w->secrets = signing_secrets(member(config, "signing_secret"));
	w->pg_tide_signature = string_is(config, "signature", "pg-tide");
	w->allow_http = member_is(config, "allow_http", true);
	w->allow_private_network = member_is(config, "allow_private_network", true);
	if ((w->headers && strchr(w->headers, '\x01')) || (w->secrets && strchr(w->secrets, '\x01')))
	{
		char	   *error = NULL;
		MemoryContext cxt = CurrentMemoryContext;

		if (!RelayResolveSecrets(w, &error))
		{
			MemoryContextSwitchTo(spi_cxt);
			secret_failed(p->name, error);
			MemoryContextSwitchTo(cxt);
			return false;
		}
		MemoryContextSwitchTo(spi_cxt);
		secret_ok(p->name);
		MemoryContextSwitchTo(cxt);
	}
	return true;
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
 * One pipeline from its row, in the current memory context; NULL when it
 * is passed over (see the top of this file).
 */
static RelayPipeline *
read_pipeline(const char *name, const char *config_text, const char *md5,
			  MemoryContext spi_cxt)
{
	cJSON	   *config = cJSON_Parse(shorten_numbers(config_text));
	RelayPipeline *p = NULL;
	const cJSON *retry = member(config, "retry");
	const cJSON *rate = member(config, "rate_limit");
	const cJSON *breaker = member(config, "breaker");
	char	   *sink_type = string_member(config, "sink_type");
	RelayRoutingError routing_error;

	if (config == NULL)
	{
		ereport(LOG, (errmsg("pg_tide relay pipeline \"%s\" is passed over: its config cannot be read", name)));
		goto done;
	}
	if (sink_type == NULL || !cJSON_IsString(member(config, "consumer_group")) ||
		!cJSON_IsString(member(config, "outbox")) ||
		!((strcmp(sink_type, "file") == 0 && cJSON_IsString(member(config, "path"))) ||
		  (strcmp(sink_type, "webhook") == 0 && cJSON_IsString(member(config, "url")))))
		goto done;

	p = palloc0(sizeof(RelayPipeline));
	p->name = pstrdup(name);
	p->consumer_group = string_member(config, "consumer_group");
	p->consumer = psprintf("relay:%s", p->name);
	p->outbox = string_member(config, "outbox");
	p->config_md5 = pstrdup(md5);
	p->batch_size = int_member(config, "batch_size", 1, 1000, 100);
	p->lease_seconds = RELAY_LEASE_MARGIN_SECONDS;
	p->strict = string_is(config, "ordering", "strict");
	p->sink.stop_at_failure = p->strict;
	p->log_attempts = !member_is(config, "attempt_log", false);
	p->retry_base_ms = int_member(retry, "base_ms", 10, 600000, 500);
	p->retry_cap_ms = Max(p->retry_base_ms, int_member(retry, "cap_ms", 10, 86400000, 60000));
	p->retry_max_attempts = int_member(retry, "max_attempts", 1, 100, 10);
	/* No rate limit unless one is given; then at least the slowest allowed. */
	p->rate_per_second = rate ? number_member(rate, "per_second", RELAY_MIN_RATE_PER_SECOND,
											  RELAY_MAX_RATE_PER_SECOND, 0) : 0;
	p->rate_burst = int_member(rate, "burst", 1, 1000000, 1);
	p->breaker_threshold = breaker ? int_member(breaker, "failure_threshold", 1, 1000000, 20) : 0;
	p->breaker_cooldown_ms = int_member(breaker, "cooldown_ms", 100, 86400000, 30000);
	if (!RelayRoutingCompile(json_text_member(config, "types"), json_text_member(config, "filter"),
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
	if (strcmp(sink_type, "file") == 0)
	{
		p->sink.sink_type = "file";
		p->sink.u.file.path = string_member(config, "path");
		p->sink.u.file.fsync = !member_is(config, "fsync", false);
		/* a file that cannot be written is retried soon */
		p->retry_base_ms = p->retry_cap_ms = 0;
	}
	else if (!read_webhook(p, config, spi_cxt))
		p = NULL;
done:
	cJSON_Delete(config);
	return p;
}

/*
 * The database's enabled pipelines that the relay can deliver and this
 * worker serves (ownership.c), copied into cxt; *any_enabled tells whether
 * any pipeline is enabled at all. The
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
			char	   *name = SPI_getvalue(rows->vals[i], rows->tupdesc, 1);
			MemoryContext old;
			RelayPipeline *p;

			/* Another of the database's workers serves it (ownership.c). */
			if (!RelayServesPipeline(name))
				continue;
			old = MemoryContextSwitchTo(cxt);
			p = read_pipeline(name,
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
