/*
 * probe.c
 *		An endpoint that no file of pg_tide names, built as pg_tide_probe.so
 *		for TAP 075 (never installed by make install): the relay must find
 *		it by its file name and its init symbol alone (relay/endpoints/
 *		registry.c), and redact the keys it declares secret. Its sink takes
 *		"secret_word", a string, and delivers every message at once; its
 *		source (config only, as source.h has it) takes "secret_word" and
 *		"auth", an object whose credentials are secrets.
 */
#include "postgres.h"

#include "config_value.h"
#include "source.h"
#include "endpoints/registry.h"

PG_MODULE_MAGIC;

static const char *const probe_config_keys[] = {"secret_word", NULL};
static const char *const probe_secret_keys[] = {"secret_word", NULL};

/* Takes "secret_word", a string, as it is. */
static void
probe_validate(const cJSON *config, cJSON *out)
{
	const cJSON *word = cJSON_GetObjectItemCaseSensitive(config, "secret_word");

	if (word == NULL)
		return;
	RelayConfigCheckType("secret_word", word, "string", "Give \"secret_word\" as a string.");
	RelayConfigAddCopy(out, "secret_word", word);
}

/* No state: every batch is delivered at once. */
static bool
probe_open(const cJSON *config, RelaySinkOpened *opened)
{
	opened->state = NULL;
	return true;
}

/* Nothing to send: the batch is done. */
static void
probe_start(void *state, RelaySinkBatch *batch)
{
	batch->ready = true;
}

/* Finished as soon as it started. */
static bool
probe_progress(void *state, RelaySinkBatch *batch)
{
	return true;
}

/* Every message delivered. */
static void
probe_outcomes(void *state, RelaySinkBatch *batch, RelayDeliveryResult *result)
{
	for (int i = 0; i < batch->nmsgs; i++)
		result->each[i].outcome = RELAY_DELIVERED;
}

/* Nothing is in flight. */
static void
probe_cancel(void *state, RelaySinkBatch *batch)
{
}

static const RelaySinkRoutine probe_routine = {
	.name = "probe",
	.config_keys = probe_config_keys,
	.secret_keys = probe_secret_keys,
	.validate = probe_validate,
	.open = probe_open,
	.start = probe_start,
	.progress = probe_progress,
	.outcomes = probe_outcomes,
	.cancel = probe_cancel,
};

static const char *const probe_source_config_keys[] = {"secret_word", "auth", NULL};
static const char *const probe_source_secret_keys[] = {"secret_word", "auth.*", NULL};

/* Takes "secret_word" as the sink does, and "auth" as it is. */
static void
probe_source_validate(const cJSON *config, cJSON *out)
{
	const cJSON *auth = cJSON_GetObjectItemCaseSensitive(config, "auth");

	probe_validate(config, out);
	if (auth != NULL)
		RelayConfigAddCopy(out, "auth", auth);
}

static const RelaySourceRoutine probe_source_routine = {
	.name = "probe",
	.config_keys = probe_source_config_keys,
	.secret_keys = probe_source_secret_keys,
	.validate = probe_source_validate,
};

/* The module's init symbol, pg_tide_endpoint_probe: a sink and a source. */
extern PGDLLEXPORT void pg_tide_endpoint_probe(void);
void
pg_tide_endpoint_probe(void)
{
	RelayRegisterSink(&probe_routine);
	RelayRegisterSource(&probe_source_routine);
}
