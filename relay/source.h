/*
 * source.h
 *		The interface between the relay and its sources, the other end of a
 *		reverse pipeline (source -> inbox), in the manner of sink.h's
 *		RelaySinkRoutine: each source type is a table of callbacks that the
 *		relay calls through, and never names an implementation.
 *
 * A source type is provided by an endpoint: a module pg_tide_<type>.so in
 * $libdir (or pg_tide.so itself) exports one init function,
 * pg_tide_endpoint_<type>(void), which registers the routines it provides
 * with RelayRegisterSource (and a sink's, where the endpoint has one).
 * Nothing lists the source types: RelaySourceLoad finds a type's module by
 * that naming convention the first time a config names the type.
 *
 * The routine holds what the catalog needs today: the config's keys, the
 * secret keys that every output of a config redacts, and the validator,
 * which tide.relay_set_inbox, the trigger on tide.relay_inbox_config and
 * the relay worker all run (reverse_config.c). The callbacks that fetch,
 * store and acknowledge messages come with the first source.
 */
#ifndef TIDE_SOURCE_H
#define TIDE_SOURCE_H

#include "postgres.h"

#include <cjson/cJSON.h>

typedef struct RelaySourceRoutine
{
	const char *name;			/* source_type in a reverse pipeline's config */

	/*
	 * The keys of the config it reads beyond those of every reverse
	 * pipeline ("inbox", "source_type", "batch_size"), NULL-ended.
	 */
	const char *const *config_keys;

	/*
	 * The keys whose values every output of a config redacts, NULL-ended,
	 * as a sink's (sink.h, endpoints/redact.c): "auth.password" names the
	 * member "password" of the object "auth", "auth.*" the members of
	 * "auth" whose name says they carry a credential. A value that is an
	 * object, a secret reference ({"env": ...} or {"file": ...}), is shown
	 * as it is: it holds no secret.
	 */
	const char *const *secret_keys;

	/*
	 * Reads the source's keys of a user's config object; raises an ERROR
	 * (SQLSTATE 22023, with a hint; 42501 for a file the role may not make
	 * the relay read, config_value.h) on bad input; adds the source's keys
	 * with defaults filled in to `out`. The only validator of the source's
	 * keys, so the relay reads only what it passed.
	 */
	void		(*validate) (const cJSON *config, cJSON *out);
} RelaySourceRoutine;

/*
 * endpoints/source_types.c, over the endpoint registry (registry.h):
 * registers a source type (an endpoint's init symbol calls it; registering
 * a name again replaces the routine); the routine of a type, loading the
 * endpoint that provides it (an ERROR, 22023, naming the module and the
 * package when none does); the same, NULL instead of the ERROR; the
 * routine if it is registered in this process already, else NULL.
 */
extern PGDLLEXPORT void RelayRegisterSource(const RelaySourceRoutine *routine);
extern PGDLLEXPORT const RelaySourceRoutine *RelaySourceLoad(const char *name);
extern PGDLLEXPORT const RelaySourceRoutine *RelaySourceFind(const char *name);
extern PGDLLEXPORT const RelaySourceRoutine *RelaySourceLookup(const char *name);

#endif							/* TIDE_SOURCE_H */
