/*
 * registry.c
 *		The endpoint types the relay knows, by the name a pipeline's config
 *		gives (registry.h): what the endpoints' init symbols registered in
 *		this process, found by naming convention, and the types pg_tide was
 *		built with (known.h, made by make from relay/endpoints/), for hints.
 *
 * Looking up type <name>: what is registered; else the init symbol
 * pg_tide_endpoint_<name> in pg_tide.so (a built-in endpoint), else in
 * $libdir/pg_tide_<name>.so (a module, linked with its client library, so
 * that pg_tide.so loads on a server that lacks the library); the symbol
 * registers the routines, and the registry is asked again. When a module is
 * missing or cannot be loaded, only pipelines of its types are refused,
 * with the package to install: postgresql-N-pg-tide-<name> by convention,
 * and the client library's package when known.h names it.
 *
 * A name becomes part of a file name, so only lower-case letters, digits
 * and "_", from a letter, are taken (no "/", no ".."): anything else is no
 * type at all.
 */
#include "postgres.h"

#include <dirent.h>
#include <sys/stat.h>

#include "fmgr.h"
#include "miscadmin.h"
#include "storage/fd.h"
#include "utils/memutils.h"

#include "endpoints/registry.h"

/* A type pg_tide was built with: one endpoint folder (known.h). */
typedef struct KnownEndpoint
{
	const char *name;
	bool		sink;			/* it provides a sink */
	bool		source;			/* it provides a source */
	const char *library_package;	/* a module: Debian's package of its client library */
	const char *dev_package;	/* and of its headers, to build the module */
} KnownEndpoint;

static const KnownEndpoint known_endpoints[] = {
#include "endpoints/known.h"
};

/* A registered routine. */
typedef struct RegisteredType
{
	RelayEndpointKind kind;
	char		name[NAMEDATALEN];
	const void *routine;
	const char *const *secret_keys;
} RegisteredType;

/* The routines registered in this process, in TopMemoryContext. */
static RegisteredType *registered;
static int	nregistered;
static int	maxregistered;

/* The longest type name: pg_tide_endpoint_<name> fits a symbol comfortably. */
#define ENDPOINT_NAME_MAX 40

/*
 * Whether name can be a type's: 1 to 40 lower-case letters, digits and
 * "_", from a letter.
 */
