-- Load looks up a chunk's published files by chunk (what it published before, whether a
-- rerun's files are in place, what gc may take): without this index each lookup read the whole
-- table, twice per loaded chunk, and under SQLite's write lock.
CREATE INDEX IF NOT EXISTS published_chunk ON published (chunk_id);

INSERT INTO ledger_compat (version, oldest_binary, note) VALUES
    (11, 10, 'additive: an index on published.chunk_id')
ON CONFLICT (version) DO NOTHING;
