/*
 * payload_schema.c
 *		Payload schemas: the JSON Schema an outbox (or one message type of
 *		it) sets for the payloads published to it, checked at publish
 *		before anything is written (docs/publishing.md#payload-schemas).
 *
 * The checks run in pg_tide-jsonschema.so (src/jsonschema/), C++ over
 * valijson, which this file loads only when a schema is set or an outbox
 * that has one is published to: a server without the module publishes to
 * outboxes without schemas as before and refuses to set one.
 *
 * 1. Per backend, a hash of the outboxes published to: for each, its
 *	  compiled schemas by message type ('' for the outbox's default), or
 *	  none. An outbox without a schema costs one hash lookup per publish.
 * 2. tide.outbox_schemas has a statement trigger that sends a relcache
 *	  invalidation of the table at commit (tide._rights_changed); every
 *	  backend processes it at the start of its next transaction and forgets
 *	  the whole hash. What was read while an invalidation arrived is used
 *	  once and not kept (the generation counter tells).
 * 3. A message's type is its header "type"; the type's schema applies,
 *	  else the outbox's default, else none. The payload is checked as the
 *	  caller passed it, read where it lies as jsonb (no text printed and
 *	  parsed), and stored unchanged; only a payload refused is printed as
 *	  text, once, for the module to find its DETAIL's pointer and keyword.
 *
 * The module reports every failure in a struct; the errors are raised here,
 * outside its C++ frames.
 */
#include "postgres.h"

#include <sys/stat.h>

#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "jsonschema/jsonschema.h"
#include "payload_schema.h"
#include "pg_tide.h"

PG_FUNCTION_INFO_V1(tide_schema_draft);
PG_FUNCTION_INFO_V1(tide_schema_validates);

#define JSONSCHEMA_LIBRARY "$libdir/pg_tide-jsonschema"

/* One schema of an outbox: for one message type, or ('') its default. */
typedef struct TypedSchema
{
	char	   *message_type;
	void	   *compiled;
} TypedSchema;

/* What the backend knows of an outbox's schemas. */
typedef struct OutboxSchemas
{
	char		outbox[NAMEDATALEN];	/* the hash key */
	int			count;			/* 0: the outbox has no schema */
	TypedSchema *schemas;		/* in schema_context */
} OutboxSchemas;

static const TideJsonSchemaRoutine *routine = NULL;
static HTAB *outbox_schemas = NULL;
static MemoryContext schema_context = NULL;
static Oid	schemas_relid = InvalidOid;
static uint64 schemas_generation = 0;
static bool callback_registered = false;

/* Releases every compiled schema and the hash (no PostgreSQL error). */
static void
forget_schemas(void)
{
	HASH_SEQ_STATUS seq;
	OutboxSchemas *entry;

	if (outbox_schemas == NULL)
		return;
	hash_seq_init(&seq, outbox_schemas);
	while ((entry = hash_seq_search(&seq)) != NULL)
		for (int i = 0; i < entry->count; i++)
			routine->release(entry->schemas[i].compiled);
	hash_destroy(outbox_schemas);
	outbox_schemas = NULL;
	MemoryContextReset(schema_context);
}

/* Relcache callback: tide.outbox_schemas changed, or every relation did. */
static void
schemas_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == schemas_relid)
	{
		forget_schemas();
		schemas_relid = InvalidOid;
		schemas_generation++;
	}
}

/* The module's functions, loading it first; 55000 when it is not installed. */
static const TideJsonSchemaRoutine *
load_module(void)
{
	char	   *path;
	struct stat st;
	TideJsonSchemaInit init;

	if (routine != NULL)
		return routine;
	path = psprintf("%s/pg_tide-jsonschema%s", pkglib_path, DLSUFFIX);
	if (stat(path, &st) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("payload schemas need the module pg_tide-jsonschema%s, which is not installed",
						DLSUFFIX),
				 errdetail("The file \"%s\" does not exist.", path),
				 errhint("Install the package postgresql-%s-pg-tide-jsonschema, or build pg_tide with Debian's libvalijson-dev and nlohmann-json3-dev installed.",
						 PG_MAJORVERSION)));
	init = (TideJsonSchemaInit) (void *) load_external_function(JSONSCHEMA_LIBRARY,
																  TIDE_JSONSCHEMA_INIT, true, NULL);
	routine = init();
	return routine;
}

