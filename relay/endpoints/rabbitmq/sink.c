/*
 * sink.c
 *		The RabbitMQ sink (the module pg_tide_rabbitmq.so): publishes each
 *		message to an exchange with publisher confirms, through rabbitmq-c,
 *		with the worker's loop waiting on the connection's socket.
 *
 * 1. `open` reads the config (validated by config.c) and the
 *	  credentials it refers to. The connection is made by the first batch
 *	  and kept across batches: TCP or TLS, login to the vhost, one channel
 *	  in confirm mode (confirm.select). rabbitmq-c makes it only blocking,
 *	  so it is made on a thread of its own (the connector, below), within
 *	  the batch's timeout_ms, and handed to the loop, which never waits
 *	  for a broker that accepts a connection and does not answer.
 * 2. `start` and `progress` publish what the send window (broker.h)
 *	  allows: persistent (delivery_mode 2), mandatory, with message_id =
 *	  the message's identity, type = its "type" header, content_type
 *	  application/json, timestamp = its created_at, and pg_tide's headers
 *	  and the message's own as the AMQP headers table. The exchange and
 *	  the routing key are templates; without "routing_key" the routing
 *	  key is the message's ordering key. A publish only writes to the
 *	  socket, and only while the socket's send buffer has room, so it
 *	  never waits for the broker: otherwise the socket is watched for
 *	  writing too. A message whose headers would not fit in one AMQP
 *	  frame is too_large (permanent) before anything of it is written:
 *	  rabbitmq-c finds out only after the publish method went out, which
 *	  would break the connection for the whole batch, every time.
 * 3. The socket is watched for reading (events.h); what arrives is read
 *	  without waiting (amqp_simple_wait_frame_noblock with a zero
 *	  timeout) until rabbitmq-c holds nothing more: basic.ack (one
 *	  delivery tag, or all up to it with multiple) delivers a message;
 *	  basic.nack fails it (retryable); basic.return, which the broker
 *	  sends before the ack of a message no queue took, makes that
 *	  message, found by its message_id, unroutable (permanent).
 * 4. A channel.close fails what is unconfirmed: NOT_FOUND the messages
 *	  for the exchange it names (unknown_destination, permanent),
 *	  PRECONDITION_FAILED on the broker's max message size the messages
 *	  larger than it (too_large, permanent), the others retryable; a lost
 *	  connection (connection.close, an error or end of the socket) fails
 *	  them as the destination's failure (connection or auth). Either way
 *	  the connection is dropped and made again by the next batch, as it
 *	  is when the batch's timeout_ms passes with messages unconfirmed
 *	  (timeout, retryable): their confirms would otherwise arrive in
 *	  another batch.
 *
 * rabbitmq-c runs no thread of its own (the connector's thread is ours and
 * touches a connection only until the loop takes it); the watch's callback reads frames
 * and allocates nothing with palloc (an ERROR there would longjmp out of
 * the worker's dispatch), and never raises an ERROR.
 */
#include "postgres.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <linux/sockios.h>
#include <time.h>

#include "fmgr.h"
#include "lib/stringinfo.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "broker.h"
#include "cloudevents.h"
#include "endpoints/registry.h"
#include "rabbitmq.h"

PG_MODULE_MAGIC;

/* The one channel the sink publishes on. */
#define RABBITMQ_CHANNEL	1

/*
 * The room a message's content header frame needs besides its headers
 * table: the frame's own header and end, class, weight, body size, flags,
 * content type, delivery mode, message id, timestamp and a type of up to
 * 255 bytes.
 */
#define RABBITMQ_PROPERTIES_ROOM	1024

/*
 * The certificates TLS verifies the broker's against without "ca_file"
 * (Debian's ca-certificates): rabbitmq-c loads no default store itself.
 */
#define RABBITMQ_SYSTEM_CA	"/etc/ssl/certs/ca-certificates.crt"

/* A pipeline's settings, from its config. */
typedef struct RabbitConfig
{
	char	   *host;
	int			port;
	char	   *vhost;
	char	   *exchange;		/* a template, or "": the default exchange */
	char	   *routing_key;	/* a template, or NULL: the ordering key */
	int			max_in_flight;
	int			timeout_ms;
	char	   *username;
	char	   *password;
	bool		tls;
	char	   *ca_file;
	char	   *cert_file;
	char	   *key_file;
	bool		verify;
	bool		envelope;		/* body "envelope": the message's JSON object */
	RelayCloudEvents ce;		/* "format": CloudEvents or pg_tide's own */
} RabbitConfig;

/* The outcome and bookkeeping of one message of a batch. */
typedef struct RabbitMessage
{
	RelayMessageOutcome o;
	bool		settled;		/* o holds its outcome */
	bool		returned;		/* basic.return came: unroutable once confirmed */
	char	   *exchange;		/* where it was published, for a channel.close */
	size_t		body_len;
	TimestampTz sent_at;
} RabbitMessage;

/* A batch in flight. */
typedef struct RabbitBatch
{
	RelaySinkBatch *batch;
	RelaySendWindow window;
	RabbitMessage *m;			/* one per message */
	int		   *by_tag;			/* message of delivery tag first_tag + k */
	int			nsent;
	int			low;			/* no delivery tag before first_tag + low is unconfirmed */
	uint64		first_tag;
	bool		finished;
} RabbitBatch;

/* What the broker is sending of a basic.return: its header, then its body. */
typedef enum ReturnState
{
	RETURN_NONE = 0,
	RETURN_HEADER,
	RETURN_BODY
} ReturnState;

