/*
 * config.c
 *		The Kafka sink's keys of a pipeline config: bootstrap_servers,
 *		topic (a destination template), max_in_flight, timeout_ms, body,
 *		compression, linger_ms, auth (SASL), tls and producer (extra
 *		librdkafka properties from a short list); see docs/sinks/kafka.md.
 *
 * RelayKafkaValidate is the sink's validate callback: pipeline_config.c
 * has checked the common keys and refused unknown ones. It ends by
 * building the producer's configuration from the normalised config
 * (KafkaBuildConf, which `open` uses too), so that a value librdkafka
 * would refuse is refused here, when the pipeline is set, rather than by
 * the relay later. No property that weakens the delivery guarantee (acks,
 * idempotence, retries, the timeouts) can be set through "producer".
 */
#include "postgres.h"

#include "lib/stringinfo.h"

#include "config_value.h"
#include "broker.h"
#include "cloudevents.h"
#include "kafka.h"

const char *const RelayKafkaConfigKeys[] = {
	"bootstrap_servers", "topic", "max_in_flight", "timeout_ms", "body", "compression",
	"linger_ms", "auth", "tls", "producer", "batch_size", "retry", "ordering", "ordering_key",
	RELAY_CE_CONFIG_KEYS, NULL
};

/*
 * The librdkafka properties "producer" may set: sizes, batching, metadata
 * and reconnection tuning. Everything that decides what "delivered" means
 * (acks, enable.idempotence, retries, message.timeout.ms, max.in.flight)
 * and what has a key of its own (security, compression, linger) is not
 * here.
 */
static const char *const producer_properties[] = {
	"allow.auto.create.topics", "batch.num.messages", "batch.size", "broker.address.family",
	"client.id", "client.rack", "compression.level", "connections.max.idle.ms",
	"message.max.bytes", "metadata.max.age.ms", "partitioner", "queue.buffering.max.kbytes",
	"queue.buffering.max.messages", "reconnect.backoff.max.ms", "reconnect.backoff.ms",
	"retry.backoff.ms", "socket.keepalive.enable", "socket.nagle.disable",
	"sticky.partitioning.linger.ms", "topic.metadata.refresh.interval.ms", NULL
};

/* The characters of a Kafka topic name. */
#define TOPIC_CHARS "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-"

/* bootstrap_servers: "host:port[,host:port...]", hosts as names, IPv4 or [IPv6]. */
static void
check_bootstrap_servers(const cJSON *config)
{
	const char *hint = "Give \"bootstrap_servers\" as \"host:port\" or \"host:port,host:port\", "
		"for example \"kafka1.example.com:9092,kafka2.example.com:9092\".";
	const cJSON *v = RelayConfigRequiredString(config, "bootstrap_servers", hint);
	char	   *list;
	char	   *save = NULL;

	if (!RelayConfigMatches(v->valuestring,
							"^([A-Za-z0-9._-]+|\\[[0-9A-Fa-f:.]+\\]):[0-9]{1,5}"
							"(,([A-Za-z0-9._-]+|\\[[0-9A-Fa-f:.]+\\]):[0-9]{1,5})*$"))
		RelayConfigError(hint, "config key \"bootstrap_servers\" is not a list of host:port: \"%s\"",
						 v->valuestring);
	list = pstrdup(v->valuestring);
	for (char *s = strtok_r(list, ",", &save); s; s = strtok_r(NULL, ",", &save))
	{
		int			port = atoi(strrchr(s, ':') + 1);

		RelayConfigCheckHost("bootstrap_servers", s, strrchr(s, ':') - s, hint);
		if (port < 1 || port > 65535)
			RelayConfigError(hint, "config key \"bootstrap_servers\" has an invalid port: \"%s\"", s);
	}
}

/* topic: a template whose text outside its placeholders is a topic name's. */
static void
check_topic(const cJSON *v)
{
	const char *hint = "Give \"topic\" as a topic name such as \"orders\", or a template such as "
		"\"orders.{type}\" whose placeholders are the message's headers.";

	if (v == NULL)
		RelayConfigError(hint, "config key \"topic\" is missing");
	RelayConfigCheckTemplate("topic", v, hint);
	for (const char *c = v->valuestring; *c; c++)
	{
		if (*c == '{')
		{
			c = strchr(c, '}');
			continue;
		}
		if (strchr(TOPIC_CHARS, *c) == NULL)
			RelayConfigError("A Kafka topic name has letters, digits, \".\", \"_\" and \"-\" only.",
							 "config key \"topic\" has a character a topic name cannot have: \"%s\"",
							 v->valuestring);
	}
	if (strlen(v->valuestring) > 249)
		RelayConfigError("A Kafka topic name has at most 249 characters.",
						 "config key \"topic\" is too long");
	/* Kafka refuses these two names, which are directories' */
	if (strcmp(v->valuestring, ".") == 0 || strcmp(v->valuestring, "..") == 0)
		RelayConfigError("A Kafka topic name cannot be \".\" or \"..\"; give a name such as \"orders\".",
						 "config key \"topic\" is not a valid topic name: \"%s\"", v->valuestring);
}

