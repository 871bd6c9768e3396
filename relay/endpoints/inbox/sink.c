/*
 * sink.c
 *		The inbox sink: a forward pipeline that writes an outbox's messages
 *		into an inbox of the same database, exactly once. Its config:
 *		"inbox" (required) and "event_id_header" (optional); see
 *		docs/sinks/inbox.md.
 *
 * Nothing crosses a network, so nothing is sent between the lease and the
 * record: `start` reports every message delivered at once, and the real
 * work is `store` (sink.h), which runs inside the transaction that records
 * the batch, before the pipeline's offset moves:
 *
 * 1. Look up the inbox's table and the pipeline's owner, and whether the
 *	  owner may write the inbox as tide.inbox_receive would (USAGE on the
 *	  schema, INSERT on the table, EXECUTE on tide.inbox_receive); the
 *	  answer is kept until an invalidation (of a relation, schema,
 *	  function, role or membership) may have changed it. A
 *	  missing inbox or a missing right is the destination's condition, not
 *	  a message's: it is raised as 55000, which holds the pipeline (the
 *	  worker tries again later) instead of dead-lettering its messages.
 * 2. Lock the table (ROW EXCLUSIVE, as the insert would) and see that it
 *	  was not dropped meanwhile.
 * 3. As the owner (never as the superuser the worker is: a trigger of the
 *	  inbox's table runs with the owner's rights, in a restricted operation
 *	  whose setting changes are undone), one set-based INSERT ... SELECT
 *	  FROM unnest(...) ON CONFLICT (event_id) DO NOTHING, in the messages'
 *	  order: event id "outbox_<outbox>:<id>" (the message identity every
 *	  sink gives) or the value of the header the config names, source the
 *	  pipeline's name, payload and headers as published.
 *
 * An inbox with a handler (src/inbox_wake.c) is looked at by the relay
 * when that transaction commits, as after tide.inbox_receive.
 *
 * The inbox rows and the offset commit together, so a crash before the
 * commit loses both and the batch is leased and written again, and after
 * it neither is repeated; a message written again all the same (an
 * operator's relay_dlq_retry of a message the inbox holds, a replay)
 * changes nothing, its event id being known. A message the table refuses
 * (a CHECK, a trigger, a header without the event id) makes the record
 * fail; the batch is then recorded message by message and that message is
 * dead-lettered with error class "record" (record_each.c).
 */
#include "postgres.h"

#include <cjson/cJSON.h>

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/syscache.h"

#include "config_value.h"
#include "endpoints/registry.h"
#include "inbox.h"
#include "inbox_wake.h"

/* An inbox pipeline's settings, from its config, and its insert's plan. */
typedef struct InboxSink
{
	char	   *inbox;
	char	   *event_id_header;	/* NULL: the message identity */
	Oid			plan_relid;		/* the table insert_plan writes; InvalidOid: none */
	SPIPlanPtr	insert_plan;
	RelayInboxTarget target;	/* the last lookup, writable, ... */
	uint64		target_generation;	/* ... as of rights_generation; 0: none */
} InboxSink;

/*
 * Bumped by every invalidation that can change a lookup's answer: a
 * relation's (a table dropped, a grant on it), a schema's, a function's, a
 * role's or a role membership's. A lookup is kept while it stays the same.
 */
static uint64 rights_generation = 1;
static bool rights_callbacks = false;

/* What a batch came to, between `start` and `outcomes`. */
typedef struct InboxBatch
{
	RelayMessageOutcome *each;
} InboxBatch;

/* The pipeline's settings. */
static bool
inbox_open(const cJSON *config, RelaySinkOpened *opened)
{
	InboxSink  *sink;

	if (!cJSON_IsString(RelayConfigMember(config, "inbox")))
	{
		opened->error = "its config has no \"inbox\"";
		return false;
	}
	sink = palloc0(sizeof(InboxSink));
	sink->inbox = RelayConfigString(config, "inbox");
	if (cJSON_IsString(RelayConfigMember(config, "event_id_header")))
		sink->event_id_header = RelayConfigString(config, "event_id_header");
	opened->state = sink;
	return true;
}

/* Every message is delivered: `store` writes them when the batch is recorded. */
static void
inbox_start(void *state, RelaySinkBatch *batch)
{
	InboxBatch *ib = palloc0(sizeof(InboxBatch));

	ib->each = palloc0(sizeof(RelayMessageOutcome) * Max(batch->nmsgs, 1));
	for (int i = 0; i < batch->nmsgs; i++)
	{
		ib->each[i].outcome = RELAY_DELIVERED;
		ib->each[i].wait_ms = -1;
	}
	batch->sink_private = ib;
}

static bool
inbox_progress(void *state, RelaySinkBatch *batch)
{
	return true;
}

static void
inbox_outcomes(void *state, RelaySinkBatch *batch, RelayDeliveryResult *result)
{
	InboxBatch *ib = batch->sink_private;

	memcpy(result->each, ib->each, sizeof(RelayMessageOutcome) * batch->nmsgs);
}

