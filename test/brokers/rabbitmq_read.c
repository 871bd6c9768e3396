/*
 * rabbitmq_read.c
 *		The RabbitMQ side of the tests (test/t/046_relay_rabbitmq.pl): a
 *		client written with rabbitmq-c, the broker's C client, not with the
 *		sink's code.
 *
 *	rabbitmq_read HOST PORT USER PASSWORD VHOST COMMAND ...
 *		exchange NAME TYPE		declares a durable exchange
 *		queue NAME [MAX_LENGTH]	declares a durable queue (with MAX_LENGTH,
 *								publishes beyond it are refused: nack)
 *		bind QUEUE EXCHANGE KEY	binds a queue
 *		delete QUEUE			deletes a queue
 *		read QUEUE IDLE_MS [MAX] consumes and acknowledges messages until
 *								none came for IDLE_MS (or MAX came), each
 *								printed as one JSON line: exchange,
 *								routing_key, redelivered, properties,
 *								headers, body and t, the time it was
 *								received (seconds since 1970)
 *
 * Exits 0 on success, 1 with a message on stderr otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <cjson/cJSON.h>

#include "rabbitmq_amqp.h"

static void
die_reply(amqp_rpc_reply_t r, const char *what)
{
	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return;
	if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION)
		fprintf(stderr, "%s: %s\n", what, amqp_error_string2(r.library_error));
	else if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD || r.reply.id == AMQP_CONNECTION_CLOSE_METHOD)
	{
		const amqp_channel_close_t *c = r.reply.decoded;

		fprintf(stderr, "%s: %u %.*s\n", what, c->reply_code, (int) c->reply_text.len,
				(const char *) c->reply_text.bytes);
	}
	else
		fprintf(stderr, "%s: unexpected reply\n", what);
	exit(1);
}

/* A string of AMQP bytes as a cJSON string. */
static cJSON *
bytes_json(amqp_bytes_t b)
{
	char	   *s = malloc(b.len + 1);
	cJSON	   *j;

	memcpy(s, b.bytes, b.len);
	s[b.len] = '\0';
	j = cJSON_CreateString(s);
	free(s);
	return j;
}

/* One field of a headers table as JSON. */
static cJSON *
field_json(const amqp_field_value_t *v)
{
	switch (v->kind)
	{
		case AMQP_FIELD_KIND_UTF8:
		case AMQP_FIELD_KIND_BYTES:
			return bytes_json(v->value.bytes);
		case AMQP_FIELD_KIND_I32:
			return cJSON_CreateNumber(v->value.i32);
		case AMQP_FIELD_KIND_I64:
			return cJSON_CreateNumber((double) v->value.i64);
		case AMQP_FIELD_KIND_BOOLEAN:
			return cJSON_CreateBool(v->value.boolean);
		default:
			return cJSON_CreateString("(other kind)");
	}
}

static void
print_message(const amqp_envelope_t *env)
{
	const amqp_basic_properties_t *p = &env->message.properties;
	cJSON	   *o = cJSON_CreateObject();
	cJSON	   *props = cJSON_AddObjectToObject(o, "properties");
	cJSON	   *headers = cJSON_AddObjectToObject(o, "headers");
	char	   *line;
	struct timeval now;

	gettimeofday(&now, NULL);
	cJSON_AddNumberToObject(o, "t", now.tv_sec + now.tv_usec / 1e6);
	cJSON_AddItemToObject(o, "exchange", bytes_json(env->exchange));
	cJSON_AddItemToObject(o, "routing_key", bytes_json(env->routing_key));
	cJSON_AddBoolToObject(o, "redelivered", env->redelivered);
	if (p->_flags & AMQP_BASIC_CONTENT_TYPE_FLAG)
		cJSON_AddItemToObject(props, "content_type", bytes_json(p->content_type));
	if (p->_flags & AMQP_BASIC_DELIVERY_MODE_FLAG)
		cJSON_AddNumberToObject(props, "delivery_mode", p->delivery_mode);
	if (p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG)
		cJSON_AddItemToObject(props, "message_id", bytes_json(p->message_id));
	if (p->_flags & AMQP_BASIC_TYPE_FLAG)
		cJSON_AddItemToObject(props, "type", bytes_json(p->type));
	if (p->_flags & AMQP_BASIC_TIMESTAMP_FLAG)
		cJSON_AddNumberToObject(props, "timestamp", (double) p->timestamp);
	if (p->_flags & AMQP_BASIC_HEADERS_FLAG)
		for (int i = 0; i < p->headers.num_entries; i++)
		{
			const amqp_table_entry_t *e = &p->headers.entries[i];
			char	   *key = strndup(e->key.bytes, e->key.len);

			cJSON_AddItemToObject(headers, key, field_json(&e->value));
			free(key);
		}
	cJSON_AddItemToObject(o, "body", bytes_json(env->message.body));
	line = cJSON_PrintUnformatted(o);
	printf("%s\n", line);
	free(line);
	cJSON_Delete(o);
}

