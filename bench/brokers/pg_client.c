/*
 * pg_client.c
 *		The baseline of bench/postgres_sink.sh: a plain client moving an
 *		outbox into another database's inbox with the same calls the
 *		postgres sink makes, in a loop: tide.poll_outbox on one side (the
 *		previous batch committed with p_commit_upto), one
 *		tide.inbox_receive_batch of the batch on the other, each with the
 *		same event ids, source, payloads and headers.
 *
 * usage: pg_client <outbox conninfo> <inbox conninfo> <group> <inbox> <batch size> <messages>
 * Prints the seconds from the first poll to the last commit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Runs a query with text parameters; exits on an error. */
static PGresult *
run(PGconn *conn, const char *sql, int n, const char *const *params)
{
	PGresult   *res = PQexecParams(conn, sql, n, NULL, params, NULL, NULL, 0);

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		fprintf(stderr, "pg_client: %s", PQerrorMessage(conn));
		exit(1);
	}
	return res;
}

int
main(int argc, char **argv)
{
	PGconn	   *out;
	PGconn	   *in;
	char		upto[32] = "";
	char		batch[16];
	long		total = 0;
	long		want;
	double		start;

	if (argc != 7)
	{
		fprintf(stderr, "usage: pg_client <outbox conninfo> <inbox conninfo> <group> <inbox> <batch size> <messages>\n");
		return 2;
	}
	out = PQconnectdb(argv[1]);
	in = PQconnectdb(argv[2]);
	if (PQstatus(out) != CONNECTION_OK || PQstatus(in) != CONNECTION_OK)
	{
		fprintf(stderr, "pg_client: %s%s", PQerrorMessage(out), PQerrorMessage(in));
		return 1;
	}
	snprintf(batch, sizeof(batch), "%s", argv[5]);
	want = atol(argv[6]);
	start = now();
	while (total < want)
	{
		const char *poll_params[3] = {argv[3], batch, upto[0] ? upto : NULL};
		PGresult   *polled = run(out,
								 "SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object("
								 "'event_id', 'outbox_bench:' || p.id, 'source', 'client', "
								 "'payload', p.payload, 'headers', p.headers) ORDER BY p.id), "
								 "pg_catalog.max(p.id), pg_catalog.count(*) "
								 "FROM tide.poll_outbox($1, 'client', $2::int, 30, $3::bigint) p",
								 3, poll_params);

		if (atol(PQgetvalue(polled, 0, 2)) > 0)
		{
			const char *params[2] = {argv[4], PQgetvalue(polled, 0, 0)};

			PQclear(run(in, "SELECT tide.inbox_receive_batch($1, $2::jsonb)", 2, params));
			total += atol(PQgetvalue(polled, 0, 2));
			snprintf(upto, sizeof(upto), "%s", PQgetvalue(polled, 0, 1));
		}
		PQclear(polled);
	}
	{
		const char *params[2] = {argv[3], upto};

		PQclear(run(out, "SELECT tide.commit_offset($1, 'client', $2::bigint)", 2, params));
	}
	printf("%.6f\n", now() - start);
	PQfinish(out);
	PQfinish(in);
	return 0;
}
