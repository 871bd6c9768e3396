/*
 * capture_admin.c
 *		tide.outbox_capture() and tide.outbox_uncapture(): who may capture a
 *		table into an outbox, the checks of the options against the table,
 *		and the triggers that capture (src/capture.c) with their row in
 *		tide.outbox_captures.
 *
 * The caller must own the table, or have the privileges of tide_admin and
 * the TRIGGER privilege on it; both the caller and the table's owner must
 * be allowed to publish to the outbox, since the triggers publish as the
 * table's owner (docs/security.md#change-capture). The catalog row and the
 * triggers are then written as the catalog's owner, so that nobody needs
 * EXECUTE on the trigger functions and no trigger of them exists without
 * its catalog row. The WHEN condition is the one piece of SQL text a
 * caller gives: it must parse as exactly one expression before it goes
 * into CREATE TRIGGER.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "parser/parser.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/relcache.h"

#include "capture.h"
#include "compat.h"
#include "pg_tide.h"

PG_FUNCTION_INFO_V1(tide_outbox_capture);
PG_FUNCTION_INFO_V1(tide_outbox_uncapture);

/* The trigger kinds of a capture, as the last part of their names. */
static const char *const trigger_kinds[] = {"insert", "update", "delete", "truncate"};

#define TRIGGER_KINDS lengthof(trigger_kinds)

/* A capture trigger's name: one per outbox and kind on a table. */
static char *
trigger_name(const char *outbox, const char *kind)
{
	return psprintf("tide_capture_%08x_%s",
					(unsigned int) hash_bytes((const unsigned char *) outbox, strlen(outbox)), kind);
}

/*
 * Opens the table (for a capture's DDL: ShareRowExclusiveLock) and checks
 * that the caller may capture it: its owner, or tide_admin with the TRIGGER
 * privilege.
 */
Relation
CaptureOpenTable(Oid relid, LOCKMODE lockmode)
{
	Relation	rel = table_open(relid, lockmode);
	Oid			userid = GetUserId();
	Oid			admin = get_role_oid("tide_admin", true);

	if (rel->rd_rel->relkind != RELKIND_RELATION && rel->rd_rel->relkind != RELKIND_PARTITIONED_TABLE)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not a table", RelationGetRelationName(rel)),
				 errhint("Only the changes of a table or a partitioned table can be captured.")));
	if (strcmp(get_namespace_name(RelationGetNamespace(rel)), "tide") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("cannot capture table \"%s\" of pg_tide's catalog", RelationGetRelationName(rel)),
				 errhint("Capture the application's own tables.")));
	if (!TideClassOwnerCheck(relid, userid) &&
		!(OidIsValid(admin) && has_privs_of_role(userid, admin) &&
		  pg_class_aclcheck(relid, userid, ACL_TRIGGER) == ACLCHECK_OK))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to capture table \"%s\"", RelationGetRelationName(rel)),
				 errhint("The table's owner can capture it, or a member of tide_admin with the TRIGGER privilege on it.")));
	return rel;
}

/* The names of the primary key's columns; refuses a table without one. */
static List *
primary_key_columns(Relation rel)
{
	Oid			index_oid = TidePrimaryKeyIndex(rel);
	Relation	index;
	List	   *names = NIL;

	if (!OidIsValid(index_oid))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("table \"%s\" has no primary key", RelationGetRelationName(rel)),
				 errhint("Name the key columns with the capture option \"key\".")));
	index = index_open(index_oid, AccessShareLock);
	for (int i = 0; i < index->rd_index->indnkeyatts; i++)
		names = lappend(names, get_attname(RelationGetRelid(rel), index->rd_index->indkey.values[i], false));
	index_close(index, AccessShareLock);
	return names;
}

/* Refuses an option naming a column that the table does not have. */
static void
check_columns(Relation rel, const char *option, List *names)
{
	ListCell   *lc;

	foreach(lc, names)
		if (get_attnum(RelationGetRelid(rel), lfirst(lc)) == InvalidAttrNumber)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("capture option \"%s\" names column \"%s\", which table \"%s\" does not have",
							option, (char *) lfirst(lc), RelationGetRelationName(rel)),
					 errhint("Name columns of the table, as in its \\d.")));
}

/* Whether a parsed SELECT is nothing but one unnamed expression. */
static bool
one_expression(RawStmt *raw)
{
	SelectStmt *select = (SelectStmt *) raw->stmt;

	return IsA(select, SelectStmt) && select->op == SETOP_NONE &&
		list_length(select->targetList) == 1 &&
		((ResTarget *) linitial(select->targetList))->name == NULL &&
		select->distinctClause == NIL && select->intoClause == NULL &&
		select->fromClause == NIL && select->whereClause == NULL &&
		select->groupClause == NIL && select->havingClause == NULL &&
		select->windowClause == NIL && select->valuesLists == NIL &&
		select->sortClause == NIL && select->limitOffset == NULL &&
		select->limitCount == NULL && select->lockingClause == NIL &&
		select->withClause == NULL;
}

