/*
 * filter.c
 *		Routing: a pipeline's "types" (patterns matched against the "type"
 *		header of a message) and "filter" (a content filter on the payload
 *		and headers, MongoDB-like). The core (compiling and evaluating) is
 *		plain C on cJSON; below it, under #ifndef RELAY_FILTER_STANDALONE,
 *		the SQL-callable functions tide._relay_routing_check and
 *		tide.relay_filter_matches.
 *
 * Semantics (docs/relay.md#routing):
 * - types: a message passes when its type matches one pattern: "*" (every
 *	 message, with a type or without), "prefix.*" (every type that starts
 *	 with "prefix." and goes on: any depth) or an exact type. The type is
 *	 the string value of the headers' "type" key; a message without one
 *	 matches only "*".
 * - filter: an object; its keys are ANDed. A key is a field path (dots
 *	 separate segments; a segment of digits indexes an array; "$headers."
 *	 addresses the headers instead of the payload) or $and/$or (non-empty
 *	 arrays of filters) or $not (a filter). A field's value is either an
 *	 object of operators ({"$gt": 5}, ANDed) or any other JSON value (deep
 *	 equality). Numbers compare as doubles, strings bytewise (UTF-8 code
 *	 point order); a comparison of different JSON types, or with a missing
 *	 field, does not match, so only $neq, $nin and {"$exists": false} can
 *	 match a missing field.
 */
#ifdef RELAY_FILTER_STANDALONE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define FILTER_MALLOC(n) malloc(n)
#define FILTER_FREE(p) free(p)
#else
#include "postgres.h"

#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#define FILTER_MALLOC(n) palloc_extended((n), MCXT_ALLOC_NO_OOM)
#define FILTER_FREE(p) pfree(p)
#endif

#include <cjson/cJSON.h>

#include "filter.h"

/* ---------------------------------------------------------------- arena */

typedef struct ArenaBlock
{
	struct ArenaBlock *next;
	size_t		used;
	size_t		size;
	/* data follows, maximally aligned */
} ArenaBlock;

#define ARENA_HDR	(((sizeof(ArenaBlock) + 15) / 16) * 16)
#define ARENA_BLOCK 4096

typedef struct Arena
{
	ArenaBlock *head;
	bool		failed;			/* out of memory */
} Arena;

static void *
arena_alloc(Arena *a, size_t n)
{
	ArenaBlock *b = a->head;
	char	   *p;

	n = ((n + 15) / 16) * 16;
	if (b == NULL || b->size - b->used < n)
	{
		size_t		size = n > ARENA_BLOCK ? n : ARENA_BLOCK;

		b = FILTER_MALLOC(ARENA_HDR + size);
		if (b == NULL)
		{
			a->failed = true;
			return NULL;
		}
		b->size = size;
		b->used = 0;
		b->next = a->head;
		a->head = b;
	}
	p = (char *) b + ARENA_HDR + b->used;
	b->used += n;
	memset(p, 0, n);
	return p;
}

static char *
arena_strdup(Arena *a, const char *s, size_t len)
{
	char	   *p = arena_alloc(a, len + 1);

	if (p != NULL)
	{
		memcpy(p, s, len);
		p[len] = '\0';
	}
	return p;
}

static void
arena_free(Arena *a)
{
	while (a->head != NULL)
	{
		ArenaBlock *next = a->head->next;

		FILTER_FREE(a->head);
		a->head = next;
	}
}

/* ------------------------------------------------------- compiled form */

/* A JSON value of the filter (an operand), copied out of cJSON. */
typedef enum FValKind
{
	FV_NULL, FV_FALSE, FV_TRUE, FV_NUMBER, FV_STRING, FV_ARRAY, FV_OBJECT
} FValKind;

typedef struct FVal
{
	FValKind	kind;
	double		num;
	const char *str;			/* FV_STRING */
	size_t		len;
	int			n;				/* FV_ARRAY, FV_OBJECT: members */
	struct FVal *items;
	const char **keys;			/* FV_OBJECT */
} FVal;

typedef enum FOp
{
	OP_EQ, OP_NEQ, OP_IN, OP_NIN, OP_GT, OP_GTE, OP_LT, OP_LTE,
	OP_EXISTS, OP_STARTS, OP_ENDS
} FOp;

