-- ---------------------------------------------------------------------------
-- Retention. tide.outbox_sweep deletes an outbox's messages that are older
-- than its retention_hours and that every participant has passed: each
-- consumer group of the outbox (a relay pipeline reads through one, and a
-- live lease holds its group's position back), never above the publish
-- tracker's safe horizon. An outbox without consumer groups loses its
-- messages by age alone: nobody reads them. The relay worker runs it.
--
-- Why no group is locked. A group's position, least(leased_upto, lowest
-- lease_start - 1), is read in one statement, so from one snapshot, and
-- every id up to it is acknowledged in that snapshot. Polls, commits and
-- lease changes only ever move a committed position forward: a poll leases
-- ids above leased_upto and moves leased_upto to the last of them, a
-- takeover splits a lease at its start, a commit raises a lease's start or
-- deletes the lease, a release only changes the expiry. So whatever
-- commits while a sweep runs, the ids at or below the position it read
-- stay acknowledged, and no poll reads them again: polls fetch ids above
-- leased_upto or inside a lease, all above the position. The sweep takes
-- no group lock, and consumers never wait for it, nor it for them. Two
-- things move a position back: tide.admin_rewind_offset and a new group
-- ('earliest' starts at 0). Each behaves as if it had run after the sweep
-- (neither reads messages): a rewind below what retention deleted, or a
-- group created during a sweep, starts at the oldest message still kept.
-- A group with no position yet ('none') holds every message.
--
-- Whole child tables. Publishes go to the children of the message table
-- (tide.tide_outbox_partitions, one range of ids each), which
-- tide._outbox_partitions_maintain() creates ahead of the ids handed out. A
-- child is dropped whole, never emptied row by row, once it is closed
-- (every id of it handed out, by a transaction that has ended: last_id at
-- or below the safe horizon) and, for every outbox with messages in it,
-- every one of those messages is at or below that outbox's bound (every
-- participant has passed it, as above) and it was closed before the
-- outbox's retention cutoff (its messages were all published before it
-- closed, so all are older than the cutoff). Only a sweep of every outbox and both retentions
-- being met drops it: other outboxes' messages share it. The drop takes
-- ACCESS EXCLUSIVE on the child alone, without waiting (NOWAIT): a reader
-- still scanning it (a poll, a replay) keeps it for the next sweep, and no
-- queue of lock requests forms behind the drop. Publishers never touch a
-- closed child, and the parent table is not locked. Rows in the parent
-- itself (0.1.0's messages, and those published while no child held their
-- id) and in the children still open (a child that fills more slowly than
-- the retention) are deleted row by row as follows; under steady load the
-- open children hold only messages younger than the retention.
--
-- The deletion takes ROW EXCLUSIVE on the message table, as publishers do:
-- publishers never wait for it. outbox_drop's SHARE ROW EXCLUSIVE waits for
-- a running sweep, as for a publisher. Rows are deleted in id order,
-- p_batch_size per statement, at most 100 statements per call; the rows a
-- concurrent sweep has locked are skipped.
-- ---------------------------------------------------------------------------

-- The participants of an outbox: one row per consumer group with its
-- position (NULL when it has none yet), named as the pipeline that reads
-- through it, else as the consumer whose lease holds the position below the
-- group's dispatch cursor, else as the group. The pipelines' groups are
-- read from relay_outbox_config once per call (grouped, then hash-joined),
-- not once per group: with 1,000 pipelines of one outbox the per-group
-- LATERAL took 1,000 x 1,000 config lookups, 90 to 200 ms of the relay
-- worker in every sweep (once a minute at rest).
CREATE OR REPLACE FUNCTION tide._retention_participants(p_outbox text)
RETURNS TABLE (kind text, name text, group_name text, passed_upto bigint)
LANGUAGE sql STABLE
AS $$
	SELECT CASE WHEN p.name IS NOT NULL THEN 'pipeline'
				WHEN l.lease_start - 1 < g.leased_upto THEN 'lease'
				ELSE 'consumer_group' END,
		   CASE WHEN p.name IS NOT NULL THEN p.name
				WHEN l.lease_start - 1 < g.leased_upto THEN l.consumer_id
				ELSE g.group_name END,
		   g.group_name,
		   CASE WHEN g.leased_upto IS NOT NULL THEN least(g.leased_upto, l.lease_start - 1) END
	  FROM tide.tide_consumer_groups g
	  LEFT JOIN LATERAL (SELECT x.consumer_id, x.lease_start
						   FROM tide.tide_consumer_leases x
						  WHERE x.group_name = g.group_name
						  ORDER BY x.lease_start, x.consumer_id LIMIT 1) l ON true
	  LEFT JOIN (SELECT r.config ->> 'consumer_group' AS group_name, min(r.name) AS name
				   FROM tide.relay_outbox_config r
				  GROUP BY 1) p ON p.group_name = g.group_name
	 WHERE g.outbox_name = p_outbox
