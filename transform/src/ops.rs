//! The declarative transform from `[transform]`: rename, cast, derive, filter, select, applied
//! in that order to every batch, and the split of rows by Hive partition value.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, Float64Array, StringArray, UInt32Array};
use arrow::compute::kernels::cmp;
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use ferry_common::paths;
use ferry_runtime::config::TransformSection;

use crate::{TransformError, bad_input, misconfigured};
use ferry_formats::decode::arrow_type;

#[derive(Debug, Clone)]
enum Filter {
    IsNull(String, bool),
    Cmp { col: String, op: String, lit: Literal },
}

#[derive(Debug, Clone)]
enum Literal {
    Str(String),
    Num(f64),
}

/// The compiled `[transform]` section.
#[derive(Debug, Clone)]
pub struct Plan {
    rename: BTreeMap<String, String>,
    cast: BTreeMap<String, DataType>,
    derive: Vec<(String, String, String)>, // (new column, function, source column)
    filters: Vec<Filter>,
    select: Vec<String>,
    partition_by: Vec<String>,
}

fn config_err(key: &str, msg: String) -> TransformError {
    misconfigured(format!("transform.{key}: {msg}"))
}

impl Plan {
    pub fn new(t: &TransformSection, partition_by: &[String]) -> Result<Plan, TransformError> {
        let mut derive = Vec::new();
        for (name, expr) in &t.derive {
            let expr = expr.trim();
            let (func, arg) = match expr.split_once('(') {
                Some((f, rest)) => (f.trim().to_string(), rest.trim_end_matches(')').trim().to_string()),
                None => ("col".to_string(), expr.to_string()),
            };
            if !["date", "hour", "col"].contains(&func.as_str()) {
                return Err(config_err(&format!("derive.{name}"), format!("unknown function {func:?} (date, hour)")));
            }
            derive.push((name.clone(), func, arg));
        }
        let mut filters = Vec::new();
        for (i, f) in t.filter.iter().enumerate() {
            filters.push(parse_filter(f).ok_or_else(|| {
                config_err(
                    &format!("filter[{i}]"),
                    format!("cannot parse {f:?}; write e.g. `kind != \"debug\"`, `score > 0.5`, `score is not null`"),
                )
            })?);
        }
        Ok(Plan {
            rename: t.rename.clone(),
            cast: t.cast.iter().map(|(k, v)| (k.clone(), arrow_type(*v))).collect(),
            derive,
            filters,
            select: t.select.clone(),
            partition_by: partition_by.to_vec(),
        })
    }

