-- Roles and privileges (docs/security.md): the four roles, per-outbox
-- publishing and consuming rights with role inheritance, a relay
-- pipeline's consumer group closed to everyone but the relay, no direct
-- writes to the catalog,
-- a caller's search_path changes nothing, secrets redacted, secret
-- references validated. Roles made here are dropped at the end.
\set VERBOSITY default
\i test/sql/include/try.sql

-- the roles exist, cannot log in, and stay when the extension goes
SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname LIKE 'tide\_%' ORDER BY rolname;

-- no function, table, view or sequence of the extension is PUBLIC's
SELECT count(*) AS public_functions FROM pg_proc p
 WHERE p.pronamespace = 'tide'::regnamespace AND has_function_privilege('public', p.oid, 'EXECUTE');
SELECT count(*) AS public_relations FROM pg_class c
 WHERE c.relnamespace = 'tide'::regnamespace AND c.relkind IN ('r', 'v', 'S')
   AND (c.relacl IS NULL OR EXISTS (SELECT 1 FROM aclexplode(c.relacl) a WHERE a.grantee = 0));
-- every function but inbox_process, publishing and a few C functions runs with a fixed search_path
SELECT p.oid::regprocedure AS without_search_path FROM pg_proc p
 WHERE p.pronamespace = 'tide'::regnamespace
   AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)
 ORDER BY p.oid::regprocedure::text;
-- the functions that run as the owner
SELECT p.oid::regprocedure AS security_definer FROM pg_proc p
 WHERE p.pronamespace = 'tide'::regnamespace AND p.prosecdef ORDER BY p.oid::regprocedure::text;

CREATE ROLE regress_sec_app LOGIN IN ROLE tide_publisher;
CREATE ROLE regress_sec_team;
CREATE ROLE regress_sec_member IN ROLE tide_publisher, regress_sec_team;
-- NOINHERIT: its own privileges to call outbox_publish, none of regress_sec_team's
CREATE ROLE regress_sec_noinherit NOINHERIT IN ROLE regress_sec_team;
GRANT USAGE ON SCHEMA tide TO regress_sec_noinherit;
GRANT EXECUTE ON FUNCTION tide.outbox_publish(text, jsonb, jsonb, text, timestamptz) TO regress_sec_noinherit;
CREATE ROLE regress_sec_consumer IN ROLE tide_consumer;
CREATE ROLE regress_sec_reader IN ROLE tide_reader;
CREATE ROLE regress_sec_nobody;
CREATE ROLE regress_sec_admin IN ROLE tide_admin;

SELECT tide.outbox_create('sec_orders');
SELECT tide.outbox_create('sec_other');

