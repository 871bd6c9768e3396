/*
 * jsonb_check.cpp
 *		Checking a jsonb payload against a compiled schema where it lies
 *		(jsonb_adapter.hpp): the publish path's check, which says only
 *		whether the payload validates. valijson then records no error and
 *		builds no message; the caller builds the DETAIL of a refusal through
 *		validate() (schema.cpp), from the payload's text, once.
 */
#include "jsonb_adapter.hpp"
#include "schema.hpp"

namespace tide_jsonschema
{

/* Whether a jsonb (a detoasted Jsonb *) validates against a compiled schema. */
bool
validates_jsonb(CompiledSchema &schema, const void *jsonb)
{
	TideJsonbItem root;

	TideJsonbRoot(jsonb, &root);
	if (schema.has_pattern && !TideJsonbStringsAtMost(&root, PATTERN_MAX_BYTES))
		return false;
	return schema.validator.validate(schema.schema, JsonbAdapter(root), nullptr);
}

}								/* namespace tide_jsonschema */
