//! The Hive layout: a chunk's parts renamed into `<table>/<k=v>/`, exactly once.
//!
//! # Publish protocol (per part file of a chunk)
//!
//! ```text
//!  dest/_ferry/landed/<table>/<chunk>/<k=v>/part-<chunk>.parquet
//!     │ rename without overwrite (atomic; the name is fixed by the chunk id)
//!     ▼
//!  dest/<table>/<k=v>/part-<chunk>.parquet            <- readers see it from here on
//!     │ manifest dest/<table>/_ferry/manifest/<chunk>.json (its temp file is written while
//!     │ the parts move, and renamed into place once they are all in), ledger `published`
//!     ▼ rows, task done
//!  dest/<table>/_ferry/ddl.sql rewritten in the background, one rewrite for all chunks
//!  committed before it, and once more before the stage exits
//! ```
//!
//! Invariant: a table file's name is a function of its chunk and partition, so one chunk can
//! only ever occupy one name per partition, and "is it published?" is "does that name exist
//! with the recorded size and hash?". What a crash leaves:
//! - before the rename: the landed file; the retry renames it. A manifest temp file, if its
//!   write had begun, is a crashed writer's temp file: gc removes it.
//! - after the rename, before the ledger commit: the table file; the retry finds it in place
//!   with the right hash, renames nothing, and commits. Nothing is published twice.
//! - a table file with the right name but other content is a conflict: the chunk is
//!   quarantined rather than overwriting what readers may already have read, unless the
//!   ledger records that very file as this chunk's earlier output (`ferry rerun`): then the
//!   new landed file replaces it, and earlier files of the chunk that the new parts do not
//!   cover are removed before the ledger commit, which replaces the chunk's `published` rows.
//!
//! A failure after some of a chunk's parts moved (any error, on any store) takes the moved
//! parts back out before the attempt ends; only if that fails too do they stay, and the chunk
//! is then retried (never quarantined) so that the next attempt publishes the rest.
//!
//! Versions (`source.versions = "replace"`): the table shows one whole version of each source
//! file, the newest that can be loaded whole.
//! - A version N that replaces another (one was registered before it) is published whole:
//!   its chunks' loads wait (not counted as attempts) until every chunk of N is copied; the
//!   first to find them all copied moves all of N's parts in one all-or-nothing step, records
//!   its own, then removes the older versions' files and `published` rows; the others find
//!   their parts in place and record them. Each of them does so holding N's switch, which the
//!   ledger gives one load lease at a time across hosts (`switches`, freed when the lease
//!   ends): a switch that fails part-way takes back what it moved, and must not find that
//!   another load, beside it, recorded some of it meanwhile. A chunk of N quarantined anywhere keeps N waiting
//!   (with the reason) and the older version whole, until it is requeued or skipped. A chunk
//!   skipped while the switch is under way (its parts moved, none recorded) is seen by every
//!   record of the version, which takes its parts back out; a skip after a record is refused.
//! - A chunk of an older version is not published once a newer version has files in the
//!   table; the check is repeated in the transaction that records it (a transaction lock on
//!   the file's URI on Postgres, taken by the retraction too), and a chunk that lost that race
//!   takes its parts back out. One whose parts vanished under it (the newer version's switch
//!   removed them between its check and its look) looks again and is superseded, not missing.
//!   A superseded chunk also removes what of it no row names (parts a sibling moved in while
//!   switching its version in) and its landed files.
//! - What a crash leaves: N's parts moved but not recorded and the older version still
//!   published (both visible): the retry of any chunk of N finds them in place and finishes;
//!   N recorded but the older version not yet removed: the same retry removes it.

use std::collections::HashSet;

use ferry_common::error::{Classified, ErrorClass};
use ferry_common::{hive, paths};
use ferry_ledger::{Lease, Ledger, Part};
use ferry_runtime::config::{ColumnType, Config};
use ferry_storage::Store;

use crate::{Job, Outcome, Table, TableError, TableFailure, Verified, WAIT_BRIEFLY, in_table};

/// Where one part of a chunk stands before load moves it (see [`HiveTable::check_part`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Not in the table; the landed file is there to move.
    Absent,
    /// In the table with this part's size and hash already.
    Published,
    /// In the table as this chunk's earlier output: to be replaced.
    Ours,
}

