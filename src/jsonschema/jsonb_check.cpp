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

/* Whether every string and property name in item is at most PATTERN_MAX_BYTES. */
static bool
jsonb_strings_short(const TideJsonbItem &item)
{
	if (item.kind == TIDE_JSONB_STRING)
		return item.size <= PATTERN_MAX_BYTES;
	if (item.kind == TIDE_JSONB_ARRAY)
		for (size_t i = 0; i < item.size; i++)
		{
			TideJsonbItem element;

			TideJsonbElement(&item, i, &element);
			if (!jsonb_strings_short(element))
				return false;
		}
	if (item.kind == TIDE_JSONB_OBJECT)
		for (size_t i = 0; i < item.size; i++)
		{
			TideJsonbItem key;
			TideJsonbItem value;

			TideJsonbMember(&item, i, &key, &value);
			if (key.size > PATTERN_MAX_BYTES || !jsonb_strings_short(value))
				return false;
		}
	return true;
}

/* Whether a jsonb (a detoasted Jsonb *) validates against a compiled schema. */
bool
validates_jsonb(CompiledSchema &schema, const void *jsonb)
{
	TideJsonbItem root;

	TideJsonbRoot(jsonb, &root);
	if (schema.has_pattern && !jsonb_strings_short(root))
		return false;
	return schema.validator.validate(schema.schema, JsonbAdapter(root), nullptr);
}

}								/* namespace tide_jsonschema */