/* Nothing is left in flight once `start` returned. */
static void
inbox_cancel(void *state, RelaySinkBatch *batch)
{
}

/* Frees the insert's plan. */
static void
inbox_close(void *state)
{
	InboxSink  *sink = state;

	if (sink->insert_plan != NULL)
		SPI_freeplan(sink->insert_plan);
	sink->insert_plan = NULL;
}

/*
 * The event id of message m: its identity, or the value of the header the
 * config names, which must be a string that tide.inbox_receive would take
 * as an event id; an ERROR (the message's) when it is not.
 */
static char *
event_id(const InboxSink *sink, const RelayMessage *m)
{
	cJSON	   *headers;
	const cJSON *v;
	char	   *id = NULL;
	char		identity[RELAY_IDENTITY_SIZE];

	if (sink->event_id_header == NULL)
	{
		RelayMessageIdentity(identity, sizeof(identity), m->outbox, m->id);
		return pstrdup(identity);
	}
	headers = m->headers ? cJSON_Parse(m->headers) : NULL;
	v = cJSON_GetObjectItemCaseSensitive(headers, sink->event_id_header);
	if (cJSON_IsString(v) && v->valuestring[0] != '\0' && strlen(v->valuestring) <= 255)
		id = pstrdup(v->valuestring);
	cJSON_Delete(headers);
	if (id == NULL || RelayConfigMatches(id, "[[:cntrl:]]"))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("message " INT64_FORMAT " of outbox \"%s\" has no event id in header \"%s\"",
						m->id, m->outbox, sink->event_id_header),
				 errhint("Publish it with that header set to a string of 1 to 255 bytes without control characters.")));
	return id;
}

/* A text[] of n elements, nulls where nulls[i] (nulls NULL: none). */
static Datum
text_array(Datum *elems, bool *nulls, int n)
{
	int			dims[1] = {n};
	int			lbs[1] = {1};

	return PointerGetDatum(construct_md_array(elems, nulls, 1, dims, lbs, TEXTOID, -1, false,
											  TYPALIGN_INT));
}

/*
 * The plan of the insert into table t->table (oid t->relid), kept in sink.
 * Its rows come from one function scan, which returns them in the arrays'
 * order, so the inbox's ids follow the messages' without a sort (a sort
 * cost a tenth of the relay's time in bench/inbox_sink.sh).
 */
static SPIPlanPtr
insert_plan(InboxSink *sink, const RelayInboxTarget *t)
{
	Oid			types[4] = {TEXTOID, TEXTARRAYOID, TEXTARRAYOID, TEXTARRAYOID};
	SPIPlanPtr	plan;

	if (sink->insert_plan != NULL && sink->plan_relid == t->relid)
		return sink->insert_plan;
	if (sink->insert_plan != NULL)
		SPI_freeplan(sink->insert_plan);
	sink->insert_plan = NULL;
	plan = SPI_prepare(psprintf("INSERT INTO %s (event_id, source, payload, headers)"
								" SELECT u.event_id, $1, u.payload::pg_catalog.jsonb, u.headers::pg_catalog.jsonb"
								"   FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3), pg_catalog.unnest($4))"
								"        AS u(event_id, payload, headers)"
								" ON CONFLICT (event_id) DO NOTHING", t->table),
					   4, types);
	if (plan == NULL)
		elog(ERROR, "could not prepare the insert into inbox \"%s\": %s", sink->inbox,
			 SPI_result_code_string(SPI_result));
	SPI_keepplan(plan);
	sink->insert_plan = plan;
	sink->plan_relid = t->relid;
	return plan;
}

/* A syscache invalidation: lookups are done again. */
static void
rights_changed(Datum arg, int cacheid, uint32 hashvalue)
{
	rights_generation++;
}

/* A relcache invalidation: lookups are done again. */
static void
relation_changed(Datum arg, Oid relid)
{
	rights_generation++;
}

/*
 * The inbox's table, locked as the insert locks it, and the pipeline's
 * owner, who may write it (steps 1 and 2 at the top of this file): looked
 * up again after any invalidation that can change the answer, else kept
 * from the last batch. An ERROR (55000) when the inbox is missing or its
 * owner may not write it.
 */
