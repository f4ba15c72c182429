-- Redone bytes. Keep in step with migrations/sqlite/0009_redone_bytes.sql.
--
-- Redone work is what the design is judged by, so it is counted where it happens: every
-- attempt records `redone_bytes`, the bytes it sent that did not end in place (a request that
-- failed and was sent again inside the attempt, a hedge that lost, everything a failed attempt
-- sent that the next one must send again). A done attempt can have redone bytes too: a part
-- retried on a new connection costs one retry, not an attempt. `bytes` of a failed attempt is
-- what it moved before it failed.

ALTER TABLE attempts ADD COLUMN IF NOT EXISTS redone_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS redone_bytes BIGINT NOT NULL DEFAULT 0;

CREATE OR REPLACE FUNCTION ferry_task_done() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO attempts (task_id, chunk_id, stage, attempt, epoch, worker, started_at, ended_at,
                          outcome, bytes, records, redone_bytes)
    VALUES (NEW.id, NEW.chunk_id, NEW.stage, NEW.attempt, NEW.epoch, OLD.lease_owner,
            COALESCE(OLD.attempted_at, NEW.finalized_at), NEW.finalized_at, 'done', NEW.bytes, NEW.records, NEW.redone_bytes);
    IF NEW.stage IN ('transform', 'copy') THEN
        INSERT INTO tasks (pipeline, chunk_id, stage, state, max_attempts, scheduled_at, created_at, node)
        VALUES (NEW.pipeline, NEW.chunk_id, CASE NEW.stage WHEN 'transform' THEN 'copy' ELSE 'load' END, 'available',
                NEW.max_attempts, NEW.finalized_at, NEW.finalized_at,
                CASE NEW.stage WHEN 'transform' THEN NEW.node ELSE NULL END)
        ON CONFLICT (chunk_id, stage) DO UPDATE
            SET state = 'available', attempt = 0, scheduled_at = excluded.scheduled_at, finalized_at = NULL,
                last_error = NULL, last_error_class = NULL, node = excluded.node, redone_bytes = 0
            WHERE tasks.state <> 'running';
    END IF;
    RETURN NULL;
END
$$;

-- redone_work: every attempt that did not end its task, and every done attempt that sent
-- something twice; `bytes` is now the bytes sent again (it was the bytes of failed attempts,
-- which were never recorded).
DROP VIEW IF EXISTS redone_work;
CREATE VIEW redone_work AS
SELECT a.stage, a.outcome, COALESCE(a.error_class, 'none') AS error_class,
       COUNT(*) AS attempts, COUNT(DISTINCT a.chunk_id) AS chunks, CAST(SUM(a.redone_bytes) AS BIGINT) AS bytes, f.pipeline
FROM attempts a JOIN chunks c ON c.id = a.chunk_id JOIN source_files f ON f.id = c.file_id
WHERE a.outcome <> 'done' OR a.redone_bytes > 0
GROUP BY f.pipeline, a.stage, a.outcome, COALESCE(a.error_class, 'none');

-- Additive: an older binary records no redone bytes, and works.
INSERT INTO ledger_compat (version, oldest_binary, note) VALUES
    (9, 8, 'additive: redone bytes per attempt')
ON CONFLICT (version) DO NOTHING;
