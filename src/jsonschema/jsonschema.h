/*
 * jsonschema.h
 *		The boundary between pg_tide.so and its JSON Schema module,
 *		pg_tide-jsonschema.so (src/jsonschema/): the module's functions, as
 *		plain C with no exception and no PostgreSQL error crossing it.
 *
 * The module wraps valijson, a C++ validator. pg_tide.so loads it only when
 * an outbox has a schema (src/payload_schema.c) and calls its init symbol,
 * pg_tide_jsonschema_routine, which returns this table. Every function
 * catches whatever the C++ side throws and reports it in a
 * TideJsonSchemaError; the caller raises the PostgreSQL error.
 */
#ifndef TIDE_JSONSCHEMA_H
#define TIDE_JSONSCHEMA_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C"
{
#endif

/* What went wrong: a schema refused, or where a document did not validate. */
typedef struct TideJsonSchemaError
{
	char		message[512];	/* what is wrong, one sentence */
	char		pointer[512];	/* JSON pointer to the failing value ("" = the root) */
	char		keyword[64];	/* the schema keyword that failed */
} TideJsonSchemaError;

typedef struct TideJsonSchemaRoutine
{
	/*
	 * Compiles a schema given as JSON text; NULL, with err->message, when it
	 * is not a schema this module can check. *draft is set to the draft
	 * used: "draft-07" or "2020-12".
	 */
	void	   *(*compile) (const char *schema_json, const char **draft,
							TideJsonSchemaError *err);

	/*
	 * Whether the JSON text document validates against a compiled schema;
	 * false with err filled when it does not, or when the check itself
	 * failed (err->keyword is then empty).
	 */
	bool		(*validate) (void *schema, const char *document_json,
							 TideJsonSchemaError *err);

	/* Frees a compiled schema. */
	void		(*release) (void *schema);

	/*
	 * Whether a jsonb (a detoasted Jsonb *) validates against a compiled
	 * schema, read where it lies: the check of every publish. It says no
	 * more than that (err->message is set only when the check itself
	 * failed); validate() on the payload's text finds the failing pointer
	 * and keyword of a payload it refuses.
	 */
	bool		(*validate_jsonb) (void *schema, const void *jsonb,
								   TideJsonSchemaError *err);
} TideJsonSchemaRoutine;

/* The init symbol of pg_tide-jsonschema.so. */
typedef const TideJsonSchemaRoutine *(*TideJsonSchemaInit) (void);

#define TIDE_JSONSCHEMA_INIT "pg_tide_jsonschema_routine"

#ifdef __cplusplus
}
#endif

#endif							/* TIDE_JSONSCHEMA_H */
