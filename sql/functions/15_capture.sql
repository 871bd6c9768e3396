-- ---------------------------------------------------------------------------
-- Change capture (docs/capture.md): the triggers (src/capture.c), and
-- outbox_capture / outbox_uncapture (src/capture_admin.c), which check the
-- caller's rights themselves and write as the catalog's owner.
-- ---------------------------------------------------------------------------

-- The row trigger of a captured table; only outbox_capture creates it. It
-- runs no SQL of its own (its publish names every object with its schema),
-- so it keeps the writer's search_path, at no cost per row.
CREATE OR REPLACE FUNCTION tide._capture_row()
RETURNS trigger
AS 'MODULE_PATHNAME', 'tide_capture_row'
LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION tide._capture_row() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;

-- The TRUNCATE trigger of a captured table: refuses it, or publishes it.
CREATE OR REPLACE FUNCTION tide._capture_truncate()
RETURNS trigger
AS 'MODULE_PATHNAME', 'tide_capture_truncate'
LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION tide._capture_truncate() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;

CREATE OR REPLACE FUNCTION tide.outbox_capture(p_table regclass, p_outbox text, p_options jsonb DEFAULT '{}')
RETURNS void
AS 'MODULE_PATHNAME', 'tide_outbox_capture'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.outbox_capture(regclass, text, jsonb)
	IS 'publishes every insert, update and delete of a table into an outbox, in the writer''s transaction';
REVOKE ALL ON FUNCTION tide.outbox_capture(regclass,text,jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_capture(regclass,text,jsonb) TO tide_admin, tide_publisher;

CREATE OR REPLACE FUNCTION tide.outbox_uncapture(p_table regclass, p_outbox text DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'tide_outbox_uncapture'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.outbox_uncapture(regclass, text)
	IS 'ends the capture of a table into one outbox, or into every outbox; returns how many ended';
REVOKE ALL ON FUNCTION tide.outbox_uncapture(regclass,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_uncapture(regclass,text) TO tide_admin, tide_publisher;

-- At the end of a DROP: a dropped table's captures go (its triggers went
-- with it), and dropping a key column of a captured table is refused (the
-- key orders its messages).
CREATE OR REPLACE FUNCTION tide._capture_dropped()
RETURNS event_trigger
LANGUAGE plpgsql
AS $$
DECLARE
	r record;
BEGIN
	DELETE FROM tide.outbox_captures c
	 USING pg_catalog.pg_event_trigger_dropped_objects() d
	 WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.objsubid = 0
	   AND c.table_name::pg_catalog.oid = d.objid;
	FOR r IN
		SELECT c.table_name, c.outbox_name, d.address_names[3] AS column_name
		  FROM pg_catalog.pg_event_trigger_dropped_objects() d
		  JOIN tide.outbox_captures c ON c.table_name::pg_catalog.oid = d.objid
		 WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.objsubid <> 0
		   AND c.options -> 'key' ? d.address_names[3]
	LOOP
		RAISE EXCEPTION 'cannot drop column "%" of table %: it is a key column of its capture into outbox "%"',
			r.column_name, r.table_name, r.outbox_name
			USING ERRCODE = 'dependent_objects_still_exist',
				  HINT = 'End the capture with tide.outbox_uncapture() first, or capture the table with another key.';
	END LOOP;
END
$$
SET search_path = pg_catalog, pg_temp
SECURITY DEFINER;
REVOKE ALL ON FUNCTION tide._capture_dropped() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;

-- One chunk of a backfill (src/capture_backfill.c): checks the caller's
-- rights itself, like outbox_capture; returns whether the backfill is done.
CREATE OR REPLACE FUNCTION tide._capture_backfill_chunk(p_table regclass, p_outbox text,
														p_options jsonb, p_first boolean)
RETURNS boolean
AS 'MODULE_PATHNAME', 'tide_capture_backfill_chunk'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._capture_backfill_chunk(regclass,text,jsonb,boolean) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._capture_backfill_chunk(regclass,text,jsonb,boolean) TO tide_admin, tide_publisher;

-- Publishes the rows of a captured table that exist, in key order, one
-- chunk per transaction. A procedure, to commit between chunks: it has no
-- SET clause (a procedure with one cannot commit) and runs no SQL but the
-- call of the chunk, whose statements name their schemas. A chunk locks
-- its rows in key order while the table's writers lock theirs in any
-- order: a chunk chosen as a deadlock's victim is run again (at most 100
-- times in a row), nothing of it having been written.
CREATE OR REPLACE PROCEDURE tide.outbox_backfill(p_table regclass, p_outbox text, p_options jsonb DEFAULT '{}')
LANGUAGE plpgsql
AS $$
DECLARE
	done boolean := false;
	first boolean := true;
	retries int := 0;
BEGIN
	LOOP
		BEGIN
			done := tide._capture_backfill_chunk(p_table, p_outbox, p_options, first);
			first := false;
			retries := 0;
		EXCEPTION WHEN deadlock_detected OR serialization_failure OR lock_not_available THEN
			retries := retries OPERATOR(pg_catalog.+) 1;
			IF retries OPERATOR(pg_catalog.>) 100 THEN
				RAISE;
			END IF;
		END;
		COMMIT;
		EXIT WHEN done;
	END LOOP;
END
$$;
COMMENT ON PROCEDURE tide.outbox_backfill(regclass, text, jsonb)
	IS 'publishes the existing rows of a captured table in key order, committing per chunk; resumes after a crash';
REVOKE ALL ON PROCEDURE tide.outbox_backfill(regclass,text,jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON PROCEDURE tide.outbox_backfill(regclass,text,jsonb) TO tide_admin, tide_publisher;

-- Refuses to delete an outbox (tide.outbox_drop) into which a table is
-- captured: its triggers would fail every write of the table.
CREATE OR REPLACE FUNCTION tide._capture_outbox_deleted()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
	captured text;
BEGIN
	SELECT string_agg(c.table_name::text, ', ' ORDER BY c.table_name::text) INTO captured
	  FROM tide.outbox_captures c WHERE c.outbox_name = OLD.outbox_name;
	IF captured IS NOT NULL THEN
		RAISE EXCEPTION 'cannot drop outbox "%": tables are captured into it', OLD.outbox_name
			USING ERRCODE = 'dependent_objects_still_exist',
				  DETAIL = format('Captured: %s.', captured),
				  HINT = 'End the captures with tide.outbox_uncapture() first.';
	END IF;
	RETURN OLD;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._capture_outbox_deleted() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._capture_outbox_deleted() TO tide_admin;
