/*
 * limits.c
 *		How large a message may be: pg_tide.max_payload_bytes, checked when
 *		a message is published (outbox.c) and when an event is received
 *		into an inbox (tide._check_payload(), called by the install script).
 *
 * The size is that of the jsonb value (its binary form, before
 * compression), read from the datum's header: the check costs the same
 * for a payload of ten bytes as for one of ten megabytes, and never
 * serialises it.
 */
#include "postgres.h"

#include "access/detoast.h"
#include "fmgr.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "pg_tide.h"

PG_FUNCTION_INFO_V1(tide_check_payload);

int			TideMaxPayloadBytes = 1024 * 1024;

/* Defines the settings of this file; called by _PG_init. */
void
TideDefineLimitGucs(void)
{
	DefineCustomIntVariable("pg_tide.max_payload_bytes",
							"Largest payload, in bytes, a message may have when it is published or received.",
							"Measured on the jsonb value; larger payloads are refused with SQLSTATE 54000.",
							&TideMaxPayloadBytes,
							1024 * 1024, 1, (int) MaxAllocSize,
							PGC_SUSET, GUC_UNIT_BYTE,
							NULL, NULL, NULL);
}

/*
 * Refuses a payload of `bytes` when it exceeds pg_tide.max_payload_bytes;
 * `index` numbers it within a batch (1-based), 0 for a single message.
 */
void
TideCheckPayloadSize(Size bytes, int index)
{
	if (bytes <= (Size) TideMaxPayloadBytes)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
			 index > 0 ? errmsg("payload %d is too large", index) : errmsg("payload is too large"),
			 errdetail("It has %zu bytes; pg_tide.max_payload_bytes is %d.",
					   bytes, TideMaxPayloadBytes),
			 errhint("Send smaller messages (a reference to large data rather than the data), "
					 "or have a superuser raise pg_tide.max_payload_bytes.")));
}

/*
 * SQL: tide._check_payload(p_payload jsonb, p_index int) raises 54000 when
 * the payload exceeds pg_tide.max_payload_bytes; NULL passes (the callers
 * refuse it with their own message).
 */
Datum
tide_check_payload(PG_FUNCTION_ARGS)
{
	/* the size without decompressing or fetching a toasted value */
	if (!PG_ARGISNULL(0))
		TideCheckPayloadSize(toast_raw_datum_size(PG_GETARG_DATUM(0)) - VARHDRSZ,
							 PG_ARGISNULL(1) ? 0 : PG_GETARG_INT32(1));
	PG_RETURN_VOID();
}