static bool
valid_name(const char *name)
{
	size_t		len = name ? strlen(name) : 0;

	if (len == 0 || len > ENDPOINT_NAME_MAX || name[0] < 'a' || name[0] > 'z')
		return false;
	for (const char *p = name; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_'))
			return false;
	return true;
}

/* The kind's name as errors give it. */
static const char *
kind_name(RelayEndpointKind kind)
{
	return kind == RELAY_ENDPOINT_SINK ? "sink" : "source";
}

/* The registered entry of a type, or NULL. */
static RegisteredType *
find_registered(RelayEndpointKind kind, const char *name)
{
	if (name == NULL)
		return NULL;
	for (int i = 0; i < nregistered; i++)
		if (registered[i].kind == kind && strcmp(registered[i].name, name) == 0)
			return &registered[i];
	return NULL;
}

/* The entry of known.h of a type, or NULL. */
static const KnownEndpoint *
find_known(RelayEndpointKind kind, const char *name)
{
	if (name == NULL)
		return NULL;
	for (size_t i = 0; i < lengthof(known_endpoints); i++)
		if (strcmp(known_endpoints[i].name, name) == 0 &&
			(kind == RELAY_ENDPOINT_SINK ? known_endpoints[i].sink : known_endpoints[i].source))
			return &known_endpoints[i];
	return NULL;
}

/* Records a routine, replacing one of the same kind and name. */
void
RelayEndpointRegister(RelayEndpointKind kind, const char *name, const void *routine,
					  const char *const *secret_keys)
{
	RegisteredType *t;

	if (!valid_name(name))
		elog(ERROR, "pg_tide: an endpoint registered a %s with the invalid name \"%s\"",
			 kind_name(kind), name ? name : "");
	t = find_registered(kind, name);
	if (t == NULL)
	{
		if (nregistered == maxregistered)
		{
			int			n = maxregistered ? maxregistered * 2 : 16;

			registered = registered
				? repalloc(registered, sizeof(RegisteredType) * n)
				: MemoryContextAlloc(TopMemoryContext, sizeof(RegisteredType) * n);
			maxregistered = n;
		}
		t = &registered[nregistered++];
		t->kind = kind;
		strlcpy(t->name, name, sizeof(t->name));
	}
	t->routine = routine;
	t->secret_keys = secret_keys;
}

void
RelayRegisterSink(const RelaySinkRoutine *routine)
{
	RelayEndpointRegister(RELAY_ENDPOINT_SINK, routine->name, routine, routine->secret_keys);
}

/* $libdir/pg_tide_<name>.so. */
static char *
module_path(const char *name)
{
	return psprintf("%s/pg_tide_%s%s", pkglib_path, name, DLSUFFIX);
}

/* Whether $libdir/pg_tide_<name>.so exists. */
static bool
module_installed(const char *name)
{
	struct stat st;

	return stat(module_path(name), &st) == 0;
}

/*
 * Calls the init symbol pg_tide_endpoint_<name> of library, if it has one.
 * false, with *error, when the library cannot be loaded (an ERROR other
 * than the loader's, a cancel, is raised again) or lacks the symbol.
 */
static bool
call_init(const char *library, const char *name, char **error)
{
	MemoryContext cxt = CurrentMemoryContext;
	char	   *symbol = psprintf("pg_tide_endpoint_%s", name);
	volatile bool found = false;
	volatile bool failed = false;

	PG_TRY();
	{
		PGFunction	init = load_external_function(library, symbol, false, NULL);

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
		*error = psprintf("%s cannot be loaded: %s", last_dir_separator(library) + 1,
						  e->detail ? e->detail : e->message);
		failed = true;
	}
	PG_END_TRY();
	if (!found && !failed)
		*error = psprintf("%s has no symbol %s", last_dir_separator(library) + 1, symbol);
	return found;
}

/*
 * The registered entry of a type, registering its endpoint first if need
 * be: from pg_tide.so, else from its module. NULL, with *error, when it
 * cannot be found or loaded; *error NULL: the name cannot be a type's.
 */
static RegisteredType *
load_type(RelayEndpointKind kind, const char *name, char **error)
{
	RegisteredType *t = find_registered(kind, name);
	char	   *path;
	bool		built_in;

	*error = NULL;
	if (t != NULL || !valid_name(name))
		return t;
	/* a built-in endpoint: its symbol is in pg_tide.so */
	built_in = call_init("$libdir/pg_tide", name, error);
	if (built_in && (t = find_registered(kind, name)) != NULL)
		return t;
	path = module_path(name);
	if (!module_installed(name))
	{
		*error = built_in
			? psprintf("endpoint \"%s\" of pg_tide%s provides no %s", name, DLSUFFIX, kind_name(kind))
			: psprintf("no module provides it: pg_tide_%s%s is not installed", name, DLSUFFIX);
		return NULL;
	}
	if (!call_init(path, name, error))
		return NULL;
	t = find_registered(kind, name);
	if (t == NULL)
		*error = psprintf("pg_tide_%s%s provides no %s \"%s\"", name, DLSUFFIX, kind_name(kind), name);
	return t;
}

/*
 * The entry of a type, loading its endpoint; an ERROR (42704) naming what
 * to install when it cannot be.
 */
static RegisteredType *
load_or_error(RelayEndpointKind kind, const char *name)
{
	char	   *error = NULL;
	RegisteredType *t = load_type(kind, name, &error);
	const KnownEndpoint *k;

	if (t != NULL)
		return t;
	if (!RelayEndpointIsKnown(kind, name))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("%s type \"%s\" does not exist", kind_name(kind), name ? name : ""),
				 errhint("See docs/relay.md for the %s types.", kind_name(kind))));
	k = find_known(kind, name);
	if (k != NULL && k->library_package != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("%s type \"%s\" is not available on this server", kind_name(kind), name),
				 errdetail("%s.", error),
				 errhint("Install the package postgresql-%s-pg-tide-%s (it brings Debian's %s), or build pg_tide where %s is installed (its make builds pg_tide_%s%s); then set the pipeline again.",
						 PG_MAJORVERSION, name, k->library_package, k->dev_package, name, DLSUFFIX)));
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("%s type \"%s\" is not available on this server", kind_name(kind), name),
			 errdetail("%s.", error ? error : "it is not registered"),
			 errhint("Install the package postgresql-%s-pg-tide-%s, or a build of pg_tide_%s%s for this server; then set the pipeline again.",
					 PG_MAJORVERSION, name, name, DLSUFFIX)));
	return NULL;				/* not reached */
}

