-- What the stages made of each chunk. Keep in step with migrations/sqlite/0002_outputs.sql.

-- transform's output: one Parquet file per (chunk, partition value), written to the local spool.
CREATE TABLE IF NOT EXISTS parts (
    chunk_id     TEXT    NOT NULL REFERENCES chunks (id),
    partition    TEXT    NOT NULL,            -- Hive path, e.g. 'dt=2026-11-30' ('' if unpartitioned)
    name         TEXT    NOT NULL,            -- file name, e.g. 'part-<chunk>.parquet'
    records      BIGINT  NOT NULL CHECK (records >= 0),
    bytes        BIGINT  NOT NULL CHECK (bytes >= 0),
    content_hash TEXT    NOT NULL,            -- blake3 of the file, checked at every hop
    PRIMARY KEY (chunk_id, partition)
);

-- Bad input records set aside by transform (at most transform.max_bad_records per chunk).
CREATE TABLE IF NOT EXISTS rejects (
    chunk_id TEXT    NOT NULL REFERENCES chunks (id),
    position TEXT    NOT NULL,                -- e.g. 'line 17' or 'record 3 of block 2'
    reason   TEXT    NOT NULL,
    PRIMARY KEY (chunk_id, position)
);

-- load's result: every file in the table, exactly once.
CREATE TABLE IF NOT EXISTS published (
    path         TEXT    PRIMARY KEY,         -- relative to the destination, e.g. 'events/dt=.../part-<chunk>.parquet'
    table_name   TEXT    NOT NULL,
    chunk_id     TEXT    NOT NULL REFERENCES chunks (id),
    partition    TEXT    NOT NULL,
    records      BIGINT  NOT NULL,
    bytes        BIGINT  NOT NULL,
    content_hash TEXT    NOT NULL,
    published_at BIGINT  NOT NULL
);
CREATE INDEX IF NOT EXISTS published_table ON published (table_name, partition);

CREATE OR REPLACE VIEW table_partitions AS
SELECT table_name, partition, COUNT(*) AS files, CAST(SUM(records) AS BIGINT) AS records,
       CAST(SUM(bytes) AS BIGINT) AS bytes
FROM published GROUP BY table_name, partition;

CREATE OR REPLACE VIEW quarantined AS
SELECT 'file' AS kind, f.uri AS what, NULL AS stage, f.error AS reason
FROM source_files f WHERE f.state = 'quarantined'
UNION ALL
SELECT 'chunk', t.chunk_id || ' of ' || f.uri, t.stage, t.last_error
FROM tasks t JOIN chunks c ON c.id = t.chunk_id JOIN source_files f ON f.id = c.file_id
WHERE t.state = 'quarantined';
