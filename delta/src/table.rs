//! Ferry's Delta Lake table (`[destination] table_format = "delta"`): the `Table` seam's
//! Delta side; `ferry verify`, `ferry vacuum` and `ferry compact` are in `upkeep`.
//!
//! The chunk's parts move into the table directory under content-addressed names, where no
//! reader sees them, and one commit to the table's log adds them (see the crate's
//! opening note for the log and its commit rule). Each Hive step has its Delta counterpart:
//!
//! | Hive layout (renames)                          | Delta (one commit per chunk)                     |
//! |------------------------------------------------|--------------------------------------------------|
//! | parts renamed into the table, all or nothing   | `add` actions of every part in one commit        |
//! | a rerun's earlier output deleted               | `remove` of the chunk's other active files       |
//! | a version switched in by renames, then the     | the version's `add`s and the older versions'     |
//! | older version's files deleted                  | `remove`s in the same commit: a reader sees one  |
//! | a skipped sibling's parts moved back out       | `remove` of its active files                     |
//! | a superseded chunk's parts moved back out      | nothing is added; a commit that raced a newer    |
//! |                                                | version is followed by one that removes it       |
//!
//! Removed files stay in the directory (a reader of an older version, time travel, still
//! reads them) until a vacuum past the retention.
//!
//! Every commit is planned against the snapshot it will follow, and planned again if another
//! writer takes that version first: the files of older versions of the source file are read
//! from the snapshot (by the chunk id in their names), not from the ledger, so a commit that
//! landed and was not recorded (a crash, a lost reply) is found and counted exactly like a
//! recorded one. What a crash at each step leaves is in `ferry_delta`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use ferry_common::paths;
use ferry_ledger::{Lease, Ledger, Part, SchemaColumn};
use ferry_runtime::config::Config;
use ferry_storage::Store;
use ferry_table::{Compacted, Job, Outcome, Table, TableError, TableFailure, Vacuumed, Verified, WAIT_BRIEFLY};
use serde_json::Value;

use crate::{self as delta, Change, DeltaError, DeltaLog, Feature, Rewritten, Snapshot, chunk_of};

type LoadError = TableError;
type LoadFailure = TableFailure;

/// A Delta table: its log, and the newest snapshot this process has read of it.
pub struct DeltaTable {
    cfg: Config,
    ledger: Ledger,
    log: DeltaLog,
    /// Commits of this process go one at a time (they would race for the same version
    /// anyway), each from the snapshot the one before it left. Whoever holds it commits every
    /// plan queued meanwhile (see [`DeltaTable::commit_plan`]).
    snapshot: tokio::sync::Mutex<Option<Snapshot>>,
    /// Chunks' plans waiting for the next commit.
    queue: std::sync::Mutex<Vec<Queued>>,
    /// The parts compacted files hold, as of the snapshot version it names: what a chunk reads
    /// while a commit holds the snapshot (see [`DeltaTable::members_now`]).
    members_seen: std::sync::Mutex<Option<(i64, Arc<HashSet<String>>)>>,
}

impl DeltaTable {
    pub fn new(cfg: Config, ledger: Ledger, dest: Store) -> DeltaTable {
        let log = DeltaLog::new(dest, &cfg.table.name).deferring_checkpoints();
        DeltaTable {
            cfg,
            ledger,
            log,
            snapshot: tokio::sync::Mutex::new(None),
            queue: Default::default(),
            members_seen: Default::default(),
        }
    }
}

/// One chunk's plan waiting for a commit, and where its answer goes.
struct Queued {
    plan: Arc<Plan>,
    confirmed: Option<Txns>,
    /// A commit of several plans failed: this one goes in a commit of its own, so the error it
    /// meets is its own.
    alone: bool,
    answer: tokio::sync::oneshot::Sender<Answer>,
}

/// What became of a queued plan.
enum Answer {
    /// Planned against a snapshot and written in that commit (the version), or nothing of it
    /// was to be written (None); with what planning found.
    Done(Option<i64>, Found),
    /// Its plan refused the commit, or its own commit failed.
    Failed(DeltaError),
    /// The commit it was in failed with others' plans: queue it again, alone.
    Alone,
}

/// A protocol or metaData action: a commit holds one of each at most.
fn is_table_action(a: &Value) -> bool {
    a.get("protocol").is_some() || a.get("metaData").is_some()
}

/// A protocol or metaData action without what differs between two plans that change the table
/// the same way (a new table's id and creation time).
fn same_table(a: &Value) -> Value {
    let mut a = a.clone();
    if let Some(m) = a.get_mut("metaData").and_then(Value::as_object_mut) {
        m.remove("id");
        m.remove("createdTime");
    }
    a
}

/// Whether two plans may share a commit, each planned against the same snapshot: they carry
/// no common chunk (each chunk's `txn` and parts appear once), and if they are of the same
/// source file, they are chunks of one version that replaces none (one's files are never what
/// the other takes out or is superseded by).
fn independent(a: &Plan, b: &Plan) -> bool {
    let chunks = |p: &Plan| -> HashSet<String> { p.chunks.iter().chain(&p.skipped).cloned().collect() };
    if !chunks(a).is_disjoint(&chunks(b)) {
        return false;
    }
    match (&a.version, &b.version) {
        (Some((va, all_a)), Some((vb, all_b))) if all_a.keys().any(|c| all_b.contains_key(c)) => va == vb && !a.replaces && !b.replaces,
        _ => true,
    }
}

/// How many times a commit confirms its lease because other commits carried its chunks
/// meanwhile, before it waits and tries again later.
const CONFIRM_ROUNDS: usize = 5;

/// A store's error keeps its class; what the log or the schema refuses is the chunk's.
fn table_error(e: DeltaError) -> LoadError {
    match e {
        DeltaError::Storage(e) => e.into(),
        other => LoadError::Stage(LoadFailure::Table(other.to_string())),
    }
}

pub(crate) use ferry_table::part_rel;

/// What one chunk's commit is to bring about, fixed before the log is read.
struct Plan {
    /// Every part going in (the chunk's, and in a version switch its siblings'), by table path.
    parts: Vec<(String, Part)>,
    /// Of those, the ones not placed in the directory: a merged file held them when load
    /// looked (their own file may be vacuumed since), so they cannot be added.
    held: HashSet<String>,
    /// The chunks whose parts these are.
    chunks: HashSet<String>,
    /// The source file's version, with every chunk of every version of it (versions = replace).
    version: Option<(i64, HashMap<String, i64>)>,
    /// Siblings an operator skipped: their files must not stay in the table.
    skipped: HashSet<String>,
    /// This version replaces an older one: the older one's files go in the same commit.
    replaces: bool,
    /// Rows of the plan's chunks, its skipped siblings or older versions were in the table
    /// before (a rerun, a retry after the record, a switch): another writer may have rewritten
    /// them, and a snapshot read from a checkpoint must learn who removed what first.
    was_in: bool,
    columns: Vec<SchemaColumn>,
    partition_by: Vec<String>,
    table: String,
    epoch: i64,
    pipeline: String,
    now_ms: i64,
}

/// The `txn` version each chunk of a plan has in a snapshot (None: no commit carried one).
type Txns = HashMap<String, Option<i64>>;

