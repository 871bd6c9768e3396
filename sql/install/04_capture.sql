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
