-- Baseline consumer: a plain SKIP LOCKED queue. Up to 100 of the oldest
-- rows that no other consumer has locked are deleted and returned with
-- their payloads and headers, in one statement.
WITH batch AS (
	SELECT id FROM bench.queue ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED),
taken AS (
	DELETE FROM bench.queue q USING batch WHERE q.id = batch.id
	RETURNING q.id, q.payload, q.headers, q.created_at)
SELECT max(id) AS last FROM taken;
