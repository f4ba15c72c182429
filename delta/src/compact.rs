//! Compaction: the small files of one partition merged into one, and taken apart again when
//! some of what they hold must leave the table.
//!
//! A compacted file is its inputs' row groups copied whole, byte for byte, one input after the
//! other (no value is decoded or encoded again, so none can change); its `add` names each
//! input in the tag `ferry.members` (`[{"path", "size", "records", "rowGroups"}]`), in the
//! order of their row groups. Everything that reads the table in Ferry's terms (which chunk's
//! part is in, which must leave) reads through those members: a part compacted away is in the
//! table exactly as if its own file were active. When a part must leave (a rerun with other
//! bytes, a newer version of its source file, a skip), the commit that takes it out removes
//! the compacted file and adds one with the other members' row groups: the same copy, without
//! that member's range. Inputs of a merge must share the Parquet schema and key-value metadata
//! (schema changes start a new file).
//!
//! ```text
//!  <table>/<k=v>/compact-<16 hex>.parquet   of its bytes and a nonce: every write a new name,
//!                                          so no commit adds a name an older version removed
//! ```
//!
//! A crash leaves at worst a compacted file no commit names: it is invisible, and `ferry
//! vacuum` removes it past the retention.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use parquet::bloom_filter::Sbbf;
use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use serde_json::{Value, json};

use crate::{Active, DeltaError, DeltaLog, Result, Snapshot, remove_active, stats};

/// The `add` tag that lists a compacted file's members.
pub const MEMBERS_TAG: &str = "ferry.members";

/// One input of a compacted file: the part (by table path) whose row groups it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub rel: String,
    /// The part's own size and records, as its own `add` had them.
    pub size: i64,
    pub records: i64,
    /// How many row groups of the compacted file are this part's (they follow the members
    /// before it).
    pub row_groups: usize,
}

/// The members an `add` names (empty for a file of its own).
pub fn members_of(add: &Value) -> std::result::Result<Vec<Member>, String> {
    let Some(text) = add.get("tags").and_then(|t| t.get(MEMBERS_TAG)).and_then(Value::as_str) else { return Ok(vec![]) };
    let list: Vec<Value> = serde_json::from_str(text).map_err(|e| format!("tag {MEMBERS_TAG} is not a JSON list ({e})"))?;
    list.iter()
        .map(|m| {
            let (Some(rel), Some(size), Some(records), Some(rgs)) = (
                m.get("path").and_then(Value::as_str),
                m.get("size").and_then(Value::as_i64),
                m.get("records").and_then(Value::as_i64),
                m.get("rowGroups").and_then(Value::as_u64),
            ) else {
                return Err(format!("tag {MEMBERS_TAG}: a member without path, size, records or rowGroups: {m}"));
            };
            Ok(Member { rel: rel.to_string(), size, records, row_groups: rgs as usize })
        })
        .collect()
}

/// A file to write into the table and the `add` that makes it visible.
#[derive(Debug, Clone)]
pub struct Rewrite {
    pub rel: String,
    pub bytes: Vec<u8>,
    pub add: Value,
}

/// One input of [`merge`]: an active file and its bytes.
pub struct Input<'a> {
    pub rel: &'a str,
    pub active: &'a Active,
    pub bytes: Bytes,
}

fn footer(rel: &str, bytes: &Bytes) -> Result<ParquetMetaData> {
    ParquetMetaDataReader::new()
        .with_page_index_policy(PageIndexPolicy::Optional)
        .parse_and_finish(bytes)
        .map_err(|e| DeltaError::Log(format!("{rel}: not a Parquet file Ferry can compact ({e})")))
}

/// What inputs must share to be merged: the Parquet schema and the key-value metadata
/// (Arrow's schema among them).
pub fn compatibility(rel: &str, bytes: &Bytes) -> Result<String> {
    let meta = footer(rel, bytes)?;
    let f = meta.file_metadata();
    Ok(format!("{:?}|{:?}", f.schema_descr().root_schema(), f.key_value_metadata()))
}

