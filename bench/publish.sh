#!/usr/bin/env bash
# Publish throughput: tide.outbox_publish() / tide.outbox_publish_batch()
# against a plain INSERT of the same rows into a plain table with the same
# columns and indexes. 8 pgbench clients, at 1 and at 100 messages per
# transaction. See bench/README.md.
#
# Run as root. pg_tide must already be built and installed (run
# test/demo.sh or test/run-tests.sh first); this script builds nothing.
# It starts its own throwaway cluster in /tmp/pg_tide_bench on port 5498
# and stops it at the end (KEEP_CLUSTER=1 leaves it running).
#
# Settings from the environment:
#   DURATION  seconds per pgbench run (default 20)
#   REPEATS   pairs of runs per case (default 3)
#   CLIENTS   pgbench clients (default 8)
#   JOBS      pgbench threads (default 2)
# With the defaults it runs for about 4.5 minutes.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIDE_CLUSTER=/tmp/pg_tide_bench
export TIDE_PORT=5498
BENCH_NAME=publish.sh
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"

DURATION=${DURATION:-20}
REPEATS=${REPEATS:-3}
CLIENTS=${CLIENTS:-8}
JOBS=${JOBS:-2}

tide_start_cluster
"$PG_BIN/createdb" "$DB"

log "creating pg_tide, its outbox and the baseline table"
psql_db <<'SQL'
CREATE EXTENSION pg_tide;

-- The outbox. No consumer group reads it during the run, so every message
-- published stays unconsumed, and the default inline_threshold (10000)
-- would refuse publishing after 10000 messages, long before a run ends (a
-- run publishes up to a few million). 2e9, near the int maximum, is far
-- above anything a run publishes, so backpressure never refuses and the
-- cheap upper bound of the fast path (last id handed out minus the oldest
-- unconsumed id) always stays below it: the slow path never runs. The
-- backpressure check itself still runs on every publish call (the publish
-- INSERT reads the config row, probes the pending index for the oldest
-- unconsumed id and reads the sequence) and is part of what is measured.
SELECT tide.outbox_create('bench', p_inline_threshold => 2000000000) \gset

-- The baseline: tide.tide_outbox_messages' columns and types, a bigint
-- primary key from a CACHE 1 sequence default, and the same partial index.
-- No foreign key: a plain table of events has none (and pg_tide's message
-- table has none either; see docs/catalog.md).
CREATE SCHEMA bench;
CREATE SEQUENCE bench.plain_messages_id_seq CACHE 1;
CREATE TABLE bench.plain_messages (
	id				bigint PRIMARY KEY DEFAULT nextval('bench.plain_messages_id_seq'),
	outbox_name		text NOT NULL,
	payload			jsonb NOT NULL,
	headers			jsonb,
	created_at		timestamptz NOT NULL DEFAULT now(),
	consumed_at		timestamptz,
	consumer_group	text
);
ALTER SEQUENCE bench.plain_messages_id_seq OWNED BY bench.plain_messages.id;
CREATE INDEX plain_messages_pending
	ON bench.plain_messages (outbox_name, id)
	WHERE consumed_at IS NULL;
SQL

# One transaction of each script, to check that they run and that both
# sides write the same rows: same payload and headers sizes.
for script in plain_single tide_single plain_batch tide_batch; do
	"$PGBENCH" -n -M prepared -c 1 -t 1 -f "$BENCH_DIR/$script.sql" "$DB" >/dev/null
done
psql_db <<'SQL'
\pset footer off
SELECT 'pg_tide' AS side, count(*) AS messages,
	   round(avg(octet_length(payload::text))) AS payload_bytes,
	   round(avg(octet_length(headers::text))) AS headers_bytes,
	   round(avg(pg_column_size(m.*))) AS row_bytes
  FROM tide.tide_outbox_messages m
UNION ALL
SELECT 'plain', count(*), round(avg(octet_length(payload::text))),
	   round(avg(octet_length(headers::text))), round(avg(pg_column_size(m.*)))
  FROM bench.plain_messages m;
SQL

# Empties both tables (and restarts their sequences), then checkpoints, so
# that every run starts from the same state.
reset_tables() {
	psql_db -c "TRUNCATE tide.tide_outbox_messages, bench.plain_messages RESTART IDENTITY" \
		-c "CHECKPOINT"
}

# CPU seconds used so far by this cluster (live processes, and the backends
# the postmaster has reaped), by this shell's children (pgbench, psql) and by
# the whole machine. Their differences over a run give the CPU that other
# processes took: the machine has only a few cores, so a run that shared
# them with something else shows here.
# Prints them; run it in this shell, not in $(...), or times sees nothing.
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
}

