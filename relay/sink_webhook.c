/*
 * sink_webhook.c
 *		The webhook sink: POSTs messages to a URL through one libcurl multi
 *		handle, signed the Standard Webhooks way.
 *
 * 1. Build the requests. Mode 'single': one request per message, the body
 *	  the message's JSON object; mode 'batch': one request whose body is a
 *	  JSON array of the whole batch. Each request carries webhook-id and
 *	  Idempotency-Key (outbox_<outbox>:<id>, or <first>-<last> for a batch),
 *	  webhook-timestamp, the custom headers and the signatures.
 * 2. Run them: up to max_in_flight at once, waiting in curl_multi_poll
 *	  slices of 100 ms with CHECK_FOR_INTERRUPTS() between them, the whole
 *	  batch bounded by timeout_ms. No new request starts after a failure
 *	  with ordering 'strict' (what follows is delivered again anyway), nor
 *	  after the destination itself failed (the others would fail alike),
 *	  nor in the last tenth of timeout_ms (it could not be answered).
 *	  Between slices RelayWorkerShouldStop (worker.c) may say the worker
 *	  must stop (the relay switched off on reload, a pause): the batch is
 *	  then abandoned, its requests released and nothing of it recorded.
 * 3. Classify each message (sink.h): 2xx delivered; 408, 425, 429, 5xx and
 *	  a timeout once connected are the message's retryable failures; other
 *	  statuses its permanent failures (redirects are never followed; 410
 *	  Gone also ends the pipeline); no connection at all (dns,
 *	  conn_refused, tls, blocked_ssrf by the SSRF check) is the
 *	  destination's failure; a request never started was not sent.
 *	  Retry-After, in seconds or as an HTTP-date, comes back with it.
 *
 * Unless allow_private_network, the address curl is about to connect to
 * (after DNS resolution) is checked in CURLOPT_OPENSOCKETFUNCTION, so a
 * name that resolves to a loopback, private, link-local (cloud metadata),
 * unspecified or multicast address is refused (the rules are address.c's,
 * which tide.relay_set_outbox also applies to a URL written with an
 * address). Proxies are switched off, and pipelines with and without
 * allow_private_network use separate multi handles, so they never share a
 * connection.
 *
 * Runs with no transaction open. No callback raises an ERROR or allocates
 * with palloc (an ERROR would longjmp through libcurl); every failure is
 * returned as data.
 */
#include "postgres.h"

#include <sys/socket.h>
#include <time.h>

#include <curl/curl.h>

#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/pmsignal.h"
#include "portability/instr_time.h"
#include "utils/json.h"

#include "address.h"
#include "signature.h"
#include "sink.h"

/* How long one curl_multi_poll may wait before interrupts are checked. */
#define WEBHOOK_POLL_SLICE_MS	100
/* How much of a response body is kept (for the log). */
#define WEBHOOK_MAX_RESPONSE	2048

/* One HTTP request of a batch, and what came back. */
typedef struct WebhookRequest
{
	CURL	   *easy;
	struct curl_slist *hdrs;
	StringInfoData body;
	int			first;			/* index of its first message in the batch */
	int			last;			/* index of its last message */
	bool		started;
	bool		done;
	bool		blocked;		/* the SSRF check refused the address */
	bool		allow_private;
	CURLcode	code;
	long		status;
	long		retry_after_ms;
	size_t		resp_len;
	char		resp[WEBHOOK_MAX_RESPONSE];
	char		errbuf[CURL_ERROR_SIZE];
} WebhookRequest;

/*
 * Two multi handles, each with its own connection cache: a connection that
 * a pipeline with allow_private_network opened to a private address must
 * never be reused by one without it (a reused connection is not checked
 * again). Both live as long as the worker.
 */
static CURLM *multis[2] = {NULL, NULL};
static CURLM *multi = NULL;
static bool curl_ready = false;

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
	size_t		room = sizeof(r->resp) - 1 - r->resp_len;

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
add_signatures(struct curl_slist **list, const RelayWebhookSinkConfig *cfg,
			   const char *id, const char *ts, const StringInfo body)
{
	char		line[RELAY_SIGNATURE_HEADER_SIZE];
	int			rc = RelaySignatureHeader(line, cfg->secrets, cfg->pg_tide_signature,
										  id, ts, body->data, body->len);

	return rc == 0 || (rc > 0 && add_header(list, line));
}

/* Prepares the easy handle of a request for messages first..last. */
static bool
prepare_request(WebhookRequest *r, const RelaySink *sink, const RelayMessage *msgs,
				int first, int last, const char *ts)
{
	const RelayWebhookSinkConfig *cfg = &sink->u.webhook;
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
			RelayAppendMessageJson(&r->body, &msgs[i]);
		}
		appendStringInfoChar(&r->body, ']');
	}
	else
		RelayAppendMessageJson(&r->body, &msgs[first]);

	RelayMessageIdentity(id, sizeof(id), msgs[first].outbox, msgs[first].id);
	if (first != last)
		snprintf(id + strlen(id), sizeof(id) - strlen(id), "-" INT64_FORMAT, msgs[last].id);

	if (!add_header(&r->hdrs, "Content-Type: application/json") ||
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

	r->easy = curl_easy_init();
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
	o.retry_after_ms = r->retry_after_ms;
	if (r->started)
	{
		curl_off_t	us = 0;

		if (curl_easy_getinfo(r->easy, CURLINFO_TOTAL_TIME_T, &us) == CURLE_OK)
			o.latency_ms = us / 1000.0;
		if (r->resp_len > 0)
			o.response = pnstrdup(r->resp, r->resp_len);
	}
	if (!r->started)
		RelaySetFailure(&o, RELAY_NOT_SENT, "not_sent", 0,
						"not sent: an earlier failure or the batch's timeout_ms came first");
	else if (request_ok(r))
	{
		o.outcome = RELAY_DELIVERED;
		o.status = r->status;
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
				 r->resp_len > 0 ? ", response: " : "", r->resp);
		RelaySetFailure(&o, (s == 408 || s == 425 || s == 429 || (s >= 500 && s <= 599)) ?
						RELAY_RETRYABLE : RELAY_PERMANENT,
						s == 413 ? "too_large" : s >= 500 ? "http_5xx" : s >= 400 ? "http_4xx" : "http_3xx",
						s, error);
		if (s == 410)
			result->gone = true;
	}
	for (i = r->first; i <= r->last; i++)
		result->each[i] = o;
}

