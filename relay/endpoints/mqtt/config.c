/*
 * config.c
 *		The MQTT sink's keys of a pipeline config: host, port, topic (a
 *		destination template), qos, protocol, client_id, retain,
 *		max_in_flight, timeout_ms, auth, tls and body; see docs/sinks/mqtt.md.
 *
 * RelayMqttValidate is the sink's validate callback: pipeline_config.c has
 * checked the keys every pipeline has and refused unknown ones, and reads
 * batch_size, retry and ordering, which this sink takes, with the rules
 * common to every sink.
 */
#include "postgres.h"

#include "broker.h"
#include "cloudevents.h"
#include "config_value.h"
#include "mqtt.h"

/* The longest string of the MQTT protocol (a 2-byte length). */
#define MQTT_STRING_MAX_BYTES 65535

const char *const RelayMqttConfigKeys[] = {
	"host", "port", "topic", "qos", "protocol", "client_id", "retain", "max_in_flight",
	"timeout_ms", "auth", "tls", "body", "batch_size", "retry", "ordering", "ordering_key",
	RELAY_CE_CONFIG_KEYS, NULL
};

/*
 * MQTT sends a string (a topic, a client id, a user name) and a password
 * with a 2-byte length: at most 65,535 bytes.
 */
static void
check_string_length(const char *key, const cJSON *v, const char *hint)
{
	if (cJSON_IsString(v) && strlen(v->valuestring) > MQTT_STRING_MAX_BYTES)
		RelayConfigError(hint, "config key \"%s\" is longer than MQTT's %d bytes", key, MQTT_STRING_MAX_BYTES);
}

/* A string key that must be present (or not, when !required), non-empty, without control characters. */
static const cJSON *
plain_string(const cJSON *config, const char *key, bool required, const char *hint)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(config, key);

	if (v == NULL && !required)
		return NULL;
	if (v == NULL)
		RelayConfigError(hint, "config key \"%s\" is missing", key);
	RelayConfigCheckType(key, v, "string", hint);
	if (v->valuestring[0] == '\0')
		RelayConfigError(hint, "config key \"%s\" must not be empty", key);
	if (RelayConfigMatches(v->valuestring, "[[:cntrl:]]"))
		RelayConfigError(hint, "config key \"%s\" must not contain control characters", key);
	check_string_length(key, v, hint);
	return v;
}

/*
 * "topic": a destination template; MQTT's wildcards + and # are for
 * subscriptions, a topic published to must not have them.
 */
static void
check_topic(const cJSON *config, cJSON *out)
{
	const char *hint = "Give \"topic\" as an MQTT topic such as \"orders/created\", or a template such as \"orders/{type}\".";
	const cJSON *topic = cJSON_GetObjectItemCaseSensitive(config, "topic");

	if (topic == NULL)
		RelayConfigError(hint, "config key \"topic\" is missing");
	RelayConfigCheckTemplate("topic", topic, hint);
	check_string_length("topic", topic, hint);
	if (strpbrk(topic->valuestring, "+#") != NULL)
		RelayConfigError("The wildcards + and # are for subscribing; a message is published to one topic.",
						 "config key \"topic\" must not contain \"+\" or \"#\": \"%s\"", topic->valuestring);
	RelayConfigAddCopy(out, "topic", topic);
}

/* "auth": {"username", "password"}, each a string or a secret reference. */
static void
check_auth(const cJSON *config, cJSON *out)
{
	static const char *const keys[] = {"username", "password", NULL};
	const cJSON *auth = cJSON_GetObjectItemCaseSensitive(config, "auth");

	if (auth == NULL)
		return;
	RelayConfigCheckType("auth", auth, "object",
						 "Give \"auth\" as {\"username\": \"...\", \"password\": {\"env\": \"PG_TIDE_...\"}}.");
	RelayConfigCheckKeys(auth, keys, NULL, "auth.");
	if (cJSON_GetObjectItemCaseSensitive(auth, "username") == NULL)
		RelayConfigError("Give \"auth.username\": MQTT sends a password only with a user name.",
						 "config key \"auth.username\" is missing");
	for (const char *const *k = keys; *k; k++)
	{
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(auth, *k);

		if (v == NULL)
			continue;
		RelayConfigCheckCredential(psprintf("auth.%s", *k), v);
		check_string_length(psprintf("auth.%s", *k), v,
							"Give a user name and password of at most 65,535 bytes each.");
	}
	RelayConfigAddCopy(out, "auth", auth);
}