# run <case> <side> <messages per transaction> <pair>
run() {
	local case=$1 side=$2 per_xact=$3 pair=$4 out tps lat xacts rows table others
	out=$TIDE_CLUSTER/pgbench_${case}_${side}_${pair}.log
	reset_tables
	cpu_seconds >"$TIDE_CLUSTER/cpu.before"
	"$PGBENCH" -n -M prepared -c "$CLIENTS" -j "$JOBS" -T "$DURATION" \
		-f "$BENCH_DIR/${side}_${case}.sql" "$DB" >"$out" 2>&1 ||
		{ cat "$out"; tide_show_server_log; exit 1; }
	# Cores used by other processes on average over the run.
	cpu_seconds >"$TIDE_CLUSTER/cpu.after"
	others=$(paste "$TIDE_CLUSTER/cpu.before" "$TIDE_CLUSTER/cpu.after" |
		awk -v d="$DURATION" '{ t += ($2 - $1) * (NR == 1 ? 1 : -1) } END { print t / d }')
	tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' "$out")
	lat=$(sed -n 's/^latency average = \([0-9.]*\) ms$/\1/p' "$out")
	xacts=$(sed -n 's/^number of transactions actually processed: \([0-9]*\)$/\1/p' "$out")
	if [ "$side" = tide ]; then table=tide.tide_outbox_messages; else table=bench.plain_messages; fi
	rows=$(psql_db -A -t -c "SELECT count(*) FROM $table")
	# Every committed transaction wrote its messages, no more, no less.
	if [ "$rows" -ne $((xacts * per_xact)) ]; then
		echo "publish.sh: $case/$side: $xacts transactions but $rows rows" >&2
		exit 1
	fi
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$case" "$per_xact" "$pair" "$side" "$tps" "$lat" "$others" >>"$RESULTS"
	printf '  %-6s pair %s  %-5s  %10.1f tps  %10.0f msg/s  %7.2f ms  others %.2f cores\n' \
		"$case" "$pair" "$side" "$tps" "$(awk "BEGIN { print $tps * $per_xact }")" "$lat" "$others"
}

: >"$RESULTS"
psql_db -A -t -c "SELECT version()" \
	-c "SELECT 'pg_tide ' || extversion FROM pg_extension WHERE extname = 'pg_tide'"
log "pgbench: $CLIENTS clients, $JOBS threads, ${DURATION}s per run, $REPEATS pairs per case"
for pair in $(seq 1 "$REPEATS"); do
	for c in single:1 batch:100; do
		# Alternate which side goes first, so that drift over the run
		# (table files growing, other load) does not favour one side.
		if [ $((pair % 2)) -eq 1 ]; then sides="plain tide"; else sides="tide plain"; fi
		for side in $sides; do
			run "${c%%:*}" "$side" "${c##*:}" "$pair"
		done
	done
done

log "results (TPS = transactions/s; msg/s = TPS x messages per transaction)"
awk -F'\t' -v pairs="$REPEATS" '
	{ tps[$1, $3, $4] = $5; oth[$1, $3, $4] = $7; per[$1] = $2 }
	END {
		printf "%-7s %5s  %11s %11s  %11s %11s  %6s  %s\n", "case", "pair",
			"plain TPS", "tide TPS", "plain msg/s", "tide msg/s", "ratio", "others"
		split("single batch", cases, " ")
		for (i = 1; i <= 2; i++) {
			c = cases[i]; m = per[c]; sp = 0; st = 0; lo = 1e9; hi = 0
			for (p = 1; p <= pairs; p++) {
				a = tps[c, p, "plain"]; b = tps[c, p, "tide"]; r = b / a
				o = oth[c, p, "plain"] > oth[c, p, "tide"] ? oth[c, p, "plain"] : oth[c, p, "tide"]
				printf "%-7s %5d  %11.1f %11.1f  %11.0f %11.0f  %6.3f  %.2f%s\n", c, p, a, b,
					a * m, b * m, r, o, (o > 0.25 ? " disturbed" : "")
				sp += a; st += b
				if (r < lo) lo = r
				if (r > hi) hi = r
			}
			printf "%-7s %5s  %11.1f %11.1f  %11.0f %11.0f  %6.3f  (pairs %.3f to %.3f)\n",
				c, "mean", sp / pairs, st / pairs, sp / pairs * m, st / pairs * m, st / sp, lo, hi
		}
	}' "$RESULTS"
echo "ratio = pg_tide rate / plain INSERT rate (target >= 0.85); mean ratio = mean tide / mean plain"
echo "others = cores used by other processes during the pair's busier run (0.05-0.15 is this"
echo "benchmark's own unattributed kernel work); 'disturbed' above 0.25"
