-- Scheduled messages: schedule, unschedule, the move, bad input.
\set VERBOSITY default
SELECT setval('tide.tide_outbox_messages_id_seq', 1, false) \g /dev/null
SELECT setval('tide.outbox_scheduled_id_seq', 1, false) \g /dev/null
\i test/sql/include/try.sql

SELECT tide.outbox_create('later');
SELECT tide.create_consumer_group('later_readers', 'later');

-- a schedule is not a message: nothing in the outbox, nothing to poll
SELECT tide.outbox_schedule('later', '{"n": 1}', p_deliver_at => now() + interval '1 hour');
SELECT tide.outbox_schedule('later', '{"n": 2}', '{"type": "t"}', now() - interval '1 second');
SELECT tide.outbox_schedule('later', '{"n": 3}', p_deliver_at => '-infinity');
SELECT id, outbox_name, payload, headers, scheduled_by::text = current_user AS by_me, deliver_at > now() AS in_future
  FROM tide.outbox_scheduled ORDER BY id;
SELECT count(*) AS messages FROM tide.tide_outbox_messages;
SELECT count(*) AS polled FROM tide.poll_outbox('later_readers', 'c1');

-- the move publishes what is due, in deliver_at order, and keeps the rest
SELECT tide.outbox_publish('later', '{"n": 0}');
SELECT tide.outbox_release_due();
SELECT tide.outbox_release_due('later');
SELECT id, payload, headers FROM tide.tide_outbox_messages ORDER BY id;
SELECT id, payload FROM tide.outbox_scheduled ORDER BY id;
SELECT id, payload FROM tide.poll_outbox('later_readers', 'c1') ORDER BY id;

-- unschedule: true once, false after, false for another outbox's id
SELECT tide.outbox_create('other');
SELECT tide.outbox_unschedule('other', 1);
SELECT tide.outbox_unschedule('later', 1);
SELECT tide.outbox_unschedule('later', 1);
SELECT tide.outbox_unschedule('later', 2);
SELECT count(*) AS scheduled_left FROM tide.outbox_scheduled;

-- p_limit moves at most that many
SELECT tide.outbox_schedule('later', jsonb_build_object('n', 10 + i), p_deliver_at => now() - i * interval '1 second')
  FROM generate_series(1, 3) i \g /dev/null
SELECT tide.outbox_release_due('later', 2);
SELECT payload FROM tide.tide_outbox_messages WHERE id > 3 ORDER BY id;
SELECT tide.outbox_release_due('later', 2);

-- a disabled outbox's rows wait; enabled again, they move
SELECT tide.outbox_schedule('other', '{"n": 20}', p_deliver_at => now());
SELECT tide.outbox_disable('other');
SELECT tide.outbox_release_due();
SELECT count(*) AS still_scheduled FROM tide.outbox_scheduled WHERE outbox_name = 'other';
SELECT tide.outbox_enable('other');
SELECT tide.outbox_release_due();

-- an outbox that backpressure refuses keeps its rows; the others move
SELECT tide.outbox_create('full', p_inline_threshold => 1);
SELECT tide.create_consumer_group('full_readers', 'full');
SELECT tide.outbox_publish('full', '{"n": 40}') > 0 AS published;
SELECT tide.outbox_schedule('full', '{"n": 41}', p_deliver_at => now() - interval '1 second') > 0 AS scheduled;
SELECT tide.outbox_schedule('other', '{"n": 42}', p_deliver_at => now()) > 0 AS scheduled;
SELECT tide.outbox_release_due();
SELECT outbox_name, payload FROM tide.outbox_scheduled ORDER BY id;
SELECT outbox_name, payload FROM tide.tide_outbox_messages WHERE payload->>'n' IN ('40', '41', '42') ORDER BY id;
SELECT tide.outbox_set_threshold('full', NULL);
SELECT tide.outbox_release_due();
SELECT count(*) AS scheduled_left FROM tide.outbox_scheduled;
SELECT tide.outbox_drop('full');

-- bad input: an error with its SQLSTATE and hint, nothing written
SELECT pg_temp.try($$SELECT tide.outbox_schedule('nope', '{}', p_deliver_at => now())$$);
SELECT pg_temp.try($$SELECT tide.outbox_schedule(NULL, '{}', p_deliver_at => now())$$);
SELECT pg_temp.try($$SELECT tide.outbox_schedule('', '{}', p_deliver_at => now())$$);
SELECT pg_temp.try($$SELECT tide.outbox_schedule('later', NULL, p_deliver_at => now())$$);
SELECT pg_temp.try($$SELECT tide.outbox_schedule('later', '[1]', p_deliver_at => now())$$);
SELECT pg_temp.try($$SELECT tide.outbox_schedule('later', '{}', '"h"', now())$$);
SELECT pg_temp.try($$SELECT tide.outbox_schedule('later', '{}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_schedule('later', '{}', p_deliver_at => 'infinity')$$);
SET pg_tide.max_payload_bytes = 1024;
SELECT pg_temp.try($$SELECT tide.outbox_schedule('later', jsonb_build_object('x', repeat('y', 2000)), p_deliver_at => now())$$);
RESET pg_tide.max_payload_bytes;
SELECT tide.outbox_disable('later');
SELECT pg_temp.try($$SELECT tide.outbox_schedule('later', '{}', p_deliver_at => now())$$);
SELECT tide.outbox_enable('later');
SELECT pg_temp.try($$SELECT tide.outbox_unschedule('later', NULL)$$);
SELECT pg_temp.try($$SELECT tide.outbox_unschedule('', 1)$$);
SELECT pg_temp.try($$SELECT tide.outbox_release_due('')$$);
SELECT pg_temp.try($$SELECT tide.outbox_release_due(NULL, 0)$$);
SELECT count(*) AS scheduled FROM tide.outbox_scheduled;

-- rights: a publisher without the outbox's grant may not schedule or unschedule
CREATE ROLE regress_sched_app IN ROLE tide_publisher;
SELECT tide.outbox_schedule('later', '{"n": 30}', p_deliver_at => now() + interval '1 day') AS kept \gset
SET ROLE regress_sched_app;
SELECT pg_temp.try($$SELECT tide.outbox_schedule('later', '{}', p_deliver_at => now())$$);
SELECT pg_temp.try(format('SELECT tide.outbox_unschedule(%L, %s)', 'later', :kept));
SELECT pg_temp.try($$SELECT tide.outbox_release_due()$$);
RESET ROLE;
SELECT tide.outbox_grant_publish('later', 'regress_sched_app');
SET ROLE regress_sched_app;
SELECT tide.outbox_schedule('later', '{"n": 31}', p_deliver_at => now() + interval '1 day') > :kept AS scheduled;
RESET ROLE;
SELECT payload, scheduled_by::text = current_user AS by_me FROM tide.outbox_scheduled ORDER BY id;

-- dropping the outbox drops its schedules
SELECT tide.outbox_drop('later');
SELECT tide.outbox_drop('other');
SELECT count(*) AS scheduled_left FROM tide.outbox_scheduled;
DROP ROLE regress_sched_app;
