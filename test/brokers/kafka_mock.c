/*
 * kafka_mock.c
 *		A Kafka cluster for the Kafka sink's tests, and for trying the sink
 *		on one's own machine (docs/sinks/local.md; `make
 *		test/brokers/kafka_mock` builds it): librdkafka's mock cluster
 *		(rdkafka_mock.h), which speaks the Kafka protocol on 127.0.0.1
 *		and keeps what it is sent, including the idempotent
 *		producer's sequence checks. Prints its bootstrap servers on one line,
 *		then reads commands on stdin until "quit" or end of input, and
 *		answers each with "ok" (or "error: ...") on stdout:
 *
 *		create <topic> <partitions>	creates a topic
 *		down | up						stops / starts every broker (connections
 *										dropped and refused, the data kept)
 *		error <api key> <error code> <count>
 *										the next <count> requests of that kind
 *										fail with that Kafka error code
 *		rtt <ms>						delays every broker's answers
 *		topic_error <topic> <error code>
 *										metadata requests about that topic
 *										answer the error (3: the topic does not
 *										exist; the mock creates any topic it is
 *										asked about otherwise)
 *
 * Usage: kafka_mock [brokers]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

int
main(int argc, char **argv)
{
	char		errstr[512];
	char		line[1024];
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_t *rk;
	rd_kafka_mock_cluster_t *mc;
	int			brokers = argc > 1 ? atoi(argv[1]) : 1;

	rd_kafka_conf_set(conf, "log_level", "0", errstr, sizeof(errstr));
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
	{
		fprintf(stderr, "kafka_mock: %s\n", errstr);
		return 1;
	}
	mc = rd_kafka_mock_cluster_new(rk, brokers);
	if (mc == NULL)
	{
		fprintf(stderr, "kafka_mock: cannot start the mock cluster\n");
		return 1;
	}
	printf("%s\n", rd_kafka_mock_cluster_bootstraps(mc));
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin) != NULL)
	{
		char		topic[512];
		int			a,
					b,
					c;
		rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;

		if (strncmp(line, "quit", 4) == 0)
			break;
		if (sscanf(line, "create %511s %d", topic, &a) == 2)
			err = rd_kafka_mock_topic_create(mc, topic, a, 1);
		else if (strncmp(line, "down", 4) == 0)
			err = rd_kafka_mock_broker_set_down(mc, -1);
		else if (strncmp(line, "up", 2) == 0)
			err = rd_kafka_mock_broker_set_up(mc, -1);
		else if (sscanf(line, "error %d %d %d", &a, &b, &c) == 3)
		{
			rd_kafka_resp_err_t *errs = calloc(c, sizeof(*errs));

			for (int i = 0; i < c; i++)
				errs[i] = (rd_kafka_resp_err_t) b;
			rd_kafka_mock_push_request_errors_array(mc, (int16_t) a, c, errs);
			free(errs);
		}
		else if (sscanf(line, "topic_error %511s %d", topic, &a) == 2)
			rd_kafka_mock_topic_set_error(mc, topic, (rd_kafka_resp_err_t) a);
		else if (sscanf(line, "rtt %d", &a) == 1)
			err = rd_kafka_mock_broker_set_rtt(mc, -1, a);
		else
		{
			printf("error: unknown command\n");
			fflush(stdout);
			continue;
		}
		if (err)
			printf("error: %s\n", rd_kafka_err2str(err));
		else
			printf("ok\n");
		fflush(stdout);
	}
	rd_kafka_mock_cluster_destroy(mc);
	rd_kafka_destroy(rk);
	return 0;
}