/// A Hive-partitioned table: the directory is the table, `_ferry/ddl.sql` its DDL.
pub struct HiveTable {
    cfg: Config,
    ledger: Ledger,
    dest: Store,
    /// Serializes DDL rewrites in this process, so an older partition list never lands last,
    /// and holds the DDL this process last wrote and the schema versions it wrote changes for.
    ddl: tokio::sync::Mutex<(Option<String>, std::collections::BTreeSet<i64>)>,
    /// A chunk went in since the DDL was last looked at: [`Table::upkeep`] rewrites it.
    ddl_due: std::sync::atomic::AtomicBool,
    ddl_wake: tokio::sync::Notify,
    /// Set by [`Table::finish`]: the writer ends after the rewrite under way.
    ddl_stop: std::sync::atomic::AtomicBool,
    /// This run published or retracted something.
    ddl_touched: std::sync::atomic::AtomicBool,
}

impl HiveTable {
    pub fn new(cfg: Config, ledger: Ledger, dest: Store) -> HiveTable {
        HiveTable {
            cfg,
            ledger,
            dest,
            ddl: tokio::sync::Mutex::new((None, Default::default())),
            ddl_due: Default::default(),
            ddl_wake: Default::default(),
            ddl_stop: Default::default(),
            ddl_touched: Default::default(),
        }
    }

    /// Removes from the table the files of older versions of this chunk's source file, and
    /// then their `published` rows. Idempotent: a crash between the two is finished by the
    /// next chunk of the new version (or its retry).
    async fn retract_older_versions(&self, dest: &Store, chunk_id: &str, uri: &str) -> Result<(), TableError> {
        let old = self.ledger.older_versions_published(chunk_id).await?;
        if old.is_empty() {
            return Ok(());
        }
        // Durable before destructive: the record of the version that replaces these files
        // must survive a power loss that their removal survives.
        self.ledger.make_durable().await?;
        for (path, chunk) in &old {
            tracing::info!(file = %dest.url(path), old_chunk = %chunk, "removing an older version's rows from the table");
            dest.delete(path).await.or_else(|e| if e.is_not_found() { Ok(()) } else { Err(e) })?;
        }
        let chunks: std::collections::BTreeSet<&String> = old.iter().map(|(_, c)| c).collect();
        for chunk in chunks {
            let manifest = paths::manifest(&self.cfg.table.name, chunk);
            dest.delete(&manifest).await.or_else(|e| if e.is_not_found() { Ok(()) } else { Err(e) })?;
        }
        let paths: Vec<String> = old.into_iter().map(|(p, _)| p).collect();
        self.ledger.retract_published(uri, &paths).await?;
        // The DDL lists partitions from `published`: one may have gone.
        self.ddl_changed();
        Ok(())
    }

    /// Takes a superseded chunk (a newer version of its file is in the table) out of the way:
    /// its parts that another chunk of its version moved into the table while switching the
    /// version in, and that it never recorded, go (else they would stay visible beside the
    /// newer version for ever: the newer version's switch removes only what `published`
    /// names); its landed files go too. Should these bytes come back, they go through
    /// transform again: the withdrawal is recorded first (and only while the chunk is still
    /// superseded), and a revert waits for a running load and then reruns every chunk a load
    /// withdrew. False: not superseded any more (its bytes came back as the newest version
    /// meanwhile), nothing removed, the chunk is published. What it did record is the newer
    /// version's switch to remove.
    async fn withdraw_chunk(&self, dest: &Store, lease: &Lease) -> Result<bool, TableError> {
        let chunk = lease.chunk_id.as_str();
        let Some(newer) = self.ledger.begin_withdrawal(lease).await? else {
            tracing::info!(chunk, "not withdrawn: its version is the newest again");
            return Ok(false);
        };
        tracing::info!(chunk, newer_version = newer, "withdrawing: a newer version of its source file is published");
        crate::withdraw_gate().await;
        // Durable before destructive: the newer version's record, which makes these files
        // unnecessary, may be another process's commit still in the page cache.
        self.ledger.make_durable().await?;
        for (_, target) in unrecorded_in_table(&self.ledger, &self.cfg.table.name, dest, chunk).await? {
            tracing::info!(chunk, file = %dest.url(&target), "removing an unrecorded part of a superseded version from the table");
            dest.delete(&target).await?;
        }
        crate::remove_landed(&self.ledger, dest, &self.cfg.table.name, chunk).await?;
        Ok(true)
    }