static const RelayInboxTarget *
writable_target(InboxSink *sink, const char *pipeline)
{
	RelayInboxTarget *t = &sink->target;

	if (!rights_callbacks)
	{
		CacheRegisterRelcacheCallback(relation_changed, (Datum) 0);
		CacheRegisterSyscacheCallback(NAMESPACEOID, rights_changed, (Datum) 0);
		CacheRegisterSyscacheCallback(PROCOID, rights_changed, (Datum) 0);
		CacheRegisterSyscacheCallback(AUTHOID, rights_changed, (Datum) 0);
		CacheRegisterSyscacheCallback(AUTHMEMROLEMEM, rights_changed, (Datum) 0);
		rights_callbacks = true;
	}
	/*
	 * Taking the lock reads the invalidations that came meanwhile: look
	 * again, once. A lookup made in this transaction after the lock is
	 * current for it; should invalidations keep coming, the next batch looks
	 * again (target_generation is as of before the lookup).
	 */
	for (int tries = 0; tries < 2 && sink->target_generation != rights_generation; tries++)
	{
		uint64		generation = rights_generation;
		MemoryContext old = MemoryContextSwitchTo(GetMemoryChunkContext(sink));

		sink->target_generation = 0;
		if (t->table != NULL)
			pfree(t->table);
		RelayInboxLookup(sink->inbox, InvalidOid, pipeline, t);
		MemoryContextSwitchTo(old);
		if (OidIsValid(t->relid))
		{
			LockRelationOid(t->relid, RowExclusiveLock);
			if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(t->relid)))
				t->relid = InvalidOid;
		}
		if (!OidIsValid(t->relid))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("inbox \"%s\" does not exist", sink->inbox),
					 errdetail("Pipeline \"%s\" is held until it can write the inbox.", pipeline),
					 errhint("Create the inbox with tide.inbox_create(), or name another one with tide.relay_set_outbox().")));
		if (!OidIsValid(t->role) || !t->writable)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("the owner of pipeline \"%s\" may not write inbox \"%s\"", pipeline, sink->inbox),
					 errdetail("Pipeline \"%s\" is held until it can write the inbox.", pipeline),
					 errhint("Grant the pipeline's owner tide_consumer (or USAGE on the schema of %s, INSERT on it and EXECUTE on tide.inbox_receive), or set the pipeline again as a role that may write the inbox.",
							 t->table)));
		sink->target_generation = generation;
	}
	return t;
}

/* Writes the delivered messages into the inbox: see the top of this file. */
static void
inbox_store(void *state, const char *pipeline, const RelayMessage *msgs, int nmsgs)
{
	InboxSink  *sink = state;
	const RelayInboxTarget *t;
	Datum	   *ids = palloc(sizeof(Datum) * nmsgs);
	Datum	   *payloads = palloc(sizeof(Datum) * nmsgs);
	Datum	   *headers = palloc(sizeof(Datum) * nmsgs);
	bool	   *headers_null = palloc(sizeof(bool) * nmsgs);
	Datum		values[4];
	Oid			save_userid;
	int			save_sec;
	int			save_nestlevel;

	/*
	 * A kept lookup's lock went with the last batch's transaction: lock
	 * again, and look again if that brought an invalidation.
	 */
	t = writable_target(sink, pipeline);
	LockRelationOid(t->relid, RowExclusiveLock);
	if (sink->target_generation != rights_generation)
		t = writable_target(sink, pipeline);

	for (int i = 0; i < nmsgs; i++)
	{
		ids[i] = CStringGetTextDatum(event_id(sink, &msgs[i]));
		payloads[i] = CStringGetTextDatum(msgs[i].payload ? msgs[i].payload : "null");
		headers_null[i] = msgs[i].headers == NULL;
		headers[i] = msgs[i].headers ? CStringGetTextDatum(msgs[i].headers) : (Datum) 0;
	}
	values[0] = CStringGetTextDatum(pipeline);
	values[1] = text_array(ids, NULL, nmsgs);
	values[2] = text_array(payloads, NULL, nmsgs);
	values[3] = text_array(headers, headers_null, nmsgs);

	/*
	 * As the owner, in a restricted operation; an ERROR's abort puts the
	 * user and the settings back, as these lines do after a success.
	 */
	GetUserIdAndSecContext(&save_userid, &save_sec);
	SetUserIdAndSecContext(t->role, save_sec | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	save_nestlevel = NewGUCNestLevel();
	if (SPI_execute_plan(insert_plan(sink, t), values, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not write into inbox \"%s\"", sink->inbox);
	AtEOXact_GUC(false, save_nestlevel);
	SetUserIdAndSecContext(save_userid, save_sec);
	/* new events for the inbox's handler, if it has one: the relay looks at commit */
	if (SPI_processed > 0)
		InboxWakeAtCommit(sink->inbox);
}

/*
 * The routine and init symbol of the inbox sink, built into pg_tide.so
 * (endpoints/registry.h). Failures are logged by default: the inbox keeps
 * what was delivered, an attempt row each would double it. Nothing waits
 * on a network: what a batch costs beyond its rows (its lease, its record,
 * two commits) is spread over more rows by default (bench/inbox_sink.sh:
 * 0.46 of a plain INSERT ... SELECT in batches of 100, 0.60 in batches of
 * 1,000).
 */
RELAY_SINK_ENDPOINT(inbox, RelayInboxConfigKeys, RelayInboxValidate,
					.log_failures_by_default = true,
					.default_batch_size = 1000,
					.close = inbox_close,
					.store = inbox_store);
