#!/usr/bin/env bash
# Publish throughput: tide.outbox_publish() / tide.outbox_publish_batch()
# against a plain INSERT of the same rows into a plain table with the same
# columns and indexes, and against PgQ's pgq.insert_event() (Debian's
# postgresql-15-pgq3), at 1, 10 and 100 messages per transaction and 1, 8
# and 32 pgbench clients; with the WAL and table bytes each message costs.
# See bench/README.md.
#
# Run as root. pg_tide must already be built and installed (run
# test/demo.sh or test/run-tests.sh first); this script builds nothing and
# installs PgQ from Debian when it is missing. It starts its own throwaway
# cluster in /tmp/pg_tide_bench on port 5498 and stops it at the end
# (KEEP_CLUSTER=1 leaves it running).
#
# Settings from the environment:
#   DURATION  seconds per pgbench run (default 5)
#   REPEATS   rounds (default 3); in a round every side runs every case
#             once, back to back, so each ratio is taken within a round
#   SIZES     messages per transaction (default "1 10 100")
#   CLIENT_COUNTS  pgbench clients (default "1 8 32"); threads: at most 2
#   SIDES     what runs (default "plain tide tide_granted pgq"); tide_granted
#             is pg_tide published by a login role that holds tide_publisher
#             and a grant on the outbox, not by a superuser: the cost of the
#             publishing-rights check; tide_keyed (not run unless named)
#             is pg_tide with an idempotency key (a new UUID) per message
# With the defaults it runs for about 9 minutes.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIDE_CLUSTER=${TIDE_CLUSTER:-/tmp/pg_tide_bench}
export TIDE_PORT=${TIDE_PORT:-5498}
BENCH_NAME=publish.sh
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"

DURATION=${DURATION:-5}
REPEATS=${REPEATS:-3}
SIZES=${SIZES:-1 10 100}
CLIENT_COUNTS=${CLIENT_COUNTS:-1 8 32}
SIDES=${SIDES:-plain tide tide_granted pgq}

bench_need_packages postgresql-15-pgq3

tide_start_cluster
"$PG_BIN/createdb" "$DB"

log "creating pg_tide, its outbox and the baseline table"
psql_db <<'SQL'
CREATE EXTENSION pg_tide;

-- The outbox. No consumer group reads it during the run, so every message
-- published stays unconsumed, and the default inline_threshold (10000)
-- would refuse publishing after 10000 messages, long before a run ends (a
-- run publishes up to a few million). 2e9, near the int maximum, is far
-- above anything a run publishes, so backpressure never refuses and the
-- cheap upper bound of the fast path (last id handed out minus the oldest
-- unconsumed id) always stays below it: the exact count never runs. The
-- backpressure check itself still runs on every publish call (the bound on
-- every call; the full check, which reads the config row, the oldest
-- unconsumed id and the sequence, once a second per backend) and is part
-- of what is measured.
SELECT tide.outbox_create('bench', p_inline_threshold => 2000000000) \gset

-- The baseline: tide.tide_outbox_messages' columns and types, a bigint
-- primary key from a CACHE 1 sequence default, and the same partial index.
-- No foreign key: a plain table of events has none (and pg_tide's message
-- table has none either; see docs/catalog.md).
CREATE SCHEMA bench;
CREATE SEQUENCE bench.plain_messages_id_seq CACHE 1;
CREATE TABLE bench.plain_messages (
	id				bigint PRIMARY KEY DEFAULT nextval('bench.plain_messages_id_seq'),
	outbox_name		text NOT NULL,
	payload			jsonb NOT NULL,
	headers			jsonb,
	created_at		timestamptz NOT NULL DEFAULT now(),
	consumed_at		timestamptz,
	consumer_group	text
);
ALTER SEQUENCE bench.plain_messages_id_seq OWNED BY bench.plain_messages.id;
CREATE INDEX plain_messages_pending
	ON bench.plain_messages (outbox_name, id)
	WHERE consumed_at IS NULL;