$$
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._retention_participants(text) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._retention_participants(text) TO tide_admin;

-- What retention may delete from an outbox now: its messages created before
-- cutoff with ids up to bound (the lowest participant position, capped by
-- the safe horizon); and, when messages past retention lie above bound, the
-- blocker: the participant with the lowest position, or the safe horizon
-- when no participant is below it (an open publishing transaction).
CREATE OR REPLACE FUNCTION tide._outbox_retention(p_outbox text, p_keep interval,
									   OUT cutoff timestamptz, OUT safe_horizon bigint,
									   OUT bound bigint, OUT blocker jsonb)
LANGUAGE plpgsql
AS $$
DECLARE
	low record;
	has_low boolean;
BEGIN
	cutoff := now() - p_keep;
	-- The horizon first: the positions and the messages are read by later
	-- statements, with later snapshots.
	safe_horizon := tide._safe_horizon();
	SELECT * INTO low FROM tide._retention_participants(p_outbox) r
	 ORDER BY r.passed_upto NULLS FIRST, r.kind, r.name LIMIT 1;
	has_low := FOUND;
	IF NOT has_low THEN
		bound := safe_horizon;
	ELSE
		bound := least(coalesce(low.passed_upto, 0), safe_horizon);
	END IF;
	IF EXISTS (SELECT 1 FROM tide.tide_outbox_messages m
				WHERE m.outbox_name = p_outbox AND m.id > bound AND m.created_at < cutoff) THEN
		IF has_low AND coalesce(low.passed_upto, -1) < safe_horizon THEN
			blocker := jsonb_build_object('kind', low.kind, 'name', low.name,
										  'group', low.group_name, 'position', low.passed_upto);
		ELSE
			blocker := jsonb_build_object('kind', 'safe_horizon', 'name', NULL,
										  'group', NULL, 'position', safe_horizon);
		END IF;
	END IF;
END
$$
SET search_path = pg_catalog, pg_temp
SECURITY DEFINER;
REVOKE ALL ON FUNCTION tide._outbox_retention(text,interval) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._outbox_retention(text,interval) TO tide_admin, tide_reader;

