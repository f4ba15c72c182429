//! A part's column statistics, read back from its Parquet footer once the file is written, in
//! the form a Delta `add` action carries in `stats` (`numRecords`, `minValues`, `maxValues`,
//! `nullCount`): with them a reader skips files without opening them.
//!
//! A reader trusts these bounds to drop files, so only exact ones are written. A column's min
//! and max are left out when a row group's are missing or inexact (long strings the writer
//! cut), and for types whose order is not the one readers compare by: floats (NaN), binary,
//! booleans, unsigned and nested types. Delta's timestamps hold milliseconds: the min is
//! rounded down and the max up, so both stay bounds. A value with no exact JSON text (a year
//! past 9999) leaves the column's bounds out. Decimals are written as their exact digits.

use std::fmt::Write as _;
use std::path::Path;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Int8Type, Int16Type, Int32Type, Int64Type, TimeUnit, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType,
};
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};

/// The `stats` JSON of the Parquet file at `path`.
pub fn of_file(path: &Path) -> Result<String, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = ParquetMetaDataReader::new().parse_and_finish(&file).map_err(|e| format!("{}: {e}", path.display()))?;
    of_metadata(&meta).map_err(|e| format!("{}: {e}", path.display()))
}

/// A value as exact JSON text, ordered as readers order the column's values.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Bound {
    Int(i128),
    Text(String),
}

/// How one column's values become bounds.
#[derive(Clone, Copy)]
enum Kind {
    Int,
    Date,
    Text,
    /// Units per millisecond (0 for seconds, which are whole milliseconds), and whether the
    /// column has a time zone (`...Z`) or not (`timestamp_ntz`).
    Timestamp {
        per_ms: i64,
        tz: bool,
    },
    Decimal {
        scale: i8,
    },
}

fn kind(t: &DataType) -> Option<Kind> {
    Some(match t {
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => Kind::Int,
        DataType::Date32 => Kind::Date,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Kind::Text,
        DataType::Timestamp(unit, tz) => Kind::Timestamp {
            per_ms: match unit {
                TimeUnit::Second => 0,
                TimeUnit::Millisecond => 1,
                TimeUnit::Microsecond => 1_000,
                TimeUnit::Nanosecond => 1_000_000,
            },
            tz: tz.is_some(),
        },
        DataType::Decimal128(_, scale) => Kind::Decimal { scale: *scale },
        _ => return None,
    })
}

/// Row `i` of a min or max array as a bound, before formatting (timestamps in their unit).
fn value(a: &ArrayRef, i: usize) -> Option<Bound> {
    if a.is_null(i) {
        return None;
    }
    Some(match a.data_type() {
        DataType::Int8 => Bound::Int(a.as_primitive::<Int8Type>().value(i).into()),
        DataType::Int16 => Bound::Int(a.as_primitive::<Int16Type>().value(i).into()),
        DataType::Int32 => Bound::Int(a.as_primitive::<Int32Type>().value(i).into()),
        DataType::Int64 => Bound::Int(a.as_primitive::<Int64Type>().value(i).into()),
        DataType::Date32 => Bound::Int(a.as_primitive::<Date32Type>().value(i).into()),
        DataType::Decimal128(..) => Bound::Int(a.as_primitive::<Decimal128Type>().value(i)),
        DataType::Timestamp(TimeUnit::Second, _) => Bound::Int(a.as_primitive::<TimestampSecondType>().value(i).into()),
        DataType::Timestamp(TimeUnit::Millisecond, _) => Bound::Int(a.as_primitive::<TimestampMillisecondType>().value(i).into()),
        DataType::Timestamp(TimeUnit::Microsecond, _) => Bound::Int(a.as_primitive::<TimestampMicrosecondType>().value(i).into()),
        DataType::Timestamp(TimeUnit::Nanosecond, _) => Bound::Int(a.as_primitive::<TimestampNanosecondType>().value(i).into()),
        DataType::Utf8 => Bound::Text(a.as_string::<i32>().value(i).to_string()),
        DataType::LargeUtf8 => Bound::Text(a.as_string::<i64>().value(i).to_string()),
        DataType::Utf8View => Bound::Text(a.as_string_view().value(i).to_string()),
        _ => return None,
    })
}

