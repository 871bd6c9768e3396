/*
 * config_read.c
 *		The members of a pipeline's config as the relay worker reads them,
 *		for pipelines.c and for each sink's `open`.
 *
 * The worker reads only configs that the validator (pipeline_config.c)
 * has just passed and normalised, so every value it takes is present and
 * within its range: nothing is clamped here. The default is for a key the
 * pipeline's sink does not take at all.
 */
#include "postgres.h"

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

/* A number member, or dflt when absent. */
double
RelayConfigNumberOr(const cJSON *obj, const char *key, double dflt)
{
	const cJSON *v = RelayConfigMember(obj, key);

	return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* An integer member, or dflt when absent. */
int
RelayConfigIntOr(const cJSON *obj, const char *key, int dflt)
{
	return (int) RelayConfigNumberOr(obj, key, dflt);
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