    /// Takes out of the table the parts of this version's skipped chunks that no row names:
    /// a switch moves every sibling's parts, and a `ferry skip` of a sibling that came while
    /// it was under way (or after a switch that crashed before recording) leaves them there.
    /// Looked at after this chunk's record, so a skip is either seen here or refused (it
    /// finds this chunk's rows; the URI lock orders the two on Postgres). They go back to
    /// their landed name, where a `ferry rerun --from load` finds them and gc removes them.
    async fn take_out_skipped(&self, dest: &Store, chunk: &str) -> Result<(), TableError> {
        let v = self.ledger.version_of(chunk).await?;
        let table = &self.cfg.table.name;
        for c in v.chunks.iter().filter(|c| c.skipped && c.id != chunk) {
            let visible: Vec<(String, String)> = unrecorded_in_table(&self.ledger, table, dest, &c.id)
                .await?
                .into_iter()
                .map(|(p, target)| (target, paths::landed(table, &p.chunk_id, &p.rel_path())))
                .collect();
            if visible.is_empty() {
                continue;
            }
            tracing::info!(chunk, skipped = %c.id, parts = visible.len(), "taking a skipped chunk's parts back out of the table");
            if !take_back(dest, &c.id, &visible).await {
                return Err(TableError::Stage(TableFailure::PartlyVisible(format!(
                    "chunk {} of the same version was skipped, and not all of its parts could be taken back out of the table",
                    c.id
                ))));
            }
        }
        Ok(())
    }

    /// Where part `p` stands: its table file absent (the landed file waiting), already this
    /// part (a retry after the rename), or this chunk's own earlier output (a rerun). Anything
    /// else is an error, found before any part of the chunk moves.
    async fn check_part(&self, dest: &Store, p: &Part, before: &[(String, String)]) -> Result<Place, TableError> {
        let landed = paths::landed(&self.cfg.table.name, &p.chunk_id, &p.rel_path());
        let target = self.table_path(p);
        match in_table(dest, &target, p).await? {
            Some(true) => Ok(Place::Published),
            // Replacing an earlier output needs its replacement: without a landed file the
            // published one stays, and the chunk waits for its copy.
            Some(false) if before.iter().any(|(path, _)| *path == target) => match dest.head(&landed).await? {
                Some(_) => Ok(Place::Ours),
                None => Err(replacement_missing(dest, &landed, &target, &p.chunk_id)),
            },
            Some(false) => Err(crate::conflict(dest, &target, &p.chunk_id)),
            None if dest.head(&landed).await?.is_some() => Ok(Place::Absent),
            // Another publisher of the same part (the chunks of a corrected file's version are
            // moved by whichever of them goes first) may have moved it between the two looks.
            None => match in_table(dest, &target, p).await? {
                Some(true) => Ok(Place::Published),
                _ => Err(crate::missing(dest, &landed, &target, &p.chunk_id)),
            },
        }
    }

    /// Moves one landed part into the table, as [`HiveTable::check_part`] found it. Ok(true):
    /// moved by this call; Ok(false): it was in place already.
    async fn publish_part(
        &self,
        dest: &Store,
        chunk: &str,
        p: &Part,
        (landed, target): (&str, &str),
        place: Place,
        before: &[(String, String)],
    ) -> Result<bool, TableError> {
        let place = match place {
            Place::Absent
                if dest.rename_noreplace(landed, target).await.or_else(|e| if e.is_not_found() { Ok(false) } else { Err(e) })? =>
            {
                return Ok(true);
            }
            // It changed since the check (a retry of our own, another writer): look again.
            Place::Absent => match self.check_part(dest, p, before).await? {
                Place::Absent => return Err(crate::missing(dest, landed, target, &p.chunk_id)),
                place => place,
            },
            place => place,
        };
        match place {
            Place::Published => {
                let _ = dest.delete(landed).await;
                Ok(false)
            }
            Place::Ours => {
                // Looked at again right before the delete: the table file goes only when its
                // replacement is there to take its place.
                if dest.head(landed).await?.is_none() {
                    return Err(replacement_missing(dest, landed, target, &p.chunk_id));
                }
                tracing::info!(chunk, file = ?dest.url(target), "replacing the chunk's earlier output");
                dest.delete(target).await?;
                if !dest.rename_noreplace(landed, target).await? {
                    return Err(TableError::Stage(TableFailure::Conflict(format!(
                        "{} reappeared while it was being replaced",
                        dest.url(target)
                    ))));
                }
                Ok(true)
            }
            Place::Absent => unreachable!("handled above"),
        }
    }

    fn table_path(&self, p: &Part) -> String {
        paths::table_file(&self.cfg.table.name, &p.rel_path())
    }