/* A pipeline's state: its settings and its connection. */
typedef struct RabbitState
{
	RabbitConfig cfg;
	amqp_connection_state_t conn;	/* NULL: not connected */
	RelayConnector *connector;	/* the connection being made, or NULL */
	RelayWatch *watch;
	uint32		watched;		/* the events watched */
	uint64		next_tag;		/* delivery tag of the next publish */
	RabbitBatch *rb;			/* the batch in flight, or NULL */
	/* the connection or channel failed: what the unconfirmed messages get */
	bool		lost;
	RelayOutcome lost_outcome;
	char		lost_class[32];
	char		lost_error[256];
	uint16		close_code;		/* channel.close: its reply code, else 0 */
	char		close_text[256];
	/* a basic.return being read */
	ReturnState return_state;
	uint64		return_left;
	char		return_text[200];
} RabbitState;

static void drain(RabbitState *st);
static void watch_socket(RabbitState *st, bool want_write);

/* Copies AMQP bytes into a C string buffer. */
static void
bytes_to_cstring(char *dst, size_t size, amqp_bytes_t b)
{
	size_t		n = Min(b.len, size - 1);

	memcpy(dst, b.bytes, n);
	dst[n] = '\0';
}

/* Closes the connection, without the close handshake (it would wait). No ERROR. */
static void
disconnect(RabbitState *st)
{
	RelayEventsUnwatch(st->watch);
	st->watch = NULL;
	st->watched = 0;
	if (st->conn != NULL)
		amqp_destroy_connection(st->conn);
	st->conn = NULL;
	st->return_state = RETURN_NONE;
}

/* events.c: the socket is readable (or writable, when asked). */
static void
socket_ready(int fd, uint32 events, void *arg)
{
	RabbitState *st = arg;

	drain(st);
	if (st->rb != NULL)
		st->rb->batch->ready = true;
	else
		watch_socket(st, false);	/* no batch waits to write */
}

/* Watches the socket for reading, and for writing too when want_write. */
static void
watch_socket(RabbitState *st, bool want_write)
{
	uint32		events = EPOLLIN | (want_write ? EPOLLOUT : 0);

	if (st->conn == NULL || (st->watch != NULL && st->watched == events))
		return;
	st->watch = RelayEventsWatch(st->watch, amqp_get_sockfd(st->conn), events, socket_ready, st);
	st->watched = st->watch ? events : 0;
}

/* Sets message i's outcome, once. */
static void
settle(RabbitMessage *rm, RelayOutcome outcome, const char *error_class, const char *error)
{
	if (rm->settled)
		return;
	rm->settled = true;
	if (outcome == RELAY_DELIVERED)
		rm->o.outcome = RELAY_DELIVERED;
	else
		RelaySetFailure(&rm->o, outcome, error_class, 0, error);
	if (rm->sent_at != 0)
		rm->o.latency_ms = (GetCurrentTimestamp() - rm->sent_at) / 1000.0;
}

/* The confirm of delivery tag `tag` (and of all before it, `multiple`). */
static void
confirm(RabbitState *st, uint64 tag, bool multiple, bool acked)
{
	RabbitBatch *rb = st->rb;
	int64		k;

	if (rb == NULL || tag < rb->first_tag || tag >= rb->first_tag + rb->nsent)
		return;					/* not of this batch */
	k = (int64) (tag - rb->first_tag);
	for (int64 pos = multiple ? rb->low : k; pos <= k; pos++)
	{
		int			i = rb->by_tag[pos];
		RabbitMessage *rm = &rb->m[i];

		if (rm->settled)
			continue;
		if (!acked)
			settle(rm, RELAY_RETRYABLE, RELAY_CLASS_BROKER,
				   "broker: the broker refused the message (basic.nack); it is tried again");
		else if (rm->returned)
			settle(rm, RELAY_PERMANENT, RELAY_CLASS_UNROUTABLE, rm->o.error);
		else
			settle(rm, RELAY_DELIVERED, NULL, NULL);
		RelaySendWindowDone(&rb->window, i, acked && !rm->returned, false);
	}
	while (rb->low < rb->nsent && rb->m[rb->by_tag[rb->low]].settled)
		rb->low++;
}

/* The message in flight whose identity is message_id, or -1. */
static int
find_sent(RabbitBatch *rb, const char *message_id)
{
	for (int pos = rb->low; pos < rb->nsent; pos++)
	{
		int			i = rb->by_tag[pos];
		char		id[RELAY_IDENTITY_SIZE];

		RelayMessageIdentity(id, sizeof(id), rb->batch->msgs[i].outbox, rb->batch->msgs[i].id);
		if (strcmp(id, message_id) == 0)
			return i;
	}
	return -1;
}

/* The connection or channel failed: note how, for the unconfirmed messages. */
static void
lose(RabbitState *st, RelayOutcome outcome, const char *error_class, const char *error)
{
	if (st->lost)
		return;
	st->lost = true;
	st->lost_outcome = outcome;
	strlcpy(st->lost_class, error_class, sizeof(st->lost_class));
	strlcpy(st->lost_error, error, sizeof(st->lost_error));
}

/* The class of a connection.close's reply code. */
static const char *
close_class(uint16 code)
{
	/* 403 ACCESS_REFUSED, 530 NOT_ALLOWED (the vhost) */
	return (code == 403 || code == 530) ? RELAY_CLASS_AUTH : RELAY_CLASS_CONNECTION;
}

