-- With `versions = "keep"`, bytes already taken in that arrive again under the same name are
-- not taken in again: that decision is kept on the file's row (how often, and when last), and
-- shown by `ferry status`, instead of passing in silence.
ALTER TABLE source_files ADD COLUMN arrived_again BIGINT NOT NULL DEFAULT 0;
ALTER TABLE source_files ADD COLUMN arrived_again_at BIGINT;

-- The switch of a corrected file's version into the table (load moves every chunk's parts in
-- one step) is held by one load task at a time, across hosts: the row names the task and the
-- epoch of its lease, and is free again once that lease is not running any more (done,
-- failed, expired). Two loads switching the same version at once could otherwise each take
-- back what the other had recorded.
CREATE TABLE IF NOT EXISTS switches (
    pipeline  TEXT    NOT NULL,
    uri       TEXT    NOT NULL,
    version   BIGINT  NOT NULL,
    task_id   BIGINT  NOT NULL,
    epoch     BIGINT  NOT NULL,
    taken_at  BIGINT  NOT NULL,
    PRIMARY KEY (pipeline, uri, version)
);

-- What the SQLite ledger's durability barrier writes (`Ledger::make_durable`): one commit with
-- `synchronous = FULL` fsyncs the WAL, but only a commit that changes a page writes anything.
CREATE TABLE IF NOT EXISTS syncs (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    n   BIGINT  NOT NULL
);
INSERT INTO syncs (id, n) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;

INSERT INTO ledger_compat (version, oldest_binary, note) VALUES
    (12, 10, 'additive: source_files.arrived_again, switches, syncs')
ON CONFLICT (version) DO NOTHING;
