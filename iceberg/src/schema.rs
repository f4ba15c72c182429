//! Ferry's recorded schema as an Iceberg schema (field ids, types), its evolution against the
//! table's current schema, the identity partition spec from `partition_by`, the default name
//! mapping (Ferry's Parquet files carry no field ids: readers resolve columns by name through
//! it), and partition values typed for the manifests.

use apache_avro::types::Value as Avro;
use ferry_ledger::SchemaColumn;
use serde_json::{Value, json};

use crate::{IcebergError, Result};

/// Where Iceberg numbers a spec's partition fields from.
pub const FIRST_PARTITION_FIELD_ID: i64 = 1000;

/// An Iceberg type for a Parquet column type as Ferry records it (`detail`), with the ids of
/// nested fields taken from `next`.
pub fn iceberg_type(detail: &str, next: &mut i64) -> Result<Value> {
    let d = detail.trim();
    let refuse = |why: &str| Err(IcebergError::Schema(format!("Iceberg has no type for {d}: {why}")));
    let (head, inner) = match d.find(['<', '[', '(']) {
        Some(i) => (&d[..i], &d[i..]),
        None => (d, ""),
    };
    Ok(match (head, inner) {
        ("string", "") => json!("string"),
        ("boolean", "") => json!("boolean"),
        ("tinyint" | "smallint" | "int", "") => json!("int"),
        ("bigint", "") => json!("long"),
        ("float", "") => json!("float"),
        ("double", "") => json!("double"),
        ("date", "") => json!("date"),
        ("binary", "") => json!("binary"),
        ("fixed", n) => match n.trim_matches(['(', ')', '[', ']']).trim().parse::<u32>() {
            Ok(n) if n > 0 => json!(format!("fixed[{n}]")),
            _ => return refuse("cannot read its length"),
        },
        ("decimal", p) => match ferry_table::types::decimal(p) {
            Some((p, s)) => json!(format!("decimal({p}, {s})")),
            None => return refuse("Iceberg decimals have a precision of 1 to 38"),
        },
        ("timestamp", "[ms]" | "[us]") => json!("timestamptz"),
        ("timestamp_ntz", "[ms]" | "[us]") => json!("timestamp"),
        ("timestamp" | "timestamp_ntz", _) => return refuse("Iceberg v2 timestamps hold microseconds; use timestamp_us or timestamp_ms"),
        ("time", _) => return refuse("Ferry writes no time of day to Iceberg tables; cast it to long or string"),
        ("list", t) => {
            let id = take(next);
            json!({"type": "list", "element-id": id, "element": iceberg_type(unwrap(t, d)?, next)?, "element-required": false})
        }
        ("map", t) => {
            let kv = split_top(unwrap(t, d)?);
            let [k, v] = kv.as_slice() else { return refuse("a map needs a key and a value type") };
            let (key_id, value_id) = (take(next), take(next));
            json!({"type": "map", "key-id": key_id, "key": iceberg_type(k, next)?, "value-id": value_id,
                   "value": iceberg_type(v, next)?, "value-required": false})
        }
        ("struct", t) => {
            let parts = split_top(unwrap(t, d)?);
            let ids: Vec<i64> = parts.iter().map(|_| take(next)).collect();
            let fields = parts
                .into_iter()
                .zip(ids)
                .map(|(f, id)| {
                    let (name, ty) = f.split_once(':').ok_or_else(|| IcebergError::Schema(format!("cannot read field {f:?} of {d}")))?;
                    Ok(json!({"id": id, "name": name, "required": false, "type": iceberg_type(ty, next)?}))
                })
                .collect::<Result<Vec<_>>>()?;
            json!({"type": "struct", "fields": fields})
        }
        _ => return refuse("not a type Ferry writes to Iceberg tables"),
    })
}

fn take(next: &mut i64) -> i64 {
    *next += 1;
    *next
}

/// `<...>` without its brackets.
fn unwrap<'a>(t: &'a str, whole: &str) -> Result<&'a str> {
    ferry_table::types::inner(t).ok_or_else(|| IcebergError::Schema(format!("cannot read type {whole}")))
}

/// [`ferry_table::types::split_top`], each piece trimmed.
fn split_top(s: &str) -> Vec<&str> {
    ferry_table::types::split_top(s).into_iter().map(str::trim).collect()
}

/// A type without its field ids: what two schemas are compared by.
pub fn shape(ty: &Value) -> Value {
    match ty {
        Value::Object(o) => Value::Object(
            o.iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "id" | "element-id" | "key-id" | "value-id" | "doc" | "initial-default" | "write-default")
                })
                .map(|(k, v)| (k.clone(), shape(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(shape).collect()),
        other => other.clone(),
    }
}

