/*
 * rabbitmq_client.c
 *		The baseline of bench/broker_rabbitmq.sh: rabbitmq-c alone
 *		publishing N messages the way the RabbitMQ sink does (persistent,
 *		mandatory, publisher confirms, the same properties and headers,
 *		bodies of the same size), with at most MAX_IN_FLIGHT unconfirmed,
 *		reading confirms as they come. Prints the seconds from the first
 *		publish to the last confirm.
 *
 *	rabbitmq_client HOST PORT USER PASSWORD VHOST EXCHANGE ROUTING_KEY N MAX_IN_FLIGHT BODY_BYTES [RATE]
 *
 * With RATE, the messages go at RATE a second, each body holding "sent",
 * the time it was published (seconds since 1970): a consumer's receipt
 * time minus it is the broker's own latency, for the sink's to be compared
 * with.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "../../test/brokers/rabbitmq_amqp.h"

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
check(amqp_rpc_reply_t r, const char *what)
{
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		fprintf(stderr, "%s failed\n", what);
		exit(1);
	}
}

int
main(int argc, char **argv)
{
	amqp_connection_state_t conn;
	amqp_socket_t *sock;
	long		n,
				max_in_flight,
				body_bytes;
	long		sent = 0,
				confirmed = 0;
	char	   *body;
	double		start;
	double		rate = 0;

	if (argc != 11 && argc != 12)
	{
		fprintf(stderr, "usage: %s HOST PORT USER PASSWORD VHOST EXCHANGE ROUTING_KEY N MAX_IN_FLIGHT BODY_BYTES [RATE]\n", argv[0]);
		return 1;
	}
	n = atol(argv[8]);
	max_in_flight = atol(argv[9]);
	body_bytes = atol(argv[10]);
	if (argc == 12)
		rate = atof(argv[11]);
	conn = amqp_new_connection();
	sock = amqp_tcp_socket_new(conn);
	if (amqp_socket_open(sock, argv[1], atoi(argv[2])) != AMQP_STATUS_OK)
	{
		fprintf(stderr, "could not connect\n");
		return 1;
	}
	check(amqp_login(conn, argv[5], 0, AMQP_DEFAULT_FRAME_SIZE, 0, AMQP_SASL_METHOD_PLAIN, argv[3], argv[4]), "login");
	amqp_channel_open(conn, 1);
	check(amqp_get_rpc_reply(conn), "channel.open");
	amqp_confirm_select(conn, 1);
	check(amqp_get_rpc_reply(conn), "confirm.select");

	/* a body of the sink's size: {"n": ..., "pad": "xxx..."} */
	body = malloc(body_bytes + 64);
	start = now();
	while (confirmed < n)
	{
		while (sent < n && sent - confirmed < max_in_flight)
		{
			amqp_basic_properties_t props;
			amqp_table_entry_t h[5];
			char		id[64];
			char		created[64];
			int			len;

			snprintf(id, sizeof(id), "outbox_bench:%ld", sent + 1);
			snprintf(created, sizeof(created), "2026-01-01T00:00:00.000000+00:00");
			if (rate > 0)
			{
				struct timeval tv;

				/* paced: the next message is due at start + sent / rate */
				while (now() < start + sent / rate)
					usleep(200);
				gettimeofday(&tv, NULL);
				len = snprintf(body, body_bytes + 64, "{\"n\": %ld, \"sent\": %.6f}", sent + 1,
							   tv.tv_sec + tv.tv_usec / 1e6);
			}
			else
				len = snprintf(body, body_bytes + 64, "{\"n\": %ld, \"pad\": \"%*s\"}", sent + 1,
							   (int) (body_bytes > 30 ? body_bytes - 30 : 1), "x");
			h[0].key = amqp_cstring_bytes("tide-id");
			h[1].key = amqp_cstring_bytes("tide-outbox");
			h[2].key = amqp_cstring_bytes("tide-created-at");
			h[3].key = amqp_cstring_bytes("trace_id");
			h[4].key = amqp_cstring_bytes("source");
			for (int i = 0; i < 5; i++)
				h[i].value.kind = AMQP_FIELD_KIND_UTF8;
			h[0].value.value.bytes = amqp_cstring_bytes(id);
			h[1].value.value.bytes = amqp_cstring_bytes("bench");
			h[2].value.value.bytes = amqp_cstring_bytes(created);
			h[3].value.value.bytes = amqp_cstring_bytes("0123456789abcdef0123456789abcdef");
			h[4].value.value.bytes = amqp_cstring_bytes("checkout-service");
			memset(&props, 0, sizeof(props));
			props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
				AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TIMESTAMP_FLAG | AMQP_BASIC_HEADERS_FLAG;
			props.content_type = amqp_cstring_bytes("application/json");
			props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
			props.message_id = amqp_cstring_bytes(id);
			props.timestamp = (uint64_t) time(NULL);
			props.headers.num_entries = 5;
			props.headers.entries = h;
			if (amqp_basic_publish(conn, 1, amqp_cstring_bytes(argv[6]), amqp_cstring_bytes(argv[7]),
								   1, 0, &props, (amqp_bytes_t) {.len = len, .bytes = body}) != AMQP_STATUS_OK)
			{
				fprintf(stderr, "publish failed\n");
				return 1;
			}
			sent++;
		}
		/* wait for what the broker sends: confirms (one, or several with multiple) */
		{
			amqp_frame_t f;

			if (amqp_simple_wait_frame(conn, &f) != AMQP_STATUS_OK)
			{
				fprintf(stderr, "connection lost\n");
				return 1;
			}
			if (f.frame_type == AMQP_FRAME_METHOD && f.payload.method.id == AMQP_BASIC_ACK_METHOD)
			{
				amqp_basic_ack_t *a = f.payload.method.decoded;

				confirmed = a->multiple ? (long) a->delivery_tag : confirmed + 1;
			}
			else if (f.frame_type == AMQP_FRAME_METHOD && f.payload.method.id != AMQP_BASIC_RETURN_METHOD)
			{
				fprintf(stderr, "unexpected method 0x%08x\n", f.payload.method.id);
				return 1;
			}
			amqp_maybe_release_buffers(conn);
		}
	}
	printf("%.3f\n", now() - start);
	amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(conn);
	return 0;
}
