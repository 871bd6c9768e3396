/*
 * receiver.c: a webhook receiver for the relay's tests and benchmarks.
 *
 *     test/receiver PORT LOGFILE
 *
 * Listens on 127.0.0.1:PORT (libmicrohttpd, one thread per connection,
 * HTTP/1.1 keep-alive) and appends every request to LOGFILE as one JSON line
 * (LOGFILE "-" logs nothing; the counters of /__stats still run):
 *
 *     {"method", "path" (with the query string), "headers" (names lower-cased),
 *      "body" (the raw bytes as a string), "status" (the code answered),
 *      "t" (unix time of receipt, microseconds), "sig" (whether a Standard
 *      Webhooks signature verified; null when no secrets are set),
 *      "concurrent" (the requests to the same path, this one included, that
 *      were in flight at its receipt: received and not yet answered)}
 *
 * A request is recorded once its body has arrived, before any delay_ms.
 * (A body with NUL bytes is logged up to the first one; signatures are
 * checked over the whole body.)
 * Each line is written with one write(2) under a mutex, so readers of the
 * file see whole lines. It answers 200 "ok\n" unless told otherwise:
 *
 *     POST /__control {JSON object, any subset of:}
 *         "reset": true           everything back to defaults, counters to
 *                                 zero (applied before the other keys)
 *         "always": code | null   every request answers code until null
 *         "fail": [codes]         the next requests answer these in order
 *         "retry_after": n | "s" | null
 *                                 Retry-After on every non-2xx answer
 *         "fail_rate": 0..1, "fail_code": code (500), "seed": n
 *                                 a random (seeded) fraction answers fail_code
 *         "delay_ms": n           every request waits n ms before answering
 *         "delay_rate": 0..1      only a random (seeded) fraction of the
 *                                 requests waits delay_ms (default 1: all)
 *         "fail_body": "<base64>" | null
 *                                 the body of every non-2xx answer, as raw
 *                                 bytes (any encoding; no NUL bytes), instead
 *                                 of "no\n"
 *         "secrets": ["whsec_<base64>", ...] | [] | null
 *                                 verify webhook-signature ("v1,<base64>"
 *                                 entries, HMAC-SHA256 over
 *                                 "<webhook-id>.<webhook-timestamp>.<body>")
 *         Precedence: always, then fail, then fail_rate, else 200.
 *         Bad JSON or a bad value answers 400 and changes nothing.
 *     GET /__health   200
 *     GET /__stats    {"requests": n, "status": {"200": n, ...},
 *                      "sig_ok": n, "sig_bad": n,
 *                      "max_concurrent": the highest "concurrent" so far}
 *
 * /__control, /__health and /__stats are neither recorded nor counted.
 * SIGTERM or SIGINT stops it cleanly.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#define MIN_CODE 100
#define MAX_CODE 599
#define MAX_SECRETS 16

typedef struct Secret
{
	unsigned char *key;
	size_t		len;
} Secret;

/* What /__control sets; everything under state_lock. */
typedef struct State
{
	int		   *fail;			/* codes still to answer, in order */
	size_t		nfail;
	size_t		fail_pos;
	int			always;			/* 0: off */
	char	   *retry_after;	/* NULL: none */
	double		fail_rate;
	int			fail_code;
	uint64_t	rng;
	int			delay_ms;
	double		delay_rate;		/* the fraction of requests that wait delay_ms */
	char	   *fail_body;		/* NULL: "no\n" */
	Secret		secrets[MAX_SECRETS];
	int			nsecrets;
} State;

/* One request in flight: con_cls of the connection. */
typedef struct Request
{
	char	   *uri;
	double		t;
	char	   *body;
	size_t		len;
	size_t		cap;
	bool		headers_seen;	/* the handler's first call is over */
} Request;

static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static State state;
static uint64_t n_requests;
static uint64_t n_status[MAX_CODE + 1];
static uint64_t n_sig_ok;
static uint64_t n_sig_bad;
static int	log_fd = -1;

/*
 * The requests in flight per path (with the query string), under
 * state_lock: a path's sender that keeps one request at a time never sees
 * more than 1.
 */
#define MAX_PATHS 4096
typedef struct PathInFlight
{
	char	   *path;
	int			in_flight;
} PathInFlight;
static PathInFlight paths[MAX_PATHS];
static int	npaths;
static int	max_concurrent;
static struct MHD_Response *resp_ok;