-- publishing without a grant: 42501
SET ROLE regress_sec_app;
SELECT pg_temp.try($$SELECT tide.outbox_publish('sec_orders', '{"n": 1}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish_batch('sec_orders', ARRAY['{"n": 1}']::jsonb[])$$);
-- an outbox that does not exist looks the same: no grant
SELECT pg_temp.try($$SELECT tide.outbox_publish('sec_missing', '{"n": 1}')$$);
RESET ROLE;
\set VERBOSITY verbose
SET ROLE regress_sec_app;
SELECT tide.outbox_publish('sec_orders', '{"n": 1}');
RESET ROLE;
\set VERBOSITY default

-- granted: publishes to that outbox, not to another
SELECT tide.outbox_grant_publish('sec_orders', 'regress_sec_app');
SELECT tide.outbox_grant_publish('sec_orders', 'regress_sec_app');	-- twice is once
SET ROLE regress_sec_app;
SELECT pg_temp.try($$SELECT tide.outbox_publish('sec_orders', '{"n": 2}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish_batch('sec_orders', ARRAY['{"n": 3}', '{"n": 4}']::jsonb[])$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish('sec_other', '{"n": 5}')$$);
RESET ROLE;
SELECT outbox_name, payload FROM tide.tide_outbox_messages WHERE outbox_name LIKE 'sec\_%' ORDER BY id;

-- a grant to a role is inherited by its members, not by NOINHERIT members
-- (they may SET ROLE to it)
SELECT tide.outbox_grant_publish('sec_other', 'regress_sec_team');
SET ROLE regress_sec_member;
SELECT pg_temp.try($$SELECT tide.outbox_publish('sec_other', '{"via": "member"}')$$);
RESET ROLE;
SET ROLE regress_sec_noinherit;
SELECT pg_temp.try($$SELECT tide.outbox_publish('sec_other', '{"via": "noinherit"}')$$);
RESET ROLE;
-- a membership granted later counts at once (the cached answer is forgotten)
SET ROLE regress_sec_app;
SELECT pg_temp.try($$SELECT tide.outbox_publish('sec_other', '{"via": "app"}')$$);
RESET ROLE;
GRANT regress_sec_team TO regress_sec_app;
SET ROLE regress_sec_app;
SELECT pg_temp.try($$SELECT tide.outbox_publish('sec_other', '{"via": "app"}')$$);
RESET ROLE;
REVOKE regress_sec_team FROM regress_sec_app;

-- revoking takes the right back at once
SELECT tide.outbox_revoke_publish('sec_orders', 'regress_sec_app');
SET ROLE regress_sec_app;
SELECT pg_temp.try($$SELECT tide.outbox_publish('sec_orders', '{"n": 6}')$$);
RESET ROLE;
SELECT tide.outbox_revoke_publish('sec_orders', 'regress_sec_app');	-- nothing to revoke: a notice
SELECT outbox_name, grantee, granted_by FROM tide.outbox_publish_grants ORDER BY 1, 2::text;

-- the grant functions: unknown outbox, unknown role, and who may call them
SELECT pg_temp.try($$SELECT tide.outbox_grant_publish('sec_missing', 'regress_sec_app')$$);
SELECT pg_temp.try($$SELECT tide.outbox_grant_publish('sec_orders', 'regress_sec_missing')$$);
SELECT pg_temp.try($$SELECT tide.outbox_revoke_publish('sec_orders', 'regress_sec_missing')$$);
SET ROLE regress_sec_app;
SELECT pg_temp.try($$SELECT tide.outbox_grant_publish('sec_orders', 'regress_sec_app')$$);
RESET ROLE;
-- tide_admin grants, and publishes anywhere
SET ROLE regress_sec_admin;
SELECT tide.outbox_grant_publish('sec_orders', 'regress_sec_app');
SELECT pg_temp.try($$SELECT tide.outbox_publish('sec_orders', '{"by": "admin"}')$$);
RESET ROLE;
-- a dropped outbox takes its grants with it
SELECT tide.outbox_drop('sec_other');
SELECT outbox_name, grantee FROM tide.outbox_publish_grants ORDER BY 1, 2::text;

-- a role without a tide role may call nothing
SET ROLE regress_sec_nobody;
SELECT pg_temp.try($$SELECT tide.outbox_publish('sec_orders', '{}')$$);
SELECT pg_temp.try($$SELECT * FROM tide.poll_outbox('g', 'c')$$);
SELECT pg_temp.try($$SELECT * FROM tide.consumer_lag$$);
SELECT pg_temp.try($$SELECT tide.outbox_create('x')$$);
RESET ROLE;

-- no direct writes to the catalog for the publisher, consumer, reader or PUBLIC
CREATE FUNCTION pg_temp.writes(p_role text) RETURNS TABLE (tbl text, op text, result text)
LANGUAGE plpgsql AS $$
DECLARE
	t text;
	col text;
BEGIN
	FOR t, col IN SELECT c.oid::regclass::text, quote_ident(a.attname) FROM pg_class c
					JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = 1
				   WHERE c.relnamespace = 'tide'::regnamespace AND c.relkind = 'r' ORDER BY 1 LOOP
		EXECUTE format('SET LOCAL ROLE %I', p_role);
		tbl := t;
		op := 'insert';
		result := pg_temp.try(format('INSERT INTO %s DEFAULT VALUES', t));
		RETURN NEXT;
		op := 'update';
		result := pg_temp.try(format('UPDATE %s SET %s = %2$s', t, col));
		RETURN NEXT;
		op := 'delete';
		result := pg_temp.try(format('DELETE FROM %s', t));
		RETURN NEXT;
		RESET ROLE;
	END LOOP;
END
$$;
BEGIN;
SELECT r.role, count(*) AS attempts,
	   count(*) FILTER (WHERE w.result LIKE '42501: permission denied for %') AS refused
  FROM unnest(ARRAY['regress_sec_app', 'regress_sec_consumer', 'regress_sec_reader', 'regress_sec_nobody']) r (role),
	   LATERAL pg_temp.writes(r.role) w
 GROUP BY r.role ORDER BY r.role;
ROLLBACK;

-- consuming rights: without a grant, every function of the consumer API
-- refuses a tide_consumer (42501), before it writes or locks anything; a
-- group that does not exist looks the same
SELECT tide.create_consumer_group('sec_group', 'sec_orders');
SELECT tide.outbox_create('sec_more');
SELECT tide.create_consumer_group('sec_more_group', 'sec_more');
SELECT tide.outbox_publish('sec_more', '{"more": 1}') > 0 AS published;
CREATE FUNCTION pg_temp.consumer_api(p_group text) RETURNS TABLE (call text, result text)
LANGUAGE plpgsql AS $$
BEGIN
	FOR call IN SELECT unnest(ARRAY[
			'SELECT count(*) FROM tide.poll_outbox(%L, ''c1'', 10)',
			'SELECT tide.wait_for_messages(%L, 0)',
			'SELECT tide.consumer_heartbeat(%L, ''c1'')',
			'SELECT tide.extend_lease(%L, ''c1'', 60) > now()',
			'SELECT tide.release_lease(%L, ''c1'')',
			'SELECT tide.commit_offset(%L, ''c1'', 0)']) LOOP
		call := format(call, p_group);
		result := pg_temp.try(call);
		RETURN NEXT;
	END LOOP;
END
$$;
SET ROLE regress_sec_consumer;
SELECT * FROM pg_temp.consumer_api('sec_group');
SELECT * FROM pg_temp.consumer_api('sec_missing_group');
SELECT * FROM tide.poll_outbox('sec_group', 'c1');
RESET ROLE;
SELECT count(*) AS joined, (SELECT count(*) FROM tide.tide_consumer_leases WHERE group_name = 'sec_group') AS leases
  FROM tide.tide_consumer_offsets WHERE group_name = 'sec_group';

-- granted: the whole API for that outbox's groups, not for another's; the
-- functions run as the caller and do their work as the owner, so the
-- consumer still cannot read the messages table itself
SELECT tide.outbox_grant_consume('sec_orders', 'regress_sec_consumer');
SELECT tide.outbox_grant_consume('sec_orders', 'regress_sec_consumer');	-- twice is once
SET ROLE regress_sec_consumer;
SELECT payload FROM tide.poll_outbox('sec_group', 'c1', 10);
SELECT * FROM pg_temp.consumer_api('sec_group');
SELECT payload FROM tide.poll_outbox('sec_group', 'c1', 10);	-- the released lease again
SELECT tide.commit_offset('sec_group', 'c1', (SELECT max(id) FROM tide.poll_outbox('sec_group', 'c1', 10)));
SELECT * FROM pg_temp.consumer_api('sec_more_group');
SELECT pg_temp.try($$SELECT count(*) FROM tide.tide_outbox_messages$$);
SELECT pg_temp.try($$SELECT tide._extend_lease('sec_group', 'c1', 60)$$);
SELECT pg_temp.try($$SELECT tide.admin_rewind_offset('sec_group', 'c1', 0)$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish('sec_orders', '{}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_grant_consume('sec_more', 'regress_sec_consumer')$$);
RESET ROLE;
SELECT consumer_id, committed_offset > 0 AS committed FROM tide.tide_consumer_offsets
 WHERE group_name = 'sec_group' ORDER BY 1;

-- a grant to a role is inherited by its members, not by NOINHERIT members;
-- a membership granted later counts at once
CREATE ROLE regress_sec_cmember IN ROLE tide_consumer, regress_sec_team;
GRANT EXECUTE ON FUNCTION tide.poll_outbox(text, text, int, int, bigint) TO regress_sec_noinherit;
SELECT tide.outbox_grant_consume('sec_more', 'regress_sec_team');
SET ROLE regress_sec_cmember;
SELECT pg_temp.try($$SELECT count(*) FROM tide.poll_outbox('sec_more_group', 'm1', 10)$$);
RESET ROLE;
SET ROLE regress_sec_noinherit;
SELECT pg_temp.try($$SELECT count(*) FROM tide.poll_outbox('sec_more_group', 'n1', 10)$$);
RESET ROLE;
SET ROLE regress_sec_consumer;
SELECT pg_temp.try($$SELECT count(*) FROM tide.poll_outbox('sec_more_group', 'c1', 10)$$);
RESET ROLE;
GRANT regress_sec_team TO regress_sec_consumer;
SET ROLE regress_sec_consumer;
SELECT pg_temp.try($$SELECT count(*) FROM tide.poll_outbox('sec_more_group', 'c1', 10)$$);
RESET ROLE;
REVOKE regress_sec_team FROM regress_sec_consumer;
SET ROLE regress_sec_consumer;
SELECT pg_temp.try($$SELECT tide.consumer_heartbeat('sec_more_group', 'c1')$$);
RESET ROLE;

-- revoking takes the right back at once (the cached answer is forgotten;
-- test/specs/consume_rights.spec shows it for another session)
SET ROLE regress_sec_cmember;
SELECT pg_temp.try($$SELECT tide.consumer_heartbeat('sec_more_group', 'm1')$$);
RESET ROLE;
SELECT tide.outbox_revoke_consume('sec_more', 'regress_sec_team');
SET ROLE regress_sec_cmember;
SELECT * FROM pg_temp.consumer_api('sec_more_group');
RESET ROLE;
SELECT tide.outbox_revoke_consume('sec_more', 'regress_sec_team');	-- nothing to revoke: a notice
-- the grant functions: unknown outbox, unknown role, and who may call them
SELECT pg_temp.try($$SELECT tide.outbox_grant_consume('sec_missing', 'regress_sec_consumer')$$);
SELECT pg_temp.try($$SELECT tide.outbox_grant_consume('sec_more', 'regress_sec_missing')$$);
SELECT pg_temp.try($$SELECT tide.outbox_revoke_consume('sec_more', 'regress_sec_missing')$$);
SET ROLE regress_sec_admin;
SELECT tide.outbox_grant_consume('sec_more', 'regress_sec_team');
SELECT tide.outbox_revoke_consume('sec_more', 'regress_sec_team');
-- tide_admin consumes from every outbox
SELECT pg_temp.try($$SELECT count(*) FROM tide.poll_outbox('sec_more_group', 'a1', 10)$$);
RESET ROLE;
SET ROLE regress_sec_reader;
SELECT outbox_name, grantee, granted_by FROM tide.outbox_consume_grants ORDER BY 1, 2::text;
RESET ROLE;

-- a consumer receives, claims and marks events of an inbox through the API
SELECT tide.inbox_create('sec_inbox');
SET ROLE regress_sec_consumer;
SELECT tide.inbox_receive('sec_inbox', 'e-1', '{"n": 1}') AS stored;
SELECT event_id, payload FROM tide.inbox_claim('sec_inbox', 10, 30);
SELECT tide.inbox_mark_processed('sec_inbox', 'e-1') AS marked;
SELECT tide.inbox_receive_batch('sec_inbox', '[{"event_id": "e-2", "payload": {"n": 2}}]') AS stored;
SELECT event_id FROM tide.inbox_claim('sec_inbox', 10, 30);
SELECT tide.inbox_mark_failed('sec_inbox', 'e-2', 'handler failed') AS failed;
SELECT pg_temp.try($$SELECT tide.inbox_claim('sec_inbox', 0, 30)$$);
RESET ROLE;
CREATE FUNCTION public.regress_sec_handle(m tide.sec_inbox_inbox) RETURNS void LANGUAGE sql AS $$ SELECT $$;
GRANT EXECUTE ON FUNCTION public.regress_sec_handle(tide.sec_inbox_inbox) TO regress_sec_consumer;
SET ROLE regress_sec_consumer;
SELECT tide.inbox_receive('sec_inbox', 'e-3', '{"n": 3}') AS stored;
SELECT tide.inbox_process('sec_inbox', 'public.regress_sec_handle') AS processed;
RESET ROLE;
DROP FUNCTION public.regress_sec_handle(tide.sec_inbox_inbox);
SET ROLE regress_sec_reader;
SELECT tide.inbox_status('sec_inbox') ->> 'processed' AS processed;
RESET ROLE;
SELECT tide.inbox_drop('sec_inbox');

-- a caller's search_path with objects shadowing names the extension uses
-- (a function, an operator, a table) changes nothing
CREATE SCHEMA regress_sec_evil;
CREATE TABLE regress_sec_evil.tide_outbox_config (outbox_name text, enabled boolean, inline_threshold int);
CREATE FUNCTION regress_sec_evil.coalesce(bigint, int) RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint';
CREATE FUNCTION regress_sec_evil.text_eq(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR regress_sec_evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = regress_sec_evil.text_eq);
CREATE TABLE regress_sec_evil.pg_roles (rolname name, oid oid, rolsuper boolean);
GRANT USAGE ON SCHEMA regress_sec_evil TO PUBLIC;
SET search_path = regress_sec_evil, pg_catalog, public;
-- the shadowing is live for the caller's own statements
SELECT 'sec_missing'::text = 'sec_orders'::text AS shadowed_equals;
SELECT coalesce(5::bigint, 1) AS keyword, regress_sec_evil.coalesce(5::bigint, 1) AS shadow, count(*) AS shadowed_table FROM pg_roles;
SET ROLE regress_sec_app;
-- the shadowing "=" would match every outbox name; the publish still fails for sec_missing
SELECT pg_temp.try($$SELECT tide.outbox_publish('sec_missing', '{}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish('sec_orders', '{"n": 7}')$$);
RESET ROLE;
-- the owner, who may publish anywhere: still no outbox sec_missing
SELECT pg_temp.try($$SELECT tide.outbox_publish('sec_missing', '{}')$$);
SELECT pg_temp.try($$SELECT tide.outbox_publish_batch('sec_missing', ARRAY['{}']::jsonb[])$$);
SET ROLE regress_sec_consumer;
SELECT payload FROM tide.poll_outbox('sec_group', 'c2', 10);
RESET ROLE;
SELECT pg_temp.try($$SELECT tide.outbox_create('sec_evil', 24, 10)$$);
SELECT outbox_name, retention_hours, inline_threshold FROM tide.tide_outbox_config WHERE outbox_name = 'sec_evil';
SELECT pg_temp.try($$SELECT tide.outbox_grant_publish('sec_evil', 'regress_sec_app')$$);
RESET search_path;
SELECT outbox_name, grantee FROM tide.outbox_publish_grants ORDER BY 1, 2::text;
DROP SCHEMA regress_sec_evil CASCADE;

-- secrets: redacted for tide_admin, and tide_reader cannot read the configs
SELECT tide.relay_set_outbox('sec_hook', 'sec_orders', 'sec_hook_group', $${
	"sink_type": "webhook", "url": "https://example.com/hooks",
	"signing_secret": ["whsec_c2VjcmV0", {"env": "PG_TIDE_HOOK_SECRET"}, {"file": "hook.secret"}],
	"headers": {"X-Plain": "shown", "X-Api-Key": "hidden by its name",
				"X-Marked": {"value": "hidden as marked", "secret": true},
				"X-Unmarked": {"value": "shown too"},
				"X-From-Env": {"env": "PG_TIDE_HEADER"}, "X-From-File": {"file": "header.txt"}}
}$$);
SET ROLE regress_sec_admin;
SELECT jsonb_pretty(tide.relay_get_config('sec_hook') - 'alerts' - 'retry');
SELECT config -> 'signing_secret' AS listed FROM tide.relay_list_configs() WHERE pipeline = 'sec_hook';
RESET ROLE;
SET ROLE regress_sec_reader;
SELECT pg_temp.try($$SELECT config FROM tide.relay_outbox_config$$);
SELECT pg_temp.try($$SELECT tide.relay_get_config('sec_hook')$$);
SELECT pg_temp.try($$SELECT * FROM tide.relay_list_configs()$$);
SELECT pipeline, sink_type, outbox, health FROM tide.relay_pipeline_status;
SELECT pipeline, outbox, lag_messages FROM tide.relay_pipeline_lag;
SELECT group_name, outbox_name FROM tide.consumer_lag ORDER BY 1;
SELECT outbox_name, messages > 0 AS has_messages FROM tide.outbox_retention_status ORDER BY 1;
SELECT tide.outbox_status('sec_orders') ->> 'outbox' AS status_of;
SELECT pg_temp.try($$SELECT count(*) FROM tide.tide_outbox_messages$$);
SELECT pg_temp.try($$SELECT count(*) FROM tide.relay_dlq$$);
SELECT pg_temp.try($$SELECT * FROM tide.poll_outbox('sec_group', 'c3')$$);
RESET ROLE;
-- a relay pipeline's consumer group is the relay's: a consumer with the
-- right on the outbox, tide_admin and a superuser are all refused by every
-- function of the consumer API, until the pipeline allows other consumers
SELECT tide.relay_set_outbox('sec_pipe', 'sec_orders', 'sec_pipe_group',
							 '{"sink_type": "webhook", "url": "https://example.com/hooks"}');
SELECT tide.outbox_publish('sec_orders', '{"for": "the webhook"}') > 0 AS published;
SET ROLE regress_sec_consumer;
SELECT * FROM pg_temp.consumer_api('sec_pipe_group');
SELECT * FROM tide.poll_outbox('sec_pipe_group', 'relay:sec_pipe');
RESET ROLE;
SET ROLE regress_sec_admin;
SELECT pg_temp.try($$SELECT count(*) FROM tide.poll_outbox('sec_pipe_group', 'relay:sec_pipe')$$);
RESET ROLE;
SELECT * FROM pg_temp.consumer_api('sec_pipe_group');
SELECT count(*) AS taken FROM tide.tide_consumer_offsets WHERE group_name = 'sec_pipe_group';
SELECT pg_temp.try($$SELECT tide.relay_set_outbox('sec_pipe', 'sec_orders', 'sec_pipe_group',
	'{"sink_type": "webhook", "url": "https://example.com/hooks", "allow_other_consumers": "yes"}')$$);
SELECT tide.relay_set_outbox('sec_pipe', 'sec_orders', 'sec_pipe_group',
	'{"sink_type": "webhook", "url": "https://example.com/hooks", "allow_other_consumers": true}');
SELECT tide.relay_get_config('sec_pipe') -> 'allow_other_consumers' AS allow_other_consumers;
SET ROLE regress_sec_consumer;
SELECT payload FROM tide.poll_outbox('sec_pipe_group', 'c1', 1);
RESET ROLE;
SELECT pg_temp.try($$SELECT count(*) FROM tide.poll_outbox('sec_pipe_group', 'c9', 1)$$);
-- closed again: the change of the pipeline counts at once
SELECT tide.relay_set_outbox('sec_pipe', 'sec_orders', 'sec_pipe_group',
	'{"sink_type": "webhook", "url": "https://example.com/hooks"}');
SET ROLE regress_sec_consumer;
SELECT pg_temp.try($$SELECT tide.release_lease('sec_pipe_group', 'c1')$$);
RESET ROLE;
-- the rule is the group's name: a pipeline's group dropped and created
-- again is still the relay's, and it can only be created for the
-- pipeline's outbox
SELECT tide.drop_consumer_group('sec_pipe_group');
SELECT pg_temp.try($$SELECT tide.create_consumer_group('sec_pipe_group', 'sec_more')$$);
SELECT tide.create_consumer_group('sec_pipe_group', 'sec_orders');
SET ROLE regress_sec_consumer;
SELECT pg_temp.try($$SELECT count(*) FROM tide.poll_outbox('sec_pipe_group', 'c1', 1)$$);
RESET ROLE;
SELECT tide.relay_delete('sec_pipe', p_keep_group => true);
SET ROLE regress_sec_consumer;
SELECT pg_temp.try($$SELECT count(*) > 0 AS got FROM tide.poll_outbox('sec_pipe_group', 'c1', 100)$$);
RESET ROLE;
SELECT tide.drop_consumer_group('sec_pipe_group');

-- consumer_lag for a tide_consumer: only the groups of the outboxes it may
-- consume from, and not a relay pipeline's closed group (sec_hook_group);
-- a reader sees every group
CREATE ROLE regress_sec_lagless IN ROLE tide_consumer;
SET ROLE regress_sec_consumer;
SELECT group_name, outbox_name, pending FROM tide.consumer_lag ORDER BY 1;
RESET ROLE;
SET ROLE regress_sec_lagless;
SELECT count(*) AS groups_without_a_grant FROM tide.consumer_lag;
RESET ROLE;
SELECT tide.outbox_grant_consume('sec_more', 'regress_sec_lagless');
SET ROLE regress_sec_lagless;
SELECT group_name, outbox_name FROM tide.consumer_lag ORDER BY 1;
RESET ROLE;
-- a caller's function in the query sees no row the view leaves out
CREATE FUNCTION public.regress_sec_leak(p text) RETURNS boolean
LANGUAGE plpgsql COST 0.0000001 AS $$
BEGIN
	RAISE NOTICE 'saw %', p;
	RETURN true;
END
$$;
SET ROLE regress_sec_lagless;
SELECT group_name FROM tide.consumer_lag WHERE public.regress_sec_leak(group_name);
RESET ROLE;
DROP FUNCTION public.regress_sec_leak(text);
SELECT tide.outbox_revoke_consume('sec_more', 'regress_sec_lagless');
SET ROLE regress_sec_reader;
SELECT group_name, outbox_name FROM tide.consumer_lag ORDER BY 1;
RESET ROLE;

-- the attempt log and the dead letters for a tide_reader: the relay's view
-- of them, without payloads, headers or answers (which may hold secrets)
INSERT INTO tide.relay_attempts (pipeline_id, outbox_name, message_id, attempt, status,
								 response_code, error_class, error, response_snippet)
VALUES ('sec_hook', 'sec_orders', 1, 1, 'failed', 401, 'http_4xx', 'HTTP status 401',
		'{"answer": "secret-answer"}');
INSERT INTO tide.relay_dlq (pipeline_id, outbox_name, message_id, payload, headers, created_at,
							attempts, reason, last_status, last_error_class, last_error, first_failed_at)
VALUES ('sec_hook', 'sec_orders', 1, '{"card": "secret-payload"}', '{"Authorization": "secret-header"}',
		'2026-01-01', 1, 'permanent', 401, 'http_4xx', 'HTTP status 401', '2026-01-01');
SET ROLE regress_sec_reader;
SELECT pipeline, outbox, message_id, attempt, manual, status, response_code, error_class, error
  FROM tide.relay_attempt_log;
SELECT pipeline, outbox, message_id, created_at, attempts, reason, last_status, last_error_class, last_error
  FROM tide.relay_dead_letters;
SELECT count(*) AS rows_with_a_secret
  FROM (SELECT a::text AS r FROM tide.relay_attempt_log a
		UNION ALL SELECT d::text FROM tide.relay_dead_letters d) x
 WHERE r LIKE '%secret%';
SELECT pg_temp.try($$SELECT response_snippet FROM tide.relay_attempts$$);
SELECT pg_temp.try($$SELECT payload FROM tide.relay_dlq$$);
RESET ROLE;
SELECT v.relname AS view, string_agg(a.attname, ', ' ORDER BY a.attnum) AS columns
  FROM pg_class v JOIN pg_attribute a ON a.attrelid = v.oid AND a.attnum > 0
 WHERE v.oid IN ('tide.relay_attempt_log'::regclass, 'tide.relay_dead_letters'::regclass)
 GROUP BY v.relname ORDER BY 1;
-- neither a consumer, a publisher nor a role without a tide role reads them
SELECT r.role, pg_temp.try(format('SET LOCAL ROLE %I; SELECT count(*) FROM tide.relay_attempt_log', r.role)) AS attempts,
	   pg_temp.try(format('SET LOCAL ROLE %I; SELECT count(*) FROM tide.relay_dead_letters', r.role)) AS dead_letters
  FROM unnest(ARRAY['regress_sec_consumer', 'regress_sec_app', 'regress_sec_nobody']) r (role);
RESET ROLE;
DELETE FROM tide.relay_attempts WHERE pipeline_id = 'sec_hook';
DELETE FROM tide.relay_dlq WHERE pipeline_id = 'sec_hook';

-- no view shows a secret
SELECT v.relname AS view_with_secret FROM pg_class v
 WHERE v.relnamespace = 'tide'::regnamespace AND v.relkind = 'v'
   AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = v.oid AND a.attname IN ('config', 'signing_secret', 'headers'));

-- secret references: their form is checked (22023)
SELECT pg_temp.try(format($$SELECT tide.relay_set_outbox('sec_bad', 'sec_orders', 'sec_bad_group', %L)$$, c))
  FROM unnest(ARRAY[
	'{"sink_type": "webhook", "url": "https://a.example", "signing_secret": {"env": "HOME"}}',
	'{"sink_type": "webhook", "url": "https://a.example", "signing_secret": {"env": "PG_TIDE_A B"}}',
	'{"sink_type": "webhook", "url": "https://a.example", "signing_secret": {"file": "../etc/passwd"}}',
	'{"sink_type": "webhook", "url": "https://a.example", "signing_secret": {"file": ".hidden"}}',
	'{"sink_type": "webhook", "url": "https://a.example", "signing_secret": {"file": "/etc/passwd"}}',
	'{"sink_type": "webhook", "url": "https://a.example", "signing_secret": {"env": "PG_TIDE_A", "file": "a"}}',
	'{"sink_type": "webhook", "url": "https://a.example", "signing_secret": {"path": "a"}}',
	'{"sink_type": "webhook", "url": "https://a.example", "signing_secret": {"env": 1}}',
	'{"sink_type": "webhook", "url": "https://a.example", "headers": {"X-A": {"env": "PATH"}}}',
	'{"sink_type": "webhook", "url": "https://a.example", "headers": {"X-A": {"file": "a/b"}}}',
	'{"sink_type": "webhook", "url": "https://a.example", "headers": {"X-A": {"value": "v", "secret": "yes"}}}',
	'{"sink_type": "webhook", "url": "https://a.example", "headers": {"X-A": {"value": "v", "other": 1}}}',
	'{"sink_type": "webhook", "url": "https://a.example", "headers": {"X-A": {"value": 1}}}',
	'{"sink_type": "webhook", "url": "https://a.example", "headers": {"X-A": {}}}']) c;
SELECT count(*) AS bad_pipelines FROM tide.relay_outbox_config WHERE name = 'sec_bad';

-- clean up: the roles are the cluster's
SELECT tide.relay_delete('sec_hook');
SELECT tide.outbox_drop('sec_orders');
SELECT tide.outbox_drop('sec_more');
SELECT tide.outbox_drop('sec_evil');
SELECT count(*) AS consume_grants_left FROM tide.outbox_consume_grants;
REVOKE ALL ON FUNCTION tide.outbox_publish(text, jsonb, jsonb, text, timestamptz) FROM regress_sec_noinherit;
REVOKE ALL ON FUNCTION tide.poll_outbox(text, text, int, int, bigint) FROM regress_sec_noinherit;
REVOKE ALL ON SCHEMA tide FROM regress_sec_noinherit;
DROP ROLE regress_sec_app, regress_sec_member, regress_sec_noinherit, regress_sec_team,
	regress_sec_consumer, regress_sec_cmember, regress_sec_reader, regress_sec_nobody, regress_sec_admin,
	regress_sec_lagless;
