/*
 * rabbitmq_amqp.h
 *		rabbitmq-c's headers for the test and benchmark clients
 *		(rabbitmq_read.c, bench/brokers/rabbitmq_client.c): under
 *		rabbitmq-c/ since 0.14, where the old names warn.
 */
#ifndef TIDE_TEST_RABBITMQ_AMQP_H
#define TIDE_TEST_RABBITMQ_AMQP_H

#if defined(__has_include)
#if __has_include(<rabbitmq-c/amqp.h>)
#define RABBITMQ_C_DIR 1
#endif
#endif
#ifdef RABBITMQ_C_DIR
#include <rabbitmq-c/amqp.h>
#include <rabbitmq-c/tcp_socket.h>
#else
#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#endif

#endif							/* TIDE_TEST_RABBITMQ_AMQP_H */
