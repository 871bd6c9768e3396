#!/usr/bin/env bash
# Consumer throughput: messages per second taken and acknowledged in
# batches of 100 by pgbench clients of one consumer group, through
# tide.poll_outbox(..., p_commit_upto) (one call and one transaction per
# batch: side tide_one_call) and through tide.poll_outbox() then
# tide.commit_offset() (two: side tide), against a plain SKIP LOCKED
# queue in SQL (select ... for update skip locked, delete) and against
# PgQ (next_batch, get_batch_events, finish_batch; Debian's
# postgresql-15-pgq3). See bench/README.md.
#
# Each run first fills the queue with N messages (PgQ with a tick every 100
# events, so that its batches hold 100 like the others), then pgbench
# clients drain exactly N in transactions of 100; the rate is N / pgbench's
# time, and the script checks that every message was taken. PgQ runs with
# one client only: a PgQ consumer takes its batches one after another.
# A one-call consumer acknowledges a batch in its next call, so each of its
# clients runs one transaction more (timed); the last batch of each client,
# at most one per client, is acknowledged after the timed run.
#
# Run as root. pg_tide must already be built and installed; PgQ is
# installed from Debian when missing. Throwaway cluster in
# /tmp/pg_tide_bench_consume on port 5494 (KEEP_CLUSTER=1 leaves it;
# BENCH_CLUSTER and BENCH_PORT choose others).
#
# Settings from the environment:
#   N         messages per run (default 100000)
#   REPEATS   rounds (default 3)
#   CLIENT_COUNTS  pgbench clients (default "1 4")
# With the defaults it runs for about 2 minutes.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIDE_CLUSTER=${BENCH_CLUSTER:-/tmp/pg_tide_bench_consume}
export TIDE_PORT=${BENCH_PORT:-5494}
BENCH_NAME=consume.sh
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"

# The NOTICE of drop_consumer_group on a missing group is expected.
export PGOPTIONS="-c client_min_messages=warning"

N=${N:-100000}
REPEATS=${REPEATS:-3}
CLIENT_COUNTS=${CLIENT_COUNTS:-1 4}

bench_need_packages postgresql-15-pgq3
tide_start_cluster
"$PG_BIN/createdb" "$DB"
psql_db >/dev/null <<'SQL'
CREATE EXTENSION pg_tide;
CREATE EXTENSION pgq;
SELECT tide.outbox_create('bench', p_inline_threshold => 2000000000);
CREATE SCHEMA bench;
-- The messages of every side: the payload and headers of bench/tide_single.sql.
CREATE FUNCTION bench.payload(i bigint) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('event', 'order.created',
		'order_id', 10000000 + i, 'customer_id', 100000 + i % 900000,
		'amount_cents', 100 + i % 99900, 'currency', 'EUR', 'items', 3,
		'sku', 'SKU-' || lpad(((10000000 + i) % 100000000)::text, 8, '0'),
		'created_at', now())
$$;
CREATE FUNCTION bench.headers(i bigint) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('trace_id', md5((10000000 + i)::text),
		'source', 'checkout-service', 'content_type', 'application/json')
$$;
-- The SKIP LOCKED queue: the message table's columns, a bigint key.
CREATE TABLE bench.queue (
	id			bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	payload		jsonb NOT NULL,
	headers		jsonb,
	created_at	timestamptz NOT NULL DEFAULT now()
);
SQL

# fill <side>: N messages into the side's queue, 10,000 per transaction (PgQ
# 100 per transaction, each followed by a tick).
fill() {
	case $1 in
	tide | tide_one_call) psql_db -c "SELECT tide.drop_consumer_group('bench', true)" \
		-c "TRUNCATE tide.tide_outbox_messages" \
		-c "SELECT tide.create_consumer_group('bench', 'bench')" >/dev/null
		bench_publish bench "$N"
		;;
	skip_locked) psql_db -c "TRUNCATE bench.queue" >/dev/null
		psql_db -c "INSERT INTO bench.queue (payload, headers)
			SELECT bench.payload(i), bench.headers(i / 10000) FROM generate_series(0, $N - 1) i" >/dev/null
		;;
	pgq) psql_db -c "SELECT pgq.drop_queue('bench', true) FROM pgq.queue WHERE queue_name = 'bench'" \
		-c "SELECT pgq.create_queue('bench')" \
		-c "SELECT pgq.set_queue_config('bench', 'ticker_max_count', '100')" \
		-c "SELECT pgq.register_consumer('bench', 'c')" >/dev/null
		psql_db >/dev/null <<SQL
