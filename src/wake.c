/*
 * wake.c
 *		Wake on commit: whoever waits for new messages in a database is woken
 *		when a transaction that published there commits.
 *
 * Each database hashes to one of a fixed number of condition variables.
 * The publish tracker broadcasts on the database's variable at commit (not
 * at abort), after the commit is visible, so a waiter that wakes and reads
 * sees the new messages. Two databases sharing a variable only cause a
 * spurious wake-up, which waiters tolerate by checking again.
 *
 * A commit that stored events into an inbox with a handler broadcasts the
 * same variable and counts as a commit (the relay's engine looks at its
 * units after either), and in a counter of its own too (src/inbox_wake.c),
 * by which the inbox handlers tell a commit of inbox events from one of
 * outbox messages and look only after the former.
 */
#include "postgres.h"

#include "port/atomics.h"
#include "storage/condition_variable.h"

#include "inbox_wake.h"
#include "pg_tide.h"

#define WAKE_SLOTS 64

typedef struct WakeShared
{
	ConditionVariable cv[WAKE_SLOTS];
	pg_atomic_uint64 commits[WAKE_SLOTS];	/* broadcasts so far, per variable */
	pg_atomic_uint64 inbox_commits[WAKE_SLOTS]; /* of them, for inbox events */
} WakeShared;

static WakeShared *wake = NULL;

/* Shared memory for the condition variables. */
Size
WakeShmemSize(void)
{
	return sizeof(WakeShared);
}

/* Lays out the condition variables on first attach. */
void
WakeShmemInit(void *place, bool found)
{
	wake = (WakeShared *) place;
	if (found)
		return;
	for (int i = 0; i < WAKE_SLOTS; i++)
	{
		ConditionVariableInit(&wake->cv[i]);
		pg_atomic_init_u64(&wake->commits[i], 0);
		pg_atomic_init_u64(&wake->inbox_commits[i], 0);
	}
}

/* The condition variable that publishing commits in a database signal. */
ConditionVariable *
WakeConditionVariable(Oid dboid)
{
	return &wake->cv[dboid % WAKE_SLOTS];
}

/* Wakes everyone waiting for messages in a database; never raises. */
void
WakeDatabase(Oid dboid)
{
	if (wake != NULL)
	{
		pg_atomic_fetch_add_u64(&wake->commits[dboid % WAKE_SLOTS], 1);
		ConditionVariableBroadcast(WakeConditionVariable(dboid));
	}
}

/*
 * How many publishing commits have broadcast a database's variable so far;
 * a waiter that compares it before and after a sleep tells a commit from
 * any other reason to wake (a commit in a database sharing the variable
 * still counts).
 */
uint64
WakeCommitCount(Oid dboid)
{
	return wake != NULL ? pg_atomic_read_u64(&wake->commits[dboid % WAKE_SLOTS]) : 0;
}

/*
 * Wakes a database's relay for inbox events that a handler is to process;
 * never raises. Outbox waiters share the variable, look and wait again.
 */
void
WakeDatabaseInboxes(Oid dboid)
{
	if (wake != NULL)
	{
		pg_atomic_fetch_add_u64(&wake->inbox_commits[dboid % WAKE_SLOTS], 1);
		pg_atomic_fetch_add_u64(&wake->commits[dboid % WAKE_SLOTS], 1);
		ConditionVariableBroadcast(WakeConditionVariable(dboid));
	}
}

/* How many commits have stored inbox events for a handler, as WakeCommitCount. */
uint64
WakeInboxCommitCount(Oid dboid)
{
	return wake != NULL ? pg_atomic_read_u64(&wake->inbox_commits[dboid % WAKE_SLOTS]) : 0;
}