void
RelayMqttValidate(const cJSON *config, cJSON *out)
{
	static const char *const protocols[] = {"5", "3.1.1", NULL};
	static const char *const bodies[] = {"payload", "envelope", NULL};
	const cJSON *host = plain_string(config, "host", true,
									 "Give \"host\", the name or address of the MQTT broker.");
	const cJSON *client_id;
	const cJSON *qos = cJSON_GetObjectItemCaseSensitive(config, "qos");
	const char *protocol;
	const char *body;
	bool		ce;

	RelayConfigCheckHost("host", host->valuestring, strlen(host->valuestring),
						 "Give \"host\", the name or address of the MQTT broker.");
	RelayConfigAddCopy(out, "host", host);
	RelayConfigAddInt(out, "port", RelayConfigInt(config, "port", "port", 1, 65535, MQTT_DEFAULT_PORT));
	check_topic(config, out);
	/* QoS 0 has no acknowledgement: nothing would say a message arrived */
	if (qos != NULL && cJSON_IsRaw(qos) && strcmp(qos->valuestring, "0") == 0)
		RelayConfigError("Give \"qos\" 1 (acknowledged by PUBACK) or 2 (by PUBCOMP); QoS 0 has no acknowledgement, so delivery could not be known.",
						 "config key \"qos\" must be 1 or 2, not 0");
	RelayConfigAddInt(out, "qos", RelayConfigInt(config, "qos", "qos", 1, 2, 1));
	protocol = RelayConfigChoice(config, "protocol", protocols, "5");
	RelayConfigAddString(out, "protocol", protocol);
	/* binary mode needs MQTT 5's user properties */
	RelayConfigCheckCloudEvents(config, out, strcmp(protocol, "5") == 0 ? NULL :
								"MQTT 3.1.1 has no user properties to carry the attributes: use \"cloudevents\": "
								"{\"mode\": \"structured\"}, or \"protocol\": \"5\".");
	/*
	 * MQTT 3.1.1 has no user properties: the body carries the headers (the
	 * envelope), or a structured CloudEvent does
	 */
	ce = cJSON_HasObjectItem(out, "cloudevents");
	body = RelayConfigChoice(config, "body", bodies, strcmp(protocol, "5") == 0 || ce ? "payload" : "envelope");
	if (strcmp(protocol, "3.1.1") == 0 && strcmp(body, "payload") == 0 && !ce)
		RelayConfigError("MQTT 3.1.1 has no user properties to carry the message's identity and headers: leave \"body\" out, or give \"envelope\", or use \"protocol\": \"5\".",
						 "config key \"body\" cannot be \"payload\" with protocol \"3.1.1\"");
	RelayConfigAddString(out, "body", body);
	client_id = plain_string(config, "client_id", false,
							 "Give \"client_id\" as a string unique to this pipeline among the broker's clients, or leave it out.");
	if (client_id != NULL)
		RelayConfigAddCopy(out, "client_id", client_id);
	RelayConfigAddBool(out, "retain", RelayConfigBool(config, "retain", false));
	RelayConfigAddInt(out, "max_in_flight", RelayConfigInt(config, "max_in_flight", "max_in_flight", 1, 10000, 100));
	RelayConfigAddInt(out, "timeout_ms", RelayConfigInt(config, "timeout_ms", "timeout_ms", 100, 600000, 10000));
	check_auth(config, out);
	RelayConfigCheckTls(config, out);
}
