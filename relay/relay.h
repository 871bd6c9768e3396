/*
 * relay.h
 *		Declarations of the relay: the launcher, the per-database relay
 *		workers and the shared memory they share with ordinary backends.
 */
#ifndef TIDE_RELAY_H
#define TIDE_RELAY_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "nodes/pg_list.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lockdefs.h"
#include "storage/pmsignal.h"
#include "storage/spin.h"
#include "utils/jsonb.h"

#include "filter.h"
#include "log_repeat.h"
#include "relay_init.h"
#include "sink.h"

/* How long a database's worker stays stopped after DROP/ALTER/CREATE DATABASE asked. */
#define RELAY_PAUSE_MS			10000
/* How long such a command waits for the worker to leave. */
#define RELAY_STOP_WAIT_MS		5000
/* How often the launcher looks at pg_database without being woken. */
#define RELAY_LAUNCHER_NAP_MS	3000
/* How long a database's worker is not restarted after it stopped on an error. */
#define RELAY_ERROR_BACKOFF_MS	10000
/*
 * How long a pipeline's lease outlasts its delivery (bounded by the sink's
 * timeout_ms): a batch not recorded by then is leased again.
 */
#define RELAY_LEASE_MARGIN_SECONDS	60
/*
 * The range of rate_limit.per_second: at the slowest one message every
 * 1,000 s, so that the wait for a token always fits its arithmetic.
 */
#define RELAY_MIN_RATE_PER_SECOND	0.001
#define RELAY_MAX_RATE_PER_SECOND	1000000.0
/* The longest Retry-After a receiver is obeyed for. */
#define RELAY_MAX_RETRY_AFTER_MS	3600000L
/* Databases with a pending pause or recheck request that shared memory remembers. */
#define RELAY_MAX_DB_REQUESTS	64
/* The most relay workers pg_tide.relay_workers_per_database may ask for. */
#define RELAY_MAX_WORKERS_PER_DATABASE	32
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
/* How long a database waits for a free relay worker before the launcher logs it. */
#define RELAY_UNSERVED_GRACE_MS	5000
/*
 * The longest a database without an enabled pipeline goes without a worker
 * for its periodic jobs (on_demand.c); pg_tide.sweep_interval, when shorter,
 * is the interval.
 */
#define RELAY_IDLE_LOOK_MAX_MS	60000

/* Why a worker ended, as it tells the launcher. */
typedef enum RelayExitReason
{
	RELAY_EXIT_STOPPED = 0,		/* SIGTERM, pause, or the relay switched off */
	RELAY_EXIT_NO_EXTENSION,	/* pg_tide is not installed in the database */
	RELAY_EXIT_ERROR,			/* a pass failed; restart after a back-off */
	RELAY_EXIT_IDLE				/* no enabled pipeline: back for the periodic jobs */
} RelayExitReason;

/*
 * One relay worker. The launcher claims a slot (in_use, dboid, generation)
 * before it registers the worker and frees it once the worker has ended;
 * the worker fills in pid and started_at and, when it ends, exit_reason and
 * exited. The counters are written only by the worker.
 */
typedef struct RelayWorkerSlot
{
	bool		in_use;
	bool		exited;
	Oid			dboid;
	uint32		generation;
	pid_t		pid;
	Latch	   *latch;			/* the worker's, while pid is set */
	TimestampTz registered_at;
	TimestampTz started_at;
	RelayExitReason exit_reason;
	bool		serving;		/* a pass found pg_tide installed */
	int			worker_index;	/* 0 .. relay_workers_per_database - 1 */
	bool		retiring;		/* the launcher asks it to leave between passes */
	int			npipelines;		/* pipelines it served at its last pass */
	bool		busy;			/* its last reading found an enabled pipeline */
	TimestampTz looked_at;		/* before the snapshot of its last look for one */
	pg_atomic_uint64 passes;
	pg_atomic_uint64 wakeups;
} RelayWorkerSlot;

/* A database whose worker must stay stopped for a while, or be looked at again. */
typedef struct RelayDbRequest
{
	Oid			dboid;			/* InvalidOid: free entry */
	TimestampTz paused_until;
	TimestampTz recheck_at;		/* 0: no recheck asked */
} RelayDbRequest;

typedef struct RelayShared
{
	slock_t		mutex;			/* protects everything below but the counters */
	pid_t		launcher_pid;
	Latch	   *launcher_latch;
	uint32		next_generation;
	pg_atomic_uint64 wake_requests; /* bumped at commit by SQL that changed
									 * pipelines or retry queues */
	TimestampTz recheck_all_at; /* requests overflowed: look at every database */
	bool		out_of_bgworkers;	/* the last worker could not be registered */
	RelayDbRequest requests[RELAY_MAX_DB_REQUESTS];
	int			nslots;
	RelayWorkerSlot slots[FLEXIBLE_ARRAY_MEMBER];
} RelayShared;