static const struct
{
	const char *name;
	FOp			op;
}			operators[] =
{
	{"$eq", OP_EQ}, {"$neq", OP_NEQ}, {"$in", OP_IN}, {"$nin", OP_NIN},
	{"$gt", OP_GT}, {"$gte", OP_GTE}, {"$lt", OP_LT}, {"$lte", OP_LTE},
	{"$exists", OP_EXISTS}, {"$startsWith", OP_STARTS}, {"$endsWith", OP_ENDS}
};

#define OPERATOR_LIST "$eq, $neq, $in, $nin, $gt, $gte, $lt, $lte, $exists, $startsWith, $endsWith"

typedef enum FNodeKind
{
	FN_AND, FN_OR, FN_NOT, FN_COND
} FNodeKind;

typedef struct FNode
{
	FNodeKind	kind;
	int			n;				/* FN_AND, FN_OR, FN_NOT: children */
	struct FNode **kids;
	/* FN_COND */
	bool		headers;		/* the path starts at the headers */
	int			nseg;
	const char **segs;
	FOp			op;
	FVal		val;
} FNode;

typedef enum PatternKind
{
	PAT_ANY, PAT_PREFIX, PAT_EXACT
} PatternKind;

typedef struct Pattern
{
	PatternKind kind;
	const char *text;			/* PAT_PREFIX: with its trailing '.' */
	size_t		len;
} Pattern;

struct RelayRouting
{
	Arena		arena;
	int			ntypes;			/* 0: no "types" key */
	Pattern    *types;
	bool		any_type;		/* a "*" among the patterns */
	FNode	   *filter;			/* NULL: no "filter" key */
	bool		filter_payload; /* the filter reads the payload */
	bool		filter_headers; /* ... the headers */
};

/* ------------------------------------------------------------ compiling */

typedef struct Compiler
{
	RelayRouting *r;
	RelayRoutingError *err;
} Compiler;

static bool
fail(Compiler *c, const char *hint, const char *fmt,...)
	__attribute__((format(printf, 3, 4)));

static bool
fail(Compiler *c, const char *hint, const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(c->err->message, sizeof(c->err->message), fmt, ap);
	va_end(ap);
	snprintf(c->err->hint, sizeof(c->err->hint), "%s", hint);
	return false;
}

static bool
out_of_memory(Compiler *c)
{
	return fail(c, "", "out of memory while compiling the routing of a pipeline");
}

/* The JSON type of a value as jsonb_typeof names it. */
const char *
RelayJsonTypeName(const cJSON *v)
{
	if (cJSON_IsObject(v))
		return "object";
	if (cJSON_IsArray(v))
		return "array";
	if (cJSON_IsString(v))
		return "string";
	if (cJSON_IsNumber(v))
		return "number";
	if (cJSON_IsBool(v))
		return "boolean";
	return "null";
}

static bool
copy_value(Compiler *c, const cJSON *v, FVal *out)
{
	const cJSON *e;
	int			i;

	if (cJSON_IsNull(v))
		out->kind = FV_NULL;
	else if (cJSON_IsFalse(v))
		out->kind = FV_FALSE;
	else if (cJSON_IsTrue(v))
		out->kind = FV_TRUE;
	else if (cJSON_IsNumber(v))
	{
		out->kind = FV_NUMBER;
		out->num = v->valuedouble;
	}
	else if (cJSON_IsString(v))
	{
		out->kind = FV_STRING;
		out->len = strlen(v->valuestring);
		if ((out->str = arena_strdup(&c->r->arena, v->valuestring, out->len)) == NULL)
			return out_of_memory(c);
	}
	else
	{
		out->kind = cJSON_IsArray(v) ? FV_ARRAY : FV_OBJECT;
		out->n = cJSON_GetArraySize(v);
		out->items = arena_alloc(&c->r->arena, sizeof(FVal) * (out->n + 1));
		if (out->items == NULL)
			return out_of_memory(c);
		if (out->kind == FV_OBJECT &&
			(out->keys = arena_alloc(&c->r->arena, sizeof(char *) * (out->n + 1))) == NULL)
			return out_of_memory(c);
		i = 0;
		cJSON_ArrayForEach(e, v)
		{
			if (out->kind == FV_OBJECT &&
				(out->keys[i] = arena_strdup(&c->r->arena, e->string, strlen(e->string))) == NULL)
				return out_of_memory(c);
			if (!copy_value(c, e, &out->items[i]))
				return false;
			i++;
		}
	}
	return true;
}

