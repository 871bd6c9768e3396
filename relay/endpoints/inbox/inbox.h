/*
 * inbox.h
 *		The inbox sink: a forward pipeline that writes an outbox's messages
 *		into an inbox of the same database, in the transaction that moves
 *		the pipeline's offset (sink.c), and its config's validator
 *		(config.c).
 */
#ifndef TIDE_INBOX_SINK_H
#define TIDE_INBOX_SINK_H

#include "sink.h"

/* The sink's keys beyond those of every pipeline, NULL-ended, and their validator. */
extern const char *const RelayInboxConfigKeys[];
extern void RelayInboxValidate(const cJSON *config, cJSON *out);

/* An inbox as RelayInboxLookup finds it. */
typedef struct RelayInboxTarget
{
	Oid			relid;			/* its table; InvalidOid: no such inbox or table */
	char	   *table;			/* the table's quoted, qualified name */
	Oid			role;			/* the role asked about */
	bool		writable;		/* that role may write it as tide.inbox_receive does */
} RelayInboxTarget;

/*
 * Looks up an inbox for `role`, or, role InvalidOid, for the owner of
 * pipeline `pipeline`: USAGE on the schema of its table, INSERT on the
 * table and EXECUTE on tide.inbox_receive make it writable (a superuser
 * has them). Runs SQL: inside a transaction.
 */
extern void RelayInboxLookup(const char *inbox, Oid role, const char *pipeline,
							 RelayInboxTarget *t);

#endif							/* TIDE_INBOX_SINK_H */
