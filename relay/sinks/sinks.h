/*
 * sinks.h
 *		The routine of each sink type (see sink.h), for the lookup by name
 *		in sinks.c only: nothing else names a sink.
 */
#ifndef TIDE_SINKS_H
#define TIDE_SINKS_H

#include "sink.h"

extern const RelaySinkRoutine RelayWebhookSinkRoutine;	/* webhook.c */
extern const RelaySinkRoutine RelayFileSinkRoutine; /* file.c */

#endif							/* TIDE_SINKS_H */
