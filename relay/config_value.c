/*
 * config_value.c
 *		One value of a pipeline config at a time: its JSON type, an integer
 *		in its range, a boolean, one string of a list, a secret reference,
 *		the keys an object may have; and the conversion of a config between
 *		jsonb and the cJSON tree the validators read and write.
 *
 * Numbers are never read as doubles. jsonb holds numerics that a double
 * cannot (1e-400 is 0 as a double, 1e400 infinite), and a value accepted
 * must be one the relay can use; so a number travels as its text (a
 * cJSON_Raw item, see config_value.h) and is compared as numeric, the way
 * SQL compares it.
 */
#include "postgres.h"

#include "catalog/pg_collation.h"
#include "regex/regex.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"

#include "config_value.h"
#include "filter.h"

/* An item cJSON made, or an ERROR when it ran out of memory. */
static cJSON *
checked(cJSON *item)
{
	if (item == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	return item;
}

/* Adds item to out as name; item is freed when that fails. */
static void
add_item(cJSON *out, const char *name, cJSON *item)
{
	checked(item);
	if (!cJSON_AddItemToObject(out, name, item))
	{
		cJSON_Delete(item);
		checked(NULL);
	}
}

/* A scalar of a jsonb as a cJSON item; a number as its text. */
static cJSON *
scalar_item(const JsonbValue *v)
{
	switch (v->type)
	{
		case jbvNull:
			return cJSON_CreateNull();
		case jbvBool:
			return cJSON_CreateBool(v->val.boolean);
		case jbvString:
			return cJSON_CreateString(pnstrdup(v->val.string.val, v->val.string.len));
		case jbvNumeric:
			return cJSON_CreateRaw(DatumGetCString(DirectFunctionCall1(numeric_out,
																	   NumericGetDatum(v->val.numeric))));
		default:
			elog(ERROR, "unexpected jsonb value type %d", (int) v->type);
	}
	return NULL;					/* keep the compiler quiet */
}

cJSON *
RelayConfigFromJsonb(Jsonb *jb)
{
	JsonbIterator *it = JsonbIteratorInit(&jb->root);
	JsonbValue	v;
	JsonbIteratorToken token;
	int			depth = 0;
	int			room = 16;
	cJSON	  **parents = palloc(sizeof(cJSON *) * room);
	cJSON	   *root = NULL;
	char	   *key = NULL;

	/* iterative, not recursive: jsonb nests as deep as the stack allowed its parser */
	while ((token = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		cJSON	   *item;

		if (token == WJB_KEY)
		{
			key = pnstrdup(v.val.string.val, v.val.string.len);
			continue;
		}
		if (token == WJB_END_OBJECT || token == WJB_END_ARRAY)
		{
			depth--;
			continue;
		}
		if (token == WJB_BEGIN_OBJECT)
			item = cJSON_CreateObject();
		else if (token == WJB_BEGIN_ARRAY)
			item = cJSON_CreateArray();
		else
			item = scalar_item(&v);
		if (item == NULL ||
			(depth > 0 && !(cJSON_IsObject(parents[depth - 1])
							? cJSON_AddItemToObject(parents[depth - 1], key, item)
							: cJSON_AddItemToArray(parents[depth - 1], item))))
		{
			cJSON_Delete(item);
			cJSON_Delete(root);
			checked(NULL);
		}
		if (root == NULL)
			root = item;
		if (token == WJB_BEGIN_OBJECT || token == WJB_BEGIN_ARRAY)
		{
			if (depth == room)
				parents = repalloc(parents, sizeof(cJSON *) * (room *= 2));
			parents[depth++] = item;
		}
	}
	pfree(parents);
	return root;
}

Jsonb *
RelayConfigToJsonb(const cJSON *config)
{
	char	   *text = cJSON_PrintUnformatted(config);
	char	   *copy;

	if (text == NULL)
		checked(NULL);
	copy = pstrdup(text);
	cJSON_free(text);
	return DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(copy)));
}

void
RelayConfigError(const char *hint, const char *fmt,...)
{
	StringInfoData message;

	initStringInfo(&message);
	for (;;)
	{
		va_list		args;
		int			needed;

		va_start(args, fmt);
		needed = appendStringInfoVA(&message, fmt, args);
		va_end(args);
		if (needed == 0)
			break;
		enlargeStringInfo(&message, needed);
	}
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("%s", message.data),
			 errhint("%s", hint)));
}

const char *
RelayConfigTypeName(const cJSON *v)
{
	if (v == NULL)
		return "missing";
	if (cJSON_IsRaw(v))
		return "number";
	return RelayJsonTypeName(v);
}

