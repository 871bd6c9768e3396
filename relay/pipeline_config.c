/*
 * pipeline_config.c
 *		The validator of a pipeline config, the only one: it checks and
 *		completes with defaults the keys every pipeline has (outbox,
 *		consumer_group, attempt_log, alerts, types and filter, rate_limit,
 *		breaker, allow_other_consumers; batch_size, retry and ordering for
 *		the sinks that take them), refuses unknown keys, and hands the
 *		sink's own keys to the sink's validator, chosen by sink_type.
 *
 * Three callers run it, so that no config reaches the relay unchecked:
 * - tide.relay_set_outbox, through tide._relay_normalize_config(), to
 *	 store the config it returns;
 * - the BEFORE INSERT OR UPDATE trigger on tide.relay_outbox_config
 *	 (tide._relay_config_check()), as the role that writes the row, so a
 *	 row written by hand is checked too (a file pipeline's permission
 *	 check included) and stored normalised;
 * - the relay worker, on every row it reads (relay/pipelines.c), for a
 *	 row written while triggers were off.
 *
 * Validation happens in the order of the config's meaning, and the first
 * error found is raised: outbox, consumer group, sink type, unknown keys,
 * the sink's own keys, then the common keys.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_collation.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"
#include "utils/rel.h"

#include "config_value.h"
#include "endpoints/registry.h"
#include "filter.h"
#include "pg_tide.h"
#include "pipeline_config.h"
#include "forward.h"
#include "reverse_config.h"
#include "secrets.h"
#include "sink.h"

PG_FUNCTION_INFO_V1(tide_relay_normalize_config);
PG_FUNCTION_INFO_V1(tide_relay_config_check);

/* The keys of every pipeline. */
static const char *const common_keys[] = {
	"sink_type", "outbox", "consumer_group", "attempt_log", "alerts", "types", "filter",
	"rate_limit", "breaker", "allow_other_consumers", "overlap_batches", NULL
};

/* The keys of the ordering, for the sinks that take "ordering" (ordering.c). */
static const char *const ordering_keys[] = {"ordering", "ordering_key", NULL};

/* Whether a sink takes one of the common keys that not every sink takes. */
static bool
sink_takes(const RelaySinkRoutine *sink, const char *key)
{
	for (const char *const *k = sink->config_keys; *k; k++)
		if (strcmp(*k, key) == 0)
			return true;
	return false;
}

/*
 * A name the pipeline's config holds (its outbox, consumer group, inbox):
 * given (the config's key must then agree) or, given is NULL, the config's
 * key.
 */
const char *
RelayConfigNameKey(const cJSON *config, const char *key, const char *given, const char *kind,
				   const char *param, const char *mismatch_hint, const char *missing_hint)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(config, key);

	if (given != NULL)
	{
		if (v != NULL && !(cJSON_IsString(v) && strcmp(v->valuestring, given) == 0))
			RelayConfigError(mismatch_hint, "config key \"%s\" does not match %s", key, param);
		return given;
	}
	if (v == NULL)
		RelayConfigError(missing_hint, "config key \"%s\" is missing", key);
	RelayConfigCheckType(key, v, "string", missing_hint);
	TideValidateName(kind, v->valuestring);
	return v->valuestring;
}

/* A member of a jsonb object as JSON text, or NULL when it has none. */
static char *
member_text(Jsonb *config, const char *key)
{
	JsonbValue	k;
	JsonbValue *v;
	Jsonb	   *value;

	k.type = jbvString;
	k.val.string.val = unconstify(char *, key);
	k.val.string.len = strlen(key);
	v = findJsonbValueFromContainer(&config->root, JB_FOBJECT, &k);
	if (v == NULL)
		return NULL;
	value = JsonbValueToJsonb(v);
	return JsonbToCString(NULL, &value->root, VARSIZE(value));
}

/*
 * The member `key` of config, checked to be an object with none but the
 * NULL-terminated keys; NULL when absent.
 */