static const char OK_BODY[] = "ok\n";
static const char NO_BODY[] = "no\n";
#define DEFAULT_SEED 1

static void
die(const char *msg)
{
	fprintf(stderr, "receiver: %s\n", msg);
	exit(1);
}

static void *
xmalloc(size_t n)
{
	void	   *p = malloc(n ? n : 1);

	if (!p)
		die("out of memory");
	return p;
}

static char *
xstrdup(const char *s)
{
	size_t		n = strlen(s) + 1;

	return memcpy(xmalloc(n), s, n);
}

/* splitmix64: deterministic given the seed */
static uint64_t
rng_next(uint64_t *s)
{
	uint64_t	z = (*s += 0x9E3779B97F4A7C15ULL);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

static void
state_free(State *s)
{
	free(s->fail);
	free(s->retry_after);
	free(s->fail_body);
	for (int i = 0; i < s->nsecrets; i++)
		free(s->secrets[i].key);
	memset(s, 0, sizeof(*s));
}

static void
state_defaults(State *s)
{
	memset(s, 0, sizeof(*s));
	s->fail_code = 500;
	s->delay_rate = 1;
	s->rng = DEFAULT_SEED;
}

/* Deep copy, so that a control request can be applied to a copy first. */
static void
state_copy(State *dst, const State *src)
{
	*dst = *src;
	dst->fail = NULL;
	if (src->nfail > src->fail_pos)
	{
		dst->nfail = src->nfail - src->fail_pos;
		dst->fail = xmalloc(dst->nfail * sizeof(int));
		memcpy(dst->fail, src->fail + src->fail_pos, dst->nfail * sizeof(int));
	}
	else
		dst->nfail = 0;
	dst->fail_pos = 0;
	dst->retry_after = src->retry_after ? xstrdup(src->retry_after) : NULL;
	dst->fail_body = src->fail_body ? xstrdup(src->fail_body) : NULL;
	for (int i = 0; i < src->nsecrets; i++)
	{
		dst->secrets[i].key = xmalloc(src->secrets[i].len);
		memcpy(dst->secrets[i].key, src->secrets[i].key, src->secrets[i].len);
	}
}

static void
counters_reset(void)
{
	n_requests = 0;
	memset(n_status, 0, sizeof(n_status));
	n_sig_ok = n_sig_bad = 0;
	max_concurrent = 0;
}

static double
now(void)
{
	struct timeval tv;

	gettimeofday(&tv, NULL);
	return tv.tv_sec + tv.tv_usec / 1e6;
}

/* Standard base64 (padding optional); a malloc'd buffer, or NULL if invalid. */
static unsigned char *
base64_decode(const char *in, size_t *outlen)
{
	size_t		n = strlen(in);
	size_t		padded = (n + 3) / 4 * 4;
	char	   *buf;
	unsigned char *out;
	int			len;
	int			pad = 0;

	if (n == 0 || n % 4 == 1)
		return NULL;
	buf = xmalloc(padded + 1);
	memcpy(buf, in, n);
	memset(buf + n, '=', padded - n);
	buf[padded] = '\0';
	out = xmalloc(padded / 4 * 3 + 1);
	len = EVP_DecodeBlock(out, (const unsigned char *) buf, (int) padded);
	if (len < 0)
	{
		free(buf);
		free(out);
		return NULL;
	}
	/* EVP_DecodeBlock counts the padding as zero bytes */
	if (buf[padded - 1] == '=')
		pad++;
	if (buf[padded - 2] == '=')
		pad++;
	free(buf);
	*outlen = (size_t) len - pad;
	return out;
}

static bool
valid_code(const cJSON *j)
{
	return cJSON_IsNumber(j) && j->valuedouble >= MIN_CODE &&
		j->valuedouble <= MAX_CODE && j->valuedouble == (int) j->valuedouble;
}

static bool
valid_int(const cJSON *j, double min)
{
	return cJSON_IsNumber(j) && j->valuedouble >= min && j->valuedouble <= 1e15 &&
		j->valuedouble == (double) (long long) j->valuedouble;
}

/*
 * Applies a control object to a copy of the state and installs it only when
 * every key is valid; returns NULL or what was wrong.
 */
static const char *
apply_control(const char *body, size_t len)
{
	cJSON	   *ctl = cJSON_ParseWithLength(body, len);
	cJSON	   *j;
	State		s;
	bool		reset = false;
	const char *err = NULL;

	if (!ctl)
		return "the body is not JSON";
	if (!cJSON_IsObject(ctl))
	{
		cJSON_Delete(ctl);
		return "the body is not a JSON object";
	}

	pthread_mutex_lock(&state_lock);
	j = cJSON_GetObjectItemCaseSensitive(ctl, "reset");
	if (j && !cJSON_IsBool(j) && !cJSON_IsNull(j))
	{
		err = "reset must be true or false";
		goto done;
	}
	reset = cJSON_IsTrue(j);
	if (reset)
		state_defaults(&s);
	else
		state_copy(&s, &state);

	if ((j = cJSON_GetObjectItemCaseSensitive(ctl, "always")))
	{
		if (cJSON_IsNull(j))
			s.always = 0;
		else if (valid_code(j))
			s.always = j->valueint;
		else
			err = "always must be an HTTP status code or null";
	}
	if ((j = cJSON_GetObjectItemCaseSensitive(ctl, "fail")))
	{
		cJSON	   *c;
		size_t		i = 0;

		free(s.fail);
		s.fail = NULL;
		s.nfail = s.fail_pos = 0;
		if (cJSON_IsArray(j))
		{
			s.nfail = cJSON_GetArraySize(j);
			s.fail = xmalloc(s.nfail * sizeof(int));
			cJSON_ArrayForEach(c, j)
			{
				if (!valid_code(c))
					err = "fail must be an array of HTTP status codes";
				else
					s.fail[i++] = c->valueint;
			}
		}
		else if (!cJSON_IsNull(j))
			err = "fail must be an array of HTTP status codes";
	}
	if ((j = cJSON_GetObjectItemCaseSensitive(ctl, "retry_after")))
	{
		free(s.retry_after);
		s.retry_after = NULL;
		if (valid_int(j, 0))
		{
			char		buf[32];

			snprintf(buf, sizeof(buf), "%lld", (long long) j->valuedouble);
			s.retry_after = xstrdup(buf);
		}
		else if (cJSON_IsString(j) && !strpbrk(j->valuestring, "\r\n"))
			s.retry_after = xstrdup(j->valuestring);
		else if (!cJSON_IsNull(j))
			err = "retry_after must be an integer, a string or null";
	}
	if ((j = cJSON_GetObjectItemCaseSensitive(ctl, "fail_rate")))
	{
		if (cJSON_IsNumber(j) && j->valuedouble >= 0 && j->valuedouble <= 1)
			s.fail_rate = j->valuedouble;
		else if (cJSON_IsNull(j))
			s.fail_rate = 0;
		else
			err = "fail_rate must be a number from 0 to 1";
	}
	if ((j = cJSON_GetObjectItemCaseSensitive(ctl, "fail_code")))
	{
		if (valid_code(j))
			s.fail_code = j->valueint;
		else if (cJSON_IsNull(j))
			s.fail_code = 500;
		else
			err = "fail_code must be an HTTP status code";
	}
	if ((j = cJSON_GetObjectItemCaseSensitive(ctl, "seed")))
	{
		if (valid_int(j, -1e15))
			s.rng = (uint64_t) (long long) j->valuedouble;
		else
			err = "seed must be an integer";
	}
	if ((j = cJSON_GetObjectItemCaseSensitive(ctl, "delay_ms")))
	{
		if (valid_int(j, 0) && j->valuedouble <= 3600000)
			s.delay_ms = (int) j->valuedouble;
		else if (cJSON_IsNull(j))
			s.delay_ms = 0;
		else
			err = "delay_ms must be an integer from 0 to 3600000";
	}
	if ((j = cJSON_GetObjectItemCaseSensitive(ctl, "delay_rate")))
	{
		if (cJSON_IsNumber(j) && j->valuedouble >= 0 && j->valuedouble <= 1)
			s.delay_rate = j->valuedouble;
		else if (cJSON_IsNull(j))
			s.delay_rate = 1;
		else
			err = "delay_rate must be a number from 0 to 1";
	}
	if ((j = cJSON_GetObjectItemCaseSensitive(ctl, "fail_body")))
	{
		unsigned char *body = NULL;
		size_t		blen = 0;

		free(s.fail_body);
		s.fail_body = NULL;
		if (cJSON_IsString(j) && (body = base64_decode(j->valuestring, &blen)) &&
			memchr(body, '\0', blen) == NULL)
		{
			body[blen] = '\0';
			s.fail_body = (char *) body;
		}
		else if (!cJSON_IsNull(j))
		{
			free(body);
			err = "fail_body must be base64 of a body without NUL bytes, or null";
		}
	}
	if ((j = cJSON_GetObjectItemCaseSensitive(ctl, "secrets")))
	{
		cJSON	   *c;

		for (int i = 0; i < s.nsecrets; i++)
			free(s.secrets[i].key);
		s.nsecrets = 0;
		if (cJSON_IsArray(j) && cJSON_GetArraySize(j) <= MAX_SECRETS)
		{
			cJSON_ArrayForEach(c, j)
			{
				const char *b64;
				unsigned char *key;
				size_t		klen;

				if (!cJSON_IsString(c))
				{
					err = "secrets must be strings";
					break;
				}
				b64 = c->valuestring;
				if (strncmp(b64, "whsec_", 6) == 0)
					b64 += 6;
				if (!(key = base64_decode(b64, &klen)))
				{
					err = "a secret is not whsec_<base64>";
					break;
				}
				s.secrets[s.nsecrets].key = key;
				s.secrets[s.nsecrets++].len = klen;
			}
		}
		else if (!cJSON_IsNull(j))
			err = "secrets must be an array of at most 16 strings, or null";
	}

	if (err)
		state_free(&s);
	else
	{
		state_free(&state);
		state = s;
		if (reset)
			counters_reset();
	}
done:
	pthread_mutex_unlock(&state_lock);
	cJSON_Delete(ctl);
	return err;
}

/*
 * Whether any v1 entry of webhook-signature is the HMAC of
 * "<webhook-id>.<webhook-timestamp>.<body>" under any secret.
 */
static bool
signature_ok(struct MHD_Connection *conn, const Request *req,
			 const Secret *secrets, int nsecrets)
{
	const char *id = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "webhook-id");
	const char *ts = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "webhook-timestamp");
	const char *sig = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "webhook-signature");
	size_t		idlen, tslen, mlen;
	char	   *msg;
	bool		ok = false;

	if (!id || !ts || !sig)
		return false;
	idlen = strlen(id);
	tslen = strlen(ts);
	mlen = idlen + 1 + tslen + 1 + req->len;
	msg = xmalloc(mlen);
	memcpy(msg, id, idlen);
	msg[idlen] = '.';
	memcpy(msg + idlen + 1, ts, tslen);
	msg[idlen + 1 + tslen] = '.';
	if (req->len)
		memcpy(msg + idlen + tslen + 2, req->body, req->len);

	for (int i = 0; i < nsecrets && !ok; i++)
	{
		unsigned char mac[EVP_MAX_MD_SIZE];
		unsigned int maclen = 0;
		char		b64[4 * ((EVP_MAX_MD_SIZE + 2) / 3) + 1];
		size_t		b64len;
		const char *p = sig;

		if (!HMAC(EVP_sha256(), secrets[i].key, (int) secrets[i].len,
				  (const unsigned char *) msg, mlen, mac, &maclen))
			continue;
		b64len = (size_t) EVP_EncodeBlock((unsigned char *) b64, mac, (int) maclen);
		/* space-separated "v1,<base64>" entries */
		while (*p && !ok)
		{
			const char *end;

			while (*p == ' ')
				p++;
			end = p;
			while (*end && *end != ' ')
				end++;
			if ((size_t) (end - p) == 3 + b64len && strncmp(p, "v1,", 3) == 0 &&
				memcmp(p + 3, b64, b64len) == 0)
				ok = true;
			p = end;
		}
	}
	free(msg);
	return ok;
}

