/*
 * sink.c
 *		The Kafka sink (pg_tide_kafka.so): produces each message to a
 *		topic with librdkafka's idempotent producer (acks=all), and counts a
 *		message delivered only when its delivery report says so.
 *
 * 1. `open` builds one producer per pipeline (config.c's
 *	  KafkaBuildConf), kept across batches until `close`. librdkafka runs
 *	  its own threads; they never call back into PostgreSQL. Its main
 *	  queue, where delivery reports and errors wait, writes to the
 *	  pipeline's RelayNotifier (an eventfd in the worker's wait) when it
 *	  stops being empty, and the loop drains it with rd_kafka_poll(rk, 0),
 *	  which runs the callbacks below in the worker's own thread, never
 *	  blocking.
 * 2. `start`/`progress` produce what the send window allows (broker.h:
 *	  max_in_flight, ordering 'key' and 'strict'): the topic from the
 *	  "topic" template, the key from the message's ordering key when the
 *	  pipeline has one (so a key keeps its partition), pg_tide's headers
 *	  and the message's as Kafka headers, the body its payload or its JSON
 *	  envelope; with "format": "cloudevents" (cloudevents.c) the Kafka
 *	  binding: the structured event as the body, or in binary mode the
 *	  payload with ce_<attribute> headers, and a content-type header in
 *	  both. librdkafka copies everything, so nothing of its points into
 *	  the batch's memory.
 * 3. Time: a message may spend half of timeout_ms in librdkafka
 *	  (message.timeout.ms and request.timeout.ms), and none is produced
 *	  after the first half's last tenth (the window's deadline), so every
 *	  message normally has its delivery report before timeout_ms has passed
 *	  and the batch ends with an answer for each. librdkafka checks its
 *	  timeouts about once a second: should a report still be missing at
 *	  timeout_ms, the message counts as timed out unsent (4.: while the
 *	  brokers are down librdkafka's reports of timeouts can come seconds
 *	  late) and its late report is ignored (each report carries its batch's
 *	  serial number).
 * 4. Outcomes (broker.h's classes): a delivery report without error is
 *	  delivered; too large is too_large and an unknown topic
 *	  unknown_destination, both permanent; brokers unreachable or
 *	  authentication refused (a message that timed out unsent while
 *	  librdkafka reported that) hold the pipeline as connection or auth; a
 *	  message that timed out once sent is a retryable timeout, other broker
 *	  errors retryable as broker (librdkafka itself retries the errors
 *	  Kafka calls retriable until message.timeout.ms, and reports the
 *	  others: a record the broker will not take, INVALID_RECORD or
 *	  POLICY_VIOLATION, is refused, permanent; CORRUPT_MESSAGE, a record
 *	  broken on its way, and an unknown error are broker, retried).
 * 5. A fatal error of the idempotent producer (its sequence broken) makes
 *	  the next batch start with a new producer.
 * 6. A new reading of the pipeline's config (any change, or a reload)
 *	  opens a new state before the old one is closed; the producer is made
 *	  by the first batch, and the old state's `close` hands its producer
 *	  over to a state that has none yet and the very same librdkafka
 *	  configuration (KafkaConfFingerprint: every property, the password
 *	  included), rather than destroying it: a change of topic, body or
 *	  batch size keeps the connections and the producer id, and the first
 *	  batch of the new reading does not wait for a new producer to be
 *	  ready. What the old producer still holds (messages of an abandoned
 *	  batch) goes on in it and reports to no batch: the batch serial
 *	  numbers go with the producer (KafkaLink), so no late report is taken
 *	  for one of the new state's messages.
 *
 * No callback raises an ERROR or calls palloc: they write into fixed
 * buffers of the batch and the pipeline.
 */
#include "postgres.h"

#include <librdkafka/rdkafka.h>

#include "fmgr.h"
#include "lib/ilist.h"
#include "lib/stringinfo.h"
#include "utils/timestamp.h"

#include "broker.h"
#include "cloudevents.h"
#include "endpoints/registry.h"
#include "kafka.h"

PG_MODULE_MAGIC;

struct KafkaBatch;
struct KafkaPipeline;

/*
 * The producer's opaque (every callback's): the state it serves, and the
 * serial number of the latest batch it was given. malloc'd: it lives as
 * long as the producer, which may outlive a state (see the top).
 */