CREATE OR REPLACE FUNCTION tide.outbox_sweep(p_outbox_name text DEFAULT NULL,
								  p_batch_size int DEFAULT 1000,
								  p_dry_run boolean DEFAULT false,
								  p_older_than interval DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
	max_batches constant int := 100;
	cfg tide.tide_outbox_config;
	r record;
	eligible bigint;
	deleted bigint;
	batches int;
	more boolean;
	after_id bigint;
	closed_upto bigint;
	in_children int;
	n bigint;
	last_id bigint;
	total bigint := 0;
	total_batches int := 0;
	any_more boolean := false;
	items jsonb := '[]';
	dropped jsonb;
BEGIN
	IF p_outbox_name IS NOT NULL THEN
		PERFORM tide._outbox_config(p_outbox_name);
	END IF;
	IF p_batch_size IS NULL THEN
		RAISE EXCEPTION 'batch size must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Give the most messages to delete with one statement, from 1 to 10000.';
	END IF;
	IF p_batch_size < 1 OR p_batch_size > 10000 THEN
		RAISE EXCEPTION 'batch size must be between 1 and 10000'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give the most messages to delete with one statement.';
	END IF;
	IF p_dry_run IS NULL THEN
		RAISE EXCEPTION 'dry_run must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Pass true to count what would be deleted, false to delete it.';
	END IF;
	PERFORM tide._check_age(p_older_than,
		'Give p_older_than, to sweep messages older than it instead of the outbox''s retention_hours, or leave it NULL.');

	FOR cfg IN SELECT * FROM tide.tide_outbox_config c
				WHERE p_outbox_name IS NULL OR c.outbox_name = p_outbox_name
				ORDER BY c.outbox_name
	LOOP
		r := tide._outbox_retention(cfg.outbox_name,
									coalesce(p_older_than, make_interval(hours => cfg.retention_hours)));
		-- Every id up to r.bound belongs to a transaction that has ended
		-- (bound <= safe horizon), so this snapshot sees the whole set, and
		-- nothing joins it later. Row by row go the messages of the parent
		-- table itself and those of the children still open (ids above the
		-- last closed child): a child that fills more slowly than the
		-- retention must not keep its old messages until it closes.
		closed_upto := coalesce((SELECT max(p.last_id) FROM tide.tide_outbox_partitions p
								  WHERE p.last_id <= r.safe_horizon), 0);
		SELECT count(*) INTO eligible FROM ONLY tide.tide_outbox_messages m
		 WHERE m.outbox_name = cfg.outbox_name AND m.id <= r.bound AND m.created_at < r.cutoff;
		SELECT eligible + count(*) INTO eligible FROM tide.tide_outbox_messages m
		 WHERE m.outbox_name = cfg.outbox_name AND m.id > closed_upto AND m.id <= r.bound
		   AND m.created_at < r.cutoff AND m.tableoid <> 'tide.tide_outbox_messages'::regclass;
		deleted := 0;
		batches := 0;
		more := false;
		IF NOT p_dry_run THEN
			<<phases>>
			FOR in_children IN 0 .. 1 LOOP
				after_id := CASE WHEN in_children = 0 THEN 0 ELSE closed_upto END;
				WHILE deleted < eligible LOOP
					IF total_batches >= max_batches THEN
						more := true;
						EXIT phases;
					END IF;
					IF in_children = 0 THEN
						WITH b AS (
							SELECT m.id FROM ONLY tide.tide_outbox_messages m
							 WHERE m.outbox_name = cfg.outbox_name AND m.id > after_id AND m.id <= r.bound
							   AND m.created_at < r.cutoff
							 ORDER BY m.id LIMIT p_batch_size
							   FOR UPDATE SKIP LOCKED),
						d AS (
							DELETE FROM ONLY tide.tide_outbox_messages m USING b WHERE m.id = b.id
							RETURNING m.id)
						SELECT count(*), max(d.id) INTO n, last_id FROM d;
					ELSE
						WITH b AS (
							SELECT m.id FROM tide.tide_outbox_messages m
							 WHERE m.outbox_name = cfg.outbox_name AND m.id > after_id AND m.id <= r.bound
							   AND m.created_at < r.cutoff
							   AND m.tableoid <> 'tide.tide_outbox_messages'::regclass
							 ORDER BY m.id LIMIT p_batch_size
							   FOR UPDATE SKIP LOCKED),
						d AS (
							DELETE FROM tide.tide_outbox_messages m USING b
							 WHERE m.outbox_name = cfg.outbox_name AND m.id = b.id
							RETURNING m.id)
						SELECT count(*), max(d.id) INTO n, last_id FROM d;
					END IF;
					batches := batches + 1;
					total_batches := total_batches + 1;
					deleted := deleted + n;
					EXIT WHEN n < p_batch_size;
					after_id := last_id;
				END LOOP;
			END LOOP;
		END IF;
		-- A key older than the window is forgotten (a publish ignores it
		-- already: src/idempotency.c).
		IF NOT p_dry_run THEN
			DELETE FROM tide.outbox_idempotency_keys k
			 WHERE k.outbox_name = cfg.outbox_name AND k.created_at < now() - cfg.idempotency_window;
		END IF;
		total := total + deleted;
		any_more := any_more OR more;
		items := items || jsonb_build_object(
					'outbox', cfg.outbox_name,
					'retention_hours', cfg.retention_hours,
					'safe_horizon', r.safe_horizon,
					'horizon_id', r.bound,
					'eligible', eligible,
					'deleted', deleted,
					'batches', batches,
					'more', more,
					'blocker', r.blocker);
	END LOOP;
	dropped := tide._outbox_partitions_retire(p_outbox_name, p_older_than, p_dry_run);
	RETURN jsonb_build_object('outboxes', items, 'deleted', total, 'batches', total_batches,
							  'more', any_more, 'dry_run', p_dry_run, 'partitions', dropped);
END
$$
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION tide.outbox_sweep(text, int, boolean, interval)
	IS 'deletes messages older than retention_hours (or p_older_than) that every consumer group has passed, in batches; names what holds retention back';
REVOKE ALL ON FUNCTION tide.outbox_sweep(text,integer,boolean,interval) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.outbox_sweep(text,integer,boolean,interval) TO tide_admin;

-- Creates the child tables of tide_outbox_messages ahead of the ids handed
-- out: children of pg_tide.partition_size ids each, until the last one
-- ends at least two children's worth above the sequence. A child has one
-- index, on (outbox_name, id), not the parent's two: every query of the
-- messages names their outbox (a partial index would not serve those
-- that do not also ask for consumed_at IS NULL), and a primary key would
-- cost every message a second index entry for a uniqueness that the
-- sequence gives (only publishes write into children, with ids from it;
-- the parent keeps its primary key for any other insert). Another
-- maintainer running holds EXCLUSIVE on tide_outbox_partitions (publishers
-- only read it); this one then returns 0 rather than wait. Creating a child
-- takes SHARE UPDATE EXCLUSIVE on the parent, which publishers (ROW
-- EXCLUSIVE) and readers (ACCESS SHARE) never wait for. A publish whose id
-- no child holds yet goes into the parent table, so a database whose relay
-- worker does not run still accepts every publish. It makes none before
-- the first id is handed out. Returns the number of children created.
CREATE OR REPLACE FUNCTION tide._outbox_partitions_maintain()
RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
	width bigint := current_setting('pg_tide.partition_size')::bigint;
	handed_out bigint;
	top bigint;
	first_id bigint;
	child text;
	made int := 0;
BEGIN
	BEGIN
		LOCK TABLE tide.tide_outbox_partitions IN EXCLUSIVE MODE NOWAIT;
	EXCEPTION WHEN lock_not_available THEN
		RETURN 0;
	END;
	-- Children restored by pg_dump come without their tie to the extension.
	PERFORM tide._outbox_partition_adopt(c.oid)
	   FROM tide.tide_outbox_partitions p
	   JOIN pg_class c ON c.relname = p.table_name AND c.relnamespace = 'tide'::regnamespace
	  WHERE NOT EXISTS (SELECT 1 FROM pg_depend d
						 WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
						   AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'a');
	handed_out := pg_sequence_last_value('tide.tide_outbox_messages_id_seq');
	-- Nothing published yet: a database being restored by pg_dump, whose
	-- children and sequence value are still to come, gets none of ours.
	IF handed_out IS NULL THEN
		RETURN 0;
	END IF;
	SELECT max(p.last_id) INTO top FROM tide.tide_outbox_partitions p;
	WHILE coalesce(top, 0) < handed_out + 2 * width LOOP
		-- The next child follows the last one, or starts above the ids
		-- handed out when the children fell behind (those ids are in the
		-- parent).
		first_id := greatest(coalesce(top, 0), handed_out) + 1;
		child := 'tide_outbox_messages_' || first_id;
		-- No CHECK constraint on the range: it would be read from the
		-- catalog and checked for every INSERT statement, and only
		-- publishes, which choose the child by its range, write here.
		EXECUTE format('CREATE TABLE tide.%I () INHERITS (tide.tide_outbox_messages)', child);
		-- One index: every reader of the messages names the outbox, and
		-- the ids come from the sequence alone (see the top of this file).
		EXECUTE format('CREATE INDEX %I ON tide.%I (outbox_name, id)', child || '_outbox_id', child);
		-- As on every table of the schema (sql/privileges.sql): outbox_drop,
		-- run by tide_admin, locks the children with the parent.
		EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON tide.%I TO tide_admin', child);
		PERFORM tide._outbox_partition_adopt(format('tide.%I', child)::regclass);
		INSERT INTO tide.tide_outbox_partitions (first_id, last_id, table_name)
		VALUES (first_id, first_id + width - 1, child);
		top := first_id + width - 1;
		made := made + 1;
	END LOOP;
	RETURN made;
END
$$
SET search_path = pg_catalog, pg_temp
SECURITY DEFINER;
REVOKE ALL ON FUNCTION tide._outbox_partitions_maintain() FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._outbox_partitions_maintain() TO tide_admin;

-- The C side of a new child table (src/partitions.c): makes it depend on
-- the extension, so that DROP EXTENSION drops it with its parent; it is not
-- a member, so pg_dump keeps its definition and its rows.
CREATE OR REPLACE FUNCTION tide._outbox_partition_adopt(p_child regclass)
RETURNS void
LANGUAGE c STRICT
AS 'MODULE_PATHNAME', 'tide_outbox_partition_adopt'
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION tide._outbox_partition_adopt(regclass) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;

-- Drops the child tables that retention has passed (see the top of this
-- file), as their owner, oldest first, and stops at the first that is not: later ones
-- hold later ids. p_outbox and p_older_than are outbox_sweep's: the outbox
-- swept with p_older_than instead of its retention_hours (all when
-- p_outbox is NULL). With p_dry_run it only names them. Returns
-- {"dropped": [names], "blocked": {table, reason, ...} or null}.
CREATE OR REPLACE FUNCTION tide._outbox_partitions_retire(p_outbox text, p_older_than interval,
														  p_dry_run boolean)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
	part tide.tide_outbox_partitions;
	cfg tide.tide_outbox_config;
	r record;
	horizon bigint := tide._safe_horizon();
	present boolean;
	held boolean;
	blocked jsonb;
	dropped jsonb := '[]';
BEGIN
	-- Every child closed since the last sweep is marked now, not only the
	-- next one to drop: its messages' age counts from here.
	IF NOT p_dry_run THEN
		UPDATE tide.tide_outbox_partitions p SET closed_at = now()
		 WHERE p.closed_at IS NULL AND p.last_id <= horizon;
	END IF;
	FOR part IN SELECT * FROM tide.tide_outbox_partitions p ORDER BY p.first_id LOOP
		IF part.last_id > horizon THEN
			blocked := jsonb_build_object('table', part.table_name, 'reason', 'open',
										  'safe_horizon', horizon);
			EXIT;
		END IF;
		-- (A dry run marks nothing: as if closed now.)
		part.closed_at := coalesce(part.closed_at, now());
		FOR cfg IN SELECT * FROM tide.tide_outbox_config c ORDER BY c.outbox_name LOOP
			EXECUTE format('SELECT EXISTS (SELECT 1 FROM tide.%I m'
						   ' WHERE m.outbox_name = $1 AND m.consumed_at IS NULL)', part.table_name)
			   INTO present USING cfg.outbox_name;
			CONTINUE WHEN NOT present;
			r := tide._outbox_retention(cfg.outbox_name,
				CASE WHEN p_older_than IS NOT NULL AND (p_outbox IS NULL OR p_outbox = cfg.outbox_name)
					 THEN p_older_than ELSE make_interval(hours => cfg.retention_hours) END);
			EXECUTE format('SELECT EXISTS (SELECT 1 FROM tide.%I m'
						   ' WHERE m.outbox_name = $1 AND m.consumed_at IS NULL AND m.id > $2)', part.table_name)
			   INTO held USING cfg.outbox_name, r.bound;
			IF held THEN
				blocked := jsonb_build_object('table', part.table_name, 'reason', 'participant',
											  'outbox', cfg.outbox_name, 'bound', r.bound,
											  'blocker', r.blocker);
			ELSIF part.closed_at >= r.cutoff THEN
				blocked := jsonb_build_object('table', part.table_name, 'reason', 'age',
											  'outbox', cfg.outbox_name, 'closed_at', part.closed_at);
			END IF;
			EXIT WHEN blocked IS NOT NULL;
		END LOOP;
		EXIT WHEN blocked IS NOT NULL;
		IF NOT p_dry_run THEN
			BEGIN
				EXECUTE format('LOCK TABLE tide.%I IN ACCESS EXCLUSIVE MODE NOWAIT', part.table_name);
			EXCEPTION WHEN lock_not_available THEN
				-- A reader still scans it: the next sweep drops it.
				blocked := jsonb_build_object('table', part.table_name, 'reason', 'in_use');
				EXIT;
			END;
			EXECUTE format('DROP TABLE tide.%I', part.table_name);
			DELETE FROM tide.tide_outbox_partitions p WHERE p.first_id = part.first_id;
		END IF;
		dropped := dropped || to_jsonb(part.table_name);
	END LOOP;
	RETURN jsonb_build_object('dropped', dropped, 'blocked', blocked);
END
$$
SET search_path = pg_catalog, pg_temp
SECURITY DEFINER;
REVOKE ALL ON FUNCTION tide._outbox_partitions_retire(text,interval,boolean) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._outbox_partitions_retire(text,interval,boolean) TO tide_admin;