/* auth: {"mechanism": PLAIN|SCRAM-SHA-256|SCRAM-SHA-512, "username", "password"}. */
static void
check_auth(const cJSON *auth, cJSON *out)
{
	static const char *const keys[] = {"mechanism", "username", "password", NULL};
	static const char *const mechanisms[] = {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", NULL};
	const char *hint = "Give \"auth\" as {\"mechanism\": \"SCRAM-SHA-512\", \"username\": \"...\", "
		"\"password\": {\"env\": \"PG_TIDE_KAFKA_PASSWORD\"}}.";
	const cJSON *username = cJSON_GetObjectItemCaseSensitive(auth, "username");
	const cJSON *password = cJSON_GetObjectItemCaseSensitive(auth, "password");
	cJSON	   *o;

	RelayConfigCheckType("auth", auth, "object", hint);
	RelayConfigCheckKeys(auth, keys, NULL, "auth.");
	o = RelayConfigAddObject(out, "auth");
	RelayConfigAddString(o, "mechanism", RelayConfigChoice(auth, "mechanism", mechanisms, NULL));
	if (username == NULL)
		RelayConfigError(hint, "config key \"auth.username\" is missing");
	RelayConfigCheckType("auth.username", username, "string", hint);
	if (username->valuestring[0] == '\0' || RelayConfigMatches(username->valuestring, "[[:cntrl:]]"))
		RelayConfigError(hint, "config key \"auth.username\" must be a non-empty string without control characters");
	RelayConfigAddCopy(o, "username", username);
	if (password == NULL)
		RelayConfigError(hint, "config key \"auth.password\" is missing");
	RelayConfigCheckCredential("auth.password", password);
	RelayConfigAddCopy(o, "password", password);
}

/* producer: an object of allowed librdkafka properties, values as strings. */
static void
check_producer(const cJSON *producer, cJSON *out)
{
	const char *hint = "Give \"producer\" as an object of librdkafka properties such as "
		"{\"message.max.bytes\": 2000000}; see docs/sinks/kafka.md for those allowed.";
	const cJSON *p;
	cJSON	   *o = RelayConfigAddObject(out, "producer");

	if (producer == NULL)
		return;
	RelayConfigCheckType("producer", producer, "object", hint);
	RelayConfigCheckKeys(producer, producer_properties, NULL, "producer.");
	cJSON_ArrayForEach(p, producer)
	{
		if (cJSON_IsString(p))
			RelayConfigAddString(o, p->string, p->valuestring);
		else if (cJSON_IsRaw(p))
			RelayConfigAddString(o, p->string, p->valuestring);
		else if (cJSON_IsBool(p))
			RelayConfigAddString(o, p->string, cJSON_IsTrue(p) ? "true" : "false");
		else
			RelayConfigError(hint, "config key \"producer.%s\" must be a string, number or boolean, not %s",
							 p->string, RelayConfigTypeName(p));
	}
}

void
RelayKafkaValidate(const cJSON *config, cJSON *out)
{
	static const char *const codecs[] = {"none", "gzip", "snappy", "lz4", "zstd", NULL};
	const cJSON *servers = cJSON_GetObjectItemCaseSensitive(config, "bootstrap_servers");
	const cJSON *topic = cJSON_GetObjectItemCaseSensitive(config, "topic");
	const cJSON *auth = cJSON_GetObjectItemCaseSensitive(config, "auth");
	char		errstr[512];
	rd_kafka_conf_t *conf;

	check_bootstrap_servers(config);
	RelayConfigAddCopy(out, "bootstrap_servers", servers);
	check_topic(topic);
	RelayConfigAddCopy(out, "topic", topic);
	RelayBrokerAddSendSettings(config, out, 1000, 1000);
	RelayConfigCheckCloudEvents(config, out, NULL);
	RelayConfigAddString(out, "compression", RelayConfigChoice(config, "compression", codecs, "none"));
	RelayConfigAddInt(out, "linger_ms", RelayConfigInt(config, "linger_ms", "linger_ms", 0, 10000, 1));
	if (auth != NULL)
		check_auth(auth, out);
	RelayConfigCheckTls(config, out);
	check_producer(cJSON_GetObjectItemCaseSensitive(config, "producer"), out);

	/* librdkafka's own check of every property, a stand-in password for a reference */
	conf = KafkaBuildConf(out, auth ? "password" : NULL, errstr, sizeof(errstr));
	if (conf == NULL)
		RelayConfigError("See docs/sinks/kafka.md for the values librdkafka accepts.",
						 "librdkafka refuses the config: %s", errstr);
	rd_kafka_conf_destroy(conf);
}

/* Sets one property; false, with errstr, when librdkafka refuses it. */
static bool
set(rd_kafka_conf_t *conf, const char *name, const char *value, char *errstr, size_t errsize)
{
	return rd_kafka_conf_set(conf, name, value, errstr, errsize) == RD_KAFKA_CONF_OK;
}

/* The TLS properties of a "tls" object. */
static bool
set_tls(rd_kafka_conf_t *conf, const cJSON *tls, char *errstr, size_t errsize)
{
	static const char *const files[][2] = {
		{"ca_file", "ssl.ca.location"},
		{"cert_file", "ssl.certificate.location"},
		{"key_file", "ssl.key.location"},
	};
	bool		verify = RelayConfigIs(tls, "verify", true);

	for (size_t i = 0; i < lengthof(files); i++)
	{
		const char *file = cJSON_GetStringValue(RelayConfigMember(tls, files[i][0]));

		if (file != NULL && !set(conf, files[i][1], file, errstr, errsize))
			return false;
	}
	return set(conf, "enable.ssl.certificate.verification", verify ? "true" : "false", errstr, errsize) &&
		set(conf, "ssl.endpoint.identification.algorithm", verify ? "https" : "none", errstr, errsize);
}

rd_kafka_conf_t *
KafkaBuildConf(const cJSON *config, const char *password, char *errstr, size_t errsize)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	const cJSON *tls = RelayConfigMember(config, "tls");
	const cJSON *auth = RelayConfigMember(config, "auth");
	const cJSON *p;
	int			timeout_ms = RelayConfigIntOr(config, "timeout_ms", 10000);
	char		num[32];
	bool		ok;

	snprintf(num, sizeof(num), "%d", KAFKA_MESSAGE_TIMEOUT(timeout_ms));
	ok = set(conf, "bootstrap.servers", cJSON_GetStringValue(RelayConfigMember(config, "bootstrap_servers")),
			 errstr, errsize) &&
		set(conf, "enable.idempotence", "true", errstr, errsize) &&
		set(conf, "acks", "all", errstr, errsize) &&
		set(conf, "message.timeout.ms", num, errstr, errsize) &&
		set(conf, "request.timeout.ms", num, errstr, errsize) &&
		set(conf, "compression.codec", cJSON_GetStringValue(RelayConfigMember(config, "compression")),
			errstr, errsize);
	/* a message to a topic that does not exist fails as such, before it times out */
	snprintf(num, sizeof(num), "%d", Max(KAFKA_MESSAGE_TIMEOUT(timeout_ms) / 2, 1));
	ok = ok && set(conf, "topic.metadata.propagation.max.ms", num, errstr, errsize);
	snprintf(num, sizeof(num), "%d", RelayConfigIntOr(config, "linger_ms", 1));
	ok = ok && set(conf, "linger.ms", num, errstr, errsize);
	if (ok)
	{
		bool		use_tls = cJSON_IsObject(tls);
		const char *protocol = auth ? (use_tls ? "sasl_ssl" : "sasl_plaintext") :
			(use_tls ? "ssl" : "plaintext");

		ok = set(conf, "security.protocol", protocol, errstr, errsize) &&
			(!use_tls || set_tls(conf, tls, errstr, errsize));
	}
	if (ok && auth != NULL)
		ok = set(conf, "sasl.mechanism", cJSON_GetStringValue(RelayConfigMember(auth, "mechanism")),
				 errstr, errsize) &&
			set(conf, "sasl.username", cJSON_GetStringValue(RelayConfigMember(auth, "username")),
				errstr, errsize) &&
			set(conf, "sasl.password", password ? password : "", errstr, errsize);
	cJSON_ArrayForEach(p, RelayConfigMember(config, "producer"))
	{
		if (!ok)
			break;
		if (cJSON_IsString(p) && !set(conf, p->string, p->valuestring, errstr, errsize))
			ok = false;
	}
	if (!ok)
	{
		rd_kafka_conf_destroy(conf);
		return NULL;
	}
	return conf;
}

