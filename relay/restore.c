/*
 * restore.c
 *		Keeps the relay worker out of a database while pg_restore (or psql
 *		running a pg_dump script) loads it.
 *
 * A restore creates the extension first and loads its tables' rows later,
 * table by table, each COPY committed on its own (in parallel with -j).
 * A worker that served the database in between would write rows of its
 * own (pipeline health, offsets, leases, attempts, dead letters, message
 * partitions) that the restore's COPY then finds already there ("duplicate
 * key"), deliver messages whose offsets are not restored yet, or sweep
 * messages whose consumer groups are still to come.
 *
 * Every session that pg_dump's output runs in, plain script or pg_restore
 * (each of -j's connections too), starts with SET check_function_bodies =
 * false, and keeps the setting until it ends; restoring pg_tide takes a
 * superuser (CREATE EXTENSION). The ProcessUtility hook (backend.c) sees
 * that statement: a superuser's session takes a shared
 * session-level advisory lock of its database (RELAY_RESTORE_LOCK_KEY)
 * and keeps it until it sets check_function_bodies again or ends. The
 * worker serves the database only while no session holds that lock
 * (RelayRestoreInProgress, at each reading of the pipelines). Nothing
 * depends on the client's name, and a single-transaction restore (-1) is
 * covered the same way. Another superuser session that turns
 * check_function_bodies off with SET pauses the relay of its database
 * for as long as it stays connected (docs/catalog.md says so); other
 * roles' sessions do not, and their COPY keeps every check.
 *
 * The restore's COPY into the extension's own tables also runs without
 * their foreign keys' checks (RelayBeginRestoreCopy). pg_dump creates the
 * foreign keys of ordinary tables after their data; those of an
 * extension's tables come with CREATE EXTENSION, before any data, and
 * pg_restore -j loads tables in any order (the largest first), so the
 * consumer offsets could come before their consumer groups and fail. The
 * dump was taken from one snapshot, in which every reference holds. (The
 * other triggers of those tables are skipped with them: the config check,
 * which the worker runs again on each pipeline it reads, the wake-up of
 * the worker, which waits for the restore anyway, and the invalidation of
 * the backends' cached rights, which RelayEndRestoreCopy does instead.)
 *
 * And a child table of tide_outbox_messages that a restore creates is tied
 * to the extension at once (RelayAdoptRestoredChild), as the worker ties
 * the children it makes: pg_dump keeps them as ordinary tables (they are
 * not members of the extension), so without that DROP EXTENSION would
 * refuse to drop the restored database's extension until the worker's
 * next maintenance, or for good with the relay off.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "storage/ipc.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"

#include "partitions.h"
#include "launcher.h"
#include "relay_xact.h"

/* This session holds the restore lock. */
static bool holds_restore_lock = false;
/* restore_session_exit is registered. */
static bool exit_callback_registered = false;

/*
 * At the end of a session that held the restore lock: the launcher looks
 * at the database again. The restore loaded the pipelines' rows with
 * their triggers off (RelayBeginRestoreCopy), so no commit asked for a
 * worker, and a database without an enabled pipeline has none
 * (on_demand.c); runs before the session's locks are released, and a
 * worker that comes while another session of the restore holds the lock
 * waits for it with the pipelines it found.
 */
static void
restore_session_exit(int code, Datum arg)
{
	if (holds_restore_lock && OidIsValid(MyDatabaseId))
		RelayRequestRecheck(MyDatabaseId, 0);
}

/* The table of the COPY that RelayBeginRestoreCopy let skip its triggers. */
static Oid	restore_copy_relid = InvalidOid;

/* The restore lock of this session's database. */
static void
restore_tag(LOCKTAG *tag)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, RELAY_RESTORE_LOCK_KEY, 0, 2);
}

/*
 * Whether a SET statement turns check_function_bodies off for the session
 * (1), turns it back on or resets it (0), or is about something else (-1).
 */
static int
sets_function_bodies_off(VariableSetStmt *stmt)
{
	char	   *value;
	bool		on;

	if (stmt->is_local)
		return -1;
	if (stmt->kind == VAR_RESET_ALL)
		return 0;
	if (stmt->name == NULL || strcmp(stmt->name, "check_function_bodies") != 0)
		return -1;
	if (stmt->kind != VAR_SET_VALUE)
		return stmt->kind == VAR_SET_DEFAULT || stmt->kind == VAR_RESET ? 0 : -1;
	value = ExtractSetVariableArgs(stmt);
	if (value == NULL || !parse_bool(value, &on))
		return -1;
	return on ? 0 : 1;
}

/*
 * From the ProcessUtility hook: a session that turns check_function_bodies
 * off, as every restore of pg_dump's output does, holds its database's
 * restore lock until it turns it on again or ends (see the top of this
 * file).
 */
