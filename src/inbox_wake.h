/*
 * inbox_wake.h
 *		Waking the relay for inbox events a handler is to process
 *		(src/inbox_wake.c, the counter in src/wake.c).
 */
#ifndef TIDE_INBOX_WAKE_H
#define TIDE_INBOX_WAKE_H

extern void WakeDatabaseInboxes(Oid dboid);
extern uint64 WakeInboxCommitCount(Oid dboid);
extern void InboxWakeAtCommit(const char *inbox);

#endif
