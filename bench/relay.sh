#!/usr/bin/env bash
# Relay delivery: how many messages per second the relay worker POSTs to the
# test webhook receiver (test/receiver.c), in mode single (one message per
# request, with and without a signing secret) and in mode batch (a JSON array
# of batch_size messages per request), beside what the receiver itself takes
# from wrk with requests of the same size and headers, and what a client of
# libcurl alone achieves (curl_client.c); the catch-up rate with a large
# backlog; the worker's memory; and the end-to-end latency from publishing to
# receipt at steady rates, also while a publishing transaction stays open.
# See bench/README.md.
#
# Throughput: N messages are published while the pipeline is disabled, then
# one transaction enables it (and wakes the worker); the rate is N divided by
# the time from that commit to the recording of the last message
# (tide.relay_consumer_offsets.updated_at). Latency: pgbench publishes one
# message per transaction at RATE/s for DURATION seconds from one client; the
# receiver logs every request with its time of receipt; each message's
# latency is its receipt time minus the time its publishing transaction's
# commit returned to pgbench (pgbench's per-transaction log).
#
# Run as root. pg_tide must already be built and installed (run
# test/demo.sh or test/run-tests.sh first); this script builds only
# test/receiver. It starts its own throwaway cluster in
# /tmp/pg_tide_bench_relay on port 5497 and stops it at the end
# (KEEP_CLUSTER=1 leaves it running), and the receiver on a free port of
# 127.0.0.1.
#
# Settings from the environment:
#   DURATION   seconds per wrk run and per latency run (default 10)
#   REPEATS    rounds (default 3); each figure is the median of the rounds
#   N_SINGLE   messages per mode-single run (default 50000)
#   N_BATCH    messages per mode-batch run (default 300000)
#   RATES      messages/s of the latency runs (default "200 2000")
#   OPEN_TX_SECONDS  how long a publishing transaction stays open during
#              the last latency run, at the first of RATES (default 60;
#              0 skips that run)
#   CATCHUP_SIZES  backlogs the batch pipeline catches up with (default
#              "100000 1000000")
#   SINGLE_BATCH_SIZE, MAX_IN_FLIGHT  mode single's batch_size (default 1000)
#              and max_in_flight (default 16); wrk uses MAX_IN_FLIGHT
#              connections, and also 32
#   BATCH_SIZE mode batch's batch_size (default 1000)
#   EXTRA_CONFIG  more keys for every pipeline's config, for example
#              '"overlap_batches": true' (default none)
#   WORKERS_PIPELINES, WORKERS_N, WORKERS_N_SLOW  the runs with several
#              workers per database: pipelines (default 8) and messages
#              per pipeline, to a receiver answering at once (default
#              10000) and after 5 ms (default 2000)
#   ISOLATION  1 (default): also the latency at the first of RATES beside a
#              second pipeline of the same outbox whose destination accepts
#              connections and never answers (timeout_ms 3000); 0 skips it
#   MANY_PIPELINES, FANOUT_N, REST_SECONDS  the runs with many pipelines:
#              how many (default 1000), the messages fanned out to all of
#              them (default 100) and the seconds the worker's CPU at rest
#              is measured over (default 60: a whole minute holds the
#              worker's once-a-minute sweep and attempt-log trim exactly once,
#              where a shorter window holds them or not by chance)
#   FANOUT     1 (default): the runs with many pipelines also fan messages
#              out to them; 0 measures the worker's CPU at rest alone
#   FANOUT_SETTLE_SECONDS  how long after the fan-out the worker's private
#              memory is measured again (default 5), to be compared with
#              its size at rest before it
#   PARTS      "all" (default); "workers" for the runs with several workers
#              alone; "many" for the runs with many pipelines alone;
#              "ordering" for mode single with ordering relaxed and "key"
#              alone; "single" for mode single beside libcurl alone
#              (curl_client.c) alone; "latency" for the latency runs at
#              RATES alone; "core" for everything but the runs
#              with several workers and with many pipelines (what an
#              earlier version's relay.sh measures too, for a comparison
#              in one sitting)
#   TIDE_CLUSTER, TIDE_PORT, PG_CONFIG  another cluster directory, port or
#              PostgreSQL (default /tmp/pg_tide_bench_relay, 5497, Debian's;
#              see test/lib.sh)
# With the defaults it runs for about 17 minutes.
#
# Several workers per database: WORKERS_PIPELINES pipelines (mode single,
# each of its own outbox) with WORKERS_N messages each wait while disabled;
# one commit enables them all; the rate is all their messages divided by the
# time from that commit to the last one's record, once with
# pg_tide.relay_workers_per_database = 1 and once with 2, round by round.
#
# Ordering per key: the mode-single run again with "ordering": "key" and
# "ordering_key": "/agg", its N_SINGLE messages spread over 100 keys (the
# payload has one more member, "agg": "k<i % 100>", about 12 bytes), beside
# the relaxed run of the same round.
#
# Many pipelines: MANY_PIPELINES file pipelines of one outbox, idle, with
# pg_tide.relay_naptime_ms = 1000: the worker's CPU (utime + stime of
# /proc/<pid>/stat) over REST_SECONDS. Then MANY_PIPELINES webhook
# pipelines of one outbox (mode single, max_in_flight 1) with FANOUT_N
# messages waiting while disabled; one commit enables them all; the rate
# is the requests answered divided by the time from that commit to the
# last pipeline's record, beside one pipeline delivering
# MANY_PIPELINES x FANOUT_N messages in the same round. The worker's private
# memory is taken before the fan-out, right after it and
# FANOUT_SETTLE_SECONDS later: what it keeps of the burst (target: at most
# twice its size at rest).
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIDE_CLUSTER=${TIDE_CLUSTER:-/tmp/pg_tide_bench_relay}
export TIDE_PORT=${TIDE_PORT:-5497}
BENCH_NAME=relay.sh
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"

# lib.sh switches the relay off; here it is what is measured. The naptime
# starts short, so that the worker soon sees the wake-up pipeline below, and
# is then set to 60 s: every run wakes the worker with a commit, and the
# latency run shows wake-on-commit, not polling.
export TIDE_EXTRA_CONF=$RELAY_BENCH_CONF

# The NOTICEs of relay_delete and outbox_drop are expected.
export PGOPTIONS="-c client_min_messages=warning"

DURATION=${DURATION:-10}
REPEATS=${REPEATS:-3}
N_SINGLE=${N_SINGLE:-50000}
N_BATCH=${N_BATCH:-300000}
RATES=${RATES:-200 2000}
OPEN_TX_SECONDS=${OPEN_TX_SECONDS:-60}
CATCHUP_SIZES=${CATCHUP_SIZES:-100000 1000000}
SINGLE_BATCH_SIZE=${SINGLE_BATCH_SIZE:-1000}
WORKERS_PIPELINES=${WORKERS_PIPELINES:-8}
WORKERS_N=${WORKERS_N:-10000}
WORKERS_N_SLOW=${WORKERS_N_SLOW:-2000}
PARTS=${PARTS:-all}
MANY_PIPELINES=${MANY_PIPELINES:-1000}
FANOUT_N=${FANOUT_N:-100}
FANOUT_SETTLE_SECONDS=${FANOUT_SETTLE_SECONDS:-5}
FANOUT=${FANOUT:-1}
REST_SECONDS=${REST_SECONDS:-60}
MAX_IN_FLIGHT=${MAX_IN_FLIGHT:-16}
BATCH_SIZE=${BATCH_SIZE:-1000}
ISOLATION=${ISOLATION:-1}
SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw

