-- The schema, and the roles that the grants of every file name.
-- The schema belongs to the extension, so DROP EXTENSION removes it.
CREATE SCHEMA tide;

COMMENT ON SCHEMA tide IS 'pg_tide: outboxes, consumer groups, inboxes and relay pipelines';

DO $$
DECLARE
	r text;
BEGIN
	FOREACH r IN ARRAY ARRAY['tide_admin', 'tide_publisher', 'tide_consumer', 'tide_reader'] LOOP
		IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
			EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
		END IF;
	END LOOP;
END
$$;
