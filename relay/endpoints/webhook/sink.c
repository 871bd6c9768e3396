/*
 * sink.c
 *		The webhook sink: POSTs messages to a URL, signed the Standard
 *		Webhooks way, through one libcurl multi handle that the worker's
 *		loop drives together with every other batch in flight.
 *
 * 1. `open` reads the pipeline's config (url, mode, max_in_flight,
 *	  timeout_ms, headers, signing_secret, signature, allow_http,
 *	  allow_private_network; validated by config.c) and reads the
 *	  secrets it refers to (secrets.c).
 * 2. `start` builds the requests. Mode 'single': one request per message,
 *	  the body the message's JSON object; mode 'batch': one request whose
 *	  body is a JSON array of the whole batch. Each request carries
 *	  webhook-id and Idempotency-Key (outbox_<outbox>:<id>, or
 *	  <first>-<last> for a batch), webhook-timestamp, the custom headers,
 *	  the signatures and, in mode 'single', the message's W3C traceparent
 *	  and tracestate. With "format": "cloudevents" (cloudevents.c) a body
 *	  is the structured event (a batch: a JSON array of them), or in
 *	  binary mode the payload with the attributes in ce-* headers.
 * 3. The requests run up to max_in_flight at once, the whole batch bounded
 *	  by timeout_ms. curl tells the worker which sockets to wait on
 *	  (CURLMOPT_SOCKETFUNCTION, into events.c's epoll set) and when to call
 *	  it back (CURLMOPT_TIMERFUNCTION, an events.c timer); the worker's
 *	  loop waits on all of them at once with every other pipeline's, and
 *	  `progress` starts what the in-flight limit allows; with ordering
 *	  'key', a message's request only once the request of the previous
 *	  message of its key was delivered (RelaySinkBatch.after), never when it
 *	  failed (the message is then parked by the worker). No new request
 *	  starts after a failure with ordering 'strict' (what follows is
 *	  delivered again anyway), nor after the destination itself failed (the
 *	  others would fail alike), nor in the last tenth of timeout_ms (it
 *	  could not be answered).
 * 4. `outcomes` classifies each message (sink.h): 2xx delivered; 408, 425,
 *	  429, 5xx and a timeout once connected are the message's retryable
 *	  failures; other statuses its permanent failures (redirects are never
 *	  followed; 410 Gone also asks that the pipeline be disabled); no
 *	  connection at all (dns, conn_refused, tls, blocked_ssrf by the SSRF
 *	  check) is the destination's failure; a request never started was not
 *	  sent. Retry-After, in seconds or as an HTTP-date, is the wait the
 *	  destination asks for.
 * 5. `outcomes` and `cancel` remove every easy handle of the batch from the
 *	  multi handle before the worker frees the batch's memory, which the
 *	  handles point into (bodies, header lists, buffers).
 *
 * Unless allow_private_network, the address curl is about to connect to
 * (after DNS resolution) is checked in CURLOPT_OPENSOCKETFUNCTION, so a
 * name that resolves to a loopback, private, link-local (cloud metadata),
 * unspecified or multicast address is refused (the rules are address.c's,
 * which tide.relay_set_outbox also applies to a URL written with an
 * address). Proxies are switched off, and pipelines with and without
 * allow_private_network use separate multi handles, so they never share a
 * connection. Each multi handle keeps at most pg_tide.relay_max_connections
 * connections open, and at most WEBHOOK_HOST_CONNECTIONS to one host: a
 * request is handed to curl only when one of its host's is free, and the
 * batches that find none wait for one in turn (WebhookHost).
 *
 * Runs with no transaction open. No callback raises an ERROR or allocates
 * with palloc (an ERROR would longjmp through libcurl); every failure is
 * returned as data.
 */
#include "postgres.h"

#include <ctype.h>
#include <dirent.h>
#include <sys/socket.h>
#include <time.h>

#include <curl/curl.h>
#include <sys/epoll.h>

#include "lib/ilist.h"
#include "lib/stringinfo.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "address.h"
#include "cloudevents.h"
#include "events.h"
#include "relay_init.h"
#include "secrets.h"
#include "signature.h"
#include "sink.h"
#include "endpoints/registry.h"
#include "webhook.h"

/* How much of a response body is kept (for the log). */
#define WEBHOOK_MAX_RESPONSE	2048
/* Connections to one destination host, at most (and curl's bound per host). */
#define WEBHOOK_HOST_CONNECTIONS 64
/* Easy handles a pool keeps to use again rather than make anew. */
#define WEBHOOK_IDLE_HANDLES	64
#define WEBHOOK_HOST_KEY_SIZE	256

/*
 * pg_tide.relay_max_connections: the connections each multi handle keeps
 * open at most.
 */
static int	max_connections = 256;

/* A webhook pipeline's settings, from its config. */
typedef struct WebhookSinkConfig
{
	char	   *url;
	bool		batch_mode;		/* mode 'batch': one JSON array per request */
	int			max_in_flight;
	int			timeout_ms;		/* bounds the whole batch */
	char	   *headers;		/* custom "Name: value" lines, '\n'-separated, or NULL */
	char	   *secrets;		/* base64 after whsec_, space-separated, or NULL */
	bool		pg_tide_signature;	/* signature 'pg-tide' rather than 'standard' */
	bool		allow_http;
	bool		allow_private_network;
	char		host_key[WEBHOOK_HOST_KEY_SIZE];	/* "scheme://host:port" of the url */
	RelayCloudEvents ce;		/* "format": CloudEvents or pg_tide's own */
} WebhookSinkConfig;

/*
 * A multi handle with its own connection cache and its timer: a
 * connection that a pipeline with allow_private_network opened to a
 * private address must never be reused by one without it (a reused
 * connection is not checked again), so there are two. Both live as long as
 * the worker and serve all its webhook pipelines.
 */
