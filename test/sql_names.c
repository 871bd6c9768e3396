/*
 * sql_names.c
 *		Checks SQL statements for names that the search_path resolves: a
 *		function or operator named without its schema, a table without its
 *		schema (other than a WITH query's name), and, with --types, a type
 *		without its schema. test/t/023_sql_qualified.pl feeds it every SQL
 *		statement of the extension's C code.
 *
 * Input on stdin: records separated by NUL bytes, each "<label>\n<sql>".
 * It parses each statement with PostgreSQL's own parser (libpg_query) and
 * walks the raw parse tree, where a name is still as it was written:
 *
 * - FuncCall: funcname must have two parts (pg_catalog.count). Calls the
 *	 grammar makes itself (EXTRACT, POSITION, ...) already say pg_catalog.
 * - A_Expr: the operator name must have two parts, OPERATOR(pg_catalog.=).
 *	 IS [NOT] DISTINCT FROM, NULLIF, IN (list), LIKE and BETWEEN name an
 *	 operator that cannot be qualified there, so they are reported too.
 * - SubLink: "x IN (SELECT ...)" and "x = ANY (SELECT ...)" need a
 *	 qualified operator (OPERATOR(pg_catalog.=) ANY (SELECT ...)).
 * - CaseExpr with an argument (CASE x WHEN ...) compares with "=".
 * - RangeVar: a schema, unless it names a WITH query of the statement.
 * - TypeName (--types): a schema; keywords such as bigint already have one.
 *
 * Prints one line per finding and exits 1 when there is any (2 when a
 * statement does not parse: every statement must be checked whole).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <pg_query.h>

static bool check_types = false;
static int	findings = 0;

/* Reports one finding for the statement labelled `label`. */
static void
report(const char *label, const char *what, const char *name)
{
	printf("%s: %s %s\n", label, what, name);
	findings++;
}

/* The name list (a list of String nodes) as "a.b", and its length. */
static int
name_list(const cJSON *list, char *buf, size_t size)
{
	const cJSON *item;
	int			n = 0;

	buf[0] = '\0';
	cJSON_ArrayForEach(item, list)
	{
		const cJSON *sval = cJSON_GetObjectItem(cJSON_GetObjectItem(item, "String"), "sval");

		if (n++ > 0)
			strncat(buf, ".", size - strlen(buf) - 1);
		strncat(buf, cJSON_IsString(sval) ? sval->valuestring : "?", size - strlen(buf) - 1);
	}
	return n;
}

/* Collects the names of the statement's WITH queries into ctes. */
static void
collect_ctes(const cJSON *node, cJSON *ctes)
{
	const cJSON *child;

	if (node == NULL)
		return;
	if (cJSON_IsObject(node))
	{
		const cJSON *cte = cJSON_GetObjectItem(node, "CommonTableExpr");
		const cJSON *name = cte ? cJSON_GetObjectItem(cte, "ctename") : NULL;

		if (cJSON_IsString(name))
			cJSON_AddItemToArray(ctes, cJSON_CreateString(name->valuestring));
	}
	cJSON_ArrayForEach(child, node)
		collect_ctes(child, ctes);
}

/* Whether name is one of the WITH query names. */
static bool
is_cte(const cJSON *ctes, const char *name)
{
	const cJSON *c;

	cJSON_ArrayForEach(c, ctes)
		if (strcmp(c->valuestring, name) == 0)
			return true;
	return false;
}

