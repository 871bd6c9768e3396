#!/usr/bin/env bash
# Sustained load: publishing and consuming at a steady rate for DURATION
# with a short retention, to see whether the message table stays small and
# the rates hold. pg_tide first, then PgQ (Debian's postgresql-15-pgq3) for
# PGQ_DURATION under the same load, in the same cluster, for the WAL each
# message costs. See bench/README.md.
#
# pg_tide: pgbench publishers call tide.outbox_publish() at RATE messages
# per second in all (one per transaction, the payload and headers of
# bench/tide_single.sql); consumers of one group poll and commit batches of
# up to 100 (bench/sustained_tide_consume.sql). A maintenance loop plays the
# relay worker (which is off here, so that nothing else runs): every
# SWEEP_EVERY seconds tide._outbox_partitions_maintain() and
# tide.outbox_sweep(p_older_than => RETENTION), with child tables of
# PARTITION_SIZE ids. PgQ: pgq.insert_event() at the same rate, one
# consumer (next_batch, get_batch_events, finish_batch), and a loop that
# ticks every second and rotates the event tables (rotation_period =
# RETENTION) as pgqd would.
#
# Every SAMPLE_EVERY seconds it records the bytes of the message tables with
# their indexes and TOAST, their dead tuples and the WAL position. At the end
# it reports: the bytes at the end against the bytes one RETENTION after the
# start (the first retention period); the publish rate of the last 5
# minutes against the first 5 (from pgbench's progress lines); and WAL bytes
# per message published, pg_tide's against PgQ's.
#
# Run as root; pg_tide must be installed. Throwaway cluster in
# /tmp/pg_tide_bench_sustained on port 5493 (KEEP_CLUSTER=1 leaves it).
#
# Settings from the environment:
#   DURATION        seconds of pg_tide load (default 1200: 20 minutes)
#   PGQ_DURATION    seconds of PgQ load (default 300; 0 skips PgQ)
#   RATE            messages per second published (default 1000)
#   PUBLISHERS      publishing pgbench clients (default 4)
#   CONSUMERS       consuming pgbench clients (default 2)
#   RETENTION       retention, in seconds (default 240)
#   PARTITION_SIZE  ids per child table (default 20000)
#   SWEEP_EVERY     seconds between sweeps (default 10)
#   SAMPLE_EVERY    seconds between samples (default 30)
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIDE_CLUSTER=/tmp/pg_tide_bench_sustained
export TIDE_PORT=5493
BENCH_NAME=sustained.sh
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"

DURATION=${DURATION:-1200}
PGQ_DURATION=${PGQ_DURATION:-300}
RATE=${RATE:-1000}
PUBLISHERS=${PUBLISHERS:-4}
CONSUMERS=${CONSUMERS:-2}
RETENTION=${RETENTION:-240}
PARTITION_SIZE=${PARTITION_SIZE:-20000}
SWEEP_EVERY=${SWEEP_EVERY:-10}
SAMPLE_EVERY=${SAMPLE_EVERY:-30}
export PGOPTIONS="-c client_min_messages=warning"

bench_need_packages postgresql-15-pgq3
TIDE_EXTRA_CONF="$TIDE_EXTRA_CONF
pg_tide.partition_size = $PARTITION_SIZE
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
SELECT pgq.set_queue_config('bench', 'rotation_period', '$RETENTION seconds');
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
					-c "SELECT tide.outbox_sweep(p_older_than => '$RETENTION seconds')" \
					>>"$TIDE_CLUSTER/sweeps.log"
				next_sweep=$((SECONDS + SWEEP_EVERY))
			fi
			;;
		pgq)
			psql_db -A -t -c "SELECT pgq.ticker()" >/dev/null
			if [ $SECONDS -ge $next_sweep ]; then
				psql_db -A -t -c "SELECT pgq.maint_rotate_tables_step1('bench')" \
					-c "SELECT pgq.maint_rotate_tables_step2()" >/dev/null
				next_sweep=$((SECONDS + SWEEP_EVERY))
			fi
			;;
		esac
		sleep 1
	done
}

# load <side> <seconds>: publishers and consumers for that long, sampling.
load() {
	local side=$1 seconds=$2 start=$SECONDS wal0 wal1 published0 published1 pub_pid con_pid mnt_pid
	psql_db -c "CHECKPOINT" >/dev/null
	wal0=$(psql_db -A -t -c "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
	published0=$(psql_db -A -t -c "SELECT coalesce(pg_sequence_last_value(
		$([ "$side" = tide ] && echo "'tide.tide_outbox_messages_id_seq'" ||
			echo "(SELECT queue_event_seq FROM pgq.queue WHERE queue_name = 'bench')::regclass")), 0)")
	"$PGBENCH" -n -M prepared -c "$PUBLISHERS" -j 2 -T "$seconds" -R "$RATE" -P 10 \
		-f "$BENCH_DIR/${side}_single.sql" "$DB" >"$TIDE_CLUSTER/${side}_publish.log" 2>&1 &
	pub_pid=$!
	"$PGBENCH" -n -M prepared -c "$CONSUMERS" -j "$(( CONSUMERS < 2 ? CONSUMERS : 2 ))" -T "$seconds" \
		-f "$BENCH_DIR/sustained_${side}_consume.sql" "$DB" >"$TIDE_CLUSTER/${side}_consume.log" 2>&1 &
	con_pid=$!
	maintain "$side" "$seconds" &
	mnt_pid=$!
	while [ $((SECONDS - start)) -lt "$seconds" ]; do
		sample "$side" $((SECONDS - start))
		sleep "$SAMPLE_EVERY"
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
	bytes_first=$(awk -F'\t' -v s="$side" -v r="$RETENTION" '$1 == s && $2 >= r { print $3; exit }' "$SAMPLES")
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
		"${bytes_first:-?}" "$RETENTION" "$bytes_end" \
		"$(awk "BEGIN { print ${bytes_first:-0} > 0 ? $bytes_end / ${bytes_first:-1} : 0 }")" "$dead_max" "$wal"
}

log "pg_tide: $DURATION s at $RATE msg/s, $PUBLISHERS publishers, $CONSUMERS consumers, retention $RETENTION s, children of $PARTITION_SIZE ids"
load tide "$DURATION"
if [ "$PGQ_DURATION" -gt 0 ]; then
	log "PgQ: $PGQ_DURATION s at $RATE msg/s, rotation every $RETENTION s"
	load pgq "$PGQ_DURATION"
fi
log "samples: $SAMPLES (side, second, bytes, dead tuples, tables, WAL position)"
cat "$SAMPLES"
bench_summary