static const cJSON *
sub_object(const cJSON *config, const char *key, const char *const *keys, const char *hint)
{
	const cJSON *o = cJSON_GetObjectItemCaseSensitive(config, key);

	if (o != NULL)
	{
		RelayConfigCheckType(key, o, "object", hint);
		RelayConfigCheckKeys(o, keys, NULL, psprintf("%s.", key));
	}
	return o;
}

/*
 * "alerts": failure_threshold (failed attempts in a row that count as
 * 100 %) and auto_disable (disable the pipeline when they reach it).
 */
static void
alerts_config(const cJSON *config, cJSON *out)
{
	static const char *const keys[] = {"failure_threshold", "auto_disable", NULL};
	const cJSON *a = sub_object(config, "alerts", keys,
								"Give \"alerts\" as an object with failure_threshold and auto_disable.");
	cJSON	   *o = RelayConfigAddObject(out, "alerts");

	RelayConfigAddInt(o, "failure_threshold",
					  RelayConfigInt(a, "failure_threshold", "alerts.failure_threshold", 1, 1000000, 100));
	RelayConfigAddBool(o, "auto_disable", RelayConfigBool(a, "auto_disable", false));
}

/* "retry": exponential backoff with jitter between base_ms and cap_ms. */
static void
retry_config(const cJSON *config, cJSON *out)
{
	static const char *const keys[] = {"base_ms", "cap_ms", "max_attempts", NULL};
	const cJSON *r = sub_object(config, "retry", keys,
								"Give \"retry\" as an object with base_ms, cap_ms and max_attempts.");
	cJSON	   *o;
	int			base_ms;

	base_ms = RelayConfigInt(r, "base_ms", "retry.base_ms", 10, 600000, 500);
	o = RelayConfigAddObject(out, "retry");
	RelayConfigAddInt(o, "base_ms", base_ms);
	RelayConfigAddInt(o, "cap_ms", RelayConfigInt(r, "cap_ms", "retry.cap_ms", base_ms, 86400000,
												  Max(60000, base_ms)));
	RelayConfigAddInt(o, "max_attempts", RelayConfigInt(r, "max_attempts", "retry.max_attempts", 1, 100, 10));
}

/*
 * The optional "rate_limit" and "breaker": rate_limit.per_second (messages
 * a second, fractions allowed, from 0.001 to 1000000) and rate_limit.burst
 * (messages at once, default per_second rounded up); breaker.failure_threshold
 * (failed attempts in a row that open it, default 20) and
 * breaker.cooldown_ms (how long it stays open, default 30000).
 */
