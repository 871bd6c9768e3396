-- ---------------------------------------------------------------------------
-- Catalog (seed 003: names and types kept exactly; additions documented in
-- docs/catalog.md)
-- ---------------------------------------------------------------------------

CREATE TABLE tide.tide_outbox_config (
	outbox_name			text PRIMARY KEY,
	retention_hours		int NOT NULL DEFAULT 24,
	-- NULL: no limit; publishing is refused only above a limit the user set
	inline_threshold	int,
	enabled				boolean NOT NULL DEFAULT true,
	created_at			timestamptz NOT NULL DEFAULT now(),
	-- The last outbox.backpressure level announced (0, 80 or 100 % of
	-- inline_threshold), so that each crossing is announced once.
	backpressure_level	smallint NOT NULL DEFAULT 0,
	-- How long a publish's idempotency key is remembered (docs/publishing.md).
	idempotency_window	interval NOT NULL DEFAULT '24 hours',
	CONSTRAINT tide_outbox_config_retention_check CHECK (retention_hours > 0),
	CONSTRAINT tide_outbox_config_threshold_check CHECK (inline_threshold > 0),
	CONSTRAINT tide_outbox_config_backpressure_check CHECK (backpressure_level IN (0, 80, 100)),
	CONSTRAINT tide_outbox_config_idempotency_window_check CHECK (idempotency_window > '0')
);

COMMENT ON TABLE tide.tide_outbox_config IS 'One row per named outbox';

-- The idempotency keys publishes gave (src/idempotency.c). A row is written
-- with its message's transaction, so a concurrent publish of the same key
-- waits on the primary key for that transaction's outcome. message_id
-- names no message row: a message that retention deleted while its key is
-- inside the window is still the answer. Internal: nothing is granted on it.
CREATE TABLE tide.outbox_idempotency_keys (
	outbox_name		text NOT NULL,
	idempotency_key	text NOT NULL,
	message_id		bigint,
	created_at		timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (outbox_name, idempotency_key)
);

COMMENT ON TABLE tide.outbox_idempotency_keys
	IS 'Idempotency keys of recent publishes and the id of the message each published';

-- CACHE 1 matters: a per-backend cache would let a backend hold ids far
-- below the value a reader sees, and the safe horizon would not cover them.
CREATE SEQUENCE tide.tide_outbox_messages_id_seq CACHE 1;

-- outbox_name names a row of tide_outbox_config. A foreign key would lock
-- that row for every message published (concurrent publishers of one outbox
-- then share the lock through multixacts): outbox_publish and outbox_drop
-- keep the reference instead (see outbox_drop and src/outbox.c).
CREATE TABLE tide.tide_outbox_messages (
	id				bigint PRIMARY KEY,
	outbox_name		text NOT NULL,
	payload			jsonb NOT NULL,
	headers			jsonb,
	created_at		timestamptz NOT NULL DEFAULT now(),
	consumed_at		timestamptz,
	consumer_group	text,
	-- after it, the message is passed, not delivered (docs/scheduled-messages.md)
	expires_at		timestamptz
);

ALTER SEQUENCE tide.tide_outbox_messages_id_seq OWNED BY tide.tide_outbox_messages.id;

COMMENT ON TABLE tide.tide_outbox_messages IS 'Shared message store for all outboxes';

CREATE INDEX idx_tide_outbox_messages_pending
	ON tide.tide_outbox_messages (outbox_name, id)
	WHERE consumed_at IS NULL;

-- The message table's children (docs/catalog.md). Each child table
-- tide.tide_outbox_messages_<first_id> inherits tide_outbox_messages, holds
-- the ids first_id to last_id (this table says so) and has one index, on
-- (outbox_name, id). tide._outbox_partitions_maintain() creates them
-- ahead of the ids handed out; a publish writes into the child that holds
-- its id, or into the parent when none does; retention drops a child whole
-- once every participant of every outbox has passed it (12_retention.sql).
-- closed_at: when retention first saw every id of the child handed out by
-- a transaction that has ended.
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

CREATE TABLE tide.tide_consumer_groups (
	group_name			text PRIMARY KEY,
	outbox_name			text NOT NULL
		REFERENCES tide.tide_outbox_config (outbox_name) ON DELETE CASCADE,
	auto_offset_reset	text NOT NULL DEFAULT 'earliest',
	created_at			timestamptz NOT NULL DEFAULT now(),
	-- Highest message id ever handed out to a consumer of the group; NULL
	-- while a group created with 'none' has no position yet.
	leased_upto			bigint,
	CONSTRAINT tide_consumer_groups_reset_check
		CHECK (auto_offset_reset IN ('earliest', 'latest', 'none'))
);

