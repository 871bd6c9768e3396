/*
 * filter.h
 *		Routing: which messages a pipeline delivers. A pipeline's config may
 *		name message types ("types") and a content filter ("filter"); both
 *		are compiled once (RelayRoutingCompile) and evaluated per message on
 *		the JSON text of its payload and headers (RelayRoutingEvaluate).
 *
 * This header and the core of filter.c are plain C (cJSON for the JSON, an
 * arena for the compiled form): built with -DRELAY_FILTER_STANDALONE they
 * need no PostgreSQL, so a fuzzer or a benchmark can drive them. Neither
 * compiling nor evaluating raises an error: a bad filter is reported in a
 * RelayRoutingError. See docs/relay.md#routing for the syntax.
 */
#ifndef TIDE_FILTER_H
#define TIDE_FILTER_H

#include <stdbool.h>
#include <stddef.h>

/* Filters nest at most this deep ($and, $or, $not and fields). */
#define RELAY_FILTER_MAX_DEPTH	32

typedef struct RelayRouting RelayRouting;
struct cJSON;

/* Why a "types" or "filter" value was refused: a message and a hint. */
typedef struct RelayRoutingError
{
	char		message[512];
	char		hint[512];
} RelayRoutingError;

/*
 * Compiles a config's "types" and "filter" values, each given as JSON text
 * or NULL when the key is absent. Returns false when one is invalid (err
 * says why; *out is NULL). Otherwise true, with *out the compiled routing,
 * or NULL when both are absent (every message is delivered). The compiled
 * form is one allocation arena (palloc in CurrentMemoryContext inside
 * PostgreSQL, malloc standalone); RelayRoutingFree releases it.
 */
extern bool RelayRoutingCompile(const char *types_json, const char *filter_json,
								RelayRouting **out, RelayRoutingError *err);
extern void RelayRoutingFree(RelayRouting *r);

/*
 * Whether a message passes: 1 it does, 0 it does not, -1 its payload or
 * headers could not be parsed (nested deeper than cJSON's 1000 levels, or
 * out of memory), so the routing cannot tell. r NULL passes every message.
 * payload_json and headers_json are JSON text (jsonb as text); either may
 * be NULL (no headers; a NULL payload has no fields). No allocation beyond
 * cJSON's own (malloc, freed before returning), no error.
 */
extern int	RelayRoutingEvaluate(const RelayRouting *r, const char *payload_json,
								 const char *headers_json);

/* RelayRoutingEvaluate != 0: a message that cannot be evaluated is delivered. */
static inline bool
RelayRoutingMatches(const RelayRouting *r, const char *payload_json, const char *headers_json)
{
	return RelayRoutingEvaluate(r, payload_json, headers_json) != 0;
}

/* The JSON type of a cJSON value as jsonb_typeof names it ("null" for NULL). */
extern const char *RelayJsonTypeName(const struct cJSON *v);

#ifndef RELAY_FILTER_STANDALONE
/*
 * Inside PostgreSQL only: compiles like RelayRoutingCompile but raises 22023
 * for an invalid value; NULL when both are absent.
 */
extern RelayRouting *RelayRoutingParse(const char *types_json, const char *filter_json);
#endif

#endif							/* TIDE_FILTER_H */
