#!/usr/bin/env bash
# The MQTT sink (relay/endpoints/mqtt/sink.c) against a Mosquitto broker on
# 127.0.0.1: the rate at which a pipeline delivers a backlog, beside
# libmosquitto alone (bench/brokers/mqtt_client.c) publishing the same
# messages (MQTT 5, the same QoS, user properties and body size) with the
# same number in flight, in the same round; and the latency from a
# publishing transaction's commit to the message's arrival at a subscriber
# at RATE messages/s. See bench/README.md.
#
# Throughput: N messages wait while the pipeline is disabled; one
# transaction enables it; the rate is N divided by the time from that
# commit to the recording of the last one (relay_consumer_offsets'
# updated_at). The baseline's rate is N divided by the time from its first
# publish to its last acknowledgement (it is connected before). Nothing
# subscribes to the topic during these runs, on both sides.
# Latency: pgbench publishes one message per transaction (bench/tide_single.sql)
# at RATE/s for DURATION s from one client; mosquitto_sub (QoS 1) prints
# each message with its time of arrival; a message's latency is that time
# minus the time its transaction's commit returned to pgbench (pgbench's
# per-transaction log; its k-th transaction published the k-th message).
#
# Run as root, with pg_tide and pg_tide_mqtt.so built and installed. It
# starts its own cluster in /tmp/pg_tide_bench_mqtt on port 5498 and a
# broker on a free port, and stops both at the end.
#
# Settings from the environment:
#   N              messages of the backlog (default 100000)
#   REPEATS        rounds (default 3)
#   QOS            1 (default) or 2
#   MAX_IN_FLIGHT  messages in flight, both sides (default 100)
#   BATCH_SIZE     the pipeline's batch_size (default 1000)
#   RATE, DURATION the latency run: messages/s (default 200) and seconds (default 10)
#   EXTRA_CONFIG   more members of the pipelines' config, e.g. '"attempt_log": false'
#                  (default none)
#   NODELAY        1 (default): the broker runs with set_tcp_nodelay true; 0: Mosquitto's default
#   TIDE_CLUSTER, TIDE_PORT, PG_CONFIG  as in bench/relay.sh
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIDE_CLUSTER=${TIDE_CLUSTER:-/tmp/pg_tide_bench_mqtt}
export TIDE_PORT=${TIDE_PORT:-5498}
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"
bench_relay_settings
QOS=${QOS:-1}
MAX_IN_FLIGHT=${MAX_IN_FLIGHT:-100}
RATE=${RATE:-200}
DURATION=${DURATION:-10}

bench_need_packages mosquitto mosquitto-clients libmosquitto-dev
[ -f "$("${PG_CONFIG:-/usr/bin/pg_config}" --pkglibdir)/pg_tide_mqtt.so" ] ||
	{ echo "broker_mqtt.sh: pg_tide_mqtt.so is not installed (build pg_tide with libmosquitto-dev)" >&2; exit 1; }

MQ_PID=""
SUB_PID=""
cleanup() {
	[ -n "$SUB_PID" ] && kill "$SUB_PID" 2>/dev/null || true
	[ -n "$MQ_PID" ] && kill "$MQ_PID" 2>/dev/null || true
	bench_cleanup
}
trap cleanup EXIT

tide_start_cluster
"$PG_BIN/createdb" "$DB"
psql_db -c "CREATE EXTENSION pg_tide" >/dev/null
cc -O2 -Wall -o "$TIDE_CLUSTER/mqtt_client" "$BENCH_DIR/brokers/mqtt_client.c" -lmosquitto

# The broker, on a free port from a random point of 20000-29999 on, with
# Nagle's algorithm off on its sockets (set_tcp_nodelay; Mosquitto's default
# leaves it on, which holds small packets such as PUBACKs until the peer's
# delayed acknowledgement: tens of milliseconds, for the pipeline and the
# client alike). NODELAY=0 runs it with Mosquitto's default.
mkdir -p "$TIDE_CLUSTER/mosquitto"
for p in $(seq $((20000 + RANDOM % 9000)) 29999); do
	ss -Hltn "sport = :$p" | grep -q . && continue
	printf 'listener %s 127.0.0.1\nallow_anonymous true\nmax_queued_messages 0\nmax_inflight_messages 0\n%s' "$p" \
		"$([ "${NODELAY:-1}" = 1 ] && echo 'set_tcp_nodelay true')" >"$TIDE_CLUSTER/mosquitto/mosquitto.conf"
	mosquitto -c "$TIDE_CLUSTER/mosquitto/mosquitto.conf" >"$TIDE_CLUSTER/mosquitto/log" 2>&1 &
	MQ_PID=$!
	sleep 0.3
	if kill -0 "$MQ_PID" 2>/dev/null; then MQ_PORT=$p; break; fi
	MQ_PID=""