# wrk, curl and jq come from Debian's packages; libmicrohttpd for the receiver.
bench_need_receiver wrk curl jq

RECEIVER_PIDS=()
cleanup() {
	local p
	for p in "${RECEIVER_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	bench_cleanup
}
trap cleanup EXIT

# start_receiver <logfile or ->: starts a receiver on a free port of
# 127.0.0.1 (from a random point of 20000-29999 on) and prints the port;
# RECEIVER_PID is its pid.
start_receiver() {
	local p pid
	for p in $(seq $((20000 + RANDOM % 9000)) 29999); do
		ss -Hltn "sport = :$p" | grep -q . && continue
		"$RECEIVER_BIN" "$p" "$1" 2>/dev/null &
		pid=$!
		for _ in $(seq 1 100); do
			kill -0 "$pid" 2>/dev/null || break
			if curl -sf "http://127.0.0.1:$p/__health" >/dev/null; then
				RECEIVER_PIDS+=("$pid")
				RECEIVER_PID=$pid
				RECEIVER_PORT=$p
				return
			fi
			sleep 0.05
		done
		kill "$pid" 2>/dev/null || true
	done
	echo "relay.sh: could not start the receiver" >&2
	exit 1
}

control() { curl -sf -X POST --data "$2" "http://127.0.0.1:$1/__control" >/dev/null; }
stats() { curl -sf "http://127.0.0.1:$1/__stats"; }

tide_start_cluster
"$PG_BIN/createdb" "$DB"
# Two receivers: one for the latency run and the sample request, which logs
# every request, and one for the throughput runs, which logs nothing.
: >"$TIDE_CLUSTER/receiver.jsonl"
start_receiver "$TIDE_CLUSTER/receiver.jsonl"
LOG_PORT=$RECEIVER_PORT
start_receiver -
PORT=$RECEIVER_PORT

log "creating pg_tide and the wake-up pipeline"
# The worker wakes on publishing commits only while the database has an
# enabled pipeline; 'wake' (a file pipeline of its own outbox) keeps one
# enabled between the throughput runs, so that the commit that enables a
# measured pipeline also wakes the worker (it publishes one message to
# 'wake'), instead of the worker finding it after its 60 s naptime.
psql_db >/dev/null <<SQL
CREATE EXTENSION pg_tide;
SELECT tide.outbox_create('wake', p_inline_threshold => 2000000000);
SELECT tide.relay_set_outbox('wake', 'wake', 'wake',
	'{"sink_type": "file", "path": "$TIDE_CLUSTER/wake.jsonl", "fsync": false}');
SQL
psql_db -f "$BENCH_DIR/payload.sql" >/dev/null

# Once the worker has seen the wake-up pipeline it sleeps until commits wake
# it; from then on the naptime is 60 s.
passes() { psql_db -A -t -c "SELECT coalesce(max(passes), 0) FROM tide.relay_workers() WHERE database = '$DB'"; }
p0=$(passes)
for _ in $(seq 1 100); do
	[ "$(passes)" -gt $((p0 + 1)) ] && break
	sleep 0.1
done
psql_db -c "ALTER SYSTEM SET pg_tide.relay_naptime_ms = 60000" -c "SELECT pg_reload_conf()" >/dev/null
sleep 0.5
psql_db -A -t -c "SELECT version()" \
	-c "SELECT 'pg_tide ' || extversion FROM pg_extension WHERE extname = 'pg_tide'"

# pipeline_config <mode> <batch_size> <max_in_flight> <port> [signed|key]
pipeline_config() {
	local sig=""
	[ "${5:-}" = signed ] && sig=", \"signing_secret\": \"$SECRET\""
	[ "${5:-}" = key ] && sig=', "ordering": "key", "ordering_key": "/agg"'
	printf '{"sink_type": "webhook", "url": "http://127.0.0.1:%s/hook", "allow_http": true, "allow_private_network": true, "mode": "%s", "batch_size": %s, "max_in_flight": %s%s%s}' \
		"$4" "$1" "$2" "$3" "$sig" "${EXTRA_CONFIG:+, $EXTRA_CONFIG}"
}

# Creates outbox and pipeline <name> (disabled) and publishes <n> messages
# into it, 10000 per call (with [keyed], each payload has "agg": one of 100
# keys). Then vacuums and checkpoints, so that each run starts from the same
# state.
prepare_pipeline() {
	local name=$1 config=$2 n=$3 payload="bench.payload(i)"
	[ "${4:-}" = keyed ] && payload="bench.payload(i) || jsonb_build_object('agg', 'k' || i % 100)"
	psql_db <<SQL
SELECT tide.outbox_create('$name', p_inline_threshold => 2000000000);
BEGIN;
SELECT tide.relay_set_outbox('$name', '$name', '$name', '$config');
SELECT tide.relay_disable('$name');
COMMIT;
DO \$\$
BEGIN
	FOR c IN 0 .. ($n - 1) / 10000 LOOP
		PERFORM tide.outbox_publish_batch('$name',
			(SELECT array_agg($payload ORDER BY i)
			   FROM generate_series(c * 10000::bigint, least(c * 10000 + 9999, $n - 1)) i),
			bench.headers(c));
		COMMIT;
	END LOOP;
END
\$\$;
VACUUM ANALYZE tide.tide_outbox_messages;
CHECKPOINT;
SQL
}

# Deletes pipeline and outbox <name> and their messages.
drop_pipeline() {
	psql_db -c "SELECT tide.relay_delete(name) FROM tide.relay_outbox_config WHERE name = '$1'" \
		-c "SELECT tide.outbox_drop('$1', p_if_exists => true)" >/dev/null
}

# Private (anonymous) memory of a process in kB: what a leak would grow.
proc_rss_kb() {
	awk '$1 == "RssAnon:" { print $2 }' "/proc/$1/status"
}

# CPU seconds so far of a process (utime + stime).
proc_cpu() {
	awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); print ($12 + $13) / hz }' "/proc/$1/stat"
}
# Seconds a process has run on a CPU and has waited for one (runnable but
# not running): the second is how much the machine's other load held it back.
proc_sched() {
	awk '{ print $1 / 1e9, $2 / 1e9 }' "/proc/$1/schedstat"
}
# Busy CPU seconds of the whole machine.
machine_cpu() {
	awk -v hz="$(getconf CLK_TCK)" '$1 == "cpu" { print ($2 + $3 + $4 + $7 + $8) / hz }' /proc/stat
}