static enum MHD_Result
add_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
	cJSON	   *headers = cls;
	char	   *name = xstrdup(key);
	cJSON	   *old;

	(void) kind;
	for (char *c = name; *c; c++)
		*c = (char) tolower((unsigned char) *c);
	value = value ? value : "";
	/* a repeated header: the values joined by ", " */
	if ((old = cJSON_GetObjectItemCaseSensitive(headers, name)) && cJSON_IsString(old))
	{
		size_t		n = strlen(old->valuestring) + 2 + strlen(value) + 1;
		char	   *joined = xmalloc(n);

		snprintf(joined, n, "%s, %s", old->valuestring, value);
		cJSON_ReplaceItemInObjectCaseSensitive(headers, name, cJSON_CreateString(joined));
		free(joined);
	}
	else
		cJSON_AddStringToObject(headers, name, value);
	free(name);
	return MHD_YES;
}

/* Counts a request to a path in flight; returns how many are now. Caller holds state_lock. */
static int
path_enter(const char *path)
{
	int			i;

	for (i = 0; i < npaths; i++)
		if (strcmp(paths[i].path, path) == 0)
			break;
	if (i == npaths)
	{
		if (npaths == MAX_PATHS)
			return 0;			/* not counted: more paths than tests use */
		paths[npaths].path = xstrdup(path);
		paths[npaths++].in_flight = 0;
	}
	if (++paths[i].in_flight > max_concurrent)
		max_concurrent = paths[i].in_flight;
	return paths[i].in_flight;
}

