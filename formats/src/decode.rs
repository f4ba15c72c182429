//! Decoding a staged chunk into Arrow record batches in the table's column types: what every
//! format's decoder shares ([`Decode`], the one way transform calls them, and the record
//! builder JSON lines and CSV fill), built with the `decode` feature only, so that extract and
//! copy do not link Arrow.
//!
//! Avro goes through [`crate::avro::decode`] straight into Arrow. JSON lines and CSV are parsed
//! record by record; a record that does not fit the table (bad JSON, a wrong column count, a
//! value of the wrong type, a missing required field) is set aside as a reject with its
//! position and reason, and the rest of the chunk flows on.

use std::borrow::Cow;
use std::io::BufRead;
use std::sync::Arc;

use crate::spec::{ColumnSpec, ColumnType, CsvOptions, EpochUnit, Format};
use arrow::array::{ArrayRef, BooleanBuilder, Date32Builder, Float32Builder, Float64Builder, Int32Builder, Int64Builder, StringBuilder};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;

/// How one chunk is decoded.
#[derive(Debug, Clone, Copy)]
pub struct Decoding<'a> {
    /// The chunk, as messages name it.
    pub path: &'a str,
    /// The table's columns: JSON lines and CSV are decoded into them; Avro brings its own.
    pub columns: &'a [ColumnSpec],
    pub names: Names,
    pub csv: &'a CsvOptions,
    /// The chunk's first record in its file (0-based): a line for JSON lines, a data record
    /// for CSV.
    pub first_record: i64,
    pub batch_size: usize,
    /// More bad records than this fail the chunk.
    pub max_bad: u64,
    /// The most bytes one record (an Avro block) may take, compressed or decompressed.
    pub max_record_size: usize,
    /// The chunk's size as the ledger recorded it (at most `extract.chunk_size`, or one
    /// record): room to reserve for a decoder that holds the chunk whole.
    pub size_hint: usize,
}

/// What a decode set aside and has to say, beside the batches it gave the sink.
#[derive(Debug, Default)]
pub struct Decoded {
    pub rejects: Vec<Reject>,
    /// Said once per chunk (fields that match no column, columns the input lacks).
    pub notes: Vec<String>,
}

/// A record left out, where it is (the chunk's own words: "line 7", "record 3") and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    pub position: String,
    pub reason: String,
}

/// Why a decode ended early.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The chunk is not what its format says, or does not fit the table: no retry helps.
    #[error("{0}")]
    BadInput(String),
    /// The chunk could not be read (its path, and why).
    #[error("reading {0}: {1}")]
    Io(String, #[source] std::io::Error),
    /// A bug in Ferry: Arrow refused what the decoder built.
    #[error("internal: {0}")]
    Internal(String),
    /// The sink said [`Stopped`]; it knows why.
    #[error("the receiver of the batches stopped the decode")]
    Stopped,
}

impl Error {
    pub(crate) fn internal(e: impl std::fmt::Display) -> Error {
        Error::Internal(e.to_string())
    }

    pub(crate) fn io(path: impl std::fmt::Display, source: std::io::Error) -> Error {
        Error::Io(path.to_string(), source)
    }
}

/// A sink's answer that ends the decode ([`Error::Stopped`]); the sink keeps its own reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped;

/// Where decoded batches go, one at a time (a chunk is never whole in memory as Arrow), each
/// with the rows that must be left out and why (an Avro string that is not UTF-8). Those rows
/// are still in the batch, their bad value a null, so a row's number stays its number in the
/// chunk; the receiver leaves them out.
pub type Sink<'a> = dyn FnMut(RecordBatch, Vec<(usize, String)>) -> Result<(), Stopped> + 'a;

/// A source format's decoder: the one call transform makes, whatever the format.
pub trait Decode: Sync {
    /// Whether a chunk brings its own schema (Avro); the others are decoded into the table's
    /// declared columns, which must then be there.
    fn self_describing(&self) -> bool;

    /// Decodes the chunk read from `input` into batches for `sink`, reading `input` to its end
    /// when it succeeds (a hashing reader sees every byte).
    fn decode(&self, input: &mut dyn BufRead, how: &Decoding<'_>, sink: &mut Sink<'_>) -> Result<Decoded, Error>;
}

