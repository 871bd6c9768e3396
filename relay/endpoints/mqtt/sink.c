/*
 * sink.c
 *		The MQTT sink: publishes each message with QoS 1 or 2 through
 *		libmosquitto, and counts it delivered once the broker acknowledged
 *		it (PUBACK for QoS 1, PUBCOMP for QoS 2). Built as pg_tide_mqtt.so
 *		(relay/broker.h), so that pg_tide.so never needs libmosquitto.
 *
 * 1. `open` reads the pipeline's config (validated by config.c) and
 *	  the credentials it refers to. The connection is made by the first
 *	  batch and kept across batches; a pipeline has one client, whose id is
 *	  "client_id" or, by default, pg_tide-<system identifier>-<database
 *	  oid>-<outbox>-<consumer group>: stable, and unique per pipeline.
 * 2. `start` connects if need be; messages are published once the broker
 *	  accepted the connection (CONNACK), up to max_in_flight unacknowledged,
 *	  in id order, as the send window (send_window.c) lets them go. With
 *	  MQTT 5 the body is the message's payload and pg_tide's identity and
 *	  the message's headers are user properties; with MQTT 3.1.1, which has
 *	  no properties, the body is the message's JSON object.
 * 3. No thread of libmosquitto's is used (no mosquitto_loop_start): the
 *	  client's socket is watched in the worker's wait (events.h), and
 *	  mosquitto_loop_read/loop_write run when it is ready, a timer runs
 *	  mosquitto_loop_misc (keepalive) every second, so every callback of
 *	  the library runs in the worker's loop. The callbacks only record
 *	  what happened (no palloc, no ERROR: they run inside libmosquitto).
 *	  A plain TCP connection is made without blocking
 *	  (mosquitto_connect_async), to the address of a host name looked up
 *	  on a thread first (RelayLookupStart). A TLS one is made by
 *	  mosquitto_connect on a thread of its own (the connector, below): it
 *	  looks the name up (the broker's certificate is checked against the
 *	  name) and makes the TCP connection blocking, then hands the client
 *	  to the loop, where what is left of the handshake goes on as the
 *	  client's other I/O does. (mosquitto_connect_async for TLS worked
 *	  with libmosquitto 2.0.11 and failed every TLS delivery with 2.0.21
 *	  and 2.1, Debian 13 and sid.)
 * 4. A session is never resumed (clean start): a message not acknowledged
 *	  when the connection is lost, or by the batch's timeout_ms, is a
 *	  failed attempt and is leased again (at least once: the broker may
 *	  have it already). The client is then dropped, and the next batch
 *	  connects again, so no acknowledgement of an abandoned message is
 *	  ever taken for one of a later batch.
 *
 * Failures (broker.h's classes): the connection refused or lost, or no
 * CONNACK in time: connection (or timeout), the pipeline is held; CONNACK
 * refusing the credentials or the client: auth, held; an MQTT 5 PUBACK
 * with reason code 0x87 (not authorized): auth, held; 0x97 (quota
 * exceeded), 0x80, 0x83, 0x89, 0x91: broker, retried; 0x90 (topic name
 * invalid), 0x99 and others: refused, dead-lettered; a message larger
 * than the broker's maximum packet size: too_large, dead-lettered; a
 * topic template naming a missing header, or expanding to a topic with
 * + or #: template, dead-lettered; no acknowledgement in time: timeout,
 * retried.
 */
#include "postgres.h"

#include <errno.h>
#include <pthread.h>
#include <sys/epoll.h>

#include <mosquitto.h>
/* mosquitto.h includes the protocol's constants from 2.1 on, which warns of the old header */
#ifndef MQTT_PROTOCOL_H
#include <mqtt_protocol.h>
#endif

#include "access/xlog.h"
#include "fmgr.h"
#include "lib/ilist.h"
#include "miscadmin.h"
#include "utils/timestamp.h"

#include "broker.h"
#include "cloudevents.h"
#include "endpoints/registry.h"
#include "mqtt.h"

PG_MODULE_MAGIC;

/* Seconds between keepalive PINGREQs when nothing else is sent. */
#define MQTT_KEEPALIVE_S	60

/* How often mosquitto_loop_misc runs (keepalive) while a client exists. */
#define MQTT_MISC_MS		1000

/* A pipeline's settings, from its config. */
typedef struct MqttSettings
{
	char	   *host;
	int			port;
	char	   *topic;			/* a destination template */
	int			qos;
	bool		v5;				/* protocol "5", else "3.1.1" */
	bool		envelope;		/* body "envelope", else "payload" */
	RelayCloudEvents ce;		/* "format": CloudEvents or pg_tide's own */
	bool		retain;
	int			max_in_flight;
	int			timeout_ms;
	char	   *client_id;
	char	   *username;		/* NULL: none */
	char	   *password;
	bool		tls;
	char	   *ca_file;		/* NULL: the system's certificates */
	char	   *cert_file;
	char	   *key_file;
	bool		verify;
} MqttSettings;

