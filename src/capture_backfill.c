/*
 * capture_backfill.c
 *		One chunk of tide.outbox_backfill (docs/capture.md#backfill): the
 *		rows of a captured table that exist, published as "read" messages in
 *		key order, with the progress in tide.outbox_backfills.
 *
 * The procedure tide.outbox_backfill calls this function and commits after
 * each chunk, so a chunk's messages and the progress that records them
 * commit together: after a crash the next call goes on after the last key
 * whose chunk committed, and no row is lost or published twice by the
 * backfill.
 *
 * A chunk reads the next rows after the last key done, in key order, FOR
 * SHARE: a transaction that is changing one of them is waited for, and
 * the row is read as it committed; a change after the read waits for the
 * chunk's commit. So for every key the "read" message comes, in id order,
 * after the capture's messages of the changes committed before it and
 * before those of the changes after it, and a consumer that applies
 * messages in id order ends with the table's rows. A row inserted behind
 * the backfill's position is published by the capture (which must exist
 * before the backfill starts).
 */
#include "postgres.h"

#include "access/table.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"

#include "capture.h"
#include "pg_tide.h"

PG_FUNCTION_INFO_V1(tide_capture_backfill_chunk);

#define BACKFILL_DEFAULT_CHUNK 1000
#define BACKFILL_MAX_CHUNK 100000

/* The options of a backfill. */
typedef struct BackfillOptions
{
	int			chunk_size;
	bool		restart;
} BackfillOptions;

/* Reads the backfill's options: "chunk_size" and "restart". */
static void
backfill_options(Jsonb *options, BackfillOptions *out)
{
	JsonbIterator *it;
	JsonbValue	value;
	JsonbIteratorToken token;
	char	   *name = NULL;

	out->chunk_size = BACKFILL_DEFAULT_CHUNK;
	out->restart = false;
	if (options == NULL)
		return;
	if (!JB_ROOT_IS_OBJECT(options))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("backfill options must be a JSON object"),
				 errhint("Pass an object such as {\"chunk_size\": 1000}, or {} for the defaults.")));
	it = JsonbIteratorInit(&options->root);
	while ((token = JsonbIteratorNext(&it, &value, true)) != WJB_DONE)
	{
		if (token == WJB_KEY)
			name = pnstrdup(value.val.string.val, value.val.string.len);
		else if (token != WJB_VALUE)
			continue;
		else if (strcmp(name, "chunk_size") == 0)
		{
			long		n = 0;
			char	   *end = NULL;

			if (value.type == jbvNumeric)
				n = strtol(DatumGetCString(DirectFunctionCall1(numeric_out,
															   NumericGetDatum(value.val.numeric))),
						   &end, 10);
			if (value.type != jbvNumeric || *end != '\0' || n < 1 || n > BACKFILL_MAX_CHUNK)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("backfill option \"chunk_size\" must be an integer from 1 to %d",
								BACKFILL_MAX_CHUNK),
						 errhint("Give the number of rows each transaction of the backfill publishes.")));
			out->chunk_size = (int) n;
		}
		else if (strcmp(name, "restart") == 0)
		{
			if (value.type != jbvBool)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("backfill option \"restart\" must be true or false"),
						 errhint("true starts the backfill again from the first key.")));
			out->restart = value.val.boolean;
		}
		else
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("unknown backfill option \"%s\"", name),
					 errhint("The options are \"chunk_size\" and \"restart\".")));
	}
}

/*
 * The capture's options, read as the catalog's owner; refuses a table that
 * is not captured into the outbox.
 */
static void
capture_options(Relation rel, const char *outbox, CaptureOptions *options)
{
	Oid			types[2] = {REGCLASSOID, TEXTOID};
	Datum		args[2] = {ObjectIdGetDatum(RelationGetRelid(rel)), CStringGetTextDatum(outbox)};

	CaptureRun("SELECT options FROM tide.outbox_captures WHERE table_name OPERATOR(pg_catalog.=) $1 AND outbox_name OPERATOR(pg_catalog.=) $2",
		2, types, args, NULL, SPI_OK_SELECT);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"%s\" is not captured into outbox \"%s\"",
						RelationGetRelationName(rel), outbox),
				 errhint("Capture it first with tide.outbox_capture(): the capture publishes the changes made during and after the backfill.")));
	CaptureParseOptions(DatumGetJsonbP(TideSpiDatum(1)), options);
}

/* Refuses a key column that may be null: its rows could not be found in key order. */
static void
require_not_null_key(Relation rel, List *key)
{
	ListCell   *lc;

	foreach(lc, key)
	{
		AttrNumber	attnum = get_attnum(RelationGetRelid(rel), lfirst(lc));

		if (attnum == InvalidAttrNumber)
			CaptureRefuseMissingKey(RelationGetRelationName(rel), lfirst(lc));
		if (!TupleDescAttr(RelationGetDescr(rel), attnum - 1)->attnotnull)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("cannot backfill table \"%s\": its key column \"%s\" may be null",
							RelationGetRelationName(rel), (char *) lfirst(lc)),
					 errhint("Capture with a key of NOT NULL columns (the primary key) to backfill.")));
	}
}

/*
 * The query of the next chunk: the rows after the last key ($1, an object
 * of the key's values, typed by the table's row type), in key order, at
 * most $2, locked FOR SHARE. Each value of the last key is a scalar
 * subquery, so that the row comparison compares with constants of the
 * statement and a btree index on the key finds the chunk's first row.
 */
