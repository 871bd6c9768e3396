#!/usr/bin/env bash
# The Kafka sink: a backlog of N messages delivered by the relay to
# librdkafka's mock cluster (test/brokers/kafka_mock), beside librdkafka
# alone (bench/brokers/kafka_client.c) producing N messages of the same size
# and headers to the same cluster with the same acknowledgement settings
# (idempotent producer, acks=all, linger.ms 1, the sink's default) and the same number in flight,
# in the same round; and the latency from a publishing commit to the message's
# arrival at a consumer at RATE messages/s. See bench/README.md.
#
# Throughput: N messages are published while the pipeline is disabled (the
# payload and headers of bench/relay.sh, about 200 and 114 bytes), then one
# transaction enables it and wakes the worker; the rate is N divided by the
# time from that commit to the recording of the last message
# (tide.relay_consumer_offsets.updated_at). The client's rate is N divided by
# the time from its first produce to its last delivery report. Both write to
# topics of PARTITIONS partitions of the same mock cluster, which runs on the
# same machine and takes a share of its CPU for both.
#
# Latency: pgbench publishes one message per transaction at RATE/s for
# DURATION s from one client; a librdkafka consumer (test/brokers/
# kafka_consume, fetch.wait.max.ms 1) notes each message's arrival; a
# message's latency is its arrival minus the time its publishing
# transaction's commit returned to pgbench. Arrival at a consumer comes after
# the broker's acknowledgement, so this is an upper bound of
# commit-to-broker. The second figure is commit-to-broker itself: from the
# commit to the message's delivery report, which is when its batch was
# started (tide.relay_attempts.attempted_at) plus the time from its send to
# its report (latency_ms); the latency pipeline logs every attempt for it
# ("attempt_log": true; a Kafka pipeline logs failures only by default).
#
# Run as root. pg_tide must already be built and installed with the Kafka
# sink (pg_tide_kafka.so). It starts its own cluster in
# /tmp/pg_tide_bench_kafka on port 5496 (KEEP_CLUSTER=1 leaves it running)
# and the mock cluster on 127.0.0.1.
#
# Settings from the environment:
#   N            messages of a throughput run (default 100000)
#   REPEATS      rounds (default 3)
#   BATCH_SIZE   the pipeline's batch_size (default 1000)
#   MAX_IN_FLIGHT  the pipeline's max_in_flight and the client's (default 1000)
#   PARTITIONS   of each topic (default 3)
#   EXTRA_CONFIG more members of the pipelines' config, e.g. '"linger_ms": 0'
#   RATE         messages/s of the latency run (default 200)
#   DURATION     seconds of the latency run (default 10)
#   TIDE_CLUSTER, TIDE_PORT, PG_CONFIG  as in bench/relay.sh
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
export TIDE_CLUSTER=${TIDE_CLUSTER:-/tmp/pg_tide_bench_kafka}
export TIDE_PORT=${TIDE_PORT:-5496}
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"

bench_relay_settings
MAX_IN_FLIGHT=${MAX_IN_FLIGHT:-1000}
PARTITIONS=${PARTITIONS:-3}
RATE=${RATE:-200}
DURATION=${DURATION:-10}

bench_need_module kafka "install librdkafka-dev, then build and install pg_tide"
make -s -C "$ROOT" PG_CONFIG="$PG_CONFIG" test/brokers/kafka_mock test/brokers/kafka_consume \
	bench/brokers/kafka_client >/dev/null

MOCK_PID=
cleanup() {
	[ -n "$MOCK_PID" ] && kill "$MOCK_PID" 2>/dev/null || true
	bench_cleanup
}
trap cleanup EXIT

tide_start_cluster
"$PG_BIN/createdb" "$DB"

# The mock cluster, its commands through a fifo (see kafka_mock.c).
rm -f "$TIDE_CLUSTER/mock.in"
mkfifo "$TIDE_CLUSTER/mock.in"
"$ROOT/test/brokers/kafka_mock" <"$TIDE_CLUSTER/mock.in" >"$TIDE_CLUSTER/mock.out" 2>&1 &
MOCK_PID=$!
exec 7>"$TIDE_CLUSTER/mock.in"
for _ in $(seq 1 50); do
	[ -s "$TIDE_CLUSTER/mock.out" ] && break
	sleep 0.1
