-- ---------------------------------------------------------------------------
-- Change capture (docs/capture.md): one row per table captured into an
-- outbox, written by tide.outbox_capture with the triggers that capture
-- (src/capture_admin.c), removed by tide.outbox_uncapture and, when the
-- table is dropped, by the event trigger tide_capture_dropped.
-- ---------------------------------------------------------------------------

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