/* The request to a path has been answered. Caller holds state_lock. */
static void
path_leave(const char *path)
{
	for (int i = 0; i < npaths; i++)
		if (strcmp(paths[i].path, path) == 0)
		{
			paths[i].in_flight--;
			return;
		}
}

/* Appends one JSON line with one write(2). */
static void
log_request(struct MHD_Connection *conn, const char *method, const Request *req,
			int code, int sig, int concurrent)
{
	cJSON	   *rec = cJSON_CreateObject();
	cJSON	   *headers = cJSON_CreateObject();
	char	   *body = xmalloc(req->len + 1);
	char	   *line;
	char		t[32];
	size_t		n;

	cJSON_AddStringToObject(rec, "method", method);
	cJSON_AddStringToObject(rec, "path", req->uri);
	MHD_get_connection_values(conn, MHD_HEADER_KIND, add_header, headers);
	cJSON_AddItemToObject(rec, "headers", headers);
	if (req->len)
		memcpy(body, req->body, req->len);
	body[req->len] = '\0';
	cJSON_AddStringToObject(rec, "body", body);
	free(body);
	cJSON_AddNumberToObject(rec, "status", code);
	/* cJSON prints doubles with 15 significant digits; microseconds need 16 */
	snprintf(t, sizeof(t), "%.6f", req->t);
	cJSON_AddItemToObject(rec, "t", cJSON_CreateRaw(t));
	if (sig < 0)
		cJSON_AddNullToObject(rec, "sig");
	else
		cJSON_AddBoolToObject(rec, "sig", sig);
	cJSON_AddNumberToObject(rec, "concurrent", concurrent);

	line = cJSON_PrintUnformatted(rec);
	cJSON_Delete(rec);
	if (!line)
		die("out of memory");
	n = strlen(line);
	line = realloc(line, n + 2);
	if (!line)
		die("out of memory");
	line[n++] = '\n';
	line[n] = '\0';

	pthread_mutex_lock(&log_lock);
	{
		size_t		off = 0;

		while (off < n)
		{
			ssize_t		w = write(log_fd, line + off, n - off);

			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0)
			{
				perror("receiver: write");
				break;
			}
			off += (size_t) w;
		}
	}
	pthread_mutex_unlock(&log_lock);
	free(line);
}

