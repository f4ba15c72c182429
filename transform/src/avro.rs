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

use arrow::array::{ArrayData, ArrayRef, BinaryArray, StringArray, make_array};
use arrow::buffer::{Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;

use ferry_formats::avro::{BlockHead, Codec, Cursor, Header, MAX_HEADER, Parse, Short, decompress};

use crate::TransformError;
use crate::decode::Sink;

/// Decodes one container file, reading `r` to its end (a hashing reader sees every byte).
pub fn decode(r: impl Read, batch_size: usize, sink: &mut Sink<'_>) -> Result<(), TransformError> {
    let mut input = Input::new(r);
    let (header, raw) = read_header(&mut input)?;
    match Plan::new(&header, &raw)? {
        Some(plan) => {
            input.consume(header.len);
            plan.decode(&mut input, &header, batch_size.max(1), sink)?;
        }
        None => {
            // Not flat: arrow-avro reads the header again from the same buffer.
            let reader = arrow_avro::reader::ReaderBuilder::new()
                .with_batch_size(batch_size)
                .build(&mut input)
                .map_err(|e| TransformError::BadInput(format!("Avro header: {e}")))?;
            for b in reader {
                sink(b.map_err(|e| TransformError::BadInput(format!("Avro data: {e}")))?)?;
            }
        }
    }
    input.drain()
}

/// A read buffer that can hand out a whole block as one slice, refilled in large reads.
/// Bytes are moved only when a block straddles the end of the buffer (about one block per
/// buffer fill), never block by block.
struct Input<R> {
    inner: R,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    eof: bool,
    /// File offset of `buf[pos]`, for error messages.
    offset: u64,
}

const READ_BUFFER: usize = 4 << 20;

impl<R> Drop for Input<R> {
    fn drop(&mut self) {
        crate::pool::give(std::mem::take(&mut self.buf));
    }
}

impl<R: Read> Input<R> {
    fn new(inner: R) -> Self {
        let mut buf = crate::pool::take(READ_BUFFER);
        buf.resize(READ_BUFFER, 0);
        Input { inner, buf, pos: 0, end: 0, eof: false, offset: 0 }
    }

    /// At least `n` bytes from the current position, or fewer only at the end of the file.
    fn ensure(&mut self, n: usize) -> Result<&[u8], TransformError> {
        if self.end - self.pos < n && !self.eof {
            if self.buf.len() - self.pos < n {
                self.buf.copy_within(self.pos..self.end, 0);
                self.end -= self.pos;
                self.pos = 0;
            }
            while self.end - self.pos < n {
                if self.end == self.buf.len() {
                    // Grown as bytes arrive, never to a size a (corrupt) block header merely
                    // claims: a bogus size ends in "truncated", not in a huge allocation.
                    let want = (self.buf.len() * 2).min(self.pos + n).max(self.end + 1);
                    self.buf.resize(want, 0);
                }
                match self.inner.read(&mut self.buf[self.end..]) {
                    Ok(0) => {
                        self.eof = true;
                        break;
                    }
                    Ok(k) => self.end += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(TransformError::io("staged Avro chunk", e)),
                }
            }
        }
        Ok(&self.buf[self.pos..self.end])
    }

    /// Reads whatever is left (normally nothing) so the hash covers the whole file.
    fn drain(mut self) -> Result<(), TransformError> {
        self.pos = self.end;
        std::io::copy(&mut self.inner, &mut std::io::sink()).map_err(|e| TransformError::io("staged Avro chunk", e))?;
        Ok(())
    }
}

impl<R: Read> Read for Input<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = std::io::Read::read(&mut self.fill_buf()?, out)?;
        self.consume(n);
        Ok(n)
    }
}

impl<R: Read> BufRead for Input<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.ensure(1).map_err(|e| std::io::Error::other(e.to_string()))
    }
    fn consume(&mut self, n: usize) {
        self.pos += n;
        self.offset += n as u64;
    }
}

fn corrupt(msg: String) -> TransformError {
    TransformError::BadInput(msg)
}

