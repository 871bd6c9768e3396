-- ---------------------------------------------------------------------------
-- Manual redelivery. Both put messages into the pipeline's retry queue as
-- manual, due at once (the worker is woken at commit); the live offset does
-- not move. The message must still be in its outbox.
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION tide._relay_queue_manual(p_pipeline text, p_from_id bigint, p_to_id bigint)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
	p tide.relay_outbox_config;
	n bigint;
BEGIN
	p := tide._relay_pipeline(p_pipeline);
	INSERT INTO tide.relay_retry_queue AS q
		(pipeline_id, outbox_name, message_id, payload, headers, created_at, attempts,
		 next_attempt_at, manual)
	SELECT p_pipeline, m.outbox_name, m.id, m.payload, m.headers, m.created_at, 0, now(), true
	  FROM tide.tide_outbox_messages m
	 WHERE m.outbox_name = p.config ->> 'outbox' AND m.id BETWEEN p_from_id AND p_to_id
	ON CONFLICT (pipeline_id, message_id) DO UPDATE
	   SET next_attempt_at = now(), manual = true;
	GET DIAGNOSTICS n = ROW_COUNT;
	IF n > 0 THEN
		PERFORM tide._relay_wake_worker();
	END IF;
	RETURN n;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._relay_queue_manual(text,bigint,bigint) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_queue_manual(text,bigint,bigint) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_retry_message(p_pipeline text, p_message_id bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	p tide.relay_outbox_config;
BEGIN
	p := tide._relay_pipeline(p_pipeline);
	IF p_message_id IS NULL THEN
		RAISE EXCEPTION 'message id must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give the id of a message of the pipeline''s outbox.';
	END IF;
	IF tide._relay_queue_manual(p_pipeline, p_message_id, p_message_id) = 0 THEN
		RAISE EXCEPTION 'message % is not in outbox "%"', p_message_id, p.config ->> 'outbox'
			USING ERRCODE = 'undefined_object',
				  HINT = 'Only a message still kept by the pipeline''s outbox can be delivered again; a dead letter is retried with tide.relay_dlq_retry().';
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.relay_retry_message(text, bigint)
	IS 'delivers one message of the pipeline''s outbox again, as a manual attempt, without moving the offset';
REVOKE ALL ON FUNCTION tide.relay_retry_message(text,bigint) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_retry_message(text,bigint) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_replay(p_pipeline text, p_from_id bigint, p_to_id bigint)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
	p tide.relay_outbox_config;
	n bigint;
BEGIN
	p := tide._relay_pipeline(p_pipeline);
	IF p_from_id IS NULL OR p_to_id IS NULL THEN
		RAISE EXCEPTION 'replay range must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give p_from_id <= p_to_id, for example the ids tide.relay_attempts shows.';
	END IF;
	IF p_from_id > p_to_id THEN
		RAISE EXCEPTION 'replay range must be two ids, the first not above the second'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give p_from_id <= p_to_id, for example the ids tide.relay_attempts shows.';
	END IF;
	SELECT count(*) INTO n FROM tide.tide_outbox_messages
	 WHERE outbox_name = p.config ->> 'outbox' AND id BETWEEN p_from_id AND p_to_id;
	IF n > 100000 THEN
		RAISE EXCEPTION 'replay range holds % messages, more than 100000', n
			USING ERRCODE = 'program_limit_exceeded',
				  HINT = 'Replay a narrower range at a time.';
	END IF;
	RETURN tide._relay_queue_manual(p_pipeline, p_from_id, p_to_id);
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.relay_replay(text, bigint, bigint)
	IS 'delivers a range of the pipeline''s messages again, as manual attempts, without moving the live offset; returns how many';
REVOKE ALL ON FUNCTION tide.relay_replay(text,bigint,bigint) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_replay(text,bigint,bigint) TO tide_admin;
