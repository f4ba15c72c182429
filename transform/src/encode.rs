//! Parquet files from flat Arrow batches, with Ferry's own page encoding.
//!
//! Why not `parquet::arrow::ArrowWriter` for everything: on the benchmark's flat events table a
//! profile put about 12% of transform's CPU in ArrowWriter outside the compressor, most of it
//! copies: every page buffer grown from empty, each page copied again to put its levels in
//! front, and the compressor's output buffer reallocated to the zstd bound (copying it) per
//! page. Here a column keeps one page buffer for the whole file with room reserved in front for
//! the definition levels, so a value is copied once into its page and a page once by zstd.
//!
//! Only the page encoding is ours. The Parquet schema comes from `ArrowSchemaConverter` and the
//! footer from `ParquetMetaDataWriter`, so files carry the same schema, logical types and
//! `ARROW:schema` as ArrowWriter's. Nested or unusual types, and codecs other than zstd and
//! none, go through ArrowWriter ([`FlatWriter::supports`]).
//!
//! Layout: `PAR1`; per row group, each column chunk in schema order (a dictionary page first
//! when the column is dictionary-encoded, then v1 data pages with PLAIN or PLAIN_DICTIONARY
//! values and the definition levels as one bit-packed run); the footer. A row group's pages are
//! held compressed until the group is complete, as with any writer: a column chunk is one
//! contiguous range of the file. Statistics (min, max, null count) are per column chunk.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::Write;

use arrow::array::{Array, ArrayRef, AsArray, BooleanBufferBuilder};
use arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use parquet::basic::{Compression, Encoding, Type as PhysicalType};
use parquet::data_type::ByteArray;
use parquet::file::metadata::{ColumnChunkMetaData, FileMetaData, KeyValue, ParquetMetaData, ParquetMetaDataWriter, RowGroupMetaData};
use parquet::file::properties::WriterProperties;
use parquet::file::statistics::{Statistics, ValueStatistics};
use parquet::schema::types::{ColumnDescPtr, SchemaDescPtr};

type Result<T> = std::result::Result<T, std::io::Error>;

fn pq_err(e: parquet::errors::ParquetError) -> std::io::Error {
    std::io::Error::other(e)
}

/// A data page ends at this many uncompressed value bytes...
const PAGE_BYTES: usize = 1 << 20;
/// ...or this many rows (ArrowWriter's default too), which also bounds the levels' size.
const PAGE_ROWS: usize = 20_000;
/// Room in front of a page's values for its levels: 4-byte length, run header, one bit per row.
const GAP: usize = 4 + 10 + PAGE_ROWS / 8 + 1;
/// A dictionary larger than this stops growing; the column chunk goes on in PLAIN pages.
const DICT_BYTES: usize = 1 << 20;
/// A row group closes early once this many compressed bytes are held, to bound memory.
const GROUP_BYTES: usize = 16 << 20;
/// Min/max values longer than this are truncated in the statistics (ArrowWriter's default).
const STATS_MAX_LEN: usize = 64;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Bool,
    I32,
    I64,
    F32,
    F64,
    Bytes,
}

impl Kind {
    fn of(dt: &DataType) -> Option<(Kind, PhysicalType)> {
        Some(match dt {
            DataType::Boolean => (Kind::Bool, PhysicalType::BOOLEAN),
            DataType::Int32 | DataType::Date32 => (Kind::I32, PhysicalType::INT32),
            // Seconds are rescaled by ArrowWriter (Parquet has no second unit): left to it.
            DataType::Int64 | DataType::Timestamp(TimeUnit::Millisecond | TimeUnit::Microsecond | TimeUnit::Nanosecond, _) => {
                (Kind::I64, PhysicalType::INT64)
            }
            DataType::Float32 => (Kind::F32, PhysicalType::FLOAT),
            DataType::Float64 => (Kind::F64, PhysicalType::DOUBLE),
            DataType::Utf8 | DataType::Binary => (Kind::Bytes, PhysicalType::BYTE_ARRAY),
            _ => return None,
        })
    }
}