/// The decoder of `format`.
pub fn decoder(format: Format) -> &'static dyn Decode {
    match format {
        Format::Avro => &crate::avro::Avro,
        Format::Jsonl => &crate::jsonl::Jsonl,
        Format::Csv => &crate::csv::Csv,
    }
}

/// The Arrow type of a table column type. Timestamps are UTC, written as the offset "+00:00"
/// (arrow's default build has no time zone database).
pub fn arrow_type(ty: ColumnType) -> DataType {
    let ts = |unit| DataType::Timestamp(unit, Some("+00:00".into()));
    match ty {
        ColumnType::String => DataType::Utf8,
        ColumnType::Long => DataType::Int64,
        ColumnType::Int => DataType::Int32,
        ColumnType::Double => DataType::Float64,
        ColumnType::Float => DataType::Float32,
        ColumnType::Boolean => DataType::Boolean,
        ColumnType::TimestampMs => ts(TimeUnit::Millisecond),
        ColumnType::Timestamp | ColumnType::TimestampUs => ts(TimeUnit::Microsecond),
        ColumnType::TimestampNs => ts(TimeUnit::Nanosecond),
        ColumnType::Date => DataType::Date32,
    }
}

pub fn table_schema(cols: &[ColumnSpec]) -> SchemaRef {
    Arc::new(Schema::new(cols.iter().map(|c| Field::new(&c.name, arrow_type(c.ty), c.nullable)).collect::<Vec<_>>()))
}

/// A value as the input wrote it, before it is checked against its column.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Cell<'a> {
    Null,
    /// Text (a JSON string, a CSV field).
    Str(Cow<'a, str>),
    /// A JSON number, as written: kept as text so that no digit is lost on the way.
    Num(&'a str),
    Bool(bool),
    /// A JSON object or array, as written.
    Json(&'a str),
}

impl Cell<'_> {
    /// The text of a number or a string cell ("" for the others).
    fn text(&self) -> &str {
        match self {
            Cell::Num(n) => n,
            Cell::Str(s) => s,
            _ => "",
        }
    }

    fn describe(&self) -> String {
        let cut = |s: &str| if s.len() > 40 { format!("{:?}...", &s[..s.floor_char_boundary(40)]) } else { format!("{s:?}") };
        match self {
            Cell::Null => "null".into(),
            Cell::Str(s) => format!("the text {}", cut(s)),
            Cell::Num(n) => format!("the number {}", cut(n)),
            Cell::Bool(b) => format!("{b}"),
            Cell::Json(j) => format!("the JSON value {}", cut(j)),
        }
    }
}

/// A value that fits its column exactly.
enum Val {
    Null,
    Str(String),
    I64(i64),
    F64(f64),
    F32(f32),
    Bool(bool),
}

/// A column being built, with what it takes to convert values into it exactly.
enum Col {
    Str(StringBuilder),
    I64(Int64Builder),
    I32(Int32Builder),
    F64(Float64Builder),
    F32(Float32Builder),
    Bool(BooleanBuilder),
    /// Timestamps as i64 in the column's unit (`per_second` of them per second).
    Ts {
        b: Int64Builder,
        dt: DataType,
        per_second: i64,
        epoch: Option<EpochUnit>,
    },
    Date(Date32Builder),
}

fn int(text: &str) -> Result<i64, String> {
    let t = text.trim();
    t.parse::<i64>().map_err(|e| match e.kind() {
        std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => "is out of the range of a long".to_string(),
        _ if t.parse::<f64>().is_ok() => "is not a whole number".to_string(),
        _ => "is not a number".to_string(),
    })
}

/// A float of either width from its text, rejecting an overflow to infinity (the text
/// `inf` itself is kept). The error ends in "a" for the caller to name the type.
fn float<F: std::str::FromStr + Copy + Into<f64>>(text: &str) -> Result<F, &'static str> {
    let v: F = text.trim().parse().map_err(|_| "is not a number, expected a")?;
    if v.into().is_infinite() && !text.to_ascii_lowercase().contains("inf") {
        return Err("is out of the range of a");
    }
    Ok(v)
}

