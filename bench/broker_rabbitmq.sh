#!/usr/bin/env bash
# The RabbitMQ sink: how fast a pipeline delivers a backlog of N messages to
# a RabbitMQ server on 127.0.0.1, beside rabbitmq-c alone publishing as many
# messages of the same size, properties and headers with the same
# acknowledgement settings (persistent, mandatory, publisher confirms) and
# the same number in flight (bench/brokers/rabbitmq_client.c); and the
# latency from a publishing transaction's commit to the message's receipt by
# a consumer at RATE messages/s. See bench/README.md.
#
# Throughput: N messages are published while the pipeline is disabled, then
# one transaction enables it; the rate is N divided by the time from that
# commit to the recording of the last confirm
# (tide.relay_consumer_offsets.updated_at). The client's rate is N divided
# by the time from its first publish to its last confirm. Latency: pgbench
# publishes one message per transaction at RATE/s for DURATION s from one
# client; a consumer (test/brokers/rabbitmq_read) logs each message's time
# of receipt; the k-th transaction of pgbench's log published the k-th
# message by id. Beside it, the broker's own latency: rabbitmq-c alone
# publishing at RATE/s, from each publish to its receipt.
#
# Run as root; pg_tide (with pg_tide_rabbitmq.so) must be built and
# installed. It starts its own cluster in /tmp/pg_tide_bench_rabbitmq on port
# 5493 and its own RabbitMQ node (as the postgres user, every port on
# 127.0.0.1), and stops both at the end.
#
# Settings from the environment:
#   N              messages of a backlog (default 100000)
#   REPEATS        rounds (default 3)
#   MAX_IN_FLIGHT  unconfirmed messages at most, for both (default 100)
#   BATCH_SIZE     the pipeline's batch_size (default 1000)
#   RATE, DURATION the latency run: messages/s and seconds (default 200, 10)
#   TIDE_CLUSTER, TIDE_PORT, PG_CONFIG  as for the other benchmarks
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIDE_CLUSTER=${TIDE_CLUSTER:-/tmp/pg_tide_bench_rabbitmq}
export TIDE_PORT=${TIDE_PORT:-5493}
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"

# lib.sh switches the relay off; here it is what is measured.
bench_relay_settings
MAX_IN_FLIGHT=${MAX_IN_FLIGHT:-100}
RATE=${RATE:-200}
DURATION=${DURATION:-10}
ROOT=$BENCH_DIR/..
CLIENT=$TIDE_CLUSTER/rabbitmq_client
READER=$TIDE_CLUSTER/rabbitmq_read
RMQ=$TIDE_CLUSTER/rabbitmq
PASSWORD=bench-pw

# --- the broker, as in test/t/046_relay_rabbitmq.pl
rmq_env() {
	echo HOME="$RMQ/home" RABBITMQ_NODENAME="tide_bench_$$@localhost" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
		RABBITMQ_NODE_PORT="$AMQP_PORT" RABBITMQ_DIST_PORT=$((AMQP_PORT + 20000)) ERL_EPMD_ADDRESS=127.0.0.1 \
		ERL_EPMD_PORT=$((AMQP_PORT + 1)) ERL_EPMD_RELAXED_COMMAND_CHECK=1 RABBITMQ_MNESIA_BASE="$RMQ/mnesia" \
		RABBITMQ_LOG_BASE="$RMQ/log" RABBITMQ_CONFIG_FILE="$RMQ/rabbitmq.conf" \
		RABBITMQ_ADVANCED_CONFIG_FILE="$RMQ/advanced.config" RABBITMQ_ENABLED_PLUGINS_FILE="$RMQ/enabled_plugins"
}
ctl() { runuser -u postgres -- env $(rmq_env) /usr/lib/rabbitmq/bin/rabbitmqctl -n "tide_bench_$$@localhost" "$@" >>"$RMQ/ctl.log" 2>&1; }
amqp() { "$READER" 127.0.0.1 "$AMQP_PORT" bench "$PASSWORD" bench "$@"; }

