/*
 * jsonb_reader.h
 *		Reading a jsonb value in place, from C++: the module's C functions
 *		over PostgreSQL's jsonb format (jsonb_reader.c), for the valijson
 *		adapter of jsonb_adapter.hpp.
 *
 * A value is an item: its kind and where its bytes are, inside the jsonb
 * the caller holds for as long as the items are used. None of these
 * functions allocates memory or raises a PostgreSQL error, so that C++
 * frames may call them.
 */
#ifndef TIDE_JSONB_READER_H
#define TIDE_JSONB_READER_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C"
{
#endif

typedef enum TideJsonbKind
{
	TIDE_JSONB_NULL,
	TIDE_JSONB_FALSE,
	TIDE_JSONB_TRUE,
	TIDE_JSONB_STRING,
	TIDE_JSONB_NUMBER,
	TIDE_JSONB_ARRAY,
	TIDE_JSONB_OBJECT
} TideJsonbKind;

/* One value of a jsonb. */
typedef struct TideJsonbItem
{
	TideJsonbKind kind;
	const char *data;			/* string: its bytes; number: its numeric;
								 * array, object: its container */
	size_t		size;			/* string: its length in bytes; array: its
								 * elements; object: its members */
} TideJsonbItem;

/* The root value of a jsonb (a detoasted Jsonb *). */
extern void TideJsonbRoot(const void *jsonb, TideJsonbItem *item);

/* Element i of an array item. */
extern void TideJsonbElement(const TideJsonbItem *array, size_t i, TideJsonbItem *element);

/* Member i of an object item, in jsonb's order of keys: its key and value. */
extern void TideJsonbMember(const TideJsonbItem *object, size_t i, TideJsonbItem *key,
							TideJsonbItem *value);

/* The index of the member named key in an object item, or -1. */
extern long TideJsonbFind(const TideJsonbItem *object, const char *key, size_t key_length);

/* Whether every string and key in an item, at any depth, is at most max bytes. */
extern bool TideJsonbStringsAtMost(const TideJsonbItem *item, size_t max);

/*
 * A number item as the text jsonb prints for it (numeric_out's), into buf
 * when it fits in size bytes with its terminating zero; returns its length
 * without the zero either way.
 */
extern size_t TideJsonbNumberText(const TideJsonbItem *number, char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif							/* TIDE_JSONB_READER_H */
