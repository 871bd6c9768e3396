-- Inbox handlers: setting one (every refusal with its SQLSTATE and hint,
-- nothing written), the roles a handler may run as, one batch run as the
-- relay runs it (tide._inbox_handle), retries, dead letters and their
-- operator event, holds, status and retention. No ids or timestamps are
-- shown.
\set VERBOSITY default
\i test/sql/include/try.sql
CREATE ROLE regress_ih_app;
CREATE ROLE regress_ih_other;
CREATE ROLE regress_ih_admin IN ROLE tide_admin;
CREATE ROLE regress_ih_super SUPERUSER;
GRANT tide_consumer TO regress_ih_app, regress_ih_other;
CREATE SCHEMA ih_app AUTHORIZATION regress_ih_app;
GRANT USAGE ON SCHEMA ih_app TO regress_ih_other, regress_ih_admin;
SELECT tide.inbox_create('ih_jobs', 'tide', 2);
SELECT tide.outbox_create('ih_ops');
SELECT tide.outbox_create('ih_out');
GRANT tide_publisher TO regress_ih_app;
SELECT tide.outbox_grant_publish('ih_out', 'regress_ih_app');
SET pg_tide.operator_events_outbox = 'ih_ops';

-- The handler notes each call with the role and search_path it ran
-- under; a payload {"fail": n} fails while the event's retry_count < n.
CREATE TABLE ih_app.calls (event_id text, run_as text, path text);
ALTER TABLE ih_app.calls OWNER TO regress_ih_app;
CREATE FUNCTION ih_app.handle(m tide.ih_jobs_inbox) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO ih_app.calls VALUES (m.event_id, current_user, current_setting('search_path'));
	IF m.retry_count < coalesce((m.payload ->> 'fail')::int, 0) THEN
		RAISE EXCEPTION 'event % refused', m.event_id;
	END IF;
	IF m.payload ? 'path' THEN
		PERFORM set_config('search_path', 'ih_app', false);
		PERFORM set_config('ih.mark', m.event_id, false);
	END IF;
	IF m.payload ? 'publish' THEN
		PERFORM tide.outbox_publish('ih_out', m.payload);
	END IF;
	IF m.payload ? 'escape' THEN
		-- back to the session's user: the relay's superuser
		RESET ROLE;
		INSERT INTO ih_app.calls VALUES (m.event_id || ' after RESET ROLE', current_user, '');
	END IF;
END
$$;
ALTER FUNCTION ih_app.handle(tide.ih_jobs_inbox) OWNER TO regress_ih_app;
CREATE FUNCTION ih_app.wrong(m jsonb) RETURNS void LANGUAGE sql AS '';
ALTER FUNCTION ih_app.wrong(jsonb) OWNER TO regress_ih_app;
-- owned by a superuser, executable by all
CREATE FUNCTION public.ih_super_handle(m tide.ih_jobs_inbox) RETURNS void LANGUAGE sql AS '';
ALTER FUNCTION public.ih_super_handle(tide.ih_jobs_inbox) OWNER TO regress_ih_super;

