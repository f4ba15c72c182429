//! Avro object container files into Arrow, block by block.
//!
//! Most staged chunks are flat records of primitive fields (with nullable unions and logical
//! types on top), and for those this module decodes straight from its read buffer into Arrow
//! buffers sized from the previous batch. arrow-avro copies each block into a fresh growing
//! Vec and grows every string buffer from 1 KiB per batch: a profile of the benchmark put
//! those reallocations at ~14% of transform's CPU. Any other schema (nested records, arrays,
//! maps, enums, fixed, decimals, named references) goes through arrow-avro unchanged, and
//! the fast path takes arrow-avro's own Arrow schema for the file, so both paths give the
//! same types, names and metadata.

use std::io::{BufRead, Read};
use std::sync::Arc;

use arrow::array::{Array, ArrayData, ArrayRef, AsArray, BinaryArray, StringArray, make_array};
use arrow::buffer::{Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;

use super::{Blocks, Codec, Cursor, Header, ReadError, Short, decompress};
use crate::decode::{Decode, Decoded, Decoding, Error as DecodeError, Sink, Stopped};

/// Avro object container files, decoded with the schema each chunk carries.
pub struct Avro;

impl Decode for Avro {
    fn self_describing(&self) -> bool {
        true
    }

    fn decode(&self, input: &mut dyn BufRead, how: &Decoding<'_>, sink: &mut Sink<'_>) -> Result<Decoded, DecodeError> {
        decode(input, how.batch_size, how.max_record_size, sink)?;
        Ok(Decoded::default())
    }
}

/// Decodes one container file, reading `r` to its end (a hashing reader sees every byte).
/// A block may take at most `limit` bytes, compressed or decompressed (`max_record_size`).
pub fn decode(r: impl Read, batch_size: usize, limit: usize, sink: &mut Sink<'_>) -> Result<(), DecodeError> {
    let mut input = Input::new(r, limit);
    let (header, raw) = input.0.header().map_err(read_error)?;
    match Plan::new(&header, &raw)? {
        Some(plan) => {
            plan.decode(&mut input, &header, batch_size.max(1), limit, sink)?;
            input.drain()
        }
        None => {
            // Not flat: arrow-avro decodes, from blocks this module has already checked and
            // decompressed (within the limit), with every string read as bytes so that one
            // record that is not UTF-8 fails alone.
            let target = arrow_avro::reader::ReaderBuilder::new()
                .build(&raw[..])
                .map_err(|e| DecodeError::BadInput(format!("Avro header: {e}")))?
                .schema();
            let mut frames = Reframe::new(input, &header, &target, limit)?;
            let reader = arrow_avro::reader::ReaderBuilder::new()
                .with_batch_size(batch_size)
                .build(&mut frames)
                .map_err(|e| DecodeError::BadInput(format!("Avro header: {e}")))?;
            let plain = plain_schema(&target);
            for b in reader {
                let b = b.map_err(|e| DecodeError::BadInput(format!("Avro data: {e}")))?;
                let (b, bad) = as_target(b, &target)?;
                sink(plain_columns(b, &plain)?, bad).map_err(|Stopped| DecodeError::Stopped)?;
            }
            frames.input.drain()
        }
    }
}

/// The file's blocks, read through a buffer from the pool (given back when done).
struct Input<R: Read>(Blocks<R>);

const READ_BUFFER: usize = 4 << 20;

impl<R: Read> Drop for Input<R> {
    fn drop(&mut self) {
        crate::pool::give(self.0.take_buffer());
    }
}

impl<R: Read> Input<R> {
    fn new(inner: R, limit: usize) -> Self {
        Input(Blocks::new(inner, crate::pool::take(READ_BUFFER), READ_BUFFER, limit))
    }

    /// The next block with its records decompressed (into `scratch`, unless the codec is
    /// null), `None` at the end of the file.
    fn block<'a>(&'a mut self, codec: Codec, limit: usize, scratch: &'a mut Vec<u8>) -> Result<Option<Block<'a>>, DecodeError> {
        let Some(b) = self.0.next_block().map_err(read_error)? else { return Ok(None) };
        let data: &[u8] = match codec {
            Codec::Null => b.data,
            codec => {
                decompress(codec, b.data, scratch, limit).map_err(|e| read_error(b.corrupt(&format!("{}: {e}", codec.name()))))?;
                scratch
            }
        };
        Ok(Some(Block { records: b.records, data, index: b.index, offset: b.offset }))
    }

    /// Reads whatever is left (normally nothing) so the hash covers the whole file.
    fn drain(mut self) -> Result<(), DecodeError> {
        self.0.drain().map_err(|e| DecodeError::io("staged Avro chunk", e))
    }
}

fn read_error(e: ReadError) -> DecodeError {
    match e {
        ReadError::Corrupt(m) => corrupt(m),
        ReadError::Io(e) => DecodeError::io("staged Avro chunk", e),
    }
}

/// The container file again, for arrow-avro: blocks checked against the sync marker and the
/// limit, decompressed here (so no codec ever expands a block past the limit), and handed on
/// uncompressed, one block in memory at a time. The schema it announces reads every string as
/// bytes when [`as_target`] can turn them back; a record whose string is not UTF-8 is then
/// one bad row rather than an error for its whole batch.
struct Reframe<R: Read> {
    input: Input<R>,
    codec: Codec,
    sync: [u8; 16],
    limit: usize,
    /// The bytes being handed out (the header, then one block at a time).
    out: Vec<u8>,
    pos: usize,
    scratch: Vec<u8>,
}

impl<R: Read> Reframe<R> {
    fn new(input: Input<R>, h: &Header, target: &SchemaRef, limit: usize) -> Result<Reframe<R>, DecodeError> {
        let codec = Codec::parse(&h.codec)
            .ok_or_else(|| corrupt(format!("Avro codec {:?} is not supported (null, deflate, snappy, zstandard)", h.codec)))?;
        // A container header and no blocks: what the writer writes for a file with no records.
        let header = |schema: &str| {
            super::Writer::new(Vec::new(), schema, Codec::Null, h.sync).and_then(|w| w.finish()).map_err(DecodeError::internal)
        };
        // Strings as bytes only where every column can be cast back to its own type.
        let as_bytes = match serde_json::from_str::<serde_json::Value>(&h.schema) {
            Ok(mut v) => strings_as_bytes(&mut v).then(|| header(&v.to_string())).transpose()?,
            Err(_) => None,
        };
        let castable = |raw: &[u8]| {
            let Ok(r) = arrow_avro::reader::ReaderBuilder::new().build(raw) else { return false };
            let got = r.schema();
            got.fields().len() == target.fields().len()
                && got.fields().iter().zip(target.fields()).all(|(g, t)| arrow::compute::can_cast_types(g.data_type(), t.data_type()))
        };
        let out = match as_bytes {
            Some(raw) if castable(&raw) => raw,
            _ => header(&h.schema)?,
        };
        Ok(Reframe { input, codec, sync: h.sync, limit, out, pos: 0, scratch: Vec::new() })
    }

    /// The next block, uncompressed, into `out`; false at the end of the file.
    fn next_block(&mut self) -> Result<bool, DecodeError> {
        let Some(b) = self.input.block(self.codec, self.limit, &mut self.scratch)? else {
            return Ok(false);
        };
        self.out.clear();
        super::write_long(&mut self.out, b.records as i64);
        super::write_bytes(&mut self.out, b.data);
        self.out.extend_from_slice(&self.sync);
        self.pos = 0;
        Ok(true)
    }
}

impl<R: Read> Read for Reframe<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = std::io::Read::read(&mut self.fill_buf()?, out)?;
        self.consume(n);
        Ok(n)
    }
}

