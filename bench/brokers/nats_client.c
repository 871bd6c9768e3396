/*
 * nats_client.c
 *		The NATS side of bench/broker_nats.sh, written with nats.c alone:
 *
 *	nats_client URL publish SUBJECT N MAX_IN_FLIGHT PAYLOAD_FILE
 *		the baseline: publishes N messages to JetStream as the relay does
 *		(the payload read from PAYLOAD_FILE as the body, the headers
 *		tide-id, tide-outbox, tide-created-at and Nats-Msg-Id, async
 *		publishes with an ack handler, at most MAX_IN_FLIGHT awaiting their
 *		PubAck), waits for every acknowledgement and prints the seconds
 *		taken and the failures
 *	nats_client URL listen SUBJECT
 *		a core NATS subscriber: prints "<tide-id> <epoch microseconds>" for
 *		each message as it arrives, until SIGTERM
 */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <nats/nats.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t answered = PTHREAD_COND_INITIALIZER;
static int	in_flight;
static int	failures;
static volatile sig_atomic_t stop;

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
die(const char *what, natsStatus s)
{
	fprintf(stderr, "nats_client: %s: %s\n", what, natsStatus_GetText(s));
	exit(1);
}

static void
ack_handler(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure)
{
	pthread_mutex_lock(&lock);
	in_flight--;
	if (pa == NULL)
		failures++;
	pthread_cond_signal(&answered);
	pthread_mutex_unlock(&lock);
	natsMsg_Destroy(msg);
}

static void
on_msg(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
	const char *id = NULL;
	struct timeval tv;

	gettimeofday(&tv, NULL);
	if (natsMsgHeader_Get(msg, "tide-id", &id) == NATS_OK)
		printf("%s %" PRId64 "\n", id, (int64_t) tv.tv_sec * 1000000 + tv.tv_usec);
	fflush(stdout);
	natsMsg_Destroy(msg);
}

static void
on_term(int sig)
{
	stop = 1;
}

int
main(int argc, char **argv)
{
	natsConnection *nc = NULL;
	natsStatus	s;

	if (argc < 4)
	{
		fprintf(stderr, "usage: nats_client URL publish|listen SUBJECT ...\n");
		return 2;
	}
	if ((s = natsConnection_ConnectTo(&nc, argv[1])) != NATS_OK)
		die("connect", s);
	if (strcmp(argv[2], "publish") == 0 && argc >= 7)
	{
		int			n = atoi(argv[4]);
		int			max_in_flight = atoi(argv[5]);
		FILE	   *f = fopen(argv[6], "r");
		char		payload[65536];
		size_t		len;
		jsOptions	jo;
		jsCtx	   *js = NULL;
		double		t0;

		if (f == NULL)
			return 1;
		len = fread(payload, 1, sizeof(payload), f);
		fclose(f);
		jsOptions_Init(&jo);
		jo.PublishAsync.MaxPending = 100000;
		jo.PublishAsync.AckHandler = ack_handler;
		if ((s = natsConnection_JetStream(&js, nc, &jo)) != NATS_OK)
			die("jetstream", s);
		t0 = now();
		for (int i = 1; i <= n; i++)
		{
			natsMsg    *m = NULL;
			char		id[64];

			pthread_mutex_lock(&lock);
			while (in_flight >= max_in_flight)
				pthread_cond_wait(&answered, &lock);
			in_flight++;
			pthread_mutex_unlock(&lock);
			snprintf(id, sizeof(id), "outbox_baseline:%d", i);
			if ((s = natsMsg_Create(&m, argv[3], NULL, payload, (int) len)) != NATS_OK ||
				(s = natsMsgHeader_Set(m, "tide-id", id)) != NATS_OK ||
				(s = natsMsgHeader_Set(m, "tide-outbox", "baseline")) != NATS_OK ||
				(s = natsMsgHeader_Set(m, "tide-created-at", "2026-01-01T00:00:00.000000+00:00")) != NATS_OK ||
				(s = natsMsgHeader_Set(m, "trace_id", "5f0b1c7e3a9d4e2f8b6a1c0d9e8f7a6b")) != NATS_OK ||
				(s = natsMsgHeader_Set(m, "Nats-Msg-Id", id)) != NATS_OK ||
				(s = js_PublishMsgAsync(js, &m, NULL)) != NATS_OK)
				die("publish", s);
			natsMsg_Destroy(m);
		}
		pthread_mutex_lock(&lock);
		while (in_flight > 0)
			pthread_cond_wait(&answered, &lock);
		pthread_mutex_unlock(&lock);
		printf("%.6f %d\n", now() - t0, failures);
		jsCtx_Destroy(js);
	}
	else if (strcmp(argv[2], "listen") == 0)
	{
		natsSubscription *sub = NULL;

		signal(SIGTERM, on_term);
		if ((s = natsConnection_Subscribe(&sub, nc, argv[3], on_msg, NULL)) != NATS_OK ||
			(s = natsConnection_Flush(nc)) != NATS_OK)
			die("subscribe", s);
		fprintf(stderr, "subscribed\n");
		while (!stop)
			usleep(100000);
		natsSubscription_Destroy(sub);
	}
	else
		return 2;
	natsConnection_Destroy(nc);
	return 0;
}