char *
KafkaConfFingerprint(const rd_kafka_conf_t *conf, const char *password)
{
	size_t		n;
	const char **dump = rd_kafka_conf_dump((rd_kafka_conf_t *) conf, &n);
	StringInfoData out;

	rd_kafka_topic_conf_t *topic_conf = rd_kafka_conf_get_default_topic_conf((rd_kafka_conf_t *) conf);

	initStringInfo(&out);
	/* name, value, name, value, ...: librdkafka's order, the same for every conf */
	for (size_t i = 0; i + 1 < n; i += 2)
		if (strcmp(dump[i], "default_topic_conf") != 0)	/* an address: its properties follow */
			appendStringInfo(&out, "%s=%s\n", dump[i], dump[i + 1]);
	rd_kafka_conf_dump_free(dump, n);
	/* the topic-level properties (acks, message.timeout.ms, compression.codec) */
	if (topic_conf != NULL)
	{
		dump = rd_kafka_topic_conf_dump(topic_conf, &n);
		for (size_t i = 0; i + 1 < n; i += 2)
			appendStringInfo(&out, "topic.%s=%s\n", dump[i], dump[i + 1]);
		rd_kafka_conf_dump_free(dump, n);
	}
	/* whether or not librdkafka's dump redacts it */
	appendStringInfo(&out, "password=%s\n", password ? password : "");
	return out.data;
}
