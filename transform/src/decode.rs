//! Decoding a staged chunk into Arrow record batches in the table's column types.
//!
//! Avro goes through [`crate::avro`] straight into Arrow. JSON lines and CSV are parsed record by
//! record; a record that does not fit the table (bad JSON, a wrong column count, a value of
//! the wrong type, a missing required field) is set aside as a reject with its position and
//! reason, and the rest of the chunk flows on.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanBuilder, Date32Builder, Float32Builder, Float64Builder, Int32Builder, Int64Builder, StringBuilder,
    TimestampMillisecondBuilder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use ferry_common::config::{ColumnSpec, ColumnType};
use ferry_ledger::Reject;

use crate::TransformError;

/// The Arrow type of a table column type. Timestamps are UTC, written as the offset "+00:00"
/// (arrow's default build has no time zone database).
pub fn arrow_type(ty: ColumnType) -> DataType {
    match ty {
        ColumnType::String => DataType::Utf8,
        ColumnType::Long => DataType::Int64,
        ColumnType::Int => DataType::Int32,
        ColumnType::Double => DataType::Float64,
        ColumnType::Float => DataType::Float32,
        ColumnType::Boolean => DataType::Boolean,
        ColumnType::Timestamp => DataType::Timestamp(TimeUnit::Millisecond, Some("+00:00".into())),
        ColumnType::Date => DataType::Date32,
    }
}

pub fn table_schema(cols: &[ColumnSpec]) -> SchemaRef {
    Arc::new(Schema::new(cols.iter().map(|c| Field::new(&c.name, arrow_type(c.ty), c.nullable)).collect::<Vec<_>>()))
}

/// A parsed cell, before it goes into a column builder.
#[derive(Debug, Clone, PartialEq)]
enum Cell {
    Null,
    Str(String),
    I64(i64),
    F64(f64),
    Bool(bool),
}

enum Col {
    Str(StringBuilder),
    I64(Int64Builder),
    I32(Int32Builder),
    F64(Float64Builder),
    F32(Float32Builder),
    Bool(BooleanBuilder),
    Ts(TimestampMillisecondBuilder),
    Date(Date32Builder),
}

impl Col {
    fn new(dt: &DataType) -> Col {
        match dt {
            DataType::Int64 => Col::I64(Int64Builder::new()),
            DataType::Int32 => Col::I32(Int32Builder::new()),
            DataType::Float64 => Col::F64(Float64Builder::new()),
            DataType::Float32 => Col::F32(Float32Builder::new()),
            DataType::Boolean => Col::Bool(BooleanBuilder::new()),
            DataType::Timestamp(_, _) => Col::Ts(TimestampMillisecondBuilder::new().with_timezone("+00:00")),
            DataType::Date32 => Col::Date(Date32Builder::new()),
            _ => Col::Str(StringBuilder::new()),
        }
    }

    /// Converts a cell to this column's type, or says why it cannot.
    fn check(&self, c: Cell) -> Result<Cell, String> {
        let bad = |what: &str, c: &Cell| Err(format!("expected {what}, got {c:?}"));
        Ok(match (self, c) {
            (_, Cell::Null) => Cell::Null,
            (Col::Str(_), Cell::Str(s)) => Cell::Str(s),
            (Col::Str(_), Cell::I64(v)) => Cell::Str(v.to_string()),
            (Col::Str(_), Cell::F64(v)) => Cell::Str(v.to_string()),
            (Col::Str(_), Cell::Bool(v)) => Cell::Str(v.to_string()),
            (Col::I64(_) | Col::I32(_), Cell::I64(v)) => Cell::I64(v),
            (Col::I64(_) | Col::I32(_), Cell::Str(s)) => match s.trim().parse::<i64>() {
                Ok(v) => Cell::I64(v),
                Err(_) => return bad("an integer", &Cell::Str(s)),
            },
            (Col::F64(_) | Col::F32(_), Cell::F64(v)) => Cell::F64(v),
            (Col::F64(_) | Col::F32(_), Cell::I64(v)) => Cell::F64(v as f64),
            (Col::F64(_) | Col::F32(_), Cell::Str(s)) => match s.trim().parse::<f64>() {
                Ok(v) => Cell::F64(v),
                Err(_) => return bad("a number", &Cell::Str(s)),
            },
            (Col::Bool(_), Cell::Bool(b)) => Cell::Bool(b),
            (Col::Bool(_), Cell::Str(s)) => match s.trim().to_ascii_lowercase().as_str() {
                "true" | "1" => Cell::Bool(true),
                "false" | "0" => Cell::Bool(false),
                _ => return bad("a boolean", &Cell::Str(s)),
            },
            (Col::Ts(_), Cell::I64(v)) => Cell::I64(v),
            (Col::Ts(_), Cell::Str(s)) => match chrono::DateTime::parse_from_rfc3339(s.trim()) {
                Ok(t) => Cell::I64(t.timestamp_millis()),
                Err(_) => return bad("an RFC 3339 timestamp or epoch milliseconds", &Cell::Str(s)),
            },
            (Col::Date(_), Cell::Str(s)) => match chrono::NaiveDate::parse_from_str(s.trim(), "%Y-%m-%d") {
                Ok(d) => Cell::I64((d - chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("epoch")).num_days()),
                Err(_) => return bad("a date YYYY-MM-DD", &Cell::Str(s)),
            },
            (Col::Date(_), Cell::I64(v)) => Cell::I64(v),
            (_, c) => return bad("another type", &c),
        })
    }

