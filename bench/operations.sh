#!/usr/bin/env bash
# Operations: what the attempt log and routing filters cost the relay's
# throughput, and whether the tables stay the same size over a long
# publish-and-deliver run with retention applied. See bench/README.md.
#
# Part 1, throughput (like relay.sh): per round and mode (single, batch), N
# messages are published into one outbox while four pipelines of it, each
# with a consumer group of its own, are disabled; then each pipeline in turn
# is enabled by one transaction (which also wakes the worker), and its rate is
# N divided by the time from that commit to the recording of the last message
# (tide.relay_consumer_offsets.updated_at). The four pipelines, delivering to
# the same receiver:
#   base    {"attempt_log": false}, no routing
#   log     the attempt log on (the default)
#   filter  "types": ["order.*"] and a filter that every message passes,
#           {"attempt_log": false}
#   both    the attempt log and the filter
# Every message has the header type order.created and an amount >= 0. The
# order of the four alternates between rounds; each variant's ratio to base is
# taken within its round. The attempt log is truncated before each run, and
# its size per row measured after each run that wrote it.
#
# Part 2, flat sizes: for DURATION_FLAT seconds pgbench publishes RATE
# messages/s (one per transaction) into outbox 'flat', which a webhook
# pipeline (attempt log on, default settings otherwise) delivers and a second
# consumer group ('readers', a pgbench client polling and committing 5 times a
# second) reads. Retention: tide.outbox_sweep(p_older_than => '60 seconds')
# every 10 s (standing for a short retention_hours; the relay's own sweep
# only knows whole hours) and pg_tide.attempt_log_retention = '120s'. Every
# 30 s it samples the row counts and sizes of the tables and the lag, then
# judges whether the sizes stayed flat.
#
# Run as root. pg_tide must already be built and installed (run
# test/demo.sh or test/run-tests.sh first); this script builds only
# test/receiver. It starts its own throwaway cluster in
# /tmp/pg_tide_bench_ops on port 5496 and stops it at the end
# (KEEP_CLUSTER=1 leaves it running), and the receiver on a free port of
# 127.0.0.1.
#
# Settings from the environment:
#   PARTS          which parts to run: "throughput flat" (default), or one
#   REPEATS        rounds of part 1 (default 3); figures are medians of rounds
#   N_SINGLE       messages per mode-single run (default 30000)
#   N_BATCH        messages per mode-batch run (default 200000)
#   BATCH_SIZE     batch_size of both modes (default 1000); max_in_flight 16
#   DURATION_FLAT  seconds of part 2 (default 600)
#   RATE           messages/s published in part 2 (default 500)
#   SAMPLE         seconds between samples of part 2 (default 30)
# With the defaults it runs for about 13 minutes (part 1 about 2.5).
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIDE_CLUSTER=/tmp/pg_tide_bench_ops
export TIDE_PORT=5496
BENCH_NAME=operations.sh
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"

# The sizing of lib.sh, with the relay on. The naptime starts short and is
# then set to 60 s for part 1 (as in relay.sh: every run wakes the worker
# with a commit); part 2 goes back to the default. The attempt log keeps
# 120 s (the worker trims it once a minute); part 1 truncates it before
# every run anyway.
export TIDE_EXTRA_CONF="shared_buffers = 1GB
max_wal_size = 16GB
checkpoint_timeout = 30min
max_connections = 50
pg_tide.relay_enabled = on
pg_tide.relay_naptime_ms = 200
pg_tide.attempt_log_retention = '120s'"

# The NOTICEs of relay_delete and outbox_drop are expected.
export PGOPTIONS="-c client_min_messages=warning"

PARTS=${PARTS:-throughput flat}
REPEATS=${REPEATS:-3}
N_SINGLE=${N_SINGLE:-30000}
N_BATCH=${N_BATCH:-200000}
BATCH_SIZE=${BATCH_SIZE:-1000}
MAX_IN_FLIGHT=16
DURATION_FLAT=${DURATION_FLAT:-600}
RATE=${RATE:-500}
SAMPLE=${SAMPLE:-30}
SAMPLES=$TIDE_CLUSTER/samples.tsv

bench_need_receiver curl jq