static enum MHD_Result
reply(struct MHD_Connection *conn, int code, const char *body, const char *type,
	  const char *retry_after)
{
	struct MHD_Response *r;
	enum MHD_Result ret;

	if (code == 200 && body == OK_BODY && !retry_after)
		return MHD_queue_response(conn, 200, resp_ok);
	r = MHD_create_response_from_buffer(strlen(body), (void *) body, MHD_RESPMEM_MUST_COPY);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	if (retry_after)
		MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, retry_after);
	ret = MHD_queue_response(conn, (unsigned int) code, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result
handle_stats(struct MHD_Connection *conn)
{
	cJSON	   *o = cJSON_CreateObject();
	cJSON	   *st = cJSON_CreateObject();
	char	   *out;
	enum MHD_Result ret;

	pthread_mutex_lock(&state_lock);
	cJSON_AddNumberToObject(o, "requests", (double) n_requests);
	for (int c = MIN_CODE; c <= MAX_CODE; c++)
	{
		if (n_status[c])
		{
			char		k[8];

			snprintf(k, sizeof(k), "%d", c);
			cJSON_AddNumberToObject(st, k, (double) n_status[c]);
		}
	}
	cJSON_AddItemToObject(o, "status", st);
	cJSON_AddNumberToObject(o, "sig_ok", (double) n_sig_ok);
	cJSON_AddNumberToObject(o, "sig_bad", (double) n_sig_bad);
	cJSON_AddNumberToObject(o, "max_concurrent", max_concurrent);
	pthread_mutex_unlock(&state_lock);
	out = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	ret = reply(conn, 200, out, "application/json", NULL);
	free(out);
	return ret;
}

static enum MHD_Result
handle_request(struct MHD_Connection *conn, const char *method, Request *req)
{
	int			code;
	int			delay_ms;
	int			sig = -1;
	char	   *retry_after = NULL;
	char	   *fail_body = NULL;
	Secret		secrets[MAX_SECRETS];
	int			nsecrets;
	int			concurrent;
	enum MHD_Result ret;

	pthread_mutex_lock(&state_lock);
	concurrent = path_enter(req->uri);
	if (state.always)
		code = state.always;
	else if (state.fail_pos < state.nfail)
		code = state.fail[state.fail_pos++];
	else if (state.fail_rate > 0 &&
			 (rng_next(&state.rng) >> 11) * 0x1.0p-53 < state.fail_rate)
		code = state.fail_code;
	else
		code = 200;
	delay_ms = state.delay_ms;
	if (delay_ms > 0 && state.delay_rate < 1 &&
		(rng_next(&state.rng) >> 11) * 0x1.0p-53 >= state.delay_rate)
		delay_ms = 0;
	if ((code < 200 || code > 299) && state.retry_after)
		retry_after = xstrdup(state.retry_after);
	if ((code < 200 || code > 299) && state.fail_body)
		fail_body = xstrdup(state.fail_body);
	/* copies of the keys, so the HMACs run outside the lock */
	nsecrets = state.nsecrets;
	for (int i = 0; i < nsecrets; i++)
	{
		secrets[i].len = state.secrets[i].len;
		secrets[i].key = xmalloc(secrets[i].len);
		memcpy(secrets[i].key, state.secrets[i].key, secrets[i].len);
	}
	pthread_mutex_unlock(&state_lock);

	if (nsecrets > 0)
	{
		sig = signature_ok(conn, req, secrets, nsecrets) ? 1 : 0;
		for (int i = 0; i < nsecrets; i++)
			free(secrets[i].key);
	}

	pthread_mutex_lock(&state_lock);
	n_requests++;
	n_status[code]++;
	if (sig == 1)
		n_sig_ok++;
	else if (sig == 0)
		n_sig_bad++;
	pthread_mutex_unlock(&state_lock);

	if (log_fd >= 0)
		log_request(conn, method, req, code, sig, concurrent);

	if (delay_ms > 0)
	{
		struct timespec ts = {delay_ms / 1000, (long) (delay_ms % 1000) * 1000000L};

		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
	}
	ret = reply(conn, code, code >= 200 && code <= 299 ? OK_BODY : fail_body ? fail_body : NO_BODY,
				"text/plain", retry_after);
	pthread_mutex_lock(&state_lock);
	path_leave(req->uri);
	pthread_mutex_unlock(&state_lock);
	free(retry_after);
	free(fail_body);
	return ret;
}

static enum MHD_Result
access_handler(void *cls, struct MHD_Connection *conn, const char *url,
			   const char *method, const char *version, const char *upload_data,
			   size_t *upload_data_size, void **con_cls)
{
	Request    *req = *con_cls;

	(void) cls;
	(void) version;
	if (!req)					/* the URI log callback always sets it */
		return MHD_NO;
	if (!req->headers_seen)
	{
		/* the first call: only the headers are here */
		req->headers_seen = true;
		return MHD_YES;
	}
	if (*upload_data_size)
	{
		size_t		n = *upload_data_size;

		if (req->len + n + 1 > req->cap)
		{
			size_t		cap = req->cap ? req->cap : 1024;

			while (cap < req->len + n + 1)
				cap *= 2;
			req->body = realloc(req->body, cap);
			if (!req->body)
				die("out of memory");
			req->cap = cap;
		}
		memcpy(req->body + req->len, upload_data, n);
		req->len += n;
		*upload_data_size = 0;
		return MHD_YES;
	}

	/* the whole body has arrived */
	if (strncmp(url, "/__", 3) == 0)
	{
		if (strcmp(url, "/__health") == 0)
			return reply(conn, 200, OK_BODY, "text/plain", NULL);
		if (strcmp(url, "/__stats") == 0)
			return handle_stats(conn);
		if (strcmp(url, "/__control") == 0)
		{
			const char *err;
			char		msg[256];

			if (strcmp(method, "POST") != 0)
				return reply(conn, 405, "POST a JSON object\n", "text/plain", NULL);
			if ((err = apply_control(req->body ? req->body : "", req->len)))
			{
				snprintf(msg, sizeof(msg), "%s\n", err);
				return reply(conn, 400, msg, "text/plain", NULL);
			}
			return reply(conn, 200, OK_BODY, "text/plain", NULL);
		}
	}
	return handle_request(conn, method, req);
}

static void *
uri_logger(void *cls, const char *uri, struct MHD_Connection *conn)
{
	Request    *req = xmalloc(sizeof(Request));

	(void) cls;
	(void) conn;
	memset(req, 0, sizeof(*req));
	req->uri = xstrdup(uri);
	req->t = now();
	return req;
}

static void
request_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
				  enum MHD_RequestTerminationCode toe)
{
	Request    *req = *con_cls;