/* Refuses a "when" that is not exactly one SQL expression. */
static void
check_when(const char *when)
{
	List	   *parsed = NIL;
	MemoryContext context = CurrentMemoryContext;

	PG_TRY();
	{
		parsed = raw_parser(psprintf("SELECT (%s)", when), RAW_PARSE_DEFAULT);
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(context);
		FlushErrorState();
		parsed = NIL;
	}
	PG_END_TRY();
	if (list_length(parsed) != 1 || !one_expression(linitial(parsed)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("capture option \"when\" must be one SQL boolean expression"),
				 errdetail("It was: %s", when),
				 errhint("Write a condition over NEW and OLD, such as NEW.status <> 'draft'.")));
}

/* Runs one statement of a capture's DDL or catalog writes; refuses another result than `expected`. */
void
CaptureRun(const char *sql, int nargs, Oid *types, Datum *args, const char *nulls, int expected)
{
	int			rc = SPI_execute_with_args(sql, nargs, types, args, nulls, false, 0);

	if (rc != expected)
		elog(ERROR, "could not run \"%s\": %s", sql, SPI_result_code_string(rc));
}

/* The table argument (the first), which must not be null. */
Oid
CaptureTableArg(FunctionCallInfo fcinfo)
{
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("table must not be null"),
				 errhint("Name the table, as in 'public.orders'.")));
	return PG_GETARG_OID(0);
}

/*
 * Creates the trigger of one kind. A "when" that CREATE TRIGGER refuses
 * (OLD in an INSERT trigger, a column it does not know) is the caller's
 * option: 22023 with PostgreSQL's reason.
 */
static void
create_trigger(const char *table, const char *outbox, const char *options_text,
			   const char *kind, const char *when)
{
	char	   *sql;
	MemoryContext context = CurrentMemoryContext;

	if (strcmp(kind, "truncate") == 0)
		sql = psprintf("CREATE TRIGGER %s %s TRUNCATE ON %s FOR EACH STATEMENT"
					   " EXECUTE FUNCTION tide._capture_truncate(%s, %s)",
					   quote_identifier(trigger_name(outbox, kind)),
					   strstr(options_text, "\"truncate\": \"publish\"") ? "AFTER" : "BEFORE",
					   table, quote_literal_cstr(outbox), quote_literal_cstr(options_text));
	else
		sql = psprintf("CREATE TRIGGER %s AFTER %s ON %s FOR EACH ROW%s%s%s"
					   " EXECUTE FUNCTION tide._capture_row(%s, %s)",
					   quote_identifier(trigger_name(outbox, kind)), kind, table,
					   when ? " WHEN ((" : "", when ? when : "", when ? "))" : "",
					   quote_literal_cstr(outbox), quote_literal_cstr(options_text));
	PG_TRY();
	{
		CaptureRun(sql, 0, NULL, NULL, NULL, SPI_OK_UTILITY);
	}
	PG_CATCH();
	{
		ErrorData  *error;

		if (when == NULL)
			PG_RE_THROW();
		MemoryContextSwitchTo(context);
		error = CopyErrorData();
		FlushErrorState();
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("capture option \"when\" cannot be the condition of the %s trigger", kind),
				 errdetail("%s", error->message),
				 errhint("Write a condition over NEW (insert, update) and OLD (update, delete) for every operation captured.")));
	}
	PG_END_TRY();
}