/// What planning found, besides the actions.
#[derive(Debug, Default)]
struct Found {
    /// A commit carried a chunk of this plan since this load last confirmed its lease (or it
    /// never did): the lease is confirmed with the ledger, then the plan made again. Written
    /// is nothing until then: the other commit may be a newer load of the chunk, and this one
    /// a load paused past its lease (a zombie), whose commit would undo the newer one's.
    confirm: Option<Txns>,
    /// A newer version of the source file is in the table: this chunk must not be.
    superseded: bool,
    /// A part to add was not placed (a merged file held it when load looked, and no longer).
    unplaced: bool,
    /// Parts of this plan another writer took out (a retry or a rerun of the same bytes):
    /// counted in as that writer left them, not added again.
    rewritten: Vec<String>,
}

impl Plan {
    /// Every chunk whose files the plan may add or take out: a snapshot read from a
    /// checkpoint learns who removed theirs before the plan is made (see `DeltaLog::trace`).
    fn touched(&self) -> impl Iterator<Item = &str> {
        self.chunks.iter().chain(&self.skipped).chain(self.version.iter().flat_map(|(_, all)| all.keys())).map(String::as_str)
    }

    /// The commit's actions against snapshot `s` and the parts it takes out, or None when there
    /// is nothing to write: every part is in and nothing is to go (a retry after a commit that
    /// landed).
    fn actions(&self, s: &Snapshot, confirmed: Option<&Txns>, found: &mut Found) -> Result<Option<Change>, DeltaError> {
        let txns: Txns = self.chunks.iter().map(|c| (c.to_string(), s.txns.get(&self.app_id(c)).map(|t| t.version))).collect();
        if txns.values().any(Option::is_some) && confirmed != Some(&txns) {
            found.confirm = Some(txns);
            return Ok(None);
        }
        let version_of = |rel: &str| self.version.as_ref().and_then(|(_, all)| all.get(chunk_of(rel)?).copied());
        if let Some((mine, _)) = &self.version {
            found.superseded = s.parts().any(|(f, _, _)| version_of(f).is_some_and(|v| v > *mine));
            if found.superseded {
                return Ok(None);
            }
        }
        // A part counts as in whether its own file is active or a compacted file holds it, or
        // another writer took it out after it was in (its rows are that writer's now).
        type Planned<'p> = Vec<&'p (String, Part)>;
        let (theirs, adds): (Planned, Planned) =
            self.parts.iter().filter(|(rel, _)| !s.has_part(rel)).partition(|(rel, _)| s.rewritten.contains_key(rel));
        if adds.iter().any(|(rel, _)| self.held.contains(rel)) {
            found.unplaced = true;
            return Ok(None);
        }
        let wanted: HashSet<&str> = self.parts.iter().map(|(rel, _)| rel.as_str()).collect();
        self.check_rewrites(s, &adds, &wanted, &version_of)?;
        found.rewritten = theirs.iter().map(|(rel, _)| rel.clone()).collect();
        let mut drop: Vec<String> = s
            .parts()
            .map(|(f, _, _)| f)
            .filter(|f| !wanted.contains(f))
            .filter(|f| {
                let Some(c) = chunk_of(f) else { return false };
                // Earlier output of these chunks (a rerun), a skipped sibling's parts, and, in
                // a switch, every file of an older version.
                self.chunks.contains(c)
                    || self.skipped.contains(c)
                    || (self.replaces && version_of(f).zip(self.version.as_ref()).is_some_and(|(v, (mine, _))| v < *mine))
            })
            .map(str::to_string)
            .collect();
        drop.sort();
        let metadata = self.metadata_change(s)?;
        if adds.is_empty() && drop.is_empty() && metadata.is_none() {
            return Ok(None);
        }
        let mut chunks: Vec<&str> = self.chunks.iter().map(String::as_str).collect();
        chunks.sort();
        let op = if drop.is_empty() { "WRITE" } else { "MERGE" };
        let mut actions = vec![delta::commit_info(op, &chunks, self.now_ms)];
        actions.extend(self.protocol_change(s));
        actions.extend(metadata);
        for (rel, p) in adds {
            actions.push(delta::add(
                rel,
                &delta::partition_values(&p.partition, &self.columns),
                p.bytes,
                p.records,
                p.stats.as_deref(),
                self.now_ms,
            ));
        }
        // Each chunk's txn version only grows: this lease's epoch, or one past the last one
        // (a sibling carried by another chunk's switch, a chunk whose tasks were pruned and
        // made again start their epochs lower).
        for c in chunks {
            let app = self.app_id(c);
            let version = s.txns.get(&app).map_or(self.epoch, |t| self.epoch.max(t.version + 1));
            actions.push(delta::txn(&app, version, self.now_ms));
        }
        Ok(Some(Change { actions, drop }))
    }

    /// Refuses a commit that would undo or double what another writer did to Ferry's parts
    /// (see [`Rewritten`]): new bytes for a chunk some of whose parts it took out (the rows it
    /// deleted would come back), or taking out a chunk whose rows may be in its files (a
    /// rerun's earlier output, a skipped sibling, an older version in a switch: Ferry would
    /// leave those rows beside the new ones). Nothing is written; the message names the commit.
    fn check_rewrites(
        &self,
        s: &Snapshot,
        adds: &[&(String, Part)],
        wanted: &HashSet<&str>,
        version_of: &dyn Fn(&str) -> Option<i64>,
    ) -> Result<(), DeltaError> {
        let refuse = |chunk: &str, part: &str, r: &Rewritten, what: &str| Err(rewritten_refusal(&self.table, chunk, part, r, what));
        for c in &self.chunks {
            let new = adds.iter().any(|(rel, _)| chunk_of(rel) == Some(c.as_str()));
            for (part, r) in s.rewritten_of(c) {
                if new {
                    return refuse(c, part, r, "loading other bytes for that chunk (a rerun or a corrected file)");
                }
                if r.kept && !wanted.contains(part) {
                    return refuse(c, part, r, "taking the chunk's earlier output out");
                }
            }
        }
        for c in &self.skipped {
            if let Some((part, r)) = s.rewritten_of(c).find(|(_, r)| r.kept) {
                return refuse(c, part, r, "taking the skipped chunk's rows out");
            }
        }
        if let Some((mine, _)) = self.version.as_ref().filter(|_| self.replaces) {
            let older = s.rewritten.iter().filter(|(p, r)| r.kept && version_of(p).is_some_and(|v| v < *mine));
            if let Some((part, r)) = older.min_by_key(|(p, _)| p.as_str()) {
                let c = chunk_of(part).unwrap_or_default();
                return refuse(c, part, r, "switching its source file to a newer version");
            }
        }
        Ok(())
    }

    /// The `txn` app id of a chunk of this pipeline.
    fn app_id(&self, chunk: &str) -> String {
        format!("ferry:{}:{chunk}", self.pipeline)
    }

