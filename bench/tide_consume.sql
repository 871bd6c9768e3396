-- pg_tide consumer: lease up to 100 messages of group 'bench' with
-- tide.poll_outbox() (id, payload, headers, created_at), then acknowledge
-- them with tide.commit_offset(), each its own transaction as a consumer
-- that works between the two would. One consumer id per pgbench client.
SELECT max(id) AS last FROM tide.poll_outbox('bench', 'c' || :client_id, 100) \gset
SELECT tide.commit_offset('bench', 'c' || :client_id, :last);
