/*
 * redact.c
 *		A pipeline's config as every output shows it: the secrets its
 *		endpoint's routine declares (RelaySinkRoutine.secret_keys,
 *		RelaySourceRoutine.secret_keys) replaced by "********", so that no
 *		endpoint's keys are written in SQL. tide._relay_redact shows a
 *		forward pipeline's config (relay_get_config, relay_list_configs),
 *		tide._relay_redact_source a reverse pipeline's.
 *
 * A declared key "a" or "a.b" names a value that is a secret: a string,
 * number or other scalar is replaced, an array's members are, one by one,
 * and an object is a reference to a secret ({"env": ...}, {"file": ...}),
 * a name rather than a secret, and is shown. A key "a.*" names an object
 * whose members are secrets when their name says they carry a credential
 * (secret_name below), or when they are objects {"value": ..., "secret":
 * true}: the header of a webhook, a broker's "auth".
 *
 * A config whose type is unknown or whose module cannot be loaded here is
 * redacted conservatively. A forward pipeline's: "signing_secret",
 * "headers.*" and "auth.*" (every key the relay's sinks have declared so
 * far), and any string, at any depth, whose member name says it carries a
 * credential. A reverse pipeline's: every string, at any depth, but for
 * "inbox", "source_type" and secret references, since no source's keys
 * can be assumed.
 */
#include "postgres.h"

#include <ctype.h>

#include "fmgr.h"
#include "utils/jsonb.h"

#include "config_value.h"
#include "endpoints/registry.h"

#define REDACTED "********"

/* The keys redacted when the type's own cannot be known. */
static const char *const conservative_keys[] = {"signing_secret", "headers.*", "auth.*", NULL};

/*
 * Whether a member of this name carries a credential: its name contains
 * auth, cookie, token, secret, key, passw (password, passwd), pwd,
 * credential, session, signature or jwt, in any case (Authorization,
 * Cookie, X-Api-Key, X-Hub-Signature, password, ...).
 */
static bool
secret_name(const char *name)
{
	static const char *const words[] = {
		"auth", "cookie", "token", "secret", "key", "passw", "pwd", "credential",
		"session", "signature", "jwt", NULL
	};
	char	   *lower = pstrdup(name);

	for (char *p = lower; *p; p++)
		*p = (char) pg_ascii_tolower((unsigned char) *p);
	for (const char *const *w = words; *w; w++)
		if (strstr(lower, *w) != NULL)
			return true;
	return false;
}

/* Replaces item (a member of object or array parent) by "********". */
static void
replace_with_redacted(cJSON *parent, cJSON *item)
{
	if (item->string != NULL)
		cJSON_ReplaceItemInObjectCaseSensitive(parent, item->string, cJSON_CreateString(REDACTED));
	else
		cJSON_ReplaceItemViaPointer(parent, item, cJSON_CreateString(REDACTED));
}

/* Redacts the value of member `name` of obj: a secret as a whole. */
static void
redact_value(cJSON *obj, const char *name)
{
	cJSON	   *v = cJSON_GetObjectItemCaseSensitive(obj, name);

	if (v == NULL || cJSON_IsObject(v))
		return;
	if (cJSON_IsArray(v))
	{
		cJSON	   *e = v->child;

		while (e != NULL)
		{
			cJSON	   *next = e->next;

			if (!cJSON_IsObject(e))
				replace_with_redacted(v, e);
			e = next;
		}
		return;
	}
	replace_with_redacted(obj, v);
}

/* Redacts the members of obj that carry a credential ("a.*"). */
static void
redact_members(cJSON *obj)
{
	cJSON	   *m = obj->child;

	while (m != NULL)
	{
		cJSON	   *next = m->next;

		if (cJSON_IsObject(m))
		{
			cJSON	   *value = cJSON_GetObjectItemCaseSensitive(m, "value");

			if (value != NULL &&
				(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "secret")) || secret_name(m->string)))
				replace_with_redacted(m, value);
		}
		else if (secret_name(m->string))
			replace_with_redacted(obj, m);
		m = next;
	}
}