done
[ -n "$MQ_PID" ] || { echo "broker_mqtt.sh: could not start mosquitto" >&2; exit 1; }
log "mosquitto $(mosquitto -h 2>/dev/null | head -n 1 | awk '{print $3}') on port $MQ_PORT; $REPEATS rounds of $N messages, QoS $QOS, $MAX_IN_FLIGHT in flight, batch_size $BATCH_SIZE"

# The messages of bench/tide_single.sql, for outbox $1 (the latency run).
publish_sql() {
	sed -e "s/'bench'/'$1'/" "$BENCH_DIR/tide_single.sql"
}

config() {
	printf '{"sink_type": "mqtt", "host": "127.0.0.1", "port": %s, "topic": "%s", "qos": %s, "max_in_flight": %s, "batch_size": %s%s}' \
		"$MQ_PORT" "$1" "$QOS" "$MAX_IN_FLIGHT" "$BATCH_SIZE" "${EXTRA_CONFIG:+, $EXTRA_CONFIG}"
}

drop_pipeline() {
	psql_db -c "SELECT tide.relay_delete(name) FROM tide.relay_outbox_config WHERE name = '$1'" \
		-c "SELECT tide.outbox_drop('$1', p_if_exists => true)" >/dev/null
}

psql_db -c "SELECT tide.outbox_create('wake')" >/dev/null
# The backlog's messages, as bench/relay.sh's: tide_single.sql's payload
# and headers (bench/payload.sql), published 10,000 per transaction.
psql_db -f "$BENCH_DIR/payload.sql" >/dev/null

