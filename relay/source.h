/*
 * source.h
 *		The interface between the relay and its sources, the other end of a
 *		reverse pipeline (source -> inbox), in the manner of sink.h's
 *		RelaySinkRoutine: each source type is a table of callbacks that the
 *		relay calls through, and never names an implementation.
 *
 * A source type is provided by an endpoint: a module pg_tide_<type>.so in
 * $libdir (or pg_tide.so itself) exports one init function,
 * pg_tide_endpoint_<type>(void), which registers the routines it provides
 * with RelayRegisterSource (and a sink's, where the endpoint has one).
 * Nothing lists the source types: RelaySourceLoad finds a type's module by
 * that naming convention the first time a config names the type.
 *
 * The routine holds what the catalog needs: the config's keys, the
 * secret keys that every output of a config redacts, and the validator,
 * which tide.relay_set_inbox, the trigger on tide.relay_inbox_config and
 * the relay worker all run (reverse_config.c); and what the relay's
 * reverse flow (flow_reverse.c) calls to fetch events.
 *
 * A reverse pipeline's life, exactly once: `open` turns its config into
 * the source's own state, kept across fetches. A fetch is an operation in
 * flight: `start` asks for events after the position the pipeline has
 * stored, `progress` is called whenever the sockets or timers the source
 * registered with the worker's wait (events.h) are ready or the fetch's
 * wake_at has come, until it says the fetch is finished, with no
 * transaction open and never an ERROR (a failure is data: `failed`). The
 * relay then stores the events in the inbox and the fetch's new position
 * in tide.relay_consumer_offsets.source_position in one local
 * transaction; only once that committed does the position become the
 * `position` of the next fetch, which is how a source learns what it may
 * acknowledge (a remote consumer group's commit, a broker's offset
 * commit): what it acknowledged is stored, and what it redelivers after a
 * crash carries the event ids the inbox has already, so stores nothing
 * twice. `cancel` abandons a fetch in flight; `close` ends the state.
 */
#ifndef TIDE_SOURCE_H
#define TIDE_SOURCE_H

#include "postgres.h"

#include <cjson/cJSON.h>

#include "datatype/timestamp.h"

struct RelaySourceOpened;
struct RelaySourceFetch;

typedef struct RelaySourceRoutine
{
	const char *name;			/* source_type in a reverse pipeline's config */

	/*
	 * The keys of the config it reads beyond those of every reverse
	 * pipeline ("inbox", "source_type", "batch_size"), NULL-ended.
	 */
	const char *const *config_keys;

	/*
	 * The keys whose values every output of a config redacts, NULL-ended,
	 * as a sink's (sink.h, endpoints/redact.c): "auth.password" names the
	 * member "password" of the object "auth", "auth.*" the members of
	 * "auth" whose name says they carry a credential. A value that is an
	 * object, a secret reference ({"env": ...} or {"file": ...}), is shown
	 * as it is: it holds no secret.
	 */
	const char *const *secret_keys;

	/*
	 * Reads the source's keys of a user's config object; raises an ERROR
	 * (SQLSTATE 22023, with a hint; 42501 for a file the role may not make
	 * the relay read, config_value.h) on bad input; adds the source's keys
	 * with defaults filled in to `out`. The only validator of the source's
	 * keys, so the relay reads only what it passed.
	 */
	void		(*validate) (const cJSON *config, cJSON *out);

	/*
	 * The source's state of a pipeline from its validated config, in the
	 * current memory context; false, with opened->error, when it cannot be
	 * served now (a secret reference that cannot be read).
	 */
	bool		(*open) (const cJSON *config, struct RelaySourceOpened *opened);

	/* Starts a fetch; never raises an ERROR. */
	void		(*start) (void *state, struct RelaySourceFetch *fetch);

	/* Moves a fetch on; true when it is finished. Never raises an ERROR. */
	bool		(*progress) (void *state, struct RelaySourceFetch *fetch);

	/* Abandons a fetch in flight, releasing what points into it; never an ERROR. */
	void		(*cancel) (void *state, struct RelaySourceFetch *fetch);

	/* Ends a pipeline's state (no fetch in flight); NULL: nothing to do. */
	void		(*close) (void *state);
} RelaySourceRoutine;

/* What `open` is told and tells the relay of a pipeline's source. */
typedef struct RelaySourceOpened
{
	const char *pipeline;		/* set by the relay: the pipeline's name */
	void	   *state;			/* the source's state of the pipeline */
	bool		read_secrets;	/* its config refers to secrets, which `open` read */
	const char *error;			/* when `open` fails: why the pipeline is passed over */
} RelaySourceOpened;

/* One event of a fetch, for tide.inbox_receive_batch. */
typedef struct RelaySourceEvent
{
	char	   *event_id;
	int64		id;				/* its number at the source, unique in the
								 * pipeline (the postgres source: the
								 * remote outbox id): a dead letter's
								 * message_id */
	char	   *payload;		/* JSON text */
	char	   *headers;		/* a JSON object's text, or NULL */
} RelaySourceEvent;

/*
 * A fetch in flight, as the relay hands it to its source. Everything the
 * source allocates for it lives in `cxt`, which the relay deletes after
 * the events are stored or the fetch is cancelled.
 */
typedef struct RelaySourceFetch
{
	int			max_events;		/* the pipeline's batch_size */
	const char *position;		/* the stored position (JSON text), committed
								 * locally: events after it are wanted, and
								 * what it covers may be acknowledged; NULL:
								 * nothing stored yet */
	MemoryContext cxt;
	/* set by the source */
	RelaySourceEvent *events;
	int			nevents;
	char	   *position_after; /* the position once these events are stored
								 * (JSON text); NULL: unchanged */
	int64		position_id;	/* a numeric position, mirrored into
								 * relay_consumer_offsets.last_change_id; 0: none */
	bool		failed;			/* the source failed (nothing fetched): the
								 * pipeline is held */
	char		error_class[32];	/* connection, auth, timeout, ... (broker.h) */
	char		error[256];
	bool		ready;			/* something happened: `progress` is due */
	TimestampTz wake_at;		/* call `progress` by then; 0: no need */
	void	   *source_private;
} RelaySourceFetch;

/*
 * endpoints/source_types.c, over the endpoint registry (registry.h):
 * registers a source type (an endpoint's init symbol calls it; registering
 * a name again replaces the routine); the routine of a type, loading the
 * endpoint that provides it (an ERROR, 22023, naming the module and the
 * package when none does); the same, NULL instead of the ERROR; the
 * routine if it is registered in this process already, else NULL.
 */
extern PGDLLEXPORT void RelayRegisterSource(const RelaySourceRoutine *routine);
extern PGDLLEXPORT const RelaySourceRoutine *RelaySourceLoad(const char *name);
extern PGDLLEXPORT const RelaySourceRoutine *RelaySourceFind(const char *name);
extern PGDLLEXPORT const RelaySourceRoutine *RelaySourceLookup(const char *name);

#endif							/* TIDE_SOURCE_H */
