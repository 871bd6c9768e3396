/*
 * jsonb_reader.c
 *		Reading a jsonb value in place (jsonb_reader.h), for the module's
 *		valijson adapter: a payload is checked where it lies, with no text
 *		printed and parsed again.
 *
 * jsonb's layout is utils/jsonb.h's: a container is a header (count and
 * kind) and one JEntry a child, then the children's data; an object's
 * keys come first, sorted by length then bytes, then its values in the
 * same order. getJsonbOffset() and getJsonbLength() read a child's place
 * without allocating. A number is a numeric, whose layout numeric.c keeps
 * to itself: the few definitions below copy those of its stored format,
 * which PostgreSQL keeps stable across releases (pg_upgrade relies on it).
 */
#include "postgres.h"

#include "utils/jsonb.h"

#include "jsonb_reader.h"

/* numeric.c's stored format: a varlena header, then a short or a long header */
typedef int16 NumericDigit;

typedef struct StoredNumeric
{
	int32		vl_len_;
	uint16		header;
	/* the long format: header is the sign and dscale, then the weight */
	int16		weight;
} StoredNumeric;

#define NUMERIC_SIGN_MASK				0xC000
#define NUMERIC_NEG						0x4000
#define NUMERIC_SPECIAL					0xC000
#define NUMERIC_IS_SHORT_HEADER(header)	(((header) & 0x8000) != 0)
#define NUMERIC_SHORT_SIGN_MASK			0x2000
#define NUMERIC_SHORT_DSCALE_MASK		0x1F80
#define NUMERIC_SHORT_DSCALE_SHIFT		7
#define NUMERIC_SHORT_WEIGHT_SIGN_MASK	0x0040
#define NUMERIC_SHORT_WEIGHT_MASK		0x003F
#define NUMERIC_DSCALE_MASK				0x3FFF
#define NUMERIC_DEC_DIGITS				4

/* Fills an item from child i of a container. */
static void
child_item(const JsonbContainer *container, int i, TideJsonbItem *item)
{
	JEntry		entry = container->children[i];
	const char *base = (const char *) &container->children[JsonContainerSize(container) *
																(JsonContainerIsObject(container) ? 2 : 1)];
	uint32		offset = getJsonbOffset(container, i);

	item->data = NULL;
	item->size = 0;
	if (JBE_ISSTRING(entry))
	{
		item->kind = TIDE_JSONB_STRING;
		item->data = base + offset;
		item->size = getJsonbLength(container, i);
	}
	else if (JBE_ISNUMERIC(entry))
	{
		item->kind = TIDE_JSONB_NUMBER;
		item->data = base + INTALIGN(offset);
	}
	else if (JBE_ISBOOL_TRUE(entry))
		item->kind = TIDE_JSONB_TRUE;
	else if (JBE_ISBOOL_FALSE(entry))
		item->kind = TIDE_JSONB_FALSE;
	else if (JBE_ISNULL(entry))
		item->kind = TIDE_JSONB_NULL;
	else
	{
		const JsonbContainer *inner = (const JsonbContainer *) (base + INTALIGN(offset));

		item->kind = JsonContainerIsObject(inner) ? TIDE_JSONB_OBJECT : TIDE_JSONB_ARRAY;
		item->data = (const char *) inner;
		item->size = JsonContainerSize(inner);
	}
}

/* The root value of a jsonb: a scalar is stored as a one-element array. */
void
TideJsonbRoot(const void *jsonb, TideJsonbItem *item)
{
	const JsonbContainer *root = &((const Jsonb *) jsonb)->root;

	if (JsonContainerIsScalar(root))
	{
		child_item(root, 0, item);
		return;
	}
	item->kind = JsonContainerIsObject(root) ? TIDE_JSONB_OBJECT : TIDE_JSONB_ARRAY;
	item->data = (const char *) root;
	item->size = JsonContainerSize(root);
}

/* Element i of an array item. */
void
TideJsonbElement(const TideJsonbItem *array, size_t i, TideJsonbItem *element)
{
	child_item((const JsonbContainer *) array->data, (int) i, element);
}

/* Member i of an object item: its key and its value. */
void
TideJsonbMember(const TideJsonbItem *object, size_t i, TideJsonbItem *key, TideJsonbItem *value)
{
	const JsonbContainer *container = (const JsonbContainer *) object->data;

	child_item(container, (int) i, key);
	child_item(container, (int) (i + object->size), value);
}