typedef struct KafkaLink
{
	struct KafkaPipeline *kp;
	uint64		serial;
} KafkaLink;

/* A Kafka pipeline's state, from `open` to `close`. */
typedef struct KafkaPipeline
{
	dlist_node	node;			/* in open_pipelines */
	char	   *fingerprint;	/* of conf: KafkaConfFingerprint */
	char	   *topic;			/* template */
	bool		envelope;		/* body 'envelope': the message's JSON object */
	RelayCloudEvents ce;		/* "format": CloudEvents or pg_tide's own */
	int			max_in_flight;
	int			timeout_ms;
	rd_kafka_conf_t *conf;		/* to make a new producer after a fatal error */
	rd_kafka_t *rk;				/* NULL until the first batch */
	KafkaLink  *link;			/* rk's opaque */
	RelayNotifier notifier;
	bool		fatal;			/* the producer must be made again */
	struct KafkaBatch *current; /* the batch in flight, or NULL */
	/* what librdkafka last reported about the brokers, since the last delivery */
	rd_kafka_resp_err_t broker_error;
	char		broker_reason[160];
} KafkaPipeline;

/* A batch in flight. */
typedef struct KafkaBatch
{
	KafkaPipeline *kp;
	RelaySinkBatch *batch;
	uint64		serial;
	RelaySendWindow window;
	RelayMessageOutcome *out;	/* one per message */
	TimestampTz *sent_at;
	TimestampTz deadline;		/* started + timeout_ms */
	const char *failed;			/* nothing could be sent: why */
} KafkaBatch;

/* A message's opaque in librdkafka: its batch's serial and its index. */
#define KAFKA_INDEX_BITS	20
#define KAFKA_TOKEN(serial, i)	((void *) (uintptr_t) (((serial) << KAFKA_INDEX_BITS) | (uint64) (i)))

/* This worker's open Kafka states, among which a producer is handed over. */
static dlist_head open_pipelines = DLIST_STATIC_INIT(open_pipelines);

/* librdkafka's logger: its messages are dropped, error_cb keeps what matters. */
static void
kafka_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
}

/* Whether an error says the brokers cannot be reached or refuse us. */
static bool
is_auth_error(rd_kafka_resp_err_t err)
{
	return err == RD_KAFKA_RESP_ERR__AUTHENTICATION ||
		err == RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED ||
		err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED ||
		err == RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED ||
		err == RD_KAFKA_RESP_ERR__SSL;
}

static bool
is_connection_error(rd_kafka_resp_err_t err)
{
	return err == RD_KAFKA_RESP_ERR__TRANSPORT ||
		err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN ||
		err == RD_KAFKA_RESP_ERR__RESOLVE;
}

/* error_cb, run by rd_kafka_poll in the worker's thread: notes the brokers' state. */
static void
kafka_error(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	KafkaPipeline *kp = ((KafkaLink *) opaque)->kp;

	if (err == RD_KAFKA_RESP_ERR__FATAL)
		kp->fatal = true;
	/* an auth failure is not forgotten for the "all brokers down" that follows it */
	if (is_auth_error(err) || (is_connection_error(err) && !is_auth_error(kp->broker_error)))
	{
		kp->broker_error = err;
		RelayCleanText(kp->broker_reason, sizeof(kp->broker_reason), reason, strlen(reason));
	}
}

/* A message's failure: "<class>: <librdkafka's words>[; <the brokers' state>]". */
static void
set_failure(KafkaPipeline *kp, RelayMessageOutcome *o, RelayOutcome outcome, const char *cls,
			rd_kafka_resp_err_t err, bool with_reason)
{
	char		error[sizeof(o->error)];

	snprintf(error, sizeof(error), "%s: %s%s%s", cls, rd_kafka_err2str(err),
			 with_reason && kp->broker_reason[0] ? "; " : "",
			 with_reason ? kp->broker_reason : "");
	RelaySetFailure(o, outcome, cls, 0, error);
}

/*
 * A message that timed out unsent, or had no report by timeout_ms: while
 * librdkafka reports the brokers unreachable or refusing us that is theirs,
 * not the message's (connection or auth, which hold the pipeline); else a
 * retryable timeout.
 */
