/*
 * kafka.h
 *		What the Kafka sink's two files share: the validator of its keys
 *		(config.c) and the librdkafka configuration built from a
 *		validated config, which the validator also builds once to let
 *		librdkafka check every property before a pipeline is accepted.
 */
#ifndef TIDE_KAFKA_H
#define TIDE_KAFKA_H

#include <librdkafka/rdkafka.h>

#include "sink.h"

extern const char *const RelayKafkaConfigKeys[];
extern void RelayKafkaValidate(const cJSON *config, cJSON *out);

/*
 * The producer's configuration from a validated config: the idempotent
 * producer with acks=all, the message and request timeouts within the
 * batch's timeout_ms (half of it each: see sink.c), compression, linger,
 * TLS, SASL with the given password (NULL: none), and the allowed extra
 * "producer" properties. NULL, with errstr, when librdkafka refuses one.
 * No palloc: errstr is the caller's.
 */
extern rd_kafka_conf_t *KafkaBuildConf(const cJSON *config, const char *password,
									   char *errstr, size_t errsize);

/*
 * Every property of a configuration and the password it was built with
 * (NULL: none), as one string (palloc'd): two producers made from
 * configurations with the same fingerprint are interchangeable. It holds
 * the password: zero it when done.
 */
extern char *KafkaConfFingerprint(const rd_kafka_conf_t *conf, const char *password);

/* The share of timeout_ms that a message may take in librdkafka. */
#define KAFKA_MESSAGE_TIMEOUT(timeout_ms)	((timeout_ms) / 2)

#endif							/* TIDE_KAFKA_H */
