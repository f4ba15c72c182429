//! A table's schema over time (`table_schemas`) and notes about a chunk's input
//! (`chunk_notes`).
//!
//! Transform records version 1 from the table's first chunk and a new version for each
//! compatible change it meets (decided in `ferry_transform::schema`); load writes the DDL
//! from the latest version. Versions are only ever inserted, numbered without gaps: two
//! transforms that both see version N and both want N+1 race on the primary key, and the
//! loser redoes its chunk against the winner's version.

use crate::backend::{Backend, Begin};
use crate::{Ledger, Result, db};

/// One column of a recorded schema.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SchemaColumn {
    pub name: String,
    /// The Hive type, as the DDL writes it (`BIGINT`, `ARRAY<STRING>`).
    #[serde(rename = "type")]
    pub hive: String,
    /// The exact type of the Parquet files' column (the Hive type does not tell a
    /// millisecond timestamp from a microsecond one).
    pub detail: String,
    pub nullable: bool,
}

/// One version of a table's schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSchema {
    pub version: i64,
    pub columns: Vec<SchemaColumn>,
    /// What changed from the previous version ("created" for version 1).
    pub change: String,
    /// The chunk whose files first had this version.
    pub chunk_id: Option<String>,
    pub recorded_at: i64,
}

struct Row {
    version: i64,
    columns: String,
    change: String,
    chunk_id: Option<String>,
    recorded_at: i64,
}

from_row!(Row { version, columns, change, chunk_id, recorded_at });

impl Ledger {
    /// Every recorded version of `table`'s schema, oldest first (empty before its first chunk).
    pub async fn table_schemas(&self, table: &str) -> Result<Vec<TableSchema>> {
        let rows = self
            .call("table_schemas", || async move {
                on_backend!(self, |pool, begin| {
                    sqlx::query_as::<_, Row>(
                        "SELECT version, columns, change, chunk_id, recorded_at FROM table_schemas
                         WHERE table_name = $1 AND pipeline = $2 ORDER BY version",
                    )
                    .bind(table)
                    .bind(self.pipeline())
                    .fetch_all(pool)
                    .await
                    .map_err(db("table_schemas"))
                })
            })
            .await?;
        rows.into_iter()
            .map(|r| {
                let columns = serde_json::from_str(&r.columns).map_err(|e| {
                    crate::Error::Internal(format!("table_schemas row {table} v{}: columns are not valid JSON: {e}", r.version))
                })?;
                Ok(TableSchema { version: r.version, columns, change: r.change, chunk_id: r.chunk_id, recorded_at: r.recorded_at })
            })
            .collect()
    }

    /// Records `version` of `table`'s schema; false if that version exists already (another
    /// transform recorded it first).
    pub async fn record_table_schema(
        &self,
        table: &str,
        version: i64,
        columns: &[SchemaColumn],
        change: &str,
        chunk: &str,
    ) -> Result<bool> {
        let now = self.now_ms();
        let json = serde_json::to_string(columns).map_err(|e| crate::Error::Internal(e.to_string()))?;
        let json = json.as_str();
        self.call("record_table_schema", || async move {
            on_backend!(self, |pool, begin| {
                let n = sqlx::query(
                    "INSERT INTO table_schemas (table_name, version, columns, change, chunk_id, recorded_at, pipeline)
                     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (pipeline, table_name, version) DO NOTHING",
                )
                .bind(table)
                .bind(version)
                .bind(json)
                .bind(change)
                .bind(chunk)
                .bind(now)
                .bind(self.pipeline())
                .execute(pool)
                .await
                .map_err(db("record_table_schema"))?
                .rows_affected();
                Ok(n == 1)
            })
        })
        .await
    }

    /// Records warnings about a chunk's input (kept once each, also when the chunk is redone).
    pub async fn note_chunk(&self, chunk: &str, notes: &[String]) -> Result<()> {
        if notes.is_empty() {
            return Ok(());
        }
        let now = self.now_ms();
        self.call("note_chunk", || async move {
            on_backend!(self, |pool, begin| {
                for note in notes {
                    sqlx::query("INSERT INTO chunk_notes (chunk_id, note, noted_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING")
                        .bind(chunk)
                        .bind(crate::text(note))
                        .bind(now)
                        .execute(pool)
                        .await
                        .map_err(db("note_chunk"))?;
                }
                Ok(())
            })
        })
        .await
    }
}
