//! Manifests and manifest lists (Avro, format version 2): what Ferry writes, and what it reads
//! of any writer's. Readers resolve these files' fields by the `field-id` each carries (the
//! names are the spec's too), so every field below has its id.

use apache_avro::types::Value as Avro;
use apache_avro::{Codec, DeflateSettings, Reader, Schema, Writer};
use serde_json::{Value, json};

use crate::{IcebergError, Result};

/// A manifest entry's status.
pub const EXISTING: i32 = 0;
pub const ADDED: i32 = 1;
pub const DELETED: i32 = 2;

/// A data or delete file as a manifest entry names it, with the sequence numbers it inherits
/// resolved (an added entry written without them has its manifest's).
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub status: i32,
    pub snapshot_id: i64,
    pub seq: i64,
    pub file_seq: i64,
    /// 0 data, 1 position deletes, 2 equality deletes.
    pub content: i32,
    pub path: String,
    pub format: String,
    /// The partition tuple, field name and value (a union of null and the value's type).
    pub partition: Vec<(String, Avro)>,
    pub records: i64,
    pub size: i64,
}

/// A manifest as a manifest list names it.
#[derive(Debug, Clone, PartialEq)]
pub struct ManifestFile {
    pub path: String,
    pub length: i64,
    pub spec_id: i32,
    /// 0 data, 1 deletes.
    pub content: i32,
    pub seq: i64,
    pub min_seq: i64,
    pub added_snapshot_id: i64,
    pub added_files: i32,
    pub existing_files: i32,
    pub deleted_files: i32,
    pub added_rows: i64,
    pub existing_rows: i64,
    pub deleted_rows: i64,
    /// The partition field summaries, as the list that named it had them (None: not given).
    pub partitions: Option<Vec<[Avro; 4]>>,
}

fn opt(ty: Value) -> Value {
    json!(["null", ty])
}

/// The Avro schema of a manifest entry whose partition tuple is `partition` (a record).
pub fn entry_schema(partition: &Value) -> Result<Schema> {
    let data_file = json!({"type": "record", "name": "r2", "fields": [
        {"name": "content", "type": "int", "field-id": 134},
        {"name": "file_path", "type": "string", "field-id": 100},
        {"name": "file_format", "type": "string", "field-id": 101},
        {"name": "partition", "type": partition, "field-id": 102},
        {"name": "record_count", "type": "long", "field-id": 103},
        {"name": "file_size_in_bytes", "type": "long", "field-id": 104},
    ]});
    let entry = json!({"type": "record", "name": "manifest_entry", "fields": [
        {"name": "status", "type": "int", "field-id": 0},
        {"name": "snapshot_id", "type": opt(json!("long")), "default": null, "field-id": 1},
        {"name": "sequence_number", "type": opt(json!("long")), "default": null, "field-id": 3},
        {"name": "file_sequence_number", "type": opt(json!("long")), "default": null, "field-id": 4},
        {"name": "data_file", "type": data_file, "field-id": 2},
    ]});
    Schema::parse(&entry).map_err(|e| IcebergError::Metadata(format!("manifest schema: {e}")))
}

fn list_schema() -> Result<Schema> {
    let summary = json!({"type": "record", "name": "r508", "fields": [
        {"name": "contains_null", "type": "boolean", "field-id": 509},
        {"name": "contains_nan", "type": opt(json!("boolean")), "default": null, "field-id": 518},
        {"name": "lower_bound", "type": opt(json!("bytes")), "default": null, "field-id": 510},
        {"name": "upper_bound", "type": opt(json!("bytes")), "default": null, "field-id": 511},
    ]});
    let file = json!({"type": "record", "name": "manifest_file", "fields": [
        {"name": "manifest_path", "type": "string", "field-id": 500},
        {"name": "manifest_length", "type": "long", "field-id": 501},
        {"name": "partition_spec_id", "type": "int", "field-id": 502},
        {"name": "content", "type": "int", "field-id": 517},
        {"name": "sequence_number", "type": "long", "field-id": 515},
        {"name": "min_sequence_number", "type": "long", "field-id": 516},
        {"name": "added_snapshot_id", "type": "long", "field-id": 503},
        {"name": "added_files_count", "type": "int", "field-id": 504},
        {"name": "existing_files_count", "type": "int", "field-id": 505},
        {"name": "deleted_files_count", "type": "int", "field-id": 506},
        {"name": "added_rows_count", "type": "long", "field-id": 512},
        {"name": "existing_rows_count", "type": "long", "field-id": 513},
        {"name": "deleted_rows_count", "type": "long", "field-id": 514},
        {"name": "partitions", "type": opt(json!({"type": "array", "items": summary, "element-id": 508})), "default": null, "field-id": 507},
    ]});
    Schema::parse(&file).map_err(|e| IcebergError::Metadata(format!("manifest list schema: {e}")))
}