impl<R: Read> BufRead for Reframe<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        if self.pos == self.out.len() {
            self.out.clear();
            self.pos = 0;
            self.next_block().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
        }
        Ok(&self.out[self.pos..])
    }
    fn consume(&mut self, n: usize) {
        self.pos += n;
    }
}

/// Reads every `string` of a schema as `bytes` (the same encoding), except logical types
/// (uuid) whose meaning needs the string. True if anything changed.
fn strings_as_bytes(t: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    match t {
        Value::String(s) if s == "string" => {
            *s = "bytes".into();
            true
        }
        Value::Array(branches) => branches.iter_mut().fold(false, |any, b| strings_as_bytes(b) | any),
        Value::Object(o) => match o.get("type").cloned() {
            Some(Value::String(k)) if k == "record" || k == "error" => match o.get_mut("fields") {
                Some(Value::Array(fields)) => {
                    fields.iter_mut().filter_map(|f| f.get_mut("type")).fold(false, |any, f| strings_as_bytes(f) | any)
                }
                _ => false,
            },
            Some(Value::String(k)) if k == "array" => o.get_mut("items").is_some_and(strings_as_bytes),
            Some(Value::String(k)) if k == "map" => o.get_mut("values").is_some_and(strings_as_bytes),
            Some(Value::String(k)) if k == "string" && !o.contains_key("logicalType") => {
                o.insert("type".into(), Value::String("bytes".into()));
                true
            }
            Some(Value::Array(_) | Value::Object(_)) => o.get_mut("type").is_some_and(strings_as_bytes),
            _ => false,
        },
        _ => false,
    }
}

