//! What the stages made of each chunk: transform's parts and rejects, load's published files.
//! Every write is fenced like `complete`: it lands only while the caller's lease is current.

use sqlx::Row;

use super::{Backend, Begin, Lease, Ledger, db};
use crate::error::Result;

/// One Parquet file transform wrote for a chunk: the rows of one partition value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub chunk_id: String,
    /// Hive partition path (`dt=2026-11-30`), empty for an unpartitioned table.
    pub partition: String,
    pub name: String,
    pub records: i64,
    pub bytes: i64,
    pub content_hash: String,
}

impl Part {
    /// `<partition>/<name>`, or just the name when unpartitioned.
    pub fn rel_path(&self) -> String {
        if self.partition.is_empty() { self.name.clone() } else { format!("{}/{}", self.partition, self.name) }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    pub position: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionStats {
    pub table: String,
    pub partition: String,
    pub files: i64,
    pub records: i64,
}

/// Locks the task row at the caller's epoch inside `$tx`, or returns Ok(false).
macro_rules! fence {
    ($tx:expr, $lease:expr, $op:expr) => {{
        let n = sqlx::query(
            "UPDATE tasks SET lease_expires_at = lease_expires_at
             WHERE id = $1 AND epoch = $2 AND state = 'running'",
        )
        .bind($lease.task_id)
        .bind($lease.epoch)
        .execute(&mut *$tx)
        .await
        .map_err(db($op))?
        .rows_affected();
        n == 1
    }};
}

impl Ledger {
    /// Replaces the chunk's parts and rejects with these, if `lease` is still current.
    pub async fn record_parts(&self, lease: &Lease, parts: &[Part], rejects: &[Reject]) -> Result<()> {
        let ok = self
            .call("record_parts", || async move {
                on_backend!(self, |pool, begin| {
                    let op = "record_parts";
                    let _write = self.write_guard().await;
                    let mut tx = pool.begin_with(begin.0).await.map_err(db(op))?;
                    if !fence!(tx, lease, op) {
                        return Ok(false);
                    }
                    for table in ["DELETE FROM parts WHERE chunk_id = $1", "DELETE FROM rejects WHERE chunk_id = $1"] {
                        sqlx::query(table).bind(&lease.chunk_id).execute(&mut *tx).await.map_err(db(op))?;
                    }
                    for p in parts {
                        sqlx::query(
                            "INSERT INTO parts (chunk_id, partition, name, records, bytes, content_hash)
                             VALUES ($1, $2, $3, $4, $5, $6)",
                        )
                        .bind(&p.chunk_id)
                        .bind(&p.partition)
                        .bind(&p.name)
                        .bind(p.records)
                        .bind(p.bytes)
                        .bind(&p.content_hash)
                        .execute(&mut *tx)
                        .await
                        .map_err(db(op))?;
                    }
                    for r in rejects {
                        sqlx::query(
                            "INSERT INTO rejects (chunk_id, position, reason) VALUES ($1, $2, $3)
                             ON CONFLICT (chunk_id, position) DO NOTHING",
                        )
                        .bind(&lease.chunk_id)
                        .bind(&r.position)
                        .bind(&r.reason)
                        .execute(&mut *tx)
                        .await
                        .map_err(db(op))?;
                    }
                    tx.commit().await.map_err(db(op))?;
                    Ok(true)
                })
            })
            .await?;
        if ok { Ok(()) } else { Err(self.lease_lost(lease).await) }
    }

    pub async fn parts(&self, chunk_id: &str) -> Result<Vec<Part>> {
        self.call("parts", || async move {
            on_backend!(self, |pool, begin| {
                let rows = sqlx::query(
                    "SELECT chunk_id, partition, name, records, bytes, content_hash
                     FROM parts WHERE chunk_id = $1 ORDER BY partition",
                )
                .bind(chunk_id)
                .fetch_all(pool)
                .await
                .map_err(db("parts"))?;
                rows.iter()
                    .map(|r| {
                        Ok(Part {
                            chunk_id: r.try_get("chunk_id")?,
                            partition: r.try_get("partition")?,
                            name: r.try_get("name")?,
                            records: r.try_get("records")?,
                            bytes: r.try_get("bytes")?,
                            content_hash: r.try_get("content_hash")?,
                        })
                    })
                    .collect::<std::result::Result<Vec<_>, sqlx::Error>>()
                    .map_err(db("parts"))
            })
        })
        .await
    }

    /// Records the chunk's files as published in `table`, if `lease` is still current.
    /// Idempotent: a path already recorded stays as it is.
    pub async fn record_published(&self, lease: &Lease, table: &str, parts: &[(String, Part)]) -> Result<()> {
        let now = self.now_ms();
        let ok = self
            .call("record_published", || async move {
                on_backend!(self, |pool, begin| {
                    let op = "record_published";
                    let _write = self.write_guard().await;
                    let mut tx = pool.begin_with(begin.0).await.map_err(db(op))?;
                    if !fence!(tx, lease, op) {
                        return Ok(false);
                    }
                    for (path, p) in parts {
                        sqlx::query(
                            "INSERT INTO published (path, table_name, chunk_id, partition, records, bytes,
                                content_hash, published_at)
                             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (path) DO NOTHING",
                        )
                        .bind(path)
                        .bind(table)
                        .bind(&p.chunk_id)
                        .bind(&p.partition)
                        .bind(p.records)
                        .bind(p.bytes)
                        .bind(&p.content_hash)
                        .bind(now)
                        .execute(&mut *tx)
                        .await
                        .map_err(db(op))?;
                    }
                    tx.commit().await.map_err(db(op))?;
                    Ok(true)
                })
            })
            .await?;
        if ok { Ok(()) } else { Err(self.lease_lost(lease).await) }
    }

    /// Files and records per published partition, from the `table_partitions` view.
    pub async fn table_partitions(&self) -> Result<Vec<PartitionStats>> {
        self.call("table_partitions", || async move {
            on_backend!(self, |pool, begin| {
                let rows = sqlx::query(
                    "SELECT table_name, partition, files, records FROM table_partitions ORDER BY table_name, partition",
                )
                .fetch_all(pool)
                .await
                .map_err(db("table_partitions"))?;
                rows.iter()
                    .map(|r| {
                        Ok(PartitionStats {
                            table: r.try_get("table_name")?,
                            partition: r.try_get("partition")?,
                            files: r.try_get("files")?,
                            records: r.try_get("records")?,
                        })
                    })
                    .collect::<std::result::Result<Vec<_>, sqlx::Error>>()
                    .map_err(db("table_partitions"))
            })
        })
        .await
    }

    /// Chunks whose `stage` task is done (for cleaning up what that stage left behind).
    pub async fn done_chunks(&self, stage: super::Stage) -> Result<Vec<String>> {
        self.call("done_chunks", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query("SELECT chunk_id FROM tasks WHERE stage = $1 AND state = 'done'")
                    .bind(stage.as_str())
                    .fetch_all(pool)
                    .await
                    .and_then(|rows| rows.iter().map(|r| r.try_get::<String, _>("chunk_id")).collect())
                    .map_err(db("done_chunks"))
            })
        })
        .await
    }

    /// Quarantined files and tasks, as (kind, what, reason) from the `quarantined` view.
    pub async fn quarantined(&self) -> Result<Vec<(String, String, Option<String>)>> {
        self.call("quarantined", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query("SELECT kind, what, reason FROM quarantined ORDER BY kind, what")
                    .fetch_all(pool)
                    .await
                    .and_then(|rows| {
                        rows.iter()
                            .map(|r| Ok((r.try_get("kind")?, r.try_get("what")?, r.try_get("reason")?)))
                            .collect()
                    })
                    .map_err(db("quarantined"))
            })
        })
        .await
    }
}