void
RelayConfigCheckType(const char *key, const cJSON *v, const char *type, const char *hint)
{
	const char *actual = RelayConfigTypeName(v);

	if (strcmp(actual, type) != 0)
		RelayConfigError(hint, "config key \"%s\" must be %s%s, not %s", key,
						 strcmp(type, "object") == 0 || strcmp(type, "array") == 0 ? "an " : "a ",
						 type, actual);
}

const cJSON *
RelayConfigRequiredString(const cJSON *obj, const char *key, const char *hint)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);

	if (v == NULL)
		RelayConfigError(hint, "config key \"%s\" is missing", key);
	RelayConfigCheckType(key, v, "string", hint);
	return v;
}

/* Whether name is in the NULL-terminated list (NULL: an empty one). */
static bool
in_list(const char *name, const char *const *list)
{
	for (; list && *list; list++)
		if (strcmp(name, *list) == 0)
			return true;
	return false;
}

/* qsort comparator of C strings. */
static int
compare_names(const void *a, const void *b)
{
	return strcmp(*(const char *const *) a, *(const char *const *) b);
}

void
RelayConfigCheckKeys(const cJSON *obj, const char *const *known,
					 const char *const *more, const char *prefix)
{
	const cJSON *member;
	const char *unknown = NULL;
	const char **names;
	int			n = 0;
	StringInfoData list;

	cJSON_ArrayForEach(member, obj)
	{
		if (!in_list(member->string, known) && !in_list(member->string, more) &&
			(unknown == NULL || strcmp(member->string, unknown) < 0))
			unknown = member->string;
	}
	if (unknown == NULL)
		return;

	for (const char *const *k = known; *k; k++)
		n++;
	for (const char *const *k = more; k && *k; k++)
		n++;
	names = palloc(sizeof(char *) * n);
	n = 0;
	for (const char *const *k = known; *k; k++)
		names[n++] = *k;
	for (const char *const *k = more; k && *k; k++)
		names[n++] = *k;
	qsort(names, n, sizeof(char *), compare_names);
	initStringInfo(&list);
	for (int i = 0; i < n; i++)
		appendStringInfo(&list, "%s%s", i > 0 ? ", " : "", names[i]);
	RelayConfigError(psprintf("Remove \"%s%s\"; the known keys are: %s.", prefix, unknown, list.data),
					 "unknown config key \"%s%s\"", prefix, unknown);
}

/* The numeric of a number's text. */
static Datum
numeric_of(const char *text)
{
	return DirectFunctionCall3(numeric_in, CStringGetDatum(text),
							   ObjectIdGetDatum(InvalidOid), Int32GetDatum(-1));
}

char *
RelayConfigNumberText(const char *numeric_text)
{
	text	   *sci;

	if (strlen(numeric_text) <= 20)
		return pstrdup(numeric_text);
	sci = DatumGetTextPP(DirectFunctionCall2(numeric_to_char, numeric_of(numeric_text),
											 CStringGetTextDatum("9.999EEEE")));
	return text_to_cstring(DatumGetTextPP(DirectFunctionCall1(btrim1, PointerGetDatum(sci))));
}

int
RelayConfigInt(const cJSON *obj, const char *field, const char *key,
			   int min, int max, int dflt)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, field);
	char	   *hint;
	Datum		n;

	if (v == NULL)
		return dflt;
	hint = psprintf("Give \"%s\" an integer from %d to %d.", key, min, max);
	if (!cJSON_IsRaw(v))
		RelayConfigError(hint, "config key \"%s\" must be an integer, not %s", key,
						 RelayConfigTypeName(v));
	n = numeric_of(v->valuestring);
	if (!DatumGetBool(DirectFunctionCall2(numeric_eq, n,
										  DirectFunctionCall2(numeric_trunc, n, Int32GetDatum(0)))))
		RelayConfigError(hint, "config key \"%s\" must be an integer, not %s", key,
						 RelayConfigNumberText(v->valuestring));
	if (DatumGetBool(DirectFunctionCall2(numeric_lt, n, NumericGetDatum(int64_to_numeric(min)))) ||
		DatumGetBool(DirectFunctionCall2(numeric_gt, n, NumericGetDatum(int64_to_numeric(max)))))
		RelayConfigError(hint, "config key \"%s\" is out of range: %s", key,
						 RelayConfigNumberText(v->valuestring));
	return DatumGetInt32(DirectFunctionCall1(numeric_int4, n));
}

bool
RelayConfigBool(const cJSON *obj, const char *key, bool dflt)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);

	if (v == NULL)
		return dflt;
	RelayConfigCheckType(key, v, "boolean", psprintf("Give \"%s\" as true or false.", key));
	return cJSON_IsTrue(v);
}