    /// Applies the plan; returns the rows left out because a cast could not keep their value
    /// exactly, as `(row of the input batch, reason)`.
    pub fn apply(&self, batch: &RecordBatch) -> Result<(RecordBatch, Vec<(usize, String)>), TransformError> {
        let mut fields: Vec<Field> = Vec::new();
        let mut cols: Vec<ArrayRef> = Vec::new();
        let mut bad: Vec<(usize, String)> = Vec::new();
        for (f, c) in batch.schema().fields().iter().zip(batch.columns()) {
            let name = self.rename.get(f.name()).cloned().unwrap_or_else(|| f.name().clone());
            let (col, dt) = match self.cast.get(&name) {
                Some(dt) => {
                    let (col, rows) = crate::exact::cast(c, dt)?;
                    bad.extend(rows.into_iter().map(|(r, why)| (r, format!("transform.cast of {name}: {why}"))));
                    (col, dt.clone())
                }
                None => (c.clone(), f.data_type().clone()),
            };
            fields.push(Field::new(name, dt, true));
            cols.push(col);
        }
        bad.sort_by_key(|(r, _)| *r);
        // The input rows still here, for reporting later rejects by their input row.
        let mut kept: Vec<usize> = (0..batch.num_rows()).collect();
        if !bad.is_empty() {
            let rows: Vec<usize> = bad.iter().map(|(r, _)| *r).collect();
            let b = RecordBatch::try_new(Arc::new(Schema::new(fields.clone())), cols).map_err(TransformError::internal)?;
            cols = crate::exact::without_rows(&b, &rows)?.columns().to_vec();
            kept.retain(|r| rows.binary_search(r).is_err());
        }
        for (name, func, arg) in &self.derive {
            let i = fields
                .iter()
                .position(|f| f.name() == arg)
                .ok_or_else(|| config_err(&format!("derive.{name}"), format!("no column {arg:?}")))?;
            let src = &cols[i];
            let col: ArrayRef = match (func.as_str(), src.data_type()) {
                // Days and hours are floored, so an instant before 1970 lands in its own day
                // (arrow's casts truncate toward zero).
                ("date" | "hour", DataType::Timestamp(unit, _)) => floor_time(src, *unit, func == "date"),
                ("date", _) => arrow::compute::cast(src, &DataType::Date32),
                ("hour", _) => arrow::compute::kernels::temporal::date_part(src, arrow::compute::kernels::temporal::DatePart::Hour),
                _ => Ok(src.clone()),
            }
            .map_err(|e| bad_input(format!("derive {name} = {func}({arg}): {e}")))?;
            fields.push(Field::new(name, col.data_type().clone(), true));
            cols.push(col);
        }
        let schema = Arc::new(Schema::new(fields));
        let mut batch = RecordBatch::try_new(schema, cols).map_err(TransformError::internal)?;
        // A partition value that cannot be a directory name rejects its record: it would fail
        // the same way on every retry.
        let mut unfit: Vec<usize> = Vec::new();
        for p in &self.partition_by {
            let Ok(i) = batch.schema().index_of(p) else { continue };
            let Some(v) = batch.column(i).as_any().downcast_ref::<StringArray>() else { continue };
            for (row, &input_row) in kept.iter().enumerate().take(v.len()) {
                if v.is_null(row) {
                    continue;
                }
                let s = v.value(row);
                let why = if s.contains('\0') {
                    Some("contains a NUL character".to_string())
                } else if s.len() > 80 && paths::escape_partition_value(Some(s)).len() + p.len() + 1 > 255 {
                    Some(format!("is {} bytes; a partition directory name has at most 255", s.len()))
                } else {
                    None
                };
                if let Some(why) = why {
                    bad.push((input_row, format!("partition column {p:?}: the value {why}")));
                    unfit.push(row);
                }
            }
        }
        if !unfit.is_empty() {
            unfit.sort_unstable();
            batch = crate::exact::without_rows(&batch, &unfit)?;
            bad.sort_by_key(|(r, _)| *r);
        }
        if !self.filters.is_empty() {
            let mut mask: Option<BooleanArray> = None;
            for f in &self.filters {
                let m = eval(&batch, f)?;
                mask = Some(match mask {
                    Some(a) => arrow::compute::and_kleene(&a, &m).map_err(TransformError::internal)?,
                    None => m,
                });
            }
            // Rows whose filter is null (a comparison with a null) do not pass.
            let mask = arrow::compute::prep_null_mask_filter(&mask.expect("filters"));
            batch = arrow::compute::filter_record_batch(&batch, &mask).map_err(TransformError::internal)?;
        }
        if !self.select.is_empty() {
            let mut keep = self.select.clone();
            for p in &self.partition_by {
                if !keep.contains(p) {
                    keep.push(p.clone());
                }
            }
            let idx = keep
                .iter()
                .map(|c| batch.schema().index_of(c).map_err(|_| misconfigured(format!("transform.select: no column {c:?}"))))
                .collect::<Result<Vec<_>, _>>()?;
            batch = batch.project(&idx).map_err(TransformError::internal)?;
        }
        Ok((batch, bad))
    }