/* A method frame the broker sent. */
static void
take_method(RabbitState *st, const amqp_frame_t *f)
{
	const amqp_method_t *m = &f->payload.method;
	char		text[256];
	char		error[256];

	switch (m->id)
	{
		case AMQP_BASIC_ACK_METHOD:
			{
				const amqp_basic_ack_t *a = m->decoded;

				confirm(st, a->delivery_tag, a->multiple, true);
				break;
			}
		case AMQP_BASIC_NACK_METHOD:
			{
				const amqp_basic_nack_t *n = m->decoded;

				confirm(st, n->delivery_tag, n->multiple, false);
				break;
			}
		case AMQP_BASIC_RETURN_METHOD:
			{
				const amqp_basic_return_t *r = m->decoded;

				bytes_to_cstring(text, sizeof(text), r->reply_text);
				snprintf(st->return_text, sizeof(st->return_text),
						 "unroutable: the broker returned the message (%u %s): no queue is bound for it",
						 r->reply_code, text);
				st->return_state = RETURN_HEADER;
				break;
			}
		case AMQP_CHANNEL_CLOSE_METHOD:
			{
				const amqp_channel_close_t *c = m->decoded;

				bytes_to_cstring(st->close_text, sizeof(st->close_text), c->reply_text);
				st->close_code = c->reply_code;
				snprintf(error, sizeof(error), "%s: the broker closed the channel: %u %s",
						 c->reply_code == 403 ? RELAY_CLASS_AUTH : RELAY_CLASS_BROKER,
						 c->reply_code, st->close_text);
				if (c->reply_code == 403)
					lose(st, RELAY_UNREACHABLE, RELAY_CLASS_AUTH, error);
				else
					lose(st, RELAY_RETRYABLE, RELAY_CLASS_BROKER, error);
				break;
			}
		case AMQP_CONNECTION_CLOSE_METHOD:
			{
				const amqp_connection_close_t *c = m->decoded;

				bytes_to_cstring(text, sizeof(text), c->reply_text);
				snprintf(error, sizeof(error), "%s: the broker closed the connection: %u %s",
						 close_class(c->reply_code), c->reply_code, text);
				lose(st, RELAY_UNREACHABLE, close_class(c->reply_code), error);
				break;
			}
		default:
			/* connection.blocked and unblocked: the batch's timeout covers them */
			break;
	}
}

/* A content frame: the header or body of a returned message. */
static void
take_content(RabbitState *st, const amqp_frame_t *f)
{
	if (f->frame_type == AMQP_FRAME_HEADER && st->return_state == RETURN_HEADER)
	{
		const amqp_basic_properties_t *p = f->payload.properties.decoded;

		if (st->rb != NULL && p != NULL && (p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG))
		{
			char		id[RELAY_IDENTITY_SIZE];
			int			i;

			bytes_to_cstring(id, sizeof(id), p->message_id);
			if ((i = find_sent(st->rb, id)) >= 0)
			{
				st->rb->m[i].returned = true;
				strlcpy(st->rb->m[i].o.error, st->return_text, sizeof(st->rb->m[i].o.error));
			}
		}
		st->return_left = f->payload.properties.body_size;
		st->return_state = st->return_left > 0 ? RETURN_BODY : RETURN_NONE;
	}
	else if (f->frame_type == AMQP_FRAME_BODY && st->return_state == RETURN_BODY)
	{
		st->return_left -= Min(st->return_left, f->payload.body_fragment.len);
		if (st->return_left == 0)
			st->return_state = RETURN_NONE;
	}
}

/*
 * Whether a channel.close blames message rm: NOT_FOUND naming its
 * exchange, or PRECONDITION_FAILED on a maximum size it exceeds. Sets the
 * class and error it gets.
 */
static bool
close_blames(const RabbitState *st, const RabbitMessage *rm, const char **cls, char *error, size_t size)
{
	const char *p;

	if (st->close_code == 404 && rm->exchange != NULL)
	{
		char		quoted[300];

		snprintf(quoted, sizeof(quoted), "exchange '%s'", rm->exchange);
		if (strstr(st->close_text, quoted) != NULL)
		{
			*cls = RELAY_CLASS_UNKNOWN_DESTINATION;
			snprintf(error, size, "unknown_destination: %s", st->close_text);
			return true;
		}
	}
	if (st->close_code == 406 && (p = strstr(st->close_text, "max size ")) != NULL &&
		rm->body_len > (size_t) strtoull(p + strlen("max size "), NULL, 10))
	{
		*cls = RELAY_CLASS_TOO_LARGE;
		snprintf(error, size, "too_large: %s", st->close_text);
		return true;
	}
	return false;
}

/* The connection is lost: fails every unconfirmed message, and drops it. */
static void
fail_unconfirmed(RabbitState *st)
{
	RabbitBatch *rb = st->rb;

	for (int pos = 0; rb != NULL && pos < rb->nsent; pos++)
	{
		int			i = rb->by_tag[pos];
		RabbitMessage *rm = &rb->m[i];
		const char *cls;
		char		error[256];

		if (rm->settled)
			continue;
		if (close_blames(st, rm, &cls, error, sizeof(error)))
			settle(rm, RELAY_PERMANENT, cls, error);
		else
			settle(rm, st->lost_outcome, st->lost_class, st->lost_error);
		RelaySendWindowDone(&rb->window, i, false, true);
	}
	if (rb != NULL)
	{
		rb->low = rb->nsent;
		rb->window.stopped = true;
	}
	disconnect(st);
	st->lost = false;
	st->close_code = 0;
}

/*
 * Reads, without waiting, every frame the broker has sent, and takes the
 * confirms, returns and closes among them. No palloc, no ERROR: runs in
 * the watch's callback.
 */
