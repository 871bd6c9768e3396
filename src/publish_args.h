/*
 * publish_args.h
 *		What every function that puts a message on its way shares with
 *		tide.outbox_publish (src/outbox.c): its arguments checked the same
 *		way, and the caller's right to publish checked before the writes
 *		run as the catalog's owner. tide.outbox_schedule (src/schedule.c)
 *		uses them.
 */
#ifndef TIDE_PUBLISH_ARGS_H
#define TIDE_PUBLISH_ARGS_H

#include "postgres.h"

#include "fmgr.h"
#include "datatype/timestamp.h"
#include "utils/jsonb.h"

/* The outbox name at argument 0, validated (TideValidateName). */
extern char *TideOutboxNameArg(FunctionCallInfo fcinfo);

/* Refuses (22023) a JSON value that is not an object; `what` names it. */
extern void TideRequireObject(Jsonb *value, const char *what);

/*
 * The payload at argument `argno`: not null (22004, the hint beginning with
 * `verb`), an object, within pg_tide.max_payload_bytes.
 */
extern Jsonb *TidePayloadArg(FunctionCallInfo fcinfo, int argno, const char *verb);

/* The optional headers at argument `argno`, an object; NULL when absent. */
extern Jsonb *TideHeadersArg(FunctionCallInfo fcinfo, int argno);

/*
 * The optional expiry at argument `argno` into *expiry, refused (22023)
 * when not after clock_timestamp(); false when absent.
 */
extern bool TideExpiryArg(FunctionCallInfo fcinfo, int argno, TimestampTz *expiry);

/*
 * Connects SPI, checks that the caller may publish to the outbox and
 * becomes the catalog's owner; TidePublishEnd undoes both.
 */
extern void TidePublishBegin(const char *name, Oid *save_userid, int *save_sec_context);
extern void TidePublishEnd(Oid save_userid, int save_sec_context);

#endif							/* TIDE_PUBLISH_ARGS_H */
