-- pg_tide consumer of bench/sustained.sh: lease up to :batch messages of
-- group 'bench' and acknowledge them; after a batch that was not full, wait
-- :wait ms, as PgQ's consumer waits for its ticker's next tick.
SELECT count(*) AS got, coalesce(max(id), 0) AS last
  FROM tide.poll_outbox('bench', 'c' || :client_id, :batch) \gset
\if :got > 0
SELECT tide.commit_offset('bench', 'c' || :client_id, :last);
\endif
\if :got < :batch
\sleep :wait ms
\endif
