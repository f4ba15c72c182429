-- The table version of a partition: the one the newest published file came with. Keep in step
-- with the other backend's 0016_partition_table_version.sql.
--
-- 0014 took MAX(table_version), right for Delta, whose versions grow, and wrong for Iceberg,
-- whose files are recorded with the id of the snapshot that brought them (random, as Iceberg's
-- snapshot ids are). The newest file's (by published_at, then version) is the same for Delta
-- and the snapshot that last changed the partition for Iceberg.
DROP VIEW IF EXISTS table_partitions;
CREATE VIEW table_partitions AS
SELECT table_name, partition, files, records, bytes, pipeline, table_version FROM (
    SELECT p.table_name, p.partition, f.pipeline,
           COUNT(*) OVER w AS files,
           CAST(SUM(p.records) OVER w AS BIGINT) AS records,
           CAST(SUM(p.bytes) OVER w AS BIGINT) AS bytes,
           p.table_version,
           ROW_NUMBER() OVER (PARTITION BY f.pipeline, p.table_name, p.partition
                              ORDER BY p.published_at DESC, p.table_version DESC) AS newest
    FROM published p JOIN chunks c ON c.id = p.chunk_id JOIN source_files f ON f.id = c.file_id
    WINDOW w AS (PARTITION BY f.pipeline, p.table_name, p.partition)
) AS per_file
WHERE newest = 1;

INSERT INTO ledger_compat (version, oldest_binary, note) VALUES
    (16, 15, 'additive: table_partitions.table_version is the newest published file''s (an Iceberg snapshot id)')
ON CONFLICT (version) DO NOTHING;
