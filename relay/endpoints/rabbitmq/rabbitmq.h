/*
 * rabbitmq.h
 *		What the RabbitMQ sink's two files share (sink.c delivers,
 *		config.c validates): rabbitmq-c's headers, which moved
 *		to rabbitmq-c/ in 0.14 (the old names warn, which -Werror
 *		refuses), and the validator.
 */
#ifndef TIDE_SINK_RABBITMQ_H
#define TIDE_SINK_RABBITMQ_H

#include "sink.h"

#if defined(__has_include)
#if __has_include(<rabbitmq-c/amqp.h>)
#define TIDE_RABBITMQ_C_DIR 1
#endif
#endif

#ifdef TIDE_RABBITMQ_C_DIR
#include <rabbitmq-c/amqp.h>
#include <rabbitmq-c/ssl_socket.h>
#include <rabbitmq-c/tcp_socket.h>
#else
#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#endif

/* The default ports: plain AMQP, and AMQP over TLS. */
#define RABBITMQ_PORT		5672
#define RABBITMQ_TLS_PORT	5671

extern const char *const RelayRabbitmqConfigKeys[];
extern void RelayRabbitmqValidate(const cJSON *config, cJSON *out);

#endif							/* TIDE_SINK_RABBITMQ_H */
