-- Spool nodes. Keep in step with migrations/postgres/0008_spool_nodes.sql.
--
-- Transform writes a chunk's Parquet to its host's spool (local disk); only a copy on that
-- host can read it. `tasks.node` is the spool node (config `spool.node`, by default the host
-- name) that a task is bound to: a transform task is stamped with its claimer's node, and the
-- copy task it hands on to inherits the node of the transform that finished. A copy claims
-- only tasks of its own node (or of none). A chunk whose node is gone for good goes back to
-- transform with `ferry rerun --spool-node NAME`.

ALTER TABLE tasks ADD COLUMN node TEXT;

DROP TRIGGER IF EXISTS tasks_on_done;
CREATE TRIGGER tasks_on_done AFTER UPDATE OF state ON tasks
WHEN OLD.state = 'running' AND NEW.state = 'done'
BEGIN
    INSERT INTO attempts (task_id, chunk_id, stage, attempt, epoch, worker, started_at, ended_at,
                          outcome, bytes, records)
    VALUES (NEW.id, NEW.chunk_id, NEW.stage, NEW.attempt, NEW.epoch, OLD.lease_owner,
            COALESCE(OLD.attempted_at, NEW.finalized_at), NEW.finalized_at, 'done', NEW.bytes, NEW.records);
    INSERT INTO tasks (pipeline, chunk_id, stage, state, max_attempts, scheduled_at, created_at, node)
    SELECT NEW.pipeline, NEW.chunk_id, CASE NEW.stage WHEN 'transform' THEN 'copy' ELSE 'load' END, 'available',
           NEW.max_attempts, NEW.finalized_at, NEW.finalized_at,
           CASE NEW.stage WHEN 'transform' THEN NEW.node ELSE NULL END
    WHERE NEW.stage IN ('transform', 'copy')
    ON CONFLICT (chunk_id, stage) DO UPDATE
        SET state = 'available', attempt = 0, scheduled_at = excluded.scheduled_at, finalized_at = NULL,
            last_error = NULL, last_error_class = NULL, node = excluded.node
        WHERE tasks.state <> 'running';
END;

-- The history views gain the pipeline (through the attempt's chunk and its source file, which
-- prune never deletes), so that each pipeline's failures, redone work and throughput can be
-- read apart. recent_failures no longer stops at 200 rows: that cut would hide a quiet
-- pipeline's failures behind a busy one's (add LIMIT to the query instead).
DROP VIEW IF EXISTS recent_failures;
CREATE VIEW recent_failures AS
SELECT a.ended_at, strftime('%Y-%m-%dT%H:%M:%fZ', a.ended_at / 1000.0, 'unixepoch') AS ended,
       a.stage, a.chunk_id, a.attempt, a.worker, a.outcome, a.error_class, a.error, f.pipeline
FROM attempts a JOIN chunks c ON c.id = a.chunk_id JOIN source_files f ON f.id = c.file_id
WHERE a.outcome <> 'done'
ORDER BY a.ended_at DESC, a.id DESC;

DROP VIEW IF EXISTS redone_work;
CREATE VIEW redone_work AS
SELECT a.stage, a.outcome, COALESCE(a.error_class, 'none') AS error_class,
       COUNT(*) AS attempts, COUNT(DISTINCT a.chunk_id) AS chunks, CAST(SUM(a.bytes) AS BIGINT) AS bytes, f.pipeline
FROM attempts a JOIN chunks c ON c.id = a.chunk_id JOIN source_files f ON f.id = c.file_id
WHERE a.outcome <> 'done'
GROUP BY f.pipeline, a.stage, a.outcome, COALESCE(a.error_class, 'none');

DROP VIEW IF EXISTS throughput;
CREATE VIEW throughput AS
SELECT a.stage, (a.ended_at / 60000) * 60000 AS minute_ms,
       strftime('%Y-%m-%dT%H:%M:00Z', (a.ended_at / 60000) * 60, 'unixepoch') AS minute,
       COUNT(*) AS chunks, CAST(SUM(a.records) AS BIGINT) AS records, CAST(SUM(a.bytes) AS BIGINT) AS bytes, f.pipeline
FROM attempts a JOIN chunks c ON c.id = a.chunk_id JOIN source_files f ON f.id = c.file_id
WHERE a.outcome = 'done'
GROUP BY f.pipeline, a.stage, a.ended_at / 60000;

-- Copies waiting, by the spool node that holds their Parquet: a node whose count only grows
-- is down or gone (then: `ferry rerun --spool-node NAME`).
CREATE VIEW copy_backlog_by_node AS
SELECT pipeline, node, COUNT(*) AS chunks, MIN(scheduled_at) AS oldest_scheduled_at
FROM tasks
WHERE stage = 'copy' AND state IN ('available', 'retryable', 'running')
GROUP BY pipeline, node;

-- An older copy would claim chunks whose spool is on another host.
INSERT INTO ledger_compat (version, oldest_binary, note) VALUES
    (8, 8, 'spool nodes: an older copy would claim chunks spooled on another host')
ON CONFLICT (version) DO NOTHING;
