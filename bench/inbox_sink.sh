#!/usr/bin/env bash
# Outbox to an inbox of the same database: how many messages per second an
# inbox pipeline (sink type "inbox", docs/sinks/inbox.md) writes into its
# inbox, beside a plain INSERT ... SELECT of the same rows into an inbox
# table in batches of the same size, each batch its own transaction, in
# the same round. See bench/README.md.
#
# Relay side: N messages (the payload and headers of bench/payload.sql) are
# published while the pipeline is disabled; one transaction enables it and
# wakes the worker; the rate is N divided by the time from that commit to
# the recording of the last message (tide.relay_consumer_offsets.updated_at,
# which commits with the inbox rows). Plain side: a procedure copies the
# same N messages from tide.tide_outbox_messages into another inbox's table
# with the columns the relay writes (event_id 'outbox_<outbox>:<id>', the
# source, the payload and headers), BATCH_SIZE rows per
# INSERT ... SELECT ... ON CONFLICT (event_id) DO NOTHING and a COMMIT after
# each; the rate is N divided by the procedure's time. Both inboxes are
# emptied, vacuumed and checkpointed before each side's run; the two sides
# alternate which goes first from round to round.
#
# Run as root. pg_tide must already be built and installed (run
# test/demo.sh or test/run-tests.sh first); this script builds nothing. It
# starts its own throwaway cluster in /tmp/pg_tide_bench_inbox_sink on port
# 5494 and stops it at the end (KEEP_CLUSTER=1 leaves it running).
#
# Settings from the environment:
#   N           messages per run (default 100000)
#   BATCH_SIZE  the pipeline's batch_size and the plain side's rows per
#               transaction (default 1000, the inbox sink's default; at
#               most 1000)
#   REPEATS     rounds (default 3); each figure is the median of the rounds
#   TIDE_CLUSTER, TIDE_PORT, PG_CONFIG  another cluster directory, port or
#               PostgreSQL (see test/lib.sh)
# With the defaults it runs for about 2 minutes. bench/suite.sh runs it and
# bench/report.sh writes its figures into RESULTS.md ("Outbox to a local
# inbox"; targets: at least 0.5 of the plain side and 20,000 msg/s).
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIDE_CLUSTER=${TIDE_CLUSTER:-/tmp/pg_tide_bench_inbox_sink}
export TIDE_PORT=${TIDE_PORT:-5494}
# shellcheck source=lib.sh
source "$BENCH_DIR/lib.sh"
bench_relay_settings

tide_start_cluster
"$PG_BIN/createdb" "$DB"

log "creating pg_tide, the outbox, the two inboxes and the pipeline"
psql_db -f "$BENCH_DIR/payload.sql" >/dev/null
psql_db >/dev/null <<SQL
CREATE EXTENSION pg_tide;
SELECT tide.outbox_create('bench');
SELECT tide.inbox_create('relayed');
SELECT tide.inbox_create('plain');
SELECT tide.relay_set_outbox('to_inbox', 'bench', 'to_inbox',
	'{"sink_type": "inbox", "inbox": "relayed", "batch_size": $BATCH_SIZE}');
