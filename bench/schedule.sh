#!/usr/bin/env bash
# Scheduled messages (docs/scheduled-messages.md): what a schedule table
# full of messages due far ahead costs the messages that are not
# scheduled. In one run, the publish rate (pgbench, one
# tide.outbox_publish() per transaction) and the relay rate (a backlog
# through a forward pipeline to a local inbox, sink type "inbox") with
#   empty  tide.outbox_scheduled empty,
#   far    100,000 scheduled messages due in 30 days,
#   due    the same, and messages of another outbox falling due all
#          through the run (DUE_PER_S a second, moved by the relay),
# the cases in turns first from round to round, each case's rate and the
# server's CPU per message (every process of the cluster: the backends, the
# relay worker, and the moves in case due) divided by empty's in the same
# round (target: 1 within the noise).
#
# Publish side: pgbench -M prepared, CLIENTS clients, DURATION seconds,
# bench/tide_single.sql; the relay worker runs (an enabled row it passes
# over keeps it, as in bench/inbox_sink.sh), so the schedule's looks are
# in it. Relay side: N messages published while the pipeline is disabled;
# the rate is N divided by the time from the commit that enables it to the
# recording of its last message. The far rows are copied in from a table
# that keeps them (scheduled once through tide.outbox_schedule), and the
# empty case deletes them; both then vacuum the schedule.
#
# Run as root. pg_tide must already be built and installed (PG_CONFIG
# another PostgreSQL's pg_config, see test/lib.sh); this script builds
# nothing. It starts its own throwaway cluster in /tmp/pg_tide_bench_schedule
# on port 5491 and stops it at the end (KEEP_CLUSTER=1 leaves it running).
#
# Settings from the environment:
#   N          relay backlog per run (default 100000)
#   FAR        scheduled messages due far ahead (default 100000)
#   DURATION   seconds per pgbench run (default 5)
#   CLIENTS    pgbench clients (default 1); threads: at most 2
#   DUE_PER_S  scheduled messages falling due per second in case due
#              (default 200)
#   REPEATS    rounds (default 3); each figure is the median of the rounds
# With the defaults it runs for about 3 minutes.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIDE_CLUSTER=${TIDE_CLUSTER:-/tmp/pg_tide_bench_schedule}
export TIDE_PORT=${TIDE_PORT:-5491}
BENCH_NAME=schedule.sh
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"
bench_relay_settings

FAR=${FAR:-100000}
DURATION=${DURATION:-5}
CLIENTS=${CLIENTS:-1}
DUE_PER_S=${DUE_PER_S:-200}
CASES="empty far due"

tide_start_cluster
"$PG_BIN/createdb" "$DB"

log "creating the outboxes, the pipeline and $FAR messages scheduled 30 days ahead"
psql_db -f "$BENCH_DIR/payload.sql" >/dev/null
psql_db >/dev/null <<SQL
CREATE EXTENSION pg_tide;
-- no consumer group holds them back: a threshold no run reaches
SELECT tide.outbox_create('bench', p_inline_threshold => 2000000000);
SELECT tide.outbox_create('side', p_inline_threshold => 2000000000);
SELECT tide.inbox_create('relayed');
SELECT tide.relay_set_outbox('to_inbox', 'bench', 'to_inbox',
	'{"sink_type": "inbox", "inbox": "relayed", "batch_size": $BATCH_SIZE}');
SELECT tide.relay_disable('to_inbox');
-- an enabled row that the relay passes over keeps the worker running
SET session_replication_role = replica;
INSERT INTO tide.relay_outbox_config (name, config) VALUES ('keep_worker', '{}');
RESET session_replication_role;
SELECT tide._relay_wake_worker();
SELECT tide.outbox_schedule('bench', bench.payload(i), bench.headers(i),
							now() + interval '30 days' + i * interval '1 ms')
  FROM generate_series(1, $FAR) i;
CREATE TABLE bench.far_rows AS SELECT * FROM tide.outbox_scheduled;
DELETE FROM tide.outbox_scheduled;
SQL
# one transaction, to check that it publishes
"$PGBENCH" -n -M prepared -c 1 -t 1 -f "$BENCH_DIR/tide_single.sql" "$DB" >/dev/null
psql_db -c "SELECT tide._outbox_partitions_maintain()" >/dev/null

# set_case <case> <seconds>: the schedule as the case has it, with case
# due's messages falling due over the next <seconds>.
set_case() {
	local case=$1 secs=$2
	psql_db -c "DELETE FROM tide.outbox_scheduled" >/dev/null
	[ "$case" = empty ] || psql_db -c "INSERT INTO tide.outbox_scheduled SELECT * FROM bench.far_rows" >/dev/null
	psql_db -c "VACUUM ANALYZE tide.outbox_scheduled" -c "CHECKPOINT" >/dev/null
	[ "$case" = due ] || return 0
	psql_db -c "SELECT tide.outbox_schedule('side', bench.payload(i), NULL,
					clock_timestamp() + (i::float8 / $DUE_PER_S) * interval '1 second')
				FROM generate_series(1, $((secs * DUE_PER_S))) i" >/dev/null
}

# server_cpu: CPU seconds the cluster's processes have used: the
# postmaster's own and its ended children's, and those of its children
# that run.
server_cpu() {
	local pm child
	pm=$(head -n 1 "$TIDE_CLUSTER/data/postmaster.pid")
	{
		sed -E 's/^.*\) //' "/proc/$pm/stat" | awk '{ print $12 + $13 + $14 + $15 }'
		for child in $(pgrep -P "$pm"); do
			sed -E 's/^.*\) //' "/proc/$child/stat" 2>/dev/null | awk '{ print $12 + $13 }' || true
		done
	} | awk -v hz="$(getconf CLK_TCK)" '{ s += $1 } END { printf "%.3f", s / hz }'
}

