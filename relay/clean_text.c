/*
 * clean_text.c
 *		Text that comes from outside the database (a receiver's answer, the
 *		error text a sink builds around it) made storable: valid in the
 *		database encoding and free of control characters.
 *
 * A receiver may answer in any encoding, and a sink cuts what it keeps at
 * a byte count (the first 120 bytes in an error, the first 2 KiB of a
 * body), which can fall inside a multi-byte character. Text stored as it
 * came would be invalid in the database: relay_dlq_list() fails for a
 * client that converts it, and a dump of the database does not restore.
 * The worker passes every outcome's texts through RelayCleanText right
 * after a sink's delivery (flow_forward.c), so every sink is covered.
 *
 * One pass, character by character:
 *
 * 1. A character valid in the database encoding is copied, if it fits
 *	  whole; text that does not fit is cut before it, at a character
 *	  boundary.
 * 2. Tabs and line breaks become one space between words (none at the
 *	  start or the end); other control characters are dropped.
 * 3. An incomplete multi-byte character at the very end is where a cut
 *	  fell: it is dropped. Any other byte that is not valid there (latin-1
 *	  text in a UTF-8 database, say) becomes '?'.
 *
 * No palloc and no ERROR: it may run anywhere, a curl callback included.
 */
#include "postgres.h"

#include "mb/pg_wchar.h"

#include "sink.h"

/*
 * Whether the len bytes at s are the start of one multi-byte character
 * whose end was cut off: fewer bytes than its lead byte announces, each of
 * them one that may follow a lead byte.
 */
static bool
cut_character(int encoding, const unsigned char *s, size_t len)
{
	size_t		i;

	if (len >= (size_t) pg_encoding_mblen(encoding, (const char *) s))
		return false;
	for (i = 1; i < len; i++)
		if (encoding == PG_UTF8 ? (s[i] & 0xC0) != 0x80 : !IS_HIGHBIT_SET(s[i]))
			return false;
	return true;
}

/*
 * Writes the cleaned text of the srclen bytes at src (or up to a NUL byte)
 * into dst, at most dstsize - 1 bytes and a NUL; returns its length. dst
 * and src must not overlap.
 */
size_t
RelayCleanText(char *dst, size_t dstsize, const char *src, size_t srclen)
{
	int			encoding = GetDatabaseEncoding();
	const unsigned char *s = (const unsigned char *) src;
	size_t		room;
	size_t		out = 0;
	size_t		i = 0;
	bool		space = false;

	if (dstsize == 0)
		return 0;
	room = dstsize - 1;
	while (i < srclen && s[i] != '\0')
	{
		size_t		left = srclen - i;
		int			len;

		if (s[i] == '\t' || s[i] == '\n' || s[i] == '\r')
		{
			space = out > 0;
			i++;
			continue;
		}
		if (s[i] < 0x20 || s[i] == 0x7F)
		{
			i++;
			continue;
		}
		len = IS_HIGHBIT_SET(s[i]) ?
			pg_encoding_verifymbchar(encoding, (const char *) s + i,
									 (int) Min(left, MAX_MULTIBYTE_CHAR_LEN)) : 1;
		if (len <= 0 && cut_character(encoding, s + i, left))
			break;
		if (out + (space ? 1 : 0) + (len > 0 ? len : 1) > room)
			break;
		if (space)
			dst[out++] = ' ';
		space = false;
		if (len > 0)
		{
			memcpy(dst + out, s + i, len);
			out += len;
			i += len;
		}
		else
		{
			dst[out++] = '?';
			i++;
		}
	}
	dst[out] = '\0';
	return out;
}
