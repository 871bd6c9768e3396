/*
 * fuzz_signature.c
 *		libFuzzer target: the webhook signature header (relay/signature.c).
 *		Input: one flags byte (bit 0: signature pg-tide), then the secrets
 *		(space-separated base64, as stored after "whsec_"), the
 *		webhook-id and the webhook-timestamp separated by newlines, and after
 *		a third newline the body (any bytes, NUL included). Secrets, id and
 *		timestamp are C strings, cut at a NUL.
 *
 * Invariants: no crash or sanitizer report; the header is written iff a
 * secret decodes to at least one byte; "webhook-signature:" is followed by
 * exactly one " v1,<44 base64 characters>" per such secret (at most 16),
 * each the HMAC-SHA256 of "<id>.<ts>.<body>" under that secret, in order;
 * "X-Pg-Tide-Signature: sha256=" by 64 lowercase hex digits, the HMAC of
 * the body under the first such secret; the same input gives the same
 * output. Built with -DFUZZ_PG_B64 (run.sh does when PostgreSQL's
 * libpgcommon.a is there), the base64 code is also compared with
 * PostgreSQL's pg_b64_encode/pg_b64_decode, which the sink used before.
 */
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "fuzz_common.h"
#include "signature.h"

#ifdef FUZZ_PG_B64
extern int	pg_b64_encode(const char *src, int len, char *dst, int dstlen);
extern int	pg_b64_decode(const char *src, int len, char *dst, int dstlen);

/* RelayBase64* agree with pg_b64_* on src, at the size the sink uses. */
static void
compare_with_pg(const char *src, size_t len)
{
	size_t		dlen = RelayBase64DecLen(len);
	unsigned char *a = malloc(dlen + 1);
	char	   *b = malloc(dlen + 1);
	size_t		elen = RelayBase64EncLen(len);
	char	   *ea = malloc(elen + 1);
	char	   *eb = malloc(elen + 1);
	int			ra = RelayBase64Decode(src, len, a, dlen);
	int			rb = pg_b64_decode(src, (int) len, b, (int) dlen);

	FUZZ_CHECK(ra == rb);
	FUZZ_CHECK(ra < 0 || memcmp(a, b, ra) == 0);
	ra = RelayBase64Encode((const unsigned char *) src, len, ea, elen);
	rb = pg_b64_encode(src, (int) len, eb, (int) elen);
	FUZZ_CHECK(ra == rb && ra == (int) elen);
	FUZZ_CHECK(memcmp(ea, eb, elen) == 0);
	/* and what was encoded decodes back */
	{
		unsigned char *back = malloc(RelayBase64DecLen(elen) + 1);

		FUZZ_CHECK(RelayBase64Decode(ea, elen, back, RelayBase64DecLen(elen)) == (int) len);
		FUZZ_CHECK(len == 0 || memcmp(back, src, len) == 0);
		free(back);
	}
	free(a);
	free(b);
	free(ea);
	free(eb);
}
#endif

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char	   *buf;
	char	   *parts[4];
	size_t		lens[4];
	bool		pg_tide;
	const char *secrets;
	const char *id;
	const char *ts;
	const char *body;
	size_t		body_len;
	char		out1[RELAY_SIGNATURE_HEADER_SIZE];
	char		out2[RELAY_SIGNATURE_HEADER_SIZE];
	int			rc1;
	int			rc2;
	unsigned char *msg;
	size_t		msg_len;
	const char *s;
	const char *o;
	int			nvalid = 0;

	if (size < 1 || size > FUZZ_MAX_INPUT)
		return 0;
	pg_tide = data[0] & 1;
	fuzz_split(data + 1, size - 1, '\n', 4, &buf, parts, lens);
	secrets = parts[0];
	id = parts[1];
	ts = parts[2];
	body = parts[3];
	body_len = lens[3];

	memset(out1, 0x7f, sizeof(out1));
	rc1 = RelaySignatureHeader(out1, secrets, pg_tide, id, ts, body, body_len);
	rc2 = RelaySignatureHeader(out2, secrets, pg_tide, id, ts, body, body_len);
	FUZZ_CHECK(rc1 == 0 || rc1 == 1);	/* -1 only when out of memory */
	FUZZ_CHECK(rc1 == rc2);
	FUZZ_CHECK(memchr(out1, '\0', sizeof(out1)) != NULL);
	FUZZ_CHECK(strcmp(out1, out2) == 0);

	/* what was signed, built independently */
	if (pg_tide)
	{
		msg_len = body_len;
		msg = malloc(msg_len + 1);
		memcpy(msg, body, body_len);
	}
	else
	{
		msg_len = strlen(id) + strlen(ts) + 2 + body_len;
		msg = malloc(msg_len + 1);
		sprintf((char *) msg, "%s.%s.", id, ts);
		memcpy(msg + strlen(id) + strlen(ts) + 2, body, body_len);
	}

	/* walk the secrets and the header together */
	o = out1;
	if (rc1 == 1)
	{
		const char *prefix = pg_tide ? "X-Pg-Tide-Signature: sha256=" : "webhook-signature:";

		FUZZ_CHECK(strncmp(o, prefix, strlen(prefix)) == 0);
		o += strlen(prefix);
	}
	else
		FUZZ_CHECK(out1[0] == '\0');
	for (s = secrets; *s;)
	{
		const char *tok;
		size_t		len;
		unsigned char *key;
		int			klen;
		unsigned char mac[EVP_MAX_MD_SIZE];
		unsigned int maclen = 0;

		while (*s == ' ')
			s++;
		if (!*s)
			break;
		tok = s;
		while (*s && *s != ' ')
			s++;
		len = s - tok;
#ifdef FUZZ_PG_B64
		compare_with_pg(tok, len);
#endif
		key = malloc(RelayBase64DecLen(len) + 1);
		klen = RelayBase64Decode(tok, len, key, RelayBase64DecLen(len));
		if (klen > 0 && (pg_tide ? nvalid < 1 : nvalid < RELAY_SIGNATURE_MAX_SECRETS))
		{
			FUZZ_CHECK(HMAC(EVP_sha256(), key, klen, msg, msg_len, mac, &maclen) != NULL);
			FUZZ_CHECK(maclen == 32);
			if (pg_tide)
			{
				char		hex[65];
				unsigned int i;

				for (i = 0; i < maclen; i++)
					sprintf(hex + 2 * i, "%02x", mac[i]);
				FUZZ_CHECK(strncmp(o, hex, 64) == 0);
				o += 64;
			}
			else
			{
				char		b64[45];

				FUZZ_CHECK(RelayBase64Encode(mac, maclen, b64, 44) == 44);
				b64[44] = '\0';
				FUZZ_CHECK(strncmp(o, " v1,", 4) == 0);
				FUZZ_CHECK(strncmp(o + 4, b64, 44) == 0);
				o += 48;
			}
			nvalid++;
		}
		free(key);
	}
	/* nothing after the last signature; a header iff a secret signed */
	FUZZ_CHECK(*o == '\0');
	FUZZ_CHECK((rc1 == 1) == (nvalid > 0));
#ifdef FUZZ_PG_B64
	compare_with_pg(body, body_len);
#endif
	free(msg);
	free(buf);
	return 0;
}