stop_rabbitmq() {
	[ -n "${RMQ_PID:-}" ] || return 0
	ctl stop || true
	kill -KILL -- -"$RMQ_PID" 2>/dev/null || true
	runuser -u postgres -- env ERL_EPMD_PORT=$((AMQP_PORT + 1)) ERL_EPMD_RELAXED_COMMAND_CHECK=1 epmd -kill >/dev/null 2>&1 || true
	RMQ_PID=
}
cleanup() {
	[ -n "${CONSUMER_PID:-}" ] && kill "$CONSUMER_PID" 2>/dev/null
	stop_rabbitmq
	bench_cleanup
}
trap cleanup EXIT

start_rabbitmq() {
	local p
	for p in $(seq $((20000 + RANDOM % 19000)) 39999); do
		ss -Hltn "sport = :$p or sport = :$((p + 1)) or sport = :$((p + 20000))" | grep -q . && continue
		AMQP_PORT=$p
		break
	done
	rm -rf "$RMQ"
	mkdir -p "$RMQ/home" "$RMQ/mnesia" "$RMQ/log"
	printf 'listeners.tcp.1 = 127.0.0.1:%s\nloopback_users = none\n' "$AMQP_PORT" >"$RMQ/rabbitmq.conf"
	echo '[{kernel, [{inet_dist_use_interface, {127,0,0,1}}]}].' >"$RMQ/advanced.config"
	echo '[].' >"$RMQ/enabled_plugins"
	chown -R postgres: "$RMQ"
	setsid runuser -u postgres -- env $(rmq_env) /usr/lib/rabbitmq/bin/rabbitmq-server >"$RMQ/server.out" 2>&1 &
	RMQ_PID=$!
	# await_startup needs the node to be there already
	for _ in $(seq 1 120); do
		ctl await_startup && break
		sleep 0.5
	done
	ctl add_vhost bench
	ctl add_user bench "$PASSWORD"
	ctl set_permissions -p bench bench '.*' '.*' '.*'
}

tide_start_cluster
log "building the clients"
cc -O2 -o "$CLIENT" "$BENCH_DIR/brokers/rabbitmq_client.c" $(pkg-config --cflags --libs librabbitmq)
cc -O2 -o "$READER" "$ROOT/test/brokers/rabbitmq_read.c" $(pkg-config --cflags --libs librabbitmq) -lcjson
"$PG_BIN/createdb" "$DB"
psql_db -c "CREATE EXTENSION pg_tide" >/dev/null
start_rabbitmq
log "rabbitmq-server $(dpkg-query -W -f='${Version}' rabbitmq-server) on 127.0.0.1:$AMQP_PORT"

CONFIG_COMMON="\"sink_type\": \"rabbitmq\", \"host\": \"127.0.0.1\", \"port\": $AMQP_PORT, \"vhost\": \"bench\",
	\"auth\": {\"username\": \"bench\", \"password\": \"$PASSWORD\"}, \"max_in_flight\": $MAX_IN_FLIGHT"

# The payload and headers of every benchmark message (about 230 bytes of body).
psql_db <<'SQL'
CREATE SCHEMA bench;
CREATE FUNCTION bench.payload(i bigint) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('n', i, 'pad', repeat('x', 200)) $$;
SQL
HEADERS="jsonb_build_object('trace_id', '0123456789abcdef0123456789abcdef', 'source', 'checkout-service')"
BODY_BYTES=$(psql_db -A -t -c "SELECT length(bench.payload(1)::text)")

# pipeline_round <round>: the pipeline's rate for a backlog of N.
pipeline_round() {
	local round=$1 name=pipe_$1 last start end rate
	amqp queue "q_$name" >/dev/null
	psql_db <<SQL >/dev/null
SELECT tide.outbox_create('$name', p_inline_threshold => 2000000000);
BEGIN;
SELECT tide.relay_set_outbox('$name', '$name', '$name', '{$CONFIG_COMMON, "routing_key": "q_$name", "batch_size": $BATCH_SIZE}');
SELECT tide.relay_disable('$name');
COMMIT;
DO \$\$
BEGIN
	FOR c IN 0 .. ($N - 1) / 10000 LOOP
		PERFORM tide.outbox_publish_batch('$name',
			(SELECT array_agg(bench.payload(i) ORDER BY i)
			   FROM generate_series(c * 10000::bigint, least(c * 10000 + 9999, $N - 1)) i),
			$HEADERS);
		COMMIT;
	END LOOP;
END
\$\$;
VACUUM ANALYZE tide.tide_outbox_messages;
CHECKPOINT;
SQL
	last=$(psql_db -A -t -c "SELECT max(id) FROM tide.tide_outbox_messages WHERE outbox_name = '$name'")
	start=$(psql_db -A -t -c "BEGIN" -c "SELECT tide.relay_enable('$name')" \
		-c "SELECT extract(epoch FROM clock_timestamp())" -c "COMMIT" | tail -n 1)
	end=$(bench_wait_recorded "$name" "$last") || exit 1
	rate=$(awk "BEGIN { printf \"%.0f\", $N / ($end - $start) }")
	[ "$(psql_db -A -t -c "SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = '$name'")" = 0 ] ||
		{ echo "broker_rabbitmq.sh: $name dead-lettered messages" >&2; exit 1; }
	psql_db -c "SELECT tide.relay_delete('$name')" -c "SELECT tide.outbox_drop('$name')" >/dev/null
	amqp delete "q_$name" >/dev/null
	echo "$rate"
}