# throughput <case> <mode> <n> <config> <round>: enables the prepared
# pipeline, waits until its offset reaches the last message, and appends
# "case round n seconds msg/s worker_cores receiver_cores machine_cores".
throughput() {
	local case=$1 mode=$2 n=$3 config=$4 round=$5 name last per_req start end secs wpid
	local w0 r0 m0 w1 r1 m1 t0 t1 q0 q1 rss_sampler
	name=${case}_$round
	drop_pipeline "$name"
	prepare_pipeline "$name" "$config" "$n" $([ "$case" = single_key ] && echo keyed) >/dev/null
	last=$(psql_db -A -t -c "SELECT max(id) FROM tide.tide_outbox_messages WHERE outbox_name = '$name'")
	if [ "$mode" = batch ]; then per_req=$BATCH_SIZE; else per_req=1; fi
	control "$PORT" '{"reset": true}'
	[ "$case" = single_signed ] && control "$PORT" "{\"secrets\": [\"$SECRET\"]}"
	wpid=$(psql_db -A -t -c "SELECT pid FROM tide.relay_workers() WHERE database = '$DB'")
	# The worker's private memory, sampled every 0.1 s during the run.
	(while proc_rss_kb "$wpid"; do sleep 0.1; done) >"$TIDE_CLUSTER/rss_$name.txt" 2>/dev/null &
	rss_sampler=$!
	read -r w0 q0 < <(proc_sched "$wpid"); r0=$(proc_cpu "$RECEIVER_PID"); m0=$(machine_cpu); t0=$(date +%s.%N)
	# One transaction enables the pipeline and wakes the worker; its
	# clock_timestamp() is taken just before the commit.
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
	read -r w1 q1 < <(proc_sched "$wpid"); r1=$(proc_cpu "$RECEIVER_PID"); m1=$(machine_cpu); t1=$(date +%s.%N)
	kill "$rss_sampler" 2>/dev/null || true
	wait "$rss_sampler" 2>/dev/null || true
	local st
	st=$(stats "$PORT")
	if [ "$(echo "$st" | jq .requests)" -lt $((n / per_req)) ]; then
		echo "relay.sh: $name: recorded, but the receiver counted fewer than $((n / per_req)) requests: $st" >&2
		exit 1
	fi
	if [ "$case" = single_signed ] && [ "$(echo "$st" | jq .sig_ok)" -lt "$n" ]; then
		echo "relay.sh: $name: signatures did not verify: $st" >&2
		exit 1
	fi
	if [ "$(echo "$st" | jq '.requests - (.status["200"] // 0)')" -ne 0 ]; then
		echo "relay.sh: $name: the receiver answered other than 200: $st" >&2
		exit 1
	fi
	secs=$(awk "BEGIN { print $end - $start }")
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$case" "$round" "$n" "$secs" \
		"$(awk "BEGIN { print $n / $secs }")" \
		"$(awk "BEGIN { d = $t1 - $t0; print ($w1 - $w0) / d, ($r1 - $r0) / d, ($m1 - $m0) / d }" | tr ' ' '\t')" \
		"$(echo "$st" | jq .requests)	$(awk "BEGIN { print ($q1 - $q0) / ($t1 - $t0) }")" >>"$RESULTS"
	bench_record relay "$case" "$round" "$(awk "BEGIN { print $n / $secs }")"
	bench_record worker_memory_kb "under load, $case" "$round" "$(sort -n "$TIDE_CLUSTER/rss_$name.txt" | tail -n 1)"
	printf '  %-14s round %s  %7d messages in %6.3f s  %8.0f msg/s  (%s requests)\n' "$case" "$round" "$n" "$secs" \
		"$(awk "BEGIN { print $n / $secs }")" "$(echo "$st" | jq .requests)"
	[ "$case" = single_signed ] && control "$PORT" '{"secrets": null}'
	drop_pipeline "$name"
}

# wrk_run <connections> <round>: the receiver's own rate with requests like
# the relay's (wrk.lua, written from a real request below).
wrk_run() {
	local c=$1 round=$2 out rps r0 m0 r1 m1 t0 t1
	out=$TIDE_CLUSTER/wrk_c${c}_$round.log
	control "$PORT" '{"reset": true}'
	r0=$(proc_cpu "$RECEIVER_PID"); m0=$(machine_cpu); t0=$(date +%s.%N)
	wrk -t2 -c"$c" -d"${DURATION}s" -s "$TIDE_CLUSTER/wrk.lua" "http://127.0.0.1:$PORT/hook" >"$out" 2>&1
	r1=$(proc_cpu "$RECEIVER_PID"); m1=$(machine_cpu); t1=$(date +%s.%N)
	rps=$(sed -n 's/^Requests\/sec: *\([0-9.]*\)$/\1/p' "$out")
	if [ -z "$rps" ] || grep -q "Non-2xx\|Socket errors" "$out"; then
		cat "$out"
		echo "relay.sh: wrk -c$c failed" >&2
		exit 1
	fi
	printf 'wrk_c%s\t%s\t\t\t%s\t\t%s\t%s\t%s\n' "$c" "$round" "$rps" \
		"$(awk "BEGIN { d = $t1 - $t0; print ($r1 - $r0) / d }")" \
		"$(awk "BEGIN { d = $t1 - $t0; print ($m1 - $m0) / d }")" "$(stats "$PORT" | jq .requests)" >>"$RESULTS"
	bench_record receiver_wrk "c$c" "$round" "$rps"
	printf '  %-14s round %s  %8.0f requests/s\n' "wrk -c$c" "$round" "$rps"
}

# curl_run <round>: what libcurl alone does with the same requests and
# MAX_IN_FLIGHT in flight (curl_client.c): the ceiling of any client built
# on it, the relay's webhook sink included. Twice: driven by
# curl_multi_perform and curl_multi_poll (libcurl_alone c16, the target's
# baseline), and driven by its socket and timer callbacks as the worker
# drives it (libcurl_alone c16_sockets, for the comparison).
curl_run() {
	local round=$1 out rps mode
	for mode in perform sockets; do
		out=$TIDE_CLUSTER/curl_client_${mode}_$round.log
		control "$PORT" '{"reset": true}'
		"$TIDE_CLUSTER/curl_client" "http://127.0.0.1:$PORT/hook" "$N_SINGLE" "$MAX_IN_FLIGHT" \
			"$TIDE_CLUSTER/sample_body.json" "$TIDE_CLUSTER/sample_headers.txt" \
			$([ "$mode" = sockets ] && echo sockets) >"$out" 2>&1 ||
			{ cat "$out"; echo "relay.sh: curl_client failed" >&2; exit 1; }
		rps=$(sed -n 's/.* \([0-9]*\) requests\/s.*/\1/p' "$out")
		if [ "$mode" = sockets ]; then
			bench_record libcurl_alone "c${MAX_IN_FLIGHT}_sockets" "$round" "$rps"
			printf '  %-14s round %s  %8.0f requests/s\n' "libcurl, sockets" "$round" "$rps"
		else
			bench_record libcurl_alone "c$MAX_IN_FLIGHT" "$round" "$rps"
			printf '  %-14s round %s  %8.0f requests/s\n' "libcurl alone" "$round" "$rps"
		fi
	done
}