/* SQL: tide.outbox_capture(p_table, p_outbox, p_options) */
Datum
tide_outbox_capture(PG_FUNCTION_ARGS)
{
	Oid			relid;
	char	   *outbox;
	CaptureOptions options;
	Relation	rel;
	char	   *options_text;
	char	   *table;
	Oid			owner;
	Oid			userid = GetUserId();
	Oid			save_userid;
	int			save_sec_context;
	Oid			types[4] = {REGCLASSOID, TEXTOID, JSONBOID, OIDOID};
	Datum		args[4];

	relid = CaptureTableArg(fcinfo);
	outbox = PG_ARGISNULL(1) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(1));
	TideValidateName("outbox", outbox);
	CaptureParseOptions(PG_ARGISNULL(2) ? NULL : PG_GETARG_JSONB_P(2), &options);

	rel = CaptureOpenTable(relid, ShareRowExclusiveLock);
	if (options.key == NIL)
		options.key = primary_key_columns(rel);
	check_columns(rel, "key", options.key);
	check_columns(rel, "ignore", options.ignore);
	check_columns(rel, "ignore_changes_of", options.ignore_changes_of);
	if (options.when)
		check_when(options.when);
	options_text = CaptureOptionsText(&options);
	table = quote_qualified_identifier(get_namespace_name(RelationGetNamespace(rel)),
									   RelationGetRelationName(rel));
	owner = rel->rd_rel->relowner;

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SPI_connect();
	SetUserIdAndSecContext(TideCatalogOwner(), save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
	args[0] = ObjectIdGetDatum(relid);
	args[1] = CStringGetTextDatum(outbox);
	CaptureRun("SELECT FROM tide.tide_outbox_config WHERE outbox_name OPERATOR(pg_catalog.=) $2", 2, types, args, NULL, SPI_OK_SELECT);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("outbox \"%s\" does not exist", outbox),
				 errhint("Create it with tide.outbox_create().")));
	TideCheckPublishRight(userid, outbox);
	TideCheckPublishRight(owner, outbox);

	args[2] = DirectFunctionCall1(jsonb_in, CStringGetDatum(options_text));
	args[3] = ObjectIdGetDatum(userid);
	CaptureRun("INSERT INTO tide.outbox_captures (table_name, outbox_name, options, owner)"
		" VALUES ($1, $2, $3, $4::pg_catalog.regrole) ON CONFLICT DO NOTHING",
		4, types, args, NULL, SPI_OK_INSERT);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("table \"%s\" is already captured into outbox \"%s\"",
						RelationGetRelationName(rel), outbox),
				 errhint("To change the options, end the capture with tide.outbox_uncapture() and capture again.")));
	for (int op = 0; op < CAPTURE_OPS; op++)
		if (options.ops[op])
			create_trigger(table, outbox, options_text, trigger_kinds[op], options.when);
	create_trigger(table, outbox, options_text, "truncate", NULL);
	SPI_finish();
	SetUserIdAndSecContext(save_userid, save_sec_context);
	table_close(rel, NoLock);
	PG_RETURN_VOID();
}

/* SQL: tide.outbox_uncapture(p_table, p_outbox) returns the number of captures ended */
Datum
tide_outbox_uncapture(PG_FUNCTION_ARGS)
{
	Oid			relid;
	char	   *outbox = NULL;
	Relation	rel;
	char	   *table;
	Oid			save_userid;
	int			save_sec_context;
	Oid			types[2] = {REGCLASSOID, TEXTOID};
	Datum		args[2];
	char		nulls[2] = {' ', ' '};
	uint64		ended;
	List	   *outboxes = NIL;
	ListCell   *lc;

	relid = CaptureTableArg(fcinfo);
	if (!PG_ARGISNULL(1))
	{
		outbox = text_to_cstring(PG_GETARG_TEXT_PP(1));
		TideValidateName("outbox", outbox);
	}
	rel = CaptureOpenTable(relid, ShareRowExclusiveLock);
	table = quote_qualified_identifier(get_namespace_name(RelationGetNamespace(rel)),
									   RelationGetRelationName(rel));

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SPI_connect();
	SetUserIdAndSecContext(TideCatalogOwner(), save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
	args[0] = ObjectIdGetDatum(relid);
	args[1] = outbox ? CStringGetTextDatum(outbox) : (Datum) 0;
	if (outbox == NULL)
		nulls[1] = 'n';
	if (SPI_execute_with_args("DELETE FROM tide.outbox_captures"
							  " WHERE table_name OPERATOR(pg_catalog.=) $1"
							  " AND ($2 IS NULL OR outbox_name OPERATOR(pg_catalog.=) $2)"
							  " RETURNING outbox_name",
							  2, types, args, nulls, false, 0) != SPI_OK_DELETE_RETURNING)
		elog(ERROR, "could not delete the captures of table \"%s\"", RelationGetRelationName(rel));
	ended = SPI_processed;
	if (ended == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 outbox ? errmsg("table \"%s\" is not captured into outbox \"%s\"",
								 RelationGetRelationName(rel), outbox) :
				 errmsg("table \"%s\" is not captured", RelationGetRelationName(rel)),
				 errhint("The captures are listed in tide.outbox_captures.")));
	for (uint64 i = 0; i < ended; i++)
		outboxes = lappend(outboxes, SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1));
	foreach(lc, outboxes)
		for (int k = 0; k < (int) TRIGGER_KINDS; k++)
		{
			char	   *name = trigger_name(lfirst(lc), trigger_kinds[k]);

			/* only the operations captured have a trigger */
			if (OidIsValid(get_trigger_oid(relid, name, true)))
				CaptureRun(psprintf("DROP TRIGGER %s ON %s", quote_identifier(name), table),
					0, NULL, NULL, NULL, SPI_OK_UTILITY);
		}
	SPI_finish();
	SetUserIdAndSecContext(save_userid, save_sec_context);
	table_close(rel, NoLock);
	PG_RETURN_INT64((int64) ended);
}
