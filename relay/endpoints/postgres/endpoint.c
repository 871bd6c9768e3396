/*
 * endpoint.c
 *		The postgres endpoint's init symbol (endpoints/registry.h): the
 *		module pg_tide_postgres.so provides a sink (sink.c: an outbox into
 *		another pg_tide database's inbox) and a source (source.c: another
 *		pg_tide database's outbox into a local inbox), both over libpq.
 */
#include "postgres.h"

#include "fmgr.h"

#include "endpoints/registry.h"
#include "remote.h"

PG_MODULE_MAGIC;

extern PGDLLEXPORT void pg_tide_endpoint_postgres(void);

/* Registers the endpoint's sink and source; called once per process. */
void
pg_tide_endpoint_postgres(void)
{
	RelayRegisterSink(&RemoteSinkRoutine);
	RelayRegisterSource(&RemoteSourceRoutine);
}
