-- Column statistics per part and the table version of each published file. Keep in step with
-- the other backend's 0014_part_stats_and_table_versions.sql.
--
-- Transform reads each part's Parquet footer once it is written and records its statistics
-- here (row count; per column min, max and null count where the footer holds them exactly),
-- as the JSON a Delta `add` action carries in `stats`. Load copies them into the table's
-- log, so readers skip files without opening them. NULL for parts written before.
ALTER TABLE parts ADD COLUMN stats TEXT;

-- The table version whose commit made the file visible (`table_format = "delta"`); NULL for
-- the Hive layout, which has no versions.
ALTER TABLE published ADD COLUMN table_version BIGINT;

-- Per partition, the newest table version that brought a file of it (NULL for Hive tables).
DROP VIEW IF EXISTS table_partitions;
CREATE VIEW table_partitions AS
SELECT p.table_name, p.partition, COUNT(*) AS files, CAST(SUM(p.records) AS BIGINT) AS records,
       CAST(SUM(p.bytes) AS BIGINT) AS bytes, f.pipeline, MAX(p.table_version) AS table_version
FROM published p JOIN chunks c ON c.id = p.chunk_id JOIN source_files f ON f.id = c.file_id
GROUP BY f.pipeline, p.table_name, p.partition;

INSERT INTO ledger_compat (version, oldest_binary, note) VALUES
    (14, 13, 'additive: parts.stats, published.table_version, table_partitions.table_version')
ON CONFLICT (version) DO NOTHING;
