-- ---------------------------------------------------------------------------
-- Inboxes. Each inbox has its own table "<inbox_schema>"."<inbox_name>_inbox"
-- (see docs/inbox.md). Names go into SQL only through format('%I'); values
-- only as parameters of EXECUTE ... USING.
-- ---------------------------------------------------------------------------

-- Additions to tide_inbox_config: the values inbox_create accepts.
ALTER TABLE tide.tide_inbox_config
	ADD CONSTRAINT tide_inbox_config_max_retries_check CHECK (max_retries > 0),
	ADD CONSTRAINT tide_inbox_config_processed_retention_check CHECK (processed_retention_hours >= 0),
	ADD CONSTRAINT tide_inbox_config_dlq_retention_check CHECK (dlq_retention_hours >= 0);

-- An inbox's handler (sql/functions/14_inbox_handlers.sql): the function
-- the relay runs on each of the inbox's pending events, as the role
-- run_as, in batches of config's batch_size (relay/inbox_handler.c).
-- owner: the role that last set it, by name, whose right to act as run_as
-- the relay checks again before every batch; the row's trigger fills it
-- in. config holds batch_size, concurrency and allow_superuser, normalised.
CREATE TABLE tide.relay_inbox_handlers (
	inbox_name	text PRIMARY KEY
		REFERENCES tide.tide_inbox_config (inbox_name) ON DELETE CASCADE ON UPDATE CASCADE,
	handler		regprocedure NOT NULL,
	run_as		text NOT NULL,
	enabled		boolean NOT NULL DEFAULT true,
	config		jsonb NOT NULL DEFAULT '{}',
	owner		text,
	created_at	timestamptz NOT NULL DEFAULT now(),
	updated_at	timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE tide.relay_inbox_handlers
	IS 'Inbox handlers: the function the relay runs on each pending event of an inbox, and the role it runs as';

-- What the relay did with an inbox's handler: events processed, failed
-- attempts and dead letters since counted_since, the last failure, and
-- the relay's hold of the handler (a reason that is not an event's: the
-- function or a right is missing), written in the transaction of each
-- batch.
CREATE TABLE tide.relay_inbox_handler_health (
	inbox_name		text PRIMARY KEY
		REFERENCES tide.relay_inbox_handlers (inbox_name) ON DELETE CASCADE ON UPDATE CASCADE,
	processed		bigint NOT NULL DEFAULT 0,
	failed			bigint NOT NULL DEFAULT 0,
	dead_lettered	bigint NOT NULL DEFAULT 0,
	last_success_at	timestamptz,
	last_failure_at	timestamptz,
	last_error		text,
	held_since		timestamptz,
	held_reason		text,
	counted_since	timestamptz NOT NULL DEFAULT now(),
	updated_at		timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE tide.relay_inbox_handler_health
	IS 'Per inbox handler: events processed, failed attempts, dead letters, the last error and the relay''s hold';

SELECT pg_catalog.pg_extension_config_dump('tide.relay_inbox_handlers', '');

SELECT pg_catalog.pg_extension_config_dump('tide.relay_inbox_handler_health', '');