static void
set_unanswered(KafkaPipeline *kp, RelayMessageOutcome *o, rd_kafka_resp_err_t err)
{
	if (is_auth_error(kp->broker_error))
		set_failure(kp, o, RELAY_UNREACHABLE, RELAY_CLASS_AUTH, err, true);
	else if (is_connection_error(kp->broker_error))
		set_failure(kp, o, RELAY_UNREACHABLE, RELAY_CLASS_CONNECTION, err, true);
	else
		set_failure(kp, o, RELAY_RETRYABLE, RELAY_CLASS_TIMEOUT, err, false);
}

/* Classifies a failed message (broker.h's classes); never an ERROR. */
static void
classify(KafkaPipeline *kp, RelayMessageOutcome *o, rd_kafka_resp_err_t err,
		 rd_kafka_msg_status_t status)
{
	switch (err)
	{
		case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
		case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
			set_failure(kp, o, RELAY_PERMANENT, RELAY_CLASS_TOO_LARGE, err, false);
			break;
		case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
		case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
		case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
		case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
			set_failure(kp, o, RELAY_PERMANENT, RELAY_CLASS_UNKNOWN_DESTINATION, err, false);
			break;
		case RD_KAFKA_RESP_ERR_INVALID_RECORD:
		case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
		case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT:
		case RD_KAFKA_RESP_ERR__INVALID_ARG:
			set_failure(kp, o, RELAY_PERMANENT, RELAY_CLASS_REFUSED, err, false);
			break;
		case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
		case RD_KAFKA_RESP_ERR__TIMED_OUT:
		case RD_KAFKA_RESP_ERR__TIMED_OUT_QUEUE:
		case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
			if (status == RD_KAFKA_MSG_STATUS_NOT_PERSISTED)
				set_unanswered(kp, o, err);
			else
				set_failure(kp, o, RELAY_RETRYABLE, RELAY_CLASS_TIMEOUT, err, false);
			break;
		default:
			if (is_auth_error(err))
				set_failure(kp, o, RELAY_UNREACHABLE, RELAY_CLASS_AUTH, err, true);
			else if (is_connection_error(err))
				set_failure(kp, o, RELAY_UNREACHABLE, RELAY_CLASS_CONNECTION, err, true);
			else
				/* e.g. CORRUPT_MESSAGE (a CRC broken in transit), retriable in Kafka's protocol */
				set_failure(kp, o, RELAY_RETRYABLE, RELAY_CLASS_BROKER, err, false);
			break;
	}
}

/* Message i's answer, from its delivery report or from produce's refusal. */
static void
message_done(KafkaBatch *kb, int i, rd_kafka_resp_err_t err, rd_kafka_msg_status_t status)
{
	RelayMessageOutcome *o = &kb->out[i];

	o->latency_ms = (GetCurrentTimestamp() - kb->sent_at[i]) / 1000.0;
	if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		o->outcome = RELAY_DELIVERED;
		kb->kp->broker_error = RD_KAFKA_RESP_ERR_NO_ERROR;
		kb->kp->broker_reason[0] = '\0';
	}
	else
		classify(kb->kp, o, err, status);
	/* the others would fail alike when the brokers cannot be reached */
	RelaySendWindowDone(&kb->window, i, o->outcome == RELAY_DELIVERED,
						o->outcome == RELAY_UNREACHABLE);
	kb->batch->ready = true;
}

/* dr_msg_cb, run by rd_kafka_poll in the worker's thread. */
static void
kafka_delivery_report(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	KafkaPipeline *kp = ((KafkaLink *) opaque)->kp;
	uint64		token = (uint64) (uintptr_t) m->_private;
	KafkaBatch *kb = kp->current;
	int			i = (int) (token & ((1 << KAFKA_INDEX_BITS) - 1));

	if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		kp->broker_error = RD_KAFKA_RESP_ERR_NO_ERROR;
		kp->broker_reason[0] = '\0';
	}
	/* a report of a batch already ended (cancelled, or past its time) */
	if (kb == NULL || (token >> KAFKA_INDEX_BITS) != kb->serial || i >= kb->batch->nmsgs)
		return;
	message_done(kb, i, m->err, rd_kafka_message_status(m));
}

