/*
 * jsonb_reader.c
 *		Reading a jsonb value in place (jsonb_reader.h), for the module's
 *		valijson adapter: a payload is checked where it lies, with no text
 *		printed and parsed again.
 *
 * jsonb's layout is utils/jsonb.h's: a container is a header (count and
 * kind) and one JEntry a child, then the children's data; an object's
 * keys come first, sorted by length then bytes, then its values in the
 * same order. A child's JEntry holds its length, or its end offset every
 * JB_OFFSET_STRIDE children; its start is found by adding the lengths
 * before it back to the last end offset (as jsonb_util.c's getJsonbOffset
 * does, in one pass here for the start and the length), and a walk over
 * all the children adds as it goes. A number is a numeric, whose layout
 * numeric.c keeps to itself: the few definitions below copy those of its
 * stored format, which PostgreSQL keeps stable across releases (pg_upgrade
 * relies on it).
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

/* Where a container's children's data begin. */
static inline const char *
children_data(const JsonbContainer *container)
{
	return (const char *) &container->children[JsonContainerSize(container) *
											   (JsonContainerIsObject(container) ? 2 : 1)];
}

/* The start of child i's data (from children_data()). */
static inline uint32
child_offset(const JsonbContainer *container, int i)
{
	uint32		offset = 0;

	for (int j = i - 1; j >= 0; j--)
	{
		offset += JBE_OFFLENFLD(container->children[j]);
		if (JBE_HAS_OFF(container->children[j]))
			break;
	}
	return offset;
}

/* Fills an item from a child: its JEntry, and its data's start and length. */
static void
entry_item(const JsonbContainer *container, JEntry entry, const char *base, uint32 offset,
		   uint32 length, TideJsonbItem *item)
{
	item->data = NULL;
	item->size = 0;
	if (JBE_ISSTRING(entry))
	{
		item->kind = TIDE_JSONB_STRING;
		item->data = base + offset;
		item->size = length;
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

/* Fills an item from child i of a container. */
static void
child_item(const JsonbContainer *container, int i, TideJsonbItem *item)
{
	JEntry		entry = container->children[i];
	uint32		offset = child_offset(container, i);
	uint32		length = JBE_HAS_OFF(entry) ? JBE_OFFLENFLD(entry) - offset : JBE_OFFLENFLD(entry);

	entry_item(container, entry, children_data(container), offset, length, item);
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
		JEntry		entry = container->children[middle];
		uint32		offset = 0;
		size_t		length;
		int			difference;

		/* the length alone, when the JEntry holds it, rules most keys out */
		if (JBE_HAS_OFF(entry))
		{
			offset = child_offset(container, (int) middle);
			length = JBE_OFFLENFLD(entry) - offset;
		}
		else
			length = JBE_OFFLENFLD(entry);
		if (length != key_length)
			difference = length < key_length ? -1 : 1;
		else
		{
			if (!JBE_HAS_OFF(entry))
				offset = child_offset(container, (int) middle);
			difference = memcmp(children_data(container) + offset, key, key_length);
		}
		if (difference == 0)
			return middle;
		if (difference < 0)
			low = middle + 1;
		else
			high = middle;
	}
	return -1;
}

/* Whether every string and key in item, at any depth, is at most max bytes. */
bool
TideJsonbStringsAtMost(const TideJsonbItem *item, size_t max)
{
	const JsonbContainer *container;
	const char *base;
	int			count;
	uint32		offset = 0;

	if (item->kind == TIDE_JSONB_STRING)
		return item->size <= max;
	if (item->kind != TIDE_JSONB_ARRAY && item->kind != TIDE_JSONB_OBJECT)
		return true;
	container = (const JsonbContainer *) item->data;
	base = children_data(container);
	count = (int) item->size * (item->kind == TIDE_JSONB_OBJECT ? 2 : 1);
	/* every child in order, each one's start the end of the one before */
	for (int i = 0; i < count; i++)
	{
		JEntry		entry = container->children[i];
		uint32		end = JBE_HAS_OFF(entry) ? JBE_OFFLENFLD(entry) : offset + JBE_OFFLENFLD(entry);
		TideJsonbItem child;

		if (JBE_ISSTRING(entry) || JBE_ISCONTAINER(entry))
		{
			entry_item(container, entry, base, offset, end - offset, &child);
			if (!TideJsonbStringsAtMost(&child, max))
				return false;
		}
		offset = end;
	}
	return true;
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
