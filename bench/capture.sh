#!/usr/bin/env bash
# Change capture: an UPDATE-heavy pgbench workload on a table captured with
# tide.outbox_capture() (the C trigger, src/capture.c), against the same
# workload on the same table shape with a hand-written PL/pgSQL trigger that
# builds the same payload and calls tide.outbox_publish(), with PgQ's
# pgq.jsontriga (Debian's postgresql-15-pgq3) into a PgQ queue, and with no
# trigger at all. Target (issue 27): the capture at least 0.8 of the
# PL/pgSQL trigger, and at least jsontriga. See bench/README.md. Besides
# each side's rate, the CPU its backends spent per update (the steadier
# figure on a machine where other work runs too), and at the end each
# trigger's own time per row.
#
# Run as root. pg_tide must already be installed (test/run-tests.sh, or
# PG_CONFIG naming an installation that has it); PgQ is installed from
# Debian when missing. Its own throwaway cluster in
# /tmp/pg_tide_bench_capture on port 5494, stopped at the end
# (KEEP_CLUSTER=1 leaves it running).
#
# Settings from the environment:
#   DURATION  seconds per pgbench run (default 5)
#   REPEATS   rounds (default 3); every side runs once per round, the order
#             rotating, so each ratio is taken within a round
#   CLIENTS   pgbench clients (default 2; threads: at most 2)
#   ROWS      rows of each table (default 10000)
#   SIDES     what runs (default "none capture plpgsql pgq")
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIDE_CLUSTER=${TIDE_CLUSTER:-/tmp/pg_tide_bench_capture}
export TIDE_PORT=${TIDE_PORT:-5494}
BENCH_NAME=capture.sh
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"

DURATION=${DURATION:-5}
REPEATS=${REPEATS:-3}
CLIENTS=${CLIENTS:-2}
ROWS=${ROWS:-10000}
SIDES=${SIDES:-none capture plpgsql pgq}

bench_need_packages postgresql-15-pgq3
tide_start_cluster
"$PG_BIN/createdb" "$DB"

log "creating the outbox, the queue and one table per side ($ROWS rows each)"
psql_db -v rows="$ROWS" <<'SQL'
CREATE EXTENSION pg_tide;
CREATE EXTENSION pgq;
-- No consumer reads the outbox: a threshold far above a run's messages.
SELECT tide.outbox_create('bench', p_inline_threshold => 2000000000) \gset
SELECT pgq.create_queue('bench') \gset
CREATE SCHEMA bench;
CREATE TABLE bench.t_none (id int PRIMARY KEY, balance bigint NOT NULL, status text NOT NULL,
	note text, updated_at timestamptz NOT NULL);
CREATE TABLE bench.t_capture (LIKE bench.t_none INCLUDING ALL);
CREATE TABLE bench.t_plpgsql (LIKE bench.t_none INCLUDING ALL);
CREATE TABLE bench.t_pgq (LIKE bench.t_none INCLUDING ALL);

SELECT tide.outbox_capture('bench.t_capture', 'bench') \gset

-- What one writes by hand without capture: the same payload and headers.
CREATE FUNCTION bench.publish_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'DELETE' THEN
		PERFORM tide.outbox_publish('bench',
			jsonb_build_object('op', 'delete', 'table', TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME,
							   'key', jsonb_build_object('id', OLD.id)),
			jsonb_build_object('type', TG_TABLE_NAME || '.delete', 'key', OLD.id::text));
		RETURN NULL;
	END IF;
	PERFORM tide.outbox_publish('bench',
		jsonb_build_object('op', lower(TG_OP), 'table', TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME,
						   'key', jsonb_build_object('id', NEW.id), 'new', to_jsonb(NEW)),
		jsonb_build_object('type', TG_TABLE_NAME || '.' || lower(TG_OP), 'key', NEW.id::text));
	RETURN NULL;
END
$$;
CREATE TRIGGER publish_change AFTER INSERT OR UPDATE OR DELETE ON bench.t_plpgsql
	FOR EACH ROW EXECUTE FUNCTION bench.publish_change();

