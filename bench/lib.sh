#!/usr/bin/env bash
# Shared by the benchmark scripts: the cluster settings, the checks before a
# run and the cleanup after it. The caller sets TIDE_CLUSTER and TIDE_PORT
# (and BENCH_NAME, the name its figures and messages carry, by default its
# file name), then sources this file.
set -euo pipefail
BENCH_NAME=${BENCH_NAME:-$(basename "${BASH_SOURCE[1]}")}

# Default durability (fsync, synchronous_commit and full_page_writes stay
# on). Only sizing, the same for every side of a comparison: enough
# shared_buffers for every run's data, and checkpoints only where a script
# asks for them, so that no run is hit by a timed or WAL-size checkpoint.
BENCH_SIZING="shared_buffers = 1GB
max_wal_size = 16GB
checkpoint_timeout = 30min
max_connections = 50"
# BENCH_EXTRA_CONF: settings added for a run by hand (for example
# 'fsync = off' to compare CPU costs without waiting for the disk).
export TIDE_EXTRA_CONF="$BENCH_SIZING
pg_tide.relay_enabled = off
${BENCH_EXTRA_CONF:-}"
# The relay's benchmarks (relay.sh, broker_*.sh) measure the relay: the same
# sizing with the relay on and a short naptime, which they set after
# sourcing this file (the cluster starts later).
RELAY_BENCH_CONF="$BENCH_SIZING
pg_tide.relay_enabled = on
pg_tide.relay_naptime_ms = 200
${BENCH_EXTRA_CONF:-}"
# shellcheck source=../test/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../test/lib.sh"

DB=tide_bench
PGBENCH=$PG_BIN/pgbench
RESULTS=$TIDE_CLUSTER/results.tsv

if [ "$(id -u)" -ne 0 ]; then
	echo "$BENCH_NAME: run me as root (the cluster runs as the postgres user)" >&2
	exit 1
fi
if [ ! -f "$("${PG_CONFIG:-/usr/bin/pg_config}" --pkglibdir)/pg_tide.so" ] ||
	[ ! -f "$("${PG_CONFIG:-/usr/bin/pg_config}" --sharedir)/extension/pg_tide.control" ]; then
	echo "$BENCH_NAME: pg_tide is not installed; run test/demo.sh or test/run-tests.sh first" >&2
	exit 1
fi

# Stops the cluster at the end, unless KEEP_CLUSTER=1.
bench_cleanup() {
	if [ "${KEEP_CLUSTER:-0}" = 1 ]; then
		log "cluster left running in $TIDE_CLUSTER (port $TIDE_PORT)"
	else
		tide_stop_cluster
	fi
}
trap bench_cleanup EXIT

