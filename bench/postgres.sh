#!/usr/bin/env bash
# The postgres endpoint, both ways, against a plain client: a backlog of N
# messages (default 100,000) moved between an outbox and an inbox of two
# databases (over libpq, TCP on 127.0.0.1) by
#   sink:   a forward pipeline, "sink_type": "postgres" (the local outbox
#           into the remote inbox), and
#   source: a reverse pipeline, "source_type": "postgres" (the remote
#           outbox into the local inbox),
# each beside bench/brokers/pg_client.c doing the same in a loop:
# tide.poll_outbox on the outbox's side (the previous batch committed with
# p_commit_upto) and one tide.inbox_receive_batch of the batch on the
# inbox's side, with the same batch size. The target: each pipeline at
# least 0.5 of the client's rate.
#
# A pipeline's N messages wait while it is disabled; one transaction
# enables it and wakes the worker; its rate is N divided by the time from
# that commit to the recording of the last message's id
# (tide.relay_consumer_offsets.updated_at: a forward pipeline's offset, a
# reverse pipeline's source position). The client's rate is N divided by
# the time from its first poll to its last commit. Every side's N events
# are checked to be in its inbox. The two databases are in one cluster
# (the inbox's or outbox's database stands for another server: the work
# and the round trips are the same, and both sides share the machine's
# cores alike).
#
# Run as root, with pg_tide built and installed with its postgres module
# (pg_tide_postgres.so: libpq-dev installed when it was built). Starts a
# throwaway cluster in /tmp/pg_tide_bench_postgres on port 5495, stopped at
# the end.
#
# Settings from the environment:
#   N           backlog (default 100000)
#   REPEATS     rounds (default 3)
#   BATCH_SIZE  the pipelines' batch_size and the client's (default 1000)
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIDE_CLUSTER=${TIDE_CLUSTER:-/tmp/pg_tide_bench_postgres}
export TIDE_PORT=${TIDE_PORT:-5495}
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"

bench_relay_settings
REMOTE_DB=${DB}_remote

bench_need_module postgres "build pg_tide with libpq-dev installed"
CLIENT=$TIDE_CLUSTER/pg_client