BG_PIDS=()
cleanup() {
	local p
	for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	bench_cleanup
}
trap cleanup EXIT

# start_receiver: a receiver that logs nothing on a free port of 127.0.0.1
# (from a random point of 20000-29999 on); RECEIVER_PID and PORT.
start_receiver() {
	local p pid
	for p in $(seq $((20000 + RANDOM % 9000)) 29999); do
		ss -Hltn "sport = :$p" | grep -q . && continue
		"$RECEIVER_BIN" "$p" - 2>/dev/null &
		pid=$!
		for _ in $(seq 1 100); do
			kill -0 "$pid" 2>/dev/null || break
			if curl -sf "http://127.0.0.1:$p/__health" >/dev/null; then
				BG_PIDS+=("$pid")
				RECEIVER_PID=$pid
				PORT=$p
				return
			fi
			sleep 0.05
		done
		kill "$pid" 2>/dev/null || true
	done
	echo "operations.sh: could not start the receiver" >&2
	exit 1
}
control() { curl -sf -X POST --data "$1" "http://127.0.0.1:$PORT/__control" >/dev/null; }
stats() { curl -sf "http://127.0.0.1:$PORT/__stats"; }

# CPU seconds so far of a process (utime + stime).
proc_cpu() {
	awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); print ($12 + $13) / hz }' "/proc/$1/stat"
}
# CPU seconds used so far by this cluster (live processes, and the backends
# the postmaster has reaped), by this shell's children (psql, curl), by the
# receiver and by the whole machine (as in publish.sh). Their differences
# over a run give the CPU that other processes took: a run that shared the
# 2 cores with something else shows here. Run it in this shell, not in $(...).
cpu_seconds() {
	local pm hz
	pm=$(head -n 1 "$TIDE_CLUSTER/data/postmaster.pid")
	hz=$(getconf CLK_TCK)
	times >"$TIDE_CLUSTER/times.out"
	awk -v hz="$hz" '$1 == "cpu" { print ($2 + $3 + $4 + $7 + $8) / hz }' /proc/stat
	{ cat "/proc/$pm/stat"; for c in $(ps -o pid= --ppid "$pm"); do
		cat "/proc/$c/stat" 2>/dev/null || true; done; } |
		awk -v hz="$hz" '{ sub(/^.*\) /, ""); t += $12 + $13
			if (++n == 1) t += $14 + $15 } END { print t / hz }'
	awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/)
		print u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$TIDE_CLUSTER/times.out"
	proc_cpu "$RECEIVER_PID"
}
worker_pid() { psql_db -A -t -c "SELECT pid FROM tide.relay_workers() WHERE database = '$DB'"; }

tide_start_cluster
"$PG_BIN/createdb" "$DB"
start_receiver

log "creating pg_tide and the wake-up pipeline"
# 'wake' (a file pipeline of its own outbox) keeps a pipeline enabled, so
# that commits wake the worker; see relay.sh.
psql_db >/dev/null <<SQL
CREATE EXTENSION pg_tide;
SELECT tide.outbox_create('wake', p_inline_threshold => 2000000000);
SELECT tide.relay_set_outbox('wake', 'wake', 'wake',
	'{"sink_type": "file", "path": "$TIDE_CLUSTER/wake.jsonl", "fsync": false}');
-- The payload and headers of bench/tide_single.sql (about 200 and 114
-- bytes), with "amount" (a number, in euros) instead of "amount_cents" for
-- the filter and a header "type": "order.created" for "types".
CREATE SCHEMA bench;
CREATE FUNCTION bench.payload(i bigint) RETURNS jsonb LANGUAGE sql AS \$\$
	SELECT jsonb_build_object('event', 'order.created',
		'order_id', 10000000 + i, 'customer_id', 100000 + i % 900000,
		'amount', (100 + i % 99900) / 100.0, 'currency', 'EUR', 'items', 3,
		'sku', 'SKU-' || lpad(((10000000 + i) % 100000000)::text, 8, '0'),
		'created_at', now())
\$\$;
CREATE FUNCTION bench.headers(i bigint) RETURNS jsonb LANGUAGE sql AS \$\$
	SELECT jsonb_build_object('type', 'order.created', 'trace_id', md5((10000000 + i)::text),
		'source', 'checkout-service', 'content_type', 'application/json')