DO \$\$
BEGIN
	FOR c IN 0 .. ($N - 1) / 100 LOOP
		PERFORM pgq.insert_event('bench', 'order.created', bench.payload(i)::text,
								 bench.headers(i / 10000)::text, NULL, NULL, NULL)
		   FROM generate_series(c * 100::bigint, least(c * 100 + 99, $N - 1)) i;
		COMMIT;
		PERFORM pgq.ticker('bench');
		COMMIT;
	END LOOP;
	-- a last tick for events the count-based ticker left behind
	PERFORM pgq.force_tick('bench');
	COMMIT;
	PERFORM pgq.ticker('bench');
END
\$\$;
SQL
		;;
	esac
	psql_db -c "VACUUM ANALYZE" -c "CHECKPOINT" >/dev/null
}

# left <side>: messages not yet taken.
left() {
	case $1 in
	tide | tide_one_call) psql_db -A -t -c "SELECT count(*) FROM tide.tide_outbox_messages
		WHERE id > (SELECT coalesce(max(committed_offset), 0) FROM tide.tide_consumer_offsets WHERE group_name = 'bench')" ;;
	skip_locked) psql_db -A -t -c "SELECT count(*) FROM bench.queue" ;;
	pgq) psql_db -A -t -c "SELECT pending_events FROM pgq.get_consumer_info('bench', 'c')" ;;
	esac
}

# run <side> <clients> <round>
run() {
	local side=$1 clients=$2 round=$3 out tps rest xacts
	out=$TIDE_CLUSTER/pgbench_${side}_${clients}_${round}.log
	fill "$side"
	# Transactions of 100: N / 100 in all, shared among the clients; for
	# PgQ one per tick; one more per client for the one-call consumer,
	# whose last call acknowledges its last batch.
	xacts=$(( (N / 100 + clients - 1) / clients ))
	[ "$side" = tide_one_call ] && xacts=$(( xacts + 1 ))
	[ "$side" = pgq ] && xacts=$(psql_db -A -t -c "SELECT q.last_tick_id - c.last_tick
		FROM pgq.get_queue_info('bench') q, pgq.get_consumer_info('bench', 'c') c")
	"$PGBENCH" -n -M prepared -c "$clients" -j "$(( clients < 2 ? clients : 2 ))" -t "$xacts" -D last=0 \
		-f "$BENCH_DIR/${side}_consume.sql" "$DB" >"$out" 2>&1 ||
		{ cat "$out"; tide_show_server_log; exit 1; }
	# Time is taken over all N: N messages taken, every one acknowledged
	# but at most one batch per client (its consumer's next call would).
	tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' "$out")
	[ "$side" = tide_one_call ] && tps=$(awk "BEGIN { print $tps * ($N / 100) / ($xacts * $clients) }") &&
		psql_db -c "SELECT tide.commit_offset(group_name, consumer_id, lease_end)
			FROM tide.tide_consumer_leases WHERE group_name = 'bench'" >/dev/null
	rest=$(left "$side")
	if [ "$rest" != 0 ]; then
		echo "consume.sh: $side with $clients clients left $rest of $N messages" >&2
		exit 1
	fi
	bench_record "consume_x$clients" "$side" "$round" "$(awk "BEGIN { print $tps * 100 }")"
	printf '  round %s  %-12s %d clients  %10.0f msg/s\n' "$round" "$side" "$clients" "$(awk "BEGIN { print $tps * 100 }")"
}

log "$REPEATS rounds of $N messages per run; $CLIENT_COUNTS clients"
for round in $(seq 1 "$REPEATS"); do
	for clients in $CLIENT_COUNTS; do
		for side in skip_locked tide_one_call tide pgq; do
			[ "$side" = pgq ] && [ "$clients" -ne 1 ] && continue
			run "$side" "$clients" "$round"
		done
	done
done
bench_summary