impl Col {
    fn new(spec: &ColumnSpec) -> Col {
        match spec.ty {
            ColumnType::Long => Col::I64(Int64Builder::new()),
            ColumnType::Int => Col::I32(Int32Builder::new()),
            ColumnType::Double => Col::F64(Float64Builder::new()),
            ColumnType::Float => Col::F32(Float32Builder::new()),
            ColumnType::Boolean => Col::Bool(BooleanBuilder::new()),
            ColumnType::Date => Col::Date(Date32Builder::new()),
            ColumnType::String => Col::Str(StringBuilder::new()),
            ty @ (ColumnType::Timestamp | ColumnType::TimestampMs | ColumnType::TimestampUs | ColumnType::TimestampNs) => {
                Col::Ts { b: Int64Builder::new(), dt: arrow_type(ty), per_second: ty.per_second().unwrap_or(1_000_000), epoch: spec.epoch }
            }
        }
    }

    /// Converts a cell to this column's type exactly, or says why it cannot: a value is never
    /// rounded, wrapped, truncated or turned into a null.
    fn convert(&self, c: Cell<'_>) -> Result<Val, String> {
        let no = |what: &str, c: &Cell| Err(format!("expected {what}, got {}", c.describe()));
        let why = |c: &Cell, reason: String| format!("{} {reason}", c.describe());
        Ok(match (self, c) {
            (_, Cell::Null) => Val::Null,
            (Col::Str(_), Cell::Str(s)) => Val::Str(s.into_owned()),
            (Col::Str(_), Cell::Num(n) | Cell::Json(n)) => Val::Str(n.to_string()),
            (Col::Str(_), Cell::Bool(v)) => Val::Str(v.to_string()),
            (Col::I64(_), c @ (Cell::Num(_) | Cell::Str(_))) => Val::I64(int(c.text()).map_err(|r| why(&c, r))?),
            (Col::I32(_), c @ (Cell::Num(_) | Cell::Str(_))) => {
                let v = int(c.text()).map_err(|r| why(&c, r.replace("a long", "an int")))?;
                Val::I64(i32::try_from(v).map_err(|_| why(&c, "is out of the range of an int (32 bits)".into()))? as i64)
            }
            (Col::F64(_), c @ (Cell::Num(_) | Cell::Str(_))) => Val::F64(float(c.text()).map_err(|r| why(&c, format!("{r} double")))?),
            (Col::F32(_), c @ (Cell::Num(_) | Cell::Str(_))) => Val::F32(float(c.text()).map_err(|r| why(&c, format!("{r} float")))?),
            (Col::Bool(_), Cell::Bool(b)) => Val::Bool(b),
            (Col::Bool(_), Cell::Str(s)) => match s.trim().to_ascii_lowercase().as_str() {
                "true" => Val::Bool(true),
                "false" => Val::Bool(false),
                _ => return no("true or false", &Cell::Str(s)),
            },
            (Col::Ts { per_second, .. }, c @ Cell::Str(_)) if !looks_numeric(&c) => {
                let Cell::Str(s) = &c else { unreachable!() };
                let t =
                    chrono::DateTime::parse_from_rfc3339(s.trim()).map_err(|e| why(&c, format!("is not an RFC 3339 timestamp ({e})")))?;
                let step = 1_000_000_000 / per_second;
                let nanos = t.timestamp_subsec_nanos() as i64;
                if nanos % step != 0 {
                    return Err(why(&c, format!("has more precision than the column's {}", unit_name(*per_second))));
                }
                let v = t.timestamp().checked_mul(*per_second).and_then(|v| v.checked_add(nanos / step));
                Val::I64(v.ok_or_else(|| why(&c, format!("is out of the range of a timestamp in {}", unit_name(*per_second))))?)
            }
            (Col::Ts { per_second, epoch, .. }, c @ (Cell::Num(_) | Cell::Str(_))) => {
                let Some(unit) = epoch else {
                    return Err(why(&c, "is a number; set the column's `epoch` (s, ms, us or ns) to say what it counts".into()));
                };
                let v = int(c.text()).map_err(|r| why(&c, r))?;
                let from = unit.per_second();
                let out = if from >= *per_second {
                    let d = from / per_second;
                    if v % d != 0 {
                        return Err(why(&c, format!("has more precision than the column's {}", unit_name(*per_second))));
                    }
                    Some(v / d)
                } else {
                    v.checked_mul(per_second / from)
                };
                Val::I64(out.ok_or_else(|| why(&c, format!("is out of the range of a timestamp in {}", unit_name(*per_second))))?)
            }
            (Col::Date(_), Cell::Str(s)) => match chrono::NaiveDate::parse_from_str(s.trim(), "%Y-%m-%d") {
                Ok(d) => Val::I64((d - chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("epoch")).num_days()),
                Err(_) => return no("a date YYYY-MM-DD", &Cell::Str(s)),
            },
            (Col::I64(_) | Col::I32(_), c) => return no("a whole number", &c),
            (Col::F64(_) | Col::F32(_), c) => return no("a number", &c),
            (Col::Bool(_), c) => return no("true or false", &c),
            (Col::Ts { .. }, c) => return no("an RFC 3339 timestamp", &c),
            (Col::Date(_), c) => return no("a date YYYY-MM-DD", &c),
        })
    }

