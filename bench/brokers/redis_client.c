/*
 * redis_client.c
 *		The baseline of bench/broker_redis.sh: Redis's own C client
 *		(hiredis) appending the same messages the redis sink appends (the
 *		same fields, payload and headers of the same size) with the same
 *		acknowledgement rule (a message counts once its XADD is answered
 *		with an entry id) and the same number of XADDs in flight, pipelined
 *		on one connection.
 *
 * usage: redis_client <host> <port> <stream> <messages> <in flight>
 * Prints the seconds from the first XADD to the last answer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/hiredis.h>

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Appends message i's XADD, with the fields the sink gives it. */
static void
append_xadd(redisContext *c, const char *stream, long i)
{
	char		id[64];
	char		payload[256];
	const char *argv[13];
	size_t		lens[13];
	int			n = 0;

	snprintf(id, sizeof(id), "outbox_bench:%ld", i + 1);
	snprintf(payload, sizeof(payload),
			 "{\"event\": \"order.created\", \"order_id\": %ld, \"customer_id\": %ld, \"amount_cents\": %ld}",
			 i, i % 1000000, 100 + i % 100000);
#define ARG(s) (argv[n] = (s), lens[n] = strlen(s), n++)
	ARG("XADD");
	ARG(stream);
	ARG("*");
	ARG("tide-id");
	ARG(id);
	ARG("tide-outbox");
	ARG("bench");
	ARG("tide-created-at");
	ARG("2026-12-01T15:00:00.123456+00:00");
	ARG("headers");
	ARG("{\"type\": \"order.created\"}");
	ARG("payload");
	ARG(payload);
	redisAppendCommandArgv(c, n, argv, lens);
}

int
main(int argc, char **argv)
{
	redisContext *c;
	long		total;
	long		window;
	long		sent = 0;
	long		acked = 0;
	double		t0;

	if (argc != 6)
	{
		fprintf(stderr, "usage: %s <host> <port> <stream> <messages> <in flight>\n", argv[0]);
		return 2;
	}
	total = atol(argv[4]);
	window = atol(argv[5]);
	c = redisConnect(argv[1], atoi(argv[2]));
	if (c == NULL || c->err)
	{
		fprintf(stderr, "redis_client: cannot connect: %s\n", c ? c->errstr : "out of memory");
		return 1;
	}
	t0 = now();
	while (acked < total)
	{
		redisReply *r;

		while (sent < total && sent - acked < window)
			append_xadd(c, argv[3], sent++);
		if (redisGetReply(c, (void **) &r) != REDIS_OK)
		{
			fprintf(stderr, "redis_client: %s\n", c->errstr);
			return 1;
		}
		if (r->type != REDIS_REPLY_STRING)
		{
			fprintf(stderr, "redis_client: XADD answered %s\n", r->str ? r->str : "something else");
			return 1;
		}
		freeReplyObject(r);
		acked++;
	}
	printf("%.6f\n", now() - t0);
	redisFree(c);
	return 0;
}
