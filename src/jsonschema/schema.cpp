/*
 * schema.cpp
 *		Compiling and checking JSON Schema with valijson.
 *
 * valijson 1.0 (Debian's libvalijson-dev) implements drafts 4 and 7. A
 * draft 2020-12 schema is checked by the same engine after three phases:
 *
 * 1. The draft: from "$schema" at the root, the caller's default when
 *	  absent (pg_tide's: draft 2020-12); any other draft is refused.
 * 2. For 2020-12, a walk of every subschema refuses the keywords the engine
 *	  cannot check (unevaluatedProperties, unevaluatedItems, $dynamicRef,
 *	  $dynamicAnchor, $anchor, minContains, maxContains, and "items" as an
 *	  array, which 2020-12 no longer allows): a schema the engine would
 *	  silently half-check is never accepted.
 * 3. The same walk rewrites what 2020-12 renamed into its draft 7 form:
 *	  prefixItems and items become items and additionalItems,
 *	  dependentRequired and dependentSchemas become dependencies, and a
 *	  $ref with other keywords beside it moves into an allOf (in 2020-12 the
 *	  other keywords apply too; in draft 7 they are ignored).
 *
 * Remote references are never fetched: a schema that needs one is refused.
 *
 * valijson matches "pattern" and "patternProperties" with std::regex, whose
 * backtracking recurses once per character: a string of some 20,000
 * characters exhausts a backend's stack. A schema with either keyword
 * therefore refuses a document holding a string (or a property name)
 * longer than PATTERN_MAX_BYTES before the engine sees it.
 */
#include <cstring>
#include <vector>

#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validation_results.hpp>

#include "schema.hpp"