enum Codec {
    None,
    Zstd(zstd::bulk::Compressor<'static>),
}

impl Codec {
    /// The page compressed, in a pooled buffer (returned to the pool once written).
    fn compress(&mut self, data: &[u8]) -> Result<Vec<u8>> {
        match self {
            Codec::None => {
                let mut out = ferry_formats::pool::take(data.len());
                out.extend_from_slice(data);
                Ok(out)
            }
            Codec::Zstd(c) => {
                let mut out = ferry_formats::pool::take(zstd::zstd_safe::compress_bound(data.len()));
                c.compress_to_buffer(data, &mut out)?;
                Ok(out)
            }
        }
    }
}

/// Writes one Parquet file of a flat schema; see the module note.
pub struct FlatWriter<W: Write> {
    out: W,
    pos: u64,
    schema: SchemaRef,
    descr: SchemaDescPtr,
    compression: Compression,
    codec: Codec,
    cols: Vec<Column>,
    row_groups: Vec<RowGroupMetaData>,
    group_rows: usize,
    max_group_rows: usize,
    rows: i64,
}

impl<W: Write> FlatWriter<W> {
    /// Whether this writer can write `schema` with `props`' compression.
    pub fn supports(schema: &SchemaRef, props: &WriterProperties) -> bool {
        let path = parquet::schema::types::ColumnPath::from("");
        matches!(props.compression(&path), Compression::ZSTD(_) | Compression::UNCOMPRESSED)
            && !schema.fields().is_empty()
            && schema.fields().iter().all(|f| Kind::of(f.data_type()).is_some())
    }

    /// Starts a file. Dictionary encoding is taken from `props` per column; compression from
    /// its default (Ferry sets no per-column codec).
    pub fn try_new(mut out: W, schema: SchemaRef, props: &WriterProperties, max_group_rows: usize) -> Result<Self> {
        let descr = std::sync::Arc::new(parquet::arrow::ArrowSchemaConverter::new().convert(&schema).map_err(pq_err)?);
        let mut cols = Vec::with_capacity(schema.fields().len());
        for (f, c) in schema.fields().iter().zip(descr.columns()) {
            let (kind, physical) =
                Kind::of(f.data_type()).ok_or_else(|| std::io::Error::other(format!("column {} is not flat", f.name())))?;
            if c.physical_type() != physical || c.max_rep_level() != 0 {
                return Err(std::io::Error::other(format!("column {}: unexpected Parquet type {}", f.name(), c.physical_type())));
            }
            let dict = kind != Kind::Bool && props.dictionary_enabled(c.path());
            cols.push(Column::new(c.clone(), kind, f.data_type() == &DataType::Utf8, c.max_def_level() > 0, dict));
        }
        let path = parquet::schema::types::ColumnPath::from("");
        let compression = props.compression(&path);
        let codec = match compression {
            Compression::ZSTD(level) => Codec::Zstd(zstd::bulk::Compressor::new(level.compression_level())?),
            _ => Codec::None,
        };
        out.write_all(b"PAR1")?;
        Ok(FlatWriter {
            out,
            pos: 4,
            schema,
            descr,
            compression,
            codec,
            cols,
            row_groups: Vec::new(),
            group_rows: 0,
            max_group_rows: max_group_rows.max(1),
            rows: 0,
        })
    }

    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.schema().fields() != self.schema.fields() {
            return Err(std::io::Error::other(format!("batch schema {:?} is not the file's {:?}", batch.schema(), self.schema)));
        }
        let mut off = 0;
        while off < batch.num_rows() {
            let n = (self.max_group_rows - self.group_rows).min(batch.num_rows() - off);
            for (c, a) in self.cols.iter_mut().zip(batch.columns()) {
                c.write(&a.slice(off, n), &mut self.codec)?;
            }
            self.group_rows += n;
            off += n;
            let held: usize = self.cols.iter().map(|c| c.held).sum();
            if self.group_rows >= self.max_group_rows || held >= GROUP_BYTES {
                self.flush_group()?;
            }
        }
        Ok(())
    }

    fn flush_group(&mut self) -> Result<()> {
        if self.group_rows == 0 {
            return Ok(());
        }
        let start = self.pos;
        let mut metas = Vec::with_capacity(self.cols.len());
        let mut uncompressed = 0;
        for c in &mut self.cols {
            c.flush_page(&mut self.codec)?;
            let meta = c.write_chunk(&mut self.out, &mut self.pos, &mut self.codec, self.compression)?;
            uncompressed += meta.uncompressed_size();
            metas.push(meta);
        }
        let group = RowGroupMetaData::builder(self.descr.clone())
            .set_num_rows(self.group_rows as i64)
            .set_total_byte_size(uncompressed)
            .set_column_metadata(metas)
            .set_file_offset(start as i64)
            .set_ordinal(self.row_groups.len() as i32)
            .build()
            .map_err(pq_err)?;
        self.row_groups.push(group);
        self.rows += self.group_rows as i64;
        self.group_rows = 0;
        Ok(())
    }

