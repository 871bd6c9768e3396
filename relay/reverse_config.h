/*
 * reverse_config.h
 *		The one validator of a reverse pipeline's config (source -> inbox):
 *		tide.relay_set_inbox, the trigger on tide.relay_inbox_config and the
 *		relay worker all call it; and the redaction of such a config.
 */
#ifndef TIDE_REVERSE_CONFIG_H
#define TIDE_REVERSE_CONFIG_H

#include "utils/jsonb.h"

/*
 * The config as stored: validated, with every default filled in, inbox
 * included. inbox is the one a caller gives (the config's key must then
 * agree), or NULL to take it from the config (a row of
 * tide.relay_inbox_config). config NULL is an error. Raises an ERROR on
 * bad input: 42704 for an inbox that does not exist, 22023 for anything
 * else the config says wrong, an unknown source type included. Rights are
 * those of `role`, as for RelayNormalizeConfig.
 */
extern Jsonb *RelayNormalizeReverseConfig(const char *inbox, Jsonb *config, Oid role);

/*
 * pipeline_names.c: refuses (23505) a pipeline name that the other
 * direction's table already holds (reverse: the name is for
 * tide.relay_inbox_config), holding until the transaction ends a lock
 * that makes a concurrent check of the same name wait.
 */
extern void RelayCheckPipelineNameFree(const char *name, bool reverse);

#endif							/* TIDE_REVERSE_CONFIG_H */