typedef struct WebhookPool
{
	CURLM	   *multi;
	RelayTimer	timer;
	HTAB	   *hosts;			/* WebhookHost by "scheme://host:port" */
	CURL	   *idle[WEBHOOK_IDLE_HANDLES]; /* easy handles to use again, reset */
	int			nidle;
} WebhookPool;

/*
 * A destination host's connections in a pool: the requests started to it
 * and not finished, at most WEBHOOK_HOST_CONNECTIONS (curl's own bound per
 * host), and the batches waiting for one of them to finish, in the order
 * they came. A request is handed to curl only with a connection for it:
 * one queued inside curl behind the bound would have its timeout run, and
 * time out unsent, taken for the destination's failure.
 */
typedef struct WebhookHost
{
	char		key[WEBHOOK_HOST_KEY_SIZE];
	int			running;
	dlist_head	waiting;		/* WebhookBatch.wait_node */
} WebhookHost;

static WebhookPool pools[2];
static bool curl_ready = false;

/*
 * Whether TLS verifies against curl's default CA directory rather than its
 * CA bundle (ca_directory_usable): OpenSSL 3 parses the whole bundle, some
 * hundred and fifty certificates, for each new TLS connection, which held
 * the worker's loop for 100 ms to a second each time; a directory of
 * hashed names is read one certificate at a time, as a chain is verified.
 */
static bool ca_directory_only = false;

struct WebhookBatch;

/* One HTTP request of a batch, and what came back. */
typedef struct WebhookRequest
{
	struct WebhookBatch *wb;
	CURL	   *easy;
	struct curl_slist *hdrs;
	StringInfoData body;
	int			first;			/* index of its first message in the batch */
	int			last;			/* index of its last message */
	bool		started;
	bool		holds_slot;		/* started and counted in its host's running */
	bool		skipped;		/* never to start: the message it waits for failed */
	bool		done;
	bool		blocked;		/* the SSRF check refused the address */
	bool		allow_private;
	CURLcode	code;
	long		status;
	long		retry_after_ms;
	bool		info_kept;		/* connected and latency_ms were read, the handle freed */
	bool		connected;
	double		latency_ms;
	size_t		resp_len;
	char	   *resp;			/* the body's first bytes (malloc, WEBHOOK_MAX_RESPONSE), or NULL */
	char		errbuf[CURL_ERROR_SIZE];
} WebhookRequest;

/* A batch in flight: its requests and how far they got. */
typedef struct WebhookBatch
{
	RelaySinkBatch *batch;
	const WebhookSinkConfig *cfg;
	WebhookPool *pool;
	WebhookHost *host;
	dlist_node	wait_node;		/* in host->waiting while waiting is set */
	bool		waiting;
	int			handed;			/* connections handed to it, not yet used */
	WebhookRequest *reqs;
	int			nreqs;			/* its requests, each prepared when it starts */
	char		ts[32];			/* webhook-timestamp, the same for every request */
	int			next;			/* the first request neither started nor skipped */
	int			running;
	bool		stopped;		/* start no more requests */
	const char *failed;			/* the batch could not be sent: why */
	TimestampTz started_at;
	TimestampTz deadline;		/* started_at + timeout_ms */
	bool		released;
} WebhookBatch;

/* CURLOPT_OPENSOCKETFUNCTION: refuses an address the SSRF check forbids. */
static curl_socket_t
open_socket(void *clientp, curlsocktype purpose, struct curl_sockaddr *address)
{
	WebhookRequest *r = clientp;

	if (!r->allow_private && RelayAddressRefused(&address->addr))
	{
		r->blocked = true;
		return CURL_SOCKET_BAD;
	}
	return socket(address->family, address->socktype, address->protocol);
}

/* CURLOPT_WRITEFUNCTION: keeps the first bytes of the response body. */
static size_t
write_body(char *ptr, size_t size, size_t nmemb, void *userdata)
{
	WebhookRequest *r = userdata;
	size_t		n = size * nmemb;
	size_t		room;

	/* kept only for a request that has a body; without memory, not kept */
	if (r->resp == NULL && (r->resp = malloc(WEBHOOK_MAX_RESPONSE)) == NULL)
		return n;
	room = WEBHOOK_MAX_RESPONSE - 1 - r->resp_len;

	if (room > 0)
	{
		memcpy(r->resp + r->resp_len, ptr, Min(n, room));
		r->resp_len += Min(n, room);
		r->resp[r->resp_len] = '\0';
	}
	return n;
}

/*
 * CURLOPT_HEADERFUNCTION: notes Retry-After, given in seconds or as an
 * HTTP-date (RFC 9110), as milliseconds from now.
 */
static size_t
read_header(char *buf, size_t size, size_t nitems, void *userdata)
{
	WebhookRequest *r = userdata;
	size_t		n = size * nitems;

	if (n > 12 && n < 128 && pg_strncasecmp(buf, "retry-after:", 12) == 0)
	{
		long		ms = RelayRetryAfterMs(buf + 12, n - 12, time(NULL));

		if (ms >= 0)
			r->retry_after_ms = ms;
	}
	return n;
}

/* Adds one header line to a list; false when curl is out of memory. */
static bool
add_header(struct curl_slist **list, const char *line)
{
	struct curl_slist *l = curl_slist_append(*list, line);

	if (l == NULL)
		return false;
	*list = l;
	return true;
}

/*
 * The signature headers of a request: Standard Webhooks' webhook-signature
 * (every secret signs "<id>.<timestamp>.<body>") or pg-tide's
 * X-Pg-Tide-Signature (the first secret signs the body), computed by
 * RelaySignatureHeader (signature.c). False only when memory ran out.
 */
static bool
add_signatures(struct curl_slist **list, const WebhookSinkConfig *cfg,
			   const char *id, const char *ts, const StringInfo body)
{
	char		line[RELAY_SIGNATURE_HEADER_SIZE];
	int			rc = RelaySignatureHeader(line, cfg->secrets, cfg->pg_tide_signature,
										  id, ts, body->data, body->len);

	return rc == 0 || (rc > 0 && add_header(list, line));
}