    /// The protocol action this commit needs: the table's first, or an upgrade a new column's
    /// type asks for (timestamp_ntz: the `timestampNtz` table feature). An upgrade keeps
    /// every feature the table has and adds only that one.
    fn protocol_change(&self, s: &Snapshot) -> Option<Value> {
        let Some(current) = &s.protocol else {
            return Some(delta::protocol_line(&delta::protocol(&self.columns)));
        };
        if !self.columns.iter().any(|c| c.detail.contains("timestamp_ntz")) || current.has(&Feature::TimestampNtz) {
            return None;
        }
        Some(delta::protocol_line(&current.with(Feature::TimestampNtz)))
    }

    /// The metaData action this commit needs: the table's first, or the current one with only
    /// its schema changed (new nullable columns appended, a column that may now be null). Every
    /// other part of the current metaData (properties, description, column comments and
    /// metadata, whoever set them) is carried over as it is; schemas are compared parsed, so
    /// another writer's key order or spacing is no change. A change Delta readers would take
    /// only with table features Ferry does not write (a column's type widened) is refused, and
    /// so is a `partition_by` other than the table's partition columns.
    fn metadata_change(&self, s: &Snapshot) -> Result<Option<Value>, DeltaError> {
        let Some(current) = s.metadata.as_ref() else {
            let id = table_id(&self.pipeline, &self.table, self.now_ms);
            return delta::metadata(&id, &self.table, &self.columns, &self.partition_by, self.now_ms)
                .map(|m| Some(delta::metadata_line(&m)));
        };
        let partitioned = s.partition_columns();
        if partitioned != self.partition_by {
            return Err(DeltaError::Schema(format!(
                "Delta table {} is partitioned by {partitioned:?}, [table] partition_by says {:?}: a Delta table keeps its \
                 partition columns; set partition_by to the table's, or load into a new table",
                self.table, self.partition_by
            )));
        }
        let mut schema = current.schema().map_err(|e| DeltaError::Log(format!("Delta table {}: {e}", self.table)))?;
        let Some(fields) = schema.get_mut("fields").and_then(Value::as_array_mut) else {
            return Err(DeltaError::Log(format!("Delta table {}: its schemaString has no fields", self.table)));
        };
        let mut changed = false;
        for c in &self.columns {
            let ty = delta::delta_type(&c.detail)?;
            let name = |f: &Value| f.get("name").and_then(Value::as_str).map(str::to_string).unwrap_or_default();
            match fields.iter_mut().find(|f| name(f).eq_ignore_ascii_case(&c.name)) {
                Some(f) if name(f) != c.name => {
                    return Err(DeltaError::Schema(format!(
                        "column {:?} is {:?} in Delta table {}: Delta column names are case-insensitive, so the two would clash",
                        c.name,
                        name(f),
                        self.table
                    )));
                }
                Some(f) => {
                    let have = f.get("type").cloned().unwrap_or(Value::Null);
                    if without_metadata(&have) != without_metadata(&ty) {
                        return Err(DeltaError::Schema(format!(
                            "column {:?} changes type from {have} to {ty}: a Delta reader takes that only with the typeWidening \
                             table feature, which Ferry does not write; widen it in the source's first version, or use \
                             destination.table_format = \"hive\"",
                            c.name
                        )));
                    }
                    // A column that may now be null; one the table allows nulls in stays so.
                    if c.nullable && f.get("nullable").and_then(Value::as_bool) == Some(false) {
                        f["nullable"] = Value::Bool(true);
                        changed = true;
                    }
                }
                // A column the table lacks: appended, nullable (the table's files so far
                // read it as null).
                None if c.nullable => {
                    fields.push(serde_json::json!({"name": c.name, "type": ty, "nullable": true, "metadata": {}}));
                    changed = true;
                }
                None => {
                    return Err(DeltaError::Schema(format!(
                        "new column {:?} is required: a Delta table gains nullable columns only",
                        c.name
                    )));
                }
            }
        }
        // A column of the table that Ferry's schema lacks (another writer's, or one an older
        // chunk's narrower schema leaves out) stays: Ferry's files read it as null.
        if !changed {
            return Ok(None);
        }
        let mut m = current.clone();
        m.schema_string = schema.to_string();
        Ok(Some(delta::metadata_line(&m)))
    }
}

/// Why a commit that would undo or double another writer's rewrite of part `part` is refused.
fn rewritten_refusal(table: &str, chunk: &str, part: &str, r: &Rewritten, what: &str) -> DeltaError {
    DeltaError::Refused(format!(
        "Delta table {table}: part {part} of chunk {chunk} was rewritten by another writer's commit {} ({}); its rows are that \
         writer's now and Ferry cannot tell them apart in its files, so {what} is refused (nothing written). Skip the chunks \
         this refuses (ferry skip --chunk) to leave the table as that writer left it",
        r.version, r.operation
    ))
}

/// Reads who removed the parts a checkpoint names as removed (or, past their retention, no
/// longer names) before a superseded chunk's files are taken out: a rare path.
async fn trace_removers(table: &DeltaTable) -> Result<(), LoadError> {
    let mut cached = table.snapshot.lock().await;
    if let Some(s) = cached.as_mut()
        && s.unknown_removers()
    {
        table.log.trace(s).await.map_err(table_error)?;
    }
    Ok(())
}

/// A Delta type with the `metadata` of its nested fields left out (comments and such that
/// another writer keeps there are not part of the type).
fn without_metadata(ty: &Value) -> Value {
    match ty {
        Value::Object(o) => {
            Value::Object(o.iter().filter(|(k, _)| k.as_str() != "metadata").map(|(k, v)| (k.clone(), without_metadata(v))).collect())
        }
        Value::Array(a) => Value::Array(a.iter().map(without_metadata).collect()),
        other => other.clone(),
    }
}

