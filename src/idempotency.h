/*
 * idempotency.h
 *		Publish-side idempotency keys (src/idempotency.c).
 */
#ifndef TIDE_IDEMPOTENCY_H
#define TIDE_IDEMPOTENCY_H

extern void IdempotencyCheckKey(const char *key, int index);
extern bool IdempotencyClaim(const char *outbox, const char *key, int64 id, int64 *first_id);
extern bool *IdempotencyClaimBatch(const char *outbox, char **keys, int count);
extern void IdempotencyRecordBatch(const char *outbox, char **keys, int64 *ids, int n);

#endif
