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
//!   `ferry:<pipeline>:<chunk>`, `version` = the load lease's epoch, which only grows), so
//!   readers and `ferry verify` can tell which commit brought which chunk; Delta keeps the
//!   latest per app id, and the table's `delta.setTransactionRetentionDuration` (7 days) lets
//!   checkpoints drop those of chunks loaded long ago.
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

use std::collections::{BTreeMap, HashMap};

use ferry_ledger::SchemaColumn;
use ferry_storage::Store;
use serde_json::{Value, json};

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
}

type Result<T, E = DeltaError> = std::result::Result<T, E>;

/// Reader and writer versions this writer produces and can append to.
const READER_VERSION: i64 = 1;
const WRITER_VERSION: i64 = 2;
/// With a `timestamp_ntz` column: table features (reader 3, writer 7), that one named.
const FEATURES_READER: i64 = 3;
const FEATURES_WRITER: i64 = 7;
/// How long a chunk's `txn` stays in the table's snapshot after its commit.
pub const TXN_RETENTION: &str = "interval 7 days";

/// A file the table's current version holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Active {
    pub size: i64,
    /// The version whose commit added it.
    pub added_in: i64,
}

/// The table as of one version: what a reader of that version sees.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// -1 before the first commit.
    pub version: i64,
    pub protocol: Option<Value>,
    pub metadata: Option<Value>,
    /// Active files by path (decoded, relative to the table).
    pub files: HashMap<String, Active>,
    /// appId -> (version, the table version that wrote it).
    pub txns: HashMap<String, (i64, i64)>,
}

impl Snapshot {
    fn empty() -> Snapshot {
        Snapshot { version: -1, ..Default::default() }
    }

    /// Applies one commit's actions (`version`'s), as the protocol's replay does.
    pub fn apply(&mut self, version: i64, text: &str) -> Result<()> {
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let action: Value = serde_json::from_str(line)
                .map_err(|e| DeltaError::Log(format!("commit {version}, line {}: not a JSON action ({e})", i + 1)))?;
            let path = |a: &Value| {
                a.get("path")
                    .and_then(Value::as_str)
                    .map(decode_path)
                    .ok_or_else(|| DeltaError::Log(format!("commit {version}, line {}: an action without a path", i + 1)))
            };
            if let Some(a) = action.get("add") {
                let size = a.get("size").and_then(Value::as_i64).unwrap_or(0);
                self.files.insert(path(a)?, Active { size, added_in: version });
            } else if let Some(r) = action.get("remove") {
                self.files.remove(&path(r)?);
            } else if let Some(t) = action.get("txn") {
                if let (Some(app), Some(v)) = (t.get("appId").and_then(Value::as_str), t.get("version").and_then(Value::as_i64)) {
                    self.txns.insert(app.to_string(), (v, version));
                }
            } else if let Some(p) = action.get("protocol") {
                check_protocol(p, version)?;
                self.protocol = Some(p.clone());
            } else if let Some(m) = action.get("metaData") {
                self.metadata = Some(m.clone());
            }
            // commitInfo, cdc, domainMetadata, ...: nothing a writer of appends must track.
        }
        self.version = version;
        Ok(())
    }

    /// The table's current schema string, if it has one.
    pub fn schema_string(&self) -> Option<&str> {
        self.metadata.as_ref()?.get("schemaString")?.as_str()
    }
}

/// A protocol this writer may append to: one it writes itself, or an older one.
fn check_protocol(p: &Value, version: i64) -> Result<()> {
    let reader = p.get("minReaderVersion").and_then(Value::as_i64).unwrap_or(1);
    let writer = p.get("minWriterVersion").and_then(Value::as_i64).unwrap_or(1);
    let features: Vec<&str> =
        p.get("writerFeatures").and_then(Value::as_array).map_or(vec![], |f| f.iter().filter_map(Value::as_str).collect());
    let known = |f: &&str| *f == "timestampNtz" || *f == "appendOnly" || *f == "invariants";
    if reader > FEATURES_READER || writer > FEATURES_WRITER || (writer == FEATURES_WRITER && !features.iter().all(known)) {
        return Err(DeltaError::Log(format!(
            "commit {version} asks for Delta protocol reader {reader} / writer {writer} {features:?}; Ferry writes tables of \
             reader {READER_VERSION} / writer {WRITER_VERSION} (or 3 / 7 with timestampNtz) and does not append to others"
        )));
    }
    Ok(())
}

