/*
 * outbox_rights.c
 *		Who may publish to an outbox and who may consume from its consumer
 *		groups; the API's writes then run as the catalog's owner.
 *
 * tide.outbox_publish and the consumer API (tide.poll_outbox, ...) run as
 * their caller, so that the check sees the caller's identity with role
 * inheritance (has_privs_of_role). A role has a right on an outbox when it
 * is a superuser or has the privileges of the extension's owner, of
 * tide_admin, or of a grantee of that outbox for that right
 * (tide.outbox_publish_grants, tide.outbox_consume_grants). Then the
 * function's reads and writes run as the owner of the catalog (the caller
 * has no privileges on its tables), with SECURITY_LOCAL_USERID_CHANGE as
 * PostgreSQL's own foreign key checks do; an error unwinds it with the
 * (sub)transaction.
 *
 * A relay pipeline's consumer group is the relay's own: only the relay
 * worker (a flag of its process, not a consumer name anyone can type) may
 * consume from it, superusers included, unless the pipeline's config says
 * "allow_other_consumers": true.
 *
 * The answers are cached per backend: the rights keyed by role, outbox and
 * right, forgotten when a grants table changes (its statement trigger sends
 * a relcache invalidation at commit) or any role or membership changes; the
 * pipelines' groups, forgotten when relay_outbox_config changes (the same
 * trigger). Both are read with a snapshot taken after the invalidations
 * were processed, so that a transaction's older snapshot (REPEATABLE READ)
 * never puts a superseded answer back into the cache.
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
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "pg_tide.h"

PG_FUNCTION_INFO_V1(tide_rights_changed);

/* Set by the relay worker when it starts (relay/worker.c). */
bool		TideInRelayWorker = false;

typedef struct RightKey
{
	Oid			userid;
	int32		right;			/* TideRight */
	char		outbox[NAMEDATALEN];
} RightKey;

typedef struct RightEntry
{
	RightKey	key;
	bool		allowed;
} RightEntry;

/* A consumer group that a relay pipeline reads through. */
typedef struct PipelineGroupEntry
{
	char		group[NAMEDATALEN];
	char		pipeline[NAMEDATALEN];	/* the first by name, for the message */
	bool		others_allowed; /* every pipeline naming it allows others */
} PipelineGroupEntry;

static const char *const right_verbs[] = {"publish to", "consume from"};
static const char *const grants_tables[] = {"outbox_publish_grants", "outbox_consume_grants"};
static const char *const grants_sql[] = {
	"SELECT g.grantee::pg_catalog.oid FROM tide.outbox_publish_grants g"
	" WHERE g.outbox_name OPERATOR(pg_catalog.=) $1",
	"SELECT g.grantee::pg_catalog.oid FROM tide.outbox_consume_grants g"
	" WHERE g.outbox_name OPERATOR(pg_catalog.=) $1"
};

static HTAB *rights = NULL;
static HTAB *pipeline_groups = NULL;
static bool callbacks_registered = false;
static Oid	messages_relid = InvalidOid;	/* tide.tide_outbox_messages */
static Oid	grants_relid[2] = {InvalidOid, InvalidOid};
static Oid	pipelines_relid = InvalidOid;	/* tide.relay_outbox_config */
static SPIPlanPtr grants_plan[2] = {NULL, NULL};
static SPIPlanPtr group_outbox_plan = NULL;
static SPIPlanPtr pipeline_groups_plan = NULL;

/*
 * Bumped by every invalidation: an answer computed while one arrived is
 * used once, not cached (the relation oids it needs may have been reset).
 */
static uint64 rights_generation = 0;
static uint64 pipelines_generation = 0;

/* Forgets every cached answer about rights. */
static void
forget_rights(void)
{
	rights_generation++;
	if (rights)
	{
		hash_destroy(rights);
		rights = NULL;
	}
}

/* Forgets the cached pipelines' groups. */
static void
forget_pipeline_groups(void)
{
	pipelines_generation++;
	if (pipeline_groups)
	{
		hash_destroy(pipeline_groups);
		pipeline_groups = NULL;
	}
}

/* Relcache callback: a grants table, relay_outbox_config or the catalog changed. */
static void
rights_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == messages_relid)
	{
		/* a reset, or the extension went: the relation oids may be stale too */
		forget_rights();
		forget_pipeline_groups();
		messages_relid = grants_relid[0] = grants_relid[1] = pipelines_relid = InvalidOid;
	}
	else if (relid == grants_relid[0] || relid == grants_relid[1])
		forget_rights();
	else if (relid == pipelines_relid)
		forget_pipeline_groups();
}

/* Syscache callback: a role or a role membership changed. */
static void
rights_syscache_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	forget_rights();
}

