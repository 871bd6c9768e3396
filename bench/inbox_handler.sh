#!/usr/bin/env bash
# Inbox handlers run by the relay (tide.inbox_set_handler):
#   throughput  N pending events of an inbox processed by the same handler
#               (one INSERT per event), by the relay (the handler enabled,
#               batch_size 100) and by a client calling
#               tide.inbox_process(inbox, handler, 100) in a tight loop, each
#               call its own transaction, until the inbox is drained; the
#               ratio relay / client is taken in each round (target >= 0.9)
#   latency     events received at RATE a second by one pgbench client, each
#               in its own transaction; commit-to-handled = the commit time
#               of the handler's transaction (track_commit_timestamp) minus
#               the time the receiving transaction's commit returned to
#               pgbench (its per-transaction log), as bench/relay.sh measures
#               a delivery; p50 and p99 (target p50 <= 3 ms)
# See bench/README.md.
#
# Run as root. pg_tide must already be built and installed (PG_CONFIG names
# the installation); this script builds nothing. It starts its own
# throwaway cluster in /tmp/pg_tide_bench_handler on port 5492 and stops it
# at the end (KEEP_CLUSTER=1 leaves it running).
#
# Settings from the environment:
#   N         events per throughput run (default 50000)
#   REPEATS   rounds (default 3)
#   RATE      events a second in the latency run (default 200)
#   DURATION  seconds of the latency run (default 20)
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIDE_CLUSTER=/tmp/pg_tide_bench_handler
export TIDE_PORT=${TIDE_PORT:-5492}
BENCH_NAME=inbox_handler.sh
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"
export TIDE_EXTRA_CONF="$RELAY_BENCH_CONF
track_commit_timestamp = on"

N=${N:-50000}
REPEATS=${REPEATS:-3}
RATE=${RATE:-200}
DURATION=${DURATION:-20}

tide_start_cluster
"$PG_BIN/createdb" "$DB"
: >"$TIDE_CLUSTER/raw.tsv"

log "creating pg_tide, the inbox and its handler"
psql_db <<'SQL'
CREATE EXTENSION pg_tide;
SELECT tide.inbox_create('bench', 'tide', 3, 0, 0);
-- The application's role: the handler runs as it, by the relay and by the
-- client alike.
CREATE ROLE bench_app IN ROLE tide_consumer;
CREATE SCHEMA bench AUTHORIZATION bench_app;
SET ROLE bench_app;
CREATE TABLE bench.effects (event_id text NOT NULL);
-- What a handler typically does: one write of its own per event.
CREATE FUNCTION bench.handle(m tide.bench_inbox) RETURNS void
LANGUAGE sql AS $$ INSERT INTO bench.effects VALUES (m.event_id) $$;
RESET ROLE;
SELECT tide.inbox_set_handler('bench', 'bench.handle(tide.bench_inbox)', '{"batch_size": 100, "enabled": false}');
SQL

# Empties the inbox and the effects and stores N pending events.
reset_inbox() {
	psql_db -c "TRUNCATE tide.bench_inbox, bench.effects" \
		-c "INSERT INTO tide.bench_inbox (event_id, payload)
			SELECT 'e' || g, jsonb_build_object('n', g) FROM generate_series(1, $N) g" \
		-c "VACUUM ANALYZE tide.bench_inbox" -c "CHECKPOINT"
}

# Checks that every event was processed once; prints nothing.
check_drained() {
	local left effects
	left=$(scalar "SELECT count(*) FROM tide.bench_inbox WHERE processed_at IS NULL")
	effects=$(scalar "SELECT count(*) || ' ' || count(DISTINCT event_id) FROM bench.effects")
	[ "$left" -eq 0 ] && [ "$effects" = "$N $N" ] ||
		{ echo "$BENCH_NAME: $left events left, effects $effects" >&2; exit 1; }
}

# Seconds the client loop takes: psql runs each call as its own statement.
client_seconds() {
	local calls=$(( N / 100 + 1 )) script=$TIDE_CLUSTER/client.sql
	{
		echo "SET ROLE bench_app;"
		echo "SELECT extract(epoch FROM clock_timestamp()) AS t0 \\gset"
		for _ in $(seq 1 "$calls"); do
			echo "SELECT tide.inbox_process('bench', 'bench.handle', 100);"
		done
		echo "SELECT extract(epoch FROM clock_timestamp()) - :t0;"
	} >"$script"
	psql_db -A -t -f "$script" | tail -n 1
}