SELECT tide.relay_disable('to_inbox');
-- An enabled row that the relay passes over (written with triggers off, as
-- test/perl/PgTide/TestNode.pm's keep_relay_worker does) keeps the
-- database's worker running, so that a run measures the relay, not a
-- worker's start; a valid idle pipeline would be looked at every turn.
SET session_replication_role = replica;
INSERT INTO tide.relay_outbox_config (name, config) VALUES ('keep_worker', '{}');
RESET session_replication_role;
SELECT tide._relay_wake_worker();
-- CPU seconds a process of the server has used (utime + stime of /proc).
CREATE FUNCTION bench.cpu_seconds(p int) RETURNS float8 LANGUAGE sql AS \$\$
	SELECT (split_part(s, ' ', 12)::bigint + split_part(s, ' ', 13)::bigint)::float8 / $(getconf CLK_TCK)
	  FROM substring(pg_read_file('/proc/' || p || '/stat') FROM '\) (.*)\$') s
\$\$;
-- The plain side: the rows the relay writes, from the outbox's table,
-- batch rows per transaction.
CREATE PROCEDURE bench.plain_copy(first bigint, last bigint, batch int)
LANGUAGE plpgsql AS \$\$
DECLARE
	lo bigint := first - 1;
BEGIN
	WHILE lo < last LOOP
		INSERT INTO tide.plain_inbox (event_id, source, payload, headers)
		SELECT 'outbox_bench:' || m.id, 'plain', m.payload, m.headers
		  FROM tide.tide_outbox_messages m
		 WHERE m.outbox_name = 'bench' AND m.id > lo AND m.id <= least(lo + batch, last)
		 ORDER BY m.id
		ON CONFLICT (event_id) DO NOTHING;
		COMMIT;
		lo := lo + batch;
	END LOOP;
END
\$\$;
SQL

# Empties both inboxes, vacuums and checkpoints, so each run starts alike.
reset_inboxes() {
	psql_db -c "TRUNCATE tide.relayed_inbox, tide.plain_inbox" \
		-c "VACUUM ANALYZE tide.relayed_inbox, tide.plain_inbox, tide.tide_outbox_messages" \
		-c "CHECKPOINT" >/dev/null
}

# relay_side: "<msg/s> <worker CPU microseconds per message>" of the
# relay for the round's messages.
relay_side() {
	local start end rows wpid cpu0 cpu1
	reset_inboxes
	wpid=$(scalar "SELECT pid FROM tide.relay_workers() WHERE database = '$DB'")
	[ -n "$wpid" ] || { echo "inbox_sink.sh: the database has no relay worker" >&2; tide_show_server_log; exit 1; }
	cpu0=$(scalar "SELECT bench.cpu_seconds($wpid)")
	start=$(bench_enable_timed to_inbox)
	end=$(bench_wait_recorded to_inbox "$LAST") || exit 1
	cpu1=$(scalar "SELECT bench.cpu_seconds($wpid)")
	psql_db -c "SELECT tide.relay_disable('to_inbox')" >/dev/null
	rows=$(scalar "SELECT count(*) FROM tide.relayed_inbox")
	[ "$rows" -eq "$N" ] || { echo "inbox_sink.sh: the relay wrote $rows rows, not $N" >&2; exit 1; }
	awk "BEGIN { printf \"%.0f %.2f\", $N / ($end - $start), ($cpu1 - $cpu0) * 1e6 / $N }"
}

# plain_side: "<msg/s> <backend CPU microseconds per message>" of the plain
# copy for the round's messages.
plain_side() {
	local out rows
	reset_inboxes
	out=$(psql_db -A -t <<SQL | tail -n 1
SELECT extract(epoch FROM clock_timestamp()) AS t0, bench.cpu_seconds(pg_backend_pid()) AS c0 \gset
CALL bench.plain_copy($FIRST, $LAST, $BATCH_SIZE);
SELECT $N / (extract(epoch FROM clock_timestamp()) - :t0), bench.cpu_seconds(pg_backend_pid()) - :c0;
SQL
)
	rows=$(scalar "SELECT count(*) FROM tide.plain_inbox")
	[ "$rows" -eq "$N" ] || { echo "inbox_sink.sh: the plain copy wrote $rows rows, not $N" >&2; exit 1; }
	awk -F'|' "BEGIN { } { printf \"%.0f %.2f\", \$1, \$2 * 1e6 / $N }" <<<"$out"
}

scalar "SELECT version()"
log "$N messages a run, batches of $BATCH_SIZE, $REPEATS rounds"
for round in $(seq 1 "$REPEATS"); do
	# A new backlog each round, after the last round's (which the pipeline's
	# consumer has passed), published as bench/relay.sh publishes its own.
	FIRST=$(($(scalar "SELECT coalesce(max(id), 0) FROM tide.tide_outbox_messages") + 1))
	bench_publish bench "$N"
	LAST=$(scalar "SELECT max(id) FROM tide.tide_outbox_messages")
	[ $((LAST - FIRST + 1)) -eq "$N" ] ||
		{ echo "inbox_sink.sh: the backlog's ids are not consecutive" >&2; exit 1; }
	if [ $((round % 2)) -eq 1 ]; then
		read -r relay relay_cpu <<<"$(relay_side)"; read -r plain plain_cpu <<<"$(plain_side)"
	else
		read -r plain plain_cpu <<<"$(plain_side)"; read -r relay relay_cpu <<<"$(relay_side)"
	fi
	ratio=$(awk "BEGIN { printf \"%.3f\", $relay / $plain }")
	printf '  round %s: relay %s msg/s (worker %s us CPU/msg), plain INSERT ... SELECT %s msg/s (%s us CPU/msg), ratio %s\n' \
		"$round" "$relay" "$relay_cpu" "$plain" "$plain_cpu" "$ratio"
	bench_record inbox_sink relay "$round" "$relay"
	bench_record inbox_sink plain "$round" "$plain"
	bench_record inbox_sink relay_per_plain "$round" "$ratio"
	bench_record inbox_sink_cpu_us relay "$round" "$relay_cpu"
	bench_record inbox_sink_cpu_us plain "$round" "$plain_cpu"
done
bench_summary
