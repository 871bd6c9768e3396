-- ---------------------------------------------------------------------------
-- Backpressure: an outbox with an inline_threshold and consumer groups
-- refuses a publish that would leave more unconsumed messages than the
-- threshold (src/backpressure.c decides; these functions say why and
-- announce it). What they report: the groups that hold the outbox back, slowest
-- first, with their lag and the pipeline that reads through each.
-- ---------------------------------------------------------------------------

-- The groups of an outbox that have a position, slowest first (at most
-- p_limit), with their lag, pipeline and whether it is enabled; "more"
-- counts the ones left out.
CREATE OR REPLACE FUNCTION tide._outbox_holders(p_outbox text, p_limit int DEFAULT 5)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
	WITH g AS (
		SELECT g.group_name, tide._group_position(g.group_name) AS position
		  FROM tide.tide_consumer_groups g
		 WHERE g.outbox_name = p_outbox
	), ranked AS (
		SELECT g.group_name, g.position,
			   row_number() OVER (ORDER BY g.position, g.group_name) AS n
		  FROM g
		 WHERE g.position IS NOT NULL
	)
	SELECT jsonb_build_object(
			'groups', coalesce((
				SELECT jsonb_agg(jsonb_build_object(
						'group', r.group_name,
						'position', r.position,
						'lag', (SELECT count(*) FROM tide.tide_outbox_messages m
								 WHERE m.outbox_name = p_outbox AND m.consumed_at IS NULL
								   AND m.id > r.position),
						'pipeline', p.name,
						'pipeline_enabled', p.enabled)
						ORDER BY r.n)
				  FROM ranked r
				  LEFT JOIN tide.relay_outbox_config p
						 ON p.config ->> 'consumer_group' = r.group_name
						AND p.config ->> 'outbox' = p_outbox
				 WHERE r.n <= p_limit), '[]'::jsonb),
			'more', (SELECT count(*) FROM ranked r WHERE r.n > p_limit))
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._outbox_holders(text,integer) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._outbox_holders(text,integer) TO tide_admin;

-- _outbox_holders as a phrase for the DETAIL of a refused publish
-- (src/backpressure.c): consumer group "g" (pipeline "p", disabled), 3
-- messages behind; ...
CREATE OR REPLACE FUNCTION tide._outbox_holders_text(p_holders jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
	SELECT string_agg(format('consumer group "%s"%s, %s message%s behind',
							 h ->> 'group',
							 CASE WHEN h ->> 'pipeline' IS NULL THEN ''
								  ELSE format(' (pipeline "%s"%s)', h ->> 'pipeline',
											  CASE WHEN (h -> 'pipeline_enabled') = 'false'::jsonb
												   THEN ', disabled' ELSE '' END) END,
							 h ->> 'lag', CASE WHEN (h ->> 'lag')::bigint = 1 THEN '' ELSE 's' END),
					  '; ' ORDER BY o)
		   || CASE WHEN (p_holders ->> 'more')::bigint > 0
				   THEN format('; and %s more group%s', p_holders ->> 'more',
							   CASE WHEN (p_holders ->> 'more')::bigint = 1 THEN '' ELSE 's' END)
				   ELSE '' END
	  FROM jsonb_array_elements(p_holders -> 'groups') WITH ORDINALITY AS x (h, o)
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._outbox_holders_text(jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._outbox_holders_text(jsonb) TO tide_admin;

-- Records that the outbox is now at p_level (0, 80 or 100 % of its
-- inline_threshold, with p_unconsumed messages) and publishes the operator
-- event outbox.backpressure for each level it rose past; called by
-- src/outbox.c when the level it counted differs from the one recorded.
-- The config row's lock makes one publish announce a crossing: another
-- publish that crosses meanwhile skips it, and one after the commit finds
-- the level recorded. The event is not worth failing the publish for.
CREATE OR REPLACE FUNCTION tide._outbox_backpressure(p_outbox text, p_level int, p_unconsumed bigint,
													 p_threshold bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	was int;
	pct int;
BEGIN
	BEGIN
		SELECT c.backpressure_level INTO was FROM tide.tide_outbox_config c
		 WHERE c.outbox_name = p_outbox FOR NO KEY UPDATE SKIP LOCKED;
	EXCEPTION WHEN serialization_failure THEN
		-- REPEATABLE READ, the row changed since the snapshot: a later
		-- publish announces it.
		RETURN;
	END;
	IF was IS NULL OR was = p_level THEN
		RETURN;
	END IF;
	UPDATE tide.tide_outbox_config SET backpressure_level = p_level WHERE outbox_name = p_outbox;
	FOREACH pct IN ARRAY ARRAY[80, 100] LOOP
		IF was < pct AND p_level >= pct THEN
			BEGIN
				PERFORM tide._relay_operator_event('outbox.backpressure', NULL,
					jsonb_build_object('outbox', p_outbox, 'percent', pct, 'unconsumed', p_unconsumed,
									   'inline_threshold', p_threshold,
									   'held_back_by', tide._outbox_holders(p_outbox) -> 'groups'));
			EXCEPTION WHEN OTHERS THEN
				RAISE WARNING 'operator event outbox.backpressure of outbox "%" not published: %', p_outbox, SQLERRM
					USING HINT = 'Check the outbox that pg_tide.operator_events_outbox names.';
			END;
		END IF;
	END LOOP;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._outbox_backpressure(text,integer,bigint,bigint) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._outbox_backpressure(text,integer,bigint,bigint) TO tide_admin;

-- The NOTICE of relay_disable and of relay_delete keeping its group: the
-- group no longer moves, and once it is the outbox's inline_threshold
-- behind, publishing to the outbox is refused.
CREATE OR REPLACE FUNCTION tide._outbox_paused_group_notice(p_outbox text, p_group text, p_pipeline text,
															p_what text)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
	threshold int;
	pos bigint;
BEGIN
	SELECT c.inline_threshold INTO threshold FROM tide.tide_outbox_config c WHERE c.outbox_name = p_outbox;
	pos := tide._group_position(p_group);
	IF threshold IS NULL OR pos IS NULL THEN
		RETURN;
	END IF;
	RAISE NOTICE 'outbox "%" refuses publishing once consumer group "%" of % pipeline "%" is % messages behind',
		p_outbox, p_group, p_what, p_pipeline, threshold
		USING DETAIL = format('The group is %s messages behind now; the outbox''s inline_threshold is %s.',
							  (SELECT count(*) FROM tide.tide_outbox_messages m
								WHERE m.outbox_name = p_outbox AND m.consumed_at IS NULL AND m.id > pos),
							  threshold),
			  HINT = CASE WHEN p_what = 'disabled'
						  THEN 'Enable the pipeline with tide.relay_enable() before then, or remove the limit with tide.outbox_set_threshold().'
						  ELSE 'Drop the group with tide.drop_consumer_group() unless something will read through it again, or remove the limit with tide.outbox_set_threshold().' END;
END
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._outbox_paused_group_notice(text,text,text,text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._outbox_paused_group_notice(text,text,text,text) TO tide_admin;