/*
 * The host of a pool that a batch's requests go to, made on first use;
 * NULL without memory (its requests are then not counted).
 */
static WebhookHost *
host_of(WebhookPool *pool, const char *key)
{
	WebhookHost *h;
	bool		found;

	if (pool->hosts == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = WEBHOOK_HOST_KEY_SIZE;
		ctl.entrysize = sizeof(WebhookHost);
		ctl.hcxt = TopMemoryContext;
		pool->hosts = hash_create("pg_tide webhook hosts", 64, &ctl,
								  HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	h = hash_search(pool->hosts, key, HASH_ENTER_NULL, &found);
	if (h != NULL && !found)
	{
		h->running = 0;
		dlist_init(&h->waiting);
	}
	return h;
}

/*
 * Whether the batch may start one more request to its host: it was handed
 * a connection, or one is free (none is while batches wait: each freed
 * one goes to the batch that waited longest).
 */
static bool
slot_free(const WebhookBatch *wb)
{
	return wb->host == NULL || wb->handed > 0 || wb->host->running < WEBHOOK_HOST_CONNECTIONS;
}

/* Counts a request that starts on its host's connections. */
static void
slot_take(WebhookRequest *r)
{
	WebhookBatch *wb = r->wb;

	if (wb->host == NULL)
		return;
	if (wb->handed > 0)
		wb->handed--;			/* already counted in running */
	else
		wb->host->running++;
	r->holds_slot = true;
}

/*
 * A connection of the host is no longer needed: handed to the batch that
 * has waited longest for one (it stays counted in running, so no other
 * batch takes it first), which is marked ready so the worker calls its
 * `progress`; or free.
 */
static void
slot_give(WebhookHost *h)
{
	WebhookBatch *next;

	if (dlist_is_empty(&h->waiting))
	{
		h->running--;
		return;
	}
	next = dlist_container(WebhookBatch, wait_node, dlist_pop_head_node(&h->waiting));
	next->waiting = false;
	next->handed++;
	next->batch->ready = true;
}

/* A request no longer in flight gives its connection on. */
static void
slot_release(WebhookRequest *r)
{
	if (!r->holds_slot)
		return;
	r->holds_slot = false;
	slot_give(r->wb->host);
}

/* Gives on the connections a batch was handed and did not use. */
static void
slots_return(WebhookBatch *wb)
{
	while (wb->handed > 0)
	{
		wb->handed--;
		slot_give(wb->host);
	}
}

/* An easy handle for a request: one the pool used before, or a new one. */
static CURL *
get_easy(WebhookPool *pool)
{
	if (pool->nidle > 0)
		return pool->idle[--pool->nidle];
	return curl_easy_init();
}

/* Gives back a request's easy handle, reset, to be used again (or freed). */
static void
put_easy(WebhookPool *pool, CURL *easy)
{
	if (pool != NULL && pool->nidle < WEBHOOK_IDLE_HANDLES)
	{
		curl_easy_reset(easy);
		pool->idle[pool->nidle++] = easy;
	}
	else
		curl_easy_cleanup(easy);
}

/* Appends one message to a body: pg_tide's object, or a CloudEvent. */
static void
append_message(StringInfo body, const WebhookSinkConfig *cfg, const RelayMessage *m)
{
	if (cfg->ce.mode == RELAY_CE_STRUCTURED)
		RelayCloudEventsAppendJson(body, &cfg->ce, m);
	else if (cfg->ce.mode == RELAY_CE_BINARY)
		appendStringInfoString(body, m->payload ? m->payload : "null");
	else
		RelayAppendMessageJson(body, m);
}

/* The Content-Type line of a request: JSON, a CloudEvent, or a batch of them. */
static const char *
content_type(const WebhookSinkConfig *cfg)
{
	if (cfg->ce.mode != RELAY_CE_STRUCTURED)
		return "Content-Type: " RELAY_CE_DATA_CONTENT_TYPE;
	return cfg->batch_mode ? "Content-Type: " RELAY_CE_BATCH_CONTENT_TYPE :
		"Content-Type: " RELAY_CE_CONTENT_TYPE;
}

/* Header lines being added from a callback, and whether all could be. */
typedef struct HeaderAdding
{
	struct curl_slist **list;
	const char *prefix;			/* before each name: "ce-" or "" */
	bool		ok;
} HeaderAdding;

/*
 * RelayCloudEventsCallback: adds "<prefix><name>: <value>"; with a prefix
 * (an attribute), the value percent-encoded as the CloudEvents HTTP
 * binding asks (every byte outside printable ASCII, space, '"' and '%').
 * A trace context header is printable ASCII already, and its spaces are
 * its own.
 */
static void
add_header_from(const char *name, const char *value, void *arg)
{
	HeaderAdding *a = arg;
	StringInfoData line;

	initStringInfo(&line);
	appendStringInfo(&line, "%s%s: ", a->prefix, name);
	for (const unsigned char *p = (const unsigned char *) value; *p; p++)
	{
		if (a->prefix[0] != '\0' && (*p <= 0x20 || *p >= 0x7f || *p == '"' || *p == '%'))
			appendStringInfo(&line, "%%%02X", *p);
		else
			appendStringInfoChar(&line, (char) *p);
	}
	if (a->ok && !add_header(a->list, line.data))
		a->ok = false;
	pfree(line.data);
}

/*
 * The headers of a request that carries one message: the trace context
 * given at publish and, in binary mode, the CloudEvent's attributes.
 * False only when memory ran out.
 */
static bool
add_message_headers(struct curl_slist **list, const WebhookSinkConfig *cfg, const RelayMessage *m)
{
	HeaderAdding a = {list, "", true};

	RelayForEachTraceHeader(m, add_header_from, &a);
	if (cfg->ce.mode == RELAY_CE_BINARY)
	{
		a.prefix = "ce-";
		RelayCloudEventsForEachAttribute(&cfg->ce, m, add_header_from, &a);
	}
	return a.ok;
}

/*
 * Prepares the body and headers of a request for messages first..last; its
 * easy handle is made when it starts (new_easy_handle), so that a batch
 * holds handles, several kilobytes each, only for the requests in flight.
 */
static bool
prepare_request(WebhookRequest *r, const WebhookSinkConfig *cfg, const RelayMessage *msgs,
				int first, int last, const char *ts)
{
	char		id[RELAY_IDENTITY_SIZE];
	char		hdr[NAMEDATALEN * 2 + 128];
	int			i;

	r->first = first;
	r->last = last;
	r->retry_after_ms = -1;
	r->allow_private = cfg->allow_private_network;
	initStringInfo(&r->body);
	if (cfg->batch_mode)
	{
		appendStringInfoChar(&r->body, '[');
		for (i = first; i <= last; i++)
		{
			if (i > first)
				appendStringInfoString(&r->body, ", ");
			append_message(&r->body, cfg, &msgs[i]);
		}
		appendStringInfoChar(&r->body, ']');
	}
	else
		append_message(&r->body, cfg, &msgs[first]);

	RelayMessageIdentity(id, sizeof(id), msgs[first].outbox, msgs[first].id);
	if (first != last)
		snprintf(id + strlen(id), sizeof(id) - strlen(id), "-" INT64_FORMAT, msgs[last].id);

	if (!add_header(&r->hdrs, content_type(cfg)) ||
		!add_header(&r->hdrs, "Expect:") ||
		!add_header(&r->hdrs, "User-Agent: pg_tide"))
		return false;
	snprintf(hdr, sizeof(hdr), "webhook-id: %s", id);
	if (!add_header(&r->hdrs, hdr))
		return false;
	snprintf(hdr, sizeof(hdr), "Idempotency-Key: %s", id);
	if (!add_header(&r->hdrs, hdr))
		return false;
	snprintf(hdr, sizeof(hdr), "webhook-timestamp: %s", ts);
	if (!add_header(&r->hdrs, hdr))
		return false;
	if (cfg->secrets && cfg->secrets[0] &&
		!add_signatures(&r->hdrs, cfg, id, ts, &r->body))
		return false;
	if (cfg->headers && cfg->headers[0])
	{
		char	   *lines = pstrdup(cfg->headers);
		char	   *save = NULL;
		char	   *tok;

		for (tok = strtok_r(lines, "\n", &save); tok; tok = strtok_r(NULL, "\n", &save))
			if (!add_header(&r->hdrs, tok))
				return false;
	}
	return first != last || add_message_headers(&r->hdrs, cfg, &msgs[first]);
}

/*
 * Prepares a request about to start in the batch's memory, which lasts as
 * long as the batch (progress is called in memory the loop resets).
 */
static bool
prepare_request_in(WebhookRequest *r, WebhookBatch *wb)
{
	MemoryContext old = MemoryContextSwitchTo(wb->batch->cxt);
	bool		ok = prepare_request(r, wb->cfg, wb->batch->msgs, r->first, r->last, wb->ts);

	MemoryContextSwitchTo(old);
	return ok;
}

/* The easy handle of a request about to start; false when memory ran out. */
static bool
new_easy_handle(WebhookRequest *r, const WebhookSinkConfig *cfg)
{
	r->easy = get_easy(r->wb->pool);
	if (r->easy == NULL)
		return false;
	curl_easy_setopt(r->easy, CURLOPT_URL, cfg->url);
	curl_easy_setopt(r->easy, CURLOPT_PROTOCOLS_STR, cfg->allow_http ? "http,https" : "https");
	curl_easy_setopt(r->easy, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(r->easy, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(r->easy, CURLOPT_PROXY, "");
	curl_easy_setopt(r->easy, CURLOPT_POST, 1L);
	curl_easy_setopt(r->easy, CURLOPT_POSTFIELDS, r->body.data);
	curl_easy_setopt(r->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) r->body.len);
	curl_easy_setopt(r->easy, CURLOPT_HTTPHEADER, r->hdrs);
	curl_easy_setopt(r->easy, CURLOPT_WRITEFUNCTION, write_body);
	curl_easy_setopt(r->easy, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(r->easy, CURLOPT_HEADERFUNCTION, read_header);
	curl_easy_setopt(r->easy, CURLOPT_HEADERDATA, r);
	curl_easy_setopt(r->easy, CURLOPT_OPENSOCKETFUNCTION, open_socket);
	curl_easy_setopt(r->easy, CURLOPT_OPENSOCKETDATA, r);
	curl_easy_setopt(r->easy, CURLOPT_ERRORBUFFER, r->errbuf);
	curl_easy_setopt(r->easy, CURLOPT_PRIVATE, r);
	curl_easy_setopt(r->easy, CURLOPT_TCP_NODELAY, 1L);
	if (ca_directory_only)
		curl_easy_setopt(r->easy, CURLOPT_CAINFO, NULL);
	return true;
}

/* Whether a finished request acknowledged its messages. */
static bool
request_ok(const WebhookRequest *r)
{
	return r->done && r->code == CURLE_OK && r->status >= 200 && r->status < 300;
}

/*
 * Whether curl had connected a request to the receiver: it connected, or it
 * sent the request on a kept-alive connection (which reports no connect
 * time).
 */
static bool
request_connected(const WebhookRequest *r)
{
	curl_off_t	t = 0;
	long		sent = 0;

	if (r->info_kept)
		return r->connected;
	if (r->easy == NULL)
		return false;
	if (curl_easy_getinfo(r->easy, CURLINFO_CONNECT_TIME_T, &t) == CURLE_OK && t > 0)
		return true;
	return curl_easy_getinfo(r->easy, CURLINFO_REQUEST_SIZE, &sent) == CURLE_OK && sent > 0;
}

/*
 * The outcome of a request, for each of its messages. A request never
 * started is not sent; a connection that could not be made at all (name,
 * refusal, TLS, the SSRF check) is the destination's failure; an answer or a
 * timeout after connecting is the message's: 408, 425, 429 and 5xx and
 * timeouts are retryable, any other status permanent (410 Gone also ends the
 * pipeline).
 */
static void
classify_request(const WebhookRequest *r, RelayDeliveryResult *result)
{
	RelayMessageOutcome o;
	int			i;

	memset(&o, 0, sizeof(o));
	o.wait_ms = r->retry_after_ms;
	if (r->started)
	{
		curl_off_t	us = 0;

		if (r->info_kept)
			o.latency_ms = r->latency_ms;
		else if (curl_easy_getinfo(r->easy, CURLINFO_TOTAL_TIME_T, &us) == CURLE_OK)
			o.latency_ms = us / 1000.0;
		if (r->resp_len > 0)
			o.response = pnstrdup(r->resp, r->resp_len);
	}
	if (!r->started && r->skipped)
		RelaySetFailure(&o, RELAY_NOT_SENT, "not_sent", 0,
						"not sent: the earlier message of its ordering key failed");
	else if (!r->started)
		RelaySetFailure(&o, RELAY_NOT_SENT, "not_sent", 0,
						"not sent: an earlier failure or the batch's timeout_ms came first");
	else if (request_ok(r))
	{
		o.outcome = RELAY_DELIVERED;
		o.response_code = r->status;
	}
	else if (r->blocked)
		RelaySetFailure(&o, RELAY_UNREACHABLE, "blocked_ssrf", 0,
						"blocked_ssrf: the URL resolves to a loopback, private, link-local or other "
						"non-public address; set \"allow_private_network\": true to allow it");
	else if (!r->done || r->code == CURLE_OPERATION_TIMEDOUT)
		RelaySetFailure(&o, request_connected(r) ? RELAY_RETRYABLE : RELAY_UNREACHABLE,
						"timeout", 0, request_connected(r) ?
						"timeout: no answer within the batch's timeout_ms" :
						"timeout: no connection within the batch's timeout_ms");
	else if (r->code != CURLE_OK)
	{
		const char *cls;
		bool		destination = true;
		char		error[256];

		switch (r->code)
		{
			case CURLE_COULDNT_RESOLVE_HOST:
				cls = "dns";
				break;
			case CURLE_COULDNT_CONNECT:
				cls = "conn_refused";
				break;
			case CURLE_SSL_CONNECT_ERROR:
			case CURLE_PEER_FAILED_VERIFICATION:
			case CURLE_SSL_CERTPROBLEM:
			case CURLE_SSL_CIPHER:
			case CURLE_SSL_CACERT_BADFILE:
				cls = "tls";
				break;
			case CURLE_UNSUPPORTED_PROTOCOL:
			case CURLE_URL_MALFORMAT:
				cls = "protocol";
				break;
			default:
				/* sent, then the connection broke: the message may be why */
				cls = "connection";
				destination = !request_connected(r);
				break;
		}
		snprintf(error, sizeof(error), "%s: %s", cls,
				 r->errbuf[0] ? r->errbuf : curl_easy_strerror(r->code));
		RelaySetFailure(&o, destination ? RELAY_UNREACHABLE : RELAY_RETRYABLE, cls, 0, error);
	}
	else
	{
		long		s = r->status;
		char		error[256];

		snprintf(error, sizeof(error), "HTTP status %ld%s%.120s", s,
				 r->resp_len > 0 ? ", response: " : "", r->resp_len > 0 ? r->resp : "");
		RelaySetFailure(&o, (s == 408 || s == 425 || s == 429 || (s >= 500 && s <= 599)) ?
						RELAY_RETRYABLE : RELAY_PERMANENT,
						s == 413 ? "too_large" : s >= 500 ? "http_5xx" : s >= 400 ? "http_4xx" : "http_3xx",
						s, error);
		if (s == 410)
		{
			result->disable = true;
			strlcpy(result->disable_reason, "the receiver answered 410 Gone",
					sizeof(result->disable_reason));
		}
	}
	for (i = r->first; i <= r->last; i++)
		result->each[i] = o;
}

/*
 * A finished request keeps what classify_request needs of its easy handle,
 * which is freed at once, with its headers and body: with many pipelines
 * in flight a batch's requests would otherwise add up (a thousand
 * pipelines with 100 requests a batch held over a gigabyte). Called after
 * curl_multi_info_read, never from inside a curl callback.
 */
static void
keep_info_and_release(WebhookRequest *r, CURLM *multi)
{
	curl_off_t	us = 0;

	r->connected = request_connected(r);
	if (curl_easy_getinfo(r->easy, CURLINFO_TOTAL_TIME_T, &us) == CURLE_OK)
		r->latency_ms = us / 1000.0;
	r->info_kept = true;
	curl_multi_remove_handle(multi, r->easy);
	put_easy(r->wb->pool, r->easy);
	r->easy = NULL;
	curl_slist_free_all(r->hdrs);
	r->hdrs = NULL;
	if (r->body.data)
		pfree(r->body.data);
	r->body.data = NULL;
}

/* Removes a request's easy handle from the multi handle and frees it. */
static void
release_request(WebhookRequest *r, CURLM *multi)
{
	slot_release(r);
	if (r->easy)
	{
		if (r->started)
			curl_multi_remove_handle(multi, r->easy);
		put_easy(r->wb->pool, r->easy);
		r->easy = NULL;
	}
	if (r->hdrs)
	{
		curl_slist_free_all(r->hdrs);
		r->hdrs = NULL;
	}
	free(r->resp);
	r->resp = NULL;
}

/* Fails every message of the batch the same way: nothing could be sent. */
static void
fail_batch(RelayDeliveryResult *result, int nmsgs, const char *error)
{
	int			i;

	for (i = 0; i < nmsgs; i++)
		RelaySetFailure(&result->each[i], RELAY_UNREACHABLE, "internal", 0, error);
}

/*
 * Whether a finished request's failure should stop new requests: always
 * with ordering 'strict' (what follows is delivered again anyway), and
 * when the destination itself failed (the others would fail the same way).
 */
static bool
stops_the_batch(const WebhookRequest *r, bool stop_at_failure)
{
	if (request_ok(r))
		return false;
	if (stop_at_failure || r->blocked)
		return true;
	return r->code != CURLE_OK && !request_connected(r);
}

/*
 * Takes the requests curl has finished: each marks its batch ready, so the
 * worker calls `progress` on it (to start the next request, or to end the
 * batch).
 */
static void
take_finished(WebhookPool *pool)
{
	CURLMsg    *m;
	int			queued;

	while ((m = curl_multi_info_read(pool->multi, &queued)) != NULL)
	{
		WebhookRequest *r = NULL;

		if (m->msg != CURLMSG_DONE)
			continue;
		curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **) &r);
		if (r == NULL || r->done)
			continue;
		r->done = true;
		r->code = m->data.result;
		curl_easy_getinfo(m->easy_handle, CURLINFO_RESPONSE_CODE, &r->status);
		keep_info_and_release(r, pool->multi);
		slot_release(r);
		r->wb->running--;
		if (stops_the_batch(r, r->wb->batch->stop_at_failure))
			r->wb->stopped = true;
		r->wb->batch->ready = true;
	}
}

/* events.c: one of curl's sockets is ready. */
static void
socket_ready(int fd, uint32 events, void *arg)
{
	WebhookPool *pool = arg;
	int			mask = 0;
	int			running;

	if (events & EPOLLIN)
		mask |= CURL_CSELECT_IN;
	if (events & EPOLLOUT)
		mask |= CURL_CSELECT_OUT;
	if (events & (EPOLLERR | EPOLLHUP))
		mask |= CURL_CSELECT_ERR;
	curl_multi_socket_action(pool->multi, fd, mask, &running);
	take_finished(pool);
}

/* events.c: curl's timer is due. */
static void
timer_due(void *arg)
{
	WebhookPool *pool = arg;
	int			running;

	curl_multi_socket_action(pool->multi, CURL_SOCKET_TIMEOUT, 0, &running);
	take_finished(pool);
}

/* CURLMOPT_SOCKETFUNCTION: which of its sockets curl waits on, and for what. */
static int
curl_socket_changed(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
	WebhookPool *pool = userp;
	RelayWatch *w = socketp;

	if (what == CURL_POLL_REMOVE)
	{
		RelayEventsUnwatch(w);
		curl_multi_assign(pool->multi, s, NULL);
		return 0;
	}
	w = RelayEventsWatch(w, s,
						 ((what & CURL_POLL_IN) ? EPOLLIN : 0) |
						 ((what & CURL_POLL_OUT) ? EPOLLOUT : 0),
						 socket_ready, pool);
	/* not watched (out of memory): the batch's deadline ends its request */
	curl_multi_assign(pool->multi, s, w);
	return 0;
}

/* CURLMOPT_TIMERFUNCTION: when curl wants to be called back; -1: never. */
static int
curl_timer_changed(CURLM *multi, long timeout_ms, void *userp)
{
	WebhookPool *pool = userp;

	RelayTimerSet(&pool->timer, timeout_ms);
	return 0;
}

/*
 * Whether curl has a default CA directory that holds certificates under
 * OpenSSL's hashed names (Debian's /etc/ssl/certs, which
 * update-ca-certificates keeps with the same certificates as the bundle
 * /etc/ssl/certs/ca-certificates.crt). Where it has none (a system with a
 * bundle only) the bundle is kept.
 */
static bool
ca_directory_usable(void)
{
	bool		usable = false;
#if LIBCURL_VERSION_NUM >= 0x075400
	CURL	   *easy = curl_easy_init();
	char	   *path = NULL;
	DIR		   *dir;
	struct dirent *de;

	if (easy != NULL && curl_easy_getinfo(easy, CURLINFO_CAPATH, &path) == CURLE_OK &&
		path != NULL && (dir = opendir(path)) != NULL)
	{
		/* a hashed name: eight hexadecimal digits, ".", a digit */
		while (!usable && (de = readdir(dir)) != NULL)
			usable = strlen(de->d_name) == 10 && strspn(de->d_name, "0123456789abcdef") == 8 &&
				de->d_name[8] == '.' && isdigit((unsigned char) de->d_name[9]);
		closedir(dir);
	}
	if (easy != NULL)
		curl_easy_cleanup(easy);
#endif
	return usable;
}

/* The pool for pipelines with or without allow_private_network; NULL when curl cannot start. */
static WebhookPool *
get_pool(bool allow_private)
{
	WebhookPool *pool = &pools[allow_private ? 1 : 0];

	if (!curl_ready)
	{
		if (curl_global_init(CURL_GLOBAL_ALL) != CURLE_OK)
			return NULL;
		curl_ready = true;
		ca_directory_only = ca_directory_usable();
	}
	if (pool->multi == NULL)
	{
		pool->multi = curl_multi_init();
		if (pool->multi == NULL)
			return NULL;
		pool->timer.fire = timer_due;
		pool->timer.arg = pool;
		curl_multi_setopt(pool->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long) WEBHOOK_HOST_CONNECTIONS);
		curl_multi_setopt(pool->multi, CURLMOPT_SOCKETFUNCTION, curl_socket_changed);
		curl_multi_setopt(pool->multi, CURLMOPT_SOCKETDATA, pool);
		curl_multi_setopt(pool->multi, CURLMOPT_TIMERFUNCTION, curl_timer_changed);
		curl_multi_setopt(pool->multi, CURLMOPT_TIMERDATA, pool);
	}
	/*
	 * A reload may have changed it. The cache of idle connections is as
	 * large as the bound: by default curl keeps only 4 per easy handle
	 * attached, so a batch's last requests, and the pause between two
	 * batches, would close the connections the next batch opens again.
	 */
	curl_multi_setopt(pool->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long) max_connections);
	curl_multi_setopt(pool->multi, CURLMOPT_MAXCONNECTS, (long) max_connections);
	return pool;
}

