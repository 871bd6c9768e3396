/*
 * pg_tide.h
 *		Declarations of src/, the code that runs in callers' transactions;
 *		the relay (relay/) uses them too. Nothing here needs relay/.
 */
#ifndef PG_TIDE_H
#define PG_TIDE_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "storage/condition_variable.h"

/* Longest outbox or consumer group name, in bytes. */
#define TIDE_MAX_NAME_BYTES 63
/* Longest consumer id or inbox event id, in bytes. */
#define TIDE_MAX_ID_BYTES 255
/* Most messages one call may publish (outbox_publish_batch). */
#define TIDE_MAX_BATCH_MESSAGES 10000

/* pg_tide.c: loading and shared memory */
extern bool TidePreloaded;
extern void TideRequirePreload(void);

/* names.c: what outbox and group names and consumer ids may be */
extern void TideValidateName(const char *kind, const char *name);
extern void TideValidateConsumerId(const char *id);

/* spi_plans.c: saved SPI plans and their results */
extern SPIPlanPtr TidePlan(SPIPlanPtr *cache, const char *sql, int nargs, Oid *argtypes);
extern SPIPlanPtr TidePlanWithOptions(SPIPlanPtr *cache, const char *sql, int nargs,
									  Oid *argtypes, int options);
extern int64 TideSpiInt64(int col, bool *isnull);
extern Datum TideSpiDatum(int col);
extern bool TideSpiBool(int col);
extern char *TideSpiText(int col);

/* catalog_version.c: the database's catalog version against the library's */
extern char *TideInstalledVersion(void);
extern int	TideCompareVersions(const char *a, const char *b);

/* limits.c: pg_tide.max_payload_bytes */
extern int	TideMaxPayloadBytes;
extern void TideDefineLimitGucs(void);
extern void TideCheckPayloadSize(Size bytes, int index);

/* outbox_rights.c: who may publish to an outbox and consume from its groups */
typedef enum TideRight
{
	TIDE_RIGHT_PUBLISH = 0,
	TIDE_RIGHT_CONSUME = 1
} TideRight;
extern bool TideInRelayWorker;
extern Oid	TideCatalogOwner(void);
extern void TideCheckPublishRight(Oid userid, const char *outbox);
extern char *TideCheckConsumeRight(Oid userid, const char *group);
extern void TideCheckConsumeOutbox(Oid userid, const char *group, const char *outbox);

/* tracker.c: commit-order-safe publish tracker */
extern Size TrackerShmemSize(void);
extern void TrackerShmemInit(void *place, bool found);
extern void TrackerRegisterXactCallback(void);
extern int64 TrackerSafeHorizon(void);
extern int64 TrackerSequenceLastValue(void);
extern int64 TrackerNextMessageId(void);
extern Oid	TrackerSequenceOid(void);

/* consumer.c: consumer groups, pg_tide.wait_recheck_ms */
extern void TideDefineConsumerGucs(void);
/*
 * A message a poll leased (TidePoll): headers is 0 when they are null;
 * expired when its expires_at had passed at the poll.
 */
typedef void (*TidePolledMessage) (void *arg, int64 id, Datum payload, Datum headers,
								   TimestampTz created_at, bool expired);
extern int	TidePoll(const char *group, const char *consumer, int batch_size, int visibility,
					 TidePolledMessage each, void *each_arg);
extern int	TidePollAhead(const char *group, const char *consumer, int64 after, int batch_size,
						  int visibility, TidePolledMessage each, void *each_arg);
extern bool TideGroupHasMessages(const char *group);
extern void TideGroupsWithMessages(int n, const char *const *groups, const char *const *consumers,
								   bool *found);
extern bool TideLockOwnLease(Datum group, Datum consumer, int64 *start, int64 *end);

/* direct_insert.c: one message into a child table without the executor; false: use SQL */
extern bool TideDirectInsert(Oid relid, int64 id, Datum outbox, Datum payload, Datum headers,
							 bool headers_null, Datum expires_at, bool expires_at_null);

/* commit.c: acknowledging a consumer's lease, as its owner (under SPI) */
extern void TideCommitOffset(Datum group, Datum consumer, bool last_isnull, int64 last);

/* wake.c: wake on commit */
extern Size WakeShmemSize(void);
extern void WakeShmemInit(void *place, bool found);
extern void WakeDatabase(Oid dboid);
extern ConditionVariable *WakeConditionVariable(Oid dboid);
extern uint64 WakeCommitCount(Oid dboid);

#endif							/* PG_TIDE_H */