static void
drain(RabbitState *st)
{
	struct timeval zero = {0, 0};

	while (st->conn != NULL && !st->lost)
	{
		amqp_frame_t f;
		int			rc = amqp_simple_wait_frame_noblock(st->conn, &f, &zero);
		char		error[256];

		if (rc == AMQP_STATUS_TIMEOUT)
			break;
		if (rc != AMQP_STATUS_OK)
		{
			snprintf(error, sizeof(error), "connection: the connection to the broker was lost: %s",
					 amqp_error_string2(rc));
			lose(st, RELAY_UNREACHABLE, RELAY_CLASS_CONNECTION, error);
			break;
		}
		if (f.frame_type == AMQP_FRAME_METHOD)
			take_method(st, &f);
		else
			take_content(st, &f);
	}
	if (st->lost)
		fail_unconfirmed(st);
	else if (st->conn != NULL)
		amqp_maybe_release_buffers(st->conn);
}

/* The error text of an RPC reply that failed. */
static void
reply_error(amqp_rpc_reply_t r, const char *what, const char **cls, char *error, size_t size)
{
	char		text[200];

	*cls = RELAY_CLASS_CONNECTION;
	if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION)
		snprintf(error, size, "connection: %s: %s", what, amqp_error_string2(r.library_error));
	else if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION && r.reply.id == AMQP_CONNECTION_CLOSE_METHOD)
	{
		const amqp_connection_close_t *c = r.reply.decoded;

		bytes_to_cstring(text, sizeof(text), c->reply_text);
		*cls = close_class(c->reply_code);
		snprintf(error, size, "%s: %s: the broker closed the connection: %u %s", *cls, what,
				 c->reply_code, text);
	}
	else if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION && r.reply.id == AMQP_CHANNEL_CLOSE_METHOD)
	{
		const amqp_channel_close_t *c = r.reply.decoded;

		bytes_to_cstring(text, sizeof(text), c->reply_text);
		*cls = c->reply_code == 403 ? RELAY_CLASS_AUTH : RELAY_CLASS_CONNECTION;
		snprintf(error, size, "%s: %s: the broker closed the channel: %u %s", *cls, what,
				 c->reply_code, text);
	}
	else
		snprintf(error, size, "connection: %s: unexpected answer from the broker", what);
}

/*
 * A connection's making, on a thread of its own (broker.h's
 * RelayConnectorStart): rabbitmq-c makes it only blocking (the TCP connect
 * and the TLS handshake, then the AMQP handshake, login, channel.open and
 * confirm.select, each waiting for the broker's answer), which in the loop
 * would hold every pipeline of the worker while a broker accepts
 * connections and never answers. The thread makes it within the
 * pipeline's timeout_ms and hands it to the loop (connect_done), which
 * watches its socket from then on. The connector's struct holds copies
 * of the settings (the pipeline may close meanwhile), malloc'd.
 */
typedef struct RabbitConnector
{
	RabbitState *st;			/* the loop's: whose connection this is */
	char	   *host;
	char	   *vhost;
	char	   *username;
	char	   *password;
	char	   *ca_file;
	char	   *cert_file;
	char	   *key_file;
	int			port;
	bool		tls;
	bool		verify;
	long		timeout_ms;
	/* the result */
	amqp_connection_state_t conn;	/* made, or NULL */
	char		cls[32];
	char		error[256];
} RabbitConnector;

/* A malloc'd copy of s (NULL stays NULL); *failed when out of memory. */
static char *
connector_strdup(const char *s, bool *failed)
{
	char	   *copy;

	if (s == NULL)
		return NULL;
	if ((copy = strdup(s)) == NULL)
		*failed = true;
	return copy;
}

/* RelayConnector's release: frees the connector's struct. */
static void
connect_release(void *arg)
{
	RabbitConnector *c = arg;

	if (c->password != NULL)
		explicit_bzero(c->password, strlen(c->password));
	free(c->host);
	free(c->vhost);
	free(c->username);
	free(c->password);
	free(c->ca_file);
	free(c->cert_file);
	free(c->key_file);
	free(c);
}

/* RelayConnector's discard: a connection nobody took. */
static void
connect_discard(void *arg)
{
	RabbitConnector *c = arg;

	if (c->conn != NULL)
		amqp_destroy_connection(c->conn);
	c->conn = NULL;
}

/* Sets *tv to what is left until deadline (a monotonic time in ms), at least 1 ms. */
static void
time_left(struct timeval *tv, int64 deadline_ms)
{
	struct timespec now;
	int64		left;

	clock_gettime(CLOCK_MONOTONIC, &now);
	left = deadline_ms - ((int64) now.tv_sec * 1000 + now.tv_nsec / 1000000);
	left = Max(left, 1);
	tv->tv_sec = left / 1000;
	tv->tv_usec = (left % 1000) * 1000;
}

/*
 * Connects, logs in, opens the channel in confirm mode, all within the
 * connector's timeout_ms; false, with its class and error, when it
 * cannot. Runs on the connector's thread: no PostgreSQL function.
 */
