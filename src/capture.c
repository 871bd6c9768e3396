/*
 * capture.c
 *		Change capture's triggers (docs/capture.md): a row trigger that
 *		publishes each INSERT, UPDATE and DELETE of a captured table into an
 *		outbox in the writer's transaction, and a TRUNCATE trigger that
 *		refuses the TRUNCATE or publishes it as one event.
 *
 * tide.outbox_capture (src/capture_admin.c) creates one trigger per
 * operation, with the capture's WHEN condition, and gives each two
 * arguments: the outbox and the normalised options (src/capture_options.c).
 * A backend reads the options once per trigger and keeps them until the
 * trigger's arguments change.
 *
 * For each row:
 * 1. An UPDATE that changed nothing but columns of "ignore_changes_of"
 *	  publishes nothing.
 * 2. The row becomes jsonb as to_jsonb(NEW) would make it, read with the
 *	  table's tuple descriptor of now, so that a column added or dropped
 *	  since the capture began is in the payload or not, like in the table
 *	  (src/capture_row.c: the columns' conversions are kept per trigger
 *	  and made again after a relcache invalidation of the table).
 * 3. The payload {"op", "table", "key", "new", "old"} is built from it
 *	  without the "ignore" columns; the key (the row's values of the key
 *	  columns, the old row's on DELETE) is also the message's header
 *	  "key", on which a pipeline orders with "ordering_key": "key".
 * 4. The message is published through tide.outbox_publish's own C entry
 *	  point, called directly (no SQL), as the table's owner: a writer of
 *	  the table publishes what its owner decided to publish, not where the
 *	  writer could not (docs/security.md#change-capture).
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/partition.h"
#include "catalog/pg_class.h"
#include "commands/trigger.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/syscache.h"

#include "capture.h"

PG_FUNCTION_INFO_V1(tide_capture_row);
PG_FUNCTION_INFO_V1(tide_capture_truncate);

/* What a backend keeps of one capture trigger. */
typedef struct CaptureTrigger
{
	Oid			tgoid;			/* hash key */
	char	   *args;			/* the options' text it was read from */
	MemoryContext context;		/* holds everything below */
	CaptureOptions options;
	Oid			relid;			/* the table the trigger is on */
	Oid			table;			/* the captured table: a partition's captured ancestor */
	MemoryContext columns_context;	/* holds columns, a child of context */
	CaptureRowColumns *columns; /* the table's columns; NULL: to be made */
	bool		columns_valid;	/* false after a relcache invalidation of relid */
} CaptureTrigger;

static HTAB *capture_triggers = NULL;

/*
 * Relcache callback: the columns of a table (of every table, for a reset)
 * are made again at the next row. Only marks them: a conversion may be in
 * progress when an invalidation is taken in.
 */
static void
capture_relcache_callback(Datum arg, Oid relid)
{
	HASH_SEQ_STATUS seq;
	CaptureTrigger *entry;

	if (capture_triggers == NULL)
		return;
	hash_seq_init(&seq, capture_triggers);
	while ((entry = hash_seq_search(&seq)) != NULL)
		if (!OidIsValid(relid) || entry->relid == relid)
			entry->columns_valid = false;
}

/* The trigger's arguments: the outbox and the options' text. */
static void
trigger_args(Trigger *trigger, char **outbox, char **options)
{
	if (trigger->tgnargs != 2)
		elog(ERROR, "capture trigger \"%s\" must have two arguments", trigger->tgname);
	*outbox = trigger->tgargs[0];
	*options = trigger->tgargs[1];
}

/*
 * The table whose capture the trigger belongs to: the table itself, or for
 * a partition (whose trigger is a clone of its parent's, of the same name)
 * the topmost ancestor that has the trigger, the one that was captured.
 */
static Oid
captured_table(Trigger *trigger, Relation rel)
{
	Oid			table = RelationGetRelid(rel);
	ListCell   *lc;

	if (!rel->rd_rel->relispartition)
		return table;
	foreach(lc, get_partition_ancestors(table))
		if (OidIsValid(get_trigger_oid(lfirst_oid(lc), trigger->tgname, true)))
			table = lfirst_oid(lc);
	return table;
}

/*
 * What the backend keeps of the trigger, read again when its options
 * changed (or its oid now names a trigger of another table).
 */