/// One table's log, read and appended to through a store.
#[derive(Debug, Clone)]
pub struct DeltaLog {
    store: Store,
    /// The table's directory in the store.
    table: String,
}

impl DeltaLog {
    pub fn new(store: Store, table: &str) -> DeltaLog {
        DeltaLog { store, table: table.to_string() }
    }

    fn commit_path(&self, version: i64) -> String {
        format!("{}/_delta_log/{version:020}.json", self.table)
    }

    /// The latest snapshot: the whole log replayed from the start.
    pub async fn snapshot(&self) -> Result<Snapshot> {
        if let Some(first) = self.first_commit().await?
            && first > 0
        {
            return Err(DeltaError::Log(format!(
                "{}: the log starts at version {first} (older commits were cleaned up after a checkpoint), \
                 which this version of Ferry cannot read",
                self.store.url(&format!("{}/_delta_log", self.table))
            )));
        }
        let mut s = Snapshot::empty();
        self.catch_up(&mut s).await?;
        Ok(s)
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

    /// The lowest commit version in the log, if any.
    async fn first_commit(&self) -> Result<Option<i64>> {
        let names = self.store.children(&format!("{}/_delta_log", self.table)).await?;
        Ok(names.iter().filter_map(|n| n.strip_suffix(".json")?.parse::<i64>().ok()).min())
    }

    /// Appends one commit: `plan` is asked for its actions against the latest snapshot, and
    /// asked again against each newer one while another writer's commit takes the version it
    /// aimed for. `plan` returning None means nothing is to be written (what it would write is
    /// in the table already, or no longer wanted). `cache` is the snapshot the caller read
    /// last (read whole when None), left as the newest this call saw; returns the version
    /// written, if any.
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
        for lost in 0..64u32 {
            let Some(actions) = plan(s)? else { return Ok(None) };
            let version = s.version + 1;
            let mut text = String::new();
            for a in &actions {
                text.push_str(&a.to_string());
                text.push('\n');
            }
            if self.store.create_new(&self.commit_path(version), text.clone().into_bytes()).await? {
                s.apply(version, &text)?;
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
}

fn rand_ms() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id() as u64);
    h.finish() % 20
}

/// The protocol action for a table with these columns.
pub fn protocol(columns: &[SchemaColumn]) -> Value {
    if columns.iter().any(|c| c.detail.contains("timestamp_ntz")) {
        json!({"protocol": {
            "minReaderVersion": FEATURES_READER, "minWriterVersion": FEATURES_WRITER,
            "readerFeatures": ["timestampNtz"], "writerFeatures": ["timestampNtz"],
        }})
    } else {
        json!({"protocol": {"minReaderVersion": READER_VERSION, "minWriterVersion": WRITER_VERSION}})
    }
}

/// The metaData action: the table's id (kept across schema changes), its schema and partition
/// columns, created at `now_ms`.
pub fn metadata(id: &str, name: &str, columns: &[SchemaColumn], partition_by: &[String], now_ms: i64) -> Result<Value> {
    let fields =
        columns.iter().map(|c| Ok(json!({"name": c.name, "type": delta_type(&c.detail)?, "nullable": c.nullable, "metadata": {}})));
    let schema = json!({"type": "struct", "fields": fields.collect::<Result<Vec<_>>>()?});
    Ok(json!({"metaData": {
        "id": id,
        "name": name,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": schema.to_string(),
        "partitionColumns": partition_by,
        "configuration": {"delta.setTransactionRetentionDuration": TXN_RETENTION},
        "createdTime": now_ms,
    }}))
}

/// The Delta type of a column's exact type text (Ferry's `detail`: `bigint`, `timestamp[us]`,
/// `list<struct<a:string>>`), or why Delta cannot hold it.
pub fn delta_type(detail: &str) -> Result<Value> {
    let d = detail.trim();
    let refuse = |why: &str| Err(DeltaError::Schema(format!("Delta has no type for {d}: {why}")));
    let (head, inner) = match d.find(['<', '[', '(']) {
        Some(i) => (&d[..i], &d[i..]),
        None => (d, ""),
    };
    Ok(match (head, inner) {
        ("string", "") => json!("string"),
        ("boolean", "") => json!("boolean"),
        ("tinyint", "") => json!("byte"),
        ("smallint", "") => json!("short"),
        ("int", "") => json!("integer"),
        ("bigint", "") => json!("long"),
        ("float", "") => json!("float"),
        ("double", "") => json!("double"),
        ("date", "") => json!("date"),
        ("binary", "") => json!("binary"),
        ("fixed", _) => json!("binary"),
        ("decimal", p) => {
            let (prec, scale) = p.trim_matches(['(', ')']).split_once(',').unwrap_or(("", ""));
            match (prec.trim().parse::<u32>(), scale.trim().parse::<u32>()) {
                (Ok(p), Ok(s)) if (1..=38).contains(&p) && s <= p => json!(format!("decimal({p},{s})")),
                _ => return refuse("Delta decimals have a precision of 1 to 38"),
            }
        }
        ("timestamp", "[ms]" | "[us]") => json!("timestamp"),
        ("timestamp_ntz", "[ms]" | "[us]") => json!("timestamp_ntz"),
        ("timestamp" | "timestamp_ntz", _) => return refuse("Delta timestamps hold microseconds; use timestamp_us or timestamp_ms"),
        ("time", _) => return refuse("Delta has no time of day; cast it to long or string"),
        ("list", t) => json!({"type": "array", "elementType": delta_type(unwrap(t, d)?)?, "containsNull": true}),
        ("map", t) => {
            let kv = split_top(unwrap(t, d)?);
            let [k, v] = kv.as_slice() else { return refuse("a map needs a key and a value type") };
            json!({"type": "map", "keyType": delta_type(k)?, "valueType": delta_type(v)?, "valueContainsNull": true})
        }
        ("struct", t) => {
            let fields = split_top(unwrap(t, d)?)
                .into_iter()
                .map(|f| {
                    let (name, ty) = f.split_once(':').ok_or_else(|| DeltaError::Schema(format!("cannot read field {f:?} of {d}")))?;
                    Ok(json!({"name": name, "type": delta_type(ty)?, "nullable": true, "metadata": {}}))
                })
                .collect::<Result<Vec<_>>>()?;
            json!({"type": "struct", "fields": fields})
        }
        _ => return refuse("not a type Ferry writes to Delta tables"),
    })
}

/// `<...>` without its brackets.
fn unwrap<'a>(t: &'a str, whole: &str) -> Result<&'a str> {
    t.strip_prefix('<').and_then(|t| t.strip_suffix('>')).ok_or_else(|| DeltaError::Schema(format!("cannot read type {whole}")))
}