static char *
chunk_sql(Relation rel, List *key, bool first)
{
	StringInfoData columns;
	StringInfoData after;
	char	   *table = quote_qualified_identifier(get_namespace_name(RelationGetNamespace(rel)),
												   RelationGetRelationName(rel));
	ListCell   *lc;

	initStringInfo(&columns);
	initStringInfo(&after);
	foreach(lc, key)
	{
		const char *column = quote_identifier(lfirst(lc));
		const char *comma = lc == list_head(key) ? "" : ", ";

		appendStringInfo(&columns, "%st.%s", comma, column);
		appendStringInfo(&after, "%s(SELECT k.%s FROM pg_catalog.jsonb_populate_record(NULL::%s, $1) k)",
						 comma, column, table);
	}
	return psprintf("SELECT pg_catalog.to_jsonb(t) FROM %s t WHERE %s ORDER BY %s LIMIT $2 FOR SHARE OF t",
					table,
					first ? "true" :
					psprintf("ROW(%s) OPERATOR(pg_catalog.>) ROW(%s)", columns.data, after.data),
					columns.data);
}

/*
 * SQL: tide._capture_backfill_chunk(p_table, p_outbox, p_options, p_first)
 * returns whether the backfill is done. Publishes the next chunk and
 * records it; p_first starts (or with "restart" restarts) the progress row.
 */
Datum
tide_capture_backfill_chunk(PG_FUNCTION_ARGS)
{
	Oid			relid;
	char	   *outbox;
	BackfillOptions backfill;
	CaptureOptions options;
	Relation	rel;
	Oid			userid = GetUserId();
	Oid			save_userid;
	int			save_sec_context;
	Oid			types[4] = {REGCLASSOID, TEXTOID, JSONBOID, INT4OID};
	Datum		args[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};
	bool		finished;
	bool		first;
	Jsonb	   *last = NULL;
	uint64		rows;
	Datum	   *found;

	relid = CaptureTableArg(fcinfo);
	outbox = PG_ARGISNULL(1) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(1));
	TideValidateName("outbox", outbox);
	backfill_options(PG_ARGISNULL(2) ? NULL : PG_GETARG_JSONB_P(2), &backfill);
	first = !PG_ARGISNULL(3) && PG_GETARG_BOOL(3);
	rel = CaptureOpenTable(relid, AccessShareLock);

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SPI_connect();
	SetUserIdAndSecContext(TideCatalogOwner(), save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
	capture_options(rel, outbox, &options);
	require_not_null_key(rel, options.key);
	TideCheckPublishRight(userid, outbox);
	args[0] = ObjectIdGetDatum(relid);
	args[1] = CStringGetTextDatum(outbox);
	if (first && backfill.restart)
		CaptureRun("DELETE FROM tide.outbox_backfills WHERE table_name OPERATOR(pg_catalog.=) $1 AND outbox_name OPERATOR(pg_catalog.=) $2",
			2, types, args, NULL, SPI_OK_DELETE);
	if (first)
		CaptureRun("INSERT INTO tide.outbox_backfills (table_name, outbox_name) VALUES ($1, $2)"
			" ON CONFLICT DO NOTHING", 2, types, args, NULL, SPI_OK_INSERT);
	CaptureRun("SELECT last_key, finished_at IS NOT NULL FROM tide.outbox_backfills"
		" WHERE table_name OPERATOR(pg_catalog.=) $1 AND outbox_name OPERATOR(pg_catalog.=) $2 FOR UPDATE", 2, types, args, NULL, SPI_OK_SELECT);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the backfill of table \"%s\" into outbox \"%s\" has no progress row",
						RelationGetRelationName(rel), outbox),
				 errhint("Start it with CALL tide.outbox_backfill().")));
	finished = TideSpiBool(2);
	if (!finished)
	{
		bool		isnull;

		SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		if (!isnull)
			last = DatumGetJsonbP(TideSpiDatum(1));

		/* the rows are read as the caller */
		SetUserIdAndSecContext(save_userid, save_sec_context);
		args[2] = last ? JsonbPGetDatum(last) : (Datum) 0;
		nulls[2] = last ? ' ' : 'n';
		args[3] = Int32GetDatum(backfill.chunk_size);
		CaptureRun(chunk_sql(rel, options.key, last == NULL), 2, types + 2, args + 2, nulls + 2,
			SPI_OK_SELECT);
		rows = SPI_processed;
		found = palloc(sizeof(Datum) * (rows + 1));
		for (uint64 i = 0; i < rows; i++)
		{
			bool		key_null;

			found[i] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &key_null);
		}
		for (uint64 i = 0; i < rows; i++)
			last = CapturePublish(RelationGetRelid(rel), outbox, &options, "read", DatumGetJsonbP(found[i]), NULL);

		SetUserIdAndSecContext(TideCatalogOwner(), save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
		finished = rows < (uint64) backfill.chunk_size;
		args[2] = last ? JsonbPGetDatum(last) : (Datum) 0;
		nulls[2] = last ? ' ' : 'n';
		args[3] = Int32GetDatum((int32) rows);
		CaptureRun(finished ?
			"UPDATE tide.outbox_backfills SET last_key = $3, rows_published = rows_published OPERATOR(pg_catalog.+) $4,"
			" updated_at = pg_catalog.now(), finished_at = pg_catalog.now() WHERE table_name OPERATOR(pg_catalog.=) $1 AND outbox_name OPERATOR(pg_catalog.=) $2" :
			"UPDATE tide.outbox_backfills SET last_key = $3, rows_published = rows_published OPERATOR(pg_catalog.+) $4,"
			" updated_at = pg_catalog.now() WHERE table_name OPERATOR(pg_catalog.=) $1 AND outbox_name OPERATOR(pg_catalog.=) $2",
			4, types, args, nulls, SPI_OK_UPDATE);
	}
	SPI_finish();
	SetUserIdAndSecContext(save_userid, save_sec_context);
	table_close(rel, NoLock);
	PG_RETURN_BOOL(finished);
}
