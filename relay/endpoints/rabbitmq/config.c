/*
 * config.c
 *		The RabbitMQ sink's keys of a pipeline config: host, port, vhost,
 *		exchange, routing_key, max_in_flight, timeout_ms, auth, tls and
 *		body; see docs/sinks/rabbitmq.md.
 *
 * RelayRabbitmqValidate is the sink's validate callback: pipeline_config.c
 * has checked the keys every pipeline has and refused unknown ones before
 * it is called, and reads batch_size, retry and ordering, which this sink
 * takes, with the rules common to every sink. Credentials sit under "auth"
 * so that every output redacts them (tide._relay_redact).
 */
#include "postgres.h"

#include "broker.h"
#include "cloudevents.h"
#include "config_value.h"
#include "rabbitmq.h"

const char *const RelayRabbitmqConfigKeys[] = {
	"host", "port", "vhost", "exchange", "routing_key", "max_in_flight", "timeout_ms", "auth",
	"tls", "body", "batch_size", "retry", "ordering", "ordering_key",
	RELAY_CE_CONFIG_KEYS, NULL
};

/* A name AMQP carries as a short string: at most 255 bytes, no control characters. */
static void
check_short_string(const char *key, const cJSON *v, const char *hint, bool may_be_empty)
{
	RelayConfigCheckType(key, v, "string", hint);
	if (!may_be_empty && v->valuestring[0] == '\0')
		RelayConfigError(hint, "config key \"%s\" must not be empty", key);
	if (strlen(v->valuestring) > 255)
		RelayConfigError(hint, "config key \"%s\" is longer than 255 bytes", key);
	if (RelayConfigMatches(v->valuestring, "[[:cntrl:]]"))
		RelayConfigError(hint, "config key \"%s\" must not contain control characters", key);
}

/* "auth": {"username", "password"}, each inline or a secret reference. */
static void
check_auth(const cJSON *auth)
{
	static const char *const keys[] = {"username", "password", NULL};
	const char *hint = "Give \"auth\" as {\"username\": \"...\", \"password\": {\"env\": \"PG_TIDE_RABBITMQ_PASSWORD\"}}.";

	RelayConfigCheckType("auth", auth, "object", hint);
	RelayConfigCheckKeys(auth, keys, NULL, "auth.");
	if (!cJSON_HasObjectItem(auth, "username"))
		RelayConfigError(hint, "config key \"auth.username\" is missing");
	if (!cJSON_HasObjectItem(auth, "password"))
		RelayConfigError(hint, "config key \"auth.password\" is missing");
	RelayConfigCheckCredential("auth.username", cJSON_GetObjectItemCaseSensitive(auth, "username"));
	RelayConfigCheckCredential("auth.password", cJSON_GetObjectItemCaseSensitive(auth, "password"));
}

void
RelayRabbitmqValidate(const cJSON *config, cJSON *out)
{
	const char *host_hint = "Give \"host\", the name or address of the RabbitMQ server, such as \"rabbitmq.internal\".";
	const char *exchange_hint = "Give \"exchange\" as an exchange name, \"\" for the default exchange, or a template such as \"orders.{type}\".";
	const char *rk_hint = "Give \"routing_key\" as a name or a template such as \"orders.{type}\"; with \"ordering\": \"key\" it may be left out to route by the ordering key.";
	const cJSON *host = cJSON_GetObjectItemCaseSensitive(config, "host");
	const cJSON *vhost = cJSON_GetObjectItemCaseSensitive(config, "vhost");
	const cJSON *exchange = cJSON_GetObjectItemCaseSensitive(config, "exchange");
	const cJSON *routing_key = cJSON_GetObjectItemCaseSensitive(config, "routing_key");
	const cJSON *ordering = cJSON_GetObjectItemCaseSensitive(config, "ordering");
	const cJSON *auth = cJSON_GetObjectItemCaseSensitive(config, "auth");
	bool		tls;

	if (host == NULL)
		RelayConfigError(host_hint, "config key \"host\" is missing");
	check_short_string("host", host, host_hint, false);
	if (RelayConfigMatches(host->valuestring, "[[:space:]/]"))
		RelayConfigError(host_hint, "config key \"host\" must be a host name or address, not \"%s\"",
						 host->valuestring);
	RelayConfigCheckHost("host", host->valuestring, strlen(host->valuestring), host_hint);
	RelayConfigAddCopy(out, "host", host);
	tls = RelayConfigCheckTls(config, out);
	RelayConfigAddInt(out, "port", RelayConfigInt(config, "port", "port", 1, 65535,
												  tls ? RABBITMQ_TLS_PORT : RABBITMQ_PORT));
	if (vhost != NULL)
	{
		check_short_string("vhost", vhost, "Give \"vhost\" as the name of a virtual host, such as \"/\".", false);
		RelayConfigAddCopy(out, "vhost", vhost);
	}
	else
		RelayConfigAddString(out, "vhost", "/");

	/* "": the default exchange, which routes to the queue the routing key names */
	if (exchange != NULL && !(cJSON_IsString(exchange) && exchange->valuestring[0] == '\0'))
	{
		RelayConfigCheckTemplate("exchange", exchange, exchange_hint);
		check_short_string("exchange", exchange, exchange_hint, false);
		RelayConfigAddCopy(out, "exchange", exchange);
	}
	else
		RelayConfigAddString(out, "exchange", "");

	if (routing_key != NULL)
	{
		RelayConfigCheckTemplate("routing_key", routing_key, rk_hint);
		check_short_string("routing_key", routing_key, rk_hint, false);
		RelayConfigAddCopy(out, "routing_key", routing_key);
	}
	else if (!(cJSON_IsString(ordering) && strcmp(ordering->valuestring, "key") == 0))
		RelayConfigError(rk_hint, "config key \"routing_key\" is missing");

	RelayBrokerAddSendSettings(config, out, 100, 100);
	RelayConfigCheckCloudEvents(config, out, NULL);
	if (auth != NULL)
	{
		check_auth(auth);
		RelayConfigAddCopy(out, "auth", auth);
	}
}
