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

#endif							/* TIDE_PIPELINE_CONFIG_H */
