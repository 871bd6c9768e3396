/*
 * sinks.c
 *		The sink types the relay knows, by the name a pipeline's config
 *		gives as sink_type. A new sink is its file in relay/sinks/ and one
 *		line here.
 *
 * The webhook and file sinks are part of pg_tide.so. A broker's sink is a
 * module of its own (pg_tide_kafka.so, ...), linked with the broker's
 * client library, so that pg_tide.so loads on a server that lacks that
 * library: the module is loaded the first time a config names its sink
 * type, and when it cannot be, only pipelines of that type are refused,
 * with the package to install. A module exports one function,
 * pg_tide_sink_routine(), returning its RelaySinkRoutine.
 */
#include "postgres.h"

#include <sys/stat.h>

#include "fmgr.h"
#include "miscadmin.h"

#include "endpoints/inbox/inbox_sink.h"
#include "sink.h"
#include "sinks.h"

typedef struct SinkType
{
	const char *name;
	const RelaySinkRoutine *builtin;	/* in pg_tide.so, or NULL: a module */
	const char *module;			/* the module's file name in $libdir */
	const char *library_package;	/* Debian's package of the client library */
	const char *dev_package;	/* and of its headers, to build the module */
} SinkType;

static const SinkType sink_types[] = {
	{"webhook", &RelayWebhookSinkRoutine},
	{"file", &RelayFileSinkRoutine},
	{"inbox", &RelayInboxSinkRoutine},
	{"kafka", NULL, "pg_tide_kafka", "librdkafka1", "librdkafka-dev"},
	{"nats", NULL, "pg_tide_nats", "libnats3.4", "libnats-dev"},
	{"redis", NULL, "pg_tide_redis", "libhiredis0.14", "libhiredis-dev"},
	{"rabbitmq", NULL, "pg_tide_rabbitmq", "librabbitmq4", "librabbitmq-dev"},
	{"mqtt", NULL, "pg_tide_mqtt", "libmosquitto1", "libmosquitto-dev"},
};

/* The routines of the modules loaded so far in this process, by index. */
static const RelaySinkRoutine *loaded[lengthof(sink_types)];

static int
sink_index(const char *name)
{
	if (name == NULL)
		return -1;
	for (size_t i = 0; i < lengthof(sink_types); i++)
		if (strcmp(sink_types[i].name, name) == 0)
			return (int) i;
	return -1;
}

/*
 * Loads the module of sink type t; NULL, with *error and *hint, when it is
 * not installed or its client library cannot be loaded. An ERROR other
 * than the loader's (a cancel) is raised again.
 */
static const RelaySinkRoutine *
load_module(const SinkType *t, char **error)
{
	char		path[MAXPGPATH];
	struct stat st;
	MemoryContext cxt = CurrentMemoryContext;
	const RelaySinkRoutine *volatile routine = NULL;

	snprintf(path, sizeof(path), "%s/%s%s", pkglib_path, t->module, DLSUFFIX);
	if (stat(path, &st) != 0)
	{
		*error = psprintf("%s%s is not installed", t->module, DLSUFFIX);
		return NULL;
	}
	PG_TRY();
	{
		PGFunction	get = load_external_function(path, "pg_tide_sink_routine", true, NULL);

		routine = ((const RelaySinkRoutine *(*) (void)) (void *) get) ();
	}
	PG_CATCH();
	{
		ErrorData  *e;

		MemoryContextSwitchTo(cxt);
		e = CopyErrorData();
		if (e->sqlerrcode == ERRCODE_QUERY_CANCELED || e->sqlerrcode == ERRCODE_ADMIN_SHUTDOWN)
			PG_RE_THROW();
		FlushErrorState();
		*error = psprintf("%s%s cannot be loaded: %s", t->module, DLSUFFIX,
						  e->detail ? e->detail : e->message);
	}
	PG_END_TRY();
	if (routine != NULL && strcmp(routine->name, t->name) != 0)
	{
		*error = psprintf("%s%s is the sink of \"%s\", not of \"%s\"", t->module, DLSUFFIX,
						  routine->name, t->name);
		return NULL;
	}
	return routine;
}

/*
 * The routine of a sink type, loading its module if need be; an ERROR
 * (42704, with the package to install) when there is no such type or its
 * module cannot be loaded.
 */
const RelaySinkRoutine *
RelaySinkLoad(const char *name)
{
	int			i = sink_index(name);
	char	   *error = NULL;

	if (i < 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("sink type \"%s\" does not exist", name ? name : ""),
				 errhint("See docs/relay.md for the sink types.")));
	if (sink_types[i].builtin != NULL)
		return sink_types[i].builtin;
	if (loaded[i] == NULL)
		loaded[i] = load_module(&sink_types[i], &error);
	if (loaded[i] == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("sink type \"%s\" is not available on this server", name),
				 errdetail("%s.", error),
				 errhint("Install the package postgresql-%s-pg-tide-%s (it brings Debian's %s), or build pg_tide where %s is installed (its make builds %s%s); then set the pipeline again.",
						 PG_MAJORVERSION, sink_types[i].name, sink_types[i].library_package,
						 sink_types[i].dev_package, sink_types[i].module, DLSUFFIX)));
	return loaded[i];
}

/*
 * The routine of a sink type, or NULL when there is none of that name or
 * its module has not been loaded in this process (RelaySinkLoad loads it:
 * every config is validated, which loads it, before it is served).
 */
const RelaySinkRoutine *
RelaySinkLookup(const char *name)
{
	int			i = sink_index(name);

	if (i < 0)
		return NULL;
	return sink_types[i].builtin ? sink_types[i].builtin : loaded[i];
}

/* The i-th sink type's name, from 0, or NULL past the last. */
const char *
RelaySinkNameAt(int i)
{
	return i >= 0 && i < (int) lengthof(sink_types) ? sink_types[i].name : NULL;
}
