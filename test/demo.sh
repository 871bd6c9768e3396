#!/usr/bin/env bash
# Quick start: installs what is missing, builds and installs pg_tide, starts
# a throwaway cluster with pg_tide preloaded, and shows messages published in
# the application's own transactions, consumed by two consumer groups, and
# delivered by the relay to a webhook receiver on this machine.
# Run as root on Debian 12: test/demo.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

tide_install_packages
tide_build_install
tide_start_cluster

log "demo"
"$PG_BIN/psql" -X -v ON_ERROR_STOP=1 -d postgres <<'SQL'
\pset footer off
\echo '-- install, one outbox, two consumer groups that each see every message'
\set QUIET on
CREATE EXTENSION pg_tide;
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL);
SELECT tide.outbox_create('orders') \g /dev/null
SELECT tide.create_consumer_group('billing', 'orders') \g /dev/null
SELECT tide.create_consumer_group('shipping', 'orders') \g /dev/null

\echo '-- the message commits with the business write ...'
BEGIN;
INSERT INTO orders VALUES (42, 'paid');
SELECT tide.outbox_publish('orders', '{"order": 42, "status": "paid"}', '{"type": "order.paid"}') AS message_id;
COMMIT;

\echo '-- ... and rolls back with it: order 43 leaves no message behind'
BEGIN;
INSERT INTO orders VALUES (43, 'paid');
SELECT tide.outbox_publish('orders', '{"order": 43, "status": "paid"}') AS message_id;
ROLLBACK;

\echo '-- many messages in one call'
SELECT tide.outbox_publish_batch('orders', ARRAY[
	'{"order": 44, "status": "paid"}', '{"order": 45, "status": "paid"}',
	'{"order": 46, "status": "paid"}']::jsonb[], '{"type": "order.paid"}') AS published;

\echo '-- two billing workers share the work: each gets its own lease'
CREATE TEMP TABLE billing_1 AS SELECT id, payload FROM tide.poll_outbox('billing', 'billing-1', 2);
CREATE TEMP TABLE billing_2 AS SELECT id, payload FROM tide.poll_outbox('billing', 'billing-2', 2);
SELECT 'billing-1' AS consumer, * FROM billing_1
UNION ALL
SELECT 'billing-2', * FROM billing_2 ORDER BY id;
\echo '-- each acknowledges the last message it processed'
SELECT tide.commit_offset('billing', 'billing-1', (SELECT max(id) FROM billing_1)) \g /dev/null
SELECT tide.commit_offset('billing', 'billing-2', (SELECT max(id) FROM billing_2)) \g /dev/null

\echo '-- shipping reads the same messages independently'
SELECT 'shipping-1' AS consumer, id, payload->>'order' AS "order", headers->>'type' AS type
  FROM tide.poll_outbox('shipping', 'shipping-1', 10);

\echo '-- where every group stands'
SELECT group_name, committed_offset, newest_id, pending FROM tide.consumer_lag ORDER BY 1;
SELECT jsonb_pretty(tide.outbox_status('orders') - 'consumer_groups') AS outbox_status;
SQL

log "delivery: the relay posts the messages to a webhook receiver on 127.0.0.1:8099"
RECEIVED=$TIDE_CLUSTER/received.jsonl
: >"$RECEIVED"
chown postgres: "$RECEIVED"
# test/receiver (test/receiver.c, libmicrohttpd) logs every request as a JSON line.
make -C "$TIDE_ROOT" -s PG_CONFIG="$PG_CONFIG" test/receiver
"$TIDE_ROOT/test/receiver" 8099 "$RECEIVED" &
RECEIVER_PID=$!
trap 'kill $RECEIVER_PID 2>/dev/null || true' EXIT
for _ in $(seq 50); do
	perl -MHTTP::Tiny -e 'exit !HTTP::Tiny->new->get("http://127.0.0.1:8099/__health")->{success}' && break
	sleep 0.1
done
# The receiver verifies the Standard Webhooks signatures with the pipeline's secret.
perl -MHTTP::Tiny -e 'exit !HTTP::Tiny->new->post("http://127.0.0.1:8099/__control",
	{content => q({"secrets": ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]})})->{success}'
"$PG_BIN/psql" -X -v ON_ERROR_STOP=1 -d postgres <<'SQL'
\pset footer off
\set QUIET on
\echo '-- a webhook pipeline from outbox orders, signed, to a receiver on this machine'
SELECT tide.relay_set_outbox('orders-webhook', 'orders', 'orders-webhook',
	'{"sink_type": "webhook", "url": "http://127.0.0.1:8099/hooks/orders",
	  "signing_secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
	  "allow_http": true, "allow_private_network": true}') \g /dev/null
\echo '-- one more order is paid: the relay is woken by the commit'
BEGIN;
INSERT INTO orders VALUES (47, 'paid');
SELECT tide.outbox_publish('orders', '{"order": 47, "status": "paid"}', '{"type": "order.paid"}') AS message_id;
COMMIT;
SQL
for _ in $(seq 100); do
	[ "$(wc -l <"$RECEIVED")" -ge 5 ] && break
	sleep 0.1
done
echo "-- what the receiver got (webhook-id, signature, whether it verified, body; up to max_in_flight requests run at once, so they may arrive out of order):"
perl -MJSON::PP -ne '
	my $r = decode_json($_);
	my $body = decode_json($r->{body});
	printf "%s %s... verified=%s %s\n", $r->{headers}{"webhook-id"},
		substr($r->{headers}{"webhook-signature"} // "", 0, 24), $r->{sig} ? "yes" : "no",
		JSON::PP->new->canonical->encode($body->{payload});' "$RECEIVED"
"$PG_BIN/psql" -X -d postgres -c "SELECT pipeline, enabled, last_change_id FROM tide.relay_list_configs() JOIN tide.relay_consumer_offsets ON pipeline_id = pipeline"

log "the cluster keeps running; connect with: psql -h $PGHOST -p $PGPORT -U postgres"
log "stop it with: runuser -u postgres -- $PG_BIN/pg_ctl -D $TIDE_CLUSTER/data stop"