/* "$headers" or "$headers.<path>": a field of the headers. */
static bool
is_headers_field(const char *field)
{
	return strncmp(field, "$headers", 8) == 0 && (field[8] == '\0' || field[8] == '.');
}

static FNode *
new_node(Compiler *c, FNodeKind kind, int n)
{
	FNode	   *node = arena_alloc(&c->r->arena, sizeof(FNode));

	if (node == NULL)
		return NULL;
	node->kind = kind;
	node->n = n;
	if (n > 0 && (node->kids = arena_alloc(&c->r->arena, sizeof(FNode *) * n)) == NULL)
		return NULL;
	return node;
}

static bool compile_filter(Compiler *c, const cJSON *f, const char *where, int depth,
						   FNode **out);

#define FILTER_HINT "A filter is an object such as {\"amount\": {\"$gt\": 100}, \"currency\": \"EUR\"}; see docs/relay.md#routing."

/* A field's path: segments split at dots, none empty. */
static bool
compile_path(Compiler *c, const char *field, const char *where, FNode *node)
{
	const char *p = field;
	int			n = 1;
	int			i;
	const char *s;

	if (is_headers_field(field))
	{
		node->headers = true;
		c->r->filter_headers = true;
		p = field[8] == '.' ? field + 9 : NULL;
	}
	else
		c->r->filter_payload = true;
	if (p == NULL)
	{
		/* "$headers": the headers object itself */
		node->nseg = 0;
		return true;
	}
	for (s = p; *s; s++)
		n += (*s == '.');
	node->segs = arena_alloc(&c->r->arena, sizeof(char *) * n);
	if (node->segs == NULL)
		return out_of_memory(c);
	for (i = 0, s = p;; i++)
	{
		const char *dot = strchr(s, '.');
		size_t		len = dot ? (size_t) (dot - s) : strlen(s);

		if (len == 0)
			return fail(c, "Give a field as a path of names separated by dots, such as \"customer.country\", or \"$headers.<name>\" for a header.",
						"\"%s\" is not a valid field path", where);
		if ((node->segs[i] = arena_strdup(&c->r->arena, s, len)) == NULL)
			return out_of_memory(c);
		if (dot == NULL)
			break;
		s = dot + 1;
	}
	node->nseg = n;
	return true;
}

/* One operator of a field: {"$gt": 5}. */
static bool
compile_operator(Compiler *c, const char *field, const cJSON *opv, const char *where,
				 FNode *node)
{
	const char *name = opv->string;
	size_t		i;
	char		hint[300];

	for (i = 0; i < sizeof(operators) / sizeof(operators[0]); i++)
		if (strcmp(operators[i].name, name) == 0)
			break;
	if (i == sizeof(operators) / sizeof(operators[0]))
	{
		if (strcmp(name, "$not") == 0 || strcmp(name, "$and") == 0 || strcmp(name, "$or") == 0)
			return fail(c, "$and, $or and $not combine whole filters: {\"$not\": {\"amount\": {\"$gt\": 5}}}.",
						"operator \"%s\" in \"%s\" must be given at the level of a filter, not of a field",
						name, where);
		return fail(c, "The operators of a field are: " OPERATOR_LIST ".",
					"unknown operator \"%s\" in \"%s\"", name, where);
	}
	node->op = operators[i].op;
	switch (node->op)
	{
		case OP_IN:
		case OP_NIN:
			if (!cJSON_IsArray(opv))
			{
				snprintf(hint, sizeof(hint), "Give \"%s\" an array of values, such as [\"EUR\", \"USD\"].", name);
				return fail(c, hint, "operator \"%s\" in \"%s\" needs an array, not %s",
							name, where, RelayJsonTypeName(opv));
			}
			break;
		case OP_GT:
		case OP_GTE:
		case OP_LT:
		case OP_LTE:
			if (!cJSON_IsNumber(opv) && !cJSON_IsString(opv))
			{
				snprintf(hint, sizeof(hint), "Give \"%s\" a number or a string; it matches values of the same type only.", name);
				return fail(c, hint, "operator \"%s\" in \"%s\" needs a number or a string, not %s",
							name, where, RelayJsonTypeName(opv));
			}
			break;
		case OP_EXISTS:
			if (!cJSON_IsBool(opv))
				return fail(c, "Give \"$exists\" true (the field is present, whatever its value) or false.",
							"operator \"$exists\" in \"%s\" needs true or false, not %s",
							where, RelayJsonTypeName(opv));
			break;
		case OP_STARTS:
		case OP_ENDS:
			if (!cJSON_IsString(opv))
			{
				snprintf(hint, sizeof(hint), "Give \"%s\" a string; it matches string values only.", name);
				return fail(c, hint, "operator \"%s\" in \"%s\" needs a string, not %s",
							name, where, RelayJsonTypeName(opv));
			}
			break;
		default:
			break;
	}
	if (!compile_path(c, field, where, node))
		return false;
	return copy_value(c, opv, &node->val);
}