# hang_listener: a socket on a free port of 127.0.0.1 that accepts
# connections (the kernel completes them) and never reads nor answers;
# prints the port, HANG_PID is its process.
hang_listener() {
	local p
	for p in $(seq $((30000 + RANDOM % 9000)) 39999); do
		ss -Hltn "sport = :$p" | grep -q . && continue
		python3 -c "import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', $p)); s.listen(1024); time.sleep(1e9)" &
		HANG_PID=$!
		RECEIVER_PIDS+=("$HANG_PID")
		for _ in $(seq 1 100); do
			ss -Hltn "sport = :$p" | grep -q . && { HANG_PORT=$p; return; }
			sleep 0.05
		done
		kill "$HANG_PID" 2>/dev/null || true
	done
	echo "relay.sh: could not start the hanging listener" >&2
	exit 1
}

# latency <round> <rate> [<open seconds>] [beside_hang]: pgbench publishes at <rate>/s
# from one client into outbox lat_<rate>_<round>, whose pipeline (mode
# single, the settings above) delivers to the logging receiver, for DURATION
# s; with <open seconds>, another session publishes one message at the start
# and keeps its transaction open that long (the run then lasts 10 s more);
# with beside_hang, a second pipeline of the same outbox delivers to a
# destination that never answers (timeout_ms 3000) during the run.
# Appends "latency_<rate> (or latency_open_tx) round messages missing p50
# p95 p99 max p50_from_start(ms) delivered_twice transactions mispaired".
latency() {
	local round=$1 rate=$2 open=${3:-0} beside=${4:-} name xacts got pglog figure=latency_$2 secs=$DURATION opener="" clients
	name=lat_${rate}_$round
	if [ "$open" -gt 0 ]; then
		figure=latency_open_tx; name=latopen_$round; secs=$((open + 10))
	fi
	if [ "$beside" = beside_hang ]; then
		figure=latency_beside_hang; name=lathang_$round
	fi
	drop_pipeline "$name"
	psql_db -c "SELECT tide.outbox_create('$name', p_inline_threshold => 2000000000)" \
		-c "SELECT tide.relay_set_outbox('$name', '$name', '$name', '$(pipeline_config single "$SINGLE_BATCH_SIZE" "$MAX_IN_FLIGHT" "$LOG_PORT")')" \
		-c "SELECT tide.relay_disable('wake')" \
		-c "VACUUM ANALYZE tide.tide_outbox_messages" -c "CHECKPOINT" >/dev/null
	if [ "$beside" = beside_hang ]; then
		hang_listener
		psql_db -c "SELECT tide.relay_set_outbox('${name}_hang', '$name', '${name}_hang', '{\"sink_type\": \"webhook\", \"url\": \"http://127.0.0.1:$HANG_PORT/hook\", \"allow_http\": true, \"allow_private_network\": true, \"timeout_ms\": 3000}')" >/dev/null
	fi
	# The worker sees the new pipeline (and that 'wake' is off) at the pass
	# this commit wakes.
	psql_db -c "SELECT tide.outbox_publish('$name', '{\"warm-up\": true}')" >/dev/null
	sleep 1
	: >"$TIDE_CLUSTER/receiver.jsonl"
	# The payload of tide_single.sql, with the pgbench client that published it.
	sed -e "s/'bench'/'$name'/" -e "s/'event', 'order.created',/'event', 'order.created', 'client', :client_id::int,/" \
		"$BENCH_DIR/tide_single.sql" >"$TIDE_CLUSTER/latency.sql"
	# One client commits about 1,600 times a second here (each commit waits
	# for its WAL flush): a client per 500 messages/s.
	clients=$(( (rate + 499) / 500 ))
	rm -f "$TIDE_CLUSTER"/pgbench_"$name".*
	if [ "$open" -gt 0 ]; then
		psql_db -c "BEGIN" -c "SELECT tide.outbox_publish('$name', '{\"open\": true}')" \
			-c "SELECT pg_sleep($open)" -c "COMMIT" >/dev/null &
		opener=$!
	fi
	(cd "$TIDE_CLUSTER" && "$PGBENCH" -n -M prepared -c "$clients" -j "$(( clients < 2 ? clients : 2 ))" -R "$rate" -T "$secs" \
		-l --log-prefix="pgbench_$name" -f "$TIDE_CLUSTER/latency.sql" "$DB" \
		>"$TIDE_CLUSTER/pgbench_$name.out" 2>&1) ||
		{ cat "$TIDE_CLUSTER/pgbench_$name.out"; exit 1; }
	[ -n "$opener" ] && wait "$opener"
	xacts=$(sed -n 's/^number of transactions actually processed: \([0-9]*\)$/\1/p' \
		"$TIDE_CLUSTER/pgbench_$name.out")
	# pgbench writes a log per thread.
	pglog=$TIDE_CLUSTER/pgbench_$name.log
	cat "$TIDE_CLUSTER"/pgbench_"$name".[0-9]* >"$pglog"
	# Waits (at most 10 s) for the last deliveries.
	for _ in $(seq 1 200); do
		got=$(wc -l <"$TIDE_CLUSTER/receiver.jsonl")
		[ "$got" -ge "$xacts" ] && break
		sleep 0.05
	done
	sleep 0.5
	cp "$TIDE_CLUSTER/receiver.jsonl" "$TIDE_CLUSTER/receiver_$name.jsonl"
	chmod a+r "$TIDE_CLUSTER/receiver_$name.jsonl" "$pglog"
	# A client's transactions run one after another, so its k-th transaction
	# in pgbench's log published its k-th message by id (the payload names
	# the client). pgbench logs each transaction's end (after the
	# commit returned) as time_epoch, time_us; the receiver each request's
	# arrival as t; the body's created_at is the publishing transaction's
	# start.
	psql_db -A -t -F $'\t' <<SQL >>"$RESULTS"
CREATE TEMP TABLE rcv (line text);
CREATE TEMP TABLE pgb (line text);
COPY rcv FROM '$TIDE_CLUSTER/receiver_$name.jsonl' WITH (FORMAT csv, QUOTE e'\x01', DELIMITER e'\x02');
COPY pgb FROM '$pglog' WITH (FORMAT csv, QUOTE e'\x01', DELIMITER e'\x02');
CREATE TEMP VIEW got AS
	SELECT (b->>'message_id')::bigint AS id, t, (b->>'created_at')::timestamptz AS created_at
	  FROM (SELECT (line::jsonb->>'body')::jsonb AS b, (line::jsonb->>'t')::float8 AS t FROM rcv) r;
CREATE TEMP VIEW published AS
	-- (pgbench numbers its transactions from 1)
	SELECT (payload->>'client')::int AS client,
		   row_number() OVER (PARTITION BY payload->>'client' ORDER BY id) AS k, id
	  FROM tide.tide_outbox_messages WHERE outbox_name = '$name' AND payload ? 'order_id';
CREATE TEMP VIEW committed AS
	SELECT f[1]::int AS client, f[2]::bigint AS k, f[5]::float8 + f[6]::float8 / 1e6 AS done
	  FROM (SELECT string_to_array(line, ' ') AS f FROM pgb) p;
CREATE TEMP VIEW lat AS
	SELECT p.id, (g.t - c.done) * 1000 AS ms,
		   (g.t - extract(epoch FROM g.created_at)) * 1000 AS ms_from_start,
		   c.done < extract(epoch FROM g.created_at) AS mismatched
	  FROM published p JOIN committed c USING (client, k)
	  JOIN (SELECT id, min(t) AS t, min(created_at) AS created_at FROM got GROUP BY id) g USING (id);
SELECT '$figure', $round, (SELECT count(*) FROM published),
	   (SELECT count(*) FROM published p WHERE NOT EXISTS (SELECT FROM got g WHERE g.id = p.id)),
	   round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 3),
	   round(percentile_cont(0.95) WITHIN GROUP (ORDER BY ms)::numeric, 3),
	   round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 3),
	   round(max(ms)::numeric, 3),
	   round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms_from_start)::numeric, 3),
	   (SELECT count(*) FROM got) - (SELECT count(DISTINCT id) FROM got),
	   (SELECT count(*) FROM committed),
	   count(*) FILTER (WHERE mismatched),
	   count(*)
  FROM lat;