/// The schema of a new table: Ferry's columns with ids 1..n, nested fields after them.
pub fn new_schema(columns: &[SchemaColumn]) -> Result<(Value, i64)> {
    let mut next = columns.len() as i64;
    let mut fields = Vec::new();
    for (i, c) in columns.iter().enumerate() {
        let ty = iceberg_type(&c.detail, &mut next)?;
        fields.push(json!({"id": i as i64 + 1, "name": c.name, "required": !c.nullable, "type": ty}));
    }
    Ok((json!({"type": "struct", "schema-id": 0, "fields": fields}), next))
}

/// The table's current schema with Ferry's columns taken in, or None when it holds them all
/// already. Columns are matched by name; a column the table lacks is appended (optional: the
/// table's files so far read it as null) with ids past `last_column_id`; a required column may
/// become optional; `int` may become `long` and `float` `double` (the promotions Iceberg v2
/// allows). Any other change is refused, and every column of the table Ferry's schema lacks
/// (another writer's) stays as it is. Returns the new schema (its id one past the table's
/// highest) and the new last column id.
pub fn evolve(
    current: &Value,
    schema_ids: i64,
    last_column_id: i64,
    columns: &[SchemaColumn],
    table: &str,
) -> Result<Option<(Value, i64)>> {
    let mut schema = current.clone();
    let Some(fields) = schema.get_mut("fields").and_then(Value::as_array_mut) else {
        return Err(IcebergError::Metadata(format!("Iceberg table {table}: its current schema has no fields")));
    };
    let mut next = last_column_id;
    let mut changed = false;
    for c in columns {
        let name = |f: &Value| f.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
        let mut scratch = 0;
        let want = iceberg_type(&c.detail, &mut scratch)?;
        match fields.iter_mut().find(|f| name(f) == c.name) {
            Some(f) => {
                let have = f.get("type").cloned().unwrap_or(Value::Null);
                if shape(&have) != shape(&want) {
                    let promoted = matches!((have.as_str(), want.as_str()), (Some("int"), Some("long")) | (Some("float"), Some("double")));
                    if !promoted {
                        return Err(IcebergError::Schema(format!(
                            "column {:?} of Iceberg table {table} is {have}, Ferry's schema has {want}: Iceberg v2 changes a \
                             column's type only from int to long, float to double or to a wider decimal; load into a new table",
                            c.name
                        )));
                    }
                    f["type"] = want;
                    changed = true;
                }
                if c.nullable && f.get("required").and_then(Value::as_bool) == Some(true) {
                    f["required"] = Value::Bool(false);
                    changed = true;
                }
            }
            None if c.nullable => {
                let id = take(&mut next);
                let ty = iceberg_type(&c.detail, &mut next)?;
                fields.push(json!({"id": id, "name": c.name, "required": false, "type": ty}));
                changed = true;
            }
            None => {
                return Err(IcebergError::Schema(format!(
                    "new column {:?} is required: an Iceberg v2 table gains optional columns only",
                    c.name
                )));
            }
        }
    }
    if !changed {
        return Ok(None);
    }
    schema["schema-id"] = json!(schema_ids + 1);
    Ok(Some((schema, next)))
}

