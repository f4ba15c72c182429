//! Delta Lake tables (`[destination] table_format = "delta"`): the table's `_delta_log`,
//! written by load over Ferry's own stores.
//!
//! # Design note
//!
//! Ferry writes the Parquet files itself (transform) and moves them into the table directory
//! (load); Delta adds only the log that says which of them a reader sees. So Ferry writes the
//! log itself instead of linking delta-rs (whose data path, arrow and object_store would be a
//! second copy of Ferry's): what that takes is the protocol's commit rule, replay and the
//! actions below, over [`Store::create_new`] (put-if-absent), on every store Ferry has.
//!
//! ```text
//!  <table>/<k=v>/part-<chunk>-<blake3 8>.parquet   moved in from _ferry/landed; invisible until added
//!  <table>/_delta_log/<version:020>.json           one commit: newline-delimited actions
//! ```
//!
//! - **A commit** is the file of version `v + 1`, created only if it does not exist: two
//!   writers that read version `v` race for one name and exactly one wins (a hard link or
//!   `renameat2(RENAME_NOREPLACE)` locally, a rename without overwrite on HDFS, `If-None-Match:
//!   *` on S3, GCS and Azure). The loser reads the commits it missed and plans again from the
//!   new snapshot: every plan is a function of the snapshot it is written against, so a plan
//!   that is no longer right (the files are in already, a newer version of the source file
//!   is in) is not written.
//! - **Names are content-addressed.** A part's table file carries its chunk id and the start
//!   of its blake3, so a file a live or earlier version names is never written over: a rerun
//!   with other bytes gets another name (its commit removes the old one and adds the new),
//!   and a retry of the same bytes finds its own name.
//! - **Exactly once through ambiguous commits.** Whether a chunk is in the table is read from
//!   the snapshot, never assumed: are the chunk's files active? A commit whose reply was lost
//!   (or whose writer was killed after the create) is found there by the retry, which then
//!   writes nothing. Each commit also carries a `txn` action per chunk (`appId` =
//!   `ferry:<pipeline>:<chunk>`, `version` = the load lease's epoch, or one past the chunk's
//!   last if that is higher: per chunk it only grows), so readers and `ferry verify` can tell
//!   which commit brought which chunk; Delta keeps the latest per app id, and the table's
//!   `delta.setTransactionRetentionDuration` (7 days) lets checkpoints drop those of chunks
//!   loaded long ago.
//! - **A load past its lease writes nothing.** A commit that would carry a chunk some commit
//!   carried since the load last confirmed its lease (a retry, a rerun, a sibling a switch
//!   took in) confirms the lease with the ledger first and is planned again; a load whose
//!   lease another claim took (paused, or cut off from the ledger while it still reached the
//!   store) stops there, so it never undoes the newer load's commit.
//! - **The ledger stays the authority on what belongs in the table** (which chunks, which
//!   version of each source file); the log is where it becomes visible, in one step per
//!   commit. The ledger records a chunk after its commit: a crash between the two leaves the
//!   chunk visible and unrecorded, and its retry finds it in the snapshot and records it.
//!
//! What a crash leaves, at each step of a chunk's load:
//! - parts moved into the table directory, no commit: invisible files; the retry adds them
//!   (gc removes those of a chunk that never comes back).
//! - the commit's temp file written, not created under its name: a temp file for gc.
//! - the commit created, the ledger not told: the retry sees the files active and records.

mod actions;
mod checkpoint;
mod compact;
mod features;
mod log;
mod preflight;
pub mod stats;
mod table;
mod upkeep;

use std::collections::HashMap;

pub use actions::*;
pub use compact::{Change, Input, MEMBERS_TAG, Member, Rewrite, compatibility, members_of, merge};
use ferry_storage::Store;
pub use log::{Action, FEATURES_READER, FEATURES_WRITER, Feature, Metadata, Protocol, SetTransaction, metadata_line, protocol_line};
pub use preflight::preflight;
use serde_json::Value;
pub use table::DeltaTable;

/// What went wrong with a table's log.
#[derive(Debug, thiserror::Error)]
pub enum DeltaError {
    #[error(transparent)]
    Storage(#[from] ferry_storage::Error),
    /// The log holds something Ferry cannot read or must not write over (a newer protocol, a
    /// commit that is not JSON, a missing commit).
    #[error("{0}")]
    Log(String),
    /// The table's schema has a type Delta cannot hold, or a change Ferry does not write.
    #[error("{0}")]
    Schema(String),
    /// The table uses a feature or a rule (another engine's, or its owner's) that Ferry does not
    /// write or that the commit would break: nothing was written.
    #[error("{0}")]
    Refused(String),
}

type Result<T, E = DeltaError> = std::result::Result<T, E>;

/// Reader and writer versions of a new table (with a `timestamp_ntz` column: table features,
/// reader 3 / writer 7, that one named).
const READER_VERSION: i32 = 1;
const WRITER_VERSION: i32 = 2;
/// How long a chunk's `txn` stays in the table's snapshot after its commit.
pub const TXN_RETENTION: &str = "interval 7 days";
/// Commits between two checkpoints, unless the table's `delta.checkpointInterval` says.
pub const CHECKPOINT_INTERVAL: i64 = 10;
/// How long a removed file stays in checkpoints (so that a vacuum of another writer still knows
/// it was removed), unless the table's `delta.deletedFileRetentionDuration` says.
const TOMBSTONE_RETENTION: &str = "interval 1 week";
/// How far a checkpoint's writer's clock may be behind the store's (see
/// [`DeltaLog::snapshot_for_vacuum`]).
pub const CLOCK_MARGIN_MS: i64 = 3_600_000;

/// A file the table's current version holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Active {
    pub size: i64,
    /// The version whose commit added it (for files read from a checkpoint: the checkpoint's
    /// version, an upper bound).
    pub added_in: i64,
    /// The `add` action itself, which a checkpoint writes again.
    pub action: Value,
    /// For a compacted file, the parts it holds (see `compact`); empty for any other.
    pub members: Vec<Member>,
}

/// An application transaction (`txn`) as the snapshot keeps it: the latest per app id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Txn {
    pub version: i64,
    /// The table version whose commit carried it.
    pub in_version: i64,
    pub last_updated: Option<i64>,
}

