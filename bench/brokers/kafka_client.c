/*
 * kafka_client.c
 *		The baseline of bench/broker_kafka.sh: librdkafka alone producing n
 *		messages like the ones the relay sends (a payload of about 200
 *		bytes, pg_tide's three headers and the bench's three), with the Kafka
 *		sink's acknowledgement settings (the idempotent producer, acks=all,
 *		linger.ms 1) and at most max_in_flight messages unreported, as the
 *		sink's max_in_flight allows. Prints the seconds from the first
 *		produce to the last delivery report, and the messages per second.
 *
 * Usage: kafka_client <bootstrap servers> <topic> <n> <max_in_flight>
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <librdkafka/rdkafka.h>

static long delivered = 0;
static long failed = 0;

static void
report(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	(void) rk;
	(void) opaque;
	if (m->err)
		failed++;
	else
		delivered++;
}

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int
main(int argc, char **argv)
{
	char		errstr[512];
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_t *rk;
	long		n,
				max_in_flight;
	double		t0,
				t1;
	static const char *const settings[][2] = {
		{"enable.idempotence", "true"}, {"acks", "all"}, {"linger.ms", "1"},
		{"message.timeout.ms", "5000"}, {"request.timeout.ms", "5000"}, {"log_level", "3"},
	};

	if (argc < 5)
	{
		fprintf(stderr, "usage: kafka_client <bootstrap servers> <topic> <n> <max_in_flight>\n");
		return 2;
	}
	n = atol(argv[3]);
	max_in_flight = atol(argv[4]);
	rd_kafka_conf_set(conf, "bootstrap.servers", argv[1], errstr, sizeof(errstr));
	for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++)
		if (rd_kafka_conf_set(conf, settings[i][0], settings[i][1], errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
		{
			fprintf(stderr, "kafka_client: %s\n", errstr);
			return 1;
		}
	rd_kafka_conf_set_dr_msg_cb(conf, report);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
	{
		fprintf(stderr, "kafka_client: %s\n", errstr);
		return 1;
	}
	t0 = now();
	for (long i = 0; i < n; i++)
	{
		char		payload[512];
		char		id[64];
		char		trace[33];
		rd_kafka_headers_t *h = rd_kafka_headers_new(8);
		int			len;

		while (i - delivered - failed >= max_in_flight)
			rd_kafka_poll(rk, 1);
		len = snprintf(payload, sizeof(payload),
					   "{\"sku\": \"SKU-%08ld\", \"items\": 3, \"event\": \"order.created\", "
					   "\"amount_cents\": %ld, \"currency\": \"EUR\", \"order_id\": %ld, "
					   "\"created_at\": \"2026-12-01T15:00:00.123456+00:00\", \"customer_id\": %ld}",
					   (10000000 + i) % 100000000, 100 + i % 99900, 10000000 + i, 100000 + i % 900000);
		snprintf(id, sizeof(id), "outbox_bench:%ld", i + 1);
		snprintf(trace, sizeof(trace), "%032lx", 10000000 + i);
		rd_kafka_header_add(h, "tide-id", -1, id, -1);
		rd_kafka_header_add(h, "tide-outbox", -1, "bench", -1);
		rd_kafka_header_add(h, "tide-created-at", -1, "2026-12-01T15:00:00.123456+00:00", -1);
		rd_kafka_header_add(h, "source", -1, "checkout-service", -1);
		rd_kafka_header_add(h, "trace_id", -1, trace, -1);
		rd_kafka_header_add(h, "content_type", -1, "application/json", -1);
		if (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(argv[2]), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
							  RD_KAFKA_V_VALUE(payload, len), RD_KAFKA_V_HEADERS(h),
							  RD_KAFKA_V_END) != RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			rd_kafka_headers_destroy(h);
			failed++;
		}
		rd_kafka_poll(rk, 0);
	}
	while (delivered + failed < n)
		rd_kafka_poll(rk, 1);
	t1 = now();
	printf("%.3f %.1f %ld\n", t1 - t0, n / (t1 - t0), failed);
	rd_kafka_destroy(rk);
	return failed > 0;
}