static void
pacing_config(const cJSON *config, cJSON *out)
{
	static const char *const rate_keys[] = {"per_second", "burst", NULL};
	static const char *const breaker_keys[] = {"failure_threshold", "cooldown_ms", NULL};
	const cJSON *r = sub_object(config, "rate_limit", rate_keys,
								"Give \"rate_limit\" as an object with per_second and burst.");
	const cJSON *b;

	if (r != NULL)
	{
		const char *rate_hint = "Give \"rate_limit.per_second\" as a number from 0.001 (one message "
			"every 1,000 s) to 1000000; tide.relay_disable() stops a pipeline.";
		const cJSON *ps;
		Datum		n;
		cJSON	   *o;

		ps = cJSON_GetObjectItemCaseSensitive(r, "per_second");
		if (ps == NULL)
			RelayConfigError("Give \"rate_limit.per_second\", the messages a second the pipeline may "
							 "send, for example 50.",
							 "config key \"rate_limit.per_second\" is missing");
		RelayConfigCheckType("rate_limit.per_second", ps, "number", rate_hint);

		/*
		 * At least 0.001, one message every 1,000 s: the relay computes the
		 * bucket in float8, which cannot hold every numeric above 0 (1e-400
		 * is none), and a slower pipeline is better disabled than woken up
		 * for a message a day; the relay bounds its wait to match
		 * (relay/pacing.c). At most 1000000, beyond what a worker sends.
		 */
		n = DirectFunctionCall3(numeric_in, CStringGetDatum(ps->valuestring),
								ObjectIdGetDatum(InvalidOid), Int32GetDatum(-1));
		if (DatumGetBool(DirectFunctionCall2(numeric_lt, n,
											 DirectFunctionCall3(numeric_in, CStringGetDatum("0.001"),
																 ObjectIdGetDatum(InvalidOid),
																 Int32GetDatum(-1)))) ||
			DatumGetBool(DirectFunctionCall2(numeric_gt, n, NumericGetDatum(int64_to_numeric(1000000)))))
			RelayConfigError(rate_hint, "config key \"rate_limit.per_second\" is out of range: %s",
							 RelayConfigNumberText(ps->valuestring));
		o = RelayConfigAddObject(out, "rate_limit");
		RelayConfigAddNumberText(o, "per_second", ps->valuestring);
		RelayConfigAddInt(o, "burst",
						  RelayConfigInt(r, "burst", "rate_limit.burst", 1, 1000000,
										 DatumGetInt32(DirectFunctionCall1(numeric_int4,
																		   DirectFunctionCall1(numeric_ceil, n)))));
	}
	b = sub_object(config, "breaker", breaker_keys,
				   "Give \"breaker\" as an object with failure_threshold and cooldown_ms.");
	if (b != NULL)
	{
		cJSON	   *o = RelayConfigAddObject(out, "breaker");

		RelayConfigAddInt(o, "failure_threshold",
						  RelayConfigInt(b, "failure_threshold", "breaker.failure_threshold", 1, 1000000, 20));
		RelayConfigAddInt(o, "cooldown_ms",
						  RelayConfigInt(b, "cooldown_ms", "breaker.cooldown_ms", 100, 86400000, 30000));
	}
}

/* "types" and "filter": which messages are delivered (relay/filter.c). */
static void
routing_config(Jsonb *jb, const cJSON *config, cJSON *out)
{
	const cJSON *types = cJSON_GetObjectItemCaseSensitive(config, "types");
	const cJSON *filter = cJSON_GetObjectItemCaseSensitive(config, "filter");

	RelayRoutingFree(RelayRoutingParse(member_text(jb, "types"), member_text(jb, "filter")));
	if (types != NULL)
		RelayConfigAddCopy(out, "types", types);
	if (filter != NULL)
		RelayConfigAddCopy(out, "filter", filter);
}

/*
 * "attempt_log": true (a row per attempt), false (none) or "failures" (a
 * row per failed attempt only); by default true, or "failures" for a sink
 * whose destination keeps what was delivered itself (a broker).
 */
static void
attempt_log_config(const cJSON *config, const RelaySinkRoutine *sink, cJSON *out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(config, "attempt_log");
	const char *hint = "Give \"attempt_log\" as true (every attempt), false (none) or \"failures\".";

	if (v == NULL)
	{
		if (sink->log_failures_by_default)
			RelayConfigAddString(out, "attempt_log", "failures");
		else
			RelayConfigAddBool(out, "attempt_log", true);
		return;
	}
	if (cJSON_IsString(v))
	{
		if (strcmp(v->valuestring, "failures") != 0)
			RelayConfigError(hint, "invalid value \"%s\" for config key \"attempt_log\"", v->valuestring);
		RelayConfigAddString(out, "attempt_log", "failures");
		return;
	}
	RelayConfigCheckType("attempt_log", v, "boolean", hint);
	RelayConfigAddBool(out, "attempt_log", cJSON_IsTrue(v));
}

/* What a forward config's names must agree with: relay_set_outbox's parameters. */
typedef struct ForwardNames
{
	const char *outbox;
	const char *consumer_group;
} ForwardNames;

/* "a" or "an" before a sink type's name. */
static const char *
article(const char *name)
{
	return strchr("aeiou", name[0]) != NULL ? "an" : "a";
}

