-- Ferry work ledger, SQLite flavour. Keep in step with migrations/postgres/0001_ledger.sql:
-- same tables, same columns, same views, same version number.
-- Times are integer milliseconds since the Unix epoch (UTC) so that both backends compare
-- them the same way and tests can drive a deterministic clock; the views add readable columns.

CREATE TABLE IF NOT EXISTS source_files (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    uri           TEXT    NOT NULL,
    size          INTEGER NOT NULL CHECK (size >= 0),
    mtime_ms      INTEGER NOT NULL,
    content_hash  TEXT    NOT NULL,
    -- the n-th distinct content seen at this uri: a changed file is a new version
    version       INTEGER NOT NULL DEFAULT 1,
    format        TEXT    NOT NULL,
    state         TEXT    NOT NULL DEFAULT 'registered'
                  CHECK (state IN ('registered', 'chunked', 'quarantined')),
    chunks        INTEGER,
    error         TEXT,
    registered_at INTEGER NOT NULL,
    chunked_at    INTEGER,
    UNIQUE (uri, content_hash)
);
CREATE INDEX IF NOT EXISTS source_files_uri ON source_files (uri, size, mtime_ms);

CREATE TABLE IF NOT EXISTS chunks (
    id           TEXT    PRIMARY KEY,
    file_id      INTEGER NOT NULL REFERENCES source_files (id),
    seq          INTEGER NOT NULL CHECK (seq >= 0),
    range_kind   TEXT    NOT NULL CHECK (range_kind IN ('bytes', 'records')),
    range_start  INTEGER NOT NULL,
    range_end    INTEGER NOT NULL CHECK (range_end >= range_start),
    records      INTEGER,
    bytes        INTEGER NOT NULL CHECK (bytes >= 0),
    content_hash TEXT    NOT NULL,
    location     TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    UNIQUE (file_id, seq)
);