/// A table id that stays the table's for life (the first commit's metaData).
fn table_id(pipeline: &str, table: &str, now_ms: i64) -> String {
    let h = blake3::hash(format!("{pipeline}/{table}/{now_ms}/{}", std::process::id()).as_bytes()).to_hex();
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

impl DeltaTable {
    /// Publishes one chunk into a Delta table: its parts into the directory, then one commit.
    async fn publish_chunk(&self, job: &Job<'_>) -> Result<Outcome, LoadError> {
        let Job { lease, dest, parts, moving, siblings: _, version } = *job;
        let table = self;
        let name = &self.cfg.table.name;
        let replace = version.is_some();
        // Into the directory, under names no reader looks at until the commit adds them; not
        // the parts a merged file holds (`ferry compact`): they are in, and their own files
        // may be gone with a vacuum.
        let held: HashSet<String> = {
            let members = self.members_now().await.map_err(table_error)?;
            moving.iter().map(part_rel).filter(|rel| members.contains(rel)).collect()
        };
        for p in moving.iter().filter(|p| !held.contains(&part_rel(p))) {
            self.place(dest, p).await?;
        }
        let columns = match self.ledger.table_schemas(name).await?.pop() {
            Some(v) => v.columns,
            None => return Err(LoadError::Stage(LoadFailure::Table(format!("no schema of table {name} is recorded")))),
        };
        let every_version = match version {
            Some(v) => Some((v.version, self.ledger.chunks_of_every_version(&lease.chunk_id).await?.into_iter().collect())),
            None => None,
        };
        let skipped: HashSet<String> = version
            .as_ref()
            .filter(|v| v.replaces)
            .map(|v| v.chunks.iter().filter(|c| c.skipped).map(|c| c.id.clone()).collect())
            .unwrap_or_default();
        let mut was_in = version.is_some_and(|v| v.replaces) || !skipped.is_empty();
        for c in moving.iter().map(|p| p.chunk_id.as_str()).chain([lease.chunk_id.as_str()]).collect::<HashSet<_>>() {
            if was_in {
                break;
            }
            was_in = !self.ledger.published_of(c).await?.is_empty();
        }
        let plan = Arc::new(Plan {
            parts: moving.iter().map(|p| (part_rel(p), p.clone())).collect(),
            held,
            chunks: moving.iter().map(|p| p.chunk_id.clone()).chain([lease.chunk_id.clone()]).collect(),
            version: every_version,
            skipped,
            replaces: version.as_ref().is_some_and(|v| v.replaces),
            was_in,
            columns,
            partition_by: self.cfg.table.partition_by.clone(),
            table: name.clone(),
            epoch: lease.epoch,
            pipeline: self.cfg.pipeline.clone(),
            now_ms: self.ledger.now_ms(),
        });
        let kill_after_commit = commit_gate().await;
        let mut confirmed: Option<Txns> = None;
        let mut rounds = 0;
        let (committed, found) = loop {
            let (committed, mut found) = self.commit_plan(&plan, confirmed.take()).await.map_err(table_error)?;
            let Some(txns) = found.confirm.take() else { break (committed, found) };
            // The fence: a load whose lease another claim took fails here (LeaseLost) and
            // writes nothing. The ledger's answer holds for the snapshot it was asked about; a
            // commit of these chunks after it asks again.
            rounds += 1;
            if rounds > CONFIRM_ROUNDS {
                return Err(LoadError::Stage(LoadFailure::Waiting {
                    reason: "other commits keep carrying this chunk; trying again later".into(),
                    after: WAIT_BRIEFLY,
                }));
            }
            self.ledger.heartbeat(lease).await?;
            confirmed = Some(txns);
        };
        if kill_after_commit {
            ferry_common::crash::kill_now("after the commit (FERRY_TEST_DELTA_COMMIT_GATE)");
        }
        if found.unplaced {
            return Err(LoadError::Stage(LoadFailure::Waiting {
                reason: "a merged file that held some of its parts was rewritten meanwhile; placing them again".into(),
                after: WAIT_BRIEFLY,
            }));
        }
        if found.superseded {
            tracing::info!(chunk = %lease.chunk_id, "a newer version of its source file is in the table; not added");
            if self.withdraw_chunk(dest, lease).await? {
                return Ok(Outcome::Superseded);
            }
            return Err(LoadError::Stage(LoadFailure::Waiting {
                reason: "the table holds a newer version of the source file, the ledger does not yet".into(),
                after: WAIT_BRIEFLY,
            }));
        }
        if let Some(v) = committed {
            tracing::debug!(chunk = %lease.chunk_id, table_version = v, parts = moving.len(), "committed to the Delta log");
        }
        if !found.rewritten.is_empty() {
            tracing::warn!(
                chunk = %lease.chunk_id,
                parts = %found.rewritten.join(" "),
                "another writer took these parts out of the table after they were in; counted in as it left them, not added again"
            );
        }
        // The version that made the chunk whole in the table: this commit's, or, on a retry
        // after a commit that landed unrecorded, the one the snapshot says added its files.
        let table_version = {
            let cached = table.snapshot.lock().await;
            cached.as_ref().and_then(|s| parts.iter().filter_map(|p| s.part_added_in(&part_rel(p))).max())
        };
        let published: Vec<(String, Part)> = parts.iter().map(|p| (paths::table_file(name, &part_rel(p)), p.clone())).collect();
        let recorded = self.ledger.record_published(lease, name, &published, replace, table_version).await?;
        // The landed copies of parts a merged file held are not needed once the ledger
        // answered (until then they were what a retry would place if the merged file changed).
        for p in moving.iter().filter(|p| plan.held.contains(&part_rel(p))) {
            let landed = paths::landed(name, &p.chunk_id, &p.rel_path());
            if let Err(e) = dest.delete(&landed).await
                && !e.is_not_found()
            {
                tracing::debug!(file = %dest.url(&landed), error = %e, "cannot remove a landed file now; gc will");
            }
        }
        if !recorded {
            // A newer version went in between this chunk's look at the ledger and its commit:
            // its files go back out of the table in a commit of their own.
            tracing::info!(chunk = %lease.chunk_id, "a newer version of its source file was published meanwhile; taking it back out");
            let mine: Vec<String> = published.iter().map(|(_, p)| part_rel(p)).collect();
            let now_ms = self.ledger.now_ms();
            {
                let mut cached = table.snapshot.lock().await;
                table
                    .log
                    .commit_parts(&mut cached, now_ms, |s| {
                        if let Some((part, r)) = s.rewritten_of(&lease.chunk_id).find(|(_, r)| r.kept) {
                            return Err(rewritten_refusal(name, &lease.chunk_id, part, r, "taking the superseded chunk's rows out"));
                        }
                        let drop: Vec<String> = mine.iter().filter(|f| s.has_part(f)).cloned().collect();
                        let chunk = [lease.chunk_id.as_str()];
                        Ok((!drop.is_empty()).then(|| Change { actions: vec![delta::commit_info("DELETE", &chunk, now_ms)], drop }))
                    })
                    .await
                    .map_err(table_error)?;
            }
            self.log.write_due_checkpoint().await;
            return Ok(Outcome::Superseded);
        }
        if let Some(v) = version {
            // The older versions' files left the table in the commit; their rows go now.
            let old: Vec<String> = self.ledger.older_versions_published(&lease.chunk_id).await?.into_iter().map(|(p, _)| p).collect();
            if !old.is_empty() {
                self.ledger.retract_published(&v.uri, &old).await?;
            }
        }
        Ok(Outcome::Published)
    }

    /// Commits `plan` (with its lease confirmed for `confirmed`), together with the plans
    /// other chunks of this process queued meanwhile: group commit. On HDFS a commit costs
    /// a file's close wait (~0.5 s) whatever it holds, so chunks that are ready together go in
    /// one version, one `txn` each. The task that gets the log's lock commits every queued
    /// plan and answers each; a plan that cannot share that commit (it touches a chunk or a
    /// source file of another plan in it, or changes the table's schema beside another such
    /// plan) waits for the next one. Each plan is judged on its own (its refusal, its
    /// confirmation, its supersession are its own); a failed commit of several plans is
    /// tried again by each of them alone, so no chunk fails for another's error.
    async fn commit_plan(&self, plan: &Arc<Plan>, confirmed: Option<Txns>) -> Result<(Option<i64>, Found), DeltaError> {
        let mut alone = false;
        loop {
            let (answer, mut rx) = tokio::sync::oneshot::channel();
            self.lock_queue().push(Queued { plan: plan.clone(), confirmed: confirmed.clone(), alone, answer });
            group_gate_queued(plan);
            // An answer dropped unsent (a committer that panicked) is taken as "alone".
            let answered = |rx: &mut tokio::sync::oneshot::Receiver<Answer>| match rx.try_recv() {
                Ok(reply) => Some(reply),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => None,
                Err(tokio::sync::oneshot::error::TryRecvError::Closed) => Some(Answer::Alone),
            };
            let reply = loop {
                let mut cached = self.snapshot.lock().await;
                // Another task's commit took this plan while this one waited for the lock.
                if let Some(reply) = answered(&mut rx) {
                    break reply;
                }
                self.commit_queued(&mut cached).await;
                drop(cached);
                if let Some(reply) = answered(&mut rx) {
                    break reply;
                }
                // Left queued for the next commit: take the lock again.
            };
            self.log.write_due_checkpoint().await;
            match reply {
                Answer::Done(version, found) => return Ok((version, found)),
                Answer::Failed(e) => return Err(e),
                Answer::Alone => alone = true,
            }
        }
    }

    /// The parts compacted files hold (a chunk's part held by one is not placed again): read
    /// from the log when no commit holds the snapshot; while one does, as the last look left
    /// them, rather than wait for its close. A stale answer is safe: a part compacted since is
    /// placed needlessly (its name is in the table already, or becomes a file no version names,
    /// for vacuum), and one no longer held is found unplaced at planning, and placed on retry.
    async fn members_now(&self) -> Result<Arc<HashSet<String>>, DeltaError> {
        let seen = || self.members_seen.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|(_, m)| m.clone());
        let mut cached = match self.snapshot.try_lock() {
            Ok(cached) => cached,
            Err(_) => match seen() {
                Some(members) => return Ok(members),
                None => self.snapshot.lock().await,
            },
        };
        match cached.as_mut() {
            Some(s) => self.log.catch_up(s).await?,
            None => *cached = Some(self.log.snapshot().await?),
        }
        Ok(self.remember_members(cached.as_ref().expect("read above")))
    }

    fn remember_members(&self, s: &Snapshot) -> Arc<HashSet<String>> {
        let mut seen = self.members_seen.lock().unwrap_or_else(|e| e.into_inner());
        match &*seen {
            Some((version, members)) if *version == s.version => members.clone(),
            _ => {
                let members: Arc<HashSet<String>> = Arc::new(s.members.keys().cloned().collect());
                *seen = Some((s.version, members.clone()));
                members
            }
        }
    }

    /// The snapshot read if none is, and traced if a chunk of `batch` has a tombstone whose
    /// writer it does not know. Not caught up here: the commit does that before it plans, and
    /// commits it replays name their writers.
    async fn prepare(&self, cached: &mut Option<Snapshot>, batch: &[Queued]) -> Result<(), DeltaError> {
        if cached.is_none() {
            *cached = Some(self.log.snapshot().await?);
        }
        let s = cached.as_mut().expect("read above");
        let touched: HashSet<&str> = batch.iter().flat_map(|q| q.plan.touched()).collect();
        if s.needs_trace(&touched) || (s.unknown_removers() && batch.iter().any(|q| q.plan.was_in)) {
            self.log.trace(s).await?;
        }
        Ok(())
    }

    fn lock_queue(&self) -> std::sync::MutexGuard<'_, Vec<Queued>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One commit of the plans queued now (the caller holds the log's lock): every one taken
    /// is answered, or put back in the queue for the next commit.
    async fn commit_queued(&self, cached: &mut Option<Snapshot>) {
        group_gate().await;
        let mut batch: Vec<Queued> = Vec::new();
        {
            let mut queue = self.lock_queue();
            // A plan that must go alone goes first and by itself.
            match queue.iter().position(|q| q.alone) {
                Some(i) => batch.push(queue.remove(i)),
                None => batch.append(&mut queue),
            }
        }
        // A plan whose load was cut off (its deadline) is not committed for it: its retry plans again.
        batch.retain(|q| !q.answer.is_closed());
        if batch.is_empty() {
            return;
        }
        let n = batch.len();
        if let Err(e) = self.prepare(cached, &batch).await {
            // Alone, each plan meets the error itself (its class is its own to keep).
            if n == 1 {
                let q = batch.pop().expect("one");
                let _ = q.answer.send(Answer::Failed(e));
            } else {
                for q in batch {
                    let _ = q.answer.send(Answer::Alone);
                }
            }
            return;
        }
        let now_ms = self.ledger.now_ms();
        // What each plan came to against the snapshot the commit was planned on (made again
        // if another writer takes the version first).
        let mut results: Vec<Option<Result<Found, DeltaError>>> = Vec::new();
        let mut taken: Vec<bool> = Vec::new();
        let mut deferred: Vec<bool> = Vec::new();
        let committed = self
            .log
            .commit_parts(cached, now_ms, |s| {
                results = (0..n).map(|_| None).collect();
                taken = vec![false; n];
                deferred = vec![false; n];
                let mut actions: Vec<Value> = Vec::new();
                let mut drop: Vec<String> = Vec::new();
                let mut chunks: Vec<String> = Vec::new();
                let mut schema_change: Option<Vec<Value>> = None;
                let mut schema_written = false;
                let mut included: Vec<usize> = Vec::new();
                for (i, q) in batch.iter().enumerate() {
                    // Its load was cut off since (its lease lost, its deadline): not written for it.
                    if q.answer.is_closed() {
                        continue;
                    }
                    if included.iter().any(|&j| !independent(&batch[j].plan, &q.plan)) {
                        deferred[i] = true;
                        continue;
                    }
                    let mut found = Found::default();
                    let change = match q.plan.actions(s, q.confirmed.as_ref(), &mut found) {
                        Ok(Some(change)) => change,
                        Ok(None) => {
                            results[i] = Some(Ok(found));
                            continue;
                        }
                        Err(e) => {
                            results[i] = Some(Err(e));
                            continue;
                        }
                    };
                    let table_actions: Vec<Value> = change.actions.iter().filter(|a| is_table_action(a)).map(same_table).collect();
                    if !table_actions.is_empty() {
                        match &schema_change {
                            // The same protocol and metadata (two chunks of a new table, or
                            // both adding the same column): the first plan's stand for both.
                            Some(first) if *first == table_actions => {}
                            Some(_) => {
                                deferred[i] = true;
                                continue;
                            }
                            None => schema_change = Some(table_actions),
                        }
                    }
                    let first_schema = schema_change.is_some() && !schema_written;
                    schema_written |= first_schema;
                    // One commitInfo for the commit, naming every chunk in it; one protocol
                    // and metaData at most.
                    actions.extend(
                        change.actions.into_iter().filter(|a| a.get("commitInfo").is_none() && (first_schema || !is_table_action(a))),
                    );
                    drop.extend(change.drop);
                    chunks.extend(q.plan.chunks.iter().cloned());
                    results[i] = Some(Ok(found));
                    taken[i] = true;
                    included.push(i);
                }
                if included.is_empty() {
                    return Ok(None);
                }
                chunks.sort();
                let names: Vec<&str> = chunks.iter().map(String::as_str).collect();
                let op = if drop.is_empty() { "WRITE" } else { "MERGE" };
                actions.insert(0, delta::commit_info(op, &names, now_ms));
                drop.sort();
                Ok(Some(Change { actions, drop }))
            })
            .await;
        let mut requeue = Vec::new();
        match committed {
            Ok(version) => {
                for (i, q) in batch.into_iter().enumerate() {
                    if deferred[i] {
                        requeue.push(q);
                        continue;
                    }
                    let answer = match results[i].take() {
                        Some(Ok(found)) => Answer::Done(version.filter(|_| taken[i]), found),
                        Some(Err(e)) => Answer::Failed(e),
                        None => Answer::Failed(DeltaError::Log("a queued plan was not looked at".into())),
                    };
                    let _ = q.answer.send(answer);
                }
                if n > 1 {
                    tracing::debug!(table = %self.cfg.table.name, ?version, plans = n, "group commit");
                }
            }
            Err(e) if n == 1 => {
                let q = batch.pop().expect("one");
                let _ = q.answer.send(Answer::Failed(e));
            }
            Err(e) => {
                tracing::debug!(table = %self.cfg.table.name, plans = n, error = %e, "a group commit failed; each plan commits alone");
                for q in batch {
                    let _ = q.answer.send(Answer::Alone);
                }
            }
        }
        if let Some(s) = cached.as_ref() {
            self.remember_members(s);
        }
        self.lock_queue().extend(requeue);
    }

    /// Moves a part's landed file to its name in the table directory (where no reader looks
    /// until a commit adds it); a retry finds it there already.
    async fn place(&self, dest: &Store, p: &Part) -> Result<(), LoadError> {
        ferry_table::place(dest, &self.cfg.table.name, p).await
    }

    /// A superseded chunk of a Delta table: recorded as withdrawn, its files taken out of the
    /// table, its landed files removed. A file of the chunk still active was added by a commit
    /// of this chunk that came after the newer version's switch (which removes every file of
    /// older versions it sees): the chunk looked before the switch was recorded and committed
    /// after it, and was stopped before the commit that takes its files back out, or the newer
    /// version has no rows and so nothing in the table told the commit it was superseded. The
    /// removal is its own commit, made after the withdrawal is recorded (and durable), so a
    /// revert of these bytes, which waits for the withdrawal, finds them out of the table. The
    /// removed files stay in the directory for readers of older table versions until a vacuum.
    async fn withdraw_chunk(&self, dest: &Store, lease: &Lease) -> Result<bool, LoadError> {
        let table = self;
        let chunk = lease.chunk_id.as_str();
        let Some(newer) = self.ledger.begin_withdrawal(lease).await? else { return Ok(false) };
        tracing::info!(chunk, newer_version = newer, "withdrawing: a newer version of its source file is in the table");
        ferry_table::withdraw_gate().await;
        self.ledger.make_durable().await?;
        let now_ms = self.ledger.now_ms();
        trace_removers(table).await?;
        let name = &self.cfg.table.name;
        let removed = {
            let mut cached = table.snapshot.lock().await;
            table
                .log
                .commit_parts(&mut cached, now_ms, |s| {
                    if let Some((part, r)) = s.rewritten_of(chunk).find(|(_, r)| r.kept) {
                        return Err(rewritten_refusal(name, chunk, part, r, "taking the superseded chunk's rows out"));
                    }
                    let drop: Vec<String> =
                        s.parts().map(|(f, _, _)| f).filter(|f| chunk_of(f) == Some(chunk)).map(str::to_string).collect();
                    Ok((!drop.is_empty()).then(|| Change { actions: vec![delta::commit_info("DELETE", &[chunk], now_ms)], drop }))
                })
                .await
                .map_err(table_error)?
        };
        self.log.write_due_checkpoint().await;
        if let Some(v) = removed {
            tracing::info!(chunk, table_version = v, "took the superseded chunk's files out of the table");
        }
        ferry_table::remove_landed(&self.ledger, dest, name, chunk).await?;
        Ok(true)
    }
}

