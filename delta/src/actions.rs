//! The log's actions as Ferry writes them, and the types and paths they hold.

use std::collections::BTreeMap;

use ferry_ledger::SchemaColumn;
use serde_json::{Value, json};

use crate::{DeltaError, Feature, Metadata, Protocol, READER_VERSION, Result, TXN_RETENTION, WRITER_VERSION};

/// The protocol of a new table with these columns.
pub fn protocol(columns: &[SchemaColumn]) -> Protocol {
    let legacy = Protocol::legacy(READER_VERSION, WRITER_VERSION);
    if columns.iter().any(|c| c.detail.contains("timestamp_ntz")) { legacy.with(Feature::TimestampNtz) } else { legacy }
}

/// The metaData of a new table: its id (kept across schema changes), its schema and partition
/// columns, created at `now_ms`.
pub fn metadata(id: &str, name: &str, columns: &[SchemaColumn], partition_by: &[String], now_ms: i64) -> Result<Metadata> {
    let fields =
        columns.iter().map(|c| Ok(json!({"name": c.name, "type": delta_type(&c.detail)?, "nullable": c.nullable, "metadata": {}})));
    let schema = json!({"type": "struct", "fields": fields.collect::<Result<Vec<_>>>()?});
    Ok(Metadata {
        id: id.to_string(),
        name: Some(name.to_string()),
        description: None,
        format: json!({"provider": "parquet", "options": {}}),
        schema_string: schema.to_string(),
        partition_columns: partition_by.to_vec(),
        configuration: BTreeMap::from([("delta.setTransactionRetentionDuration".to_string(), TXN_RETENTION.to_string())]),
        created_time: Some(now_ms),
        other: Default::default(),
    })
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
        ("decimal", p) => match ferry_table::types::decimal(p) {
            Some((p, s)) => json!(format!("decimal({p},{s})")),
            None => return refuse("Delta decimals have a precision of 1 to 38"),
        },
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
    ferry_table::types::inner(t).ok_or_else(|| DeltaError::Schema(format!("cannot read type {whole}")))
}

use ferry_table::types::split_top;

/// An `add` action for a part at table path `rel` (relative to the table), with the file's
/// statistics as transform recorded them (`stats` JSON), or its row count alone.
pub fn add(
    rel: &str,
    partition_values: &BTreeMap<String, Option<String>>,
    size: i64,
    records: i64,
    stats: Option<&str>,
    now_ms: i64,
) -> Value {
    let stats = stats.map_or_else(|| json!({"numRecords": records}).to_string(), str::to_string);
    json!({"add": {
        "path": encode_path(rel),
        "partitionValues": partition_values,
        "size": size,
        "modificationTime": now_ms,
        "dataChange": true,
        "stats": stats,
    }})
}

/// A `remove` action for table path `rel`; its partition values are its directory's.
pub fn remove(rel: &str, size: i64, now_ms: i64) -> Value {
    let partition_values = partition_values(rel.rsplit_once('/').map_or("", |(dir, _)| dir), &[]);
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

pub use ferry_table::chunk_of;

/// A Hive partition path (`dt=2026-11-28/h=%2F`) as Delta's partition values: the column
/// names, and the values unescaped (Hive's default partition is null). The directory holds
/// Arrow's text of a value; a timestamp column's value is written as Delta's protocol reads it
/// (see [`delta_partition_text`]), found by its type in `columns`.
pub fn partition_values(partition: &str, columns: &[SchemaColumn]) -> BTreeMap<String, Option<String>> {
    partition
        .split('/')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| {
            let v = ferry_common::paths::unescape_partition_value(v);
            let detail = columns.iter().find(|c| c.name == k).map_or("", |c| c.detail.as_str());
            (k.to_string(), v.map(|v| delta_partition_text(detail, &v).unwrap_or(v)))
        })
        .collect()
}

/// A partition value's text as Delta's protocol serializes it, for the types whose Arrow text
/// differs: a timestamp (`2026-11-20T10:00:00+00:00` in the directory) as an ISO 8601 instant in
/// UTC (`2026-11-20T10:00:00.000000Z`, which readers in any session time zone read alike), a
/// timestamp without time zone (`2026-11-20T10:00:00`) as `2026-11-20 10:00:00.000000`. None:
/// the text is Delta's already (or not a timestamp this reads, left as it is).
pub fn delta_partition_text(detail: &str, text: &str) -> Option<String> {
    const NTZ: &str = "%Y-%m-%d %H:%M:%S%.6f";
    if detail.starts_with("timestamp_ntz") {
        let t = chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f").ok()?;
        Some(t.format(NTZ).to_string())
    } else if detail.starts_with("timestamp") {
        let t = chrono::DateTime::parse_from_rfc3339(text).ok()?;
        Some(t.with_timezone(&chrono::Utc).format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string())
    } else {
        None
    }
}

/// A `remove` action for `active` (at table path `rel`): its partition values as its `add`
/// wrote them.
pub fn remove_active(rel: &str, active: &crate::Active, now_ms: i64) -> Value {
    let mut r = remove(rel, active.size, now_ms);
    if let Some(v) = active.action.get("partitionValues") {
        r["remove"]["partitionValues"] = v.clone();
    }
    r
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
        let v = partition_values("dt=2026-11-28/k=a%2Fb/n=__HIVE_DEFAULT_PARTITION__", &[]);
        assert_eq!(v["dt"].as_deref(), Some("2026-11-28"));
        assert_eq!(v["k"].as_deref(), Some("a/b"));
        assert_eq!(v["n"], None);
        assert!(partition_values("", &[]).is_empty());
    }

    #[test]
    fn timestamp_partition_values_are_written_as_delta_reads_them() {
        let col = |name: &str, detail: &str| SchemaColumn { name: name.into(), hive: String::new(), detail: detail.into(), nullable: true };
        let columns = [col("ts", "timestamp[us]"), col("at", "timestamp_ntz[ms]"), col("d", "date"), col("s", "string")];
        let v = partition_values(
            "ts=2026-11-20T10%3A00%3A00%2B00%3A00/at=2026-11-20T10%3A00%3A00.5/d=2026-11-20/s=2026-11-20T10%3A00%3A00%2B00%3A00",
            &columns,
        );
        assert_eq!(v["ts"].as_deref(), Some("2026-11-20T10:00:00.000000Z"));
        assert_eq!(v["at"].as_deref(), Some("2026-11-20 10:00:00.500000"));
        assert_eq!(v["d"].as_deref(), Some("2026-11-20"));
        // A string column's value is kept as it is, whatever it looks like.
        assert_eq!(v["s"].as_deref(), Some("2026-11-20T10:00:00+00:00"));
        // Another offset is the same instant in UTC; a value this does not read stays.
        assert_eq!(delta_partition_text("timestamp[us]", "2026-11-20T12:30:00.25+02:00").as_deref(), Some("2026-11-20T10:30:00.250000Z"));
        assert_eq!(delta_partition_text("timestamp[us]", "not a time"), None);
    }
}
