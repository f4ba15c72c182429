-- The table's schema over time, and what a chunk's input looked like besides its rejects.
-- Keep in step with migrations/postgres/0006_schemas.sql.

-- One row per version of a table's schema, as transform wrote its Parquet files: version 1
-- from the first chunk, a new version for each compatible change (a new nullable column, a
-- wider type). Every file of the table was written in one of these versions, and every
-- later version reads the earlier files. `columns` is JSON: [{"name", "type" (the Hive
-- type), "detail" (the exact Arrow type), "nullable"}], partition columns included.
CREATE TABLE IF NOT EXISTS table_schemas (
    table_name  TEXT    NOT NULL,
    version     INTEGER NOT NULL CHECK (version >= 1),
    columns     TEXT    NOT NULL,
    change      TEXT    NOT NULL,
    chunk_id    TEXT,
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (table_name, version)
);

-- Warnings about a chunk's input that did not stop it: input fields that match no column
-- (not loaded), declared columns the input never has (all null).
CREATE TABLE IF NOT EXISTS chunk_notes (
    chunk_id TEXT    NOT NULL REFERENCES chunks (id),
    note     TEXT    NOT NULL,
    noted_at INTEGER NOT NULL,
    PRIMARY KEY (chunk_id, note)
);
