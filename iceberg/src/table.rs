//! Ferry's Iceberg table: the `Table` seam's Iceberg side (see the crate's opening note for
//! the commit and what a crash leaves).
//!
//! | Hive layout (renames)                          | Iceberg (one snapshot per commit)                  |
//! |------------------------------------------------|----------------------------------------------------|
//! | parts renamed into the table, all or nothing   | every part added in one snapshot (`append`)        |
//! | a rerun's earlier output deleted               | the chunk's other files deleted in it (`overwrite`)|
//! | a version switched in, older files deleted     | the version's files added and the older versions'  |
//! |                                                | deleted in one snapshot: a reader sees one or other|
//! | a skipped sibling's parts moved back out       | its files deleted                                  |
//! | a superseded chunk's parts moved back out      | its files deleted in a snapshot of their own       |
//!
//! Deleted files stay in the directory (a reader of an older snapshot still reads them).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use ferry_common::error::ConfigError;
use ferry_common::paths;
use ferry_ledger::{CatalogSwap, Lease, Ledger, Part, Record, SchemaColumn, Swapped};
use ferry_runtime::config::{Config, IcebergCatalog};
use ferry_storage::Store;
use ferry_table::{Job, Outcome, Table, TableError, TableFailure, Vacuumed, Verified, WAIT_BRIEFLY, chunk_of, part_rel};
use serde_json::{Value, json};

use crate::manifest::{self, ADDED, DELETED, EXISTING, Entry, ManifestFile};
use crate::rest::{Committed, RestCatalog};
use crate::schema::{self, PartitionField};
use crate::{FORMAT_VERSION, IcebergError, PREVIOUS_VERSIONS_MAX, Result, canon, rel};

/// How many times a commit plans again after another writer moved the catalog row first,
/// before its chunk waits and tries later.
const ROUNDS: usize = 10;

/// Iceberg's default `history.expire.max-snapshot-age-ms`: five days.
const MAX_SNAPSHOT_AGE_MS: i64 = 5 * 24 * 3600 * 1000;

/// The property of the default name mapping (Ferry's Parquet files carry no field ids).
const NAME_MAPPING: &str = "schema.name-mapping.default";

/// An Iceberg table whose catalog is the ledger or a REST catalog.
pub struct IcebergTable {
    cfg: Config,
    ledger: Ledger,
    dest: Store,
    catalog: Catalog,
    /// Commits of this process go one at a time (they would race for the catalog row anyway);
    /// whoever holds it commits every plan queued meanwhile (see [`IcebergTable::commit_queued`]).
    commits: tokio::sync::Mutex<()>,
    queue: std::sync::Mutex<Vec<Queued>>,
    /// Manifests read, by path: a manifest is never changed once written.
    manifests: std::sync::Mutex<HashMap<String, Arc<Vec<Entry>>>>,
}

/// Where the table's current metadata file is named.
enum Catalog {
    /// Iceberg's JDBC catalog in the ledger: a commit is one ledger transaction with the record.
    Ledger,
    /// A REST catalog: a commit, then the record (see the `rest` module).
    Rest(Box<RestCatalog>),
}

/// The table as its catalog row names it.
#[derive(Default)]
struct Current {
    /// The metadata file (None: no table yet).
    location: Option<String>,
    meta: Option<Value>,
    /// The current snapshot's manifests, and the entries of each data manifest.
    manifests: Vec<(ManifestFile, Arc<Vec<Entry>>)>,
}

impl Current {
    /// The data files a reader of the current snapshot reads.
    fn live(&self) -> impl Iterator<Item = &Entry> {
        self.manifests
            .iter()
            .filter(|(m, _)| m.content == 0)
            .flat_map(|(_, es)| es.iter())
            .filter(|e| e.status != DELETED && e.content == 0)
    }

    /// Whether a snapshot of the table's history is another writer's (no `ferry.chunks` in its
    /// summary): only then can a file Ferry recorded be out of the table by design.
    fn foreign(&self) -> bool {
        let snaps = self.meta.as_ref().and_then(|m| m.get("snapshots")?.as_array());
        snaps.into_iter().flatten().any(|s| s.get("summary").and_then(|x| x.get("ferry.chunks")).is_none())
    }

    fn snapshot_id(&self) -> Option<i64> {
        self.meta.as_ref()?.get("current-snapshot-id")?.as_i64().filter(|id| *id >= 0)
    }
}

/// What a chunk's publish is to bring about, fixed before the table is read.
struct Plan {
    /// Every part going in (the chunk's, and in a version switch its siblings'), by file URL.
    parts: Vec<(String, Part)>,
    chunks: HashSet<String>,
    /// The source file's version, with every chunk of every version of it (versions = replace).
    version: Option<(i64, HashMap<String, i64>)>,
    /// Siblings an operator skipped: their files must not stay in the table.
    skipped: HashSet<String>,
    /// This version replaces an older one: the older one's files go in the same snapshot.
    replaces: bool,
    columns: Vec<SchemaColumn>,
    /// `<chunk>@<epoch>` of each chunk the snapshot brings.
    marker: String,
    /// The files the ledger records as published for these chunks, by URL, with their chunk.
    recorded: HashMap<String, String>,
    table: String,
}

/// One chunk's plan waiting for a commit, and where its answer goes.
struct Queued {
    plan: Arc<Plan>,
    lease: Lease,
    /// Its own parts, as the ledger records them.
    published: Vec<(String, Part)>,
    replace: bool,
    /// A commit of several plans failed: this one goes in a commit of its own.
    alone: bool,
    answer: tokio::sync::oneshot::Sender<Answer>,
}

/// What became of a queued plan.
enum Answer {
    /// In the table and recorded.
    Done,
    /// A newer version of its source file is in: to be withdrawn.
    Superseded,
    Failed(TableError),
    /// The commit it was in failed with others' plans: queue it again, alone.
    Alone,
    /// Other writers took the catalog's row first every round.
    Busy,
}

/// Whether two plans may share a snapshot, each planned against the same one: no common chunk,
/// the same schema, and if of the same source file, chunks of one version that replaces none.
fn independent(a: &Plan, b: &Plan) -> bool {
    let chunks = |p: &Plan| -> HashSet<String> { p.chunks.iter().chain(&p.skipped).cloned().collect() };
    if !chunks(a).is_disjoint(&chunks(b)) || a.columns != b.columns {
        return false;
    }
    match (&a.version, &b.version) {
        (Some((va, all_a)), Some((vb, all_b))) if all_a.keys().any(|c| all_b.contains_key(c)) => va == vb && !a.replaces && !b.replaces,
        _ => true,
    }
}

/// A plan against one snapshot.
enum Planned {
    /// Another writer's snapshot deleted a file of these chunks after it was in (a DELETE, an
    /// overwrite, a compaction): what the plan would do next would undo or double that.
    Refused(String),
    /// Every part is in and nothing is to go: the snapshot that brought them.
    Nothing(Option<i64>),
    /// A newer version of the source file is in the table.
    Superseded,
    Commit {
        adds: Vec<(String, Part)>,
        drops: HashSet<String>,
    },
}