    async fn publish_chunk(&self, job: &Job<'_>) -> Result<Outcome, TableError> {
        let Job { lease, dest, parts, moving, siblings, version } = *job;
        let table = &self.cfg.table.name;
        let replace = version.is_some();
        // These chunks' own earlier publish, if any (`ferry rerun`): their files are ours to replace.
        let mut before = self.ledger.published_of(&lease.chunk_id).await?;
        for c in siblings {
            before.extend(self.ledger.published_of(c).await?);
        }
        if !before.is_empty() {
            // Durable before destructive: the rerun that makes those files replaceable (an
            // operator's commit) is on disk before any of them is removed.
            self.ledger.make_durable().await?;
        }
        let started = std::time::Instant::now();
        // Every part goes to its one table path, so the manifest is known before any moves:
        // its temp file is written while the parts are checked and moved (on HDFS that write
        // waits ~0.5 s for a block report), and it appears only once they are all in place.
        let published: Vec<(String, Part)> = parts.iter().map(|p| (self.table_path(p), p.clone())).collect();
        let manifest = serde_json::json!({
            "chunk": lease.chunk_id,
            "files": published.iter().map(|(path, p)| serde_json::json!({
                "path": path, "partition": p.partition, "records": p.records, "bytes": p.bytes, "blake3": p.content_hash,
            })).collect::<Vec<_>>(),
        });
        let manifest_rel = paths::manifest(table, &lease.chunk_id);
        let (prepared, moved) = tokio::join!(
            dest.prepare_put(&manifest_rel, serde_json::to_vec_pretty(&manifest).unwrap_or_default()),
            self.move_parts(dest, &lease.chunk_id, moving, &before),
        );
        let moved = match (moved, prepared) {
            (Ok(moved), Ok(prepared)) => {
                let renamed = started.elapsed();
                dest.commit(prepared).await?;
                tracing::debug!(chunk = %lease.chunk_id, parts = parts.len(), ?renamed, manifested = ?started.elapsed(), "parts and manifest in place");
                moved
            }
            (Err(e), prepared) => {
                if let Ok(prepared) = prepared {
                    dest.discard(prepared).await;
                }
                // A newer version switched in while this chunk looked (its check above came
                // first, and the switch removed this chunk's files from the table under it): the
                // chunk is superseded, not missing or in conflict.
                if replace && self.ledger.newer_version_published(&lease.chunk_id).await?.is_some() {
                    tracing::info!(chunk = %lease.chunk_id, error = %e, "a newer version of its source file was published meanwhile");
                    if self.withdraw_chunk(dest, lease).await? {
                        return Ok(Outcome::Superseded);
                    }
                }
                // The moves' error says what happened to the chunk (a conflict is not
                // retried), except that a sibling's part gone while a version is switched in
                // is that sibling's business (another load may be moving it): wait and look again.
                return Err(match e {
                    TableError::Stage(TableFailure::Missing { chunk, message }) if chunk != lease.chunk_id => {
                        TableError::Stage(TableFailure::Waiting {
                            reason: format!("a part of chunk {chunk} of the same version: {message}"),
                            after: WAIT_BRIEFLY,
                        })
                    }
                    e => e,
                });
            }
            // The parts are in place but not recorded: the retry finds them there.
            (Ok(_), Err(e)) => return Err(e.into()),
        };
        if !self.ledger.record_published(lease, table, &published, replace, None).await? {
            // A newer version went in while these parts moved: they go back out.
            tracing::info!(chunk = %lease.chunk_id, "not publishing: a newer version of its source file was published meanwhile");
            if !take_back(dest, &lease.chunk_id, &moved).await {
                return Err(TableError::Stage(TableFailure::PartlyVisible(format!(
                    "chunk {} was superseded while it was published, and not all of its parts could be taken back out",
                    lease.chunk_id
                ))));
            }
            let _ = dest.delete(&manifest_rel).await;
            return Ok(Outcome::Superseded);
        }
        if let Some(v) = version {
            if v.replaces {
                self.take_out_skipped(dest, &lease.chunk_id).await?;
            }
            self.retract_older_versions(dest, &lease.chunk_id, &v.uri).await?;
        }
        self.ddl_changed();
        tracing::debug!(chunk = %lease.chunk_id, recorded = ?started.elapsed(), "published");
        Ok(Outcome::Published)
    }

