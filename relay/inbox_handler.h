/*
 * inbox_handler.h
 *		One batch of an inbox's handler (relay/inbox_handler.c).
 */
#ifndef TIDE_INBOX_HANDLER_H
#define TIDE_INBOX_HANDLER_H

/*
 * The first key of the transaction-level advisory locks that are an
 * inbox's concurrency slots (inbox_handler.c): pg_locks shows slot n of an
 * inbox as classid INBOX_HANDLER_SLOT_KEY + n, objid hashtext(inbox name),
 * objsubid 2, as pg_try_advisory_xact_lock(int, int) would take it. The
 * ASCII of "tih", then the slot.
 */
#define INBOX_HANDLER_SLOT_KEY	0x74696800

/* What one batch of a handler did. */
typedef struct InboxHandlerOutcome
{
	bool		found;			/* the inbox has an enabled handler */
	char	   *held;			/* why it cannot run now (not an event's fault), or NULL */
	bool		busy;			/* `concurrency` batches of the inbox run already */
	int			claimed;		/* events taken */
	int			processed;		/* events the handler processed */
	int			failed;			/* events it failed on */
	int			dead_lettered;	/* of them, dead-lettered */
	int			batch_size;		/* the handler's batch_size */
} InboxHandlerOutcome;

/* Why a handler cannot run (inbox_handler_rules.c). */
typedef struct InboxHandlerProblem
{
	const char *sqlstate;
	char	   *message;
	char	   *hint;
} InboxHandlerProblem;

extern void InboxHandlerRunBatch(const char *inbox, InboxHandlerOutcome *out);
extern char *InboxHandlerCheck(const char *inbox, Oid relid, Oid handler, const char *run_as,
							   bool allow_superuser, const char *owner, InboxHandlerProblem *p);

#endif