/* A field's condition: a value to equal, or an object of operators. */
static bool
compile_field(Compiler *c, const cJSON *v, const char *where, FNode **out)
{
	const char *field = v->string;
	const cJSON *e;
	int			nops = 0;
	int			nfields = 0;
	int			i;
	FNode	   *node;

	if (field[0] == '\0' || (field[0] == '$' && !is_headers_field(field)))
		return fail(c, "Give a field as a path of names separated by dots, such as \"customer.country\", or \"$headers.<name>\" for a header.",
					"\"%s\" is not a valid field path", where);
	if (cJSON_IsObject(v))
		cJSON_ArrayForEach(e, v)
		{
			if (e->string[0] == '$')
				nops++;
			else
				nfields++;
		}
	if (nops > 0 && nfields > 0)
		return fail(c, "Give a field either an object of operators, such as {\"$gte\": 1, \"$lt\": 10}, or a value to equal.",
					"\"%s\" mixes operators and fields", where);
	if (nops == 0)
	{
		/* equality with any JSON value, an object without operators included */
		if ((node = new_node(c, FN_COND, 0)) == NULL)
			return out_of_memory(c);
		node->op = OP_EQ;
		if (!compile_path(c, field, where, node) || !copy_value(c, v, &node->val))
			return false;
		*out = node;
		return true;
	}
	if ((node = new_node(c, FN_AND, nops)) == NULL)
		return out_of_memory(c);
	i = 0;
	cJSON_ArrayForEach(e, v)
	{
		if ((node->kids[i] = new_node(c, FN_COND, 0)) == NULL)
			return out_of_memory(c);
		node->kids[i]->kind = FN_COND;
		if (!compile_operator(c, field, e, where, node->kids[i]))
			return false;
		i++;
	}
	*out = nops == 1 ? node->kids[0] : node;
	return true;
}

