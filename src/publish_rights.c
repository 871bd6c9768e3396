/*
 * publish_rights.c
 *		Who may publish to an outbox, and publishing's writes as the owner.
 *
 * tide.outbox_publish runs as its caller, so that the check sees the
 * caller's identity with role inheritance (has_privs_of_role): a superuser,
 * a role with the privileges of the extension's owner or of tide_admin, or
 * of a grantee of the outbox in tide.outbox_publish_grants may publish.
 * Then the writes run as the owner of the catalog (the caller has no
 * privileges on its tables), with SECURITY_LOCAL_USERID_CHANGE as
 * PostgreSQL's own foreign key checks do; an error unwinds it with the
 * (sub)transaction.
 *
 * The answers are cached per backend, keyed by role and outbox, and
 * forgotten when the grants table changes (its statement trigger sends a
 * relcache invalidation at commit) or any role or membership changes.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"

#include "pg_tide.h"

PG_FUNCTION_INFO_V1(tide_publish_rights_changed);

typedef struct PublishRightKey
{
	Oid			userid;
	char		outbox[NAMEDATALEN];
} PublishRightKey;

typedef struct PublishRightEntry
{
	PublishRightKey key;
	bool		allowed;
} PublishRightEntry;

static HTAB *rights = NULL;
static bool callbacks_registered = false;
static Oid	messages_relid = InvalidOid;	/* tide.tide_outbox_messages */
static Oid	grants_relid = InvalidOid;	/* tide.outbox_publish_grants */
static SPIPlanPtr grants_plan = NULL;

/* Forgets every cached answer and the cached relation oids. */
static void
forget_rights(void)
{
	if (rights)
	{
		hash_destroy(rights);
		rights = NULL;
	}
	messages_relid = InvalidOid;
	grants_relid = InvalidOid;
}

/* Relcache callback: the grants table (or the messages table) changed. */
static void
rights_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == grants_relid || relid == messages_relid)
		forget_rights();
}

/* Syscache callback: a role or a role membership changed. */
static void
rights_syscache_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	forget_rights();
}

/* The oid of relation tide.<name>, looked up once and cached. */
static Oid
tide_relid(Oid *cache, const char *name)
{
	if (!OidIsValid(*cache))
	{
		Oid			nsp = get_namespace_oid("tide", false);

		*cache = get_relname_relid(name, nsp);
		if (!OidIsValid(*cache))
			elog(ERROR, "relation tide.%s does not exist", name);
	}
	return *cache;
}

/* The owner of the catalog: the owner of tide.tide_outbox_messages. */
Oid
TideCatalogOwner(void)
{
	Oid			relid = tide_relid(&messages_relid, "tide_outbox_messages");
	HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	Oid			owner;

	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for relation %u", relid);
	owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
	ReleaseSysCache(tup);
	return owner;
}

/* Whether userid may publish to the outbox, asked of the catalog (SPI connected). */
static bool
publish_allowed(Oid userid, const char *outbox)
{
	Oid			admin = get_role_oid("tide_admin", true);
	Oid			types[1] = {TEXTOID};
	Datum		args[1];

	if (superuser_arg(userid) || has_privs_of_role(userid, TideCatalogOwner()) ||
		(OidIsValid(admin) && has_privs_of_role(userid, admin)))
		return true;

	args[0] = CStringGetTextDatum(outbox);
	if (SPI_execute_plan(TidePlan(&grants_plan,
								  "SELECT g.grantee::pg_catalog.oid FROM tide.outbox_publish_grants g"
								  " WHERE g.outbox_name OPERATOR(pg_catalog.=) $1",
								  1, types),
						 args, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the publishing rights of outbox \"%s\"", outbox);
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		Oid			grantee = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[i],
															 SPI_tuptable->tupdesc, 1, &isnull));

		if (!isnull && has_privs_of_role(userid, grantee))
			return true;
	}
	return false;
}

/* The error for a caller without the right to publish to the outbox. */
static void
refuse_publish(Oid userid, const char *outbox)
{
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied to publish to outbox \"%s\"", outbox),
			 errdetail("Role \"%s\" has no right to publish to it.",
					   GetUserNameFromId(userid, false)),
			 errhint("An administrator can grant it with tide.outbox_grant_publish().")));
}

/*
 * Raises 42501 unless userid (the caller, not the current user: SPI runs
 * as the owner) may publish to the outbox. Needs SPI connected.
 */
void
TideCheckPublishRight(Oid userid, const char *outbox)
{
	PublishRightKey key;
	PublishRightEntry *entry;
	bool		allowed;

	if (!callbacks_registered)
	{
		CacheRegisterRelcacheCallback(rights_relcache_callback, (Datum) 0);
		CacheRegisterSyscacheCallback(AUTHMEMROLEMEM, rights_syscache_callback, (Datum) 0);
		CacheRegisterSyscacheCallback(AUTHOID, rights_syscache_callback, (Datum) 0);
		callbacks_registered = true;
	}

	memset(&key, 0, sizeof(key));
	key.userid = userid;
	strlcpy(key.outbox, outbox, NAMEDATALEN);
	entry = rights ? hash_search(rights, &key, HASH_FIND, NULL) : NULL;
	if (entry)
		allowed = entry->allowed;
	else
	{
		/* the callbacks need the oid before a change can arrive */
		tide_relid(&grants_relid, "outbox_publish_grants");
		allowed = publish_allowed(userid, outbox);
		/* the lookup may have processed invalidations: cache afterwards */
		if (rights == NULL)
		{
			HASHCTL		ctl;

			ctl.keysize = sizeof(PublishRightKey);
			ctl.entrysize = sizeof(PublishRightEntry);
			ctl.hcxt = TopMemoryContext;
			rights = hash_create("pg_tide publishing rights", 64, &ctl,
								 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
		}
		entry = hash_search(rights, &key, HASH_ENTER, NULL);
		entry->allowed = allowed;
	}
	if (!allowed)
		refuse_publish(userid, outbox);
}

/*
 * Trigger on tide.outbox_publish_grants: every backend forgets its cached
 * answers when the change commits (this one at once).
 */
Datum
tide_publish_rights_changed(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		elog(ERROR, "tide_publish_rights_changed: not called as a trigger");
	CacheInvalidateRelcacheByRelid(RelationGetRelid(trigdata->tg_relation));
	return PointerGetDatum(NULL);
}
