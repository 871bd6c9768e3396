/*
 * registry.h
 *		The endpoint types the relay knows: the sinks (sink.h) and the
 *		sources that endpoints provide, by the name a pipeline's config
 *		gives (sink_type, source_type), with the secret keys each declares.
 *
 * An endpoint <name> lives in relay/endpoints/<name>/ and registers what
 * it provides through one init symbol, found by its name:
 *
 *		PGDLLEXPORT void pg_tide_endpoint_<name>(void);
 *
 * which calls RelayRegisterSink for its sink and RelayRegisterSource
 * (source.h) for its source, which files it here as RELAY_ENDPOINT_SOURCE.
 * A type is looked up in what is registered; when absent, the symbol is
 * looked for in pg_tide.so (a built-in endpoint: webhook, file), then in
 * $libdir/pg_tide_<name>.so (a module, linked with its client library, so
 * that pg_tide.so loads on a server that lacks the library), whose init
 * symbol is called once per process. Nothing lists the endpoints by hand:
 * the Makefile makes relay/endpoints/known.h from the folders, for hints
 * that name the types and the packages to install.
 */
#ifndef TIDE_ENDPOINT_REGISTRY_H
#define TIDE_ENDPOINT_REGISTRY_H

#include "sink.h"

/* The kinds of endpoint types a config names. */
typedef enum RelayEndpointKind
{
	RELAY_ENDPOINT_SINK,		/* sink_type of a forward pipeline */
	RELAY_ENDPOINT_SOURCE		/* source_type of a reverse pipeline */
} RelayEndpointKind;

/*
 * Registering, from an endpoint's init symbol: a sink's routine, or any
 * kind's routine with its name and secret keys. The routine must outlive
 * the process (a static). Registering a name again replaces the routine.
 */
extern PGDLLEXPORT void RelayRegisterSink(const RelaySinkRoutine *routine);
extern PGDLLEXPORT void RelayEndpointRegister(RelayEndpointKind kind, const char *name,
											  const void *routine, const char *const *secret_keys);

/*
 * The routine of an endpoint that provides one sink, and the init symbol
 * that registers it, as PG_FUNCTION_INFO_V1 declares a function:
 *
 *		RELAY_SINK_ENDPOINT(file, RelayFileConfigKeys, RelayFileValidate);
 *
 * defines file_routine, named "file", whose callbacks are file_open,
 * file_start, file_progress, file_outcomes and file_cancel, and
 * pg_tide_endpoint_file(), which registers it. What follows the validator
 * sets the routine's other members (.close, .secret_keys, ...). An endpoint
 * that provides more writes its own init symbol.
 */
#define RELAY_SINK_ENDPOINT(type, keys, validator, ...) \
static const RelaySinkRoutine type##_routine = { \
	.name = #type, \
	.config_keys = (keys), \
	.validate = (validator), \
	.open = type##_open, \
	.start = type##_start, \
	.progress = type##_progress, \
	.outcomes = type##_outcomes, \
	.cancel = type##_cancel, \
	__VA_ARGS__ \
}; \
extern PGDLLEXPORT void pg_tide_endpoint_##type(void); \
void \
pg_tide_endpoint_##type(void) \
{ \
	RelayRegisterSink(&type##_routine); \
} \
extern int	no_such_variable

/*
 * The routine of a sink type, loading its endpoint if need be; an ERROR
 * (42704, with what to install) when there is no such type or its module
 * cannot be loaded. RelaySinkLookup: the routine only if it is already
 * registered in this process, else NULL (every config is validated, which
 * loads the type, before it is served).
 */
extern PGDLLEXPORT const RelaySinkRoutine *RelaySinkLoad(const char *name);
extern PGDLLEXPORT const RelaySinkRoutine *RelaySinkLookup(const char *name);

/*
 * The routine of a type of any kind: RelayEndpointLoad as RelaySinkLoad;
 * RelayEndpointFind the same, but NULL instead of the ERROR, with *error
 * saying why (left NULL when the name cannot be a type's), for a kind
 * whose errors say more (source.h); RelayEndpointLookup as
 * RelaySinkLookup.
 */
extern PGDLLEXPORT const void *RelayEndpointLoad(RelayEndpointKind kind, const char *name);
extern PGDLLEXPORT const void *RelayEndpointFind(RelayEndpointKind kind, const char *name,
												 char **error);
extern PGDLLEXPORT const void *RelayEndpointLookup(RelayEndpointKind kind, const char *name);

/*
 * Whether name is a type of this kind that this server knows (built, or a
 * module installed), and the names of every such type, NULL-ended, in the
 * order of hints: the types pg_tide was built with, then others registered
 * or installed as $libdir/pg_tide_<name>.so.
 */
extern PGDLLEXPORT bool RelayEndpointIsKnown(RelayEndpointKind kind, const char *name);
extern PGDLLEXPORT const char **RelayEndpointNames(RelayEndpointKind kind);

/*
 * The secret keys that the type's routine declares (RelaySinkRoutine's
 * secret_keys, NULL: none), loading its endpoint if need be; false when
 * the type is unknown or its endpoint cannot be loaded. Never an ERROR
 * but a cancel.
 */
extern PGDLLEXPORT bool RelayEndpointSecretKeys(RelayEndpointKind kind, const char *name,
												const char *const **keys);

#endif							/* TIDE_ENDPOINT_REGISTRY_H */