typedef enum MqttLink
{
	MQTT_LINK_DOWN = 0,			/* no client, or it failed */
	MQTT_LINK_CONNECTING,		/* waiting for CONNACK */
	MQTT_LINK_UP
} MqttLink;

/* A batch in flight; in batch->cxt. */
typedef struct MqttBatch
{
	RelaySinkBatch *batch;
	RelaySendWindow window;
	int		   *mids;			/* message i's packet id while in flight */
	TimestampTz *sent_at;
	RelayMessageOutcome *each;	/* message i's outcome once known */
	bool	   *known;			/* whether each[i] is set */
	int			oldest;			/* no message before it is in flight */
	bool		connected;		/* the broker accepted the connection during the batch */
	bool		link_failed;	/* the connection failed: what was not sent is held */
	char		link_class[32];
	char		link_error[256];
} MqttBatch;

/* A pipeline's state: its settings and its client. */
typedef struct MqttPipeline
{
	dlist_node	node;			/* in pipelines */
	MqttSettings cfg;
	struct mosquitto *mosq;		/* NULL: not connected */
	MqttLink	link;
	bool		drop;			/* the client failed: destroy it, outside its calls */
	RelayWatch *watch;
	int			watch_fd;
	uint32		watch_events;
	MqttBatch  *mb;				/* the batch in flight, or NULL */
	RelayLookup *lookup;		/* the host name's lookup, while it runs */
	bool		have_address;	/* address is the host's, for the next connect */
	char		address[64];
	RelayConnector *connector;	/* a TLS client's connect, while it runs */
} MqttPipeline;

/* The open pipelines of this worker, whose clients the timer keeps alive. */
static dlist_head pipelines = DLIST_STATIC_INIT(pipelines);
static RelayTimer misc_timer;
static bool library_ready = false;

/* Records message i's outcome and its answer in the send window. */
static void
settle(MqttBatch *mb, int i, RelayOutcome outcome, const char *error_class, long code,
	   const char *error)
{
	RelayMessageOutcome *o = &mb->each[i];

	if (mb->known[i])
		return;
	memset(o, 0, sizeof(*o));
	o->wait_ms = -1;
	if (outcome == RELAY_DELIVERED)
	{
		o->outcome = RELAY_DELIVERED;
		o->response_code = code;
	}
	else
		RelaySetFailure(o, outcome, error_class, code, error);
	if (mb->sent_at[i] != 0)
		o->latency_ms = (GetCurrentTimestamp() - mb->sent_at[i]) / 1000.0;
	mb->known[i] = true;
	mb->mids[i] = 0;
	RelaySendWindowDone(&mb->window, i, outcome == RELAY_DELIVERED,
						outcome == RELAY_UNREACHABLE);
	mb->batch->ready = true;
}

/*
 * The connection failed: every message in flight is held as the
 * destination's failure (it is leased again), nothing more is sent, and
 * the client is destroyed once the library's call returns.
 */
static void
link_down(MqttPipeline *p, const char *error_class, const char *error)
{
	MqttBatch  *mb = p->mb;

	if (p->link == MQTT_LINK_DOWN && p->drop)
		return;
	p->link = MQTT_LINK_DOWN;
	p->drop = true;
	if (mb == NULL)
		return;
	if (!mb->link_failed)
	{
		mb->link_failed = true;
		strlcpy(mb->link_class, error_class, sizeof(mb->link_class));
		strlcpy(mb->link_error, error, sizeof(mb->link_error));
	}
	for (int i = mb->oldest; i < mb->batch->nmsgs; i++)
		if (mb->window.state[i] == RELAY_SEND_IN_FLIGHT)
			settle(mb, i, RELAY_UNREACHABLE, mb->link_class, 0, mb->link_error);
	mb->window.stopped = true;
	mb->batch->ready = true;
}

/* A libmosquitto error as text (errno's when it says so); no palloc. */
static void
mosquitto_error(char *buf, size_t size, const char *what, int rc)
{
	snprintf(buf, size, "%s: %s", what,
			 rc == MOSQ_ERR_ERRNO ? strerror(errno) : mosquitto_strerror(rc));
}

/* The library's call returned rc: a failure is the connection's. */
static void
check_rc(MqttPipeline *p, int rc, const char *what)
{
	char		error[256];

	if (rc == MOSQ_ERR_SUCCESS || p->link == MQTT_LINK_DOWN)
		return;
	mosquitto_error(error, sizeof(error), what, rc);
	link_down(p, RELAY_CLASS_CONNECTION, error);
}

