/*
 * session.c
 *		The relay worker's session settings, pinned as soon as it is
 *		connected.
 *
 * The worker connects as the bootstrap superuser, and connecting applies
 * the settings of ALTER DATABASE ... SET and ALTER ROLE ... SET, which a
 * database owner may write. Trusted as they are, they would let that owner
 * choose the search_path the worker resolves names in (and so run code of
 * theirs as superuser), run the worker as another role, or change what its
 * SQL does: replica mode skips triggers, read-only or serializable
 * transactions and timeouts make its writes fail. So, like PostgreSQL's own
 * autovacuum and logical replication workers, it overrides every such
 * setting with a fixed value (PGC_S_OVERRIDE: no later SET, function SET
 * clause or reload can change it). Its SQL also names every function and
 * operator with its schema (test/t/023_sql_qualified.pl checks that), so
 * neither defence depends on the other.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_authid.h"
#include "miscadmin.h"
#include "utils/guc.h"

#include "relay_xact.h"

/* A setting and the value the worker runs with. */
typedef struct PinnedSetting
{
	const char *name;
	const char *value;
} PinnedSetting;

static const PinnedSetting pinned_settings[] = {
	{"search_path", "pg_catalog, pg_temp"},
	{"role", "none"},
	{"session_replication_role", "origin"},
	{"default_transaction_read_only", "off"},
	{"default_transaction_isolation", "read committed"},
	{"default_transaction_deferrable", "off"},
	{"statement_timeout", "0"},
	{"lock_timeout", "0"},
	{"idle_in_transaction_session_timeout", "0"},
#if PG_VERSION_NUM >= 170000
	{"transaction_timeout", "0"},
#endif
	{"check_function_bodies", "on"},
	{"transform_null_equals", "off"},
	{"standard_conforming_strings", "on"},
	{"array_nulls", "on"},
};

/*
 * Overrides the settings a database owner or role could have given the
 * worker's session (see the top of this file); the session runs as the
 * bootstrap superuser again, whatever session_authorization said.
 */
void
RelayPinSessionSettings(void)
{
	/* role names are looked up in the catalog */
	StartTransactionCommand();
	SetConfigOption("session_authorization",
					GetUserNameFromId(BOOTSTRAP_SUPERUSERID, false),
					PGC_SUSET, PGC_S_OVERRIDE);
	for (int i = 0; i < (int) lengthof(pinned_settings); i++)
		SetConfigOption(pinned_settings[i].name, pinned_settings[i].value,
						PGC_SUSET, PGC_S_OVERRIDE);
	CommitTransactionCommand();
}
