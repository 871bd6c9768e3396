#!/usr/bin/env bash
# The whole benchmark suite in one command: builds and installs pg_tide,
# runs publish.sh (against a plain INSERT and PgQ), consume.sh (against a
# SKIP LOCKED queue and PgQ), relay.sh (against the receiver's own wrk
# rate; latency, catch-up, worker memory), inbox_sink.sh (outbox to a local
# inbox against a plain INSERT ... SELECT), inbox_handler.sh (a handler run by
# the relay against inbox_process in a client loop), capture.sh (an UPDATE-heavy
# workload on a captured table against a PL/pgSQL trigger and PgQ's jsontriga),
# schema.sh (publishing with a payload schema against without one),
# schedule.sh (unscheduled messages' rates beside a full schedule)
# and sustained.sh (25 minutes of
# steady publishing and consuming; SUSTAINED_DURATION shortens it), each in its own throwaway
# cluster, then writes bench/RESULTS.md and bench/results/*.png.
#
#   sudo bench/suite.sh            # about 45 minutes on 2 cores
#   QUICK=1 sudo bench/suite.sh    # a few minutes, one round: a smoke run
#
# Run as root on Debian 12 (the clusters run as the postgres user). Every
# setting of the three scripts (REPEATS, DURATION, ...) is passed through;
# see their headers. Installs what it needs from Debian: the build
# dependencies, postgresql-15-pgq3, wrk, jq, curl, gnuplot-nox.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../test/lib.sh
source "$BENCH_DIR/../test/lib.sh"

if [ "$(id -u)" -ne 0 ]; then
	echo "suite.sh: run me as root (the clusters run as the postgres user)" >&2
	exit 1
fi

tide_install_packages
for p in postgresql-15-pgq3 wrk jq curl gnuplot-nox; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$p" >/dev/null
done
tide_build_install

if [ "${QUICK:-0}" = 1 ]; then
	export REPEATS=${REPEATS:-1} DURATION=${DURATION:-2} N=${N:-30000} N_SINGLE=${N_SINGLE:-10000}
	export N_BATCH=${N_BATCH:-50000} CATCHUP_SIZES=${CATCHUP_SIZES:-100000 1000000} OPEN_TX_SECONDS=${OPEN_TX_SECONDS:-5}
	export SUSTAINED_DURATION=${SUSTAINED_DURATION:-120} SUSTAINED_PGQ_DURATION=${SUSTAINED_PGQ_DURATION:-60}
	export SUSTAINED_RETENTION=${SUSTAINED_RETENTION:-30}
fi

WORK=$(mktemp -d /tmp/pg_tide_suite.XXXXXX)
export BENCH_RAW=$WORK/raw.tsv
: >"$BENCH_RAW"
{
	echo "date:      $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo "commit:    $(git -C "$BENCH_DIR/.." rev-parse --short HEAD 2>/dev/null || echo unknown)"
	echo "cpu:       $(lscpu | sed -n 's/^Model name: *//p' | head -n 1), $(nproc) cores"
	echo "memory:    $(free -g | awk '/^Mem:/ { print $2 }') GiB"
	echo "os:        $(. /etc/os-release && echo "$PRETTY_NAME"), kernel $(uname -r)"
	echo "postgres:  $("$PG_BIN/postgres" --version)"
	echo "pg_tide:   $(sed -n "s/^default_version = '\(.*\)'/\1/p" "$BENCH_DIR/../pg_tide.control")"
	echo "pgq:       $(dpkg-query -W -f='${Version}' postgresql-15-pgq3)"
	echo "settings:  REPEATS=${REPEATS:-default} DURATION=${DURATION:-default}${QUICK:+ QUICK=$QUICK}"
	echo "cluster:   default durability (fsync, synchronous_commit, full_page_writes on),"
	echo "           shared_buffers 1GB, max_wal_size 16GB, checkpoint_timeout 30min"
} >"$WORK/machine.txt"
cat "$WORK/machine.txt"

started=$SECONDS
for script in publish.sh consume.sh relay.sh inbox_sink.sh inbox_handler.sh capture.sh schema.sh schedule.sh sustained.sh; do
	log "suite: $script"
	"$BENCH_DIR/$script"
done
log "suite: report (the benchmarks took $(( (SECONDS - started) / 60 )) min)"
"$BENCH_DIR/report.sh" "$BENCH_RAW" "$WORK/machine.txt" "$BENCH_DIR"
cp "$BENCH_RAW" "$BENCH_DIR/results/raw.tsv"
echo "raw measurements: $BENCH_DIR/results/raw.tsv"