static bool
connect_broker(RabbitConnector *c)
{
	struct timespec now;
	int64		deadline_ms;
	struct timeval tv;
	amqp_connection_state_t conn;
	amqp_socket_t *sock;
	amqp_rpc_reply_t r;
	const char *cls = RELAY_CLASS_CONNECTION;
	int			rc;

	clock_gettime(CLOCK_MONOTONIC, &now);
	deadline_ms = (int64) now.tv_sec * 1000 + now.tv_nsec / 1000000 + c->timeout_ms;
	strlcpy(c->cls, RELAY_CLASS_CONNECTION, sizeof(c->cls));
	if ((conn = amqp_new_connection()) == NULL)
	{
		snprintf(c->error, sizeof(c->error), "connection: out of memory for a connection");
		return false;
	}
	sock = c->tls ? amqp_ssl_socket_new(conn) : amqp_tcp_socket_new(conn);
	if (sock == NULL)
	{
		snprintf(c->error, sizeof(c->error), "connection: could not create a%s socket", c->tls ? " TLS" : "");
		amqp_destroy_connection(conn);
		return false;
	}
	if (c->tls)
	{
		const char *ca = c->ca_file ? c->ca_file : (c->verify ? RABBITMQ_SYSTEM_CA : NULL);

		amqp_ssl_socket_set_verify_peer(sock, c->verify);
		amqp_ssl_socket_set_verify_hostname(sock, c->verify);
		rc = AMQP_STATUS_OK;
		if ((ca && (rc = amqp_ssl_socket_set_cacert(sock, ca)) != AMQP_STATUS_OK) ||
			(c->cert_file && (rc = amqp_ssl_socket_set_key(sock, c->cert_file, c->key_file)) != AMQP_STATUS_OK))
		{
			snprintf(c->error, sizeof(c->error), "connection: could not read the TLS files of \"tls\": %s",
					 amqp_error_string2(rc));
			amqp_destroy_connection(conn);
			return false;
		}
	}
	time_left(&tv, deadline_ms);
	rc = amqp_socket_open_noblock(sock, c->host, c->port, &tv);
	if (rc != AMQP_STATUS_OK)
	{
		if (rc == AMQP_STATUS_TIMEOUT)
			strlcpy(c->cls, RELAY_CLASS_TIMEOUT, sizeof(c->cls));
		snprintf(c->error, sizeof(c->error), "%s: could not connect to %.100s:%d within timeout_ms: %s",
				 c->cls, c->host, c->port, amqp_error_string2(rc));
		amqp_destroy_connection(conn);
		return false;
	}
	/* the AMQP handshake and login answer within what is left of timeout_ms */
	time_left(&tv, deadline_ms);
	amqp_set_handshake_timeout(conn, &tv);
	amqp_set_rpc_timeout(conn, &tv);
	r = amqp_login(conn, c->vhost, 0, AMQP_DEFAULT_FRAME_SIZE, 0, AMQP_SASL_METHOD_PLAIN,
				   c->username ? c->username : "guest", c->password ? c->password : "guest");
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		reply_error(r, "login", &cls, c->error, sizeof(c->error));
		/* a broker closes the connection after a refused login */
		if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
			(r.library_error == AMQP_STATUS_CONNECTION_CLOSED || r.library_error == AMQP_STATUS_SOCKET_CLOSED))
		{
			cls = RELAY_CLASS_AUTH;
			snprintf(c->error, sizeof(c->error),
					 "auth: login to vhost \"%.100s\" refused: the broker closed the connection", c->vhost);
		}
		else if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && r.library_error == AMQP_STATUS_TIMEOUT)
		{
			cls = RELAY_CLASS_TIMEOUT;
			snprintf(c->error, sizeof(c->error),
					 "timeout: the broker at %.100s:%d did not answer the AMQP handshake and login within timeout_ms",
					 c->host, c->port);
		}
		strlcpy(c->cls, cls, sizeof(c->cls));
		amqp_destroy_connection(conn);
		return false;
	}
	time_left(&tv, deadline_ms);
	amqp_set_rpc_timeout(conn, &tv);
	amqp_channel_open(conn, RABBITMQ_CHANNEL);
	if ((r = amqp_get_rpc_reply(conn)).reply_type == AMQP_RESPONSE_NORMAL)
	{
		amqp_confirm_select(conn, RABBITMQ_CHANNEL);
		r = amqp_get_rpc_reply(conn);
	}
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		reply_error(r, "opening a channel in confirm mode", &cls, c->error, sizeof(c->error));
		strlcpy(c->cls, cls, sizeof(c->cls));
		amqp_destroy_connection(conn);
		return false;
	}
	c->conn = conn;
	return true;
}

/* RelayConnector's connect, on the connector's thread. */
static void
connect_main(void *arg)
{
	(void) connect_broker(arg);
}

static void fail_all(RabbitBatch *rb, RelayOutcome outcome, const char *cls, const char *error);

/*
 * RelayConnector's done, in the loop: takes the connection, or fails the
 * batch that waits for it.
 */
static void
connect_done(void *arg)
{
	RabbitConnector *c = arg;
	RabbitState *st = c->st;

	st->connector = NULL;
	if (c->conn != NULL)
	{
		st->conn = c->conn;
		c->conn = NULL;
		st->next_tag = 1;
		watch_socket(st, false);
		if (st->rb != NULL && !st->rb->finished)
			st->rb->first_tag = st->next_tag;
	}
	else if (st->rb != NULL && !st->rb->finished)
		fail_all(st->rb, RELAY_UNREACHABLE, c->cls, c->error);
	if (st->rb != NULL)
		st->rb->batch->ready = true;
}

/*
 * Starts making the pipeline's connection on a connector's thread; false
 * with the class and error when none can start.
 */