    /// Splits a batch by partition value: (Hive path like `dt=2026-11-30`, rows without the
    /// partition columns, which the path carries).
    pub fn partition(&self, batch: &RecordBatch) -> Result<Vec<(String, RecordBatch)>, TransformError> {
        if self.partition_by.is_empty() {
            return Ok(vec![(String::new(), batch.clone())]);
        }
        let schema = batch.schema();
        let mut keys: Vec<ArrayRef> = Vec::new();
        for p in &self.partition_by {
            let i = schema.index_of(p).map_err(|_| misconfigured(format!("table.partition_by: no column {p:?} (derive it?)")))?;
            keys.push(batch.column(i).clone());
        }
        // Group rows on the partition columns' raw values (a date is 4 bytes, not a formatted
        // string per row: a profile showed that formatting at ~2% of transform's CPU), then
        // format each group's path once. Most batches hold one or two values.
        let raw = keys.iter().map(RawKey::new).collect::<Result<Vec<_>, _>>()?;
        let mut index: BTreeMap<Vec<Option<&[u8]>>, usize> = BTreeMap::new();
        let mut groups: Vec<(usize, Vec<u32>)> = Vec::new(); // (first row, rows)
        let mut prev: Option<(Vec<Option<&[u8]>>, usize)> = None;
        let mut key: Vec<Option<&[u8]>> = Vec::with_capacity(keys.len());
        for row in 0..batch.num_rows() {
            key.clear();
            key.extend(raw.iter().map(|k| k.get(row)));
            let g = match &prev {
                Some((k, g)) if *k == key => *g,
                _ => {
                    let g = *index.entry(key.clone()).or_insert_with(|| {
                        groups.push((row, Vec::new()));
                        groups.len() - 1
                    });
                    prev = Some((key.clone(), g));
                    g
                }
            };
            groups[g].1.push(row as u32);
        }
        let mut paths = Vec::with_capacity(groups.len());
        for (first, rows) in groups {
            let mut parts = Vec::with_capacity(keys.len());
            for (p, k) in self.partition_by.iter().zip(&keys) {
                let v = arrow::compute::cast(&k.slice(first, 1), &DataType::Utf8).map_err(TransformError::internal)?;
                let v = v.as_any().downcast_ref::<StringArray>().expect("utf8");
                let v = paths::escape_partition_value((!v.is_null(0)).then(|| v.value(0)));
                parts.push(format!("{p}={v}"));
            }
            paths.push((parts.join("/"), rows));
        }
        // In path order, as before (the same rows always land in the same files). Values that
        // share a path (null and the empty string) are one group, rows in batch order.
        paths.sort_by(|a, b| a.0.cmp(&b.0));
        paths.dedup_by(|later, first| {
            if later.0 != first.0 {
                return false;
            }
            first.1.append(&mut later.1);
            first.1.sort_unstable();
            true
        });
        let data_cols: Vec<usize> = (0..schema.fields().len()).filter(|&i| !self.partition_by.contains(schema.field(i).name())).collect();
        let data = batch.project(&data_cols).map_err(TransformError::internal)?;
        let mut out = Vec::with_capacity(paths.len());
        for (path, rows) in paths {
            let part = if rows.len() == data.num_rows() {
                data.clone()
            } else {
                let idx = UInt32Array::from(rows);
                let cols = data
                    .columns()
                    .iter()
                    .map(|c| arrow::compute::take(c, &idx, None))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(TransformError::internal)?;
                RecordBatch::try_new(data.schema(), cols).map_err(TransformError::internal)?
            };
            out.push((path, part));
        }
        Ok(out)
    }
}

/// The UTC date (Date32) or hour of day (Int32) of each timestamp, floored.
fn floor_time(src: &ArrayRef, unit: arrow::datatypes::TimeUnit, date: bool) -> Result<ArrayRef, arrow::error::ArrowError> {
    use arrow::datatypes::TimeUnit;
    let per_second: i64 = match unit {
        TimeUnit::Second => 1,
        TimeUnit::Millisecond => 1_000,
        TimeUnit::Microsecond => 1_000_000,
        TimeUnit::Nanosecond => 1_000_000_000,
    };
    let v = arrow::compute::cast(src, &DataType::Int64)?;
    let v = v.as_any().downcast_ref::<arrow::array::Int64Array>().expect("int64");
    Ok(if date {
        let day = per_second * 86_400;
        Arc::new(v.unary::<_, arrow::datatypes::Date32Type>(|t| t.div_euclid(day) as i32))
    } else {
        let hour = per_second * 3_600;
        Arc::new(v.unary::<_, arrow::datatypes::Int32Type>(|t| t.div_euclid(hour).rem_euclid(24) as i32))
    })
}