CREATE INDEX tide_consumer_groups_outbox_idx ON tide.tide_consumer_groups (outbox_name);

COMMENT ON TABLE tide.tide_consumer_groups IS 'Named consumer groups with offset reset policy';

CREATE TABLE tide.tide_consumer_offsets (
	group_name			text NOT NULL
		REFERENCES tide.tide_consumer_groups (group_name) ON DELETE CASCADE,
	consumer_id			text NOT NULL,
	committed_offset	bigint NOT NULL DEFAULT 0,
	last_heartbeat		timestamptz NOT NULL DEFAULT now(),
	-- expired messages this consumer's polls passed (docs/scheduled-messages.md)
	expired				bigint NOT NULL DEFAULT 0,
	PRIMARY KEY (group_name, consumer_id)
);

COMMENT ON TABLE tide.tide_consumer_offsets IS 'Per-consumer committed offsets and heartbeats';

CREATE TABLE tide.tide_consumer_leases (
	group_name		text NOT NULL,
	consumer_id		text NOT NULL,
	lease_start		bigint NOT NULL,
	lease_end		bigint NOT NULL,
	expires_at		timestamptz NOT NULL,
	PRIMARY KEY (group_name, consumer_id),
	FOREIGN KEY (group_name, consumer_id)
		REFERENCES tide.tide_consumer_offsets (group_name, consumer_id) ON DELETE CASCADE,
	CONSTRAINT tide_consumer_leases_range_check CHECK (lease_start <= lease_end)
);

COMMENT ON TABLE tide.tide_consumer_leases IS 'Visibility leases for in-flight message batches';

CREATE TABLE tide.tide_inbox_config (
	inbox_name					text PRIMARY KEY,
	inbox_schema				text NOT NULL DEFAULT 'tide',
	max_retries					int NOT NULL DEFAULT 3,
	processed_retention_hours	int NOT NULL DEFAULT 72,
	dlq_retention_hours			int NOT NULL DEFAULT 0,
	created_at					timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE tide.tide_inbox_config IS 'Named inbox configurations';

-- owner: the role that last set the pipeline, by name (a dump restores it
-- by name), whose rights the relay checks the server files the config
-- names with, when the pipeline is set and at every reading by the worker
-- (relay/config_files.c); the row's trigger fills it in. NULL, or a role
-- that no longer exists: no rights.
CREATE TABLE tide.relay_outbox_config (
	name		text PRIMARY KEY,
	enabled		boolean NOT NULL DEFAULT true,
	config		jsonb NOT NULL,
	owner		text
);

COMMENT ON TABLE tide.relay_outbox_config IS 'Forward relay pipeline definitions (outbox to sink)';

-- owner: as relay_outbox_config's, the role that last set the pipeline,
-- whose rights the server files its config names are checked with.
CREATE TABLE tide.relay_inbox_config (
	name		text PRIMARY KEY,
	enabled		boolean NOT NULL DEFAULT true,
	config		jsonb NOT NULL,
	owner		text
);

COMMENT ON TABLE tide.relay_inbox_config IS 'Reverse relay pipeline definitions (source to inbox)';

CREATE TABLE tide.relay_consumer_offsets (
	relay_group_id	text NOT NULL,
	pipeline_id		text NOT NULL,
	outbox_name		text NOT NULL,
	last_change_id	bigint NOT NULL DEFAULT 0,
	updated_at		timestamptz NOT NULL DEFAULT now(),
	source_position	jsonb,
	PRIMARY KEY (relay_group_id, pipeline_id, outbox_name)
);

COMMENT ON TABLE tide.relay_consumer_offsets IS 'Durable per-pipeline delivery offset';
-- A reverse pipeline's row: relay_group_id 'reverse', outbox_name its inbox.
COMMENT ON COLUMN tide.relay_consumer_offsets.source_position
	IS 'a reverse pipeline''s position in its source, in the form its source type needs; NULL for a forward pipeline';

-- A message whose delivery failed by its own answer waits here for its next
-- attempt (relay/worker.c), with a copy of the message, so the pipeline's
-- offset can move past it; an operator's redelivery (relay_dlq_retry,
-- relay_retry_message, relay_replay) puts messages here too, marked
-- manual. pipeline_id is the pipeline's name. ordering_key is the
-- message's key with "ordering": "key" (relay/ordering.c; NULL: none): a
-- key is held back while an entry of it waits here, and only its entries
-- with no earlier one still waiting for its time are taken. A key comes
-- from a message and may be of any length, so its index holds a hash of
-- it (a btree entry must fit in a third of a page): the queries compare
-- the hashes to find the entries, then the keys in full.
CREATE TABLE tide.relay_retry_queue (
	pipeline_id			text NOT NULL,
	outbox_name			text NOT NULL,
	message_id			bigint NOT NULL,
	payload				jsonb NOT NULL,
	headers				jsonb,
	created_at			timestamptz NOT NULL,
	attempts			int NOT NULL,
	next_attempt_at		timestamptz NOT NULL,
	manual				boolean NOT NULL DEFAULT false,
	first_failed_at		timestamptz NOT NULL DEFAULT now(),
	last_status			int,
	last_error_class	text,
	last_error			text,
	ordering_key		text,
	PRIMARY KEY (pipeline_id, message_id)
);