SQL
	tail -n 1 "$RESULTS" | awk -F'\t' '{ printf "  %-15s round %s  %d messages, %d missing, %d twice: p50 %.2f  p95 %.2f  p99 %.2f  max %.2f ms (p50 from transaction start %.2f ms)\n", $1, $2, $3, $4, $10, $5, $6, $7, $8, $9 }'
	local f
	for f in 5:p50 6:p95 7:p99 8:max; do
		bench_record "$figure" "${f#*:}" "$round" "$(tail -n 1 "$RESULTS" | cut -f "${f%%:*}")"
	done
	# The rate pgbench reached (it may fall short of the one asked for).
	bench_record "$figure" "msg/s published" "$round" "$(awk "BEGIN { print $xacts / $secs }")"
	# Every message arrived and was paired with its transaction; one message
	# per pgbench transaction; and no transaction ended before its message
	# was created (which would mean that they were paired wrongly).
	if [ "$(tail -n 1 "$RESULTS" | cut -f 4)" -ne 0 ] || [ "$(tail -n 1 "$RESULTS" | cut -f 3)" -ne "$xacts" ] ||
		[ "$(tail -n 1 "$RESULTS" | cut -f 12)" -ne 0 ] ||
		[ "$(tail -n 1 "$RESULTS" | cut -f 13)" -ne "$xacts" ]; then
		echo "relay.sh: $name: messages missing, not one per pgbench transaction, or paired wrongly: $(tail -n 1 "$RESULTS")" >&2
		exit 1
	fi
	psql_db -c "SELECT tide.relay_enable('wake')" >/dev/null
	if [ "$beside" = beside_hang ]; then
		psql_db -c "SELECT tide.relay_delete('${name}_hang')" >/dev/null
		kill "$HANG_PID" 2>/dev/null || true
	fi
	drop_pipeline "$name"
}

# set_workers <n>: pg_tide.relay_workers_per_database = n, reloaded; waits
# until the database has that many workers, every enabled pipeline served
# (whatever earlier runs left enabled, the wake-up pipeline at least).
set_workers() {
	psql_db -c "ALTER SYSTEM SET pg_tide.relay_workers_per_database = $1" -c "SELECT pg_reload_conf()" >/dev/null
	for _ in $(seq 1 600); do
		[ "$(psql_db -A -t -c "SELECT count(*) = $1 AND sum(pipelines) = (SELECT count(*) FROM tide.relay_outbox_config WHERE enabled)
			FROM tide.relay_workers() WHERE database = '$DB'")" = t ] && return
		sleep 0.1
	done
	echo "relay.sh: $1 workers per database did not start, or do not serve every enabled pipeline:" >&2
	psql_db -c "SELECT * FROM tide.relay_workers() WHERE database = '$DB'" \
		-c "SELECT name, enabled FROM tide.relay_outbox_config ORDER BY name" >&2
	exit 1
}

# enable_and_wake <LIKE pattern>: one transaction enables the pipelines
# whose names match and wakes the worker; prints its clock_timestamp(),
# taken just before the commit.
enable_and_wake() {
	psql_db -A -t <<SQL | tail -n 1
BEGIN;
SELECT tide.relay_enable(name) FROM tide.relay_outbox_config WHERE name LIKE '$1';
SELECT tide.outbox_publish('wake', '{}');
SELECT extract(epoch FROM clock_timestamp());
COMMIT;
SQL
}

# workers_throughput <case> <workers> <messages per pipeline> <receiver delay ms> <round>:
# WORKERS_PIPELINES pipelines, enabled by one commit, delivered by
# <workers> workers; appends "case round n seconds msg/s" and records it.
workers_throughput() {
	local case=$1 workers=$2 n=$3 delay=$4 round=$5 i names=() start end secs total spread
	set_workers "$workers"
	for i in $(seq 1 "$WORKERS_PIPELINES"); do
		names+=("workers_$i")
		drop_pipeline "workers_$i"
		prepare_pipeline "workers_$i" "$(pipeline_config single "$SINGLE_BATCH_SIZE" "$MAX_IN_FLIGHT" "$PORT")" "$n" >/dev/null
	done
	total=$((n * WORKERS_PIPELINES))
	control "$PORT" '{"reset": true}'
	control "$PORT" "{\"delay_ms\": $delay}"
	start=$(enable_and_wake 'workers\_%')
	for _ in $(seq 1 6000); do
		[ "$(psql_db -A -t -c "SELECT count(*) = $WORKERS_PIPELINES FROM tide.relay_consumer_offsets o
			WHERE o.pipeline_id LIKE 'workers\_%' AND o.last_change_id >= (SELECT max(id) FROM tide.tide_outbox_messages m
				WHERE m.outbox_name = o.pipeline_id)")" = t ] && break
		sleep 0.05
	done
	end=$(psql_db -A -t -c "SELECT extract(epoch FROM max(updated_at)) FROM tide.relay_consumer_offsets WHERE pipeline_id LIKE 'workers\_%'")
	spread=$(psql_db -A -t -c "SELECT string_agg(pipelines::text, '+' ORDER BY worker_index) FROM tide.relay_workers() WHERE database = '$DB'")
	if [ "$(stats "$PORT" | jq '.requests - (.status["200"] // 0)')" -ne 0 ] || [ "$(stats "$PORT" | jq .requests)" -lt "$total" ]; then
		echo "relay.sh: $case with $workers workers: not every message delivered with a 200: $(stats "$PORT")" >&2
		exit 1
	fi
	secs=$(awk "BEGIN { print $end - $start }")
	printf '%s\t%s\t%s\t%s\t%s\n' "workers_${case}_w$workers" "$round" "$total" "$secs" "$(awk "BEGIN { print $total / $secs }")" >>"$RESULTS"
	bench_record relay_workers "$case, $workers per database" "$round" "$(awk "BEGIN { print $total / $secs }")"
	printf '  %-22s round %s  %7d messages in %6.3f s  %8.0f msg/s  (pipelines per worker %s)\n' \
		"$case, $workers workers" "$round" "$total" "$secs" "$(awk "BEGIN { print $total / $secs }")" "$spread"
	control "$PORT" '{"delay_ms": 0}'
	for i in "${names[@]}"; do drop_pipeline "$i"; done
}