/* CONNACK: the broker accepted the connection, or refused it. */
static void
on_connect(struct mosquitto *mosq, void *arg, int rc, int flags, const mosquitto_property *props)
{
	MqttPipeline *p = arg;
	char		error[256];
	bool		auth;

	if (rc == 0)
	{
		p->link = MQTT_LINK_UP;
		if (p->mb)
		{
			p->mb->connected = true;
			p->mb->batch->ready = true;
		}
		return;
	}
	if (p->cfg.v5)
		auth = rc == MQTT_RC_BAD_USERNAME_OR_PASSWORD || rc == MQTT_RC_NOT_AUTHORIZED ||
			rc == MQTT_RC_BAD_AUTHENTICATION_METHOD || rc == MQTT_RC_BANNED;
	else
		auth = rc == CONNACK_REFUSED_BAD_USERNAME_PASSWORD || rc == CONNACK_REFUSED_NOT_AUTHORIZED;
	snprintf(error, sizeof(error), "the broker refused the connection: %s",
			 p->cfg.v5 ? mosquitto_reason_string(rc) : mosquitto_connack_string(rc));
	link_down(p, auth ? RELAY_CLASS_AUTH : RELAY_CLASS_CONNECTION, error);
}

static void
on_disconnect(struct mosquitto *mosq, void *arg, int rc, const mosquitto_property *props)
{
	MqttPipeline *p = arg;
	char		error[256];

	mosquitto_error(error, sizeof(error), "connection to the broker lost", rc);
	link_down(p, RELAY_CLASS_CONNECTION, error);
}

/* The outcome and class of an MQTT 5 PUBACK/PUBREC reason code >= 0x80. */
static RelayOutcome
reason_outcome(int reason, const char **error_class)
{
	switch (reason)
	{
		case MQTT_RC_NOT_AUTHORIZED:
			/* the broker's rules, not the message: held until they change */
			*error_class = RELAY_CLASS_AUTH;
			return RELAY_UNREACHABLE;
		case MQTT_RC_QUOTA_EXCEEDED:
		case MQTT_RC_UNSPECIFIED:
		case MQTT_RC_IMPLEMENTATION_SPECIFIC:
		case MQTT_RC_PACKET_ID_IN_USE:
		case MQTT_RC_SERVER_BUSY:
			*error_class = RELAY_CLASS_BROKER;
			return RELAY_RETRYABLE;
		case MQTT_RC_PACKET_TOO_LARGE:
			*error_class = RELAY_CLASS_TOO_LARGE;
			return RELAY_PERMANENT;
		default:
			*error_class = RELAY_CLASS_REFUSED;
			return RELAY_PERMANENT;
	}
}

/* A message's acknowledgement (PUBACK, PUBCOMP) or refusal. */
static void
on_publish(struct mosquitto *mosq, void *arg, int mid, int reason, const mosquitto_property *props)
{
	MqttPipeline *p = arg;
	MqttBatch  *mb = p->mb;
	const char *error_class;
	RelayOutcome outcome;
	char		error[256];

	if (mb == NULL || mid == 0)
		return;					/* a message of an abandoned batch */
	for (int i = mb->oldest; i < mb->batch->nmsgs; i++)
	{
		if (mb->mids[i] != mid || mb->window.state[i] != RELAY_SEND_IN_FLIGHT)
			continue;
		if (reason < 0x80)
		{
			settle(mb, i, RELAY_DELIVERED, NULL, reason, NULL);
			break;
		}
		outcome = reason_outcome(reason, &error_class);
		snprintf(error, sizeof(error), "%s: the broker refused the message: %s (reason code 0x%02x)",
				 error_class, mosquitto_reason_string(reason), reason);
		settle(mb, i, outcome, error_class, reason, error);
		break;
	}
	while (mb->oldest < mb->batch->nmsgs &&
		   mb->window.state[mb->oldest] != RELAY_SEND_IN_FLIGHT &&
		   mb->window.state[mb->oldest] != RELAY_SEND_WAITING)
		mb->oldest++;
}

/* Destroys a pipeline's client; never from inside one of its calls. */
static void
client_drop(MqttPipeline *p, bool say_goodbye)
{
	RelayEventsUnwatch(p->watch);
	p->watch = NULL;
	p->watch_fd = -1;
	if (p->mosq != NULL)
	{
		if (say_goodbye && p->link == MQTT_LINK_UP)
			mosquitto_disconnect(p->mosq);
		mosquitto_destroy(p->mosq);
	}
	p->mosq = NULL;
	p->link = MQTT_LINK_DOWN;
	p->drop = false;
}

static void socket_ready(int fd, uint32 events, void *arg);

/*
 * After a call into the library: destroys a failed client, or watches its
 * socket for reading, and for writing while it has something to write.
 * Right after the call, so that a socket the library closed is never
 * watched by the number another descriptor may get.
 */