# client_round <round>: rabbitmq-c alone, the same messages and settings.
client_round() {
	local name=client_$1 secs
	amqp queue "q_$name" >/dev/null
	secs=$("$CLIENT" 127.0.0.1 "$AMQP_PORT" bench "$PASSWORD" bench "" "q_$name" "$N" "$MAX_IN_FLIGHT" "$BODY_BYTES")
	amqp delete "q_$name" >/dev/null
	awk "BEGIN { printf \"%.0f\", $N / $secs }"
}

# latency_round <round>: commit-to-consumer latency at RATE/s; prints p50 p95 p99 max (ms).
latency_round() {
	local round=$1 name=lat_$1 xacts pglog
	amqp queue "q_$name" >/dev/null
	psql_db -c "SELECT tide.outbox_create('$name')" \
		-c "SELECT tide.relay_set_outbox('$name', '$name', '$name', '{$CONFIG_COMMON, \"routing_key\": \"q_$name\", \"batch_size\": $BATCH_SIZE}')" >/dev/null
	psql_db -c "SELECT tide.outbox_publish('$name', '{\"warm-up\": true}')" >/dev/null
	sleep 1
	amqp read "q_$name" 200 >/dev/null
	amqp read "q_$name" $(((DURATION + 5) * 1000)) >"$TIDE_CLUSTER/consumer_$name.jsonl" &
	CONSUMER_PID=$!
	sleep 0.5
	cat >"$TIDE_CLUSTER/latency.sql" <<SQL
SELECT tide.outbox_publish('$name', bench.payload(:client_id), $HEADERS);
SQL
	rm -f "$TIDE_CLUSTER"/pgbench_"$name".*
	(cd "$TIDE_CLUSTER" && "$PGBENCH" -n -M prepared -c 1 -j 1 -R "$RATE" -T "$DURATION" \
		-l --log-prefix="pgbench_$name" -f "$TIDE_CLUSTER/latency.sql" "$DB" >"$TIDE_CLUSTER/pgbench_$name.out" 2>&1) ||
		{ cat "$TIDE_CLUSTER/pgbench_$name.out"; exit 1; }
	wait "$CONSUMER_PID"
	CONSUMER_PID=
	xacts=$(sed -n 's/^number of transactions actually processed: \([0-9]*\)$/\1/p' "$TIDE_CLUSTER/pgbench_$name.out")
	pglog=$TIDE_CLUSTER/pgbench_$name.log
	cat "$TIDE_CLUSTER"/pgbench_"$name".[0-9]* >"$pglog"
	chmod a+r "$pglog" "$TIDE_CLUSTER/consumer_$name.jsonl"
	# pgbench numbers its transactions from 1, and its k-th published the
	# k-th message by id; a message's id is in its message_id
	psql_db -A -t -F ' ' <<SQL
CREATE TEMP TABLE rcv (line text);
CREATE TEMP TABLE pgb (line text);
COPY rcv FROM '$TIDE_CLUSTER/consumer_$name.jsonl' WITH (FORMAT csv, QUOTE e'\x01', DELIMITER e'\x02');
COPY pgb FROM '$pglog' WITH (FORMAT csv, QUOTE e'\x01', DELIMITER e'\x02');
CREATE TEMP VIEW got AS
	SELECT split_part(line::jsonb->'properties'->>'message_id', ':', 2)::bigint AS id, (line::jsonb->>'t')::float8 AS t FROM rcv;
CREATE TEMP VIEW published AS
	SELECT row_number() OVER (ORDER BY id) AS k, id
	  FROM tide.tide_outbox_messages WHERE outbox_name = '$name' AND NOT payload ? 'warm-up';
CREATE TEMP VIEW committed AS
	SELECT f[2]::bigint AS k, f[5]::float8 + f[6]::float8 / 1e6 AS done
	  FROM (SELECT string_to_array(line, ' ') AS f FROM pgb) p;
CREATE TEMP VIEW lat AS
	SELECT (g.t - c.done) * 1000 AS ms
	  FROM published p JOIN committed c USING (k) JOIN (SELECT id, min(t) AS t FROM got GROUP BY id) g USING (id);
SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 3),
	   round(percentile_cont(0.95) WITHIN GROUP (ORDER BY ms)::numeric, 3),
	   round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 3),
	   round(max(ms)::numeric, 3), count(*), $xacts
  FROM lat;