done
BOOTSTRAP=$(head -n 1 "$TIDE_CLUSTER/mock.out")
mock() { echo "$1" >&7; sleep 0.1; }

psql_db >/dev/null <<SQL
CREATE EXTENSION pg_tide;
SELECT tide.outbox_create('wake', p_inline_threshold => 2000000000);
SELECT tide.relay_set_outbox('wake', 'wake', 'wake',
	'{"sink_type": "file", "path": "$TIDE_CLUSTER/wake.jsonl", "fsync": false}');
SQL
psql_db -f "$BENCH_DIR/payload.sql" >/dev/null
psql_db -A -t -c "SELECT version()"

config() {
	printf '{"sink_type": "kafka", "bootstrap_servers": "%s", "topic": "%s", "batch_size": %s, "max_in_flight": %s%s}' \
		"$BOOTSTRAP" "$1" "$BATCH_SIZE" "$MAX_IN_FLIGHT" "${2:-}${EXTRA_CONFIG:+, $EXTRA_CONFIG}"
}

# pipeline <round>: the relay's rate for a backlog of N.
pipeline() {
	local name=kafka_$1 last start end
	mock "create $name $PARTITIONS"
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
			bench.headers(c));
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
	if [ "$(psql_db -A -t -c "SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = '$name'")" != 0 ]; then
		echo "$BENCH_NAME: $name dead-lettered messages" >&2
		exit 1
	fi
	psql_db -c "SELECT tide.relay_delete('$name')" -c "SELECT tide.outbox_drop('$name')" >/dev/null
	awk -v n="$N" -v s="$start" -v e="$end" 'BEGIN { printf "%.1f\n", n / (e - s) }'
}

# client <round>: librdkafka alone.
client() {
	mock "create client_$1 $PARTITIONS"
	"$ROOT/bench/brokers/kafka_client" "$BOOTSTRAP" "client_$1" "$N" "$MAX_IN_FLIGHT" | awk '{ print $2 }'
}