/* Compiles a schema given as JSON text; 22023 when the module refuses it. */
static void *
compile_schema(const char *schema_json, const char **draft)
{
	TideJsonSchemaError err;
	void	   *compiled = load_module()->compile(schema_json, draft, &err);

	if (compiled == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid payload schema"),
				 errdetail("%s", err.message),
				 errhint("Give a JSON Schema of draft 2020-12 (the default) or draft-07 (\"$schema\": \"http://json-schema.org/draft-07/schema#\") that uses no remote reference.")));
	return compiled;
}

/*
 * SQL: tide._schema_draft(p_schema) returns the draft of a schema the module
 * accepts ("2020-12" or "draft-07"), or raises 22023.
 */
Datum
tide_schema_draft(PG_FUNCTION_ARGS)
{
	Jsonb	   *schema = PG_GETARG_JSONB_P(0);
	const char *draft = NULL;
	void	   *compiled;

	compiled = compile_schema(JsonbToCString(NULL, &schema->root, VARSIZE(schema)), &draft);
	routine->release(compiled);
	PG_RETURN_TEXT_P(cstring_to_text(draft));
}

/*
 * SQL: tide._schema_validates(p_schema, p_payload) returns whether the
 * payload validates against the schema, checked as a publish checks it;
 * 22023 when the schema is refused.
 */
Datum
tide_schema_validates(PG_FUNCTION_ARGS)
{
	Jsonb	   *schema = PG_GETARG_JSONB_P(0);
	Jsonb	   *payload = PG_GETARG_JSONB_P(1);
	const char *draft = NULL;
	void	   *compiled;
	TideJsonSchemaError err;
	bool		valid;

	compiled = compile_schema(JsonbToCString(NULL, &schema->root, VARSIZE(schema)), &draft);
	valid = routine->validate_jsonb(compiled, payload, &err);
	routine->release(compiled);
	if (!valid && err.message[0] != '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("could not check the payload against the schema"),
				 errdetail("%s", err.message),
				 errhint("Give a payload and a schema that the JSON Schema module can read.")));
	PG_RETURN_BOOL(valid);
}

/* The hash, made (and the callback registered) on first use. */
static void
prepare_cache(void)
{
	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(schemas_relcache_callback, (Datum) 0);
		callback_registered = true;
	}
	if (schema_context == NULL)
		schema_context = AllocSetContextCreate(TopMemoryContext, "pg_tide payload schemas",
											   ALLOCSET_SMALL_SIZES);
	if (!OidIsValid(schemas_relid))
	{
		Oid			nsp = get_namespace_oid("tide", true);

		if (OidIsValid(nsp))
			schemas_relid = get_relname_relid("outbox_schemas", nsp);
	}
	if (outbox_schemas == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = NAMEDATALEN;
		ctl.entrysize = sizeof(OutboxSchemas);
		ctl.hcxt = schema_context;
		outbox_schemas = hash_create("pg_tide payload schemas", 16, &ctl,
									 HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
}

/*
 * Reads and compiles the outbox's schemas into *entry (through SPI, which
 * the caller connected). A catalog without the table has none.
 */
static void
load_schemas(const char *outbox, OutboxSchemas *entry)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1];
	uint64		n;

	entry->count = 0;
	entry->schemas = NULL;
	if (!OidIsValid(schemas_relid))
		return;
	args[0] = CStringGetTextDatum(outbox);
	if (SPI_execute_with_args("SELECT s.message_type, s.schema::pg_catalog.text FROM tide.outbox_schemas s"
							  " WHERE s.outbox_name OPERATOR(pg_catalog.=) $1",
							  1, argtypes, args, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the payload schemas of outbox \"%s\"", outbox);
	n = SPI_processed;
	if (n == 0)
		return;
	entry->schemas = MemoryContextAllocZero(schema_context, sizeof(TypedSchema) * n);
	for (uint64 i = 0; i < n; i++)
	{
		const char *draft;
		char	   *type = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);

		entry->schemas[i].message_type = MemoryContextStrdup(schema_context, type ? type : "");
		entry->schemas[i].compiled = compile_schema(SPI_getvalue(SPI_tuptable->vals[i],
																 SPI_tuptable->tupdesc, 2), &draft);
		entry->count = (int) i + 1;
	}
}

