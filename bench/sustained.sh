#!/usr/bin/env bash
# Sustained load: publishing and consuming at a steady rate for
# SUSTAINED_DURATION with a short retention, to see whether the message
# table stays small and the rates hold. pg_tide first, then PgQ (Debian's
# postgresql-15-pgq3) for SUSTAINED_PGQ_DURATION under the same load, in
# the same cluster, for the WAL each message costs. See bench/README.md.
#
# pg_tide: pgbench publishers call tide.outbox_publish() at SUSTAINED_RATE
# messages per second in all (one per transaction, the payload and headers
# of bench/tide_single.sql); consumers of one group poll and commit batches
# (bench/sustained_tide_consume.sql), waiting SUSTAINED_CONSUME_EVERY_MS
# whenever they have caught up, as PgQ's consumer waits for the next tick.
# A maintenance loop plays the relay worker (which is off here, so that
# nothing else runs): every SUSTAINED_SWEEP_EVERY seconds
# tide._outbox_partitions_maintain() and tide.outbox_sweep(p_older_than =>
# SUSTAINED_RETENTION), with child tables of SUSTAINED_PARTITION_SIZE ids.
# PgQ: pgq.insert_event() at the same rate, one consumer (next_batch,
# get_batch_events, finish_batch), and a loop that ticks every second and
# rotates the event tables (rotation_period = SUSTAINED_RETENTION) as pgqd
# would.
#
# Every SUSTAINED_SAMPLE_EVERY seconds it records the bytes of the message
# tables with their indexes and TOAST, their dead tuples and the WAL
# position. At the end it reports: the bytes at the end against the bytes
# one SUSTAINED_RETENTION after the start (the first retention period); the
# publish rate of the last 5 minutes against the first 5 (from pgbench's
# progress lines); and WAL bytes per message published, pg_tide's against
# PgQ's.
#
# Run as root; pg_tide must be installed. Throwaway cluster in
# /tmp/pg_tide_bench_sustained on port 5493 (TIDE_CLUSTER and TIDE_PORT
# override them; KEEP_CLUSTER=1 leaves it running).
#
# Settings from the environment:
#   SUSTAINED_DURATION        seconds of pg_tide load (default 1200)
#   SUSTAINED_PGQ_DURATION    seconds of PgQ load (default 300; 0: none)
#   SUSTAINED_RATE            messages per second published (default 300)
#   SUSTAINED_PUBLISHERS      publishing pgbench clients (default 4)
#   SUSTAINED_CONSUMERS       consuming clients of pg_tide (default 2; PgQ's
#                             consumer takes its batches one after another,
#                             so it has 1)
#   SUSTAINED_RETENTION       retention, in seconds (default 240)
#   SUSTAINED_PARTITION_SIZE  ids per child table (default 10000)
#   SUSTAINED_SWEEP_EVERY     seconds between sweeps (default 5)
#   SUSTAINED_SAMPLE_EVERY    seconds between samples (default 30)
#   SUSTAINED_CONSUME_EVERY_MS  how long a consumer waits when it has caught
#                             up (default 1000: PgQ's ticker ticks every
#                             second here, and its consumer sees new events
#                             once per tick)
#   SUSTAINED_CONSUME_BATCH   most messages a pg_tide poll takes (default
#                             5000)
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIDE_CLUSTER=${TIDE_CLUSTER:-/tmp/pg_tide_bench_sustained}
export TIDE_PORT=${TIDE_PORT:-5493}
BENCH_NAME=sustained.sh
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"

SUSTAINED_DURATION=${SUSTAINED_DURATION:-1200}
SUSTAINED_PGQ_DURATION=${SUSTAINED_PGQ_DURATION:-300}
SUSTAINED_RATE=${SUSTAINED_RATE:-300}
SUSTAINED_PUBLISHERS=${SUSTAINED_PUBLISHERS:-4}
SUSTAINED_CONSUMERS=${SUSTAINED_CONSUMERS:-2}
SUSTAINED_RETENTION=${SUSTAINED_RETENTION:-240}
SUSTAINED_PARTITION_SIZE=${SUSTAINED_PARTITION_SIZE:-10000}
SUSTAINED_SWEEP_EVERY=${SUSTAINED_SWEEP_EVERY:-5}
SUSTAINED_SAMPLE_EVERY=${SUSTAINED_SAMPLE_EVERY:-30}
SUSTAINED_CONSUME_EVERY_MS=${SUSTAINED_CONSUME_EVERY_MS:-1000}
SUSTAINED_CONSUME_BATCH=${SUSTAINED_CONSUME_BATCH:-5000}
export PGOPTIONS="-c client_min_messages=warning"

