/*
 * config.c
 *		The inbox sink's keys of a pipeline config, "inbox" (required) and
 *		"event_id_header" (optional), and whether a role may write an inbox;
 *		see docs/sinks/inbox.md.
 *
 * RelayInboxValidate is the sink's validate callback (pipeline_config.c
 * has checked the common keys and refused unknown ones). The relay worker
 * is a superuser, so a pipeline may write only an inbox that the role it
 * is checked with (the one that sets it, or its owner: config_files.c)
 * could write itself through tide.inbox_receive. tide.relay_set_outbox and
 * the row's trigger refuse a missing inbox (42704) and one the role may not
 * write (42501). The worker does not: an inbox dropped or a right revoked
 * after the pipeline was set holds the pipeline at its next record
 * (sink.c checks again there, as the owner) until the inbox or the
 * right is back, rather than passing it over until its config changes.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "utils/builtins.h"

#include "config_value.h"
#include "inbox.h"
#include "pg_tide.h"

const char *const RelayInboxConfigKeys[] = {"inbox", "event_id_header", "batch_size", NULL};

/*
 * Looks up inbox `inbox` for `role`, or for the owner of `pipeline` when
 * role is InvalidOid (then *role_out is that owner, or InvalidOid): its
 * table's oid and quoted, qualified name (in the caller's memory context),
 * or InvalidOid when the inbox or its table does not exist; whether the
 * role may write it as tide.inbox_receive does. Runs SQL.
 */
void
RelayInboxLookup(const char *inbox, Oid role, const char *pipeline, RelayInboxTarget *t)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[3] = {TEXTOID, OIDOID, TEXTOID};
	Datum		values[3];
	char		nulls[3] = {' ', OidIsValid(role) ? ' ' : 'n', pipeline ? ' ' : 'n'};
	MemoryContext cxt = CurrentMemoryContext;

	memset(t, 0, sizeof(*t));
	values[0] = CStringGetTextDatum(inbox);
	values[1] = ObjectIdGetDatum(role);
	values[2] = pipeline ? CStringGetTextDatum(pipeline) : (Datum) 0;
	SPI_connect();
	if (SPI_execute_plan(TidePlan(&plan,
								  "WITH w AS (SELECT coalesce($2,"
								  "    (SELECT o.oid FROM tide.relay_outbox_config p"
								  "       JOIN pg_catalog.pg_roles o ON o.rolname OPERATOR(pg_catalog.=) p.owner"
								  "      WHERE p.name OPERATOR(pg_catalog.=) $3)) AS role)"
								  " SELECT t.oid, pg_catalog.format('%I.%I', c.inbox_schema,"
								  "          pg_catalog.concat(c.inbox_name, '_inbox')), w.role,"
								  "        CASE WHEN w.role IS NULL OR t.oid IS NULL THEN false"
								  "             ELSE pg_catalog.has_schema_privilege(w.role, n.oid, 'USAGE')"
								  "              AND pg_catalog.has_table_privilege(w.role, t.oid, 'INSERT')"
								  "              AND pg_catalog.has_function_privilege(w.role,"
								  "                    'tide.inbox_receive(text,text,jsonb,jsonb,text)', 'EXECUTE') END"
								  "   FROM tide.tide_inbox_config c CROSS JOIN w"
								  "   LEFT JOIN pg_catalog.pg_namespace n ON n.nspname OPERATOR(pg_catalog.=) c.inbox_schema"
								  "   LEFT JOIN pg_catalog.pg_class t ON t.relnamespace OPERATOR(pg_catalog.=) n.oid"
								  "        AND t.relname OPERATOR(pg_catalog.=) pg_catalog.concat(c.inbox_name, '_inbox')"
								  "  WHERE c.inbox_name OPERATOR(pg_catalog.=) $1",
								  3, types),
						 values, nulls, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look up inbox \"%s\"", inbox);
	if (SPI_processed == 1)
	{
		t->relid = DatumGetObjectId(TideSpiDatum(1));
		t->table = MemoryContextStrdup(cxt, TideSpiText(2));
		t->role = DatumGetObjectId(TideSpiDatum(3));
		t->writable = TideSpiBool(4);
	}
	SPI_finish();
}

/* Whether this process is a relay worker (see the top of this file). */
static bool
in_relay_worker(void)
{
	return MyBgworkerEntry != NULL &&
		strcmp(MyBgworkerEntry->bgw_function_name, "RelayWorkerMain") == 0;
}

/* The role a config is checked with, as a message names it. */
static const char *
role_name(Oid role)
{
	const char *name = OidIsValid(role) ? GetUserNameFromId(role, true) : NULL;

	return name ? psprintf("role \"%s\"", name) : "a pipeline without an owner";
}

void
RelayInboxValidate(const cJSON *config, cJSON *out)
{
	const char *hint = "Give \"inbox\", the name of an inbox of this database that tide.inbox_create() made.";
	const char *header_hint = "Give \"event_id_header\" as the name of the message header whose value is the "
		"event id, or leave it out to use the message's identity outbox_<outbox>:<id>.";
	const cJSON *inbox = RelayConfigRequiredString(config, "inbox", hint);

	TideValidateName("inbox", inbox->valuestring);
	RelayConfigAddHeaderName(config, out, "event_id_header", header_hint);
	if (!in_relay_worker())
	{
		Oid			role = RelayConfigRole();
		RelayInboxTarget t;

		RelayInboxLookup(inbox->valuestring, role, NULL, &t);
		if (!OidIsValid(t.relid))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("inbox \"%s\" does not exist", inbox->valuestring),
					 errhint("Create it with tide.inbox_create(), then set the pipeline.")));
		if (!OidIsValid(role) || !t.writable)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("permission denied to write inbox \"%s\" for %s", inbox->valuestring,
							role_name(role)),
					 errdetail("The relay writes the inbox with the rights of the pipeline's owner, as tide.inbox_receive would."),
					 errhint("Grant tide_consumer (or USAGE on the schema of %s, INSERT on it and EXECUTE on tide.inbox_receive) to the role that sets the pipeline.",
							 t.table)));
	}
	RelayConfigAddCopy(out, "inbox", inbox);
}