CREATE TABLE IF NOT EXISTS tasks (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    chunk_id         TEXT    NOT NULL REFERENCES chunks (id),
    stage            TEXT    NOT NULL CHECK (stage IN ('transform', 'copy', 'load')),
    state            TEXT    NOT NULL DEFAULT 'available'
                     CHECK (state IN ('available', 'running', 'retryable', 'done', 'quarantined')),
    attempt          INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts     INTEGER NOT NULL CHECK (max_attempts > 0),
    scheduled_at     INTEGER NOT NULL,
    lease_owner      TEXT,
    lease_expires_at INTEGER,
    epoch            INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    last_error_class TEXT    CHECK (last_error_class IN ('transient', 'permanent')),
    created_at       INTEGER NOT NULL,
    attempted_at     INTEGER,
    finalized_at     INTEGER,
    -- what the last finished attempt moved (stage output bytes and records)
    bytes            INTEGER NOT NULL DEFAULT 0,
    records          INTEGER NOT NULL DEFAULT 0,
    UNIQUE (chunk_id, stage),
    -- a lease exists exactly while the task runs
    CHECK ((state = 'running') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
    -- finalized_at is set exactly for the terminal states
    CHECK ((state IN ('done', 'quarantined')) = (finalized_at IS NOT NULL))
);
-- The claim query reads this index in order and stops after LIMIT rows: no sort, no scan of
-- the whole backlog. Its predicate must stay textually identical to the claim's WHERE term.
CREATE INDEX IF NOT EXISTS tasks_due ON tasks (stage, scheduled_at, id)
    WHERE state IN ('available', 'retryable');
-- No (stage, state) index: every state change would pay for it, and only the summary queries
-- (backlog, pending) group by state. Measured on Postgres: +5% claim+complete cycles/s.
CREATE INDEX IF NOT EXISTS tasks_lease ON tasks (state, lease_expires_at);

-- Append-only: one row per finished attempt (a lease that ended in any way).
CREATE TABLE IF NOT EXISTS attempts (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id     INTEGER NOT NULL REFERENCES tasks (id),
    chunk_id    TEXT    NOT NULL,
    stage       TEXT    NOT NULL,
    attempt     INTEGER NOT NULL,
    epoch       INTEGER NOT NULL,
    worker      TEXT    NOT NULL,
    started_at  INTEGER NOT NULL,
    ended_at    INTEGER NOT NULL,
    outcome     TEXT    NOT NULL
                CHECK (outcome IN ('done', 'retryable', 'quarantined', 'lease_expired', 'released')),
    error_class TEXT    CHECK (error_class IN ('transient', 'permanent')),
    error       TEXT,
    bytes       INTEGER NOT NULL DEFAULT 0,
    records     INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS attempts_task ON attempts (task_id);
CREATE INDEX IF NOT EXISTS attempts_ended ON attempts (ended_at);

-- Finishing a task is one UPDATE to 'done'; the database itself appends the attempt to the
-- history and makes the chunk's next stage available, in the same statement. Any writer, even
-- a hand-written UPDATE, keeps the pipeline's invariant that a done stage hands its chunk on.
CREATE TRIGGER IF NOT EXISTS tasks_on_done AFTER UPDATE OF state ON tasks
WHEN OLD.state = 'running' AND NEW.state = 'done'
BEGIN
    INSERT INTO attempts (task_id, chunk_id, stage, attempt, epoch, worker, started_at, ended_at,
                          outcome, bytes, records)
    VALUES (NEW.id, NEW.chunk_id, NEW.stage, NEW.attempt, NEW.epoch, OLD.lease_owner,
            COALESCE(OLD.attempted_at, NEW.finalized_at), NEW.finalized_at, 'done', NEW.bytes, NEW.records);
    INSERT INTO tasks (chunk_id, stage, state, max_attempts, scheduled_at, created_at)
    SELECT NEW.chunk_id, CASE NEW.stage WHEN 'transform' THEN 'copy' ELSE 'load' END, 'available',
           NEW.max_attempts, NEW.finalized_at, NEW.finalized_at
    WHERE NEW.stage IN ('transform', 'copy')
    ON CONFLICT (chunk_id, stage) DO NOTHING;
END;

CREATE VIEW IF NOT EXISTS backlog AS
SELECT t.stage, t.state, COUNT(*) AS tasks, CAST(COALESCE(SUM(c.bytes), 0) AS BIGINT) AS bytes,
       MIN(t.created_at) AS oldest_created_ms
FROM tasks t JOIN chunks c ON c.id = t.chunk_id
GROUP BY t.stage, t.state;

CREATE VIEW IF NOT EXISTS stuck_leases AS
SELECT t.id AS task_id, t.chunk_id, t.stage, t.attempt, t.epoch, t.lease_owner,
       t.lease_expires_at,
       strftime('%Y-%m-%dT%H:%M:%fZ', t.lease_expires_at / 1000.0, 'unixepoch') AS lease_expired,
       CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) - t.lease_expires_at AS overdue_ms
FROM tasks t
WHERE t.state = 'running'
  AND t.lease_expires_at < CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER);

CREATE VIEW IF NOT EXISTS recent_failures AS
SELECT a.ended_at, strftime('%Y-%m-%dT%H:%M:%fZ', a.ended_at / 1000.0, 'unixepoch') AS ended,
       a.stage, a.chunk_id, a.attempt, a.worker, a.outcome, a.error_class, a.error
FROM attempts a
WHERE a.outcome <> 'done'
ORDER BY a.ended_at DESC, a.id DESC
LIMIT 200;

-- Work that was done more than once: every attempt that did not end the task, with the bytes
-- it had moved, so "how much was redone and why" is one query.
CREATE VIEW IF NOT EXISTS redone_work AS
SELECT a.stage, a.outcome, COALESCE(a.error_class, 'none') AS error_class,
       COUNT(*) AS attempts, COUNT(DISTINCT a.chunk_id) AS chunks, CAST(SUM(a.bytes) AS BIGINT) AS bytes
FROM attempts a
WHERE a.outcome <> 'done'
GROUP BY a.stage, a.outcome, COALESCE(a.error_class, 'none');

CREATE VIEW IF NOT EXISTS throughput AS
SELECT a.stage, (a.ended_at / 60000) * 60000 AS minute_ms,
       strftime('%Y-%m-%dT%H:%M:00Z', (a.ended_at / 60000) * 60, 'unixepoch') AS minute,
       COUNT(*) AS chunks, CAST(SUM(a.records) AS BIGINT) AS records, CAST(SUM(a.bytes) AS BIGINT) AS bytes
FROM attempts a
WHERE a.outcome = 'done'
GROUP BY a.stage, a.ended_at / 60000;
