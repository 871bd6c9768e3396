/*
 * signature.h
 *		What the webhook sink computes from strings alone: the signature
 *		header of a request (Standard Webhooks' webhook-signature or
 *		pg-tide's X-Pg-Tide-Signature) and the wait a Retry-After value asks
 *		for.
 *
 * This header and signature.c are plain C (OpenSSL for HMAC-SHA256, libcurl
 * for HTTP-dates): built with -DRELAY_SIGNATURE_STANDALONE they need no
 * PostgreSQL, so a fuzzer can drive them (test/fuzz/). Nothing here raises
 * an error. See docs/relay.md#webhook-sink.
 */
#ifndef TIDE_SIGNATURE_H
#define TIDE_SIGNATURE_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

/* Most secrets that sign one request. */
#define RELAY_SIGNATURE_MAX_SECRETS	16

/*
 * Room for the longest header line, its NUL included: "webhook-signature:"
 * and 16 times " v1," and 44 base64 characters (768 + 18 + 1 bytes), or
 * "X-Pg-Tide-Signature: sha256=" and 64 hex digits.
 */
#define RELAY_SIGNATURE_HEADER_SIZE 1024

/*
 * Writes the signature header line of a request into out (at least
 * RELAY_SIGNATURE_HEADER_SIZE bytes). secrets are the parts after "whsec_"
 * (base64), separated by spaces; a part that does not decode to at least
 * one byte is skipped.
 * - pg_tide false: "webhook-signature:" then " v1,<base64 HMAC-SHA256>" for
 *	 each secret, at most RELAY_SIGNATURE_MAX_SECRETS, over
 *	 "<id>.<ts>.<body>".
 * - pg_tide true: "X-Pg-Tide-Signature: sha256=<hex HMAC-SHA256>" with the
 *	 first secret over the body.
 * Returns 1 when the line was written, 0 when no secret could sign (no
 * header: out is ""), -1 when memory ran out. body may hold NUL bytes.
 * Allocates with palloc inside PostgreSQL (no ERROR: out of memory is -1),
 * malloc standalone; frees what it allocates.
 */
extern int	RelaySignatureHeader(char *out, const char *secrets, bool pg_tide,
								 const char *id, const char *ts,
								 const char *body, size_t body_len);

/*
 * Base64 as PostgreSQL's pg_b64_encode/pg_b64_decode (common/base64.c) do
 * it, byte for byte: no whitespace accepted, "=" padding required. Encode
 * needs dstlen >= RelayBase64EncLen(len); decode needs dstlen >=
 * RelayBase64DecLen(len). Both return the length written, or -1 (dst
 * zeroed).
 */
#define RelayBase64EncLen(n)	(((n) + 2) / 3 * 4)
#define RelayBase64DecLen(n)	(((n) * 3) >> 2)
extern int	RelayBase64Encode(const unsigned char *src, size_t len, char *dst, size_t dstlen);
extern int	RelayBase64Decode(const char *src, size_t len, unsigned char *dst, size_t dstlen);

/*
 * The wait, in milliseconds from now, that the value of a Retry-After
 * header asks for (RFC 9110): whole seconds from 0 to 86400, or an
 * HTTP-date (curl_getdate), capped at a day and 0 when it is past. value is
 * what follows "Retry-After:" (len bytes, not NUL-terminated; blanks around
 * and a trailing CR LF are ignored). Returns -1 when the value is neither
 * (or longer than 127 bytes): the caller keeps what it had.
 */
extern long RelayRetryAfterMs(const char *value, size_t len, time_t now);

#endif							/* TIDE_SIGNATURE_H */