static bool
compile_filter(Compiler *c, const cJSON *f, const char *where, int depth, FNode **out)
{
	const cJSON *e;
	const cJSON *k;
	FNode	   *node;
	char		sub[300];
	int			i;
	int			j;

	if (depth > RELAY_FILTER_MAX_DEPTH)
		return fail(c, "Filters nest at most 32 levels deep; simplify the filter.",
					"config key \"filter\" is nested too deeply at \"%s\"", where);
	if (!cJSON_IsObject(f))
		return fail(c, FILTER_HINT, depth == 0 ? "config key \"%s\" must be an object, not %s"
					: "\"%s\" must be a filter object, not %s", where, RelayJsonTypeName(f));
	if ((node = new_node(c, FN_AND, cJSON_GetArraySize(f))) == NULL)
		return out_of_memory(c);
	i = 0;
	cJSON_ArrayForEach(e, f)
	{
		const char *key = e->string;

		snprintf(sub, sizeof(sub), "%s.%s", where, key);
		if (strcmp(key, "$and") == 0 || strcmp(key, "$or") == 0)
		{
			FNode	   *logic;

			if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) == 0)
			{
				char		hint[300];

				snprintf(hint, sizeof(hint), "Give \"%s\" a non-empty array of filters, such as [{\"currency\": \"EUR\"}, {\"amount\": {\"$gt\": 100}}].", key);
				return fail(c, hint, "operator \"%s\" in \"%s\" needs a non-empty array of filters, not %s",
							key, where, cJSON_IsArray(e) ? "an empty array" : RelayJsonTypeName(e));
			}
			if ((logic = new_node(c, key[1] == 'a' ? FN_AND : FN_OR, cJSON_GetArraySize(e))) == NULL)
				return out_of_memory(c);
			j = 0;
			cJSON_ArrayForEach(k, e)
			{
				char		elem[340];

				snprintf(elem, sizeof(elem), "%s[%d]", sub, j);
				if (!compile_filter(c, k, elem, depth + 1, &logic->kids[j]))
					return false;
				j++;
			}
			node->kids[i] = logic;
		}
		else if (strcmp(key, "$not") == 0)
		{
			FNode	   *not = new_node(c, FN_NOT, 1);

			if (not == NULL)
				return out_of_memory(c);
			if (!cJSON_IsObject(e))
				return fail(c, "Give \"$not\" a filter object, such as {\"status\": \"test\"}.",
							"operator \"$not\" in \"%s\" needs a filter object, not %s",
							where, RelayJsonTypeName(e));
			if (!compile_filter(c, e, sub, depth + 1, &not->kids[0]))
				return false;
			node->kids[i] = not;
		}
		else if (key[0] == '$' && !is_headers_field(key))
			return fail(c, "$and, $or and $not combine filters; the other operators apply to a field: {\"amount\": {\"$gt\": 5}}.",
						"unknown operator \"%s\" in \"%s\"", key, where);
		else
		{
			if (depth + 1 > RELAY_FILTER_MAX_DEPTH)
				return fail(c, "Filters nest at most 32 levels deep; simplify the filter.",
							"config key \"filter\" is nested too deeply at \"%s\"", sub);
			if (!compile_field(c, e, sub, &node->kids[i]))
				return false;
		}
		i++;
	}
	*out = node->n == 1 ? node->kids[0] : node;
	return true;
}

#define TYPES_HINT "Give \"types\" as an array of message types such as [\"order.created\", \"order.*\"], or [\"*\"] for every message."

static bool
compile_types(Compiler *c, const cJSON *t)
{
	const cJSON *e;
	int			i = 0;

	if (!cJSON_IsArray(t))
		return fail(c, TYPES_HINT, "config key \"types\" must be an array, not %s", RelayJsonTypeName(t));
	if (cJSON_GetArraySize(t) == 0)
		return fail(c, TYPES_HINT, "config key \"types\" must not be an empty array");
	c->r->ntypes = cJSON_GetArraySize(t);
	if ((c->r->types = arena_alloc(&c->r->arena, sizeof(Pattern) * c->r->ntypes)) == NULL)
		return out_of_memory(c);
	cJSON_ArrayForEach(e, t)
	{
		Pattern    *p = &c->r->types[i++];
		const char *s;
		size_t		len;
		const char *star;

		if (!cJSON_IsString(e))
			return fail(c, TYPES_HINT, "config key \"types\" must hold strings, not %s", RelayJsonTypeName(e));
		s = e->valuestring;
		len = strlen(s);
		if (len == 0)
			return fail(c, TYPES_HINT, "config key \"types\" must not hold an empty string");
		star = strchr(s, '*');
		if (star != NULL &&
			!(len == 1) &&
			!(star == s + len - 1 && len >= 3 && s[len - 2] == '.'))
			return fail(c, "A pattern in \"types\" is a type (\"order.paid\"), a prefix followed by \".*\" (\"order.*\"), or \"*\" for every message.",
						"invalid pattern \"%s\" in config key \"types\"", s);
		if (len == 1 && s[0] == '*')
		{
			p->kind = PAT_ANY;
			c->r->any_type = true;
		}
		else if (star != NULL)
			p->kind = PAT_PREFIX, len--;	/* keeps the '.' */
		else
			p->kind = PAT_EXACT;
		p->len = len;
		if ((p->text = arena_strdup(&c->r->arena, s, len)) == NULL)
			return out_of_memory(c);
	}
	return true;
}