    /// Moves every part into the table, all or nothing, and removes the earlier output (of the
    /// same chunks) that the new parts do not cover. Returns what this call moved, as (table
    /// file, landed file). `chunk` names the work in messages.
    async fn move_parts(
        &self,
        dest: &Store,
        chunk: &str,
        parts: &[Part],
        before: &[(String, String)],
    ) -> Result<Vec<(String, String)>, TableError> {
        let table = &self.cfg.table.name;
        // All or nothing: every part is checked before any goes in, so a conflict on the
        // second partition cannot leave the first one's rows visible and unrecorded.
        let mut places = Vec::with_capacity(parts.len());
        for p in parts {
            places.push(self.check_part(dest, p, before).await?);
        }
        let mut moved: Vec<(String, String)> = Vec::new(); // (table file, landed file) moved by this attempt
        for (p, place) in parts.iter().zip(places) {
            let landed = paths::landed(table, &p.chunk_id, &p.rel_path());
            let target = self.table_path(p);
            let published = match test_fault(moved.len()).await {
                Some(e) => Err(e),
                None => self.publish_part(dest, chunk, p, (&landed, &target), place, before).await,
            };
            match published {
                Ok(true) => moved.push((target.clone(), landed)),
                Ok(false) => {}
                // Whatever failed (another writer, a store error, a timeout): take back what
                // this attempt put in, so that no reader sees part of the chunk. If that fails
                // too, the parts stay where they are and the chunk must be retried, whatever
                // its error was: the next attempt finds them in place and finishes the rest.
                Err(e) => {
                    let all_back = take_back(dest, chunk, &moved).await;
                    return Err(match (all_back, e.class()) {
                        (false, ErrorClass::Permanent) => TableError::Stage(TableFailure::PartlyVisible(format!(
                            "{e}; {} of the chunk's parts could not be taken back out of the table and stay there until it is retried",
                            moved.len()
                        ))),
                        _ => e,
                    });
                }
            }
        }
        // Earlier output of this chunk that the new parts do not cover (another partition).
        for (path, _) in before.iter().filter(|(path, _)| !parts.iter().any(|p| self.table_path(p) == *path)) {
            tracing::info!(chunk, file = %dest.url(path), "removing the chunk's earlier output");
            dest.delete(path).await.or_else(|e| if e.is_not_found() { Ok(()) } else { Err(e) })?;
        }
        Ok(moved)
    }

    fn ddl_changed(&self) {
        self.ddl_touched.store(true, std::sync::atomic::Ordering::SeqCst);
        self.ddl_due.store(true, std::sync::atomic::Ordering::SeqCst);
        self.ddl_wake.notify_one();
    }