/// A partition column's values as raw bytes, to group rows without formatting each value.
struct RawKey {
    data: arrow::array::ArrayData,
    /// Bytes per value; 0 for strings (offsets + values).
    width: usize,
}

impl RawKey {
    fn new(col: &ArrayRef) -> Result<RawKey, TransformError> {
        if let Some(width) = col.data_type().primitive_width() {
            return Ok(RawKey { data: col.to_data(), width });
        }
        // Strings as they are; anything else (booleans, ...) as its text.
        let s = if col.data_type() == &DataType::Utf8 {
            col.clone()
        } else {
            arrow::compute::cast(col, &DataType::Utf8).map_err(TransformError::internal)?
        };
        Ok(RawKey { data: s.to_data(), width: 0 })
    }

    #[inline]
    fn get(&self, row: usize) -> Option<&[u8]> {
        if self.data.is_null(row) {
            return None;
        }
        Some(if self.width > 0 {
            &self.data.buffers()[0].as_slice()[(self.data.offset() + row) * self.width..][..self.width]
        } else {
            let o = self.data.buffer::<i32>(0);
            &self.data.buffers()[1].as_slice()[o[row] as usize..o[row + 1] as usize]
        })
    }
}

fn parse_filter(f: &str) -> Option<Filter> {
    let f = f.trim();
    let lower = f.to_ascii_lowercase();
    if let Some(col) = lower.strip_suffix(" is not null") {
        return Some(Filter::IsNull(f[..col.len()].trim().to_string(), false));
    }
    if let Some(col) = lower.strip_suffix(" is null") {
        return Some(Filter::IsNull(f[..col.len()].trim().to_string(), true));
    }
    for op in ["==", "!=", ">=", "<=", ">", "<", "="] {
        if let Some((col, lit)) = f.split_once(op) {
            let lit = lit.trim();
            let lit = if let Some(s) = lit.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
                Literal::Str(s.to_string())
            } else {
                Literal::Num(lit.parse().ok()?)
            };
            let op = if op == "=" { "==" } else { op };
            return Some(Filter::Cmp { col: col.trim().to_string(), op: op.to_string(), lit });
        }
    }
    None
}

