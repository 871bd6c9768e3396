/*
 * fuzz_routing_config.c
 *		libFuzzer target: the C part of pipeline config validation,
 *		RelayRoutingCompile (relay/filter.c), which checks and compiles a
 *		config's "types" and "filter". Input: the "types" JSON, a newline,
 *		the "filter" JSON; an empty part is an absent key.
 *
 * Invariants: no crash or sanitizer report; a refusal has *out NULL and a
 * non-empty message, both message and hint NUL-terminated in their
 * buffers; compiling again gives the same answer and the same message.
 */
#include "fuzz_common.h"
#include "filter.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char	   *buf;
	char	   *parts[2];
	size_t		lens[2];
	const char *types;
	const char *filter;
	RelayRouting *r1 = (RelayRouting *) 1;
	RelayRouting *r2 = (RelayRouting *) 1;
	RelayRoutingError e1;
	RelayRoutingError e2;
	bool		ok1;
	bool		ok2;

	if (size > FUZZ_MAX_INPUT)
		return 0;
	fuzz_split(data, size, '\n', 2, &buf, parts, lens);
	types = parts[0][0] ? parts[0] : NULL;
	filter = parts[1][0] ? parts[1] : NULL;

	memset(&e1, 0x7f, sizeof(e1));
	memset(&e2, 0x55, sizeof(e2));
	ok1 = RelayRoutingCompile(types, filter, &r1, &e1);
	ok2 = RelayRoutingCompile(types, filter, &r2, &e2);
	FUZZ_CHECK(ok1 == ok2);
	if (!ok1)
	{
		FUZZ_CHECK(r1 == NULL && r2 == NULL);
		FUZZ_CHECK(memchr(e1.message, '\0', sizeof(e1.message)) != NULL);
		FUZZ_CHECK(memchr(e1.hint, '\0', sizeof(e1.hint)) != NULL);
		FUZZ_CHECK(e1.message[0] != '\0');
		FUZZ_CHECK(strcmp(e1.message, e2.message) == 0);
		FUZZ_CHECK(strcmp(e1.hint, e2.hint) == 0);
	}
	else
	{
		/* both absent: no routing at all; otherwise a compiled one */
		FUZZ_CHECK((r1 == NULL) == (types == NULL && filter == NULL));
		/* a message without payload or headers: evaluating must not fail */
		FUZZ_CHECK(RelayRoutingEvaluate(r1, NULL, NULL) >= 0);
		FUZZ_CHECK(RelayRoutingEvaluate(r1, NULL, NULL) == RelayRoutingEvaluate(r2, NULL, NULL));
	}
	RelayRoutingFree(r1);
	RelayRoutingFree(r2);
	free(buf);
	return 0;
}
