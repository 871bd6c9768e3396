-- PgQ consumer: the next batch (one tick's events, 100 here) of consumer
-- 'c', its events with pgq.get_batch_events(), then pgq.finish_batch().
BEGIN;
SELECT pgq.next_batch('bench', 'c') AS batch \gset
SELECT max(ev_id) AS last FROM pgq.get_batch_events(:batch);
SELECT pgq.finish_batch(:batch);
COMMIT;
