#!/usr/bin/env bash
# Inbox throughput, 8 pgbench clients, every statement its own transaction:
#   receive_new   tide.inbox_receive() with a new event id every time
#   receive_half  tide.inbox_receive() where half the ids are duplicates of
#                 events stored before the run
#   claim_mark    tide.inbox_claim() of up to 10 messages, then
#                 tide.inbox_mark_processed() of each (two transactions)
# See bench/README.md.
#
# Run as root. pg_tide must already be built and installed (run
# test/demo.sh or test/run-tests.sh first); this script builds nothing.
# It starts its own throwaway cluster in /tmp/pg_tide_bench_inbox on port
# 5495 and stops it at the end (KEEP_CLUSTER=1 leaves it running).
#
# Settings from the environment:
#   DURATION  seconds per pgbench run (default 20)
#   REPEATS   runs per case (default 2)
#   CLIENTS   pgbench clients (default 8)
#   JOBS      pgbench threads (default 2)
#   BATCH     messages per claim in claim_mark (default 10)
# With the defaults it runs for about 2.5 minutes.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIDE_CLUSTER=/tmp/pg_tide_bench_inbox
export TIDE_PORT=5495
BENCH_NAME=inbox.sh
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"

DURATION=${DURATION:-20}
REPEATS=${REPEATS:-2}
CLIENTS=${CLIENTS:-8}
JOBS=${JOBS:-2}
BATCH=${BATCH:-10}
# Events stored before a receive_half run: the duplicates are drawn from them.
PRELOADED=100000
# Pending messages before a claim_mark run: more than a run can process.
PENDING=400000

tide_start_cluster
"$PG_BIN/createdb" "$DB"

log "creating pg_tide and the inbox"
psql_db <<'SQL'
CREATE EXTENSION pg_tide;
SELECT tide.inbox_create('bench') \gset
CREATE SCHEMA bench;
-- New event ids: 'evt-<n>'.
CREATE SEQUENCE bench.event_ids;
SQL

# Empties the inbox and stores what the case starts with, then checkpoints
# and vacuums, so that every run of a case starts from the same state.
# Rows are written straight into the table: faster than receiving them.
reset_inbox() {
	local case=$1
	psql_db -c "TRUNCATE tide.bench_inbox" -c "ALTER SEQUENCE bench.event_ids RESTART"
	case $case in
	receive_half)
		psql_db -c "INSERT INTO tide.bench_inbox (event_id, source, payload)
			SELECT 'pre-' || g, 'preload', jsonb_build_object('n', g)
			  FROM generate_series(1, $PRELOADED) g" ;;
	claim_mark)
		psql_db -c "INSERT INTO tide.bench_inbox (event_id, source, payload)
			SELECT 'pre-' || g, 'preload', jsonb_build_object('n', g)
			  FROM generate_series(1, $PENDING) g" ;;
	esac
	psql_db -c "VACUUM ANALYZE tide.bench_inbox" -c "CHECKPOINT"
}

# run <case> <repeat>
run() {
	local case=$1 rep=$2 out tps lat xacts rows new msgs script
	out=$TIDE_CLUSTER/pgbench_${case}_${rep}.log
	script=inbox_$case
	reset_inbox "$case"
	"$PGBENCH" -n -M prepared -c "$CLIENTS" -j "$JOBS" -T "$DURATION" \
		-D preloaded=$PRELOADED -D batch="$BATCH" \
		-f "$BENCH_DIR/$script.sql" "$DB" >"$out" 2>&1 ||
		{ cat "$out"; tide_show_server_log; exit 1; }
	tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' "$out")
	lat=$(sed -n 's/^latency average = \([0-9.]*\) ms$/\1/p' "$out")
	xacts=$(sed -n 's/^number of transactions actually processed: \([0-9]*\)$/\1/p' "$out")
	rows=$(scalar "SELECT count(*) FROM tide.bench_inbox")
	new=$(scalar "SELECT count(*) FROM tide.bench_inbox WHERE event_id LIKE 'evt-%'")
	case $case in
	receive_new)
		# Every transaction stored exactly one new event.
		[ "$rows" -eq "$xacts" ] && [ "$new" -eq "$xacts" ] ||
			{ echo "inbox.sh: $case: $xacts transactions but $rows rows" >&2; exit 1; }
		msgs=$xacts ;;
	receive_half)
		# Duplicates stored nothing: the new rows are the transactions that
		# sent a new id, each of which took one value of the sequence.
		[ "$rows" -eq $((PRELOADED + new)) ] &&
			[ "$new" -eq "$(scalar "SELECT coalesce(pg_sequence_last_value('bench.event_ids'), 0)")" ] ||
			{ echo "inbox.sh: $case: $rows rows, $new new" >&2; exit 1; }
		echo "  receive_half: $new of $xacts receives were new"
		msgs=$xacts ;;
	claim_mark)
		# Every claimed message was marked once; some were left pending.
		msgs=$(scalar "SELECT count(*) FROM tide.bench_inbox WHERE processed_at IS NOT NULL")
		local claimed
		claimed=$(scalar "SELECT count(*) FROM tide.bench_inbox
			WHERE processed_at IS NULL AND claimed_until IS NOT NULL")
		[ "$claimed" -eq 0 ] && [ "$msgs" -lt "$PENDING" ] ||
			{ echo "inbox.sh: $case: $claimed claimed but not processed, $msgs processed" >&2; exit 1; }
		;;
	esac
	# Messages per second: TPS x messages per transaction.
	msgs=$(awk "BEGIN { print $tps * $msgs / $xacts }")
	printf '%s\t%s\t%s\t%s\t%s\n' "$case" "$rep" "$tps" "$lat" "$msgs" >>"$RESULTS"
	printf '  %-12s run %s  %9.1f tps  %9.0f msg/s  %7.2f ms\n' "$case" "$rep" "$tps" "$msgs" "$lat"
}

: >"$RESULTS"
scalar "SELECT version()"
scalar "SELECT 'pg_tide ' || extversion FROM pg_extension WHERE extname = 'pg_tide'"
log "pgbench: $CLIENTS clients, $JOBS threads, ${DURATION}s per run, $REPEATS runs per case, claim batch $BATCH"
for rep in $(seq 1 "$REPEATS"); do
	for c in receive_new receive_half claim_mark; do
		run "$c" "$rep"
	done
done

log "results (TPS = pgbench transactions/s; msg/s = messages received or processed per second)"
awk -F'\t' '
	{ n[$1]++; tps[$1] += $3; lat[$1] += $4; msgs[$1] += $5
	  printf "%-13s run %s  %9.1f tps  %9.0f msg/s  %7.2f ms\n", $1, $2, $3, $5, $4 }
	END {
		split("receive_new receive_half claim_mark", cases, " ")
		for (i = 1; i <= 3; i++) {
			c = cases[i]
			printf "%-13s mean   %9.1f tps  %9.0f msg/s  %7.2f ms\n", c,
				tps[c] / n[c], msgs[c] / n[c], lat[c] / n[c]
		}
	}' "$RESULTS"
echo "claim_mark: one pgbench transaction = one claim of up to $BATCH messages plus their marks"