static void
read_queue(amqp_connection_state_t conn, const char *queue, long idle_ms, long max)
{
	long		n = 0;

	amqp_basic_qos(conn, 1, 0, 500, 0);
	die_reply(amqp_get_rpc_reply(conn), "basic.qos");
	amqp_basic_consume(conn, 1, amqp_cstring_bytes(queue), amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
	die_reply(amqp_get_rpc_reply(conn), "basic.consume");
	while (max <= 0 || n < max)
	{
		amqp_envelope_t env;
		struct timeval tv = {idle_ms / 1000, (idle_ms % 1000) * 1000};
		amqp_rpc_reply_t r;

		amqp_maybe_release_buffers(conn);
		r = amqp_consume_message(conn, &env, &tv, 0);
		if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && r.library_error == AMQP_STATUS_TIMEOUT)
			break;
		die_reply(r, "consume");
		print_message(&env);
		if (amqp_basic_ack(conn, 1, env.delivery_tag, 0) != AMQP_STATUS_OK)
		{
			fprintf(stderr, "basic.ack failed\n");
			exit(1);
		}
		amqp_destroy_envelope(&env);
		n++;
	}
	fflush(stdout);
}

int
main(int argc, char **argv)
{
	amqp_connection_state_t conn;
	amqp_socket_t *sock;
	const char *cmd;

	if (argc < 8)
	{
		fprintf(stderr, "usage: %s HOST PORT USER PASSWORD VHOST COMMAND ARG...\n", argv[0]);
		return 1;
	}
	conn = amqp_new_connection();
	sock = amqp_tcp_socket_new(conn);
	if (amqp_socket_open(sock, argv[1], atoi(argv[2])) != AMQP_STATUS_OK)
	{
		fprintf(stderr, "could not connect to %s:%s\n", argv[1], argv[2]);
		return 1;
	}
	die_reply(amqp_login(conn, argv[5], 0, AMQP_DEFAULT_FRAME_SIZE, 0, AMQP_SASL_METHOD_PLAIN,
						 argv[3], argv[4]), "login");
	amqp_channel_open(conn, 1);
	die_reply(amqp_get_rpc_reply(conn), "channel.open");
	cmd = argv[6];
	if (strcmp(cmd, "exchange") == 0 && argc == 9)
	{
		amqp_exchange_declare(conn, 1, amqp_cstring_bytes(argv[7]), amqp_cstring_bytes(argv[8]),
							  0, 1, 0, 0, amqp_empty_table);
		die_reply(amqp_get_rpc_reply(conn), "exchange.declare");
	}
	else if (strcmp(cmd, "queue") == 0 && argc >= 8)
	{
		amqp_table_entry_t args[2];
		amqp_table_t table = amqp_empty_table;

		if (argc >= 9)
		{
			args[0].key = amqp_cstring_bytes("x-max-length");
			args[0].value.kind = AMQP_FIELD_KIND_I32;
			args[0].value.value.i32 = atoi(argv[8]);
			args[1].key = amqp_cstring_bytes("x-overflow");
			args[1].value.kind = AMQP_FIELD_KIND_UTF8;
			args[1].value.value.bytes = amqp_cstring_bytes("reject-publish");
			table.num_entries = 2;
			table.entries = args;
		}
		amqp_queue_declare(conn, 1, amqp_cstring_bytes(argv[7]), 0, 1, 0, 0, table);
		die_reply(amqp_get_rpc_reply(conn), "queue.declare");
	}
	else if (strcmp(cmd, "bind") == 0 && argc == 10)
	{
		amqp_queue_bind(conn, 1, amqp_cstring_bytes(argv[7]), amqp_cstring_bytes(argv[8]),
						amqp_cstring_bytes(argv[9]), amqp_empty_table);
		die_reply(amqp_get_rpc_reply(conn), "queue.bind");
	}
	else if (strcmp(cmd, "delete") == 0 && argc == 8)
	{
		amqp_queue_delete(conn, 1, amqp_cstring_bytes(argv[7]), 0, 0);
		die_reply(amqp_get_rpc_reply(conn), "queue.delete");
	}
	else if (strcmp(cmd, "read") == 0 && argc >= 9)
		read_queue(conn, argv[7], atol(argv[8]), argc >= 10 ? atol(argv[9]) : 0);
	else
	{
		fprintf(stderr, "unknown command or wrong arguments: %s\n", cmd);
		return 1;
	}
	amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
	amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(conn);
	return 0;
}