/* The common keys and the sink's, of a config already known to be an object. */
static void
normalize(void *arg, Jsonb *jb, const cJSON *config, cJSON *out)
{
	const char *outbox = ((ForwardNames *) arg)->outbox;
	const char *consumer_group = ((ForwardNames *) arg)->consumer_group;
	const RelaySinkRoutine *sink;
	const char *sink_type;

	/*
	 * outbox and consumer_group are relay_set_outbox's parameters; the keys
	 * are accepted when they agree, so that relay_get_config's output can be
	 * set again.
	 */
	outbox = RelayConfigNameKey(config, "outbox", outbox, "outbox", "p_outbox",
								"The outbox is given by p_outbox; leave \"outbox\" out of the config or give the same name.",
								"Give \"outbox\", the name of the outbox the pipeline reads.");
	consumer_group = RelayConfigNameKey(config, "consumer_group", consumer_group, "consumer group",
										"p_consumer_group",
										"The consumer group is given by p_consumer_group; leave \"consumer_group\" out of the config or give the same name.",
										"Give \"consumer_group\", the name of the consumer group the pipeline reads through.");
	RelayConfigAddString(out, "outbox", outbox);
	RelayConfigAddString(out, "consumer_group", consumer_group);

	/*
	 * A type this server knows passes as it is; anything else is refused
	 * with the list of the types there are (a directory read: not for
	 * every valid config).
	 */
	sink_type = RelayConfigString(config, "sink_type");
	if (sink_type == NULL || !RelayEndpointIsKnown(RELAY_ENDPOINT_SINK, sink_type))
		sink_type = RelayConfigChoice(config, "sink_type", RelayEndpointNames(RELAY_ENDPOINT_SINK), NULL);
	/* a broker's sink is a module: loaded here, or refused with what to install */
	sink = RelaySinkLoad(sink_type);

	/* a sink without "ordering" (a file) delivers in id order anyway: say so */
	if (!sink_takes(sink, "ordering"))
		for (const char *const *k = ordering_keys; *k; k++)
			if (cJSON_GetObjectItemCaseSensitive(config, *k) != NULL)
				RelayConfigError(psprintf("Leave \"ordering\" and \"ordering_key\" out: %s %s pipeline delivers every message in id order.",
										  article(sink->name), sink->name),
								 "config key \"%s\" is not for %s %s pipeline", *k, article(sink->name), sink->name);
	RelayConfigCheckKeys(config, common_keys, sink->config_keys, "");
	RelayConfigAddString(out, "sink_type", sink->name);
	sink->validate(config, out);

	if (sink_takes(sink, "batch_size"))
		RelayConfigAddInt(out, "batch_size", RelayConfigInt(config, "batch_size", "batch_size", 1, 1000,
															sink->default_batch_size > 0 ? sink->default_batch_size : 100));
	if (sink_takes(sink, "ordering"))
	{
		static const char *const orderings[] = {"relaxed", "strict", "key", NULL};
		const char *ordering = RelayConfigChoice(config, "ordering", orderings, "relaxed");

		RelayConfigAddString(out, "ordering", ordering);
		/* "ordering_key", required with "key" and refused otherwise (ordering.c) */
		RelayOrderingValidate(config, ordering, out);
	}
	attempt_log_config(config, sink, out);
	alerts_config(config, out);
	RelayConfigAddBool(out, "allow_other_consumers", RelayConfigBool(config, "allow_other_consumers", false));
	/* whether a relaxed pipeline's batches overlap (flow_forward.c's lease_ahead) */
	RelayConfigAddBool(out, "overlap_batches", RelayConfigBool(config, "overlap_batches", sink->sends_on_own_threads));
	if (sink_takes(sink, "retry"))
		retry_config(config, out);
	routing_config(jb, config, out);
	pacing_config(config, out);
}

