-- Pipelines share nothing they should not. Keep in step with migrations/sqlite/0010_pipeline_scope.sql.
--
-- Two pipelines may write tables of the same name into different destinations: each has its
-- own schema versions (`table_schemas` keyed by pipeline too), its own partitions in
-- `table_partitions` (from its own published files) and its own outages. Rows from before
-- this migration go to the pipeline of the chunk that recorded them, else 'default'.

ALTER TABLE table_schemas ADD COLUMN IF NOT EXISTS pipeline TEXT NOT NULL DEFAULT 'default';
UPDATE table_schemas s SET pipeline = f.pipeline
FROM chunks c JOIN source_files f ON f.id = c.file_id
WHERE c.id = s.chunk_id;
ALTER TABLE table_schemas DROP CONSTRAINT IF EXISTS table_schemas_pkey;
ALTER TABLE table_schemas ADD PRIMARY KEY (pipeline, table_name, version);

ALTER TABLE outages ADD COLUMN IF NOT EXISTS pipeline TEXT NOT NULL DEFAULT 'default';
DROP INDEX IF EXISTS outages_open;
CREATE UNIQUE INDEX IF NOT EXISTS outages_open ON outages (pipeline, store, stage) WHERE ended_at IS NULL;
DROP VIEW IF EXISTS open_outages;
CREATE VIEW open_outages AS
SELECT id, store, stage, started_at, probes, last_probe_at, last_error, pipeline
FROM outages WHERE ended_at IS NULL;

DROP VIEW IF EXISTS table_partitions;
CREATE VIEW table_partitions AS
SELECT p.table_name, p.partition, COUNT(*) AS files, CAST(SUM(p.records) AS BIGINT) AS records,
       CAST(SUM(p.bytes) AS BIGINT) AS bytes, f.pipeline
FROM published p JOIN chunks c ON c.id = p.chunk_id JOIN source_files f ON f.id = c.file_id
GROUP BY f.pipeline, p.table_name, p.partition;

INSERT INTO ledger_compat (version, oldest_binary, note) VALUES
    (10, 10, 'pipeline scope: schema versions and outages are keyed by pipeline (an older binary''s upserts no longer match)')
ON CONFLICT (version) DO NOTHING;