/// A part of Ferry's that another writer's commit took out of the table: a DELETE, UPDATE or
/// MERGE that rewrote its file, an OPTIMIZE that merged it, a removal of a compacted file that
/// held it. Ferry cannot name that writer's files by chunk, so it can neither take the part's
/// rows out (a switch, a rerun, a skip would leave them beside the new ones) nor put the part
/// back (the rows the other writer deleted would return).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    /// The commit that took it out.
    pub version: i64,
    /// That commit's operation and writer, as its commitInfo says (`DELETE by delta-rs.0.25.1`).
    pub operation: String,
    /// The commit added files, where some of the part's rows may be now (a DELETE of whole
    /// files adds none: the rows are gone).
    pub kept: bool,
}

/// The table as of one version: what a reader of that version sees.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// -1 before the first commit.
    pub version: i64,
    pub protocol: Option<Protocol>,
    pub metadata: Option<Metadata>,
    /// Active files by path (decoded, relative to the table).
    pub files: HashMap<String, Active>,
    /// Removed files (tombstones) by path, with their `remove` action.
    pub removed: HashMap<String, Value>,
    pub txns: HashMap<String, Txn>,
    /// The compacted file that holds each part compacted away, by the part's path.
    pub members: HashMap<String, String>,
    /// Ferry's parts out of this version that another writer took out, by path.
    pub rewritten: HashMap<String, Rewritten>,
    /// The first version whose commit was replayed: a tombstone of an older commit (read from
    /// a checkpoint) says a file was removed, not by whom, until [`DeltaLog::trace`].
    pub replayed_from: i64,
    /// [`DeltaLog::trace`] read the log back as far as it goes: tracing again learns nothing.
    pub traced: bool,
}

impl Snapshot {
    fn empty() -> Snapshot {
        Snapshot { version: -1, ..Default::default() }
    }

    /// Applies one commit's actions (`version`'s), as the protocol's replay does.
    pub fn apply(&mut self, version: i64, text: &str) -> Result<()> {
        let mut actions = Vec::new();
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let action = Action::parse(line).map_err(|e| DeltaError::Log(format!("commit {version}, line {}: {e}", i + 1)))?;
            actions.push((i, action));
        }
        let foreign = foreign_commit(version, actions.iter().map(|(_, a)| a));
        for (i, action) in actions {
            self.apply_action(version, action, foreign.as_ref())
                .map_err(|e| DeltaError::Log(format!("commit {version}, line {}: {e}", i + 1)))?;
        }
        self.version = version;
        Ok(())
    }

    /// One action; `foreign` is set when another writer's commit holds it (None for Ferry's
    /// commits and a checkpoint's actions).
    fn apply_action(&mut self, version: i64, action: Action, foreign: Option<&Rewritten>) -> Result<(), String> {
        let path = |a: &Value| a.get("path").and_then(Value::as_str).map(decode_path).ok_or("an action without a path");
        match action {
            Action::Add(a) => {
                let p = path(&a)?;
                let size = a.get("size").and_then(Value::as_i64).unwrap_or(0);
                let members = members_of(&a)?;
                self.removed.remove(&p);
                self.rewritten.remove(&p);
                for m in &members {
                    self.members.insert(m.rel.clone(), p.clone());
                    self.rewritten.remove(&m.rel);
                }
                if let Some(old) = self.files.insert(p.clone(), Active { size, added_in: version, action: a, members }) {
                    self.forget_members(&p, &old);
                }
            }
            Action::Remove(r) => {
                let p = path(&r)?;
                // The parts whose rows the removed file held: itself, or a compacted file's members.
                let mut parts = if chunk_of(&p).is_some() { vec![p.clone()] } else { vec![] };
                if let Some(old) = self.files.remove(&p) {
                    self.forget_members(&p, &old);
                    if !old.members.is_empty() {
                        parts = old.members.iter().map(|m| m.rel.clone()).collect();
                    }
                }
                for part in parts {
                    match foreign {
                        Some(w) => self.rewritten.insert(part, w.clone()),
                        // Ferry took it out itself: its rows are out, or in the file it added.
                        None => self.rewritten.remove(&part),
                    };
                }
                self.removed.insert(p, r);
            }
            Action::Txn(t) => {
                self.txns.insert(t.app_id, Txn { version: t.version, in_version: version, last_updated: t.last_updated });
            }
            // Read whatever it asks for; writing to it is checked before each commit
            // (`Snapshot::unwritable`), so a reader (status, verify) still reads the table.
            Action::Protocol(p) => self.protocol = Some(p),
            Action::MetaData(m) => self.metadata = Some(m),
            // commitInfo, cdc, domainMetadata, ...: nothing a writer of appends must track.
            Action::CommitInfo(_) | Action::Other => {}
        }
        Ok(())
    }

    /// Drops the members of `old` (once at `rel`) that no other file holds now.
    fn forget_members(&mut self, rel: &str, old: &Active) {
        for m in &old.members {
            if self.members.get(&m.rel).is_some_and(|f| f == rel)
                && !self.files.get(rel).is_some_and(|a| a.members.iter().any(|n| n.rel == m.rel))
            {
                self.members.remove(&m.rel);
            }
        }
    }

    /// The parts of `chunk` another writer took out of the table (see [`Rewritten`]).
    pub fn rewritten_of<'a>(&'a self, chunk: &'a str) -> impl Iterator<Item = (&'a str, &'a Rewritten)> + 'a {
        self.rewritten.iter().filter(move |(p, _)| chunk_of(p) == Some(chunk)).map(|(p, r)| (p.as_str(), r))
    }

    /// Whether a tombstone of one of `chunks`' parts came from a checkpoint, so who removed it
    /// is not known yet (see [`DeltaLog::trace`]).
    /// Read from a checkpoint and not traced yet: a tombstone (or the lack of one, once pruned
    /// past its retention) says nothing of who took a part out. A rerun, a switch or a withdrawal
    /// of a chunk that was in the table traces first (see [`DeltaLog::trace`]).
    pub fn unknown_removers(&self) -> bool {
        self.replayed_from > 0 && !self.traced
    }

    pub fn needs_trace(&self, chunks: &std::collections::HashSet<&str>) -> bool {
        self.replayed_from > 0 && !self.traced && self.removed.keys().any(|p| chunk_of(p).is_some_and(|c| chunks.contains(c)))
    }

    /// The table's current schema string, if it has one.
    pub fn schema_string(&self) -> Option<&str> {
        Some(&self.metadata.as_ref()?.schema_string)
    }

    /// A table property (`metaData.configuration`), if set.
    pub fn property(&self, key: &str) -> Option<&str> {
        self.metadata.as_ref()?.configuration.get(key).map(String::as_str)
    }

    /// The oldest `lastUpdated` of a txn, and the oldest `deletionTimestamp` of a tombstone,
    /// that a checkpoint written at `now_ms` keeps (the table's retentions, or Delta's defaults).
    pub(crate) fn retained_since(&self, now_ms: i64) -> (i64, i64) {
        let txns = self.retention_ms("delta.setTransactionRetentionDuration", TXN_RETENTION);
        (now_ms.saturating_sub(txns), now_ms.saturating_sub(self.tombstone_retention_ms()))
    }

    /// How long a removed file stays in checkpoints, and how old it must be before a vacuum
    /// deletes it: the table's `delta.deletedFileRetentionDuration`, else 1 week.
    pub fn tombstone_retention_ms(&self) -> i64 {
        self.retention_ms("delta.deletedFileRetentionDuration", TOMBSTONE_RETENTION)
    }

    /// A retention property of the table in ms, or Delta's default for it.
    fn retention_ms(&self, property: &str, default: &str) -> i64 {
        self.property(property).and_then(interval_ms).or_else(|| interval_ms(default)).unwrap_or(i64::MAX)
    }

    /// Forgets the txns and tombstones past their retention at `now_ms`, as a checkpoint
    /// written then does: a long-running writer's snapshot stays the size of the table.
    pub fn prune(&mut self, now_ms: i64) {
        let (txns_since, tombstones_since) = self.retained_since(now_ms);
        self.txns.retain(|_, t| t.last_updated.is_none_or(|at| at >= txns_since));
        self.removed.retain(|_, r| r.get("deletionTimestamp").and_then(Value::as_i64).unwrap_or(i64::MAX) >= tombstones_since);
    }

    /// Commits between checkpoints: `delta.checkpointInterval`, or [`CHECKPOINT_INTERVAL`].
    pub fn checkpoint_interval(&self) -> i64 {
        self.property("delta.checkpointInterval").and_then(|v| v.trim().parse().ok()).filter(|n| *n > 0).unwrap_or(CHECKPOINT_INTERVAL)
    }
}