/* Serves librdkafka's main queue: delivery reports and errors; never blocks. */
static void
kafka_poll(KafkaPipeline *kp)
{
	if (kp->rk != NULL)
		while (rd_kafka_poll(kp->rk, 0) > 0)
			;
}

/* events.c: the main queue is no longer empty. */
static void
kafka_queue_ready(int fd, uint32 events, void *arg)
{
	KafkaPipeline *kp = arg;

	RelayNotifierDrain(&kp->notifier);
	kafka_poll(kp);
}

/* Destroys the producer, waiting at most a moment for what it holds. */
static void
destroy_producer(KafkaPipeline *kp)
{
	rd_kafka_queue_t *q;

	if (kp->rk == NULL)
		return;
	kp->current = NULL;
	rd_kafka_flush(kp->rk, 500);
	rd_kafka_purge(kp->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
	kafka_poll(kp);
	q = rd_kafka_queue_get_main(kp->rk);
	rd_kafka_queue_io_event_enable(q, -1, NULL, 0);
	rd_kafka_queue_destroy(q);
	rd_kafka_destroy(kp->rk);
	kp->rk = NULL;
	free(kp->link);
	kp->link = NULL;
}

/* Makes librdkafka's threads write to kp's eventfd when the main queue fills (-1: to none). */
static void
watch_queue(KafkaPipeline *kp, int fd)
{
	static const uint64 one = 1;
	rd_kafka_queue_t *q = rd_kafka_queue_get_main(kp->rk);

	rd_kafka_queue_io_event_enable(q, fd, &one, sizeof(one));
	rd_kafka_queue_destroy(q);
}

/*
 * Hands kp's producer over to another open state with the same librdkafka
 * configuration and no producer yet (see the top); false when there is
 * none.
 */
static bool
hand_over_producer(KafkaPipeline *kp)
{
	dlist_iter	it;

	/* the latest opened first: the pipeline's new reading, opened just before */
	dlist_reverse_foreach(it, &open_pipelines)
	{
		KafkaPipeline *to = dlist_container(KafkaPipeline, node, it.cur);

		if (to == kp || to->rk != NULL || to->conf == NULL ||
			strcmp(to->fingerprint, kp->fingerprint) != 0)
			continue;
		/* no write to kp's eventfd, which closes, from here on */
		watch_queue(kp, -1);
		kp->current = NULL;
		kafka_poll(kp);
		to->rk = kp->rk;
		to->link = kp->link;
		to->link->kp = to;
		to->fatal = kp->fatal;
		to->broker_error = kp->broker_error;
		memcpy(to->broker_reason, kp->broker_reason, sizeof(to->broker_reason));
		kp->rk = NULL;
		kp->link = NULL;
		watch_queue(to, to->notifier.fd);
		/* what came meanwhile is served by the loop */
		RelayNotifierSignal(&to->notifier);
		return true;
	}
	return false;
}

/* A new producer from kp->conf; false, with errstr, when librdkafka cannot make one. */
static bool
make_producer(KafkaPipeline *kp, char *errstr, size_t errsize)
{
	rd_kafka_conf_t *conf;
	KafkaLink  *link = malloc(sizeof(KafkaLink));

	if (link == NULL)
	{
		snprintf(errstr, errsize, "out of memory");
		return false;
	}
	link->kp = kp;
	link->serial = 0;
	conf = rd_kafka_conf_dup(kp->conf);
	rd_kafka_conf_set_opaque(conf, link);
	kp->fatal = false;
	kp->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, errsize);
	if (kp->rk == NULL)
	{
		rd_kafka_conf_destroy(conf);
		free(link);
		return false;
	}
	kp->link = link;
	/* librdkafka's threads write to the eventfd; the loop serves the queue */
	watch_queue(kp, kp->notifier.fd);
	return true;
}

/* rd_kafka_headers of a message: pg_tide's, then its own. */
static void
add_header(const char *name, const char *value, void *arg)
{
	rd_kafka_header_add((rd_kafka_headers_t *) arg, name, -1, value, -1);
}