tide_start_cluster
"$PG_BIN/createdb" "$DB"
"$PG_BIN/createdb" "$REMOTE_DB"
psql_remote() { "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -d "$REMOTE_DB" "$@"; }
for db in psql_db psql_remote; do
	$db >/dev/null <<'SQL'
CREATE EXTENSION pg_tide;
SELECT tide.inbox_create('bench');
CREATE SCHEMA bench;
CREATE FUNCTION bench.payload(i bigint) RETURNS jsonb LANGUAGE sql IMMUTABLE
RETURN jsonb_build_object('event', 'order.created', 'order_id', i,
						  'customer_id', i % 1000000, 'amount_cents', 100 + i % 100000);
SQL
done
gcc -O2 -I"$("$PG_CONFIG" --includedir)" -o "$CLIENT" "$BENCH_DIR/brokers/pg_client.c" \
	-L"$("$PG_CONFIG" --libdir)" -lpq
LOCAL_CONN="host=127.0.0.1 port=$TIDE_PORT dbname=$DB user=postgres"
REMOTE_CONN="host=127.0.0.1 port=$TIDE_PORT dbname=$REMOTE_DB user=postgres"

# backlog <psql_db|psql_remote> <outbox>: N messages in that database's
# outbox, created with a consumer group of its name (which a pipeline or
# the client reads through); empties the inboxes; prints the last id.
backlog() {
	$1 -c "SELECT tide.outbox_create('$2', p_inline_threshold => 2000000000)" \
		-c "SELECT tide.create_consumer_group('$2', '$2')" >/dev/null
	{
		bench_publish_sql "$2" "$N" "'{\"type\": \"order.created\"}'"
		echo "VACUUM ANALYZE tide.tide_outbox_messages;"
	} | $1 >/dev/null
	for db in psql_db psql_remote; do
		$db -c "TRUNCATE tide.bench_inbox" -c "VACUUM ANALYZE tide.bench_inbox" -c CHECKPOINT >/dev/null
	done
	$1 -A -t -c "SELECT max(id) FROM tide.tide_outbox_messages WHERE outbox_name = '$2'"
}

# stored <psql_db|psql_remote> <source>: fails the bench unless N events of that source are in the inbox.
stored() {
	local got
	got=$($1 -A -t -c "SELECT count(*) FROM tide.bench_inbox WHERE source = '$2'")
	[ "$got" -eq "$N" ] || { echo "$BENCH_NAME: $2: $got of $N in the inbox" >&2; exit 1; }
}

# pipeline <sink|source> <round>: a pipeline moves the backlog; records its rate.
pipeline() {
	local name=$1_$2 outbox_db=psql_db inbox_db=psql_remote last start end set_sql
	if [ "$1" = sink ]; then
		set_sql="SELECT tide.relay_set_outbox('$name', '$name', '$name', '{\"sink_type\": \"postgres\",
		  \"inbox\": \"bench\", \"connection\": \"$REMOTE_CONN\", \"batch_size\": $BATCH_SIZE}')"
		last=$(backlog psql_db "$name" | tail -n 1)
	else
		outbox_db=psql_remote
		inbox_db=psql_db
		set_sql="SELECT tide.relay_set_inbox('$name', 'bench', '{\"source_type\": \"postgres\",
		  \"outbox\": \"$name\", \"consumer_group\": \"$name\", \"connection\": \"$REMOTE_CONN\",
		  \"batch_size\": $BATCH_SIZE}')"
		last=$(backlog psql_remote "$name" | tail -n 1)
	fi
	psql_db >/dev/null <<SQL
BEGIN;
$set_sql;
SELECT tide.relay_disable('$name');
COMMIT;
SQL
	start=$(psql_db -A -t <<SQL | tail -n 1
BEGIN;
SELECT tide.relay_enable('$name');
SELECT extract(epoch FROM clock_timestamp());
COMMIT;
SQL
)
	end=$(bench_wait_recorded "$name" "$last") || exit 1
	stored $inbox_db "$name"
	PIPE_RATE=$(echo "$N / ($end - $start)" | bc -l)
	bench_record pipeline_msg_s "$1" "$2" "$PIPE_RATE"
	psql_db -c "SELECT tide.relay_delete('$name')" >/dev/null
	$outbox_db -c "SELECT tide.drop_consumer_group('$name', true)" -c "SELECT tide.outbox_drop('$name')" >/dev/null
}

# client <sink|source> <round>: the plain client moves as many; records its rate.
client() {
	local name=cl_$1_$2 outbox_db=psql_db inbox_db=psql_remote from=$LOCAL_CONN to=$REMOTE_CONN secs
	if [ "$1" = source ]; then
		outbox_db=psql_remote inbox_db=psql_db from=$REMOTE_CONN to=$LOCAL_CONN
	fi
	backlog $outbox_db "$name" >/dev/null
	secs=$("$CLIENT" "$from" "$to" "$name" bench "$BATCH_SIZE" "$N")
	stored $inbox_db client
	CLIENT_RATE=$(echo "$N / $secs" | bc -l)
	bench_record client_msg_s "$1" "$2" "$CLIENT_RATE"
	$outbox_db -c "SELECT tide.drop_consumer_group('$name')" -c "SELECT tide.outbox_drop('$name')" >/dev/null
}

log "$REPEATS rounds: a backlog of $N, batch_size $BATCH_SIZE, each way"
for round in $(seq 1 "$REPEATS"); do
	for way in sink source; do
		pipeline "$way" "$round"
		client "$way" "$round"
		bench_record ratio "${way}_vs_client" "$round" "$(echo "$PIPE_RATE / $CLIENT_RATE" | bc -l)"
		log "round $round, $way: pipeline $(printf %.0f "$PIPE_RATE") msg/s, client $(printf %.0f "$CLIENT_RATE") msg/s"
	done
done
bench_summary
