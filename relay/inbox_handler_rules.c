/*
 * inbox_handler_rules.c
 *		Whether an inbox's handler may run, and as whom: the one check of
 *		the rules, made by the row's trigger when a handler is set (as the
 *		role that sets it) and by the relay before every batch (as the row's
 *		owner, relay/inbox_handler.c), so that a right taken away later holds
 *		the handler instead of failing its events.
 *
 * The relay's worker is a superuser, so the rules are about delegation:
 * the owner (the role that set the handler) may make it run as run_as
 * only if it is a member of run_as, or run_as owns the function and the
 * owner may execute it; a superuser run_as only if the owner is a
 * superuser who set "allow_superuser". Then run_as must be able to do the
 * work: USAGE on the function's schema, EXECUTE on it, SELECT and UPDATE
 * on the inbox's table. Every check reads the system caches: the relay
 * makes it before every batch.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_proc.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

#include "compat.h"
#include "inbox_handler.h"
#include "pg_tide.h"

PG_FUNCTION_INFO_V1(tide_inbox_handler_problem);

/* Fills a problem and returns its message. */
static char *
problem(InboxHandlerProblem *p, const char *sqlstate, char *message, char *hint)
{
	p->sqlstate = sqlstate;
	p->message = message;
	p->hint = hint;
	return message;
}

/*
 * Why the handler of inbox `inbox` (its table `relid`, InvalidOid when it
 * is missing) cannot run as `run_as` when `owner` set it, with a SQLSTATE
 * and a hint in *p; NULL when it can.
 */
char *
InboxHandlerCheck(const char *inbox, Oid relid, Oid handler, const char *run_as,
				  bool allow_superuser, const char *owner, InboxHandlerProblem *p)
{
	HeapTuple	proc;
	Form_pg_proc form;
	Oid			rowtype;
	Oid			owner_id;
	Oid			run_as_id;
	char	   *table;
	char	   *function;
	Oid			nsp;
	Oid			proowner;

	memset(p, 0, sizeof(*p));
	if (!OidIsValid(relid) || !OidIsValid(get_rel_type_id(relid)))
		return problem(p, "42P01", psprintf("the table of inbox \"%s\" does not exist", inbox),
					   pstrdup("Drop the inbox with tide.inbox_drop() and create it again."));
	rowtype = get_rel_type_id(relid);
	table = quote_qualified_identifier(get_namespace_name(get_rel_namespace(relid)), get_rel_name(relid));
	proc = SearchSysCache1(PROCOID, ObjectIdGetDatum(handler));
	if (!HeapTupleIsValid(proc))
		return problem(p, "42883", psprintf("the handler function of inbox \"%s\" does not exist", inbox),
					   pstrdup("Create the function again, or set another handler with tide.inbox_set_handler()."));
	form = (Form_pg_proc) GETSTRUCT(proc);
	nsp = form->pronamespace;
	proowner = form->proowner;
	function = format_procedure(handler);
	if (form->prokind != PROKIND_FUNCTION || form->pronargs != 1 || form->proargtypes.values[0] != rowtype)
	{
		ReleaseSysCache(proc);
		return problem(p, "22023",
					   psprintf("handler %s must be a function of one argument of type %s",
								function, format_type_be(rowtype)),
					   psprintf("Declare it as CREATE FUNCTION ...(m %s) RETURNS void ...",
								format_type_be(rowtype)));
	}
	ReleaseSysCache(proc);

	owner_id = owner != NULL ? get_role_oid(owner, true) : InvalidOid;
	if (!OidIsValid(owner_id))
		return problem(p, "42501",
					   psprintf("the role that set the handler of inbox \"%s\" does not exist", inbox),
					   pstrdup("Set the handler again with tide.inbox_set_handler()."));
	run_as_id = get_role_oid(run_as, true);
	if (!OidIsValid(run_as_id))
		return problem(p, "42704", psprintf("role \"%s\" does not exist", run_as),
					   pstrdup("Name an existing role in \"run_as\", or leave it out to run the handler as its owner."));
	if (superuser_arg(run_as_id) && !(superuser_arg(owner_id) && allow_superuser))
		return problem(p, "42501",
					   psprintf("handler of inbox \"%s\" cannot run as superuser \"%s\"", inbox, run_as),
					   pstrdup(superuser_arg(owner_id) ?
							   "Name a role without superuser in \"run_as\", or pass \"allow_superuser\": true." :
							   "Name a role without superuser in \"run_as\"; only a superuser may let a handler run as one."));
	if (!is_member_of_role(owner_id, run_as_id) &&
		!(proowner == run_as_id && TideProcAclCheck(handler, owner_id, ACL_EXECUTE) == ACLCHECK_OK))
		return problem(p, "42501",
					   psprintf("role \"%s\" cannot make the handler of inbox \"%s\" run as role \"%s\"",
								owner, inbox, run_as),
					   pstrdup("Name in \"run_as\" a role you are a member of, or the owner of a handler you may execute."));
	if (TideNamespaceAclCheck(nsp, run_as_id, ACL_USAGE) != ACLCHECK_OK)
		return problem(p, "42501",
					   psprintf("role \"%s\" has no USAGE on schema %s of handler %s",
								run_as, quote_identifier(get_namespace_name(nsp)), function),
					   psprintf("Grant USAGE on schema %s to role %s.",
								quote_identifier(get_namespace_name(nsp)), quote_identifier(run_as)));
	if (TideProcAclCheck(handler, run_as_id, ACL_EXECUTE) != ACLCHECK_OK)
		return problem(p, "42501", psprintf("role \"%s\" cannot execute handler %s", run_as, function),
					   psprintf("Grant EXECUTE on function %s to role %s.", function, quote_identifier(run_as)));
	if (pg_class_aclcheck(relid, run_as_id, ACL_SELECT) != ACLCHECK_OK ||
		pg_class_aclcheck(relid, run_as_id, ACL_UPDATE) != ACLCHECK_OK)
		return problem(p, "42501", psprintf("role \"%s\" cannot process inbox \"%s\"", run_as, inbox),
					   psprintf("Grant SELECT and UPDATE on table %s to role %s, for example through tide_consumer.",
								table, quote_identifier(run_as)));
	return NULL;
}

