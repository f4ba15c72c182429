//! Decoding a staged chunk into Arrow record batches in the table's column types.
//!
//! Avro goes through [`crate::avro`] straight into Arrow. JSON lines and CSV are parsed record by
//! record; a record that does not fit the table (bad JSON, a wrong column count, a value of
//! the wrong type, a missing required field) is set aside as a reject with its position and
//! reason, and the rest of the chunk flows on.

use std::borrow::Cow;
use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanBuilder, Date32Builder, Float32Builder, Float64Builder, Int32Builder, Int64Builder, StringBuilder};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use ferry_common::config::{ColumnSpec, ColumnType, CsvOptions, EpochUnit};
use ferry_ledger::Reject;

use crate::TransformError;

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
enum Cell<'a> {
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

/// Where decoded batches go, one at a time, so a chunk is never whole in memory as Arrow.
pub type Sink<'a> = dyn FnMut(RecordBatch) -> Result<(), TransformError> + 'a;

/// Builds batches of the table schema from parsed records, collecting rejects.
struct Rows<'a> {
    schema: SchemaRef,
    cols: Vec<Col>,
    len: usize,
    batch_size: usize,
    sink: &'a mut Sink<'a>,
    rejects: Vec<Reject>,
    max_bad: u64,
}

impl<'a> Rows<'a> {
    fn new(specs: &[ColumnSpec], batch_size: usize, max_bad: u64, sink: &'a mut Sink<'a>) -> Rows<'a> {
        let cols = specs.iter().map(Col::new).collect();
        Rows { schema: table_schema(specs), cols, len: 0, batch_size, sink, rejects: vec![], max_bad }
    }

    /// Adds a record whose cells are in schema order, or rejects it whole.
    fn add(&mut self, cells: Vec<Cell<'_>>, position: impl Fn() -> String) -> Result<(), TransformError> {
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

    fn reject(&mut self, position: String, reason: String) -> Result<(), TransformError> {
        self.rejects.push(Reject { position, reason });
        if self.rejects.len() as u64 > self.max_bad {
            let first = &self.rejects[0];
            return Err(TransformError::BadInput(format!(
                "more than max_bad_records = {} bad records; first at {}: {}",
                self.max_bad, first.position, first.reason
            )));
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), TransformError> {
        if self.len == 0 {
            return Ok(());
        }
        let arrays = self.cols.iter_mut().map(|c| c.finish()).collect();
        let batch = RecordBatch::try_new(self.schema.clone(), arrays).map_err(TransformError::internal)?;
        self.len = 0;
        (self.sink)(batch)
    }

    fn finish(mut self) -> Result<Vec<Reject>, TransformError> {
        self.flush()?;
        Ok(self.rejects)
    }
}

/// One JSON value as written: a string unescaped, anything else kept as its text.
fn json_cell(v: Option<&serde_json::value::RawValue>) -> Result<Cell<'_>, String> {
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
struct Unmatched(std::collections::BTreeSet<String>);

impl Unmatched {
    fn note(&mut self, name: &str) {
        if self.0.len() < 20 && !self.0.contains(name) {
            self.0.insert(name.to_string());
        }
    }

    /// The note for the ledger (and the log), if any field matched no column.
    fn report(&self, what: &str) -> Option<String> {
        if self.0.is_empty() {
            return None;
        }
        tracing::warn!(fields = ?self.0, "{what} fields match no column of the table and are not loaded");
        Some(format!("{what} fields that match no column of the table are not loaded: {:?}", self.0))
    }
}

/// JSON lines; `first_line` is the chunk's first line in the source file (0-based).
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

/// JSON lines read from `r` (the chunk at `path`) one line at a time: a chunk is never held
/// whole, only its longest line. `first_line` is the chunk's first line in its file (0-based).
#[allow(clippy::too_many_arguments)] // the chunk, its place, its limits, where it goes
pub fn jsonl<'a>(
    mut r: impl std::io::BufRead,
    path: &str,
    specs: &[ColumnSpec],
    names_rule: Names,
    first_line: i64,
    batch_size: usize,
    max_bad: u64,
    sink: &'a mut Sink<'a>,
) -> Result<(Vec<Reject>, Vec<String>), TransformError> {
    let mut rows = Rows::new(specs, batch_size, max_bad, sink);
    let names: std::collections::HashSet<String> =
        specs.iter().map(|c| if names_rule == Names::AnyCase { c.name.to_ascii_lowercase() } else { c.name.clone() }).collect();
    let mut unmatched = Unmatched::default();
    let mut buf = Vec::new();
    for i in 0.. {
        buf.clear();
        if r.read_until(b'\n', &mut buf).map_err(|e| TransformError::io(path, e))? == 0 {
            break;
        }
        let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        // A UTF-8 byte order mark is not part of the first record.
        let line = if i == 0 && first_line == 0 { line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line) } else { line };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let pos = || format!("line {}", first_line + i as i64 + 1);
        type Obj<'r> = std::collections::HashMap<Cow<'r, str>, &'r serde_json::value::RawValue>;
        match serde_json::from_slice::<Obj<'_>>(line) {
            Ok(mut obj) => {
                if names_rule == Names::AnyCase {
                    obj = obj.into_iter().map(|(k, v)| (Cow::Owned(k.to_ascii_lowercase()), v)).collect();
                }
                for k in obj.keys() {
                    if !names.contains(k.as_ref()) {
                        unmatched.note(k);
                    }
                }
                let cells: Result<Vec<Cell<'_>>, String> = specs
                    .iter()
                    .map(|c| {
                        let v = if names_rule == Names::AnyCase {
                            obj.get(c.name.to_ascii_lowercase().as_str())
                        } else {
                            obj.get(c.name.as_str())
                        };
                        json_cell(v.copied())
                    })
                    .collect();
                match cells {
                    Ok(cells) => rows.add(cells, pos)?,
                    Err(why) => rows.reject(pos(), why)?,
                }
            }
            Err(e) => rows.reject(pos(), format!("invalid JSON object: {e}"))?,
        }
    }
    let note = unmatched.report("JSON");
    Ok((rows.finish()?, note.into_iter().collect()))
}