static CaptureTrigger *
capture_trigger(Trigger *trigger, Relation rel)
{
	char	   *outbox;
	char	   *args;
	CaptureTrigger *entry;
	bool		found;
	MemoryContext old;

	trigger_args(trigger, &outbox, &args);
	if (capture_triggers == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(Oid);
		ctl.entrysize = sizeof(CaptureTrigger);
		ctl.hcxt = CacheMemoryContext;
		capture_triggers = hash_create("pg_tide capture triggers", 16, &ctl,
									   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
		CacheRegisterRelcacheCallback(capture_relcache_callback, (Datum) 0);
	}
	entry = hash_search(capture_triggers, &trigger->tgoid, HASH_ENTER, &found);
	if (found && entry->context != NULL)
	{
		if (strcmp(entry->args, args) == 0 && entry->relid == RelationGetRelid(rel))
			return entry;
		MemoryContextDelete(entry->context);
	}
	entry->context = NULL;
	{
		MemoryContext context = AllocSetContextCreate(CacheMemoryContext, "pg_tide capture trigger",
													  ALLOCSET_SMALL_SIZES);

		old = MemoryContextSwitchTo(context);
		CaptureParseOptions(DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(args))),
							&entry->options);
		entry->args = pstrdup(args);
		MemoryContextSwitchTo(old);
		entry->relid = RelationGetRelid(rel);
		entry->table = captured_table(trigger, rel);
		entry->columns_context = AllocSetContextCreate(context, "pg_tide capture columns",
													   ALLOCSET_SMALL_SIZES);
		entry->columns = NULL;
		entry->context = context;
	}
	return entry;
}

/* The table's columns as the trigger converts them, made again when the table changed. */
static CaptureRowColumns *
capture_columns(CaptureTrigger *entry, Relation rel)
{
	if (entry->columns == NULL || !entry->columns_valid)
	{
		MemoryContextReset(entry->columns_context);
		entry->columns = NULL;
		/* an invalidation taken in from here on makes them again at the next row */
		entry->columns_valid = true;
		entry->columns = CaptureRowColumnsFor(RelationGetDescr(rel), entry->columns_context);
	}
	return entry->columns;
}

/* Whether the name is in the list of names. */
static bool
names_contain(List *names, const char *name)
{
	ListCell   *lc;

	foreach(lc, names)
		if (strcmp(lfirst(lc), name) == 0)
			return true;
	return false;
}

/* Whether an UPDATE changed a column that is not in "ignore_changes_of". */
static bool
changed_beyond_ignored(Relation rel, HeapTuple old_tuple, HeapTuple new_tuple, List *ignored)
{
	TupleDesc	desc = RelationGetDescr(rel);

	if (ignored == NIL)
		return true;
	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		bool		old_null;
		bool		new_null;
		Datum		old_value;
		Datum		new_value;

		if (att->attisdropped || names_contain(ignored, NameStr(att->attname)))
			continue;
		old_value = heap_getattr(old_tuple, att->attnum, desc, &old_null);
		new_value = heap_getattr(new_tuple, att->attnum, desc, &new_null);
		if (old_null != new_null)
			return true;
		if (!old_null && !datum_image_eq(old_value, new_value, att->attbyval, att->attlen))
			return true;
	}
	return false;
}

/* The row as to_jsonb() makes it. */
static Jsonb *
row_jsonb(CaptureTrigger *entry, Relation rel, HeapTuple tuple)
{
	return CaptureRowJsonb(capture_columns(entry, rel), RelationGetDescr(rel), tuple);
}

/* A JSON string value. */
static JsonbValue *
string_value(JsonbValue *value, const char *text)
{
	value->type = jbvString;
	value->val.string.val = (char *) text;
	value->val.string.len = strlen(text);
	return value;
}

/* Pushes a jsonb as the value of the key being built. */
static void
push_jsonb(JsonbParseState **state, Jsonb *jsonb)
{
	JsonbValue	value;

	value.type = jbvBinary;
	value.val.binary.data = &jsonb->root;
	value.val.binary.len = VARSIZE(jsonb) - VARHDRSZ;
	pushJsonbValue(state, WJB_VALUE, &value);
}

/* Raises the error of a key column that the captured table no longer has (renamed). */
void
CaptureRefuseMissingKey(const char *table, const char *column)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("captured table \"%s\" has no key column \"%s\"", table, column),
			 errhint("Capture the table again with tide.outbox_uncapture() and tide.outbox_capture() naming its key.")));
}

/* The key columns' values of the row, as an object. */
static Jsonb *
key_jsonb(CaptureOptions *options, Oid table, Jsonb *row)
{
	JsonbParseState *state = NULL;
	ListCell   *lc;

	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	foreach(lc, options->key)
	{
		JsonbValue	name;
		JsonbValue *value;

		string_value(&name, lfirst(lc));
		value = findJsonbValueFromContainer(&row->root, JB_FOBJECT, &name);
		if (value == NULL)
			CaptureRefuseMissingKey(get_rel_name(table), lfirst(lc));
		pushJsonbValue(&state, WJB_KEY, &name);
		pushJsonbValue(&state, WJB_VALUE, value);
	}
	return JsonbValueToJsonb(pushJsonbValue(&state, WJB_END_OBJECT, NULL));
}

