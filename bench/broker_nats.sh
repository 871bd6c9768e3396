#!/usr/bin/env bash
# The NATS JetStream sink: how fast the relay delivers a backlog to a
# stream, beside nats.c alone publishing the same messages with the same
# acknowledgements (bench/brokers/nats_client.c: async publishes, each
# counted once its PubAck came, Nats-Msg-Id set, the same headers and body,
# the same number in flight), in the same round; and the latency from a
# publishing transaction's commit to the message's arrival at a NATS
# subscriber, at RATE messages/s. See bench/README.md.
#
# Throughput: N messages are published while the pipeline is disabled, then
# one transaction enables it (and wakes the worker); the rate is N divided
# by the time from that commit to the recording of the last message
# (tide.relay_consumer_offsets.updated_at). The baseline's rate is N divided
# by the time its publishes took until the last PubAck. The ratio is
# relay / baseline, round by round.
#
# Latency: one pgbench client publishes one message per transaction at
# RATE/s for DURATION seconds; a core NATS subscriber on the subject
# (nats_client listen) logs each message's arrival; pgbench's per-
# transaction log gives each commit's end, and a client's k-th transaction
# published its k-th message by id.
#
# Run as root. pg_tide must already be built and installed, its NATS
# module included (libnats-dev installed when it was built); this script
# builds bench/brokers/nats_client and test/brokers/nats_tool. It starts
# its own cluster in /tmp/pg_tide_bench_nats on port 5498 and nats-server
# on 127.0.0.1:NATS_PORT with its store in the cluster's directory, and
# stops both at the end (KEEP_CLUSTER=1 leaves the cluster running).
#
# Settings from the environment:
#   N              messages per throughput run (default 100000)
#   REPEATS        rounds (default 3)
#   BATCH_SIZE     the pipeline's batch_size (default 1000)
#   MAX_IN_FLIGHT  the pipeline's and the baseline's in-flight limit (default 1000)
#   RATE, DURATION the latency run (default 200 messages/s for 10 s)
#   NATS_PORT      default 4398
#   TIDE_CLUSTER, TIDE_PORT, PG_CONFIG  as in bench/relay.sh
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIDE_CLUSTER=${TIDE_CLUSTER:-/tmp/pg_tide_bench_nats}
export TIDE_PORT=${TIDE_PORT:-5498}
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"
bench_relay_settings
MAX_IN_FLIGHT=${MAX_IN_FLIGHT:-1000}
RATE=${RATE:-200}
DURATION=${DURATION:-10}
NATS_PORT=${NATS_PORT:-4398}
NATS_URL=nats://127.0.0.1:$NATS_PORT

bench_need_packages nats-server libnats-dev
ROOT=$(cd "$BENCH_DIR/.." && pwd)
make -s -C "$ROOT" test/brokers/nats_tool >/dev/null
NATS_TOOL=$ROOT/test/brokers/nats_tool

tide_start_cluster
"$PG_BIN/createdb" "$DB"
CLIENT=$TIDE_CLUSTER/nats_client
cc -O2 -o "$CLIENT" "$BENCH_DIR/brokers/nats_client.c" $(pkg-config --cflags --libs libnats) -lpthread

NATS_PID=""
LISTEN_PID=""
cleanup() {
	[ -n "$LISTEN_PID" ] && kill "$LISTEN_PID" 2>/dev/null || true
	[ -n "$NATS_PID" ] && kill "$NATS_PID" 2>/dev/null || true
	bench_cleanup
}
trap cleanup EXIT

nats-server -js -a 127.0.0.1 -p "$NATS_PORT" -sd "$TIDE_CLUSTER/nats" >"$TIDE_CLUSTER/nats.log" 2>&1 &
NATS_PID=$!
for _ in $(seq 1 100); do
	"$NATS_TOOL" "$NATS_URL" create BENCH 'bench.>' 120 >/dev/null 2>&1 && break
	sleep 0.1
done
"$NATS_TOOL" "$NATS_URL" create BASE 'base.>' 120

psql_db >/dev/null <<SQL
CREATE EXTENSION pg_tide;
SELECT tide.outbox_create('wake', p_inline_threshold => 2000000000);
SELECT tide.relay_set_outbox('wake', 'wake', 'wake',
	'{"sink_type": "file", "path": "$TIDE_CLUSTER/wake.jsonl", "fsync": false}');
CREATE SCHEMA bench;
-- about 200 bytes, as in bench/relay.sh; one header beside pg_tide's
CREATE FUNCTION bench.payload(i bigint) RETURNS jsonb LANGUAGE sql AS \$\$
	SELECT jsonb_build_object('event', 'order.created',
		'order_id', 10000000 + i, 'customer_id', 100000 + i % 900000,
		'amount_cents', 100 + i % 99900, 'currency', 'EUR', 'items', 3,
		'sku', 'SKU-' || lpad(((10000000 + i) % 100000000)::text, 8, '0'),
		'created_at', now())
\$\$;
SQL
# The baseline's body: the jsonb text of one such payload.
psql_db -A -t -c "SELECT bench.payload(1)::text" | tr -d '\n' >"$TIDE_CLUSTER/payload.json"

config() {
	printf '{"sink_type": "nats", "servers": "%s", "subject": "bench.%s", "batch_size": %s, "max_in_flight": %s}' \
		"$NATS_URL" "$1" "$BATCH_SIZE" "$MAX_IN_FLIGHT"
}

