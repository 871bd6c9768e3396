-- ---------------------------------------------------------------------------
-- Payload schemas (docs/publishing.md#payload-schemas): the JSON Schema
-- each payload published to an outbox must validate against, per outbox
-- (message_type '') and per message type (the header "type"). Checked in C
-- at publish (src/payload_schema.c) by the module pg_tide-jsonschema.so.
-- ---------------------------------------------------------------------------

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
