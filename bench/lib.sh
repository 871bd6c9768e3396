#!/usr/bin/env bash
# Shared by the benchmark scripts: the cluster settings, the checks before a
# run and the cleanup after it. The caller sets TIDE_CLUSTER, TIDE_PORT and
# BENCH_NAME, then sources this file.
set -euo pipefail

# Default durability (fsync, synchronous_commit and full_page_writes stay
# on). Only sizing, the same for every side of a comparison: enough
# shared_buffers for every run's data, and checkpoints only where a script
# asks for them, so that no run is hit by a timed or WAL-size checkpoint.
export TIDE_EXTRA_CONF="shared_buffers = 1GB
max_wal_size = 16GB
checkpoint_timeout = 30min
max_connections = 50
pg_tide.relay_enabled = off"
# shellcheck source=../test/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../test/lib.sh"

DB=tide_bench
PGBENCH=$PG_BIN/pgbench
RESULTS=$TIDE_CLUSTER/results.tsv

if [ "$(id -u)" -ne 0 ]; then
	echo "$BENCH_NAME: run me as root (the cluster runs as the postgres user)" >&2
	exit 1
fi
if [ ! -f "$(/usr/bin/pg_config --pkglibdir)/pg_tide.so" ] ||
	[ ! -f "$(/usr/bin/pg_config --sharedir)/extension/pg_tide.control" ]; then
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
