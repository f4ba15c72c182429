//! One schema per table, kept in the ledger (`table_schemas`) and changed only in ways that
//! keep every earlier file readable.
//!
//! A chunk's output schema (after decoding, `table.columns` and `[transform]`) is compared
//! with the table's latest recorded version:
//! - the same: nothing to do;
//! - narrower, or missing nullable columns, or in another order: the chunk's batches are put
//!   in the table's shape (widened exactly, nulls for the missing columns), so every file of
//!   the table has one schema;
//! - a compatible change (a new nullable column, `int` to `bigint`, `float` to `double`,
//!   millisecond to microsecond timestamps, a required column that may now be null): the
//!   chunk is written in the new version, which transform records before the chunk's parts,
//!   and load writes the DDL (`ALTER TABLE ... ADD COLUMNS`) from it. Where the table's format
//!   keeps column types (Delta), a wider number is not a change: the chunk's values go into the
//!   column's type, and a value that does not fit is a rejected record;
//! - anything else (another type, a new required column, a required column missing):
//!   the chunk is bad input, with a message that names the column and both types.
//!
//! Types are compared by `detail`, a text of Ferry's own that names the exact Parquet type
//! (`timestamp[ms]`, `list<string>`), so the comparison does not depend on Arrow's formatting.

use std::sync::Arc;

use arrow::array::{ArrayRef, new_null_array};
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use ferry_ledger::{SchemaColumn, TableSchema};

use crate::{TransformError, bad_input};

/// The Hive type and Ferry's exact type text of an Arrow type.
pub fn describe(dt: &DataType) -> (String, String) {
    let unit = |u: &TimeUnit| match u {
        TimeUnit::Second => "s",
        TimeUnit::Millisecond => "ms",
        TimeUnit::Microsecond => "us",
        TimeUnit::Nanosecond => "ns",
    };
    let same = |h: &str| (h.to_string(), h.to_ascii_lowercase());
    match dt {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => same("STRING"),
        DataType::Boolean => same("BOOLEAN"),
        DataType::Int8 => same("TINYINT"),
        DataType::Int16 | DataType::UInt8 => same("SMALLINT"),
        DataType::Int32 | DataType::UInt16 => same("INT"),
        DataType::Int64 | DataType::UInt32 => same("BIGINT"),
        DataType::UInt64 => same("DECIMAL(20,0)"),
        DataType::Float16 | DataType::Float32 => same("FLOAT"),
        DataType::Float64 => same("DOUBLE"),
        DataType::Date32 | DataType::Date64 => same("DATE"),
        DataType::Timestamp(u, tz) => {
            let zone = if tz.is_some() { "" } else { "_ntz" };
            ("TIMESTAMP".into(), format!("timestamp{zone}[{}]", unit(u)))
        }
        // Hive has no time of day: the files hold Parquet TIME, which Hive reads as a number.
        DataType::Time32(u) => ("INT".into(), format!("time[{}]", unit(u))),
        DataType::Time64(u) => ("BIGINT".into(), format!("time[{}]", unit(u))),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => same("BINARY"),
        DataType::FixedSizeBinary(n) => ("BINARY".into(), format!("fixed[{n}]")),
        DataType::Decimal32(p, s) | DataType::Decimal64(p, s) | DataType::Decimal128(p, s) | DataType::Decimal256(p, s) => {
            same(&format!("DECIMAL({p},{s})"))
        }
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            let (h, d) = describe(f.data_type());
            (format!("ARRAY<{h}>"), format!("list<{d}>"))
        }
        DataType::Struct(fs) => {
            let (h, d): (Vec<String>, Vec<String>) = fs
                .iter()
                .map(|f| {
                    let (h, d) = describe(f.data_type());
                    (format!("{}:{h}", ferry_common::hive::ident(f.name())), format!("{}:{d}", f.name()))
                })
                .unzip();
            (format!("STRUCT<{}>", h.join(",")), format!("struct<{}>", d.join(",")))
        }
        DataType::Map(entries, _) => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => {
                let (kh, kd) = describe(kv[0].data_type());
                let (vh, vd) = describe(kv[1].data_type());
                (format!("MAP<{kh},{vh}>"), format!("map<{kd},{vd}>"))
            }
            other => describe(other),
        },
        // Parquet stores a dictionary's values.
        DataType::Dictionary(_, v) => describe(v),
        other => ("STRING".into(), format!("{other:?}")),
    }
}

/// The recorded form of `schema`.
pub fn columns(schema: &Schema) -> Vec<SchemaColumn> {
    schema
        .fields()
        .iter()
        .map(|f| {
            let (hive, detail) = describe(f.data_type());
            SchemaColumn { name: f.name().clone(), hive, detail, nullable: f.is_nullable() }
        })
        .collect()
}

