/*
 * config_value.h
 *		Reading one value of a pipeline config, with the messages every
 *		validator gives: the common keys' validator (pipeline_config.c) and
 *		each sink's (relay/endpoints/<name>/config.c) call these.
 *
 * A config arrives as a cJSON tree made from its jsonb by
 * RelayConfigFromJsonb, in which every number is a cJSON_Raw item holding
 * the number's text as jsonb prints it (1e-400 written out in full, 1e300
 * with its 300 zeros): a double holds neither, so ranges and integer-ness
 * are checked on the text, as numeric. The normalised config a validator
 * builds ("out") holds numbers the same way, so that RelayConfigToJsonb
 * stores 100 as 100 and 0.5 as 0.5. Every function here raises an ERROR
 * (22023, a lower-case message and a hint) on bad input; none returns a
 * value that was not checked.
 */
#ifndef TIDE_CONFIG_VALUE_H
#define TIDE_CONFIG_VALUE_H

#include <cjson/cJSON.h>

#include "utils/jsonb.h"

/* The cJSON tree of a jsonb value, numbers as their text (see above). */
extern PGDLLEXPORT cJSON *RelayConfigFromJsonb(Jsonb *jb);

/* The jsonb of a normalised config built by a validator. */
extern PGDLLEXPORT Jsonb *RelayConfigToJsonb(const cJSON *config);

/* Raises 22023 with this message and hint. */
#if PG_VERSION_NUM >= 180000
/* 18 spells "never returns" as a prefix, earlier versions as an attribute. */
extern PGDLLEXPORT pg_noreturn void RelayConfigError(const char *hint, const char *fmt,...) pg_attribute_printf(2, 3);
#else
extern PGDLLEXPORT void RelayConfigError(const char *hint, const char *fmt,...) pg_attribute_printf(2, 3) pg_attribute_noreturn();
#endif

/* The JSON type of a value as jsonb_typeof names it; "missing" for NULL. */
extern PGDLLEXPORT const char *RelayConfigTypeName(const cJSON *v);

/*
 * Refuses a value whose JSON type is not `type` ("object", "array",
 * "string", "number", "boolean"); NULL counts as missing.
 */
extern PGDLLEXPORT void RelayConfigCheckType(const char *key, const cJSON *v, const char *type,
								 const char *hint);

/*
 * The string that member `key` of obj must be; refuses it missing or of
 * another type, with the hint.
 */
extern PGDLLEXPORT const cJSON *RelayConfigRequiredString(const cJSON *obj, const char *key,
														  const char *hint);

/*
 * Refuses a member of obj whose name is not in the NULL-terminated lists
 * known and (when not NULL) more; prefix names the parent object in
 * messages ("retry."). The first unknown name in byte order is named.
 */
extern PGDLLEXPORT void RelayConfigCheckKeys(const cJSON *obj, const char *const *known,
								 const char *const *more, const char *prefix);

/*
 * The integer member `field` of obj (key names it in messages), within
 * [min, max], or dflt when absent.
 */
extern PGDLLEXPORT int	RelayConfigInt(const cJSON *obj, const char *field, const char *key,
						   int min, int max, int dflt);

/* The boolean member `key` of obj, or dflt when absent. */
extern PGDLLEXPORT bool RelayConfigBool(const cJSON *obj, const char *key, bool dflt);

/*
 * The string member `key` of obj, one of the NULL-terminated list allowed,
 * or dflt when absent (missing is an error when dflt is NULL).
 */
extern PGDLLEXPORT const char *RelayConfigChoice(const cJSON *obj, const char *key,
									 const char *const *allowed, const char *dflt);

/*
 * Refuses a value that is not a reference to a secret kept outside the
 * database: {"env": "PG_TIDE_..."} or {"file": "<plain file name>"}.
 */
extern PGDLLEXPORT void RelayConfigCheckSecretRef(const char *key, const cJSON *ref);

/*
 * Refuses a value that cannot name a message header: not a string, empty,
 * longer than 255 bytes or with control characters.
 */
extern PGDLLEXPORT void RelayConfigCheckHeaderName(const char *key, const cJSON *v, const char *hint);

/* An optional header name under `key` of obj, checked as above and added to out. */
extern PGDLLEXPORT void RelayConfigAddHeaderName(const cJSON *obj, cJSON *out, const char *key,
												 const char *hint);

/* Whether a string matches a regular expression, as SQL's ~ matches it. */
extern PGDLLEXPORT bool RelayConfigMatches(const char *s, const char *pattern);

/* A numeric's text as a message shows it (1e-400 as 1.000e-400). */
extern PGDLLEXPORT char *RelayConfigNumberText(const char *numeric_text);

/*
 * Adding to the normalised config: a number (as its text), an integer, a
 * boolean, a string, or a copy of a value of the user's config.
 */
extern PGDLLEXPORT void RelayConfigAddNumberText(cJSON *out, const char *name, const char *text);
extern PGDLLEXPORT void RelayConfigAddInt(cJSON *out, const char *name, int value);
extern PGDLLEXPORT void RelayConfigAddBool(cJSON *out, const char *name, bool value);
extern PGDLLEXPORT void RelayConfigAddString(cJSON *out, const char *name, const char *value);
extern PGDLLEXPORT void RelayConfigAddCopy(cJSON *out, const char *name, const cJSON *value);

/* A new empty object added to out under name. */
extern PGDLLEXPORT cJSON *RelayConfigAddObject(cJSON *out, const char *name);

/*
 * config_files.c: the role a config is checked with (RelayNormalizeConfig
 * sets it; InvalidOid has no rights) and which it is, whether it is a superuser or has the
 * privileges of a built-in role, and a file a config names for the relay
 * to read (a TLS file, a credentials file), refused with 42501 unless that
 * role may read server files or the file is in pg_tide.secrets_directory.
 */
extern PGDLLEXPORT Oid RelayConfigSetRole(Oid role);
extern PGDLLEXPORT Oid RelayConfigRole(void);
extern PGDLLEXPORT bool RelayConfigRoleHas(Oid builtin);
extern PGDLLEXPORT void RelayConfigCheckFile(const char *key, const cJSON *v, const char *hint);

/*
 * config_limits.c: a host name (len bytes of host) of at most 253 bytes
 * and labels of 1 to 63 (an address is left to the sink's own check), and
 * a port (len digits) from 1 to 65535, returned.
 */
extern PGDLLEXPORT void RelayConfigCheckHost(const char *key, const char *host, size_t len,
											 const char *hint);
extern PGDLLEXPORT int RelayConfigCheckPort(const char *key, const char *digits, size_t len,
											const char *hint);

#endif							/* TIDE_CONFIG_VALUE_H */
