/*
 * relay_xact.h
 *		What the relay worker's flows and jobs use of its process: short
 *		transactions and their groups (xact.c), the extension's lock
 *		(extension_lock.c), the session (session.c, worker_settings.c),
 *		which pipelines this worker serves (ownership.c), restores
 *		(restore.c), the sweeps (retention.c) and its memory
 *		(worker_memory.c).
 */
#ifndef TIDE_RELAY_XACT_H
#define TIDE_RELAY_XACT_H

#include "postgres.h"

#include "nodes/nodes.h"
#include "storage/ipc.h"
#include "storage/lockdefs.h"
#include "storage/pmsignal.h"
#include "utils/jsonb.h"

/*
 * The first key of the session-level advisory lock a worker holds on each
 * pipeline it serves (ownership.c): pg_locks shows it as classid, with the
 * pipeline's name hash as objid and objsubid 2, as pg_try_advisory_lock(int,
 * int) would take it. The ASCII of "tide".
 */
#define RELAY_PIPELINE_LOCK_KEY	0x74696465
/*
 * The first key of the shared session-level advisory lock that a session
 * restoring a database holds (restore.c): pg_locks shows it as classid,
 * with objid 0 and objsubid 2. The ASCII of "tidr".
 */
#define RELAY_RESTORE_LOCK_KEY	0x74696472

/* json_text.c: jsonb as jsonb_out's text, in cxt */
extern char *RelayJsonbText(Jsonb *jb, MemoryContext cxt);

/* retention.c */
extern int	SweepIntervalSecs;
extern void RelaySweepOutboxes(void);
extern bool RelaySweepHasMore(void);

/* worker_memory.c */
extern void RelayKeepFreedMemory(void);
extern void RelayReturnMemoryWhenIdle(int in_flight, long *timeout);

/*
 * A worker that never sleeps (a backlog, a slow receiver) would not notice
 * the postmaster's death in WaitLatch; it checks between batches, so an
 * orphan stops at once and never delays the restart of the server.
 */
static inline void
RelayExitIfPostmasterDied(void)
{
	if (!PostmasterIsAlive())
		proc_exit(1);
}

/* session.c */
extern void RelayPinSessionSettings(void);

/* worker_settings.c */
extern void RelayReloadConfig(void);
extern void RelayApplyDatabaseSettings(void);

/* ownership.c */
extern bool RelayServesPipeline(const char *name);
extern void RelayKeepPipeline(const char *name);
extern void RelayReleaseUnservedPipelines(void);
extern bool RelayWorkerRetired(void);

/* extension_lock.c: the worker's lock order against DROP EXTENSION */
typedef enum RelayExtensionTurn
{
	RELAY_EXTENSION_LOCKED,		/* held until RelayUnlockExtension */
	RELAY_EXTENSION_BUSY,		/* a DROP EXTENSION holds or awaits it */
	RELAY_EXTENSION_ABSENT		/* pg_tide is not installed */
} RelayExtensionTurn;
extern RelayExtensionTurn RelayLockExtensionForTurn(void);
extern bool RelayExtensionLockedForXact(void);
extern void RelayExtensionLockAborted(void);
extern bool RelayUnlockExtension(void);

/* restore.c: no relay while a restore loads the database */
extern void RelayNoteSessionSetting(Node *parsetree);
extern bool RelayRestoreInProgress(void);
extern int	RelayBeginRestoreCopy(Node *parsetree);
extern void RelayEndRestoreCopy(int nest);
extern void RelayAdoptRestoredChild(Node *parsetree);

/* xact.c */
extern void RelayBeginShortXact(const char *activity);
extern void RelayEndShortXact(MemoryContext cxt);
extern void RelayAbortShortXact(void);
extern void RelayBeginXactGroup(void);
extern void RelayEndXactGroup(void);
extern bool RelayTryLockTable(const char *relname, LOCKMODE mode);
extern void RelayAfterCommitAborted(void);


/* units.c: how often the worker reads its units without being asked */
extern int	RelayNaptimeMs;

#endif							/* TIDE_RELAY_XACT_H */
