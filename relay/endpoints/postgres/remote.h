/*
 * remote.h
 *		What the files of the postgres endpoint share (pg_tide_postgres.so:
 *		another pg_tide database reached over libpq): the connection keys
 *		of a config (config.c), the nonblocking connection driven by the
 *		worker's wait (client.c), and the sink's validator (sink.c points
 *		its routine at it).
 */
#ifndef TIDE_REMOTE_H
#define TIDE_REMOTE_H

#include <libpq-fe.h>

#include "sink.h"
#include "source.h"
#include "events.h"
#include "broker.h"

/* The keys of a pipeline config that name the remote database (config.c). */
#define REMOTE_CONNECTION_KEYS \
	"connection", "password", "sslmode", "sslrootcert", "sslcert", "sslkey", \
	"connect_timeout_ms", "statement_timeout_ms"

/*
 * Checks the connection keys of a user's config and adds them, defaults
 * filled in, to out; raises 22023 (42501 for a file the role may not have
 * read) with a hint.
 */
extern void RemoteValidateConnection(const cJSON *config, cJSON *out);

/* The keys whose values every output of a config redacts (config.c). */
extern const char *const RemoteSecretKeys[];

/* The endpoint's sink (sink.c) and source (source.c), which endpoint.c registers. */
extern const RelaySinkRoutine RemoteSinkRoutine;
extern const RelaySourceRoutine RemoteSourceRoutine;

/* The sink's and the source's validators and keys (config.c). */
extern void RemoteSinkValidate(const cJSON *config, cJSON *out);
extern const char *const RemoteSinkConfigKeys[];
extern void RemoteSourceValidate(const cJSON *config, cJSON *out);
extern const char *const RemoteSourceConfigKeys[];

/* How far the connection is. */
typedef enum RemoteState
{
	REMOTE_DOWN = 0,			/* none */
	REMOTE_LOOKING_UP,			/* the host name's lookup is on its thread */
	REMOTE_CONNECTING,			/* PQconnectPoll has not said OK yet */
	REMOTE_SETTING_UP,			/* the session's settings are sent, unanswered */
	REMOTE_READY,				/* a query may be sent */
	REMOTE_BUSY					/* a query is in flight */
} RemoteState;

/*
 * A connection to the remote database, one per pipeline, kept across
 * batches. Every call here is made from the worker's loop and never
 * raises an ERROR: a failure sets `failed`, its class (broker.h's
 * connection, auth, timeout) and why, and drops the connection.
 */
typedef struct RemoteClient
{
	/* libpq's keywords and values, NULL-ended; the slot of hostaddr */
	const char **keywords;
	const char **values;
	int			hostaddr_slot;
	char		host[256];		/* to look up, or "" (an address, a socket directory) */
	int			port;
	bool		password_given; /* then the server must have asked for it */
	int			connect_timeout_ms;
	int			statement_timeout_ms;
	char	   *key;			/* the parameters, to find a parked connection */

	PGconn	   *conn;
	RemoteState state;
	PostgresPollingStatusType polling;
	RelayWatch *watch;
	int			watched_fd;
	uint32		watching;
	RelayLookup *lookup;
	char		address[64];	/* what the lookup found */
	TimestampTz deadline;		/* of the connect, or of the query in flight */
	PGresult   *result;			/* the answer of the query in flight, once it came */
	bool		answered;

	bool		failed;
	char		fail_class[32];
	char		fail_error[256];

	/* something happened: the owner's batch is due a turn */
	void		(*notify) (void *arg);
	void	   *notify_arg;
} RemoteClient;

/*
 * Reads a validated config's connection keys and the password it refers
 * to into c (palloc'd in the current context); false, with *error, when
 * the password's reference cannot be read.
 */
extern bool RemoteClientInit(RemoteClient *c, const cJSON *config, char **error);

/* Starts connecting unless connected or connecting already. */
extern void RemoteClientConnect(RemoteClient *c);

/*
 * What a call's own deadline leaves beyond the remote's statement_timeout,
 * so that a slow call ends with the remote's error (57014) and the
 * connection kept, not with the relay dropping it.
 */
#define REMOTE_ANSWER_SLACK_MS 2000

/*
 * Sends a query with text parameters on a READY connection (then BUSY);
 * false, with the failure noted, when it cannot be sent.
 */
extern bool RemoteClientSend(RemoteClient *c, const char *sql, int nparams, const char *const *params,
							 long timeout_ms);

/*
 * Moves the connection on: the connect, the settings, sending what is
 * buffered, reading the answer. Called when its socket is ready and from
 * the owner's progress; notices the deadlines.
 */
extern void RemoteClientPump(RemoteClient *c);

/* The answer of the query sent, once it came (the caller PQclears it); else NULL. */
extern PGresult *RemoteClientTakeResult(RemoteClient *c);

/* Drops the connection (a lookup goes on for the next connect). */
extern void RemoteClientDrop(RemoteClient *c);

/* Ends everything the client holds. */
extern void RemoteClientClose(RemoteClient *c);

/*
 * The class and outcome of an error the remote answered (its SQLSTATE):
 * connection and auth hold the pipeline (RELAY_UNREACHABLE), timeout and
 * transient states are retried, the refusal of the data is permanent.
 */
extern RelayOutcome RemoteClassifyError(const PGresult *res, char *error_class, size_t class_size,
										char *error, size_t error_size);

#endif							/* TIDE_REMOTE_H */
