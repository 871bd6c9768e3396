/*
 * capture_row.c
 *		A captured row as jsonb, exactly as to_jsonb(row) makes it, for the
 *		capture trigger (src/capture.c), which converts one or two rows per
 *		change.
 *
 * to_jsonb(row) looks up every column's type category and output function
 * again for each row, writes integers out as text and reads them back as
 * numeric: about a fifth of what the trigger spent per row
 * (bench/RESULTS-history.md, "Change capture profiled"). Here:
 *
 * 1. Once per trigger and table shape (CaptureRowColumns, rebuilt after a
 *	  relcache invalidation of the table: src/capture.c), each column's
 *	  name and how its value is converted: the built-in types that
 *	  to_jsonb maps in a known way (bool; int2, int4, int8 as numbers;
 *	  text and varchar as strings; date, timestamp and timestamptz as
 *	  to_jsonb's ISO strings) directly, every other type (domains, arrays,
 *	  composites, json, numeric and floats, whose special values become
 *	  strings, and types with a cast to json) through to_jsonb of that one
 *	  value, with its FmgrInfo kept.
 * 2. Per row, the tuple is deformed once and the object built from the
 *	  values; jsonb sorts the keys at the end as to_jsonb does.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "nodes/makefuncs.h"
#include "utils/builtins.h"
#include "utils/date.h"
#include "utils/fmgroids.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/numeric.h"

#include "capture.h"

/* How a column's value becomes jsonb. */
typedef enum ColumnConversion
{
	CONVERT_BOOL,
	CONVERT_INTEGER,			/* int2, int4, int8: a number */
	CONVERT_TEXT,				/* text, varchar: a string */
	CONVERT_DATETIME,			/* date, timestamp, timestamptz: an ISO string */
	CONVERT_TO_JSONB			/* anything else: to_jsonb of the value */
} ColumnConversion;

/* One column of the row, as converted. */
typedef struct CaptureColumn
{
	AttrNumber	attnum;
	char	   *name;
	Oid			typid;
	ColumnConversion conversion;
	FmgrInfo	to_jsonb;		/* CONVERT_TO_JSONB: to_jsonb() of the type */
} CaptureColumn;

struct CaptureRowColumns
{
	int			ncolumns;
	CaptureColumn *columns;		/* the table's columns, dropped ones left out */
};

/* How to_jsonb converts a value of the type, when it is one of the direct ones. */
static ColumnConversion
conversion_of(Oid typid)
{
	switch (typid)
	{
		case BOOLOID:
			return CONVERT_BOOL;
		case INT2OID:
		case INT4OID:
		case INT8OID:
			return CONVERT_INTEGER;
		case TEXTOID:
		case VARCHAROID:
			return CONVERT_TEXT;
		case DATEOID:
		case TIMESTAMPOID:
		case TIMESTAMPTZOID:
			return CONVERT_DATETIME;
		default:
			return CONVERT_TO_JSONB;
	}
}

/* The columns of a table's tuple descriptor, with their conversions, in `context`. */
CaptureRowColumns *
CaptureRowColumnsFor(TupleDesc desc, MemoryContext context)
{
	MemoryContext old = MemoryContextSwitchTo(context);
	CaptureRowColumns *row = palloc(sizeof(CaptureRowColumns));

	row->ncolumns = 0;
	row->columns = palloc0(sizeof(CaptureColumn) * Max(desc->natts, 1));
	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		CaptureColumn *column;

		if (att->attisdropped)
			continue;
		column = &row->columns[row->ncolumns++];
		column->attnum = att->attnum;
		column->name = pstrdup(NameStr(att->attname));
		column->typid = att->atttypid;
		column->conversion = conversion_of(att->atttypid);
		if (column->conversion == CONVERT_TO_JSONB)
		{
			/* to_jsonb reads its argument's type from the call expression */
			fmgr_info_cxt(F_TO_JSONB, &column->to_jsonb, context);
			column->to_jsonb.fn_expr = (Node *)
				makeFuncExpr(F_TO_JSONB, JSONBOID,
							 list_make1(makeNullConst(att->atttypid, att->atttypmod, att->attcollation)),
							 InvalidOid, InvalidOid, COERCE_EXPLICIT_CALL);
		}
	}
	MemoryContextSwitchTo(old);
	return row;
}

