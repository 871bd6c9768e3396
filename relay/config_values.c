/*
 * config_values.c
 *		The members of a pipeline's config as the relay worker reads them,
 *		for pipelines.c and for each sink's `open`.
 *
 * tide.relay_set_outbox validated the config when it was set, but a row
 * written by hand can hold anything and must never stop another pipeline:
 * a member of the wrong type reads as absent, a number is clamped to the
 * range the worker can use, and an absent one takes its default.
 */
#include "postgres.h"

#include <math.h>

#include "sink.h"

/* The member `key` of a JSON object, or NULL. */
const cJSON *
RelayConfigMember(const cJSON *obj, const char *key)
{
	return cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
}

/* A string member copied into the current memory context, or NULL. */
char *
RelayConfigString(const cJSON *obj, const char *key)
{
	const cJSON *v = RelayConfigMember(obj, key);

	return cJSON_IsString(v) ? pstrdup(v->valuestring) : NULL;
}

/* Whether a member is the string `value`. */
bool
RelayConfigStringIs(const cJSON *obj, const char *key, const char *value)
{
	const char *s = cJSON_GetStringValue(RelayConfigMember(obj, key));

	return s != NULL && strcmp(s, value) == 0;
}

/* Whether a member is the JSON value true (or, want_true false, false). */
bool
RelayConfigIs(const cJSON *obj, const char *key, bool want_true)
{
	const cJSON *v = RelayConfigMember(obj, key);

	return want_true ? cJSON_IsTrue(v) : cJSON_IsFalse(v);
}

/* A number member clamped to [min, max] (NaN and absent: the default). */
double
RelayConfigNumber(const cJSON *obj, const char *key, double min, double max, double dflt)
{
	const cJSON *v = RelayConfigMember(obj, key);

	if (!cJSON_IsNumber(v) || isnan(v->valuedouble))
		return dflt;
	return Min(Max(v->valuedouble, min), max);
}

/* An integer member clamped to [min, max], rounded as numeric::int rounds. */
int
RelayConfigInt(const cJSON *obj, const char *key, int min, int max, int dflt)
{
	return (int) rint(RelayConfigNumber(obj, key, min, max, dflt));
}

/* A member as JSON text, or NULL when absent. */
char *
RelayConfigJsonText(const cJSON *obj, const char *key)
{
	const cJSON *v = RelayConfigMember(obj, key);
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
