/*
 * sinks.h
 *		The routine of each sink type (see sink.h), for the lookup by name
 *		in sinks.c, and the validator its routine points at: nothing else
 *		names a sink.
 */
#ifndef TIDE_SINKS_H
#define TIDE_SINKS_H

#include "sink.h"

extern const RelaySinkRoutine RelayWebhookSinkRoutine;	/* webhook.c */
extern const RelaySinkRoutine RelayFileSinkRoutine; /* file.c */

/*
 * Each sink's validator and the keys it takes beyond those of every
 * pipeline, NULL-ended (<sink>_config.c; numbers as config_value.h reads
 * them). A sink that lists "batch_size", "retry" or "ordering" takes that
 * common key, read with the same rules for every sink (pipeline_config.c).
 */
extern void RelayWebhookValidate(const cJSON *config, cJSON *out);
extern void RelayFileValidate(const cJSON *config, cJSON *out);
extern const char *const RelayWebhookConfigKeys[];
extern const char *const RelayFileConfigKeys[];

#endif							/* TIDE_SINKS_H */