SQL
	psql_db -c "SELECT tide.relay_delete('$name')" -c "SELECT tide.outbox_drop('$name')" >/dev/null
	amqp delete "q_$name" >/dev/null
}

# client_latency_round <round>: rabbitmq-c alone publishing at RATE/s, the
# same consumer; prints p50 p99 (ms) from publish to receipt.
client_latency_round() {
	local name=clat_$1
	amqp queue "q_$name" >/dev/null
	amqp read "q_$name" $(((DURATION + 5) * 1000)) >"$TIDE_CLUSTER/consumer_$name.jsonl" &
	CONSUMER_PID=$!
	sleep 0.5
	"$CLIENT" 127.0.0.1 "$AMQP_PORT" bench "$PASSWORD" bench "" "q_$name" $((RATE * DURATION)) "$MAX_IN_FLIGHT" "$BODY_BYTES" "$RATE" >/dev/null
	wait "$CONSUMER_PID"
	CONSUMER_PID=
	chmod a+r "$TIDE_CLUSTER/consumer_$name.jsonl"
	psql_db -A -t -F ' ' <<SQL
CREATE TEMP TABLE rcv (line text);
COPY rcv FROM '$TIDE_CLUSTER/consumer_$name.jsonl' WITH (FORMAT csv, QUOTE e'\x01', DELIMITER e'\x02');
SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 3),
	   round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 3)
  FROM (SELECT ((line::jsonb->>'t')::float8 - ((line::jsonb->>'body')::jsonb->>'sent')::float8) * 1000 AS ms FROM rcv) r;
SQL
	amqp delete "q_$name" >/dev/null
}

log "$REPEATS rounds: a backlog of $N messages ($BODY_BYTES-byte bodies), $MAX_IN_FLIGHT in flight, batch_size $BATCH_SIZE; latency at $RATE/s for ${DURATION}s"
for round in $(seq 1 "$REPEATS"); do
	pipe=$(pipeline_round "$round")
	client=$(client_round "$round")
	ratio=$(awk "BEGIN { printf \"%.2f\", $pipe / $client }")
	read -r p50 p95 p99 max got xacts < <(latency_round "$round")
	read -r c50 c99 < <(client_latency_round "$round")
	printf '  round %s: pipeline %s msg/s, rabbitmq-c alone %s msg/s, ratio %s; latency at %s/s: p50 %s p95 %s p99 %s max %s ms (%s of %s paired); rabbitmq-c alone p50 %s p99 %s ms\n' \
		"$round" "$pipe" "$client" "$ratio" "$RATE" "$p50" "$p95" "$p99" "$max" "$got" "$xacts" "$c50" "$c99"
	[ "$got" = "$xacts" ] || { echo "broker_rabbitmq.sh: $((xacts - got)) messages of the latency run missing" >&2; exit 1; }
	bench_record backlog "pipeline msg/s" "$round" "$pipe"
	bench_record backlog "client msg/s" "$round" "$client"
	bench_record backlog ratio "$round" "$ratio"
	bench_record "latency_$RATE" p50 "$round" "$p50"
	bench_record "latency_$RATE" p99 "$round" "$p99"
	bench_record "latency_$RATE" "client p50" "$round" "$c50"
	bench_record "latency_$RATE" "client p99" "$round" "$c99"
done
bench_summary
