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

INSERT INTO ledger_compat (version, oldest_binary, note) VALUES
    (12, 10, 'additive: source_files.arrived_again, switches')
ON CONFLICT (version) DO NOTHING;
