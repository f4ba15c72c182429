-- Several pipelines on one ledger. Keep in step with migrations/sqlite/0007_pipelines.sql.
--
-- Every source file and task belongs to a named pipeline (the config's `pipeline`, 'default'
-- for a ledger from before this migration: its history is kept). A stage claims only its own
-- pipeline's tasks; extract knows a file by (pipeline, uri, content), so two pipelines may
-- read the same source. Chunks, parts, rejects and published rows belong to their file's
-- pipeline (chunk ids of other pipelines are derived with the pipeline's name).

ALTER TABLE source_files ADD COLUMN IF NOT EXISTS pipeline TEXT NOT NULL DEFAULT 'default';
ALTER TABLE source_files DROP CONSTRAINT IF EXISTS source_files_uri_content_hash_key;
CREATE UNIQUE INDEX IF NOT EXISTS source_files_pipeline_uri_hash ON source_files (pipeline, uri, content_hash);
DROP INDEX IF EXISTS source_files_uri;
CREATE INDEX IF NOT EXISTS source_files_uri ON source_files (pipeline, uri, size, mtime_ms);

ALTER TABLE tasks ADD COLUMN IF NOT EXISTS pipeline TEXT NOT NULL DEFAULT 'default';
-- The claim reads this index in order; its predicate stays textually identical to the claim's.
DROP INDEX IF EXISTS tasks_due;
CREATE INDEX tasks_due ON tasks (pipeline, stage, scheduled_at, id) WHERE state IN ('available', 'retryable');

-- A finished stage hands its chunk on within its pipeline.
CREATE OR REPLACE FUNCTION ferry_task_done() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO attempts (task_id, chunk_id, stage, attempt, epoch, worker, started_at, ended_at,
                          outcome, bytes, records)
    VALUES (NEW.id, NEW.chunk_id, NEW.stage, NEW.attempt, NEW.epoch, OLD.lease_owner,
            COALESCE(OLD.attempted_at, NEW.finalized_at), NEW.finalized_at, 'done', NEW.bytes, NEW.records);
    IF NEW.stage IN ('transform', 'copy') THEN
        INSERT INTO tasks (pipeline, chunk_id, stage, state, max_attempts, scheduled_at, created_at)
        VALUES (NEW.pipeline, NEW.chunk_id, CASE NEW.stage WHEN 'transform' THEN 'copy' ELSE 'load' END, 'available',
                NEW.max_attempts, NEW.finalized_at, NEW.finalized_at)
        ON CONFLICT (chunk_id, stage) DO UPDATE
            SET state = 'available', attempt = 0, scheduled_at = excluded.scheduled_at, finalized_at = NULL,
                last_error = NULL, last_error_class = NULL
            WHERE tasks.state <> 'running';
    END IF;
    RETURN NULL;
END
$$;

-- Each pipeline's table, as recorded by its first stage to run: a config that names the
-- pipeline with another table is refused.
CREATE TABLE IF NOT EXISTS pipelines (
    name       TEXT   PRIMARY KEY,
    table_name TEXT   NOT NULL,
    created_at BIGINT NOT NULL
);

DROP VIEW IF EXISTS quarantined;
CREATE VIEW quarantined AS
SELECT 'file' AS kind, f.uri AS what, NULL AS stage, f.error AS reason, f.pipeline AS pipeline
FROM source_files f WHERE f.state = 'quarantined'
UNION ALL
SELECT 'chunk', t.chunk_id || ' of ' || f.uri, t.stage, t.last_error, t.pipeline
FROM tasks t JOIN chunks c ON c.id = t.chunk_id JOIN source_files f ON f.id = c.file_id
WHERE t.state = 'quarantined';

-- The backlog per pipeline (`backlog` keeps its columns: older binaries read it).
CREATE OR REPLACE VIEW pipeline_backlog AS
SELECT t.pipeline, t.stage, t.state, COUNT(*) AS tasks, MIN(t.created_at) AS oldest_created_ms
FROM tasks t
GROUP BY t.pipeline, t.stage, t.state;

-- Rolling upgrades: which binaries still work on a ledger that has a migration. A binary
-- whose schema is older than a migration's version runs on the ledger only if that
-- migration's `oldest_binary` is at most its own schema (`ledger/src/backend.rs`). Every
-- migration from here on adds its row, and `ferry migrate --check` shows them.
CREATE TABLE IF NOT EXISTS ledger_compat (
    version       BIGINT PRIMARY KEY,
    oldest_binary BIGINT NOT NULL,
    note          TEXT    NOT NULL
);
INSERT INTO ledger_compat (version, oldest_binary, note) VALUES
    (6, 5, 'additive: table_schemas, chunk_notes'),
    (7, 7, 'pipelines: an older binary would claim every pipeline''s tasks')
ON CONFLICT (version) DO NOTHING;