/// The JSON text of a bound (`up`: a max, rounded up where Delta holds less precision).
fn json(b: &Bound, k: Kind, up: bool) -> Option<String> {
    match (b, k) {
        (Bound::Int(v), Kind::Int) => Some(v.to_string()),
        (Bound::Int(v), Kind::Date) => {
            let d = chrono::DateTime::from_timestamp(i64::try_from(*v).ok()?.checked_mul(86_400)?, 0)?.date_naive();
            (1..=9999).contains(&chrono::Datelike::year(&d)).then(|| format!("\"{}\"", d.format("%Y-%m-%d")))
        }
        (Bound::Int(v), Kind::Timestamp { per_ms, tz }) => {
            let v = i64::try_from(*v).ok()?;
            let ms = match per_ms {
                0 => v.checked_mul(1_000)?,
                n if up => v.div_euclid(n) + i64::from(v.rem_euclid(n) != 0),
                n => v.div_euclid(n),
            };
            let t = chrono::DateTime::from_timestamp_millis(ms)?;
            if !(1..=9999).contains(&chrono::Datelike::year(&t)) {
                return None;
            }
            Some(format!("\"{}{}\"", t.format("%Y-%m-%dT%H:%M:%S%.3f"), if tz { "Z" } else { "" }))
        }
        (Bound::Int(v), Kind::Decimal { scale }) => Some(decimal_text(*v, scale)),
        (Bound::Text(s), Kind::Text) => serde_json::to_string(s).ok(),
        _ => None,
    }
}

/// The exact digits of an unscaled decimal: `decimal_text(-1234, 2)` is `-12.34`.
fn decimal_text(v: i128, scale: i8) -> String {
    let digits = v.unsigned_abs().to_string();
    let sign = if v < 0 { "-" } else { "" };
    if scale <= 0 {
        return format!("{sign}{digits}{}", "0".repeat(usize::from(scale.unsigned_abs())));
    }
    let scale = usize::from(scale.unsigned_abs());
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{sign}{int}.{frac}")
}

