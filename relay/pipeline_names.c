/*
 * pipeline_names.c
 *		A pipeline's name is unique across both directions: a forward
 *		pipeline (tide.relay_outbox_config) and a reverse one
 *		(tide.relay_inbox_config) never share a name, because health,
 *		counters, offsets and status are keyed by the name alone.
 *
 * Each table's primary key keeps names unique within it; across the two,
 * the row trigger (pipeline_config.c) and the set functions check the
 * other table. Two transactions that create one name in the two tables at
 * once would each miss the other's uncommitted row, so the check first
 * takes a transaction-level advisory lock on the name: the second waits
 * until the first ends and then, in a fresh snapshot, sees its row.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "utils/builtins.h"

#include "pg_tide.h"
#include "reverse_config.h"

PG_FUNCTION_INFO_V1(tide_relay_check_pipeline_name);

/*
 * The first key of the transaction-level advisory lock on a pipeline name
 * being created: pg_locks shows it as classid, with the name's hashtext as
 * objid. The ASCII of "tidn".
 */
#define RELAY_PIPELINE_NAME_LOCK_KEY	0x7469646e

/* See reverse_config.h. */
void
RelayCheckPipelineNameFree(const char *name, bool reverse)
{
	static SPIPlanPtr lock_plan = NULL;
	static SPIPlanPtr forward_plan = NULL;
	static SPIPlanPtr reverse_plan = NULL;
	Oid			lock_types[2] = {INT4OID, TEXTOID};
	Oid			name_types[1] = {TEXTOID};
	Datum		lock_args[2];
	Datum		name_args[1];
	bool		taken;

	lock_args[0] = Int32GetDatum(RELAY_PIPELINE_NAME_LOCK_KEY);
	lock_args[1] = name_args[0] = CStringGetTextDatum(name);
	SPI_connect();
	if (SPI_execute_plan(TidePlan(&lock_plan,
								  "SELECT pg_catalog.pg_advisory_xact_lock($1, pg_catalog.hashtext($2))",
								  2, lock_types),
						 lock_args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not lock pipeline name \"%s\"", name);
	/* read-write: a snapshot taken after the lock, in READ COMMITTED */
	if (SPI_execute_plan(reverse ?
						 TidePlan(&forward_plan,
								  "SELECT FROM tide.relay_outbox_config WHERE name OPERATOR(pg_catalog.=) $1",
								  1, name_types) :
						 TidePlan(&reverse_plan,
								  "SELECT FROM tide.relay_inbox_config WHERE name OPERATOR(pg_catalog.=) $1",
								  1, name_types),
						 name_args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the pipelines");
	taken = SPI_processed > 0;
	SPI_finish();
	if (taken)
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("pipeline \"%s\" already exists as a %s pipeline", name,
						reverse ? "forward" : "reverse"),
				 errhint("Pipeline names are unique across both directions: choose another name, or delete the %s pipeline with tide.relay_delete().",
						 reverse ? "forward" : "reverse")));
}

/*
 * tide._relay_check_pipeline_name(p_name text, p_reverse boolean): what
 * relay_set_outbox (false) and relay_set_inbox (true) check first.
 */
Datum
tide_relay_check_pipeline_name(PG_FUNCTION_ARGS)
{
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		PG_RETURN_VOID();
	RelayCheckPipelineNameFree(text_to_cstring(PG_GETARG_TEXT_PP(0)), PG_GETARG_BOOL(1));
	PG_RETURN_VOID();
}
