-- pg_tide consumer of bench/sustained.sh: lease up to 100 messages of group
-- 'bench', acknowledge them; when there are none, wait a little, as a
-- consumer that keeps up would.
SELECT coalesce(max(id), 0) AS last FROM tide.poll_outbox('bench', 'c' || :client_id, 100) \gset
\if :last > 0
SELECT tide.commit_offset('bench', 'c' || :client_id, :last);
\else
\sleep 20 ms
\endif