/* The index of the member named key, by jsonb's order: length, then bytes. */
long
TideJsonbFind(const TideJsonbItem *object, const char *key, size_t key_length)
{
	const JsonbContainer *container = (const JsonbContainer *) object->data;
	long		low = 0;
	long		high = (long) object->size;

	while (low < high)
	{
		long		middle = low + (high - low) / 2;
		TideJsonbItem candidate;
		int			difference;

		child_item(container, (int) middle, &candidate);
		if (candidate.size != key_length)
			difference = candidate.size < key_length ? -1 : 1;
		else
			difference = memcmp(candidate.data, key, key_length);
		if (difference == 0)
			return middle;
		if (difference < 0)
			low = middle + 1;
		else
			high = middle;
	}
	return -1;
}

/* Appends c at *length when it fits (the text's length is counted anyway). */
static inline void
put_char(char *buf, size_t size, size_t *length, char c)
{
	if (*length + 1 < size)
		buf[*length] = c;
	(*length)++;
}

/*
 * A number as numeric_out prints it: the sign, the integral digits without
 * leading zeros (or "0"), and exactly dscale decimals.
 */
size_t
TideJsonbNumberText(const TideJsonbItem *number, char *buf, size_t size)
{
	const StoredNumeric *numeric = (const StoredNumeric *) number->data;
	uint16		header = numeric->header;
	bool		is_short = NUMERIC_IS_SHORT_HEADER(header);
	const NumericDigit *digits;
	int			ndigits;
	int			weight;
	int			dscale;
	bool		negative;
	size_t		length = 0;
	int			d;

	if ((header & NUMERIC_SIGN_MASK) == NUMERIC_SPECIAL)
	{
		/* NaN and the infinities: jsonb refuses them, so never stored */
		for (const char *s = "NaN"; *s; s++)
			put_char(buf, size, &length, *s);
	}
	else
	{
		if (is_short)
		{
			digits = (const NumericDigit *) ((const char *) numeric + VARHDRSZ + sizeof(uint16));
			weight = (header & NUMERIC_SHORT_WEIGHT_SIGN_MASK ? ~NUMERIC_SHORT_WEIGHT_MASK : 0) |
				(header & NUMERIC_SHORT_WEIGHT_MASK);
			dscale = (header & NUMERIC_SHORT_DSCALE_MASK) >> NUMERIC_SHORT_DSCALE_SHIFT;
			negative = (header & NUMERIC_SHORT_SIGN_MASK) != 0;
		}
		else
		{
			digits = (const NumericDigit *) ((const char *) numeric + VARHDRSZ + sizeof(uint16) +
											 sizeof(int16));
			weight = numeric->weight;
			dscale = header & NUMERIC_DSCALE_MASK;
			negative = (header & NUMERIC_SIGN_MASK) == NUMERIC_NEG;
		}
		ndigits = (int) ((VARSIZE(numeric) - ((const char *) digits - (const char *) numeric)) /
						 sizeof(NumericDigit));

		if (negative)
			put_char(buf, size, &length, '-');
		if (weight < 0)
		{
			d = weight + 1;
			put_char(buf, size, &length, '0');
		}
		else
		{
			for (d = 0; d <= weight; d++)
			{
				int			digit = d < ndigits ? digits[d] : 0;
				bool		leading = d == 0;

				for (int unit = 1000; unit >= 1; unit /= 10)
				{
					int			decimal = digit / unit;

					digit -= decimal * unit;
					if (decimal > 0 || !leading || unit == 1)
					{
						put_char(buf, size, &length, (char) ('0' + decimal));
						leading = false;
					}
				}
			}
		}
		if (dscale > 0)
		{
			int			written = 0;

			put_char(buf, size, &length, '.');
			for (; written < dscale; d++)
			{
				int			digit = d >= 0 && d < ndigits ? digits[d] : 0;

				for (int unit = 1000; unit >= 1 && written < dscale; unit /= 10, written++)
				{
					int			decimal = digit / unit;

					digit -= decimal * unit;
					put_char(buf, size, &length, (char) ('0' + decimal));
				}
			}
		}
	}
	if (size > 0)
		buf[length < size ? length : size - 1] = '\0';
	return length;
}
