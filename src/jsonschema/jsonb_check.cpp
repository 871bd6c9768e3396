/*
 * jsonb_check.cpp
 *		Checking a jsonb payload against a compiled schema where it lies
 *		(jsonb_adapter.hpp): the publish path's check, which says only
 *		whether the payload validates. valijson then records no error and
 *		builds no message; the caller builds the DETAIL of a refusal through
 *		validate() (schema.cpp), from the payload's text, once.
 *
 * valijson's visitor keeps, for every property it checks, what only an
 * error report needs: a copy of its context with the property's name
 * added, and the name in a set of matched properties. JsonbVisitor checks
 * "properties" without them where the outcome cannot depend on them (no
 * patternProperties, additionalProperties absent, true or false): a
 * property is found, its value checked by a JsonbVisitor, and with
 * additionalProperties false the matched ones must be all the object's.
 * Every other keyword, and "properties" in every other form, is valijson's
 * own. That visitor is valijson 1.0's (Debian 12's): its template and
 * constructor changed in later versions, which check the jsonb with
 * valijson's own visitor throughout. TAP test 077 runs the
 * JSON-Schema-Test-Suite through this path and compares each outcome with
 * valijson's on the parsed text.
 */
#include <cstring>

#include "jsonb_adapter.hpp"
#include "schema.hpp"

namespace tide_jsonschema
{

#ifdef TIDE_VALIJSON_1_0

/*
 * valijson's visitor, with the lighter check of "properties" above. Like
 * valijson's, it keeps a reference to its target: the caller keeps the
 * target alive.
 */
class JsonbVisitor : public valijson::ValidationVisitor<JsonbAdapter>
{
public:
	JsonbVisitor(const JsonbAdapter &target, const valijson::Subschema *empty,
				 std::unordered_map<std::string, std::regex> &regexes)
		: ValidationVisitor(target, std::vector<std::string>(), true, nullptr, regexes),
		  m_target(target), m_empty(empty), m_regexes(regexes) {}

	bool visit(const valijson::constraints::PropertiesConstraint &constraint) override
	{
		const valijson::Subschema *additional = constraint.getAdditionalPropertiesSubschema();
		bool		plain = additional == nullptr || additional == m_empty;
		bool		validated = true;
		size_t		matched = 0;

		constraint.applyToPatternProperties([&plain](const auto &, const valijson::Subschema *) {
			plain = false;
			return false;
		});
		constraint.applyToProperties([&plain](const auto &name, const valijson::Subschema *) {
			/* valijson looks a name up to its first zero byte */
			plain = plain && std::strlen(name.c_str()) == name.size();
			return plain;
		});
		if (!plain)
			return ValidationVisitor::visit(constraint);
		if (!m_target.isObject())
			return true;

		const JsonbObject object = m_target.asObject();

		constraint.applyToProperties([&](const auto &name, const valijson::Subschema *subschema) {
			JsonbObject::const_iterator member = object.find(std::string(name.c_str(), name.size()));

			if (member == object.end())
				return true;
			matched++;
			const JsonbAdapter value = (*member).second;
			JsonbVisitor child(value, m_empty, m_regexes);

			validated = child.validateSchema(*subschema);
			return validated;
		});
		if (!validated)
			return false;
		return additional != nullptr || matched == object.size();
	}

private:
	const JsonbAdapter &m_target;
	const valijson::Subschema *m_empty;
	std::unordered_map<std::string, std::regex> &m_regexes;
};
#endif

/* Whether a jsonb (a detoasted Jsonb *) validates against a compiled schema. */
bool
validates_jsonb(CompiledSchema &schema, const void *jsonb)
{
	TideJsonbItem root;

	TideJsonbRoot(jsonb, &root);
	if (schema.has_pattern && !TideJsonbStringsAtMost(&root, PATTERN_MAX_BYTES))
		return false;

	const JsonbAdapter target(root);
#ifdef TIDE_VALIJSON_1_0
	JsonbVisitor visitor(target, schema.schema.emptySubschema(), schema.jsonb_regexes);

	return visitor.validateSchema(schema.schema);
#else
	return schema.validator.validate(schema.schema, target, nullptr);
#endif
}

}								/* namespace tide_jsonschema */