	(void) cls;
	(void) conn;
	(void) toe;
	if (req)
	{
		free(req->uri);
		free(req->body);
		free(req);
		*con_cls = NULL;
	}
}

int
main(int argc, char **argv)
{
	struct sockaddr_in addr;
	struct MHD_Daemon *d;
	sigset_t	sigs;
	char	   *end;
	long		port;
	int			sig;

	if (argc != 3)
	{
		fprintf(stderr, "usage: %s PORT LOGFILE   (LOGFILE - logs nothing)\n", argv[0]);
		return 2;
	}
	port = strtol(argv[1], &end, 10);
	if (*end || port < 1 || port > 65535)
		die("PORT must be 1 to 65535");
	if (strcmp(argv[2], "-") != 0)
	{
		log_fd = open(argv[2], O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
		if (log_fd < 0)
		{
			perror(argv[2]);
			return 1;
		}
	}
	state_defaults(&state);
	resp_ok = MHD_create_response_from_buffer(strlen(OK_BODY), (void *) OK_BODY,
											  MHD_RESPMEM_PERSISTENT);
	MHD_add_response_header(resp_ok, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain");

	/* the signals go to sigwait below, not to MHD's threads */
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);

	memset(&addr, 0, sizeof(addr));
	addr.sin_family = AF_INET;
	addr.sin_port = htons((uint16_t) port);
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);

	/*
	 * One thread per connection: a delay_ms sleep holds only its own
	 * connection, and keep-alive connections (wrk, the relay's) each get a
	 * thread that answers without any hand-off.
	 */
	d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD |
						 MHD_USE_ERROR_LOG,
						 (uint16_t) port, NULL, NULL, access_handler, NULL,
						 MHD_OPTION_SOCK_ADDR, (struct sockaddr *) &addr,
						 MHD_OPTION_URI_LOG_CALLBACK, uri_logger, NULL,
						 MHD_OPTION_NOTIFY_COMPLETED, request_completed, NULL,
						 MHD_OPTION_CONNECTION_LIMIT, (unsigned int) 4096,
						 MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned int) 1024,
						 MHD_OPTION_END);
	if (!d)
	{
		fprintf(stderr, "receiver: cannot listen on 127.0.0.1:%ld\n", port);
		return 1;
	}

	while (sigwait(&sigs, &sig) != 0)
		;
	MHD_stop_daemon(d);
	MHD_destroy_response(resp_ok);
	if (log_fd >= 0)
		close(log_fd);
	pthread_mutex_lock(&state_lock);
	state_free(&state);
	pthread_mutex_unlock(&state_lock);
	return 0;
}