/// The default name mapping for `schema` (`schema.name-mapping.default`), keeping the names an
/// earlier mapping gave each field id (aliases another writer set).
pub fn name_mapping(schema: &Value, earlier: Option<&Value>) -> Value {
    fn names_of(earlier: Option<&Value>, id: i64) -> Option<Value> {
        let list = earlier?.as_array()?;
        for m in list {
            if m.get("field-id").and_then(Value::as_i64) == Some(id) {
                return m.get("names").cloned();
            }
            if let Some(n) = names_of(m.get("fields"), id) {
                return Some(n);
            }
        }
        None
    }
    fn entry(id: i64, name: &str, ty: &Value, earlier: Option<&Value>) -> Value {
        let names = names_of(earlier, id).unwrap_or_else(|| json!([name]));
        let mut m = json!({"field-id": id, "names": names});
        let nested = nested(ty, earlier);
        if !nested.is_empty() {
            m["fields"] = Value::Array(nested);
        }
        m
    }
    fn nested(ty: &Value, earlier: Option<&Value>) -> Vec<Value> {
        let id = |k: &str| ty.get(k).and_then(Value::as_i64).unwrap_or(0);
        match ty.get("type").and_then(Value::as_str) {
            Some("struct") => fields(ty, earlier),
            Some("list") => vec![entry(id("element-id"), "element", &ty["element"], earlier)],
            Some("map") => vec![entry(id("key-id"), "key", &ty["key"], earlier), entry(id("value-id"), "value", &ty["value"], earlier)],
            _ => vec![],
        }
    }
    fn fields(s: &Value, earlier: Option<&Value>) -> Vec<Value> {
        s.get("fields")
            .and_then(Value::as_array)
            .map(|fs| {
                fs.iter()
                    .map(|f| {
                        let id = f.get("id").and_then(Value::as_i64).unwrap_or(0);
                        entry(id, f.get("name").and_then(Value::as_str).unwrap_or_default(), &f["type"], earlier)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
    Value::Array(fields(schema, earlier))
}

/// One identity partition field: its name, its source column's Iceberg type, its field id.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionField {
    pub name: String,
    pub ty: String,
    pub field_id: i64,
}

/// The identity spec of `partition_by` over `schema` (spec id 0).
pub fn new_spec(schema: &Value, partition_by: &[String]) -> Result<Value> {
    let mut fields = Vec::new();
    for (i, col) in partition_by.iter().enumerate() {
        let f = field_named(schema, col).ok_or_else(|| IcebergError::Schema(format!("partition column {col:?} is not in the schema")))?;
        fields.push(json!({"name": col, "transform": "identity", "source-id": f["id"], "field-id": FIRST_PARTITION_FIELD_ID + i as i64}));
    }
    Ok(json!({"spec-id": 0, "fields": fields}))
}

fn field_named<'a>(schema: &'a Value, name: &str) -> Option<&'a Value> {
    schema.get("fields")?.as_array()?.iter().find(|f| f.get("name").and_then(Value::as_str) == Some(name))
}

/// The partition fields of `spec` over `schema`, checked to be identity partitions on
/// `partition_by` in order: a table partitioned otherwise (another writer's spec) is refused.
pub fn spec_fields(spec: &Value, schema: &Value, partition_by: &[String], table: &str) -> Result<Vec<PartitionField>> {
    let fields = spec.get("fields").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut out = Vec::new();
    for f in &fields {
        let source = f.get("source-id").and_then(Value::as_i64).unwrap_or(-1);
        let col = schema
            .get("fields")
            .and_then(Value::as_array)
            .and_then(|fs| fs.iter().find(|c| c.get("id").and_then(Value::as_i64) == Some(source)));
        let (Some(col), Some("identity")) = (col, f.get("transform").and_then(Value::as_str)) else {
            return Err(spec_refused(table, spec, partition_by));
        };
        out.push(PartitionField {
            name: col["name"].as_str().unwrap_or_default().to_string(),
            ty: col["type"].as_str().unwrap_or("nested").to_string(),
            field_id: f.get("field-id").and_then(Value::as_i64).unwrap_or(0),
        });
    }
    if out.iter().map(|f| f.name.as_str()).ne(partition_by.iter().map(String::as_str)) {
        return Err(spec_refused(table, spec, partition_by));
    }
    Ok(out)
}

fn spec_refused(table: &str, spec: &Value, partition_by: &[String]) -> IcebergError {
    IcebergError::Schema(format!(
        "Iceberg table {table} has the partition spec {spec}; [table] partition_by {partition_by:?} asks for identity partitions on \
         those columns in that order: set partition_by to the table's, or load into a new table"
    ))
}

/// A Hive partition path (`dt=2026-11-28/h=%2F`) as the partition tuple of a manifest entry,
/// typed by each field's source type.
pub fn partition_tuple(partition: &str, fields: &[PartitionField]) -> Result<Vec<(String, Avro)>> {
    let values: Vec<(&str, Option<String>)> = partition
        .split('/')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k, ferry_common::paths::unescape_partition_value(v)))
        .collect();
    let mut out = Vec::new();
    for f in fields {
        let Some((_, text)) = values.iter().find(|(k, _)| *k == f.name) else {
            return Err(IcebergError::Schema(format!("part path {partition:?} has no value for partition column {:?}", f.name)));
        };
        let bad = |why: &str| IcebergError::Schema(format!("partition value {text:?} of {:?} ({}): {why}", f.name, f.ty));
        let v = match text {
            None => Avro::Union(0, Box::new(Avro::Null)),
            Some(t) => {
                let inner = match f.ty.as_str() {
                    "string" => Avro::String(t.clone()),
                    "int" => Avro::Int(t.parse().map_err(|_| bad("not an int"))?),
                    "long" => Avro::Long(t.parse().map_err(|_| bad("not a long"))?),
                    "boolean" => Avro::Boolean(t.parse().map_err(|_| bad("not a boolean"))?),
                    "date" => {
                        let d = chrono::NaiveDate::parse_from_str(t, "%Y-%m-%d").map_err(|_| bad("not a date"))?;
                        Avro::Date((d - chrono::NaiveDate::default()).num_days() as i32)
                    }
                    "timestamptz" => {
                        let t = chrono::DateTime::parse_from_rfc3339(t).map_err(|_| bad("not a timestamp"))?;
                        Avro::TimestampMicros(t.timestamp_micros())
                    }
                    "timestamp" => {
                        let t = chrono::NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%S%.f").map_err(|_| bad("not a timestamp"))?;
                        Avro::LocalTimestampMicros(t.and_utc().timestamp_micros())
                    }
                    _ => return Err(bad("Ferry partitions Iceberg tables by string, int, long, boolean, date and timestamp columns")),
                };
                Avro::Union(1, Box::new(inner))
            }
        };
        out.push((f.name.clone(), v));
    }
    Ok(out)
}

