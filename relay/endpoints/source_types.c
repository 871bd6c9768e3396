/*
 * source_types.c
 *		The source types a reverse pipeline's config may name as
 *		source_type (source.h): the sources of the endpoint registry
 *		(registry.h, kind RELAY_ENDPOINT_SOURCE), found as its sinks are, by
 *		the endpoint's init symbol in pg_tide.so or $libdir/pg_tide_<type>.so.
 *		What is a source's own is how a type no endpoint provides is refused.
 */
#include "postgres.h"

#include "lib/stringinfo.h"

#include "config_value.h"
#include "source.h"
#include "endpoints/registry.h"

/* Registers a source type's routine; an endpoint's init symbol calls it. */
void
RelayRegisterSource(const RelaySourceRoutine *routine)
{
	RelayEndpointRegister(RELAY_ENDPOINT_SOURCE, routine->name, routine, routine->secret_keys);
}

/* The routine of a registered source type, or NULL. */
const RelaySourceRoutine *
RelaySourceLookup(const char *name)
{
	return RelayEndpointLookup(RELAY_ENDPOINT_SOURCE, name);
}

/* The routine of a source type, or NULL when no endpoint provides it. */
const RelaySourceRoutine *
RelaySourceFind(const char *name)
{
	char	   *error;

	return RelayEndpointFind(RELAY_ENDPOINT_SOURCE, name, &error);
}

/* The source types this server knows, quoted, for a hint: "" when none. */
static char *
known_sources(void)
{
	StringInfoData names;
	const char **known = RelayEndpointNames(RELAY_ENDPOINT_SOURCE);

	initStringInfo(&names);
	for (int i = 0; known[i] != NULL; i++)
		appendStringInfo(&names, "%s\"%s\"", i > 0 ? ", " : "; this server has ", known[i]);
	return names.data;
}

/*
 * The routine of a source type, loading the endpoint that provides it if
 * need be; an ERROR (22023, with the module and the package that would
 * bring it) when none does.
 */
const RelaySourceRoutine *
RelaySourceLoad(const char *name)
{
	char	   *error;
	const RelaySourceRoutine *routine = RelayEndpointFind(RELAY_ENDPOINT_SOURCE, name, &error);

	if (routine != NULL)
		return routine;
	if (error == NULL)
		RelayConfigError(psprintf("A source type is a lower-case name such as \"postgres\"; docs/relay.md, \"Reverse pipelines\", lists the source types%s.",
								  known_sources()),
						 "unknown source type \"%s\"", name);
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("unknown source type \"%s\"", name),
			 errdetail("%s.", error),
			 errhint("Install the package postgresql-%s-pg-tide-%s if there is one (it brings pg_tide_%s%s); docs/relay.md, \"Reverse pipelines\", lists the source types%s.",
					 PG_MAJORVERSION, name, name, DLSUFFIX, known_sources())));
	return NULL;				/* not reached */
}