    fn push(&mut self, v: Val) {
        match (self, v) {
            (Col::Str(b), Val::Str(s)) => b.append_value(s),
            (Col::Str(b), _) => b.append_null(),
            (Col::I64(b), Val::I64(v)) => b.append_value(v),
            (Col::I64(b), _) => b.append_null(),
            (Col::I32(b), Val::I64(v)) => b.append_value(v as i32), // range checked in convert
            (Col::I32(b), _) => b.append_null(),
            (Col::F64(b), Val::F64(v)) => b.append_value(v),
            (Col::F64(b), _) => b.append_null(),
            (Col::F32(b), Val::F32(v)) => b.append_value(v),
            (Col::F32(b), _) => b.append_null(),
            (Col::Bool(b), Val::Bool(v)) => b.append_value(v),
            (Col::Bool(b), _) => b.append_null(),
            (Col::Ts { b, .. }, Val::I64(v)) => b.append_value(v),
            (Col::Ts { b, .. }, _) => b.append_null(),
            (Col::Date(b), Val::I64(v)) => match i32::try_from(v) {
                Ok(d) => b.append_value(d),
                Err(_) => b.append_null(), // unreachable: chrono dates fit
            },
            (Col::Date(b), _) => b.append_null(),
        }
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Col::Str(b) => Arc::new(b.finish()),
            Col::I64(b) => Arc::new(b.finish()),
            Col::I32(b) => Arc::new(b.finish()),
            Col::F64(b) => Arc::new(b.finish()),
            Col::F32(b) => Arc::new(b.finish()),
            Col::Bool(b) => Arc::new(b.finish()),
            Col::Ts { b, dt, .. } => {
                let data = arrow::array::Array::into_data(b.finish()).into_builder().data_type(dt.clone());
                arrow::array::make_array(data.build().expect("i64 values are a valid timestamp array"))
            }
            Col::Date(b) => Arc::new(b.finish()),
        }
    }
}

/// A CSV field or JSON string in a timestamp column that is an epoch number, not a date.
fn looks_numeric(c: &Cell<'_>) -> bool {
    matches!(c, Cell::Str(s) if { let t = s.trim(); !t.is_empty() && t.trim_start_matches('-').bytes().all(|b| b.is_ascii_digit()) })
}

fn unit_name(per_second: i64) -> &'static str {
    match per_second {
        1_000 => "milliseconds",
        1_000_000 => "microseconds",
        _ => "nanoseconds",
    }
}

/// Builds batches of the table schema from parsed records, collecting rejects.
pub(crate) struct Rows<'a> {
    schema: SchemaRef,
    cols: Vec<Col>,
    len: usize,
    batch_size: usize,
    sink: &'a mut Sink<'a>,
    rejects: Vec<Reject>,
    max_bad: u64,
}

