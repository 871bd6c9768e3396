/*
 * mqtt.h
 *		What the MQTT sink's two files share: the validator of its config
 *		keys (config.c) and the keys, for its routine (sink.c).
 */
#ifndef TIDE_MQTT_H
#define TIDE_MQTT_H

#include <cjson/cJSON.h>

/* The port of an MQTT broker when the config gives none. */
#define MQTT_DEFAULT_PORT	1883

extern const char *const RelayMqttConfigKeys[];
extern void RelayMqttValidate(const cJSON *config, cJSON *out);

#endif							/* TIDE_MQTT_H */
