-- Expiring messages: p_expires_at on publish, batch and schedule, its
-- refusals, and consumer groups passing expired messages.
\set VERBOSITY default
SELECT setval('tide.tide_outbox_messages_id_seq', 1, false) \g /dev/null
\i test/sql/include/try.sql

SELECT tide.outbox_create('exp');
SELECT tide.create_consumer_group('exp_readers', 'exp');
SELECT tide.outbox_create('exp2');
SELECT tide.create_consumer_group('exp2_readers', 'exp2');

-- refused, with nothing written: already expired at the publish, or not after deliver_at
SELECT pg_temp.try($$SELECT tide.outbox_publish('exp', '{}', p_expires_at => clock_timestamp() - interval '1 second')$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish('exp', '{}', p_expires_at => '-infinity')$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish('exp', '{}', NULL, 'key-1', now() - interval '1 hour')$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish_batch('exp', ARRAY['{}', '{}']::jsonb[], p_expires_at => now() - interval '1 minute')$$);
SELECT pg_temp.try($$SELECT tide.outbox_schedule('exp', '{}', p_deliver_at => now() + interval '1 hour', p_expires_at => now() + interval '1 hour')$$);
SELECT pg_temp.try($$SELECT tide.outbox_schedule('exp', '{}', p_deliver_at => now() + interval '1 hour', p_expires_at => now() + interval '1 minute')$$);
SELECT pg_temp.try($$SELECT tide.outbox_schedule('exp', '{}', p_deliver_at => now() - interval '1 hour', p_expires_at => now() - interval '1 minute')$$);
SELECT count(*) AS messages FROM tide.tide_outbox_messages;
SELECT count(*) AS scheduled FROM tide.outbox_scheduled;
SELECT count(*) AS keys FROM tide.outbox_idempotency_keys;

-- 'exp': a, b (expires soon), c (expires in an hour), d (expires soon)
SELECT tide.outbox_publish('exp', '{"n": "a"}');
SELECT tide.outbox_publish('exp', '{"n": "b"}', p_expires_at => clock_timestamp() + interval '500 ms');
SELECT tide.outbox_publish('exp', '{"n": "c"}', p_expires_at => clock_timestamp() + interval '1 hour');
SELECT tide.outbox_publish('exp', '{"n": "d"}', p_expires_at => clock_timestamp() + interval '500 ms');
-- 'exp2': a batch that expires soon, and a schedule due now that expires soon
SELECT tide.outbox_publish_batch('exp2', ARRAY['{"n": "e1"}', '{"n": "e2"}', '{"n": "e3"}']::jsonb[],
								 p_expires_at => clock_timestamp() + interval '500 ms');
SELECT tide.outbox_schedule('exp2', '{"n": "s"}', p_deliver_at => now(),
							p_expires_at => clock_timestamp() + interval '500 ms') > 0 AS scheduled;
SELECT payload ->> 'n' AS n, expires_at IS NOT NULL AS expires FROM tide.tide_outbox_messages ORDER BY id;
SELECT pg_sleep(0.7);

-- the poll returns a and c; b and d expired and are counted once
SELECT id, payload ->> 'n' AS n FROM tide.poll_outbox('exp_readers', 'c1', 4);
SELECT committed_offset, expired FROM tide.consumer_lag WHERE group_name = 'exp_readers';
-- committing c leaves d in the lease: the next poll passes it, commits it, returns nothing
SELECT tide.commit_offset('exp_readers', 'c1', 3);
SELECT count(*) AS polled FROM tide.poll_outbox('exp_readers', 'c1', 4);
SELECT committed_offset, expired, active_leases FROM tide.consumer_lag WHERE group_name = 'exp_readers';
SELECT tide.outbox_publish('exp', '{"n": "f"}');
SELECT id, payload ->> 'n' AS n FROM tide.poll_outbox('exp_readers', 'c1', 4);

-- a scheduled message past its expiry at its move is still moved, then expires
SELECT tide.outbox_release_due('exp2');
SELECT count(*) AS refused FROM tide.outbox_scheduled WHERE refused_at IS NOT NULL;
SELECT tide.outbox_publish('exp2', '{"n": "g"}');
-- a first batch that all expired is passed and committed by the poll, which polls on
SELECT id, payload ->> 'n' AS n FROM tide.poll_outbox('exp2_readers', 'c1', 3);
SELECT committed_offset, expired FROM tide.consumer_lag WHERE group_name = 'exp2_readers';
SELECT consumer_id, expired FROM tide.tide_consumer_offsets ORDER BY group_name, consumer_id;

-- the expiry as given, through every INSERT: one and a batch, READ COMMITTED and REPEATABLE READ
SELECT tide.outbox_publish('exp', '{"n": "rc"}', p_expires_at => '2100-01-01 00:00:00+00') > 0 AS published;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT tide.outbox_publish('exp', '{"n": "rr"}', p_expires_at => '2100-01-02 00:00:00+00') > 0 AS published;
SELECT tide.outbox_publish_batch('exp', ARRAY['{"n": "rr2"}']::jsonb[], p_expires_at => '2100-01-03 00:00:00+00');
COMMIT;
SELECT payload ->> 'n' AS n, expires_at AT TIME ZONE 'UTC' AS expires_at_utc FROM tide.tide_outbox_messages
 WHERE payload ->> 'n' IN ('rc', 'rr', 'rr2') ORDER BY id;

SELECT tide.outbox_drop('exp');
SELECT tide.outbox_drop('exp2');