/* Compiles parsed "types" and "filter" (either NULL when absent). */
static bool
compile_parsed(const cJSON *types, const cJSON *filter, RelayRouting **out,
			   RelayRoutingError *err)
{
	RelayRouting r0;
	RelayRouting *r;
	Compiler	c;
	bool		ok = true;

	*out = NULL;
	err->message[0] = err->hint[0] = '\0';
	if (types == NULL && filter == NULL)
		return true;
	memset(&r0, 0, sizeof(r0));
	c.r = &r0;
	c.err = err;
	if (types != NULL)
		ok = compile_types(&c, types);
	if (ok && filter != NULL)
		ok = compile_filter(&c, filter, "filter", 0, &r0.filter);
	if (ok && r0.arena.failed)
		ok = out_of_memory(&c);
	if (ok && (r = arena_alloc(&r0.arena, sizeof(RelayRouting))) == NULL)
		ok = out_of_memory(&c);
	if (!ok)
	{
		arena_free(&r0.arena);
		return false;
	}
	*r = r0;					/* after the allocation: the arena as it is now */
	*out = r;
	return true;
}

bool
RelayRoutingCompile(const char *types_json, const char *filter_json, RelayRouting **out,
					RelayRoutingError *err)
{
	cJSON	   *types = NULL;
	cJSON	   *filter = NULL;
	bool		ok;

	*out = NULL;
	err->message[0] = err->hint[0] = '\0';
	if (types_json != NULL && (types = cJSON_Parse(types_json)) == NULL)
	{
		snprintf(err->message, sizeof(err->message), "config key \"types\" is not valid JSON");
		snprintf(err->hint, sizeof(err->hint), "%s", TYPES_HINT);
		return false;
	}
	if (filter_json != NULL && (filter = cJSON_Parse(filter_json)) == NULL)
	{
		cJSON_Delete(types);
		snprintf(err->message, sizeof(err->message), "config key \"filter\" is not valid JSON");
		snprintf(err->hint, sizeof(err->hint), "%s", FILTER_HINT);
		return false;
	}
	ok = compile_parsed(types, filter, out, err);
	cJSON_Delete(types);
	cJSON_Delete(filter);
	return ok;
}

void
RelayRoutingFree(RelayRouting *r)
{
	Arena		a;

	if (r == NULL)
		return;
	a = r->arena;				/* r lives in the arena */
	arena_free(&a);
}

/* ----------------------------------------------------------- evaluating */

static bool
value_equal(const FVal *v, const cJSON *d)
{
	const cJSON *e;
	int			i;

	switch (v->kind)
	{
		case FV_NULL:
			return cJSON_IsNull(d);
		case FV_FALSE:
			return cJSON_IsFalse(d);
		case FV_TRUE:
			return cJSON_IsTrue(d);
		case FV_NUMBER:
			return cJSON_IsNumber(d) && d->valuedouble == v->num;
		case FV_STRING:
			return cJSON_IsString(d) && strcmp(d->valuestring, v->str) == 0;
		case FV_ARRAY:
			if (!cJSON_IsArray(d))
				return false;
			i = 0;
			cJSON_ArrayForEach(e, d)
			{
				if (i >= v->n || !value_equal(&v->items[i], e))
					return false;
				i++;
			}
			return i == v->n;
		case FV_OBJECT:
			if (!cJSON_IsObject(d) || cJSON_GetArraySize(d) != v->n)
				return false;
			for (i = 0; i < v->n; i++)
			{
				e = cJSON_GetObjectItemCaseSensitive(d, v->keys[i]);
				if (e == NULL || !value_equal(&v->items[i], e))
					return false;
			}
			return true;
	}
	return false;
}

/* The value at a node's path, or NULL when there is none. */
static const cJSON *
lookup(const FNode *node, const cJSON *payload, const cJSON *headers)
{
	const cJSON *d = node->headers ? headers : payload;
	int			i;

	for (i = 0; d != NULL && i < node->nseg; i++)
	{
		const char *seg = node->segs[i];

		if (cJSON_IsObject(d))
			d = cJSON_GetObjectItemCaseSensitive(d, seg);
		else if (cJSON_IsArray(d) && seg[0] >= '0' && seg[0] <= '9' &&
				 strspn(seg, "0123456789") == strlen(seg) && strlen(seg) <= 9)
			d = cJSON_GetArrayItem(d, atoi(seg));
		else
			d = NULL;
	}
	return d;
}

