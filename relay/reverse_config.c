/*
 * reverse_config.c
 *		The validator of a reverse pipeline's config (source -> inbox), the
 *		only one: it checks and completes with defaults the keys every
 *		reverse pipeline has (inbox, source_type, batch_size), refuses
 *		unknown keys, and hands the source's own keys to the source's
 *		validator, chosen by source_type (source.h).
 *
 * Three callers run it, as pipeline_config.c's for forward pipelines:
 * tide.relay_set_inbox (through tide._relay_normalize_reverse_config), the
 * BEFORE INSERT OR UPDATE trigger on tide.relay_inbox_config
 * (tide._relay_config_check, so a row written by hand is checked and
 * stored normalised too) and the relay worker on every row it reads.
 *
 * The first error found is raised, in the order of the config's meaning:
 * inbox, batch_size, source type, unknown keys, the source's keys.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"

#include "config_value.h"
#include "pg_tide.h"
#include "pipeline_config.h"
#include "reverse_config.h"
#include "source.h"

PG_FUNCTION_INFO_V1(tide_relay_normalize_reverse_config);

/* The keys of every reverse pipeline. */
static const char *const reverse_keys[] = {"inbox", "source_type", "batch_size", NULL};

/* Raises the inbox's ERROR (42704, with a hint) unless the inbox exists. */
static void
check_inbox_exists(const char *inbox)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1];

	args[0] = CStringGetTextDatum(inbox);
	SPI_connect();
	/* tide._inbox_config checks the name and raises what inbox functions raise */
	if (SPI_execute_plan(TidePlan(&plan, "SELECT FROM tide._inbox_config($1)", 1, argtypes),
						 args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read tide.tide_inbox_config");
	SPI_finish();
}

/* The keys of a reverse pipeline's config, already known to be an object. */
static void
normalize_reverse(void *arg, Jsonb *jb, const cJSON *config, cJSON *out)
{
	const char *inbox = arg;
	const cJSON *type;
	const RelaySourceRoutine *source;
	const char *type_hint = "Give \"source_type\", the kind of source the pipeline reads, such as \"postgres\".";

	inbox = RelayConfigNameKey(config, "inbox", inbox, "inbox", "p_inbox",
							   "The inbox is given by p_inbox; leave \"inbox\" out of the config or give the same name.",
							   "Give \"inbox\", the name of the inbox the pipeline writes into.");
	check_inbox_exists(inbox);
	RelayConfigAddString(out, "inbox", inbox);
	RelayConfigAddInt(out, "batch_size", RelayConfigInt(config, "batch_size", "batch_size", 1, 10000, 100));

	type = cJSON_GetObjectItemCaseSensitive(config, "source_type");
	if (type == NULL)
		RelayConfigError(type_hint, "config key \"source_type\" is missing");
	RelayConfigCheckType("source_type", type, "string", type_hint);
	/* a source is provided by an endpoint: loaded here, or refused with what to install */
	source = RelaySourceLoad(type->valuestring);

	RelayConfigCheckKeys(config, reverse_keys, source->config_keys, "");
	RelayConfigAddString(out, "source_type", source->name);
	source->validate(config, out);
}

/* A reverse pipeline's config as stored (see reverse_config.h). */
Jsonb *
RelayNormalizeReverseConfig(const char *inbox, Jsonb *jb, Oid role)
{
	return RelayNormalizeWith(jb, role,
							  "{\"source_type\": \"postgres\", \"connection\": \"host=db2 dbname=app\", ...}",
							  normalize_reverse, unconstify(char *, inbox));
}

/*
 * tide._relay_normalize_reverse_config(p_inbox text, p_config jsonb): the
 * config relay_set_inbox stores (NULL p_inbox takes the config's key).
 */
Datum
tide_relay_normalize_reverse_config(PG_FUNCTION_ARGS)
{
	char	   *inbox = PG_ARGISNULL(0) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(0));

	PG_RETURN_JSONB_P(RelayNormalizeReverseConfig(inbox, PG_ARGISNULL(1) ? NULL : PG_GETARG_JSONB_P(1),
												  GetUserId()));
}