impl Plan {
    fn against(&self, cur: &Current) -> Planned {
        let version_of = |path: &str| self.version.as_ref().and_then(|(_, all)| all.get(chunk_of(path)?).copied());
        if let Some((mine, _)) = &self.version
            && cur.live().any(|e| version_of(&e.path).is_some_and(|v| v > *mine))
        {
            return Planned::Superseded;
        }
        // By each file's one spelling; what is deleted is named as its manifest names it.
        let live: HashMap<String, &Entry> = cur.live().map(|e| (canon(&e.path).into_owned(), e)).collect();
        let wanted: HashSet<&str> = self.parts.iter().map(|(url, _)| url.as_str()).collect();
        // Files of these chunks the ledger recorded in the table that are no longer in it: only
        // another writer's snapshot takes a recorded file out (Ferry's own deletes record the
        // chunk's new files, or retract the chunk, in the same step). The same bytes again (a
        // retry, a rerun) count as in, as that writer left them; other bytes would put back
        // rows it deleted, or double rows it kept in files of its own.
        let foreign = cur.foreign();
        let theirs: HashMap<&str, &str> = self
            .recorded
            .iter()
            .filter(|(url, _)| foreign && !live.contains_key(url.as_str()))
            .map(|(u, c)| (u.as_str(), c.as_str()))
            .collect();
        let adds: Vec<(String, Part)> =
            self.parts.iter().filter(|(url, _)| !live.contains_key(url.as_str()) && !theirs.contains_key(url.as_str())).cloned().collect();
        if let Some((url, p)) = adds.iter().find(|(_, p)| theirs.values().any(|c| *c == p.chunk_id)) {
            let (gone, _) = theirs.iter().find(|(_, c)| **c == p.chunk_id).expect("found above");
            return Planned::Refused(format!(
                "Iceberg table {}: {gone} of chunk {} was deleted by another writer's snapshot after Ferry published it; loading \
                 other bytes for the chunk ({url}) would bring back or double the rows that writer changed, so nothing is \
                 written. Skip the chunk (ferry skip --chunk {}) to leave the table as that writer left it",
                self.table, p.chunk_id, p.chunk_id
            ));
        }
        let drops: HashSet<String> = live
            .iter()
            .filter(|(path, _)| !wanted.contains(path.as_str()))
            .map(|(_, e)| e.path.as_str())
            .filter(|path| {
                let Some(c) = chunk_of(path) else { return false };
                self.chunks.contains(c)
                    || self.skipped.contains(c)
                    || (self.replaces && version_of(path).zip(self.version.as_ref()).is_some_and(|(v, (mine, _))| v < *mine))
            })
            .map(|p| p.to_string())
            .collect();
        if adds.is_empty() && drops.is_empty() {
            // Recorded with the snapshot that brought the newest of its files.
            let id = self.parts.iter().filter_map(|(url, _)| live.get(url.as_str())).max_by_key(|e| e.seq).map(|e| e.snapshot_id);
            return Planned::Nothing(id);
        }
        Planned::Commit { adds, drops }
    }
}

/// A store's or the ledger's error keeps its class; what the metadata or the schema refuses is
/// the chunk's.
fn table_error(e: IcebergError) -> TableError {
    match e {
        IcebergError::Storage(e) => e.into(),
        IcebergError::Ledger(e) => e.into(),
        other => TableError::Stage(TableFailure::Table(other.to_string())),
    }
}

/// A random id for a snapshot (positive, as Iceberg's are).
fn snapshot_id() -> i64 {
    (rand::random::<u64>() >> 1) as i64
}