/* Redacts the value a declared key names in config. */
static void
redact_key(cJSON *config, const char *key)
{
	char	   *path = pstrdup(key);
	cJSON	   *obj = config;
	char	   *part = path;
	char	   *dot;

	/* down to the object holding the last part */
	while ((dot = strchr(part, '.')) != NULL)
	{
		*dot = '\0';
		obj = cJSON_GetObjectItemCaseSensitive(obj, part);
		if (!cJSON_IsObject(obj))
			return;
		part = dot + 1;
	}
	if (strcmp(part, "*") == 0)
		redact_members(obj);
	else
		redact_value(obj, part);
}

/* Redacts every string, at any depth, whose member name says it is a secret. */
static void
redact_named_strings(cJSON *node)
{
	for (cJSON *m = node->child; m != NULL; m = m->next)
	{
		if (cJSON_IsString(m) && m->string != NULL && secret_name(m->string))
			cJSON_SetValuestring(m, REDACTED);
		else if (cJSON_IsObject(m) || cJSON_IsArray(m))
			redact_named_strings(m);
	}
}

/* Redacts every string within v, but for secret references. */
static void
redact_strings(cJSON *v)
{
	cJSON	   *e;

	if (cJSON_IsObject(v) &&
		(cJSON_GetObjectItemCaseSensitive(v, "env") != NULL ||
		 cJSON_GetObjectItemCaseSensitive(v, "file") != NULL))
		return;
	cJSON_ArrayForEach(e, v)
	{
		if (cJSON_IsString(e))
			cJSON_SetValuestring(e, REDACTED);
		else
			redact_strings(e);
	}
}

/* A forward pipeline's config of an unknown sink type, redacted (see above). */
static void
redact_unknown_sink(cJSON *config)
{
	redact_named_strings(config);
	for (const char *const *k = conservative_keys; *k != NULL; k++)
		redact_key(config, *k);
}

/* A reverse pipeline's config of an unknown source type, redacted (see above). */
static void
redact_unknown_source(cJSON *config)
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

/*
 * A config with the secrets of its type (the member type_key names, of
 * this kind) redacted: those the type declares, or when it is unknown
 * here, those that `unknown` redacts.
 */
static Jsonb *
redact_config(Jsonb *jb, RelayEndpointKind kind, const char *type_key,
			  void (*unknown) (cJSON *config))
{
	cJSON	   *config;
	Jsonb	   *volatile result = NULL;

	if (!JB_ROOT_IS_OBJECT(jb) || JB_ROOT_IS_SCALAR(jb))
		return jb;
	config = RelayConfigFromJsonb(jb);
	/* cJSON's memory is malloc's: freed even when a cancel interrupts */
	PG_TRY();
	{
		const cJSON *type = cJSON_GetObjectItemCaseSensitive(config, type_key);
		const char *const *keys = NULL;

		if (cJSON_IsString(type) && RelayEndpointSecretKeys(kind, type->valuestring, &keys))
		{
			for (const char *const *k = keys; k != NULL && *k != NULL; k++)
				redact_key(config, *k);
		}
		else
			unknown(config);
		result = RelayConfigToJsonb(config);
	}
	PG_CATCH();
	{
		cJSON_Delete(config);
		PG_RE_THROW();
	}
	PG_END_TRY();
	cJSON_Delete(config);
	return result;
}

PG_FUNCTION_INFO_V1(tide_relay_redact);
PG_FUNCTION_INFO_V1(tide_relay_redact_source);

/*
 * tide._relay_redact(p_config jsonb): a forward pipeline's config with the
 * secrets its sink type declares replaced by "********" (see above).
 */
Datum
tide_relay_redact(PG_FUNCTION_ARGS)
{
	PG_RETURN_JSONB_P(redact_config(PG_GETARG_JSONB_P(0), RELAY_ENDPOINT_SINK, "sink_type",
									redact_unknown_sink));
}

/*
 * tide._relay_redact_source(p_config jsonb): a reverse pipeline's config
 * with the secrets its source type declares replaced by "********".
 */
Datum
tide_relay_redact_source(PG_FUNCTION_ARGS)
{
	PG_RETURN_JSONB_P(redact_config(PG_GETARG_JSONB_P(0), RELAY_ENDPOINT_SOURCE, "source_type",
									redact_unknown_source));
}
