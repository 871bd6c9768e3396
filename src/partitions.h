/*
 * partitions.h
 *		The table a publish inserts into (src/partitions.c).
 */
#ifndef TIDE_PARTITIONS_H
#define TIDE_PARTITIONS_H

#include "executor/spi.h"

/* One message, or a batch; each with or without FOR KEY SHARE and an expiry. */
#define PUBLISH_PLANS 8

typedef struct PublishTarget
{
	int64		first_id;		/* the ids the table holds */
	int64		last_id;
	char		table[NAMEDATALEN]; /* in schema tide */
	Oid			relid;
	SPIPlanPtr	plans[PUBLISH_PLANS];	/* outbox.c's INSERTs into it */
} PublishTarget;

extern int	TidePartitionSize;
extern void TideDefinePartitionGucs(void);
extern PublishTarget *PartitionTargetFor(int64 first, int64 last);
extern void TidePartitionAdopt(Oid relid);

#endif
