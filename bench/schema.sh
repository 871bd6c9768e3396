#!/usr/bin/env bash
# Payload schemas: publishing one 20-property message per transaction into
# an outbox whose payloads are checked against a 20-property JSON Schema
# (docs/publishing.md#payload-schemas), against the same publishing into an
# outbox without a schema, in the same rounds. The ratio with / without is
# the cost of the check (target: at least 0.8).
#
# Run as root. pg_tide must already be built and installed with the JSON
# Schema module (pg_tide-jsonschema.so). It starts its own cluster in
# /tmp/pg_tide_bench_schema on port 5493 (KEEP_CLUSTER=1 leaves it running).
#
# Settings from the environment:
#   DURATION  seconds per pgbench run (default 5)
#   REPEATS   rounds (default 7); each runs both sides back to back, in
#             turns first, and gives one ratio: the figure is the median of
#             the rounds' ratios, printed with their spread
#   CLIENTS   pgbench clients (default 2, so that the check's CPU counts
#             beside the commits' waits); threads: at most 2
#   TIDE_CLUSTER, TIDE_PORT, PG_CONFIG  as in bench/relay.sh
#
# A single round moves with whatever else the machine does (0.54 to 1.00
# over eight rounds of one client on a quiet machine): only the median of
# several rounds says something. Each run also measures the CPU time the
# cluster's processes used per message (utime and stime of the postmaster,
# its children and the children it reaped, from /proc), which moves much
# less with the machine's load: its ratio without / with is what the rate
# ratio would be with the cluster alone on the machine and bound by CPU.
# Last, the check's own cost: one backend publishes LOOP_PUBLISHES messages
# in one statement, to each outbox in turn, LOOP_TURNS times; the fastest
# turn of each side (the one least disturbed) gives its microseconds per
# publish, and their difference is the check.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIDE_CLUSTER=${TIDE_CLUSTER:-/tmp/pg_tide_bench_schema}
export TIDE_PORT=${TIDE_PORT:-5493}
BENCH_NAME=schema.sh
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"

DURATION=${DURATION:-5}
REPEATS=${REPEATS:-7}
CLIENTS=${CLIENTS:-2}
LOOP_TURNS=${LOOP_TURNS:-12}
LOOP_PUBLISHES=${LOOP_PUBLISHES:-3000}

tide_start_cluster
"$PG_BIN/createdb" "$DB"

log "creating the outboxes, one with a 20-property schema"
psql_db <<'SQL'
CREATE EXTENSION pg_tide;
-- no consumer group reads them: a threshold no run reaches
SELECT tide.outbox_create('without_schema', p_inline_threshold => 2000000000);
SELECT tide.outbox_create('with_schema', p_inline_threshold => 2000000000);
SELECT tide.outbox_set_schema('with_schema', 'order.created', '{
  "type": "object",
  "required": ["event", "order_id", "customer_id", "amount_cents", "currency", "items", "sku",
               "created_at", "channel", "country", "email"],
  "additionalProperties": false,
  "properties": {
    "event": {"const": "order.created"},
    "order_id": {"type": "integer", "minimum": 1},
    "customer_id": {"type": "integer", "minimum": 1},
    "amount_cents": {"type": "integer", "minimum": 0},
    "currency": {"type": "string", "enum": ["EUR", "USD", "GBP"]},
    "items": {"type": "integer", "minimum": 1, "maximum": 1000},
    "sku": {"type": "string", "pattern": "^SKU-[0-9]{8}$"},
    "created_at": {"type": "string", "minLength": 20},
    "channel": {"type": "string", "enum": ["web", "app", "store"]},
    "country": {"type": "string", "minLength": 2, "maxLength": 2},
    "coupon": {"type": ["string", "null"]},
    "gift": {"type": "boolean"},
    "tax_cents": {"type": "integer", "minimum": 0},
    "shipping_cents": {"type": "integer", "minimum": 0},
    "email": {"type": "string", "maxLength": 254},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 10},
    "address": {"type": "object", "required": ["city", "zip"],
                "properties": {"city": {"type": "string"}, "zip": {"type": "string"}}},
    "note": {"type": "string", "maxLength": 500},
    "priority": {"type": "integer", "minimum": 0, "maximum": 9},
    "version": {"type": "integer", "const": 1}
  }
}');
SQL
# one transaction of each side, to check that it publishes
for outbox in without_schema with_schema; do
	"$PGBENCH" -n -M prepared -c 1 -t 1 -D outbox="$outbox" -f "$BENCH_DIR/schema_publish.sql" "$DB" >/dev/null
done
psql_db -c "SELECT tide._outbox_partitions_maintain()" >/dev/null

# cluster_cpu: CPU seconds used so far by the cluster's processes, live
# and reaped (the backends of a finished pgbench run are reaped ones).
cluster_cpu() {
	local pm
	pm=$(head -n 1 "$TIDE_CLUSTER/data/postmaster.pid")
	{ cat "/proc/$pm/stat"; for c in $(ps -o pid= --ppid "$pm"); do
		cat "/proc/$c/stat" 2>/dev/null || true; done; } |
		awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); t += $12 + $13
			if (++n == 1) t += $14 + $15 } END { printf "%.2f\n", t / hz }'
}