/* Checks that a config is a JSON object and normalises it with fn (see pipeline_config.h). */
Jsonb *
RelayNormalizeWith(Jsonb *jb, Oid role, const char *example, RelayNormalizer fn, void *arg)
{
	cJSON	   *volatile config = NULL;
	cJSON	   *volatile out = NULL;
	Jsonb	   *volatile result = NULL;
	volatile Oid role_before;

	if (jb == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("pipeline config must not be null"),
				 errhint("Give a config such as %s.", example)));
	if (!JB_ROOT_IS_OBJECT(jb))
	{
		JsonbValue	scalar;
		const char *type = "array";

		if (JB_ROOT_IS_SCALAR(jb) && JsonbExtractScalar(&jb->root, &scalar))
			type = scalar.type == jbvNull ? "null" : scalar.type == jbvString ? "string"
				: scalar.type == jbvNumeric ? "number" : "boolean";
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("pipeline config must be a JSON object, not %s", type),
				 errhint("Give a config such as %s.", example)));
	}

	/*
	 * cJSON allocates with malloc: both trees are freed on every way out,
	 * and the role the sinks check files with is put back.
	 */
	role_before = RelayConfigSetRole(role);
	PG_TRY();
	{
		config = RelayConfigFromJsonb(jb);
		out = cJSON_CreateObject();
		if (out == NULL)
			ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory")));
		fn(arg, jb, config, out);
		result = RelayConfigToJsonb(out);
	}
	PG_FINALLY();
	{
		RelayConfigSetRole(role_before);
		cJSON_Delete(config);
		cJSON_Delete(out);
	}
	PG_END_TRY();
	return result;
}

/* A forward pipeline's config as stored (see pipeline_config.h). */
Jsonb *
RelayNormalizeConfig(const char *outbox, const char *consumer_group, Jsonb *jb, Oid role)
{
	ForwardNames names = {outbox, consumer_group};

	return RelayNormalizeWith(jb, role,
							  "{\"sink_type\": \"webhook\", \"url\": \"https://example.com/hooks\"}",
							  normalize, &names);
}

/*
 * tide._relay_normalize_config(p_outbox text, p_consumer_group text,
 * p_config jsonb): the config relay_set_outbox stores (see
 * RelayNormalizeConfig; NULL p_outbox or p_consumer_group takes the
 * config's key).
 */
Datum
tide_relay_normalize_config(PG_FUNCTION_ARGS)
{
	char	   *outbox = PG_ARGISNULL(0) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *group = PG_ARGISNULL(1) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(1));

	PG_RETURN_JSONB_P(RelayNormalizeConfig(outbox, group, PG_ARGISNULL(2) ? NULL : PG_GETARG_JSONB_P(2),
										   GetUserId()));
}

/*
 * The pipeline's owner as the trigger stores it: the role given in the
 * row when the writer has its privileges (a superuser restoring a dump
 * keeps every owner; a role may name itself or a role it acts as),
 * otherwise the writer. So no writer can lend a pipeline rights it has
 * not got itself.
 */
static char *
row_owner(Datum given, bool given_null)
{
	if (!given_null)
	{
		char	   *name = TextDatumGetCString(given);
		Oid			role = get_role_oid(name, true);

		if (superuser() || (OidIsValid(role) && has_privs_of_role(GetUserId(), role)))
			return name;
	}
	return GetUserNameFromId(GetUserId(), false);
}

/* Whether two configs are the same bytes: an equal config written otherwise (1.0 for 1) is not. */
static bool
same_config(Datum a, Datum b)
{
	Jsonb	   *x = DatumGetJsonbP(a);
	Jsonb	   *y = DatumGetJsonbP(b);

	return VARSIZE(x) == VARSIZE(y) && memcmp(x, y, VARSIZE(x)) == 0;
}

/* Whether two text values, either of which may be NULL, are equal. */
static bool
same_text(Datum a, bool a_null, Datum b, bool b_null)
{
	if (a_null || b_null)
		return a_null && b_null;
	return DatumGetBool(DirectFunctionCall2Coll(texteq, C_COLLATION_OID, a, b));
}

