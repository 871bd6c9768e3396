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