-- A publisher as an application would have it: no superuser, tide_publisher
-- and the right to publish to this outbox.
CREATE ROLE bench_publisher LOGIN IN ROLE tide_publisher;
SELECT tide.outbox_grant_publish('bench', 'bench_publisher');

-- PgQ: one queue; events go to its rotating event tables.
CREATE EXTENSION pgq;
SELECT pgq.create_queue('bench');
SQL

# tide_keyed's scripts: tide_single.sql and tide_batch.sql with an
# idempotency key per message, a new UUID each (none repeats).
sed -e "s|'application/json'));\$|'application/json'), gen_random_uuid()::text);|" \
	"$BENCH_DIR/tide_single.sql" >"$TIDE_CLUSTER/tide_keyed_single.sql"
sed -e "s|'application/json'));\$|'application/json'), ARRAY(SELECT gen_random_uuid()::text FROM generate_series(1, :n)));|" \
	"$BENCH_DIR/tide_batch.sql" >"$TIDE_CLUSTER/tide_keyed_batch.sql"
# The file of a script.
script_file() { if [ -f "$BENCH_DIR/$1.sql" ]; then echo "$BENCH_DIR/$1.sql"; else echo "$TIDE_CLUSTER/$1.sql"; fi; }

# One transaction of each script, to check that they run and that every
# side writes the same payloads and headers.
for script in plain_single tide_single tide_keyed_single pgq_single plain_batch tide_batch tide_keyed_batch pgq_batch; do
	"$PGBENCH" -n -M prepared -c 1 -t 1 -D n=10 -f "$(script_file "$script")" "$DB" >/dev/null
done
[ "$(scalar "SELECT count(*) FROM tide.outbox_idempotency_keys")" -eq 11 ] ||
	{ echo "publish.sh: the tide_keyed scripts did not publish with keys" >&2; exit 1; }
# pg_tide's child tables (the relay worker, off here, would make them):
# every run's ids, restarted at 1, then go into a child, as in a database
# whose worker runs.
psql_db -c "SELECT tide._outbox_partitions_maintain()" >/dev/null
psql_db <<'SQL'
\pset footer off
SELECT queue_data_pfx AS pgq_table FROM pgq.queue WHERE queue_name = 'bench' \gset
SELECT 'pg_tide' AS side, count(*) AS messages,
	   round(avg(octet_length(payload::text))) AS payload_bytes,
	   round(avg(octet_length(headers::text))) AS headers_bytes
  FROM tide.tide_outbox_messages m
UNION ALL
SELECT 'plain', count(*), round(avg(octet_length(payload::text))), round(avg(octet_length(headers::text)))
  FROM bench.plain_messages m
UNION ALL
SELECT 'pgq', count(*), round(avg(octet_length(ev_data))), round(avg(octet_length(ev_extra1)))
  FROM :pgq_table;
SQL

# The rows a side has written, and the bytes of its tables (with indexes
# and TOAST; pg_tide's parent table and its children).
side_rows() {
	case $1 in
	tide | tide_granted | tide_keyed) psql_db -A -t -c "SELECT count(*) FROM tide.tide_outbox_messages" ;;
	plain) psql_db -A -t -c "SELECT count(*) FROM bench.plain_messages" ;;
	pgq) psql_db -A -t -c "SELECT count(*) FROM $(pgq_table)" ;;
	esac
}
side_bytes() {
	case $1 in
	tide | tide_granted | tide_keyed) psql_db -A -t -c "SELECT pg_total_relation_size('tide.tide_outbox_messages')
		+ pg_total_relation_size('tide.outbox_idempotency_keys')
		+ coalesce((SELECT sum(pg_total_relation_size(inhrelid)) FROM pg_inherits
		 WHERE inhparent = 'tide.tide_outbox_messages'::regclass), 0)" ;;
	plain) psql_db -A -t -c "SELECT pg_total_relation_size('bench.plain_messages')" ;;
	pgq) psql_db -A -t -c "SELECT sum(pg_total_relation_size(inhrelid)) FROM pg_inherits
		WHERE inhparent = '$(pgq_table)'::regclass" ;;
	esac
}
# The parent of the PgQ queue's event tables.
pgq_table() { psql_db -A -t -c "SELECT queue_data_pfx FROM pgq.queue WHERE queue_name = 'bench'"; }