    fn push(&mut self, c: Cell) {
        match (self, c) {
            (Col::Str(b), Cell::Str(s)) => b.append_value(s),
            (Col::Str(b), _) => b.append_null(),
            (Col::I64(b), Cell::I64(v)) => b.append_value(v),
            (Col::I64(b), _) => b.append_null(),
            (Col::I32(b), Cell::I64(v)) => b.append_value(v as i32),
            (Col::I32(b), _) => b.append_null(),
            (Col::F64(b), Cell::F64(v)) => b.append_value(v),
            (Col::F64(b), _) => b.append_null(),
            (Col::F32(b), Cell::F64(v)) => b.append_value(v as f32),
            (Col::F32(b), _) => b.append_null(),
            (Col::Bool(b), Cell::Bool(v)) => b.append_value(v),
            (Col::Bool(b), _) => b.append_null(),
            (Col::Ts(b), Cell::I64(v)) => b.append_value(v),
            (Col::Ts(b), _) => b.append_null(),
            (Col::Date(b), Cell::I64(v)) => b.append_value(v as i32),
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
            Col::Ts(b) => Arc::new(b.finish()),
            Col::Date(b) => Arc::new(b.finish()),
        }
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
    fn new(schema: SchemaRef, batch_size: usize, max_bad: u64, sink: &'a mut Sink<'a>) -> Rows<'a> {
        let cols = schema.fields().iter().map(|f| Col::new(f.data_type())).collect();
        Rows { schema, cols, len: 0, batch_size, sink, rejects: vec![], max_bad }
    }

    /// Adds a record whose cells are in schema order, or rejects it whole.
    fn add(&mut self, cells: Vec<Cell>, position: impl Fn() -> String) -> Result<(), TransformError> {
        let mut checked = Vec::with_capacity(cells.len());
        for ((cell, col), field) in cells.into_iter().zip(&self.cols).zip(self.schema.fields()) {
            match col.check(cell) {
                Ok(Cell::Null) if !field.is_nullable() => {
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

fn json_cell(v: Option<&serde_json::Value>) -> Cell {
    match v {
        None | Some(serde_json::Value::Null) => Cell::Null,
        Some(serde_json::Value::String(s)) => Cell::Str(s.clone()),
        Some(serde_json::Value::Bool(b)) => Cell::Bool(*b),
        Some(serde_json::Value::Number(n)) => match n.as_i64() {
            Some(i) => Cell::I64(i),
            None => Cell::F64(n.as_f64().unwrap_or(f64::NAN)),
        },
        Some(other) => Cell::Str(other.to_string()),
    }
}

/// JSON lines; `first_line` is the chunk's first line in the source file (0-based).
pub fn jsonl<'a>(
    data: &[u8],
    schema: SchemaRef,
    first_line: i64,
    batch_size: usize,
    max_bad: u64,
    sink: &'a mut Sink<'a>,
) -> Result<Vec<Reject>, TransformError> {
    let mut rows = Rows::new(schema.clone(), batch_size, max_bad, sink);
    for (i, line) in data.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let pos = || format!("line {}", first_line + i as i64 + 1);
        match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(line) {
            Ok(obj) => {
                let cells = schema.fields().iter().map(|f| json_cell(obj.get(f.name()))).collect();
                rows.add(cells, pos)?;
            }
            Err(e) => rows.reject(pos(), format!("invalid JSON: {e}"))?,
        }
    }
    rows.finish()
}

/// CSV with a header row; `first_record` is the chunk's first data record (0-based).
pub fn csv<'a>(
    data: &[u8],
    schema: SchemaRef,
    first_record: i64,
    batch_size: usize,
    max_bad: u64,
    sink: &'a mut Sink<'a>,
) -> Result<Vec<Reject>, TransformError> {
    let mut rows = Rows::new(schema.clone(), batch_size, max_bad, sink);
    let mut r = csv::ReaderBuilder::new().flexible(true).from_reader(data);
    let header = r.headers().map_err(|e| TransformError::BadInput(format!("CSV header: {e}")))?.clone();
    let mut index = Vec::with_capacity(schema.fields().len());
    for f in schema.fields() {
        match header.iter().position(|h| h == f.name()) {
            Some(i) => index.push(i),
            None if f.is_nullable() => index.push(usize::MAX),
            None => {
                return Err(TransformError::BadInput(format!("CSV header has no column {:?}", f.name())));
            }
        }
    }
    let mut rec = csv::StringRecord::new();
    let mut n = first_record;
    loop {
        n += 1;
        match r.read_record(&mut rec) {
            Ok(false) => break,
            Ok(true) if rec.len() != header.len() => {
                let why = format!("{} fields, the header has {}", rec.len(), header.len());
                rows.reject(format!("record {n}"), why)?;
            }
            Ok(true) => {
                let cells = index
                    .iter()
                    .zip(schema.fields())
                    .map(|(&i, f)| match rec.get(i) {
                        // An empty CSV field is a null, except in a string column.
                        Some("") if f.data_type() != &DataType::Utf8 => Cell::Null,
                        Some(s) => Cell::Str(s.to_string()),
                        None => Cell::Null,
                    })
                    .collect();
                let line = rec.position().map(|p| p.line()).unwrap_or(0);
                rows.add(cells, || format!("record {n} (line {line} of the chunk)"))?;
            }
            Err(e) => rows.reject(format!("record {n}"), format!("invalid CSV: {e}"))?,
        }
    }
    rows.finish()
}