/* A pipeline's circuit breaker (pacing.c). */
typedef enum RelayBreakerState
{
	RELAY_BREAKER_CLOSED = 0,
	RELAY_BREAKER_OPEN,
	RELAY_BREAKER_HALF_OPEN
} RelayBreakerState;

/* A pipeline's rate limit and breaker, in the worker's memory (pacing.c). */
typedef struct RelayPacing
{
	double		tokens;			/* messages it may send now */
	TimestampTz refilled_at;	/* 0: the bucket starts full */
	RelayBreakerState breaker;
	int			failures_in_row;
	TimestampTz breaker_until;	/* open: when it turns half-open */
	long		cooldown_ms;	/* the last cooldown; doubles while probes fail */
	RelayRepeat opened;			/* from its first opening to its closing, for the log */
} RelayPacing;

/* An enabled pipeline as a pass read it from relay_outbox_config. */
typedef struct RelayPipeline
{
	char	   *name;
	char	   *outbox;
	char	   *consumer_group;
	char	   *consumer;		/* 'relay:' || name, its consumer in the group */
	int			batch_size;
	int			lease_seconds;	/* outlasts the sink's longest delivery */
	bool		strict;			/* ordering 'strict': hold at a failing message */
	bool		overlap;		/* "overlap_batches": lease the next batch while one is in flight */
	char	   *ordering_key;	/* ordering 'key': a header name or a JSON
								 * pointer (ordering.c); NULL: another ordering */
	int			retry_base_ms;	/* backoff after a failed delivery */
	int			retry_cap_ms;
	int			retry_max_attempts; /* attempts before a message is dead-lettered */
	bool		log_attempts;	/* attempt_log: a row in relay_attempts per attempt */
	bool		log_successes;	/* ... successful ones too (not "failures") */
	double		rate_per_second;	/* rate_limit.per_second; 0: no limit */
	int			rate_burst;		/* rate_limit.burst */
	int			breaker_threshold;	/* breaker.failure_threshold; 0: no breaker */
	int			breaker_cooldown_ms;
	struct RelayRouting *routing;	/* types and filter; NULL: every message */
	char	   *config_md5;		/* tells a changed config, which retries at once */
	bool		reads_secrets;	/* its open read secrets: opened again at every reading */
	const RelaySinkRoutine *sink;	/* what it delivers to */
	void	   *sink_state;		/* the sink's state of the pipeline (its open) */
	MemoryContext cxt;			/* holds the pipeline and its sink's state */
} RelayPipeline;

/* What recording a delivery does with one message of the batch. */
typedef enum RelayDisposition
{
	RELAY_KEEP = 0,				/* nothing: acknowledged live, or left as it was */
	RELAY_DONE,					/* delivered from the retry queue: leaves it */
	RELAY_REQUEUE,				/* failed: (back) into the retry queue */
	RELAY_DEAD					/* failed for good: into relay_dlq */
} RelayDisposition;

/* Everything one record transaction writes for a delivered batch. */
typedef struct RelaySettlement
{
	int64		offset_id;		/* commit the live lease up to this id; 0: none */
	TimestampTz sent_at;		/* when the batch was sent */
	const char *breaker;		/* the breaker's state after the batch, or NULL */
	int			filtered;		/* messages its routing passed over */
	bool		disable;		/* the destination asked to be disabled */
	int			n;
	const RelayMessage *msgs;
	const RelayMessageOutcome *each;
	RelayDisposition *disp;
	int		   *attempts;		/* failed attempts, this one included */
	int		   *attempt_no;		/* the attempt's number for relay_attempts; 0: not attempted */
	long	   *delay_ms;		/* RELAY_REQUEUE: when to try again */
	const char **reason;		/* RELAY_DEAD: 'permanent' or 'exhausted' */
	bool	   *unrecorded;		/* set by RelayRecordEach: dead-lettered because
								 * its outcome could not be recorded; NULL: none */
} RelaySettlement;

/* GUCs */
extern bool RelayEnabled;
extern int	AttemptLogRetentionSecs;
extern char *OperatorEventsOutbox;
extern int	SweepIntervalSecs;
extern int	RelayNaptimeMs;
extern int	RelayMaxWorkers;
extern int	RelayWorkersPerDatabase;
extern int	RelayMaxConnections;

