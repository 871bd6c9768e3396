-- ---------------------------------------------------------------------------
-- Inbox handlers (docs/inbox.md, "Handlers"). tide.inbox_set_handler names
-- the function the relay runs on each pending event of an inbox and the
-- role it runs as; the relay claims a batch, runs the handler on each event
-- as that role with the event's processed mark in the same transaction,
-- counts failures and dead-letters as inbox_process does
-- (relay/inbox_handler.c). Who may name which role is checked once, by
-- tide._inbox_handler_problem: by the row's trigger when a handler is set
-- (as the role that sets it), and by the relay before every batch (as the
-- row's owner), so that a right taken away later holds the handler.
-- ---------------------------------------------------------------------------

-- Why the handler cannot run, as {sqlstate, message, hint}, or NULL when
-- it can: p_owner (the role that set it) must be allowed to make p_run_as
-- run it, and p_run_as must have the rights to process the inbox
-- (relay/inbox_handler_rules.c, which the relay calls before every batch).
CREATE OR REPLACE FUNCTION tide._inbox_handler_problem(p_inbox text, p_handler oid, p_run_as text,
													   p_config jsonb, p_owner text)
RETURNS text[]
AS 'MODULE_PATHNAME', 'tide_inbox_handler_problem'
LANGUAGE C STABLE
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._inbox_handler_problem(text,oid,text,jsonb,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._inbox_handler_problem(text,oid,text,jsonb,text) TO tide_admin;

-- An integer config key of an inbox handler: the default when absent,
-- 22023 unless a whole number from p_min to p_max.
CREATE OR REPLACE FUNCTION tide._inbox_handler_int(p_config jsonb, p_key text, p_default int,
												   p_min int, p_max int, p_hint text)
RETURNS int
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	v jsonb := p_config -> p_key;
BEGIN
	IF v IS NULL THEN
		RETURN p_default;
	END IF;
	IF jsonb_typeof(v) <> 'number' OR v::text::numeric <> trunc(v::text::numeric)
	   OR v::text::numeric < p_min OR v::text::numeric > p_max THEN
		RAISE EXCEPTION '"%" must be a whole number from % to %, not %', p_key, p_min, p_max, v
			USING ERRCODE = 'invalid_parameter_value', HINT = p_hint;
	END IF;
	RETURN v::text::int;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._inbox_handler_int(jsonb,text,integer,integer,integer,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._inbox_handler_int(jsonb,text,integer,integer,integer,text) TO tide_admin;

-- A handler's stored config, normalised: batch_size, concurrency and
-- allow_superuser, each with its default; 22023 for anything else.
CREATE OR REPLACE FUNCTION tide._inbox_handler_config(p_config jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	k text;
BEGIN
	IF p_config IS NULL OR jsonb_typeof(p_config) <> 'object' THEN
		RAISE EXCEPTION 'handler config must be a JSON object'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Pass an object such as {"batch_size": 100, "run_as": "app"}, or leave it out.';
	END IF;
	FOR k IN SELECT jsonb_object_keys(p_config) LOOP
		IF k NOT IN ('batch_size', 'concurrency', 'allow_superuser') THEN
			RAISE EXCEPTION 'unknown handler config key "%"', k
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'A handler takes "run_as", "enabled", "batch_size", "concurrency" and "allow_superuser".';
		END IF;
	END LOOP;
	IF coalesce(jsonb_typeof(p_config -> 'allow_superuser'), 'boolean') <> 'boolean' THEN
		RAISE EXCEPTION '"allow_superuser" must be true or false'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Only a superuser may pass true, to let the handler run as a superuser.';
	END IF;
	RETURN jsonb_build_object(
		'batch_size', tide._inbox_handler_int(p_config, 'batch_size', 100, 1, 10000,
			'Give the largest number of events one transaction of the handler takes.'),
		'concurrency', tide._inbox_handler_int(p_config, 'concurrency', 1, 1, 16,
			'Give how many batches of the inbox the relay may process at once, at most one per relay worker of the database.'),
		'allow_superuser', coalesce((p_config ->> 'allow_superuser')::boolean, false));
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._inbox_handler_config(jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._inbox_handler_config(jsonb) TO tide_admin;

-- The BEFORE INSERT OR UPDATE trigger of tide.relay_inbox_handlers: every
-- row, set through tide.inbox_set_handler or written by hand, is checked
-- with the rights of the role that writes it, which becomes its owner (a
-- superuser may keep another owner: a restore). An UPDATE that changes
-- nothing but enabled is not checked again, so that an administrator may
-- disable a handler a superuser set.
CREATE OR REPLACE FUNCTION tide._inbox_handler_check()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
	problem text[];
BEGIN
	IF TG_OP = 'UPDATE' AND NEW.inbox_name = OLD.inbox_name AND NEW.handler = OLD.handler
	   AND NEW.run_as = OLD.run_as AND NEW.config = OLD.config
	   AND NEW.owner IS NOT DISTINCT FROM OLD.owner THEN
		NEW.updated_at := now();
		RETURN NEW;
	END IF;
	IF NEW.owner IS NULL OR NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user) THEN
		NEW.owner := current_user;
	END IF;
	NEW.config := tide._inbox_handler_config(NEW.config);
	IF (NEW.config ->> 'allow_superuser')::boolean
	   AND NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user) THEN
		RAISE EXCEPTION 'only a superuser may let a handler run as a superuser'
			USING ERRCODE = 'insufficient_privilege',
				  HINT = 'Leave "allow_superuser" out, and name a role without superuser in "run_as".';
	END IF;
	problem := tide._inbox_handler_problem(NEW.inbox_name, NEW.handler, NEW.run_as, NEW.config, NEW.owner);
	IF problem IS NOT NULL THEN
		RAISE EXCEPTION '%', problem[2] USING ERRCODE = problem[1], HINT = problem[3];
	END IF;
	NEW.updated_at := now();
	RETURN NEW;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._inbox_handler_check() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._inbox_handler_check() TO tide_admin;

-- The AFTER trigger of tide.relay_inbox_handlers: the relay worker looks at
-- its handlers at commit (a database whose only work is a handler gets a
-- worker), and listeners of tide_relay_config hear of it.
CREATE OR REPLACE FUNCTION tide._inbox_handler_notify()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM pg_notify('tide_relay_config',
					  json_build_object('table', TG_TABLE_NAME, 'op', TG_OP,
										'name', CASE WHEN TG_OP = 'DELETE' THEN OLD.inbox_name
													 ELSE NEW.inbox_name END)::text);
	PERFORM tide._relay_wake_worker();
	RETURN NULL;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._inbox_handler_notify() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._inbox_handler_notify() TO tide_admin;

CREATE OR REPLACE FUNCTION tide.inbox_set_handler(p_inbox text, p_handler regprocedure,
												  p_config jsonb DEFAULT '{}')
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	cfg tide.tide_inbox_config;
	run_as text;
	enabled boolean;
	concurrency int;
	workers int;
BEGIN
	cfg := tide._inbox_config(p_inbox);
	PERFORM tide._check_handler_given(p_handler,
		'Pass a function that takes the inbox''s row type, or remove the handler with tide.inbox_drop_handler().');
	IF p_config IS NULL OR jsonb_typeof(p_config) <> 'object' THEN
		-- refused as the row's trigger refuses it
		PERFORM tide._inbox_handler_config(p_config);
	END IF;
	IF coalesce(jsonb_typeof(p_config -> 'run_as'), 'string') <> 'string' OR p_config ->> 'run_as' = '' THEN
		RAISE EXCEPTION '"run_as" must be a role name'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Name the role the handler runs as, or leave "run_as" out to run it as the function''s owner.';
	END IF;
	IF coalesce(jsonb_typeof(p_config -> 'enabled'), 'boolean') <> 'boolean' THEN
		RAISE EXCEPTION '"enabled" must be true or false'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Leave it out to enable the handler.';
	END IF;
	run_as := coalesce(p_config ->> 'run_as',
					   (SELECT pg_catalog.pg_get_userbyid(p.proowner) FROM pg_catalog.pg_proc p
						 WHERE p.oid = p_handler));
	enabled := coalesce((p_config ->> 'enabled')::boolean, true);
	-- The row's trigger checks the rest, as it does for a row written by hand.
	INSERT INTO tide.relay_inbox_handlers AS h (inbox_name, handler, run_as, enabled, config)
	VALUES (p_inbox, p_handler, run_as, enabled, p_config - 'run_as' - 'enabled')
	ON CONFLICT (inbox_name) DO UPDATE
		SET handler = EXCLUDED.handler, run_as = EXCLUDED.run_as, enabled = EXCLUDED.enabled,
			config = EXCLUDED.config, owner = NULL
	RETURNING (h.config ->> 'concurrency')::int INTO concurrency;
	-- Each batch runs in a relay worker of its own: no more run at once.
	workers := current_setting('pg_tide.relay_workers_per_database', true)::int;
	IF concurrency > workers THEN
		RAISE WARNING 'handler of inbox "%" may run % batches at once, but the database has % relay worker%',
			p_inbox, concurrency, workers, CASE WHEN workers = 1 THEN '' ELSE 's' END
			USING DETAIL = 'Each relay worker runs one batch at a time.',
				  HINT = format('Set pg_tide.relay_workers_per_database to %s to run %s at once.',
								concurrency, concurrency);
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.inbox_set_handler(text, regprocedure, jsonb)
	IS 'sets the function the relay runs on each pending event of an inbox, and the role it runs as ("run_as", by default the function''s owner)';
REVOKE ALL ON FUNCTION tide.inbox_set_handler(text,regprocedure,jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.inbox_set_handler(text,regprocedure,jsonb) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.inbox_drop_handler(p_inbox text, p_if_exists boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._check_inbox_name(p_inbox);
	PERFORM tide._check_flag('p_if_exists', p_if_exists);
	DELETE FROM tide.relay_inbox_handlers WHERE inbox_name = p_inbox;
	IF NOT FOUND THEN
		IF p_if_exists THEN
			RAISE NOTICE 'inbox "%" has no handler, skipping', p_inbox;
			RETURN;
		END IF;
		RAISE EXCEPTION 'inbox "%" has no handler', p_inbox
			USING ERRCODE = 'undefined_object',
				  HINT = 'Pass p_if_exists => true to ignore a missing handler.';
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.inbox_drop_handler(text, boolean)
	IS 'removes an inbox''s handler: the relay no longer processes the inbox; its events stay';
REVOKE ALL ON FUNCTION tide.inbox_drop_handler(text,boolean) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.inbox_drop_handler(text,boolean) TO tide_admin;

-- Enables or disables an inbox's handler, or raises 42704.
CREATE OR REPLACE FUNCTION tide._inbox_handler_enable(p_inbox text, p_enabled boolean)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	PERFORM tide._check_inbox_name(p_inbox);
	UPDATE tide.relay_inbox_handlers SET enabled = p_enabled WHERE inbox_name = p_inbox;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'inbox "%" has no handler', p_inbox
			USING ERRCODE = 'undefined_object',
				  HINT = 'Set one with tide.inbox_set_handler().';
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._inbox_handler_enable(text,boolean) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._inbox_handler_enable(text,boolean) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.inbox_enable_handler(p_inbox text)
RETURNS void
LANGUAGE sql
AS $$
	SELECT tide._inbox_handler_enable(p_inbox, true)
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.inbox_enable_handler(text) IS 'lets the relay run an inbox''s handler again';
REVOKE ALL ON FUNCTION tide.inbox_enable_handler(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.inbox_enable_handler(text) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.inbox_disable_handler(p_inbox text)
RETURNS void
LANGUAGE sql
AS $$
	SELECT tide._inbox_handler_enable(p_inbox, false)
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.inbox_disable_handler(text)
	IS 'stops the relay running an inbox''s handler; pending events wait';
REVOKE ALL ON FUNCTION tide.inbox_disable_handler(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.inbox_disable_handler(text) TO tide_admin;

-- The relay's record of one batch of a handler (relay/inbox_handler.c):
-- the counters, the last failure, the end of a hold; and an operator event
-- "inbox.dead_lettered" for each event dead-lettered.
CREATE OR REPLACE FUNCTION tide._inbox_handler_after_batch(p_inbox text, p_processed int, p_failed int,
														   p_last_error text, p_dead text[], p_dead_errors text[])
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
	INSERT INTO tide.relay_inbox_handler_health AS h
		(inbox_name, processed, failed, dead_lettered, last_success_at, last_failure_at, last_error)
	VALUES (p_inbox, p_processed, p_failed, coalesce(cardinality(p_dead), 0),
			CASE WHEN p_processed > 0 THEN now() END, CASE WHEN p_failed > 0 THEN now() END, p_last_error)
	ON CONFLICT (inbox_name) DO UPDATE
		SET processed = h.processed + EXCLUDED.processed,
			failed = h.failed + EXCLUDED.failed,
			dead_lettered = h.dead_lettered + EXCLUDED.dead_lettered,
			last_success_at = coalesce(EXCLUDED.last_success_at, h.last_success_at),
			last_failure_at = coalesce(EXCLUDED.last_failure_at, h.last_failure_at),
			last_error = coalesce(EXCLUDED.last_error, h.last_error),
			held_since = NULL, held_reason = NULL,
			updated_at = now();
	FOR i IN 1 .. coalesce(cardinality(p_dead), 0) LOOP
		PERFORM tide._relay_operator_event('inbox.dead_lettered', NULL,
			jsonb_build_object('inbox', p_inbox, 'event_id', p_dead[i], 'last_error', p_dead_errors[i]));
	END LOOP;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._inbox_handler_after_batch(text,integer,integer,text,text[],text[]) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;

-- The relay holds a handler for a reason that is not an event's (p_reason;
-- NULL ends the hold).
CREATE OR REPLACE FUNCTION tide._inbox_handler_hold(p_inbox text, p_reason text)
RETURNS void
LANGUAGE sql
AS $$
	INSERT INTO tide.relay_inbox_handler_health AS h (inbox_name, held_since, held_reason)
	SELECT p_inbox, CASE WHEN p_reason IS NOT NULL THEN now() END, p_reason
	 WHERE EXISTS (SELECT FROM tide.relay_inbox_handlers WHERE inbox_name = p_inbox)
	ON CONFLICT (inbox_name) DO UPDATE
		SET held_since = CASE WHEN p_reason IS NULL THEN NULL ELSE coalesce(h.held_since, now()) END,
			held_reason = p_reason, updated_at = now()
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._inbox_handler_hold(text,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;

-- Runs an inbox's handler on one batch of its pending events now, as the
-- relay does (relay/inbox_handler.c), holding one of the inbox's
-- concurrency slots until the caller's transaction ends; returns how many
-- were processed (0 when every slot is taken). For the superuser only: the
-- relay's worker calls the same code.
CREATE OR REPLACE FUNCTION tide._inbox_handle(p_inbox text)
RETURNS bigint
AS 'MODULE_PATHNAME', 'tide_inbox_handle'
LANGUAGE C VOLATILE STRICT
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._inbox_handle(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;

-- Deletes the processed and dead-lettered events past their inbox's
-- retention (0 keeps them), at most p_limit per inbox; returns whether an
-- inbox had more (the relay's periodic jobs, relay/retention.c).
CREATE OR REPLACE FUNCTION tide._inbox_retention(p_limit int)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
	cfg tide.tide_inbox_config;
	n bigint;
	more boolean := false;
BEGIN
	FOR cfg IN SELECT * FROM tide.tide_inbox_config
				WHERE processed_retention_hours > 0 OR dlq_retention_hours > 0 ORDER BY inbox_name LOOP
		-- An inbox dropped meanwhile is passed over.
		BEGIN
			EXECUTE format($sql$
				DELETE FROM %1$s d WHERE d.id IN (
					SELECT t.id FROM %1$s t
					 WHERE ($1 > 0 AND t.processed_at < clock_timestamp() - make_interval(hours => $1))
						OR ($2 > 0 AND t.processed_at IS NULL
							AND t.dead_lettered_at < clock_timestamp() - make_interval(hours => $2))
					 ORDER BY t.id
					 LIMIT $3
					   FOR UPDATE SKIP LOCKED)$sql$, tide._inbox_table(cfg))
				USING cfg.processed_retention_hours, cfg.dlq_retention_hours, p_limit;
			GET DIAGNOSTICS n = ROW_COUNT;
		EXCEPTION WHEN undefined_table THEN
			n := 0;
		END;
		more := more OR n >= p_limit;
	END LOOP;
	RETURN more;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._inbox_retention(integer) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