/* The outbox's schemas, from the hash or read now. */
static OutboxSchemas *
outbox_entry(const char *outbox, OutboxSchemas *unkept)
{
	OutboxSchemas *entry;
	bool		found;
	uint64		generation;

	prepare_cache();
	entry = hash_search(outbox_schemas, outbox, HASH_FIND, NULL);
	if (entry != NULL)
		return entry;
	generation = schemas_generation;
	strlcpy(unkept->outbox, outbox, NAMEDATALEN);
	load_schemas(outbox, unkept);
	/* an invalidation during the read: this publish uses what it read, once */
	if (generation != schemas_generation || outbox_schemas == NULL)
		return unkept;
	entry = hash_search(outbox_schemas, outbox, HASH_ENTER, &found);
	entry->count = unkept->count;
	entry->schemas = unkept->schemas;
	unkept->count = 0;
	return entry;
}

/* The value of the "type" header, or NULL. */
static char *
message_type(Jsonb *headers)
{
	JsonbValue	key;
	JsonbValue *value;

	if (headers == NULL || !JB_ROOT_IS_OBJECT(headers))
		return NULL;
	key.type = jbvString;
	key.val.string.val = "type";
	key.val.string.len = 4;
	value = findJsonbValueFromContainer(&headers->root, JB_FOBJECT, &key);
	if (value == NULL || value->type != jbvString)
		return NULL;
	return pnstrdup(value->val.string.val, value->val.string.len);
}

/* The schema for a message type: the type's own, else the default, else NULL. */
static TypedSchema *
schema_for(OutboxSchemas *entry, const char *type)
{
	TypedSchema *fallback = NULL;

	for (int i = 0; i < entry->count; i++)
	{
		if (type != NULL && type[0] != '\0' && strcmp(entry->schemas[i].message_type, type) == 0)
			return &entry->schemas[i];
		if (entry->schemas[i].message_type[0] == '\0')
			fallback = &entry->schemas[i];
	}
	return fallback;
}

/*
 * Checks the payloads about to be published to an outbox against its
 * schema: 22023 naming the first one that does not validate (by its index
 * from 1 in a batch), with the JSON pointer and the keyword. Called with SPI connected, before anything is written.
 */
void
TidePayloadSchemaCheck(const char *outbox, Jsonb *headers, Datum *payloads, int count, bool batch)
{
	OutboxSchemas unkept = {{0}, 0, NULL};
	OutboxSchemas *entry = outbox_entry(outbox, &unkept);
	TypedSchema *schema;
	char	   *type;

	if (entry->count == 0)
		return;
	type = message_type(headers);
	schema = schema_for(entry, type);
	for (int i = 0; schema != NULL && i < count; i++)
	{
		Jsonb	   *payload = DatumGetJsonbP(payloads[i]);
		TideJsonSchemaError err;

		/* read in place; a refusal's pointer and keyword from its text, once */
		if (routine->validate_jsonb(schema->compiled, payload, &err) ||
			routine->validate(schema->compiled,
							  JsonbToCString(NULL, &payload->root, VARSIZE(payload)), &err))
			continue;
		if (entry == &unkept)
			for (int j = 0; j < unkept.count; j++)
				routine->release(unkept.schemas[j].compiled);
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 batch
				 ? errmsg("payload %d does not match the schema of outbox \"%s\"", i + 1, outbox)
				 : errmsg("payload does not match the schema of outbox \"%s\"", outbox),
				 err.keyword[0]
				 ? errdetail("At JSON pointer \"%s\", keyword \"%s\" %s: %s", err.pointer, err.keyword,
							 schema->message_type[0] ? psprintf("of the schema of message type \"%s\"",
																schema->message_type)
							 : "of the outbox's schema",
							 err.message)
				 : errdetail("%s", err.message),
				 errhint("Publish a payload that validates against the schema; tide.outbox_status() lists the outbox's schemas.")));
	}
	for (int j = 0; j < unkept.count; j++)
		routine->release(unkept.schemas[j].compiled);
}