/// A writer of deflated blocks. Not the null codec: apache-avro leaves `avro.codec` out of the
/// header for it, and PyIceberg reads a header without one as gzip, which it cannot read.
fn writer(schema: &Schema) -> apache_avro::AvroResult<Writer<'_, Vec<u8>>> {
    Writer::with_codec(schema, Vec::new(), Codec::Deflate(DeflateSettings::default()))
}

fn avro_err(what: &str) -> impl Fn(apache_avro::Error) -> IcebergError + '_ {
    move |e| IcebergError::Metadata(format!("{what}: {e}"))
}

fn some(v: Avro) -> Avro {
    Avro::Union(1, Box::new(v))
}

fn none() -> Avro {
    Avro::Union(0, Box::new(Avro::Null))
}

/// A value out of its union.
fn plain(v: &Avro) -> &Avro {
    match v {
        Avro::Union(_, inner) => plain(inner),
        other => other,
    }
}

fn get<'a>(record: &'a Avro, name: &str) -> Option<&'a Avro> {
    match plain(record) {
        Avro::Record(fields) => fields.iter().find(|(n, _)| n == name).map(|(_, v)| plain(v)),
        _ => None,
    }
}

fn long(record: &Avro, name: &str) -> Option<i64> {
    match get(record, name)? {
        Avro::Long(v) => Some(*v),
        Avro::Int(v) => Some(*v as i64),
        _ => None,
    }
}

fn string(record: &Avro, name: &str) -> Option<String> {
    match get(record, name)? {
        Avro::String(s) => Some(s.clone()),
        _ => None,
    }
}

/// Writes a manifest of `entries` (each with its partition tuple in `partition_schema`'s
/// order), with the table's current schema (JSON text) and `spec` in its header.
pub fn write_manifest(entries: &[Entry], partition_schema: &Value, schema_json: &str, spec: &Value) -> Result<Vec<u8>> {
    let schema = entry_schema(partition_schema)?;
    let mut w = writer(&schema).map_err(avro_err("manifest"))?;
    let spec_id = spec.get("spec-id").and_then(Value::as_i64).unwrap_or(0);
    let fields = spec.get("fields").cloned().unwrap_or(json!([]));
    for (k, v) in [
        ("schema", schema_json.to_string()),
        ("partition-spec", fields.to_string()),
        ("partition-spec-id", spec_id.to_string()),
        ("format-version", "2".to_string()),
        ("content", "data".to_string()),
    ] {
        w.add_user_metadata(k.to_string(), v).map_err(avro_err("manifest"))?;
    }
    for e in entries {
        // An added entry inherits its sequence numbers from the manifest list (the commit's).
        let (seq, file_seq) = if e.status == ADDED { (none(), none()) } else { (some(Avro::Long(e.seq)), some(Avro::Long(e.file_seq))) };
        let partition =
            e.partition.iter().map(|(n, v)| (n.clone(), if matches!(plain(v), Avro::Null) { none() } else { some(plain(v).clone()) }));
        let record = Avro::Record(vec![
            ("status".into(), Avro::Int(e.status)),
            ("snapshot_id".into(), some(Avro::Long(e.snapshot_id))),
            ("sequence_number".into(), seq),
            ("file_sequence_number".into(), file_seq),
            (
                "data_file".into(),
                Avro::Record(vec![
                    ("content".into(), Avro::Int(e.content)),
                    ("file_path".into(), Avro::String(e.path.clone())),
                    ("file_format".into(), Avro::String(e.format.clone())),
                    ("partition".into(), Avro::Record(partition.collect())),
                    ("record_count".into(), Avro::Long(e.records)),
                    ("file_size_in_bytes".into(), Avro::Long(e.size)),
                ]),
            ),
        ]);
        w.append_value_ref(&record).map_err(avro_err("manifest entry"))?;
    }
    w.into_inner().map_err(avro_err("manifest"))
}