static bool
connector_start(RabbitState *st, const char **cls, char *error, size_t size)
{
	const RabbitConfig *cfg = &st->cfg;
	RabbitConnector *c = calloc(1, sizeof(RabbitConnector));
	bool		failed = false;

	*cls = RELAY_CLASS_CONNECTION;
	if (c == NULL)
	{
		snprintf(error, size, "connection: out of memory");
		return false;
	}
	c->st = st;
	c->host = connector_strdup(cfg->host, &failed);
	c->vhost = connector_strdup(cfg->vhost, &failed);
	c->username = connector_strdup(cfg->username, &failed);
	c->password = connector_strdup(cfg->password, &failed);
	c->ca_file = connector_strdup(cfg->ca_file, &failed);
	c->cert_file = connector_strdup(cfg->cert_file, &failed);
	c->key_file = connector_strdup(cfg->key_file, &failed);
	c->port = cfg->port;
	c->tls = cfg->tls;
	c->verify = cfg->verify;
	c->timeout_ms = cfg->timeout_ms;
	if (failed)
	{
		snprintf(error, size, "connection: out of memory");
		connect_release(c);
		return false;
	}
	st->connector = RelayConnectorStart(connect_main, connect_done, connect_discard, connect_release,
										c, error, size);
	return st->connector != NULL;
}

/* created_at ("2026-01-02T03:04:05.678+01:00") as seconds since 1970, or now. */
static uint64
created_seconds(const char *created_at)
{
	struct tm	tm;
	int			sh = 0,
				sm = 0;
	char		sign = 0;
	const char *p;
	time_t		t;

	memset(&tm, 0, sizeof(tm));
	if (created_at == NULL ||
		sscanf(created_at, "\"%d-%d-%dT%d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
			   &tm.tm_hour, &tm.tm_min, &tm.tm_sec) != 6)
		return (uint64) time(NULL);
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	t = timegm(&tm);
	/* the offset follows the seconds and their fraction */
	p = created_at + strlen("\"2026-01-02T03:04:05");
	while (*p == '.' || (*p >= '0' && *p <= '9'))
		p++;
	if ((*p == '+' || *p == '-') && sscanf(p, "%c%d:%d", &sign, &sh, &sm) >= 2)
		t -= (sign == '-' ? -1 : 1) * (sh * 3600 + sm * 60);
	return (uint64) t;
}

/* The AMQP headers table being built for a message. */
typedef struct HeaderTable
{
	amqp_table_entry_t *entries;
	int			n;
	int			size;
	bool		too_long;		/* a name over AMQP's 255 bytes */
	const char *type;			/* the "type" header, or NULL */
	size_t		encoded;		/* the table's size on the wire */
} HeaderTable;

/* RelayBrokerForEachHeader's callback: one header as a string entry. */
static void
add_header(const char *name, const char *value, void *arg)
{
	HeaderTable *t = arg;
	amqp_table_entry_t *e;

	if (strlen(name) > 255)
	{
		t->too_long = true;
		return;
	}
	if (t->n == t->size)
	{
		t->size = Max(8, t->size * 2);
		t->entries = t->entries ? repalloc(t->entries, sizeof(amqp_table_entry_t) * t->size)
			: palloc(sizeof(amqp_table_entry_t) * t->size);
	}
	e = &t->entries[t->n++];
	/* the name's length byte and bytes, the type byte, the value's length and bytes */
	t->encoded += 1 + strlen(name) + 1 + 4 + strlen(value);
	e->key = amqp_cstring_bytes(pstrdup(name));
	e->value.kind = AMQP_FIELD_KIND_UTF8;
	e->value.value.bytes = amqp_cstring_bytes(pstrdup(value));
	if (strcmp(name, "type") == 0)
		t->type = e->value.value.bytes.bytes;
}

/* Whether the socket's send buffer can take `need` bytes more without blocking. */
static bool
socket_has_room(RabbitState *st, size_t need)
{
	int			fd = amqp_get_sockfd(st->conn);
	int			queued = 0;
	int			sndbuf = 0;
	socklen_t	len = sizeof(sndbuf);

	if (ioctl(fd, SIOCOUTQ, &queued) != 0 ||
		getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, &len) != 0)
		return true;
	/* a message larger than the buffer goes once the buffer is empty */
	return queued == 0 || (size_t) queued + need <= (size_t) sndbuf / 2;
}

/*
 * Publishes message i, in memory of its own that the caller resets; false
 * with the outcome set when it cannot be sent (its template, a header
 * name), or when the connection failed (st->lost).
 */