impl<'a> Rows<'a> {
    pub(crate) fn new(specs: &[ColumnSpec], batch_size: usize, max_bad: u64, sink: &'a mut Sink<'a>) -> Rows<'a> {
        let cols = specs.iter().map(Col::new).collect();
        Rows { schema: table_schema(specs), cols, len: 0, batch_size, sink, rejects: vec![], max_bad }
    }

    /// Adds a record whose cells are in schema order, or rejects it whole.
    pub(crate) fn add(&mut self, cells: Vec<Cell<'_>>, position: impl Fn() -> String) -> Result<(), Error> {
        let mut checked = Vec::with_capacity(cells.len());
        for ((cell, col), field) in cells.into_iter().zip(&self.cols).zip(self.schema.fields()) {
            match col.convert(cell) {
                Ok(Val::Null) if !field.is_nullable() => {
                    return self.reject(position(), format!("column {:?} is required but missing or null", field.name()));
                }
                Ok(c) => checked.push(c),
                Err(why) => {
                    return self.reject(position(), format!("column {:?}: {why}", field.name()));
                }
            }
        }
        for (col, c) in self.cols.iter_mut().zip(checked) {
            col.push(c);
        }
        self.len += 1;
        if self.len >= self.batch_size {
            self.flush()?;
        }
        Ok(())
    }

    pub(crate) fn reject(&mut self, position: String, reason: String) -> Result<(), Error> {
        self.rejects.push(Reject { position, reason });
        if self.rejects.len() as u64 > self.max_bad {
            let first = &self.rejects[0];
            return Err(Error::BadInput(format!(
                "more than max_bad_records = {} bad records; first at {}: {}",
                self.max_bad, first.position, first.reason
            )));
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), Error> {
        if self.len == 0 {
            return Ok(());
        }
        let arrays = self.cols.iter_mut().map(|c| c.finish()).collect();
        let batch = RecordBatch::try_new(self.schema.clone(), arrays).map_err(Error::internal)?;
        self.len = 0;
        (self.sink)(batch, Vec::new()).map_err(|Stopped| Error::Stopped)
    }

    pub(crate) fn finish(mut self) -> Result<Vec<Reject>, Error> {
        self.flush()?;
        Ok(self.rejects)
    }
}

/// One JSON value as written: a string unescaped, anything else kept as its text.
pub(crate) fn json_cell(v: Option<&serde_json::value::RawValue>) -> Result<Cell<'_>, String> {
    let Some(raw) = v else { return Ok(Cell::Null) };
    let text = raw.get();
    Ok(match text.as_bytes().first() {
        Some(b'"') => Cell::Str(serde_json::from_str::<Cow<str>>(text).map_err(|e| format!("invalid JSON string: {e}"))?),
        Some(b'n') => Cell::Null,
        Some(b't') => Cell::Bool(true),
        Some(b'f') => Cell::Bool(false),
        Some(b'{' | b'[') => Cell::Json(text),
        _ => Cell::Num(text),
    })
}

/// Field names of a chunk's records that match no column, reported once per chunk.
#[derive(Default)]
pub(crate) struct Unmatched(std::collections::BTreeSet<String>);

impl Unmatched {
    pub(crate) fn note(&mut self, name: &str) {
        if self.0.len() < 20 && !self.0.contains(name) {
            self.0.insert(name.to_string());
        }
    }

    /// The note for the ledger (and the log), if any field matched no column.
    pub(crate) fn report(&self, what: &str) -> Option<String> {
        if self.0.is_empty() {
            return None;
        }
        tracing::warn!(fields = ?self.0, "{what} fields match no column of the table and are not loaded");
        Some(format!("{what} fields that match no column of the table are not loaded: {:?}", self.0))
    }
}

/// How input field names find their columns (`table.case_insensitive`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Names {
    #[default]
    Exact,
    AnyCase,
}