/* Removes a request's easy handle from the multi handle and frees it. */
static void
release_request(WebhookRequest *r)
{
	if (r->easy)
	{
		if (r->started)
			curl_multi_remove_handle(multi, r->easy);
		curl_easy_cleanup(r->easy);
		r->easy = NULL;
	}
	if (r->hdrs)
	{
		curl_slist_free_all(r->hdrs);
		r->hdrs = NULL;
	}
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
stops_the_batch(const WebhookRequest *r, const RelaySink *sink)
{
	if (request_ok(r))
		return false;
	if (sink->stop_at_failure || r->blocked)
		return true;
	return r->code != CURLE_OK && !request_connected(r);
}

/* Delivers a batch to the sink's URL: see the top of this file. */
void
RelayWebhookSinkDeliver(const RelaySink *sink, const RelayMessage *msgs, int nmsgs,
						RelayDeliveryResult *result)
{
	const RelayWebhookSinkConfig *cfg = &sink->u.webhook;
	WebhookRequest *reqs;
	int			nreqs = cfg->batch_mode ? 1 : nmsgs;
	int			next = 0;
	int			running = 0;
	bool		stopped = false;
	char		ts[32];
	instr_time	start;
	int			i;

	if (!curl_ready)
	{
		if (curl_global_init(CURL_GLOBAL_ALL) != CURLE_OK)
		{
			fail_batch(result, nmsgs, "could not initialise libcurl");
			return;
		}
		curl_ready = true;
	}
	multi = multis[cfg->allow_private_network ? 1 : 0];
	if (multi == NULL)
	{
		multi = multis[cfg->allow_private_network ? 1 : 0] = curl_multi_init();
		if (multi == NULL)
		{
			fail_batch(result, nmsgs, "could not create a libcurl multi handle");
			return;
		}
		curl_multi_setopt(multi, CURLMOPT_MAX_HOST_CONNECTIONS, 64L);
	}

	snprintf(ts, sizeof(ts), "%ld", (long) time(NULL));
	reqs = palloc0(sizeof(WebhookRequest) * nreqs);
	for (i = 0; i < nreqs; i++)
	{
		if (!prepare_request(&reqs[i], sink, msgs, cfg->batch_mode ? 0 : i,
							 cfg->batch_mode ? nmsgs - 1 : i, ts))
		{
			fail_batch(result, nmsgs, "could not prepare a request");
			nreqs = i + 1;
			goto cleanup;
		}
	}

	INSTR_TIME_SET_CURRENT(start);
	for (;;)
	{
		instr_time	now;
		long		elapsed_ms;
		long		left_ms;
		CURLMsg    *m;
		int			queued;

		INSTR_TIME_SET_CURRENT(now);
		INSTR_TIME_SUBTRACT(now, start);
		elapsed_ms = (long) INSTR_TIME_GET_MILLISEC(now);
		left_ms = cfg->timeout_ms - elapsed_ms;

		/*
		 * Start what the in-flight limit allows, unless the batch stopped or
		 * is in the last tenth of its time: a request started then could
		 * hardly connect, and its timeout would pass for the destination's
		 * failure. It is not sent, and leased again.
		 */
		while (!stopped && next < nreqs && running < cfg->max_in_flight &&
			   left_ms > 0 && left_ms >= cfg->timeout_ms / 10)
		{
			WebhookRequest *r = &reqs[next++];

			curl_easy_setopt(r->easy, CURLOPT_TIMEOUT_MS, Max(left_ms, 1L));
			if (curl_multi_add_handle(multi, r->easy) != CURLM_OK)
			{
				/* not started: the batch is leased again */
				stopped = true;
				break;
			}
			r->started = true;
			running++;
		}
		if (running == 0 || left_ms <= 0)
			break;

		{
			int			still;

			curl_multi_perform(multi, &still);
		}
		while ((m = curl_multi_info_read(multi, &queued)) != NULL)
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
			running--;
			if (stops_the_batch(r, sink))
				stopped = true;
		}
		if (running == 0 && (stopped || next >= nreqs))
			break;
		/* Slots freed: fill them before waiting, so none sits idle. */
		if (!stopped && next < nreqs && running < cfg->max_in_flight)
			continue;
		if (running > 0)
			curl_multi_poll(multi, NULL, 0, (int) Min(left_ms, WEBHOOK_POLL_SLICE_MS), NULL);
		CHECK_FOR_INTERRUPTS();
		/* An orphan of a dead postmaster stops at once (as RelayExitIfPostmasterDied, relay.h). */
		if (!PostmasterIsAlive())
			proc_exit(1);
		/* The relay switched off, a pause: the batch is abandoned (sink.h). */
		if (RelayWorkerShouldStop())
		{
			result->abandoned = true;
			break;
		}
	}

	for (i = 0; i < nreqs; i++)
		classify_request(&reqs[i], result);

cleanup:
	for (i = 0; i < nreqs; i++)
	{
		release_request(&reqs[i]);
		if (reqs[i].body.data)
			pfree(reqs[i].body.data);
	}
	pfree(reqs);
}