static bool
publish(RabbitState *st, RabbitBatch *rb, int i, StringInfo body)
{
	const RelayMessage *msg = &rb->batch->msgs[i];
	RabbitMessage *rm = &rb->m[i];
	StringInfoData exchange;
	StringInfoData routing_key;
	HeaderTable headers;
	amqp_basic_properties_t props;
	amqp_bytes_t content;
	char		id[RELAY_IDENTITY_SIZE];
	char		error[256];
	int			rc;

	initStringInfo(&exchange);
	initStringInfo(&routing_key);
	if (!RelayBrokerExpand(st->cfg.exchange, msg, &exchange, error, sizeof(error)) ||
		(st->cfg.routing_key && !RelayBrokerExpand(st->cfg.routing_key, msg, &routing_key, error, sizeof(error))))
	{
		settle(rm, RELAY_PERMANENT, RELAY_CLASS_TEMPLATE, psprintf("template: %s", error));
		return false;
	}
	if (st->cfg.routing_key == NULL && msg->key == NULL)
	{
		settle(rm, RELAY_PERMANENT, RELAY_CLASS_TEMPLATE,
			   "template: the message has no ordering key, which is its routing key (the config has no \"routing_key\")");
		return false;
	}
	if (st->cfg.routing_key == NULL)
		appendStringInfoString(&routing_key, msg->key);
	memset(&headers, 0, sizeof(headers));
	RelayBrokerForEachHeader(msg, add_header, &headers);
	/* the AMQP binding: cloudEvents_<attribute> application properties */
	RelayCloudEventsForEachHeader(&st->cfg.ce, msg, "cloudEvents_", NULL, add_header, &headers);
	if (exchange.len > 255 || routing_key.len > 255 || headers.too_long)
	{
		settle(rm, RELAY_PERMANENT, RELAY_CLASS_REFUSED,
			   headers.too_long ? "refused: a header name is longer than AMQP's 255 bytes" :
			   "refused: its exchange or routing key is longer than AMQP's 255 bytes");
		return false;
	}
	/*
	 * The properties go in one frame: rabbitmq-c refuses a larger one only
	 * once the publish method is on the wire, which breaks the connection
	 * for every message. Refused here, before anything is sent.
	 */
	if (headers.encoded + RABBITMQ_PROPERTIES_ROOM > (size_t) amqp_get_frame_max(st->conn))
	{
		settle(rm, RELAY_PERMANENT, RELAY_CLASS_TOO_LARGE,
			   psprintf("too_large: its headers take %zu bytes, more than fit in an AMQP frame of %d bytes",
						headers.encoded, amqp_get_frame_max(st->conn)));
		return false;
	}
	RelayMessageIdentity(id, sizeof(id), msg->outbox, msg->id);
	memset(&props, 0, sizeof(props));
	props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
		AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TIMESTAMP_FLAG | AMQP_BASIC_HEADERS_FLAG;
	props.content_type = amqp_cstring_bytes(RelayCloudEventsContentType(&st->cfg.ce) ?
											RelayCloudEventsContentType(&st->cfg.ce) : "application/json");
	props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
	props.message_id = amqp_cstring_bytes(id);
	props.timestamp = created_seconds(msg->created_at);
	props.headers.num_entries = headers.n;
	props.headers.entries = headers.entries;
	if (headers.type != NULL && strlen(headers.type) <= 255)
	{
		props._flags |= AMQP_BASIC_TYPE_FLAG;
		props.type = amqp_cstring_bytes(headers.type);
	}

	resetStringInfo(body);
	RelayCloudEventsAppendBody(body, &st->cfg.ce, msg, st->cfg.envelope);

	rm->sent_at = GetCurrentTimestamp();
	rm->body_len = body->len;
	rm->exchange = MemoryContextStrdup(rb->batch->cxt, exchange.data);
	rb->by_tag[rb->nsent++] = i;
	st->next_tag++;
	content.len = body->len;
	content.bytes = body->data;
	/* mandatory: a message no queue takes is returned, not dropped */
	rc = amqp_basic_publish(st->conn, RABBITMQ_CHANNEL, amqp_cstring_bytes(exchange.data),
							amqp_cstring_bytes(routing_key.data), 1, 0, &props, content);
	if (rc != AMQP_STATUS_OK)
	{
		snprintf(error, sizeof(error), "connection: could not publish: %s", amqp_error_string2(rc));
		lose(st, RELAY_UNREACHABLE, RELAY_CLASS_CONNECTION, error);
		return false;
	}
	return true;
}

/* Publishes what the send window allows now, while the socket has room. */
static void
publish_more(RabbitState *st, RabbitBatch *rb)
{
	MemoryContext cxt = AllocSetContextCreate(CurrentMemoryContext, "pg_tide rabbitmq publish",
											  ALLOCSET_SMALL_SIZES);
	MemoryContext old = MemoryContextSwitchTo(cxt);
	StringInfoData body;
	bool		want_write = false;

	initStringInfo(&body);
	while (st->conn != NULL && !st->lost)
	{
		int			i;
		const RelayMessage *next = rb->window.next < rb->batch->nmsgs ?
			&rb->batch->msgs[rb->window.next] : NULL;

		/* the next message's size, roughly: its payload and its headers */
		if (next != NULL &&
			!socket_has_room(st, strlen(next->payload ? next->payload : "") +
							 (next->headers ? strlen(next->headers) : 0) + 1024))
		{
			want_write = true;
			break;
		}
		if ((i = RelaySendWindowNext(&rb->window)) < 0)
			break;
		/* a failure of the message's own; st->lost is the connection's */
		if (!publish(st, rb, i, &body) && !st->lost)
			RelaySendWindowDone(&rb->window, i, false, false);
	}
	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
	if (st->lost)
		fail_unconfirmed(st);
	else
		watch_socket(st, want_write);
}

/* Fails every message: the connection could not be made. */
static void
fail_all(RabbitBatch *rb, RelayOutcome outcome, const char *cls, const char *error)
{
	for (int i = 0; i < rb->batch->nmsgs; i++)
		settle(&rb->m[i], outcome, cls, error);
	rb->finished = true;
}

static void
rabbitmq_start(void *state, RelaySinkBatch *batch)
{
	RabbitState *st = state;
	MemoryContext old = MemoryContextSwitchTo(batch->cxt);
	RabbitBatch *rb = palloc0(sizeof(RabbitBatch));

	rb->batch = batch;
	rb->m = palloc0(sizeof(RabbitMessage) * Max(batch->nmsgs, 1));
	for (int i = 0; i < batch->nmsgs; i++)
		rb->m[i].o.wait_ms = -1;
	rb->by_tag = palloc0(sizeof(int) * Max(batch->nmsgs, 1));
	RelaySendWindowInit(&rb->window, batch, st->cfg.max_in_flight, st->cfg.timeout_ms);
	MemoryContextSwitchTo(old);
	batch->sink_private = rb;
	st->rb = rb;
	st->lost = false;

	/*
	 * A connection closed since the last batch is dropped, then made again
	 * on a connector's thread, whose end makes the batch ready; a connect
	 * still running from an earlier batch serves this one.
	 */
	drain(st);
	if (st->conn == NULL && st->connector == NULL)
	{
		const char *cls;
		char		error[256];

		if (!connector_start(st, &cls, error, sizeof(error)))
			fail_all(rb, RELAY_UNREACHABLE, cls, error);
		return;
	}
	rb->first_tag = st->next_tag;
}

