#!/usr/bin/env bash
# The postgres sink: a backlog of N messages (default 100,000) moved by the
# relay from an outbox into the inbox of another database (over libpq, TCP
# on 127.0.0.1), beside a plain client (bench/brokers/pg_client.c) doing
# the same in a loop: tide.poll_outbox on the outbox's side (the previous
# batch committed with p_commit_upto), one tide.inbox_receive_batch of the
# batch on the inbox's side, with the same batch size, event ids, source,
# payloads and headers. The target: the pipeline at least 0.5 of the
# client's rate.
#
# Pipeline: N messages wait while the pipeline is disabled; one
# transaction enables it and wakes the worker; the rate is N divided by the
# time from that commit to the recording of the last message
# (tide.relay_consumer_offsets.updated_at). Client: N divided by the time
# from its first poll to its last commit. Each side's N events are checked
# to be in the inbox. The two databases are in one cluster (the inbox's
# database stands for another server: the work and the round trips are
# the same, the machine's two cores are shared alike by both sides).
#
# Run as root, with pg_tide built and installed with its postgres module
# (pg_tide_postgres.so: libpq-dev installed when it was built). Starts a
# throwaway cluster in /tmp/pg_tide_bench_postgres on port 5495, stopped at
# the end.
#
# Settings from the environment:
#   N           backlog (default 100000)
#   REPEATS     rounds (default 3)
#   BATCH_SIZE  the pipeline's batch_size and the client's (default 1000)
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIDE_CLUSTER=${TIDE_CLUSTER:-/tmp/pg_tide_bench_postgres}
export TIDE_PORT=${TIDE_PORT:-5495}
BENCH_NAME=postgres_sink.sh
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"

export TIDE_EXTRA_CONF=$RELAY_BENCH_CONF
export PGOPTIONS="-c client_min_messages=warning"

N=${N:-100000}
REPEATS=${REPEATS:-3}
BATCH_SIZE=${BATCH_SIZE:-1000}
REMOTE_DB=${DB}_inbox

if [ ! -f "$("$PG_CONFIG" --pkglibdir)/pg_tide_postgres.so" ]; then
	echo "$BENCH_NAME: pg_tide_postgres.so is not installed (build pg_tide with libpq-dev installed)" >&2
	exit 1
fi
CLIENT=$TIDE_CLUSTER/pg_client

tide_start_cluster
"$PG_BIN/createdb" "$DB"
"$PG_BIN/createdb" "$REMOTE_DB"
psql_db -c "CREATE EXTENSION pg_tide"
psql_remote() { "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -d "$REMOTE_DB" "$@"; }
psql_remote -c "CREATE EXTENSION pg_tide" -c "SELECT tide.inbox_create('bench')"
gcc -O2 -I"$("$PG_CONFIG" --includedir)" -o "$CLIENT" "$BENCH_DIR/brokers/pg_client.c" \
	-L"$("$PG_CONFIG" --libdir)" -lpq
LOCAL_CONN="host=127.0.0.1 port=$TIDE_PORT dbname=$DB user=postgres"
REMOTE_CONN="host=127.0.0.1 port=$TIDE_PORT dbname=$REMOTE_DB user=postgres"
CONFIG="{\"sink_type\": \"postgres\", \"inbox\": \"bench\", \"connection\": \"$REMOTE_CONN\",
  \"batch_size\": $BATCH_SIZE}"

psql_db <<'SQL'
CREATE SCHEMA bench;
CREATE FUNCTION bench.payload(i bigint) RETURNS jsonb LANGUAGE sql IMMUTABLE
RETURN jsonb_build_object('event', 'order.created', 'order_id', i,
						  'customer_id', i % 1000000, 'amount_cents', 100 + i % 100000);
SQL

# backlog <outbox>: N messages in the outbox; prints the last id.
backlog() {
	psql_db <<SQL
DO \$\$
BEGIN
	FOR c IN 0 .. ($N - 1) / 10000 LOOP
		PERFORM tide.outbox_publish_batch('$1',
			(SELECT array_agg(bench.payload(i) ORDER BY i)
			   FROM generate_series(c * 10000::bigint, least(c * 10000 + 9999, $N - 1)) i),
			'{"type": "order.created"}');
		COMMIT;
	END LOOP;
END
\$\$;
VACUUM ANALYZE tide.tide_outbox_messages;
SQL
	psql_remote -c "TRUNCATE tide.bench_inbox" -c "VACUUM ANALYZE tide.bench_inbox" -c CHECKPOINT >/dev/null
	psql_db -A -t -c "SELECT max(id) FROM tide.tide_outbox_messages WHERE outbox_name = '$1'"
}

# stored <source>: fails the bench unless N events of that source are in the inbox.
stored() {
	local got
	got=$(psql_remote -A -t -c "SELECT count(*) FROM tide.bench_inbox WHERE source = '$1'")
	[ "$got" -eq "$N" ] || { echo "$BENCH_NAME: $1: $got of $N in the inbox" >&2; exit 1; }
}

# pipeline <round>: the relay moves the backlog; records its rate.
pipeline() {
	local name=pg_$1 last start end
	psql_db >/dev/null <<SQL
SELECT tide.outbox_create('$name', p_inline_threshold => 2000000000);
BEGIN;
SELECT tide.relay_set_outbox('$name', '$name', '$name', '$CONFIG');
SELECT tide.relay_disable('$name');
COMMIT;
SQL
	last=$(backlog "$name" | tail -n 1)
	start=$(psql_db -A -t <<SQL | tail -n 1
BEGIN;
SELECT tide.relay_enable('$name');
SELECT extract(epoch FROM clock_timestamp());
COMMIT;
SQL
)
	end=$(bench_wait_recorded "$name" "$last") || exit 1
	stored "$name"
	PIPE_RATE=$(echo "$N / ($end - $start)" | bc -l)
	bench_record pipeline_msg_s postgres "$1" "$PIPE_RATE"
	psql_db -c "SELECT tide.relay_delete('$name')" -c "SELECT tide.outbox_drop('$name')" >/dev/null
}

# client <round>: the plain client moves as many; records its rate.
client() {
	local name=cl_$1 secs
	psql_db -c "SELECT tide.outbox_create('$name', p_inline_threshold => 2000000000)" \
		-c "SELECT tide.create_consumer_group('$name', '$name')" >/dev/null
	backlog "$name" >/dev/null
	secs=$("$CLIENT" "$LOCAL_CONN" "$REMOTE_CONN" "$name" bench "$BATCH_SIZE" "$N")
	stored client
	CLIENT_RATE=$(echo "$N / $secs" | bc -l)
	bench_record client_msg_s poll_receive "$1" "$CLIENT_RATE"
	psql_db -c "SELECT tide.drop_consumer_group('$name')" -c "SELECT tide.outbox_drop('$name')" >/dev/null
}

log "$REPEATS rounds: a backlog of $N, batch_size $BATCH_SIZE"
for round in $(seq 1 "$REPEATS"); do
	pipeline "$round"
	client "$round"
	bench_record ratio pipeline_vs_client "$round" "$(echo "$PIPE_RATE / $CLIENT_RATE" | bc -l)"
	log "round $round: pipeline $(printf %.0f "$PIPE_RATE") msg/s, client $(printf %.0f "$CLIENT_RATE") msg/s"
done
bench_summary