CREATE INDEX relay_retry_queue_due ON tide.relay_retry_queue (pipeline_id, next_attempt_at);
CREATE INDEX relay_retry_queue_key ON tide.relay_retry_queue
	(pipeline_id, pg_catalog.hashtextextended(ordering_key, 0), message_id);

COMMENT ON TABLE tide.relay_retry_queue
	IS 'Messages waiting for another delivery attempt, per pipeline';

-- A message that failed permanently or ran out of attempts, with a copy of
-- the message and the last failure. A reverse pipeline's dead letter is an
-- event its inbox refused (relay/flow_reverse.c): outbox_name is the inbox,
-- message_id the event's number at its source, and event_id its id in the
-- inbox, which a retry stores it under (NULL for a forward pipeline's).
CREATE TABLE tide.relay_dlq (
	id					bigserial PRIMARY KEY,
	pipeline_id			text NOT NULL,
	outbox_name			text NOT NULL,
	message_id			bigint NOT NULL,
	payload				jsonb NOT NULL,
	headers				jsonb,
	created_at			timestamptz NOT NULL,
	attempts			int NOT NULL,
	reason				text NOT NULL,
	last_status			int,
	last_error_class	text,
	last_error			text,
	first_failed_at		timestamptz NOT NULL,
	dead_lettered_at	timestamptz NOT NULL DEFAULT now(),
	event_id			text,
	CONSTRAINT relay_dlq_message_key UNIQUE (pipeline_id, message_id),
	CONSTRAINT relay_dlq_reason_check CHECK (reason IN ('permanent', 'exhausted', 'expired'))
);

CREATE INDEX relay_dlq_dead_lettered_at ON tide.relay_dlq (dead_lettered_at);

COMMENT ON TABLE tide.relay_dlq
	IS 'Dead letters: messages a pipeline could not deliver, kept until retried or purged';
COMMENT ON COLUMN tide.relay_dlq.event_id
	IS 'a reverse pipeline''s dead letter: the event''s id in its inbox; NULL for a forward pipeline''s';

-- One row per delivery attempt, written by the relay worker in the
-- transaction that records the batch (relay/attempt_log.c), unless the
-- pipeline's config says "attempt_log": false. Rows older than
-- pg_tide.attempt_log_retention are deleted by the worker.
CREATE TABLE tide.relay_attempts (
	id					bigserial PRIMARY KEY,
	pipeline_id			text NOT NULL,
	outbox_name			text NOT NULL,
	message_id			bigint NOT NULL,
	attempt				int NOT NULL,
	manual				boolean NOT NULL DEFAULT false,
	status				text NOT NULL,
	response_code		int,
	error_class			text,
	error				text,
	latency_ms			real,
	response_snippet	text,
	attempted_at		timestamptz NOT NULL DEFAULT now(),
	CONSTRAINT relay_attempts_status_check CHECK (status IN ('success', 'failed'))
);

-- the attempts of a message (by its id alone: an integer key is what each
-- insert compares cheaply, where a pipeline name would be compared as text
-- in the database's collation); the failures of a pipeline; retention
CREATE INDEX relay_attempts_message ON tide.relay_attempts (message_id);

CREATE INDEX relay_attempts_failures ON tide.relay_attempts (pipeline_id, attempted_at)
	WHERE status = 'failed';

CREATE INDEX relay_attempts_attempted_at ON tide.relay_attempts USING brin (attempted_at);

COMMENT ON TABLE tide.relay_attempts
	IS 'Delivery attempts: one row per request a pipeline made, with its outcome';

-- A pipeline's health as its relay worker last recorded it, in the
-- transaction that records each batch: failures in a row since the last
-- success, when each last happened, the last error, the circuit breaker's
-- state and how many messages its routing passed over. And what only the
-- worker knows (relay/pipeline_state.c): whether it holds the pipeline
-- (since and until when, and why; a batch recorded after the hold ends
-- clears it), and whether its last turn ended in an ERROR (the message,
-- since when, how many turns in a row; a turn without one clears it).
-- Its delivery counters, whatever "attempt_log" says, written by the same
-- statement of the record transaction (tide._relay_after_batch), so they
-- commit with the offsets they count: messages delivered, failed attempts
-- (in all and by error class), failed attempts queued for another try,
-- messages dead-lettered, since counted_since; and the deliveries of the
-- minute rate_minute and of the minute before, from which
-- relay_pipeline_status estimates the deliveries of the last 60 seconds.
-- No index holds a counted column, so the update is a HOT one.
CREATE TABLE tide.relay_pipeline_health (
	pipeline_id				text PRIMARY KEY,
	consecutive_failures	int NOT NULL DEFAULT 0,
	last_success_at			timestamptz,
	last_failure_at			timestamptz,
	last_status				int,
	last_error_class		text,
	last_error				text,
	breaker					text,
	filtered				bigint NOT NULL DEFAULT 0,
	updated_at				timestamptz NOT NULL DEFAULT now(),
	held_since				timestamptz,
	held_until				timestamptz,
	held_reason				text,
	turn_error				text,
	turn_error_since		timestamptz,
	turn_errors				int NOT NULL DEFAULT 0,
	delivered				bigint NOT NULL DEFAULT 0,
	failed					bigint NOT NULL DEFAULT 0,
	failed_by_class			jsonb NOT NULL DEFAULT '{}',
	retried					bigint NOT NULL DEFAULT 0,
	dead_lettered			bigint NOT NULL DEFAULT 0,
	counted_since			timestamptz NOT NULL DEFAULT now(),
	rate_minute				timestamptz,
	delivered_in_minute		bigint NOT NULL DEFAULT 0,
	delivered_minute_before	bigint NOT NULL DEFAULT 0,
	-- of the dead letters, the messages that expired before they were sent
	expired					bigint NOT NULL DEFAULT 0
);

COMMENT ON TABLE tide.relay_pipeline_health
	IS 'Per pipeline: consecutive failed attempts, last success, last failure and its error, the worker''s hold and the error that ended its last turn, and its delivery counters';

-- User data survives pg_dump.
SELECT pg_catalog.pg_extension_config_dump('tide.tide_outbox_config', '');

SELECT pg_catalog.pg_extension_config_dump('tide.tide_outbox_messages', '');

SELECT pg_catalog.pg_extension_config_dump('tide.outbox_idempotency_keys', '');

SELECT pg_catalog.pg_extension_config_dump('tide.tide_outbox_messages_id_seq', '');

SELECT pg_catalog.pg_extension_config_dump('tide.tide_outbox_partitions', '');

SELECT pg_catalog.pg_extension_config_dump('tide.tide_consumer_groups', '');

SELECT pg_catalog.pg_extension_config_dump('tide.tide_consumer_offsets', '');

SELECT pg_catalog.pg_extension_config_dump('tide.tide_consumer_leases', '');

SELECT pg_catalog.pg_extension_config_dump('tide.tide_inbox_config', '');

SELECT pg_catalog.pg_extension_config_dump('tide.relay_outbox_config', '');

SELECT pg_catalog.pg_extension_config_dump('tide.relay_inbox_config', '');

SELECT pg_catalog.pg_extension_config_dump('tide.relay_consumer_offsets', '');

SELECT pg_catalog.pg_extension_config_dump('tide.relay_retry_queue', '');

SELECT pg_catalog.pg_extension_config_dump('tide.relay_dlq', '');

SELECT pg_catalog.pg_extension_config_dump('tide.relay_dlq_id_seq', '');

SELECT pg_catalog.pg_extension_config_dump('tide.relay_attempts', '');

SELECT pg_catalog.pg_extension_config_dump('tide.relay_attempts_id_seq', '');

SELECT pg_catalog.pg_extension_config_dump('tide.relay_pipeline_health', '');
