/*
 * catalog_version.c
 *		Which version of pg_tide's catalog a database has, against the one
 *		this library was built for.
 *
 * One pg_tide.so serves every catalog version on the upgrade path: after
 * the package is upgraded and the server restarted, each database keeps
 * the catalog it had until someone runs ALTER EXTENSION pg_tide UPDATE.
 * The library reads extversion from pg_extension and compares it with
 * TIDE_CATALOG_VERSION (the control file's default_version, passed in by
 * the Makefile), so that the relay worker can wait for the update instead
 * of failing on a column an older catalog lacks; an SQL entry point whose
 * work needs objects newer than the catalog that declares it compares the
 * same way and refuses with 55000 (CONTRIBUTING.md).
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"

#include "pg_tide.h"

/*
 * The installed version of pg_tide in this database (extversion), in the
 * current memory context, or NULL when it is not installed. Needs a
 * transaction.
 */
char *
TideInstalledVersion(void)
{
	Oid			extoid = get_extension_oid("pg_tide", true);
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	char	   *version = NULL;

	if (!OidIsValid(extoid))
		return NULL;
	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_oid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(extoid));
	scan = systable_beginscan(rel, ExtensionOidIndexId, true, NULL, 1, &key);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
	{
		bool		isnull;
		Datum		d = heap_getattr(tup, Anum_pg_extension_extversion,
									 RelationGetDescr(rel), &isnull);

		if (!isnull)
			version = text_to_cstring(DatumGetTextPP(d));
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return version;
}

/*
 * Compares two versions of the form 1.2.3 part by part as numbers:
 * negative, zero or positive as a is older than, the same as or newer
 * than b. A part that is not a number compares as 0.
 */
int
TideCompareVersions(const char *a, const char *b)
{
	while (*a || *b)
	{
		long		x = strtol(a, (char **) &a, 10);
		long		y = strtol(b, (char **) &b, 10);

		if (x != y)
			return x < y ? -1 : 1;
		a += strspn(a, ".");
		b += strspn(b, ".");
		if ((*a && !isdigit((unsigned char) *a)) || (*b && !isdigit((unsigned char) *b)))
			break;
	}
	return 0;
}
