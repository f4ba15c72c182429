//! Checkpoints: the state of the table at one version in one Parquet file, so that a reader
//! (and Ferry's own next snapshot) starts there instead of replaying every JSON commit, and so
//! that commits older than it can be cleaned up.
//!
//! A checkpoint is the snapshot's actions, one per row, each in the column of its kind (`add`,
//! `remove`, `txn`, `metaData`, `protocol`), as the protocol's classic checkpoint has it. Both
//! directions go through JSON, the log's own form: the actions are decoded into Arrow against
//! the checkpoint schema when written, and encoded back to JSON lines when read, so that a
//! checkpoint replays through the same code as a commit.
//!
//! Ferry writes single-file checkpoints and reads those and the multi-part ones other writers
//! leave (`<version>.checkpoint.<part>.<parts>.parquet`). Tables with V2 checkpoints declare the
//! `v2Checkpoint` feature, which the protocol check refuses before they are read.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use ferry_storage::Store;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{Value, json};

use crate::{DeltaError, Result, Snapshot};

/// A checkpoint found in the log: its version and its files (one, or every part).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub version: i64,
    pub files: Vec<String>,
}

fn map() -> DataType {
    let entry = Fields::from(vec![Field::new("key", DataType::Utf8, false), Field::new("value", DataType::Utf8, true)]);
    DataType::Map(Arc::new(Field::new("key_value", DataType::Struct(entry), false)), false)
}

fn strings() -> DataType {
    DataType::List(Arc::new(Field::new("element", DataType::Utf8, true)))
}

fn object(fields: Vec<Field>) -> DataType {
    DataType::Struct(Fields::from(fields))
}

/// The classic checkpoint's schema, the columns Ferry writes and reads.
fn schema() -> SchemaRef {
    use DataType::{Boolean, Int32, Int64, Utf8};
    let f = |name: &str, t: DataType| Field::new(name, t, true);
    Arc::new(Schema::new(vec![
        f("txn", object(vec![f("appId", Utf8), f("version", Int64), f("lastUpdated", Int64)])),
        f(
            "add",
            object(vec![
                f("path", Utf8),
                f("partitionValues", map()),
                f("size", Int64),
                f("modificationTime", Int64),
                f("dataChange", Boolean),
                f("stats", Utf8),
                f("tags", map()),
            ]),
        ),
        f(
            "remove",
            object(vec![
                f("path", Utf8),
                f("deletionTimestamp", Int64),
                f("dataChange", Boolean),
                f("extendedFileMetadata", Boolean),
                f("partitionValues", map()),
                f("size", Int64),
            ]),
        ),
        f(
            "metaData",
            object(vec![
                f("id", Utf8),
                f("name", Utf8),
                f("description", Utf8),
                f("format", object(vec![f("provider", Utf8), f("options", map())])),
                f("schemaString", Utf8),
                f("partitionColumns", strings()),
                f("configuration", map()),
                f("createdTime", Int64),
            ]),
        ),
        f(
            "protocol",
            object(vec![
                f("minReaderVersion", Int32),
                f("minWriterVersion", Int32),
                f("readerFeatures", strings()),
                f("writerFeatures", strings()),
            ]),
        ),
    ]))
}

/// The checkpoint of `s` as of `now_ms`, and its number of actions.
pub(crate) fn encode(s: &Snapshot, now_ms: i64) -> Result<(Vec<u8>, usize)> {
    let (Some(protocol), Some(metadata)) = (&s.protocol, &s.metadata) else {
        return Err(DeltaError::Log(format!("version {}: no protocol or metadata to checkpoint", s.version)));
    };
    let (txns_since, tombstones_since) = s.retained_since(now_ms);
    let mut lines = vec![json!({"protocol": protocol}), json!({"metaData": metadata})];
    // Sorted: the same state is the same rows, whoever writes it.
    let txns: BTreeMap<_, _> = s.txns.iter().filter(|(_, t)| t.last_updated.is_none_or(|at| at >= txns_since)).collect();
    for (app, t) in txns {
        lines.push(json!({"txn": {"appId": app, "version": t.version, "lastUpdated": t.last_updated}}));
    }
    let files: BTreeMap<_, _> = s.files.iter().collect();
    for a in files.values() {
        let mut add = a.action.clone();
        // In a checkpoint the file is state, not a change.
        add["dataChange"] = json!(false);
        lines.push(json!({"add": add}));
    }
    let removed: BTreeMap<_, _> = s.removed.iter().collect();
    for r in removed.values() {
        if r.get("deletionTimestamp").and_then(Value::as_i64).unwrap_or(i64::MAX) >= tombstones_since {
            let mut r = (*r).clone();
            r["dataChange"] = json!(false);
            lines.push(json!({"remove": r}));
        }
    }
    let mut text = String::new();
    for l in &lines {
        text.push_str(&l.to_string());
        text.push('\n');
    }
    let schema = schema();
    let err = |e: &dyn std::fmt::Display| DeltaError::Log(format!("version {}: writing its checkpoint: {e}", s.version));
    let reader = arrow::json::ReaderBuilder::new(schema.clone()).with_batch_size(8192).build(text.as_bytes()).map_err(|e| err(&e))?;
    let mut out = Vec::new();
    // Snappy: what Spark and delta-rs write, and every Delta reader reads.
    let props = parquet::file::properties::WriterProperties::builder().set_compression(parquet::basic::Compression::SNAPPY).build();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut out, schema, Some(props)).map_err(|e| err(&e))?;
    for batch in reader {
        w.write(&batch.map_err(|e| err(&e))?).map_err(|e| err(&e))?;
    }
    w.close().map_err(|e| err(&e))?;
    Ok((out, lines.len()))
}