# due_left: the case due's messages not moved yet.
due_left() { scalar "SELECT count(*) FROM tide.outbox_scheduled WHERE outbox_name = 'side'"; }

# publish_side <case> <round>: pgbench's rate, in RATE, and the server's
# CPU microseconds per message, in CPU_US.
publish_side() {
	local out=$TIDE_CLUSTER/pgbench_$1_$2.log cpu0 cpu1 done
	psql_db -c "TRUNCATE tide.tide_outbox_messages" -c "CHECKPOINT" >/dev/null
	set_case "$1" "$DURATION"
	cpu0=$(server_cpu)
	"$PGBENCH" -n -M prepared -c "$CLIENTS" -j "$((CLIENTS < 2 ? CLIENTS : 2))" -T "$DURATION" \
		-f "$BENCH_DIR/tide_single.sql" "$DB" >"$out" 2>&1 || { cat "$out"; tide_show_server_log; exit 1; }
	cpu1=$(server_cpu)
	RATE=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' "$out")
	done=$(sed -n 's/^number of transactions actually processed: \([0-9]*\)$/\1/p' "$out")
	CPU_US=$(awk "BEGIN { printf \"%.1f\", ($cpu1 - $cpu0) * 1e6 / $done }")
	MOVED_LEFT=$(due_left)
}

# relay_side <case>: the pipeline's rate for a backlog of N, in RATE, and
# the server's CPU microseconds per message, in CPU_US.
relay_side() {
	local start end last rows secs cpu0 cpu1
	psql_db -c "TRUNCATE tide.tide_outbox_messages, tide.relayed_inbox" >/dev/null
	bench_publish bench "$N"
	last=$(scalar "SELECT max(id) FROM tide.tide_outbox_messages WHERE outbox_name = 'bench'")
	# case due's messages fall due over about the time the last empty
	# case took (5 s before the first)
	secs=$(awk "BEGIN { s = ${EMPTY_RELAY_S:-5}; printf \"%d\", s < 1 ? 1 : s + 0.5 }")
	set_case "$1" "$secs"
	cpu0=$(server_cpu)
	start=$(bench_enable_timed to_inbox)
	end=$(bench_wait_recorded to_inbox "$last") || exit 1
	cpu1=$(server_cpu)
	MOVED_LEFT=$(due_left)
	psql_db -c "SELECT tide.relay_disable('to_inbox')" >/dev/null
	rows=$(scalar "SELECT count(*) FROM tide.relayed_inbox")
	[ "$rows" -eq "$N" ] || { echo "schedule.sh: the relay wrote $rows rows, not $N" >&2; exit 1; }
	RATE=$(awk "BEGIN { printf \"%.0f\", $N / ($end - $start) }")
	CPU_US=$(awk "BEGIN { printf \"%.1f\", ($cpu1 - $cpu0) * 1e6 / $N }")
	[ "$1" != empty ] || EMPTY_RELAY_S=$(awk "BEGIN { print $end - $start }")
}

# Waits until case due's messages of a run have all moved (at most 60 s).
wait_moved() {
	local i
	for i in $(seq 1 600); do
		[ "$(due_left)" -eq 0 ] && return 0
		sleep 0.1
	done
	echo "schedule.sh: scheduled messages were not moved within 60 s" >&2
	tide_show_server_log
	exit 1
}

scalar "SELECT version()"
log "publish: ${DURATION}s per run, $CLIENTS clients; relay: $N messages; $FAR far; $DUE_PER_S due/s; $REPEATS rounds"
for round in $(seq 1 "$REPEATS"); do
	# the cases in turns first: round 1 empty far due, round 2 far due empty, ...
	read -ra order <<<"$CASES"
	shift_by=$(((round - 1) % ${#order[@]}))
	order=("${order[@]:shift_by}" "${order[@]:0:shift_by}")
	declare -A rate=() cpu=()
	for side in relay publish; do
		for case in "${order[@]}"; do
			"${side}_side" "$case" "$round"
			rate[$side$case]=$RATE
			cpu[$side$case]=$CPU_US
			printf '  round %s  %-7s %-5s %10.0f msg/s  %7.1f us server CPU/msg%s\n' "$round" "$side" "$case" \
				"$RATE" "$CPU_US" "$([ "$case" = due ] && echo "  (scheduled left at the end: $MOVED_LEFT)")"
			bench_record "schedule_$side" "$case" "$round" "$RATE"
			bench_record "schedule_${side}_cpu_us" "$case" "$round" "$CPU_US"
			[ "$case" != due ] || wait_moved
		done
	done
	for case in far due; do
		for side in publish relay; do
			ratio=$(awk "BEGIN { printf \"%.3f\", ${rate[$side$case]} / ${rate[${side}empty]} }")
			cpu_ratio=$(awk "BEGIN { printf \"%.3f\", ${cpu[$side$case]} / ${cpu[${side}empty]} }")
			bench_record "schedule_${side}_ratio" "${case}_per_empty" "$round" "$ratio"
			bench_record "schedule_${side}_cpu_ratio" "${case}_per_empty" "$round" "$cpu_ratio"
			printf '  round %s  %-7s %s / empty: rate %s, server CPU per message %s\n' "$round" "$side" "$case" "$ratio" "$cpu_ratio"
		done
	done
done
bench_summary