/// The writer of a commit that is not Ferry's (its commitInfo's `engineInfo` does not start
/// with `ferry/`), as a [`Rewritten`] for the parts it takes out; None for Ferry's.
fn foreign_commit<'a>(version: i64, mut actions: impl Iterator<Item = &'a Action> + Clone) -> Option<Rewritten> {
    let info = actions.clone().find_map(|a| match a {
        Action::CommitInfo(i) => Some(i),
        _ => None,
    });
    let text = |k: &str| info.and_then(|i| i.get(k)).and_then(Value::as_str);
    let engine = text("engineInfo").or(text("clientVersion"));
    if engine.is_some_and(|e| e.starts_with("ferry/")) {
        return None;
    }
    let operation = format!("{} by {}", text("operation").unwrap_or("a commit"), engine.unwrap_or("another writer"));
    Some(Rewritten { version, operation, kept: actions.any(|a| matches!(a, Action::Add(_))) })
}

/// A Delta interval (`interval 7 days`, `interval 12 hours`) in milliseconds.
pub fn interval_ms(text: &str) -> Option<i64> {
    let mut words = text.split_whitespace();
    let first = words.next()?;
    let n: i64 = if first.eq_ignore_ascii_case("interval") { words.next()? } else { first }.parse().ok()?;
    let unit = words.next()?.to_ascii_lowercase();
    let ms = match unit.trim_end_matches('s') {
        "millisecond" => 1,
        "second" => 1_000,
        "minute" => 60_000,
        "hour" => 3_600_000,
        "day" => 86_400_000,
        "week" => 7 * 86_400_000,
        _ => return None,
    };
    n.checked_mul(ms)
}

/// One table's log, read and appended to through a store.
#[derive(Debug, Clone)]
pub struct DeltaLog {
    store: Store,
    /// The table's directory in the store.
    table: String,
    /// Set by [`DeltaLog::deferring_checkpoints`]: the snapshot a commit made due for a
    /// checkpoint, written by [`DeltaLog::write_due_checkpoint`] once the committer let go of
    /// its lock.
    due: Option<std::sync::Arc<std::sync::Mutex<Option<Due>>>>,
    /// The newest checkpoint version this log wrote: deferred checkpoints are written one at a
    /// time and never an older one after a newer (`_last_checkpoint` would go back).
    written: std::sync::Arc<tokio::sync::Mutex<i64>>,
    /// A commit at a checkpoint version failed with no answer (it may have landed): the next
    /// commit this log makes writes the checkpoint instead, or the interval would go without.
    missed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Unit tests: the commit of this version lands and its answer is an error, as when the
    /// store's reply is lost (the store's own tests and the suite's fault proxy lose real ones).
    #[cfg(test)]
    lose_reply_at: Option<i64>,
}

/// A snapshot a commit made due for a checkpoint, and the commit's time.
type Due = (Snapshot, i64);

impl DeltaLog {
    pub fn new(store: Store, table: &str) -> DeltaLog {
        DeltaLog {
            store,
            table: table.to_string(),
            due: None,
            written: Default::default(),
            missed: Default::default(),
            #[cfg(test)]
            lose_reply_at: None,
        }
    }

    /// A log whose commits leave their checkpoint to [`DeltaLog::write_due_checkpoint`]: a
    /// writer that commits under a lock (load's group commit) writes it after letting go, so
    /// the next commit does not wait for it.
    pub fn deferring_checkpoints(mut self) -> DeltaLog {
        self.due = Some(Default::default());
        self
    }