/// The entries of a manifest that `m` names (any writer's), sequence numbers resolved.
pub fn read_manifest(bytes: &[u8], m: &ManifestFile) -> Result<Vec<Entry>> {
    let what = format!("manifest {}", m.path);
    let reader = Reader::new(bytes).map_err(|e| IcebergError::Metadata(format!("{what}: {e}")))?;
    let mut out = Vec::new();
    for v in reader {
        let v = v.map_err(|e| IcebergError::Metadata(format!("{what}: {e}")))?;
        let bad = |field: &str| IcebergError::Metadata(format!("{what}: an entry without {field}"));
        let status = long(&v, "status").ok_or_else(|| bad("status"))? as i32;
        let df = get(&v, "data_file").ok_or_else(|| bad("data_file"))?;
        // Null sequence numbers are inherited (only an added entry's may be).
        let seq = long(&v, "sequence_number").unwrap_or(m.seq);
        let partition = match get(df, "partition") {
            Some(Avro::Record(fields)) => fields.iter().map(|(n, v)| (n.clone(), plain(v).clone())).collect(),
            _ => vec![],
        };
        out.push(Entry {
            status,
            snapshot_id: long(&v, "snapshot_id").unwrap_or(m.added_snapshot_id),
            seq,
            file_seq: long(&v, "file_sequence_number").unwrap_or(if status == ADDED { m.seq } else { seq }),
            content: long(df, "content").unwrap_or(0) as i32,
            path: string(df, "file_path").ok_or_else(|| bad("file_path"))?,
            format: string(df, "file_format").unwrap_or_else(|| "PARQUET".into()),
            partition,
            records: long(df, "record_count").ok_or_else(|| bad("record_count"))?,
            size: long(df, "file_size_in_bytes").ok_or_else(|| bad("file_size_in_bytes"))?,
        });
    }
    Ok(out)
}

/// Writes the manifest list of snapshot `snapshot_id` (its parent and sequence number in the
/// header).
pub fn write_list(files: &[ManifestFile], snapshot_id: i64, parent: Option<i64>, seq: i64) -> Result<Vec<u8>> {
    let schema = list_schema()?;
    let mut w = writer(&schema).map_err(avro_err("manifest list"))?;
    let mut meta =
        vec![("snapshot-id", snapshot_id.to_string()), ("sequence-number", seq.to_string()), ("format-version", "2".to_string())];
    meta.extend(parent.map(|p| ("parent-snapshot-id", p.to_string())));
    for (k, v) in meta {
        w.add_user_metadata(k.to_string(), v).map_err(avro_err("manifest list"))?;
    }
    for m in files {
        let partitions = match &m.partitions {
            None => none(),
            Some(list) => some(Avro::Array(
                list.iter()
                    .map(|[n, nan, lo, hi]| {
                        let opt = |v: &Avro| if matches!(plain(v), Avro::Null) { none() } else { some(plain(v).clone()) };
                        Avro::Record(vec![
                            ("contains_null".into(), plain(n).clone()),
                            ("contains_nan".into(), opt(nan)),
                            ("lower_bound".into(), opt(lo)),
                            ("upper_bound".into(), opt(hi)),
                        ])
                    })
                    .collect(),
            )),
        };
        let record = Avro::Record(vec![
            ("manifest_path".into(), Avro::String(m.path.clone())),
            ("manifest_length".into(), Avro::Long(m.length)),
            ("partition_spec_id".into(), Avro::Int(m.spec_id)),
            ("content".into(), Avro::Int(m.content)),
            ("sequence_number".into(), Avro::Long(m.seq)),
            ("min_sequence_number".into(), Avro::Long(m.min_seq)),
            ("added_snapshot_id".into(), Avro::Long(m.added_snapshot_id)),
            ("added_files_count".into(), Avro::Int(m.added_files)),
            ("existing_files_count".into(), Avro::Int(m.existing_files)),
            ("deleted_files_count".into(), Avro::Int(m.deleted_files)),
            ("added_rows_count".into(), Avro::Long(m.added_rows)),
            ("existing_rows_count".into(), Avro::Long(m.existing_rows)),
            ("deleted_rows_count".into(), Avro::Long(m.deleted_rows)),
            ("partitions".into(), partitions),
        ]);
        w.append_value_ref(&record).map_err(avro_err("manifest list entry"))?;
    }
    w.into_inner().map_err(avro_err("manifest list"))
}