\$\$;
SQL
passes() { psql_db -A -t -c "SELECT coalesce(max(passes), 0) FROM tide.relay_workers() WHERE database = '$DB'"; }
p0=$(passes)
for _ in $(seq 1 100); do
	[ "$(passes)" -gt $((p0 + 1)) ] && break
	sleep 0.1
done
psql_db -c "ALTER SYSTEM SET pg_tide.relay_naptime_ms = 60000" -c "SELECT pg_reload_conf()" >/dev/null
sleep 0.5
psql_db -A -t -c "SELECT version()" \
	-c "SELECT 'pg_tide ' || extversion FROM pg_extension WHERE extname = 'pg_tide'" \
	-c "SELECT 'payload ' || length(bench.payload(1)::text) || ' bytes, headers ' || length(bench.headers(1)::text) || ' bytes'"

FILTER='"types": ["order.*"], "filter": {"$or": [{"amount": {"$gte": 0}}, {"vip": true}]}'
# variant_config <variant> <mode>
variant_config() {
	local extra
	case $1 in
	base) extra=', "attempt_log": false' ;;
	log) extra='' ;;
	filter) extra=", $FILTER, \"attempt_log\": false" ;;
	both) extra=", $FILTER" ;;
	esac
	printf '{"sink_type": "webhook", "url": "http://127.0.0.1:%s/hook", "allow_http": true, "allow_private_network": true, "mode": "%s", "batch_size": %s, "max_in_flight": %s%s}' \
		"$PORT" "$2" "$BATCH_SIZE" "$MAX_IN_FLIGHT" "$extra"
}
VARIANTS="base log filter both"

# prepare_round <mode> <round> <n>: outbox <mode>_<round> with <n> messages
# (10000 per call) and its four pipelines, disabled, each with its own
# consumer group (created at 'earliest', so each delivers all <n>).
prepare_round() {
	local mode=$1 round=$2 n=$3 ob=${1}_$2 v
	{
		echo "SELECT tide.outbox_create('$ob', p_inline_threshold => 2000000000);"
		for v in $VARIANTS; do
			echo "BEGIN;"
			echo "SELECT tide.relay_set_outbox('${ob}_$v', '$ob', '${ob}_$v', '$(variant_config "$v" "$mode")');"
			echo "SELECT tide.relay_disable('${ob}_$v');"
			echo "COMMIT;"
		done
		bench_publish_sql "$ob" "$n"
		echo "VACUUM ANALYZE tide.tide_outbox_messages;"
	} | psql_db >/dev/null
}