    /// Writes the last row group and the footer; returns the sink.
    pub fn into_inner(mut self) -> Result<W> {
        self.flush_group()?;
        let kv = vec![KeyValue::new(parquet::arrow::ARROW_SCHEMA_META_KEY.to_string(), parquet::arrow::encode_arrow_schema(&self.schema))];
        let created_by = format!("ferry version {} (Parquet pages by ferry, footer by parquet-rs)", env!("CARGO_PKG_VERSION"));
        let file = FileMetaData::new(1, self.rows, Some(created_by), Some(kv), self.descr.clone(), None);
        let meta = ParquetMetaData::new(file, std::mem::take(&mut self.row_groups));
        // Into memory first: the footer writer buffers internally and would drop a late write
        // error (a full disk) on the floor, leaving a file without its footer.
        let mut footer = Vec::new();
        ParquetMetaDataWriter::new(&mut footer, &meta).finish().map_err(pq_err)?;
        self.out.write_all(&footer)?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// One column: the page being filled, the finished pages of the row group, chunk statistics.
struct Column {
    descr: ColumnDescPtr,
    kind: Kind,
    /// Strings (as opposed to binary), for truncating statistics at character boundaries.
    utf8: bool,
    nullable: bool,
    /// Whether new column chunks start dictionary-encoded.
    use_dict: bool,
    /// `GAP` bytes kept for the levels, then this page's PLAIN values.
    page: Vec<u8>,
    /// Definition levels of this page (nullable columns), one bit per row: Arrow's bitmaps
    /// and Parquet's bit-packing both put the first value in the least significant bit.
    levels: BooleanBufferBuilder,
    /// Boolean values of this page: PLAIN booleans are bit-packed.
    bools: BooleanBufferBuilder,
    /// Dictionary indices of this page, while the dictionary is in use.
    indices: Vec<u32>,
    dict: Dict,
    dict_on: bool,
    page_rows: usize,
    /// Finished data pages of this row group: (header, compressed body).
    pages: Vec<(Vec<u8>, Vec<u8>)>,
    /// Compressed bytes in `pages`.
    held: usize,
    stats: Stats,
    plain_pages: bool,
    dict_pages: bool,
    uncompressed: i64,
    compressed: i64,
}

impl Column {
    fn new(descr: ColumnDescPtr, kind: Kind, utf8: bool, nullable: bool, use_dict: bool) -> Column {
        Column {
            descr,
            kind,
            utf8,
            nullable,
            use_dict,
            page: {
                let mut page = ferry_formats::pool::take(PAGE_BYTES + GAP + (64 << 10));
                page.resize(GAP, 0);
                page
            },
            levels: BooleanBufferBuilder::new(0),
            bools: BooleanBufferBuilder::new(0),
            indices: Vec::new(),
            dict: Dict::default(),
            dict_on: use_dict,
            page_rows: 0,
            pages: Vec::new(),
            held: 0,
            stats: Stats::default(),
            plain_pages: false,
            dict_pages: false,
            uncompressed: 0,
            compressed: 0,
        }
    }

    fn write(&mut self, a: &ArrayRef, codec: &mut Codec) -> Result<()> {
        let nulls = a.nulls().cloned();
        let valid = |i: usize| nulls.as_ref().is_none_or(|n| n.is_valid(i));
        macro_rules! fixed {
            ($t:ty) => {{
                let d = a.to_data();
                let vals = d.buffer::<$t>(0);
                for i in 0..a.len() {
                    let v = vals[i].to_le_bytes();
                    self.put(valid(i).then_some(&v[..]), codec)?;
                }
            }};
        }
        match self.kind {
            Kind::Bytes => {
                let d = a.to_data();
                let offsets = d.buffer::<i32>(0);
                let data = d.buffers()[1].as_slice();
                for i in 0..a.len() {
                    let v = &data[offsets[i] as usize..offsets[i + 1] as usize];
                    self.put(valid(i).then_some(v), codec)?;
                }
            }
            Kind::I32 => fixed!(i32),
            Kind::I64 => fixed!(i64),
            Kind::F32 => fixed!(f32),
            Kind::F64 => fixed!(f64),
            Kind::Bool => {
                let b = a.as_boolean();
                for i in 0..a.len() {
                    let v = [b.value(i) as u8];
                    self.put(valid(i).then_some(&v[..]), codec)?;
                }
            }
        }
        Ok(())
    }

    /// Adds one row: a value (PLAIN bytes of it, without a length prefix) or a null.
    #[inline]
    fn put(&mut self, v: Option<&[u8]>, codec: &mut Codec) -> Result<()> {
        if let Some(v) = v {
            if matches!(self.kind, Kind::F32 | Kind::F64) && as_f64(self.kind, v).is_nan() {
                self.stats.nans += 1; // every one, dictionary or not
            }
            if self.dict_on {
                match self.dict.index(v, self.kind) {
                    Some((i, new)) => {
                        if new {
                            self.stats.update(self.kind, v);
                        }
                        self.indices.push(i);
                    }
                    None => {
                        // The dictionary is full: finish its page, go on in PLAIN.
                        self.flush_page(codec)?;
                        self.dict_on = false;
                        self.push_plain(v);
                    }
                }
            } else {
                self.push_plain(v);
            }
        } else {
            self.stats.nulls += 1;
        }
        if self.nullable {
            self.levels.append(v.is_some());
        }
        self.page_rows += 1;
        if self.page_rows >= PAGE_ROWS || self.page.len() - GAP + self.bools.as_slice().len() >= PAGE_BYTES {
            self.flush_page(codec)?;
        }
        Ok(())
    }

    #[inline]
    fn push_plain(&mut self, v: &[u8]) {
        self.stats.update(self.kind, v);
        match self.kind {
            Kind::Bool => self.bools.append(v[0] != 0),
            Kind::Bytes => {
                self.page.extend_from_slice(&(v.len() as u32).to_le_bytes());
                self.page.extend_from_slice(v);
            }
            _ => self.page.extend_from_slice(v),
        }
    }

    /// Finishes the current data page: levels into the gap, values after, compressed.
    fn flush_page(&mut self, codec: &mut Codec) -> Result<()> {
        if self.page_rows == 0 {
            return Ok(());
        }
        // A page of nulls only, before any value: PLAIN (no values), so that a column chunk
        // with no values has no empty dictionary page.
        let encoding = if self.dict_on && !self.indices.is_empty() {
            let width = bit_width(self.dict.len.saturating_sub(1) as u32);
            self.page.push(width);
            bit_packed(&self.indices, width, &mut self.page);
            self.indices.clear();
            self.dict_pages = true;
            Encoding::PLAIN_DICTIONARY
        } else {
            if self.kind == Kind::Bool {
                self.page.extend_from_slice(self.bools.as_slice());
                self.bools.truncate(0);
            }
            self.plain_pages = true;
            Encoding::PLAIN
        };
        let start = if self.nullable {
            // <4-byte length><run header: groups of 8, bit-packed><one bit per row>
            let mut run = Vec::with_capacity(10);
            let bits = self.levels.as_slice();
            varint(&mut run, ((bits.len() as u64) << 1) | 1);
            let len = run.len() + bits.len();
            let start = GAP - 4 - len;
            self.page[start..start + 4].copy_from_slice(&(len as u32).to_le_bytes());
            self.page[start + 4..start + 4 + run.len()].copy_from_slice(&run);
            self.page[start + 4 + run.len()..GAP].copy_from_slice(bits);
            self.levels.truncate(0);
            start
        } else {
            GAP
        };
        let raw = &self.page[start..];
        let body = codec.compress(raw)?;
        let mut header = Vec::with_capacity(32);
        page_header(&mut header, 0, raw.len(), body.len(), |h| {
            // DataPageHeader: num_values, encoding, definition and repetition level encodings (RLE).
            h.i32(5, 1, self.page_rows as i32);
            h.i32(5, 2, encoding as i32);
            h.i32(5, 3, Encoding::RLE as i32);
            h.i32(5, 4, Encoding::RLE as i32);
        });
        self.uncompressed += (header.len() + raw.len()) as i64;
        self.compressed += (header.len() + body.len()) as i64;
        self.held += body.len();
        self.stats.values += self.page_rows as i64;
        self.pages.push((header, body));
        self.page.truncate(GAP);
        self.page_rows = 0;
        Ok(())
    }

    /// Writes the column chunk of the row group and starts the next one.
    fn write_chunk(
        &mut self,
        out: &mut impl Write,
        pos: &mut u64,
        codec: &mut Codec,
        compression: Compression,
    ) -> Result<ColumnChunkMetaData> {
        let mut dictionary_page_offset = None;
        if self.dict_pages {
            let raw = &self.dict.plain;
            let body = codec.compress(raw)?;
            let mut header = Vec::with_capacity(32);
            // Dictionary pages are written with the v1 encoding name, as parquet-rs and parquet-mr do.
            page_header(&mut header, 2, raw.len(), body.len(), |h| {
                h.i32(7, 1, self.dict.len as i32);
                h.i32(7, 2, Encoding::PLAIN_DICTIONARY as i32);
            });
            dictionary_page_offset = Some(*pos as i64);
            out.write_all(&header)?;
            out.write_all(&body)?;
            *pos += (header.len() + body.len()) as u64;
            self.uncompressed += (header.len() + raw.len()) as i64;
            self.compressed += (header.len() + body.len()) as i64;
            ferry_formats::pool::give(body);
        }
        let data_page_offset = *pos as i64;
        for (header, body) in self.pages.drain(..) {
            out.write_all(&header)?;
            out.write_all(&body)?;
            *pos += (header.len() + body.len()) as u64;
            ferry_formats::pool::give(body);
        }
        let mut encodings = Vec::new();
        if self.plain_pages {
            encodings.push(Encoding::PLAIN);
        }
        if self.dict_pages {
            encodings.push(Encoding::PLAIN_DICTIONARY);
        }
        encodings.push(Encoding::RLE);
        let meta = ColumnChunkMetaData::builder(self.descr.clone())
            .set_encodings(encodings)
            .set_compression(compression)
            .set_num_values(self.stats.values)
            .set_total_compressed_size(self.compressed)
            .set_total_uncompressed_size(self.uncompressed)
            .set_data_page_offset(data_page_offset)
            .set_dictionary_page_offset(dictionary_page_offset)
            .set_statistics(self.stats.finish(self.kind, self.utf8))
            .build()
            .map_err(pq_err)?;
        // The next row group's chunk starts afresh, dictionary included.
        *self = Column::new(self.descr.clone(), self.kind, self.utf8, self.nullable, self.use_dict);
        Ok(meta)
    }
}

impl Drop for Column {
    fn drop(&mut self) {
        ferry_formats::pool::give(std::mem::take(&mut self.page));
        for (_, body) in self.pages.drain(..) {
            ferry_formats::pool::give(body);
        }
    }
}

/// PageHeader in Thrift compact protocol: type, sizes, then the type's own header as field
/// `sub` (5 = DataPageHeader, 7 = DictionaryPageHeader) written by `fields`.
fn page_header(out: &mut Vec<u8>, page_type: i32, uncompressed: usize, compressed: usize, fields: impl FnOnce(&mut Thrift)) {
    let mut t = Thrift { out, last: vec![0] };
    t.i32(0, 1, page_type);
    t.i32(0, 2, uncompressed as i32);
    t.i32(0, 3, compressed as i32);
    fields(&mut t);
    t.end_struct();
    t.end_struct();
}

/// Just enough of the Thrift compact protocol for page headers: i32 fields and one nested struct.
struct Thrift<'a> {
    out: &'a mut Vec<u8>,
    /// Last field id written at each nesting level.
    last: Vec<i16>,
}

impl Thrift<'_> {
    /// Writes i32 field `id` of the struct at field `parent` of the header (0 = the header itself),
    /// opening that struct on its first field.
    fn i32(&mut self, parent: i16, id: i16, v: i32) {
        if parent != 0 && self.last.len() == 1 {
            self.field(parent, 12);
            self.last.push(0);
        }
        self.field(id, 5);
        varint(self.out, ((v << 1) ^ (v >> 31)) as u32 as u64);
    }