/*
 * tide._relay_config_check(): the BEFORE INSERT OR UPDATE trigger of
 * tide.relay_outbox_config and tide.relay_inbox_config (a reverse
 * pipeline's config goes to reverse_config.c's validator). It stores the
 * row's owner (row_owner) and validates the row's name and config with the
 * rights of the role that writes it, storing the config normalised, and
 * refuses a name the other direction has. The owner's rights, which are
 * never more than the writer's but for a superuser's row naming another
 * owner, are what the relay worker checks at every reading: a restore by
 * a superuser into a cluster where an owner has lost a right still
 * restores the row, which the worker then passes over, saying why. An
 * UPDATE that leaves the name, config and owner as they were (enabling,
 * disabling) is not checked again, so a pipeline set by a superuser can
 * still be disabled by an administrator who may not set it.
 */
Datum
tide_relay_config_check(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	TupleDesc	desc;
	HeapTuple	tuple;
	int			name_col;
	int			config_col;
	int			owner_col;
	Datum		config;
	bool		isnull;
	Datum		name;
	bool		name_null;
	Datum		owner = (Datum) 0;
	bool		owner_null = true;
	int			cols[2];
	Datum		values[2];
	bool		nulls[2] = {false, false};
	int			ncols = 1;
	bool		reverse;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		TRIGGER_FIRED_BY_DELETE(trigdata->tg_event) || TRIGGER_FIRED_BY_TRUNCATE(trigdata->tg_event))
		elog(ERROR, "tide._relay_config_check() must be a BEFORE INSERT OR UPDATE row trigger");
	desc = RelationGetDescr(trigdata->tg_relation);
	reverse = strcmp(RelationGetRelationName(trigdata->tg_relation), "relay_inbox_config") == 0;
	tuple = TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) ? trigdata->tg_newtuple : trigdata->tg_trigtuple;
	name_col = SPI_fnumber(desc, "name");
	config_col = SPI_fnumber(desc, "config");
	/* absent while a 0.1.0 catalog is being updated */
	owner_col = SPI_fnumber(desc, "owner");
	if (name_col <= 0 || config_col <= 0)
		elog(ERROR, "tide._relay_config_check() needs the columns name and config");

	config = heap_getattr(tuple, config_col, desc, &isnull);
	name = heap_getattr(tuple, name_col, desc, &name_null);
	if (owner_col > 0)
		owner = heap_getattr(tuple, owner_col, desc, &owner_null);
	if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) && !isnull && !name_null)
	{
		bool		old_null;
		bool		old_name_null;
		bool		old_owner_null = true;
		Datum		old = heap_getattr(trigdata->tg_trigtuple, config_col, desc, &old_null);
		Datum		old_name = heap_getattr(trigdata->tg_trigtuple, name_col, desc, &old_name_null);
		Datum		old_owner = owner_col > 0 ?
			heap_getattr(trigdata->tg_trigtuple, owner_col, desc, &old_owner_null) : (Datum) 0;

		if (!old_null && !old_name_null && same_config(config, old) &&
			same_text(owner, owner_null, old_owner, old_owner_null) &&
			same_text(name, false, old_name, false))
			return PointerGetDatum(tuple);
	}
	TideValidateName("pipeline", name_null ? NULL : TextDatumGetCString(name));
	if (owner_col > 0)
	{
		char	   *owner_name = row_owner(owner, owner_null);

		cols[1] = owner_col;
		values[1] = CStringGetTextDatum(owner_name);
		ncols = 2;
	}
	cols[0] = config_col;
	if (reverse)
		values[0] = JsonbPGetDatum(RelayNormalizeReverseConfig(NULL, isnull ? NULL : DatumGetJsonbP(config),
															   GetUserId()));
	else
		values[0] = JsonbPGetDatum(RelayNormalizeConfig(NULL, NULL, isnull ? NULL : DatumGetJsonbP(config),
														GetUserId()));
	/* a pipeline's name is unique across both directions */
	RelayCheckPipelineNameFree(TextDatumGetCString(name), reverse);
	return PointerGetDatum(heap_modify_tuple_by_cols(tuple, desc, ncols, cols, values, nulls));
}
