//! load into a Delta Lake table (`[destination] table_format = "delta"`).
//!
//! The chunk's parts move into the table directory under content-addressed names, where no
//! reader sees them, and one commit to the table's log adds them (see `ferry_delta`
//! for the log and its commit rule). Each Hive step has its Delta counterpart:
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
use ferry_delta::{self as delta, Change, DeltaError, DeltaLog, Rewritten, Snapshot, chunk_of};
use ferry_ledger::{Lease, Part, SchemaColumn, Work};
use ferry_storage::Store;
use serde_json::Value;

use crate::{LoadError, LoadFailure, Loader, Moving, WAIT_BRIEFLY};

/// The table's log and the newest snapshot this process has read of it.
pub(crate) struct DeltaTable {
    log: DeltaLog,
    /// Commits of this process go one at a time (they would race for the same version
    /// anyway), each from the snapshot the one before it left.
    snapshot: tokio::sync::Mutex<Option<Snapshot>>,
}

impl DeltaTable {
    pub(crate) fn new(dest: Store, table: &str) -> DeltaTable {
        DeltaTable { log: DeltaLog::new(dest, table), snapshot: tokio::sync::Mutex::new(None) }
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

/// A part's file name in a Delta table: `part-<chunk>-<first 8 of its blake3>.parquet`, so
/// that other bytes for the same chunk and partition (a rerun) never take a name an earlier
/// version of the table still reads.
pub(crate) fn part_rel(p: &Part) -> String {
    let stem = p.name.strip_suffix(".parquet").unwrap_or(&p.name);
    let hash = p.content_hash.get(..8).unwrap_or(&p.content_hash);
    paths::part_rel(&p.partition, &format!("{stem}-{hash}.parquet"))
}

/// What one chunk's commit is to bring about, fixed before the log is read.
struct Plan<'a> {
    /// Every part going in (the chunk's, and in a version switch its siblings'), by table path.
    parts: Vec<(String, &'a Part)>,
    /// Of those, the ones not placed in the directory: a merged file held them when load
    /// looked (their own file may be vacuumed since), so they cannot be added.
    held: HashSet<String>,
    /// The chunks whose parts these are.
    chunks: HashSet<&'a str>,
    /// The source file's version, with every chunk of every version of it (versions = replace).
    version: Option<(i64, HashMap<String, i64>)>,
    /// Siblings an operator skipped: their files must not stay in the table.
    skipped: HashSet<String>,
    /// This version replaces an older one: the older one's files go in the same commit.
    replaces: bool,
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
#[derive(Default)]
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

impl Plan<'_> {
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
        type Planned<'p> = Vec<&'p (String, &'p Part)>;
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
        let mut chunks: Vec<&str> = self.chunks.iter().copied().collect();
        chunks.sort();
        let op = if drop.is_empty() { "WRITE" } else { "MERGE" };
        let mut actions = vec![delta::commit_info(op, &chunks, self.now_ms)];
        actions.extend(self.protocol_change(s));
        actions.extend(metadata);
        for (rel, p) in adds {
            actions.push(delta::add(rel, &delta::partition_values(&p.partition), p.bytes, p.records, p.stats.as_deref(), self.now_ms));
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
        adds: &[&(String, &Part)],
        wanted: &HashSet<&str>,
        version_of: &dyn Fn(&str) -> Option<i64>,
    ) -> Result<(), DeltaError> {
        let refuse = |chunk: &str, part: &str, r: &Rewritten, what: &str| Err(rewritten_refusal(&self.table, chunk, part, r, what));
        for c in &self.chunks {
            let new = adds.iter().any(|(rel, _)| chunk_of(rel) == Some(*c));
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
        if s.protocol.is_none() {
            return Some(delta::protocol(&self.columns));
        }
        if !self.columns.iter().any(|c| c.detail.contains("timestamp_ntz")) {
            return None;
        }
        let (mut readers, mut writers) = (s.protocol_features("readerFeatures"), s.protocol_features("writerFeatures"));
        let (_, w) = s.protocol_versions();
        if w < 7 {
            // A table of the legacy protocol: its writer version names the features it has.
            for (since, f) in
                [(2, "appendOnly"), (2, "invariants"), (3, "checkConstraints"), (4, "changeDataFeed"), (4, "generatedColumns")]
            {
                if w >= since {
                    writers.push(f.to_string());
                }
            }
            for (since, f) in [(5, "columnMapping"), (6, "identityColumns")] {
                if w >= since {
                    writers.push(f.to_string());
                    if f == "columnMapping" {
                        readers.push(f.to_string());
                    }
                }
            }
        } else if writers.iter().any(|f| f == "timestampNtz") && readers.iter().any(|f| f == "timestampNtz") {
            return None;
        }
        for list in [&mut readers, &mut writers] {
            if !list.iter().any(|f| f == "timestampNtz") {
                list.push("timestampNtz".into());
            }
        }
        Some(serde_json::json!({"protocol": {
            "minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": readers, "writerFeatures": writers,
        }}))
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
            return delta::metadata(&id, &self.table, &self.columns, &self.partition_by, self.now_ms).map(Some);
        };
        let partitioned = s.partition_columns();
        if partitioned != self.partition_by {
            return Err(DeltaError::Schema(format!(
                "Delta table {} is partitioned by {partitioned:?}, [table] partition_by says {:?}: a Delta table keeps its \
                 partition columns; set partition_by to the table's, or load into a new table",
                self.table, self.partition_by
            )));
        }
        let text = s.schema_string().unwrap_or(r#"{"type":"struct","fields":[]}"#);
        let mut schema: Value = serde_json::from_str(text)
            .map_err(|e| DeltaError::Log(format!("Delta table {}: its schemaString is not JSON ({e})", self.table)))?;
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
        m["schemaString"] = Value::String(schema.to_string());
        Ok(Some(serde_json::json!({ "metaData": m })))
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

/// Reads who removed the tombstoned parts of `chunks` when the cached snapshot came from a
/// checkpoint (a rare path: a rerun, a switch, a revert of a chunk that was in before).
async fn trace_for(table: &DeltaTable, chunks: &HashSet<&str>) -> Result<(), LoadError> {
    let mut cached = table.snapshot.lock().await;
    if let Some(s) = cached.as_mut()
        && s.needs_trace(chunks)
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

impl Loader {
    /// Publishes one chunk into a Delta table: its parts into the directory, then one commit.
    pub(crate) async fn chunk_delta(self: Arc<Self>, lease: Lease, table: &DeltaTable) -> Result<Work, LoadError> {
        let name = &self.cfg.table.name;
        let replace = self.cfg.source.versions == ferry_runtime::config::Versions::Replace;
        let dest = self.dest.isolated()?;
        if replace
            && self.ledger.newer_version_published(&lease.chunk_id).await?.is_some()
            && self.withdraw_delta(&dest, &lease, table).await?
        {
            return Ok(Work::default());
        }
        let version = if replace { Some(self.ledger.version_of(&lease.chunk_id).await?) } else { None };
        let Moving { parts, moving, siblings, switching: _switching } = self.moving(&lease, version.as_ref()).await?;
        // Into the directory, under names no reader looks at until the commit adds them; not
        // the parts a merged file holds (`ferry compact`): they are in, and their own files
        // may be gone with a vacuum.
        let held: HashSet<String> = {
            let mut cached = table.snapshot.lock().await;
            match cached.as_mut() {
                Some(s) => table.log.catch_up(s).await.map_err(table_error)?,
                None => *cached = Some(table.log.snapshot().await.map_err(table_error)?),
            }
            let s = cached.as_ref().expect("read above");
            moving.iter().map(part_rel).filter(|rel| s.members.contains_key(rel)).collect()
        };
        for p in moving.iter().filter(|p| !held.contains(&part_rel(p))) {
            self.place(&dest, p).await?;
        }
        let columns = match self.ledger.table_schemas(name).await?.pop() {
            Some(v) => v.columns,
            None => return Err(LoadError::Stage(LoadFailure::Table(format!("no schema of table {name} is recorded")))),
        };
        let every_version = match &version {
            Some(v) => Some((v.version, self.ledger.chunks_of_every_version(&lease.chunk_id).await?.into_iter().collect())),
            None => None,
        };
        let skipped = version
            .as_ref()
            .filter(|v| v.replaces)
            .map(|v| v.chunks.iter().filter(|c| c.skipped).map(|c| c.id.clone()).collect())
            .unwrap_or_default();
        let plan = Plan {
            parts: moving.iter().map(|p| (part_rel(p), p)).collect(),
            held,
            chunks: moving.iter().map(|p| p.chunk_id.as_str()).chain([lease.chunk_id.as_str()]).collect(),
            version: every_version,
            skipped,
            replaces: version.as_ref().is_some_and(|v| v.replaces),
            columns,
            partition_by: self.cfg.table.partition_by.clone(),
            table: name.clone(),
            epoch: lease.epoch,
            pipeline: self.cfg.pipeline.clone(),
            now_ms: self.ledger.now_ms(),
        };
        let touched: HashSet<&str> = plan
            .chunks
            .iter()
            .copied()
            .chain(plan.skipped.iter().map(String::as_str))
            .chain(plan.version.iter().flat_map(|(_, all)| all.keys().map(String::as_str)))
            .collect();
        trace_for(table, &touched).await?;
        let kill_after_commit = commit_gate().await;
        let mut confirmed: Option<Txns> = None;
        let mut rounds = 0;
        let (committed, found) = loop {
            let mut found = Found::default();
            let committed = {
                let mut cached = table.snapshot.lock().await;
                table
                    .log
                    .commit_parts(&mut cached, plan.now_ms, |s| plan.actions(s, confirmed.as_ref(), &mut found))
                    .await
                    .map_err(table_error)?
            };
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
            self.ledger.heartbeat(&lease).await?;
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
            if self.withdraw_delta(&dest, &lease, table).await? {
                return Ok(Work::default());
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
        let recorded = self.ledger.record_published(&lease, name, &published, replace, table_version).await?;
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
            return Ok(Work::default());
        }
        if let Some(v) = &version {
            // The older versions' files left the table in the commit; their rows go now.
            let old: Vec<String> = self.ledger.older_versions_published(&lease.chunk_id).await?.into_iter().map(|(p, _)| p).collect();
            if !old.is_empty() {
                self.ledger.retract_published(&v.uri, &old).await?;
            }
            if !siblings.is_empty() {
                self.ledger.wake(&siblings, ferry_ledger::Stage::Load).await?;
            }
        }
        Ok(Work { bytes: parts.iter().map(|p| p.bytes).sum(), records: parts.iter().map(|p| p.records).sum(), ..Work::default() })
    }

    /// Moves a part's landed file to its name in the table directory (where no reader looks
    /// until a commit adds it); a retry finds it there already.
    async fn place(&self, dest: &Store, p: &Part) -> Result<(), LoadError> {
        let name = &self.cfg.table.name;
        let landed = paths::landed(name, &p.chunk_id, &p.rel_path());
        let target = paths::table_file(name, &part_rel(p));
        if dest.rename_noreplace(&landed, &target).await.or_else(|e| if e.is_not_found() { Ok(false) } else { Err(e) })? {
            return Ok(());
        }
        match ferry_runtime::table::in_table::<LoadFailure>(dest, &target, p).await? {
            Some(true) => {
                let _ = dest.delete(&landed).await;
                Ok(())
            }
            Some(false) => Err(self.conflict(dest, &target, &p.chunk_id)),
            None => Err(self.missing(dest, &landed, &target, &p.chunk_id)),
        }
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
    async fn withdraw_delta(&self, dest: &Store, lease: &Lease, table: &DeltaTable) -> Result<bool, LoadError> {
        let chunk = lease.chunk_id.as_str();
        let Some(newer) = self.ledger.begin_withdrawal(lease).await? else { return Ok(false) };
        tracing::info!(chunk, newer_version = newer, "withdrawing: a newer version of its source file is in the table");
        crate::withdraw_gate().await;
        self.ledger.make_durable().await?;
        let now_ms = self.ledger.now_ms();
        trace_for(table, &HashSet::from([chunk])).await?;
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
        if let Some(v) = removed {
            tracing::info!(chunk, table_version = v, "took the superseded chunk's files out of the table");
        }
        for p in self.ledger.parts(chunk).await? {
            let landed = paths::landed(&self.cfg.table.name, &p.chunk_id, &p.rel_path());
            if let Err(e) = dest.delete(&landed).await {
                tracing::debug!(file = %dest.url(&landed), error = %e, "cannot remove a landed file now; gc will");
            }
        }
        Ok(true)
    }
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

    fn plan<'a>(parts: &'a [Part], version: Option<(i64, &[(&str, i64)])>, replaces: bool) -> Plan<'a> {
        Plan {
            parts: parts.iter().map(|p| (part_rel(p), p)).collect(),
            held: HashSet::new(),
            chunks: parts.iter().map(|p| p.chunk_id.as_str()).collect(),
            version: version.map(|(v, all)| (v, all.iter().map(|(c, v)| (c.to_string(), *v)).collect())),
            skipped: HashSet::new(),
            replaces,
            columns: vec![SchemaColumn { name: "n".into(), hive: "BIGINT".into(), detail: "bigint".into(), nullable: true }],
            partition_by: vec!["dt".into()],
            table: "t".into(),
            epoch: 4,
            pipeline: "p".into(),
            now_ms: 1_000,
        }
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
        let before = s.metadata.as_ref().unwrap();
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
