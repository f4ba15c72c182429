//! What the stages made of each chunk: transform's parts and rejects, load's published files.
//! Every write is fenced like `complete`: it lands only while the caller's lease is current.

use ferry_common::paths;

use crate::backend::{Backend, Begin};
use crate::catalog::{CatalogSwap, Record, Swapped};
use crate::state::TaskState;
use crate::{Lease, Ledger, Result, db};

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
    /// The file's column statistics as Delta's `stats` JSON (row count; min, max and null
    /// count of the columns whose footer statistics are exact); None for parts recorded by
    /// binaries before it.
    pub stats: Option<String>,
}

from_row!(Part { chunk_id, partition, name, records, bytes, content_hash, stats });

impl Part {
    /// `<partition>/<name>`, or just the name when unpartitioned.
    pub fn rel_path(&self) -> String {
        paths::part_rel(&self.partition, &self.name)
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
    /// Delta tables: the newest table version that brought a file of the partition.
    pub table_version: Option<i64>,
}

from_row!(PartitionStats { table = "table_name", partition, files, records, table_version });

/// Locks the task row at the caller's epoch inside `$tx`, or returns Ok(false).
macro_rules! fence {
    ($tx:expr, $lease:expr, $op:expr) => {{
        let n = sqlx::query(
            "UPDATE tasks SET lease_expires_at = lease_expires_at
             WHERE id = $1 AND epoch = $2 AND state = $3",
        )
        .bind($lease.task_id)
        .bind($lease.epoch)
        .bind(TaskState::Running.as_str())
        .execute(&mut *$tx)
        .await
        .map_err(db($op))?
        .rows_affected();
        n == 1
    }};
}

/// The newest version of a chunk's source file, newer than the chunk's own, with files in
/// the table (`$1`: the chunk).
const NEWER_PUBLISHED: &str = concat!(
    "SELECT MAX(n.version) FROM chunks c
     JOIN source_files f ON f.id = c.file_id
     JOIN source_files n ON n.pipeline = f.pipeline AND n.uri = f.uri AND n.version > f.version
     WHERE c.id = $1 AND ",
    version_in_table!("n")
);

/// [`NEWER_PUBLISHED`] for chunk `$chunk` inside `$tx`, after taking the chunk's file's URI
/// lock on Postgres (`$postgres`): the check a record or a withdrawal makes in its own
/// transaction, ordered with a retraction or a revert of the same file, which take it too.
macro_rules! newer_in_tx {
    ($tx:expr, $chunk:expr, $postgres:expr, $op:expr) => {{
        if $postgres {
            sqlx::query(
                "SELECT pg_advisory_xact_lock(hashtextextended(f.uri, 1)) FROM chunks c
                 JOIN source_files f ON f.id = c.file_id WHERE c.id = $1",
            )
            .bind($chunk)
            .execute(&mut *$tx)
            .await
            .map_err(db($op))?;
        }
        let newer: Option<i64> = sqlx::query_scalar(NEWER_PUBLISHED).bind($chunk).fetch_one(&mut *$tx).await.map_err(db($op))?;
        newer
    }};
}

/// One version of a source file, as load needs it to publish the version whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionState {
    pub version: i64,
    pub uri: String,
    /// Another version of the file was registered before this one: publishing this one
    /// replaces it, so it happens only once every chunk of this one is copied.
    pub replaces: bool,
    pub chunks: Vec<VersionChunk>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionChunk {
    pub id: String,
    /// Copied to the destination (its load task exists).
    pub copied: bool,
    /// The stage where one of its tasks is quarantined.
    pub quarantined_at: Option<String>,
    /// Given up on by an operator (`ferry skip`): the version is whole without it.
    pub skipped: bool,
}

impl Ledger {
    /// Replaces the chunk's parts and rejects with these, if `lease` is still current.
    pub async fn record_parts(&self, lease: &Lease, parts: &[Part], rejects: &[Reject]) -> Result<()> {
        let ok = self
            .call("record_parts", || async move {
                on_backend!(self, |pool, begin| {
                    let op = "record_parts";
                    let (_write, mut tx) = write_tx!(self, pool, begin, op);
                    if !fence!(tx, lease, op) {
                        return Ok(false);
                    }
                    for table in ["DELETE FROM parts WHERE chunk_id = $1", "DELETE FROM rejects WHERE chunk_id = $1"] {
                        sqlx::query(table).bind(&lease.chunk_id).execute(&mut *tx).await.map_err(db(op))?;
                    }
                    for p in parts {
                        sqlx::query(
                            "INSERT INTO parts (chunk_id, partition, name, records, bytes, content_hash, stats)
                             VALUES ($1, $2, $3, $4, $5, $6, $7)",
                        )
                        .bind(&p.chunk_id)
                        .bind(&p.partition)
                        .bind(&p.name)
                        .bind(p.records)
                        .bind(p.bytes)
                        .bind(&p.content_hash)
                        .bind(&p.stats)
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
                        .bind(crate::text(&r.position))
                        .bind(crate::text(&r.reason))
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
                sqlx::query_as::<_, Part>(
                    "SELECT chunk_id, partition, name, records, bytes, content_hash, stats
                     FROM parts WHERE chunk_id = $1 ORDER BY partition",
                )
                .bind(chunk_id)
                .fetch_all(pool)
                .await
                .map_err(db("parts"))
            })
        })
        .await
    }

    /// Where the staged copies no longer needed are (`chunks.location`): chunks of this pipeline
    /// transformed (or, after a prune, published) before `cutoff_ms`.
    pub async fn transformed_before(&self, cutoff_ms: i64) -> Result<std::collections::HashSet<String>> {
        self.call("transformed_before", || async move {
            on_backend!(self, |pool, begin| {
                let ids: Vec<String> = sqlx::query_scalar(
                    "SELECT DISTINCT c.location FROM tasks JOIN chunks c ON c.id = tasks.chunk_id
                     WHERE tasks.pipeline = $1 AND tasks.state = 'done' AND tasks.finalized_at < $2
                       AND tasks.stage IN ('transform', 'load')
                       AND NOT EXISTS (SELECT 1 FROM tasks x WHERE x.chunk_id = tasks.chunk_id AND x.state <> 'done')",
                )
                .bind(self.pipeline())
                .bind(cutoff_ms)
                .fetch_all(pool)
                .await
                .map_err(db("transformed_before"))?;
                Ok(ids.into_iter().collect())
            })
        })
        .await
    }

    /// Every file the ledger says this pipeline published into `table`: (path, chunk, bytes).
    pub async fn published_files(&self, table: &str) -> Result<Vec<(String, String, i64)>> {
        self.call("published_files", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query_as(
                    "SELECT p.path, p.chunk_id, p.bytes FROM published p JOIN chunks c ON c.id = p.chunk_id
                     JOIN source_files f ON f.id = c.file_id WHERE p.table_name = $1 AND f.pipeline = $2 ORDER BY p.path",
                )
                .bind(table)
                .bind(self.pipeline())
                .fetch_all(pool)
                .await
                .map_err(db("published_files"))
            })
        })
        .await
    }

    /// The files the ledger says `chunk_id` has in the table: (path, content hash).
    pub async fn published_of(&self, chunk_id: &str) -> Result<Vec<(String, String)>> {
        self.call("published_of", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query_as("SELECT path, content_hash FROM published WHERE chunk_id = $1 ORDER BY path")
                    .bind(chunk_id)
                    .fetch_all(pool)
                    .await
                    .map_err(db("published_of"))
            })
        })
        .await
    }

    /// The newest version of the source file of `chunk_id` that is newer than the chunk's own
    /// and has files in the table: the file was corrected, and the correction is published
    /// (so this chunk's rows must not be).
    pub async fn newer_version_published(&self, chunk_id: &str) -> Result<Option<i64>> {
        self.call("newer_version_published", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query_scalar(NEWER_PUBLISHED).bind(chunk_id).fetch_one(pool).await.map_err(db("newer_version_published"))
            })
        })
        .await
    }

    /// Records that this load withdraws its chunk (see the load stage's `withdraw`), if the
    /// chunk is still superseded: returns the newer version in the table, or None when there
    /// is none any more (the chunk's bytes came back as the newest version) and the chunk
    /// must not be withdrawn. The check and the record are one step (SQLite's write lock; the
    /// file's URI lock on Postgres, which a revert takes too), so a revert either comes first
    /// and the chunk is published, or finds the record and sends the chunk through transform
    /// again, whatever the withdrawal removed.
    pub async fn begin_withdrawal(&self, lease: &Lease) -> Result<Option<i64>> {
        let now = self.now_ms();
        let postgres = self.backend_name() == "postgres";
        let out = self
            .call("begin_withdrawal", || async move {
                on_backend!(self, |pool, begin| {
                    let op = "begin_withdrawal";
                    let (_write, mut tx) = write_tx!(self, pool, begin, op);
                    if !fence!(tx, lease, op) {
                        return Ok(None);
                    }
                    let newer = newer_in_tx!(tx, &lease.chunk_id, postgres, op);
                    if newer.is_some() {
                        sqlx::query("UPDATE chunks SET withdrawn_at = $2 WHERE id = $1")
                            .bind(&lease.chunk_id)
                            .bind(now)
                            .execute(&mut *tx)
                            .await
                            .map_err(db(op))?;
                    }
                    tx.commit().await.map_err(db(op))?;
                    Ok(Some(newer))
                })
            })
            .await?;
        match out {
            Some(newer) => Ok(newer),
            None => Err(self.lease_lost(lease).await),
        }
    }

    /// Where the version of the source file that `chunk_id` belongs to stands: its number,
    /// its URI, whether another version of that file was registered before it, and each of
    /// its chunks (copied yet, quarantined at which stage, skipped by an operator).
    pub async fn version_of(&self, chunk_id: &str) -> Result<VersionState> {
        self.call("version_of", || async move {
            on_backend!(self, |pool, begin| {
                let (version, uri, older): (i64, String, i64) = sqlx::query_as(
                    "SELECT f.version, f.uri,
                            (SELECT COUNT(*) FROM source_files o WHERE o.pipeline = f.pipeline AND o.uri = f.uri AND o.version < f.version)
                     FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE c.id = $1",
                )
                .bind(chunk_id)
                .fetch_one(pool)
                .await
                .map_err(db("version_of"))?;
                let chunks: Vec<(String, i64, Option<String>, i64)> = sqlx::query_as(
                    "SELECT s.id,
                            (SELECT COUNT(*) FROM tasks t WHERE t.chunk_id = s.id AND t.stage = 'load'
                               AND NOT EXISTS (SELECT 1 FROM tasks e WHERE e.chunk_id = s.id
                                               AND e.stage IN ('transform', 'copy') AND e.state <> 'done')),
                            (SELECT MIN(t.stage) FROM tasks t WHERE t.chunk_id = s.id AND t.state = 'quarantined'),
                            (SELECT COUNT(*) FROM skips k WHERE k.chunk_id = s.id)
                     FROM chunks s WHERE s.file_id = (SELECT file_id FROM chunks WHERE id = $1) ORDER BY s.seq",
                )
                .bind(chunk_id)
                .fetch_all(pool)
                .await
                .map_err(db("version_of"))?;
                let chunks = chunks
                    .into_iter()
                    .map(|(id, load, quarantined_at, skips)| VersionChunk { id, copied: load > 0, quarantined_at, skipped: skips > 0 })
                    .collect();
                Ok(VersionState { version, uri, replaces: older > 0, chunks })
            })
        })
        .await
    }

    /// Every chunk of every version of the source file of `chunk_id` (its own version's
    /// too), with that version: what a Delta commit reads the table's files against, so that
    /// it finds an older or newer version's files whether the ledger recorded them or not.
    pub async fn chunks_of_every_version(&self, chunk_id: &str) -> Result<Vec<(String, i64)>> {
        self.call("chunks_of_every_version", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query_as(
                    "SELECT oc.id, o.version FROM chunks c
                     JOIN source_files f ON f.id = c.file_id
                     JOIN source_files o ON o.pipeline = f.pipeline AND o.uri = f.uri
                     JOIN chunks oc ON oc.file_id = o.id
                     WHERE c.id = $1 ORDER BY oc.id",
                )
                .bind(chunk_id)
                .fetch_all(pool)
                .await
                .map_err(db("chunks_of_every_version"))
            })
        })
        .await
    }

    /// Files in the table from older versions of the source file of `chunk_id`: (path, chunk).
    pub async fn older_versions_published(&self, chunk_id: &str) -> Result<Vec<(String, String)>> {
        self.call("older_versions_published", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query_as(
                    "SELECT p.path, p.chunk_id FROM chunks c
                     JOIN source_files f ON f.id = c.file_id
                     JOIN source_files o ON o.pipeline = f.pipeline AND o.uri = f.uri AND o.version < f.version
                     JOIN chunks oc ON oc.file_id = o.id
                     JOIN published p ON p.chunk_id = oc.id
                     WHERE c.id = $1 ORDER BY p.path",
                )
                .bind(chunk_id)
                .fetch_all(pool)
                .await
                .map_err(db("older_versions_published"))
            })
        })
        .await
    }

    /// Takes the switch of `version` of `uri` into the table for this load lease: one switch
    /// of a version at a time, whatever host it runs on (see the `switches` table). Free when
    /// no row holds it or its holder's lease is not running any more (finished, failed, or
    /// expired: a crashed holder frees it by its lease, nobody has to clean up). None: taken
    /// (or held already by this lease); Some(chunk): held by the live lease of that chunk's load.
    pub async fn take_switch(&self, lease: &Lease, uri: &str, version: i64) -> Result<Option<String>> {
        let now = self.now_ms();
        self.call("take_switch", || async move {
            on_backend!(self, |pool, begin| {
                let op = "take_switch";
                let (_write, mut tx) = write_tx!(self, pool, begin, op);
                sqlx::query(
                    "INSERT INTO switches (pipeline, uri, version, task_id, epoch, taken_at) VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (pipeline, uri, version) DO UPDATE SET
                        task_id = excluded.task_id, epoch = excluded.epoch, taken_at = excluded.taken_at
                     WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = switches.task_id AND t.epoch = switches.epoch
                                         AND t.state = $7 AND t.lease_expires_at > $6)",
                )
                .bind(self.pipeline())
                .bind(uri)
                .bind(version)
                .bind(lease.task_id)
                .bind(lease.epoch)
                .bind(now)
                .bind(TaskState::Running.as_str())
                .execute(&mut *tx)
                .await
                .map_err(db(op))?;
                let (task_id, epoch, chunk): (i64, i64, Option<String>) = sqlx::query_as(
                    "SELECT s.task_id, s.epoch, t.chunk_id FROM switches s LEFT JOIN tasks t ON t.id = s.task_id
                     WHERE s.pipeline = $1 AND s.uri = $2 AND s.version = $3",
                )
                .bind(self.pipeline())
                .bind(uri)
                .bind(version)
                .fetch_one(&mut *tx)
                .await
                .map_err(db(op))?;
                tx.commit().await.map_err(db(op))?;
                Ok(if (task_id, epoch) == (lease.task_id, lease.epoch) { None } else { Some(chunk.unwrap_or_default()) })
            })
        })
        .await
    }

    /// Gives the switch of `version` of `uri` back, if this lease holds it (its end would free it
    /// too; this frees it as soon as the switch is over).
    pub async fn release_switch(&self, lease: &Lease, uri: &str, version: i64) -> Result<()> {
        self.call("release_switch", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query("DELETE FROM switches WHERE pipeline = $1 AND uri = $2 AND version = $3 AND task_id = $4 AND epoch = $5")
                    .bind(self.pipeline())
                    .bind(uri)
                    .bind(version)
                    .bind(lease.task_id)
                    .bind(lease.epoch)
                    .execute(pool)
                    .await
                    .map_err(db("release_switch"))?;
                Ok(())
            })
        })
        .await
    }

    /// Makes these chunks' `stage` tasks that wait (retryable) due now: what they waited
    /// for has happened.
    pub async fn wake(&self, chunks: &[String], stage: crate::Stage) -> Result<()> {
        let now = self.now_ms();
        self.call("wake", || async move {
            on_backend!(self, |pool, begin| {
                let op = "wake";
                let (_write, mut tx) = write_tx!(self, pool, begin, op);
                for c in chunks {
                    sqlx::query(
                        "UPDATE tasks SET scheduled_at = $3 WHERE chunk_id = $1 AND stage = $2 AND state = $4 AND scheduled_at > $3",
                    )
                    .bind(c)
                    .bind(stage.as_str())
                    .bind(now)
                    .bind(TaskState::Retryable.as_str())
                    .execute(&mut *tx)
                    .await
                    .map_err(db(op))?;
                }
                tx.commit().await.map_err(db(op))
            })
        })
        .await
    }

    /// Forgets published files that were removed from the table (an older version's of the
    /// source file at `uri`).
    pub async fn retract_published(&self, uri: &str, paths: &[String]) -> Result<()> {
        let postgres = self.backend_name() == "postgres";
        self.call("retract_published", || async move {
            on_backend!(self, |pool, begin| {
                let op = "retract_published";
                let (_write, mut tx) = write_tx!(self, pool, begin, op);
                if postgres {
                    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 1))")
                        .bind(uri)
                        .execute(&mut *tx)
                        .await
                        .map_err(db(op))?;
                }
                for p in paths {
                    sqlx::query("DELETE FROM published WHERE path = $1").bind(p).execute(&mut *tx).await.map_err(db(op))?;
                }
                tx.commit().await.map_err(db(op))
            })
        })
        .await
    }

    /// Records the chunk's files as published in `table`, if `lease` is still current. They
    /// replace what was recorded for the chunk before (a rerun); idempotent. With `replace`
    /// (`source.versions = "replace"`), nothing is recorded and false returned when a newer
    /// version of the chunk's source file has been published meanwhile: the check and the
    /// record are one step (SQLite's write lock; a transaction lock on the file's URI on
    /// Postgres, which [`Ledger::retract_published`] takes too). `table_version` is the Delta
    /// version whose commit made them visible (None for the Hive layout).
    pub async fn record_published(
        &self,
        lease: &Lease,
        table: &str,
        parts: &[(String, Part)],
        replace: bool,
        table_version: Option<i64>,
    ) -> Result<bool> {
        let record = Record { table, parts, replace, table_version };
        Ok(self.publish_tx(None, &[(lease, Some(record))]).await? == Swapped::Done)
    }

    /// [`Ledger::record_published`] of each entry and, when `swap` is given, a commit to a table
    /// of the Iceberg catalog in the ledger, as one transaction: all or nothing. An entry whose
    /// record is None has its lease confirmed only (a commit that takes a withdrawn chunk's files
    /// out). Returns how it ended; a lease lost is the error of the first entry whose lease
    /// another claim took.
    pub(crate) async fn publish_tx(&self, swap: Option<&CatalogSwap<'_>>, entries: &[(&Lease, Option<Record<'_>>)]) -> Result<Swapped> {
        let now = self.now_ms();
        let postgres = self.backend_name() == "postgres";
        let ended = self
            .call("record_published", || async move {
                on_backend!(self, |pool, begin| {
                    let op = "record_published";
                    let (_write, mut tx) = write_tx!(self, pool, begin, op);
                    for (i, (lease, record)) in entries.iter().enumerate() {
                        if !fence!(tx, lease, op) {
                            return Ok(Err(i));
                        }
                        if record.is_some_and(|r| r.replace) {
                            if newer_in_tx!(tx, &lease.chunk_id, postgres, op).is_some() {
                                return Ok(Ok(Swapped::Superseded));
                            }
                            // A version with no rows is in the table from here on (see `version_in_table!`).
                            sqlx::query("UPDATE source_files SET switched_at = $2 WHERE id = (SELECT file_id FROM chunks WHERE id = $1)")
                                .bind(&lease.chunk_id)
                                .bind(now)
                                .execute(&mut *tx)
                                .await
                                .map_err(db(op))?;
                        }
                    }
                    if let Some(swap) = swap
                        && !swap_in_tx!(tx, swap, op)
                    {
                        return Ok(Ok(Swapped::Lost));
                    }
                    for (lease, record) in entries {
                        let Some(Record { table, parts, table_version, .. }) = record else { continue };
                        sqlx::query("DELETE FROM published WHERE chunk_id = $1")
                            .bind(&lease.chunk_id)
                            .execute(&mut *tx)
                            .await
                            .map_err(db(op))?;
                        for (path, p) in *parts {
                            sqlx::query(
                                "INSERT INTO published (path, table_name, chunk_id, partition, records, bytes,
                                    content_hash, published_at, table_version)
                                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (path) DO NOTHING",
                            )
                            .bind(path)
                            .bind(*table)
                            .bind(&p.chunk_id)
                            .bind(&p.partition)
                            .bind(p.records)
                            .bind(p.bytes)
                            .bind(&p.content_hash)
                            .bind(now)
                            .bind(*table_version)
                            .execute(&mut *tx)
                            .await
                            .map_err(db(op))?;
                        }
                    }
                    tx.commit().await.map_err(db(op))?;
                    Ok(Ok(Swapped::Done))
                })
            })
            .await?;
        match ended {
            Ok(end) => Ok(end),
            Err(i) => Err(self.lease_lost(entries[i].0).await),
        }
    }

    /// Files and records per published partition, from the `table_partitions` view.
    pub async fn table_partitions(&self) -> Result<Vec<PartitionStats>> {
        self.call("table_partitions", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query_as::<_, PartitionStats>(
                    "SELECT table_name, partition, files, records, table_version FROM table_partitions WHERE pipeline = $1
                     ORDER BY table_name, partition",
                )
                .bind(self.pipeline())
                .fetch_all(pool)
                .await
                .map_err(db("table_partitions"))
            })
        })
        .await
    }
}
