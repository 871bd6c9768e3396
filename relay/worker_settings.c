/*
 * worker_settings.c
 *		A running relay worker sees the settings of ALTER DATABASE ... SET
 *		and ALTER ROLE ... SET again after a reload.
 *
 * A backend applies those settings (pg_db_role_setting) once, when it
 * connects (process_settings in postinit.c); a reload only re-reads the
 * configuration files. A relay worker runs for as long as the server, so a
 * per-database pg_tide.operator_events_outbox set or RESET after it started
 * would never reach it, and its operator events would go to the wrong
 * outbox, or nowhere, without a word. So on SIGHUP the worker notes that
 * the configuration was reloaded (RelayReloadConfig, wherever the reload is
 * taken), and between passes (RelayApplyDatabaseSettings), in a short
 * transaction of its own:
 *
 * 1. every setting whose value came from pg_db_role_setting goes back to
 *	  its built-in default, as a reload does for a line removed from
 *	  postgresql.conf, so that a RESET takes effect;
 * 2. the configuration files are read again, which gives those settings
 *	  their file values back;
 * 3. the database's and the role's settings are applied again, in the order
 *	  and at the priorities of a new connection;
 * 4. the pinned settings (session.c) are pinned again. They win anyway
 *	  (PGC_S_OVERRIDE ranks above every source of step 3), so a database
 *	  owner steers the worker no more after a reload than at its start.
 *
 * A setting given on the postmaster's command line and overridden by a
 * database or role setting falls back to the file or built-in value, not
 * to the command line's, once that setting is removed.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_db_role_setting.h"
#include "miscadmin.h"
#include "postmaster/interrupt.h"
#include "utils/guc.h"
#include "utils/guc_tables.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "launcher.h"
#include "relay_xact.h"

/* A reload was taken since the database and role settings were last applied. */
static bool database_settings_stale = false;

/*
 * Takes a pending reload of the configuration files and notes it for the
 * pass; wakes the relay workers, so that the pass comes now, not after a
 * long naptime, and a changed relay_workers_per_database moves pipelines
 * at once (ownership.c).
 */
void
RelayReloadConfig(void)
{
	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
	database_settings_stale = true;
	pg_atomic_fetch_add_u64(&Relay->wake_requests, 1);
}

/* Whether a value's source is a database or role setting (pg_db_role_setting). */
static bool
from_db_role_setting(GucSource source)
{
	return source >= PGC_S_GLOBAL && source <= PGC_S_DATABASE_USER;
}

/*
 * Step 1: every setting a database or role setting gave a value goes back
 * to its built-in default. Only settings that can change after the start
 * of a session are touched; the others never took such a value.
 */
static void
forget_db_role_settings(void)
{
	struct config_generic **vars;
	int			nvars;

#if PG_VERSION_NUM >= 160000
	vars = get_guc_variables(&nvars);
#else
	vars = get_guc_variables();
	nvars = GetNumConfigOptions();
#endif
	for (int i = 0; i < nvars; i++)
	{
		struct config_generic *var = vars[i];

		if (var->context != PGC_SUSET && var->context != PGC_USERSET)
			continue;
		if (!from_db_role_setting(var->source) && !from_db_role_setting(var->reset_source))
			continue;
		/* What ProcessConfigFile does for a line removed from the file. */
		if (from_db_role_setting(var->reset_source))
			var->reset_source = PGC_S_DEFAULT;
		if (from_db_role_setting(var->source))
			var->source = PGC_S_DEFAULT;
		for (GucStack *stack = var->stack; stack != NULL; stack = stack->prev)
			if (from_db_role_setting(stack->source))
				stack->source = PGC_S_DEFAULT;
		(void) set_config_option(var->name, NULL, PGC_SUSET, PGC_S_DEFAULT,
								 GUC_ACTION_SET, true, 0, false);
	}
}

/* Step 3: the settings of pg_db_role_setting, as process_settings applies them. */
static void
apply_db_role_settings(void)
{
	Relation	rel = table_open(DbRoleSettingRelationId, AccessShareLock);
	Snapshot	snapshot = RegisterSnapshot(GetCatalogSnapshot(DbRoleSettingRelationId));
	Oid			roleid = GetSessionUserId();

	/* Later ones win: the database and role, the role, the database, every database. */
	ApplySetting(snapshot, MyDatabaseId, roleid, rel, PGC_S_DATABASE_USER);
	ApplySetting(snapshot, InvalidOid, roleid, rel, PGC_S_USER);
	ApplySetting(snapshot, MyDatabaseId, InvalidOid, rel, PGC_S_DATABASE);
	ApplySetting(snapshot, InvalidOid, InvalidOid, rel, PGC_S_GLOBAL);
	UnregisterSnapshot(snapshot);
	table_close(rel, AccessShareLock);
}

/*
 * Applies the database and role settings again after a reload (see the top
 * of this file); does nothing when no reload was taken. Call it between
 * passes, with no transaction open. An ERROR is logged and leaves the
 * settings as the configuration files made them, until the next reload.
 */
void
RelayApplyDatabaseSettings(void)
{
	MemoryContext cxt = CurrentMemoryContext;

	if (!database_settings_stale)
		return;
	database_settings_stale = false;

	PG_TRY();
	{
		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		forget_db_role_settings();
		ProcessConfigFile(PGC_SIGHUP);
		apply_db_role_settings();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		EmitErrorReport();
		FlushErrorState();
		AbortCurrentTransaction();
		ereport(LOG,
				(errmsg("pg_tide relay worker for database %u could not apply the database and role settings again",
						MyDatabaseId),
				 errdetail("It runs with the values of the configuration files until the next reload.")));
	}
	PG_END_TRY();
	/* The worker's own settings win over whatever was applied (session.c). */
	RelayPinSessionSettings();
	MemoryContextSwitchTo(cxt);
}