/* Defines the webhook sink's settings; called from _PG_init when preloaded. */
void
RelayDefineWebhookGucs(void)
{
	DefineCustomIntVariable("pg_tide.relay_max_connections",
							"How many connections a relay worker keeps open at most.",
							"Bounds the webhook connections of each worker, for its pipelines "
							"with and without allow_private_network each; requests beyond it "
							"wait for a connection.",
							&max_connections,
							256, 1, 100000,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);
}

/* Milliseconds from now until t (negative once passed). */
static long
ms_until(TimestampTz t)
{
	return (long) ((t - GetCurrentTimestamp()) / 1000);
}

/* Prepares a batch's requests and starts the first ones. */
static void
webhook_start(void *state, RelaySinkBatch *batch)
{
	const WebhookSinkConfig *cfg = state;
	WebhookBatch *wb = palloc0(sizeof(WebhookBatch));
	int			nreqs = cfg->batch_mode ? 1 : batch->nmsgs;

	wb->batch = batch;
	wb->cfg = cfg;
	batch->sink_private = wb;
	wb->pool = get_pool(cfg->allow_private_network);
	if (wb->pool == NULL)
	{
		wb->failed = "could not initialise libcurl";
		return;
	}
	wb->host = host_of(wb->pool, cfg->host_key);
	snprintf(wb->ts, sizeof(wb->ts), "%ld", (long) time(NULL));
	wb->reqs = palloc0(sizeof(WebhookRequest) * nreqs);
	for (int i = 0; i < nreqs; i++)
	{
		wb->reqs[i].wb = wb;
		wb->reqs[i].first = cfg->batch_mode ? 0 : i;
		wb->reqs[i].last = cfg->batch_mode ? batch->nmsgs - 1 : i;
		wb->reqs[i].retry_after_ms = -1;
	}
	wb->nreqs = nreqs;
	wb->started_at = GetCurrentTimestamp();
	wb->deadline = TimestampTzPlusMilliseconds(wb->started_at, cfg->timeout_ms);
}

