/*
 * fuzz_retry_after.c
 *		libFuzzer target: the Retry-After value parser (relay/signature.c,
 *		RelayRetryAfterMs, which the webhook sink's header callback calls
 *		with what follows "Retry-After:"). Input: the value, any bytes.
 *
 * Invariants: no crash or sanitizer report; the answer is -1 or whole
 * seconds from 0 to a day; the same input gives the same answer; a value of
 * only digits (blanks around it) up to 86400 is that many seconds; a value
 * of 128 bytes or more is refused; an HTTP-date far in the past is 0.
 */
#include <limits.h>
#include <time.h>

#include "fuzz_common.h"
#include "signature.h"

/* A fixed "now": 2026-11-30 00:00:00 UTC. */
#define FUZZ_NOW	((time_t) 1796083200)

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *v = (const char *) data;
	long		ms;
	long		later;
	size_t		i;
	size_t		a;
	size_t		b;
	int			digits = 1;
	long		secs = 0;

	if (size > 1024)
		return 0;
	ms = RelayRetryAfterMs(v, size, FUZZ_NOW);
	FUZZ_CHECK(ms == -1 || (ms >= 0 && ms <= 86400L * 1000 && ms % 1000 == 0));
	FUZZ_CHECK(ms == RelayRetryAfterMs(v, size, FUZZ_NOW));
	if (size >= 128)
		FUZZ_CHECK(ms == -1);

	/* a date answer moves with now; a number of seconds does not */
	later = RelayRetryAfterMs(v, size, FUZZ_NOW + 10);
	FUZZ_CHECK(later == -1 ? ms == -1 : ms != -1);

	/* "  123\r\n": blanks, digits, then blanks and CR LF */
	for (a = 0; a < size && (v[a] == ' ' || v[a] == '\t'); a++)
		;
	for (b = size; b > a && (v[b - 1] == ' ' || v[b - 1] == '\r' || v[b - 1] == '\n'); b--)
		;
	if (b == a || b - a > 9)
		digits = 0;
	for (i = a; i < b && digits; i++)
	{
		if (v[i] < '0' || v[i] > '9')
			digits = 0;
		else
			secs = secs * 10 + (v[i] - '0');
	}
	if (digits && size < 128)
	{
		FUZZ_CHECK(ms == (secs <= 86400 ? secs * 1000 : -1));
		FUZZ_CHECK(later == ms);
	}
	return 0;
}
