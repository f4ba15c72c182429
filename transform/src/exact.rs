//! Casts that keep every value exactly or say which rows they could not.
//!
//! Arrow's casts turn a value that does not fit into a null (`safe`) or fail the whole array,
//! and some lose information without either: 1.9 to an integer is 1, microseconds to
//! milliseconds drop digits, a double to a float rounds. Here a row survives only if casting
//! its value back gives the value it had; every other row is reported, to be rejected with
//! its reason, and the rest of the batch goes on.

use arrow::array::{Array, ArrayRef, BooleanArray};
use arrow::compute::CastOptions;
use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};

use crate::TransformError;

/// `a` cast to `to`, and the rows whose value did not survive exactly (as `(row, reason)`).
pub fn cast(a: &ArrayRef, to: &DataType) -> Result<(ArrayRef, Vec<(usize, String)>), TransformError> {
    if a.data_type() == to {
        return Ok((a.clone(), Vec::new()));
    }
    let opts = CastOptions { safe: true, ..Default::default() };
    // A value of a kind the column cannot hold at all (an array, map, record or union into a
    // flat column, or the other way round) is each record's own bad value, not the chunk's.
    let out = (a.data_type().is_nested() == to.is_nested())
        .then(|| arrow::compute::cast_with_options(a, to, &opts).ok())
        .flatten()
        .and_then(|out| arrow::compute::cast_with_options(&out, a.data_type(), &opts).ok().map(|back| (out, back)));
    let Some((out, back)) = out else {
        let kind = format!("{}", a.data_type());
        let kind = kind.split('(').next().unwrap_or_default();
        let why = format!("a {kind} value ({}) cannot be kept in a {to} column", a.data_type());
        let bad = (0..a.len()).filter(|&r| a.is_valid(r)).map(|r| (r, why.clone())).collect();
        return Ok((arrow::array::new_null_array(to, a.len()), bad));
    };
    // Rows where the value came back different (or not at all): `distinct` treats two nulls
    // as equal, so a null input is fine.
    let changed: BooleanArray = arrow::compute::kernels::cmp::distinct(&back, a).map_err(TransformError::internal)?;
    let mut bad = Vec::new();
    if changed.true_count() > 0 {
        let fmt = ArrayFormatter::try_new(a.as_ref(), &FormatOptions::default()).map_err(TransformError::internal)?;
        for row in (0..a.len()).filter(|&r| changed.value(r)) {
            let mut v = fmt.value(row).to_string();
            if v.len() > 40 {
                v.truncate(v.floor_char_boundary(40));
                v.push_str("...");
            }
            bad.push((row, format!("the value {v} ({}) does not fit {to} exactly", a.data_type())));
        }
    }
    Ok((out, bad))
}

/// `batch` without the rows in `drop` (sorted, possibly repeated).
pub fn without_rows(batch: &RecordBatch, drop: &[usize]) -> Result<RecordBatch, TransformError> {
    if drop.is_empty() {
        return Ok(batch.clone());
    }
    let mut keep = vec![true; batch.num_rows()];
    for &r in drop {
        keep[r] = false;
    }
    arrow::compute::filter_record_batch(batch, &BooleanArray::from(keep)).map_err(TransformError::internal)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Float64Array, Int64Array, StringArray, TimestampMicrosecondArray};
    use arrow::datatypes::TimeUnit;

    use super::*;

    fn bad_rows(a: ArrayRef, to: DataType) -> Vec<usize> {
        cast(&a, &to).unwrap().1.into_iter().map(|(r, _)| r).collect()
    }

    #[test]
    fn a_value_that_does_not_survive_is_reported_never_changed() {
        let longs: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), Some(3_000_000_000), None, Some(-5)]));
        assert_eq!(bad_rows(longs, DataType::Int32), vec![1], "3e9 does not wrap into an int");
        let doubles: ArrayRef = Arc::new(Float64Array::from(vec![1.0, 1.9, -2.0]));
        assert_eq!(bad_rows(doubles.clone(), DataType::Int64), vec![1], "1.9 is not made 1");
        assert_eq!(bad_rows(doubles, DataType::Float32), vec![1], "1.9 has no exact float");
        let text: ArrayRef = Arc::new(StringArray::from(vec!["12", "abc", "18446744073709551615"]));
        assert_eq!(bad_rows(text, DataType::Int64), vec![1, 2], "not a number, out of range: not a null");
        let list: ArrayRef = Arc::new(arrow::array::ListArray::from_iter_primitive::<arrow::datatypes::Int64Type, _, _>(vec![
            Some(vec![Some(1), Some(2)]),
            None,
            Some(vec![]),
        ]));
        let (out, bad) = cast(&list, &DataType::Utf8).unwrap();
        assert_eq!(out.null_count(), 3);
        assert_eq!(bad.iter().map(|(r, _)| *r).collect::<Vec<_>>(), vec![0, 2], "each list is its record's bad value; a null is fine");
        assert!(bad[0].1.contains("a List value") && bad[0].1.contains("Utf8"), "{}", bad[0].1);
        let us: ArrayRef = Arc::new(TimestampMicrosecondArray::from(vec![1_000, 1_234_567, -1_500]).with_timezone("+00:00"));
        assert_eq!(
            bad_rows(us, DataType::Timestamp(TimeUnit::Millisecond, Some("+00:00".into()))),
            vec![1, 2],
            "microseconds are not cut to milliseconds"
        );
    }
}