# Empties every side's table (and restarts the sequences; PgQ's queue is
# made anew), then checkpoints, so that every run starts from the same state.
reset_tables() {
	psql_db -c "TRUNCATE tide.tide_outbox_messages, tide.outbox_idempotency_keys, bench.plain_messages RESTART IDENTITY" \
		-c "SELECT pgq.drop_queue('bench')" -c "SELECT pgq.create_queue('bench')" \
		-c "CHECKPOINT" >/dev/null
}

# run <side> <messages per transaction> <clients> <round>
run() {
	local side=$1 per_xact=$2 clients=$3 round=$4 out tps xacts rows script wal0 wal1 bytes user=postgres
	out=$TIDE_CLUSTER/pgbench_${side}_${per_xact}_${clients}_${round}.log
	if [ "$side" = tide_granted ]; then script=tide; user=bench_publisher; else script=$side; fi
	if [ "$per_xact" -eq 1 ]; then script=${script}_single; else script=${script}_batch; fi
	reset_tables
	wal0=$(psql_db -A -t -c "SELECT pg_current_wal_insert_lsn()")
	"$PGBENCH" -n -M prepared -c "$clients" -j "$(( clients < 2 ? clients : 2 ))" -T "$DURATION" \
		-U "$user" -D n="$per_xact" -f "$(script_file "$script")" "$DB" >"$out" 2>&1 ||
		{ cat "$out"; tide_show_server_log; exit 1; }
	wal1=$(psql_db -A -t -c "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '$wal0')")
	tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' "$out")
	xacts=$(sed -n 's/^number of transactions actually processed: \([0-9]*\)$/\1/p' "$out")
	rows=$(side_rows "$side")
	# Every committed transaction wrote its messages, no more, no less.
	if [ "$rows" -ne $((xacts * per_xact)) ]; then
		echo "publish.sh: $side, $per_xact per transaction: $xacts transactions but $rows rows" >&2
		exit 1
	fi
	bytes=$(side_bytes "$side")
	bench_record "publish_${per_xact}x${clients}" "$side" "$round" "$(awk "BEGIN { print $tps * $per_xact }")"
	bench_record "wal_bytes_${per_xact}x${clients}" "$side" "$round" "$(awk "BEGIN { print $wal1 / $rows }")"
	bench_record "table_bytes_${per_xact}x${clients}" "$side" "$round" "$(awk "BEGIN { print $bytes / $rows }")"
	printf '  round %s  %-5s %3d/xact %2d clients  %10.0f msg/s  WAL %5.0f B/msg  table %5.0f B/msg\n' \
		"$round" "$side" "$per_xact" "$clients" "$(awk "BEGIN { print $tps * $per_xact }")" \
		"$(awk "BEGIN { print $wal1 / $rows }")" "$(awk "BEGIN { print $bytes / $rows }")"
}

psql_db -A -t -c "SELECT version()" \
	-c "SELECT 'pg_tide ' || extversion FROM pg_extension WHERE extname = 'pg_tide'" \
	-c "SELECT 'pgq ' || extversion FROM pg_extension WHERE extname = 'pgq'"
log "pgbench: ${DURATION}s per run, $REPEATS rounds; sides $SIDES; $SIZES messages per transaction; $CLIENT_COUNTS clients"
for round in $(seq 1 "$REPEATS"); do
	for per_xact in $SIZES; do
		for clients in $CLIENT_COUNTS; do
			# The order of the sides rotates from round to round, so that
			# drift over the run favours none of them.
			set -- $SIDES
			for _ in $(seq 2 "$round"); do set -- "${@:2}" "$1"; done
			for side in "$@"; do
				run "$side" "$per_xact" "$clients" "$round"
			done
		done
	done
done
bench_summary