-- refusals, as an administrator who is not a member of regress_ih_app
SET ROLE regress_ih_admin;
SELECT pg_temp.try(q) FROM (VALUES
	($$SELECT tide.inbox_set_handler('ih_nope', 'ih_app.handle(tide.ih_jobs_inbox)')$$),
	($$SELECT tide.inbox_set_handler('', 'ih_app.handle(tide.ih_jobs_inbox)')$$),
	($$SELECT tide.inbox_set_handler('ih_jobs', NULL)$$),
	($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.wrong(jsonb)')$$),
	($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', NULL)$$),
	($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', '[]')$$),
	($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', '{"batch": 1}')$$),
	($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', '{"batch_size": 0}')$$),
	($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', '{"batch_size": 1.5}')$$),
	($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', '{"batch_size": "10"}')$$),
	($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', '{"concurrency": 17}')$$),
	($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', '{"enabled": "yes"}')$$),
	($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', '{"run_as": 1}')$$),
	($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', '{"run_as": ""}')$$),
	($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', '{"run_as": "regress_ih_nobody"}')$$),
	($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', '{"allow_superuser": 1}')$$),
	-- a role the administrator cannot act as, though it may run the function
	($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', '{"run_as": "regress_ih_other"}')$$),
	-- the superuser the relay's worker is, or any other
	($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', '{"run_as": "regress_ih_super"}')$$),
	($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', '{"run_as": "regress_ih_super", "allow_superuser": true}')$$),
	-- by default the function's owner: here a superuser
	($$SELECT tide.inbox_set_handler('ih_jobs', 'public.ih_super_handle(tide.ih_jobs_inbox)')$$),
	-- a row written by hand is checked the same way
	($$INSERT INTO tide.relay_inbox_handlers (inbox_name, handler, run_as) VALUES ('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', 'regress_ih_super')$$),
	($$INSERT INTO tide.relay_inbox_handlers (inbox_name, handler, run_as, owner) VALUES ('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', 'regress_ih_other', 'regress_ih_super')$$),
	($$SELECT tide.inbox_drop_handler('ih_jobs')$$),
	($$SELECT tide.inbox_drop_handler('ih_jobs', NULL)$$),
	($$SELECT tide.inbox_enable_handler('ih_jobs')$$),
	($$SELECT tide.inbox_disable_handler('ih_nope')$$)) AS t(q);
SELECT count(*) AS handlers_written FROM tide.relay_inbox_handlers;
RESET ROLE;

-- the rights of the role it runs as, checked when it is set
REVOKE EXECUTE ON FUNCTION ih_app.handle(tide.ih_jobs_inbox) FROM PUBLIC;
GRANT regress_ih_other TO regress_ih_admin;
SET ROLE regress_ih_admin;
SELECT pg_temp.try($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', '{"run_as": "regress_ih_other"}')$$);
RESET ROLE;
GRANT EXECUTE ON FUNCTION ih_app.handle(tide.ih_jobs_inbox) TO regress_ih_other;
REVOKE USAGE ON SCHEMA ih_app FROM regress_ih_other;
SET ROLE regress_ih_admin;
SELECT pg_temp.try($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', '{"run_as": "regress_ih_other"}')$$);
RESET ROLE;
GRANT USAGE ON SCHEMA ih_app TO regress_ih_other;
REVOKE tide_consumer FROM regress_ih_other;
SET ROLE regress_ih_admin;
SELECT pg_temp.try($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', '{"run_as": "regress_ih_other"}')$$);
-- the function's owner, which the administrator may not act as, but
-- only if the administrator may execute the function
SELECT pg_temp.try($$SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)')$$);
RESET ROLE;
SELECT count(*) AS handlers_written FROM tide.relay_inbox_handlers;
GRANT EXECUTE ON FUNCTION ih_app.handle(tide.ih_jobs_inbox) TO tide_admin;
SET ROLE regress_ih_admin;
SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', '{"batch_size": 3}');
RESET ROLE;
SELECT inbox_name, handler, run_as, enabled, config, owner FROM tide.relay_inbox_handlers;
-- a superuser who says so may let it run as a superuser
SELECT pg_temp.try($$SELECT tide.inbox_set_handler('ih_jobs', 'public.ih_super_handle(tide.ih_jobs_inbox)')$$);
BEGIN;
SELECT tide.inbox_set_handler('ih_jobs', 'public.ih_super_handle(tide.ih_jobs_inbox)', '{"allow_superuser": true}');
SELECT run_as, config FROM tide.relay_inbox_handlers;
-- an administrator may disable it, not set it again
SET ROLE regress_ih_admin;
SELECT tide.inbox_disable_handler('ih_jobs');
SELECT pg_temp.try($$UPDATE tide.relay_inbox_handlers SET config = config || '{"batch_size": 5}'$$);
ROLLBACK;

-- batches as the relay runs them (batch_size 3): as regress_ih_app,
-- search_path pinned; a failed event is retried in the next batch, and
-- dead-lettered at max_retries (2)
SELECT tide.inbox_receive('ih_jobs', 'e1', '{}');
SELECT tide.inbox_receive('ih_jobs', 'e2', '{"fail": 1}');
SELECT tide.inbox_receive('ih_jobs', 'e3', '{"fail": 5}');
SELECT tide.inbox_receive('ih_jobs', 'e4', '{"escape": true}');
SELECT tide.inbox_receive('ih_jobs', 'e5', '{"path": true}');
SELECT tide._inbox_handle('ih_jobs') AS processed;
SELECT event_id, processed_at IS NOT NULL AS processed, retry_count, last_error,
	   dead_lettered_at IS NOT NULL AS dead
  FROM tide.ih_jobs_inbox ORDER BY id;
SELECT tide._inbox_handle('ih_jobs') AS processed;
SELECT tide._inbox_handle('ih_jobs') AS processed;
SELECT tide._inbox_handle('ih_jobs') AS processed;
SELECT event_id, processed_at IS NOT NULL AS processed, retry_count, last_error,
	   dead_lettered_at IS NOT NULL AS dead
  FROM tide.ih_jobs_inbox ORDER BY id;
-- each processed event's writes once, failed attempts' undone
SELECT event_id, run_as, path FROM ih_app.calls ORDER BY event_id;
-- a handler publishes to an outbox, with its event's processed mark
SELECT tide.inbox_receive('ih_jobs', 'p1', '{"publish": true}');
SELECT tide._inbox_handle('ih_jobs') AS processed;
SELECT payload FROM tide.tide_outbox_messages WHERE outbox_name = 'ih_out';
-- the handler's SET is undone, its RESET ROLE was refused
SELECT coalesce(current_setting('ih.mark', true), '') AS mark, current_user;
SELECT payload - 'at' AS event, headers FROM tide.tide_outbox_messages WHERE outbox_name = 'ih_ops';
SELECT s - 'oldest_pending_age_seconds' - 'handler' AS status,
	   (s -> 'handler') - 'last_success_at' - 'last_failure_at' AS handler
  FROM tide.inbox_status('ih_jobs') s;
SELECT inbox, handler, run_as, enabled, batch_size, concurrency, owner, processed, failed,
	   dead_lettered, last_error, held_reason
  FROM tide.inbox_handler_status;

-- held, not failed, when run_as loses a right: no event is claimed
REVOKE EXECUTE ON FUNCTION ih_app.handle(tide.ih_jobs_inbox) FROM PUBLIC, tide_admin;
REVOKE EXECUTE ON FUNCTION ih_app.handle(tide.ih_jobs_inbox) FROM regress_ih_app;
SELECT tide.inbox_receive('ih_jobs', 'e6', '{}');
SELECT tide._inbox_handle('ih_jobs') AS processed;
SELECT held_reason, held_since IS NOT NULL AS held FROM tide.inbox_handler_status;
SELECT event_id, retry_count FROM tide.ih_jobs_inbox WHERE processed_at IS NULL AND dead_lettered_at IS NULL;
GRANT EXECUTE ON FUNCTION ih_app.handle(tide.ih_jobs_inbox) TO regress_ih_app;
SELECT tide._inbox_handle('ih_jobs') AS processed;
SELECT held_reason, held_since IS NOT NULL AS held FROM tide.inbox_handler_status;
-- disabled: nothing runs
SELECT tide.inbox_disable_handler('ih_jobs');
SELECT tide.inbox_receive('ih_jobs', 'e7', '{}');
SELECT tide._inbox_handle('ih_jobs') AS processed;
SELECT tide.inbox_enable_handler('ih_jobs');
SELECT tide._inbox_handle('ih_jobs') AS processed;
-- not for anyone but a superuser
SET ROLE regress_ih_admin;
SELECT pg_temp.try($$SELECT tide._inbox_handle('ih_jobs')$$);
RESET ROLE;

-- retention: processed rows past processed_retention_hours, dead letters
-- past dlq_retention_hours (0 keeps them)
UPDATE tide.ih_jobs_inbox SET processed_at = processed_at - interval '73 hours' WHERE event_id IN ('e1', 'e2');
UPDATE tide.ih_jobs_inbox SET dead_lettered_at = dead_lettered_at - interval '1000 hours';
SELECT tide._inbox_retention(10) AS more;
SELECT event_id FROM tide.ih_jobs_inbox ORDER BY id;
UPDATE tide.tide_inbox_config SET dlq_retention_hours = 1 WHERE inbox_name = 'ih_jobs';
UPDATE tide.ih_jobs_inbox SET processed_at = processed_at - interval '73 hours' WHERE event_id IN ('e5', 'e6', 'e7');
SELECT tide._inbox_retention(3) AS more;
SELECT tide._inbox_retention(3) AS more;
SELECT tide._inbox_retention(3) AS more;
SELECT event_id FROM tide.ih_jobs_inbox ORDER BY id;

-- a dropped function holds the handler; dropping the inbox drops the handler
SELECT tide.inbox_drop_handler('ih_jobs');
SELECT tide.inbox_drop_handler('ih_jobs', true);
SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)');
-- concurrency above the database's relay workers (1 here): a warning, and
-- the figure that takes effect
SELECT tide.inbox_set_handler('ih_jobs', 'ih_app.handle(tide.ih_jobs_inbox)', '{"concurrency": 2}');
SELECT concurrency, effective_concurrency, running FROM tide.inbox_handler_status;
-- a batch holds one of the inbox's slots until its transaction ends
BEGIN;
SELECT tide._inbox_handle('ih_jobs') AS processed;
SELECT running FROM tide.inbox_handler_status;
COMMIT;
SELECT running FROM tide.inbox_handler_status;
DROP FUNCTION ih_app.handle(tide.ih_jobs_inbox);
SELECT tide._inbox_handle('ih_jobs') AS processed;
DROP FUNCTION public.ih_super_handle(tide.ih_jobs_inbox);
SELECT tide.inbox_drop('ih_jobs');
SELECT count(*) AS handlers, (SELECT count(*) FROM tide.relay_inbox_handler_health) AS health
  FROM tide.relay_inbox_handlers;

RESET pg_tide.operator_events_outbox;
SELECT tide.outbox_drop('ih_ops');
SELECT tide.outbox_drop('ih_out');
DROP SCHEMA ih_app CASCADE;
DROP ROLE regress_ih_app, regress_ih_other, regress_ih_admin, regress_ih_super;
