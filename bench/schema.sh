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
# several rounds says something.
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

# run <outbox> <round>: one pgbench run; its rate in LAST_TPS.
run() {
	local outbox=$1 round=$2 out tps
	out=$TIDE_CLUSTER/pgbench_${outbox}_${round}.log
	psql_db -c "TRUNCATE tide.tide_outbox_messages" -c "CHECKPOINT" >/dev/null
	"$PGBENCH" -n -M prepared -c "$CLIENTS" -j "$(( CLIENTS < 2 ? CLIENTS : 2 ))" -T "$DURATION" \
		-D outbox="$outbox" -f "$BENCH_DIR/schema_publish.sql" "$DB" >"$out" 2>&1 ||
		{ cat "$out"; tide_show_server_log; exit 1; }
	tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' "$out")
	bench_record publish_schema "$outbox" "$round" "$tps"
	printf '  round %s  %-15s %10.0f msg/s\n' "$round" "$outbox" "$tps"
	LAST_TPS=$tps
}

log "pgbench: ${DURATION}s per run, $REPEATS rounds, $CLIENTS clients"
ratios=()
for round in $(seq 1 "$REPEATS"); do
	if [ $((round % 2)) -eq 1 ]; then order="without_schema with_schema"; else order="with_schema without_schema"; fi
	declare -A rate=()
	for outbox in $order; do
		run "$outbox" "$round"
		rate[$outbox]=$LAST_TPS
	done
	ratio=$(awk "BEGIN { printf \"%.3f\", ${rate[with_schema]} / ${rate[without_schema]} }")
	bench_record publish_schema_ratio with_over_without "$round" "$ratio"
	printf '  round %s  ratio with / without schema: %s\n' "$round" "$ratio"
	ratios+=("$ratio")
done
bench_summary
printf '%s\n' "${ratios[@]}" | sort -g | awk -v target=0.8 '
	{ r[NR] = $1; met += ($1 >= target) }
	END {
		med = NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2
		q1 = r[int((NR + 3) / 4)]; q3 = r[NR + 1 - int((NR + 3) / 4)]
		printf "ratio with / without schema: median %.3f, middle half %.3f to %.3f, all %.3f to %.3f; %d of %d rounds at least %.1f\n",
			med, q1, q3, r[1], r[NR], met, NR, target
	}'