# relay_run <round>: prints the messages per second of the relay.
relay_run() {
	local name=nats_$1 last start end
	psql_db >/dev/null <<SQL
SELECT tide.outbox_create('$name', p_inline_threshold => 2000000000);
BEGIN;
SELECT tide.relay_set_outbox('$name', '$name', '$name', '$(config "$name")');
SELECT tide.relay_disable('$name');
COMMIT;
DO \$\$
BEGIN
	FOR c IN 0 .. ($N - 1) / 10000 LOOP
		PERFORM tide.outbox_publish_batch('$name',
			(SELECT array_agg(bench.payload(i) ORDER BY i)
			   FROM generate_series(c * 10000::bigint, least(c * 10000 + 9999, $N - 1)) i),
			jsonb_build_object('trace_id', md5(c::text)));
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
SELECT tide.outbox_publish('wake', '{}');
SELECT extract(epoch FROM clock_timestamp());
COMMIT;
SQL
)
	end=$(bench_wait_recorded "$name" "$last") || exit 1
	[ "$(psql_db -A -t -c "SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = '$name'")" = 0 ] ||
		{ echo "broker_nats.sh: $name dead-lettered messages" >&2; exit 1; }
	psql_db -c "SELECT tide.relay_delete('$name')" -c "SELECT tide.outbox_drop('$name')" >/dev/null
	awk "BEGIN { print $N / ($end - $start) }"
}

# baseline_run: prints the messages per second of nats.c alone.
baseline_run() {
	local secs failures
	read -r secs failures < <("$CLIENT" "$NATS_URL" publish base.x "$N" "$MAX_IN_FLIGHT" "$TIDE_CLUSTER/payload.json")
	[ "$failures" = 0 ] || { echo "broker_nats.sh: the baseline had $failures failures" >&2; exit 1; }
	awk "BEGIN { print $N / $secs }"
}

log "throughput: $N messages, batch_size $BATCH_SIZE, max_in_flight $MAX_IN_FLIGHT, $REPEATS rounds"
for round in $(seq 1 "$REPEATS"); do
	relay=$(relay_run "$round")
	base=$(baseline_run)
	ratio=$(awk "BEGIN { print $relay / $base }")
	bench_record nats_throughput relay "$round" "$relay"
	bench_record nats_throughput nats.c "$round" "$base"
	bench_record nats_throughput ratio "$round" "$ratio"
	printf '  round %s  relay %8.0f msg/s  nats.c alone %8.0f msg/s  ratio %.2f\n' "$round" "$relay" "$base" "$ratio"
done

log "latency: $RATE messages/s for $DURATION s, commit to arrival at a NATS subscriber"
psql_db >/dev/null <<SQL
SELECT tide.outbox_create('lat', p_inline_threshold => 2000000000);
SELECT tide.relay_set_outbox('lat', 'lat', 'lat', '$(config lat)');
SQL
"$CLIENT" "$NATS_URL" listen bench.lat >"$TIDE_CLUSTER/arrivals.txt" 2>"$TIDE_CLUSTER/listen.err" &
LISTEN_PID=$!
for _ in $(seq 1 100); do grep -q subscribed "$TIDE_CLUSTER/listen.err" && break; sleep 0.05; done
psql_db -c "SELECT tide.outbox_publish('lat', '{\"warm-up\": true}')" >/dev/null
sleep 1
: >"$TIDE_CLUSTER/arrivals.txt"
printf "SELECT tide.outbox_publish('lat', bench.payload(1));\n" >"$TIDE_CLUSTER/latency.sql"
rm -f "$TIDE_CLUSTER"/pgbench_lat.*
(cd "$TIDE_CLUSTER" && "$PGBENCH" -n -M prepared -c 1 -R "$RATE" -T "$DURATION" -l --log-prefix=pgbench_lat \
	-f "$TIDE_CLUSTER/latency.sql" "$DB" >"$TIDE_CLUSTER/pgbench_lat.out" 2>&1) ||
	{ cat "$TIDE_CLUSTER/pgbench_lat.out"; exit 1; }
sleep 1
kill "$LISTEN_PID" 2>/dev/null || true
wait "$LISTEN_PID" 2>/dev/null || true
LISTEN_PID=""
# k-th transaction (end: epoch seconds and microseconds, fields 5 and 6)
# against the k-th message by id.
sort -t: -k2,2n "$TIDE_CLUSTER/arrivals.txt" | awk '{ print $2 }' >"$TIDE_CLUSTER/arrive_us.txt"
awk '{ printf "%.0f\n", $5 * 1000000 + $6 }' "$TIDE_CLUSTER"/pgbench_lat.[0-9]* >"$TIDE_CLUSTER/commit_us.txt"
sent=$(wc -l <"$TIDE_CLUSTER/commit_us.txt")
paste "$TIDE_CLUSTER/commit_us.txt" "$TIDE_CLUSTER/arrive_us.txt" |
	awk 'NF == 2 { print ($2 - $1) / 1000 }' | sort -g >"$TIDE_CLUSTER/latency_ms.txt"
got=$(wc -l <"$TIDE_CLUSTER/latency_ms.txt")
p50=$(awk -v n="$got" 'NR == int((n + 1) / 2) { print; exit }' "$TIDE_CLUSTER/latency_ms.txt")
p99=$(awk -v n="$got" 'NR == int(n * 0.99 + 0.5) { print; exit }' "$TIDE_CLUSTER/latency_ms.txt")
bench_record nats_latency_ms p50 1 "$p50"
bench_record nats_latency_ms p99 1 "$p99"
printf '  %d published, %d arrived; commit to arrival p50 %.2f ms, p99 %.2f ms\n' "$sent" "$got" "$p50" "$p99"
bench_summary