static void
after_io(MqttPipeline *p)
{
	int			fd;
	uint32		events;

	if (p->drop || p->mosq == NULL)
	{
		client_drop(p, false);
		return;
	}
	fd = mosquitto_socket(p->mosq);
	events = EPOLLIN | (mosquitto_want_write(p->mosq) ? EPOLLOUT : 0);
	if (fd != p->watch_fd)
	{
		RelayEventsUnwatch(p->watch);
		p->watch = fd >= 0 ? RelayEventsWatch(NULL, fd, events, socket_ready, p) : NULL;
		p->watch_fd = p->watch ? fd : -1;
	}
	else if (p->watch != NULL && events != p->watch_events)
		p->watch = RelayEventsWatch(p->watch, fd, events, socket_ready, p);
	p->watch_events = events;
	if (p->watch == NULL)
	{
		/* not waited on: nothing would ever move it on */
		link_down(p, RELAY_CLASS_CONNECTION, "connection: the socket cannot be watched");
		client_drop(p, false);
	}
}

/* events.c: the client's socket is ready. */
static void
socket_ready(int fd, uint32 events, void *arg)
{
	MqttPipeline *p = arg;

	if (p->mosq == NULL)
		return;
	if (events & (EPOLLIN | EPOLLERR | EPOLLHUP))
		check_rc(p, mosquitto_loop_read(p->mosq, 1), "connection to the broker lost");
	if (p->mosq != NULL && !p->drop && (events & EPOLLOUT))
		check_rc(p, mosquitto_loop_write(p->mosq, 1), "connection to the broker lost");
	after_io(p);
}

/* The timer: keepalive and the library's housekeeping for every client. */
static void
misc_due(void *arg)
{
	dlist_iter	it;
	bool		any = false;

	dlist_foreach(it, &pipelines)
	{
		MqttPipeline *p = dlist_container(MqttPipeline, node, it.cur);

		if (p->mosq == NULL)
			continue;
		check_rc(p, mosquitto_loop_misc(p->mosq), "connection to the broker lost");
		after_io(p);
		any |= p->mosq != NULL;
	}
	if (any)
		RelayTimerSet(&misc_timer, MQTT_MISC_MS);
}

/* The batch cannot be sent: the connection could not be made (why). */
static void
batch_unconnected(MqttBatch *mb, const char *error)
{
	mb->link_failed = true;
	strlcpy(mb->link_class, RELAY_CLASS_CONNECTION, sizeof(mb->link_class));
	strlcpy(mb->link_error, error, sizeof(mb->link_error));
	mb->window.stopped = true;
	mb->batch->ready = true;
}

/*
 * A TLS client's connect, on a thread of its own (broker.h's
 * RelayConnectorStart): mosquitto_connect looks the host name up and makes
 * the TCP connection blocking, which in the loop would hold every pipeline
 * of the worker while a name server is slow or a broker drops connections
 * unanswered (the kernel gives such a connect up after about two
 * minutes). What is left of the TLS handshake then goes on in the loop, as
 * the client's other I/O does. The client is the thread's until the loop
 * takes it (connect_done). malloc'd.
 */
typedef struct MqttConnector
{
	MqttPipeline *p;			/* the loop's: whose client this is */
	struct mosquitto *mosq;
	char		host[256];
	int			port;
	int			rc;				/* mosquitto_connect's result */
	int			err;			/* errno after it */
} MqttConnector;

/*
 * Until a TLS connect has succeeded in this process, connects take turns:
 * libmosquitto sets OpenSSL up for its clients in the first one, through
 * globals that two threads doing it at once would both write.
 */
static pthread_mutex_t first_tls_lock = PTHREAD_MUTEX_INITIALIZER;
static bool tls_set_up = false;

/* RelayConnector's connect, on the connector's thread. */
static void
connect_main(void *arg)
{
	MqttConnector *c = arg;
	bool		first = !__atomic_load_n(&tls_set_up, __ATOMIC_ACQUIRE);

	if (first)
		pthread_mutex_lock(&first_tls_lock);
	c->rc = mosquitto_connect(c->mosq, c->host, c->port, MQTT_KEEPALIVE_S);
	c->err = errno;
	if (first)
	{
		if (c->rc == MOSQ_ERR_SUCCESS)
			__atomic_store_n(&tls_set_up, true, __ATOMIC_RELEASE);
		pthread_mutex_unlock(&first_tls_lock);
	}
}

/* RelayConnector's discard: a client nobody took. */
static void
connect_discard(void *arg)
{
	MqttConnector *c = arg;

	if (c->mosq != NULL)
		mosquitto_destroy(c->mosq);
	c->mosq = NULL;
}

