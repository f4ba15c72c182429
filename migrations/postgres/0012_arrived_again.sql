-- With `versions = "keep"`, bytes already taken in that arrive again under the same name are
-- not taken in again: that decision is kept on the file's row (how often, and when last), and
-- shown by `ferry status`, instead of passing in silence.
ALTER TABLE source_files ADD COLUMN arrived_again BIGINT NOT NULL DEFAULT 0;
ALTER TABLE source_files ADD COLUMN arrived_again_at BIGINT;

INSERT INTO ledger_compat (version, oldest_binary, note) VALUES
    (12, 10, 'additive: source_files.arrived_again')
ON CONFLICT (version) DO NOTHING;