/// Whether a column of type `from` (detail) can be read as `to` without a change to any value.
fn widens(from: &str, to: &str) -> bool {
    matches!(
        (from, to),
        ("tinyint" | "smallint" | "int", "bigint")
            | ("tinyint" | "smallint", "int")
            | ("tinyint", "smallint")
            | ("float", "double")
            | ("timestamp[ms]", "timestamp[us]")
            | ("timestamp_ntz[ms]", "timestamp_ntz[us]")
    )
}

/// Whether widening `from` to `to` changes the column's type in a table that keeps types
/// (Delta): the numbers do; a timestamp's unit does not (Delta's timestamps are microseconds,
/// whatever unit the files hold).
fn changes_type(from: &str, to: &str) -> bool {
    !(from.starts_with("timestamp") && to.starts_with("timestamp"))
}

/// The Arrow type of a primitive detail that [`widens`] names (the types a table column may be
/// widened to, or filled with nulls in).
fn arrow_of(detail: &str) -> Option<DataType> {
    let utc = || Some("+00:00".into());
    Some(match detail {
        "string" => DataType::Utf8,
        "boolean" => DataType::Boolean,
        "tinyint" => DataType::Int8,
        "smallint" => DataType::Int16,
        "int" => DataType::Int32,
        "bigint" => DataType::Int64,
        "float" => DataType::Float32,
        "double" => DataType::Float64,
        "date" => DataType::Date32,
        "binary" => DataType::Binary,
        "timestamp[ms]" => DataType::Timestamp(TimeUnit::Millisecond, utc()),
        "timestamp[us]" => DataType::Timestamp(TimeUnit::Microsecond, utc()),
        "timestamp[ns]" => DataType::Timestamp(TimeUnit::Nanosecond, utc()),
        "timestamp_ntz[ms]" => DataType::Timestamp(TimeUnit::Millisecond, None),
        "timestamp_ntz[us]" => DataType::Timestamp(TimeUnit::Microsecond, None),
        "timestamp_ntz[ns]" => DataType::Timestamp(TimeUnit::Nanosecond, None),
        _ => return None,
    })
}

/// How a chunk's batches become the table's.
#[derive(Debug, Clone)]
pub enum Fit {
    /// Already in the table's latest version.
    Same,
    /// Put into `target` (the latest version) batch by batch.
    Conform(SchemaRef),
    /// A new version: `target`, recorded as `version` with `change`, batches put into it.
    Evolve { target: SchemaRef, version: i64, change: String },
}

impl Fit {
    /// The fit of a chunk whose batches have `schema` to the table's `latest` version.
    /// `widen`: whether the table's format lets a column's type widen (see
    /// `TableFormat::widens_columns`); if not, a wider number is put back into the column's type.
    pub fn new(latest: Option<&TableSchema>, schema: &Schema, widen: bool) -> Result<Fit, String> {
        let Some(latest) = latest else {
            return Ok(Fit::Evolve { target: Arc::new(schema.clone()), version: 1, change: "created".into() });
        };
        let v = latest.version;
        let mut target: Vec<Field> = Vec::with_capacity(latest.columns.len());
        let mut changes: Vec<String> = Vec::new();
        for r in &latest.columns {
            match schema.field_with_name(&r.name) {
                Ok(f) => {
                    let (hive, detail) = describe(f.data_type());
                    let nullable = r.nullable || f.is_nullable();
                    if !r.nullable && f.is_nullable() {
                        changes.push(format!("column `{}` may be null", r.name));
                    }
                    if detail == r.detail {
                        target.push(f.clone().with_nullable(nullable));
                    } else if widens(&r.detail, &detail) && (widen || !changes_type(&r.detail, &detail)) {
                        changes.push(format!("column `{}` {} -> {hive}", r.name, r.hive));
                        target.push(f.clone().with_nullable(nullable));
                    } else if let (true, Some(dt)) = (widens(&r.detail, &detail), arrow_of(&r.detail)) {
                        // Kept in the column's type: each value that fits, exactly.
                        target.push(Field::new(&r.name, dt, nullable));
                    } else if let (true, Some(dt)) = (widens(&detail, &r.detail), arrow_of(&r.detail)) {
                        target.push(Field::new(&r.name, dt, nullable));
                    } else {
                        return Err(format!(
                            "column {:?} is {} ({}) in table schema version {v} but {hive} ({detail}) in this input; \
                             only a new nullable column or a wider type can change a table's schema",
                            r.name, r.hive, r.detail
                        ));
                    }
                }
                Err(_) if r.nullable => match arrow_of(&r.detail) {
                    Some(dt) => target.push(Field::new(&r.name, dt, true)),
                    None => {
                        return Err(format!(
                            "this input has no column {:?} ({}), which table schema version {v} has; Ferry can fill \
                             only a column of a simple type with nulls",
                            r.name, r.hive
                        ));
                    }
                },
                Err(_) => {
                    return Err(format!(
                        "this input has no column {:?}, which is required in table schema version {v} ({})",
                        r.name, r.hive
                    ));
                }
            }
        }
        for f in schema.fields().iter().filter(|f| !latest.columns.iter().any(|r| &r.name == f.name())) {
            let (hive, _) = describe(f.data_type());
            if !f.is_nullable() {
                return Err(format!(
                    "this input has a new column {:?} ({hive}) that is required; a column added to a table must be nullable",
                    f.name()
                ));
            }
            changes.push(format!("added column `{}` {hive}", f.name()));
            target.push(f.as_ref().clone());
        }
        let target = Arc::new(Schema::new_with_metadata(Fields::from(target), schema.metadata().clone()));
        Ok(if !changes.is_empty() {
            Fit::Evolve { target, version: v + 1, change: changes.join("; ") }
        } else if target.fields() == schema.fields() {
            Fit::Same
        } else {
            Fit::Conform(target)
        })
    }

