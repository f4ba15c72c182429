-- Recovery without hand-written SQL, and files that change under the same name.
-- Keep in step with migrations/sqlite/0005_recovery.sql.

-- `ferry rerun --from S` makes stage S of a chunk available again while the later stages'
-- tasks still exist (done, or quarantined for want of a lost file). When S completes, the
-- next stage runs again: its existing task is reset instead of kept.
CREATE OR REPLACE FUNCTION ferry_task_done() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO attempts (task_id, chunk_id, stage, attempt, epoch, worker, started_at, ended_at,
                          outcome, bytes, records)
    VALUES (NEW.id, NEW.chunk_id, NEW.stage, NEW.attempt, NEW.epoch, OLD.lease_owner,
            COALESCE(OLD.attempted_at, NEW.finalized_at), NEW.finalized_at, 'done', NEW.bytes, NEW.records);
    IF NEW.stage IN ('transform', 'copy') THEN
        INSERT INTO tasks (chunk_id, stage, state, max_attempts, scheduled_at, created_at)
        VALUES (NEW.chunk_id, CASE NEW.stage WHEN 'transform' THEN 'copy' ELSE 'load' END, 'available',
                NEW.max_attempts, NEW.finalized_at, NEW.finalized_at)
        ON CONFLICT (chunk_id, stage) DO UPDATE
            SET state = 'available', attempt = 0, scheduled_at = excluded.scheduled_at, finalized_at = NULL,
                last_error = NULL, last_error_class = NULL
            WHERE tasks.state <> 'running';
    END IF;
    RETURN NULL;
END
$$;

-- Chunks an operator gave up on (`ferry skip`): their unfinished tasks were closed as done
-- without output; the reason stays here.
CREATE TABLE IF NOT EXISTS skips (
    chunk_id   TEXT   NOT NULL REFERENCES chunks (id),
    stage      TEXT   NOT NULL CHECK (stage IN ('transform', 'copy', 'load')),
    reason     TEXT   NOT NULL,
    skipped_at BIGINT NOT NULL,
    PRIMARY KEY (chunk_id, stage)
);

-- What besides size and mtime tells that a file was rewritten (a local file's inode and
-- ctime, which no writer can set back; an S3 object's ETag): a file whose size and mtime
-- match a done version is skipped without hashing only when this matches too.
ALTER TABLE source_files ADD COLUMN IF NOT EXISTS change_token TEXT;

-- Identical bytes under another name are a recorded decision, not a silent no-op (their
-- chunk ids would be the same): extract looks them up by hash.
CREATE INDEX IF NOT EXISTS source_files_hash ON source_files (content_hash);
