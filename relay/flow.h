/*
 * flow.h
 *		The interface between the relay's engine and its flows, in the
 *		manner of sink.h: each flow is a table of callbacks (RelayFlowRoutine)
 *		that the engine calls through, and never names an implementation. A
 *		forward pipeline (outbox -> sink, flow_forward.c) is one flow, a
 *		reverse pipeline (source -> inbox) another, an inbox handler (inbox
 *		-> handler function) a third. A new flow is a file and one line in
 *		the table of flows (flows.c), the engine's only list of them.
 *
 * What the engine owns, for every flow alike: the units (one per enabled
 * row of a flow's catalog table) and their readings, the operations in
 * flight and the one wait on all of them, holds, pacing and back-off after
 * an ERROR per unit, the grouped short transactions in which operations
 * are recorded (with their after-commit list), and cancel and ERROR
 * cleanup. What a flow owns: its catalog table, what an operation does and
 * what a result means (its policy).
 *
 * A unit's life: at every reading of the units (a short transaction of the
 * engine, with a snapshot, after a change in SQL, a reload and every
 * pg_tide.relay_naptime_ms) each flow's `read` reads its enabled rows and
 * turns each new or changed one into a reading (RelayUnitReading); an
 * unchanged one (same config md5, RelayUnitIsCurrent) is kept as it is.
 * A unit that is neither held nor paced then takes its `step` whenever the
 * engine looks at it (after a commit, a reading, the end of a hold, the
 * time `next_due` named): the step may run a short transaction (a lease, a
 * claim, the start of a fetch) and start an operation (RelayNewOperation).
 * An operation in flight is moved on by `progress`, with no transaction
 * open, whenever what it registered with the worker's wait (events.h: its
 * sockets and timers) is ready or its wake_at has come, until it says it is
 * finished. Then, for all the operations that finished in one turn of the
 * engine: `finish` for each (no transaction open: take the results out of
 * the sink or source, start a batch prepared ahead), `record` for each,
 * together in one group of short transactions (xact.c: each record is a
 * subtransaction of the group's, so an ERROR in one loses no other's), the
 * group's after-commit callbacks once it committed, and `after_record` for
 * each (with no transaction open: prepare the next batch ahead). `close`
 * ends a reading the unit no longer needs.
 *
 * A unit has at most three operations (RelayUnit): the one in flight
 * (`op`), one prepared ahead of it and not started (`ahead`), and a
 * finished one that is recorded while the next is in flight
 * (`recording`). A flow that needs neither ahead nor recording uses `op`
 * alone.
 *
 * A flow includes this header, relay_xact.h for its short transactions
 * (RelayBeginShortXact, RelayEndShortXact, RelayTryLockTable) and the
 * interface of what it talks to (sink.h); never engine.h, the process's
 * view of the engine.
 *
 * ERRORs: `step`, `finish`, `record` and `after_record` may raise one (a
 * dropped table, a lost lease, a full disk); the engine then undoes the
 * unit's short transaction, cancels every operation of the unit (`cancel`,
 * before the operations' memory is freed), holds the unit (1 s, doubling
 * up to a minute while the errors go on), logs it at most once a minute
 * and goes on with the others. `progress`, `cancel`, `abandoned`, `close`
 * and the after-commit callbacks run with no transaction open and never
 * raise an ERROR: they run on the way out of one, or between transactions.
 */
#ifndef TIDE_FLOW_H
#define TIDE_FLOW_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "lib/ilist.h"
#include "nodes/pg_list.h"

#include "log_repeat.h"

struct RelayFlowRoutine;
struct RelayUnit;

/*
 * One reading of a unit's row, as a flow's `read` made it: the flow's own
 * state of it (a forward pipeline's RelayPipeline with its sink opened) in
 * a memory context of its own, which the engine reparents under its own
 * and deletes after `close`.
 */
typedef struct RelayUnitReading
{
	const struct RelayFlowRoutine *flow;	/* set by the engine */
	const char *name;			/* the unit's name: unique within its flow */
	const char *config_md5;		/* tells a changed row, which is read again */
	bool		reads_secrets;	/* read again at every reading: a secret may
								 * have changed */
	void	   *state;			/* the flow's reading of the unit */
	MemoryContext cxt;			/* holds the reading and the flow's state of it */
} RelayUnitReading;

