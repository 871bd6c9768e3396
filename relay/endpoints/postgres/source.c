/*
 * source.c
 *		The postgres source (pg_tide_postgres.so): a reverse pipeline reads a
 *		consumer group of another pg_tide database's outbox over libpq, and
 *		the relay stores its messages in a local inbox, exactly once.
 *
 * A fetch (source.h) on the pipeline's connection (client.c):
 * 1. SELECT ... FROM tide.poll_outbox(<group>, 'relay:<pipeline>', n,
 *	  visibility, <commit up to>): the remote leases the next messages to
 *	  the pipeline's consumer, after committing what the pipeline stored
 *	  already. What may be committed is what the last poll returned, once
 *	  the pipeline's stored position (committed locally) covers it: the
 *	  relay stores the events and the position in one local transaction
 *	  and hands that position to the next fetch only once it committed.
 * 2. When nothing is there: SELECT tide.wait_for_messages(<group>, ms) on
 *	  the remote, which returns as soon as a message commits there (or
 *	  after the time), then one more poll. So a message is fetched when it
 *	  commits, not at a polling interval.
 *
 * Events are the messages after the stored position, each with the event
 * id outbox_<outbox>:<id> (the identity every sink gives a message) and
 * its payload and headers. After a crash between the local commit and the
 * remote's, the consumer gets its lease back: the messages the position
 * covers are passed over (and their ids are in the inbox anyway), and the
 * next poll commits them. The position is {"id": <the last id stored>}.
 *
 * Failures (client.c's classes: connection, auth, timeout, an inbox or
 * group that does not exist, a refused commit) fail the fetch: the relay
 * holds the pipeline and fetches again later, from its stored position.
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "utils/timestamp.h"

#include "remote.h"

/* Seconds a poll's lease lasts on the remote: the time to store a batch, many times over. */
#define REMOTE_LEASE_SECONDS "60"

static const char poll_sql[] =
"SELECT p.id, p.payload, p.headers FROM tide.poll_outbox($1, $2, $3::pg_catalog.int4, "
REMOTE_LEASE_SECONDS ", $4::pg_catalog.int8) p ORDER BY p.id";
static const char wait_sql[] = "SELECT tide.wait_for_messages($1, $2::pg_catalog.int4)";

/* Where a fetch is. */
typedef enum FetchStage
{
	STAGE_POLL,					/* the first poll (with the commit) */
	STAGE_WAIT,					/* nothing was there: waiting on the remote */
	STAGE_REPOLL				/* polling again after the wait */
} FetchStage;

/* A pipeline's state: its settings, its connection, what its last poll returned. */
typedef struct PostgresSource
{
	RemoteClient client;
	char	   *outbox;
	char	   *group;
	char	   *consumer;		/* relay:<pipeline> */
	int			wait_ms;
	int64		last_polled;	/* the highest id the last poll returned; 0: none */
	RelaySourceFetch *fetch;	/* in flight, or NULL */
	FetchStage	stage;
	bool		calling;
	int64		stored;			/* the fetch's stored position */
} PostgresSource;

/* client.c: something happened, the fetch is due a turn. */
static void
fetch_ready(void *arg)
{
	PostgresSource *s = arg;

	if (s->fetch != NULL)
		s->fetch->ready = true;
}

/* The id of a position {"id": n}; 0 for none. */
static int64
position_id(const char *position)
{
	cJSON	   *j = position ? cJSON_Parse(position) : NULL;
	const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
	int64		result = 0;

	if (cJSON_IsNumber(id) && id->valuedouble > 0)
		result = (int64) id->valuedouble;
	else if (cJSON_IsString(id))
		result = strtoll(id->valuestring, NULL, 10);
	cJSON_Delete(j);
	return result;
}

/* Fails the fetch: nothing fetched, the pipeline is held. */
static void
fail_fetch(RelaySourceFetch *f, const char *cls, const char *error)
{
	f->failed = true;
	f->nevents = 0;
	f->position_after = NULL;
	strlcpy(f->error_class, cls, sizeof(f->error_class));
	strlcpy(f->error, error, sizeof(f->error));
}

/* Sends the stage's call; false when the connection is not ready yet. */
static bool
send_call(PostgresSource *s)
{
	RemoteClient *c = &s->client;
	char		n[16];
	char		upto[32];
	char		ms[16];

	if (c->state != REMOTE_READY)
		return false;
	if (s->stage == STAGE_WAIT)
	{
		const char *params[2] = {s->group, ms};

		snprintf(ms, sizeof(ms), "%d", s->wait_ms);
		s->calling = RemoteClientSend(c, wait_sql, 2, params,
										s->wait_ms + c->statement_timeout_ms + REMOTE_ANSWER_SLACK_MS);
	}
	else
	{
		const char *params[4] = {s->group, s->consumer, n, NULL};

		snprintf(n, sizeof(n), "%d", s->fetch->max_events);
		/* what the last poll returned may be committed once it is stored */
		if (s->stage == STAGE_POLL && s->last_polled > 0 && s->last_polled <= s->stored)
		{
			snprintf(upto, sizeof(upto), INT64_FORMAT, s->last_polled);
			params[3] = upto;
		}
		s->calling = RemoteClientSend(c, poll_sql, 4, params,
										c->statement_timeout_ms + REMOTE_ANSWER_SLACK_MS);
	}
	return true;
}