/* Registers the invalidation callbacks, once per backend. */
static void
register_callbacks(void)
{
	if (callbacks_registered)
		return;
	CacheRegisterRelcacheCallback(rights_relcache_callback, (Datum) 0);
	CacheRegisterSyscacheCallback(AUTHMEMROLEMEM, rights_syscache_callback, (Datum) 0);
	CacheRegisterSyscacheCallback(AUTHOID, rights_syscache_callback, (Datum) 0);
	callbacks_registered = true;
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

/* Whether userid has every right on every outbox: superuser, owner, tide_admin. */
static bool
has_every_right(Oid userid)
{
	Oid			admin = get_role_oid("tide_admin", true);

	return superuser_arg(userid) || has_privs_of_role(userid, TideCatalogOwner()) ||
		(OidIsValid(admin) && has_privs_of_role(userid, admin));
}

/* Whether userid has the right on the outbox, asked of the catalog (SPI connected). */
static bool
right_allowed(Oid userid, TideRight right, const char *outbox)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1];

	if (has_every_right(userid))
		return true;

	args[0] = CStringGetTextDatum(outbox);
	if (SPI_execute_snapshot(TidePlan(&grants_plan[right], grants_sql[right], 1, types),
							 args, NULL, GetLatestSnapshot(), InvalidSnapshot,
							 true, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the rights to %s outbox \"%s\"", right_verbs[right], outbox);
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

/* Whether userid has the right on the outbox, from the cache or the catalog. */
static bool
has_right(Oid userid, TideRight right, const char *outbox)
{
	RightKey	key;
	RightEntry *entry;
	bool		allowed;
	uint64		generation;

	register_callbacks();
	memset(&key, 0, sizeof(key));
	key.userid = userid;
	key.right = (int32) right;
	strlcpy(key.outbox, outbox, NAMEDATALEN);
	entry = rights ? hash_search(rights, &key, HASH_FIND, NULL) : NULL;
	if (entry)
		return entry->allowed;

	generation = rights_generation;
	/* the callbacks need the oids before a change can arrive */
	tide_relid(&messages_relid, "tide_outbox_messages");
	tide_relid(&grants_relid[right], grants_tables[right]);
	allowed = right_allowed(userid, right, outbox);
	if (generation != rights_generation)
		return allowed;
	if (rights == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(RightKey);
		ctl.entrysize = sizeof(RightEntry);
		ctl.hcxt = TopMemoryContext;
		rights = hash_create("pg_tide outbox rights", 64, &ctl,
							 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	entry = hash_search(rights, &key, HASH_ENTER, NULL);
	entry->allowed = allowed;
	return allowed;
}

/*
 * Raises 42501 unless userid (the caller, not the current user: SPI runs
 * as the owner) may publish to the outbox. Needs SPI connected.
 */
void
TideCheckPublishRight(Oid userid, const char *outbox)
{
	if (!has_right(userid, TIDE_RIGHT_PUBLISH, outbox))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to publish to outbox \"%s\"", outbox),
				 errdetail("Role \"%s\" has no right to publish to it.",
						   GetUserNameFromId(userid, false)),
				 errhint("An administrator can grant it with tide.outbox_grant_publish().")));
}

/*
 * The error for a caller without the right to consume from the group's
 * outbox. It names the group, not the outbox: a group that does not exist
 * must look the same.
 */
static void
refuse_consume(Oid userid, const char *group)
{
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied to consume from consumer group \"%s\"", group),
			 errdetail("Role \"%s\" has no right to consume from the outbox the group reads.",
					   GetUserNameFromId(userid, false)),
			 errhint("An administrator can grant it with tide.outbox_grant_consume().")));
}

/*
 * The consumer groups of every relay pipeline, read from the catalog (SPI
 * connected) into a table in cxt.
 */
