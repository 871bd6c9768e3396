-- PgQ consumer of bench/sustained.sh: the next batch of consumer 'c' (the
-- events of one tick), its events, finish_batch; when there is no batch
-- yet, wait :wait ms.
SELECT coalesce(pgq.next_batch('bench', 'c'), 0) AS batch \gset
\if :batch > 0
SELECT max(ev_id) AS last FROM pgq.get_batch_events(:batch);
SELECT pgq.finish_batch(:batch);
\else
\sleep :wait ms
\endif