/*
 * Whether request i may start now (ordering 'key', sink.h: the request of
 * the message it waits for was delivered), sets r->skipped when it never
 * will (that one failed or will not be sent), or must wait.
 */
static bool
request_may_start(WebhookBatch *wb, int i)
{
	const int  *after = wb->batch->after;
	const WebhookRequest *dep;

	if (after == NULL || wb->cfg->batch_mode || after[i] < 0)
		return true;
	dep = &wb->reqs[after[i]];
	if (dep->skipped || (dep->done && !request_ok(dep)))
		wb->reqs[i].skipped = true;
	return dep->done && request_ok(dep);
}

/*
 * Starts what the in-flight limit allows, in order, a request that waits
 * for an earlier one (ordering 'key') once that one was delivered, unless
 * the batch stopped or is in the last tenth of its time (a request started
 * then could hardly connect, and its timeout would pass for the
 * destination's failure: it is not sent, and leased again); true when the
 * batch is finished.
 */
static bool
webhook_progress(void *state, RelaySinkBatch *batch)
{
	WebhookBatch *wb = batch->sink_private;
	const WebhookSinkConfig *cfg = wb->cfg;
	long		left_ms;
	bool		may_start;
	bool		for_slot = false;

	if (wb->failed)
		return true;
	left_ms = ms_until(wb->deadline);
	may_start = !wb->stopped && left_ms > 0 && left_ms >= cfg->timeout_ms / 10;
	for (int i = wb->next; i < wb->nreqs && may_start && wb->running < cfg->max_in_flight; i++)
	{
		WebhookRequest *r = &wb->reqs[i];

		if (r->started || r->skipped || !request_may_start(wb, i))
			continue;
		if (!slot_free(wb))
		{
			/* its host's connections are all in use: wait for one, in turn */
			for_slot = true;
			break;
		}
		if (!prepare_request_in(r, wb) || !new_easy_handle(r, cfg))
		{
			/* not started: the batch is leased again */
			wb->stopped = true;
			break;
		}
		curl_easy_setopt(r->easy, CURLOPT_TIMEOUT_MS, Max(left_ms, 1L));
		if (curl_multi_add_handle(wb->pool->multi, r->easy) != CURLM_OK)
		{
			/* not started: the batch is leased again */
			wb->stopped = true;
			break;
		}
		r->started = true;
		slot_take(r);
		wb->running++;
	}
	while (wb->next < wb->nreqs && (wb->reqs[wb->next].started || wb->reqs[wb->next].skipped))
		wb->next++;
	/* connections handed to it and not used (nothing more to start now) go on */
	slots_return(wb);
	if (for_slot && !wb->waiting)
	{
		dlist_push_tail(&wb->host->waiting, &wb->wait_node);
		wb->waiting = true;
	}
	if ((wb->running == 0 && !for_slot) || left_ms <= 0)
		return true;
	batch->wake_at = wb->deadline;
	return false;
}

