#!/usr/bin/env bash
# The redis sink: a backlog of N messages (default 100,000) delivered by the
# relay to a Redis stream (XADD, each message acknowledged by its entry id,
# MAX_IN_FLIGHT in flight), beside Redis's own C client (hiredis,
# bench/brokers/redis_client.c) appending the same messages with the same
# fields, the same acknowledgement and the same number in flight, in the
# same round; and the commit-to-broker latency at RATE messages/s.
#
# Throughput: N messages wait while the pipeline is disabled; one
# transaction enables it and wakes the worker; the rate is N divided by the
# time from that commit to the recording of the last message
# (tide.relay_consumer_offsets.updated_at). The client's rate is N divided
# by the time from its first XADD to its last answer. The pipeline runs
# twice a round: as configured by default ("attempt_log": "failures", a
# broker sink's default: no row per delivered message) and with
# "attempt_log": false; the two should agree, and how far they differ shows
# the spread of a run. One unmeasured run of the client comes first.
#
# Latency: pgbench publishes one message per transaction at RATE/s for
# DURATION seconds from one client; a message's latency is the time Redis
# appended it (its entry id, in milliseconds of the server's clock, which is
# this machine's) minus the time its transaction's commit returned to
# pgbench (pgbench's per-transaction log, paired by order: one client
# publishes one message per transaction). Entry ids have millisecond
# resolution, so each latency is floored to the millisecond.
#
# Run as root, with pg_tide built and installed with its redis module
# (pg_tide_redis.so: libhiredis-dev installed when it was built). Starts a
# throwaway cluster in /tmp/pg_tide_bench_redis on port 5496 and a Redis
# server on a free port of 127.0.0.1 (appendonly no, as the sink's tests),
# both stopped at the end.
#
# Settings from the environment:
#   N              backlog (default 100000)
#   REPEATS        rounds (default 3)
#   MAX_IN_FLIGHT  XADDs in flight, for both (default 100)
#   BATCH_SIZE     the pipeline's batch_size (default 1000)
#   RATE, DURATION the latency run (default 200 messages/s for 10 s)
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIDE_CLUSTER=${TIDE_CLUSTER:-/tmp/pg_tide_bench_redis}
export TIDE_PORT=${TIDE_PORT:-5496}
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"

bench_relay_settings
MAX_IN_FLIGHT=${MAX_IN_FLIGHT:-100}
RATE=${RATE:-200}
DURATION=${DURATION:-10}

bench_need_packages redis-server redis-tools libhiredis-dev
bench_need_module redis "build pg_tide with libhiredis-dev installed"
CLIENT=$TIDE_CLUSTER/redis_client
REDIS_DIR=$TIDE_CLUSTER/redis

tide_start_cluster
"$PG_BIN/createdb" "$DB"
psql_db -c "CREATE EXTENSION pg_tide"
gcc -O2 -o "$CLIENT" "$BENCH_DIR/brokers/redis_client.c" -lhiredis

# Redis on a free port from a random point of 20000-29999 on.
mkdir -p "$REDIS_DIR"
chown postgres: "$REDIS_DIR"
for p in $(seq $((20000 + RANDOM % 9000)) 29999); do
	ss -Hltn "sport = :$p" | grep -q . && continue
	runuser -u postgres -- redis-server --bind 127.0.0.1 --port "$p" --save '' --appendonly no \
		--dir "$REDIS_DIR" --daemonize yes --pidfile "$REDIS_DIR/redis.pid" --logfile "$REDIS_DIR/redis.log"
	for _ in $(seq 1 100); do
		redis-cli -p "$p" PING 2>/dev/null | grep -q PONG && break
		sleep 0.05
	done
	redis-cli -p "$p" PING 2>/dev/null | grep -q PONG && { REDIS_PORT=$p; break; }
done
[ -n "${REDIS_PORT:-}" ] || { echo "$BENCH_NAME: could not start redis-server" >&2; exit 1; }
stop_redis() {
	[ -f "$REDIS_DIR/redis.pid" ] && kill "$(cat "$REDIS_DIR/redis.pid")" 2>/dev/null || true
	bench_cleanup
}
trap stop_redis EXIT

CONFIG="{\"sink_type\": \"redis\", \"url\": \"redis://127.0.0.1:$REDIS_PORT\", \"stream\": \"bench\",
  \"batch_size\": $BATCH_SIZE, \"max_in_flight\": $MAX_IN_FLIGHT}"

# The messages: the payload and headers redis_client.c sends.
psql_db <<'SQL'
CREATE SCHEMA bench;
CREATE FUNCTION bench.payload(i bigint) RETURNS jsonb LANGUAGE sql IMMUTABLE
RETURN jsonb_build_object('event', 'order.created', 'order_id', i,
						  'customer_id', i % 1000000, 'amount_cents', 100 + i % 100000);
SQL

