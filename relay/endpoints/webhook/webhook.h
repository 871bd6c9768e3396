/*
 * webhook.h
 *		What the webhook sink's two files share: the validator of its keys
 *		(config.c), which its routine (sink.c) points at.
 */
#ifndef TIDE_WEBHOOK_H
#define TIDE_WEBHOOK_H

#include <cjson/cJSON.h>

extern void RelayWebhookValidate(const cJSON *config, cJSON *out);
extern const char *const RelayWebhookConfigKeys[];

#endif							/* TIDE_WEBHOOK_H */
