-- State changes from 0.1.0 to 0.2.0, run before the functions, views and
-- privileges (which the update script re-creates from the same files as a
-- fresh install). A new table, column or index of 0.2.0 is written here
-- once, and into sql/install/ for fresh installs.

-- tide.commit_offset does its work in C (src/commit.c), as does the commit
-- of tide.poll_outbox(..., p_commit_upto): the internal PL/pgSQL function
-- of 0.1.0 that did it goes.
DROP FUNCTION tide._commit_offset(text, text, bigint);

-- A pipeline config is validated in C (relay/pipeline_config.c), once for
-- relay_set_outbox, the row trigger and the relay worker: the PL/pgSQL
-- validators of 0.1.0 go, and so does the trigger that checked only a file
-- pipeline's permission (tide._relay_config_check replaces it, created in
-- 0.1.0--0.2.0.post.sql once the functions exist). The C symbol of
-- tide._relay_url_host_class stays in the library for 0.1.0 databases.
DROP TRIGGER relay_outbox_config_file_sink ON tide.relay_outbox_config;
DROP FUNCTION tide._relay_check_file_sink();
DROP FUNCTION tide._relay_webhook_config(jsonb);
DROP FUNCTION tide._relay_file_config(jsonb);
DROP FUNCTION tide._relay_routing(jsonb);
DROP FUNCTION tide._relay_pacing_config(jsonb);
DROP FUNCTION tide._relay_alerts_config(jsonb);
DROP FUNCTION tide._relay_check_secret(jsonb);
DROP FUNCTION tide._relay_check_secret_ref(text, jsonb);
DROP FUNCTION tide._relay_check_url(text, boolean, boolean);
DROP FUNCTION tide._relay_url_host_class(text);
DROP FUNCTION tide._relay_check_keys(jsonb, text[], text);
DROP FUNCTION tide._relay_choice(jsonb, text, text[], text);
DROP FUNCTION tide._relay_bool(jsonb, text, boolean);
DROP FUNCTION tide._relay_int(jsonb, text, text, bigint, bigint, bigint);
DROP FUNCTION tide._relay_number_text(numeric);
DROP FUNCTION tide._relay_check_type(text, jsonb, text, text);
DROP FUNCTION tide._relay_bad_config(text, text);

-- A config is redacted in C from the secret keys each sink declares
-- (relay/endpoints/redact.c): the rule on header names lives there now.
DROP FUNCTION tide._relay_secret_header(text);

-- What only the relay worker knows, for relay_pipeline_status: its hold of
-- a pipeline and the ERROR that ended the pipeline's last turn
-- (relay/pipeline_state.c).
ALTER TABLE tide.relay_pipeline_health
	ADD COLUMN held_since timestamptz,
	ADD COLUMN held_until timestamptz,
	ADD COLUMN held_reason text,
	ADD COLUMN turn_error text,
	ADD COLUMN turn_error_since timestamptz,
	ADD COLUMN turn_errors int NOT NULL DEFAULT 0;

COMMENT ON TABLE tide.relay_pipeline_health
	IS 'Per pipeline: consecutive failed attempts, last success, last failure and its error, the worker''s hold and the error that ended its last turn';

-- Every view and function output names the pipeline "pipeline": the
-- column "name" of relay_list_configs is renamed, which changes its
-- return type.
DROP FUNCTION tide.relay_list_configs();

-- relay_pipeline_status gains columns after "health" (a changed column
-- list, which CREATE OR REPLACE VIEW cannot make).
DROP VIEW tide.relay_pipeline_status;

-- tide.relay_workers() returns two more columns (worker_index, pipelines):
-- a new return type, so the function is re-created.
DROP FUNCTION tide.relay_workers();

-- "ordering": "key" (relay/ordering.c): each queued message's ordering key,
-- indexed by its hash (a key may be longer than a btree entry can be).
ALTER TABLE tide.relay_retry_queue ADD COLUMN ordering_key text;
CREATE INDEX relay_retry_queue_key ON tide.relay_retry_queue
	(pipeline_id, pg_catalog.hashtextextended(ordering_key, 0), message_id);