/* Produces message i; its refusal is its outcome at once. */
static void
produce(KafkaBatch *kb, int i)
{
	KafkaPipeline *kp = kb->kp;
	const RelayMessage *m = &kb->batch->msgs[i];
	RelayMessageOutcome *o = &kb->out[i];
	StringInfoData topic;
	StringInfoData body;
	rd_kafka_headers_t *headers;
	rd_kafka_resp_err_t err;
	MemoryContext old = MemoryContextSwitchTo(kb->batch->cxt);

	kb->sent_at[i] = GetCurrentTimestamp();
	initStringInfo(&topic);
	if (!RelayBrokerExpand(kp->topic, m, &topic, o->error, sizeof(o->error)))
	{
		char		error[sizeof(o->error)];

		strlcpy(error, o->error, sizeof(error));
		RelaySetFailure(o, RELAY_PERMANENT, RELAY_CLASS_TEMPLATE, 0, error);
		RelaySendWindowDone(&kb->window, i, false, false);
		MemoryContextSwitchTo(old);
		return;
	}
	initStringInfo(&body);
	RelayCloudEventsAppendBody(&body, &kp->ce, m, kp->envelope);
	headers = rd_kafka_headers_new(8);
	RelayBrokerForEachHeader(m, add_header, headers);
	/* the Kafka binding: ce_<attribute> headers and content-type */
	RelayCloudEventsForEachHeader(&kp->ce, m, "ce_", "content-type", add_header, headers);
	err = rd_kafka_producev(kp->rk,
							RD_KAFKA_V_TOPIC(topic.data),
							RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
							RD_KAFKA_V_VALUE(body.data, body.len),
							RD_KAFKA_V_KEY(m->key, m->key ? strlen(m->key) : 0),
							RD_KAFKA_V_HEADERS(headers),
							RD_KAFKA_V_OPAQUE(KAFKA_TOKEN(kb->serial, i)),
							RD_KAFKA_V_END);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		/* the headers are the caller's unless produced */
		rd_kafka_headers_destroy(headers);
		message_done(kb, i, err, RD_KAFKA_MSG_STATUS_NOT_PERSISTED);
	}
	pfree(topic.data);
	pfree(body.data);
	MemoryContextSwitchTo(old);
}

static void
kafka_start(void *state, RelaySinkBatch *batch)
{
	KafkaPipeline *kp = state;
	KafkaBatch *kb = MemoryContextAllocZero(batch->cxt, sizeof(KafkaBatch));
	char		errstr[256];

	kb->kp = kp;
	kb->batch = batch;
	batch->sink_private = kb;
	kb->out = MemoryContextAllocZero(batch->cxt, sizeof(RelayMessageOutcome) * batch->nmsgs);
	kb->sent_at = MemoryContextAllocZero(batch->cxt, sizeof(TimestampTz) * batch->nmsgs);
	for (int i = 0; i < batch->nmsgs; i++)
		kb->out[i].wait_ms = -1;
	if (kp->rk != NULL && (kp->fatal || rd_kafka_fatal_error(kp->rk, NULL, 0)))
		destroy_producer(kp);
	if (kp->rk == NULL && !make_producer(kp, errstr, sizeof(errstr)))
	{
		kb->failed = MemoryContextStrdup(batch->cxt, errstr);
		return;
	}
	/* messages go only in the first half: each is answered within the second */
	RelaySendWindowInit(&kb->window, batch, kp->max_in_flight, KAFKA_MESSAGE_TIMEOUT(kp->timeout_ms));
	kb->deadline = TimestampTzPlusMilliseconds(kb->window.started_at, kp->timeout_ms);
	kb->serial = ++kp->link->serial;
	kp->current = kb;
}

static bool
kafka_progress(void *state, RelaySinkBatch *batch)
{
	KafkaBatch *kb = batch->sink_private;
	int			i;

	if (kb->failed)
		return true;
	kafka_poll(kb->kp);
	while ((i = RelaySendWindowNext(&kb->window)) >= 0)
		produce(kb, i);
	if (RelaySendWindowFinished(&kb->window) || GetCurrentTimestamp() >= kb->deadline)
		return true;
	batch->wake_at = kb->deadline;
	return false;
}