# workers_rounds: the runs with 1 and 2 workers per database, each round
# both, alternating which goes first.
workers_rounds() {
	local round first second
	log "$REPEATS rounds: $WORKERS_PIPELINES pipelines of $WORKERS_N messages (receiver at once) and of $WORKERS_N_SLOW (receiver after 5 ms), 1 and 2 workers per database"
	for round in $(seq 1 "$REPEATS"); do
		if [ $((round % 2)) = 1 ]; then first=1; second=2; else first=2; second=1; fi
		workers_throughput fast "$first" "$WORKERS_N" 0 "$round"
		workers_throughput fast "$second" "$WORKERS_N" 0 "$round"
		workers_throughput slow_5ms "$first" "$WORKERS_N_SLOW" 5 "$round"
		workers_throughput slow_5ms "$second" "$WORKERS_N_SLOW" 5 "$round"
	done
	set_workers 1
}

# set_naptime <ms>: pg_tide.relay_naptime_ms, reloaded.
set_naptime() {
	psql_db -c "ALTER SYSTEM SET pg_tide.relay_naptime_ms = $1" -c "SELECT pg_reload_conf()" >/dev/null
}

# wait_pipelines <n>: waits until the worker serves n pipelines.
wait_pipelines() {
	for _ in $(seq 1 600); do
		[ "$(psql_db -A -t -c "SELECT coalesce(sum(pipelines), 0) = $1 FROM tide.relay_workers() WHERE database = '$DB'")" = t ] && return
		sleep 0.1
	done
	echo "relay.sh: the worker did not come to serve $1 pipelines" >&2
	exit 1
}

# drop_many <prefix>: deletes the pipelines named <prefix>_<i> and their outbox <prefix>.
drop_many() {
	psql_db -c "SELECT tide.relay_delete(name) FROM tide.relay_outbox_config WHERE name LIKE '$1\_%'" \
		-c "SELECT tide.outbox_drop('$1', p_if_exists => true)" >/dev/null
}

# rest_cpu <round>: MANY_PIPELINES idle file pipelines of one outbox,
# naptime 1 s; records the worker's CPU (cores) over REST_SECONDS.
rest_cpu() {
	local round=$1 wpid c0 c1 t0 t1 p0 p1 cores
	drop_many rest
	set_naptime 1000
	psql_db >/dev/null <<SQL
SELECT tide.outbox_create('rest', p_inline_threshold => 2000000000);
SELECT tide.relay_set_outbox('rest_' || i, 'rest', 'rest_' || i,
	jsonb_build_object('sink_type', 'file', 'path', '$TIDE_CLUSTER/rest_' || i || '.jsonl', 'fsync', false))
  FROM generate_series(1, $MANY_PIPELINES) i;
SQL
	wait_pipelines $((MANY_PIPELINES + 1))
	# settled: the first readings (validation, opening) are behind it
	sleep 3
	wpid=$(psql_db -A -t -c "SELECT pid FROM tide.relay_workers() WHERE database = '$DB'")
	c0=$(proc_cpu "$wpid"); p0=$(passes); t0=$(date +%s.%N)
	sleep "$REST_SECONDS"
	c1=$(proc_cpu "$wpid"); p1=$(passes); t1=$(date +%s.%N)
	cores=$(awk "BEGIN { print ($c1 - $c0) / ($t1 - $t0) }")
	printf '%s\t%s\t%s\t%s\t%s\t%s\n' "rest_cpu" "$round" "$MANY_PIPELINES" "$(awk "BEGIN { print $t1 - $t0 }")" "$cores" "$((p1 - p0))" >>"$RESULTS"
	bench_record worker_cpu_at_rest "$MANY_PIPELINES pipelines, cores" "$round" "$cores"
	printf '  %-22s round %s  %d idle pipelines, naptime 1 s: worker %.4f cores over %.1f s (%d passes)\n' \
		"at rest" "$round" "$MANY_PIPELINES" "$cores" "$(awk "BEGIN { print $t1 - $t0 }")" $((p1 - p0))
	set_naptime 60000
	drop_many rest
}

# fanout <round>: MANY_PIPELINES webhook pipelines of one outbox with
# FANOUT_N messages waiting, enabled by one commit; rate = requests
# answered / (that commit to the last pipeline's record). Then one pipeline
# delivering as many messages (throughput); records both and their ratio.
fanout() {
	local round=$1 total last start end secs rate one st wpid mem_rest mem_burst mem_settled
	total=$((MANY_PIPELINES * FANOUT_N))
	drop_many fan
	psql_db >/dev/null <<SQL
SELECT tide.outbox_create('fan', p_inline_threshold => 2000000000);
BEGIN;
SELECT tide.relay_set_outbox('fan_' || i, 'fan', 'fan_' || i, '$(pipeline_config single "$FANOUT_N" 1 "$PORT")')
  FROM generate_series(1, $MANY_PIPELINES) i;
SELECT tide.relay_disable('fan_' || i) FROM generate_series(1, $MANY_PIPELINES) i;
COMMIT;
SELECT tide.outbox_publish_batch('fan', (SELECT array_agg(bench.payload(i) ORDER BY i) FROM generate_series(1, $FANOUT_N) i),
	bench.headers(1));
VACUUM ANALYZE tide.tide_outbox_messages;
CHECKPOINT;
SQL
	last=$(psql_db -A -t -c "SELECT max(id) FROM tide.tide_outbox_messages WHERE outbox_name = 'fan'")
	control "$PORT" '{"reset": true}'
	# The worker's private memory before the burst, right after it and
	# FANOUT_SETTLE_SECONDS later: what it keeps of a burst.
	wpid=$(psql_db -A -t -c "SELECT pid FROM tide.relay_workers() WHERE database = '$DB'")
	mem_rest=$(proc_rss_kb "$wpid")
	start=$(enable_and_wake 'fan\_%')
	for _ in $(seq 1 6000); do
		if [ "$(stats "$PORT" | jq .requests)" -ge "$total" ] &&
			[ "$(psql_db -A -t -c "SELECT count(*) = $MANY_PIPELINES FROM tide.relay_consumer_offsets WHERE pipeline_id LIKE 'fan\_%' AND last_change_id >= $last")" = t ]; then
			break
		fi
		sleep 0.1
	done
	st=$(stats "$PORT")
	if [ "$(echo "$st" | jq '.requests - (.status["200"] // 0)')" -ne 0 ] || [ "$(echo "$st" | jq .requests)" -lt "$total" ]; then
		echo "relay.sh: fan-out to $MANY_PIPELINES pipelines: not every message delivered with a 200: $st" >&2
		exit 1
	fi
	mem_burst=$(proc_rss_kb "$wpid")
	end=$(psql_db -A -t -c "SELECT extract(epoch FROM max(updated_at)) FROM tide.relay_consumer_offsets WHERE pipeline_id LIKE 'fan\_%'")
	secs=$(awk "BEGIN { print $end - $start }")
	rate=$(awk "BEGIN { print $(echo "$st" | jq .requests) / $secs }")
	printf '%s\t%s\t%s\t%s\t%s\n' "fanout" "$round" "$(echo "$st" | jq .requests)" "$secs" "$rate" >>"$RESULTS"
	printf '  %-22s round %s  %d requests in %6.3f s  %8.0f req/s\n' "fan-out" "$round" "$(echo "$st" | jq .requests)" "$secs" "$rate"
	sleep "$FANOUT_SETTLE_SECONDS"
	mem_settled=$(proc_rss_kb "$wpid")
	bench_record worker_memory_kb "fan-out, at rest before it" "$round" "$mem_rest"
	bench_record worker_memory_kb "fan-out, right after it" "$round" "$mem_burst"
	bench_record worker_memory_kb "fan-out, ${FANOUT_SETTLE_SECONDS} s after it" "$round" "$mem_settled"
	printf '  %-22s round %s  worker memory %d kB at rest, %d kB right after, %d kB %d s after (%.2f times at rest)\n' \
		"fan-out" "$round" "$mem_rest" "$mem_burst" "$mem_settled" "$FANOUT_SETTLE_SECONDS" \
		"$(awk "BEGIN { print $mem_settled / $mem_rest }")"
	drop_many fan
	wait_pipelines 1
	throughput one_pipeline single "$total" "$SINGLE_CFG" "$round"
	one=$(tail -n 1 "$RESULTS" | cut -f 5)
	bench_record relay_fanout "$MANY_PIPELINES pipelines x $FANOUT_N, req/s" "$round" "$rate"
	bench_record relay_fanout "one pipeline, $total msg/s" "$round" "$one"
	bench_record relay_fanout "ratio (target >= 0.5)" "$round" "$(awk "BEGIN { print $rate / $one }")"
	printf '  %-22s round %s  fan-out / one pipeline %.3f\n' "fan-out" "$round" "$(awk "BEGIN { print $rate / $one }")"
}

