/*
 * fuzz_common.h
 *		Helpers shared by the libFuzzer targets of test/fuzz/ (see run.sh and
 *		docs/fuzzing.md): splitting an input into NUL-terminated parts.
 */
#ifndef TIDE_FUZZ_COMMON_H
#define TIDE_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Inputs longer than this are ignored (run.sh also passes -max_len). */
#define FUZZ_MAX_INPUT	65536

/* Stops the run: libFuzzer reports the crash and keeps the input. */
#define FUZZ_CHECK(cond) \
	do { \
		if (!(cond)) \
		{ \
			fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
			abort(); \
		} \
	} while (0)

/*
 * Copies data into *buf (one allocation, freed by the caller) and cuts it at
 * the first nparts - 1 separator bytes: parts[i] is NUL-terminated, and the
 * last part runs to the end of the input (lens[i] its length, NUL bytes
 * included). A missing part is "" (length 0).
 */
static inline void
fuzz_split(const uint8_t *data, size_t size, char sep, int nparts,
		   char **buf, char **parts, size_t *lens)
{
	char	   *p = malloc(size + 1);
	size_t		start = 0;
	int			k = 0;
	size_t		i;

	memcpy(p, data, size);
	p[size] = '\0';
	*buf = p;
	for (i = 0; i < size && k < nparts - 1; i++)
		if (p[i] == sep)
		{
			p[i] = '\0';
			parts[k] = p + start;
			lens[k++] = i - start;
			start = i + 1;
		}
	parts[k] = p + start;
	lens[k++] = size - start;
	for (; k < nparts; k++)
	{
		parts[k] = p + size;
		lens[k] = 0;
	}
}

#endif