/// A batch read with strings as bytes, in the file's own Arrow types again, with the rows
/// that hold a string that is not UTF-8 (anywhere in the record: a nested field, a list
/// item, a map value).
#[allow(clippy::type_complexity)]
fn as_target(b: RecordBatch, target: &SchemaRef) -> Result<(RecordBatch, Vec<(usize, String)>), DecodeError> {
    if b.schema().fields() == target.fields() {
        return Ok((RecordBatch::try_new(target.clone(), b.columns().to_vec()).map_err(DecodeError::internal)?, Vec::new()));
    }
    let mut bad: std::collections::BTreeMap<usize, String> = Default::default();
    let mut cols = Vec::with_capacity(b.num_columns());
    for (col, f) in b.columns().iter().zip(target.fields()) {
        for r in utf8_rows(col, f.data_type()) {
            bad.entry(r).or_insert_with(|| format!("column {:?}: a string that is not valid UTF-8", f.name()));
        }
        // What is not UTF-8 becomes "": those rows are left out anyway.
        let col = if bad.is_empty() { col.clone() } else { without_bad_utf8(col) };
        cols.push(arrow::compute::cast(&col, f.data_type()).map_err(|e| DecodeError::BadInput(format!("Avro data: {e}")))?);
    }
    let b = RecordBatch::try_new_with_options(target.clone(), cols, &Default::default())
        .map_err(|e| DecodeError::BadInput(format!("Avro data: {e}")))?;
    Ok((b, bad.into_iter().collect()))
}

/// Whether a field is an Avro `uuid` (arrow-avro reads it as 16 bytes).
fn is_uuid(f: &arrow::datatypes::Field) -> bool {
    f.data_type() == &DataType::FixedSizeBinary(16) && f.metadata().get("logicalType").map(String::as_str) == Some("uuid")
}

/// The file's Arrow schema with the columns every reader takes as text made text: a `uuid`
/// column as its canonical string (not 16 bytes), an enum as its symbol (not a dictionary).
fn plain_schema(s: &SchemaRef) -> SchemaRef {
    let fields: Vec<arrow::datatypes::Field> = s
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            _ if is_uuid(f) => arrow::datatypes::Field::new(f.name(), DataType::Utf8, f.is_nullable()),
            DataType::Dictionary(_, v) if v.as_ref() == &DataType::Utf8 => {
                arrow::datatypes::Field::new(f.name(), DataType::Utf8, f.is_nullable()).with_metadata(f.metadata().clone())
            }
            _ => f.as_ref().clone(),
        })
        .collect();
    Arc::new(arrow::datatypes::Schema::new_with_metadata(fields, s.metadata().clone()))
}