impl Names {
    pub fn matches(self, field: &str, column: &str) -> bool {
        match self {
            Names::Exact => field == column,
            Names::AnyCase => field.eq_ignore_ascii_case(column),
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{Int32Type, Int64Type, TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType};

    use super::*;

    /// JSON lines through [`Decode`], with a sink of batches only; (rejects, notes).
    #[allow(clippy::too_many_arguments)]
    fn jsonl(
        input: &[u8],
        path: &str,
        specs: &[ColumnSpec],
        names: Names,
        first: i64,
        batch_size: usize,
        max_bad: u64,
        sink: &mut dyn FnMut(RecordBatch) -> Result<(), Error>,
    ) -> Result<(Vec<Reject>, Vec<String>), Error> {
        let dialect = CsvOptions::default();
        let how = Decoding {
            path,
            columns: specs,
            names,
            csv: &dialect,
            first_record: first,
            batch_size,
            max_bad,
            max_record_size: 1 << 20,
            size_hint: 0,
        };
        run(Format::Jsonl, input, &how, sink)
    }

    /// CSV through [`Decode`], as [`jsonl`].
    #[allow(clippy::too_many_arguments)]
    fn csv(
        input: &[u8],
        specs: &[ColumnSpec],
        names: Names,
        dialect: &CsvOptions,
        first: i64,
        batch_size: usize,
        max_bad: u64,
        sink: &mut dyn FnMut(RecordBatch) -> Result<(), Error>,
    ) -> Result<(Vec<Reject>, Vec<String>), Error> {
        let how = Decoding {
            path: "test",
            columns: specs,
            names,
            csv: dialect,
            first_record: first,
            batch_size,
            max_bad,
            max_record_size: 1 << 20,
            size_hint: 0,
        };
        run(Format::Csv, input, &how, sink)
    }

    fn run(
        format: Format,
        mut input: &[u8],
        how: &Decoding<'_>,
        sink: &mut dyn FnMut(RecordBatch) -> Result<(), Error>,
    ) -> Result<(Vec<Reject>, Vec<String>), Error> {
        let d = decoder(format).decode(&mut input, how, &mut |b, _| sink(b).map_err(|_| Stopped))?;
        Ok((d.rejects, d.notes))
    }

    fn col(name: &str, ty: ColumnType) -> ColumnSpec {
        ColumnSpec { name: name.into(), ty, nullable: true, epoch: None }
    }

    /// Decodes `input` (JSON lines, or CSV when it does not start with `{`) into one column
    /// `v`; returns the batch column (if any row got through) and the rejects' reasons.
    fn one(spec: ColumnSpec, input: &str) -> (Option<ArrayRef>, Vec<String>) {
        let mut got: Option<ArrayRef> = None;
        let rejects = {
            let mut sink = |b: RecordBatch| -> Result<(), Error> {
                got = Some(b.column(0).clone());
                Ok(())
            };
            let specs = [spec];
            if input.trim_start_matches('\u{feff}').starts_with('{') {
                jsonl(input.as_bytes(), "test", &specs, Names::Exact, 0, 1000, 1000, &mut sink).unwrap().0
            } else {
                csv(input.as_bytes(), &specs, Names::Exact, &CsvOptions::default(), 0, 1000, 1000, &mut sink).unwrap().0
            }
        };
        (got, rejects.into_iter().map(|r| r.reason).collect())
    }

    #[track_caller]
    fn rejected(spec: ColumnSpec, input: &str, why: &str) {
        let (got, rejects) = one(spec, input);
        assert!(got.is_none(), "{input}: kept as {got:?}");
        assert_eq!(rejects.len(), 1, "{input}: {rejects:?}");
        assert!(rejects[0].contains(why), "{input}: {rejects:?} should say {why:?}");
    }

    #[test]
    fn numbers_are_kept_exactly_or_rejected_with_a_reason() {
        // Integers: range and whole numbers.
        rejected(col("v", ColumnType::Int), r#"{"v": 3000000000}"#, "out of the range of an int");
        rejected(col("v", ColumnType::Int), "v\n3000000000\n", "out of the range of an int");
        rejected(col("v", ColumnType::Long), r#"{"v": 1.9}"#, "not a whole number");
        rejected(col("v", ColumnType::Long), r#"{"v": "abc"}"#, "not a number");
        rejected(col("v", ColumnType::Long), r#"{"v": 18446744073709551615}"#, "out of the range of a long");
        rejected(col("v", ColumnType::Double), r#"{"v": 1e400}"#, "out of the range of a double");
        rejected(col("v", ColumnType::Float), r#"{"v": 1e39}"#, "out of the range of a float");
        rejected(col("v", ColumnType::Long), r#"{"v": true}"#, "expected a whole number");
        rejected(col("v", ColumnType::Boolean), r#"{"v": "yes"}"#, "expected true or false");
        let (got, _) = one(col("v", ColumnType::Int), r#"{"v": -2147483648}"#);
        assert_eq!(got.unwrap().as_primitive::<Int32Type>().value(0), i32::MIN);
        let (got, _) = one(col("v", ColumnType::Long), r#"{"v": 9223372036854775807}"#);
        assert_eq!(got.unwrap().as_primitive::<Int64Type>().value(0), i64::MAX);
        // Number text into a string column is the text as written, every digit of it.
        for (json, want) in [
            (r#"{"v": 18446744073709551615}"#, "18446744073709551615"),
            (r#"{"v": 0.1000000000000000055511151231257827}"#, "0.1000000000000000055511151231257827"),
            (r#"{"v": 1E+3}"#, "1E+3"),
            (r#"{"v": {"a": [1, 2]}}"#, r#"{"a": [1, 2]}"#),
            (r#"{"v": "\u00e9t\u00e9"}"#, "été"),
        ] {
            let (got, rejects) = one(col("v", ColumnType::String), json);
            assert!(rejects.is_empty(), "{json}: {rejects:?}");
            assert_eq!(got.unwrap().as_string::<i32>().value(0), want, "{json}");
        }
    }

    #[test]
    fn timestamps_keep_their_precision_and_their_day() {
        // Microseconds by default: nothing cut to milliseconds.
        let (got, _) = one(col("v", ColumnType::Timestamp), r#"{"v": "2026-11-30T12:00:00.123456Z"}"#);
        let us = got.unwrap().as_primitive::<TimestampMicrosecondType>().value(0);
        assert_eq!(us, 1_796_040_000_123_456);
        // Before 1970: floored, not rounded toward zero.
        let (got, _) = one(col("v", ColumnType::Timestamp), r#"{"v": "1969-12-31T23:59:59.999999Z"}"#);
        assert_eq!(got.unwrap().as_primitive::<TimestampMicrosecondType>().value(0), -1);
        // Nanoseconds where asked for; milliseconds reject what they cannot hold.
        let (got, _) = one(col("v", ColumnType::TimestampNs), r#"{"v": "2026-11-30T12:00:00.123456789+01:00"}"#);
        assert_eq!(got.unwrap().as_primitive::<TimestampNanosecondType>().value(0), 1_796_036_400_123_456_789);
        rejected(
            col("v", ColumnType::TimestampMs),
            r#"{"v": "2026-11-30T12:00:00.123456Z"}"#,
            "more precision than the column's milliseconds",
        );
        rejected(col("v", ColumnType::Timestamp), r#"{"v": "2026-11-30T12:00:00.1234567Z"}"#, "more precision");
        rejected(col("v", ColumnType::TimestampNs), r#"{"v": "2300-01-01T00:00:00Z"}"#, "out of the range");
        rejected(col("v", ColumnType::Timestamp), r#"{"v": "2026-11-30 12:00:00"}"#, "not an RFC 3339 timestamp");
        // An epoch number needs its unit: seconds are never taken for milliseconds.
        rejected(col("v", ColumnType::Timestamp), r#"{"v": 1796040000}"#, "set the column's `epoch`");
        let secs = ColumnSpec { epoch: Some(EpochUnit::S), ..col("v", ColumnType::TimestampMs) };
        let (got, _) = one(secs.clone(), r#"{"v": 1796040000}"#);
        assert_eq!(got.unwrap().as_primitive::<TimestampMillisecondType>().value(0), 1_796_040_000_000);
        let (got, _) = one(secs, "v\n1796040000\n");
        assert_eq!(got.unwrap().as_primitive::<TimestampMillisecondType>().value(0), 1_796_040_000_000);
        let ns = ColumnSpec { epoch: Some(EpochUnit::Ns), ..col("v", ColumnType::TimestampMs) };
        rejected(ns, r#"{"v": 1796040000000000001}"#, "more precision");
    }

    #[test]
    fn a_csv_dialect_without_header_and_with_its_own_null() {
        use crate::spec::AsciiChar;
        let specs = [col("a", ColumnType::String), col("b", ColumnType::Long)];
        let d = CsvOptions { delimiter: AsciiChar(b'|'), quote: AsciiChar(b'\''), has_header: false, null_value: Some("NULL".into()) };
        let mut got: Vec<(Option<String>, Option<i64>)> = Vec::new();
        let mut sink = |b: RecordBatch| -> Result<(), Error> {
            let (a, n) = (b.column(0).as_string::<i32>(), b.column(1).as_primitive::<Int64Type>());
            got.extend((0..b.num_rows()).map(|i| ((!a.is_null(i)).then(|| a.value(i).to_string()), (!n.is_null(i)).then(|| n.value(i)))));
            Ok(())
        };
        let (rejects, _) = csv(b"x|1\n'y|z'|2\nNULL|NULL\n|3\nonly\n", &specs, Names::Exact, &d, 0, 10, 10, &mut sink).unwrap();
        assert_eq!(
            got,
            [(Some("x".into()), Some(1)), (Some("y|z".into()), Some(2)), (None, None), (Some(String::new()), Some(3))],
            "with a null_value, an empty field is the empty string"
        );
        assert_eq!(rejects.len(), 1, "one field where the table has two: {rejects:?}");
    }

    #[test]
    fn names_match_in_any_case_when_asked() {
        let specs = [col("userid", ColumnType::Long)];
        let mut got: Vec<i64> = Vec::new();
        let mut sink = |b: RecordBatch| -> Result<(), Error> {
            got.extend(b.column(0).as_primitive::<Int64Type>().iter().map(|v| v.unwrap_or(-1)));
            Ok(())
        };
        assert!(jsonl(&b"{\"userId\": 7}\n"[..], "test", &specs, Names::AnyCase, 0, 10, 10, &mut sink).unwrap().1.is_empty());
        let (_, notes) = jsonl(&b"{\"userId\": 8}\n"[..], "test", &specs, Names::Exact, 0, 10, 10, &mut sink).unwrap();
        assert!(notes.len() == 1 && notes[0].contains("userId"), "the field left out is noted: {notes:?}");
        csv(b"UserID\n9\n", &specs, Names::AnyCase, &CsvOptions::default(), 0, 10, 10, &mut sink).unwrap();
        let (_, notes) = csv(b"x,UserID\n1,9\n", &specs, Names::AnyCase, &CsvOptions::default(), 0, 10, 10, &mut sink).unwrap();
        assert!(notes.len() == 1 && notes[0].contains("\"x\""), "{notes:?}");
        let specs = [col("userid", ColumnType::Long), col("other", ColumnType::Long)];
        let (_, notes) = csv(b"userid\n10\n", &specs, Names::Exact, &CsvOptions::default(), 0, 10, 10, &mut sink).unwrap();
        assert!(notes.len() == 1 && notes[0].contains("not in the CSV header") && notes[0].contains("other"), "{notes:?}");
        assert_eq!(got, [7, -1, 9, 9, 10], "exact matching leaves userId out (a null, and a note)");
    }

    #[test]
    fn csv_header_bom_and_column_matching() {
        // A header that matches no column is an error, not rows of nulls.
        let specs = [col("a", ColumnType::String), col("b", ColumnType::Long)];
        let mut sink = |_b: RecordBatch| -> Result<(), Error> { Ok(()) };
        let e = csv(b"x,y\n1,2\n", &specs, Names::Exact, &CsvOptions::default(), 0, 10, 10, &mut sink).unwrap_err();
        assert!(e.to_string().contains("matches none of the table's columns"), "{e}");
        // A byte order mark is not part of the first column's name or the first record.
        let (got, rejects) = one(col("v", ColumnType::Long), "\u{feff}v\n7\n");
        assert!(rejects.is_empty(), "{rejects:?}");
        assert_eq!(got.unwrap().as_primitive::<Int64Type>().value(0), 7);
        let (got, rejects) = one(col("v", ColumnType::Long), "\u{feff}{\"v\": 8}\n");
        assert!(rejects.is_empty(), "{rejects:?}");
        assert_eq!(got.unwrap().as_primitive::<Int64Type>().value(0), 8);
        // A required column that is missing rejects the record, with the column's name.
        let req = ColumnSpec { nullable: false, ..col("v", ColumnType::Long) };
        rejected(req, r#"{"w": 1}"#, "column \"v\" is required");
        assert!(one(col("v", ColumnType::Long), r#"{"v": null}"#).0.unwrap().is_null(0));
    }
}
