/*
 * sinks.c
 *		The sink types the relay knows, by the name a pipeline's config
 *		gives as sink_type. A new sink is its file in relay/sinks/ and one
 *		line here.
 */
#include "postgres.h"

#include "sink.h"
#include "sinks.h"

static const RelaySinkRoutine *const sink_routines[] = {
	&RelayWebhookSinkRoutine,
	&RelayFileSinkRoutine,
};

/* The routine of a sink type, or NULL when there is none of that name. */
const RelaySinkRoutine *
RelaySinkLookup(const char *name)
{
	if (name == NULL)
		return NULL;
	for (size_t i = 0; i < lengthof(sink_routines); i++)
		if (strcmp(sink_routines[i]->name, name) == 0)
			return sink_routines[i];
	return NULL;
}

/* The i-th sink type's routine, from 0, or NULL past the last. */
const RelaySinkRoutine *
RelaySinkAt(int i)
{
	return i >= 0 && i < (int) lengthof(sink_routines) ? sink_routines[i] : NULL;
}