/// The manifests a manifest list names (any writer's).
pub fn read_list(bytes: &[u8], path: &str) -> Result<Vec<ManifestFile>> {
    let what = format!("manifest list {path}");
    let reader = Reader::new(bytes).map_err(|e| IcebergError::Metadata(format!("{what}: {e}")))?;
    let mut out = Vec::new();
    for v in reader {
        let v = v.map_err(|e| IcebergError::Metadata(format!("{what}: {e}")))?;
        let need = |field: &str| long(&v, field).ok_or_else(|| IcebergError::Metadata(format!("{what}: an entry without {field}")));
        let partitions = match get(&v, "partitions") {
            Some(Avro::Array(list)) => Some(
                list.iter()
                    .map(|s| {
                        let f = |n: &str| get(s, n).cloned().unwrap_or(Avro::Null);
                        [f("contains_null"), f("contains_nan"), f("lower_bound"), f("upper_bound")]
                    })
                    .collect(),
            ),
            _ => None,
        };
        out.push(ManifestFile {
            path: string(&v, "manifest_path").ok_or_else(|| IcebergError::Metadata(format!("{what}: an entry without manifest_path")))?,
            length: need("manifest_length")?,
            spec_id: need("partition_spec_id")? as i32,
            content: long(&v, "content").unwrap_or(0) as i32,
            seq: long(&v, "sequence_number").unwrap_or(0),
            min_seq: long(&v, "min_sequence_number").unwrap_or(0),
            added_snapshot_id: need("added_snapshot_id")?,
            added_files: long(&v, "added_files_count").unwrap_or(0) as i32,
            existing_files: long(&v, "existing_files_count").unwrap_or(0) as i32,
            deleted_files: long(&v, "deleted_files_count").unwrap_or(0) as i32,
            added_rows: long(&v, "added_rows_count").unwrap_or(0),
            existing_rows: long(&v, "existing_rows_count").unwrap_or(0),
            deleted_rows: long(&v, "deleted_rows_count").unwrap_or(0),
            partitions,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{PartitionField, partition_avro};

    #[test]
    fn a_manifest_and_its_list_read_back_with_inherited_sequence_numbers() {
        let fields = [PartitionField { name: "dt".into(), ty: "date".into(), field_id: 1000 }];
        let part = partition_avro(&fields).unwrap();
        let e = |status, path: &str| Entry {
            status,
            snapshot_id: 7,
            seq: 3,
            file_seq: 3,
            content: 0,
            path: path.into(),
            format: "PARQUET".into(),
            partition: vec![("dt".into(), Avro::Date(20000))],
            records: 10,
            size: 100,
        };
        let bytes = write_manifest(&[e(ADDED, "a"), e(DELETED, "b")], &part, "{}", &json!({"spec-id": 0, "fields": []})).unwrap();
        // The header's schema keeps the field ids readers resolve by.
        let header = Reader::new(&bytes[..]).unwrap().writer_schema().canonical_form();
        assert!(String::from_utf8_lossy(&bytes).contains("\"field-id\":102"), "{header}");
        let m = ManifestFile {
            path: "m".into(),
            length: bytes.len() as i64,
            spec_id: 0,
            content: 0,
            seq: 5,
            min_seq: 3,
            added_snapshot_id: 9,
            added_files: 1,
            existing_files: 0,
            deleted_files: 1,
            added_rows: 10,
            existing_rows: 0,
            deleted_rows: 10,
            partitions: None,
        };
        let got = read_manifest(&bytes, &m).unwrap();
        assert_eq!((got[0].seq, got[0].file_seq, got[0].status), (5, 5, ADDED));
        assert_eq!((got[1].seq, got[1].file_seq, got[1].status), (3, 3, DELETED));
        assert_eq!(got[0].partition, vec![("dt".to_string(), Avro::Date(20000))]);
        let list = write_list(std::slice::from_ref(&m), 9, Some(8), 5).unwrap();
        assert_eq!(read_list(&list, "l").unwrap(), vec![m]);
    }
}
