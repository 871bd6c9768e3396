/*
 * broker.c
 *		What every broker's sink shares (broker.h): credentials given inline
 *		or by reference, destination templates, the headers a message
 *		carries, and the notifier that lets a client library's thread wake
 *		the worker's loop.
 *
 * These live in pg_tide.so, not in the broker modules, so that the five
 * brokers read the same config the same way and fail with the same
 * classes; a module calls them as it calls any function of pg_tide.so.
 */
#include "postgres.h"

#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "config_value.h"
#include "broker.h"
#include "secrets.h"

const char *const RelayBrokerSecretKeys[] = {"auth.*", NULL};

void
RelayConfigCheckCredential(const char *key, const cJSON *v)
{
	const char *hint = psprintf("Give \"%s\" as a string, or as {\"env\": \"PG_TIDE_<NAME>\"} or "
								"{\"file\": \"<file name in pg_tide.secrets_directory>\"}.", key);

	if (cJSON_IsObject(v))
	{
		RelayConfigCheckSecretRef(key, v);
		return;
	}
	RelayConfigCheckType(key, v, "string", hint);
	if (v->valuestring[0] == '\0')
		RelayConfigError(hint, "config key \"%s\" must not be empty", key);
	if (RelayConfigMatches(v->valuestring, "[[:cntrl:]]"))
		RelayConfigError(hint, "config key \"%s\" must not contain control characters", key);
}

void
RelayBrokerAddSendSettings(const cJSON *config, cJSON *out, int default_in_flight, int min_timeout_ms)
{
	static const char *const bodies[] = {"payload", "envelope", NULL};

	RelayConfigAddInt(out, "max_in_flight",
					  RelayConfigInt(config, "max_in_flight", "max_in_flight", 1, 10000, default_in_flight));
	RelayConfigAddInt(out, "timeout_ms",
					  RelayConfigInt(config, "timeout_ms", "timeout_ms", min_timeout_ms, 600000, 10000));
	RelayConfigAddString(out, "body", RelayConfigChoice(config, "body", bodies, "payload"));
}

bool
RelayBrokerCredential(const cJSON *v, char **value, char **error)
{
	const char *s;

	*value = NULL;
	if (v == NULL || cJSON_IsNull(v))
		return true;
	if (cJSON_IsString(v))
	{
		*value = pstrdup(v->valuestring);
		return true;
	}
	if ((s = cJSON_GetStringValue(RelayConfigMember(v, "env"))) != NULL)
		*value = RelayReadSecretRef(psprintf("\x01" "env:%s", s), error);
	else if ((s = cJSON_GetStringValue(RelayConfigMember(v, "file"))) != NULL)
		*value = RelayReadSecretRef(psprintf("\x01" "file:%s", s), error);
	else
		*error = pstrdup("a credential is neither a string nor a secret reference");
	return *value != NULL;
}

bool
RelayConfigCheckTls(const cJSON *config, cJSON *out)
{
	static const char *const keys[] = {"ca_file", "cert_file", "key_file", "verify", NULL};
	const char *hint = "Give \"tls\" as true, or as {\"ca_file\": \"/path/ca.pem\", \"cert_file\": ..., "
		"\"key_file\": ..., \"verify\": true} with absolute file names.";
	const cJSON *tls = cJSON_GetObjectItemCaseSensitive(config, "tls");
	cJSON	   *o;

	if (tls == NULL || cJSON_IsFalse(tls))
	{
		RelayConfigAddBool(out, "tls", false);
		return false;
	}
	if (!cJSON_IsTrue(tls))
	{
		RelayConfigCheckType("tls", tls, "object", hint);
		RelayConfigCheckKeys(tls, keys, NULL, "tls.");
	}
	o = RelayConfigAddObject(out, "tls");
	for (int i = 0; i < 3 && cJSON_IsObject(tls); i++)
	{
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(tls, keys[i]);
		char	   *key = psprintf("tls.%s", keys[i]);

		if (v == NULL)
			continue;
		/* one the role setting the pipeline may have the relay read (config_files.c) */
		RelayConfigCheckFile(key, v, hint);
		RelayConfigAddCopy(o, keys[i], v);
	}
	if (cJSON_IsObject(tls) &&
		cJSON_HasObjectItem(tls, "cert_file") != cJSON_HasObjectItem(tls, "key_file"))
		RelayConfigError("A client certificate needs its key: give both \"tls.cert_file\" and \"tls.key_file\", or neither.",
						 "config key \"tls.%s\" is missing",
						 cJSON_HasObjectItem(tls, "cert_file") ? "key_file" : "cert_file");
	RelayConfigAddBool(o, "verify", RelayConfigBool(cJSON_IsObject(tls) ? tls : NULL, "verify", true));
	return true;
}

#define PLACEHOLDER_CHARS "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-."

void
RelayConfigCheckTemplate(const char *key, const cJSON *v, const char *hint)
{
	const char *s;

	RelayConfigCheckType(key, v, "string", hint);
	s = v->valuestring;
	if (s[0] == '\0')
		RelayConfigError(hint, "config key \"%s\" must not be empty", key);
	if (RelayConfigMatches(s, "[[:cntrl:]]"))
		RelayConfigError(hint, "config key \"%s\" must not contain control characters", key);
	for (const char *c = s; *c; c++)
	{
		size_t		len;

		if (*c == '}')
			RelayConfigError(hint, "config key \"%s\" has a \"}\" without its \"{\": \"%s\"", key, s);
		if (*c != '{')
			continue;
		len = strspn(c + 1, PLACEHOLDER_CHARS);
		if (len == 0 || c[1 + len] != '}')
			RelayConfigError(hint, "config key \"%s\" has a malformed placeholder: \"%s\"", key, s);
		c += len + 1;
	}
}