static void
kafka_outcomes(void *state, RelaySinkBatch *batch, RelayDeliveryResult *result)
{
	KafkaBatch *kb = batch->sink_private;
	KafkaPipeline *kp = state;

	if (kp->current == kb)
		kp->current = NULL;
	for (int i = 0; i < batch->nmsgs; i++)
	{
		RelayMessageOutcome *o = &result->each[i];

		if (kb->failed)
		{
			char		error[sizeof(o->error)];

			snprintf(error, sizeof(error), "connection: %s", kb->failed);
			RelaySetFailure(o, RELAY_UNREACHABLE, RELAY_CLASS_CONNECTION, 0, error);
			continue;
		}
		switch (kb->window.state[i])
		{
			case RELAY_SEND_ACKED:
			case RELAY_SEND_FAILED:
				*o = kb->out[i];
				break;
			case RELAY_SEND_IN_FLIGHT:

				/* no report by timeout_ms (see the top of the file) */
				set_unanswered(kp, o, RD_KAFKA_RESP_ERR__MSG_TIMED_OUT);
				o->latency_ms = (GetCurrentTimestamp() - kb->sent_at[i]) / 1000.0;
				break;
			case RELAY_SEND_SKIPPED:
			case RELAY_SEND_WAITING:
				RelaySendWindowNotSent(&kb->window, i, o);
				break;
		}
	}
}

static void
kafka_cancel(void *state, RelaySinkBatch *batch)
{
	KafkaPipeline *kp = state;

	/* what is still in librdkafka reports to no batch */
	if (kp->current == batch->sink_private)
		kp->current = NULL;
}

static bool
kafka_open(const cJSON *config, RelaySinkOpened *opened)
{
	KafkaPipeline *kp = palloc0(sizeof(KafkaPipeline));
	const cJSON *auth = RelayConfigMember(config, "auth");
	const cJSON *password = RelayConfigMember(auth, "password");
	char	   *secret = NULL;
	char	   *error = NULL;
	char		errstr[512];

	kp->topic = RelayConfigString(config, "topic");
	kp->envelope = RelayConfigStringIs(config, "body", "envelope");
	RelayCloudEventsOpen(config, &kp->ce);
	kp->max_in_flight = RelayConfigIntOr(config, "max_in_flight", 1000);
	kp->timeout_ms = RelayConfigIntOr(config, "timeout_ms", 10000);
	kp->notifier.fd = -1;
	opened->longest_batch_seconds = (kp->timeout_ms + 999) / 1000;
	opened->read_secrets = cJSON_IsObject(password);
	if (!RelayBrokerCredential(password, &secret, &error))
	{
		opened->error = error;
		return false;
	}
	kp->conf = KafkaBuildConf(config, secret, errstr, sizeof(errstr));
	if (kp->conf != NULL)
		kp->fingerprint = KafkaConfFingerprint(kp->conf, secret);
	if (secret != NULL)
	{
		explicit_bzero(secret, strlen(secret));
		pfree(secret);
	}
	if (kp->conf == NULL)
	{
		opened->error = psprintf("librdkafka refuses the config: %s", errstr);
		return false;
	}
	rd_kafka_conf_set_dr_msg_cb(kp->conf, kafka_delivery_report);
	rd_kafka_conf_set_error_cb(kp->conf, kafka_error);
	rd_kafka_conf_set_log_cb(kp->conf, kafka_log);
	if (!RelayNotifierOpen(&kp->notifier, kafka_queue_ready, kp))
	{
		explicit_bzero(kp->fingerprint, strlen(kp->fingerprint));
		rd_kafka_conf_destroy(kp->conf);
		opened->error = "could not open an eventfd for librdkafka";
		return false;
	}
	/* the producer: the first batch's, or the one a state closing hands over */
	dlist_push_tail(&open_pipelines, &kp->node);
	opened->state = kp;
	return true;
}

static void
kafka_close(void *state)
{
	KafkaPipeline *kp = state;

	if (kp == NULL)
		return;
	dlist_delete(&kp->node);
	if (kp->rk != NULL && !hand_over_producer(kp))
		destroy_producer(kp);
	RelayNotifierClose(&kp->notifier);
	if (kp->conf != NULL)
		rd_kafka_conf_destroy(kp->conf);
	kp->conf = NULL;
	/* it holds the password */
	if (kp->fingerprint != NULL)
		explicit_bzero(kp->fingerprint, strlen(kp->fingerprint));
}

/* The routine and init symbol of the Kafka sink, a module (endpoints/registry.h). */
RELAY_BROKER_SINK_ENDPOINT(kafka, RelayKafkaConfigKeys, RelayKafkaValidate,
					.sends_on_own_threads = true);
