#!/usr/bin/env bash
# Installs what is missing, builds and installs pg_tide, starts a throwaway
# cluster with pg_tide preloaded, and runs every test: pg_regress, isolation
# and TAP. Run as root on Debian 12: sudo test/run-tests.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

tide_install_packages
tide_build_install
TIDE_EXTRA_CONF=$'fsync = off\nmax_prepared_transactions = 10\npg_tide.relay_enabled = off' tide_start_cluster

# The tests run as postgres (TAP tests run initdb, which refuses root) from
# a copy of the tree that postgres owns.
work=$(mktemp -d /tmp/pg_tide_tests.XXXXXX)
tar -C "$TIDE_ROOT" --exclude=.git -cf - . | tar -C "$work" -xf -
chown -R postgres: "$work"

log "running pg_regress, isolation and TAP tests"
status=0
runuser -u postgres -- env PGHOST="$PGHOST" PGPORT="$PGPORT" PGUSER=postgres \
	make -C "$work" -s PG_CONFIG="$PG_CONFIG" ${PROVE_FLAGS:+PROVE_FLAGS="$PROVE_FLAGS"} installcheck || status=$?

if [ "$status" -ne 0 ]; then
	for diffs in "$work/regression.diffs" "$work/output_iso/regression.diffs"; do
		if [ -s "$diffs" ]; then
			log "$diffs"
			cat "$diffs"
		fi
	done
	for tap_log in "$work"/tmp_check/log/*; do
		[ -f "$tap_log" ] || continue
		log "$tap_log"
		tail -n 100 "$tap_log"
	done
	tide_show_server_log
	log "FAILED (files kept in $work)"
else
	rm -rf "$work"
	log "all tests passed"
fi
tide_stop_cluster
exit "$status"
