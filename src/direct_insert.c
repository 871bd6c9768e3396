/*
 * direct_insert.c
 *		One published message into a child of the message table without
 *		the executor: the row through heap_insert and its one index entry
 *		through index_insert, as COPY does. The INSERT through SPI spent
 *		about a quarter of a publish in the executor's start and end
 *		(bench/RESULTS-why.md); this is what a plain INSERT pays for its
 *		row and its index entry.
 *
 * Only a table of the shape the extension makes (tide._outbox_partitions_
 * maintain: a child with the seed's columns and one index on (outbox_name,
 * id)) is written this way. For anything else the caller falls back to
 * its INSERT through SPI, which the executor checks in full: the parent
 * (a primary key and a partial index), a table with a trigger, a rule, a
 * row security policy, a CHECK or NOT NULL constraint beyond the seed's,
 * a generated or identity column, a column it does not know, or an index
 * other than one plain btree on (outbox_name, id).
 *
 * The row is what the INSERT writes: id, outbox_name, payload, headers and
 * expires_at as given, created_at the column default now() (the transaction's start),
 * consumed_at and consumer_group null. heap_insert moves a large payload
 * to TOAST, logs the row (for logical decoding too) and counts it for the
 * statistics; the command counter moves on afterwards, as it does after
 * a statement run through SPI.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/pg_am_d.h"
#include "catalog/pg_index.h"
#include "nodes/execnodes.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/timestamp.h"

#include "pg_tide.h"

/* The columns of a message row that a publish writes. */
typedef enum MessageColumn
{
	COL_ID,
	COL_OUTBOX_NAME,
	COL_PAYLOAD,
	COL_HEADERS,
	COL_EXPIRES_AT,
	COL_CREATED_AT,
	COL_NULL,					/* consumed_at, consumer_group: null */
	COL_UNKNOWN
} MessageColumn;

/* Which column of a message row `att` is; COL_UNKNOWN for one this file does not write. */
static MessageColumn
column_of(Form_pg_attribute att)
{
	const char *name = NameStr(att->attname);

	if (att->attgenerated != '\0' || att->attidentity != '\0')
		return COL_UNKNOWN;
	if (strcmp(name, "id") == 0)
		return COL_ID;
	if (strcmp(name, "outbox_name") == 0)
		return COL_OUTBOX_NAME;
	if (strcmp(name, "payload") == 0)
		return COL_PAYLOAD;
	if (strcmp(name, "headers") == 0)
		return COL_HEADERS;
	if (strcmp(name, "expires_at") == 0 && !att->attnotnull && !att->atthasdef)
		return COL_EXPIRES_AT;
	if (strcmp(name, "created_at") == 0 && att->atthasdef)
		return COL_CREATED_AT;
	if ((strcmp(name, "consumed_at") == 0 || strcmp(name, "consumer_group") == 0) &&
		!att->attnotnull && !att->atthasdef)
		return COL_NULL;
	return COL_UNKNOWN;
}

/* Whether nothing but the row and its index entries is asked of an insert. */
static bool
plain_table(Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);

	if (rel->rd_rel->relkind != RELKIND_RELATION || rel->trigdesc != NULL ||
		rel->rd_rel->relhasrules || rel->rd_rel->relrowsecurity)
		return false;
	if (desc->constr != NULL && desc->constr->num_check > 0)
		return false;
	return true;
}

/*
 * The table's one index, if it is a plain index on (outbox_name, id) ready
 * for inserts; NULL otherwise. Opened with the table's lock level.
 */
static Relation
message_index(Relation rel, AttrNumber outbox_att, AttrNumber id_att)
{
	List	   *indexes = RelationGetIndexList(rel);
	Relation	index;
	Form_pg_index form;

	if (list_length(indexes) != 1)
		return NULL;
	index = index_open(linitial_oid(indexes), RowExclusiveLock);
	form = index->rd_index;
	if (index->rd_rel->relam == BTREE_AM_OID && form->indisready &&
		!form->indisunique && !form->indisexclusion &&
		form->indnatts == 2 && form->indnkeyatts == 2 &&
		form->indkey.values[0] == outbox_att && form->indkey.values[1] == id_att &&
		RelationGetIndexExpressions(index) == NIL && RelationGetIndexPredicate(index) == NIL)
		return index;
	index_close(index, RowExclusiveLock);
	return NULL;
}

/*
 * Inserts message `id` into table `relid` when the table is of the shape
 * this file writes; false, having written nothing, when it is not.
 */
bool
TideDirectInsert(Oid relid, int64 id, Datum outbox, Datum payload, Datum headers, bool headers_null,
				 Datum expires_at, bool expires_at_null)
{
	Relation	rel = table_open(relid, RowExclusiveLock);
	TupleDesc	desc = RelationGetDescr(rel);
	Datum	   *values = palloc0(sizeof(Datum) * desc->natts);
	bool	   *nulls = palloc(sizeof(bool) * desc->natts);
	AttrNumber	outbox_att = InvalidAttrNumber;
	AttrNumber	id_att = InvalidAttrNumber;
	Relation	index;
	HeapTuple	tuple;
	Datum		key[2];
	bool		key_nulls[2] = {false, false};

	if (!plain_table(rel))
	{
		table_close(rel, NoLock);
		return false;
	}
	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		nulls[i] = true;
		if (att->attisdropped)
			continue;
		switch (column_of(att))
		{
			case COL_ID:
				values[i] = Int64GetDatum(id);
				id_att = att->attnum;
				break;
			case COL_OUTBOX_NAME:
				values[i] = outbox;
				outbox_att = att->attnum;
				break;
			case COL_PAYLOAD:
				values[i] = payload;
				break;
			case COL_HEADERS:
				values[i] = headers;
				nulls[i] = headers_null;
				continue;
			case COL_EXPIRES_AT:
				values[i] = expires_at;
				nulls[i] = expires_at_null;
				continue;
			case COL_CREATED_AT:
				values[i] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
				break;
			case COL_NULL:
				continue;
			case COL_UNKNOWN:
				table_close(rel, NoLock);
				return false;
		}
		nulls[i] = false;
	}
	if (outbox_att == InvalidAttrNumber || id_att == InvalidAttrNumber ||
		(index = message_index(rel, outbox_att, id_att)) == NULL)
	{
		table_close(rel, NoLock);
		return false;
	}

	tuple = heap_form_tuple(desc, values, nulls);
	heap_insert(rel, tuple, GetCurrentCommandId(true), 0, NULL);
	key[0] = outbox;
	key[1] = Int64GetDatum(id);
	index_insert(index, key, key_nulls, &tuple->t_self, rel, UNIQUE_CHECK_NO, false,
				 BuildIndexInfo(index));
	index_close(index, NoLock);
	table_close(rel, NoLock);
	CommandCounterIncrement();
	return true;
}