    /// Rewrites the DDL an earlier run left if the ledger now says otherwise. No DDL yet means
    /// nothing was published (or a crash came before the first rewrite): left to the first
    /// chunk, so that a stage with nothing to do writes nothing.
    async fn check_ddl(&self) -> Result<(), TableError> {
        match self.dest.read(&paths::ddl(&self.cfg.table.name)).await {
            Ok(b) => {
                self.ddl.lock().await.0 = String::from_utf8(b).ok();
                self.write_ddl().await
            }
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Rewrites `<table>/_ferry/ddl.sql`: CREATE EXTERNAL TABLE plus one ADD PARTITION per
    /// published partition, for Hive, Spark or Trino; DuckDB and pyarrow read the Hive layout
    /// directly.
    pub async fn write_ddl(&self) -> Result<(), TableError> {
        let mut guard = self.ddl.lock().await;
        let (last, changes) = &mut *guard;
        // What an earlier run left: rewritten only if the ledger now says otherwise.
        if last.is_none() {
            match self.dest.read(&paths::ddl(&self.cfg.table.name)).await {
                Ok(b) => *last = String::from_utf8(b).ok(),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        // Rewritten only when the partition list differs from what this process last wrote:
        // on HDFS every file write waits for a block report, and most chunks add no partition.
        // After writing, look again: another load process may have written a newer list
        // meanwhile and ours may have landed last. The ledger's list only grows, so the
        // writer that sees no change after its own write leaves the newest list in place.
        for _ in 0..5 {
            let sql = self.render_ddl().await?;
            if last.as_deref() == Some(sql.as_str()) {
                return Ok(());
            }
            // The statements a new schema version needs are in place before the DDL names them.
            self.write_schema_changes(changes).await?;
            self.dest.put_atomic(&paths::ddl(&self.cfg.table.name), sql.clone().into_bytes()).await?;
            *last = Some(sql);
        }
        Ok(())
    }

    async fn render_ddl(&self) -> Result<String, TableError> {
        let table = &self.cfg.table.name;
        let location = self.dest.url(table);
        let partitions = self.ledger.table_partitions().await?;
        let versions = self.ledger.table_schemas(table).await?;
        let t = &self.cfg.transform;
        let pcols = &self.cfg.table.partition_by;
        let cols = match versions.last() {
            // The schema transform recorded from the files it wrote: exact, also without
            // `table.columns` (an Avro schema) and after the table evolved.
            Some(v) => v.columns.iter().map(|c| (c.name.clone(), c.hive.clone())).collect(),
            None => self.configured_columns(),
        };
        let kept = |n: &str| t.select.is_empty() || t.select.iter().any(|s| s == n) || pcols.iter().any(|p| p == n);
        let data: Vec<String> =
            cols.iter().filter(|(n, _)| kept(n) && !pcols.contains(n)).map(|(n, ty)| format!("  {} {ty}", hive::ident(n))).collect();
        let mut sql = String::from("-- Written by ferry-load when a chunk adds a partition. Do not edit.\n");
        sql.push_str(&format!("CREATE EXTERNAL TABLE IF NOT EXISTS {} (\n{}\n)\n", hive::ident(table), data.join(",\n")));
        if !pcols.is_empty() {
            let p: Vec<String> = pcols
                .iter()
                .map(|c| format!("{} {}", hive::ident(c), cols.iter().find(|(n, _)| n == c).map_or("STRING", |(_, ty)| ty.as_str())))
                .collect();
            sql.push_str(&format!("PARTITIONED BY ({})\n", p.join(", ")));
        }
        sql.push_str(&format!("STORED AS PARQUET\nLOCATION {};\n", hive::literal(&location)));
        if versions.len() > 1 {
            sql.push_str("-- The table's schema evolved; a table created from an earlier version of this file is\n");
            sql.push_str("-- brought up to date by the statements of each later version, in order:\n");
            for v in &versions[1..] {
                sql.push_str(&format!("--   schema-v{}.sql: {}\n", v.version, one_line(&v.change)));
            }
        }
        for p in partitions.iter().filter(|p| &p.table == table && !p.partition.is_empty()) {
            // The path holds escaped values (`%2F` for `/`); the partition spec the values.
            let spec: Vec<String> = p
                .partition
                .split('/')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| match paths::unescape_partition_value(v) {
                    Some(v) => format!("{}={}", hive::ident(k), hive::literal(&v)),
                    None => format!("{}={}", hive::ident(k), hive::literal(paths::DEFAULT_PARTITION)),
                })
                .collect();
            sql.push_str(&format!(
                "ALTER TABLE {} ADD IF NOT EXISTS PARTITION ({}) LOCATION {};\n",
                hive::ident(table),
                spec.join(", "),
                hive::literal(&format!("{location}/{}", p.partition))
            ));
        }
        Ok(sql)
    }

    /// The table's columns as the config describes them (before any chunk recorded a schema):
    /// the declared ones after rename and cast, then the derived ones.
    fn configured_columns(&self) -> Vec<(String, String)> {
        let t = &self.cfg.transform;
        let mut cols: Vec<(String, String)> = Vec::new();
        for c in &self.cfg.table.columns {
            let name = t.rename.get(&c.name).unwrap_or(&c.name).clone();
            let ty: ColumnType = t.cast.get(&name).copied().unwrap_or(c.ty);
            cols.push((name, ty.hive().to_string()));
        }
        for (name, expr) in &t.derive {
            let expr = expr.trim();
            let ty = if expr.starts_with("date(") {
                "DATE".to_string()
            } else if expr.starts_with("hour(") {
                "INT".to_string()
            } else {
                let src = expr.trim_start_matches("col(").trim_end_matches(')').trim();
                cols.iter().find(|(n, _)| n == src).map_or("STRING".to_string(), |(_, ty)| ty.clone())
            };
            cols.retain(|(n, _)| n != name);
            cols.push((name.clone(), ty));
        }
        cols
    }

    /// Writes `_ferry/schema-v<N>.sql` for every version after the first that this process
    /// has not written yet: `ADD COLUMNS` for new columns, `CHANGE COLUMN` for wider types.
    async fn write_schema_changes(&self, written: &mut std::collections::BTreeSet<i64>) -> Result<(), TableError> {
        let table = &self.cfg.table.name;
        let versions = self.ledger.table_schemas(table).await?;
        let pcols = &self.cfg.table.partition_by;
        for pair in versions.windows(2) {
            let (old, new) = (&pair[0], &pair[1]);
            if written.contains(&new.version) {
                continue;
            }
            let mut sql = format!("-- Schema version {} of {}: {}\n", new.version, hive::ident(table), one_line(&new.change));
            let added: Vec<String> = new
                .columns
                .iter()
                .filter(|c| !pcols.contains(&c.name) && !old.columns.iter().any(|o| o.name == c.name))
                .map(|c| format!("{} {}", hive::ident(&c.name), c.hive))
                .collect();
            if !added.is_empty() {
                sql.push_str(&format!("ALTER TABLE {} ADD COLUMNS ({});\n", hive::ident(table), added.join(", ")));
            }
            for c in new.columns.iter().filter(|c| !pcols.contains(&c.name)) {
                if old.columns.iter().any(|o| o.name == c.name && o.hive != c.hive) {
                    let name = hive::ident(&c.name);
                    sql.push_str(&format!("ALTER TABLE {} CHANGE COLUMN {name} {name} {};\n", hive::ident(table), c.hive));
                }
            }
            self.dest.put_atomic(&paths::schema_change(table, new.version), sql.into_bytes()).await?;
            written.insert(new.version);
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Table for HiveTable {
    fn format(&self) -> &'static str {
        "hive"
    }

    fn store(&self) -> &Store {
        &self.dest
    }

    fn meta_dirs(&self) -> Vec<String> {
        vec![paths::table_meta(&self.cfg.table.name)]
    }

    async fn publish(&self, job: &Job<'_>) -> Result<Outcome, TableError> {
        self.publish_chunk(job).await
    }

    async fn withdraw(&self, dest: &Store, lease: &Lease) -> Result<bool, TableError> {
        self.withdraw_chunk(dest, lease).await
    }

    async fn unrecorded(&self, chunk: &str) -> Result<Vec<String>, TableError> {
        Ok(unrecorded_in_table(&self.ledger, &self.cfg.table.name, &self.dest, chunk).await?.into_iter().map(|(_, path)| path).collect())
    }

    async fn verify(&self) -> Result<Verified, TableError> {
        verify(&self.dest, &self.ledger, &self.cfg.table.name).await
    }

    async fn vacuum(&self, _: Option<std::time::Duration>, _: bool, _: bool) -> Result<crate::Vacuumed, TableError> {
        Err(crate::refused("hive", "ferry vacuum", "a Hive table's replaced files are removed when a version switches"))
    }

    async fn compact(&self, _: i64, _: bool) -> Result<crate::Compacted, TableError> {
        Err(crate::refused(
            "hive",
            "ferry compact",
            "a Hive table's files are read by name, and merging them would change what each partition's files hold",
        ))
    }

    /// Keeps `ddl.sql` up to date in the background while chunks are published: a chunk's
    /// task is done once the ledger has it, without waiting for the DDL (on HDFS each rewrite
    /// waits ~0.5 s for a block report, and chunks adding partitions at once would queue
    /// behind each other's rewrites). Rewrites coalesce: one render covers every chunk
    /// committed before it. A rewrite that fails is tried again a second later, and the stage
    /// writes the DDL once more before it exits ([`Table::finish`]).
    async fn upkeep(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        // Once at the start: a run that crashed (or failed) after a commit may have left the
        // DDL behind. One try; reading it costs a small read, rewriting it only if it differs.
        if let Err(e) = self.check_ddl().await {
            tracing::warn!(error = %e, "cannot check the table's DDL now; it is rewritten after the next chunk");
        }
        // Stopping wakes the writer too, also out of its wait after a failed rewrite: a
        // destination that is down must not keep the stage from exiting.
        while !self.ddl_stop.load(SeqCst) {
            while !self.ddl_stop.load(SeqCst) && self.ddl_due.swap(false, SeqCst) {
                if let Err(e) = self.write_ddl().await {
                    tracing::warn!(error = %e, "cannot rewrite the table's DDL now; trying again");
                    self.ddl_due.store(true, SeqCst);
                    tokio::select! {
                        _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                        _ = self.ddl_wake.notified() => {}
                    }
                }
            }
            if !self.ddl_stop.load(SeqCst) {
                self.ddl_wake.notified().await;
            }
        }
    }

    /// Ends [`Table::upkeep`] (a rewrite under way finishes first: a write cut off would
    /// leave a temp file behind; the writes take turns on `ddl`), and rewrites the DDL one last time if this run
    /// published or retracted anything. A run that published nothing does not touch the
    /// destination; a crash after a commit is made up for by the next run that publishes.
    async fn finish(&self) -> Result<(), TableError> {
        self.ddl_stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.ddl_wake.notify_one();
        if self.ddl_touched.load(std::sync::atomic::Ordering::SeqCst) {
            self.write_ddl().await?;
        }
        Ok(())
    }
}

/// A published file's replacement (a rerun) is not there: the published file stays.
fn replacement_missing(dest: &Store, landed: &str, target: &str, chunk: &str) -> TableError {
    TableError::Stage(TableFailure::Missing {
        chunk: chunk.to_string(),
        message: format!(
            "{} would replace {}, but it is not there; the published file stays. Run the chunk again \
             (ferry rerun --chunk {chunk} --from transform)",
            dest.url(landed),
            dest.url(target)
        ),
    })
}

/// Moves the parts this attempt published back to their landed names (or, where the
/// landed file is still there, removes the table file). True if every one went back.
async fn take_back(dest: &Store, chunk: &str, moved: &[(String, String)]) -> bool {
    let mut all = true;
    for (t, l) in moved.iter().rev() {
        let back = match dest.rename_noreplace(t, l).await {
            Ok(true) => Ok(()),
            // The landed file is still there (on S3 its removal after the copy may have
            // failed): the table file is the one to remove.
            Ok(false) => dest.delete(t).await,
            Err(e) => Err(e),
        };
        if let Err(err) = back {
            all = false;
            tracing::error!(chunk, file = ?dest.url(t), error = %err, "could not take a part back out of the table");
        }
    }
    all
}

/// A schema change's description on one `--` comment line of the DDL.
fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

/// The parts of `chunk` that are in the table (its bytes at its table path) while no
/// `published` row of it names them, with their table paths: moved there by a sibling's switch
/// of the chunk's version, or by an attempt of its own that died (or could not take them back)
/// before recording them. Only the store can tell the second case; `ferry skip` asks here
/// before it closes a load, as closing it would leave them in the table unnamed.
async fn unrecorded_in_table(ledger: &Ledger, table: &str, dest: &Store, chunk: &str) -> Result<Vec<(Part, String)>, TableError> {
    let recorded: HashSet<String> = ledger.published_of(chunk).await?.into_iter().map(|(p, _)| p).collect();
    let mut found = Vec::new();
    for p in ledger.parts(chunk).await? {
        let target = paths::table_file(table, &p.rel_path());
        if !recorded.contains(&target) && in_table::<TableFailure>(dest, &target, &p).await? == Some(true) {
            found.push((p, target));
        }
    }
    Ok(found)
}

/// Tests stand in for a switch that fails part-way (debug builds only): with
/// `FERRY_TEST_SWITCH_GATE=DIR`, the first chunk of this process to have moved one part
/// creates `DIR/reached` and waits (two minutes at most) for `DIR/go`; if `DIR/fail` exists
/// then, its next part fails as a conflict would.
#[cfg(debug_assertions)]
async fn test_fault(moved: usize) -> Option<TableError> {
    static USED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let dir = ferry_runtime::gate::dir("FERRY_TEST_SWITCH_GATE", None)?;
    if moved != 1 || USED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return None;
    }
    ferry_runtime::gate::hold_async(&dir).await;
    dir.join("fail").exists().then(|| TableError::Stage(TableFailure::Conflict("a failure the test injected".into())))
}

#[cfg(not(debug_assertions))]
async fn test_fault(_moved: usize) -> Option<TableError> {
    None
}

/// A Hive-layout table: the ledger's published files against the directory.
async fn verify(dest: &Store, ledger: &Ledger, table: &str) -> Result<Verified, TableError> {
    let mut out = Verified::default();
    let want = ledger.published_files(table).await?;
    let have: std::collections::HashMap<String, u64> = dest
        .list(table)
        .await?
        .into_iter()
        .map(|e| (e.rel, e.size))
        .filter(|(rel, _)| !rel.contains("/_ferry/") && !rel.rsplit('/').next().unwrap_or_default().starts_with('.'))
        .collect();
    let (mut missing, mut wrong) = (0, 0);
    for (path, chunk, bytes) in &want {
        match have.get(path) {
            None => {
                missing += 1;
                out.bad_chunks.insert(chunk.clone());
                out.lines.push(format!("missing  {path} (chunk {chunk})"));
            }
            Some(&size) if size != *bytes as u64 => {
                wrong += 1;
                out.bad_chunks.insert(chunk.clone());
                out.lines.push(format!("size     {path}: {size} bytes, the ledger says {bytes} (chunk {chunk})"));
            }
            Some(_) => {}
        }
    }
    let known: std::collections::HashSet<&str> = want.iter().map(|(p, _, _)| p.as_str()).collect();
    let mut extra = 0;
    for path in have.keys().filter(|p| p.ends_with(".parquet") && !known.contains(p.as_str())) {
        extra += 1;
        out.lines.push(format!("extra    {path} (not published by pipeline {} as far as the ledger knows)", ledger.pipeline()));
    }
    out.lines.push(format!(
        "pipeline {}, table {table}: {} file(s) published, {missing} missing, {wrong} of the wrong size, {extra} extra",
        ledger.pipeline(),
        want.len()
    ));
    out.problems = missing + wrong + extra;
    Ok(out)
}