    /// Writes the checkpoint the newest commit made due, if one is and no other task took it
    /// first. A failure is logged: the commit stands without it (a checkpoint only saves
    /// readers a replay), and the next interval writes one again.
    pub async fn write_due_checkpoint(&self) {
        let Some(due) = &self.due else { return };
        let mut written = self.written.lock().await;
        let taken = due.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some((s, now_ms)) = taken.filter(|(s, _)| s.version > *written) else { return };
        match self.checkpoint(&s, now_ms).await {
            Ok(()) => *written = s.version,
            Err(e) => {
                tracing::warn!(table = %self.store.url(&self.table), version = s.version, error = %e, "could not write the checkpoint")
            }
        }
    }

    /// The store the table is in, and the table's directory in it.
    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    fn log_dir(&self) -> String {
        ferry_common::paths::delta_log(&self.table)
    }

    fn commit_path(&self, version: i64) -> String {
        format!("{}/{version:020}.json", self.log_dir())
    }

    /// The latest snapshot: the checkpoint `_last_checkpoint` names, then the commits after it,
    /// read one by one until the next is not there; the log is not listed, so the cost follows
    /// the table and the commits since its checkpoint, not the length of its history. Without a
    /// pointer (or with one naming a checkpoint that is gone or of a kind this does not read),
    /// the newest complete checkpoint of a listing.
    pub async fn snapshot(&self) -> Result<Snapshot> {
        if let Some(c) = checkpoint::pointed(&self.store, &self.log_dir()).await? {
            let mut s = Snapshot::empty();
            match checkpoint::read(&self.store, &self.log_dir(), &c, &mut s).await {
                Ok(()) => {
                    self.catch_up(&mut s).await?;
                    return Ok(s);
                }
                Err(DeltaError::Storage(e)) if e.is_not_found() => {
                    tracing::debug!(table = %self.table, version = c.version, "_last_checkpoint names a checkpoint that is gone; listing the log");
                }
                Err(e) => return Err(e),
            }
        }
        let names = self.store.children(&self.log_dir()).await?;
        let first = names.iter().filter_map(|n| n.strip_suffix(".json")?.parse::<i64>().ok()).min();
        let mut s = Snapshot::empty();
        match checkpoint::latest(&names) {
            Some(c) => checkpoint::read(&self.store, &self.log_dir(), &c, &mut s).await?,
            None if first.is_some_and(|f| f > 0) => {
                return Err(DeltaError::Log(format!(
                    "{}: the log starts at version {} and has no checkpoint to start from",
                    self.store.url(&self.log_dir()),
                    first.unwrap_or_default()
                )));
            }
            None => {}
        }
        self.catch_up(&mut s).await?;
        Ok(s)
    }

    /// The latest snapshot with every tombstone of a file removed at or after `cutoff_ms`: what
    /// a vacuum with that cutoff must not delete (a file removed before it, whose tombstone is
    /// gone, is a file no version names, which vacuum takes by its age). A checkpoint keeps the
    /// tombstones of files removed within the table's `delta.deletedFileRetentionDuration` of
    /// its writing, so replay starts from the newest checkpoint written (its file's time, plus
    /// [`CLOCK_MARGIN_MS`] for the writer's clock) no more than that retention, as the checkpoint
    /// itself says, after `cutoff_ms`; with none, from version 0 while the log has it, else from
    /// the newest checkpoint. A vacuum reads the commits of its retention, not the whole history.
    pub async fn snapshot_for_vacuum(&self, cutoff_ms: i64) -> Result<Snapshot> {
        let entries = self.store.list(&self.log_dir()).await?;
        let name = |rel: &str| rel.rsplit('/').next().unwrap_or(rel).to_string();
        let names: Vec<String> = entries.iter().map(|e| name(&e.rel)).collect();
        let written: HashMap<String, i64> = entries.iter().map(|e| (name(&e.rel), e.mtime_ms)).collect();
        // A cheap first look with today's retention; the checkpoint's own decides.
        let today = self.snapshot().await?;
        let now_retention = today.tombstone_retention_ms();
        for c in checkpoint::complete(&names).into_iter().rev() {
            let Some(at) = c.files.iter().map(|f| written.get(f).copied()).collect::<Option<Vec<i64>>>().and_then(|t| t.into_iter().max())
            else {
                continue;
            };
            let at = at.saturating_add(CLOCK_MARGIN_MS);
            if at.saturating_sub(now_retention) > cutoff_ms {
                continue;
            }
            let mut s = Snapshot::empty();
            checkpoint::read(&self.store, &self.log_dir(), &c, &mut s).await?;
            if at.saturating_sub(s.tombstone_retention_ms()) <= cutoff_ms {
                self.catch_up(&mut s).await?;
                return Ok(s);
            }
        }
        if names.iter().any(|n| n == &format!("{:020}.json", 0)) {
            let mut s = Snapshot::empty();
            self.catch_up(&mut s).await?;
            return Ok(s);
        }
        Ok(today)
    }

    /// Learns who removed the files `s`'s checkpoint names as removed: the log is replayed
    /// from the oldest point every later commit is kept from (version 0, or the oldest
    /// checkpoint), and the parts another writer took out since are marked in `s`. A removal
    /// older than that point (the log cleaned up past `delta.logRetentionDuration`) stays
    /// unknown. Costs a read of every kept commit, so it is asked for only when a chunk with
    /// such a tombstone is to be written.
    pub async fn trace(&self, s: &mut Snapshot) -> Result<()> {
        if s.replayed_from == 0 || s.traced {
            return Ok(());
        }
        // Once it has read back as far as the log goes, tracing again learns nothing: the log
        // only loses its oldest commits and checkpoints over time, never gains them. (Not
        // marked when a read fails: the next call tries again.)
        let names = self.store.children(&self.log_dir()).await?;
        let commits: std::collections::BTreeSet<i64> = names.iter().filter_map(|n| n.strip_suffix(".json")?.parse().ok()).collect();
        let mut h = Snapshot::empty();
        if !commits.contains(&0) {
            // The oldest checkpoint from which no commit is missing.
            let last = commits.last().copied().unwrap_or(-1);
            let Some(c) = checkpoint::complete(&names).into_iter().find(|c| (c.version + 1..=last).all(|v| commits.contains(&v))) else {
                s.traced = true;
                return Ok(());
            };
            if c.version + 1 >= s.replayed_from {
                s.traced = true;
                return Ok(());
            }
            checkpoint::read(&self.store, &self.log_dir(), &c, &mut h).await?;
        }
        self.catch_up(&mut h).await?;
        for (p, r) in h.rewritten {
            if !s.has_part(&p) {
                s.rewritten.entry(p).or_insert(r);
            }
        }
        s.replayed_from = h.replayed_from;
        s.traced = true;
        Ok(())
    }

