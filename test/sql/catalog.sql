-- The catalog of seed 003: every table, column and type, the pending index
-- and the relay config triggers.
SELECT table_name, column_name, data_type
  FROM information_schema.columns
 WHERE table_schema = 'tide'
   AND table_name IN ('tide_outbox_config', 'tide_outbox_messages', 'tide_consumer_groups',
					  'tide_consumer_offsets', 'tide_consumer_leases', 'tide_inbox_config',
					  'relay_outbox_config', 'relay_inbox_config', 'relay_consumer_offsets')
 ORDER BY table_name, ordinal_position;

SELECT indexdef FROM pg_indexes
 WHERE schemaname = 'tide' AND indexname = 'idx_tide_outbox_messages_pending';

SELECT tgname, tgrelid::regclass
  FROM pg_trigger
 WHERE tgrelid IN ('tide.relay_outbox_config'::regclass, 'tide.relay_inbox_config'::regclass)
   AND NOT tgisinternal
 ORDER BY tgname;

-- The id sequence is not cached per backend (the safe horizon depends on it).
SELECT seqcache FROM pg_sequence WHERE seqrelid = 'tide.tide_outbox_messages_id_seq'::regclass;

-- The extension is not relocatable; schema tide belongs to it, so DROP
-- EXTENSION removes it.
SELECT extname, extrelocatable FROM pg_extension WHERE extname = 'pg_tide';
SELECT count(*) AS schema_is_member FROM pg_depend
 WHERE classid = 'pg_namespace'::regclass AND objid = 'tide'::regnamespace
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_tide') AND deptype = 'e';

-- Every API function has a comment.
SELECT p.proname
  FROM pg_proc p
 WHERE p.pronamespace = 'tide'::regnamespace
   AND p.proname !~ '^_'
   AND obj_description(p.oid, 'pg_proc') IS NULL
 ORDER BY 1;

-- DROP and CREATE EXTENSION in one session: publishing works again (cached
-- plans and the cached sequence follow the new objects).
SELECT tide.outbox_create('reinstall');
SELECT tide.outbox_publish('reinstall', '{}') > 0 AS published;
DROP EXTENSION pg_tide;
CREATE EXTENSION pg_tide;
SELECT tide.outbox_create('reinstall');
SELECT tide.outbox_publish('reinstall', '{}') AS first_id_again;
SELECT tide._safe_horizon() AS horizon;
SELECT tide.outbox_drop('reinstall');