bench_need_packages postgresql-15-pgq3
TIDE_EXTRA_CONF="$TIDE_EXTRA_CONF
pg_tide.partition_size = $SUSTAINED_PARTITION_SIZE
autovacuum_naptime = 10s"
tide_start_cluster
"$PG_BIN/createdb" "$DB"
psql_db >/dev/null <<SQL
CREATE EXTENSION pg_tide;
CREATE EXTENSION pgq;
SELECT tide.outbox_create('bench', p_inline_threshold => 2000000000);
SELECT tide.create_consumer_group('bench', 'bench');
SELECT tide._outbox_partitions_maintain();
SELECT pgq.create_queue('bench');
SELECT pgq.set_queue_config('bench', 'rotation_period', '$SUSTAINED_RETENTION seconds');
SELECT pgq.register_consumer('bench', 'c');
SQL

SAMPLES=$TIDE_CLUSTER/sustained_samples.tsv
: >"$SAMPLES"

# The bytes (tables, indexes, TOAST) and dead tuples of a side's message
# tables: pg_tide's parent and its children, PgQ's event tables.
side_tables() {
	case $1 in
	tide) echo "SELECT 'tide.tide_outbox_messages'::regclass AS t UNION ALL
		SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'tide.tide_outbox_messages'::regclass" ;;
	pgq) echo "SELECT inhrelid::regclass AS t FROM pg_inherits
		WHERE inhparent = (SELECT queue_data_pfx FROM pgq.queue WHERE queue_name = 'bench')::regclass" ;;
	esac
}
sample() {
	local side=$1 t=$2
	psql_db -A -t -F $'\t' -c "SELECT '$side', $t, coalesce(sum(pg_total_relation_size(x.t)), 0),
		coalesce(sum(s.n_dead_tup), 0), count(*), pg_current_wal_lsn() - '0/0'::pg_lsn
		FROM ($(side_tables "$side")) x LEFT JOIN pg_stat_user_tables s ON s.relid = x.t" >>"$SAMPLES"
}

# maintain <side> <seconds>: what the relay worker (pg_tide) or pgqd (PgQ)
# would do, until the time is up.
maintain() {
	local side=$1 seconds=$2 end=$((SECONDS + $2)) next_sweep=0
	while [ $SECONDS -lt $end ]; do
		case $side in
		tide)
			if [ $SECONDS -ge $next_sweep ]; then
				psql_db -A -t -c "SELECT tide._outbox_partitions_maintain()" \
					-c "SELECT tide.outbox_sweep(p_older_than => '$SUSTAINED_RETENTION seconds')" \
					>>"$TIDE_CLUSTER/sweeps.log"
				next_sweep=$((SECONDS + SUSTAINED_SWEEP_EVERY))
			fi
			;;
		pgq)
			psql_db -A -t -c "SELECT pgq.ticker()" >/dev/null
			if [ $SECONDS -ge $next_sweep ]; then
				psql_db -A -t -c "SELECT pgq.maint_rotate_tables_step1('bench')" \
					-c "SELECT pgq.maint_rotate_tables_step2()" >/dev/null
				next_sweep=$((SECONDS + SUSTAINED_SWEEP_EVERY))
			fi
			;;
		esac
		sleep 1
	done
}

