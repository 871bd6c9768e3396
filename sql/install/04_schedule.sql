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
