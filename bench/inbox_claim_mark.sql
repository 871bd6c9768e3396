-- inbox.sh, claim_mark: a consumer's cycle in two transactions. The first
-- claims up to :batch pending messages for 30 s; the second marks each of
-- them processed. pgbench counts the cycle as one transaction.
SELECT coalesce(string_agg(event_id, ','), '') AS ids
  FROM tide.inbox_claim('bench', :batch, 30) \gset
SELECT count(tide.inbox_mark_processed('bench', e)) AS marked
  FROM unnest(string_to_array(:ids, ',')) AS e;