# throughput <mode> <round> <variant> <n>: truncates the attempt log,
# checkpoints, enables the variant's pipeline, waits until its offset reaches
# the last message, and appends "mode round variant n seconds msg/s
# worker_us_per_msg attempts_rows attempts_bytes".
throughput() {
	local mode=$1 round=$2 v=$3 n=$4 ob=${1}_$2 name last per_req start end secs wpid w0 w1 st
	local arows abytes filtered t0 others
	name=${ob}_$v
	last=$(psql_db -A -t -c "SELECT max(id) FROM tide.tide_outbox_messages WHERE outbox_name = '$ob'")
	if [ "$mode" = batch ]; then per_req=$BATCH_SIZE; else per_req=1; fi
	psql_db -c "TRUNCATE tide.relay_attempts" -c "CHECKPOINT" >/dev/null
	control '{"reset": true}'
	wpid=$(worker_pid)
	w0=$(proc_cpu "$wpid")
	cpu_seconds >"$TIDE_CLUSTER/cpu.before"
	t0=$(date +%s.%N)
	start=$(psql_db -A -t <<SQL
BEGIN;
SELECT tide.relay_enable('$name');
SELECT tide.outbox_publish('wake', '{}');
SELECT extract(epoch FROM clock_timestamp());
COMMIT;
SQL
)
	start=$(echo "$start" | tail -n 1)
	end=$(bench_wait_recorded "$name" "$last") || exit 1
	w1=$(proc_cpu "$wpid")
	cpu_seconds >"$TIDE_CLUSTER/cpu.after"
	# Cores used by other processes on average over the run.
	others=$(paste "$TIDE_CLUSTER/cpu.before" "$TIDE_CLUSTER/cpu.after" |
		awk -v d="$(awk "BEGIN { print $(date +%s.%N) - $t0 }")" '{ t += ($2 - $1) * (NR == 1 ? 1 : -1) } END { print t / d }')
	st=$(stats)
	if [ "$(echo "$st" | jq '.requests - (.status["200"] // 0)')" -ne 0 ] ||
		[ "$(echo "$st" | jq .requests)" -ne $((n / per_req)) ]; then
		echo "operations.sh: $name: not $((n / per_req)) requests all answered 200: $st" >&2
		exit 1
	fi
	read -r arows abytes filtered < <(psql_db -A -t -F ' ' -c "SELECT (SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = '$name' AND status = 'success'), pg_total_relation_size('tide.relay_attempts'), (SELECT filtered FROM tide.relay_pipeline_status WHERE pipeline = '$name')")
	# Every message passes the filter; the attempt log has one row per
	# message when it is on, none when off.
	local want=0
	case $v in log | both) want=$n ;; esac
	if [ "$filtered" -ne 0 ] || [ "$arows" -ne "$want" ]; then
		echo "operations.sh: $name: $filtered messages filtered out, $arows attempts logged (expected 0 and $want)" >&2
		exit 1
	fi
	psql_db -c "SELECT tide.relay_delete('$name')" >/dev/null
	secs=$(awk "BEGIN { print $end - $start }")
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$round" "$v" "$n" "$secs" \
		"$(awk "BEGIN { print $n / $secs }")" "$(awk "BEGIN { print ($w1 - $w0) / $n * 1e6 }")" \
		"$arows	$abytes	$others" >>"$RESULTS"
	printf '  %-6s round %s  %-6s %7d messages in %6.3f s  %8.0f msg/s  worker %5.1f us/msg  others %.2f%s\n' "$mode" "$round" "$v" "$n" "$secs" \
		"$(awk "BEGIN { print $n / $secs }")" "$(awk "BEGIN { print ($w1 - $w0) / $n * 1e6 }")" "$others" \
		"$([ "$arows" -gt 0 ] && awk "BEGIN { printf \"  attempt log %.0f bytes/row\", $abytes / $arows }")"
}

part_throughput() {
	local round mode n order v
	: >"$RESULTS"
	log "throughput: $REPEATS rounds; single $N_SINGLE, batch $N_BATCH messages; variants $VARIANTS"
	for v in $VARIANTS; do printf '%-6s single: %s\n' "$v" "$(variant_config "$v" single)"; done
	for round in $(seq 1 "$REPEATS"); do
		if [ $((round % 2)) = 1 ]; then order="base log filter both"; else order="both filter log base"; fi
		for mode in single batch; do
			if [ "$mode" = single ]; then n=$N_SINGLE; else n=$N_BATCH; fi
			prepare_round "$mode" "$round" "$n"
			for v in $order; do
				throughput "$mode" "$round" "$v" "$n"
			done
			psql_db -c "SELECT tide.outbox_drop('${mode}_$round')" >/dev/null
		done
	done
	cp "$RESULTS" "$TIDE_CLUSTER/results_$(date +%Y%m%d_%H%M%S).tsv"

	log "throughput (median of $REPEATS rounds, [min to max]; ratios to base within each round)"
	awk -F'\t' -v rounds="$REPEATS" '
		function sort(a, n,   i, j, t) { for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t } }
		function med(a, n) { sort(a, n); return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2 }
		{ rate[$1, $3, $2] = $6; us[$1, $3, $2] = $7; if ($8 > 0) bpr[$1, $3, $2] = $9 / $8
		  if ($10 > 0.3) { dist++; dl = dl sprintf(" %s/%s/%s (%.2f)", $1, $2, $3, $10) } }
		END {
			n = rounds; split("single batch", ms, " "); split("base log filter both", vs, " ")
			printf "%-6s %-7s %9s  %-21s %7s  %-17s %9s\n", "mode", "variant", "msg/s", "[min to max]", "/ base", "[min to max]", "us/msg"
			for (i = 1; i <= 2; i++) for (j = 1; j <= 4; j++) {
				m = ms[i]; v = vs[j]
				for (r = 1; r <= n; r++) { a[r] = rate[m, v, r]; b[r] = rate[m, v, r] / rate[m, "base", r]; c[r] = us[m, v, r] }
				mr = med(a, n); lo = a[1]; hi = a[n]; mb = med(b, n); blo = b[1]; bhi = b[n]; mc = med(c, n)
				printf "%-6s %-7s %9.0f  [%7.0f to %7.0f]  %7.3f  [%5.3f to %5.3f]  %9.1f\n", m, v, mr, lo, hi, mb, blo, bhi, mc
			}
			for (i = 1; i <= 2; i++) for (j = 2; j <= 4; j += 2) {
				m = ms[i]; v = vs[j]; for (r = 1; r <= n; r++) a[r] = bpr[m, v, r]
				printf "attempt log, %-6s %-4s: %.0f bytes per row (pg_total_relation_size / rows) [%.0f to %.0f]\n", m, v, med(a, n), a[1], a[n]
			}
			printf "runs disturbed (others above 0.3 cores): %d%s\n", dist, dl
		}' "$RESULTS"
	echo "us/msg: the relay worker's CPU time per message (median); others: cores that processes other than"
	echo "the cluster, the receiver and this script took during the run (about 0.1 is unattributed kernel work)"
}