/// Splits `a,b<c,d>,e` at the commas outside brackets.
fn split_top(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0i32, 0usize, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' | ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// An `add` action for a part at table path `rel` (relative to the table).
pub fn add(rel: &str, partition_values: &BTreeMap<String, Option<String>>, size: i64, records: i64, now_ms: i64) -> Value {
    json!({"add": {
        "path": encode_path(rel),
        "partitionValues": partition_values,
        "size": size,
        "modificationTime": now_ms,
        "dataChange": true,
        "stats": json!({"numRecords": records}).to_string(),
    }})
}

/// A `remove` action for table path `rel`; its partition values are its directory's.
pub fn remove(rel: &str, size: i64, now_ms: i64) -> Value {
    let partition_values = partition_values(rel.rsplit_once('/').map_or("", |(dir, _)| dir));
    json!({"remove": {
        "path": encode_path(rel),
        "deletionTimestamp": now_ms,
        "dataChange": true,
        "extendedFileMetadata": true,
        "partitionValues": partition_values,
        "size": size,
    }})
}

pub fn txn(app_id: &str, version: i64, now_ms: i64) -> Value {
    json!({"txn": {"appId": app_id, "version": version, "lastUpdated": now_ms}})
}

pub fn commit_info(operation: &str, chunks: &[&str], now_ms: i64) -> Value {
    json!({"commitInfo": {
        "timestamp": now_ms,
        "operation": operation,
        "operationParameters": {"mode": "Append", "chunks": chunks.join(",")},
        "engineInfo": concat!("ferry/", env!("CARGO_PKG_VERSION")),
        "isBlindAppend": operation == "WRITE",
    }})
}

/// A Hive partition path (`dt=2026-11-28/h=%2F`) as Delta's partition values: the column
/// names, and the values unescaped (Hive's default partition is null).
pub fn partition_values(partition: &str) -> BTreeMap<String, Option<String>> {
    partition
        .split('/')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), ferry_common::paths::unescape_partition_value(v)))
        .collect()
}

