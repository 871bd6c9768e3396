/*
 * connector.c
 *		A connect that a client library makes only blocking (rabbitmq-c's
 *		connection, libmosquitto's TLS connect), made on a thread of the
 *		sink's own and handed to the worker's loop (broker.h).
 *
 * The connector is shared by the loop and the thread, each holding a
 * reference; the sink's own struct (arg, malloc'd) holds what the connect
 * needs and what it made. Once the thread has returned, the loop takes the
 * result (`done`, called in the loop). The loop may give the connector up
 * while the thread still works (its pipeline closes): one atomic state
 * decides which of the two destroys the result (`discard`), and whichever
 * lets go last frees arg (`release`) and the connector. The thread calls
 * no PostgreSQL function: what it runs is the sink's `connect` and
 * `discard`, and RelayNotifierSignal.
 */
#include "postgres.h"

#include <stdlib.h>

#include "broker.h"

typedef enum RelayConnectState
{
	RELAY_CONNECT_RUNNING = 0,
	RELAY_CONNECT_FINISHED,		/* the thread returned: the result is the loop's */
	RELAY_CONNECT_ABANDONED		/* the loop gave it up: the thread discards it */
} RelayConnectState;

struct RelayConnector
{
	int			refs;			/* the loop's and the thread's (atomic) */
	int			state;			/* RelayConnectState (atomic) */
	RelayNotifier notifier;		/* the thread signals it; watched until taken or given up */
	RelayConnectorFn connect;
	RelayConnectorFn done;
	RelayConnectorFn discard;
	RelayConnectorFn release;
	void	   *arg;
};

/* Drops one reference; the last one frees arg and the connector. */
static void
connector_release(RelayConnector *c)
{
	if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) != 0)
		return;
	RelayNotifierClose(&c->notifier);
	c->release(c->arg);
	free(c);
}

/* The connector's thread. */
static void *
connector_main(void *arg)
{
	RelayConnector *c = arg;
	int			expected = RELAY_CONNECT_RUNNING;

	c->connect(c->arg);
	if (__atomic_compare_exchange_n(&c->state, &expected, RELAY_CONNECT_FINISHED, false,
									__ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		RelayNotifierSignal(&c->notifier);
	else
		c->discard(c->arg);
	connector_release(c);
	return NULL;
}

/* events.c: the thread returned; the loop takes its result. */
static void
connector_signalled(int fd, uint32 events, void *arg)
{
	RelayConnector *c = arg;

	RelayNotifierDrain(&c->notifier);
	if (c->notifier.watch == NULL ||
		__atomic_load_n(&c->state, __ATOMIC_ACQUIRE) != RELAY_CONNECT_FINISHED)
		return;
	RelayNotifierStopWatching(&c->notifier);
	c->done(c->arg);
	connector_release(c);
}

RelayConnector *
RelayConnectorStart(RelayConnectorFn connect, RelayConnectorFn done, RelayConnectorFn discard,
					RelayConnectorFn release, void *arg, char *error, size_t errsize)
{
	RelayConnector *c = calloc(1, sizeof(RelayConnector));
	int			rc;

	if (c == NULL)
	{
		snprintf(error, errsize, "connection: out of memory");
		release(arg);
		return NULL;
	}
	c->refs = 2;
	c->connect = connect;
	c->done = done;
	c->discard = discard;
	c->release = release;
	c->arg = arg;
	if (!RelayNotifierOpen(&c->notifier, connector_signalled, c))
	{
		snprintf(error, errsize, "connection: cannot wait for a connect: %m");
		release(arg);
		free(c);
		return NULL;
	}
	if ((rc = RelayBrokerStartThread(connector_main, c)) != 0)
	{
		snprintf(error, errsize, "connection: cannot start a thread to connect: %s", strerror(rc));
		RelayNotifierClose(&c->notifier);
		release(arg);
		free(c);
		return NULL;
	}
	return c;
}

void
RelayConnectorAbandon(RelayConnector *c)
{
	int			expected = RELAY_CONNECT_RUNNING;

	if (c == NULL)
		return;
	RelayNotifierStopWatching(&c->notifier);
	/* finished but not taken yet: the result is the loop's to discard */
	if (!__atomic_compare_exchange_n(&c->state, &expected, RELAY_CONNECT_ABANDONED, false,
									 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		c->discard(c->arg);
	connector_release(c);
}