    /// The version of the newest checkpoint in the log, if any.
    pub async fn checkpoint_version(&self) -> Result<Option<i64>> {
        Ok(checkpoint::latest(&self.store.children(&self.log_dir()).await?).map(|c| c.version))
    }

    /// Brings `s` up to date by reading the commits after it, one by one. Replaying a commit
    /// twice changes nothing, so a read that fails part-way leaves `s` fit to go on from.
    pub async fn catch_up(&self, s: &mut Snapshot) -> Result<()> {
        loop {
            let next = s.version + 1;
            match self.store.read(&self.commit_path(next)).await {
                Ok(bytes) => {
                    let text = String::from_utf8(bytes).map_err(|_| DeltaError::Log(format!("commit {next} is not UTF-8")))?;
                    s.apply(next, &text)?;
                }
                Err(e) if e.is_not_found() => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Appends one commit: `plan` is asked for its actions against the latest snapshot, and
    /// asked again against each newer one while another writer's commit takes the version it
    /// aimed for. `plan` returning None means nothing is to be written (what it would write is
    /// in the table already, or no longer wanted). `cache` is the snapshot the caller read
    /// last (read whole when None), left as the newest this call saw; returns the version
    /// written, if any. A commit whose version is a multiple of the table's checkpoint
    /// interval is followed by a checkpoint (see [`DeltaLog::checkpoint`]).
    pub async fn commit<F>(&self, cache: &mut Option<Snapshot>, mut plan: F) -> Result<Option<i64>>
    where
        F: FnMut(&Snapshot) -> Result<Option<Vec<Value>>>,
    {
        match cache.as_mut() {
            Some(s) => self.catch_up(s).await?,
            None => *cache = Some(self.snapshot().await?),
        }
        let s = cache.as_mut().expect("read above");
        // Each lost race means another commit went in; a bound keeps a writer that always
        // loses (hundreds of hosts on one table) from trying for ever within one attempt.
        let url = self.store.url(&self.table);
        for lost in 0..64u32 {
            if let Some(why) = s.unwritable(&url) {
                return Err(DeltaError::Refused(why));
            }
            let Some(actions) = plan(s)? else { return Ok(None) };
            features::check_commit(s, &url, &actions).map_err(DeltaError::Refused)?;
            let version = s.version + 1;
            let mut text = String::new();
            for a in &actions {
                text.push_str(&a.to_string());
                text.push('\n');
            }
            let boundary = version > 0 && version % s.checkpoint_interval() == 0;
            let created = self.store.create_new(&self.commit_path(version), text.clone().into_bytes()).await;
            #[cfg(test)]
            let created = match created {
                Ok(true) if self.lose_reply_at == Some(version) => Err(ferry_storage::Error::Other("the reply was lost".into())),
                c => c,
            };
            let created = match created {
                Ok(created) => created,
                Err(e) => {
                    if boundary {
                        self.missed.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    return Err(e.into());
                }
            };
            if created {
                s.apply(version, &text)?;
                if boundary || self.missed.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    let now_ms = actions.iter().find_map(|a| a.get("commitInfo")?.get("timestamp")?.as_i64()).unwrap_or(0);
                    // What the checkpoint leaves out (tombstones and txns past their
                    // retention) leaves this writer's snapshot too, so it does not grow for ever.
                    s.prune(now_ms);
                    match &self.due {
                        Some(due) => *due.lock().unwrap_or_else(|e| e.into_inner()) = Some((s.clone(), now_ms)),
                        // The commit stands without it: a checkpoint only saves readers a
                        // replay, and the next interval's writes one again.
                        None => {
                            if let Err(e) = self.checkpoint(s, now_ms).await {
                                tracing::warn!(table = %self.store.url(&self.table), version, error = %e, "could not write the checkpoint");
                            }
                        }
                    }
                }
                return Ok(Some(version));
            }
            tracing::debug!(table = %self.table, version, lost, "another writer committed this version first; planning again");
            // A little jitter, so that writers that lost together do not race again in step.
            tokio::time::sleep(std::time::Duration::from_millis(u64::from(lost.min(10)) * 5 + rand_ms())).await;
            self.catch_up(s).await?;
        }
        Err(DeltaError::Storage(ferry_storage::Error::Other(format!(
            "{}: lost the race for the next commit 64 times in a row; retried later",
            self.store.url(&self.table)
        ))))
    }

    /// Writes the checkpoint of snapshot `s` (`<version>.checkpoint.parquet`: its protocol,
    /// metadata, active files, the txns and tombstones still within their retention as of
    /// `now_ms`), then points `_last_checkpoint` at it. Each is written whole under its name
    /// (temp file, then rename or a single PUT); a checkpoint of a version holds the same
    /// state whoever writes it, so two writers may both write it. `_last_checkpoint` is left
    /// alone when it already names a newer checkpoint (a slower writer's older checkpoint would
    /// otherwise send readers back to replay from it); two writers that both read an older one
    /// can still race, which costs readers replayed commits, never a wrong table (they list the
    /// log from the checkpoint it names).
    pub async fn checkpoint(&self, s: &Snapshot, now_ms: i64) -> Result<()> {
        let (bytes, rows) = checkpoint::encode(s, now_ms)?;
        self.store.put_atomic(&format!("{}/{:020}.checkpoint.parquet", self.log_dir(), s.version), bytes).await?;
        let pointer = format!("{}/_last_checkpoint", self.log_dir());
        let newer = match self.store.read(&pointer).await {
            Ok(text) => serde_json::from_slice::<Value>(&text)
                .ok()
                .and_then(|v| v.get("version").and_then(Value::as_i64))
                .is_some_and(|v| v >= s.version),
            Err(e) if e.is_not_found() => false,
            Err(e) => return Err(e.into()),
        };
        if newer {
            tracing::debug!(table = %self.table, version = s.version, "checkpoint written; _last_checkpoint already names a newer one");
            return Ok(());
        }
        let last = serde_json::json!({"version": s.version, "size": rows});
        self.store.put_atomic(&pointer, last.to_string().into_bytes()).await?;
        tracing::debug!(table = %self.table, version = s.version, actions = rows, "checkpoint written");
        Ok(())
    }
}

fn rand_ms() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id() as u64);
    h.finish() % 20
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ferry_ledger::SchemaColumn;
    use serde_json::json;

    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
    }