fn eval(batch: &RecordBatch, f: &Filter) -> Result<BooleanArray, TransformError> {
    let col = |name: &str| {
        batch
            .schema()
            .index_of(name)
            .map(|i| batch.column(i).clone())
            .map_err(|_| misconfigured(format!("transform.filter: no column {name:?}")))
    };
    match f {
        Filter::IsNull(c, true) => arrow::compute::is_null(&col(c)?).map_err(TransformError::internal),
        Filter::IsNull(c, false) => arrow::compute::is_not_null(&col(c)?).map_err(TransformError::internal),
        Filter::Cmp { col: c, op, lit } => {
            let a = col(c)?;
            let (a, b): (ArrayRef, Box<dyn arrow::array::Datum>) = match lit {
                Literal::Str(s) => (
                    arrow::compute::cast(&a, &DataType::Utf8).map_err(TransformError::internal)?,
                    Box::new(StringArray::new_scalar(s.as_str())),
                ),
                Literal::Num(n) => (
                    arrow::compute::cast(&a, &DataType::Float64).map_err(TransformError::internal)?,
                    Box::new(Float64Array::new_scalar(*n)),
                ),
            };
            let r = match op.as_str() {
                "==" => cmp::eq(&a, b.as_ref()),
                "!=" => cmp::neq(&a, b.as_ref()),
                ">" => cmp::gt(&a, b.as_ref()),
                ">=" => cmp::gt_eq(&a, b.as_ref()),
                "<" => cmp::lt(&a, b.as_ref()),
                _ => cmp::lt_eq(&a, b.as_ref()),
            };
            r.map_err(TransformError::internal)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int64Array, TimestampMillisecondArray};

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("kind", DataType::Utf8, true),
            Field::new("user_id", DataType::Int64, true),
            Field::new("score", DataType::Float64, true),
            Field::new("ts", DataType::Timestamp(arrow::datatypes::TimeUnit::Millisecond, Some("+00:00".into())), true),
        ]));
        let day = 86_400_000;
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec!["click", "debug", "view", "click"])),
                Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
                Arc::new(Float64Array::from(vec![Some(0.9), Some(0.1), None, Some(0.7)])),
                Arc::new(TimestampMillisecondArray::from(vec![0, 1, day + 5, day + 3_600_000 * 2]).with_timezone("+00:00")),
            ],
        )
        .unwrap()
    }

    #[test]
    fn rename_cast_derive_filter_select_then_partition() {
        let mut t = TransformSection::default();
        t.rename.insert("user_id".into(), "uid".into());
        t.cast.insert("uid".into(), ferry_common::config::ColumnType::String);
        t.derive.insert("dt".into(), "date(ts)".into());
        t.derive.insert("hr".into(), "hour(ts)".into());
        t.filter = vec!["kind != \"debug\"".into(), "score is not null".into(), "score > 0.5".into()];
        t.select = vec!["uid".into(), "kind".into(), "hr".into()];
        let plan = Plan::new(&t, &["dt".to_string()]).unwrap();
        let (out, _) = plan.apply(&batch()).unwrap();
        assert_eq!(out.num_rows(), 2, "debug, null score and low score rows are filtered out");
        let names: Vec<_> = out.schema().fields().iter().map(|f| f.name().clone()).collect();
        assert_eq!(names, ["uid", "kind", "hr", "dt"], "select keeps partition columns last");
        assert_eq!(out.column(0).data_type(), &DataType::Utf8, "cast to string");
        let hr = out.column(2).as_any().downcast_ref::<arrow::array::Int32Array>().unwrap();
        assert_eq!(hr.values().to_vec(), vec![0, 2]);
        let parts = plan.partition(&out).unwrap();
        let paths: Vec<_> = parts.iter().map(|(p, b)| (p.as_str(), b.num_rows(), b.num_columns())).collect();
        assert_eq!(paths, [("dt=1970-01-01", 1, 3), ("dt=1970-01-02", 1, 3)], "partition column moves to the path");
    }

    #[test]
    fn bad_transform_config_is_named() {
        let t = TransformSection { filter: vec!["score >>> banana".into()], ..Default::default() };
        let e = Plan::new(&t, &[]).unwrap_err().to_string();
        assert!(e.contains("transform.filter[0]"), "{e}");
        let mut t = TransformSection::default();
        t.derive.insert("dt".into(), "month(ts)".into());
        let e = Plan::new(&t, &[]).unwrap_err().to_string();
        assert!(e.contains("transform.derive.dt") && e.contains("month"), "{e}");
    }

    #[test]
    fn partition_values_are_escaped_and_unfit_ones_reject_their_record() {
        let vals: Vec<Option<String>> = vec![
            Some("a/b=c".into()),
            Some(String::new()),
            None,
            Some("__HIVE_DEFAULT_PARTITION__".into()),
            Some("nul\0here".into()),
            Some("x".repeat(300)),
        ];
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, true), Field::new("v", DataType::Int64, false)]));
        let batch =
            RecordBatch::try_new(schema, vec![Arc::new(StringArray::from(vals)), Arc::new(Int64Array::from(vec![0, 1, 2, 3, 4, 5]))])
                .unwrap();
        let plan = Plan::new(&TransformSection::default(), &["k".to_string()]).unwrap();
        let (out, bad) = plan.apply(&batch).unwrap();
        assert_eq!(bad.iter().map(|(r, _)| *r).collect::<Vec<_>>(), vec![4, 5], "{bad:?}");
        assert!(bad[0].1.contains("NUL") && bad[1].1.contains("255"), "{bad:?}");
        let paths: Vec<String> = plan.partition(&out).unwrap().into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            paths,
            ["k=%5F_HIVE_DEFAULT_PARTITION__", "k=__HIVE_DEFAULT_PARTITION__", "k=a%2Fb%3Dc"],
            "empty and null share the default"
        );
    }
}