const char *
RelayConfigChoice(const cJSON *obj, const char *key, const char *const *allowed,
				  const char *dflt)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
	StringInfoData hint;

	initStringInfo(&hint);
	appendStringInfo(&hint, "Give \"%s\" one of: ", key);
	for (const char *const *a = allowed; *a; a++)
		appendStringInfo(&hint, "%s'%s'", a == allowed ? "" : ", ", *a);
	appendStringInfoChar(&hint, '.');
	if (v == NULL)
	{
		if (dflt == NULL)
			RelayConfigError(hint.data, "config key \"%s\" is missing", key);
		return dflt;
	}
	RelayConfigCheckType(key, v, "string", hint.data);
	if (!in_list(v->valuestring, allowed))
		RelayConfigError(hint.data, "invalid value \"%s\" for config key \"%s\"", v->valuestring, key);
	return v->valuestring;
}

/* Whether s is non-empty and every byte of it is in chars. */
static bool
only_chars(const char *s, const char *chars)
{
	return s[0] != '\0' && strspn(s, chars) == strlen(s);
}

#define NAME_CHARS "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_"

void
RelayConfigCheckSecretRef(const char *key, const cJSON *ref)
{
	const cJSON *env = cJSON_GetObjectItemCaseSensitive(ref, "env");
	const cJSON *file = cJSON_GetObjectItemCaseSensitive(ref, "file");
	const char *hint = psprintf("Give \"%s\" as {\"env\": \"PG_TIDE_<NAME>\"} or "
								"{\"file\": \"<file name in pg_tide.secrets_directory>\"}.", key);

	if (cJSON_GetArraySize(ref) != 1 || (env == NULL && file == NULL))
		RelayConfigError(hint, "config key \"%s\" is not a valid secret reference", key);
	if (cJSON_IsString(env))
	{
		if (strncmp(env->valuestring, "PG_TIDE_", 8) != 0 || !only_chars(env->valuestring + 8, NAME_CHARS))
			RelayConfigError("Only environment variables named PG_TIDE_<letters, digits, _> can hold secrets.",
							 "environment variable \"%s\" in config key \"%s\" does not start with \"PG_TIDE_\"",
							 env->valuestring, key);
	}
	else if (cJSON_IsString(file))
	{
		const char *name = file->valuestring;

		if (name[0] == '\0' || strchr(NAME_CHARS, name[0]) == NULL ||
			strspn(name + 1, NAME_CHARS ".-") != strlen(name + 1) || strlen(name) > 255)
			RelayConfigError("Give the name of a file in pg_tide.secrets_directory: letters, digits, "
							 "\".\", \"_\" and \"-\", no \"/\", not starting with \".\".",
							 "file \"%s\" in config key \"%s\" is not a plain file name", name, key);
	}
	else
		RelayConfigError(hint, "config key \"%s\" is not a valid secret reference", key);
}

void
RelayConfigCheckHeaderName(const char *key, const cJSON *v, const char *hint)
{
	RelayConfigCheckType(key, v, "string", hint);
	if (v->valuestring[0] == '\0')
		RelayConfigError(hint, "config key \"%s\" must not be empty", key);
	if (strlen(v->valuestring) > 255 || RelayConfigMatches(v->valuestring, "[[:cntrl:]]"))
		RelayConfigError(hint, "config key \"%s\" must have at most 255 bytes and no control characters", key);
}

void
RelayConfigAddHeaderName(const cJSON *obj, cJSON *out, const char *key, const char *hint)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);

	if (v == NULL)
		return;
	RelayConfigCheckHeaderName(key, v, hint);
	RelayConfigAddCopy(out, key, v);
}

bool
RelayConfigMatches(const char *s, const char *pattern)
{
	return RE_compile_and_execute(cstring_to_text(pattern), unconstify(char *, s), strlen(s),
								  REG_ADVANCED, DEFAULT_COLLATION_OID, 0, NULL);
}

void
RelayConfigAddNumberText(cJSON *out, const char *name, const char *text)
{
	add_item(out, name, cJSON_CreateRaw(text));
}

void
RelayConfigAddInt(cJSON *out, const char *name, int value)
{
	char		text[16];

	snprintf(text, sizeof(text), "%d", value);
	add_item(out, name, cJSON_CreateRaw(text));
}

void
RelayConfigAddBool(cJSON *out, const char *name, bool value)
{
	add_item(out, name, cJSON_CreateBool(value));
}

void
RelayConfigAddString(cJSON *out, const char *name, const char *value)
{
	add_item(out, name, cJSON_CreateString(value));
}

void
RelayConfigAddCopy(cJSON *out, const char *name, const cJSON *value)
{
	add_item(out, name, cJSON_Duplicate(value, true));
}

cJSON *
RelayConfigAddObject(cJSON *out, const char *name)
{
	cJSON	   *obj = cJSON_CreateObject();

	add_item(out, name, obj);
	return obj;
}