-- The attempt log's index of a message's attempts is on the message id
-- alone: each row a batch writes costs one integer comparison per level
-- instead of a text comparison in the database's collation.
DROP INDEX tide.relay_attempts_message;
CREATE INDEX relay_attempts_message ON tide.relay_attempts (message_id);

-- tide.poll_outbox gains p_commit_upto (acknowledge the last batch and
-- lease the next in one call): a new signature, so the function is
-- re-created.
DROP FUNCTION tide.poll_outbox(text, text, integer, integer);

-- The message table's children (sql/install/01_catalog.sql): 0.1.0's
-- messages stay in tide_outbox_messages itself, where retention deletes
-- them row by row as before; new messages go to the children that
-- tide._outbox_partitions_maintain() creates.
CREATE TABLE tide.tide_outbox_partitions (
	first_id		bigint PRIMARY KEY,
	last_id			bigint NOT NULL,
	table_name		text NOT NULL UNIQUE,
	created_at		timestamptz NOT NULL DEFAULT now(),
	closed_at		timestamptz,
	CONSTRAINT tide_outbox_partitions_range_check CHECK (first_id <= last_id)
);

COMMENT ON TABLE tide.tide_outbox_partitions
	IS 'Child tables of tide_outbox_messages, each holding one range of message ids';

SELECT pg_catalog.pg_extension_config_dump('tide.tide_outbox_partitions', '');

-- The role whose rights the server files a pipeline names are checked
-- with (relay/config_files.c). A 0.1.0 pipeline names no such file (a
-- file pipeline was checked for pg_write_server_files when it was set), so
-- it keeps working as the extension's owner's.
ALTER TABLE tide.relay_outbox_config ADD COLUMN owner text;
UPDATE tide.relay_outbox_config
   SET owner = (SELECT r.rolname FROM pg_catalog.pg_extension e
				  JOIN pg_catalog.pg_roles r ON r.oid = e.extowner
				 WHERE e.extname = 'pg_tide');

-- Backpressure only where the user set a limit: a new outbox has no
-- inline_threshold unless one is given. An existing outbox keeps the one it
-- has (only the default changes), and its last announced
-- outbox.backpressure level starts at 0.
ALTER TABLE tide.tide_outbox_config
	ALTER COLUMN inline_threshold DROP NOT NULL,
	ALTER COLUMN inline_threshold DROP DEFAULT,
	ADD COLUMN backpressure_level smallint NOT NULL DEFAULT 0,
	ADD CONSTRAINT tide_outbox_config_backpressure_check CHECK (backpressure_level IN (0, 80, 100));

-- tide.outbox_drop gains p_cascade and tide.relay_delete p_keep_group:
-- new signatures, so the functions are re-created.
DROP FUNCTION tide.outbox_drop(text, boolean);
DROP FUNCTION tide.relay_delete(text);

-- A pipeline's delivery counters, kept whatever "attempt_log" says
-- (tide._relay_after_batch), which takes the batch's dead letters, retries
-- and failed attempts' classes: a new signature, so the function of 0.1.0
-- goes. Counting starts with the update.
ALTER TABLE tide.relay_pipeline_health
	ADD COLUMN delivered bigint NOT NULL DEFAULT 0,
	ADD COLUMN failed bigint NOT NULL DEFAULT 0,
	ADD COLUMN failed_by_class jsonb NOT NULL DEFAULT '{}',
	ADD COLUMN retried bigint NOT NULL DEFAULT 0,
	ADD COLUMN dead_lettered bigint NOT NULL DEFAULT 0,
	ADD COLUMN counted_since timestamptz NOT NULL DEFAULT now(),
	ADD COLUMN rate_minute timestamptz,
	ADD COLUMN delivered_in_minute bigint NOT NULL DEFAULT 0,
	ADD COLUMN delivered_minute_before bigint NOT NULL DEFAULT 0;

COMMENT ON TABLE tide.relay_pipeline_health
	IS 'Per pipeline: consecutive failed attempts, last success, last failure and its error, the worker''s hold and the error that ended its last turn, and its delivery counters';

DROP FUNCTION tide._relay_after_batch(text, integer, integer, integer, text, text, bigint[], text, integer);