/* Pushes the row's object without the "ignore" columns. */
static void
push_row(JsonbParseState **state, Jsonb *row, List *ignore)
{
	JsonbIterator *it;
	JsonbValue	value;
	JsonbIteratorToken token;
	bool		skip = false;

	if (ignore == NIL)
	{
		push_jsonb(state, row);
		return;
	}
	it = JsonbIteratorInit(&row->root);
	while ((token = JsonbIteratorNext(&it, &value, true)) != WJB_DONE)
	{
		if (token == WJB_KEY)
		{
			skip = names_contain(ignore, pnstrdup(value.val.string.val, value.val.string.len));
			if (skip)
				continue;
		}
		else if (token == WJB_VALUE && skip)
			continue;
		pushJsonbValue(state, token, token == WJB_BEGIN_OBJECT || token == WJB_END_OBJECT ? NULL : &value);
	}
}

/*
 * The "key" header: a one-column key's value (a string as it is, another
 * value as JSON), or the JSON of the key object.
 */
static char *
key_text(Jsonb *key)
{
	JsonbValue	value;

	if (JsonContainerSize(&key->root) == 1)
	{
		JsonbIterator *it = JsonbIteratorInit(&key->root);

		while (JsonbIteratorNext(&it, &value, true) != WJB_VALUE)
			;
		if (value.type == jbvString)
			return pnstrdup(value.val.string.val, value.val.string.len);
		if (value.type != jbvBinary)
			return JsonbToCString(NULL, &JsonbValueToJsonb(&value)->root, 0);
	}
	return JsonbToCString(NULL, &key->root, VARSIZE(key));
}

/* The event type: the "type" option, else the table's name, then the operation. */
static char *
event_type(CaptureOptions *options, Oid table, const char *op)
{
	return psprintf("%s.%s", options->type ? options->type : get_rel_name(table), op);
}

/* The table's schema-qualified name, as the payload's "table" gives it. */
static char *
table_name(Oid table)
{
	return psprintf("%s.%s", get_namespace_name(get_rel_namespace(table)), get_rel_name(table));
}

/* The headers: the event type, and the key when there is one. */
static Jsonb *
headers_jsonb(const char *type, const char *key)
{
	JsonbParseState *state = NULL;
	JsonbValue	value;

	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	if (key != NULL)
	{
		pushJsonbValue(&state, WJB_KEY, string_value(&value, "key"));
		pushJsonbValue(&state, WJB_VALUE, string_value(&value, key));
	}
	pushJsonbValue(&state, WJB_KEY, string_value(&value, "type"));
	pushJsonbValue(&state, WJB_VALUE, string_value(&value, type));
	return JsonbValueToJsonb(pushJsonbValue(&state, WJB_END_OBJECT, NULL));
}

/* The owner of a table. */
static Oid
table_owner(Oid table)
{
	HeapTuple	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(table));
	Oid			owner;

	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for relation %u", table);
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);
	return owner;
}