# run <outbox> <round>: one pgbench run; its rate in LAST_TPS, the
# cluster's CPU microseconds per message in LAST_CPU_US.
run() {
	local outbox=$1 round=$2 out tps cpu_before cpu_after count
	out=$TIDE_CLUSTER/pgbench_${outbox}_${round}.log
	psql_db -c "TRUNCATE tide.tide_outbox_messages" -c "CHECKPOINT" >/dev/null
	cpu_before=$(cluster_cpu)
	"$PGBENCH" -n -M prepared -c "$CLIENTS" -j "$(( CLIENTS < 2 ? CLIENTS : 2 ))" -T "$DURATION" \
		-D outbox="$outbox" -f "$BENCH_DIR/schema_publish.sql" "$DB" >"$out" 2>&1 ||
		{ cat "$out"; tide_show_server_log; exit 1; }
	sleep 1    # the run's backends reaped
	cpu_after=$(cluster_cpu)
	tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' "$out")
	count=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*$/\1/p' "$out")
	LAST_CPU_US=$(awk "BEGIN { printf \"%.1f\", ($cpu_after - $cpu_before) * 1000000 / $count }")
	bench_record publish_schema "$outbox" "$round" "$tps"
	bench_record publish_schema_cpu_us "$outbox" "$round" "$LAST_CPU_US"
	printf '  round %s  %-15s %10.0f msg/s  %7.1f us CPU/msg\n' "$round" "$outbox" "$tps" "$LAST_CPU_US"
	LAST_TPS=$tps
}

# ratio_summary <name> <ratios...>: their median, middle half and range,
# and how many reach the target.
ratio_summary() {
	local name=$1
	shift
	printf '%s\n' "$@" | sort -g | awk -v target=0.8 -v name="$name" '
		{ r[NR] = $1; met += ($1 >= target) }
		END {
			med = NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2
			q1 = r[int((NR + 3) / 4)]; q3 = r[NR + 1 - int((NR + 3) / 4)]
			printf "%s: median %.3f, middle half %.3f to %.3f, all %.3f to %.3f; %d of %d rounds at least %.1f\n",
				name, med, q1, q3, r[1], r[NR], met, NR, target
		}'
}

log "pgbench: ${DURATION}s per run, $REPEATS rounds, $CLIENTS clients"
ratios=()
cpu_ratios=()
for round in $(seq 1 "$REPEATS"); do
	if [ $((round % 2)) -eq 1 ]; then order="without_schema with_schema"; else order="with_schema without_schema"; fi
	declare -A rate=() cpu=()
	for outbox in $order; do
		run "$outbox" "$round"
		rate[$outbox]=$LAST_TPS
		cpu[$outbox]=$LAST_CPU_US
	done
	ratio=$(awk "BEGIN { printf \"%.3f\", ${rate[with_schema]} / ${rate[without_schema]} }")
	cpu_ratio=$(awk "BEGIN { printf \"%.3f\", ${cpu[without_schema]} / ${cpu[with_schema]} }")
	bench_record publish_schema_ratio with_over_without "$round" "$ratio"
	bench_record publish_schema_cpu_ratio without_over_with "$round" "$cpu_ratio"
	printf '  round %s  ratio with / without schema: %s (CPU per message, without / with: %s)\n' \
		"$round" "$ratio" "$cpu_ratio"
	ratios+=("$ratio")
	cpu_ratios+=("$cpu_ratio")
done
bench_summary
ratio_summary "ratio with / without schema" "${ratios[@]}"
ratio_summary "CPU per message, without / with" "${cpu_ratios[@]}"

log "the check's own cost: $LOOP_TURNS turns of $LOOP_PUBLISHES publishes a side in one backend"
psql_db -c "TRUNCATE tide.tide_outbox_messages" >/dev/null
psql_db -A -t -F ' ' <<SQL | while read -r side fastest median; do
CREATE FUNCTION pg_temp.publish_us(p_outbox text, p_count int) RETURNS float8
LANGUAGE plpgsql AS \$\$
DECLARE
	started timestamptz := clock_timestamp();
BEGIN
	PERFORM count(tide.outbox_publish(p_outbox,
		jsonb_build_object('event', 'order.created', 'order_id', i, 'customer_id', i,
						   'amount_cents', 1234, 'currency', 'EUR', 'items', 3,
						   'sku', 'SKU-' || lpad(i::text, 8, '0'), 'created_at', now(),
						   'channel', 'web', 'country', 'DE', 'coupon', null, 'gift', false,
						   'tax_cents', 246, 'shipping_cents', 499,
						   'email', 'customer' || i || '@example.com',
						   'tags', jsonb_build_array('new', 'promo'),
						   'address', jsonb_build_object('city', 'Berlin', 'zip', '10115'),
						   'note', 'leave at the door', 'priority', 2, 'version', 1),
		'{"type": "order.created"}'))
	  FROM generate_series(1, p_count) i;
	RETURN extract(epoch FROM clock_timestamp() - started) * 1e6 / p_count;
END
\$\$;
CREATE TEMP TABLE turns (outbox text, us float8);
DO \$\$
BEGIN
	FOR turn IN 1 .. $LOOP_TURNS LOOP
		INSERT INTO turns SELECT 'without_schema', pg_temp.publish_us('without_schema', $LOOP_PUBLISHES);
		INSERT INTO turns SELECT 'with_schema', pg_temp.publish_us('with_schema', $LOOP_PUBLISHES);
	END LOOP;
END
\$\$;
SELECT outbox, round(min(us)::numeric, 1), round((percentile_cont(0.5) WITHIN GROUP (ORDER BY us))::numeric, 1)
  FROM turns GROUP BY outbox ORDER BY outbox DESC;
SQL
	bench_record publish_loop_us "$side" 1 "$fastest"
	printf '  %-15s %6.1f us per publish in the fastest turn (median %.1f)\n' "$side" "$fastest" "$median"
done