namespace tide_jsonschema
{

static const char *const DRAFT7_URIS[] = {
	"http://json-schema.org/draft-07/schema#",
	"http://json-schema.org/draft-07/schema",
	"https://json-schema.org/draft-07/schema#",
	"https://json-schema.org/draft-07/schema",
	nullptr
};

static const char *const DRAFT2020_URIS[] = {
	"https://json-schema.org/draft/2020-12/schema",
	"https://json-schema.org/draft/2020-12/schema#",
	nullptr
};

/* 2020-12 keywords the engine does not implement (phase 2). */
static const char *const UNSUPPORTED_2020[] = {
	"unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$dynamicAnchor",
	"$recursiveRef", "$recursiveAnchor", "$anchor", "minContains", "maxContains",
	nullptr
};

/* Whether s is one of the null-terminated list. */
static bool
listed(const std::string &s, const char *const *list)
{
	for (; *list; list++)
		if (s == *list)
			return true;
	return false;
}

/* Whether the root's "$schema" names draft 2020-12 (phase 1). */
static bool
is_draft2020(const nlohmann::json &schema, bool default_2020)
{
	if (!schema.is_object() || !schema.contains("$schema"))
		return default_2020;
	const nlohmann::json &uri = schema["$schema"];

	if (!uri.is_string())
		throw SchemaRefused("\"$schema\" must be a string.");
	if (listed(uri.get<std::string>(), DRAFT2020_URIS))
		return true;
	if (listed(uri.get<std::string>(), DRAFT7_URIS))
		return false;
	throw SchemaRefused("\"$schema\" names a draft other than 2020-12 and draft-07: " +
						uri.get<std::string>() + ".");
}

static void rewrite_2020(nlohmann::json &schema);

/* Rewrites each value of a member that maps names to subschemas. */
static void
rewrite_map(nlohmann::json &schema, const char *keyword)
{
	if (schema.contains(keyword) && schema[keyword].is_object())
		for (auto &member : schema[keyword].items())
			rewrite_2020(member.value());
}

/* Rewrites a member that is one subschema or an array of them. */
static void
rewrite_member(nlohmann::json &schema, const char *keyword)
{
	if (!schema.contains(keyword))
		return;
	nlohmann::json &value = schema[keyword];

	if (value.is_array())
		for (auto &element : value)
			rewrite_2020(element);
	else
		rewrite_2020(value);
}

/* Phases 2 and 3 on one subschema and, recursively, those it holds. */
static void
rewrite_2020(nlohmann::json &schema)
{
	if (!schema.is_object())
		return;
	for (auto &member : schema.items())
		if (listed(member.key(), UNSUPPORTED_2020))
			throw SchemaRefused("Keyword \"" + member.key() + "\" is not supported.");
	if (schema.contains("items") && schema["items"].is_array())
		throw SchemaRefused("\"items\" must be a schema in draft 2020-12 (\"prefixItems\" makes a tuple).");

	for (const char *keyword : {"properties", "patternProperties", "$defs", "definitions",
			"dependentSchemas"})
		rewrite_map(schema, keyword);
	for (const char *keyword : {"items", "prefixItems", "allOf", "anyOf", "oneOf", "not", "if",
			"then", "else", "additionalProperties", "contains", "propertyNames"})
		rewrite_member(schema, keyword);

	if (schema.contains("prefixItems"))
	{
		nlohmann::json prefix = schema["prefixItems"];

		schema.erase("prefixItems");
		if (schema.contains("items"))
			schema["additionalItems"] = schema["items"];
		schema["items"] = prefix;
	}
	for (const char *keyword : {"dependentRequired", "dependentSchemas"})
	{
		if (!schema.contains(keyword))
			continue;
		if (!schema[keyword].is_object())
			throw SchemaRefused(std::string("\"") + keyword + "\" must be an object.");
		nlohmann::json &dependencies = schema["dependencies"];

		for (auto &member : schema[keyword].items())
		{
			if (dependencies.contains(member.key()))
				dependencies[member.key()] = {{"allOf", {dependencies[member.key()], member.value()}}};
			else
				dependencies[member.key()] = member.value();
			/* an array in allOf is not a schema: the list becomes "required" */
			if (dependencies[member.key()].contains("allOf"))
				for (auto &part : dependencies[member.key()]["allOf"])
					if (part.is_array())
						part = {{"required", part}};
		}
		schema.erase(keyword);
	}
	if (schema.contains("$ref") && schema.size() > 1)
	{
		nlohmann::json ref = {{"$ref", schema["$ref"]}};

		schema.erase("$ref");
		if (schema.contains("allOf") && schema["allOf"].is_array())
			schema["allOf"].push_back(ref);
		else if (schema.contains("allOf"))
			throw SchemaRefused("\"allOf\" must be an array.");
		else
			schema["allOf"] = nlohmann::json::array({ref});
	}
}

/* Whether a member named "pattern" or "patternProperties" is anywhere in value. */
static bool
mentions_pattern(const nlohmann::json &value)
{
	if (value.is_object())
		for (auto &member : value.items())
			if (member.key() == "pattern" || member.key() == "patternProperties" ||
				mentions_pattern(member.value()))
				return true;
	if (value.is_array())
		for (auto &element : value)
			if (mentions_pattern(element))
				return true;
	return false;
}

static std::string pointer_token(const std::string &name);

/*
 * Finds a string or property name longer than PATTERN_MAX_BYTES in value
 * (at pointer); false, with *failure, when there is one.
 */
static bool
strings_short(const nlohmann::json &value, const std::string &pointer, Failure *failure)
{
	if (value.is_string() && value.get_ref<const std::string &>().size() > PATTERN_MAX_BYTES)
	{
		failure->pointer = pointer;
		failure->keyword = "pattern";
		failure->message = "A string of " + std::to_string(value.get_ref<const std::string &>().size()) +
			" bytes is longer than " + std::to_string(PATTERN_MAX_BYTES) +
			", the most a schema with \"pattern\" or \"patternProperties\" checks.";
		return false;
	}
	if (value.is_object())
		for (auto &member : value.items())
		{
			std::string at = pointer + "/" + pointer_token(member.key());

			if (member.key().size() > PATTERN_MAX_BYTES)
			{
				failure->pointer = at;
				failure->keyword = "patternProperties";
				failure->message = "A property name of " + std::to_string(member.key().size()) +
					" bytes is longer than " + std::to_string(PATTERN_MAX_BYTES) +
					", the most a schema with \"pattern\" or \"patternProperties\" checks.";
				return false;
			}
			if (!strings_short(member.value(), at, failure))
				return false;
		}
	if (value.is_array())
		for (size_t i = 0; i < value.size(); i++)
			if (!strings_short(value[i], pointer + "/" + std::to_string(i), failure))
				return false;
	return true;
}

/* Compiles a schema (see the top of the file). */
SchemaPtr
compile(const nlohmann::json &schema, bool default_2020)
{
	SchemaPtr	compiled(new CompiledSchema());

	if (!schema.is_object() && !schema.is_boolean())
		throw SchemaRefused("A schema must be a JSON object or a boolean.");
	compiled->source = schema;
	compiled->draft2020 = is_draft2020(schema, default_2020);
	if (compiled->draft2020)
		rewrite_2020(compiled->source);
	compiled->has_pattern = mentions_pattern(compiled->source);

	valijson::SchemaParser parser(valijson::SchemaParser::kDraft7);
	valijson::adapters::NlohmannJsonAdapter adapter(compiled->source);

	parser.populateSchema(adapter, compiled->schema);
	return compiled;
}

/* The draft a compiled schema follows. */
const char *
draft_of(const CompiledSchema &schema)
{
	return schema.draft2020 ? "2020-12" : "draft-07";
}

/* valijson's error descriptions, by what they start with or hold, and the keyword. */
static const struct
{
	const char *text;
	const char *keyword;
}			KEYWORDS[] = {
	{"Value type not permitted by 'type'", "type"},
	{"Missing required property", "required"},
	{"Failed to match expected value set by 'const'", "const"},
	{"Failed to match against any enum", "enum"},
	{"'contains' constraint", "contains"},
	{"Array contains more items than allowed", "additionalItems"},
	{"Expected number less than or equal", "maximum"},
	{"Expected number less than", "exclusiveMaximum"},
	{"Expected number greater than or equal", "minimum"},
	{"Expected number greater than", "exclusiveMinimum"},
	{"Array should contain no more than", "maxItems"},
	{"Array should contain no fewer than", "minItems"},
	{"String should be no more than", "maxLength"},
	{"String should be no fewer than", "minLength"},
	{"Object should have no more than", "maxProperties"},
	{"Object should have no fewer than", "minProperties"},
	{"multiple of", "multipleOf"},
	{"multipleOf", "multipleOf"},
	{"'not' constraint", "not"},
	{"oneOf", "oneOf"},
	{"exactly one child schema", "oneOf"},
	{"anyOf", "anyOf"},
	{"if-then-else", "if"},
	{"regex specified by 'pattern'", "pattern"},
	{"schema associated with pattern", "patternProperties"},
	{"'properties' or 'additionalProperties'", "additionalProperties"},
	{"additional properties schema", "additionalProperties"},
	{"schema associated with property name", "properties"},
	{"Missing dependency", "dependencies"},
	{"dependent schema", "dependencies"},
	{"String should be a valid", "format"},
	{"Elements at indexes", "uniqueItems"},
	{"Failed to validate item #", "items"},
	{"Cannot validate item #", "items"},
	{"child schema #", "allOf"},
	{nullptr, nullptr}
};

/* The keyword of a valijson error description ("" when unknown). */
static std::string
keyword_of(const std::string &description, bool draft2020)
{
	for (int i = 0; KEYWORDS[i].text; i++)
		if (description.find(KEYWORDS[i].text) != std::string::npos)
		{
			std::string keyword = KEYWORDS[i].keyword;

			/* the names 2020-12 gives what phase 3 rewrote */
			if (draft2020 && keyword == "dependencies")
				return description.find("Missing") == 0 ? "dependentRequired" : "dependentSchemas";
			if (draft2020 && keyword == "additionalItems")
				return "items";
			return keyword;
		}
	return "";
}

/* One JSON pointer token (RFC 6901): ~ and / escaped. */
static std::string
pointer_token(const std::string &name)
{
	std::string token;

	for (char c : name)
		if (c == '~')
			token += "~0";
		else if (c == '/')
			token += "~1";
		else
			token += c;
	return token;
}

/*
 * The JSON pointer of valijson's context: "<root>", then "[name]" or
 * "[index]" each (valijson 1.0), or "[\"name\"]" for a property (1.1 on).
 */
static std::string
pointer_of(const std::vector<std::string> &context)
{
	std::string pointer;

	for (const std::string &part : context)
		if (part.size() >= 2 && part.front() == '[' && part.back() == ']')
		{
			std::string token = part.substr(1, part.size() - 2);

			if (token.size() >= 2 && token.front() == '"' && token.back() == '"')
				token = token.substr(1, token.size() - 2);
			pointer += "/" + pointer_token(token);
		}
	return pointer;
}

/* Whether document validates; on failure, the first (innermost) error. */
bool
validate(CompiledSchema &schema, const nlohmann::json &document, Failure *failure)
{
	valijson::adapters::NlohmannJsonAdapter target(document);
	valijson::ValidationResults results;

	if (schema.has_pattern && !strings_short(document, "", failure))
		return false;
	/* the common case stops at nothing and records nothing */
	if (schema.validator.validate(schema.schema, target, nullptr))
		return true;
	schema.validator.validate(schema.schema, target, &results);
	failure->pointer.clear();
	failure->keyword.clear();
	failure->message = "The payload does not validate.";
	if (results.numErrors() > 0)
	{
		const valijson::ValidationResults::Error &error = *results.begin();
		std::string::size_type quote;

		failure->pointer = pointer_of(error.context);
		failure->keyword = keyword_of(error.description, schema.draft2020);
		failure->message = error.description;
		/* the property additionalProperties refuses is named in the text alone */
		if (failure->keyword == "additionalProperties" &&
			(quote = error.description.rfind("'", error.description.size() - 3)) != std::string::npos &&
			error.description.size() >= quote + 3)
			failure->pointer += "/" + pointer_token(error.description.substr(quote + 1, error.description.size() - quote - 3));
	}
	return false;
}

/* Deletes a compiled schema. */
void
destroy(CompiledSchema *schema)
{
	delete schema;
}

}								/* namespace tide_jsonschema */