/* RelayConnector's release. */
static void
connect_release(void *arg)
{
	free(arg);
}

/* RelayConnector's done, in the loop: takes the client. */
static void
connect_done(void *arg)
{
	MqttConnector *c = arg;
	MqttPipeline *p = c->p;

	p->connector = NULL;
	p->mosq = c->mosq;
	c->mosq = NULL;
	p->drop = false;
	if (c->rc != MOSQ_ERR_SUCCESS)
	{
		char		what[128];
		char		error[256];

		errno = c->err;
		snprintf(what, sizeof(what), "connection: could not connect to %.60s:%d", c->host, c->port);
		mosquitto_error(error, sizeof(error), what, c->rc);
		client_drop(p, false);
		if (p->mb != NULL)
			batch_unconnected(p->mb, error);
	}
	else
	{
		/* waiting for CONNACK, whether or not a batch waits meanwhile */
		p->link = MQTT_LINK_CONNECTING;
		after_io(p);
		RelayTimerSet(&misc_timer, MQTT_MISC_MS);
		if (p->mb != NULL)
			p->mb->batch->ready = true;
	}
}

/*
 * Hands a TLS client, its settings made, to a connector; false with error
 * when none can start (the client is then the caller's to destroy).
 */
static bool
connector_start(MqttPipeline *p, struct mosquitto *mosq, char *error, size_t errsize)
{
	MqttConnector *c = calloc(1, sizeof(MqttConnector));

	if (c == NULL)
	{
		snprintf(error, errsize, "connection: out of memory");
		return false;
	}
	if (strlen(p->cfg.host) >= sizeof(c->host))
	{
		snprintf(error, errsize, "connection: the host name is longer than %zu bytes", sizeof(c->host) - 1);
		free(c);
		return false;
	}
	strlcpy(c->host, p->cfg.host, sizeof(c->host));
	c->port = p->cfg.port;
	c->mosq = mosq;
	c->p = p;
	p->connector = RelayConnectorStart(connect_main, connect_done, connect_discard, connect_release,
									   c, error, errsize);
	return p->connector != NULL;
}

static bool client_connect(MqttPipeline *p, char *error, size_t errsize);

/*
 * The host name's lookup finished (called in the loop): connects to its
 * address if a batch waits, or keeps it for the next batch.
 */
static void
lookup_done(void *arg)
{
	MqttPipeline *p = arg;
	char		found_error[200];
	char		error[256];
	bool		found = RelayLookupResult(p->lookup, p->address, sizeof(p->address),
										  found_error, sizeof(found_error));

	RelayLookupEnd(p->lookup);
	p->lookup = NULL;
	p->have_address = found;
	if (p->mb == NULL)
		return;
	if (!found)
	{
		snprintf(error, sizeof(error), "connection: could not connect to %.60s:%d: %s",
				 p->cfg.host, p->cfg.port, found_error);
		batch_unconnected(p->mb, error);
	}
	else if (p->mosq == NULL && !client_connect(p, error, sizeof(error)))
		batch_unconnected(p->mb, error);
	else
		p->mb->batch->ready = true;
}

/*
 * A new client for the pipeline, connecting without blocking the loop;
 * false with error when it cannot be. Over plain TCP a host name is looked
 * up on a thread first (broker.h's RelayLookupStart), and the client made
 * once it has the address (lookup_done); over TLS the name is the one the
 * broker's certificate is checked against, so libmosquitto is given it,
 * on the connector's thread (connector_start).
 */