/// The checkpoint `_last_checkpoint` in `dir` names: one file, or `parts` files. None without a
/// pointer, or when it is not one this reads (not JSON, no version, a V2 checkpoint): the
/// caller lists the log instead.
pub(crate) async fn pointed(store: &Store, dir: &str) -> Result<Option<Checkpoint>> {
    let text = match store.read(&format!("{dir}/_last_checkpoint")).await {
        Ok(text) => text,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let Ok(v) = serde_json::from_slice::<Value>(&text) else { return Ok(None) };
    let Some(version) = v.get("version").and_then(Value::as_i64).filter(|v| *v >= 0) else { return Ok(None) };
    if v.get("v2Checkpoint").is_some_and(|c| !c.is_null()) {
        return Ok(None);
    }
    let files = match v.get("parts").and_then(Value::as_u64) {
        None => vec![format!("{version:020}.checkpoint.parquet")],
        Some(n) if (1..=100_000).contains(&n) => (1..=n).map(|i| format!("{version:020}.checkpoint.{i:010}.{n:010}.parquet")).collect(),
        Some(_) => return Ok(None),
    };
    Ok(Some(Checkpoint { version, files }))
}

/// The newest complete checkpoint among the log's file names.
pub(crate) fn latest(names: &[String]) -> Option<Checkpoint> {
    complete(names).pop()
}

/// Every complete checkpoint among the log's file names, oldest first (of two for one version,
/// the single file).
pub(crate) fn complete(names: &[String]) -> Vec<Checkpoint> {
    let mut parts: BTreeMap<(i64, u32), Vec<(u32, String)>> = BTreeMap::new();
    let mut found: BTreeMap<i64, Checkpoint> = BTreeMap::new();
    for n in names {
        let Some((version, rest)) = n.split_once(".checkpoint.") else { continue };
        let Ok(version) = version.parse::<i64>() else { continue };
        if rest == "parquet" {
            found.insert(version, Checkpoint { version, files: vec![n.clone()] });
        } else if let Some((part, of)) = rest.strip_suffix(".parquet").and_then(|r| r.split_once('.'))
            && let (Ok(part), Ok(of)) = (part.parse::<u32>(), of.parse::<u32>())
        {
            parts.entry((version, of)).or_default().push((part, n.clone()));
        }
    }
    for ((version, of), mut files) in parts {
        files.sort();
        files.dedup();
        if files.len() == of as usize {
            found.entry(version).or_insert(Checkpoint { version, files: files.into_iter().map(|(_, n)| n).collect() });
        }
    }
    found.into_values().collect()
}

/// Replays checkpoint `c` (files in `dir`) into the empty snapshot `s`.
pub(crate) async fn read(store: &Store, dir: &str, c: &Checkpoint, s: &mut Snapshot) -> Result<()> {
    for name in &c.files {
        let path = format!("{dir}/{name}");
        let bytes = bytes::Bytes::from(store.read(&path).await?);
        let err = |e: &dyn std::fmt::Display| DeltaError::Log(format!("{}: {e}", store.url(&path)));
        let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| err(&e))?;
        // Only what replay uses: other writers' checkpoints carry more (parsed stats, deletion
        // vectors), in types the JSON encoder below need not know. The tags hold a compacted
        // file's members.
        let wanted = [
            "add.path",
            "add.partitionValues",
            "add.size",
            "add.modificationTime",
            "add.dataChange",
            "add.stats",
            "add.tags",
            "remove.path",
            "remove.deletionTimestamp",
            "remove.dataChange",
            "remove.extendedFileMetadata",
            "remove.partitionValues",
            "remove.size",
            "txn",
            "metaData",
            "protocol",
        ];
        let mask = ProjectionMask::columns(builder.parquet_schema(), wanted);
        let reader = builder.with_projection(mask).build().map_err(|e| err(&e))?;
        for batch in reader {
            let batch = batch.map_err(|e| err(&e))?;
            let mut text = Vec::new();
            let mut w = arrow::json::LineDelimitedWriter::new(&mut text);
            w.write(&batch).map_err(|e| err(&e))?;
            w.finish().map_err(|e| err(&e))?;
            for line in text.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                let action: Value = serde_json::from_slice(line).map_err(|e| err(&e))?;
                let action = crate::Action::of(action).map_err(|e| err(&e))?;
                s.apply_action(c.version, action, None).map_err(|e| err(&e))?;
            }
        }
    }
    s.version = c.version;
    // Who took out the files its tombstones name is not in a checkpoint.
    s.replayed_from = c.version + 1;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_complete_checkpoint_is_chosen() {
        let names: Vec<String> = [
            "00000000000000000009.json",
            "00000000000000000010.checkpoint.parquet",
            "00000000000000000020.checkpoint.0000000001.0000000002.parquet",
            "00000000000000000020.checkpoint.0000000002.0000000002.parquet",
            "00000000000000000030.checkpoint.0000000001.0000000002.parquet",
            "00000000000000000025.checkpoint.3b5c8e9a-uuid.json",
            "_last_checkpoint",
        ]
        .map(String::from)
        .to_vec();
        let c = latest(&names).unwrap();
        assert_eq!(c.version, 20);
        assert_eq!(c.files.len(), 2);
        assert_eq!(latest(&names[..2]).unwrap(), Checkpoint { version: 10, files: vec![names[1].clone()] });
        assert_eq!(latest(&names[..1]), None);
    }
}
