-- The backlog's bytes are what each stage still has to move: the staged chunk for transform,
-- the Parquet parts transform wrote for copy and load (a chunk's parts are a fraction of its
-- staged bytes, so counting those overstated the copy backlog ~2.7x).
DROP VIEW IF EXISTS backlog;
CREATE VIEW backlog AS
SELECT t.stage, t.state, COUNT(*) AS tasks,
       CAST(COALESCE(SUM(CASE WHEN t.stage = 'transform' THEN c.bytes ELSE COALESCE(p.bytes, 0) END), 0) AS BIGINT) AS bytes,
       MIN(t.created_at) AS oldest_created_ms
FROM tasks t
JOIN chunks c ON c.id = t.chunk_id
LEFT JOIN (SELECT chunk_id, SUM(bytes) AS bytes FROM parts GROUP BY chunk_id) p ON p.chunk_id = t.chunk_id
GROUP BY t.stage, t.state;