# latency <round>: p50, p95, p99, max (ms) from commit to arrival at RATE/s,
# the counts, and p50, p99 from commit to the delivery report.
latency() {
	local name=lat_$1 consumer pglog
	mock "create $name 1"
	psql_db -c "SELECT tide.outbox_create('$name', p_inline_threshold => 2000000000)" \
		-c "SELECT tide.relay_set_outbox('$name', '$name', '$name', '$(config "$name" ', "attempt_log": true')')" >/dev/null
	psql_db -c "SELECT tide.outbox_publish('$name', '{\"warm-up\": true}')" >/dev/null
	sleep 1
	"$ROOT/test/brokers/kafka_consume" "$BOOTSTRAP" "$name" 3000 follow >"$TIDE_CLUSTER/consumed_$name.jsonl" &
	consumer=$!
	sleep 1
	sed -e "s/'bench'/'$name'/" "$BENCH_DIR/tide_single.sql" >"$TIDE_CLUSTER/latency.sql"
	rm -f "$TIDE_CLUSTER"/pgbench_"$name".*
	(cd "$TIDE_CLUSTER" && "$PGBENCH" -n -M prepared -c 1 -j 1 -R "$RATE" -T "$DURATION" \
		-l --log-prefix="pgbench_$name" -f "$TIDE_CLUSTER/latency.sql" "$DB" >"$TIDE_CLUSTER/pgbench_$name.out" 2>&1) ||
		{ cat "$TIDE_CLUSTER/pgbench_$name.out"; exit 1; }
	wait "$consumer" || true
	pglog=$TIDE_CLUSTER/pgbench_$name.log
	cat "$TIDE_CLUSTER"/pgbench_"$name".[0-9]* >"$pglog"
	chmod a+r "$pglog" "$TIDE_CLUSTER/consumed_$name.jsonl"
	# One client: its k-th transaction published the k-th message by id.
	psql_db -A -t -F ' ' <<SQL
CREATE TEMP TABLE got (line text);
CREATE TEMP TABLE pgb (line text);
COPY got FROM '$TIDE_CLUSTER/consumed_$name.jsonl' WITH (FORMAT csv, QUOTE e'\x01', DELIMITER e'\x02');
COPY pgb FROM '$pglog' WITH (FORMAT csv, QUOTE e'\x01', DELIMITER e'\x02');
CREATE TEMP VIEW arrived AS
	SELECT substring(h ->> 1 FROM '[0-9]+\$')::bigint AS id, min((line::jsonb ->> 't')::float8) AS t
	  FROM got, jsonb_array_elements(line::jsonb -> 'headers') h WHERE h ->> 0 = 'tide-id' GROUP BY 1;
CREATE TEMP VIEW published AS
	SELECT row_number() OVER (ORDER BY id) AS k, id
	  FROM tide.tide_outbox_messages WHERE outbox_name = '$name' AND payload ? 'order_id';
CREATE TEMP VIEW committed AS
	SELECT row_number() OVER () AS k, f[5]::float8 + f[6]::float8 / 1e6 AS done
	  FROM (SELECT string_to_array(line, ' ') AS f FROM pgb) p;
CREATE TEMP VIEW lat AS
	SELECT (a.t - c.done) * 1000 AS ms FROM published p JOIN committed c USING (k) JOIN arrived a USING (id);
CREATE TEMP VIEW acked AS
	SELECT (extract(epoch FROM r.attempted_at) + r.latency_ms / 1000.0 - c.done) * 1000 AS ms
	  FROM published p JOIN committed c USING (k)
	  JOIN tide.relay_attempts r ON r.message_id = p.id AND r.pipeline_id = '$name' AND r.status = 'success';
SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 2),
	   round(percentile_cont(0.95) WITHIN GROUP (ORDER BY ms)::numeric, 2),
	   round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 2),
	   round(max(ms)::numeric, 2),
	   (SELECT count(*) FROM published), (SELECT count(*) FROM committed), count(*),
	   (SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 2) FROM acked),
	   (SELECT round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 2) FROM acked)
  FROM lat;
SQL
	psql_db -c "SELECT tide.relay_delete('$name')" -c "SELECT tide.outbox_drop('$name')" >/dev/null
}

log "$REPEATS rounds: a backlog of $N (batch_size $BATCH_SIZE, max_in_flight $MAX_IN_FLIGHT, $PARTITIONS partitions); latency at $RATE/s for ${DURATION}s"
for round in $(seq 1 "$REPEATS"); do
	p=$(pipeline "$round")
	c=$(client "$round")
	ratio=$(awk -v p="$p" -v c="$c" 'BEGIN { printf "%.3f", p / c }')
	bench_record throughput "pipeline msg/s" "$round" "$p"
	bench_record throughput "client msg/s" "$round" "$c"
	bench_record throughput "ratio" "$round" "$ratio"
	lat=$(latency "$round")
	read -r p50 p95 p99 max published committed paired ack50 ack99 <<<"$lat"
	if [ "$published" != "$committed" ] || [ "$paired" != "$published" ]; then
		echo "$BENCH_NAME: latency round $round: $published published, $committed committed, $paired arrived and paired" >&2
		exit 1
	fi
	bench_record "latency_$RATE" p50 "$round" "$p50"
	bench_record "latency_$RATE" p95 "$round" "$p95"
	bench_record "latency_$RATE" p99 "$round" "$p99"
	bench_record "latency_$RATE" max "$round" "$max"
	bench_record "latency_${RATE}_acknowledged" p50 "$round" "$ack50"
	bench_record "latency_${RATE}_acknowledged" p99 "$round" "$ack99"
	printf '  round %s: pipeline %s msg/s, client %s msg/s, ratio %s; at %s/s commit to consumer p50 %s p95 %s p99 %s max %s ms, commit to delivery report p50 %s p99 %s ms (%s messages)\n' \
		"$round" "$p" "$c" "$ratio" "$RATE" "$p50" "$p95" "$p99" "$max" "$ack50" "$ack99" "$paired"
done
bench_summary