/*
 * An operation in flight: a unit's batch (a lease delivered to a sink, a
 * fetch from a source, a claim of inbox events) between its start and its
 * record, which the engine waits on together with every other. All its
 * memory is in cxt, deleted only after the flow released whatever points
 * into it (`cancel`).
 */
typedef struct RelayOperation
{
	dlist_node	node;			/* the engine's list of operations in flight */
	bool		listed;			/* in that list (started) */
	bool		finished;		/* progress said so already: finished at the
								 * engine's next look at it */
	bool		to_record;		/* set by `finish`: `record` is due */
	int			n;				/* the items it took (messages, events); 0: none */
	struct RelayUnit *unit;
	MemoryContext cxt;

	/*
	 * Where the operation's sink or source says that `progress` is due
	 * (*ready), and by when it is due at the latest even if nothing happens
	 * (*wake_at, 0: no need). The flow points them at the fields its sink
	 * or source sets (RelaySinkBatch.ready, .wake_at); they start pointing
	 * at ready_self and wake_at_self.
	 */
	bool	   *ready;
	TimestampTz *wake_at;
	bool		ready_self;
	TimestampTz wake_at_self;

	void	   *flow_private;	/* the flow's own state of the operation */
} RelayOperation;

/*
 * A unit in the engine's table: one enabled row of a flow's catalog table,
 * served by this worker. The engine keeps it from the first reading that
 * lists it until the worker ends, served (reading != NULL) or not. Fields
 * marked "engine" are the engine's, which a flow reads; the flow may set
 * those marked "flow may set".
 */
typedef struct RelayUnit
{
	const struct RelayFlowRoutine *flow;	/* engine */
	char	   *name;			/* engine: the key, with the flow */
	char		config_md5[33]; /* engine: the row the unit's state was reached with */
	RelayUnitReading *reading;	/* engine: the reading it is served with; NULL: none */
	RelayUnitReading *next_reading; /* engine: a newer one, taken once its
									 * operations ended */
	bool		listed;			/* engine: the last reading listed it */

	/*
	 * Holds: nothing of the unit is started until held_until (0: not held).
	 * A flow begins a hold (its destination failed) by setting held_until
	 * and holds, and ends it with RelayEndHold; the engine lets the unit try
	 * again, with `look` set, once the time is up. held_log is the hold as
	 * the log tells it (log_repeat.c).
	 */
	TimestampTz held_until;		/* flow may set */
	int			holds;			/* flow may set: failed attempts in a row while held */
	RelayRepeat held_log;		/* flow may set */
	/* Pacing: the unit's rate limit lets it start again then; 0: now. */
	TimestampTz paced_until;	/* flow may set */
	/* Work may be waiting: after a commit, a reading, a hold's end. */
	bool		look;			/* flow may set, and clears when it looked */

	/* ERRORs in a row (engine): the back-off after them, and their log. */
	int			errors;
	RelayRepeat errors_log;
	RelayRepeat record_log;		/* flow may set: failures to record its state */

	/* Its operations (above); NULL: none. */
	RelayOperation *op;			/* in flight */
	RelayOperation *ahead;		/* prepared while `op` is in flight, not started */
	RelayOperation *recording;	/* finished, recorded while `op` is in flight */

	void	   *flow_private;	/* the flow's state of the unit, kept across
								 * readings (RelayFlowRoutine.unit_size bytes,
								 * zeroed, for as long as the worker runs) */
} RelayUnit;

/* What a flow's `read` is given and gives back. */
typedef struct RelayFlowReading
{
	MemoryContext cxt;			/* where `units` and `kept` go */
	bool		reopen;			/* open every row again, changed or not (a reload) */
	/* set by `read` */
	bool		any_enabled;	/* the flow has an enabled row at all */
	List	   *units;			/* RelayUnitReading *: rows new or changed */
	List	   *kept;			/* char *: names of rows kept as they are read */
} RelayFlowReading;

/* A callback run once a group's transaction committed (RelayAfterCommit). */
typedef void (*RelayAfterCommitFn) (void *arg);