static bool
rabbitmq_progress(void *state, RelaySinkBatch *batch)
{
	RabbitState *st = state;
	RabbitBatch *rb = batch->sink_private;

	if (rb->finished)
		return true;
	if (st->conn == NULL && st->connector != NULL)
	{
		/* the connection is being made (connect_signalled ends the wait) */
		if (GetCurrentTimestamp() < rb->window.deadline)
		{
			batch->wake_at = rb->window.deadline;
			return false;
		}
		fail_all(rb, RELAY_UNREACHABLE, RELAY_CLASS_TIMEOUT,
				 "timeout: the connection to the broker (TCP, TLS, AMQP handshake, login, channel) was not made within the batch's timeout_ms");
		return true;
	}
	drain(st);
	publish_more(st, rb);
	if (RelaySendWindowFinished(&rb->window))
	{
		rb->finished = true;
		return true;
	}
	if (GetCurrentTimestamp() >= rb->window.deadline)
	{
		char		error[256];

		snprintf(error, sizeof(error), "timeout: no confirm from the broker within the batch's timeout_ms (%d ms)",
				 st->cfg.timeout_ms);
		lose(st, RELAY_RETRYABLE, RELAY_CLASS_TIMEOUT, error);
		fail_unconfirmed(st);
		rb->finished = true;
		return true;
	}
	batch->wake_at = rb->window.deadline;
	return false;
}

static void
rabbitmq_outcomes(void *state, RelaySinkBatch *batch, RelayDeliveryResult *result)
{
	RabbitState *st = state;
	RabbitBatch *rb = batch->sink_private;

	for (int i = 0; i < batch->nmsgs; i++)
	{
		if (rb->m[i].settled)
			result->each[i] = rb->m[i].o;
		else
			RelaySendWindowNotSent(&rb->window, i, &result->each[i]);
	}
	st->rb = NULL;
	watch_socket(st, false);
}

/*
 * Abandons a batch: with messages unconfirmed the connection is dropped,
 * so that no confirm of theirs is taken for another batch's.
 */
static void
rabbitmq_cancel(void *state, RelaySinkBatch *batch)
{
	RabbitState *st = state;
	RabbitBatch *rb = batch->sink_private;

	st->rb = NULL;
	if (rb != NULL && rb->low < rb->nsent)
		disconnect(st);
	else
		watch_socket(st, false);
}

static void
rabbitmq_close(void *state)
{
	RabbitState *st = state;

	st->rb = NULL;
	disconnect(st);
	RelayConnectorAbandon(st->connector);
	st->connector = NULL;
}

/* The pipeline's settings, with the credentials it refers to read. */
static bool
rabbitmq_open(const cJSON *config, RelaySinkOpened *opened)
{
	RabbitState *st = palloc0(sizeof(RabbitState));
	RabbitConfig *cfg = &st->cfg;
	const cJSON *auth = RelayConfigMember(config, "auth");
	const cJSON *tls = RelayConfigMember(config, "tls");
	char	   *error = NULL;

	if (!cJSON_IsString(RelayConfigMember(config, "host")))
	{
		opened->error = "its config has no \"host\"";
		return false;
	}
	cfg->host = RelayConfigString(config, "host");
	cfg->port = RelayConfigIntOr(config, "port", RABBITMQ_PORT);
	cfg->vhost = RelayConfigString(config, "vhost");
	if (cfg->vhost == NULL)
		cfg->vhost = "/";
	cfg->exchange = RelayConfigString(config, "exchange");
	if (cfg->exchange == NULL)
		cfg->exchange = "";
	cfg->routing_key = RelayConfigString(config, "routing_key");
	cfg->max_in_flight = RelayConfigIntOr(config, "max_in_flight", 100);
	cfg->timeout_ms = RelayConfigIntOr(config, "timeout_ms", 10000);
	cfg->envelope = RelayConfigStringIs(config, "body", "envelope");
	RelayCloudEventsOpen(config, &cfg->ce);
	cfg->tls = cJSON_IsObject(tls) || cJSON_IsTrue(tls);
	if (cJSON_IsObject(tls))
	{
		cfg->ca_file = RelayConfigString(tls, "ca_file");
		cfg->cert_file = RelayConfigString(tls, "cert_file");
		cfg->key_file = RelayConfigString(tls, "key_file");
		cfg->verify = !RelayConfigIs(tls, "verify", false);
	}
	else
		cfg->verify = true;
	/* connecting is part of the batch's timeout_ms */
	opened->longest_batch_seconds = (cfg->timeout_ms + 999) / 1000 + 1;
	if (auth != NULL)
	{
		const cJSON *user = RelayConfigMember(auth, "username");
		const cJSON *password = RelayConfigMember(auth, "password");

		opened->read_secrets = cJSON_IsObject(user) || cJSON_IsObject(password);
		if (!RelayBrokerCredential(user, &cfg->username, &error) ||
			!RelayBrokerCredential(password, &cfg->password, &error))
		{
			opened->error = error;
			return false;
		}
	}
	opened->state = st;
	return true;
}

/* The routine and init symbol of the RabbitMQ sink, a module (endpoints/registry.h). */
RELAY_BROKER_SINK_ENDPOINT(rabbitmq, RelayRabbitmqConfigKeys, RelayRabbitmqValidate);