/* -1, 0, 1 for d <, =, > the operand; 2 when they cannot be compared */
static int
compare(const FVal *v, const cJSON *d)
{
	if (v->kind == FV_NUMBER && cJSON_IsNumber(d))
		return d->valuedouble < v->num ? -1 : d->valuedouble > v->num ? 1 :
			d->valuedouble == v->num ? 0 : 2;	/* NaN cannot come from JSON */
	if (v->kind == FV_STRING && cJSON_IsString(d))
	{
		int			r = strcmp(d->valuestring, v->str);

		return r < 0 ? -1 : r > 0 ? 1 : 0;
	}
	return 2;
}

static bool
eval(const FNode *node, const cJSON *payload, const cJSON *headers)
{
	const cJSON *d;
	int			i;
	int			cmp;

	switch (node->kind)
	{
		case FN_AND:
			for (i = 0; i < node->n; i++)
				if (!eval(node->kids[i], payload, headers))
					return false;
			return true;
		case FN_OR:
			for (i = 0; i < node->n; i++)
				if (eval(node->kids[i], payload, headers))
					return true;
			return false;
		case FN_NOT:
			return !eval(node->kids[0], payload, headers);
		case FN_COND:
			break;
	}
	d = lookup(node, payload, headers);
	switch (node->op)
	{
		case OP_EXISTS:
			return (d != NULL) == (node->val.kind == FV_TRUE);
		case OP_EQ:
			return d != NULL && value_equal(&node->val, d);
		case OP_NEQ:
			return d == NULL || !value_equal(&node->val, d);
		case OP_IN:
		case OP_NIN:
			for (i = 0; d != NULL && i < node->val.n; i++)
				if (value_equal(&node->val.items[i], d))
					return node->op == OP_IN;
			return node->op == OP_NIN;
		case OP_STARTS:
		case OP_ENDS:
			if (d == NULL || !cJSON_IsString(d))
				return false;
			{
				size_t		len = strlen(d->valuestring);

				if (len < node->val.len)
					return false;
				return memcmp(node->op == OP_STARTS ? d->valuestring
							  : d->valuestring + len - node->val.len,
							  node->val.str, node->val.len) == 0;
			}
		default:
			if (d == NULL || (cmp = compare(&node->val, d)) == 2)
				return false;
			switch (node->op)
			{
				case OP_GT:
					return cmp > 0;
				case OP_GTE:
					return cmp >= 0;
				case OP_LT:
					return cmp < 0;
				default:
					return cmp <= 0;
			}
	}
}

static bool
type_matches(const RelayRouting *r, const cJSON *headers)
{
	const cJSON *t = cJSON_IsObject(headers) ? cJSON_GetObjectItemCaseSensitive(headers, "type") : NULL;
	const char *type;
	size_t		len;
	int			i;

	if (r->any_type)
		return true;
	if (!cJSON_IsString(t))
		return false;
	type = t->valuestring;
	len = strlen(type);
	for (i = 0; i < r->ntypes; i++)
	{
		const Pattern *p = &r->types[i];

		if (p->kind == PAT_EXACT ? len == p->len && memcmp(type, p->text, len) == 0
			: len > p->len && memcmp(type, p->text, p->len) == 0)
			return true;
	}
	return false;
}

int
RelayRoutingEvaluate(const RelayRouting *r, const char *payload_json, const char *headers_json)
{
	cJSON	   *headers = NULL;
	cJSON	   *payload = NULL;
	int			result = 1;

	if (r == NULL)
		return 1;
	if (headers_json != NULL &&
		((r->ntypes > 0 && !r->any_type) || (r->filter != NULL && r->filter_headers)))
	{
		if ((headers = cJSON_Parse(headers_json)) == NULL)
			return -1;
	}
	if (r->ntypes > 0 && !type_matches(r, headers))
		result = 0;
	else if (r->filter != NULL)
	{
		if (payload_json != NULL && r->filter_payload &&
			(payload = cJSON_Parse(payload_json)) == NULL)
			result = -1;
		else
			result = eval(r->filter, payload, headers) ? 1 : 0;
	}
	cJSON_Delete(payload);
	cJSON_Delete(headers);
	return result;
}

#ifndef RELAY_FILTER_STANDALONE
/* ---------------------------------------------------- SQL and the worker */

PG_FUNCTION_INFO_V1(tide_relay_routing_check);
PG_FUNCTION_INFO_V1(tide_relay_filter_matches);

static void
raise_routing_error(const RelayRoutingError *err)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("%s", err->message),
			 err->hint[0] ? errhint("%s", err->hint) : 0));
}

