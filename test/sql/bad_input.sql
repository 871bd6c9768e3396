-- Bad input across the whole API: NULL in every argument that has no
-- meaning for NULL, empty, over-long and hostile names, out-of-range sizes,
-- payloads over pg_tide.max_payload_bytes, bad relay configs and hostile
-- URLs. Every call must fail with its SQLSTATE, a lower-case message and a
-- hint, and must write nothing and take no id: every table and sequence of
-- schema tide is compared before and after.
--
-- NULL is meaningful, and so not tried here, for: the headers of
-- outbox_publish, outbox_publish_batch and inbox_receive, the source of
-- inbox_receive, the error of inbox_mark_failed, the name of inbox_status
-- (all inboxes), the pipeline of relay_dlq_list (all pipelines), the
-- outbox (all) and p_older_than (retention_hours) of outbox_sweep, and the
-- payload and headers of relay_filter_matches.
\set VERBOSITY default
\i test/sql/include/try.sql
SELECT coalesce(pg_sequence_last_value('tide.tide_outbox_messages_id_seq'), 0) AS seq_before \gset

-- Objects for the calls to aim at: an outbox with messages and a consumer
-- holding a lease, a disabled outbox, an inbox with an event, a pipeline.
SELECT tide.outbox_create('bi_orders');
SELECT tide.outbox_create('bi_off');
SELECT tide.outbox_disable('bi_off');
SELECT count(tide.outbox_publish('bi_orders', jsonb_build_object('n', g))) AS published
  FROM generate_series(1, 3) g;
SELECT tide.create_consumer_group('bi_group', 'bi_orders');
SELECT count(*) AS leased FROM tide.poll_outbox('bi_group', 'bi_c1', 2);
SELECT tide.inbox_create('bi_inbox');
SELECT tide.inbox_receive('bi_inbox', 'e-1', '{"n": 1}');
SELECT tide.relay_set_outbox('bi_hook', 'bi_orders', 'bi_hook_group',
							 '{"sink_type": "webhook", "url": "https://example.com/hooks"}');

-- What "nothing was written" means: the rows of every table in schema tide
-- (count and a digest of their contents), the state of every sequence in
-- it (the message ids among them), and the relations of every schema (no
-- table was created or dropped).
CREATE FUNCTION pg_temp.catalog_state()
RETURNS TABLE (object text, state text)
LANGUAGE plpgsql AS $$
DECLARE
	r record;
