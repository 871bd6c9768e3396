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
 * The config as stored: validated, with every default filled in, outbox
 * and consumer group included. outbox and consumer_group are those a
 * caller gives (the config's keys must then agree), or NULL to take them
 * from the config (a row of tide.relay_outbox_config). config NULL is an
 * error. Raises an ERROR on bad input. Rights are those of `role` (the
 * caller, or the pipeline's owner; InvalidOid: none): a file pipeline
 * needs it to be a superuser or a member of pg_write_server_files, a
 * server file named outside pg_tide.secrets_directory a superuser or a
 * role with the privileges of pg_read_server_files (42501).
 */
extern Jsonb *RelayNormalizeConfig(const char *outbox, const char *consumer_group, Jsonb *config,
								   Oid role);

/*
 * What a validator of one direction's config does once the config is known
 * to be an object: read `config` (jb is the same config as jsonb), add the
 * normalised keys to `out`, raise an ERROR on bad input.
 */
typedef void (*RelayNormalizer) (void *arg, Jsonb *jb, const cJSON *config, cJSON *out);

/*
 * Checks that config is a JSON object (an ERROR whose hint gives `example`
 * otherwise) and returns what fn makes of it, with the rights of `role`,
 * freeing what it allocated on every way out.
 */
extern Jsonb *RelayNormalizeWith(Jsonb *config, Oid role, const char *example,
								 RelayNormalizer fn, void *arg);

/*
 * A name the config holds under `key` (an outbox, consumer group, inbox):
 * `given` by the caller's parameter `param` (the key must then agree, else
 * mismatch_hint) or, given NULL, the key's string (missing_hint when
 * absent), checked as a name of `kind`.
 */
extern const char *RelayConfigNameKey(const cJSON *config, const char *key, const char *given,
									  const char *kind, const char *param,
									  const char *mismatch_hint, const char *missing_hint);

#endif							/* TIDE_PIPELINE_CONFIG_H */