/// The Avro schema of the partition tuple of `fields` (each optional).
pub fn partition_avro(fields: &[PartitionField]) -> Result<Value> {
    let mut out = Vec::new();
    for f in fields {
        let ty = match f.ty.as_str() {
            "string" | "int" | "long" | "boolean" => json!(f.ty),
            "date" => json!({"type": "int", "logicalType": "date"}),
            "timestamptz" => json!({"type": "long", "logicalType": "timestamp-micros", "adjust-to-utc": true}),
            "timestamp" => json!({"type": "long", "logicalType": "local-timestamp-micros", "adjust-to-utc": false}),
            other => return Err(IcebergError::Schema(format!("partition column {:?} is {other}: not a type Ferry partitions by", f.name))),
        };
        out.push(json!({"name": f.name, "type": ["null", ty], "default": null, "field-id": f.field_id}));
    }
    Ok(json!({"type": "record", "name": "r102", "fields": out}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, detail: &str, nullable: bool) -> SchemaColumn {
        SchemaColumn { name: name.into(), hive: String::new(), detail: detail.into(), nullable }
    }

    #[test]
    fn types_and_ids() {
        let cols = [col("a", "bigint", false), col("b", "list<struct<x:int,y:string>>", true), col("c", "timestamp[ms]", true)];
        let (s, last) = new_schema(&cols).unwrap();
        assert_eq!(last, 6);
        assert_eq!(s["fields"][0], json!({"id": 1, "name": "a", "required": true, "type": "long"}));
        assert_eq!(s["fields"][1]["type"]["element-id"], 4);
        assert_eq!(s["fields"][1]["type"]["element"]["fields"][1], json!({"id": 6, "name": "y", "required": false, "type": "string"}));
        assert_eq!(s["fields"][2]["type"], "timestamptz");
        assert!(iceberg_type("timestamp[ns]", &mut 0).is_err());
        let m = name_mapping(&s, None);
        assert_eq!(m[1]["fields"][0]["fields"][1], json!({"field-id": 6, "names": ["y"]}));
    }

    #[test]
    fn evolution_appends_promotes_and_refuses() {
        let (s, last) = new_schema(&[col("a", "int", false), col("b", "string", true)]).unwrap();
        assert!(evolve(&s, 0, last, &[col("a", "int", false)], "t").unwrap().is_none());
        let (s2, last2) = evolve(&s, 0, last, &[col("a", "bigint", true), col("c", "double", true)], "t").unwrap().unwrap();
        assert_eq!((s2["schema-id"].as_i64(), last2), (Some(1), 3));
        assert_eq!(s2["fields"][0], json!({"id": 1, "name": "a", "required": false, "type": "long"}));
        assert_eq!(s2["fields"][2], json!({"id": 3, "name": "c", "required": false, "type": "double"}));
        assert!(evolve(&s, 0, last, &[col("b", "bigint", true)], "t").is_err());
        assert!(evolve(&s, 0, last, &[col("d", "bigint", false)], "t").is_err());
    }

    #[test]
    fn partition_values_are_typed() {
        let f = |n: &str, t: &str| PartitionField { name: n.into(), ty: t.into(), field_id: 1000 };
        let t = partition_tuple("dt=1970-01-03/n=__HIVE_DEFAULT_PARTITION__", &[f("dt", "date"), f("n", "long")]).unwrap();
        assert_eq!(t[0].1, Avro::Union(1, Box::new(Avro::Date(2))));
        assert_eq!(t[1].1, Avro::Union(0, Box::new(Avro::Null)));
        assert!(partition_tuple("n=x", &[f("n", "long")]).is_err());
        assert!(partition_tuple("dt=2020-01-01", &[f("n", "long")]).is_err());
    }
}
