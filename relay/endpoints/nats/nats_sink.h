/*
 * nats_sink.h
 *		What the NATS JetStream sink's two files share: sink.c (the routine
 *		and the delivery) and config.c (the validator of its keys).
 *		Not named nats.h, which is nats.c's client library's header.
 */
#ifndef TIDE_NATS_SINK_H
#define TIDE_NATS_SINK_H

#include <cjson/cJSON.h>

extern const char *const RelayNatsConfigKeys[];
extern void RelayNatsValidate(const cJSON *config, cJSON *out);

#endif							/* TIDE_NATS_SINK_H */