CREATE TRIGGER pgq_capture AFTER INSERT OR UPDATE OR DELETE ON bench.t_pgq
	FOR EACH ROW EXECUTE FUNCTION pgq.jsontriga('bench');

-- Loaded before the triggers publish anything that a run counts.
INSERT INTO bench.t_none SELECT g, 0, 'open', 'row ' || g, now() FROM generate_series(1, :rows) g;
INSERT INTO bench.t_capture SELECT * FROM bench.t_none;
INSERT INTO bench.t_plpgsql SELECT * FROM bench.t_none;
INSERT INTO bench.t_pgq SELECT * FROM bench.t_none;
TRUNCATE tide.tide_outbox_messages;
VACUUM ANALYZE;
SQL

# The messages a side has published.
side_messages() {
	case $1 in
	none) echo 0 ;;
	capture | plpgsql) scalar "SELECT count(*) FROM tide.tide_outbox_messages" ;;
	pgq) scalar "SELECT count(*) FROM $(scalar "SELECT queue_data_pfx FROM pgq.queue WHERE queue_name = 'bench'")" ;;
	esac
}

# Both pg_tide sides publish the same payload: checked on one update each.
psql_db -c "UPDATE bench.t_capture SET balance = balance + 1 WHERE id = 1" \
	-c "UPDATE bench.t_plpgsql SET balance = balance + 1 WHERE id = 1"
psql_db -A -t -c "SELECT count(DISTINCT (payload - 'table') || jsonb_build_object('h', headers - 'type'))
	FROM tide.tide_outbox_messages" | grep -qx 1 ||
	{ echo "capture.sh: the two pg_tide sides publish different messages" >&2; exit 1; }

# The CPU time (user + system, in clock ticks) of the backends that have
# ended: the postmaster's children's times, which grow as it reaps them.
# Steadier than a rate on a machine shared with other work, which takes
# the CPU but does not add to what a backend spends.
reaped_cpu_ticks() {
	awk '{ print $16 + $17 }' "/proc/$(head -1 "$TIDE_CLUSTER/data/postmaster.pid")/stat"
}

# Waits (at most 5 s) until the backends of the database have ended; exits
# the bench when they have not.
wait_backends_ended() {
	local postmaster
	postmaster=$(head -1 "$TIDE_CLUSTER/data/postmaster.pid")
	for _ in $(seq 1 100); do
		pgrep -P "$postmaster" -f "postgres: .* $DB " >/dev/null || return 0
		sleep 0.05
	done
	echo "capture.sh: backends of $DB still running after pgbench" >&2
	exit 1
}

script=$TIDE_CLUSTER/update.sql
# run <side> <round>
run() {
	local side=$1 round=$2 out tps xacts messages cpu_before cpu_us
	out=$TIDE_CLUSTER/pgbench_${side}_${round}.log
	cat >"$script" <<PGB
\set id random(1, $ROWS)
UPDATE bench.t_$side SET balance = balance + 1, updated_at = now() WHERE id = :id;
PGB
	# pg_tide's child tables, which the relay worker (off here) keeps ahead
	# of the ids handed out: the messages go into a child, as in a
	# database whose worker runs (bench/publish.sh does the same).
	psql_db -c "TRUNCATE tide.tide_outbox_messages" -c "SELECT tide._outbox_partitions_maintain()" \
		-c "SELECT pgq.drop_queue('bench')" -c "SELECT pgq.create_queue('bench')" \
		-c "VACUUM bench.t_$side" -c "CHECKPOINT" >/dev/null
	wait_backends_ended
	cpu_before=$(reaped_cpu_ticks)
	"$PGBENCH" -n -M prepared -c "$CLIENTS" -j "$(( CLIENTS < 2 ? CLIENTS : 2 ))" -T "$DURATION" \
		-f "$script" "$DB" >"$out" 2>&1 || { cat "$out"; tide_show_server_log; exit 1; }
	wait_backends_ended
	tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' "$out")
	xacts=$(sed -n 's/^number of transactions actually processed: \([0-9]*\)$/\1/p' "$out")
	messages=$(side_messages "$side")
	# Every committed update published one message.
	if [ "$side" != none ] && [ "$messages" -ne "$xacts" ]; then
		echo "capture.sh: $side: $xacts updates but $messages messages" >&2
		exit 1
	fi
	# the CPU the pgbench clients' backends spent per update, in microseconds
	cpu_us=$(awk -v t="$(( $(reaped_cpu_ticks) - cpu_before ))" -v hz="$(getconf CLK_TCK)" -v n="$xacts" \
		'BEGIN { printf "%.1f", t * 1000000 / hz / n }')
	bench_record "updates_per_s" "$side" "$round" "$tps"
	bench_record "cpu_us_per_update" "$side" "$round" "$cpu_us"
	printf '  round %s  %-8s %10.0f updates/s %8.1f us CPU/update\n' "$round" "$side" "$tps" "$cpu_us"
}