/* Checks one node of the parse tree and everything below it. */
static void
walk(const cJSON *node, const char *label, const cJSON *ctes)
{
	const cJSON *child;
	char		name[256];

	if (node == NULL)
		return;
	if (cJSON_IsObject(node))
	{
		const cJSON *x;

		if ((x = cJSON_GetObjectItem(node, "FuncCall")) != NULL &&
			name_list(cJSON_GetObjectItem(x, "funcname"), name, sizeof(name)) < 2)
			report(label, "unqualified function", name);
		if ((x = cJSON_GetObjectItem(node, "A_Expr")) != NULL)
		{
			const cJSON *kind = cJSON_GetObjectItem(x, "kind");

			bool		plain = cJSON_IsString(kind) &&
				(strcmp(kind->valuestring, "AEXPR_OP") == 0 ||
				 strcmp(kind->valuestring, "AEXPR_OP_ANY") == 0 ||
				 strcmp(kind->valuestring, "AEXPR_OP_ALL") == 0);

			if (name_list(cJSON_GetObjectItem(x, "name"), name, sizeof(name)) < 2)
				report(label, plain ? "unqualified operator" :
					   "construct whose operator cannot be qualified:",
					   plain ? name : cJSON_IsString(kind) ? kind->valuestring : "?");
		}
		if ((x = cJSON_GetObjectItem(node, "SubLink")) != NULL)
		{
			const cJSON *type = cJSON_GetObjectItem(x, "subLinkType");

			if (cJSON_IsString(type) &&
				(strcmp(type->valuestring, "ANY_SUBLINK") == 0 ||
				 strcmp(type->valuestring, "ALL_SUBLINK") == 0) &&
				name_list(cJSON_GetObjectItem(x, "operName"), name, sizeof(name)) < 2)
				report(label, "unqualified operator in IN/ANY/ALL (subquery)",
					   name[0] ? name : "=");
		}
		if ((x = cJSON_GetObjectItem(node, "CaseExpr")) != NULL && cJSON_GetObjectItem(x, "arg"))
			report(label, "unqualified operator", "= in CASE x WHEN");
		if ((x = cJSON_GetObjectItem(node, "RangeVar")) != NULL &&
			!cJSON_GetObjectItem(x, "schemaname"))
		{
			const cJSON *rel = cJSON_GetObjectItem(x, "relname");

			if (!cJSON_IsString(rel) || !is_cte(ctes, rel->valuestring))
				report(label, "unqualified table", cJSON_IsString(rel) ? rel->valuestring : "?");
		}
		if (check_types && (x = cJSON_GetObjectItem(node, "TypeName")) != NULL &&
			name_list(cJSON_GetObjectItem(x, "names"), name, sizeof(name)) < 2)
			report(label, "unqualified type", name);
	}
	cJSON_ArrayForEach(child, node)
	{
		/* FOR UPDATE OF x names an item of the FROM list, not a table */
		if (child->string && strcmp(child->string, "lockedRels") == 0)
			continue;
		walk(child, label, ctes);
	}
}

/* Parses and checks one "<label>\n<sql>" record; false when it does not parse. */
static bool
check_record(char *record)
{
	char	   *nl = strchr(record, '\n');
	const char *label = record;
	const char *sql;
	PgQueryParseResult r;
	bool		ok = true;

	if (nl == NULL)
		return true;
	*nl = '\0';
	sql = nl + 1;
	r = pg_query_parse(sql);
	if (r.error)
	{
		printf("%s: does not parse (%s): %s\n", label, r.error->message, sql);
		ok = false;
	}
	else
	{
		cJSON	   *tree = cJSON_Parse(r.parse_tree);
		cJSON	   *ctes = cJSON_CreateArray();

		collect_ctes(tree, ctes);
		walk(tree, label, ctes);
		cJSON_Delete(ctes);
		cJSON_Delete(tree);
	}
	pg_query_free_parse_result(r);
	return ok;
}

int
main(int argc, char **argv)
{
	char	   *input = NULL;
	size_t		len = 0;
	size_t		size = 0;
	size_t		pos = 0;
	int			statements = 0;
	bool		all_parsed = true;
	size_t		n;

	check_types = argc > 1 && strcmp(argv[1], "--types") == 0;
	do
	{
		if (len + 4096 + 1 > size)
		{
			size = (size + 4096) * 2;
			input = realloc(input, size);
			if (input == NULL)
				return 3;
		}
		n = fread(input + len, 1, 4096, stdin);
		len += n;
	} while (n > 0);
	input[len] = '\0';

	while (pos < len)
	{
		char	   *record = input + pos;

		pos += strlen(record) + 1;
		if (record[0] == '\0')
			continue;
		statements++;
		if (!check_record(record))
			all_parsed = false;
	}
	printf("checked %d statements, %d findings\n", statements, findings);
	free(input);
	return !all_parsed ? 2 : findings > 0 ? 1 : 0;
}
