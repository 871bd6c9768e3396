-- ---------------------------------------------------------------------------
-- Scheduled messages (docs/scheduled-messages.md): tide.outbox_schedule and
-- tide.outbox_unschedule in C (src/schedule.c), the move here.
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION tide.outbox_schedule(p_name text, p_payload jsonb,
												p_headers jsonb DEFAULT NULL,
												p_deliver_at timestamptz DEFAULT NULL,
												p_expires_at timestamptz DEFAULT NULL)
RETURNS bigint
LANGUAGE C
AS 'MODULE_PATHNAME', 'tide_outbox_schedule';
COMMENT ON FUNCTION tide.outbox_schedule(text, jsonb, jsonb, timestamptz, timestamptz)
	IS 'schedules a message for delivery at or after p_deliver_at, passed instead after p_expires_at; returns the schedule''s id';
REVOKE ALL ON FUNCTION tide.outbox_schedule(text,jsonb,jsonb,timestamptz,timestamptz) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_schedule(text,jsonb,jsonb,timestamptz,timestamptz) TO tide_admin, tide_publisher;

CREATE OR REPLACE FUNCTION tide.outbox_unschedule(p_name text, p_id bigint)
RETURNS boolean
LANGUAGE C
AS 'MODULE_PATHNAME', 'tide_outbox_unschedule';
COMMENT ON FUNCTION tide.outbox_unschedule(text, bigint)
	IS 'removes a scheduled message that has not been moved into its outbox; returns whether it did';
REVOKE ALL ON FUNCTION tide.outbox_unschedule(text,bigint) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_unschedule(text,bigint) TO tide_admin, tide_publisher;

-- Moves the due messages into their outboxes: deletes the rows and
-- publishes each through tide.outbox_publish in the caller's transaction,
-- so each gets its message id there and the publish tracker covers it. The
-- rows of each outbox are taken in (deliver_at, id) order, at most p_limit
-- in all, skipping rows another move or an unschedule holds, each in a
-- subtransaction of its own. A disabled outbox's rows wait until it is
-- enabled; an outbox that backpressure refuses keeps its remaining rows for
-- a later move while the other outboxes' rows move; a row the outbox
-- refuses (a payload schema set since it was scheduled) is kept with
-- refused_at and refused_reason and not moved again. Returns the number
-- moved.
CREATE OR REPLACE FUNCTION tide.outbox_release_due(p_name text DEFAULT NULL, p_limit int DEFAULT 1000)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
	due_outbox text;
	due record;
	moved bigint := 0;
	row_payload jsonb;
	row_headers jsonb;
	row_expires_at timestamptz;
	refusal text;
	refusal_state text;
	-- a parameter, not clock_timestamp() in the queries: a volatile bound
	-- cannot use the index on deliver_at, and every move would read the
	-- whole schedule
	due_by timestamptz := clock_timestamp();
BEGIN
	IF p_name IS NOT NULL THEN
		PERFORM tide._check_name('outbox', p_name);
	END IF;
	IF p_limit IS NULL OR p_limit <= 0 THEN
		RAISE EXCEPTION 'limit must be positive'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give the most scheduled messages to move in this call, at least 1.';
	END IF;
	FOR due_outbox IN
		SELECT DISTINCT d.outbox_name FROM tide.outbox_scheduled d
		  JOIN tide.tide_outbox_config c ON c.outbox_name = d.outbox_name
		 WHERE d.deliver_at <= due_by AND d.refused_at IS NULL AND c.enabled
		   AND (p_name IS NULL OR d.outbox_name = p_name)
		 ORDER BY 1
	LOOP
		EXIT WHEN moved >= p_limit;
		-- each row in a subtransaction of its own: a row the outbox refuses
		-- (its payload schema, changed since) is kept aside, and backpressure
		-- leaves the outbox's rows for a later move; neither stops the others
		FOR due IN
			SELECT d.id FROM tide.outbox_scheduled d
			 WHERE d.outbox_name = due_outbox AND d.deliver_at <= due_by
			   AND d.refused_at IS NULL
			 ORDER BY d.deliver_at, d.id
			 LIMIT p_limit - moved
			 FOR UPDATE SKIP LOCKED
		LOOP
			BEGIN
				DELETE FROM tide.outbox_scheduled s WHERE s.id = due.id
				RETURNING s.payload, s.headers, s.expires_at INTO row_payload, row_headers, row_expires_at;
				-- an expiry past by now is kept: the message expires in the outbox
				PERFORM tide._outbox_publish_moved(due_outbox, row_payload, row_headers, row_expires_at);
				moved := moved + 1;
			EXCEPTION
				WHEN configuration_limit_exceeded THEN
					EXIT;
				WHEN data_exception OR integrity_constraint_violation THEN
					GET STACKED DIAGNOSTICS refusal = MESSAGE_TEXT, refusal_state = RETURNED_SQLSTATE;
					UPDATE tide.outbox_scheduled
					   SET refused_at = clock_timestamp(), refused_reason = refusal_state || ': ' || refusal
					 WHERE id = due.id;
					RAISE WARNING 'scheduled message % of outbox "%" was refused at its move: %', due.id, due_outbox, refusal
						USING HINT = 'It stays in tide.outbox_scheduled with refused_at set and is not moved again; tide.outbox_unschedule() removes it.';
			END;
		END LOOP;
	END LOOP;
	RETURN moved;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.outbox_release_due(text, int)
	IS 'moves the scheduled messages that are due (of one outbox, or of all) into their outboxes; returns the number moved';
REVOKE ALL ON FUNCTION tide.outbox_release_due(text,integer) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_release_due(text,integer) TO tide_admin;