psql_db() { "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -d "$DB" "$@"; }
# scalar <sql>: the one value the query returns, unaligned.
scalar() { psql_db -A -t -c "$1"; }

# bench_publish_sql <outbox> <n> [headers]: prints the SQL that publishes
# n messages (bench.payload) into the outbox, 10,000 per transaction, each
# transaction's with the headers (an SQL expression of c, the transaction's
# number; default bench.headers(c)).
bench_publish_sql() {
	cat <<SQL
DO \$\$
BEGIN
	FOR c IN 0 .. ($2 - 1) / 10000 LOOP
		PERFORM tide.outbox_publish_batch('$1',
			(SELECT array_agg(bench.payload(i) ORDER BY i)
			   FROM generate_series(c * 10000::bigint, least(c * 10000 + 9999, $2 - 1)) i),
			${3:-bench.headers(c)});
		COMMIT;
	END LOOP;
END
\$\$;
SQL
}

# bench_publish <outbox> <n>: publishes n messages (bench.payload,
# bench.headers) into the outbox, 10,000 per transaction.
bench_publish() {
	bench_publish_sql "$1" "$2" | psql_db >/dev/null
}

# bench_wait_recorded <pipeline> <last id> [seconds]: waits until the
# pipeline's offset has reached <last id> and prints the epoch of that
# record (relay_consumer_offsets.updated_at, the end of a throughput run);
# exits the bench when it has not within the seconds (default 300). One
# session waits, sleeping in the server between looks: a new psql every
# 50 ms would start 20 backends a second, CPU taken from the relay being
# measured that the baselines beside it (which poll nothing) never lose.
bench_wait_recorded() {
	local name=$1 last=$2 secs=${3:-300}
	psql_db -A -t <<SQL || { echo "$BENCH_NAME: $name not recorded up to $last within $secs s" >&2; tide_show_server_log; exit 1; }
DO \$wait\$
DECLARE
	deadline timestamptz := clock_timestamp() + make_interval(secs => $secs);
BEGIN
	WHILE NOT EXISTS (SELECT FROM tide.relay_consumer_offsets
					   WHERE pipeline_id = '$name' AND last_change_id >= $last) LOOP
		IF clock_timestamp() > deadline THEN
			RAISE EXCEPTION 'not recorded';
		END IF;
		PERFORM pg_sleep(0.05);
	END LOOP;
END
\$wait\$;
SELECT extract(epoch FROM updated_at) FROM tide.relay_consumer_offsets
 WHERE pipeline_id = '$name' AND last_change_id >= $last;
SQL
}

# bench_enable_timed <pipeline>: enables the pipeline (waking the worker at
# its commit) and prints the epoch just before that commit, the start of a
# throughput run.
bench_enable_timed() {
	psql_db -A -t <<SQL | tail -n 1
BEGIN;
SELECT tide.relay_enable('$1');
SELECT extract(epoch FROM clock_timestamp());
COMMIT;
SQL
}

# bench_need_packages <packages...>: installs Debian packages when missing.
bench_need_packages() {
	local p missing=()
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		log "installing ${missing[*]}"
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
	fi
}

# bench_relay_settings: what the relay's benchmarks (relay.sh, broker_*.sh,
# inbox_sink.sh, postgres.sh) set after sourcing this file: the relay on
# (RELAY_BENCH_CONF) in the cluster they start, clients quiet, and the
# defaults N (backlog, 100000), REPEATS (3) and BATCH_SIZE (1000).
bench_relay_settings() {
	export TIDE_EXTRA_CONF=$RELAY_BENCH_CONF
	export PGOPTIONS="-c client_min_messages=warning"
	N=${N:-100000}
	REPEATS=${REPEATS:-3}
	BATCH_SIZE=${BATCH_SIZE:-1000}
}

# bench_need_module <endpoint> <what its build needs>: fails unless the
# endpoint's module, pg_tide_<endpoint>.so, is installed.
bench_need_module() {
	if [ ! -f "$("$PG_CONFIG" --pkglibdir)/pg_tide_$1.so" ]; then
		echo "$BENCH_NAME: pg_tide_$1.so is not installed ($2)" >&2
		exit 1
	fi
}

# bench_record <figure> <case> <round> <value>: one measurement, appended to
# $BENCH_RAW (bench/suite.sh sets it and writes RESULTS.md from it; a script
# run on its own keeps it in its cluster directory), with the script's name.
bench_record() {
	printf '%s\t%s\t%s\t%s\t%s\n' "$BENCH_NAME" "$1" "$2" "$3" "$4" >>"${BENCH_RAW:-$TIDE_CLUSTER/raw.tsv}"
}

# bench_summary: the median and the spread of every figure and case this
# script recorded.
bench_summary() {
	log "results: median [min to max] of the rounds"
	sort -t $'\t' -k2,2 -k3,3 -k5,5g "${BENCH_RAW:-$TIDE_CLUSTER/raw.tsv}" | awk -F'\t' -v me="$BENCH_NAME" '
		$1 != me { next }
		{ key = $2 "\t" $3; if (!(key in n)) order[++k] = key; v[key, ++n[key]] = $5 }
		END {
			for (i = 1; i <= k; i++) {
				key = order[i]; c = n[key]
				med = c % 2 ? v[key, (c + 1) / 2] : (v[key, c / 2] + v[key, c / 2 + 1]) / 2
				split(key, f, "\t")
				printf "  %-22s %-14s %12.2f  [%.2f to %.2f]  %d rounds\n", f[1], f[2], med, v[key, 1], v[key, c], c
			}
		}'
}

# bench_need_receiver <tools...>: installs the tools and libmicrohttpd from
# Debian's packages when missing, builds test/receiver, sets RECEIVER_BIN.
bench_need_receiver() {
	local tool missing=()
	for tool in "$@"; do
		command -v "$tool" >/dev/null || missing+=("$tool")
	done
	dpkg-query -W -f='${Status}' libmicrohttpd-dev 2>/dev/null | grep -q "install ok installed" ||
		missing+=(libmicrohttpd-dev)
	if [ ${#missing[@]} -gt 0 ]; then
		log "installing ${missing[*]}"
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
	fi
	make -s -C "$(dirname "${BASH_SOURCE[0]}")/.." test/receiver >/dev/null
	RECEIVER_BIN=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/test/receiver
}
