/*
 * capture_options.c
 *		The options of a change capture (docs/capture.md#options): read from
 *		the jsonb given to tide.outbox_capture, every mistake refused with
 *		22023 before anything is written, and written back as the normalised
 *		text that the catalog row and the triggers' argument hold.
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"

#include "capture.h"

const char *const CaptureOpNames[CAPTURE_OPS] = {"insert", "update", "delete"};

#define CAPTURE_OPTION_KEYS \
	"\"operations\", \"key\", \"ignore\", \"ignore_changes_of\", \"when\", \"old_row\", \"type\" and \"truncate\""

/* Raises the 22023 of an option whose value is not what it must be. */
static void
refuse_option(const char *option, const char *must_be)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("capture option \"%s\" must be %s", option, must_be),
			 errhint("See the options of tide.outbox_capture in docs/capture.md.")));
}

/* The text of a JSON string value, or NULL when the value is not a string. */
static char *
string_of(JsonbValue *value)
{
	if (value->type != jbvString)
		return NULL;
	return pnstrdup(value->val.string.val, value->val.string.len);
}

/* A non-empty string option. */
static char *
string_option(const char *option, JsonbValue *value)
{
	char	   *text = string_of(value);

	if (text == NULL || text[0] == '\0')
		refuse_option(option, "a non-empty string");
	return text;
}

/* An array of non-empty strings, as a List of char *; may be empty. */
static List *
names_option(const char *option, JsonbValue *value)
{
	JsonbIterator *it;
	JsonbValue	elem;
	JsonbIteratorToken token;
	List	   *names = NIL;

	if (value->type != jbvBinary || !JsonContainerIsArray(value->val.binary.data))
		refuse_option(option, "an array of column names");
	it = JsonbIteratorInit(value->val.binary.data);
	while ((token = JsonbIteratorNext(&it, &elem, true)) != WJB_DONE)
	{
		char	   *name;

		if (token != WJB_ELEM)
			continue;
		name = string_of(&elem);
		if (name == NULL || name[0] == '\0')
			refuse_option(option, "an array of column names");
		names = lappend(names, name);
	}
	return names;
}

/* "operations": a non-empty subset of insert, update and delete. */
static void
operations_option(JsonbValue *value, bool *ops)
{
	List	   *names = names_option("operations", value);
	ListCell   *lc;

	if (names == NIL)
		refuse_option("operations", "a non-empty array of \"insert\", \"update\" and \"delete\"");
	foreach(lc, names)
	{
		int			op;

		for (op = 0; op < CAPTURE_OPS; op++)
			if (strcmp(lfirst(lc), CaptureOpNames[op]) == 0)
				break;
		if (op == CAPTURE_OPS)
			refuse_option("operations", "a non-empty array of \"insert\", \"update\" and \"delete\"");
		ops[op] = true;
	}
}

/* One option, by its name. */
static void
read_option(const char *name, JsonbValue *value, CaptureOptions *out)
{
	if (strcmp(name, "operations") == 0)
	{
		memset(out->ops, 0, sizeof(out->ops));
		operations_option(value, out->ops);
	}
	else if (strcmp(name, "key") == 0)
	{
		out->key = names_option(name, value);
		if (out->key == NIL)
			refuse_option(name, "a non-empty array of column names");
	}
	else if (strcmp(name, "ignore") == 0)
		out->ignore = names_option(name, value);
	else if (strcmp(name, "ignore_changes_of") == 0)
		out->ignore_changes_of = names_option(name, value);
	else if (strcmp(name, "when") == 0)
		out->when = value->type == jbvNull ? NULL : string_option(name, value);
	else if (strcmp(name, "old_row") == 0)
	{
		if (value->type != jbvBool)
			refuse_option(name, "true or false");
		out->old_row = value->val.boolean;
	}
	else if (strcmp(name, "type") == 0)
		out->type = value->type == jbvNull ? NULL : string_option(name, value);
	else if (strcmp(name, "truncate") == 0)
	{
		char	   *text = string_of(value);

		if (text == NULL || (strcmp(text, "refuse") != 0 && strcmp(text, "publish") != 0))
			refuse_option(name, "\"refuse\" or \"publish\"");
		out->truncate_publish = strcmp(text, "publish") == 0;
	}
	else
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unknown capture option \"%s\"", name),
				 errhint("The options are " CAPTURE_OPTION_KEYS ".")));
}

/*
 * Reads `options` (NULL: none) into `out`, the defaults filled in but for
 * "key", left NIL when not given (the caller knows the primary key).
 */
void
CaptureParseOptions(Jsonb *options, CaptureOptions *out)
{
	JsonbIterator *it;
	JsonbValue	value;
	JsonbIteratorToken token;
	char	   *name = NULL;

	memset(out, 0, sizeof(*out));
	for (int op = 0; op < CAPTURE_OPS; op++)
		out->ops[op] = true;
	if (options == NULL)
		return;
	if (!JB_ROOT_IS_OBJECT(options))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("capture options must be a JSON object"),
				 errhint("Pass an object such as {\"operations\": [\"insert\", \"update\"]}, or {} for the defaults.")));
	it = JsonbIteratorInit(&options->root);
	while ((token = JsonbIteratorNext(&it, &value, true)) != WJB_DONE)
	{
		if (token == WJB_KEY)
			name = pnstrdup(value.val.string.val, value.val.string.len);
		else if (token == WJB_VALUE)
			read_option(name, &value, out);
	}
}

/* Appends a JSON array of the names. */
static void
append_names(StringInfo buf, List *names)
{
	ListCell   *lc;

	appendStringInfoChar(buf, '[');
	foreach(lc, names)
	{
		if (lc != list_head(names))
			appendStringInfoString(buf, ", ");
		escape_json(buf, lfirst(lc));
	}
	appendStringInfoChar(buf, ']');
}

/* Appends a JSON string, or null. */
static void
append_string_or_null(StringInfo buf, const char *text)
{
	if (text == NULL)
		appendStringInfoString(buf, "null");
	else
		escape_json(buf, text);
}

/* The options as a JSON object with every key, in a fixed order. */
char *
CaptureOptionsText(const CaptureOptions *options)
{
	StringInfoData buf;
	bool		first = true;

	initStringInfo(&buf);
	appendStringInfoString(&buf, "{\"operations\": [");
	for (int op = 0; op < CAPTURE_OPS; op++)
	{
		if (!options->ops[op])
			continue;
		appendStringInfo(&buf, "%s\"%s\"", first ? "" : ", ", CaptureOpNames[op]);
		first = false;
	}
	appendStringInfoString(&buf, "], \"key\": ");
	append_names(&buf, options->key);
	appendStringInfoString(&buf, ", \"ignore\": ");
	append_names(&buf, options->ignore);
	appendStringInfoString(&buf, ", \"ignore_changes_of\": ");
	append_names(&buf, options->ignore_changes_of);
	appendStringInfoString(&buf, ", \"when\": ");
	append_string_or_null(&buf, options->when);
	appendStringInfo(&buf, ", \"old_row\": %s, \"type\": ", options->old_row ? "true" : "false");
	append_string_or_null(&buf, options->type);
	appendStringInfo(&buf, ", \"truncate\": \"%s\"}", options->truncate_publish ? "publish" : "refuse");
	return buf.data;
}