    fn field(&mut self, id: i16, ty: u8) {
        let last = self.last.last_mut().expect("a struct is open");
        let delta = id - *last;
        debug_assert!((1..=15).contains(&delta));
        self.out.push(((delta as u8) << 4) | ty);
        *last = id;
    }

    fn end_struct(&mut self) {
        if self.last.pop().is_some() {
            self.out.push(0);
        }
    }
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Bits needed for values up to `max` (at least 1, so a one-entry dictionary still has a width).
fn bit_width(max: u32) -> u8 {
    (32 - max.leading_zeros()).max(1) as u8
}

/// `values` as one bit-packed run of the RLE/bit-packing hybrid, padded to a multiple of 8.
fn bit_packed(values: &[u32], width: u8, out: &mut Vec<u8>) {
    varint(out, ((values.len().div_ceil(8) as u64) << 1) | 1);
    let (mut acc, mut bits) = (0u64, 0u32);
    let padded = values.len().div_ceil(8) * 8;
    for i in 0..padded {
        acc |= (values.get(i).copied().unwrap_or(0) as u64) << bits;
        bits += width as u32;
        while bits >= 8 {
            out.push(acc as u8);
            acc >>= 8;
            bits -= 8;
        }
    }
}

/// A column chunk's dictionary: value -> index, and the entries PLAIN-encoded (the page).
#[derive(Default)]
struct Dict {
    map: HashMap<Box<[u8]>, u32, BuildHasherDefault<Fx>>,
    plain: Vec<u8>,
    len: usize,
}

impl Dict {
    /// The value's index and whether it is new; `None` once the dictionary is full.
    #[inline]
    fn index(&mut self, v: &[u8], kind: Kind) -> Option<(u32, bool)> {
        if let Some(&i) = self.map.get(v) {
            return Some((i, false));
        }
        if self.plain.len() + v.len() + 4 > DICT_BYTES {
            return None;
        }
        if kind == Kind::Bytes {
            self.plain.extend_from_slice(&(v.len() as u32).to_le_bytes());
        }
        self.plain.extend_from_slice(v);
        let i = self.len as u32;
        self.map.insert(v.into(), i);
        self.len += 1;
        Some((i, true))
    }
}

/// FxHash: dictionary keys are short and not attacker-chosen in a way that matters here (a
/// bad spread only slows one chunk), and SipHash would cost more than the lookup.
#[derive(Default)]
struct Fx(u64);

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(b));
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