#[async_trait::async_trait]
impl Table for DeltaTable {
    fn format(&self) -> &'static str {
        "delta"
    }

    fn store(&self) -> &Store {
        self.log.store()
    }

    fn meta_dirs(&self) -> Vec<String> {
        let name = &self.cfg.table.name;
        vec![paths::table_meta(name), paths::delta_log(name)]
    }

    async fn publish(&self, job: &Job<'_>) -> Result<Outcome, TableError> {
        self.publish_chunk(job).await
    }

    async fn withdraw(&self, dest: &Store, lease: &Lease) -> Result<bool, TableError> {
        self.withdraw_chunk(dest, lease).await
    }

    /// In a Delta table, "in the table" is "active in the latest version".
    async fn unrecorded(&self, chunk: &str) -> Result<Vec<String>, TableError> {
        crate::upkeep::unrecorded_active(self.log.store(), &self.ledger, &self.cfg.table.name, chunk).await
    }

    async fn verify(&self) -> Result<Verified, TableError> {
        crate::upkeep::verify(self.log.store(), &self.ledger, &self.cfg.table.name).await
    }

    async fn vacuum(&self, retain: Option<std::time::Duration>, allow_short: bool, dry_run: bool) -> Result<Vacuumed, TableError> {
        let (dest, table) = (self.log.store(), &self.cfg.table.name);
        let table_ms = crate::upkeep::retention_ms(dest, table).await?;
        let retain_ms = retain.map_or(table_ms, |d| d.as_millis().min(i64::MAX as u128) as i64);
        if retain_ms < table_ms && !allow_short {
            let human = |ms: i64| humantime::format_duration(std::time::Duration::from_millis(ms as u64)).to_string();
            return Err(ferry_common::error::ConfigError::new(
                "--retain",
                format!(
                    "{} is shorter than the table's delta.deletedFileRetentionDuration ({}): readers of versions within it \
                     would fail; pass --allow-short-retention to do it anyway",
                    human(retain_ms),
                    human(table_ms)
                ),
            )
            .into());
        }
        let cutoff = chrono::Utc::now().timestamp_millis().saturating_sub(retain_ms);
        crate::upkeep::vacuum(dest, &self.ledger, table, cutoff, dry_run).await
    }

    /// The checkpoint a commit of this run made due, if a task that ended early left it.
    async fn finish(&self) -> Result<(), TableError> {
        self.log.write_due_checkpoint().await;
        Ok(())
    }

    async fn compact(&self, target: i64, dry_run: bool) -> Result<Compacted, TableError> {
        let clock = || chrono::Utc::now().timestamp_millis();
        crate::upkeep::compact(self.log.store(), &self.cfg.table.name, target, dry_run, clock).await
    }
}

