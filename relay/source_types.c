/*
 * source_types.c
 *		The source types a reverse pipeline's config may name as
 *		source_type, found by naming convention rather than by a list.
 *
 * An endpoint that provides a source type <type> exports an init function
 * pg_tide_endpoint_<type>(void) that calls RelayRegisterSource with the
 * type's routine (source.h). RelaySourceLoad looks for that function in
 * pg_tide.so itself (a source built in) and then in $libdir/pg_tide_<type>.so
 * (a module linked with a client library, so that pg_tide.so loads on a
 * server that lacks the library), the first time a config names the type.
 * A type no module provides is refused with the package that would bring
 * it.
 */
#include "postgres.h"

#include <sys/stat.h>

#include "fmgr.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"

#include "config_value.h"
#include "source.h"

/* Source types a process can hold: a handful of endpoints. */
#define MAX_SOURCE_TYPES 32

/* The longest type name: it becomes part of a file and a symbol name. */
#define MAX_SOURCE_TYPE_NAME 31

static const RelaySourceRoutine *registered[MAX_SOURCE_TYPES];
static int	nregistered = 0;

/* Registers a source type's routine; an endpoint's init function calls it. */
void
RelayRegisterSource(const RelaySourceRoutine *routine)
{
	const RelaySourceRoutine *known = RelaySourceLookup(routine->name);

	if (known == routine)
		return;
	if (known != NULL)
		elog(ERROR, "source type \"%s\" is registered twice", routine->name);
	if (nregistered >= MAX_SOURCE_TYPES)
		elog(ERROR, "too many source types: at most %d", MAX_SOURCE_TYPES);
	registered[nregistered++] = routine;
}

/* The routine of a registered source type, or NULL. */
const RelaySourceRoutine *
RelaySourceLookup(const char *name)
{
	if (name == NULL)
		return NULL;
	for (int i = 0; i < nregistered; i++)
		if (strcmp(registered[i]->name, name) == 0)
			return registered[i];
	return NULL;
}

/*
 * Whether a name can be a source type: lower-case letters, digits and
 * underscores, from a letter, so that it names a file and a symbol.
 */
static bool
plausible_type_name(const char *name)
{
	size_t		len = name ? strlen(name) : 0;

	if (len == 0 || len > MAX_SOURCE_TYPE_NAME || name[0] < 'a' || name[0] > 'z')
		return false;
	for (size_t i = 0; i < len; i++)
		if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9') || name[i] == '_'))
			return false;
	return true;
}

/*
 * Runs the init function `symbol` of the library `path` when it has one;
 * false when the library or the function is not there. A library that
 * cannot be loaded sets *error; any other ERROR (a cancel) is raised again.
 */
static bool
run_endpoint_init(const char *path, const char *symbol, char **error)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile bool found = false;

	PG_TRY();
	{
		PGFunction	init = load_external_function(path, symbol, false, NULL);

		if (init != NULL)
		{
			((void (*) (void)) (void *) init) ();
			found = true;
		}
	}
	PG_CATCH();
	{
		ErrorData  *e;

		MemoryContextSwitchTo(cxt);
		e = CopyErrorData();
		if (e->sqlerrcode == ERRCODE_QUERY_CANCELED || e->sqlerrcode == ERRCODE_ADMIN_SHUTDOWN)
			PG_RE_THROW();
		FlushErrorState();
		*error = psprintf("%s cannot be loaded: %s", path, e->detail ? e->detail : e->message);
	}
	PG_END_TRY();
	return found;
}

/* The names of the source types registered in this process, for a hint. */
static char *
registered_names(void)
{
	StringInfoData names;

	initStringInfo(&names);
	for (int i = 0; i < nregistered; i++)
		appendStringInfo(&names, "%s\"%s\"", i > 0 ? ", " : "", registered[i]->name);
	return names.data;
}

/*
 * The routine of a source type, running the init function of the endpoint
 * that provides it if need be; NULL, with *error saying why, when none
 * does. An ERROR other than a loader's (a cancel) is raised.
 */
static const RelaySourceRoutine *
find_source(const char *name, char **error)
{
	const RelaySourceRoutine *routine = RelaySourceLookup(name);
	char	   *symbol;
	char		path[MAXPGPATH];
	struct stat st;

	*error = NULL;
	if (routine != NULL || !plausible_type_name(name))
		return routine;
	symbol = psprintf("pg_tide_endpoint_%s", name);
	snprintf(path, sizeof(path), "%s/pg_tide_%s%s", pkglib_path, name, DLSUFFIX);
	if (run_endpoint_init("$libdir/pg_tide", symbol, error))
		*error = psprintf("endpoint \"%s\" has no source", name);
	else if (stat(path, &st) != 0)
		*error = psprintf("no module provides it: pg_tide_%s%s is not installed", name, DLSUFFIX);
	else if (run_endpoint_init(path, symbol, error))
		*error = psprintf("pg_tide_%s%s has no source", name, DLSUFFIX);
	else if (*error == NULL)
		*error = psprintf("pg_tide_%s%s has no function %s", name, DLSUFFIX, symbol);
	return RelaySourceLookup(name);
}

/* The routine of a source type, or NULL when no endpoint provides it. */
const RelaySourceRoutine *
RelaySourceFind(const char *name)
{
	char	   *error;

	return name == NULL ? NULL : find_source(name, &error);
}

/*
 * The routine of a source type, running the init function of the endpoint
 * that provides it if need be; an ERROR (22023, with the module and the
 * package that would bring it) when none does.
 */
const RelaySourceRoutine *
RelaySourceLoad(const char *name)
{
	char	   *error;
	const RelaySourceRoutine *routine = find_source(name, &error);

	if (routine != NULL)
		return routine;
	if (error == NULL)
		RelayConfigError(psprintf("A source type is a lower-case name such as \"postgres\"; docs/relay.md, \"Reverse pipelines\", lists the source types%s%s.",
								  nregistered > 0 ? "; this server has " : "", registered_names()),
						 "unknown source type \"%s\"", name);
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("unknown source type \"%s\"", name),
			 errdetail("%s.", error),
			 errhint("Install the package postgresql-%s-pg-tide-%s if there is one (it brings pg_tide_%s%s); docs/relay.md, \"Reverse pipelines\", lists the source types%s%s.",
					 PG_MAJORVERSION, name, name, DLSUFFIX,
					 nregistered > 0 ? "; this server has " : "", registered_names())));
	return NULL;				/* not reached */
}
