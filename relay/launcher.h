/*
 * launcher.h
 *		The relay's launcher and its shared memory: one slot per relay worker,
 *		the requests of commands that need a database to themselves, and the
 *		settings that say how many workers run (launcher.c, backend.c,
 *		worker_slots.c, on_demand.c).
 */
#ifndef TIDE_LAUNCHER_H
#define TIDE_LAUNCHER_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "port/atomics.h"
#include "storage/latch.h"
#include "storage/spin.h"

/* How long a database's worker stays stopped after DROP/ALTER/CREATE DATABASE asked. */
#define RELAY_PAUSE_MS			10000
/* How long such a command waits for the worker to leave. */
#define RELAY_STOP_WAIT_MS		5000
/* How often the launcher looks at pg_database without being woken. */
#define RELAY_LAUNCHER_NAP_MS	3000
/* How long a database's worker is not restarted after it stopped on an error. */
#define RELAY_ERROR_BACKOFF_MS	10000
/* Databases with a pending pause or recheck request that shared memory remembers. */
#define RELAY_MAX_DB_REQUESTS	64
/* The most relay workers pg_tide.relay_workers_per_database may ask for. */
#define RELAY_MAX_WORKERS_PER_DATABASE	32
/* How long a database waits for a free relay worker before the launcher logs it. */
#define RELAY_UNSERVED_GRACE_MS	5000
/*
 * The longest a database without an enabled pipeline goes without a worker
 * for its periodic jobs (on_demand.c); pg_tide.sweep_interval, when shorter,
 * is the interval.
 */
#define RELAY_IDLE_LOOK_MAX_MS	60000
/*
 * A database's worker stays while a scheduled message is due within
 * RELAY_SCHEDULE_STAY_MS (flow_schedule.c); for a later one it leaves, and
 * the launcher starts a worker RELAY_SCHEDULE_LEAD_MS before the message's
 * time (less than the stay, so that worker stays until then).
 */
#define RELAY_SCHEDULE_STAY_MS	4000
#define RELAY_SCHEDULE_LEAD_MS	2000

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
	TimestampTz due_at;			/* that look's next scheduled message; 0: none */
	pg_atomic_uint64 passes;
	pg_atomic_uint64 wakeups;
} RelayWorkerSlot;

/* A database whose worker must stay stopped for a while, or be looked at again. */
typedef struct RelayDbRequest
{
	Oid			dboid;			/* InvalidOid: free entry */
	TimestampTz paused_until;
	TimestampTz recheck_at;		/* 0: no recheck asked */
	TimestampTz due_at;			/* with the recheck, the earliest message the
								 * asking commit scheduled; 0: none */
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

/* launcher.c: settings; what _PG_init calls is in relay_init.h */
extern bool RelayEnabled;
extern char *OperatorEventsOutbox;
extern int	RelayMaxWorkers;
extern int	RelayWorkersPerDatabase;

/* launcher.c; what _PG_init calls is in relay_init.h */
extern RelayShared *Relay;
extern bool RelayDatabasePaused(Oid dboid, TimestampTz now);
extern RelayDbRequest *RelayFindRequest(Oid dboid, bool create, TimestampTz now);
extern void RelayWakeLauncher(void);

/*
 * backend.c: asks the launcher to look at a database again, soon, and to
 * start a worker for it at due_at (a scheduled message; 0: none)
 */
extern void RelayRequestRecheck(Oid dboid, TimestampTz due_at);
extern PGDLLEXPORT void RelayLauncherMain(Datum main_arg);

/* on_demand.c */
extern bool RelayLeaveWhenIdle(RelayWorkerSlot *slot, bool any_enabled, int in_flight);
extern long RelayIdleLookMs(void);

/* worker.c */
extern PGDLLEXPORT void RelayWorkerMain(Datum main_arg);

#endif							/* TIDE_LAUNCHER_H */
