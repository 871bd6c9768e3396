/*
 * mqtt_client.c
 *		The baseline of bench/broker_mqtt.sh: libmosquitto alone publishing
 *		N messages as the MQTT sink does (MQTT 5, QoS 1 or 2, the same user
 *		properties and content type, a body of the same size), at most
 *		IN_FLIGHT unacknowledged, and waiting for every acknowledgement.
 *		Prints the messages per second from the first publish to the last
 *		acknowledgement.
 *
 * usage: mqtt_client HOST PORT TOPIC N IN_FLIGHT QOS BODY_BYTES
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mosquitto.h>
/* mosquitto.h includes the protocol's constants from 2.1 on, which warns of the old header */
#ifndef MQTT_PROTOCOL_H
#include <mqtt_protocol.h>
#endif

static int	acked = 0;
static int	failed = 0;
static int	connected = 0;

static void
on_connect(struct mosquitto *m, void *arg, int rc, int flags, const mosquitto_property *p)
{
	connected = rc == 0 ? 1 : -1;
}

static void
on_publish(struct mosquitto *m, void *arg, int mid, int reason, const mosquitto_property *p)
{
	acked++;
	if (reason >= 0x80)
		failed++;
}

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int
main(int argc, char **argv)
{
	struct mosquitto *m;
	int			n, in_flight, qos, body_bytes, sent = 0;
	char	   *body;
	double		t0;

	if (argc != 8)
	{
		fprintf(stderr, "usage: %s HOST PORT TOPIC N IN_FLIGHT QOS BODY_BYTES\n", argv[0]);
		return 2;
	}
	n = atoi(argv[4]);
	in_flight = atoi(argv[5]);
	qos = atoi(argv[6]);
	body_bytes = atoi(argv[7]);
	body = malloc(body_bytes + 64);
	mosquitto_lib_init();
	m = mosquitto_new("pg_tide-bench-baseline", true, NULL);
	mosquitto_int_option(m, MOSQ_OPT_PROTOCOL_VERSION, MQTT_PROTOCOL_V5);
	mosquitto_int_option(m, MOSQ_OPT_SEND_MAXIMUM, in_flight);
	mosquitto_int_option(m, MOSQ_OPT_TCP_NODELAY, 1);
	mosquitto_max_inflight_messages_set(m, in_flight);
	mosquitto_connect_v5_callback_set(m, on_connect);
	mosquitto_publish_v5_callback_set(m, on_publish);
	if (mosquitto_connect(m, argv[1], atoi(argv[2]), 60) != MOSQ_ERR_SUCCESS)
	{
		fprintf(stderr, "cannot connect\n");
		return 1;
	}
	while (connected == 0)
		mosquitto_loop(m, 100, 1);
	if (connected < 0)
	{
		fprintf(stderr, "connection refused\n");
		return 1;
	}
	t0 = now_s();
	while (acked < n)
	{
		while (sent < n && sent - acked < in_flight)
		{
			mosquitto_property *props = NULL;
			char		id[64];
			int			len;

			snprintf(id, sizeof(id), "outbox_bench:%d", sent + 1);
			mosquitto_property_add_string(&props, MQTT_PROP_CONTENT_TYPE, "application/json");
			mosquitto_property_add_string_pair(&props, MQTT_PROP_USER_PROPERTY, "tide-id", id);
			mosquitto_property_add_string_pair(&props, MQTT_PROP_USER_PROPERTY, "tide-outbox", "bench");
			mosquitto_property_add_string_pair(&props, MQTT_PROP_USER_PROPERTY, "tide-created-at",
											   "2026-01-01T00:00:00.000000+00:00");
			/* the headers of bench/tide_single.sql's messages */
			mosquitto_property_add_string_pair(&props, MQTT_PROP_USER_PROPERTY, "trace_id",
											   "0123456789abcdef0123456789abcdef");
			mosquitto_property_add_string_pair(&props, MQTT_PROP_USER_PROPERTY, "source", "checkout-service");
			mosquitto_property_add_string_pair(&props, MQTT_PROP_USER_PROPERTY, "content_type",
											   "application/json");
			len = snprintf(body, body_bytes + 64, "{\"n\": %d, \"pad\": \"", sent + 1);
			while (len < body_bytes - 2)
				body[len++] = 'x';
			body[len++] = '"';
			body[len++] = '}';
			if (mosquitto_publish_v5(m, NULL, argv[3], len, body, qos, false, props) != MOSQ_ERR_SUCCESS)
			{
				fprintf(stderr, "publish failed\n");
				return 1;
			}
			mosquitto_property_free_all(&props);
			sent++;
		}
		if (mosquitto_loop(m, 1000, 1) != MOSQ_ERR_SUCCESS)
		{
			fprintf(stderr, "connection lost\n");
			return 1;
		}
	}
	printf("%.1f\n", n / (now_s() - t0));
	if (failed)
		fprintf(stderr, "%d messages refused\n", failed);
	mosquitto_disconnect(m);
	mosquitto_destroy(m);
	return failed ? 1 : 0;
}