typedef struct RelayFlowRoutine
{
	const char *name;			/* "forward", "reverse", "handler", "schedule": for the log */
	const char *unit_noun;		/* what the log calls a unit: "pipeline", "inbox handler" */

	/*
	 * A sentence the log adds when a unit stops after an ERROR, after "The
	 * <unit> is tried again in N ms (error N in a row).": what becomes of
	 * the work it had in flight. NULL: nothing is added.
	 */
	const char *error_retry_note;
	Size		unit_size;		/* bytes of RelayUnit.flow_private; 0: none */

	/*
	 * The flow's table of units in schema tide, with a boolean column
	 * "enabled" (or the condition units_wanted): a worker leaves a database
	 * in which no flow's table has such a row, and a change of the table
	 * must ask the launcher to look again (on_demand.c).
	 */
	const char *units_table;

	/*
	 * The condition on units_table's rows that needs a worker, in SQL
	 * (schema-qualified operators); NULL: "enabled".
	 */
	const char *units_wanted;

	/*
	 * A query of one timestamptz: when units_table will next have a row
	 * that needs a worker (a scheduled message's time); NULL or no time:
	 * never without a change that asks the launcher to look again. A worker
	 * that leaves tells the launcher, which starts one then (on_demand.c).
	 */
	const char *units_due_at;

	/*
	 * Reads the flow's enabled rows from its catalog table, in the engine's
	 * reading transaction (a snapshot is active; the flow connects to SPI
	 * itself). A row whose unit is served with a reading of the same config
	 * md5 (RelayUnitIsCurrent; no row when reading->reopen) goes into
	 * `kept`, others are read and opened into `units`. Takes its table's lock conditionally (RelayTryLockTable), so
	 * that a DROP EXTENSION in progress is passed over. A row that cannot
	 * be read is the flow's to report and pass over, never an ERROR for the
	 * others.
	 */
	void		(*read) (RelayFlowReading *reading);

	/*
	 * After the reading transaction committed and the units took their
	 * readings, with no transaction open, given the units this reading read
	 * (`units` of `read`): what the flow does once it has read, in short
	 * transactions of its own (clear what an earlier worker recorded of its
	 * units, its periodic jobs: retention). Only while the catalog is the
	 * library's version. An ERROR here is the worker's (it ends and is
	 * started again after a back-off), so a job catches what it can
	 * survive. NULL: nothing.
	 */
	void		(*after_read) (List *units);

	/*
	 * SQL asked the relay to look again (a changed row, retries queued by
	 * an operator): the flow looks at what it would otherwise look at only
	 * when due (its retry queue). NULL: nothing more than `look`.
	 */
	void		(*sql_changed) (struct RelayUnit *unit);

	/*
	 * A unit takes a reading with another config md5 than the one its state
	 * was reached with (a changed row is tried at once): the flow resets
	 * its policy state of the unit. The engine has ended the unit's hold,
	 * its ERRORs in a row and its pacing time already. NULL: nothing to do.
	 */
	void		(*config_changed) (struct RelayUnit *unit);

	/*
	 * Of `n` units about to take their step, those that would only look for
	 * work may be asked about together, in one statement (idle_look.c):
	 * the flow clears `look` of each that has nothing, which then takes no
	 * step. Never raises an ERROR to the engine (a failed look lets each
	 * unit look on its own). NULL: every unit takes its step.
	 */
	void		(*look_together) (struct RelayUnit **units, int n, TimestampTz now);

	/*
	 * The unit's step, when it has no operation and is neither held nor
	 * paced: whatever is due (a retry, new work when `look` is set) is
	 * taken, in short transactions, and started as an operation
	 * (RelayNewOperation); nothing when nothing is due. With no operation
	 * started, the unit's operations are ended (RelayEndOperations).
	 */
	void		(*step) (struct RelayUnit *unit);

	/*
	 * When a unit without an operation is next due for a time (a retry
	 * queue's next entry); 0 or DT_NOEND: none. Cheap: no transaction.
	 * NULL: only when woken.
	 */
	TimestampTz (*next_due) (struct RelayUnit *unit);

	/*
	 * Moves an operation on, with no transaction open; true when it is
	 * finished. Never raises an ERROR: a failure is a result.
	 */
	bool		(*progress) (RelayOperation *op);

	/*
	 * The unit's operation `op` finished: its results are taken out of the
	 * sink or source (no transaction open) and op->to_record set; a batch
	 * prepared ahead may start. May raise an ERROR.
	 */
	void		(*finish) (struct RelayUnit *unit);

	/*
	 * Records the unit's finished operation (`recording`, else `op`) in a
	 * short transaction of the engine's group (RelayBeginShortXact ...
	 * RelayEndShortXact) and ends it (RelayEndOperations, or
	 * RelayFreeOperation of `recording`). What must happen only once the
	 * record is durable (a source's acknowledgement) goes to
	 * RelayAfterCommit. May raise an ERROR.
	 */
	void		(*record) (struct RelayUnit *unit);

	/*
	 * After the group of records committed and its after-commit callbacks
	 * ran, for a unit whose operation is still in flight: prepares the next
	 * one ahead. NULL: nothing. May raise an ERROR.
	 */
	void		(*after_record) (struct RelayUnit *unit);

	/*
	 * Abandons an operation: releases whatever the sink or source holds
	 * that points into op->cxt (only when something does). Never an ERROR.
	 */
	void		(*cancel) (RelayOperation *op);

	/*
	 * An operation was abandoned, nothing of it recorded (a cancel, the
	 * worker's stop, an ERROR elsewhere): the unit is to take its items
	 * again at its next step. Never an ERROR.
	 */
	void		(*abandoned) (RelayOperation *op);

	/*
	 * A unit's step or record ended with an ERROR (`message`), the errors
	 * in a row so far and the end of its hold, or ended without one after
	 * such steps (ok): written where the status views show it; never raises
	 * an ERROR. NULL: nothing is written.
	 */
	void		(*note_error) (struct RelayUnit *unit, const char *message);
	void		(*note_ok) (struct RelayUnit *unit);

	/* The unit is no longer served (disabled, deleted, moved). NULL: nothing. */
	void		(*let_go) (struct RelayUnit *unit);

	/* Ends a reading (no operation uses it any more); never an ERROR. */
	void		(*close) (RelayUnitReading *reading);
} RelayFlowRoutine;