impl Fx {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// Min, max and null count of a column chunk, values compared as their Parquet type orders them.
#[derive(Default)]
struct Stats {
    min: Option<Vec<u8>>,
    max: Option<Vec<u8>>,
    nulls: u64,
    /// NaNs, left out of min/max.
    nans: u64,
    /// Rows (levels) written.
    values: i64,
}

impl Stats {
    #[inline]
    fn update(&mut self, kind: Kind, v: &[u8]) {
        if matches!(kind, Kind::F32 | Kind::F64) && as_f64(kind, v).is_nan() {
            return; // counted in `nans` instead (Column::put)
        }
        let less = |a: &[u8], b: &[u8]| match kind {
            Kind::Bool => a[0] < b[0],
            Kind::I32 => i32::from_le_bytes(a.try_into().expect("4")) < i32::from_le_bytes(b.try_into().expect("4")),
            Kind::I64 => i64::from_le_bytes(a.try_into().expect("8")) < i64::from_le_bytes(b.try_into().expect("8")),
            // IEEE 754 total order, which parquet-rs declares for floats: -0.0 < +0.0.
            Kind::F32 | Kind::F64 => as_f64(kind, a).total_cmp(&as_f64(kind, b)).is_lt(),
            Kind::Bytes => a < b,
        };
        match &mut self.min {
            Some(m) if !less(v, m) => {}
            m => set(m, v),
        }
        match &mut self.max {
            Some(m) if !less(m, v) => {}
            m => set(m, v),
        }
    }