# load <side> <seconds>: publishers and consumers for that long, sampling.
load() {
	local side=$1 seconds=$2 start=$SECONDS wal0 wal1 published0 published1 pub_pid con_pid mnt_pid consumers
	psql_db -c "CHECKPOINT" >/dev/null
	wal0=$(psql_db -A -t -c "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
	published0=$(psql_db -A -t -c "SELECT coalesce(pg_sequence_last_value(
		$([ "$side" = tide ] && echo "'tide.tide_outbox_messages_id_seq'" ||
			echo "(SELECT queue_event_seq FROM pgq.queue WHERE queue_name = 'bench')::regclass")), 0)")
	"$PGBENCH" -n -M prepared -c "$SUSTAINED_PUBLISHERS" -j 2 -T "$seconds" -R "$SUSTAINED_RATE" -P 10 \
		-f "$BENCH_DIR/${side}_single.sql" "$DB" >"$TIDE_CLUSTER/${side}_publish.log" 2>&1 &
	pub_pid=$!
	# A PgQ consumer takes its batches one after another: one client.
	consumers=$SUSTAINED_CONSUMERS
	[ "$side" = pgq ] && consumers=1
	"$PGBENCH" -n -M prepared -c "$consumers" -j "$(( consumers < 2 ? consumers : 2 ))" -T "$seconds" \
		-D batch="$SUSTAINED_CONSUME_BATCH" -D wait="$SUSTAINED_CONSUME_EVERY_MS" \
		-f "$BENCH_DIR/sustained_${side}_consume.sql" "$DB" >"$TIDE_CLUSTER/${side}_consume.log" 2>&1 &
	con_pid=$!
	maintain "$side" "$seconds" &
	mnt_pid=$!
	while [ $((SECONDS - start)) -lt "$seconds" ]; do
		sample "$side" $((SECONDS - start))
		sleep "$SUSTAINED_SAMPLE_EVERY"
	done
	wait "$pub_pid" || { cat "$TIDE_CLUSTER/${side}_publish.log"; tide_show_server_log; exit 1; }
	wait "$con_pid" || { cat "$TIDE_CLUSTER/${side}_consume.log"; tide_show_server_log; exit 1; }
	wait "$mnt_pid"
	sample "$side" $((SECONDS - start))
	wal1=$(psql_db -A -t -c "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
	published1=$(psql_db -A -t -c "SELECT coalesce(pg_sequence_last_value(
		$([ "$side" = tide ] && echo "'tide.tide_outbox_messages_id_seq'" ||
			echo "(SELECT queue_event_seq FROM pgq.queue WHERE queue_name = 'bench')::regclass")), 0)")
	report "$side" "$seconds" "$(awk "BEGIN { print ($wal1 - $wal0) / ($published1 - $published0) }")" \
		"$((published1 - published0))"
}

# report <side> <seconds> <wal bytes per message> <messages>
report() {
	local side=$1 seconds=$2 wal=$3 n=$4 first last bytes_first bytes_end dead_max
	# pgbench's progress lines: "progress: 10.0 s, 999.8 tps, lat ..."
	first=$(awk '/^progress:/ && $2 <= 300 { s += $4; c++ } END { if (c) print s / c }' "$TIDE_CLUSTER/${side}_publish.log")
	last=$(awk -v d="$seconds" '/^progress:/ && $2 > d - 300 { s += $4; c++ } END { if (c) print s / c }' "$TIDE_CLUSTER/${side}_publish.log")
	bytes_first=$(awk -F'\t' -v s="$side" -v r="$SUSTAINED_RETENTION" '$1 == s && $2 >= r { print $3; exit }' "$SAMPLES")
	bytes_end=$(awk -F'\t' -v s="$side" '$1 == s { b = $3 } END { print b }' "$SAMPLES")
	dead_max=$(awk -F'\t' -v s="$side" '$1 == s && $4 > m { m = $4 } END { print m + 0 }' "$SAMPLES")
	bench_record "sustained_publish_first5" "$side" 1 "$first"
	bench_record "sustained_publish_last5" "$side" 1 "$last"
	bench_record "sustained_wal_bytes" "$side" 1 "$wal"
	bench_record "sustained_table_bytes_after_retention" "$side" 1 "${bytes_first:-0}"
	bench_record "sustained_table_bytes_end" "$side" 1 "$bytes_end"
	bench_record "sustained_dead_tuples_max" "$side" 1 "$dead_max"
	printf '  %-5s %5d s, %d messages: publish %.0f/s first 5 min, %.0f/s last 5 min (%.3f);' \
		"$side" "$seconds" "$n" "$first" "$last" "$(awk "BEGIN { print $last / $first }")"
	printf ' table %s B after %d s, %s B at the end (%.2f); dead tuples at most %s; WAL %.0f B/msg\n' \
		"${bytes_first:-?}" "$SUSTAINED_RETENTION" "$bytes_end" \
		"$(awk "BEGIN { print (${bytes_first:-0} > 0 ? $bytes_end / ${bytes_first:-1} : 0) }")" "$dead_max" "$wal"
}

log "pg_tide: $SUSTAINED_DURATION s at $SUSTAINED_RATE msg/s, $SUSTAINED_PUBLISHERS publishers, $SUSTAINED_CONSUMERS consumers, retention $SUSTAINED_RETENTION s, children of $SUSTAINED_PARTITION_SIZE ids"
load tide "$SUSTAINED_DURATION"
if [ "$SUSTAINED_PGQ_DURATION" -gt 0 ]; then
	log "PgQ: $SUSTAINED_PGQ_DURATION s at $SUSTAINED_RATE msg/s, rotation every $SUSTAINED_RETENTION s"
	load pgq "$SUSTAINED_PGQ_DURATION"
fi
log "samples: $SAMPLES (side, second, bytes, dead tuples, tables, WAL position)"
cat "$SAMPLES"
bench_summary