psql_db -A -t -c "SELECT version()" \
	-c "SELECT 'pg_tide ' || extversion FROM pg_extension WHERE extname = 'pg_tide'" \
	-c "SELECT 'pgq ' || extversion FROM pg_extension WHERE extname = 'pgq'"
log "pgbench: ${DURATION}s per run, $REPEATS rounds, $CLIENTS clients; sides $SIDES"
for round in $(seq 1 "$REPEATS"); do
	set -- $SIDES
	for _ in $(seq 2 "$round"); do set -- "${@:2}" "$1"; done
	for side in "$@"; do
		run "$side" "$round"
	done
	# The ratios of this round.
	awk -F'\t' -v me="$BENCH_NAME" -v r="$round" '
		$1 == me && $4 == r && $2 == "updates_per_s" { v[$3] = $5 }
		$1 == me && $4 == r && $2 == "cpu_us_per_update" { cpu[$3] = $5 }
		END {
			if (v["plpgsql"] > 0) printf "  round %s  capture / plpgsql = %.2f\n", r, v["capture"] / v["plpgsql"]
			if (v["pgq"] > 0) printf "  round %s  capture / pgq     = %.2f\n", r, v["capture"] / v["pgq"]
			if (cpu["capture"] > 0 && cpu["plpgsql"] > 0)
				printf "  round %s  CPU per update, plpgsql / capture = %.2f\n", r, cpu["plpgsql"] / cpu["capture"]
			if (cpu["capture"] > 0 && cpu["pgq"] > 0)
				printf "  round %s  CPU per update, pgq / capture     = %.2f\n", r, cpu["pgq"] / cpu["capture"]
		}' "${BENCH_RAW:-$TIDE_CLUSTER/raw.tsv}"
done

# The triggers' own time per row, as EXPLAIN ANALYZE reports it for an
# UPDATE of every row in one statement: each trigger without the client,
# the statement and the commit around it, the figure least moved by other
# work on the machine. REPEATS times, the sides in turn.
trigger_us_per_row() {
	psql_db -A -t -c "EXPLAIN (ANALYZE, COSTS OFF) UPDATE bench.t_$1 SET balance = balance + 1, updated_at = now()" |
		sed -n 's/^Trigger .*: time=\([0-9.]*\) calls=\([0-9]*\)$/\1 \2/p' |
		awk '{ printf "%.2f", $1 * 1000 / $2 }'
}
log "trigger time per row: UPDATE of all $ROWS rows in one statement, $REPEATS times"
psql_db -c "SELECT tide._outbox_partitions_maintain()" >/dev/null
for round in $(seq 1 "$REPEATS"); do
	for side in $SIDES; do
		[ "$side" != none ] || continue
		psql_db -c "VACUUM bench.t_$side" >/dev/null
		us=$(trigger_us_per_row "$side")
		bench_record "trigger_us_per_row" "$side" "$round" "$us"
		printf '  round %s  %-8s %8s us per row in the trigger\n' "$round" "$side" "$us"
	done
done
bench_summary