/// A table path as the relative URI an action holds: every byte but unreserved ones, `/` and
/// `=` percent-encoded (so the `%` of a Hive-escaped value becomes `%25`).
pub fn encode_path(rel: &str) -> String {
    let mut out = String::with_capacity(rel.len());
    for b in rel.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/=".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The inverse of [`encode_path`], for any writer's paths (a `+` stays a `+`).
pub fn decode_path(uri: &str) -> String {
    let b = uri.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16)
        {
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_survive_the_round_trip_and_hive_escapes_are_escaped_again() {
        for p in ["dt=2026-11-28/part-c1-0a1b2c3d.parquet", "k=a%2Fb/part-x.parquet", "k=a b:c/p.parquet", "k=é/p.parquet"] {
            assert_eq!(decode_path(&encode_path(p)), p);
        }
        assert_eq!(encode_path("k=a%2Fb/p.parquet"), "k=a%252Fb/p.parquet");
        assert_eq!(decode_path("k=a%20b/x%2"), "k=a b/x%2");
    }

    #[test]
    fn types_delta_holds_and_those_it_does_not() {
        assert_eq!(delta_type("bigint").unwrap(), json!("long"));
        assert_eq!(delta_type("decimal(20,0)").unwrap(), json!("decimal(20,0)"));
        assert_eq!(delta_type("timestamp[ms]").unwrap(), json!("timestamp"));
        assert_eq!(
            delta_type("map<string,list<struct<a:int,b:timestamp_ntz[us]>>>").unwrap(),
            json!({"type": "map", "keyType": "string", "valueContainsNull": true, "valueType": {
            "type": "array", "containsNull": true, "elementType": {"type": "struct", "fields": [
                {"name": "a", "type": "integer", "nullable": true, "metadata": {}},
                {"name": "b", "type": "timestamp_ntz", "nullable": true, "metadata": {}},
            ]}}})
        );
        for (bad, why) in
            [("timestamp[ns]", "microseconds"), ("time[ms]", "time of day"), ("decimal(40,2)", "38"), ("Utf8View", "not a type")]
        {
            let e = delta_type(bad).unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains(why), "{e}");
        }
    }

    #[test]
    fn partition_values_are_unescaped_and_the_default_partition_is_null() {
        let v = partition_values("dt=2026-11-28/k=a%2Fb/n=__HIVE_DEFAULT_PARTITION__");
        assert_eq!(v["dt"].as_deref(), Some("2026-11-28"));
        assert_eq!(v["k"].as_deref(), Some("a/b"));
        assert_eq!(v["n"], None);
        assert!(partition_values("").is_empty());
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
    }

    #[test]
    fn writers_racing_for_a_version_each_commit_once_and_replay_sees_every_file() {
        let d = tempfile::tempdir().unwrap();
        let log = DeltaLog::new(Store::from_url(&d.path().display().to_string()).unwrap(), "t");
        rt().block_on(async {
            let cols = vec![SchemaColumn { name: "a".into(), hive: "BIGINT".into(), detail: "bigint".into(), nullable: true }];
            let mut cache = None;
            let v = log
                .commit(&mut cache, |s| Ok((s.version < 0).then(|| vec![protocol(&cols), metadata("id-1", "t", &cols, &[], 1).unwrap()])))
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
                            .then(|| vec![add(&path, &BTreeMap::new(), 10, 1, 2), txn(&format!("ferry:p:{i}"), 1, 2)]))
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
}
