/*
 * pipeline_config.h
 *		The one validator of a pipeline config: RelayNormalizeConfig checks
 *		the keys every pipeline has and hands the sink's own keys to the
 *		sink's validator; tide.relay_set_outbox, the trigger on
 *		tide.relay_outbox_config and the relay worker all call it.
 */
#ifndef TIDE_PIPELINE_CONFIG_H
#define TIDE_PIPELINE_CONFIG_H

#include <cjson/cJSON.h>

#include "utils/jsonb.h"

/*
 * A sink's validator: reads the sink's own keys of the user's config
 * (numbers as in config_value.h), raises an ERROR on bad input and adds
 * the sink's keys with their defaults to out.
 */
typedef void (*RelaySinkValidate) (const cJSON *config, cJSON *out);

/*
 * The sinks' validators (relay/sinks/<sink>_config.c), each with the
 * NULL-terminated list of the keys its sink takes beyond those of every
 * pipeline. A sink that lists "batch_size", "retry" or "ordering" takes
 * that common key, read with the same rules for every sink.
 */
extern void RelayWebhookValidate(const cJSON *config, cJSON *out);
extern void RelayFileValidate(const cJSON *config, cJSON *out);
extern const char *const RelayWebhookConfigKeys[];
extern const char *const RelayFileConfigKeys[];

/*
 * The config as stored: validated, with every default filled in, outbox
 * and consumer group included. outbox and consumer_group are those a
 * caller gives (the config's keys must then agree), or NULL to take them
 * from the config (a row of tide.relay_outbox_config). config NULL is an
 * error. Raises an ERROR on bad input; a file pipeline needs the current
 * user to be a superuser or a member of pg_write_server_files (42501).
 */
extern Jsonb *RelayNormalizeConfig(const char *outbox, const char *consumer_group, Jsonb *config);

#endif							/* TIDE_PIPELINE_CONFIG_H */