RelayRouting *
RelayRoutingParse(const char *types_json, const char *filter_json)
{
	RelayRouting *r;
	RelayRoutingError err;

	if (!RelayRoutingCompile(types_json, filter_json, &r, &err))
		raise_routing_error(&err);
	return r;
}

static char *
jsonb_text(Jsonb *j)
{
	return JsonbToCString(NULL, &j->root, VARSIZE(j));
}

/*
 * tide._relay_routing_check(p_types jsonb, p_filter jsonb): raises 22023
 * when either is invalid; NULL means the key is absent.
 */
Datum
tide_relay_routing_check(PG_FUNCTION_ARGS)
{
	char	   *types = PG_ARGISNULL(0) ? NULL : jsonb_text(PG_GETARG_JSONB_P(0));
	char	   *filter = PG_ARGISNULL(1) ? NULL : jsonb_text(PG_GETARG_JSONB_P(1));

	RelayRoutingFree(RelayRoutingParse(types, filter));
	PG_RETURN_VOID();
}

/* The routing compiled for the last config seen by a call site. */
typedef struct MatchCache
{
	Jsonb	   *config;			/* a copy, compared byte for byte */
	RelayRouting *routing;
} MatchCache;

/*
 * tide.relay_filter_matches(p_config jsonb, p_payload jsonb, p_headers
 * jsonb): whether a message with that payload and headers passes the
 * "types" and "filter" of a pipeline config (other keys are ignored).
 */
Datum
tide_relay_filter_matches(PG_FUNCTION_ARGS)
{
	MatchCache *cache = fcinfo->flinfo->fn_extra;
	const RelayRouting *r;
	Jsonb	   *config;
	char	   *payload;
	char	   *headers;
	int			result;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("p_config must not be null"),
				 errhint("Give a pipeline config, or an object with \"types\" and \"filter\".")));
	config = PG_GETARG_JSONB_P(0);
	if (cache == NULL || VARSIZE(cache->config) != VARSIZE(config) ||
		memcmp(cache->config, config, VARSIZE(config)) != 0)
	{
		MemoryContext old;
		cJSON	   *c;
		RelayRouting *nr;
		RelayRoutingError err;
		char	   *cfg_text = jsonb_text(config);
		bool		ok;

		if (!JB_ROOT_IS_OBJECT(config) || JB_ROOT_IS_SCALAR(config))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("p_config must be a JSON object"),
					 errhint("Give a pipeline config, or an object with \"types\" and \"filter\".")));
		if ((c = cJSON_Parse(cfg_text)) == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("p_config could not be parsed")));
		old = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);
		ok = compile_parsed(cJSON_GetObjectItemCaseSensitive(c, "types"),
							cJSON_GetObjectItemCaseSensitive(c, "filter"), &nr, &err);
		MemoryContextSwitchTo(old);
		cJSON_Delete(c);
		if (!ok)
			raise_routing_error(&err);
		if (cache == NULL)
			cache = fcinfo->flinfo->fn_extra =
				MemoryContextAllocZero(fcinfo->flinfo->fn_mcxt, sizeof(MatchCache));
		else
		{
			RelayRoutingFree(cache->routing);
			pfree(cache->config);
		}
		cache->routing = nr;
		cache->config = MemoryContextAlloc(fcinfo->flinfo->fn_mcxt, VARSIZE(config));
		memcpy(cache->config, config, VARSIZE(config));
	}
	/* only what the routing reads is converted to text */
	r = cache->routing;
	payload = PG_ARGISNULL(1) || r == NULL || r->filter == NULL || !r->filter_payload ? NULL
		: jsonb_text(PG_GETARG_JSONB_P(1));
	headers = PG_ARGISNULL(2) || r == NULL ||
		!((r->ntypes > 0 && !r->any_type) || (r->filter != NULL && r->filter_headers)) ? NULL
		: jsonb_text(PG_GETARG_JSONB_P(2));
	result = RelayRoutingEvaluate(r, payload, headers);
	if (result < 0)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("the message could not be parsed for routing"),
				 errdetail("Its payload or headers nest more than 1000 levels deep."),
				 errhint("The relay delivers such a message whatever its routing.")));
	PG_RETURN_BOOL(result == 1);
}
#endif							/* RELAY_FILTER_STANDALONE */