/* Publishes the message as the table's owner, through tide.outbox_publish's entry point. */
static void
publish_as_owner(Oid table, const char *outbox, Jsonb *payload, Jsonb *headers)
{
	Oid			save_userid;
	int			save_sec_context;

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(table_owner(table), save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
	DirectFunctionCall3(tide_outbox_publish, CStringGetTextDatum(outbox),
						JsonbPGetDatum(payload), JsonbPGetDatum(headers));
	SetUserIdAndSecContext(save_userid, save_sec_context);
}

/*
 * Publishes one row's message: `op` with the row's new and old values
 * (either may be NULL; old goes into the payload only with "old_row").
 * Returns the key.
 */
Jsonb *
CapturePublish(Oid table, const char *outbox, CaptureOptions *options, const char *op,
			   Jsonb *new_row, Jsonb *old_row)
{
	Jsonb	   *key = key_jsonb(options, table, new_row ? new_row : old_row);
	JsonbParseState *state = NULL;
	JsonbValue	value;
	Jsonb	   *payload;

	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	pushJsonbValue(&state, WJB_KEY, string_value(&value, "op"));
	pushJsonbValue(&state, WJB_VALUE, string_value(&value, op));
	pushJsonbValue(&state, WJB_KEY, string_value(&value, "table"));
	pushJsonbValue(&state, WJB_VALUE, string_value(&value, table_name(table)));
	pushJsonbValue(&state, WJB_KEY, string_value(&value, "key"));
	push_jsonb(&state, key);
	if (new_row != NULL)
	{
		pushJsonbValue(&state, WJB_KEY, string_value(&value, "new"));
		push_row(&state, new_row, options->ignore);
	}
	if (old_row != NULL && options->old_row)
	{
		pushJsonbValue(&state, WJB_KEY, string_value(&value, "old"));
		push_row(&state, old_row, options->ignore);
	}
	payload = JsonbValueToJsonb(pushJsonbValue(&state, WJB_END_OBJECT, NULL));
	publish_as_owner(table, outbox, payload,
					 headers_jsonb(event_type(options, table, op), key_text(key)));
	return key;
}

/* SQL: tide._capture_row(), the row trigger of a captured table */
Datum
tide_capture_row(PG_FUNCTION_ARGS)
{
	TriggerData *data = (TriggerData *) fcinfo->context;
	Relation	rel;
	CaptureTrigger *entry;
	char	   *outbox;
	char	   *args;
	CaptureOp	op;
	HeapTuple	new_tuple = NULL;
	HeapTuple	old_tuple = NULL;
	Jsonb	   *new_row = NULL;
	Jsonb	   *old_row = NULL;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_FOR_ROW(data->tg_event) ||
		!TRIGGER_FIRED_AFTER(data->tg_event))
		elog(ERROR, "tide._capture_row() must be an AFTER ... FOR EACH ROW trigger");
	rel = data->tg_relation;
	trigger_args(data->tg_trigger, &outbox, &args);
	entry = capture_trigger(data->tg_trigger, rel);

	if (TRIGGER_FIRED_BY_INSERT(data->tg_event))
	{
		op = CAPTURE_INSERT;
		new_tuple = data->tg_trigtuple;
	}
	else if (TRIGGER_FIRED_BY_UPDATE(data->tg_event))
	{
		op = CAPTURE_UPDATE;
		old_tuple = data->tg_trigtuple;
		new_tuple = data->tg_newtuple;
		if (!changed_beyond_ignored(rel, old_tuple, new_tuple, entry->options.ignore_changes_of))
			return PointerGetDatum(NULL);
	}
	else
	{
		op = CAPTURE_DELETE;
		old_tuple = data->tg_trigtuple;
	}
	if (!entry->options.ops[op])
		return PointerGetDatum(NULL);

	if (new_tuple != NULL)
		new_row = row_jsonb(entry, rel, new_tuple);
	if (old_tuple != NULL && (op == CAPTURE_DELETE || entry->options.old_row))
		old_row = row_jsonb(entry, rel, old_tuple);
	CapturePublish(entry->table, outbox, &entry->options, CaptureOpNames[op], new_row, old_row);
	return PointerGetDatum(NULL);
}

/* SQL: tide._capture_truncate(), the TRUNCATE trigger: refuses it, or publishes one event */
Datum
tide_capture_truncate(PG_FUNCTION_ARGS)
{
	TriggerData *data = (TriggerData *) fcinfo->context;
	Relation	rel;
	CaptureTrigger *entry;
	char	   *outbox;
	char	   *args;
	JsonbParseState *state = NULL;
	JsonbValue	value;
	Jsonb	   *payload;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BY_TRUNCATE(data->tg_event))
		elog(ERROR, "tide._capture_truncate() must be a TRUNCATE trigger");
	rel = data->tg_relation;
	trigger_args(data->tg_trigger, &outbox, &args);
	entry = capture_trigger(data->tg_trigger, rel);
	if (!entry->options.truncate_publish)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("cannot truncate table \"%s\": its changes are captured into outbox \"%s\"",
						RelationGetRelationName(rel), outbox),
				 errhint("Remove the rows with DELETE instead, capture with \"truncate\": \"publish\", or end the capture with tide.outbox_uncapture().")));

	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	pushJsonbValue(&state, WJB_KEY, string_value(&value, "op"));
	pushJsonbValue(&state, WJB_VALUE, string_value(&value, "truncate"));
	pushJsonbValue(&state, WJB_KEY, string_value(&value, "table"));
	pushJsonbValue(&state, WJB_VALUE, string_value(&value, table_name(entry->table)));
	payload = JsonbValueToJsonb(pushJsonbValue(&state, WJB_END_OBJECT, NULL));
	publish_as_owner(entry->table, outbox, payload,
					 headers_jsonb(event_type(&entry->options, entry->table, "truncate"), NULL));
	return PointerGetDatum(NULL);
}