# many_rounds: the runs with many pipelines.
many_rounds() {
	local round
	log "$REPEATS rounds: $MANY_PIPELINES idle pipelines for ${REST_SECONDS}s; $FANOUT_N messages to $MANY_PIPELINES webhook pipelines against one pipeline"
	for round in $(seq 1 "$REPEATS"); do
		rest_cpu "$round"
		if [ "$FANOUT" = 1 ]; then
			fanout "$round"
		fi
	done
}

# A real request of the relay, for wrk: one message through a logging run.
log "taking a sample request from the relay"
psql_db -c "SELECT tide.outbox_create('sample', p_inline_threshold => 2000000000)" \
	-c "SELECT tide.relay_set_outbox('sample', 'sample', 'sample', '$(pipeline_config single 100 16 "$LOG_PORT")')" >/dev/null
psql_db -c "SELECT tide.outbox_publish('sample', bench.payload(1), bench.headers(1))" >/dev/null
for _ in $(seq 1 100); do [ -s "$TIDE_CLUSTER/receiver.jsonl" ] && break; sleep 0.05; done
if [ ! -s "$TIDE_CLUSTER/receiver.jsonl" ]; then
	echo "relay.sh: the relay delivered nothing" >&2
	tide_show_server_log
	exit 1
fi
head -n 1 "$TIDE_CLUSTER/receiver.jsonl" >"$TIDE_CLUSTER/sample.json"
drop_pipeline sample
jq -r '"wrk.method = \"POST\"",
	"wrk.body = \(.body | tojson)",
	(.headers | to_entries[] | select(.key != "host" and .key != "content-length")
		| "wrk.headers[\(.key | tojson)] = \(.value | tojson)")' \
	"$TIDE_CLUSTER/sample.json" >"$TIDE_CLUSTER/wrk.lua"
jq -j '.body' "$TIDE_CLUSTER/sample.json" >"$TIDE_CLUSTER/sample_body.json"
jq -r '.headers | to_entries[] | select(.key != "host" and .key != "content-length")
	| "\(.key): \(.value)"' "$TIDE_CLUSTER/sample.json" >"$TIDE_CLUSTER/sample_headers.txt"
gcc -O2 -o "$TIDE_CLUSTER/curl_client" "$BENCH_DIR/curl_client.c" -lcurl
printf 'a request: %s bytes of body, headers %s\n' "$(jq -r '.body | length' "$TIDE_CLUSTER/sample.json")" \
	"$(jq -r '.headers | keys | join(", ")' "$TIDE_CLUSTER/sample.json")"

: >"$RESULTS"
SINGLE_CFG=$(pipeline_config single "$SINGLE_BATCH_SIZE" "$MAX_IN_FLIGHT" "$PORT")
if [ "$PARTS" = workers ]; then
	workers_rounds
	bench_summary
	exit 0
fi
if [ "$PARTS" = many ]; then
	many_rounds
	bench_summary
	exit 0
fi
SIGNED_CFG=$(pipeline_config single "$SINGLE_BATCH_SIZE" "$MAX_IN_FLIGHT" "$PORT" signed)
KEY_CFG=$(pipeline_config single "$SINGLE_BATCH_SIZE" "$MAX_IN_FLIGHT" "$PORT" key)
BATCH_CFG=$(pipeline_config batch "$BATCH_SIZE" "$MAX_IN_FLIGHT" "$PORT")
log "$REPEATS rounds: wrk -t2 -c$MAX_IN_FLIGHT and -c32 for ${DURATION}s; single $N_SINGLE, signed $N_SINGLE, batch $N_BATCH messages; catch-up from $CATCHUP_SIZES; latency at $RATES/s for ${DURATION}s; a transaction open ${OPEN_TX_SECONDS}s"
echo "single: $SINGLE_CFG"
echo "batch:  $BATCH_CFG"
echo "key:    $KEY_CFG"
# The worker at rest: it has started, read its pipelines and delivered the
# sample, and waits.
wpid=$(psql_db -A -t -c "SELECT pid FROM tide.relay_workers() WHERE database = '$DB'")
bench_record worker_memory_kb "at rest, before the first run" 1 "$(proc_rss_kb "$wpid")"
for round in $(seq 1 "$REPEATS"); do
	if [ "$PARTS" = ordering ]; then
		throughput single single "$N_SINGLE" "$SINGLE_CFG" "$round"
		throughput single_key single "$N_SINGLE" "$KEY_CFG" "$round"
		continue
	fi
	if [ "$PARTS" = single ]; then
		curl_run "$round"
		throughput single single "$N_SINGLE" "$SINGLE_CFG" "$round"
		continue
	fi
	if [ "$PARTS" = latency ]; then
		for rate in $RATES; do
			latency "$round" "$rate"
		done
		continue
	fi
	wrk_run "$MAX_IN_FLIGHT" "$round"
	curl_run "$round"
	throughput single single "$N_SINGLE" "$SINGLE_CFG" "$round"
	throughput single_key single "$N_SINGLE" "$KEY_CFG" "$round"
	throughput single_signed single "$N_SINGLE" "$SIGNED_CFG" "$round"
	throughput batch batch "$N_BATCH" "$BATCH_CFG" "$round"
	for n in $CATCHUP_SIZES; do
		throughput "catchup_$n" batch "$n" "$BATCH_CFG" "$round"
	done
	wrk_run 32 "$round"
	for rate in $RATES; do
		latency "$round" "$rate"
	done
	[ "$OPEN_TX_SECONDS" -gt 0 ] && latency "$round" "${RATES%% *}" "$OPEN_TX_SECONDS"
	[ "$ISOLATION" = 1 ] && latency "$round" "${RATES%% *}" 0 beside_hang
	# Idle again: what the worker keeps (malloc keeps freed memory).
	bench_record worker_memory_kb "at rest, after the round" "$round" "$(proc_rss_kb "$wpid")"