/// The row groups of `inputs` (each with the indices to copy) as one Parquet file.
fn concat(inputs: &[(&str, &Bytes, Vec<usize>)]) -> Result<Vec<u8>> {
    let metas = inputs.iter().map(|(rel, b, _)| footer(rel, b)).collect::<Result<Vec<_>>>()?;
    let first = metas.first().ok_or_else(|| DeltaError::Log("nothing to compact".into()))?;
    let fm = first.file_metadata();
    for ((rel, _, _), m) in inputs.iter().zip(&metas).skip(1) {
        if m.file_metadata().schema_descr().root_schema() != fm.schema_descr().root_schema()
            || m.file_metadata().key_value_metadata() != fm.key_value_metadata()
        {
            return Err(DeltaError::Log(format!("{rel}: its Parquet schema differs from {}'s; not merged", inputs[0].0)));
        }
    }
    let mut props = WriterProperties::builder().set_key_value_metadata(fm.key_value_metadata().cloned());
    if let Some(by) = fm.created_by() {
        props = props.set_created_by(by.to_string());
    }
    let mut out = Vec::new();
    let mut w = SerializedFileWriter::new(&mut out, fm.schema_descr().root_schema_ptr(), Arc::new(props.build()))
        .map_err(|e| DeltaError::Log(format!("compacting: {e}")))?;
    let err = |e: parquet::errors::ParquetError| DeltaError::Log(format!("compacting: {e}"));
    for ((_, bytes, groups), meta) in inputs.iter().zip(&metas) {
        let page_index = meta.page_index();
        for &g in groups {
            let rg = meta.row_group(g);
            let mut out_rg = w.next_row_group().map_err(err)?;
            for (c, column) in rg.columns().iter().enumerate() {
                let result = ColumnCloseResult {
                    bytes_written: column.compressed_size() as u64,
                    rows_written: rg.num_rows() as u64,
                    metadata: column.clone(),
                    bloom_filter: Sbbf::read_from_column_chunk(column, *bytes).ok().flatten(),
                    column_index: page_index.and_then(|pi| pi.column_index(g, c)).cloned(),
                    offset_index: page_index.and_then(|pi| pi.offset_index(g, c)).cloned(),
                };
                out_rg.append_column(*bytes, result).map_err(err)?;
            }
            out_rg.close().map_err(err)?;
        }
    }
    w.close().map_err(err)?;
    Ok(out)
}

/// The compacted file of `members` written from `inputs`, in partition directory `dir`, with
/// its statistics read back from what was written. `data_change`: false for a merge (the
/// rows do not change), true when members were dropped.
/// `like` is an active file of the same partition: the compacted file carries its partition
/// values as written (Delta's text for the partition's types, not the directory's).
fn build(
    dir: &str,
    like: &Active,
    members: &[Member],
    inputs: &[(&str, &Bytes, Vec<usize>)],
    data_change: bool,
    now_ms: i64,
) -> Result<Rewrite> {
    let bytes = concat(inputs)?;
    let b = Bytes::from(bytes);
    let meta = footer("the compacted file", &b)?;
    let records: i64 = members.iter().map(|m| m.records).sum();
    if meta.file_metadata().num_rows() != records {
        return Err(DeltaError::Log(format!(
            "compacting: the merged file holds {} rows, its members {records}",
            meta.file_metadata().num_rows()
        )));
    }
    let stats = stats::of_metadata(&meta).map_err(|e| DeltaError::Log(format!("compacting: {e}")))?;
    let name = format!("compact-{}.parquet", unique_stem(&b));
    let rel = if dir.is_empty() { name } else { format!("{dir}/{name}") };
    let list: Vec<Value> =
        members.iter().map(|m| json!({"path": m.rel, "size": m.size, "records": m.records, "rowGroups": m.row_groups})).collect();
    let mut add = crate::add(&rel, &BTreeMap::new(), b.len() as i64, records, Some(&stats), now_ms);
    add["add"]["partitionValues"] = like.action.get("partitionValues").cloned().unwrap_or_else(|| json!(crate::partition_values(dir, &[])));
    add["add"]["dataChange"] = json!(data_change);
    add["add"]["tags"] = json!({MEMBERS_TAG: Value::Array(list).to_string()});
    Ok(Rewrite { rel, bytes: b.to_vec(), add })
}