/* The flows, each in a file of its own. */
extern const RelayFlowRoutine RelayForwardFlow;	/* flow_forward.c */
extern const RelayFlowRoutine RelayReverseFlow;	/* flow_reverse.c */
extern const RelayFlowRoutine RelayHandlerFlow;	/* flow_handler.c */
extern const RelayFlowRoutine RelayScheduleFlow;	/* flow_schedule.c */

/* flows.c: every flow, NULL-ended: the engine's only list of them. */
#define RELAY_MAX_FLOWS 8
extern const RelayFlowRoutine *const RelayFlows[];

/* engine.c and units.c: what flows call */

/* Whether `flow`'s unit `name` is served with a reading of config md5 `md5`, to be kept. */
extern bool RelayUnitIsCurrent(const RelayFlowRoutine *flow, const char *name, const char *md5);
/* A new operation of the unit, its memory context made; not yet listed. */
extern RelayOperation *RelayMakeOperation(RelayUnit *unit);
/* Lists an operation among those in flight (the engine waits on it). */
extern void RelayListOperation(RelayOperation *op);
/* A new operation made, listed and set as the unit's `op`. */
extern RelayOperation *RelayNewOperation(RelayUnit *unit);
/* Frees one operation; with `cancel` the flow's `cancel` runs first. */
extern void RelayFreeOperation(RelayOperation *op, bool cancel);
/* Ends every operation of the unit, takes a newer reading, lets go of an unlisted one. */
extern void RelayEndOperations(RelayUnit *unit, bool cancel);
/* The unit's hold is over (`why`, for the log), if the log said it began. */
extern void RelayEndHold(RelayUnit *unit, const char *why);
/* The unit's step or record ended without an ERROR. */
extern void RelayUnitOk(RelayUnit *unit);
/* The engine looks at the units again by time t (0, DT_NOEND: no time). */
extern void RelayWakeAt(TimestampTz t);
/* The worker is retired: start nothing new. */
extern bool RelayEngineRetiring(void);
/* What one turn of the engine allocates; reset every turn. */
extern MemoryContext RelayLoopContext(void);

/*
 * xact.c: `fn(arg)` runs once the short transaction that is open now (in a
 * group: the group's transaction) has committed, with no transaction open;
 * never raises an ERROR. Discarded when that short transaction is undone.
 * `arg` lives in RelayAfterCommitContext(), kept until the callbacks ran
 * or were discarded.
 */
extern void RelayAfterCommit(RelayAfterCommitFn fn, void *arg);
extern MemoryContext RelayAfterCommitContext(void);

#endif							/* TIDE_FLOW_H */