void
RelayNoteSessionSetting(Node *parsetree)
{
	LOCKTAG		tag;
	int			off;

	/* DISCARD ALL released every advisory lock of the session */
	if (IsA(parsetree, DiscardStmt) && ((DiscardStmt *) parsetree)->target == DISCARD_ALL &&
		holds_restore_lock)
	{
		holds_restore_lock = false;
		RelayRequestRecheck(MyDatabaseId, 0);
	}
	if (!IsA(parsetree, VariableSetStmt) || !OidIsValid(MyDatabaseId) || !superuser())
		return;
	off = sets_function_bodies_off((VariableSetStmt *) parsetree);
	if (off < 0 || (off == 1) == holds_restore_lock)
		return;
	restore_tag(&tag);
	if (off == 1)
	{
		if (!exit_callback_registered)
		{
			before_shmem_exit(restore_session_exit, (Datum) 0);
			exit_callback_registered = true;
		}
		(void) LockAcquire(&tag, ShareLock, true, false);
	}
	else
	{
		LockRelease(&tag, ShareLock, true);
		RelayRequestRecheck(MyDatabaseId, 0);
	}
	holds_restore_lock = off == 1;
}

/*
 * Whether a session of this database holds the restore lock (a restore is
 * loading it); says so in the log when that starts and ends.
 */
bool
RelayRestoreInProgress(void)
{
	static bool reported = false;
	LOCKTAG		tag;
	bool		loading;

	restore_tag(&tag);
	loading = LockAcquire(&tag, ExclusiveLock, true, true) == LOCKACQUIRE_NOT_AVAIL;
	if (!loading)
		LockRelease(&tag, ExclusiveLock, true);
	if (loading && !reported)
		ereport(LOG,
				(errmsg("pg_tide relay worker for database \"%s\" waits: a restore is loading it",
						get_database_name(MyDatabaseId)),
				 errdetail("A session of the database set check_function_bodies to off, as pg_restore and pg_dump scripts do; the worker serves the database once no such session is connected.")));
	else if (!loading && reported)
		ereport(LOG,
				(errmsg("pg_tide relay worker for database \"%s\" serves it: no restore is loading it any more",
						get_database_name(MyDatabaseId))));
	reported = loading;
	return loading;
}

/*
 * From the ProcessUtility hook, before a statement: a restore's COPY into
 * a table of the extension runs with session_replication_role = replica,
 * which skips the foreign keys' checks (see the top of this file).
 * Returns the GUC nest level to end with RelayEndRestoreCopy, or -1.
 */
int
RelayBeginRestoreCopy(Node *parsetree)
{
	CopyStmt   *copy = (CopyStmt *) parsetree;
	Oid			relid;
	Oid			extension;
	int			nest;

	if (!holds_restore_lock || !IsA(parsetree, CopyStmt) || !copy->is_from || copy->relation == NULL ||
		!superuser())
		return -1;
	relid = RangeVarGetRelid(copy->relation, NoLock, true);
	extension = get_extension_oid("pg_tide", true);
	if (!OidIsValid(relid) || !OidIsValid(extension) ||
		getExtensionOfObject(RelationRelationId, relid) != extension)
		return -1;
	nest = NewGUCNestLevel();
	(void) set_config_option("session_replication_role", "replica", PGC_SUSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	restore_copy_relid = relid;
	return nest;
}

/*
 * After the statement: the setting RelayBeginRestoreCopy changed is back,
 * and the backends forget what they cached of the table, as its statement
 * triggers would have made them.
 */
void
RelayEndRestoreCopy(int nest)
{
	if (nest < 0)
		return;
	AtEOXact_GUC(true, nest);
	CacheInvalidateRelcacheByRelid(restore_copy_relid);
}

/*
 * From the ProcessUtility hook, after a statement: a CREATE TABLE of a
 * restore that makes a child of tide.tide_outbox_messages ties the child
 * to the extension (see the top of this file).
 */
void
RelayAdoptRestoredChild(Node *parsetree)
{
	CreateStmt *create = (CreateStmt *) parsetree;
	RangeVar   *parent;
	Oid			nsp;
	Oid			child;

	if (!holds_restore_lock || !IsA(parsetree, CreateStmt) || list_length(create->inhRelations) != 1)
		return;
	parent = linitial_node(RangeVar, create->inhRelations);
	if (parent->schemaname == NULL || strcmp(parent->schemaname, "tide") != 0 ||
		strcmp(parent->relname, "tide_outbox_messages") != 0 ||
		!OidIsValid(get_extension_oid("pg_tide", true)))
		return;
	CommandCounterIncrement();
	child = RangeVarGetRelid(create->relation, NoLock, true);
	nsp = get_namespace_oid("tide", true);
	if (OidIsValid(child) && get_rel_namespace(child) == nsp)
		TidePartitionAdopt(child);
}