for round in $(seq 1 "$REPEATS"); do
	# --- the pipeline
	name=backlog_$round
	drop_pipeline "$name"
	psql_db -c "SELECT tide.outbox_create('$name', p_inline_threshold => 2000000000)" \
		-c "SELECT tide.relay_set_outbox('$name', '$name', '$name', '$(config "$name")')" \
		-c "SELECT tide.relay_disable('$name')" >/dev/null
	psql_db <<SQL
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
	body_bytes=$(psql_db -A -t -c "SELECT round(avg(length(payload::text))) FROM tide.tide_outbox_messages WHERE outbox_name = '$name'")
	start=$(psql_db -A -t <<SQL | tail -n 1
BEGIN;
SELECT tide.relay_enable('$name');
SELECT tide.outbox_publish('wake', '{}');
SELECT extract(epoch FROM clock_timestamp());
COMMIT;
SQL
)
	end=$(bench_wait_recorded "$name" "$last") || exit 1
	failed=$(psql_db -A -t -c "SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = '$name' AND status = 'failed'")
	[ "$failed" = 0 ] || { echo "broker_mqtt.sh: $name: $failed failed attempts" >&2; exit 1; }
	pipeline=$(awk "BEGIN { printf \"%.1f\", $N / ($end - $start) }")
	drop_pipeline "$name"
	# --- libmosquitto alone, the same messages
	client=$("$TIDE_CLUSTER/mqtt_client" 127.0.0.1 "$MQ_PORT" "$name" "$N" "$MAX_IN_FLIGHT" "$QOS" "$body_bytes")
	ratio=$(awk "BEGIN { printf \"%.3f\", $pipeline / $client }")
	printf '  round %s: pipeline %s msg/s, libmosquitto alone %s msg/s (body %s bytes): ratio %s\n' \
		"$round" "$pipeline" "$client" "$body_bytes" "$ratio"
	bench_record backlog_msg_s pipeline "$round" "$pipeline"
	bench_record backlog_msg_s libmosquitto "$round" "$client"
	bench_record backlog_ratio pipeline/client "$round" "$ratio"

	# --- latency at RATE/s
	name=latency_$round
	drop_pipeline "$name"
	psql_db -c "SELECT tide.outbox_create('$name', p_inline_threshold => 2000000000)" \
		-c "SELECT tide.relay_set_outbox('$name', '$name', '$name', '$(config "$name")')" >/dev/null
	: >"$TIDE_CLUSTER/sub_$name.txt"
	mosquitto_sub -h 127.0.0.1 -p "$MQ_PORT" -V 5 -q 1 -t "$name" -F '%U %j' >"$TIDE_CLUSTER/sub_$name.txt" &
	SUB_PID=$!
	psql_db -c "SELECT tide.outbox_publish('wake', '{}')" >/dev/null
	sleep 1
	rm -f "$TIDE_CLUSTER"/pgbench_"$name".*
	(cd "$TIDE_CLUSTER" && "$PGBENCH" -n -M prepared -c 1 -j 1 -R "$RATE" -T "$DURATION" \
		-l --log-prefix="pgbench_$name" -f <(publish_sql "$name") "$DB" >/dev/null)
	xacts=$(cat "$TIDE_CLUSTER"/pgbench_"$name".* | wc -l)
	for _ in $(seq 1 200); do
		[ "$(wc -l <"$TIDE_CLUSTER/sub_$name.txt")" -ge "$xacts" ] && break
		sleep 0.05
	done
	sleep 0.5
	kill "$SUB_PID" 2>/dev/null || true
	wait "$SUB_PID" 2>/dev/null || true
	SUB_PID=""
	cat "$TIDE_CLUSTER"/pgbench_"$name".* >"$TIDE_CLUSTER/pgbench_$name.log"
	chmod a+r "$TIDE_CLUSTER/sub_$name.txt" "$TIDE_CLUSTER/pgbench_$name.log"
	read -r msgs missing p50 p95 p99 < <(psql_db -A -t -F ' ' <<SQL
CREATE TEMP TABLE sub (line text);
CREATE TEMP TABLE pgb (line text);
COPY sub FROM '$TIDE_CLUSTER/sub_$name.txt' WITH (FORMAT csv, QUOTE e'\x01', DELIMITER e'\x02');
COPY pgb FROM '$TIDE_CLUSTER/pgbench_$name.log' WITH (FORMAT csv, QUOTE e'\x01', DELIMITER e'\x02');
CREATE TEMP VIEW got AS
	SELECT split_part(j->'properties'->'user-properties'->>'tide-id', ':', 2)::bigint AS id, min(t) AS t
	  FROM (SELECT split_part(line, ' ', 1)::float8 AS t, substr(line, strpos(line, ' ') + 1)::jsonb AS j FROM sub) s
	 GROUP BY 1;
CREATE TEMP VIEW published AS
	SELECT row_number() OVER (ORDER BY id) AS k, id
	  FROM tide.tide_outbox_messages WHERE outbox_name = '$name' AND payload ? 'order_id';
CREATE TEMP VIEW committed AS
	SELECT f[2]::bigint AS k, f[5]::float8 + f[6]::float8 / 1e6 AS done
	  FROM (SELECT string_to_array(line, ' ') AS f FROM pgb) p;
SELECT (SELECT count(*) FROM published),
	   (SELECT count(*) FROM published p WHERE NOT EXISTS (SELECT FROM got g WHERE g.id = p.id)),
	   round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 3),
	   round(percentile_cont(0.95) WITHIN GROUP (ORDER BY ms)::numeric, 3),
	   round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 3)
  FROM (SELECT (g.t - c.done) * 1000 AS ms FROM published p JOIN committed c USING (k) JOIN got g USING (id)) l;
SQL
)
	printf '  round %s: latency at %s/s: %s messages, %s missing: p50 %s  p95 %s  p99 %s ms\n' \
		"$round" "$RATE" "$msgs" "$missing" "$p50" "$p95" "$p99"
	[ "$missing" = 0 ] && [ "$msgs" = "$xacts" ] ||
		{ echo "broker_mqtt.sh: $name: messages missing or not one per transaction" >&2; exit 1; }
	bench_record "latency_$RATE" p50 "$round" "$p50"
	bench_record "latency_$RATE" p95 "$round" "$p95"
	bench_record "latency_$RATE" p99 "$round" "$p99"
	drop_pipeline "$name"
done
bench_summary