/// 16 hex digits naming a merged file: of its bytes and a nonce, so that no two writes share a
/// name. A name is never committed twice: a merged file rebuilt with the same bytes as one an
/// older version named (a merge taken apart again) gets a new name, so a vacuum deleting the
/// old one cannot delete what a new commit adds.
fn unique_stem(bytes: &[u8]) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = blake3::Hasher::new();
    h.update(bytes);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    h.update(&nanos.to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    h.finalize().to_hex()[..16].to_string()
}

fn dir_of(rel: &str) -> &str {
    rel.rsplit_once('/').map_or("", |(d, _)| d)
}

/// The files `inputs` (all of one partition) merged into one: their members (a compacted
/// input's members, a part's itself) in order.
pub fn merge(inputs: &[Input<'_>], now_ms: i64) -> Result<Rewrite> {
    let Some(first) = inputs.first() else { return Err(DeltaError::Log("nothing to compact".into())) };
    let dir = dir_of(first.rel);
    let mut members = Vec::new();
    let mut copy = Vec::new();
    for i in inputs {
        if dir_of(i.rel) != dir {
            return Err(DeltaError::Log(format!("{} and {} are in different partitions", inputs[0].rel, i.rel)));
        }
        let meta = footer(i.rel, &i.bytes)?;
        let groups = meta.num_row_groups();
        if i.active.members.is_empty() {
            let records = meta.file_metadata().num_rows();
            members.push(Member { rel: i.rel.to_string(), size: i.active.size, records, row_groups: groups });
        } else {
            if i.active.members.iter().map(|m| m.row_groups).sum::<usize>() != groups {
                return Err(DeltaError::Log(format!("{}: its members name other row groups than it has", i.rel)));
            }
            members.extend(i.active.members.iter().cloned());
        }
        copy.push((i.rel, &i.bytes, (0..groups).collect()));
    }
    build(dir, first.active, &members, &copy, false, now_ms)
}

/// Compacted file `rel` (`bytes`) without the members in `drop`; None when none is left.
pub fn without(rel: &str, active: &Active, bytes: &Bytes, drop: &BTreeSet<String>, now_ms: i64) -> Result<Option<Rewrite>> {
    let meta = footer(rel, bytes)?;
    if active.members.iter().map(|m| m.row_groups).sum::<usize>() != meta.num_row_groups() {
        return Err(DeltaError::Log(format!("{rel}: its members name other row groups than it has")));
    }
    let (mut kept, mut groups, mut at) = (Vec::new(), Vec::new(), 0);
    for m in &active.members {
        if !drop.contains(&m.rel) {
            kept.push(m.clone());
            groups.extend(at..at + m.row_groups);
        }
        at += m.row_groups;
    }
    if kept.is_empty() {
        return Ok(None);
    }
    build(dir_of(rel), active, &kept, &[(rel, bytes, groups)], true, now_ms).map(Some)
}

/// What a plan asks of [`DeltaLog::commit_parts`]: actions to write, and Ferry's parts (by
/// table path) to take out of the table, whether each is a file of its own or a member of a
/// compacted file.
#[derive(Debug, Default)]
pub struct Change {
    pub actions: Vec<Value>,
    pub drop: Vec<String>,
}

impl Snapshot {
    /// Is Ferry's part `rel` in this version, as a file or in a compacted one?
    pub fn has_part(&self, rel: &str) -> bool {
        self.members.contains_key(rel) || self.files.get(rel).is_some_and(|a| a.members.is_empty())
    }

    /// Every part this version holds: (table path, its size, the compacted file holding it).
    pub fn parts(&self) -> impl Iterator<Item = (&str, i64, Option<&str>)> {
        self.files.iter().flat_map(|(rel, a)| {
            let own = a.members.is_empty().then_some((rel.as_str(), a.size, None));
            own.into_iter().chain(a.members.iter().map(move |m| (m.rel.as_str(), m.size, Some(rel.as_str()))))
        })
    }

    /// The version that made part `rel` visible (for a compacted one: its compaction's).
    pub fn part_added_in(&self, rel: &str) -> Option<i64> {
        let file = self.members.get(rel).map_or(rel, String::as_str);
        self.files.get(file).map(|a| a.added_in)
    }
}

impl DeltaLog {
    /// A commit as [`DeltaLog::commit`] makes it, where the plan may also name parts to take
    /// out: a part that is a file of its own gets a `remove`; a compacted file holding any
    /// gets a `remove`, and an `add` of a file of its other members, which is written (outside
    /// the plan, since the plan is planned again on every lost race) before the plan is asked
    /// again. Returns the version written, if any.
    pub async fn commit_parts<F>(&self, cache: &mut Option<Snapshot>, now_ms: i64, mut plan: F) -> Result<Option<i64>>
    where
        F: FnMut(&Snapshot) -> Result<Option<Change>>,
    {
        let mut ready: HashMap<String, (BTreeSet<String>, Option<Rewrite>)> = HashMap::new();
        // Each round writes the rewrites the last plan asked for; a compaction or another
        // writer's split between rounds asks for others, a few times at most.
        for _ in 0..16 {
            let mut needed: HashMap<String, BTreeSet<String>> = HashMap::new();
            let version = self
                .commit(cache, |s| {
                    needed.clear();
                    let Some(Change { mut actions, drop }) = plan(s)? else { return Ok(None) };
                    let mut split: HashMap<&str, BTreeSet<String>> = HashMap::new();
                    for rel in drop {
                        match (s.files.get(&rel), s.members.get(&rel)) {
                            (Some(a), _) if a.members.is_empty() => actions.push(remove_active(&rel, a, now_ms)),
                            (_, Some(file)) => {
                                split.entry(file.as_str()).or_default().insert(rel);
                            }
                            // Not in this version: nothing to take out.
                            _ => {}
                        }
                    }
                    for (file, dropped) in split {
                        match ready.get(file) {
                            Some((d, rewrite)) if *d == dropped => {
                                actions.push(remove_active(file, &s.files[file], now_ms));
                                actions.extend(rewrite.as_ref().map(|r| r.add.clone()));
                            }
                            _ => {
                                needed.insert(file.to_string(), dropped);
                            }
                        }
                    }
                    Ok(needed.is_empty().then_some(actions))
                })
                .await?;
            if needed.is_empty() {
                return Ok(version);
            }
            let s = cache.as_ref().expect("commit leaves the snapshot it read");
            for (file, dropped) in needed {
                let Some(active) = s.files.get(&file) else { continue };
                let bytes = Bytes::from(self.store.read(&format!("{}/{file}", self.table)).await?);
                let rewrite = without(&file, active, &bytes, &dropped, now_ms)?;
                if let Some(r) = &rewrite {
                    if !self.store.create_new(&format!("{}/{}", self.table, r.rel), r.bytes.clone()).await? {
                        return Err(DeltaError::Log(format!("{}: a file has the new name already", r.rel)));
                    }
                    tracing::debug!(table = %self.table, from = %file, to = %r.rel, dropped = dropped.len(), "compacted file rewritten without parts leaving");
                }
                ready.insert(file, (dropped, rewrite));
            }
        }
        Err(DeltaError::Storage(ferry_storage::Error::Other(format!(
            "{}: the compacted files holding parts to take out kept changing; retried later",
            self.store.url(&self.table)
        ))))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use arrow::array::{Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use parquet::arrow::ArrowWriter;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    use super::*;

    /// A Parquet file of `n` rows from `from`, three rows a row group, with bloom filters.
    pub(crate) fn part(from: i64, n: i64) -> Bytes {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false), Field::new("s", DataType::Utf8, true)]));
        let ids: Vec<i64> = (from..from + n).collect();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from(ids.clone())), Arc::new(StringArray::from_iter(ids.iter().map(|i| Some(format!("v{i}")))))],
        )
        .unwrap();
        let props = WriterProperties::builder().set_max_row_group_row_count(Some(3)).set_bloom_filter_enabled(true).build();
        let mut out = Vec::new();
        let mut w = ArrowWriter::try_new(&mut out, schema, Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        Bytes::from(out)
    }

    fn rows(b: &[u8]) -> Vec<i64> {
        let r = ParquetRecordBatchReaderBuilder::try_new(Bytes::copy_from_slice(b)).unwrap().build().unwrap();
        r.flat_map(|batch| batch.unwrap().column(0).as_any().downcast_ref::<Int64Array>().unwrap().values().to_vec()).collect()
    }

    fn active(size: usize, members: Vec<Member>) -> Active {
        Active { size: size as i64, added_in: 1, action: Value::Null, members }
    }

    #[test]
    fn merged_row_groups_read_back_whole_and_a_member_leaves_with_its_rows() {
        let (a, b, c) = (part(0, 7), part(100, 4), part(200, 2));
        let (aa, ab, ac) = (active(a.len(), vec![]), active(b.len(), vec![]), active(c.len(), vec![]));
        let inputs = [
            Input { rel: "k=1/part-a-00000000.parquet", active: &aa, bytes: a.clone() },
            Input { rel: "k=1/part-b-00000000.parquet", active: &ab, bytes: b.clone() },
        ];
        let m = merge(&inputs, 5).unwrap();
        assert!(m.rel.starts_with("k=1/compact-") && m.rel.ends_with(".parquet"), "{}", m.rel);
        // The same inputs merged again: the same bytes under a new name (a name is never
        // committed twice).
        let twice = merge(&inputs, 5).unwrap();
        assert_eq!(twice.bytes, m.bytes);
        assert_ne!(twice.rel, m.rel);
        assert_eq!(rows(&m.bytes), [rows(&a), rows(&b)].concat());
        let members = members_of(&m.add["add"]).unwrap();
        assert_eq!(members.iter().map(|m| (m.records, m.row_groups)).collect::<Vec<_>>(), [(7, 3), (4, 2)]);
        assert_eq!(m.add["add"]["dataChange"], false);
        assert_eq!(m.add["add"]["partitionValues"], serde_json::json!(BTreeMap::from([("k", "1")])));
        let stats: Value = serde_json::from_str(m.add["add"]["stats"].as_str().unwrap()).unwrap();
        assert_eq!(
            (stats["numRecords"].as_i64(), stats["minValues"]["n"].as_i64(), stats["maxValues"]["n"].as_i64()),
            (Some(11), Some(0), Some(103))
        );
        // A merged file merges again with a part: the members flatten, in order.
        let am = active(m.bytes.len(), members);
        let merged = Bytes::from(m.bytes.clone());
        let again = merge(
            &[
                Input { rel: &m.rel, active: &am, bytes: merged.clone() },
                Input { rel: "k=1/part-c-00000000.parquet", active: &ac, bytes: c.clone() },
            ],
            6,
        )
        .unwrap();
        let all = members_of(&again.add["add"]).unwrap();
        assert_eq!(
            all.iter().map(|m| m.rel.as_str()).collect::<Vec<_>>(),
            ["k=1/part-a-00000000.parquet", "k=1/part-b-00000000.parquet", "k=1/part-c-00000000.parquet"]
        );
        // The middle member leaves: the others' rows, exactly.
        let ag = active(again.bytes.len(), all);
        let drop = BTreeSet::from(["k=1/part-b-00000000.parquet".to_string()]);
        let w = without(&again.rel, &ag, &Bytes::from(again.bytes.clone()), &drop, 7).unwrap().unwrap();
        assert_eq!(rows(&w.bytes), [rows(&a), rows(&c)].concat());
        assert_eq!(w.add["add"]["dataChange"], true);
        assert_eq!(members_of(&w.add["add"]).unwrap().len(), 2);
        // Every member leaving leaves nothing to add.
        let every: BTreeSet<String> = ag.members.iter().map(|m| m.rel.clone()).collect();
        assert!(without(&again.rel, &ag, &Bytes::from(again.bytes.clone()), &every, 7).unwrap().is_none());
        // Files of another schema are not merged.
        let other = {
            let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
            let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![1]))]).unwrap();
            let mut out = Vec::new();
            let mut w = ArrowWriter::try_new(&mut out, schema, None).unwrap();
            w.write(&batch).unwrap();
            w.close().unwrap();
            Bytes::from(out)
        };
        assert_ne!(compatibility("a", &a).unwrap(), compatibility("x", &other).unwrap());
        let ao = active(other.len(), vec![]);
        let e = merge(&[Input { rel: "k=1/a", active: &aa, bytes: a }, Input { rel: "k=1/x", active: &ao, bytes: other }], 1).unwrap_err();
        assert!(e.to_string().contains("schema differs"), "{e}");
    }
}
