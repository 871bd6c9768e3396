/*
 * compat.h
 *		Differences between the PostgreSQL major versions pg_tide builds on
 *		(15 to 18), kept in one place.
 */
#ifndef TIDE_COMPAT_H
#define TIDE_COMPAT_H

#include "postgres.h"
#include "storage/proc.h"

#if PG_VERSION_NUM < 150000
#error "pg_tide needs PostgreSQL 15 or later"
#endif

/*
 * "Never returns", written before a function's declaration: a prefix from
 * 18 on (pg_noreturn), an attribute before (which GCC and Clang also take
 * in that place).
 */
#if PG_VERSION_NUM >= 180000
#define TideNoReturn pg_noreturn
#else
#define TideNoReturn pg_attribute_noreturn()
#endif

/* Whether the current user owns a relation (or is a superuser). */
#if PG_VERSION_NUM >= 160000
#define TideClassOwnerCheck(relid, role) object_ownercheck(RelationRelationId, (relid), (role))
#else
#define TideClassOwnerCheck(relid, role) pg_class_ownercheck((relid), (role))
#endif

/* A relation's primary key index (18 asks whether a deferrable one will do). */
#if PG_VERSION_NUM >= 180000
#define TidePrimaryKeyIndex(rel) RelationGetPrimaryKeyIndex((rel), false)
#else
#define TidePrimaryKeyIndex(rel) RelationGetPrimaryKeyIndex(rel)
#endif

/* This backend's index into the PGPROC array. */
#if PG_VERSION_NUM >= 170000
#include "storage/procnumber.h"
#define TideMyProcIndex() ((int) MyProcNumber)
#else
#define TideMyProcIndex() (MyProc->pgprocno)
#endif

/* Whether the current user owns a database (or is a superuser). */
#include "catalog/pg_database.h"
#include "miscadmin.h"
#include "utils/acl.h"
#if PG_VERSION_NUM >= 160000
#define TideDatabaseOwnerCheck(dboid) \
	object_ownercheck(DatabaseRelationId, (dboid), GetUserId())
#else
#define TideDatabaseOwnerCheck(dboid) pg_database_ownercheck((dboid), GetUserId())
#endif

/*
 * A WaitEventSet that lives as long as the process: 17 ties a set to a
 * resource owner (none: it is never released), 15 and 16 to a memory
 * context.
 */
#include "storage/latch.h"
#include "utils/memutils.h"
#if PG_VERSION_NUM >= 170000
#define TideCreateLongLivedWaitEventSet(nevents) CreateWaitEventSet(NULL, (nevents))
#else
#define TideCreateLongLivedWaitEventSet(nevents) CreateWaitEventSet(TopMemoryContext, (nevents))
#endif

/* Whether this process holds a lock in exactly that mode (17 added "or stronger"). */
#include "storage/lock.h"
#if PG_VERSION_NUM >= 170000
#define TideLockHeldByMe(tag, mode) LockHeldByMe((tag), (mode), false)
#else
#define TideLockHeldByMe(tag, mode) LockHeldByMe((tag), (mode))
#endif

/* A role's right on a function or a schema (16 made these object_aclcheck). */
#if PG_VERSION_NUM >= 160000
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
#define TideProcAclCheck(proc, role, mode) object_aclcheck(ProcedureRelationId, (proc), (role), (mode))
#define TideNamespaceAclCheck(nsp, role, mode) object_aclcheck(NamespaceRelationId, (nsp), (role), (mode))
#else
#define TideProcAclCheck(proc, role, mode) pg_proc_aclcheck((proc), (role), (mode))
#define TideNamespaceAclCheck(nsp, role, mode) pg_namespace_aclcheck((nsp), (role), (mode))
#endif

#endif							/* TIDE_COMPAT_H */