/* The value of a header as a template or a broker header uses it, or NULL. */
static char *
header_text(const cJSON *h)
{
	if (cJSON_IsString(h))
		return h->valuestring;
	if (cJSON_IsNumber(h) || cJSON_IsBool(h) || cJSON_IsRaw(h))
		return cJSON_PrintUnformatted(h);	/* malloc'd: see free_header_text */
	return NULL;
}

static void
free_header_text(const cJSON *h, char *text)
{
	if (text != NULL && !cJSON_IsString(h))
		cJSON_free(text);
}

bool
RelayBrokerExpand(const char *tmpl, const RelayMessage *m, StringInfo out,
				  char *error, size_t errsize)
{
	cJSON	   *headers = NULL;
	bool		ok = true;

	for (const char *c = tmpl; *c && ok; c++)
	{
		char		name[256];
		size_t		len;
		const cJSON *h;
		char	   *text;

		if (*c != '{')
		{
			appendStringInfoChar(out, *c);
			continue;
		}
		len = strspn(c + 1, PLACEHOLDER_CHARS);
		if (len >= sizeof(name) || c[1 + len] != '}')
		{
			snprintf(error, errsize, "destination template \"%s\" is malformed", tmpl);
			ok = false;
			break;
		}
		memcpy(name, c + 1, len);
		name[len] = '\0';
		c += len + 1;
		if (headers == NULL && m->headers != NULL)
			headers = cJSON_Parse(m->headers);
		h = cJSON_GetObjectItemCaseSensitive(headers, name);
		text = header_text(h);
		if (text == NULL || text[0] == '\0')
		{
			snprintf(error, errsize, "header \"%s\" of destination template \"%s\" is %s", name, tmpl,
					 h == NULL ? "missing" : text ? "empty" : "not a string, number or boolean");
			ok = false;
		}
		else
			appendStringInfoString(out, text);
		free_header_text(h, text);
	}
	cJSON_Delete(headers);
	return ok;
}

void
RelayBrokerForEachHeader(const RelayMessage *m, RelayHeaderCallback cb, void *arg)
{
	char		id[RELAY_IDENTITY_SIZE];
	cJSON	   *headers;
	const cJSON *h;

	RelayMessageIdentity(id, sizeof(id), m->outbox, m->id);
	cb(RELAY_HEADER_ID, id, arg);
	cb(RELAY_HEADER_OUTBOX, m->outbox, arg);
	if (m->created_at != NULL)
	{
		/* created_at is a JSON string: its quotes are dropped */
		char	   *created = pstrdup(m->created_at[0] == '"' ? m->created_at + 1 : m->created_at);
		size_t		len = strlen(created);

		if (len > 0 && created[len - 1] == '"')
			created[len - 1] = '\0';
		cb(RELAY_HEADER_CREATED_AT, created, arg);
		pfree(created);
	}
	if (m->headers == NULL || (headers = cJSON_Parse(m->headers)) == NULL)
		return;
	cJSON_ArrayForEach(h, headers)
	{
		char	   *text = cJSON_IsString(h) ? h->valuestring : cJSON_PrintUnformatted(h);

		if (text != NULL)
			cb(h->string, text, arg);
		if (text != NULL && !cJSON_IsString(h))
			cJSON_free(text);
	}
	cJSON_Delete(headers);
}

bool
RelayNotifierOpen(RelayNotifier *n, RelayFdCallback callback, void *arg)
{
	n->watch = NULL;
	n->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (n->fd < 0)
		return false;
	n->watch = RelayEventsWatch(NULL, n->fd, EPOLLIN, callback, arg);
	if (n->watch == NULL)
	{
		close(n->fd);
		n->fd = -1;
		return false;
	}
	return true;
}

void
RelayNotifierSignal(RelayNotifier *n)
{
	uint64		one = 1;

	/* EAGAIN: the counter is already non-zero, the loop will wake anyway */
	if (n->fd >= 0 && write(n->fd, &one, sizeof(one)) < 0)
		return;
}

void
RelayNotifierDrain(RelayNotifier *n)
{
	uint64		count;

	if (n->fd >= 0 && read(n->fd, &count, sizeof(count)) < 0)
		return;
}

void
RelayNotifierStopWatching(RelayNotifier *n)
{
	RelayEventsUnwatch(n->watch);
	n->watch = NULL;
}

void
RelayNotifierClose(RelayNotifier *n)
{
	RelayNotifierStopWatching(n);
	if (n->fd >= 0)
		close(n->fd);
	n->fd = -1;
}

int
RelayBrokerStartThread(void *(*thread_main) (void *), void *arg)
{
	pthread_t	thread;
	sigset_t	all;
	sigset_t	old;
	int			rc;

	/* the thread inherits the mask: every signal is the loop's */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(&thread, NULL, thread_main, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc == 0)
		pthread_detach(thread);
	return rc;
}
