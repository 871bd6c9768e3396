/*
 * signature.c
 *		The webhook sink's computations on strings: the signature header of a
 *		request and the wait a Retry-After value asks for (signature.h).
 *		Plain C on OpenSSL and libcurl; -DRELAY_SIGNATURE_STANDALONE builds
 *		it without PostgreSQL (test/fuzz/).
 */
#ifdef RELAY_SIGNATURE_STANDALONE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define SIG_MALLOC(n) malloc(n)
#define SIG_FREE(p) free(p)
#else
#include "postgres.h"
#define SIG_MALLOC(n) palloc_extended((n), MCXT_ALLOC_HUGE | MCXT_ALLOC_NO_OOM)
#define SIG_FREE(p) pfree(p)
#endif

#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "signature.h"

/* ---------------------------------------------------------------- base64 */

static const char b64chars[] =
"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The value of a base64 character, -1 for any other byte. */
static int
b64value(unsigned char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '+')
		return 62;
	if (c == '/')
		return 63;
	return -1;
}

int
RelayBase64Encode(const unsigned char *src, size_t len, char *dst, size_t dstlen)
{
	size_t		o = 0;
	size_t		i;

	for (i = 0; i < len; i += 3)
	{
		uint32_t	buf = (uint32_t) src[i] << 16;

		if (i + 1 < len)
			buf |= (uint32_t) src[i + 1] << 8;
		if (i + 2 < len)
			buf |= src[i + 2];
		if (o + 4 > dstlen)
		{
			memset(dst, 0, dstlen);
			return -1;
		}
		dst[o++] = b64chars[(buf >> 18) & 0x3f];
		dst[o++] = b64chars[(buf >> 12) & 0x3f];
		dst[o++] = i + 1 < len ? b64chars[(buf >> 6) & 0x3f] : '=';
		dst[o++] = i + 2 < len ? b64chars[buf & 0x3f] : '=';
	}
	return (int) o;
}

/*
 * Decodes as pg_b64_decode does: a "=" may stand only third or fourth in a
 * group of four and ends the data (a later group yields as many bytes as the
 * first padded one); whitespace, any other character, and a last group of
 * fewer than four characters are errors.
 */
int
RelayBase64Decode(const char *src, size_t len, unsigned char *dst, size_t dstlen)
{
	size_t		o = 0;
	size_t		i;
	uint32_t	buf = 0;
	int			pos = 0;
	int			end = 0;		/* 1: "xx==" seen, 2: "xxx=" seen */

	for (i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) src[i];
		int			b;

		if (c == '=')
		{
			if (!end)
			{
				if (pos == 2)
					end = 1;
				else if (pos == 3)
					end = 2;
				else
					goto error;
			}
			b = 0;
		}
		else if ((b = b64value(c)) < 0)
			goto error;
		buf = (buf << 6) + b;
		if (++pos == 4)
		{
			int			n = end == 0 ? 3 : end == 1 ? 1 : 2;

			if (o + n > dstlen)
				goto error;
			dst[o++] = (buf >> 16) & 255;
			if (n > 1)
				dst[o++] = (buf >> 8) & 255;
			if (n > 2)
				dst[o++] = buf & 255;
			buf = 0;
			pos = 0;
		}
	}
	if (pos != 0)
		goto error;
	return (int) o;

error:
	memset(dst, 0, dstlen);
	return -1;
}

/* ------------------------------------------------------------ signatures */

int
RelaySignatureHeader(char *out, const char *secrets, bool pg_tide,
					 const char *id, const char *ts,
					 const char *body, size_t body_len)
{
	size_t		id_len = pg_tide ? 0 : strlen(id);
	size_t		ts_len = pg_tide ? 0 : strlen(ts);
	const char *s = secrets;
	unsigned char *msg;
	size_t		msg_len;
	size_t		o;
	int			nsigned = 0;
	int			result = 0;

	out[0] = '\0';
	/* pg-tide signs the body; Standard Webhooks "<id>.<ts>.<body>" */
	if (pg_tide)
	{
		msg = (unsigned char *) body;
		msg_len = body_len;
	}
	else
	{
		if (body_len > SIZE_MAX - id_len - ts_len - 3)
			return -1;
		msg_len = id_len + 1 + ts_len + 1 + body_len;
		msg = SIG_MALLOC(msg_len + 1);
		if (msg == NULL)
			return -1;
		memcpy(msg, id, id_len);
		msg[id_len] = '.';
		memcpy(msg + id_len + 1, ts, ts_len);
		msg[id_len + 1 + ts_len] = '.';
		if (body_len > 0)
			memcpy(msg + id_len + ts_len + 2, body, body_len);
	}
	o = (size_t) snprintf(out, RELAY_SIGNATURE_HEADER_SIZE, "%s",
						  pg_tide ? "X-Pg-Tide-Signature: sha256=" : "webhook-signature:");

	while (nsigned < RELAY_SIGNATURE_MAX_SECRETS)
	{
		const char *tok;
		size_t		tok_len;
		size_t		key_size;
		unsigned char *key;
		int			klen;
		unsigned char mac[EVP_MAX_MD_SIZE];
		unsigned int maclen = 0;

		while (*s == ' ')
			s++;
		if (*s == '\0')
			break;
		tok = s;
		while (*s != '\0' && *s != ' ')
			s++;
		tok_len = s - tok;

		key_size = RelayBase64DecLen(tok_len);
		key = SIG_MALLOC(key_size + 1);
		if (key == NULL)
		{
			result = -1;
			break;
		}
		klen = RelayBase64Decode(tok, tok_len, key, key_size);
		if (klen <= 0 ||
			HMAC(EVP_sha256(), key, klen, msg, msg_len, mac, &maclen) == NULL)
		{
			SIG_FREE(key);
			continue;
		}
		SIG_FREE(key);
		if (pg_tide)
		{
			unsigned int i;

			for (i = 0; i < maclen; i++)
				o += snprintf(out + o, RELAY_SIGNATURE_HEADER_SIZE - o, "%02x", mac[i]);
			nsigned++;
			break;
		}
		else
		{
			char		b64[RelayBase64EncLen(EVP_MAX_MD_SIZE) + 1];
			int			blen = RelayBase64Encode(mac, maclen, b64, sizeof(b64) - 1);

			if (blen <= 0)
				continue;
			b64[blen] = '\0';
			o += snprintf(out + o, RELAY_SIGNATURE_HEADER_SIZE - o, " v1,%s", b64);
			nsigned++;
		}
	}
	if (!pg_tide)
		SIG_FREE(msg);
	if (result < 0 || nsigned == 0)
	{
		out[0] = '\0';
		return result;
	}
	return 1;
}

/* ----------------------------------------------------------- Retry-After */

long
RelayRetryAfterMs(const char *value, size_t len, time_t now)
{
	char		tmp[128];
	char	   *v = tmp;
	char	   *end;
	long		secs;
	time_t		when;

	if (len >= sizeof(tmp))
		return -1;
	memcpy(tmp, value, len);
	tmp[len] = '\0';
	while (*v == ' ' || *v == '\t')
		v++;
	for (end = v + strlen(v); end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' '); end--)
		end[-1] = '\0';
	secs = strtol(v, &end, 10);
	if (end != v && *end == '\0')
		return secs >= 0 && secs <= 86400 ? secs * 1000 : -1;
	if ((when = curl_getdate(v, NULL)) != -1)
		return when > now ? (long) (when - now < 86400 ? when - now : 86400) * 1000 : 0;
	return -1;
}
