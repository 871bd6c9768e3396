/*
 * source_redact.c
 *		A reverse pipeline's config as every output shows it: the values of
 *		its source's secret keys (RelaySourceRoutine.secret_keys) replaced by
 *		"********", so that the keys a source keeps secret are declared once,
 *		by the source, and never written in SQL.
 *
 * A secret reference ({"env": ...} or {"file": ...}) is shown as it is: it
 * names a secret and holds none. A config whose source type no endpoint
 * on this server provides (its module not installed) cannot say which of
 * its keys are secret, so every string in it is redacted but for the keys
 * of every reverse pipeline (inbox, source_type).
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/jsonb.h"

#include "config_value.h"
#include "source.h"

PG_FUNCTION_INFO_V1(tide_relay_redact_source);

#define REDACTED "********"

/* Whether a value is a reference to a secret kept outside the database. */
static bool
is_secret_ref(const cJSON *v)
{
	return cJSON_IsObject(v) &&
		(cJSON_GetObjectItemCaseSensitive(v, "env") != NULL ||
		 cJSON_GetObjectItemCaseSensitive(v, "file") != NULL);
}

/* Redacts the member of obj that a dotted path ("auth.password") names. */
static void
redact_path(cJSON *obj, const char *path)
{
	const char *dot = strchr(path, '.');
	cJSON	   *v;

	if (!cJSON_IsObject(obj))
		return;
	if (dot != NULL)
	{
		char	   *head = pnstrdup(path, dot - path);

		redact_path(cJSON_GetObjectItemCaseSensitive(obj, head), dot + 1);
		return;
	}
	v = cJSON_GetObjectItemCaseSensitive(obj, path);
	if (v != NULL && !cJSON_IsNull(v) && !is_secret_ref(v))
		cJSON_ReplaceItemInObjectCaseSensitive(obj, path, cJSON_CreateString(REDACTED));
}

/* Redacts every string within v, but for secret references. */
static void
redact_strings(cJSON *v)
{
	cJSON	   *e;

	if (is_secret_ref(v))
		return;
	cJSON_ArrayForEach(e, v)
	{
		if (cJSON_IsString(e))
			cJSON_SetValuestring(e, REDACTED);
		else
			redact_strings(e);
	}
}

/*
 * tide._relay_redact_source(p_config jsonb): a reverse pipeline's config
 * with its source's secrets shown as ********.
 */
Datum
tide_relay_redact_source(PG_FUNCTION_ARGS)
{
	Jsonb	   *jb = PG_GETARG_JSONB_P(0);
	cJSON	   *volatile config = NULL;
	Jsonb	   *volatile result = NULL;

	if (!JB_ROOT_IS_OBJECT(jb))
		PG_RETURN_JSONB_P(jb);
	PG_TRY();
	{
		const cJSON *type;
		const RelaySourceRoutine *source = NULL;

		config = RelayConfigFromJsonb(jb);
		type = cJSON_GetObjectItemCaseSensitive(config, "source_type");
		if (cJSON_IsString(type))
			source = RelaySourceFind(type->valuestring);
		if (source != NULL)
		{
			for (const char *const *k = source->secret_keys; k != NULL && *k != NULL; k++)
				redact_path(config, *k);
		}
		else
		{
			cJSON	   *e;

			cJSON_ArrayForEach(e, config)
			{
				if (strcmp(e->string, "inbox") == 0 || strcmp(e->string, "source_type") == 0)
					continue;
				if (cJSON_IsString(e))
					cJSON_SetValuestring(e, REDACTED);
				else
					redact_strings(e);
			}
		}
		result = RelayConfigToJsonb(config);
	}
	PG_FINALLY();
	{
		cJSON_Delete(config);
	}
	PG_END_TRY();
	PG_RETURN_JSONB_P(result);
}