static bool
client_connect(MqttPipeline *p, char *error, size_t errsize)
{
	const MqttSettings *c = &p->cfg;
	const char *host = c->host;
	int			rc;

	if (p->have_address)
	{
		host = p->address;
		p->have_address = false;
	}
	else if (!c->tls && !RelayHostIsAddress(host))
	{
		char		why[200];

		p->lookup = RelayLookupStart(host, c->port, lookup_done, p, why, sizeof(why));
		if (p->lookup == NULL)
			snprintf(error, errsize, "connection: could not connect to %.60s:%d: %s", c->host, c->port, why);
		return p->lookup != NULL;
	}

	if (!library_ready)
	{
		mosquitto_lib_init();
		library_ready = true;
	}
	p->mosq = mosquitto_new(c->client_id, true, p);
	if (p->mosq == NULL)
	{
		snprintf(error, errsize, "connection: could not create an MQTT client: %s", strerror(errno));
		return false;
	}
	mosquitto_int_option(p->mosq, MOSQ_OPT_PROTOCOL_VERSION,
						 c->v5 ? MQTT_PROTOCOL_V5 : MQTT_PROTOCOL_V311);
	mosquitto_int_option(p->mosq, MOSQ_OPT_SEND_MAXIMUM, c->max_in_flight);
	mosquitto_int_option(p->mosq, MOSQ_OPT_TCP_NODELAY, 1);
	mosquitto_max_inflight_messages_set(p->mosq, c->max_in_flight);
	mosquitto_connect_v5_callback_set(p->mosq, on_connect);
	mosquitto_disconnect_v5_callback_set(p->mosq, on_disconnect);
	mosquitto_publish_v5_callback_set(p->mosq, on_publish);
	rc = mosquitto_username_pw_set(p->mosq, c->username, c->password);
	if (rc == MOSQ_ERR_SUCCESS && c->tls)
	{
		if (c->ca_file == NULL)
			rc = mosquitto_int_option(p->mosq, MOSQ_OPT_TLS_USE_OS_CERTS, 1);
		if (rc == MOSQ_ERR_SUCCESS && (c->ca_file != NULL || c->cert_file != NULL))
			rc = mosquitto_tls_set(p->mosq, c->ca_file, c->ca_file ? NULL : "/etc/ssl/certs",
								   c->cert_file, c->key_file, NULL);
		if (rc == MOSQ_ERR_SUCCESS && !c->verify)
			rc = mosquitto_tls_insecure_set(p->mosq, true);
		if (rc == MOSQ_ERR_SUCCESS && !c->verify)
			rc = mosquitto_tls_opts_set(p->mosq, 0, NULL, NULL);
	}
	if (rc != MOSQ_ERR_SUCCESS)
	{
		mosquitto_error(error, errsize, "connection: the client's settings were refused", rc);
		client_drop(p, false);
		return false;
	}
	p->link = MQTT_LINK_CONNECTING;
	p->drop = false;
	if (c->tls)
	{
		struct mosquitto *mosq = p->mosq;

		/* the client is the connector's until its thread returns */
		p->mosq = NULL;
		if (connector_start(p, mosq, error, errsize))
			return true;
		mosquitto_destroy(mosq);
		p->link = MQTT_LINK_DOWN;
		return false;
	}
	rc = mosquitto_connect_async(p->mosq, host, c->port, MQTT_KEEPALIVE_S);
	if (rc != MOSQ_ERR_SUCCESS)
	{
		char		what[128];

		snprintf(what, sizeof(what), "connection: could not connect to %.60s:%d", c->host, c->port);
		mosquitto_error(error, errsize, what, rc);
		client_drop(p, false);
		return false;
	}
	after_io(p);
	if (p->mosq == NULL)
	{
		snprintf(error, errsize, "connection: the client's socket cannot be watched");
		return false;
	}
	RelayTimerSet(&misc_timer, MQTT_MISC_MS);
	return true;
}

/* RelayBrokerForEachHeader's callback: one user property; arg is the list. */
static void
add_user_property(const char *name, const char *value, void *arg)
{
	mosquitto_property **props = arg;

	/* a header that cannot be one (not UTF-8) is left out, not the message */
	(void) mosquitto_property_add_string_pair(props, MQTT_PROP_USER_PROPERTY, name, value);
}

/* Publishes message i (marked in flight by the send window). */
static void
publish(MqttPipeline *p, MqttBatch *mb, int i)
{
	const MqttSettings *c = &p->cfg;
	const RelayMessage *m = &mb->batch->msgs[i];
	StringInfoData topic;
	StringInfoData body;
	mosquitto_property *props = NULL;
	char		error[256];
	int			mid = 0;
	int			rc;

	initStringInfo(&topic);
	if (!RelayBrokerExpand(c->topic, m, &topic, error, sizeof(error)))
	{
		settle(mb, i, RELAY_PERMANENT, RELAY_CLASS_TEMPLATE, 0, error);
		return;
	}
	if (strpbrk(topic.data, "+#") != NULL)
	{
		snprintf(error, sizeof(error), "topic \"%.120s\" has a wildcard (+ or #), which no message is published to",
				 topic.data);
		settle(mb, i, RELAY_PERMANENT, RELAY_CLASS_TEMPLATE, 0, error);
		return;
	}
	initStringInfo(&body);
	RelayCloudEventsAppendBody(&body, &c->ce, m, c->envelope);
	if (c->v5)
	{
		mosquitto_property_add_string(&props, MQTT_PROP_CONTENT_TYPE, RelayCloudEventsContentType(&c->ce) ?
									  RelayCloudEventsContentType(&c->ce) : "application/json");
		RelayBrokerForEachHeader(m, add_user_property, &props);
		/* the MQTT binding: each attribute a user property under its own name */
		RelayCloudEventsForEachHeader(&c->ce, m, "", NULL, add_user_property, &props);
	}
	mb->sent_at[i] = GetCurrentTimestamp();
	rc = mosquitto_publish_v5(p->mosq, &mid, topic.data, body.len, body.data, c->qos, c->retain, props);
	mosquitto_property_free_all(&props);
	pfree(topic.data);
	pfree(body.data);
	mb->mids[i] = mid;
	switch (rc)
	{
		case MOSQ_ERR_SUCCESS:
			break;
		case MOSQ_ERR_OVERSIZE_PACKET:
		case MOSQ_ERR_PAYLOAD_SIZE:
			mosquitto_error(error, sizeof(error), "too_large: the broker does not take a message this large", rc);
			settle(mb, i, RELAY_PERMANENT, RELAY_CLASS_TOO_LARGE, 0, error);
			break;
		case MOSQ_ERR_INVAL:
		case MOSQ_ERR_MALFORMED_UTF8:
			mosquitto_error(error, sizeof(error), "refused: the message cannot be published", rc);
			settle(mb, i, RELAY_PERMANENT, RELAY_CLASS_REFUSED, 0, error);
			break;
		case MOSQ_ERR_QOS_NOT_SUPPORTED:
		case MOSQ_ERR_RETAIN_NOT_SUPPORTED:
			/* the broker takes no message of this pipeline: held until it does */
			mosquitto_error(error, sizeof(error), "refused: the broker does not take the pipeline's settings", rc);
			settle(mb, i, RELAY_UNREACHABLE, RELAY_CLASS_REFUSED, 0, error);
			break;
		default:
			check_rc(p, rc, "connection to the broker lost");
			break;
	}
}