/// Tests hold the first group commit of this process with the log's lock taken, before it
/// looks at the queue (debug builds only): `FERRY_TEST_DELTA_GROUP_GATE=DIR`; every plan
/// queued writes `DIR/queued-<chunk>`, so a test knows how many the commit will find.
async fn group_gate() {
    #[cfg(debug_assertions)]
    {
        static USED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if let Some(dir) = ferry_runtime::gate::dir("FERRY_TEST_DELTA_GROUP_GATE", None)
            && !USED.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            ferry_runtime::gate::hold_async(&dir).await;
        }
    }
}

fn group_gate_queued(plan: &Plan) {
    #[cfg(debug_assertions)]
    if let Some(dir) = ferry_runtime::gate::dir("FERRY_TEST_DELTA_GROUP_GATE", None) {
        let mut chunks: Vec<&String> = plan.chunks.iter().collect();
        chunks.sort();
        if let Some(c) = chunks.first() {
            let _ = std::fs::write(dir.join(format!("queued-{c}")), b"");
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = plan;
}

/// Tests hold the first commit of this process before it is made (debug builds only):
/// `FERRY_TEST_DELTA_COMMIT_GATE=DIR`; if `DIR/kill` exists at `go`, the process is killed
/// right after the commit, before anything records it. True: kill after the commit.
async fn commit_gate() -> bool {
    #[cfg(debug_assertions)]
    {
        static USED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if let Some(dir) = ferry_runtime::gate::dir("FERRY_TEST_DELTA_COMMIT_GATE", None)
            && !USED.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            ferry_runtime::gate::hold_async(&dir).await;
            return dir.join("kill").exists();
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(chunk: &str, partition: &str, hash: &str) -> Part {
        Part {
            chunk_id: chunk.into(),
            partition: partition.into(),
            name: format!("part-{chunk}.parquet"),
            records: 3,
            bytes: 100,
            content_hash: hash.into(),
            stats: None,
        }
    }

    #[test]
    fn names_carry_the_chunk_and_the_bytes() {
        let p = part("c0ffee11", "dt=2026-11-28", "0123456789abcdef");
        assert_eq!(part_rel(&p), "dt=2026-11-28/part-c0ffee11-01234567.parquet");
        assert_eq!(chunk_of(&part_rel(&p)), Some("c0ffee11"));
        assert_eq!(chunk_of("dt=1/part-00000-3f2a.snappy.parquet"), None, "another writer's file");
        assert_eq!(chunk_of("part-a-b-0123abcd.parquet"), Some("a-b"));
    }

    fn plan(parts: &[Part], version: Option<(i64, &[(&str, i64)])>, replaces: bool) -> Plan {
        Plan {
            parts: parts.iter().map(|p| (part_rel(p), p.clone())).collect(),
            held: HashSet::new(),
            chunks: parts.iter().map(|p| p.chunk_id.clone()).collect(),
            version: version.map(|(v, all)| (v, all.iter().map(|(c, v)| (c.to_string(), *v)).collect())),
            skipped: HashSet::new(),
            replaces,
            was_in: false,
            columns: vec![SchemaColumn { name: "n".into(), hive: "BIGINT".into(), detail: "bigint".into(), nullable: true }],
            partition_by: vec!["dt".into()],
            table: "t".into(),
            epoch: 4,
            pipeline: "p".into(),
            now_ms: 1_000,
        }
    }

    #[test]
    fn plans_share_a_commit_only_when_neither_can_change_what_the_other_finds() {
        let (a, b, c) = ([part("aaaa", "dt=1", "11111111ff")], [part("bbbb", "dt=1", "22222222ff")], [part("cccc", "dt=1", "33333333ff")]);
        let every: &[(&str, i64)] = &[("aaaa", 1), ("bbbb", 1), ("cccc", 2)];
        assert!(independent(&plan(&a, None, false), &plan(&b, None, false)), "chunks of other files");
        assert!(independent(&plan(&a, Some((1, every)), false), &plan(&b, Some((1, every)), false)), "chunks of one version");
        assert!(!independent(&plan(&a, Some((1, every)), false), &plan(&c, Some((2, every)), true)), "a version and the one replacing it");
        assert!(!independent(&plan(&a, Some((1, every)), false), &plan(&c, Some((2, every)), false)), "two versions of a file");
        assert!(!independent(&plan(&a, None, false), &plan(&a, None, false)), "one chunk twice");
    }

    /// The plan's change against `s` once the lease is confirmed (as the load does when a
    /// commit carried one of its chunks before).
    fn confirmed(p: &Plan, s: &Snapshot, found: &mut Found) -> Result<Option<Change>, DeltaError> {
        let first = p.actions(s, None, found)?;
        match found.confirm.take() {
            Some(txns) => p.actions(s, Some(&txns), found),
            None => Ok(first),
        }
    }

    #[test]
    fn a_chunk_committed_before_confirms_the_lease_first_and_its_txn_version_only_grows() {
        let mut s = Snapshot { version: -1, ..Default::default() };
        let v1 = [part("aaaa", "dt=1", "11111111ff")];
        let mut found = Found::default();
        let first = plan(&v1, None, false).actions(&s, None, &mut found).unwrap().map(|c| written(&s, c)).unwrap();
        assert!(found.confirm.is_none(), "a chunk no commit carried yet: no confirmation");
        apply(&mut s, &first);
        assert_eq!(s.txns["ferry:p:aaaa"].version, 4, "the lease's epoch");
        // Made again later, with other bytes, by a task whose epochs started again lower (its
        // tasks pruned and made again): the lease is confirmed first, then the txn is past the last.
        let rerun = [part("aaaa", "dt=1", "33333333ff")];
        let mut later = plan(&rerun, None, false);
        later.epoch = 1;
        assert!(later.actions(&s, None, &mut found).unwrap().is_none(), "nothing written before the lease is confirmed");
        let txns = found.confirm.take().expect("a confirmation asked for");
        assert_eq!(txns, HashMap::from([("aaaa".to_string(), Some(4))]));
        let change = later.actions(&s, Some(&txns), &mut found).unwrap().map(|c| written(&s, c)).unwrap();
        assert!(found.confirm.is_none());
        apply(&mut s, &change);
        assert_eq!(s.txns["ferry:p:aaaa"].version, 5, "never backwards");
        // A commit that carried the chunk after the confirmation asks for another.
        assert!(later.actions(&s, Some(&txns), &mut found).unwrap().is_none());
        assert_eq!(found.confirm.take(), Some(HashMap::from([("aaaa".to_string(), Some(5))])));
    }

    fn kinds(actions: &[Value]) -> Vec<String> {
        actions.iter().map(|a| a.as_object().unwrap().keys().next().unwrap().clone()).collect()
    }

    /// A plan's change as the commit writes it when no part is in a compacted file: a remove
    /// per part that leaves.
    fn written(s: &Snapshot, c: Change) -> Vec<Value> {
        let mut actions = c.actions;
        actions.extend(c.drop.iter().map(|rel| delta::remove(rel, s.files[rel].size, 1_000)));
        actions
    }

    fn apply(s: &mut Snapshot, actions: &[Value]) {
        let text: String = actions.iter().map(|a| format!("{a}\n")).collect();
        s.apply(s.version + 1, &text).unwrap();
    }

    #[test]
    fn a_chunk_goes_in_once_a_rerun_swaps_its_files_and_a_new_version_replaces_the_old_whole() {
        let mut s = Snapshot { version: -1, ..Default::default() };
        let v1 = [part("aaaa", "dt=1", "11111111ff"), part("aaaa", "dt=2", "22222222ff")];
        let every = [("aaaa", 1), ("bbbb", 2)];
        let mut found = Found::default();
        let first = confirmed(&plan(&v1, Some((1, &every)), false), &s, &mut found).unwrap().map(|c| written(&s, c)).unwrap();
        assert_eq!(kinds(&first), ["commitInfo", "protocol", "metaData", "add", "add", "txn"]);
        apply(&mut s, &first);
        assert_eq!(s.files.len(), 2);
        // The same chunk again (a lost reply): nothing to write.
        assert!(confirmed(&plan(&v1, Some((1, &every)), false), &s, &mut found).unwrap().is_none());
        // A rerun with other bytes in one partition: the new name in, the old one out, at once.
        let rerun = [part("aaaa", "dt=1", "33333333ff"), part("aaaa", "dt=2", "22222222ff")];
        let swap = confirmed(&plan(&rerun, Some((1, &every)), false), &s, &mut found).unwrap().map(|c| written(&s, c)).unwrap();
        assert_eq!(kinds(&swap), ["commitInfo", "add", "txn", "remove"]);
        apply(&mut s, &swap);
        assert!(s.files.contains_key("dt=1/part-aaaa-33333333.parquet") && !s.files.contains_key("dt=1/part-aaaa-11111111.parquet"));
        // Version 2 of the file replaces version 1: its add and version 1's removes together.
        let v2 = [part("bbbb", "dt=1", "44444444ff")];
        let switch = confirmed(&plan(&v2, Some((2, &every)), true), &s, &mut found).unwrap().map(|c| written(&s, c)).unwrap();
        assert_eq!(kinds(&switch), ["commitInfo", "add", "txn", "remove", "remove"]);
        apply(&mut s, &switch);
        assert_eq!(s.files.keys().collect::<Vec<_>>(), ["dt=1/part-bbbb-44444444.parquet"]);
        // Version 1's chunk, late (its commit lost the race to the switch): superseded, nothing written.
        let mut late = Found::default();
        assert!(confirmed(&plan(&v1, Some((1, &every)), false), &s, &mut late).unwrap().is_none());
        assert!(late.superseded);
    }

    #[test]
    fn a_type_change_is_refused_and_a_new_nullable_column_is_a_schema_change() {
        let mut s = Snapshot { version: -1, ..Default::default() };
        let ps = [part("aaaa", "dt=1", "11111111ff")];
        let mut found = Found::default();
        let p = plan(&ps, None, false);
        let first = confirmed(&p, &s, &mut found).unwrap().map(|c| written(&s, c)).unwrap();
        apply(&mut s, &first);
        let mut wider = plan(&ps, None, false);
        wider.columns.push(SchemaColumn { name: "m".into(), hive: "STRING".into(), detail: "string".into(), nullable: true });
        let change = confirmed(&wider, &s, &mut found).unwrap().map(|c| written(&s, c)).unwrap();
        assert_eq!(kinds(&change), ["commitInfo", "metaData", "txn"]);
        let mut retyped = plan(&ps, None, false);
        retyped.columns[0].detail = "string".into();
        let e = confirmed(&retyped, &s, &mut found).unwrap_err().to_string();
        assert!(e.contains("\"n\"") && e.contains("typeWidening"), "{e}");
    }

    /// Another engine's table: its metaData written with its own key order, properties, a
    /// description and a column comment.
    fn foreign_table() -> Snapshot {
        let mut s = Snapshot { version: -1, ..Default::default() };
        let schema = r#"{"fields":[{"metadata":{"comment":"a count"},"nullable":true,"type":"long","name":"n"},{"name":"x","type":"string","nullable":false,"metadata":{}}],"type":"struct"}"#;
        let commit = [
            serde_json::json!({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}),
            serde_json::json!({"metaData": {
                "id": "0b5c-other", "name": "events", "description": "theirs", "format": {"provider": "parquet", "options": {}},
                "schemaString": schema, "partitionColumns": ["dt"], "createdTime": 7,
                "configuration": {"delta.logRetentionDuration": "interval 60 days", "delta.checkpointInterval": "4"},
            }}),
        ];
        apply(&mut s, &commit);
        s
    }

    #[test]
    fn another_engines_metadata_is_carried_over_and_only_the_schema_grows() {
        let s = foreign_table();
        let ps = [part("aaaa", "dt=1", "11111111ff")];
        let mut found = Found::default();
        // The same columns (other key order, a comment): no metaData at all.
        let same = confirmed(&plan(&ps, None, false), &s, &mut found).unwrap().map(|c| written(&s, c)).unwrap();
        assert_eq!(kinds(&same), ["commitInfo", "add", "txn"]);
        // A new nullable column: the current metaData with it appended, nothing else changed.
        let mut wider = plan(&ps, None, false);
        wider.columns.push(SchemaColumn { name: "m".into(), hive: "STRING".into(), detail: "string".into(), nullable: true });
        let change = confirmed(&wider, &s, &mut found).unwrap().map(|c| written(&s, c)).unwrap();
        let m = &change.iter().find_map(|a| a.get("metaData")).unwrap();
        let before = serde_json::to_value(s.metadata.as_ref().unwrap()).unwrap();
        for key in ["id", "name", "description", "format", "partitionColumns", "createdTime", "configuration"] {
            assert_eq!(m[key], before[key], "{key}");
        }
        let schema: Value = serde_json::from_str(m["schemaString"].as_str().unwrap()).unwrap();
        let fields = schema["fields"].as_array().unwrap();
        assert_eq!(fields.iter().map(|f| f["name"].as_str().unwrap()).collect::<Vec<_>>(), ["n", "x", "m"]);
        assert_eq!(fields[0]["metadata"]["comment"], "a count", "the other engine's column comment");
        assert_eq!(fields[1]["nullable"], false, "a column Ferry does not load keeps its rule");
        // Other partition columns, and a name that differs only in case, are refused.
        let mut moved = plan(&ps, None, false);
        moved.partition_by = vec!["day".into()];
        let e = moved.actions(&s, None, &mut found).unwrap_err().to_string();
        assert!(e.contains("partitioned by [\"dt\"]") && e.contains("partition_by"), "{e}");
        let mut upper = plan(&ps, None, false);
        upper.columns[0].name = "N".into();
        let e = upper.actions(&s, None, &mut found).unwrap_err().to_string();
        assert!(e.contains("case-insensitive"), "{e}");
    }

    #[test]
    fn a_timestamp_ntz_column_adds_its_feature_and_keeps_the_tables_others() {
        let mut s = foreign_table();
        apply(
            &mut s,
            &[
                serde_json::json!({"protocol": {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["appendOnly", "invariants"]}}),
            ],
        );
        let ps = [part("aaaa", "dt=1", "11111111ff")];
        let mut p = plan(&ps, None, false);
        p.columns.push(SchemaColumn { name: "t".into(), hive: "TIMESTAMP".into(), detail: "timestamp_ntz[us]".into(), nullable: true });
        let mut found = Found::default();
        let change = confirmed(&p, &s, &mut found).unwrap().map(|c| written(&s, c)).unwrap();
        let proto = change.iter().find_map(|a| a.get("protocol")).expect("a protocol upgrade");
        assert_eq!(proto["minReaderVersion"], 3);
        assert_eq!(proto["writerFeatures"], serde_json::json!(["appendOnly", "invariants", "timestampNtz"]));
        assert_eq!(proto["readerFeatures"], serde_json::json!(["timestampNtz"]));
        apply(&mut s, &change);
        let again = confirmed(&p, &s, &mut found).unwrap();
        assert!(again.is_none_or(|c| c.actions.iter().all(|a| a.get("protocol").is_none())), "upgraded once");
    }
}