    fn finish(&self, kind: Kind, utf8: bool) -> Statistics {
        let nulls = Some(self.nulls);
        let (min, max) = (self.min.as_deref(), self.max.as_deref());
        // The values seen, ordered as IEEE 754 total order (-0.0 < +0.0), which parquet-rs
        // declares for floats.
        let float = |v: Option<&[u8]>| v.map(|v| as_f64(kind, v));
        match kind {
            Kind::Bool => Statistics::boolean(min.map(|v| v[0] != 0), max.map(|v| v[0] != 0), None, nulls, false),
            Kind::I32 => {
                let f = |v: &[u8]| i32::from_le_bytes(v.try_into().expect("4"));
                Statistics::int32(min.map(f), max.map(f), None, nulls, false)
            }
            Kind::I64 => {
                let f = |v: &[u8]| i64::from_le_bytes(v.try_into().expect("8"));
                Statistics::int64(min.map(f), max.map(f), None, nulls, false)
            }
            // parquet-rs declares floats in IEEE 754 total order, under which readers (pyarrow)
            // trust min/max only with the NaN count beside them.
            Kind::F32 => Statistics::Float(
                ValueStatistics::new(float(min).map(|f| f as f32), float(max).map(|f| f as f32), None, nulls, false)
                    .with_nan_count(Some(self.nans)),
            ),
            Kind::F64 => {
                Statistics::Double(ValueStatistics::new(float(min), float(max), None, nulls, false).with_nan_count(Some(self.nans)))
            }
            Kind::Bytes => {
                // Long values are cut, as ArrowWriter does: the min to a prefix (still <= every
                // value), the max to a prefix with its last character or byte incremented.
                let lo = min.map(|v| truncated_min(v, utf8));
                let hi = max.and_then(|v| truncated_max(v, utf8));
                let exact = |v: Option<&[u8]>, t: &Option<Vec<u8>>| v.zip(t.as_ref()).is_some_and(|(v, t)| v.len() == t.len());
                let (min_exact, max_exact) = (exact(min, &lo), exact(max, &hi));
                Statistics::ByteArray(
                    ValueStatistics::new(lo.map(ByteArray::from), hi.map(ByteArray::from), None, nulls, false)
                        .with_min_is_exact(min_exact)
                        .with_max_is_exact(max_exact),
                )
            }
        }
    }
}

/// A prefix of at most `STATS_MAX_LEN` bytes, cut at a character boundary for strings.
fn truncated_min(v: &[u8], utf8: bool) -> Vec<u8> {
    let mut n = v.len().min(STATS_MAX_LEN);
    while utf8 && n < v.len() && n > 0 && v[n] & 0xc0 == 0x80 {
        n -= 1;
    }
    v[..n].to_vec()
}

/// A value of at most `STATS_MAX_LEN` bytes that is >= every value starting like `v`, or none.
fn truncated_max(v: &[u8], utf8: bool) -> Option<Vec<u8>> {
    if v.len() <= STATS_MAX_LEN {
        return Some(v.to_vec());
    }
    if utf8 {
        // UTF-8 orders bytes as code points: a larger last character makes a larger string.
        let mut chars: Vec<char> = std::str::from_utf8(&truncated_min(v, true)).ok()?.chars().collect();
        while let Some(c) = chars.pop() {
            let next = (c as u32 + 1..=char::MAX as u32).find_map(char::from_u32);
            if let Some(next) = next {
                chars.push(next);
                return Some(chars.into_iter().collect::<String>().into_bytes());
            }
        }
        None
    } else {
        let mut b = v[..STATS_MAX_LEN].to_vec();
        while let Some(last) = b.pop() {
            if last < u8::MAX {
                b.push(last + 1);
                return Some(b);
            }
        }
        None
    }
}

fn set(slot: &mut Option<Vec<u8>>, v: &[u8]) {
    let s = slot.get_or_insert_with(Vec::new);
    s.clear();
    s.extend_from_slice(v);
}

fn as_f64(kind: Kind, v: &[u8]) -> f64 {
    match kind {
        Kind::F32 => f32::from_le_bytes(v.try_into().expect("4")) as f64,
        _ => f64::from_le_bytes(v.try_into().expect("8")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{
        BinaryArray, BooleanArray, Date32Array, Float32Array, Float64Array, Int32Array, Int64Array, StringArray, TimestampMillisecondArray,
    };
    use arrow::datatypes::{Field, Schema};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::basic::ZstdLevel;
    use std::sync::Arc;

    fn batch(n: usize, seed: u64) -> RecordBatch {
        let mut x = seed;
        let mut next = move || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            x >> 33
        };
        let mut r: Vec<u64> = (0..n * 8).map(|_| next()).collect();
        let mut take = || r.pop().unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("host", DataType::Utf8, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, Some("+00:00".into())), false),
            Field::new("n", DataType::Int32, true),
            Field::new("d", DataType::Date32, true),
            Field::new("f", DataType::Float32, true),
            Field::new("score", DataType::Float64, true),
            Field::new("ok", DataType::Boolean, true),
            Field::new("blob", DataType::Binary, true),
            Field::new("big", DataType::Int64, false),
            Field::new("none", DataType::Utf8, true),
            Field::new("none_i", DataType::Int64, true),
        ]));
        let rows: Vec<[u64; 8]> = (0..n).map(|_| std::array::from_fn(|_| take())).collect();
        let cols: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| format!("{:x}{}", r[0], "é".repeat((r[1] % 3) as usize))))),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| (r[2] % 7 != 0).then(|| format!("host-{}", r[2] % 5))))),
            Arc::new(TimestampMillisecondArray::from_iter_values(rows.iter().map(|r| r[3] as i64 - (1 << 30))).with_timezone("+00:00")),
            Arc::new(Int32Array::from_iter(rows.iter().map(|r| (r[4] % 4 != 0).then_some((r[4] % 1000) as i32 - 500)))),
            Arc::new(Date32Array::from_iter(rows.iter().map(|r| (r[4] % 5 != 0).then_some((r[5] % 3) as i32 + 20000)))),
            Arc::new(Float32Array::from_iter(rows.iter().map(|r| match r[5] % 9 {
                0 => None,
                1 => Some(f32::NAN),
                2 => Some(-0.0),
                v => Some(v as f32 / 3.0),
            }))),
            Arc::new(Float64Array::from_iter(rows.iter().map(|r| (r[6] % 5 != 0).then_some(r[6] as f64 / 7.0)))),
            Arc::new(BooleanArray::from_iter(rows.iter().map(|r| (r[7] % 3 != 0).then_some(r[7] % 2 == 0)))),
            Arc::new(BinaryArray::from_iter(
                rows.iter().map(|r| (r[0] % 3 != 0).then(|| r[1].to_le_bytes()[..(r[2] % 8) as usize].to_vec())),
            )),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r[3] as i64 * 1_000_000_007))),
            Arc::new(StringArray::from(vec![None::<&str>; n])),
            Arc::new(Int64Array::from(vec![None; n])),
        ];
        RecordBatch::try_new(schema, cols).unwrap()
    }

    fn roundtrip(
        batches: &[RecordBatch],
        props: &WriterProperties,
        group: usize,
    ) -> (Vec<RecordBatch>, parquet::file::metadata::ParquetMetaData) {
        let mut w = FlatWriter::try_new(Vec::new(), batches[0].schema(), props, group).unwrap();
        for b in batches {
            w.write(b).unwrap();
        }
        let bytes = bytes::Bytes::from(w.into_inner().unwrap());
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes).unwrap();
        let meta = reader.metadata().as_ref().clone();
        (reader.with_batch_size(1 << 20).build().unwrap().map(|b| b.unwrap()).collect(), meta)
    }

    #[test]
    fn round_trips_through_the_parquet_reader_with_and_without_dictionaries() {
        let input = vec![batch(30_000, 1), batch(1, 2), batch(17_000, 3)];
        let all = arrow::compute::concat_batches(&input[0].schema(), &input).unwrap();
        for (dict, zstd, group) in [(true, true, 1 << 20), (false, true, 10_000), (true, false, 7)] {
            let props = WriterProperties::builder()
                .set_dictionary_enabled(dict)
                .set_compression(if zstd { Compression::ZSTD(ZstdLevel::try_new(1).unwrap()) } else { Compression::UNCOMPRESSED })
                .build();
            let (out, meta) = roundtrip(&input, &props, group);
            let got = arrow::compute::concat_batches(&out[0].schema(), &out).unwrap();
            assert_eq!(got, all, "dict {dict} zstd {zstd} group {group}");
            assert_eq!(meta.num_row_groups(), all.num_rows().div_ceil(group));
            // Statistics agree with the data.
            let rg = meta.row_group(0);
            let ts = rg.column(2).statistics().unwrap();
            let first = all.column(2).as_primitive::<arrow::datatypes::TimestampMillisecondType>().slice(0, rg.num_rows() as usize);
            assert_eq!(ts.min_bytes_opt().unwrap(), arrow::compute::min(&first).unwrap().to_le_bytes());
            assert_eq!(ts.max_bytes_opt().unwrap(), arrow::compute::max(&first).unwrap().to_le_bytes());
            for (i, c) in rg.columns().iter().enumerate().take(10) {
                let st = c.statistics().unwrap();
                assert!(st.min_bytes_opt().is_some() && st.max_bytes_opt().is_some(), "column {i} has no min/max: {st:?}");
            }
            // Every NaN counted, dictionary or not (column 5 has one value in 9 NaN).
            let f = all.column(5).as_primitive::<arrow::datatypes::Float32Type>().slice(0, rg.num_rows() as usize);
            let nans = f.iter().filter(|v| v.is_some_and(f32::is_nan)).count() as u64;
            assert_eq!(rg.column(5).statistics().unwrap().nan_count_opt(), Some(nans), "dict {dict}");
            // All-null columns: no dictionary page, no min/max, every row counted as null.
            for c in [rg.column(10), rg.column(11)] {
                assert!(c.dictionary_page_offset().is_none());
                assert_eq!(c.statistics().unwrap().null_count_opt(), Some(rg.num_rows() as u64));
                assert!(c.statistics().unwrap().min_bytes_opt().is_none());
            }
            let host = rg.column(1).statistics().unwrap();
            assert_eq!(host.null_count_opt(), Some(all.column(1).slice(0, rg.num_rows() as usize).null_count() as u64));
        }
    }

    #[test]
    fn a_full_dictionary_falls_back_to_plain_pages() {
        // Unique 100-byte strings overflow the 1 MiB dictionary after ~10k values.
        let schema = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8, true)]));
        let col = StringArray::from_iter((0..40_000).map(|i| (i % 11 != 0).then(|| format!("{i:0100}"))));
        let b = RecordBatch::try_new(schema, vec![Arc::new(col)]).unwrap();
        let props = WriterProperties::builder().set_dictionary_enabled(true).build();
        let (out, meta) = roundtrip(std::slice::from_ref(&b), &props, 1 << 20);
        assert_eq!(arrow::compute::concat_batches(&out[0].schema(), &out).unwrap(), b);
        let c = meta.row_group(0).column(0);
        assert!(c.dictionary_page_offset().is_some());
        assert!(c.encodings().any(|e| e == Encoding::PLAIN) && c.encodings().any(|e| e == Encoding::PLAIN_DICTIONARY));
    }

    #[test]
    fn long_min_max_are_truncated_to_bounds() {
        let long = "é".repeat(40); // 80 bytes
        let min = truncated_min(long.as_bytes(), true);
        assert_eq!(min, "é".repeat(32).as_bytes());
        let max = truncated_max(long.as_bytes(), true).unwrap();
        assert!(max.len() <= STATS_MAX_LEN && max.as_slice() > long.as_bytes() && std::str::from_utf8(&max).is_ok());
        assert_eq!(truncated_max(&[0xff; 70], false), None);
        let mut b = vec![1u8; 70];
        b[63] = 0xff;
        assert_eq!(truncated_max(&b, false).unwrap(), [&[1u8; 62][..], &[2]].concat());
        assert_eq!(truncated_max(b"short", true).unwrap(), b"short");
    }

    #[test]
    fn only_flat_schemas_and_zstd_or_none_are_supported() {
        let props = WriterProperties::builder().build();
        let flat = batch(1, 1).schema();
        assert!(FlatWriter::<Vec<u8>>::supports(&flat, &props));
        let snappy = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
        assert!(!FlatWriter::<Vec<u8>>::supports(&flat, &snappy));
        let nested = Arc::new(Schema::new(vec![Field::new("l", DataType::new_list(DataType::Int64, true), true)]));
        assert!(!FlatWriter::<Vec<u8>>::supports(&nested, &props));
        let seconds = Arc::new(Schema::new(vec![Field::new("t", DataType::Timestamp(TimeUnit::Second, None), true)]));
        assert!(!FlatWriter::<Vec<u8>>::supports(&seconds, &props));
    }
}
