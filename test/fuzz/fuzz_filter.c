/*
 * fuzz_filter.c
 *		libFuzzer target: the routing filter evaluator (relay/filter.c),
 *		compiling and evaluating. Input: four parts separated by newlines:
 *		"types" JSON, "filter" JSON, payload JSON, headers JSON; an empty
 *		types or filter part is an absent key, an empty headers part is no
 *		headers, an empty payload part is NULL.
 *
 * Invariants: no crash or sanitizer report; a refused config has *out
 * NULL and a message; an evaluation is 1, 0 or -1, the same every time,
 * and -1 only when the payload or headers do not parse; no routing (both
 * absent) passes every message; RelayRoutingMatches agrees.
 */
#include <cjson/cJSON.h>

#include "fuzz_common.h"
#include "filter.h"

/* Whether JSON text parses (NULL does). */
static bool
parses(const char *json)
{
	cJSON	   *j;

	if (json == NULL)
		return true;
	j = cJSON_Parse(json);
	if (j == NULL)
		return false;
	cJSON_Delete(j);
	return true;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char	   *buf;
	char	   *parts[4];
	size_t		lens[4];
	const char *types;
	const char *filter;
	const char *payload;
	const char *headers;
	RelayRouting *r = NULL;
	RelayRoutingError err;
	int			v1;
	int			v2;

	if (size > FUZZ_MAX_INPUT)
		return 0;
	fuzz_split(data, size, '\n', 4, &buf, parts, lens);
	types = parts[0][0] ? parts[0] : NULL;
	filter = parts[1][0] ? parts[1] : NULL;
	payload = parts[2][0] ? parts[2] : NULL;
	headers = parts[3][0] ? parts[3] : NULL;

	if (!RelayRoutingCompile(types, filter, &r, &err))
	{
		FUZZ_CHECK(r == NULL);
		FUZZ_CHECK(memchr(err.message, '\0', sizeof(err.message)) != NULL && err.message[0]);
		/* a refused routing is never evaluated by the relay; still, NULL passes */
	}
	v1 = RelayRoutingEvaluate(r, payload, headers);
	v2 = RelayRoutingEvaluate(r, payload, headers);
	FUZZ_CHECK(v1 == 1 || v1 == 0 || v1 == -1);
	FUZZ_CHECK(v1 == v2);
	FUZZ_CHECK(RelayRoutingMatches(r, payload, headers) == (v1 != 0));
	if (r == NULL)
		FUZZ_CHECK(v1 == 1);
	if (v1 == -1)
		FUZZ_CHECK(!parses(payload) || !parses(headers));
	RelayRoutingFree(r);
	free(buf);
	return 0;
}