/* Removes the batch's requests from curl; once, and never an ERROR. */
static void
release_batch(WebhookBatch *wb)
{
	if (wb == NULL || wb->released)
		return;
	wb->released = true;
	if (wb->waiting)
	{
		dlist_delete(&wb->wait_node);
		wb->waiting = false;
	}
	slots_return(wb);
	for (int i = 0; i < wb->nreqs; i++)
		release_request(&wb->reqs[i], wb->pool ? wb->pool->multi : NULL);
}

static void
webhook_outcomes(void *state, RelaySinkBatch *batch, RelayDeliveryResult *result)
{
	WebhookBatch *wb = batch->sink_private;

	if (wb->failed)
		fail_batch(result, batch->nmsgs, wb->failed);
	else
		for (int i = 0; i < wb->nreqs; i++)
			classify_request(&wb->reqs[i], result);
	release_batch(wb);
}

static void
webhook_cancel(void *state, RelaySinkBatch *batch)
{
	release_batch(batch->sink_private);
}

/*
 * A header or signing secret value as the worker gets it: a string as it
 * is, {"value": ...} its value, a reference to a secret marked for
 * secrets.c ("\x01env:NAME", "\x01file:NAME"); NULL when it is none of
 * these. `strip` is dropped from the front of a plain string.
 */