# pipeline <round> <case> <config>: the relay delivers the backlog; records its rate.
pipeline() {
	local round=$1 case=$2 config=$3 name=redis_$1_$2 last start end
	redis-cli -p "$REDIS_PORT" DEL bench >/dev/null
	psql_db <<SQL
SELECT tide.outbox_create('$name', p_inline_threshold => 2000000000);
BEGIN;
SELECT tide.relay_set_outbox('$name', '$name', '$name', '$config');
SELECT tide.relay_disable('$name');
COMMIT;
DO \$\$
BEGIN
	FOR c IN 0 .. ($N - 1) / 10000 LOOP
		PERFORM tide.outbox_publish_batch('$name',
			(SELECT array_agg(bench.payload(i) ORDER BY i)
			   FROM generate_series(c * 10000::bigint, least(c * 10000 + 9999, $N - 1)) i),
			'{"type": "order.created"}');
		COMMIT;
	END LOOP;
END
\$\$;
VACUUM ANALYZE tide.tide_outbox_messages;
CHECKPOINT;
SQL
	last=$(psql_db -A -t -c "SELECT max(id) FROM tide.tide_outbox_messages WHERE outbox_name = '$name'")
	start=$(psql_db -A -t <<SQL | tail -n 1
BEGIN;
SELECT tide.relay_enable('$name');
SELECT extract(epoch FROM clock_timestamp());
COMMIT;
SQL
)
	end=$(bench_wait_recorded "$name" "$last") || exit 1
	local got
	got=$(redis-cli -p "$REDIS_PORT" XLEN bench)
	[ "$got" -ge "$N" ] || { echo "$BENCH_NAME: $name: $got of $N in the stream" >&2; exit 1; }
	PIPE_RATE=$(echo "$N / ($end - $start)" | bc -l)
	bench_record pipeline_msg_s "$case" "$round" "$PIPE_RATE"
	psql_db -c "SELECT tide.relay_delete('$name')" -c "SELECT tide.outbox_drop('$name')" >/dev/null
}

# client <round>: hiredis alone appends as many; records its rate.
client() {
	local round=$1 secs
	redis-cli -p "$REDIS_PORT" DEL bench >/dev/null
	secs=$("$CLIENT" 127.0.0.1 "$REDIS_PORT" bench "$N" "$MAX_IN_FLIGHT")
	CLIENT_RATE=$(echo "$N / $secs" | bc -l)
	bench_record client_msg_s hiredis "$round" "$CLIENT_RATE"
}

# latency <round>: commit-to-broker latency at RATE/s.
latency() {
	local round=$1 name=lat_$1 n
	redis-cli -p "$REDIS_PORT" DEL bench >/dev/null
	psql_db <<SQL
SELECT tide.outbox_create('$name');
SELECT tide.relay_set_outbox('$name', '$name', '$name', '$CONFIG');
SQL
	echo "SELECT tide.outbox_publish('$name', bench.payload(1), '{\"type\": \"order.created\"}');" >"$TIDE_CLUSTER/lat.sql"
	sleep 1
	rm -f "$TIDE_CLUSTER"/pgbench_lat.*
	(cd "$TIDE_CLUSTER" && runuser -u postgres -- "$PGBENCH" -n -c 1 -j 1 -R "$RATE" -T "$DURATION" \
		-l --log-prefix=pgbench_lat -f lat.sql "$DB" >pgbench_lat.out 2>&1)
	n=$(cat "$TIDE_CLUSTER"/pgbench_lat.[0-9]* | wc -l)
	local deadline=$((SECONDS + 60))
	until [ "$(redis-cli -p "$REDIS_PORT" XLEN bench)" -ge "$n" ]; do
		[ $SECONDS -gt $deadline ] && { echo "$BENCH_NAME: latency: not all $n arrived" >&2; exit 1; }
		sleep 0.1
	done
	# k-th commit (epoch us) beside the k-th entry's time (ms, from its id)
	paste <(awk '{ printf "%d%06d\n", $5, $6 }' "$TIDE_CLUSTER"/pgbench_lat.[0-9]*) \
		<(redis-cli -p "$REDIS_PORT" --raw XRANGE bench - + | grep -E '^[0-9]+-[0-9]+$' | cut -d- -f1) |
		awk '{ print ($2 * 1000 - $1) / 1000 }' | sort -g >"$TIDE_CLUSTER/lat_$round.txt"
	local p50 p99
	p50=$(awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }' "$TIDE_CLUSTER/lat_$round.txt")
	p99=$(awk '{ v[NR] = $1 } END { print v[int(NR * 0.99)] }' "$TIDE_CLUSTER/lat_$round.txt")
	bench_record "latency_${RATE}_p50_ms" redis "$round" "$p50"
	bench_record "latency_${RATE}_p99_ms" redis "$round" "$p99"
	psql_db -c "SELECT tide.relay_delete('$name')" -c "SELECT tide.outbox_drop('$name')" >/dev/null
}

log "$REPEATS rounds: a backlog of $N, $MAX_IN_FLIGHT in flight, batch_size $BATCH_SIZE; latency at $RATE/s for ${DURATION}s"
NO_LOG_CONFIG="${CONFIG%\}}, \"attempt_log\": false}"
# Redis grows its memory during its first appends: one run of the client,
# not measured, first, so that no measured run pays for that alone.
redis-cli -p "$REDIS_PORT" DEL bench >/dev/null
"$CLIENT" 127.0.0.1 "$REDIS_PORT" bench "$N" "$MAX_IN_FLIGHT" >/dev/null
for round in $(seq 1 "$REPEATS"); do
	pipeline "$round" redis "$CONFIG"
	client "$round"
	bench_record ratio pipeline_vs_hiredis "$round" "$(echo "$PIPE_RATE / $CLIENT_RATE" | bc -l)"
	log "round $round: pipeline $(printf %.0f "$PIPE_RATE") msg/s, hiredis $(printf %.0f "$CLIENT_RATE") msg/s"
	pipeline "$round" redis_no_log "$NO_LOG_CONFIG"
	bench_record ratio no_log_vs_hiredis "$round" "$(echo "$PIPE_RATE / $CLIENT_RATE" | bc -l)"
	latency "$round"
done
bench_summary