    /// Replay knows which of Ferry's parts another writer took out: a DELETE that rewrote one
    /// (rows kept in its file), a DELETE of a whole file (none kept), an OPTIMIZE of a compacted
    /// file (each member); Ferry's own removes and a part added again are not marked.
    #[test]
    fn replay_marks_the_parts_another_writer_took_out() {
        let line = |v: Value| format!("{v}\n");
        let ferry = |op: &str| line(commit_info(op, &[], 1));
        let other = |op: &str| line(json!({"commitInfo": {"operation": op, "clientVersion": "delta-rs.0.25.1"}}));
        let add_ = |p: &str| line(json!({"add": {"path": p, "size": 10, "partitionValues": {}, "dataChange": true}}));
        let (p1, p2, p3, p4) =
            ("part-c1-0000000a.parquet", "part-c2-0000000b.parquet", "part-c3-0000000c.parquet", "part-c4-0000000d.parquet");
        let mut s = Snapshot::empty();
        s.apply(0, &(ferry("WRITE") + &add_(p1) + &add_(p2) + &add_(p3) + &add_(p4))).unwrap();
        s.apply(1, &(other("DELETE") + &line(remove(p1, 10, 2)) + &add_("part-00000-x.parquet"))).unwrap();
        s.apply(2, &(other("DELETE") + &line(remove(p2, 10, 2)))).unwrap();
        s.apply(3, &(ferry("MERGE") + &line(remove(p3, 10, 2)))).unwrap();
        let merged = json!({"add": {"path": "compact-1.parquet", "size": 10, "partitionValues": {}, "dataChange": false,
            "tags": {MEMBERS_TAG: json!([{"path": p4, "size": 10, "records": 3, "rowGroups": 1}]).to_string()}}});
        s.apply(4, &(ferry("OPTIMIZE") + &line(remove(p4, 10, 2)) + &line(merged))).unwrap();
        let mut marked: Vec<&str> = s.rewritten.keys().map(String::as_str).collect();
        marked.sort();
        assert_eq!(marked, [p1, p2], "Ferry's own remove and compaction mark nothing");
        s.apply(5, &(other("OPTIMIZE") + &line(remove("compact-1.parquet", 10, 2)) + &add_("part-00001-y.parquet"))).unwrap();
        let got: BTreeMap<&str, (i64, &str, bool)> =
            s.rewritten.iter().map(|(p, r)| (p.as_str(), (r.version, r.operation.as_str(), r.kept))).collect();
        assert_eq!(
            got,
            BTreeMap::from([
                (p1, (1, "DELETE by delta-rs.0.25.1", true)),
                (p2, (2, "DELETE by delta-rs.0.25.1", false)),
                (p4, (5, "OPTIMIZE by delta-rs.0.25.1", true)),
            ])
        );
        assert_eq!(s.rewritten_of("c1").count(), 1);
        // Added again (a revert by an operator through Ferry): in, not marked.
        s.apply(6, &(ferry("WRITE") + &add_(p2))).unwrap();
        assert!(!s.rewritten.contains_key(p2));
    }

    #[test]
    fn writers_racing_for_a_version_each_commit_once_and_replay_sees_every_file() {
        let d = tempfile::tempdir().unwrap();
        let log = DeltaLog::new(Store::from_url(&d.path().display().to_string()).unwrap(), "t");
        rt().block_on(async {
            let cols = vec![SchemaColumn { name: "a".into(), hive: "BIGINT".into(), detail: "bigint".into(), nullable: true }];
            let mut cache = None;
            let v = log
                .commit(&mut cache, |s| {
                    Ok((s.version < 0)
                        .then(|| vec![protocol_line(&protocol(&cols)), metadata_line(&metadata("id-1", "t", &cols, &[], 1).unwrap())]))
                })
                .await
                .unwrap();
            assert_eq!((cache.unwrap().version, v), (0, Some(0)));
            // Eight writers, each adding its own file unless it is in already: every one goes in
            // once, whatever the order the races are won in.
            let writers = (0..8).map(|i| {
                let log = log.clone();
                tokio::spawn(async move {
                    let path = format!("part-{i}.parquet");
                    log.commit(&mut None, |s| {
                        Ok((!s.files.contains_key(&path))
                            .then(|| vec![add(&path, &BTreeMap::new(), 10, 1, None, 2), txn(&format!("ferry:p:{i}"), 1, 2)]))
                    })
                    .await
                    .unwrap()
                })
            });
            let mut versions: Vec<i64> = futures::future::join_all(writers).await.into_iter().map(|r| r.unwrap().unwrap()).collect();
            versions.sort();
            assert_eq!(versions, (1..=8).collect::<Vec<_>>());
            let s = log.snapshot().await.unwrap();
            assert_eq!((s.version, s.files.len(), s.txns.len()), (8, 8, 8));
            // A writer that comes again finds its file in and writes nothing.
            let again = log.commit(&mut None, |s| Ok((!s.files.contains_key("part-3.parquet")).then(Vec::new))).await.unwrap();
            assert_eq!(again, None);
            // Removing takes a file out of the next snapshot; the one read before stays as it was.
            let mut after = Some(s.clone());
            log.commit(&mut after, |_| Ok(Some(vec![remove("part-3.parquet", 10, 3)]))).await.unwrap();
            assert!(!after.unwrap().files.contains_key("part-3.parquet") && s.files.contains_key("part-3.parquet"));
        });
    }

