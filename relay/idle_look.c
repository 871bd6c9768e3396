/*
 * idle_look.c
 *		One look for work over all the idle pipelines of a worker.
 *
 * A pipeline that is to look for live messages (after a commit, a reading
 * of the pipelines, the end of a hold) used to ask on its own, in a short
 * transaction of its own, whether its consumer holds a lease or a poll of
 * its group would find anything. With a thousand idle pipelines that was a
 * thousand transactions per naptime for nothing. Here the pipelines that
 * only look are asked about in one transaction and one statement
 * (TideGroupsWithMessages in src/consumer.c); only those with something to
 * do take their step, which looks again and leases (lease.c).
 *
 * Nothing is skipped by it: the statement's snapshot is taken after the
 * worker read the commit count, so a message committed after the look
 * bumps that count and makes every pipeline look again at the next turn.
 */
#include "postgres.h"

#include "pg_tide.h"
#include "forward.h"
#include "relay_xact.h"

/*
 * Sets found[i] for each of the n pipelines that may have something to
 * lease: a lease of its consumer, an expired lease in its group, or a
 * message past its group's position (or a group that cannot be read, whose
 * step reports why).
 */
void
RelayLookForWork(RelayPipeline *const *pipelines, int n, bool *found)
{
	MemoryContext cxt = CurrentMemoryContext;
	const char **groups = palloc(sizeof(char *) * Max(n, 1));
	const char **consumers = palloc(sizeof(char *) * Max(n, 1));

	for (int i = 0; i < n; i++)
	{
		groups[i] = pipelines[i]->consumer_group;
		consumers[i] = pipelines[i]->consumer;
	}
	RelayBeginShortXact("pg_tide relay: looking for messages");
	TideGroupsWithMessages(n, groups, consumers, found);
	RelayEndShortXact(cxt);
	pfree(groups);
	pfree(consumers);
}