/* The value of an int2, int4 or int8 column. */
static int64
integer_value(Oid typid, Datum value)
{
	if (typid == INT2OID)
		return DatumGetInt16(value);
	if (typid == INT4OID)
		return DatumGetInt32(value);
	return DatumGetInt64(value);
}

/* Pushes to_jsonb of one value: a scalar as itself, a container whole. */
static void
push_to_jsonb(JsonbParseState **state, CaptureColumn *column, Datum value)
{
	Jsonb	   *jsonb = DatumGetJsonbP(FunctionCall1(&column->to_jsonb, value));
	JsonbValue	converted;

	if (!JsonbExtractScalar(&jsonb->root, &converted))
	{
		converted.type = jbvBinary;
		converted.val.binary.data = &jsonb->root;
		converted.val.binary.len = VARSIZE(jsonb) - VARHDRSZ;
	}
	pushJsonbValue(state, WJB_VALUE, &converted);
}

/* Pushes one column's value as to_jsonb(row) would have it. */
static void
push_column(JsonbParseState **state, CaptureColumn *column, Datum value, bool isnull)
{
	JsonbValue	converted;

	if (isnull)
	{
		converted.type = jbvNull;
		pushJsonbValue(state, WJB_VALUE, &converted);
		return;
	}
	switch (column->conversion)
	{
		case CONVERT_BOOL:
			converted.type = jbvBool;
			converted.val.boolean = DatumGetBool(value);
			break;
		case CONVERT_INTEGER:
			converted.type = jbvNumeric;
			converted.val.numeric = int64_to_numeric(integer_value(column->typid, value));
			break;
		case CONVERT_TEXT:
			/* a string beyond jsonb's limit: to_jsonb raises its error */
			if (VARSIZE_ANY_EXHDR(DatumGetPointer(value)) > JENTRY_OFFLENMASK)
			{
				push_to_jsonb(state, column, value);
				return;
			}
			converted.type = jbvString;
			converted.val.string.val = TextDatumGetCString(value);
			converted.val.string.len = strlen(converted.val.string.val);
			break;
		case CONVERT_DATETIME:
			converted.type = jbvString;
			converted.val.string.val = JsonEncodeDateTime(NULL, value, column->typid, NULL);
			converted.val.string.len = strlen(converted.val.string.val);
			break;
		case CONVERT_TO_JSONB:
			push_to_jsonb(state, column, value);
			return;
	}
	pushJsonbValue(state, WJB_VALUE, &converted);
}

/* The row as to_jsonb(row) makes it; `desc` is the one the columns were made from. */
Jsonb *
CaptureRowJsonb(CaptureRowColumns *row, TupleDesc desc, HeapTuple tuple)
{
	Datum	   *values = palloc(sizeof(Datum) * desc->natts);
	bool	   *nulls = palloc(sizeof(bool) * desc->natts);
	JsonbParseState *state = NULL;

	heap_deform_tuple(tuple, desc, values, nulls);
	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	for (int i = 0; i < row->ncolumns; i++)
	{
		CaptureColumn *column = &row->columns[i];
		JsonbValue	key;

		/* the relcache callback makes the columns again before the table's shape changes */
		if (column->attnum > desc->natts ||
			TupleDescAttr(desc, column->attnum - 1)->atttypid != column->typid)
			elog(ERROR, "the capture trigger's columns are out of date");
		key.type = jbvString;
		key.val.string.val = column->name;
		key.val.string.len = strlen(column->name);
		pushJsonbValue(&state, WJB_KEY, &key);
		push_column(&state, column, values[column->attnum - 1], nulls[column->attnum - 1]);
	}
	return JsonbValueToJsonb(pushJsonbValue(&state, WJB_END_OBJECT, NULL));
}