done
if [ "$PARTS" = all ]; then
	workers_rounds
	many_rounds
fi
cp "$RESULTS" "$TIDE_CLUSTER/results_$(date +%Y%m%d_%H%M%S).tsv"
bench_summary
if [ "$PARTS" = ordering ]; then
	log "ordering key / relaxed, mode single, round by round (target >= 0.8)"
	awk -F'\t' '$1 == "single" { s[$2] = $5 } $1 == "single_key" { k[$2] = $5 }
		END { for (r in s) printf "  round %s  relaxed %8.0f msg/s  key %8.0f msg/s  ratio %.3f\n", r, s[r], k[r], k[r] / s[r] }' \
		"$RESULTS" | sort
	exit 0
fi
[ "$PARTS" = single ] && exit 0
[ "$PARTS" = latency ] && exit 0

log "results (median of $REPEATS rounds, [min to max]; ratios taken within each round)"
awk -F'\t' -v rounds="$REPEATS" -v wc="wrk_c$MAX_IN_FLIGHT" -v mif="$MAX_IN_FLIGHT" -v lrate="${RATES%% *}" '
	function sort(a, n,   i, j, t) { for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t } }
	function med(a, n) { sort(a, n); return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2 }
	function line(label, unit, fmt, vals, n,   m, lo, hi) {
		m = med(vals, n); lo = vals[1]; hi = vals[n]
		printf "%-34s " fmt " %-9s [" fmt " to " fmt "]\n", label, m, unit, lo, hi
	}
	$1 ~ /^wrk_/ { rate[$1, $2] = $5; rcpu[$1, $2] = $7 }
	$1 == "single" || $1 == "single_key" || $1 == "single_signed" || $1 == "batch" {
		rate[$1, $2] = $5; wcpu[$1, $2] = $6; rcpu[$1, $2] = $7; mcpu[$1, $2] = $8; wq[$1, $2] = $10 }
	$1 == "latency_" lrate { for (i = 3; i <= 9; i++) lat[i, $2] = $i }
	$1 == "latency_beside_hang" { for (i = 3; i <= 9; i++) hang[i, $2] = $i; nhang++ }
	END {
		n = rounds
		for (r = 1; r <= n; r++) a[r] = rate[wc, r];            line("receiver, wrk -c" mif, "req/s", "%9.0f", a, n)
		for (r = 1; r <= n; r++) a[r] = rate["wrk_c32", r];      line("receiver, wrk -c32", "req/s", "%9.0f", a, n)
		for (r = 1; r <= n; r++) a[r] = rate["single", r];       line("relay single", "msg/s", "%9.0f", a, n)
		for (r = 1; r <= n; r++) a[r] = rate["single", r] / rate[wc, r]; line("  / wrk -c" mif " (target >= 0.6)", "", "%9.3f", a, n)
		for (r = 1; r <= n; r++) a[r] = rate["single_key", r];   line("relay single, ordering key", "msg/s", "%9.0f", a, n)
		for (r = 1; r <= n; r++) a[r] = rate["single_key", r] / rate["single", r]; line("  / relaxed (target >= 0.8)", "", "%9.3f", a, n)
		for (r = 1; r <= n; r++) a[r] = rate["single_signed", r]; line("relay single, signed", "msg/s", "%9.0f", a, n)
		for (r = 1; r <= n; r++) a[r] = rate["single_signed", r] / rate[wc, r]; line("  / wrk -c" mif, "", "%9.3f", a, n)
		for (r = 1; r <= n; r++) a[r] = rate["batch", r];        line("relay batch (target >= 50000)", "msg/s", "%9.0f", a, n)
		for (r = 1; r <= n; r++) a[r] = lat[5, r];  line("latency p50 at " lrate "/s (target <= 2)", "ms", "%9.2f", a, n)
		for (r = 1; r <= n; r++) a[r] = lat[6, r];  line("latency p95", "ms", "%9.2f", a, n)
		for (r = 1; r <= n; r++) a[r] = lat[7, r];  line("latency p99 (target <= 10)", "ms", "%9.2f", a, n)
		for (r = 1; r <= n; r++) a[r] = lat[8, r];  line("latency max", "ms", "%9.2f", a, n)
		for (r = 1; r <= n; r++) a[r] = lat[9, r];  line("latency p50 from xact start", "ms", "%9.2f", a, n)
		for (r = 1; r <= n; r++) a[r] = lat[3, r];  line("latency messages", "", "%9d", a, n)
		if (nhang == n) {
			for (r = 1; r <= n; r++) a[r] = hang[5, r];  line("beside a hanging pipeline, p50 (<= 10)", "ms", "%9.2f", a, n)
			for (r = 1; r <= n; r++) a[r] = hang[5, r] / lat[5, r]; line("  / alone (target <= 3)", "", "%9.3f", a, n)
			for (r = 1; r <= n; r++) a[r] = hang[7, r];  line("beside a hanging pipeline, p99 (<= 10)", "ms", "%9.2f", a, n)
			for (r = 1; r <= n; r++) a[r] = hang[7, r] / lat[7, r]; line("  / alone (target <= 3)", "", "%9.3f", a, n)
		}
		printf "\nCPU during the runs (cores, median of the rounds):"
		split("single single_signed batch", cs, " ")
		for (i = 1; i <= 3; i++) {
			c = cs[i]; for (r = 1; r <= n; r++) { w[r] = wcpu[c, r]; x[r] = rcpu[c, r]; y[r] = mcpu[c, r]; q[r] = wq[c, r] }
			printf "\n  %-14s worker on CPU %.2f, waiting for a CPU %.2f; receiver %.2f; whole machine %.2f", c, med(w, n), med(q, n), med(x, n), med(y, n)
		}
		for (r = 1; r <= n; r++) x[r] = rcpu[wc, r]
		printf "\n  %-14s receiver %.2f\n", "wrk -c" mif, med(x, n)
	}' "$RESULTS"
echo "latency: receipt at the receiver minus the end of the publishing transaction in pgbench (its commit returned);"
echo "'from xact start': minus the message's created_at (the publishing transaction's start)"