/* Takes a poll's rows: the events after the stored position. False: none came. */
static bool
take_rows(PostgresSource *s, PGresult *res)
{
	RelaySourceFetch *f = s->fetch;
	int			rows = PQntuples(res);
	MemoryContext old = MemoryContextSwitchTo(f->cxt);
	int64		last = 0;

	f->events = palloc0(sizeof(RelaySourceEvent) * Max(rows, 1));
	f->nevents = 0;
	for (int i = 0; i < rows; i++)
	{
		int64		id = strtoll(PQgetvalue(res, i, 0), NULL, 10);
		RelaySourceEvent *e;
		char		identity[RELAY_IDENTITY_SIZE];

		last = Max(last, id);
		/* stored already: a lease given back after a crash before the remote's commit */
		if (id <= s->stored)
			continue;
		e = &f->events[f->nevents++];
		RelayMessageIdentity(identity, sizeof(identity), s->outbox, id);
		e->event_id = pstrdup(identity);
		e->id = id;
		e->payload = pstrdup(PQgetvalue(res, i, 1));
		e->headers = PQgetisnull(res, i, 2) ? NULL : pstrdup(PQgetvalue(res, i, 2));
	}
	/* the poll committed what it was asked to */
	s->last_polled = last;
	if (rows > 0)
	{
		f->position_id = Max(last, s->stored);
		f->position_after = psprintf("{\"id\": " INT64_FORMAT "}", f->position_id);
	}
	MemoryContextSwitchTo(old);
	return rows > 0;
}

static void
postgres_source_start(void *state, RelaySourceFetch *f)
{
	PostgresSource *s = state;
	RemoteClient *c = &s->client;

	s->fetch = f;
	s->stage = STAGE_POLL;
	s->calling = false;
	s->stored = position_id(f->position);
	/* a commit the remote refused, or a lease it gave to another: none to commit */
	if (s->last_polled > s->stored)
		s->last_polled = 0;
	c->failed = false;
	c->notify = fetch_ready;
	c->notify_arg = s;
	RemoteClientConnect(c);
	f->ready = true;
}

static bool
postgres_source_progress(void *state, RelaySourceFetch *f)
{
	PostgresSource *s = state;
	RemoteClient *c = &s->client;
	PGresult   *res;

	RemoteClientPump(c);
	if ((res = RemoteClientTakeResult(c)) != NULL)
	{
		ExecStatusType st = PQresultStatus(res);

		s->calling = false;
		if (st != PGRES_TUPLES_OK)
		{
			char		cls[32];
			char		error[256];

			RemoteClassifyError(res, cls, sizeof(cls), error, sizeof(error));
			PQclear(res);
			/* the next poll commits nothing: the lease may be gone */
			s->last_polled = 0;
			fail_fetch(f, cls, error);
			return true;
		}
		if (s->stage == STAGE_WAIT)
			s->stage = STAGE_REPOLL;
		else if (take_rows(s, res) || s->stage == STAGE_REPOLL)
		{
			PQclear(res);
			return true;
		}
		else
			s->stage = STAGE_WAIT;
		PQclear(res);
	}
	if (c->failed)
	{
		c->failed = false;
		s->last_polled = 0;
		fail_fetch(f, c->fail_class, c->fail_error);
		return true;
	}
	if (!s->calling)
		send_call(s);
	if (c->failed)
		return postgres_source_progress(state, f);
	f->wake_at = c->deadline;
	return false;
}

static void
postgres_source_cancel(void *state, RelaySourceFetch *f)
{
	PostgresSource *s = state;

	s->fetch = NULL;
	/* an answer still due belongs to this fetch */
	if (s->calling)
		RemoteClientDrop(&s->client);
	s->calling = false;
	s->client.failed = false;
}

static void
postgres_source_close(void *state)
{
	PostgresSource *s = state;

	s->fetch = NULL;
	RemoteClientClose(&s->client);
}

/*
 * The pipeline's settings from its config, with the password it refers
 * to read; false when it cannot be (the pipeline's error).
 */
static bool
postgres_source_open(const cJSON *config, RelaySourceOpened *opened)
{
	PostgresSource *s = palloc0(sizeof(PostgresSource));
	char	   *error = NULL;

	opened->read_secrets = cJSON_IsObject(RelayConfigMember(config, "password"));
	if (!RemoteClientInit(&s->client, config, &error))
	{
		opened->error = error;
		return false;
	}
	s->outbox = RelayConfigString(config, "outbox");
	s->group = RelayConfigString(config, "consumer_group");
	s->consumer = psprintf("relay:%s", opened->pipeline ? opened->pipeline : "");
	if (s->outbox == NULL || s->group == NULL)
	{
		opened->error = "its config has no \"outbox\" or \"consumer_group\"";
		return false;
	}
	/* the wait ends well before the remote's statement_timeout */
	s->wait_ms = Max(100, Min(5000, s->client.statement_timeout_ms / 2));
	opened->state = s;
	return true;
}

const RelaySourceRoutine RemoteSourceRoutine = {
	.name = "postgres",
	.config_keys = RemoteSourceConfigKeys,
	.secret_keys = RemoteSecretKeys,
	.validate = RemoteSourceValidate,
	.open = postgres_source_open,
	.start = postgres_source_start,
	.progress = postgres_source_progress,
	.cancel = postgres_source_cancel,
	.close = postgres_source_close,
};