/// `b` in [`plain_schema`]'s types.
fn plain_columns(b: RecordBatch, plain: &SchemaRef) -> Result<RecordBatch, DecodeError> {
    if b.schema().fields() == plain.fields() {
        return Ok(b);
    }
    let cols = b
        .columns()
        .iter()
        .zip(b.schema().fields())
        .zip(plain.fields())
        .map(|((c, f), p)| -> Result<ArrayRef, DecodeError> {
            if f.data_type() == p.data_type() {
                return Ok(c.clone());
            }
            if is_uuid(f) {
                let bytes = c.as_fixed_size_binary();
                let text: StringArray = bytes
                    .iter()
                    .map(|v| {
                        v.map(|v| {
                            let h: String = v.iter().map(|b| format!("{b:02x}")).collect();
                            format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
                        })
                    })
                    .collect();
                return Ok(Arc::new(text));
            }
            arrow::compute::cast(c, p.data_type()).map_err(|e| DecodeError::BadInput(format!("Avro data: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(plain.clone(), cols).map_err(DecodeError::internal)
}

/// Rows of `a` (read with strings as bytes) that hold bytes which are not UTF-8 where
/// `target` has a string.
fn utf8_rows(a: &ArrayRef, target: &DataType) -> Vec<usize> {
    // Children's bad rows as rows of a list or map with these offsets.
    let parents = |offsets: &[i32], children: Vec<usize>| -> Vec<usize> {
        let mut rows: Vec<usize> = children.into_iter().map(|c| offsets.partition_point(|&o| o as usize <= c).saturating_sub(1)).collect();
        rows.dedup();
        rows
    };
    match (a.data_type(), target) {
        (DataType::Binary, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) => invalid_utf8(a.as_binary::<i32>()),
        (DataType::List(_), DataType::List(t)) => {
            let l = a.as_list::<i32>();
            parents(l.value_offsets(), utf8_rows(l.values(), t.data_type()))
        }
        (DataType::Struct(_), DataType::Struct(ts)) => {
            let s = a.as_struct();
            let mut rows: Vec<usize> = s.columns().iter().zip(ts).flat_map(|(c, t)| utf8_rows(c, t.data_type())).collect();
            rows.sort_unstable();
            rows.dedup();
            rows
        }
        (DataType::Map(_, _), DataType::Map(t, _)) => {
            let m = a.as_map();
            let entries: ArrayRef = Arc::new(m.entries().clone());
            parents(m.value_offsets(), utf8_rows(&entries, t.data_type()))
        }
        _ => Vec::new(),
    }
}

/// `a` with every byte string that is not UTF-8, at any depth, replaced by "".
fn without_bad_utf8(a: &ArrayRef) -> ArrayRef {
    use arrow::array::{ListArray, MapArray, StructArray};
    match a.data_type() {
        DataType::Binary => {
            let b = a.as_binary::<i32>();
            Arc::new(b.iter().map(|v| v.map(|v| if std::str::from_utf8(v).is_ok() { v } else { b"" })).collect::<BinaryArray>())
        }
        DataType::List(f) => {
            let l = a.as_list::<i32>();
            Arc::new(ListArray::new(f.clone(), l.offsets().clone(), without_bad_utf8(l.values()), l.nulls().cloned()))
        }
        DataType::Struct(fs) => {
            let s = a.as_struct();
            Arc::new(StructArray::new(fs.clone(), s.columns().iter().map(without_bad_utf8).collect(), s.nulls().cloned()))
        }
        DataType::Map(f, sorted) => {
            let m = a.as_map();
            let entries: ArrayRef = Arc::new(m.entries().clone());
            let entries = without_bad_utf8(&entries).as_struct().clone();
            Arc::new(MapArray::new(f.clone(), m.offsets().clone(), entries, m.nulls().cloned(), *sorted))
        }
        _ => a.clone(),
    }
}

/// The strings of `a`, with "" for a value that is not UTF-8 (its row is left out).
fn utf8_or_empty(a: &BinaryArray) -> StringArray {
    a.iter().map(|v| v.map(|b| std::str::from_utf8(b).unwrap_or(""))).collect()
}

/// Rows whose value is not UTF-8.
fn invalid_utf8(a: &BinaryArray) -> Vec<usize> {
    (0..a.len()).filter(|&i| a.is_valid(i) && std::str::from_utf8(a.value(i)).is_err()).collect()
}

/// One block's records, as [`Input::block`] found them.
struct Block<'a> {
    records: u64,
    /// The records' bytes, decompressed.
    data: &'a [u8],
    /// Which block of the file it is, and the file offset it starts at (for errors).
    index: u64,
    offset: u64,
}

fn corrupt(msg: String) -> DecodeError {
    DecodeError::BadInput(msg)
}

/// The physical Avro encoding of a flat field.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Prim {
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
}

impl Prim {
    fn parse(t: &serde_json::Value) -> Option<Prim> {
        let name = match t {
            serde_json::Value::String(s) => s.as_str(),
            // {"type": "long", "logicalType": ...}: the logical type only changes the Arrow
            // type, which is checked against arrow-avro's below.
            serde_json::Value::Object(o) => o.get("type")?.as_str()?,
            _ => return None,
        };
        Some(match name {
            "boolean" => Prim::Boolean,
            "int" => Prim::Int,
            "long" => Prim::Long,
            "float" => Prim::Float,
            "double" => Prim::Double,
            "bytes" => Prim::Bytes,
            "string" => Prim::String,
            _ => return None,
        })
    }

    /// Whether this encoding fills the Arrow type as is (no value conversion).
    fn fills(self, dt: &DataType) -> bool {
        matches!(
            (self, dt),
            (Prim::Boolean, DataType::Boolean)
                | (Prim::Int, DataType::Int32 | DataType::Date32 | DataType::Time32(_))
                | (Prim::Long, DataType::Int64 | DataType::Timestamp(_, _) | DataType::Time64(_))
                | (Prim::Float, DataType::Float32)
                | (Prim::Double, DataType::Float64)
                | (Prim::Bytes, DataType::Binary)
                | (Prim::String, DataType::Utf8)
        )
    }
}

/// How each field of a flat record is decoded.
struct Plan {
    schema: SchemaRef,
    fields: Vec<(Prim, Option<i64>)>, // (encoding, union branch that means null)
}

impl Plan {
    /// `None` when the schema is not a flat record of primitives: arrow-avro takes the file.
    fn new(h: &Header, raw: &[u8]) -> Result<Option<Plan>, DecodeError> {
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&h.schema) else {
            return Ok(None);
        };
        let Some(fields) =
            json.get("fields").and_then(|f| f.as_array()).filter(|_| json.get("type").and_then(|t| t.as_str()) == Some("record"))
        else {
            return Ok(None);
        };
        if fields.is_empty() {
            return Ok(None); // a batch of no columns has no row count: arrow-avro's case
        }
        let mut plan = Vec::with_capacity(fields.len());
        for f in fields {
            let Some(t) = f.get("type") else {
                return Ok(None);
            };
            let field = match t {
                serde_json::Value::Array(branches) if branches.len() == 2 => {
                    let null = branches.iter().position(|b| b.as_str() == Some("null"));
                    match null {
                        Some(i) => match Prim::parse(&branches[1 - i]) {
                            Some(p) => (p, Some(i as i64)),
                            None => return Ok(None),
                        },
                        None => return Ok(None),
                    }
                }
                t => match Prim::parse(t) {
                    Some(p) => (p, None),
                    None => return Ok(None),
                },
            };
            plan.push(field);
        }
        if Codec::parse(&h.codec).is_none() {
            return Ok(None);
        }
        // arrow-avro's Arrow schema for this header, so both paths agree on types and metadata.
        let schema =
            arrow_avro::reader::ReaderBuilder::new().build(raw).map_err(|e| DecodeError::BadInput(format!("Avro header: {e}")))?.schema();
        if schema.fields().len() != plan.len()
            || !schema.fields().iter().zip(&plan).all(|(f, (p, null))| p.fills(f.data_type()) && (null.is_some() || !f.is_nullable()))
        {
            return Ok(None);
        }
        Ok(Some(Plan { schema, fields: plan }))
    }

    fn decode<R: Read>(
        &self,
        input: &mut Input<R>,
        h: &Header,
        batch_size: usize,
        limit: usize,
        sink: &mut Sink<'_>,
    ) -> Result<(), DecodeError> {
        let mut cols: Vec<Column> = self.fields.iter().map(|&(p, null)| Column::new(p, null)).collect();
        let mut rows = 0usize;
        let mut scratch = Vec::new();
        let mut last = 0u64;
        let codec = Codec::parse(&h.codec).ok_or_else(|| corrupt(format!("unsupported codec {}", h.codec)))?;
        for c in cols.iter_mut() {
            c.reserve(batch_size);
        }
        while let Some(Block { records: count, data, index, offset }) = input.block(codec, limit, &mut scratch)? {
            last = index;
            let block_err = |what: &str| corrupt(format!("Avro block {index} at byte {offset}: {what}"));
            let mut cur = Cursor { data, pos: 0 };
            for i in 0..count {
                for col in cols.iter_mut() {
                    col.decode(&mut cur).map_err(|_| block_err(&format!("record {i} is malformed or runs past the end of the block")))?;
                }
                rows += 1;
                if rows == batch_size {
                    let (b, bad) = self.flush(&mut cols, rows, batch_size, index)?;
                    sink(b, bad).map_err(|Stopped| DecodeError::Stopped)?;
                    rows = 0;
                }
            }
            if cur.pos != data.len() {
                return Err(block_err(&format!("{} bytes left after its {count} records", data.len() - cur.pos)));
            }
            // Arrow offsets are i32: a batch ends before a column could pass 2 GiB (a block
            // adds at most MAX_BLOCK).
            if rows > 0 && cols.iter().any(|c| c.data.len() > 1 << 30) {
                let (b, bad) = self.flush(&mut cols, rows, batch_size, index)?;
                sink(b, bad).map_err(|Stopped| DecodeError::Stopped)?;
                rows = 0;
            }
        }
        if rows > 0 {
            let (b, bad) = self.flush(&mut cols, rows, batch_size, last)?;
            sink(b, bad).map_err(|Stopped| DecodeError::Stopped)?;
        }
        Ok(())
    }

    /// The batch so far, with its rows that hold a string that is not UTF-8; `block` is the
    /// block being decoded, for error messages.
    #[allow(clippy::type_complexity)]
    fn flush(
        &self,
        cols: &mut [Column],
        rows: usize,
        batch_size: usize,
        block: u64,
    ) -> Result<(RecordBatch, Vec<(usize, String)>), DecodeError> {
        let mut bad = Vec::new();
        let arrays = cols
            .iter_mut()
            .zip(self.schema.fields())
            .map(|(c, f)| {
                let (array, not_utf8) = c.finish(f.data_type(), rows, batch_size).map_err(|e| match e {
                    DecodeError::BadInput(m) => {
                        DecodeError::BadInput(format!("column {:?}, in Avro block {block} or the {rows} records before it: {m}", f.name()))
                    }
                    e => e,
                })?;
                bad.extend(not_utf8.into_iter().map(|r| (r, format!("column {:?}: a string that is not valid UTF-8", f.name()))));
                Ok(array)
            })
            .collect::<Result<Vec<_>, DecodeError>>()?;
        bad.sort_by_key(|(r, _)| *r);
        let b = RecordBatch::try_new(self.schema.clone(), arrays).map_err(|e| DecodeError::BadInput(format!("Avro data: {e}")))?;
        Ok((b, bad))
    }
}

/// One field's values for the batch being built.
struct Column {
    prim: Prim,
    null_branch: Option<i64>,
    valid: Vec<bool>,
    /// Fixed-width values as little-endian bytes; variable-width values' bytes.
    data: Vec<u8>,
    offsets: Vec<i32>,
    /// Bytes per row of the last batch, to size the next one's buffer once.
    bytes_per_row: usize,
}

impl Column {
    fn new(prim: Prim, null_branch: Option<i64>) -> Column {
        Column { prim, null_branch, valid: Vec::new(), data: Vec::new(), offsets: vec![0], bytes_per_row: 0 }
    }

    fn width(&self) -> usize {
        match self.prim {
            Prim::Int | Prim::Float => 4,
            Prim::Long | Prim::Double => 8,
            Prim::Boolean => 1,
            Prim::Bytes | Prim::String => 0,
        }
    }

    fn reserve(&mut self, rows: usize) {
        if self.null_branch.is_some() {
            self.valid.reserve(rows);
        }
        match self.width() {
            0 => {
                self.offsets.reserve(rows + 1);
                // A little over the last batch's size, in whole MiB: variable-width buffers
                // rarely grow, and batches ask glibc for the same sizes again, which it then
                // serves from memory it already has rather than freshly mapped pages.
                let want = (self.bytes_per_row * rows / 8 * 9 + 1024).min(1 << 30);
                self.data.reserve(want.next_multiple_of(1 << 20));
            }
            w => self.data.reserve(rows * w),
        }
    }

    #[inline]
    fn decode(&mut self, c: &mut Cursor<'_>) -> Result<(), Short> {
        if let Some(null) = self.null_branch {
            let branch = c.long()?;
            if branch == null {
                self.valid.push(false);
                match self.prim {
                    Prim::Bytes | Prim::String => self.offsets.push(self.data.len() as i32),
                    _ => self.data.extend(std::iter::repeat_n(0, self.width())),
                }
                return Ok(());
            }
            if branch != 1 - null {
                return Err(Short);
            }
            self.valid.push(true);
        }
        match self.prim {
            Prim::Boolean => self.data.push((c.bytes(1)?[0] != 0) as u8),
            Prim::Int => {
                let v = c.long()?;
                let v = i32::try_from(v).map_err(|_| Short)?;
                self.data.extend_from_slice(&v.to_le_bytes());
            }
            Prim::Long => {
                let v = c.long()?;
                self.data.extend_from_slice(&v.to_le_bytes());
            }
            Prim::Float => self.data.extend_from_slice(c.bytes(4)?),
            Prim::Double => self.data.extend_from_slice(c.bytes(8)?),
            Prim::Bytes | Prim::String => {
                let s = c.len_prefixed()?;
                self.data.extend_from_slice(s);
                // Offsets are i32: a batch holds at most 2 GiB of one column.
                self.offsets.push(i32::try_from(self.data.len()).map_err(|_| Short)?);
            }
        }
        Ok(())
    }

    /// The column's array, and the rows whose string is not UTF-8 (a null in the array).
    fn finish(&mut self, dt: &DataType, rows: usize, batch_size: usize) -> Result<(ArrayRef, Vec<usize>), DecodeError> {
        let mut not_utf8 = Vec::new();
        let nulls = self.null_branch.map(|_| NullBuffer::from(std::mem::take(&mut self.valid)));
        let bad = |e: arrow::error::ArrowError| DecodeError::BadInput(format!("Avro data: {e}"));
        let array: ArrayRef = match self.prim {
            Prim::Bytes | Prim::String => {
                if rows == batch_size {
                    self.bytes_per_row = self.data.len() / rows;
                }
                let offsets = OffsetBuffer::new(ScalarBuffer::from(std::mem::replace(&mut self.offsets, vec![0])));
                let values = Buffer::from_vec(std::mem::take(&mut self.data));
                if self.prim == Prim::String {
                    // try_new checks the bytes are UTF-8, as Avro strings must be, in one pass.
                    // Only when that fails are the values looked at one by one.
                    match StringArray::try_new(offsets.clone(), values.clone(), nulls.clone()) {
                        Ok(a) => Arc::new(a),
                        Err(_) => {
                            let bin = BinaryArray::try_new(offsets, values, nulls).map_err(bad)?;
                            not_utf8 = invalid_utf8(&bin);
                            Arc::new(utf8_or_empty(&bin))
                        }
                    }
                } else {
                    Arc::new(BinaryArray::try_new(offsets, values, nulls).map_err(bad)?)
                }
            }
            Prim::Boolean => {
                let bits = arrow::buffer::BooleanBuffer::from_iter(self.data.drain(..).map(|b| b != 0));
                Arc::new(arrow::array::BooleanArray::new(bits, nulls))
            }
            _ => {
                let data = ArrayData::builder(dt.clone())
                    .len(rows)
                    .add_buffer(Buffer::from_vec(std::mem::take(&mut self.data)))
                    .nulls(nulls)
                    .build()
                    .map_err(bad)?;
                make_array(data)
            }
        };
        self.reserve(batch_size);
        Ok((array, not_utf8))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(file: &[u8], batch: usize) -> (Vec<RecordBatch>, Vec<RecordBatch>) {
        let mut fast = Vec::new();
        decode(file, batch, 64 << 20, &mut |b, bad| {
            assert!(bad.is_empty(), "{bad:?}");
            fast.push(b);
            Ok(())
        })
        .unwrap();
        let reference: Vec<RecordBatch> =
            arrow_avro::reader::ReaderBuilder::new().with_batch_size(batch).build(file).unwrap().map(|b| b.unwrap()).collect();
        (fast, reference)
    }

    fn concat(b: &[RecordBatch]) -> RecordBatch {
        arrow::compute::concat_batches(&b[0].schema(), b).unwrap()
    }

    /// Writes a one-block container file by hand: schema, then records already encoded.
    fn container(schema: &str, codec: &str, count: i64, records: &[u8]) -> Vec<u8> {
        use crate::avro::{write_bytes as bytes, write_long as long};
        let mut f = b"Obj\x01".to_vec();
        long(&mut f, 2);
        bytes(&mut f, b"avro.schema");
        bytes(&mut f, schema.as_bytes());
        bytes(&mut f, b"avro.codec");
        bytes(&mut f, codec.as_bytes());
        long(&mut f, 0);
        let sync = [7u8; 16];
        f.extend_from_slice(&sync);
        long(&mut f, count);
        bytes(&mut f, records);
        f.extend_from_slice(&sync);
        f
    }

    #[test]
    fn every_primitive_and_union_order_matches_arrow_avro() {
        let schema = r#"{"type":"record","name":"R","fields":[
            {"name":"b","type":"boolean"},{"name":"i","type":["int","null"]},{"name":"d","type":{"type":"int","logicalType":"date"}},
            {"name":"l","type":["null",{"type":"long","logicalType":"timestamp-micros"}]},{"name":"f","type":"float"},
            {"name":"x","type":"double"},{"name":"y","type":["null","bytes"]},{"name":"s","type":["string","null"]}]}"#;
        // Two records: all values, then every nullable one null.
        let mut r = vec![1u8, 0, 0x54, 0x02, 0x02, 0x80, 0x01];
        r.extend_from_slice(&1.5f32.to_le_bytes());
        r.extend_from_slice(&(-2.25f64).to_le_bytes());
        r.extend_from_slice(&[0x02, 0x04, 0xff, 0x00, 0x00, 0x06]);
        r.extend_from_slice("é!".as_bytes());
        r.extend_from_slice(&[0, 0x02, 0x01, 0x00]);
        r.extend_from_slice(&0f32.to_le_bytes());
        r.extend_from_slice(&0f64.to_le_bytes());
        r.extend_from_slice(&[0x00, 0x02]);
        let file = container(schema, "null", 2, &r);
        let (fast, reference) = both(&file, 10);
        assert_eq!(concat(&fast), concat(&reference));
        assert_eq!(concat(&fast).column(1).null_count(), 1);
        assert_eq!(concat(&fast).column(7).null_count(), 1);
    }

    #[test]
    fn other_schemas_go_through_arrow_avro() {
        let schema = r#"{"type":"record","name":"R","fields":[{"name":"a","type":{"type":"array","items":"long"}}]}"#;
        let file = container(schema, "null", 1, &[0x04, 0x02, 0x04, 0x00]);
        let (fast, reference) = both(&file, 10);
        assert_eq!(concat(&fast), concat(&reference));
        let crate::avro::Parse::Done(h) = Header::parse(&file) else { panic!("header") };
        assert!(Plan::new(&h, &file[..h.len]).unwrap().is_none());
    }

    #[test]
    fn corrupt_blocks_are_bad_input_naming_the_block() {
        let schema = r#"{"type":"record","name":"R","fields":[{"name":"s","type":"string"}]}"#;
        let good = container(schema, "null", 1, &[0x02, b'a']);
        let run = |f: &[u8]| decode(f, 10, 64 << 20, &mut |_, _| Ok(())).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(run(&good[..good.len() - 3]).contains("truncated"), "{}", run(&good[..good.len() - 3]));
        let mut extra = container(schema, "null", 1, &[0x02, b'a', b'b']);
        assert!(run(&extra).contains("1 bytes left"), "{}", run(&extra));
        let n = extra.len();
        extra[n - 1] ^= 1;
        assert!(run(&extra).contains("sync marker"), "{}", run(&extra));
        let long = container(schema, "null", 2, &[0x02, b'a']);
        assert!(run(&long).contains("runs past the end"), "{}", run(&long));
        // Sizes a corrupt file claims are checked before anything is allocated for them.
        let header_len = good.len() - 2 - 2 - 16; // count, size, record, sync
        let mut huge = good[..header_len].to_vec();
        huge.extend_from_slice(&[0x02, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02]); // 1 record, 2^42 bytes
        assert!(run(&huge).contains("limit"), "{}", run(&huge));
        let mut big = good[..header_len].to_vec();
        big.extend_from_slice(&[0x02, 0x80, 0x80, 0x80, 0x20, b'a']); // 1 record, 32 MiB, file ends
        assert!(run(&big).contains("truncated"), "{}", run(&big));
        let mut bad_header = good[..4].to_vec();
        bad_header.extend_from_slice(&[0x02, 0x01]); // one entry, key of length -1
        assert!(run(&bad_header).contains("corrupt Avro header"), "{}", run(&bad_header));
    }

    /// Every batch and bad row `decode` hands on, with the limit given.
    fn collect(file: &[u8], limit: usize) -> Result<(RecordBatch, Vec<(usize, String)>), DecodeError> {
        let (mut batches, mut bad) = (Vec::new(), Vec::new());
        decode(file, 2, limit, &mut |b, rows| {
            let first: usize = batches.iter().map(RecordBatch::num_rows).sum();
            bad.extend(rows.into_iter().map(|(r, why)| (first + r, why)));
            batches.push(b);
            Ok(())
        })?;
        Ok((concat(&batches), bad))
    }

    #[test]
    fn a_string_that_is_not_utf8_is_one_bad_row_on_both_paths() {
        let flat = r#"{"type":"record","name":"R","fields":[{"name":"n","type":"long"},{"name":"s","type":"string"}]}"#;
        // Records: (1,"a"), (2, 0xff), (3,"c").
        let file = container(flat, "null", 3, &[0x02, 0x02, b'a', 0x04, 0x02, 0xff, 0x06, 0x02, b'c']);
        let (b, bad) = collect(&file, 1 << 20).unwrap();
        assert_eq!(b.num_rows(), 3);
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert_eq!(bad[0].0, 1);
        assert!(bad[0].1.contains("\"s\"") && bad[0].1.contains("UTF-8"), "{bad:?}");
        // Not flat: a list of strings and a nested record; the bad string is deep in record 1.
        let nested = r#"{"type":"record","name":"R","fields":[{"name":"n","type":"long"},
            {"name":"tags","type":{"type":"array","items":"string"}},
            {"name":"inner","type":{"type":"record","name":"I","fields":[{"name":"t","type":["null","string"]}]}}]}"#;
        let mut recs = Vec::new();
        for (n, tag, inner) in
            [(1u8, &b"x"[..], &b"ok"[..]), (2, &b"y"[..], &b"\xc3\x28"[..]), (3, &b"\xff"[..], &b"ok"[..]), (4, &b"z"[..], &b"ok"[..])]
        {
            recs.extend_from_slice(&[n * 2, 0x02, 0x02, tag[0]]);
            recs.truncate(recs.len() - 1);
            recs.extend_from_slice(tag);
            recs.push(0x00); // end of the array
            recs.extend_from_slice(&[0x02, (inner.len() * 2) as u8]);
            recs.extend_from_slice(inner);
        }
        let file = container(nested, "null", 4, &recs);
        let (b, bad) = collect(&file, 1 << 20).unwrap();
        assert_eq!(b.num_rows(), 4);
        let rows: Vec<usize> = bad.iter().map(|(r, _)| *r).collect();
        assert_eq!(rows, [1, 2], "{bad:?}");
        assert!(bad[0].1.contains("\"inner\"") && bad[1].1.contains("\"tags\""), "{bad:?}");
        let reference = arrow_avro::reader::ReaderBuilder::new().build(&container(nested, "null", 1, &recs[..8])[..]).unwrap().schema();
        assert_eq!(b.schema(), reference, "the file's own types, strings as strings");
    }

    #[test]
    fn a_compression_bomb_stops_at_the_limit_on_both_paths() {
        use crate::avro::{Writer, write_bytes};
        let flat = r#"{"type":"record","name":"R","fields":[{"name":"s","type":"string"}]}"#;
        let nested = r#"{"type":"record","name":"R","fields":[{"name":"s","type":{"type":"array","items":"string"}}]}"#;
        for (schema, item) in [(flat, vec![]), (nested, vec![0x02u8])] {
            // One record: a 4 MiB string of zeros (deflated to a few KiB).
            let mut w = Writer::new(Vec::new(), schema, Codec::Deflate, [5; 16]).unwrap();
            w.record(|buf| {
                buf.extend_from_slice(&item);
                write_bytes(buf, &vec![b'0'; 4 << 20]);
                if !item.is_empty() {
                    buf.push(0);
                }
            });
            let file = w.finish().unwrap();
            assert!(file.len() < 64 << 10);
            let e = collect(&file, 1 << 20).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains("limit") && e.contains("Avro block 0"), "{e}");
            assert_eq!(collect(&file, 8 << 20).unwrap().0.num_rows(), 1, "within the limit it decodes");
        }
    }
}