/// The `stats` JSON of a file from its footer.
pub fn of_metadata(meta: &ParquetMetaData) -> Result<String, String> {
    let file = meta.file_metadata();
    let schema = parquet::arrow::parquet_to_arrow_schema(file.schema_descr(), file.key_value_metadata()).map_err(|e| e.to_string())?;
    let groups = meta.row_groups();
    let (mut mins, mut maxes, mut nulls) = (String::new(), String::new(), String::new());
    for field in schema.fields() {
        let name = serde_json::to_string(field.name()).map_err(|e| e.to_string())?;
        let Ok(conv) = StatisticsConverter::try_new(field.name(), &schema, file.schema_descr()) else { continue };
        if conv.parquet_column_index().is_none() {
            continue;
        }
        // Null counts: every row group's, or none (a group without statistics). Ferry's
        // writers always count nulls, so statistics without a count mean none.
        let counts = conv.row_group_null_counts(groups.iter()).map_err(|e| e.to_string())?;
        let null_count = (counts.null_count() == 0).then(|| counts.values().iter().sum::<u64>());
        if let Some(n) = null_count {
            let _ = write!(nulls, "{}{name}:{n}", if nulls.is_empty() { "" } else { "," });
        }
        let Some(k) = kind(field.data_type()) else { continue };
        let bounds = (|| -> Option<(Bound, Bound)> {
            let (lo, hi) = (conv.row_group_mins(groups.iter()).ok()?, conv.row_group_maxes(groups.iter()).ok()?);
            let (lo_exact, hi_exact) =
                (conv.row_group_is_min_value_exact(groups.iter()).ok()?, conv.row_group_is_max_value_exact(groups.iter()).ok()?);
            let mut out: Option<(Bound, Bound)> = None;
            for (i, g) in groups.iter().enumerate() {
                // A group of nulls only has no bounds, and needs none.
                if counts.is_valid(i) && counts.value(i) == g.num_rows() as u64 {
                    continue;
                }
                if !(lo_exact.is_valid(i) && lo_exact.value(i) && hi_exact.is_valid(i) && hi_exact.value(i)) {
                    return None;
                }
                let (l, h) = (value(&lo, i)?, value(&hi, i)?);
                out = Some(match out {
                    None => (l, h),
                    Some((a, b)) => (a.min(l), b.max(h)),
                });
            }
            out
        })();
        if let Some((lo, hi)) = bounds
            && let (Some(lo), Some(hi)) = (json(&lo, k, false), json(&hi, k, true))
        {
            let _ = write!(mins, "{}{name}:{lo}", if mins.is_empty() { "" } else { "," });
            let _ = write!(maxes, "{}{name}:{hi}", if maxes.is_empty() { "" } else { "," });
        }
    }
    Ok(format!("{{\"numRecords\":{},\"minValues\":{{{mins}}},\"maxValues\":{{{maxes}}},\"nullCount\":{{{nulls}}}}}", file.num_rows()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Decimal128Array, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
    use arrow::datatypes::{Field, Schema};
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    use super::*;

    /// The stats text of a file of these batches (one row group each), and the same parsed.
    fn stats_of(batches: &[RecordBatch], props: WriterProperties) -> (String, serde_json::Value) {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("p.parquet");
        let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batches[0].schema(), Some(props)).unwrap();
        for b in batches {
            w.write(b).unwrap();
            w.flush().unwrap(); // one row group per batch
        }
        w.close().unwrap();
        let text = of_file(&path).unwrap();
        let parsed = serde_json::from_str(&text).unwrap();
        (text, parsed)
    }

    #[test]
    fn bounds_over_row_groups_exact_or_left_out() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("t", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), true),
            Field::new("d", DataType::Decimal128(38, 3), true),
            Field::new("f", DataType::Float64, true),
            Field::new("long", DataType::Utf8, true),
        ]));
        let long = "x".repeat(100);
        let b1 = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![Some(5), None, Some(-7)])),
                Arc::new(StringArray::from(vec![Some("b"), Some("é\"q"), None])),
                Arc::new(TimestampMicrosecondArray::from(vec![Some(1_500), Some(-2_500), None]).with_timezone("UTC")),
                Arc::new(Decimal128Array::from(vec![Some(i128::MAX / 7), Some(-5), None]).with_precision_and_scale(38, 3).unwrap()),
                Arc::new(Float64Array::from(vec![Some(1.0), Some(f64::NAN), None])),
                Arc::new(StringArray::from(vec![Some(long.as_str()), Some("a"), None])),
            ],
        )
        .unwrap();
        let b2 = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![Some(9_007_199_254_740_993), None])),
                Arc::new(StringArray::from(vec![Some("a"), None])),
                Arc::new(TimestampMicrosecondArray::from(vec![None, None]).with_timezone("UTC")),
                Arc::new(Decimal128Array::from(vec![None, Some(0)]).with_precision_and_scale(38, 3).unwrap()),
                Arc::new(Float64Array::from(vec![None, Some(2.0)])),
                Arc::new(StringArray::from(vec![Some("b"), None])),
            ],
        )
        .unwrap();
        let (text, s) = stats_of(&[b1, b2], WriterProperties::builder().set_statistics_truncate_length(Some(64)).build());
        assert_eq!(s["numRecords"], 5);
        assert_eq!(s["nullCount"], serde_json::json!({"n": 2, "s": 2, "t": 3, "d": 2, "f": 2, "long": 2}));
        // i64 past 2^53 and 38-digit decimals kept exactly (the parsed JSON would round them,
        // so the text is compared).
        assert!(text.contains("\"n\":-7") && text.contains("\"n\":9007199254740993"), "{text}");
        assert_eq!(s["minValues"]["s"], "a");
        assert_eq!(s["maxValues"]["s"], "é\"q");
        // -2.5 ms rounds down, 1.5 ms up; the group of nulls only adds nothing.
        assert_eq!(s["minValues"]["t"], "1969-12-31T23:59:59.997Z");
        assert_eq!(s["maxValues"]["t"], "1970-01-01T00:00:00.002Z");
        assert!(text.contains(&format!("\"d\":{}", decimal_text(i128::MAX / 7, 3))) && text.contains("\"d\":-0.005"), "{text}");
        // Floats and cut strings have no bounds a reader may trust.
        for gone in ["f", "long"] {
            assert!(s["minValues"].get(gone).is_none() && s["maxValues"].get(gone).is_none(), "{gone}: {s}");
        }
    }

    #[test]
    fn decimals_keep_every_digit() {
        assert_eq!(decimal_text(-1234, 2), "-12.34");
        assert_eq!(decimal_text(5, 3), "0.005");
        assert_eq!(decimal_text(-5, 3), "-0.005");
        assert_eq!(decimal_text(12, 0), "12");
        assert_eq!(decimal_text(12, -2), "1200");
        assert_eq!(decimal_text(i128::MIN + 1, 38).len(), "-1.".len() + 38);
    }
}
