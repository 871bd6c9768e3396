/*
 * kafka_consume.c
 *		The consuming side of the Kafka sink's tests: a librdkafka consumer
 *		that reads a topic from the beginning of every partition to its
 *		end and prints each message as one JSON line: {"topic", "partition",
 *		"offset", "key" (null when none), "headers" (an array of [name,
 *		value]), "body"}. Exits once every partition is read to its end;
 *		with "follow", keeps reading until no message came for timeout ms,
 *		and each line also has "t", the time it was received (seconds since
 *		the epoch, to the microsecond), for bench/broker_kafka.sh.
 *
 * Usage: kafka_consume <bootstrap servers> <topic> [timeout ms [follow]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <cjson/cJSON.h>
#include <librdkafka/rdkafka.h>

static cJSON *
text(const void *p, size_t len)
{
	char	   *s = malloc(len + 1);
	cJSON	   *j;

	memcpy(s, p, len);
	s[len] = '\0';
	j = cJSON_CreateString(s);
	free(s);
	return j;
}

int
main(int argc, char **argv)
{
	char		errstr[512];
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_t *rk;
	const rd_kafka_metadata_t *md;
	rd_kafka_topic_t *rkt;
	rd_kafka_topic_partition_list_t *parts;
	int			nparts = 0,
				ended = 0;
	int			timeout_ms = argc > 3 ? atoi(argv[3]) : 10000;
	int			waited = 0;
	int			follow = argc > 4 && strcmp(argv[4], "follow") == 0;

	if (argc < 3)
	{
		fprintf(stderr, "usage: kafka_consume <bootstrap servers> <topic> [timeout ms]\n");
		return 2;
	}
	rd_kafka_conf_set(conf, "bootstrap.servers", argv[1], errstr, sizeof(errstr));
	rd_kafka_conf_set(conf, "group.id", "kafka_consume", errstr, sizeof(errstr));
	rd_kafka_conf_set(conf, "enable.partition.eof", "true", errstr, sizeof(errstr));
	rd_kafka_conf_set(conf, "enable.auto.commit", "false", errstr, sizeof(errstr));
	rd_kafka_conf_set(conf, "log_level", "0", errstr, sizeof(errstr));
	/* answered as soon as there is a message: the bench measures arrival */
	rd_kafka_conf_set(conf, "fetch.wait.max.ms", "1", errstr, sizeof(errstr));
	rd_kafka_conf_set(conf, "fetch.error.backoff.ms", "1", errstr, sizeof(errstr));
	rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
	{
		fprintf(stderr, "kafka_consume: %s\n", errstr);
		return 1;
	}
	rkt = rd_kafka_topic_new(rk, argv[2], NULL);
	if (rd_kafka_metadata(rk, 0, rkt, &md, timeout_ms) != RD_KAFKA_RESP_ERR_NO_ERROR ||
		md->topic_cnt != 1 || md->topics[0].err)
	{
		fprintf(stderr, "kafka_consume: no topic %s\n", argv[2]);
		return 1;
	}
	nparts = md->topics[0].partition_cnt;
	parts = rd_kafka_topic_partition_list_new(nparts);
	for (int i = 0; i < nparts; i++)
		rd_kafka_topic_partition_list_add(parts, argv[2], md->topics[0].partitions[i].id)->offset =
			RD_KAFKA_OFFSET_BEGINNING;
	rd_kafka_metadata_destroy(md);
	rd_kafka_topic_destroy(rkt);
	rd_kafka_assign(rk, parts);
	while ((follow || ended < nparts) && waited < timeout_ms)
	{
		struct timeval tv;
		rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
		rd_kafka_headers_t *hdrs;
		cJSON	   *line,
				   *headers;
		char	   *out;

		if (m == NULL)
		{
			waited += 100;
			continue;
		}
		gettimeofday(&tv, NULL);
		if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF)
		{
			ended++;
			rd_kafka_message_destroy(m);
			continue;
		}
		waited = 0;
		if (m->err)
		{
			fprintf(stderr, "kafka_consume: %s\n", rd_kafka_message_errstr(m));
			rd_kafka_message_destroy(m);
			continue;
		}
		line = cJSON_CreateObject();
		cJSON_AddStringToObject(line, "topic", rd_kafka_topic_name(m->rkt));
		cJSON_AddNumberToObject(line, "partition", m->partition);
		cJSON_AddNumberToObject(line, "offset", (double) m->offset);
		cJSON_AddItemToObject(line, "key", m->key ? text(m->key, m->key_len) : cJSON_CreateNull());
		headers = cJSON_AddArrayToObject(line, "headers");
		if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			const char *name;
			const void *value;
			size_t		size;

			for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &value, &size) == 0; i++)
			{
				cJSON	   *pair = cJSON_CreateArray();

				cJSON_AddItemToArray(pair, cJSON_CreateString(name));
				cJSON_AddItemToArray(pair, value ? text(value, size) : cJSON_CreateNull());
				cJSON_AddItemToArray(headers, pair);
			}
		}
		cJSON_AddItemToObject(line, "body", text(m->payload, m->len));
		if (follow)
			cJSON_AddNumberToObject(line, "t", tv.tv_sec + tv.tv_usec / 1e6);
		out = cJSON_PrintUnformatted(line);
		printf("%s\n", out);
		free(out);
		cJSON_Delete(line);
		rd_kafka_message_destroy(m);
	}
	rd_kafka_topic_partition_list_destroy(parts);
	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
	if (!follow && ended < nparts)
	{
		fprintf(stderr, "kafka_consume: timed out before the end of %s\n", argv[2]);
		return 1;
	}
	return 0;
}