# Seconds the relay takes from enabling the handler to the last event's
# processed mark (one session waits, sleeping in the server).
relay_seconds() {
	psql_db -A -t <<SQL
SELECT extract(epoch FROM clock_timestamp()) AS t0 \gset
SELECT tide.inbox_enable_handler('bench');
DO \$wait\$
DECLARE
	deadline timestamptz := clock_timestamp() + interval '600 seconds';
BEGIN
	WHILE EXISTS (SELECT FROM tide.bench_inbox WHERE processed_at IS NULL) LOOP
		IF clock_timestamp() > deadline THEN
			RAISE EXCEPTION 'the relay did not process the inbox in time';
		END IF;
		PERFORM pg_sleep(0.01);
	END LOOP;
END
\$wait\$;
SELECT extract(epoch FROM max(processed_at)) - :t0 AS took FROM tide.bench_inbox \gset
SELECT tide.inbox_disable_handler('bench') \gset
SELECT :took;
SQL
}

scalar "SELECT version()"
log "throughput: $N events per run, $REPEATS rounds (client, relay)"
for rep in $(seq 1 "$REPEATS"); do
	reset_inbox
	c=$(client_seconds)
	check_drained
	reset_inbox
	r=$(relay_seconds | tail -n 1)
	check_drained
	cr=$(awk "BEGIN { print $N / $c }")
	rr=$(awk "BEGIN { print $N / $r }")
	ratio=$(awk "BEGIN { print $rr / $cr }")
	bench_record "events/s" client "$rep" "$cr"
	bench_record "events/s" relay "$rep" "$rr"
	printf '  round %s  client %9.0f events/s  relay %9.0f events/s  ratio %.3f\n' "$rep" "$cr" "$rr" "$ratio"
done

log "latency: $RATE events/s for ${DURATION}s, each received in its own transaction"
psql_db -c "TRUNCATE tide.bench_inbox, bench.effects" -c "SELECT tide.inbox_enable_handler('bench')" \
	-c "CREATE TABLE bench.sent (event_id text PRIMARY KEY, returned_us bigint NOT NULL)" >/dev/null
# Each client counts its transactions in k: its k-th event is 'l<client>-<k>'.
cat >"$TIDE_CLUSTER/receive.sql" <<'SQL'
\set k :k + 1
SELECT tide.inbox_receive('bench', 'l' || :client_id || '-' || :k, '{}');
SQL
rm -f "$TIDE_CLUSTER"/pgbench_lat.*
(cd "$TIDE_CLUSTER" && "$PGBENCH" -n -M prepared -c 1 -j 1 -R "$RATE" -T "$DURATION" -D k=0 \
	-l --log-prefix=pgbench_lat -f "$TIDE_CLUSTER/receive.sql" "$DB" >"$TIDE_CLUSTER/pgbench_latency.out" 2>&1) ||
	{ cat "$TIDE_CLUSTER/pgbench_latency.out"; exit 1; }
sleep 1
# pgbench logs each transaction after its commit returned, in order: client,
# transaction number, time, script, epoch seconds, microseconds; a client's
# n-th line is its n-th event.
cat "$TIDE_CLUSTER"/pgbench_lat.* | awk '{ printf "l%d-%d\t%d%06d\n", $1, ++n[$1], $5, $6 }' |
	psql_db -c "COPY bench.sent FROM STDIN"
read -r p50 p99 n sent <<<"$(scalar "
	SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 2),
		   round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 2), count(*),
		   (SELECT count(*) FROM bench.sent)
	  FROM (SELECT (extract(epoch FROM pg_xact_commit_timestamp(e.xmin)) * 1e6 - s.returned_us) / 1000 AS ms
			  FROM bench.sent s JOIN bench.effects e USING (event_id)) x" | tr '|' ' ')"
[ "$n" -eq "$sent" ] && [ "$n" -gt 0 ] ||
	{ echo "$BENCH_NAME: $n of the $sent events were handled" >&2; exit 1; }
bench_record "latency ms" p50 1 "$p50"
bench_record "latency ms" p99 1 "$p99"
printf '  %s events: from the commit returned to the handler commit, p50 %s ms, p99 %s ms\n' "$n" "$p50" "$p99"

bench_summary