/// CSV with a header row; `first_record` is the chunk's first data record (0-based).
/// CSV in `dialect`; `first_record` is the chunk's first data record (0-based). With a
/// header, columns are found by name; without one, fields fill the columns in order.
#[allow(clippy::too_many_arguments)] // the chunk, its place, its dialect, its limits, where it goes
pub fn csv<'a>(
    data: &[u8],
    specs: &[ColumnSpec],
    names_rule: Names,
    dialect: &CsvOptions,
    first_record: i64,
    batch_size: usize,
    max_bad: u64,
    sink: &'a mut Sink<'a>,
) -> Result<(Vec<Reject>, Vec<String>), TransformError> {
    let mut rows = Rows::new(specs, batch_size, max_bad, sink);
    let mut notes = Vec::new();
    let data = data.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(data);
    let mut r = csv::ReaderBuilder::new()
        .flexible(true)
        .delimiter(dialect.delimiter.0)
        .quote(dialect.quote.0)
        .has_headers(dialect.has_header)
        .from_reader(data);
    let (index, fields): (Vec<usize>, usize) = if dialect.has_header {
        let header = r.headers().map_err(|e| TransformError::BadInput(format!("CSV header: {e}")))?.clone();
        let mut index = Vec::with_capacity(specs.len());
        for f in specs {
            match header.iter().position(|h| names_rule.matches(h, &f.name)) {
                Some(i) => index.push(i),
                None if f.nullable => index.push(usize::MAX),
                None => {
                    return Err(TransformError::BadInput(format!("CSV header has no column {:?}", f.name)));
                }
            }
        }
        if !specs.is_empty() && index.iter().all(|&i| i == usize::MAX) {
            let got: Vec<&str> = header.iter().take(10).collect();
            return Err(TransformError::BadInput(format!(
                "the CSV header matches none of the table's columns (it has {got:?}); is this the right file, and does it have a header? (source.csv.has_header)"
            )));
        }
        let mut unmatched = Unmatched::default();
        for h in header.iter().filter(|h| !specs.iter().any(|c| names_rule.matches(h, &c.name))) {
            unmatched.note(h);
        }
        notes.extend(unmatched.report("CSV header"));
        let absent: Vec<&str> = specs.iter().zip(&index).filter(|(_, i)| **i == usize::MAX).map(|(c, _)| c.name.as_str()).collect();
        if !absent.is_empty() {
            notes.push(format!("columns that are not in the CSV header are null: {absent:?}"));
        }
        (index, header.len())
    } else {
        ((0..specs.len()).collect(), specs.len())
    };
    let null = dialect.null_value.as_deref();
    let mut rec = csv::StringRecord::new();
    let mut n = first_record;
    loop {
        n += 1;
        match r.read_record(&mut rec) {
            Ok(false) => break,
            Ok(true) if rec.len() != fields => {
                let why = if dialect.has_header {
                    format!("{} fields, the header has {fields}", rec.len())
                } else {
                    format!("{} fields, the table has {fields} columns", rec.len())
                };
                rows.reject(format!("record {n}"), why)?;
            }
            Ok(true) => {
                let cells = index
                    .iter()
                    .zip(specs)
                    .map(|(&i, f)| match (rec.get(i), null) {
                        (Some(s), Some(null)) if s == null => Cell::Null,
                        // Without a null_value, an empty field is a null, except in a string column.
                        (Some(""), None) if f.ty != ColumnType::String => Cell::Null,
                        (Some(s), _) => Cell::Str(Cow::Borrowed(s)),
                        (None, _) => Cell::Null,
                    })
                    .collect();
                let line = rec.position().map(|p| p.line()).unwrap_or(0);
                rows.add(cells, || format!("record {n} (line {line} of the chunk)"))?;
            }
            Err(e) => rows.reject(format!("record {n}"), format!("invalid CSV: {e}"))?,
        }
    }
    Ok((rows.finish()?, notes))
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{Int32Type, Int64Type, TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType};

    use super::*;

    fn col(name: &str, ty: ColumnType) -> ColumnSpec {
        ColumnSpec { name: name.into(), ty, nullable: true, epoch: None }
    }

    /// Decodes `input` (JSON lines, or CSV when it does not start with `{`) into one column
    /// `v`; returns the batch column (if any row got through) and the rejects' reasons.
    fn one(spec: ColumnSpec, input: &str) -> (Option<ArrayRef>, Vec<String>) {
        let mut got: Option<ArrayRef> = None;
        let rejects = {
            let mut sink = |b: RecordBatch| -> Result<(), TransformError> {
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
        use ferry_common::config::AsciiChar;
        let specs = [col("a", ColumnType::String), col("b", ColumnType::Long)];
        let d = CsvOptions { delimiter: AsciiChar(b'|'), quote: AsciiChar(b'\''), has_header: false, null_value: Some("NULL".into()) };
        let mut got: Vec<(Option<String>, Option<i64>)> = Vec::new();
        let mut sink = |b: RecordBatch| -> Result<(), TransformError> {
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
        let mut sink = |b: RecordBatch| -> Result<(), TransformError> {
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
        let mut sink = |_b: RecordBatch| -> Result<(), TransformError> { Ok(()) };
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