static char *
secret_value(const cJSON *v, const char *strip)
{
	const char *s;

	if (cJSON_IsString(v))
	{
		s = v->valuestring;
		if (strip && strncmp(s, strip, strlen(strip)) == 0)
			s += strlen(strip);
		return pstrdup(s);
	}
	if ((s = cJSON_GetStringValue(RelayConfigMember(v, "value"))) != NULL)
		return pstrdup(s);
	if ((s = cJSON_GetStringValue(RelayConfigMember(v, "env"))) != NULL)
		return psprintf("\x01" "env:%s", s);
	if ((s = cJSON_GetStringValue(RelayConfigMember(v, "file"))) != NULL)
		return psprintf("\x01" "file:%s", s);
	return NULL;
}

/* qsort comparator of header lines by name. */
static int
compare_strings(const void *a, const void *b)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

/* The custom headers as "Name: value" lines, '\n'-separated, or NULL. */
static char *
header_lines(const cJSON *headers)
{
	const cJSON *h;
	char	  **lines;
	int			n = 0;
	StringInfoData buf;

	if (!cJSON_IsObject(headers) || cJSON_GetArraySize(headers) == 0)
		return NULL;
	lines = palloc(sizeof(char *) * cJSON_GetArraySize(headers));
	cJSON_ArrayForEach(h, headers)
	{
		char	   *value = secret_value(h, NULL);

		if (value)
			lines[n++] = psprintf("%s: %s", h->string, value);
	}
	if (n == 0)
		return NULL;
	qsort(lines, n, sizeof(char *), compare_strings);
	initStringInfo(&buf);
	for (int i = 0; i < n; i++)
		appendStringInfo(&buf, "%s%s", i > 0 ? "\n" : "", lines[i]);
	return buf.data;
}