BEGIN
	FOR r IN SELECT c.oid::regclass AS rel, c.relkind FROM pg_class c
			  WHERE c.relnamespace = 'tide'::regnamespace AND c.relkind IN ('r', 'S')
			  ORDER BY c.relname LOOP
		object := r.rel::text;
		IF r.relkind = 'S' THEN
			EXECUTE format('SELECT format(''last_value %%s, is_called %%s'', last_value, is_called) FROM %s',
						   r.rel) INTO state;
		ELSE
			EXECUTE format('SELECT format(''%%s rows, digest %%s'', count(*), '
						   'md5(coalesce(string_agg(t::text, ''|'' ORDER BY t::text), ''''))) FROM %s t',
						   r.rel) INTO state;
		END IF;
		RETURN NEXT;
	END LOOP;
	RETURN QUERY
		SELECT 'relations in schema ' || n.nspname, count(c.oid)::text
		  FROM pg_namespace n LEFT JOIN pg_class c ON c.relnamespace = n.oid
		 WHERE n.nspname !~ '^pg_' AND n.nspname <> 'information_schema'
		 GROUP BY n.nspname;
END
$$;
CREATE TEMP TABLE state_before AS SELECT * FROM pg_temp.catalog_state();

-- The calls, each with the SQLSTATE it must fail with.
CREATE TEMP TABLE calls (n serial, expect text, call text);

-- outboxes: names
INSERT INTO calls (expect, call) VALUES
	('22004', $c$SELECT tide.outbox_create(NULL)$c$),
	('22023', $c$SELECT tide.outbox_create('')$c$),
	('22023', $c$SELECT tide.outbox_create(repeat('x', 64))$c$),
	('22023', $c$SELECT tide.outbox_create('bi"quoted')$c$),
	('22023', $c$SELECT tide.outbox_create('bi''quoted')$c$),
	('22023', $c$SELECT tide.outbox_create('bi; DROP TABLE tide.tide_outbox_messages; --')$c$),
	('22023', $c$SELECT tide.outbox_create('bi\backslash')$c$),
	('22023', $c$SELECT tide.outbox_create(E'bi\nnewline')$c$),
	('22023', $c$SELECT tide.outbox_create('bi space')$c$),
	('22023', $c$SELECT tide.outbox_create('commandes_été')$c$),
	('22023', $c$SELECT tide.outbox_create('bi/../x')$c$),
	('22004', $c$SELECT tide.outbox_create_if_not_exists(NULL)$c$),
	('22004', $c$SELECT tide.outbox_create_if_not_exists('bi_new', NULL)$c$),
	('22023', $c$SELECT tide.outbox_create_if_not_exists('bi_new', 24, 0)$c$),
	('22004', $c$SELECT tide.outbox_drop(NULL)$c$),
	('22004', $c$SELECT tide.outbox_enable(NULL)$c$),
	('22004', $c$SELECT tide.outbox_disable(NULL)$c$),
	('22004', $c$SELECT tide.outbox_status(NULL)$c$),
	('42704', $c$SELECT tide.outbox_status('bi_missing')$c$);

-- outboxes: sizes and flags
INSERT INTO calls (expect, call) VALUES
	('22004', $c$SELECT tide.outbox_create('bi_new', NULL)$c$),
	('22023', $c$SELECT tide.outbox_create('bi_new', 0)$c$),
	('22023', $c$SELECT tide.outbox_create('bi_new', -24)$c$),
	('22023', $c$SELECT tide.outbox_create('bi_new', 2147483647)$c$),
	('22004', $c$SELECT tide.outbox_set_threshold(NULL, 5)$c$),
	('42704', $c$SELECT tide.outbox_set_threshold('bi_nope', 5)$c$),
	('22023', $c$SELECT tide.outbox_set_threshold('bi_orders', 0)$c$),
	('22004', $c$SELECT tide.outbox_drop('bi_orders', false, NULL)$c$),
	('22023', $c$SELECT tide.outbox_create('bi_new', 24, 0)$c$),
	('22023', $c$SELECT tide.outbox_create('bi_new', 24, -1)$c$),
	('22004', $c$SELECT tide.outbox_drop('bi_orders', NULL)$c$);

-- publishing
INSERT INTO calls (expect, call) VALUES
	('22004', $c$SELECT tide.outbox_publish(NULL, '{}')$c$),
	('22004', $c$SELECT tide.outbox_publish('bi_orders', NULL)$c$),
	('22023', $c$SELECT tide.outbox_publish('', '{}')$c$),
	('22023', $c$SELECT tide.outbox_publish('bi_orders"; DELETE FROM tide.tide_outbox_messages; --', '{}')$c$),
	('22023', $c$SELECT tide.outbox_publish(repeat('o', 64), '{}')$c$),
	('22023', $c$SELECT tide.outbox_publish('bi_orders', '[1, 2]')$c$),
	('22023', $c$SELECT tide.outbox_publish('bi_orders', '"text"')$c$),
	('22023', $c$SELECT tide.outbox_publish('bi_orders', '{}', '"not an object"')$c$),
	('42704', $c$SELECT tide.outbox_publish('bi_missing', '{}')$c$),
	('55000', $c$SELECT tide.outbox_publish('bi_off', '{}')$c$),
	('54000', $c$SELECT tide.outbox_publish('bi_orders', jsonb_build_object('blob', repeat('x', 100000)))$c$),
	('22004', $c$SELECT tide.outbox_publish_batch(NULL, ARRAY['{}']::jsonb[])$c$),
	('22004', $c$SELECT tide.outbox_publish_batch('bi_orders', NULL)$c$),
	('22004', $c$SELECT tide.outbox_publish_batch('bi_orders', ARRAY['{}', NULL]::jsonb[])$c$),
	('22023', $c$SELECT tide.outbox_publish_batch('bi_orders', ARRAY['{}', '1']::jsonb[])$c$),
	('22023', $c$SELECT tide.outbox_publish_batch('bi_orders', ARRAY[['{}'], ['{}']]::jsonb[])$c$),
	('22023', $c$SELECT tide.outbox_publish_batch('bi_orders', ARRAY['{}']::jsonb[], '[]')$c$),
	('54000', $c$SELECT tide.outbox_publish_batch('bi_orders', array_fill('{}'::jsonb, ARRAY[10001]))$c$),
	('54000', $c$SELECT tide.outbox_publish_batch('bi_orders', ARRAY['{}', jsonb_build_object('blob', repeat('x', 100000))])$c$);

-- consumer groups (bi_hook_group is pipeline bi_hook's: even a superuser
-- may not consume from it)
INSERT INTO calls (expect, call) VALUES
	('22004', $c$SELECT tide.create_consumer_group(NULL, 'bi_orders')$c$),
	('22004', $c$SELECT tide.create_consumer_group('bi_g2', NULL)$c$),
	('22004', $c$SELECT tide.create_consumer_group('bi_g2', 'bi_orders', NULL)$c$),
	('22004', $c$SELECT tide.create_consumer_group('bi_g2', 'bi_orders', 'earliest', NULL)$c$),
	('22023', $c$SELECT tide.create_consumer_group('bi_g2', 'bi_orders', 'newest')$c$),
	('22023', $c$SELECT tide.create_consumer_group('bi g2''; --', 'bi_orders')$c$),
	('22023', $c$SELECT tide.create_consumer_group(repeat('g', 64), 'bi_orders')$c$),
	('22004', $c$SELECT tide.drop_consumer_group(NULL)$c$),
	('22004', $c$SELECT tide.drop_consumer_group('bi_group', NULL)$c$),
	('22004', $c$SELECT * FROM tide.poll_outbox(NULL, 'bi_c2')$c$),
	('22004', $c$SELECT * FROM tide.poll_outbox('bi_group', NULL)$c$),
	('22004', $c$SELECT * FROM tide.poll_outbox('bi_group', 'bi_c2', NULL)$c$),
	('22004', $c$SELECT * FROM tide.poll_outbox('bi_group', 'bi_c2', 10, NULL)$c$),
	('22023', $c$SELECT * FROM tide.poll_outbox('bi_group', '')$c$),
	('22023', $c$SELECT * FROM tide.poll_outbox('bi_group', repeat('c', 256))$c$),
	('22023', $c$SELECT * FROM tide.poll_outbox('bi_group', 'bi_c2;1')$c$),
	('22023', $c$SELECT * FROM tide.poll_outbox('bi_group', E'bi_c2\t1')$c$),
	('22023', $c$SELECT * FROM tide.poll_outbox('bi_group', 'bi_c2', 0)$c$),
	('22023', $c$SELECT * FROM tide.poll_outbox('bi_group', 'bi_c2', -1)$c$),
	('22023', $c$SELECT * FROM tide.poll_outbox('bi_group', 'bi_c2', 10001)$c$),
	('22023', $c$SELECT * FROM tide.poll_outbox('bi_group', 'bi_c2', 2147483647)$c$),
	('22023', $c$SELECT * FROM tide.poll_outbox('bi_group', 'bi_c2', 10, 0)$c$),
	('22023', $c$SELECT * FROM tide.poll_outbox('bi_group', 'bi_c2', 10, -30)$c$),
	('22023', $c$SELECT * FROM tide.poll_outbox('bi_group', 'bi_c2', 10, 86401)$c$),
	('42704', $c$SELECT * FROM tide.poll_outbox('bi_missing', 'bi_c2')$c$),
	('42501', $c$SELECT * FROM tide.poll_outbox('bi_hook_group', 'bi_c2')$c$),
	('42501', $c$SELECT * FROM tide.poll_outbox('bi_hook_group', 'relay:bi_hook')$c$),
	('42501', $c$SELECT tide.wait_for_messages('bi_hook_group', 0)$c$),
	('42501', $c$SELECT tide.commit_offset('bi_hook_group', 'relay:bi_hook', 1)$c$),
	('42501', $c$SELECT tide.consumer_heartbeat('bi_hook_group', 'relay:bi_hook')$c$),
	('42501', $c$SELECT tide.extend_lease('bi_hook_group', 'relay:bi_hook', 10)$c$),
	('42501', $c$SELECT tide.release_lease('bi_hook_group', 'relay:bi_hook')$c$),
	('22004', $c$SELECT tide.wait_for_messages(NULL)$c$),
	('22004', $c$SELECT tide.wait_for_messages('bi_group', NULL)$c$),
	('22023', $c$SELECT tide.wait_for_messages('bi_group', -1)$c$),
	('22023', $c$SELECT tide.wait_for_messages('bi_group', 3600001)$c$),
	('22004', $c$SELECT tide.commit_offset(NULL, 'bi_c1', 1)$c$),
	('22004', $c$SELECT tide.commit_offset('bi_group', NULL, 1)$c$),
	('22004', $c$SELECT tide.commit_offset('bi_group', 'bi_c1', NULL)$c$),
	('22023', $c$SELECT tide.commit_offset('bi_group', 'bi_c1', -1)$c$),
	('22004', $c$SELECT tide.consumer_heartbeat(NULL, 'bi_c1')$c$),
	('22004', $c$SELECT tide.consumer_heartbeat('bi_group', NULL)$c$),
	('22004', $c$SELECT tide.extend_lease(NULL, 'bi_c1', 10)$c$),
	('22004', $c$SELECT tide.extend_lease('bi_group', NULL, 10)$c$),
	('22004', $c$SELECT tide.extend_lease('bi_group', 'bi_c1', NULL)$c$),
	('22023', $c$SELECT tide.extend_lease('bi_group', 'bi_c1', 0)$c$),
	('22023', $c$SELECT tide.extend_lease('bi_group', 'bi_c1', -10)$c$),
	('22023', $c$SELECT tide.extend_lease('bi_group', 'bi_c1', 86401)$c$),
	('22004', $c$SELECT tide.release_lease(NULL, 'bi_c1')$c$),
	('22004', $c$SELECT tide.release_lease('bi_group', NULL)$c$),
	('22004', $c$SELECT tide.admin_rewind_offset(NULL, 'bi_c1', 0)$c$),
	('22004', $c$SELECT tide.admin_rewind_offset('bi_group', NULL, 0)$c$),
	('22004', $c$SELECT tide.admin_rewind_offset('bi_group', 'bi_c1', NULL)$c$),
	('22004', $c$SELECT tide.admin_rewind_offset('bi_group', 'bi_c1', 0, NULL)$c$),
	('22023', $c$SELECT tide.admin_rewind_offset('bi_group', 'bi_c1', -1, true)$c$);

-- inboxes
INSERT INTO calls (expect, call) VALUES
	('22004', $c$SELECT tide.inbox_create(NULL)$c$),
	('22023', $c$SELECT tide.inbox_create('')$c$),
	('22023', $c$SELECT tide.inbox_create(repeat('i', 58))$c$),
	('22023', $c$SELECT tide.inbox_create('bi"inbox')$c$),
	('22023', $c$SELECT tide.inbox_create('bi_inbox2; DROP SCHEMA tide CASCADE')$c$),
	('22004', $c$SELECT tide.inbox_create('bi_inbox2', NULL)$c$),
	('22023', $c$SELECT tide.inbox_create('bi_inbox2', '')$c$),
	('3F000', $c$SELECT tide.inbox_create('bi_inbox2', 'tide"; DROP SCHEMA tide; --')$c$),
	('22004', $c$SELECT tide.inbox_create('bi_inbox2', 'tide', NULL)$c$),
	('22023', $c$SELECT tide.inbox_create('bi_inbox2', 'tide', 0)$c$),
	('22004', $c$SELECT tide.inbox_create('bi_inbox2', 'tide', 3, NULL)$c$),
	('22023', $c$SELECT tide.inbox_create('bi_inbox2', 'tide', 3, -1)$c$),
	('22023', $c$SELECT tide.inbox_create('bi_inbox2', 'tide', 3, 1000000)$c$),
	('22004', $c$SELECT tide.inbox_create('bi_inbox2', 'tide', 3, 72, NULL)$c$),
	('22023', $c$SELECT tide.inbox_create('bi_inbox2', 'tide', 3, 72, -1)$c$),
	('22004', $c$SELECT tide.inbox_drop(NULL)$c$),
	('22004', $c$SELECT tide.inbox_drop('bi_inbox', NULL)$c$),
	('22004', $c$SELECT tide.inbox_receive(NULL, 'e-2', '{}')$c$),
	('22004', $c$SELECT tide.inbox_receive('bi_inbox', NULL, '{}')$c$),
	('22004', $c$SELECT tide.inbox_receive('bi_inbox', 'e-2', NULL)$c$),
	('22023', $c$SELECT tide.inbox_receive('bi_inbox', '', '{}')$c$),
	('22023', $c$SELECT tide.inbox_receive('bi_inbox', repeat('e', 256), '{}')$c$),
	('22023', $c$SELECT tide.inbox_receive('bi_inbox', E'e-2\r\nX-Injected: 1', '{}')$c$),
	('22023', $c$SELECT tide.inbox_receive('bi_inbox', 'e-2', '{}', '[]')$c$),
	('54000', $c$SELECT tide.inbox_receive('bi_inbox', 'e-2', jsonb_build_object('blob', repeat('x', 100000)))$c$),
	('42704', $c$SELECT tide.inbox_receive('bi_missing', 'e-2', '{}')$c$),
	('22004', $c$SELECT tide.inbox_receive_batch(NULL, '[]')$c$),
	('22004', $c$SELECT tide.inbox_receive_batch('bi_inbox', NULL)$c$),
	('22023', $c$SELECT tide.inbox_receive_batch('bi_inbox', '{}')$c$),
	('22023', $c$SELECT tide.inbox_receive_batch('bi_inbox', '[1]')$c$),
	('22023', $c$SELECT tide.inbox_receive_batch('bi_inbox', '[{"event_id": 7, "payload": {}}]')$c$),
	('22023', $c$SELECT tide.inbox_receive_batch('bi_inbox', '[{"event_id": "e-3\r\nX: 1", "payload": {}}]')$c$),
	('22004', $c$SELECT tide.inbox_receive_batch('bi_inbox', '[{"event_id": "e-3"}]')$c$),
	('54000', $c$SELECT tide.inbox_receive_batch('bi_inbox', jsonb_build_array(jsonb_build_object('event_id', 'e-3', 'payload', jsonb_build_object('blob', repeat('x', 100000)))))$c$),
	('54000', $c$SELECT tide.inbox_receive_batch('bi_inbox', (SELECT jsonb_agg(jsonb_build_object('event_id', 'e' || i, 'payload', '{}'::jsonb)) FROM generate_series(1, 10001) i))$c$),
	('22004', $c$SELECT * FROM tide.inbox_claim(NULL)$c$),
	('22004', $c$SELECT * FROM tide.inbox_claim('bi_inbox', NULL)$c$),
	('22023', $c$SELECT * FROM tide.inbox_claim('bi_inbox', 0)$c$),
	('22023', $c$SELECT * FROM tide.inbox_claim('bi_inbox', 10001)$c$),
	('22004', $c$SELECT * FROM tide.inbox_claim('bi_inbox', 10, NULL)$c$),
	('22023', $c$SELECT * FROM tide.inbox_claim('bi_inbox', 10, 0)$c$),
	('22023', $c$SELECT * FROM tide.inbox_claim('bi_inbox', 10, 86401)$c$),
	('22004', $c$SELECT tide.inbox_mark_processed(NULL, 'e-1')$c$),
	('22004', $c$SELECT tide.inbox_mark_processed('bi_inbox', NULL)$c$),
	('22004', $c$SELECT tide.inbox_mark_failed(NULL, 'e-1', 'boom')$c$),
	('22004', $c$SELECT tide.inbox_mark_failed('bi_inbox', NULL, 'boom')$c$),
	('22004', $c$SELECT tide.inbox_process(NULL, 'tide.inbox_dlq'::regproc)$c$),
	('22004', $c$SELECT tide.inbox_process('bi_inbox', NULL)$c$),
	('22004', $c$SELECT tide.inbox_process('bi_inbox', 'tide.inbox_dlq'::regproc, NULL)$c$),
	('22023', $c$SELECT tide.inbox_process('bi_inbox', 'tide.inbox_dlq'::regproc, 0)$c$),
	('22023', $c$SELECT tide.inbox_process('bi_inbox', 'tide.inbox_dlq'::regproc)$c$),
	('22004', $c$SELECT * FROM tide.inbox_dlq(NULL)$c$),
	('22004', $c$SELECT tide.replay_inbox_messages(NULL, ARRAY['e-1'])$c$),
	('22004', $c$SELECT tide.replay_inbox_messages('bi_inbox', NULL)$c$),
	('22023', $c$SELECT tide.inbox_status('bi_inbox;')$c$),
	('22004', $c$SELECT tide.inbox_truncate_processed(NULL)$c$);

-- relay pipelines: arguments and configs of the wrong type or with unknown keys
INSERT INTO calls (expect, call) VALUES
	('22004', $c$SELECT tide.relay_set_outbox(NULL, 'bi_orders', 'bi_g3', '{"sink_type": "webhook", "url": "https://example.com/"}')$c$),
	('22004', $c$SELECT tide.relay_set_outbox('bi_p', NULL, 'bi_g3', '{"sink_type": "webhook", "url": "https://example.com/"}')$c$),
	('22004', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', NULL, '{"sink_type": "webhook", "url": "https://example.com/"}')$c$),
	('22004', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', NULL)$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi p', 'bi_orders', 'bi_g3', '{"sink_type": "webhook", "url": "https://example.com/"}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '[]')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"url": "https://example.com/"}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "sqs", "url": "https://example.com/"}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "webhook", "urll": "https://example.com/"}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "webhook", "url": "https://example.com/", "retry": {"jitter": 1}}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "webhook", "url": 443}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "webhook", "url": "https://example.com/", "batch_size": "10"}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "webhook", "url": "https://example.com/", "batch_size": 0}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "webhook", "url": "https://example.com/", "batch_size": 1000000}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "webhook", "url": "https://example.com/", "timeout_ms": -1}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "webhook", "url": "https://example.com/", "max_in_flight": 1.5}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "webhook", "url": "https://example.com/", "allow_http": "yes"}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "webhook", "url": "https://example.com/", "headers": ["X-A: 1"]}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "webhook", "url": "https://example.com/", "headers": {"X-A": "1\r\nX-Injected: 1"}}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "webhook", "url": "https://example.com/", "retry": 5}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "webhook", "url": "https://example.com/", "signing_secret": 42}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "file", "path": "relative/out.jsonl"}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "file", "path": "/tmp/out\n.jsonl"}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "webhook", "url": "https://example.com/", "ordering": "key"}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "webhook", "url": "https://example.com/", "ordering": "key", "ordering_key": ["/a"]}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "webhook", "url": "https://example.com/", "ordering": "key", "ordering_key": "/a~"}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "webhook", "url": "https://example.com/", "ordering": "relaxed", "ordering_key": "id"}')$c$),
	('22023', $c$SELECT tide.relay_set_outbox('bi_p', 'bi_orders', 'bi_g3', '{"sink_type": "file", "path": "/tmp/out.jsonl", "ordering": "key", "ordering_key": "id"}')$c$);

-- relay pipelines: numbers the relay cannot use. Each is refused by its
-- validator, so no accepted config can stop a pipeline (1e-400 does not fit
-- float8, 2147483648 does not fit int4) or make the worker spin (a rate of
-- 1e-20 a second); the relay also bounds what a row written by hand holds.
INSERT INTO calls (expect, call)
SELECT '22023', format('SELECT tide.relay_set_outbox(''bi_p'', ''bi_orders'', ''bi_g3'', %L)',
					   '{"sink_type": "webhook", "url": "https://example.com/", ' || cfg || '}')
  FROM (VALUES
	('"rate_limit": {"per_second": 1e-400}'),
	('"rate_limit": {"per_second": 1e-20}'),
	('"rate_limit": {"per_second": 0.0009}'),
	('"rate_limit": {"per_second": 0}'),
	('"rate_limit": {"per_second": -1}'),
	('"rate_limit": {"per_second": 1000000.5}'),
	('"rate_limit": {"per_second": 1e400}'),
	('"rate_limit": {"per_second": "1e-20"}'),
	('"rate_limit": {"per_second": null}'),
	('"rate_limit": {"per_second": [1]}'),
	('"rate_limit": {"per_second": 1, "burst": 0}'),
	('"rate_limit": {"per_second": 1, "burst": -1}'),
	('"rate_limit": {"per_second": 1, "burst": 1e-400}'),
	('"rate_limit": {"per_second": 1, "burst": 2147483648}'),
	('"rate_limit": {"per_second": 1, "burst": "5"}'),
	('"rate_limit": 50'),
	('"breaker": {"failure_threshold": 0}'),
	('"breaker": {"failure_threshold": 1e-400}'),
	('"breaker": {"failure_threshold": 2147483648}'),
	('"breaker": {"failure_threshold": true}'),
	('"breaker": {"cooldown_ms": 99}'),
	('"breaker": {"cooldown_ms": -1}'),
	('"breaker": {"cooldown_ms": 86400001}'),
	('"breaker": {"cooldown_ms": 1e400}'),
	('"retry": {"base_ms": 9}'),
	('"retry": {"base_ms": 1e-400}'),
	('"retry": {"cap_ms": 1e20}'),
	('"retry": {"base_ms": 1000, "cap_ms": 999}'),
	('"retry": {"max_attempts": 0}'),
	('"retry": {"max_attempts": 101}'),
	('"retry": {"max_attempts": 2147483648}'),
	('"timeout_ms": 1e-400'),
	('"timeout_ms": 99'),
	('"timeout_ms": 600001'),
	('"timeout_ms": 2147483648'),
	('"max_in_flight": 0'),
	('"max_in_flight": 1001'),
	('"max_in_flight": -2147483649'),
	('"batch_size": 1e-400'),
	('"batch_size": -0.5'),
	('"batch_size": 1001'),
	('"alerts": {"failure_threshold": 0}'),
	('"alerts": {"failure_threshold": 1000001}'),
	('"alerts": {"failure_threshold": 1e-400}'),
	('"alerts": {"failure_threshold": "100"}')) AS v (cfg)
UNION ALL
SELECT '22023', format('SELECT tide.relay_set_outbox(''bi_p'', ''bi_orders'', ''bi_g3'', %L)',
					   '{"sink_type": "file", "path": "/tmp/bi.jsonl", ' || cfg || '}')
  FROM (VALUES
	('"batch_size": 1001'),
	('"batch_size": 1e-400'),
	('"rate_limit": {"per_second": 1e-400}'),
	('"breaker": {"cooldown_ms": 1e400}')) AS v (cfg);

-- relay pipelines: hostile URLs
INSERT INTO calls (expect, call)
SELECT '22023', format('SELECT tide.relay_set_outbox(''bi_p'', ''bi_orders'', ''bi_g3'', %L)', cfg)
  FROM (VALUES
	('{"sink_type": "webhook", "url": "file:///etc/passwd"}'),
	('{"sink_type": "webhook", "url": "gopher://example.com:70/_SET%20x"}'),
	('{"sink_type": "webhook", "url": "ftp://example.com/"}'),
	('{"sink_type": "webhook", "url": "javascript:alert(1)"}'),
	('{"sink_type": "webhook", "url": "https://user:secret@example.com/"}'),
	('{"sink_type": "webhook", "url": "https://example.com@127.0.0.1/"}'),
	('{"sink_type": "webhook", "url": "https://example.com/a\nHost: evil"}'),
	('{"sink_type": "webhook", "url": "https://exa mple.com/"}'),
	('{"sink_type": "webhook", "url": "http://example.com/"}'),
	('{"sink_type": "webhook", "url": "https://127.0.0.1/"}'),
	('{"sink_type": "webhook", "url": "https://127.0.0.1./"}'),
	('{"sink_type": "webhook", "url": "https://10.1.2.3:8443/"}'),
	('{"sink_type": "webhook", "url": "https://172.16.0.1/"}'),
	('{"sink_type": "webhook", "url": "https://192.168.1.1/"}'),
	('{"sink_type": "webhook", "url": "http://169.254.169.254/latest/meta-data/", "allow_http": true}'),
	('{"sink_type": "webhook", "url": "https://0.0.0.0/"}'),
	('{"sink_type": "webhook", "url": "http://2130706433/", "allow_http": true}'),
	('{"sink_type": "webhook", "url": "https://0x7f000001/"}'),
	('{"sink_type": "webhook", "url": "https://0177.0.0.1/"}'),
	('{"sink_type": "webhook", "url": "https://127.1/"}'),
	('{"sink_type": "webhook", "url": "https://[::1]/"}'),
	('{"sink_type": "webhook", "url": "https://[::ffff:169.254.169.254]/"}'),
	('{"sink_type": "webhook", "url": "https://[fe80::1]/"}'),
	('{"sink_type": "webhook", "url": "https://[fd00::1]/"}'),
	('{"sink_type": "webhook", "url": "https://[1:2:3]/"}'),
	('{"sink_type": "webhook", "url": "https://127.0.0.1/", "allow_private_network": "true"}')
  ) AS u (cfg);

-- relay operations
INSERT INTO calls (expect, call) VALUES
	('22004', $c$SELECT tide.relay_enable(NULL)$c$),
	('22004', $c$SELECT tide.relay_disable(NULL)$c$),
	('22004', $c$SELECT tide.relay_delete(NULL)$c$),
	('22004', $c$SELECT tide.relay_delete('bi_hook', NULL)$c$),
	('42704', $c$SELECT tide.relay_delete('bi_missing')$c$),
	('22004', $c$SELECT tide.relay_get_config(NULL)$c$),
	('22023', $c$SELECT tide.relay_get_config('bi_hook"')$c$),
	('22023', $c$SELECT * FROM tide.relay_dlq_list('bi_hook; --')$c$),
	('22004', $c$SELECT * FROM tide.relay_dlq_list(NULL, NULL)$c$),
	('22023', $c$SELECT * FROM tide.relay_dlq_list(NULL, 0)$c$),
	('22023', $c$SELECT * FROM tide.relay_dlq_list(NULL, -1)$c$),
	('22004', $c$SELECT tide.relay_dlq_retry(NULL)$c$),
	('42704', $c$SELECT tide.relay_dlq_retry(-1)$c$),
	('22004', $c$SELECT tide.relay_dlq_retry_all(NULL)$c$),
	('22004', $c$SELECT tide.relay_dlq_purge(NULL)$c$),
	('22023', $c$SELECT tide.relay_dlq_purge(interval '-1 day')$c$),
	('22023', $c$SELECT tide.relay_dlq_purge(interval '1000 years')$c$),
	('22004', $c$SELECT tide.relay_retry_message(NULL, 1)$c$),
	('22004', $c$SELECT tide.relay_retry_message('bi_hook', NULL)$c$),
	('42704', $c$SELECT tide.relay_retry_message('bi_hook', -1)$c$),
	('22004', $c$SELECT tide.relay_replay(NULL, 1, 2)$c$),
	('22004', $c$SELECT tide.relay_replay('bi_hook', NULL, 2)$c$),
	('22004', $c$SELECT tide.relay_replay('bi_hook', 1, NULL)$c$),
	('22023', $c$SELECT tide.relay_replay('bi_hook', 5, 1)$c$),
	('22004', $c$SELECT tide.relay_filter_matches(NULL, '{}')$c$),
	('22023', $c$SELECT tide.relay_filter_matches('[]', '{}')$c$),
	('22023', $c$SELECT tide.relay_filter_matches('{"types": "order.paid"}', '{}')$c$),
	('22023', $c$SELECT tide.outbox_sweep('bi_orders; --')$c$),
	('22004', $c$SELECT tide.outbox_sweep('bi_orders', NULL)$c$),
	('22023', $c$SELECT tide.outbox_sweep('bi_orders', 0)$c$),
	('22023', $c$SELECT tide.outbox_sweep('bi_orders', 10001)$c$),
	('22004', $c$SELECT tide.outbox_sweep('bi_orders', 100, NULL)$c$),
	('22023', $c$SELECT tide.outbox_sweep('bi_orders', 100, false, interval '-1 hour')$c$),
	('22023', $c$SELECT tide.outbox_sweep('bi_orders', 100, false, interval '1000 years')$c$),
	('22004', $c$SELECT tide.outbox_grant_publish(NULL, 'tide_publisher')$c$),
	('22004', $c$SELECT tide.outbox_grant_publish('bi_orders', NULL)$c$),
	('22023', $c$SELECT tide.outbox_grant_publish('bi_orders"; GRANT tide_admin TO PUBLIC; --', 'tide_publisher')$c$),
	('42704', $c$SELECT tide.outbox_grant_publish('bi_orders', '')$c$),
	('42704', $c$SELECT tide.outbox_grant_publish('bi_orders', 'tide_publisher; DROP ROLE tide_admin')$c$),
	('42704', $c$SELECT tide.outbox_grant_publish('bi_nope', 'tide_publisher')$c$),
	('22004', $c$SELECT tide.outbox_revoke_publish(NULL, 'tide_publisher')$c$),
	('22004', $c$SELECT tide.outbox_revoke_publish('bi_orders', NULL)$c$),
	('42704', $c$SELECT tide.outbox_revoke_publish('bi_orders', 'no such role')$c$),
	('22004', $c$SELECT tide.outbox_grant_consume(NULL, 'tide_consumer')$c$),
	('22004', $c$SELECT tide.outbox_grant_consume('bi_orders', NULL)$c$),
	('22023', $c$SELECT tide.outbox_grant_consume('bi_orders"; GRANT tide_admin TO PUBLIC; --', 'tide_consumer')$c$),
	('42704', $c$SELECT tide.outbox_grant_consume('bi_orders', '')$c$),
	('42704', $c$SELECT tide.outbox_grant_consume('bi_orders', 'tide_consumer; DROP ROLE tide_admin')$c$),
	('42704', $c$SELECT tide.outbox_grant_consume('bi_nope', 'tide_consumer')$c$),
	('22004', $c$SELECT tide.outbox_revoke_consume(NULL, 'tide_consumer')$c$),
	('22004', $c$SELECT tide.outbox_revoke_consume('bi_orders', NULL)$c$),
	('42704', $c$SELECT tide.outbox_revoke_consume('bi_orders', 'no such role')$c$),
	('42704', $c$SELECT tide.outbox_revoke_consume('bi_nope', 'tide_consumer')$c$);

-- Run them, with a payload limit of 64kB (the payloads above have 100kB).
SET pg_tide.max_payload_bytes = '64kB';
CREATE TEMP TABLE results AS SELECT n, expect, call, pg_temp.try(call) AS result FROM calls ORDER BY n;
RESET pg_tide.max_payload_bytes;

\pset tuples_only on
\pset format unaligned
SELECT format(E'%s\n    %s', call, result) FROM results ORDER BY n;
\pset tuples_only off
\pset format aligned

-- How many; none accepted; each with the SQLSTATE it must have, a
-- lower-case message and a hint.
SELECT count(*) AS malformed_calls,
	   count(*) FILTER (WHERE result = 'ok') AS accepted,
	   count(*) FILTER (WHERE left(result, 5) = expect) AS expected_sqlstate,
	   count(*) FILTER (WHERE result ~ '^.{5}: [a-z]') AS lower_case_message,
	   count(*) FILTER (WHERE result ~ ' / hint: .') AS with_hint
  FROM results;
SELECT call, expect, result FROM results WHERE left(result, 5) IS DISTINCT FROM expect;
SELECT left(result, 5) AS sqlstate, count(*) FROM results GROUP BY 1 ORDER BY 1;

-- Nothing was written, no id was taken, no relation appeared.
SELECT b.object, CASE WHEN a.state IS NOT DISTINCT FROM b.state THEN 'unchanged'
					  ELSE format('CHANGED: %s -> %s', b.state, a.state) END AS after_bad_input
  FROM state_before b FULL JOIN pg_temp.catalog_state() a USING (object)
 ORDER BY 1;

-- The limit: 1MB unless set; payloads up to it are published.
SHOW pg_tide.max_payload_bytes;
SELECT pg_temp.try($$SELECT tide.outbox_publish('bi_orders', jsonb_build_object('blob', repeat('x', 1100000)))$$);
SELECT tide.outbox_publish('bi_orders', jsonb_build_object('blob', repeat('x', 100000))) > :seq_before AS published;
-- only superusers set it
CREATE ROLE regress_tide_bad_input;
SET ROLE regress_tide_bad_input;
SET pg_tide.max_payload_bytes = '1GB';
RESET ROLE;
DROP ROLE regress_tide_bad_input;
-- with allow_private_network, an address is accepted
SELECT tide.relay_set_outbox('bi_private', 'bi_orders', 'bi_private_group',
	'{"sink_type": "webhook", "url": "http://127.0.0.1:8080/", "allow_http": true, "allow_private_network": true}');
SELECT tide.relay_get_config('bi_private') ->> 'url' AS url;

-- clean up for the tests that follow
SELECT tide.relay_delete('bi_private');
SELECT tide.relay_delete('bi_hook');
SELECT tide.outbox_drop('bi_orders');
SELECT tide.outbox_drop('bi_off');
SELECT tide.inbox_drop('bi_inbox');
SELECT setval('tide.tide_outbox_messages_id_seq', greatest(:seq_before, 1), :seq_before > 0) \g /dev/null