# ---------------------------------------------------------------- part 2

sample_flat() {
	psql_db -A -t -F $'\t' <<SQL >>"$SAMPLES"
SELECT round(extract(epoch FROM clock_timestamp()) - $FLAT_T0),
	   (SELECT count(*) FROM tide.tide_outbox_messages WHERE outbox_name = 'flat'),
	   pg_total_relation_size('tide.tide_outbox_messages'),
	   (SELECT count(*) FROM tide.relay_attempts),
	   pg_total_relation_size('tide.relay_attempts'),
	   pg_total_relation_size('tide.relay_consumer_offsets'),
	   pg_total_relation_size('tide.tide_consumer_offsets'),
	   pg_total_relation_size('tide.tide_consumer_leases'),
	   (SELECT lag_messages FROM tide.relay_pipeline_lag WHERE pipeline = 'flat'),
	   (SELECT coalesce(max(id), 0) FROM tide.tide_outbox_messages WHERE outbox_name = 'flat')
		 - (SELECT committed_offset FROM tide.tide_consumer_offsets WHERE group_name = 'readers'),
	   (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'tide.tide_outbox_messages'::regclass),
	   (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'tide.relay_attempts'::regclass);
SQL
}

part_flat() {
	local flat_db=tide_flat nsamples i pub_pid rd_pid sw_pid xacts
	log "flat sizes: ${DURATION_FLAT}s publishing $RATE messages/s; sweep(p_older_than => 60 s) every 10 s; attempt_log_retention 120s; a sample every ${SAMPLE}s"
	# A database of its own: fresh tables, and its worker the only one.
	"$PG_BIN/dropdb" "$DB"
	DB=$flat_db
	"$PG_BIN/createdb" "$DB"
	psql_db -c "ALTER SYSTEM RESET pg_tide.relay_naptime_ms" -c "SELECT pg_reload_conf()" >/dev/null
	psql_db >/dev/null <<SQL
CREATE EXTENSION pg_tide;
SELECT tide.outbox_create('flat', p_inline_threshold => 2000000000);
SELECT tide.relay_set_outbox('flat', 'flat', 'flat',
	'{"sink_type": "webhook", "url": "http://127.0.0.1:$PORT/hook", "allow_http": true, "allow_private_network": true}');
SELECT tide.create_consumer_group('readers', 'flat');
SQL
	psql_db -A -t -c "SELECT 'pipeline flat: ' || tide.relay_get_config('flat')::text" \
		-c "SHOW pg_tide.attempt_log_retention" -c "SHOW pg_tide.sweep_interval" -c "SHOW autovacuum"
	# One message per transaction, the payload and headers of part 1.
	cat >"$TIDE_CLUSTER/flat_publish.sql" <<'SQL'
\set order_id random(1, 100000000)
\set customer_id random(1, 1000000)
\set amount random(100, 100000)
SELECT tide.outbox_publish('flat',
		jsonb_build_object('event', 'order.created',
						   'order_id', :order_id::bigint,
						   'customer_id', :customer_id::bigint,
						   'amount', :amount / 100.0,
						   'currency', 'EUR',
						   'items', 3,
						   'sku', 'SKU-' || lpad((:order_id::bigint % 100000000)::text, 8, '0'),
						   'created_at', now()),
		jsonb_build_object('type', 'order.created',
						   'trace_id', md5(:order_id::text),
						   'source', 'checkout-service',
						   'content_type', 'application/json'));
SQL
	# The second consumer group: poll up to 1000 and acknowledge them in the
	# same transaction.
	cat >"$TIDE_CLUSTER/flat_read.sql" <<'SQL'
SELECT tide.commit_offset('readers', 'reader-1', max(id))
  FROM tide.poll_outbox('readers', 'reader-1', 1000, 30) HAVING count(*) > 0;
SQL
	: >"$SAMPLES"
	: >"$TIDE_CLUSTER/sweep.log"
	FLAT_T0=$(date +%s.%N)
	(cd "$TIDE_CLUSTER" && exec "$PGBENCH" -n -M prepared -c 2 -j 1 -R "$RATE" -T "$DURATION_FLAT" \
		-f "$TIDE_CLUSTER/flat_publish.sql" "$DB" >"$TIDE_CLUSTER/pgbench_flat_publish.out" 2>&1) &
	pub_pid=$!
	BG_PIDS+=("$pub_pid")
	(cd "$TIDE_CLUSTER" && exec "$PGBENCH" -n -M prepared -c 1 -j 1 -R 5 -T "$DURATION_FLAT" \
		-f "$TIDE_CLUSTER/flat_read.sql" "$DB" >"$TIDE_CLUSTER/pgbench_flat_read.out" 2>&1) &
	rd_pid=$!
	BG_PIDS+=("$rd_pid")
	# The sweep every 10 s, standing for a retention of 60 s.
	(while :; do
		sleep 10
		psql_db -A -t -c "SELECT round(extract(epoch FROM clock_timestamp()) - $FLAT_T0), tide.outbox_sweep(p_older_than => interval '60 seconds')"
	done >>"$TIDE_CLUSTER/sweep.log" 2>&1) &
	sw_pid=$!
	BG_PIDS+=("$sw_pid")
	nsamples=$((DURATION_FLAT / SAMPLE))
	sample_flat
	for i in $(seq 1 "$nsamples"); do
		# Sleeps until the next multiple of SAMPLE seconds from the start.
		sleep "$(awk -v t0="$FLAT_T0" -v now="$(date +%s.%N)" -v at=$((i * SAMPLE)) 'BEGIN { d = t0 + at - now; print (d > 0 ? d : 0) }')"
		sample_flat
		tail -n 1 "$SAMPLES" | awk -F'\t' '{ printf "  t=%4ds  messages %6d  %6.1f MB   attempts %6d  %6.1f MB   lag %d\n", $1, $2, $3 / 1048576, $4, $5 / 1048576, $9 }'
	done
	wait "$pub_pid" || { cat "$TIDE_CLUSTER/pgbench_flat_publish.out"; exit 1; }
	wait "$rd_pid" || { cat "$TIDE_CLUSTER/pgbench_flat_read.out"; exit 1; }
	kill "$sw_pid" 2>/dev/null || true
	xacts=$(sed -n 's/^number of transactions actually processed: \([0-9]*\)$/\1/p' "$TIDE_CLUSTER/pgbench_flat_publish.out")

	log "flat sizes: samples (sizes pg_total_relation_size in kB; lag in messages)"
	awk -F'\t' 'BEGIN { printf "%6s %8s %9s %8s %9s %8s %8s %8s %7s %7s %8s %8s\n", "t (s)", "messages", "msgs kB", "attempts", "att kB", "r_off kB", "c_off kB", "lease kB", "lag", "rd lag", "dead msg", "dead att" }
		{ printf "%6d %8d %9.0f %8d %9.0f %8.0f %8.0f %8.0f %7d %7d %8d %8d\n", $1, $2, $3 / 1024, $4, $5 / 1024, $6 / 1024, $7 / 1024, $8 / 1024, $9, $10, $11, $12 }' "$SAMPLES"
	echo "r_off: relay_consumer_offsets, c_off: tide_consumer_offsets, lease: tide_consumer_leases;"
	echo "lag: relay_pipeline_lag.lag_messages of the pipeline; rd lag: newest id minus the 'readers' group's offset;"
	echo "dead: n_dead_tup of tide_outbox_messages and relay_attempts at the sample"
	printf 'published: %s transactions in %s s (%.1f/s); swept: %s messages in %s sweeps\n' "$xacts" "$DURATION_FLAT" \
		"$(awk "BEGIN { print $xacts / $DURATION_FLAT }")" \
		"$(cut -d '|' -f 2 "$TIDE_CLUSTER/sweep.log" | jq -s 'map(.deleted) | add // 0')" \
		"$(grep -c deleted "$TIDE_CLUSTER/sweep.log")"

	# Flat: after the warm-up (the first half of the samples), every sample
	# within 20 % of the median of the last half; and no growth: the mean of
	# the last third of the run at most 10 % above that of the middle third.
	log "flat sizes: verdict (last half of the samples within +-20 % of their median; last third / middle third <= 1.10)"
	awk -F'\t' '
		function sort(a, n,   i, j, t) { for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t } }
		{ n++; for (c = 2; c <= 8; c++) v[c, n] = $c }
		END {
			split("2 3 4 5 6 7 8", cols, " ")
			name[2] = "messages (rows)"; name[3] = "tide_outbox_messages (bytes)"; name[4] = "relay_attempts (rows)"
			name[5] = "relay_attempts (bytes)"; name[6] = "relay_consumer_offsets (bytes)"
			name[7] = "tide_consumer_offsets (bytes)"; name[8] = "tide_consumer_leases (bytes)"
			h = int(n / 2); t = int(n / 3)
			for (k = 1; k <= 7; k++) {
				c = cols[k]; m = 0
				for (i = n - h + 1; i <= n; i++) a[++m] = v[c, i]
				lo = 1e30; hi = 0; for (i = 1; i <= m; i++) { if (a[i] < lo) lo = a[i]; if (a[i] > hi) hi = a[i] }
				sort(a, m); med = m % 2 ? a[(m+1)/2] : (a[m/2] + a[m/2+1]) / 2
				s1 = 0; s2 = 0
				for (i = n - 2 * t + 1; i <= n - t; i++) s1 += v[c, i]
				for (i = n - t + 1; i <= n; i++) s2 += v[c, i]
				tr = s1 > 0 ? s2 / s1 : 1
				ok = (lo >= 0.8 * med && hi <= 1.2 * med && tr <= 1.10)
				printf "%-32s median %12.0f  [%.2f to %.2f of it]  last/middle third %.3f  %s\n", name[c], med, med ? lo / med : 1, med ? hi / med : 1, tr, ok ? "flat" : "NOT FLAT"
			}
		}' "$SAMPLES"

	log "autovacuum at the end"
	psql_db -c "SELECT relname, n_live_tup, n_dead_tup, last_autovacuum, autovacuum_count, last_autoanalyze, autoanalyze_count, now() AS now
	  FROM pg_stat_user_tables
	 WHERE relid IN ('tide.tide_outbox_messages'::regclass, 'tide.relay_attempts'::regclass,
	                 'tide.relay_consumer_offsets'::regclass, 'tide.tide_consumer_offsets'::regclass,
	                 'tide.tide_consumer_leases'::regclass)
	 ORDER BY relname"
	psql_db -c "SELECT pipeline, delivered_upto, newest_id, lag_messages FROM tide.relay_pipeline_lag" \
		-c "SELECT count(*) AS dead_letters FROM tide.relay_dlq" \
		-c "SELECT status, count(*) FROM tide.relay_attempts GROUP BY status"
	cp "$SAMPLES" "$TIDE_CLUSTER/samples_$(date +%Y%m%d_%H%M%S).tsv"
}

for part in $PARTS; do
	case $part in
	throughput) part_throughput ;;
	flat) part_flat ;;
	*) echo "operations.sh: unknown part $part (throughput, flat)" >&2; exit 1 ;;
	esac
done