/*
 * tide._inbox_handler_problem(inbox, handler, run_as, config, owner): why
 * the handler cannot run, as {sqlstate, message, hint}, or NULL (see
 * InboxHandlerCheck); for the row's trigger.
 */
Datum
tide_inbox_handler_problem(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan = NULL;
	char	   *inbox;
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1];
	Oid			relid = InvalidOid;
	bool		found;
	bool		allow_superuser = false;
	InboxHandlerProblem p;
	Datum		out[3];

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		PG_RETURN_NULL();
	inbox = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (!PG_ARGISNULL(3))
	{
		JsonbValue *v = getKeyJsonValueFromContainer(&PG_GETARG_JSONB_P(3)->root, "allow_superuser",
													 strlen("allow_superuser"), NULL);

		allow_superuser = v != NULL && v->type == jbvBool && v->val.boolean;
	}
	args[0] = PG_GETARG_DATUM(0);
	SPI_connect();
	if (SPI_execute_plan(TidePlan(&plan,
								  "SELECT coalesce(pg_catalog.to_regclass(tide._inbox_table(c))::oid, 0)"
								  "  FROM tide.tide_inbox_config c WHERE c.inbox_name OPERATOR(pg_catalog.=) $1",
								  1, argtypes),
						 args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read tide.tide_inbox_config");
	found = SPI_processed > 0;
	if (found)
	{
		bool		isnull;

		relid = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	}
	SPI_finish();
	if (!found)
	{
		p.sqlstate = "42704";
		p.message = psprintf("inbox \"%s\" does not exist", inbox);
		p.hint = "Create it with tide.inbox_create().";
	}
	else if (InboxHandlerCheck(inbox, relid, PG_GETARG_OID(1), text_to_cstring(PG_GETARG_TEXT_PP(2)),
							   allow_superuser,
							   PG_ARGISNULL(4) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(4)), &p) == NULL)
		PG_RETURN_NULL();
	out[0] = CStringGetTextDatum(p.sqlstate);
	out[1] = CStringGetTextDatum(p.message);
	out[2] = CStringGetTextDatum(p.hint);
	PG_RETURN_ARRAYTYPE_P(construct_array(out, 3, TEXTOID, -1, false, TYPALIGN_INT));
}
