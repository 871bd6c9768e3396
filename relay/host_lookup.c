/*
 * host_lookup.c
 *		Looking a broker's host name up without blocking the worker's loop
 *		(broker.h): hiredis and libmosquitto call getaddrinfo inside their
 *		connect, which would wait in the loop on the name server, and so
 *		hold every pipeline of the worker while it is slow or silent.
 *
 * RelayLookupStart runs getaddrinfo on a thread of its own
 * (RelayBrokerStartThread), which writes the answer into the lookup and
 * signals a RelayNotifier that the loop watches; the loop then calls the
 * sink's `done`. The lookup is shared by the loop and the thread, each
 * holding one reference: a sink may end it while the thread still waits
 * on the name server (its pipeline closed), and the thread frees it when
 * it returns. The thread calls no PostgreSQL function and allocates with
 * malloc only.
 */
#include "postgres.h"

#include <netdb.h>
#include <arpa/inet.h>
#include <sys/socket.h>

#include "broker.h"

struct RelayLookup
{
	int			refs;			/* the loop's and the thread's (atomic) */
	RelayNotifier notifier;		/* the thread signals it; watched until `done` or the end */
	RelayLookupDone done;		/* the loop's: called once with the answer */
	void	   *arg;
	char		host[256];
	char		port[12];
	bool		finished;		/* set by the thread (atomic) after the answer */
	int			status;			/* getaddrinfo's result */
	char		address[INET6_ADDRSTRLEN];
};

/* Drops one reference; the last one frees the lookup. */
static void
lookup_release(RelayLookup *l)
{
	if (__atomic_sub_fetch(&l->refs, 1, __ATOMIC_ACQ_REL) == 0)
	{
		RelayNotifierClose(&l->notifier);
		free(l);
	}
}

/* The lookup's thread: getaddrinfo, an IPv4 address first as hiredis prefers. */
static void *
lookup_main(void *arg)
{
	RelayLookup *l = arg;
	struct addrinfo hints;
	struct addrinfo *res = NULL;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	l->status = getaddrinfo(l->host, l->port, &hints, &res);
	if (l->status == 0)
	{
		const struct addrinfo *pick = res;

		for (const struct addrinfo *a = res; a != NULL; a = a->ai_next)
			if (a->ai_family == AF_INET)
			{
				pick = a;
				break;
			}
		l->status = getnameinfo(pick->ai_addr, pick->ai_addrlen, l->address, sizeof(l->address),
								NULL, 0, NI_NUMERICHOST);
		freeaddrinfo(res);
	}
	__atomic_store_n(&l->finished, true, __ATOMIC_RELEASE);
	RelayNotifierSignal(&l->notifier);
	lookup_release(l);
	return NULL;
}

/* events.c: the thread signalled; hands the answer to the sink once. */
static void
lookup_signalled(int fd, uint32 events, void *arg)
{
	RelayLookup *l = arg;

	RelayNotifierDrain(&l->notifier);
	if (l->notifier.watch == NULL || !__atomic_load_n(&l->finished, __ATOMIC_ACQUIRE))
		return;
	RelayNotifierStopWatching(&l->notifier);
	/* the sink may end the lookup in `done`: nothing of it is used after */
	l->done(l->arg);
}

bool
RelayHostIsAddress(const char *host)
{
	unsigned char buf[sizeof(struct in6_addr)];

	return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

RelayLookup *
RelayLookupStart(const char *host, int port, RelayLookupDone done, void *arg,
				 char *error, size_t errsize)
{
	RelayLookup *l = calloc(1, sizeof(RelayLookup));
	int			rc;

	if (l == NULL)
	{
		snprintf(error, errsize, "out of memory");
		return NULL;
	}
	if (strlen(host) >= sizeof(l->host))
	{
		snprintf(error, errsize, "the host name is longer than %zu bytes", sizeof(l->host) - 1);
		free(l);
		return NULL;
	}
	strlcpy(l->host, host, sizeof(l->host));
	snprintf(l->port, sizeof(l->port), "%d", port);
	l->done = done;
	l->arg = arg;
	l->refs = 2;
	if (!RelayNotifierOpen(&l->notifier, lookup_signalled, l))
	{
		snprintf(error, errsize, "cannot wait for a host name's lookup: %s", strerror(errno));
		free(l);
		return NULL;
	}
	if ((rc = RelayBrokerStartThread(lookup_main, l)) != 0)
	{
		snprintf(error, errsize, "cannot start a thread to look the host name up: %s", strerror(rc));
		RelayNotifierClose(&l->notifier);
		free(l);
		return NULL;
	}
	return l;
}

bool
RelayLookupResult(const RelayLookup *l, char *address, size_t size, char *error, size_t errsize)
{
	if (!__atomic_load_n(&l->finished, __ATOMIC_ACQUIRE))
	{
		snprintf(error, errsize, "the lookup of \"%s\" has not finished", l->host);
		return false;
	}
	if (l->status != 0)
	{
		snprintf(error, errsize, "could not look up \"%s\": %s", l->host, gai_strerror(l->status));
		return false;
	}
	strlcpy(address, l->address, size);
	return true;
}

void
RelayLookupEnd(RelayLookup *l)
{
	if (l == NULL)
		return;
	RelayNotifierStopWatching(&l->notifier);
	lookup_release(l);
}