/// A random UUID (version 4) as text.
fn uuid() -> String {
    let b: u128 = (rand::random::<u128>() & !(0xf << 76) & !(0x3 << 62)) | (0x4 << 76) | (0x2 << 62);
    let h = format!("{b:032x}");
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

impl IcebergTable {
    pub fn new(cfg: Config, ledger: Ledger, dest: Store) -> Result<IcebergTable, TableError> {
        let catalog = match cfg.destination.iceberg.catalog {
            IcebergCatalog::Ledger => Catalog::Ledger,
            IcebergCatalog::Rest => Catalog::Rest(Box::new(
                RestCatalog::new(&cfg.destination.iceberg, &cfg.table.name)
                    .map_err(|e| TableError::Config(ConfigError::new("destination.iceberg", e.to_string())))?,
            )),
        };
        Ok(IcebergTable {
            cfg,
            ledger,
            dest,
            catalog,
            commits: Default::default(),
            queue: Default::default(),
            manifests: Default::default(),
        })
    }

    fn name(&self) -> &str {
        &self.cfg.table.name
    }

    fn metadata_dir(&self) -> String {
        format!("{}/metadata", self.name())
    }

    /// The table as the catalog names it now, its manifests read (or taken from memory).
    async fn current(&self) -> Result<Current> {
        let ice = &self.cfg.destination.iceberg;
        let (loc, meta) = match &self.catalog {
            Catalog::Ledger => {
                let location = self.ledger.iceberg_location(&ice.catalog_name, &ice.namespace, self.name()).await?;
                let Some(loc) = location else { return Ok(Current::default()) };
                let bytes = self.dest.read(&rel(&self.dest, &loc)?).await?;
                let meta: Value = serde_json::from_slice(&bytes).map_err(|e| IcebergError::Metadata(format!("{loc}: not JSON: {e}")))?;
                (loc, meta)
            }
            Catalog::Rest(rest) => match rest.load().await? {
                Some(found) => found,
                None => return Ok(Current::default()),
            },
        };
        match meta.get("format-version").and_then(Value::as_i64) {
            Some(FORMAT_VERSION) => {}
            v => {
                return Err(IcebergError::Metadata(format!(
                    "{loc}: format version {}; Ferry writes Iceberg tables of format version 2 only (upgrade a version 1 \
                     table with ALTER TABLE ... SET TBLPROPERTIES ('format-version' = '2'))",
                    v.map_or("none".to_string(), |v| v.to_string())
                )));
            }
        }
        let mut cur = Current { location: Some(loc.clone()), meta: Some(meta), manifests: vec![] };
        let Some(id) = cur.snapshot_id() else { return Ok(cur) };
        let snap = snapshot(cur.meta.as_ref().expect("read above"), id)
            .ok_or_else(|| IcebergError::Metadata(format!("{loc}: current snapshot {id} is not in its snapshots")))?;
        let list_url = snap.get("manifest-list").and_then(Value::as_str).ok_or_else(|| {
            IcebergError::Metadata(format!("{loc}: snapshot {id} has no manifest-list (format version 1 manifests are not read)"))
        })?;
        let list = manifest::read_list(&self.dest.read(&rel(&self.dest, list_url)?).await?, list_url)?;
        for m in list {
            let cached = self.manifests.lock().unwrap_or_else(|e| e.into_inner()).get(&m.path).cloned();
            let entries = match cached {
                Some(es) => es,
                // Delete manifests are carried as they are: Ferry reads only data files.
                None if m.content != 0 => Arc::new(vec![]),
                None => {
                    let es = Arc::new(manifest::read_manifest(&self.dest.read(&rel(&self.dest, &m.path)?).await?, &m)?);
                    self.manifests.lock().unwrap_or_else(|e| e.into_inner()).insert(m.path.clone(), es.clone());
                    es
                }
            };
            cur.manifests.push((m, entries));
        }
        // Only the current snapshot's manifests stay in memory: a long-running load on a table
        // with a long history would otherwise keep every manifest it ever read.
        let keep: HashMap<String, Arc<Vec<Entry>>> =
            cur.manifests.iter().filter(|(m, _)| m.content == 0).map(|(m, es)| (m.path.clone(), es.clone())).collect();
        *self.manifests.lock().unwrap_or_else(|e| e.into_inner()) = keep;
        Ok(cur)
    }

    /// Writes the manifests and manifest list of a snapshot that adds `adds` and deletes
    /// `drops` from `cur` (and takes in Ferry's `columns`); returns the table's metadata with
    /// it (see [`IcebergTable::commit_meta`]), and the snapshot's id and sequence number.
    /// Nothing is visible until the catalog names it.
    async fn write_snapshot(
        &self,
        cur: &Current,
        columns: &[SchemaColumn],
        adds: &[(String, Part)],
        drops: &HashSet<String>,
        marker: &str,
    ) -> Result<(Value, i64, i64)> {
        let now = self.ledger.now_ms();
        let mut meta = match &cur.meta {
            Some(m) => m.clone(),
            None => self.new_metadata(columns, now)?,
        };
        self.take_in_schema(&mut meta, columns)?;
        let (spec, fields) = self.spec(&meta)?;
        let partition_avro = schema::partition_avro(&fields)?;
        let schema_json = current_schema(&meta).map(|s| s.to_string()).unwrap_or_default();
        let seq = meta.get("last-sequence-number").and_then(Value::as_i64).unwrap_or(0) + 1;
        let id = snapshot_id();
        let tag = uuid();
        let dir = self.metadata_dir();
        let mut list: Vec<ManifestFile> = Vec::new();
        let (mut deleted_files, mut deleted_records, mut deleted_bytes) = (0i64, 0i64, 0i64);
        for (k, (m, entries)) in cur.manifests.iter().enumerate() {
            if m.content != 0 || !entries.iter().any(|e| e.status != DELETED && drops.contains(&e.path)) {
                list.push(m.clone());
                continue;
            }
            // A manifest naming a file to delete is written again: that file deleted, the
            // others it has kept as they are (existing), the ones it had deleted left out.
            if m.spec_id as i64 != spec.get("spec-id").and_then(Value::as_i64).unwrap_or(0) {
                return Err(IcebergError::Schema(format!(
                    "manifest {} of table {} is of partition spec {}, not the table's: Ferry does not rewrite it",
                    m.path,
                    self.name(),
                    m.spec_id
                )));
            }
            let kept: Vec<Entry> = entries
                .iter()
                .filter(|e| e.status != DELETED)
                .map(|e| {
                    let mut e = e.clone();
                    if drops.contains(&e.path) {
                        e.status = DELETED;
                        e.snapshot_id = id;
                        deleted_files += 1;
                        deleted_records += e.records;
                        deleted_bytes += e.size;
                    } else {
                        e.status = EXISTING;
                    }
                    e
                })
                .collect();
            let bytes = manifest::write_manifest(&kept, &partition_avro, &schema_json, &spec)?;
            let path = format!("{dir}/{tag}-m{k}.avro");
            list.push(manifest_file(&self.dest.url(&path), bytes.len(), &kept, id, seq, m.spec_id));
            self.dest.create_new(&path, bytes).await?;
        }
        if !adds.is_empty() {
            let mut entries = Vec::new();
            for (url, p) in adds {
                entries.push(Entry {
                    status: ADDED,
                    snapshot_id: id,
                    seq,
                    file_seq: seq,
                    content: 0,
                    path: url.clone(),
                    format: "PARQUET".into(),
                    partition: schema::partition_tuple(&p.partition, &fields)?,
                    records: p.records,
                    size: p.bytes,
                });
            }
            let bytes = manifest::write_manifest(&entries, &partition_avro, &schema_json, &spec)?;
            let path = format!("{dir}/{tag}-m{}.avro", cur.manifests.len());
            let spec_id = spec.get("spec-id").and_then(Value::as_i64).unwrap_or(0) as i32;
            list.insert(0, manifest_file(&self.dest.url(&path), bytes.len(), &entries, id, seq, spec_id));
            self.dest.create_new(&path, bytes).await?;
        }
        let parent = cur.snapshot_id();
        let list_path = format!("{dir}/snap-{id}-{tag}.avro");
        self.dest.create_new(&list_path, manifest::write_list(&list, id, parent, seq)?).await?;

        let live: Vec<&Entry> = cur.live().filter(|e| !drops.contains(&e.path)).collect();
        let added_records: i64 = adds.iter().map(|(_, p)| p.records).sum();
        let added_bytes: i64 = adds.iter().map(|(_, p)| p.bytes).sum();
        let operation = match (adds.is_empty(), drops.is_empty()) {
            (false, true) => "append",
            (true, false) => "delete",
            _ => "overwrite",
        };
        let summary = json!({
            "operation": operation,
            "added-data-files": adds.len().to_string(),
            "added-records": added_records.to_string(),
            "added-files-size": added_bytes.to_string(),
            "deleted-data-files": deleted_files.to_string(),
            "deleted-records": deleted_records.to_string(),
            "removed-files-size": deleted_bytes.to_string(),
            "total-data-files": (live.len() + adds.len()).to_string(),
            "total-records": (live.iter().map(|e| e.records).sum::<i64>() + added_records).to_string(),
            "total-files-size": (live.iter().map(|e| e.size).sum::<i64>() + added_bytes).to_string(),
            "ferry.pipeline": self.cfg.pipeline,
            "ferry.chunks": marker,
            "engine-name": "ferry",
            "engine-version": env!("CARGO_PKG_VERSION"),
        });
        // Snapshot times only grow, as readers' time travel expects.
        let last = meta.get("last-updated-ms").and_then(Value::as_i64).unwrap_or(0);
        let at = now.max(last + 1);
        let mut snap = json!({
            "snapshot-id": id,
            "sequence-number": seq,
            "timestamp-ms": at,
            "manifest-list": self.dest.url(&list_path),
            "summary": summary,
            "schema-id": meta.get("current-schema-id").cloned().unwrap_or(json!(0)),
        });
        if let Some(p) = parent {
            snap["parent-snapshot-id"] = json!(p);
        }
        push(&mut meta, "snapshots", snap);
        meta["current-snapshot-id"] = json!(id);
        meta["last-sequence-number"] = json!(seq);
        // The main branch moves; its other settings (retention) and every other ref stay.
        match meta.get_mut("refs").and_then(|r| r.get_mut("main")).and_then(Value::as_object_mut) {
            Some(main) => {
                main.insert("snapshot-id".into(), json!(id));
            }
            None => {
                if !meta.get("refs").is_some_and(Value::is_object) {
                    meta["refs"] = json!({});
                }
                meta["refs"]["main"] = json!({"snapshot-id": id, "type": "branch"});
            }
        }
        push(&mut meta, "snapshot-log", json!({"timestamp-ms": at, "snapshot-id": id}));
        if let Some(old) = &cur.location {
            push(&mut meta, "metadata-log", json!({"timestamp-ms": last, "metadata-file": old}));
            let keep =
                property(&meta, "write.metadata.previous-versions-max").and_then(|v| v.parse().ok()).unwrap_or(PREVIOUS_VERSIONS_MAX);
            if let Some(log) = meta.get_mut("metadata-log").and_then(Value::as_array_mut)
                && log.len() > keep
            {
                log.drain(..log.len() - keep);
            }
        }
        meta["last-updated-ms"] = json!(at);
        Ok((meta, id, seq))
    }

    /// Commits `meta` (from [`IcebergTable::write_snapshot`], snapshot `id`) over `cur`,
    /// recording `entries` (and confirming `lease`, when given) with it: in the ledger's catalog,
    /// the metadata file written and the row moved in the ledger transaction; in a REST catalog,
    /// the commit sent (a lost reply settled by reading the table), then the record.
    async fn commit_meta(
        &self,
        cur: &Current,
        meta: &Value,
        id: i64,
        lease: Option<&Lease>,
        entries: &[(&Lease, Record<'_>)],
    ) -> Result<Swapped, TableError> {
        match &self.catalog {
            Catalog::Ledger => {
                let new = self.write_metadata(cur, meta).await?;
                let swap = self.swap(cur.location.as_deref(), &new);
                let ended = match lease {
                    Some(lease) => self.ledger.commit_catalog(lease, Some(&swap)).await?,
                    None => self.ledger.record_published_with(Some(&swap), entries).await?,
                };
                if ended == Swapped::Done {
                    tracing::debug!(metadata = %new, "committed to the Iceberg table");
                }
                Ok(ended)
            }
            Catalog::Rest(rest) => {
                // The lease first: a load whose lease another claim took commits nothing.
                if let Some(lease) = lease {
                    self.ledger.commit_catalog(lease, None).await?;
                }
                for (lease, _) in entries {
                    self.ledger.commit_catalog(lease, None).await?;
                }
                if !self.rest_commit(rest, cur, meta, id).await.map_err(table_error)? {
                    return Ok(Swapped::Lost);
                }
                if entries.is_empty() {
                    return Ok(Swapped::Done);
                }
                // In the table now: a record that fails leaves files the retry finds in the
                // snapshot and records.
                Ok(self.ledger.record_published_with(None, entries).await?)
            }
        }
    }

    /// Writes `meta` as the metadata file that follows `cur`'s (under a name no other writer
    /// takes) for the ledger's catalog to point at; its URL.
    async fn write_metadata(&self, cur: &Current, meta: &Value) -> Result<String, TableError> {
        let n = cur.location.as_deref().and_then(metadata_number).map_or(0, |n| n + 1);
        let path = format!("{}/{n:05}-{}.metadata.json", self.metadata_dir(), uuid());
        let text = serde_json::to_vec_pretty(meta).map_err(|e| table_error(IcebergError::Metadata(e.to_string())))?;
        self.dest.create_new(&path, text).await?;
        Ok(self.dest.url(&path))
    }

    /// Sends the commit of snapshot `id` to the REST catalog: true if it is in the table. An
    /// answer lost (a reset, a timeout, a 5xx) is settled by reading the table for the snapshot.
    async fn rest_commit(&self, rest: &RestCatalog, cur: &Current, meta: &Value, id: i64) -> Result<bool> {
        let base = cur.meta.as_ref().ok_or_else(|| IcebergError::Metadata(format!("table {}: no metadata to commit over", self.name())))?;
        let (requirements, updates) = rest_changes(base, meta, id)?;
        let settle = match rest.commit(requirements, updates).await {
            // The catalog's answer names the table it made: the snapshot is in it (any other
            // 2xx, e.g. a redirect followed as a GET, is settled by reading the table).
            Ok(Committed::Done(answer)) if answer.as_ref().and_then(|m| snapshot(m, id)).is_some() => return Ok(true),
            Ok(Committed::Done(_)) => None,
            Ok(Committed::Conflict) => return Ok(false),
            Err(IcebergError::Storage(e)) => Some(e),
            Err(e) => return Err(e),
        };
        if let Some(e) = &settle {
            tracing::warn!(snapshot = id, error = %e, "the catalog's answer to a commit was lost; reading the table to settle it");
        }
        match rest.load().await {
            Ok(Some((_, now))) if snapshot(&now, id).is_some() => Ok(true),
            // Not in: planned again against the table as it is (the commit, if it is still on
            // its way, fails its requirement on main).
            Ok(_) => Ok(false),
            Err(e) => Err(settle.map_or(e, IcebergError::Storage)),
        }
    }

    /// The metadata of a new table: Ferry's schema, the identity spec of `partition_by`, no
    /// snapshot yet.
    fn new_metadata(&self, columns: &[SchemaColumn], now: i64) -> Result<Value> {
        let (schema, last_column_id) = schema::new_schema(columns)?;
        let spec = schema::new_spec(&schema, &self.cfg.table.partition_by)?;
        let last_partition_id = schema::FIRST_PARTITION_FIELD_ID - 1 + self.cfg.table.partition_by.len() as i64;
        Ok(json!({
            "format-version": FORMAT_VERSION,
            "table-uuid": uuid(),
            "location": self.dest.url(self.name()),
            "last-sequence-number": 0,
            "last-updated-ms": now,
            "last-column-id": last_column_id,
            "current-schema-id": 0,
            "schemas": [schema],
            "default-spec-id": 0,
            "partition-specs": [spec],
            "last-partition-id": last_partition_id,
            "properties": {NAME_MAPPING: schema::name_mapping(&schema, None).to_string()},
            "current-snapshot-id": -1,
            "snapshots": [],
            "snapshot-log": [],
            "metadata-log": [],
            "sort-orders": [{"order-id": 0, "fields": []}],
            "default-sort-order-id": 0,
            "refs": {},
        }))
    }

    /// Takes Ferry's columns into the table's schema (see [`schema::evolve`]): a new schema
    /// made current, and the name mapping updated, when they change it.
    fn take_in_schema(&self, meta: &mut Value, columns: &[SchemaColumn]) -> Result<()> {
        let current =
            current_schema(meta).cloned().ok_or_else(|| IcebergError::Metadata(format!("table {}: no current schema", self.name())))?;
        let highest =
            meta.get("schemas").and_then(Value::as_array).into_iter().flatten().filter_map(|s| s.get("schema-id")?.as_i64()).max();
        let last = meta.get("last-column-id").and_then(Value::as_i64).unwrap_or(0);
        let evolved = schema::evolve(&current, highest.unwrap_or(0), last, columns, self.name())?;
        let (schema, last) = match evolved {
            Some((s, last)) => (s, last),
            None if property(meta, NAME_MAPPING).is_some() => return Ok(()),
            None => (current, last),
        };
        let earlier: Option<Value> = property(meta, NAME_MAPPING).and_then(|m| serde_json::from_str(&m).ok());
        let mapping = schema::name_mapping(&schema, earlier.as_ref()).to_string();
        if schema.get("schema-id") != current_schema(meta).and_then(|s| s.get("schema-id")) {
            meta["current-schema-id"] = schema["schema-id"].clone();
            push(meta, "schemas", schema);
            meta["last-column-id"] = json!(last);
        }
        if !meta.get("properties").is_some_and(Value::is_object) {
            meta["properties"] = json!({});
        }
        meta["properties"][NAME_MAPPING] = json!(mapping);
        Ok(())
    }

    /// The table's default spec, checked against `partition_by`, and its fields.
    fn spec(&self, meta: &Value) -> Result<(Value, Vec<PartitionField>)> {
        let id = meta.get("default-spec-id").and_then(Value::as_i64).unwrap_or(0);
        let spec = meta
            .get("partition-specs")
            .and_then(Value::as_array)
            .and_then(|ss| ss.iter().find(|s| s.get("spec-id").and_then(Value::as_i64) == Some(id)))
            .cloned()
            .ok_or_else(|| IcebergError::Metadata(format!("table {}: default spec {id} is not in its specs", self.name())))?;
        let schema = current_schema(meta).ok_or_else(|| IcebergError::Metadata(format!("table {}: no current schema", self.name())))?;
        let fields = schema::spec_fields(&spec, schema, &self.cfg.table.partition_by, self.name())?;
        Ok((spec, fields))
    }

    /// Creates the table in the REST catalog with Ferry's schema and the spec of
    /// `partition_by`, at `<destination>/<table>`.
    async fn rest_create(&self, rest: &RestCatalog, columns: &[SchemaColumn]) -> Result<()> {
        let (schema, _) = schema::new_schema(columns)?;
        let spec = schema::new_spec(&schema, &self.cfg.table.partition_by)?;
        rest.create(&schema, &spec, &self.dest.url(self.name())).await
    }

    fn swap<'a>(&'a self, old: Option<&'a str>, new: &'a str) -> CatalogSwap<'a> {
        let ice = &self.cfg.destination.iceberg;
        CatalogSwap { catalog: &ice.catalog_name, namespace: &ice.namespace, table: self.name(), old, new }
    }

    /// Publishes one chunk: its parts into the directory, then one snapshot committed with
    /// the ledger's record of it.
    async fn publish_chunk(&self, job: &Job<'_>) -> Result<Outcome, TableError> {
        let Job { lease, dest, parts, moving, siblings: _, version } = *job;
        let name = self.name().to_string();
        for p in moving {
            ferry_table::place(dest, &name, p).await?;
        }
        let columns = match self.ledger.table_schemas(&name).await?.pop() {
            Some(v) => v.columns,
            None => return Err(TableError::Stage(TableFailure::Table(format!("no schema of table {name} is recorded")))),
        };
        let every_version = match version {
            Some(v) => Some((v.version, self.ledger.chunks_of_every_version(&lease.chunk_id).await?.into_iter().collect())),
            None => None,
        };
        let chunks: HashSet<String> = moving.iter().map(|p| p.chunk_id.clone()).chain([lease.chunk_id.clone()]).collect();
        let mut marker: Vec<String> = chunks.iter().map(|c| format!("{c}@{}", lease.epoch)).collect();
        marker.sort();
        let url = |p: &Part| self.dest.url(&paths::table_file(&name, &part_rel(p)));
        let mut recorded = HashMap::new();
        for c in &chunks {
            for (path, _) in self.ledger.published_of(c).await? {
                recorded.insert(self.dest.url(&path), c.clone());
            }
        }
        let plan = Plan {
            parts: moving.iter().map(|p| (url(p), p.clone())).collect(),
            chunks,
            version: every_version,
            skipped: version
                .filter(|v| v.replaces)
                .map(|v| v.chunks.iter().filter(|c| c.skipped).map(|c| c.id.clone()).collect())
                .unwrap_or_default(),
            replaces: version.is_some_and(|v| v.replaces),
            columns,
            marker: marker.join(","),
            recorded,
            table: name.clone(),
        };
        let published: Vec<(String, Part)> = parts.iter().map(|p| (paths::table_file(&name, &part_rel(p)), p.clone())).collect();
        let replace = version.is_some();
        let plan = Arc::new(plan);
        let mut alone = false;
        let answer = loop {
            let (answer, mut rx) = tokio::sync::oneshot::channel();
            self.lock_queue().push(Queued {
                plan: plan.clone(),
                lease: lease.clone(),
                published: published.clone(),
                replace,
                alone,
                answer,
            });
            // An answer dropped unsent (a committer that panicked) is taken as "alone".
            let answered = |rx: &mut tokio::sync::oneshot::Receiver<Answer>| match rx.try_recv() {
                Ok(reply) => Some(reply),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => None,
                Err(tokio::sync::oneshot::error::TryRecvError::Closed) => Some(Answer::Alone),
            };
            let reply = loop {
                let one = self.commits.lock().await;
                // Another task's commit took this plan while this one waited for the lock.
                if let Some(reply) = answered(&mut rx) {
                    break reply;
                }
                self.commit_queued().await;
                drop(one);
                if let Some(reply) = answered(&mut rx) {
                    break reply;
                }
            };
            match reply {
                Answer::Alone => alone = true,
                other => break other,
            }
        };
        match answer {
            Answer::Done => {}
            Answer::Failed(e) => return Err(e),
            Answer::Superseded => {
                tracing::info!(chunk = %lease.chunk_id, "a newer version of its source file is in the table; not added");
                if self.withdraw_chunk(dest, lease).await? {
                    return Ok(Outcome::Superseded);
                }
                return Err(TableError::Stage(TableFailure::Waiting {
                    reason: "the table holds a newer version of the source file, the ledger does not yet".into(),
                    after: WAIT_BRIEFLY,
                }));
            }
            Answer::Alone | Answer::Busy => {
                return Err(TableError::Stage(TableFailure::Waiting {
                    reason: format!("other writers committed to Iceberg table {name} first {ROUNDS} times; trying again later"),
                    after: WAIT_BRIEFLY,
                }));
            }
        }
        if let Some(v) = version {
            // The older versions' files left the table in the snapshot; their rows go now.
            let old: Vec<String> = self.ledger.older_versions_published(&lease.chunk_id).await?.into_iter().map(|(p, _)| p).collect();
            if !old.is_empty() {
                self.ledger.retract_published(&v.uri, &old).await?;
            }
        }
        Ok(Outcome::Published)
    }

    fn lock_queue(&self) -> std::sync::MutexGuard<'_, Vec<Queued>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One commit of the plans queued now (the caller holds `commits`): group commit. On HDFS
    /// a snapshot costs three files' closes (~0.5 s each) whatever it holds, so chunks ready
    /// together go in one snapshot, their ledger rows in its transaction. Each plan is judged on
    /// its own against the snapshot (a refusal, a supersession, nothing to do are its own); plans
    /// that touch a chunk or a source file of another plan in the commit, or bring another
    /// schema, wait for the next one; a commit of several plans that fails is made again by each
    /// plan alone, so no chunk fails for another's error. Every plan taken is answered, or put
    /// back in the queue.
    async fn commit_queued(&self) {
        let mut batch: Vec<Queued> = {
            let mut queue = self.lock_queue();
            match queue.iter().position(|q| q.alone) {
                Some(i) => vec![queue.remove(i)],
                None => std::mem::take(&mut *queue),
            }
        };
        let fail = |batch: Vec<Queued>, e: TableError| {
            if batch.len() == 1 {
                if let Some(q) = batch.into_iter().next() {
                    let _ = q.answer.send(Answer::Failed(e));
                }
            } else {
                batch.into_iter().for_each(|q| q.answer.send(Answer::Alone).unwrap_or(()));
            }
        };
        for _ in 0..ROUNDS {
            // A plan whose load was cut off (its deadline) is not committed for it.
            batch.retain(|q| !q.answer.is_closed());
            if batch.is_empty() {
                return;
            }
            let cur = match self.current().await {
                Ok(cur) => cur,
                Err(e) => return fail(batch, table_error(e)),
            };
            // A REST catalog makes the table (its ids, its location) itself: created first, then
            // read as the catalog wrote it.
            if let (Catalog::Rest(rest), None) = (&self.catalog, &cur.meta) {
                if let Err(e) = self.rest_create(rest, &batch[0].plan.columns).await {
                    return fail(batch, table_error(e));
                }
                continue;
            }
            let (mut adds, mut drops, mut markers) = (Vec::new(), HashSet::new(), Vec::new());
            let mut taken: Vec<Queued> = Vec::new();
            let mut later: Vec<Queued> = Vec::new();
            for q in std::mem::take(&mut batch) {
                if taken.iter().any(|t| !independent(&t.plan, &q.plan)) {
                    later.push(q);
                    continue;
                }
                let reply = match q.plan.against(&cur) {
                    Planned::Refused(why) => Answer::Failed(TableError::Stage(TableFailure::Table(why))),
                    Planned::Superseded => Answer::Superseded,
                    Planned::Nothing(id) => match self.ledger.record_published(&q.lease, self.name(), &q.published, q.replace, id).await {
                        Ok(true) => Answer::Done,
                        Ok(false) => Answer::Superseded,
                        Err(e) => Answer::Failed(e.into()),
                    },
                    Planned::Commit { adds: a, drops: d } => {
                        adds.extend(a);
                        drops.extend(d);
                        markers.push(q.plan.marker.clone());
                        taken.push(q);
                        continue;
                    }
                };
                let _ = q.answer.send(reply);
            }
            self.lock_queue().splice(0..0, later);
            if taken.is_empty() {
                return;
            }
            let columns = taken[0].plan.columns.clone();
            let (meta, id, seq) = match self.write_snapshot(&cur, &columns, &adds, &drops, &markers.join(",")).await {
                Ok(written) => written,
                Err(e) => return fail(taken, table_error(e)),
            };
            let entries: Vec<(&Lease, Record<'_>)> = taken
                .iter()
                .map(|q| (&q.lease, Record { table: self.name(), parts: &q.published, replace: q.replace, table_version: Some(id) }))
                .collect();
            let ended = self.commit_meta(&cur, &meta, id, None, &entries).await;
            drop(entries);
            match ended {
                Ok(Swapped::Done) => {
                    tracing::debug!(chunks = taken.len(), sequence = seq, snapshot = id, "committed to the Iceberg table");
                    taken.into_iter().for_each(|q| q.answer.send(Answer::Done).unwrap_or(()));
                    return;
                }
                Ok(Swapped::Superseded) if taken.len() == 1 => {
                    taken.into_iter().for_each(|q| q.answer.send(Answer::Superseded).unwrap_or(()));
                    return;
                }
                Ok(Swapped::Superseded) => return taken.into_iter().for_each(|q| q.answer.send(Answer::Alone).unwrap_or(())),
                // Another writer moved the catalog's row first: every plan made again on its table.
                Ok(Swapped::Lost) => {
                    tracing::debug!(chunks = taken.len(), "another writer committed to the Iceberg table first; planning again");
                    batch = taken;
                }
                Err(e) => return fail(taken, e),
            }
        }
        batch.into_iter().for_each(|q| q.answer.send(Answer::Busy).unwrap_or(()));
    }

    /// `ferry vacuum`: Ferry's snapshots older than the cutoff expired (not a ref's head, not
    /// the newest `history.expire.min-snapshots-to-keep` of main; other writers' snapshots are
    /// theirs to expire), then the files of Ferry's that no snapshot left needs deleted: data
    /// files no live entry names (of settled chunks, written before the cutoff: a load at work
    /// may still commit one), and the manifest lists and manifests of Ferry's expired snapshots.
    async fn vacuum_table(&self, retain: Option<std::time::Duration>, allow_short: bool, dry_run: bool) -> Result<Vacuumed, TableError> {
        let cur = self.current().await.map_err(table_error)?;
        let Some(meta) = cur.meta.as_ref() else { return Ok(Vacuumed::default()) };
        let prop = |k: &str, default: i64| property(meta, k).and_then(|v| v.parse::<i64>().ok()).unwrap_or(default);
        let table_ms = prop("history.expire.max-snapshot-age-ms", MAX_SNAPSHOT_AGE_MS);
        let min_keep = prop("history.expire.min-snapshots-to-keep", 1).max(1) as usize;
        let retain_ms = retain.map_or(table_ms, |d| d.as_millis().min(i64::MAX as u128) as i64);
        if retain_ms < table_ms && !allow_short {
            let human = |ms: i64| humantime::format_duration(std::time::Duration::from_millis(ms as u64)).to_string();
            return Err(ConfigError::new(
                "--retain",
                format!(
                    "{} is shorter than the table's history.expire.max-snapshot-age-ms ({}): readers of snapshots within it \
                     would fail; pass --allow-short-retention to do it anyway",
                    human(retain_ms),
                    human(table_ms)
                ),
            )
            .into());
        }
        let now = self.ledger.now_ms();
        let cutoff = now.saturating_sub(retain_ms);
        let mut out = Vacuumed::default();
        // The snapshots to expire, and what they name, read before they go.
        let mut cur = cur;
        let mut expired_files: HashSet<String> = HashSet::new();
        // Every data file a manifest read here names, live or deleted: a file of Ferry's outside
        // it was never committed.
        let mut named: HashSet<String> = HashSet::new();
        for round in 0..=ROUNDS {
            let meta = cur.meta.as_ref().expect("read above");
            let expired = expirable(meta, cutoff, min_keep, &self.cfg.pipeline);
            if expired.is_empty() {
                break;
            }
            if round == ROUNDS {
                return Err(TableError::Stage(TableFailure::Waiting {
                    reason: format!("other writers committed to Iceberg table {} first {ROUNDS} times; trying again later", self.name()),
                    after: WAIT_BRIEFLY,
                }));
            }
            for id in &expired {
                let Some(list_url) = snapshot(meta, *id).and_then(|s| s.get("manifest-list")?.as_str()) else { continue };
                expired_files.insert(canon(list_url).into_owned());
                for m in self.read_list(list_url).await.map_err(table_error)? {
                    if expired.contains(&m.added_snapshot_id) {
                        expired_files.insert(canon(&m.path).into_owned());
                        if m.content == 0 {
                            named
                                .extend(self.read_entries(&m).await.map_err(table_error)?.into_iter().map(|e| canon(&e.path).into_owned()));
                        }
                    }
                }
            }
            if dry_run {
                break;
            }
            let mut next = meta.clone();
            let keep = |v: &Value, key: &str| v.get(key).and_then(Value::as_i64).is_none_or(|id| !expired.contains(&id));
            if let Some(snaps) = next.get_mut("snapshots").and_then(Value::as_array_mut) {
                snaps.retain(|s| keep(s, "snapshot-id"));
            }
            if let Some(log) = next.get_mut("snapshot-log").and_then(Value::as_array_mut) {
                log.retain(|s| keep(s, "snapshot-id"));
            }
            let ids: Vec<i64> = expired.iter().copied().collect();
            let done = match &self.catalog {
                Catalog::Ledger => {
                    if let Some(old) = &cur.location {
                        push(&mut next, "metadata-log", json!({"timestamp-ms": meta.get("last-updated-ms"), "metadata-file": old}));
                    }
                    next["last-updated-ms"] = json!(now.max(meta.get("last-updated-ms").and_then(Value::as_i64).unwrap_or(0) + 1));
                    let new = self.write_metadata(&cur, &next).await?;
                    self.ledger.swap_catalog(&self.swap(cur.location.as_deref(), &new)).await? == Swapped::Done
                }
                Catalog::Rest(rest) => {
                    let requirements = json!([
                        {"type": "assert-table-uuid", "uuid": meta.get("table-uuid")},
                        {"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": meta.pointer("/refs/main/snapshot-id")},
                    ]);
                    let updates = json!([{"action": "remove-snapshots", "snapshot-ids": ids}]);
                    matches!(rest.commit(requirements, updates).await.map_err(table_error)?, Committed::Done(_))
                }
            };
            if done {
                tracing::info!(snapshots = ids.len(), "expired Ferry's snapshots past the retention");
                break;
            }
            cur = self.current().await.map_err(table_error)?;
        }
        // In this order: the listing, the ledger, the table. A part listed here whose chunk the
        // ledger then shows settled had its commit (if any) before that, so the table read
        // after names it; a part placed after the listing is not a candidate.
        let name = self.name().to_string();
        let listed = self.dest.list(&name).await?;
        let chunks: Vec<String> = listed.iter().filter_map(|e| chunk_of(&e.rel).map(str::to_string)).collect();
        let settled = self.ledger.settled_chunks(&chunks).await?;
        // What the snapshots left need, read after the expiry (another writer's commit since
        // then names only files its snapshot's parent had, or new ones).
        let cur = if dry_run { cur } else { self.current().await.map_err(table_error)? };
        let meta = cur.meta.as_ref().expect("the table exists");
        let expired_now: HashSet<i64> = if dry_run { expirable(meta, cutoff, min_keep, &self.cfg.pipeline) } else { HashSet::new() };
        let mut needed: HashSet<String> = HashSet::new();
        for s in meta.get("snapshots").and_then(Value::as_array).into_iter().flatten() {
            if s.get("snapshot-id").and_then(Value::as_i64).is_some_and(|id| expired_now.contains(&id)) {
                continue;
            }
            let Some(list_url) = s.get("manifest-list").and_then(Value::as_str) else { continue };
            needed.insert(canon(list_url).into_owned());
            for m in self.read_list(list_url).await.map_err(table_error)? {
                needed.insert(canon(&m.path).into_owned());
                if m.content != 0 {
                    continue;
                }
                for e in self.read_entries(&m).await.map_err(table_error)? {
                    let path = canon(&e.path).into_owned();
                    if e.status != DELETED {
                        needed.insert(path.clone());
                    }
                    named.insert(path);
                }
            }
        }
        let mut gone: Vec<(String, i64, bool)> = Vec::new();
        for e in &listed {
            let url = self.dest.url(&e.rel);
            if needed.contains(&url) {
                continue;
            }
            if expired_files.contains(&url) {
                gone.push((e.rel.clone(), e.size as i64, false));
            } else if let Some(c) = chunk_of(&e.rel) {
                if e.mtime_ms >= cutoff {
                    out.kept += 1;
                } else if !settled.contains(c) {
                    out.again += 1;
                } else {
                    gone.push((e.rel.clone(), e.size as i64, !named.contains(&url)));
                }
            }
        }
        gone.sort();
        for (path, size, untracked) in gone {
            if !dry_run {
                match self.dest.delete(&path).await {
                    Ok(()) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e.into()),
                }
            }
            out.deleted.push(self.dest.url(&path));
            out.files += 1;
            out.bytes += size;
            out.untracked += usize::from(untracked);
        }
        out.version = meta.get("last-sequence-number").and_then(Value::as_i64).unwrap_or(0);
        Ok(out)
    }

    /// A manifest list, read.
    async fn read_list(&self, url: &str) -> Result<Vec<ManifestFile>> {
        manifest::read_list(&self.dest.read(&rel(&self.dest, url)?).await?, url)
    }

    /// A data manifest's entries, read.
    async fn read_entries(&self, m: &ManifestFile) -> Result<Vec<Entry>> {
        manifest::read_manifest(&self.dest.read(&rel(&self.dest, &m.path)?).await?, m)
    }

    /// A superseded chunk: recorded as withdrawn (durably), then its files deleted from the
    /// table in a snapshot of their own (fenced by its lease), then its landed files removed.
    async fn withdraw_chunk(&self, dest: &Store, lease: &Lease) -> Result<bool, TableError> {
        let chunk = lease.chunk_id.as_str();
        let Some(newer) = self.ledger.begin_withdrawal(lease).await? else { return Ok(false) };
        tracing::info!(chunk, newer_version = newer, "withdrawing: a newer version of its source file is in the table");
        ferry_table::withdraw_gate().await;
        self.ledger.make_durable().await?;
        {
            let _one = self.commits.lock().await;
            for round in 0.. {
                let cur = self.current().await.map_err(table_error)?;
                let drops: HashSet<String> = cur.live().filter(|e| chunk_of(&e.path) == Some(chunk)).map(|e| e.path.clone()).collect();
                if drops.is_empty() {
                    break;
                }
                if round == ROUNDS {
                    return Err(TableError::Stage(TableFailure::Waiting {
                        reason: format!(
                            "other writers committed to Iceberg table {} first {ROUNDS} times; trying again later",
                            self.name()
                        ),
                        after: WAIT_BRIEFLY,
                    }));
                }
                let marker = format!("{chunk}@{}", lease.epoch);
                let (meta, id, seq) = self.write_snapshot(&cur, &[], &[], &drops, &marker).await.map_err(table_error)?;
                if self.commit_meta(&cur, &meta, id, Some(lease), &[]).await? == Swapped::Done {
                    tracing::info!(chunk, sequence = seq, "took the superseded chunk's files out of the table");
                    break;
                }
            }
        }
        ferry_table::remove_landed(&self.ledger, dest, self.name(), chunk).await?;
        Ok(true)
    }
}

/// The REST commit that makes `meta` (snapshot `id`) of `base`: its requirements (the table,
/// its main branch where Ferry read it, the schema it evolves) and its updates (the schema, the
/// properties Ferry changed, the snapshot, main moved to it with its retention kept).
fn rest_changes(base: &Value, meta: &Value, id: i64) -> Result<(Value, Value)> {
    let main = base.pointer("/refs/main/snapshot-id").and_then(Value::as_i64);
    let mut requirements = vec![
        json!({"type": "assert-table-uuid", "uuid": base.get("table-uuid").cloned().unwrap_or(Value::Null)}),
        json!({"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": main}),
    ];
    let mut updates = Vec::new();
    if meta.get("current-schema-id") != base.get("current-schema-id") {
        requirements.push(json!({"type": "assert-current-schema-id", "current-schema-id": base.get("current-schema-id")}));
        requirements.push(json!({"type": "assert-last-assigned-field-id", "last-assigned-field-id": base.get("last-column-id")}));
        let schema = current_schema(meta).ok_or_else(|| IcebergError::Metadata("the new metadata has no current schema".into()))?;
        updates.push(json!({"action": "add-schema", "schema": schema, "last-column-id": meta.get("last-column-id")}));
        updates.push(json!({"action": "set-current-schema", "schema-id": -1}));
    }
    let changed: serde_json::Map<String, Value> = meta
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(k, v)| base.get("properties").and_then(|p| p.get(k.as_str())) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !changed.is_empty() {
        updates.push(json!({"action": "set-properties", "updates": changed}));
    }
    let snap = snapshot(meta, id).ok_or_else(|| IcebergError::Metadata(format!("snapshot {id} is not in the new metadata")))?;
    updates.push(json!({"action": "add-snapshot", "snapshot": snap}));
    let mut set_ref = json!({"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": id});
    for key in ["min-snapshots-to-keep", "max-snapshot-age-ms", "max-ref-age-ms"] {
        if let Some(v) = meta.pointer(&format!("/refs/main/{key}")) {
            set_ref[key] = v.clone();
        }
    }
    updates.push(set_ref);
    Ok((Value::Array(requirements), Value::Array(updates)))
}

/// The snapshots `ferry vacuum` expires: this pipeline's (`ferry.chunks` in the summary,
/// `ferry.pipeline` its name) older than `cutoff`, but never the current one, a ref's head, or
/// one of the newest `min_keep` of main's line.
fn expirable(meta: &Value, cutoff: i64, min_keep: usize, pipeline: &str) -> HashSet<i64> {
    let snaps: Vec<&Value> = meta.get("snapshots").and_then(Value::as_array).into_iter().flatten().collect();
    let mut keep: HashSet<i64> = HashSet::new();
    if let Some(refs) = meta.get("refs").and_then(Value::as_object) {
        keep.extend(refs.values().filter_map(|r| r.get("snapshot-id")?.as_i64()));
    }
    keep.extend(meta.get("current-snapshot-id").and_then(Value::as_i64));
    let parent: HashMap<i64, i64> =
        snaps.iter().filter_map(|s| Some((s.get("snapshot-id")?.as_i64()?, s.get("parent-snapshot-id")?.as_i64()?))).collect();
    let mut at = meta.pointer("/refs/main/snapshot-id").and_then(Value::as_i64);
    for _ in 0..min_keep {
        let Some(id) = at else { break };
        keep.insert(id);
        at = parent.get(&id).copied();
    }
    snaps
        .iter()
        .filter(|s| s.pointer("/summary/ferry.chunks").is_some())
        .filter(|s| s.pointer("/summary/ferry.pipeline").and_then(Value::as_str) == Some(pipeline))
        .filter(|s| s.get("timestamp-ms").and_then(Value::as_i64).is_some_and(|t| t < cutoff))
        .filter_map(|s| s.get("snapshot-id")?.as_i64())
        .filter(|id| !keep.contains(id))
        .collect()
}

/// The manifest-list entry of a manifest this snapshot wrote.
fn manifest_file(url: &str, length: usize, entries: &[Entry], id: i64, seq: i64, spec_id: i32) -> ManifestFile {
    let count = |s: i32| entries.iter().filter(|e| e.status == s).count() as i32;
    let rows = |s: i32| entries.iter().filter(|e| e.status == s).map(|e| e.records).sum::<i64>();
    ManifestFile {
        path: url.to_string(),
        length: length as i64,
        spec_id,
        content: 0,
        seq,
        min_seq: entries.iter().map(|e| if e.status == ADDED { seq } else { e.seq }).min().unwrap_or(seq),
        added_snapshot_id: id,
        added_files: count(ADDED),
        existing_files: count(EXISTING),
        deleted_files: count(DELETED),
        added_rows: rows(ADDED),
        existing_rows: rows(EXISTING),
        deleted_rows: rows(DELETED),
        partitions: None,
    }
}

fn snapshot(meta: &Value, id: i64) -> Option<&Value> {
    meta.get("snapshots")?.as_array()?.iter().find(|s| s.get("snapshot-id").and_then(Value::as_i64) == Some(id))
}

fn current_schema(meta: &Value) -> Option<&Value> {
    let id = meta.get("current-schema-id")?.as_i64()?;
    meta.get("schemas")?.as_array()?.iter().find(|s| s.get("schema-id").and_then(Value::as_i64) == Some(id))
}

fn property(meta: &Value, key: &str) -> Option<String> {
    meta.get("properties")?.get(key)?.as_str().map(str::to_string)
}

fn push(meta: &mut Value, key: &str, v: Value) {
    match meta.get_mut(key).and_then(Value::as_array_mut) {
        Some(a) => a.push(v),
        None => meta[key] = json!([v]),
    }
}

/// `00012` of `.../00012-<uuid>.metadata.json`.
fn metadata_number(url: &str) -> Option<u64> {
    url.rsplit('/').next()?.split('-').next()?.parse().ok()
}

#[async_trait::async_trait]
impl Table for IcebergTable {
    fn format(&self) -> &'static str {
        "iceberg"
    }

    fn store(&self) -> &Store {
        &self.dest
    }

    fn meta_dirs(&self) -> Vec<String> {
        vec![paths::table_meta(self.name()), self.metadata_dir()]
    }

    async fn publish(&self, job: &Job<'_>) -> Result<Outcome, TableError> {
        self.publish_chunk(job).await
    }

    async fn withdraw(&self, dest: &Store, lease: &Lease) -> Result<bool, TableError> {
        self.withdraw_chunk(dest, lease).await
    }

    /// In an Iceberg table, "in the table" is "a live data file of the current snapshot".
    async fn unrecorded(&self, chunk: &str) -> Result<Vec<String>, TableError> {
        let cur = self.current().await.map_err(table_error)?;
        let recorded: HashSet<String> = self.ledger.published_of(chunk).await?.into_iter().map(|(p, _)| p).collect();
        let mut out = Vec::new();
        for e in cur.live().filter(|e| chunk_of(&e.path) == Some(chunk)) {
            let rel = rel(&self.dest, &e.path).map_err(table_error)?;
            if !recorded.contains(&rel) {
                out.push(rel);
            }
        }
        Ok(out)
    }

    async fn vacuum(&self, retain: Option<std::time::Duration>, allow_short: bool, dry_run: bool) -> Result<Vacuumed, TableError> {
        self.vacuum_table(retain, allow_short, dry_run).await
    }

    async fn verify(&self) -> Result<Verified, TableError> {
        let mut out = Verified::default();
        let cur = self.current().await.map_err(table_error)?;
        let seq = cur.meta.as_ref().and_then(|m| m.get("last-sequence-number")?.as_i64()).unwrap_or(0);
        let live: HashMap<String, &Entry> = cur.live().filter_map(|e| Some((rel(&self.dest, &e.path).ok()?, e))).collect();
        let want = self.ledger.published_files(self.name()).await?;
        let foreign = cur.foreign();
        let mut recorded = HashSet::new();
        for (path, chunk, bytes) in &want {
            recorded.insert(path.as_str());
            match live.get(path) {
                // Taken out by another writer's snapshot (Ferry's own deletes leave no recorded
                // file out): that writer's to change, reported, not a fault of the table.
                None if foreign => {
                    out.rewritten += 1;
                    out.lines.push(format!(
                        "rewritten {path} (chunk {chunk}): deleted by another writer's snapshot (a DELETE, an overwrite, a \
                         compaction) before sequence {seq}"
                    ));
                }
                None => {
                    out.problems += 1;
                    out.bad_chunks.insert(chunk.clone());
                    out.lines.push(format!("missing  {path} (chunk {chunk}): not in the table's snapshot of sequence {seq}"));
                }
                Some(e) if e.size != *bytes => {
                    out.problems += 1;
                    out.bad_chunks.insert(chunk.clone());
                    out.lines.push(format!("size     {path}: {} bytes in the table, the ledger says {bytes} (chunk {chunk})", e.size));
                }
                Some(_) => {}
            }
        }
        let mut others = 0;
        for (path, _) in live.iter().filter(|(p, _)| !recorded.contains(p.as_str())) {
            match chunk_of(path) {
                Some(chunk) => {
                    out.problems += 1;
                    out.bad_chunks.insert(chunk.to_string());
                    out.lines.push(format!("unrecorded {path} (chunk {chunk}): in the table, not recorded as published"));
                }
                None => others += 1,
            }
        }
        out.lines.push(format!(
            "Iceberg table {}: {} data files at sequence {seq} ({others} of other writers), {} recorded by the ledger",
            self.name(),
            live.len(),
            want.len()
        ));
        Ok(out)
    }
}
