/*
 * forward.h
 *		The forward flow's kit (flow_forward.c): a pipeline of
 *		relay_outbox_config as read (pipelines.c), its lease and record
 *		(lease.c, record_each.c), ordering, pacing, attempt log and state.
 */
#ifndef TIDE_FORWARD_H
#define TIDE_FORWARD_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "nodes/pg_list.h"

#include "filter.h"
#include "log_repeat.h"
#include "sink.h"

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
	const char **reason;		/* RELAY_DEAD: 'permanent', 'exhausted' or 'expired' */
	bool	   *unrecorded;		/* set by RelayRecordEach: dead-lettered because
								 * its outcome could not be recorded; NULL: none */
} RelaySettlement;

/* attempt_log.c: tide.relay_attempts and its retention */
extern int	AttemptLogRetentionSecs;
extern Datum RelayMakeArray(Datum *elems, bool *nulls, int n, Oid type);
extern void RelayLogAttempts(const RelayPipeline *p, const RelaySettlement *s,
							 TimestampTz sent_at);
extern void RelayTrimAttemptLog(void);
extern void RelayRecordHealth(const RelayPipeline *p, const RelaySettlement *s);

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

/* pacing.c */
extern const char *RelayBreakerStateName(const RelayPipeline *p, const RelayPacing *pc);
extern int	RelayPacingAllowance(const RelayPipeline *p, RelayPacing *pc, int want,
								 TimestampTz *wake);
extern void RelayPacingAfterBatch(const RelayPipeline *p, RelayPacing *pc, int sent,
								  int failures, int successes);

/* idle_look.c */
extern void RelayLookForWork(RelayPipeline *const *pipelines, int n, bool *found);

/* pipelines.c */
/* Whether the caller's reading of pipeline `name` has config md5 `md5` and can be kept. */
typedef bool (*RelayReadingIsCurrent) (const char *name, const char *md5);
extern List *RelayReadPipelines(MemoryContext cxt, bool *any_enabled, RelayReadingIsCurrent is_current,
								List **kept);

/* pipeline_state.c: what the worker knows of a pipeline, for relay_pipeline_status (and flow_errors.h) */
extern void RelayRecordHold(const RelayPipeline *p, const RelayMessage *m,
							const RelayMessageOutcome *o, TimestampTz until, int holds,
							RelayRepeat *log);
extern bool RelayForgetPipelineStates(List *pipelines);

#endif							/* TIDE_FORWARD_H */