static HTAB *
read_pipeline_groups(MemoryContext cxt)
{
	HASHCTL		ctl;
	HTAB	   *groups;

	if (SPI_execute_snapshot(TidePlan(&pipeline_groups_plan,
									  "SELECT c.config OPERATOR(pg_catalog.->>) 'consumer_group', c.name,"
									  "       coalesce(c.config OPERATOR(pg_catalog.->) 'allow_other_consumers'"
									  "                OPERATOR(pg_catalog.=) 'true'::pg_catalog.jsonb, false)"
									  "  FROM tide.relay_outbox_config c"
									  " WHERE c.config OPERATOR(pg_catalog.?) 'consumer_group'"
									  " ORDER BY c.name",
									  0, NULL),
							 NULL, NULL, GetLatestSnapshot(), InvalidSnapshot,
							 true, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the consumer groups of the relay pipelines");

	ctl.keysize = NAMEDATALEN;
	ctl.entrysize = sizeof(PipelineGroupEntry);
	ctl.hcxt = cxt;
	groups = hash_create("pg_tide pipeline groups", 16, &ctl,
						 HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		char	   *group = SPI_getvalue(tup, desc, 1);
		char		key[NAMEDATALEN];
		bool		found;
		bool		isnull;
		bool		allowed = DatumGetBool(SPI_getbinval(tup, desc, 3, &isnull));
		PipelineGroupEntry *entry;

		if (group == NULL)
			continue;
		memset(key, 0, sizeof(key));
		strlcpy(key, group, NAMEDATALEN);
		entry = hash_search(groups, key, HASH_ENTER, &found);
		if (!found)
		{
			strlcpy(entry->pipeline, SPI_getvalue(tup, desc, 2), NAMEDATALEN);
			entry->others_allowed = allowed;
		}
		else
			entry->others_allowed = entry->others_allowed && allowed;
	}
	return groups;
}

/*
 * Raises 42501 when the group is a relay pipeline's and the caller is not
 * the relay worker, unless the pipeline allows other consumers.
 */
static void
check_pipeline_group(const char *group)
{
	HTAB	   *groups = pipeline_groups;
	PipelineGroupEntry *entry;
	char		key[NAMEDATALEN];
	char		pipeline[NAMEDATALEN];
	bool		refused = false;

	if (TideInRelayWorker)
		return;
	register_callbacks();
	if (groups == NULL)
	{
		uint64		generation = pipelines_generation;

		/* the callbacks need the oids before a change can arrive */
		tide_relid(&messages_relid, "tide_outbox_messages");
		tide_relid(&pipelines_relid, "relay_outbox_config");
		groups = read_pipeline_groups(TopMemoryContext);
		/* changed while it was read: it answers this call only */
		if (generation == pipelines_generation)
			pipeline_groups = groups;
	}
	memset(key, 0, sizeof(key));
	strlcpy(key, group, NAMEDATALEN);
	entry = hash_search(groups, key, HASH_FIND, NULL);
	if (entry && !entry->others_allowed)
	{
		refused = true;
		strlcpy(pipeline, entry->pipeline, NAMEDATALEN);
	}
	if (groups != pipeline_groups)
		hash_destroy(groups);
	if (refused)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to consume from consumer group \"%s\"", group),
				 errdetail("It is the consumer group of relay pipeline \"%s\": only the relay consumes from it.",
						   pipeline),
				 errhint("An administrator can let other consumers share it by setting \"allow_other_consumers\": true in the pipeline's config with tide.relay_set_outbox().")));
}

/*
 * Raises 42501 unless userid may consume from the group, given the outbox
 * it reads, and the group is not a pipeline's that is closed to userid.
 * Needs SPI connected.
 */
void
TideCheckConsumeOutbox(Oid userid, const char *group, const char *outbox)
{
	if (!has_right(userid, TIDE_RIGHT_CONSUME, outbox))
		refuse_consume(userid, group);
	check_pipeline_group(group);
}

/*
 * Raises 42501 unless userid (the caller) may consume from the group (see
 * the top of the file); returns the outbox the group reads. An unknown
 * group is refused to a role without the right on every outbox, so that
 * names are not disclosed; to one with it, NULL is returned and the caller
 * reports the missing group. Reads the group without locking it: a caller
 * without the right must not hold its lock. Needs SPI connected.
 */
char *
TideCheckConsumeRight(Oid userid, const char *group)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(group)};
	char	   *outbox = NULL;

	if (SPI_execute_plan(TidePlan(&group_outbox_plan,
								  "SELECT g.outbox_name FROM tide.tide_consumer_groups g"
								  " WHERE g.group_name OPERATOR(pg_catalog.=) $1",
								  1, types),
						 args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read consumer group \"%s\"", group);
	if (SPI_processed > 0)
		outbox = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);

	if (outbox != NULL)
		TideCheckConsumeOutbox(userid, group, outbox);
	else
	{
		if (!has_every_right(userid))
			refuse_consume(userid, group);
		check_pipeline_group(group);
	}
	return outbox;
}

/*
 * Trigger on the grants tables, relay_outbox_config, tide_outbox_config
 * (src/admission_cache.c) and relay_inbox_handlers (src/inbox_wake.c):
 * every backend forgets its cached answers when the change commits (this
 * one at once).
 */
Datum
tide_rights_changed(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		elog(ERROR, "tide_rights_changed: not called as a trigger");
	CacheInvalidateRelcacheByRelid(RelationGetRelid(trigdata->tg_relation));
	return PointerGetDatum(NULL);
}