    /// `b` in the table's shape, with the rows left out whose value does not fit the column's
    /// type (only where a table that keeps its types got a wider input), as `(row, reason)`.
    pub fn apply(&self, b: RecordBatch) -> Result<(RecordBatch, Vec<(usize, String)>), TransformError> {
        let target = match self {
            Fit::Same => return Ok((b, Vec::new())),
            Fit::Conform(t) | Fit::Evolve { target: t, .. } => t,
        };
        if b.schema().fields() == target.fields() {
            return Ok((b, Vec::new()));
        }
        let mut bad: Vec<(usize, String)> = Vec::new();
        let mut cols: Vec<ArrayRef> = Vec::with_capacity(target.fields().len());
        for f in target.fields() {
            cols.push(match b.column_by_name(f.name()) {
                Some(c) => {
                    let (col, rows) = crate::exact::cast(c, f.data_type())?;
                    bad.extend(rows.into_iter().map(|(r, why)| {
                        (
                            r,
                            format!(
                                "column {:?}: {why}; the table keeps the column's type (a Delta table's type widens only with \
                                 Delta's typeWidening feature, which Ferry does not write)",
                                f.name()
                            ),
                        )
                    }));
                    col
                }
                None => new_null_array(f.data_type(), b.num_rows()),
            });
        }
        let out = RecordBatch::try_new(target.clone(), cols).map_err(|e| bad_input(format!("table schema: {e}")))?;
        if bad.is_empty() {
            return Ok((out, bad));
        }
        bad.sort_by_key(|(r, _)| *r);
        bad.dedup_by_key(|(r, _)| *r);
        let rows: Vec<usize> = bad.iter().map(|(r, _)| *r).collect();
        Ok((crate::exact::without_rows(&out, &rows)?, bad))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(fields: Vec<Field>, version: i64) -> TableSchema {
        TableSchema { version, columns: columns(&Schema::new(fields)), change: "created".into(), chunk_id: None, recorded_at: 0 }
    }

    #[test]
    fn compatible_changes_evolve_and_others_are_refused_by_name() {
        let ts = |u| DataType::Timestamp(u, Some("+00:00".into()));
        let v1 = recorded(
            vec![
                Field::new("id", DataType::Utf8, false),
                Field::new("n", DataType::Int32, true),
                Field::new("t", ts(TimeUnit::Millisecond), true),
            ],
            1,
        );
        let same =
            Schema::new(v1.columns.iter().map(|c| Field::new(&c.name, arrow_of(&c.detail).unwrap(), c.nullable)).collect::<Vec<_>>());
        assert!(matches!(Fit::new(Some(&v1), &same, true), Ok(Fit::Same)));
        assert!(matches!(Fit::new(None, &same, true), Ok(Fit::Evolve { version: 1, .. })));
        // Wider, plus a new nullable column: version 2, in the input's order of new columns.
        let wider = Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("extra", DataType::Utf8, true),
            Field::new("n", DataType::Int64, true),
            Field::new("t", ts(TimeUnit::Microsecond), true),
        ]);
        let Ok(Fit::Evolve { target, version, change }) = Fit::new(Some(&v1), &wider, true) else { panic!() };
        assert_eq!(version, 2);
        assert!(change.contains("`n` INT -> BIGINT") && change.contains("added column `extra` STRING"), "{change}");
        let names: Vec<&str> = target.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["id", "n", "t", "extra"], "new columns go last, as ADD COLUMNS puts them");
        // Narrower and missing a nullable column: put into the table's shape, no new version.
        let narrow = Schema::new(vec![Field::new("n", DataType::Int16, true), Field::new("id", DataType::Utf8, false)]);
        let Ok(Fit::Conform(t)) = Fit::new(Some(&v1), &narrow, true) else { panic!() };
        let b = RecordBatch::try_new(
            Arc::new(narrow.clone()),
            vec![Arc::new(arrow::array::Int16Array::from(vec![Some(7)])), Arc::new(arrow::array::StringArray::from(vec!["a"]))],
        )
        .unwrap();
        let (out, bad) = Fit::Conform(t.clone()).apply(b).unwrap();
        assert!(bad.is_empty());
        assert_eq!(out.schema(), t);
        assert_eq!(out.column(1).as_any().downcast_ref::<arrow::array::Int32Array>().unwrap().value(0), 7);
        assert_eq!(out.column(2).null_count(), 1);
        // Refused, each naming the column and both types.
        let other = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
        let e = Fit::new(Some(&v1), &other, true).unwrap_err();
        assert!(e.contains("\"id\"") && e.contains("STRING") && e.contains("BIGINT"), "{e}");
        let missing = Schema::new(vec![Field::new("n", DataType::Int32, true)]);
        assert!(Fit::new(Some(&v1), &missing, true).unwrap_err().contains("required"));
        let new_required = Schema::new(vec![Field::new("id", DataType::Utf8, false), Field::new("x", DataType::Int32, false)]);
        assert!(Fit::new(Some(&v1), &new_required, true).unwrap_err().contains("must be nullable"));
    }

    /// A table that keeps its column types (Delta): a wider number is no new version; each value
    /// that fits goes into the column's type, one that does not is a rejected row, and a
    /// timestamp's finer unit is still a new version (the column's type stays `timestamp`).
    #[test]
    fn a_table_that_keeps_types_takes_wider_numbers_that_fit_and_rejects_the_rest() {
        let v1 = recorded(vec![Field::new("id", DataType::Utf8, false), Field::new("n", DataType::Int32, true)], 1);
        let wider = Schema::new(vec![Field::new("id", DataType::Utf8, false), Field::new("n", DataType::Int64, true)]);
        let Ok(Fit::Conform(t)) = Fit::new(Some(&v1), &wider, false) else { panic!("no new version") };
        assert_eq!(t.field_with_name("n").unwrap().data_type(), &DataType::Int32);
        let b = RecordBatch::try_new(
            Arc::new(wider),
            vec![
                Arc::new(arrow::array::StringArray::from(vec!["a", "b", "c"])),
                Arc::new(arrow::array::Int64Array::from(vec![Some(7), Some(1 << 40), None])),
            ],
        )
        .unwrap();
        let (out, bad) = Fit::Conform(t.clone()).apply(b).unwrap();
        assert_eq!(out.num_rows(), 2, "the value past INT's range left out, the null kept");
        assert_eq!(out.column(1).as_any().downcast_ref::<arrow::array::Int32Array>().unwrap().value(0), 7);
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].0, 1);
        assert!(bad[0].1.contains("\"n\"") && bad[0].1.contains("1099511627776") && bad[0].1.contains("typeWidening"), "{}", bad[0].1);
        let ts = |u| DataType::Timestamp(u, Some("+00:00".into()));
        let v1 = recorded(vec![Field::new("t", ts(TimeUnit::Millisecond), true)], 1);
        let finer = Schema::new(vec![Field::new("t", ts(TimeUnit::Microsecond), true)]);
        assert!(matches!(Fit::new(Some(&v1), &finer, false), Ok(Fit::Evolve { version: 2, .. })));
    }

    #[test]
    fn nested_types_have_hive_names() {
        let item = Arc::new(Field::new("item", DataType::Utf8, true));
        let s = DataType::Struct(Fields::from(vec![Field::new("a", DataType::Int64, true), Field::new("b", DataType::List(item), true)]));
        assert_eq!(describe(&s), ("STRUCT<`a`:BIGINT,`b`:ARRAY<STRING>>".to_string(), "struct<a:bigint,b:list<string>>".to_string()));
        assert_eq!(describe(&DataType::FixedSizeBinary(16)).0, "BINARY");
        assert_eq!(describe(&DataType::Decimal128(10, 2)).0, "DECIMAL(10,2)");
    }
}
