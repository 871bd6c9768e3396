-- pg_tide consumer, one call per batch: tide.poll_outbox() acknowledges
-- the batch this client leased last (p_commit_upto => :last) and leases
-- the next 100 in the same call and transaction, as a consumer that works
-- between its polls does. :last starts at 0 (pgbench -D: nothing to
-- acknowledge yet, a harmless retry) and stays when a poll returns nothing.
-- One consumer id per pgbench client.
SELECT coalesce(max(id), :last) AS last
  FROM tide.poll_outbox('bench', 'c' || :client_id, 100, p_commit_upto => :last) \gset
