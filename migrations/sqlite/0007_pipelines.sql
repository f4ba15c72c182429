-- no-transaction
-- Several pipelines on one ledger. Keep in step with migrations/postgres/0007_pipelines.sql.
--
-- Every source file and task belongs to a named pipeline (the config's `pipeline`, 'default'
-- for a ledger from before this migration: its history is kept). A stage claims only its own
-- pipeline's tasks; extract knows a file by (pipeline, uri, content), so two pipelines may
-- read the same source. Chunks, parts, rejects and published rows belong to their file's
-- pipeline (chunk ids of other pipelines are derived with the pipeline's name).
--
-- SQLite cannot change a table's UNIQUE constraint in place: source_files is rebuilt in one
-- transaction, with foreign keys off meanwhile (chunks point at its ids, which are kept), and
-- the view that reads it is dropped first (a rename checks every view).

PRAGMA foreign_keys = OFF;
BEGIN IMMEDIATE;

DROP VIEW IF EXISTS quarantined;

CREATE TABLE source_files_by_pipeline (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline      TEXT    NOT NULL DEFAULT 'default',
    uri           TEXT    NOT NULL,
    size          INTEGER NOT NULL CHECK (size >= 0),
    mtime_ms      INTEGER NOT NULL,
    content_hash  TEXT    NOT NULL,
    version       INTEGER NOT NULL DEFAULT 1,
    format        TEXT    NOT NULL,
    state         TEXT    NOT NULL DEFAULT 'registered'
                  CHECK (state IN ('registered', 'chunked', 'quarantined')),
    chunks        INTEGER,
    error         TEXT,
    registered_at INTEGER NOT NULL,
    chunked_at    INTEGER,
    change_token  TEXT,
    UNIQUE (pipeline, uri, content_hash)
);
INSERT INTO source_files_by_pipeline (id, uri, size, mtime_ms, content_hash, version, format, state, chunks, error,
                                      registered_at, chunked_at, change_token)
SELECT id, uri, size, mtime_ms, content_hash, version, format, state, chunks, error, registered_at, chunked_at, change_token
FROM source_files;
DROP TABLE source_files;
ALTER TABLE source_files_by_pipeline RENAME TO source_files;
CREATE INDEX source_files_uri ON source_files (pipeline, uri, size, mtime_ms);
CREATE INDEX source_files_hash ON source_files (content_hash);

ALTER TABLE tasks ADD COLUMN pipeline TEXT NOT NULL DEFAULT 'default';
-- The claim reads this index in order; its predicate stays textually identical to the claim's.
DROP INDEX IF EXISTS tasks_due;
CREATE INDEX tasks_due ON tasks (pipeline, stage, scheduled_at, id) WHERE state IN ('available', 'retryable');

-- A finished stage hands its chunk on within its pipeline.
DROP TRIGGER IF EXISTS tasks_on_done;
CREATE TRIGGER tasks_on_done AFTER UPDATE OF state ON tasks
WHEN OLD.state = 'running' AND NEW.state = 'done'
BEGIN
    INSERT INTO attempts (task_id, chunk_id, stage, attempt, epoch, worker, started_at, ended_at,
                          outcome, bytes, records)
    VALUES (NEW.id, NEW.chunk_id, NEW.stage, NEW.attempt, NEW.epoch, OLD.lease_owner,
            COALESCE(OLD.attempted_at, NEW.finalized_at), NEW.finalized_at, 'done', NEW.bytes, NEW.records);
    INSERT INTO tasks (pipeline, chunk_id, stage, state, max_attempts, scheduled_at, created_at)
    SELECT NEW.pipeline, NEW.chunk_id, CASE NEW.stage WHEN 'transform' THEN 'copy' ELSE 'load' END, 'available',
           NEW.max_attempts, NEW.finalized_at, NEW.finalized_at
    WHERE NEW.stage IN ('transform', 'copy')
    ON CONFLICT (chunk_id, stage) DO UPDATE
        SET state = 'available', attempt = 0, scheduled_at = excluded.scheduled_at, finalized_at = NULL,
            last_error = NULL, last_error_class = NULL
        WHERE tasks.state <> 'running';
END;

-- Each pipeline's table, as recorded by its first stage to run: a config that names the
-- pipeline with another table is refused.
CREATE TABLE IF NOT EXISTS pipelines (
    name       TEXT    PRIMARY KEY,
    table_name TEXT    NOT NULL,
    created_at INTEGER NOT NULL
);

CREATE VIEW quarantined AS
SELECT 'file' AS kind, f.uri AS what, NULL AS stage, f.error AS reason, f.pipeline AS pipeline
FROM source_files f WHERE f.state = 'quarantined'
UNION ALL
SELECT 'chunk', t.chunk_id || ' of ' || f.uri, t.stage, t.last_error, t.pipeline
FROM tasks t JOIN chunks c ON c.id = t.chunk_id JOIN source_files f ON f.id = c.file_id
WHERE t.state = 'quarantined';

-- The backlog per pipeline (`backlog` keeps its columns: older binaries read it).
CREATE VIEW pipeline_backlog AS
SELECT t.pipeline, t.stage, t.state, COUNT(*) AS tasks, MIN(t.created_at) AS oldest_created_ms
FROM tasks t
GROUP BY t.pipeline, t.stage, t.state;

-- Rolling upgrades: which binaries still work on a ledger that has a migration. A binary
-- whose schema is older than a migration's version runs on the ledger only if that
-- migration's `oldest_binary` is at most its own schema (`ledger/src/backend.rs`). Every
-- migration from here on adds its row, and `ferry migrate --check` shows them.
CREATE TABLE IF NOT EXISTS ledger_compat (
    version       INTEGER PRIMARY KEY,
    oldest_binary INTEGER NOT NULL,
    note          TEXT    NOT NULL
);
INSERT INTO ledger_compat (version, oldest_binary, note) VALUES
    (6, 5, 'additive: table_schemas, chunk_notes'),
    (7, 7, 'pipelines: an older binary would claim every pipeline''s tasks')
ON CONFLICT (version) DO NOTHING;

COMMIT;
PRAGMA foreign_keys = ON;