-- Reverse pipelines (source -> inbox) are set with tide.relay_set_inbox and
-- validated in C as forward ones are (relay/reverse_config.c): a row of
-- relay_inbox_config records its owner as relay_outbox_config does. A row
-- that 0.1.0 accepted unchecked keeps its config: the relay worker checks
-- every row it reads and passes over one it refuses, saying why.
ALTER TABLE tide.relay_inbox_config ADD COLUMN owner text;
UPDATE tide.relay_inbox_config
   SET owner = (SELECT r.rolname FROM pg_catalog.pg_extension e
				  JOIN pg_catalog.pg_roles r ON r.oid = e.extowner
				 WHERE e.extname = 'pg_tide');

-- A reverse pipeline's position in its source, whatever form the source
-- needs (a remote outbox id, offsets per partition, a stream id).
ALTER TABLE tide.relay_consumer_offsets ADD COLUMN source_position jsonb;
COMMENT ON COLUMN tide.relay_consumer_offsets.source_position
	IS 'a reverse pipeline''s position in its source, in the form its source type needs; NULL for a forward pipeline';

-- Inbox handlers (sql/install/02_inbox.sql): the function the relay runs on
-- an inbox's pending events, and what it did with it.
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

-- A reverse pipeline's dead letter keeps the event's id in its inbox, so
-- that tide.relay_dlq_retry stores it there under that id (0.1.0 has no
-- reverse pipelines: its dead letters are all forward ones, NULL).
ALTER TABLE tide.relay_dlq ADD COLUMN event_id text;
COMMENT ON COLUMN tide.relay_dlq.event_id
	IS 'a reverse pipeline''s dead letter: the event''s id in its inbox; NULL for a forward pipeline''s';

-- tide.relay_dlq_list returns the event id too: a new return type, so the
-- function is re-created.
DROP FUNCTION tide.relay_dlq_list(text, integer);

-- Change capture (sql/install/04_capture.sql).
CREATE TABLE tide.outbox_captures (
	table_name	regclass NOT NULL,
	outbox_name	text NOT NULL REFERENCES tide.tide_outbox_config (outbox_name),
	options		jsonb NOT NULL,
	owner		regrole,
	created_at	timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (table_name, outbox_name)
);

COMMENT ON TABLE tide.outbox_captures
	IS 'Tables whose inserts, updates and deletes are published into an outbox by a trigger, with the options normalised';

SELECT pg_catalog.pg_extension_config_dump('tide.outbox_captures', '');

-- The progress of tide.outbox_backfill: the last key whose chunk committed
-- (src/capture_backfill.c). A capture's end ends its backfill.
CREATE TABLE tide.outbox_backfills (
	table_name		regclass NOT NULL,
	outbox_name		text NOT NULL,
	last_key		jsonb,
	rows_published	bigint NOT NULL DEFAULT 0,
	started_at		timestamptz NOT NULL DEFAULT now(),
	updated_at		timestamptz NOT NULL DEFAULT now(),
	finished_at		timestamptz,
	PRIMARY KEY (table_name, outbox_name),
	FOREIGN KEY (table_name, outbox_name)
		REFERENCES tide.outbox_captures (table_name, outbox_name) ON DELETE CASCADE
);

COMMENT ON TABLE tide.outbox_backfills
	IS 'The progress of each backfill of a captured table: the last key published, rows, when it finished';

SELECT pg_catalog.pg_extension_config_dump('tide.outbox_backfills', '');

-- Publish-side idempotency keys (sql/install/01_catalog.sql,
-- src/idempotency.c): each outbox's window, and the keys. tide.outbox_publish
-- gains p_idempotency_key and tide.outbox_publish_batch
-- p_idempotency_keys: new signatures, so the functions are re-created.
ALTER TABLE tide.tide_outbox_config
	ADD COLUMN idempotency_window interval NOT NULL DEFAULT '24 hours',
	ADD CONSTRAINT tide_outbox_config_idempotency_window_check CHECK (idempotency_window > '0');

CREATE TABLE tide.outbox_idempotency_keys (
	outbox_name		text NOT NULL,
	idempotency_key	text NOT NULL,
	message_id		bigint,
	created_at		timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (outbox_name, idempotency_key)
);