/* launcher.c; what _PG_init calls is in relay_init.h */
extern RelayShared *Relay;
extern bool RelayDatabasePaused(Oid dboid, TimestampTz now);
extern RelayDbRequest *RelayFindRequest(Oid dboid, bool create, TimestampTz now);
extern void RelayWakeLauncher(void);

/* backend.c: asks the launcher to look at a database again, soon */
extern void RelayRequestRecheck(Oid dboid);
extern PGDLLEXPORT void RelayLauncherMain(Datum main_arg);

/* json_text.c: jsonb as jsonb_out's text, in cxt */
extern char *RelayJsonbText(Jsonb *jb, MemoryContext cxt);

/* lease.c */
extern int	RelayLeaseBatch(const RelayPipeline *p, int limit, MemoryContext cxt,
							RelayMessage **msgs);
extern int	RelayLeaseAhead(const RelayPipeline *p, int64 after, int limit, MemoryContext cxt,
							RelayMessage **msgs);
extern int	RelayTakeRetries(const RelayPipeline *p, int limit, MemoryContext cxt, RelayMessage **msgs,
							 TimestampTz *next_due);
extern void RelayRecord(const RelayPipeline *p, const RelaySettlement *s, MemoryContext cxt);

/* record_each.c */
extern void RelayRecordEach(const RelayPipeline *p, RelaySettlement *s, MemoryContext cxt);

/* ordering.c: ordering 'key' (see the top of that file) */
extern void RelayOrderingValidate(const cJSON *config, const char *ordering, cJSON *out);
extern void RelayOrderingKeyArgs(const RelayPipeline *p, Datum *header, bool *header_null,
								 Datum *path, bool *path_null);
extern void RelayOrderingFindBlocked(const RelayPipeline *p, RelayMessage *msgs, int n);
extern void RelayOrderingDependencies(const RelayMessage *msgs, int n, const bool *include,
									  int *after);
extern int	RelayOrderingParked(const RelayMessage *msgs, int n, const int *after,
								RelayMessageOutcome *each, bool *parked);

/* retention.c */
extern void RelaySweepOutboxes(void);
extern bool RelaySweepHasMore(void);

/* on_demand.c */
extern bool RelayLeaveWhenIdle(RelayWorkerSlot *slot, bool any_enabled, int in_flight);
extern long RelayIdleLookMs(void);

/* worker_memory.c */
extern void RelayKeepFreedMemory(void);
extern void RelayReturnMemoryWhenIdle(int in_flight, long *timeout);

/* pacing.c */
extern const char *RelayBreakerStateName(const RelayPipeline *p, const RelayPacing *pc);
extern int	RelayPacingAllowance(const RelayPipeline *p, RelayPacing *pc, int want,
								 TimestampTz *wake);
extern void RelayPacingAfterBatch(const RelayPipeline *p, RelayPacing *pc, int sent,
								  int failures, int successes);

/* idle_look.c */
extern void RelayLookForWork(RelayPipeline *const *pipelines, int n, bool *found);

/* attempt_log.c */
extern Datum RelayMakeArray(Datum *elems, bool *nulls, int n, Oid type);
extern void RelayLogAttempts(const RelayPipeline *p, const RelaySettlement *s,
							 TimestampTz sent_at);
extern void RelayTrimAttemptLog(void);
extern void RelayRecordHealth(const RelayPipeline *p, const RelaySettlement *s);

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

/* pipelines.c */
/* Whether the caller's reading of pipeline `name` has config md5 `md5` and can be kept. */
typedef bool (*RelayReadingIsCurrent) (const char *name, const char *md5);
extern List *RelayReadPipelines(MemoryContext cxt, bool *any_enabled, RelayReadingIsCurrent is_current,
								List **kept);

/* secrets.c */
extern char *RelaySecretsDirectory;
extern bool RelayResolveSecrets(char **headers, char **secrets, char **error);
extern char *RelayReadSecretRef(const char *marked, char **error);

/* pipeline_state.c: what the worker knows of a pipeline, for relay_pipeline_status */
extern void RelayRecordHold(const RelayPipeline *p, const RelayMessage *m,
							const RelayMessageOutcome *o, TimestampTz until, int holds,
							RelayRepeat *log);
extern void RelayRecordTurnError(const char *pipeline, const char *message, int errors,
								 TimestampTz until, RelayRepeat *log);
extern void RelayRecordTurnOk(const char *pipeline, RelayRepeat *log);
extern bool RelayForgetPipelineStates(List *pipelines);

/* worker.c */
extern PGDLLEXPORT void RelayWorkerMain(Datum main_arg);

#endif							/* TIDE_RELAY_H */