    /// Commits a new table of one bigint column `a`.
    async fn create_table(log: &DeltaLog, cache: &mut Option<Snapshot>) {
        let cols = vec![SchemaColumn { name: "a".into(), hive: "BIGINT".into(), detail: "bigint".into(), nullable: true }];
        log.commit(cache, |_| {
            Ok(Some(vec![protocol_line(&protocol(&cols)), metadata_line(&metadata("id-1", "t", &cols, &[], 1).unwrap())]))
        })
        .await
        .unwrap();
    }

    /// A log that defers its checkpoints (load's group commit) returns from the commit at a
    /// checkpoint version with no checkpoint written: it is written after, by
    /// `write_due_checkpoint`, Snappy-compressed; and the committer's own snapshot forgets the
    /// txns and tombstones past their retention as the checkpoint does, so it does not grow.
    #[test]
    fn a_deferred_checkpoint_is_written_after_the_commit_compressed_and_the_snapshot_pruned_with_it() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::from_url(&d.path().display().to_string()).unwrap();
        let log = DeltaLog::new(store, "t").deferring_checkpoints();
        let dir = d.path().join("t/_delta_log");
        let day = 86_400_000;
        rt().block_on(async {
            let mut cache = None;
            create_table(&log, &mut cache).await;
            // Commits 1..=10: each adds a file and a txn, and from the second on removes the
            // file before it; the first five are 30 days older than the last ones.
            for i in 1..=10i64 {
                let now = if i <= 5 { 1 } else { 30 * day };
                log.commit(&mut cache, |_| {
                    let mut a = vec![commit_info("WRITE", &[], now), add(&format!("f{i}.parquet"), &BTreeMap::new(), 10, 1, None, now)];
                    a.push(txn(&format!("ferry:p:{i}"), i, now));
                    if i > 1 {
                        a.push(remove(&format!("f{}.parquet", i - 1), 10, now));
                    }
                    Ok(Some(a))
                })
                .await
                .unwrap();
            }
            let checkpoint = dir.join(format!("{:020}.checkpoint.parquet", 10));
            assert!(!checkpoint.exists(), "the commit returned before its checkpoint was written");
            let s = cache.as_ref().unwrap();
            assert_eq!(s.txns.len(), 5, "txns past their retention pruned from the committer's snapshot: {:?}", s.txns.keys());
            assert_eq!(s.removed.len(), 5, "tombstones past their retention pruned: {:?}", s.removed.keys());
            log.write_due_checkpoint().await;
            let bytes = bytes::Bytes::from(std::fs::read(&checkpoint).expect("written after the commit"));
            let meta = parquet::file::metadata::ParquetMetaDataReader::new().parse_and_finish(&bytes).unwrap();
            for rg in meta.row_groups() {
                for c in rg.columns() {
                    assert_eq!(c.compression(), parquet::basic::Compression::SNAPPY, "{}", c.column_path());
                }
            }
            // Written once: a second call finds nothing due.
            let before = std::fs::metadata(&checkpoint).unwrap().modified().unwrap();
            log.write_due_checkpoint().await;
            assert_eq!(std::fs::metadata(&checkpoint).unwrap().modified().unwrap(), before);
        });
    }

    /// A vacuum's snapshot starts from the newest checkpoint that still holds every tombstone of
    /// its retention (one written no more than the table's tombstone retention after its
    /// cutoff), not from version 0, and not from a newer checkpoint that pruned some of them.
    #[test]
    fn a_vacuum_replays_from_the_newest_checkpoint_that_still_holds_its_tombstones() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::from_url(&d.path().display().to_string()).unwrap();
        let log = DeltaLog::new(store, "t");
        let dir = d.path().join("t/_delta_log");
        let day = 86_400_000;
        let now = chrono::Utc::now().timestamp_millis();
        // Commit i (1..=24) is made, and removes file i - 1, 25 - i days ago.
        let at = |i: i64| now - (25 - i) * day;
        rt().block_on(async {
            let mut cache = None;
            create_table(&log, &mut cache).await;
            for i in 1..=24i64 {
                log.commit(&mut cache, |_| {
                    let mut a = vec![commit_info("WRITE", &[], at(i)), add(&format!("f{i}.parquet"), &BTreeMap::new(), 10, 1, None, at(i))];
                    if i > 1 {
                        a.push(remove(&format!("f{}.parquet", i - 1), 10, at(i)));
                    }
                    Ok(Some(a))
                })
                .await
                .unwrap();
            }
            // The checkpoints' files as old as their commits.
            for v in [10, 20] {
                let f = std::fs::File::options().write(true).open(dir.join(format!("{v:020}.checkpoint.parquet"))).unwrap();
                f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_millis(at(v) as u64)).unwrap();
            }
            let mut whole = Snapshot::empty();
            log.catch_up(&mut whole).await.unwrap();
            // A retention of 14 days: checkpoint 20 (5 days old) dropped the tombstones of
            // commits 11 and 12 (removed 14 and 13 days ago, past its 7 days); checkpoint 10 (15
            // days old) holds every one removed since 22 days ago.
            let cutoff = now - 14 * day;
            let kept = |s: &Snapshot| -> std::collections::BTreeSet<String> {
                s.removed.iter().filter(|(_, r)| r["deletionTimestamp"].as_i64().unwrap() >= cutoff).map(|(p, _)| p.clone()).collect()
            };
            assert_eq!(kept(&whole).len(), 14);
            // Commits before checkpoint 10 are not read.
            for v in 1..10 {
                std::fs::write(dir.join(format!("{v:020}.json")), b"not JSON").unwrap();
            }
            let s = log.snapshot_for_vacuum(cutoff).await.unwrap();
            assert_eq!((s.version, s.files.keys().collect::<Vec<_>>()), (24, whole.files.keys().collect()));
            assert_eq!(kept(&s), kept(&whole), "every tombstone of the retention");
            assert!(log.snapshot().await.unwrap().removed.len() < whole.removed.len());
        });
    }

    #[test]
    fn a_checkpoint_commit_whose_reply_was_lost_moves_the_checkpoint_to_the_next_commit() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::from_url(&d.path().display().to_string()).unwrap();
        let mut log = DeltaLog::new(store, "t");
        log.lose_reply_at = Some(10);
        let dir = d.path().join("t/_delta_log");
        rt().block_on(async {
            let mut cache = None;
            create_table(&log, &mut cache).await;
            // Each commit adds its file unless the table has it (as a retry after a lost reply
            // finds its own commit and writes nothing).
            let add_file = |i: i64| {
                move |s: &Snapshot| -> Result<Option<Vec<Value>>> {
                    let rel = format!("f{i}.parquet");
                    Ok((!s.files.contains_key(&rel))
                        .then(|| vec![commit_info("WRITE", &[], 5), add(&rel, &BTreeMap::new(), 10, 1, None, 5)]))
                }
            };
            for i in 1..10 {
                log.commit(&mut cache, add_file(i)).await.unwrap();
            }
            let e = log.commit(&mut cache, add_file(10)).await.unwrap_err();
            assert!(e.to_string().contains("reply was lost"), "{e}");
            assert!(dir.join(format!("{:020}.json", 10)).exists(), "commit 10 landed");
            // The retry finds commit 10 in the table: nothing written, no checkpoint either.
            assert_eq!(log.commit(&mut cache, add_file(10)).await.unwrap(), None);
            assert!(!dir.join(format!("{:020}.checkpoint.parquet", 10)).exists());
            // The next commit writes the checkpoint the lost one missed.
            assert_eq!(log.commit(&mut cache, add_file(11)).await.unwrap(), Some(11));
            assert!(dir.join(format!("{:020}.checkpoint.parquet", 11)).exists(), "the missed checkpoint, one commit later");
            let last: Value = serde_json::from_slice(&std::fs::read(dir.join("_last_checkpoint")).unwrap()).unwrap();
            assert_eq!(last["version"], 11);
        });
    }

    #[test]
    fn a_snapshot_starts_from_the_checkpoint_last_checkpoint_names_and_reads_the_same_as_a_whole_replay() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::from_url(&d.path().display().to_string()).unwrap();
        let log = DeltaLog::new(store, "t");
        let day = 86_400_000;
        rt().block_on(async {
            let mut cache = None;
            create_table(&log, &mut cache).await;
            // 24 commits, each adding a file and removing the one before it; the first txns and
            // removes are 30 days old by the time of the last commit.
            for i in 1..=24i64 {
                let now = if i < 5 { 1 } else { 30 * day };
                let pv: BTreeMap<String, Option<String>> = [("k".to_string(), Some(format!("v{i}")))].into();
                log.commit(&mut cache, |_| {
                    let mut a = vec![
                        commit_info("WRITE", &[], now),
                        add(&format!("k=v{i}/f{i}.parquet"), &pv, 10 + i, i, Some(r#"{"numRecords":7,"minValues":{"a":-1}}"#), now),
                        txn(&format!("ferry:p:{i}"), i, now),
                    ];
                    if i % 2 == 0 {
                        a.push(remove(&format!("k=v{}/f{}.parquet", i - 1, i - 1), 9 + i, now));
                    }
                    Ok(Some(a))
                })
                .await
                .unwrap();
            }
            let mut whole = Snapshot::empty();
            log.catch_up(&mut whole).await.unwrap();
            let dir = d.path().join("t/_delta_log");
            for v in [10, 20] {
                assert!(dir.join(format!("{v:020}.checkpoint.parquet")).exists(), "checkpoint {v}");
            }
            let last = || -> serde_json::Value { serde_json::from_slice(&std::fs::read(dir.join("_last_checkpoint")).unwrap()).unwrap() };
            assert_eq!(last()["version"], 20);
            // A slower writer's checkpoint of an older version leaves the pointer where it is.
            let mut older = Snapshot::empty();
            for v in 0..=10 {
                older.apply(v, &std::fs::read_to_string(dir.join(format!("{v:020}.json"))).unwrap()).unwrap();
            }
            log.checkpoint(&older, 30 * day).await.unwrap();
            assert_eq!(last()["version"], 20, "_last_checkpoint never goes back");
            // The commits a cleanup would remove go; the snapshot starts at the checkpoint.
            for v in 0..20 {
                std::fs::remove_file(dir.join(format!("{v:020}.json"))).unwrap();
            }
            let from = log.snapshot().await.unwrap();
            assert_eq!(from.version, 24);
            assert_eq!(from.files.keys().collect::<std::collections::BTreeSet<_>>(), whole.files.keys().collect());
            for (path, a) in &whole.files {
                let b = &from.files[path];
                assert_eq!(
                    (a.size, &a.action["stats"], &a.action["partitionValues"]),
                    (b.size, &b.action["stats"], &b.action["partitionValues"])
                );
            }
            assert_eq!((from.metadata.as_ref(), from.protocol.as_ref()), (whole.metadata.as_ref(), whole.protocol.as_ref()));
            // Txns and tombstones older than their retention are not in the checkpoint.
            assert_eq!(whole.txns.len(), 24);
            assert_eq!(from.txns.len(), 24 - 4);
            assert!(from.txns.keys().all(|k| k != "ferry:p:1"));
            assert_eq!((whole.removed.len(), from.removed.len()), (12, 10), "{:?}", from.removed.keys());
            // The snapshot starts where `_last_checkpoint` points, not at the newest name in a
            // listing: a checkpoint file a writer left unfinished and never pointed to is not read.
            let junk = dir.join(format!("{:020}.checkpoint.parquet", 23));
            std::fs::write(&junk, b"not parquet").unwrap();
            assert_eq!(log.snapshot().await.unwrap().files.len(), whole.files.len());
            std::fs::remove_file(&junk).unwrap();
            // Without a checkpoint (the pointer names one that is gone: the log is listed), a log
            // that does not start at 0 cannot be read.
            for v in [10, 20] {
                std::fs::remove_file(dir.join(format!("{v:020}.checkpoint.parquet"))).unwrap();
            }
            let e = log.snapshot().await.unwrap_err().to_string();
            assert!(e.contains("starts at version 20"), "{e}");
        });
    }

    #[test]
    fn intervals_read_as_delta_writes_them() {
        assert_eq!(interval_ms("interval 7 days"), Some(7 * 86_400_000));
        assert_eq!(interval_ms("interval 1 week"), Some(7 * 86_400_000));
        assert_eq!(interval_ms("12 hours"), Some(12 * 3_600_000));
        assert_eq!(interval_ms("interval 1 fortnight"), None);
        assert_eq!(interval_ms("soon"), None);
    }
}