/* The signing secrets (base64 after whsec_, or references), space-separated, or NULL. */
static char *
signing_secrets(const cJSON *secret)
{
	StringInfoData buf;
	const cJSON *e;

	if (secret == NULL || cJSON_IsNull(secret))
		return NULL;
	initStringInfo(&buf);
	if (cJSON_IsArray(secret))
	{
		cJSON_ArrayForEach(e, secret)
		{
			char	   *v = secret_value(e, "whsec_");

			if (v)
				appendStringInfo(&buf, "%s%s", buf.len > 0 ? " " : "", v);
		}
	}
	else
	{
		char	   *v = secret_value(secret, "whsec_");

		if (v)
			appendStringInfoString(&buf, v);
	}
	return buf.len > 0 ? buf.data : NULL;
}

/* "scheme://host:port" of a URL, the default port filled in (or the URL itself). */
static void
host_key(const char *url, char *key)
{
	CURLU	   *u = curl_url();
	char	   *scheme = NULL;
	char	   *host = NULL;
	char	   *port = NULL;

	strlcpy(key, url, WEBHOOK_HOST_KEY_SIZE);
	if (u == NULL)
		return;
	if (curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
		curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
		curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
		curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK)
		snprintf(key, WEBHOOK_HOST_KEY_SIZE, "%s://%s:%s", scheme, host, port);
	curl_free(scheme);
	curl_free(host);
	curl_free(port);
	curl_url_cleanup(u);
}

/*
 * The pipeline's settings from its config (a URL is required), with the
 * secrets it refers to read; false when they cannot be (the pipeline's
 * error, recorded by pipelines.c).
 */
static bool
webhook_open(const cJSON *config, RelaySinkOpened *opened)
{
	WebhookSinkConfig *w;
	char	   *error = NULL;

	if (!cJSON_IsString(RelayConfigMember(config, "url")))
	{
		opened->error = "its config has no \"url\"";
		return false;
	}
	w = palloc0(sizeof(WebhookSinkConfig));
	w->url = RelayConfigString(config, "url");
	w->batch_mode = RelayConfigStringIs(config, "mode", "batch");
	w->max_in_flight = RelayConfigIntOr(config, "max_in_flight", 16);
	w->timeout_ms = RelayConfigIntOr(config, "timeout_ms", 10000);
	w->headers = header_lines(RelayConfigMember(config, "headers"));
	w->secrets = signing_secrets(RelayConfigMember(config, "signing_secret"));
	w->pg_tide_signature = RelayConfigStringIs(config, "signature", "pg-tide");
	w->allow_http = RelayConfigIs(config, "allow_http", true);
	w->allow_private_network = RelayConfigIs(config, "allow_private_network", true);
	host_key(w->url, w->host_key);
	RelayCloudEventsOpen(config, &w->ce);
	opened->longest_batch_seconds = (w->timeout_ms + 999) / 1000;
	opened->read_secrets = (w->headers && strchr(w->headers, '\x01')) ||
		(w->secrets && strchr(w->secrets, '\x01'));
	if (opened->read_secrets && !RelayResolveSecrets(&w->headers, &w->secrets, &error))
	{
		opened->error = error;
		return false;
	}
	opened->state = w;
	return true;
}

/*
 * The signing secret, and the headers whose name says they carry a
 * credential or that are marked {"secret": true}.
 */
static const char *const webhook_secret_keys[] = {"signing_secret", "headers.*", NULL};

/* The routine and init symbol of the webhook sink, built into pg_tide.so (endpoints/registry.h). */
RELAY_SINK_ENDPOINT(webhook, RelayWebhookConfigKeys, RelayWebhookValidate,
					.secret_keys = webhook_secret_keys);