/* Publishes what the send window lets go. */
static void
send_more(MqttPipeline *p, MqttBatch *mb)
{
	int			i;

	while (p->link == MQTT_LINK_UP && !p->drop && (i = RelaySendWindowNext(&mb->window)) >= 0)
		publish(p, mb, i);
}

static void
mqtt_start(void *state, RelaySinkBatch *batch)
{
	MqttPipeline *p = state;
	MqttBatch  *mb = MemoryContextAllocZero(batch->cxt, sizeof(MqttBatch));
	int			n = Max(batch->nmsgs, 1);
	char		error[256];

	mb->batch = batch;
	mb->mids = MemoryContextAllocZero(batch->cxt, sizeof(int) * n);
	mb->sent_at = MemoryContextAllocZero(batch->cxt, sizeof(TimestampTz) * n);
	mb->each = MemoryContextAllocZero(batch->cxt, sizeof(RelayMessageOutcome) * n);
	mb->known = MemoryContextAllocZero(batch->cxt, sizeof(bool) * n);
	RelaySendWindowInit(&mb->window, batch, p->cfg.max_in_flight, p->cfg.timeout_ms);
	batch->sink_private = mb;
	p->mb = mb;
	if (p->drop)
		client_drop(p, false);
	/* (a lookup or connect still running from an earlier batch serves this one) */
	if (p->mosq == NULL && p->lookup == NULL && p->connector == NULL &&
		!client_connect(p, error, sizeof(error)))
		batch_unconnected(mb, error);
	mb->connected = p->link == MQTT_LINK_UP;
}

static bool
mqtt_progress(void *state, RelaySinkBatch *batch)
{
	MqttPipeline *p = state;
	MqttBatch  *mb = batch->sink_private;
	bool		in_flight;

	if (p->drop)
		client_drop(p, false);
	if (p->mosq != NULL)
	{
		send_more(p, mb);
		after_io(p);
	}
	if (RelaySendWindowFinished(&mb->window) && p->link != MQTT_LINK_CONNECTING &&
		((p->lookup == NULL && p->connector == NULL) || mb->link_failed))
		return true;
	if (GetCurrentTimestamp() < mb->window.deadline)
	{
		batch->wake_at = mb->window.deadline;
		return false;
	}

	/* timeout_ms has passed: what is in flight was not acknowledged in time */
	in_flight = mb->window.in_flight > 0;
	for (int i = mb->oldest; i < batch->nmsgs; i++)
		if (mb->window.state[i] == RELAY_SEND_IN_FLIGHT)
			settle(mb, i, RELAY_RETRYABLE, RELAY_CLASS_TIMEOUT, 0,
				   "timeout: no acknowledgement within the batch's timeout_ms");
	if (!mb->connected && !mb->link_failed)
	{
		mb->link_failed = true;
		strlcpy(mb->link_class, RELAY_CLASS_TIMEOUT, sizeof(mb->link_class));
		strlcpy(mb->link_error, p->lookup != NULL ?
				"timeout: the broker's host name was not looked up within the batch's timeout_ms" :
				p->connector != NULL ?
				"timeout: the connection to the broker (its host name's lookup and TCP connect) was not made within the batch's timeout_ms" :
				"timeout: the broker did not accept the connection (CONNACK) within the batch's timeout_ms",
				sizeof(mb->link_error));
	}
	/* a late acknowledgement must not be taken for another message's */
	if (in_flight || !mb->connected)
		client_drop(p, true);
	return true;
}