const RelaySinkRoutine *
RelaySinkLoad(const char *name)
{
	return RelayEndpointLoad(RELAY_ENDPOINT_SINK, name);
}

const RelaySinkRoutine *
RelaySinkLookup(const char *name)
{
	return RelayEndpointLookup(RELAY_ENDPOINT_SINK, name);
}

const void *
RelayEndpointLoad(RelayEndpointKind kind, const char *name)
{
	return load_or_error(kind, name)->routine;
}

const void *
RelayEndpointFind(RelayEndpointKind kind, const char *name, char **error)
{
	RegisteredType *t = load_type(kind, name, error);

	return t ? t->routine : NULL;
}

const void *
RelayEndpointLookup(RelayEndpointKind kind, const char *name)
{
	RegisteredType *t = find_registered(kind, name);

	return t ? t->routine : NULL;
}

bool
RelayEndpointIsKnown(RelayEndpointKind kind, const char *name)
{
	if (!valid_name(name))
		return false;
	return find_known(kind, name) != NULL || find_registered(kind, name) != NULL ||
		module_installed(name);
}

/* Adds name to the NULL-ended list of n names unless it is there. */
static void
add_name(const char **names, int *n, const char *name)
{
	for (int i = 0; i < *n; i++)
		if (strcmp(names[i], name) == 0)
			return;
	names[(*n)++] = name;
	names[*n] = NULL;
}

/* qsort's comparison of names. */
static int
compare_names(const void *a, const void *b)
{
	return strcmp(*(const char *const *) a, *(const char *const *) b);
}

const char **
RelayEndpointNames(RelayEndpointKind kind)
{
	int			max = lengthof(known_endpoints) + nregistered + 1;
	int			n = 0;
	int			first_installed;
	const char **names = palloc(sizeof(char *) * max);
	DIR		   *dir;
	struct dirent *de;
	size_t		suffix = strlen(DLSUFFIX);

	names[0] = NULL;
	for (size_t i = 0; i < lengthof(known_endpoints); i++)
		if (find_known(kind, known_endpoints[i].name))
			add_name(names, &n, known_endpoints[i].name);
	for (int i = 0; i < nregistered; i++)
		if (registered[i].kind == kind)
			add_name(names, &n, registered[i].name);
	/* modules installed beside pg_tide that it was not built with, by name */
	first_installed = n;
	dir = AllocateDir(pkglib_path);
	while (dir != NULL && (de = ReadDir(dir, pkglib_path)) != NULL)
	{
		size_t		len = strlen(de->d_name);
		char	   *name;

		if (strncmp(de->d_name, "pg_tide_", 8) != 0 || len <= 8 + suffix ||
			strcmp(de->d_name + len - suffix, DLSUFFIX) != 0)
			continue;
		name = pnstrdup(de->d_name + 8, len - 8 - suffix);
		if (!valid_name(name) || find_known(RELAY_ENDPOINT_SINK, name) || find_known(RELAY_ENDPOINT_SOURCE, name))
			continue;
		if (n + 1 >= max)
		{
			max *= 2;
			names = repalloc(names, sizeof(char *) * max);
		}
		add_name(names, &n, name);
	}
	if (dir != NULL)
		FreeDir(dir);
	qsort(names + first_installed, n - first_installed, sizeof(char *), compare_names);
	return names;
}

bool
RelayEndpointSecretKeys(RelayEndpointKind kind, const char *name, const char *const **keys)
{
	char	   *error;
	RegisteredType *t = load_type(kind, name, &error);

	*keys = t ? t->secret_keys : NULL;
	return t != NULL;
}
