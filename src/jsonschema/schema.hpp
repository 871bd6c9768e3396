/*
 * schema.hpp
 *		JSON Schema compiled with valijson, in C++: what the module's C
 *		boundary (module.cpp), its check of jsonb (jsonb_check.cpp) and the
 *		conformance runner (test/jsonschema/conformance.cpp) share.
 */
#ifndef TIDE_JSONSCHEMA_SCHEMA_HPP
#define TIDE_JSONSCHEMA_SCHEMA_HPP

#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include <valijson/schema.hpp>
#include <valijson/validator.hpp>

namespace tide_jsonschema
{

/* A schema this module refuses: not valid, or using what it cannot check. */
class SchemaRefused : public std::runtime_error
{
public:
	explicit SchemaRefused(const std::string &what) : std::runtime_error(what) {}
};

/* Where a document failed: its JSON pointer and the schema keyword. */
struct Failure
{
	std::string pointer;
	std::string keyword;
	std::string message;
};

/* The longest string a schema with a pattern checks (schema.cpp says why). */
static const size_t PATTERN_MAX_BYTES = 1000;

/* A schema compiled for valijson, and what the checks need to know of it. */
class CompiledSchema
{
public:
	bool		draft2020 = false;
	bool		has_pattern = false;	/* "pattern" or "patternProperties" anywhere */
	nlohmann::json source;		/* the document valijson's schema was read from */
	valijson::Schema schema;
	valijson::Validator validator;
#ifdef TIDE_VALIJSON_1_0
	/* the patterns compiled by the jsonb check (jsonb_check.cpp) */
	std::unordered_map<std::string, std::regex> jsonb_regexes;
#endif
};

/* Deletes a compiled schema (the type is complete only in schema.cpp). */
void destroy(CompiledSchema *schema);

struct CompiledSchemaDeleter
{
	void operator()(CompiledSchema *schema) const { destroy(schema); }
};

typedef std::unique_ptr<CompiledSchema, CompiledSchemaDeleter> SchemaPtr;

/*
 * Compiles a schema, of draft 2020-12 or draft 7 as its "$schema" says,
 * else as default_2020 says; throws SchemaRefused (or anything valijson
 * throws).
 */
SchemaPtr compile(const nlohmann::json &schema, bool default_2020);

/* The draft a compiled schema follows: "draft-07" or "2020-12". */
const char *draft_of(const CompiledSchema &schema);

/* Whether document validates; fills *failure when it does not. */
bool validate(CompiledSchema &schema, const nlohmann::json &document, Failure *failure);

/*
 * Whether a jsonb (a detoasted Jsonb *) validates, read in place: the
 * module's publish check (jsonb_check.cpp), which says no more.
 */
bool validates_jsonb(CompiledSchema &schema, const void *jsonb);

}								/* namespace tide_jsonschema */

#endif							/* TIDE_JSONSCHEMA_SCHEMA_HPP */