/// The file's header, read through the buffer (which keeps it for arrow-avro if the schema
/// is not flat), with its raw bytes.
fn read_header<R: Read>(input: &mut Input<R>) -> Result<(Header, Vec<u8>), TransformError> {
    let mut want = 64 << 10;
    loop {
        let avail = input.ensure(want)?;
        match Header::parse(avail) {
            Parse::Done(h) => {
                let raw = avail[..h.len].to_vec();
                return Ok((h, raw));
            }
            Parse::Corrupt(m) => return Err(corrupt(m)),
            // The header is longer than what is buffered: read more, unless there is no more.
            Parse::More if avail.len() < want || want > MAX_HEADER => return Err(corrupt("truncated Avro header".into())),
            Parse::More => want *= 4,
        }
    }
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
    fn new(h: &Header, raw: &[u8]) -> Result<Option<Plan>, TransformError> {
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
        let schema = arrow_avro::reader::ReaderBuilder::new()
            .build(raw)
            .map_err(|e| TransformError::BadInput(format!("Avro header: {e}")))?
            .schema();
        if schema.fields().len() != plan.len()
            || !schema.fields().iter().zip(&plan).all(|(f, (p, null))| p.fills(f.data_type()) && (null.is_some() || !f.is_nullable()))
        {
            return Ok(None);
        }
        Ok(Some(Plan { schema, fields: plan }))
    }

    fn decode<R: Read>(&self, input: &mut Input<R>, h: &Header, batch_size: usize, sink: &mut Sink<'_>) -> Result<(), TransformError> {
        let mut cols: Vec<Column> = self.fields.iter().map(|&(p, null)| Column::new(p, null)).collect();
        let mut rows = 0usize;
        let mut scratch = Vec::new();
        let mut index = 0u64;
        let codec = Codec::parse(&h.codec).ok_or_else(|| corrupt(format!("unsupported codec {}", h.codec)))?;
        for c in cols.iter_mut() {
            c.reserve(batch_size);
        }
        loop {
            let at = input.offset;
            let head = input.ensure(20)?;
            if head.is_empty() {
                break;
            }
            let block_err = |what: &str| corrupt(format!("Avro block {index} at byte {at}: {what}"));
            let (count, size, start) = match BlockHead::parse(head, index, at) {
                Parse::Done(b) => (b.records, b.size, b.len),
                Parse::Corrupt(m) => return Err(corrupt(m)),
                Parse::More => return Err(block_err("truncated block header")),
            };
            let total = start + size + 16;
            let block = input.ensure(total)?;
            if block.len() < total {
                return Err(block_err(&format!("truncated: the file ends inside the block ({} of {total} bytes)", block.len())));
            }
            if block[start + size..total] != h.sync {
                return Err(block_err("does not end with the file's sync marker"));
            }
            let data = &block[start..start + size];
            let data: &[u8] = match codec {
                Codec::Null => data,
                codec => {
                    decompress(codec, data, &mut scratch).map_err(|e| block_err(&format!("{}: {e}", codec.name())))?;
                    &scratch
                }
            };
            let mut cur = Cursor { data, pos: 0 };
            for i in 0..count {
                for col in cols.iter_mut() {
                    col.decode(&mut cur).map_err(|_| block_err(&format!("record {i} is malformed or runs past the end of the block")))?;
                }
                rows += 1;
                if rows == batch_size {
                    sink(self.flush(&mut cols, rows, batch_size, index)?)?;
                    rows = 0;
                }
            }
            if cur.pos != data.len() {
                return Err(block_err(&format!("{} bytes left after its {count} records", data.len() - cur.pos)));
            }
            input.consume(total);
            index += 1;
            // Arrow offsets are i32: a batch ends before a column could pass 2 GiB (a block
            // adds at most MAX_BLOCK).
            if rows > 0 && cols.iter().any(|c| c.data.len() > 1 << 30) {
                sink(self.flush(&mut cols, rows, batch_size, index - 1)?)?;
                rows = 0;
            }
        }
        if rows > 0 {
            sink(self.flush(&mut cols, rows, batch_size, index.saturating_sub(1))?)?;
        }
        Ok(())
    }

    /// The batch so far; `block` is the block being decoded, for error messages.
    fn flush(&self, cols: &mut [Column], rows: usize, batch_size: usize, block: u64) -> Result<RecordBatch, TransformError> {
        let arrays = cols
            .iter_mut()
            .zip(self.schema.fields())
            .map(|(c, f)| {
                c.finish(f.data_type(), rows, batch_size).map_err(|e| match e {
                    TransformError::BadInput(m) => TransformError::BadInput(format!(
                        "column {:?}, in Avro block {block} or the {rows} records before it: {m}",
                        f.name()
                    )),
                    e => e,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        RecordBatch::try_new(self.schema.clone(), arrays).map_err(|e| TransformError::BadInput(format!("Avro data: {e}")))
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

    fn finish(&mut self, dt: &DataType, rows: usize, batch_size: usize) -> Result<ArrayRef, TransformError> {
        let nulls = self.null_branch.map(|_| NullBuffer::from(std::mem::take(&mut self.valid)));
        let bad = |e: arrow::error::ArrowError| TransformError::BadInput(format!("Avro data: {e}"));
        let array: ArrayRef = match self.prim {
            Prim::Bytes | Prim::String => {
                if rows == batch_size {
                    self.bytes_per_row = self.data.len() / rows;
                }
                let offsets = OffsetBuffer::new(ScalarBuffer::from(std::mem::replace(&mut self.offsets, vec![0])));
                let values = Buffer::from_vec(std::mem::take(&mut self.data));
                if self.prim == Prim::String {
                    // try_new checks the bytes are UTF-8, as Avro strings must be.
                    Arc::new(StringArray::try_new(offsets, values, nulls).map_err(bad)?)
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
        Ok(array)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(file: &[u8], batch: usize) -> (Vec<RecordBatch>, Vec<RecordBatch>) {
        let mut fast = Vec::new();
        decode(file, batch, &mut |b| {
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

    #[test]
    fn flat_records_match_arrow_avro_for_every_codec() {
        use ferry_admin::sample::{AvroCodec, events, write_events};
        for codec in [AvroCodec::Null, AvroCodec::Deflate, AvroCodec::Snappy, AvroCodec::Zstandard] {
            let mut file = Vec::new();
            write_events(&mut file, ferry_common::config::Format::Avro, events(7, 2_345, 0), codec, 300).unwrap();
            for batch in [1, 100, 1000, 8192] {
                let (fast, reference) = both(&file, batch);
                assert_eq!(concat(&fast), concat(&reference), "{codec:?} batch {batch}");
                assert!(fast.iter().all(|b| b.num_rows() <= batch));
            }
        }
    }

    /// Writes a one-block container file by hand: schema, then records already encoded.
    fn container(schema: &str, codec: &str, count: i64, records: &[u8]) -> Vec<u8> {
        use ferry_formats::avro::{write_bytes as bytes, write_long as long};
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
        let Parse::Done(h) = Header::parse(&file) else { panic!("header") };
        assert!(Plan::new(&h, &file[..h.len]).unwrap().is_none());
    }

    #[test]
    fn corrupt_blocks_are_bad_input_naming_the_block() {
        let schema = r#"{"type":"record","name":"R","fields":[{"name":"s","type":"string"}]}"#;
        let good = container(schema, "null", 1, &[0x02, b'a']);
        let run = |f: &[u8]| decode(f, 10, &mut |_| Ok(())).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(run(&good[..good.len() - 3]).contains("truncated"), "{}", run(&good[..good.len() - 3]));
        let mut extra = container(schema, "null", 1, &[0x02, b'a', b'b']);
        assert!(run(&extra).contains("1 bytes left"), "{}", run(&extra));
        let n = extra.len();
        extra[n - 1] ^= 1;
        assert!(run(&extra).contains("sync marker"), "{}", run(&extra));
        let long = container(schema, "null", 2, &[0x02, b'a']);
        assert!(run(&long).contains("runs past the end"), "{}", run(&long));
        let bad_utf8 = container(schema, "null", 1, &[0x02, 0xff]);
        assert!(run(&bad_utf8).contains("Avro block 0"), "{}", run(&bad_utf8));
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
}