static void
mqtt_outcomes(void *state, RelaySinkBatch *batch, RelayDeliveryResult *result)
{
	MqttPipeline *p = state;
	MqttBatch  *mb = batch->sink_private;

	for (int i = 0; i < batch->nmsgs; i++)
	{
		if (mb->known[i])
			result->each[i] = mb->each[i];
		else if (mb->link_failed && mb->window.state[i] != RELAY_SEND_SKIPPED)
			RelaySetFailure(&result->each[i], RELAY_UNREACHABLE, mb->link_class, 0, mb->link_error);
		else
			RelaySendWindowNotSent(&mb->window, i, &result->each[i]);
	}
	p->mb = NULL;
}

static void
mqtt_cancel(void *state, RelaySinkBatch *batch)
{
	MqttPipeline *p = state;
	MqttBatch  *mb = batch->sink_private;

	/* an acknowledgement still to come must find no batch */
	if (mb != NULL && mb->window.in_flight > 0)
		client_drop(p, true);
	p->mb = NULL;
}

static void
mqtt_close(void *state)
{
	MqttPipeline *p = state;

	client_drop(p, true);
	RelayLookupEnd(p->lookup);
	p->lookup = NULL;
	RelayConnectorAbandon(p->connector);
	p->connector = NULL;
	dlist_delete(&p->node);
}

/* A member of the config's "tls" object as a string, or NULL. */
static char *
tls_string(const cJSON *tls, const char *key)
{
	const char *s = cJSON_GetStringValue(RelayConfigMember(tls, key));

	return s ? pstrdup(s) : NULL;
}

static bool
mqtt_open(const cJSON *config, RelaySinkOpened *opened)
{
	MqttPipeline *p;
	MqttSettings *c;
	const cJSON *auth = RelayConfigMember(config, "auth");
	const cJSON *tls = RelayConfigMember(config, "tls");
	char	   *error = NULL;

	if (!cJSON_IsString(RelayConfigMember(config, "host")) ||
		!cJSON_IsString(RelayConfigMember(config, "topic")))
	{
		opened->error = "its config has no \"host\" or \"topic\"";
		return false;
	}
	p = palloc0(sizeof(MqttPipeline));
	c = &p->cfg;
	c->host = RelayConfigString(config, "host");
	c->port = RelayConfigIntOr(config, "port", MQTT_DEFAULT_PORT);
	c->topic = RelayConfigString(config, "topic");
	c->qos = RelayConfigIntOr(config, "qos", 1);
	c->v5 = !RelayConfigStringIs(config, "protocol", "3.1.1");
	c->envelope = !c->v5 || RelayConfigStringIs(config, "body", "envelope");
	RelayCloudEventsOpen(config, &c->ce);
	c->retain = RelayConfigIs(config, "retain", true);
	c->max_in_flight = RelayConfigIntOr(config, "max_in_flight", 100);
	c->timeout_ms = RelayConfigIntOr(config, "timeout_ms", 10000);
	if (cJSON_IsString(RelayConfigMember(config, "client_id")))
		c->client_id = RelayConfigString(config, "client_id");
	else
		c->client_id = psprintf("pg_tide-" UINT64_FORMAT "-%u-%s-%s", GetSystemIdentifier(),
								MyDatabaseId, cJSON_GetStringValue(RelayConfigMember(config, "outbox")),
								cJSON_GetStringValue(RelayConfigMember(config, "consumer_group")));
	opened->read_secrets = cJSON_IsObject(RelayConfigMember(auth, "username")) ||
		cJSON_IsObject(RelayConfigMember(auth, "password"));
	if (!RelayBrokerCredential(RelayConfigMember(auth, "username"), &c->username, &error) ||
		!RelayBrokerCredential(RelayConfigMember(auth, "password"), &c->password, &error))
	{
		opened->error = error;
		return false;
	}
	if (cJSON_IsObject(tls))
	{
		c->tls = true;
		c->ca_file = tls_string(tls, "ca_file");
		c->cert_file = tls_string(tls, "cert_file");
		c->key_file = tls_string(tls, "key_file");
		c->verify = !RelayConfigIs(tls, "verify", false);
	}
	p->watch_fd = -1;
	dlist_push_tail(&pipelines, &p->node);
	misc_timer.fire = misc_due;
	opened->longest_batch_seconds = (c->timeout_ms + 999) / 1000 + 1;
	opened->state = p;
	return true;
}

/* The routine and init symbol of the MQTT sink, a module (endpoints/registry.h). */
RELAY_BROKER_SINK_ENDPOINT(mqtt, RelayMqttConfigKeys, RelayMqttValidate);