COMMENT ON TABLE tide.outbox_idempotency_keys
	IS 'Idempotency keys of recent publishes and the id of the message each published';

SELECT pg_catalog.pg_extension_config_dump('tide.outbox_idempotency_keys', '');

DROP FUNCTION tide.outbox_publish(text, jsonb, jsonb);
DROP FUNCTION tide.outbox_publish_batch(text, jsonb[], jsonb);

-- Expiring messages (docs/scheduled-messages.md): a nullable column, so no
-- rewrite; it reaches the child tables of tide_outbox_messages through
-- inheritance. A consumer's count of the expired messages its polls passed.
-- tide.outbox_publish and tide.outbox_publish_batch gain p_expires_at: the
-- 0.1.0 signatures are dropped above, the new ones created with the functions.
ALTER TABLE tide.tide_outbox_messages ADD COLUMN expires_at timestamptz;
ALTER TABLE tide.tide_consumer_offsets ADD COLUMN expired bigint NOT NULL DEFAULT 0;
-- A forward pipeline dead-letters an expired message with reason and error
-- class "expired" and counts it (tide._relay_after_batch gains p_expired;
-- its 0.1.0 signature is dropped above).
ALTER TABLE tide.relay_pipeline_health ADD COLUMN expired bigint NOT NULL DEFAULT 0;
ALTER TABLE tide.relay_dlq DROP CONSTRAINT relay_dlq_reason_check,
	ADD CONSTRAINT relay_dlq_reason_check CHECK (reason IN ('permanent', 'exhausted', 'expired'));

-- Payload schemas (sql/install/04_payload_schemas.sql).
CREATE TABLE tide.outbox_schemas (
	outbox_name		text NOT NULL REFERENCES tide.tide_outbox_config (outbox_name) ON DELETE CASCADE,
	message_type	text NOT NULL DEFAULT '',
	schema			jsonb NOT NULL,
	draft			text NOT NULL CHECK (draft IN ('2020-12', 'draft-07')),
	updated_at		timestamptz NOT NULL DEFAULT now(),
	updated_by		regrole,
	PRIMARY KEY (outbox_name, message_type)
);

COMMENT ON TABLE tide.outbox_schemas
	IS 'Per outbox and message type ('''' for the outbox''s default): the JSON Schema its payloads must validate against';

SELECT pg_catalog.pg_extension_config_dump('tide.outbox_schemas', '');
-- ---------------------------------------------------------------------------
-- Scheduled messages (docs/scheduled-messages.md). A scheduled message is
-- not in the outbox before its time: it waits here, and a move
-- (tide.outbox_release_due, the relay) deletes it and publishes it into the
-- outbox in one transaction, where it gets its message id. Its own
-- sequence keeps a schedule's id from ever being taken for a message's.
-- ---------------------------------------------------------------------------

CREATE SEQUENCE tide.outbox_scheduled_id_seq;

CREATE TABLE tide.outbox_scheduled (
	id				bigint PRIMARY KEY DEFAULT nextval('tide.outbox_scheduled_id_seq'),
	outbox_name		text NOT NULL REFERENCES tide.tide_outbox_config (outbox_name) ON DELETE CASCADE,
	deliver_at		timestamptz NOT NULL,
	payload			jsonb NOT NULL,
	headers			jsonb,
	scheduled_by	regrole NOT NULL,
	scheduled_at	timestamptz NOT NULL DEFAULT now(),
	-- a row its outbox refused at its move (a payload schema set since it
	-- was scheduled): kept, no longer moved, until unscheduled
	refused_at		timestamptz,
	refused_reason	text,
	-- carried into the message at its move
	expires_at		timestamptz
);

ALTER SEQUENCE tide.outbox_scheduled_id_seq OWNED BY tide.outbox_scheduled.id;

COMMENT ON TABLE tide.outbox_scheduled
	IS 'Messages scheduled for later delivery, moved into their outbox at deliver_at';

-- The moves take the due rows in this order.
CREATE INDEX outbox_scheduled_due ON tide.outbox_scheduled (deliver_at, id);

SELECT pg_catalog.pg_extension_config_dump('tide.outbox_scheduled', '');

SELECT pg_catalog.pg_extension_config_dump('tide.outbox_scheduled_id_seq', '');
