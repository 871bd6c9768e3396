/*
 * module.cpp
 *		The C boundary of pg_tide-jsonschema.so (jsonschema.h): each function
 *		catches every C++ exception and reports it in a TideJsonSchemaError,
 *		so that none crosses into PostgreSQL's frames.
 */
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

#include "jsonschema.h"
#include "schema.hpp"

using tide_jsonschema::CompiledSchema;

/* Copies s into a fixed field, cut to fit. */
static void
set_field(char *field, size_t size, const std::string &s)
{
	snprintf(field, size, "%s", s.c_str());
}

/* Empties an error. */
static void
clear_error(TideJsonSchemaError *err)
{
	err->message[0] = '\0';
	err->pointer[0] = '\0';
	err->keyword[0] = '\0';
}

/* Puts the exception being handled into err->message (called in a catch block). */
static void
report_exception(TideJsonSchemaError *err)
{
	try
	{
		throw;
	}
	catch (const std::bad_alloc &)
	{
		set_field(err->message, sizeof(err->message), "Out of memory.");
	}
	catch (const std::exception &e)
	{
		set_field(err->message, sizeof(err->message), e.what());
	}
	catch (...)
	{
		set_field(err->message, sizeof(err->message), "Unknown error.");
	}
}

/* Compiles a schema given as JSON text; NULL with err->message when refused. */
static void *
module_compile(const char *schema_json, const char **draft, TideJsonSchemaError *err)
{
	clear_error(err);
	try
	{
		tide_jsonschema::SchemaPtr compiled =
			tide_jsonschema::compile(nlohmann::json::parse(schema_json), true);

		*draft = tide_jsonschema::draft_of(*compiled);
		return compiled.release();
	}
	catch (...)
	{
		report_exception(err);
	}
	return nullptr;
}

/* Whether a JSON text validates against a compiled schema. */
static bool
module_validate(void *schema, const char *document_json, TideJsonSchemaError *err)
{
	clear_error(err);
	try
	{
		tide_jsonschema::Failure failure;

		if (tide_jsonschema::validate(*static_cast<CompiledSchema *>(schema),
									  nlohmann::json::parse(document_json), &failure))
			return true;
		set_field(err->message, sizeof(err->message), failure.message);
		set_field(err->pointer, sizeof(err->pointer), failure.pointer);
		set_field(err->keyword, sizeof(err->keyword), failure.keyword);
	}
	catch (...)
	{
		report_exception(err);
	}
	return false;
}

/* Whether a jsonb validates against a compiled schema, read in place. */
static bool
module_validate_jsonb(void *schema, const void *jsonb, TideJsonSchemaError *err)
{
	clear_error(err);
	try
	{
		return tide_jsonschema::validates_jsonb(*static_cast<CompiledSchema *>(schema), jsonb);
	}
	catch (...)
	{
		report_exception(err);
	}
	return false;
}

/* Frees a compiled schema. */
static void
module_release(void *schema)
{
	tide_jsonschema::destroy(static_cast<CompiledSchema *>(schema));
}

static const TideJsonSchemaRoutine routine = {
	module_compile,
	module_validate,
	module_release,
	module_validate_jsonb,
};

/* The init symbol: the module's functions. */
extern "C" const TideJsonSchemaRoutine *
pg_tide_jsonschema_routine(void)
{
	return &routine;
}
