-- Iceberg's JDBC catalog in the ledger (`[destination.iceberg] catalog = "ledger"`). Keep in
-- step with the other backend's 0015_iceberg_catalog.sql.
--
-- The two tables are the ones Iceberg's JdbcCatalog (Spark, Flink, Trino's jdbc catalog) and
-- PyIceberg's SqlCatalog create and read, with their names and columns, so those engines find
-- Ferry's tables given only the ledger's URL. A table's row points at its current metadata
-- file; a commit is `UPDATE ... SET metadata_location = new WHERE metadata_location = old`,
-- which Ferry runs in the same transaction as the chunks' ledger rows. IF NOT EXISTS: a reader
-- that created them first keeps its own (iceberg_type, which only JdbcCatalog's newer schema
-- has, is never written by Ferry: NULL reads as a table there).
CREATE TABLE IF NOT EXISTS iceberg_tables (
    catalog_name VARCHAR(255) NOT NULL,
    table_namespace VARCHAR(255) NOT NULL,
    table_name VARCHAR(255) NOT NULL,
    metadata_location VARCHAR(1000),
    previous_metadata_location VARCHAR(1000),
    iceberg_type VARCHAR(5),
    PRIMARY KEY (catalog_name, table_namespace, table_name)
);

CREATE TABLE IF NOT EXISTS iceberg_namespace_properties (
    catalog_name VARCHAR(255) NOT NULL,
    namespace VARCHAR(255) NOT NULL,
    property_key VARCHAR(255) NOT NULL,
    property_value VARCHAR(1000),
    PRIMARY KEY (catalog_name, namespace, property_key)
);

INSERT INTO ledger_compat (version, oldest_binary, note) VALUES
    (15, 14, 'additive: iceberg_tables, iceberg_namespace_properties (the Iceberg JDBC catalog)')
ON CONFLICT (version) DO NOTHING;
