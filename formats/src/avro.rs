//! The Avro object container format: the one place Ferry reads and writes its framing.
//!
//! ```text
//! file   = magic "Obj\x01", metadata map (avro.schema, avro.codec, ...), 16-byte sync marker,
//!          then blocks
//! block  = record count (long), byte size (long), that many bytes of (compressed) records,
//!          the sync marker again
//! long   = zigzag, then base-128 varint
//! ```
//!
//! Every length read from a file is checked before anything is allocated for it: a header
//! may claim at most [`MAX_HEADER`] bytes, a block (compressed or decompressed) at most the
//! caller's `limit` (the `max_record_size` setting, itself at most [`MAX_BLOCK`]), and a count
//! or size that is negative or overflows is corrupt input, never a panic or a huge allocation.
//! A decompressed block is produced at most `limit + 1` bytes at a time, so a small
//! "compression bomb" costs what the limit allows and no more. Extract's splitter, the decoder
//! ([`decode`], with the `decode` feature) and the sample generator all use this module.

use std::io::{Read, Write};

#[cfg(feature = "decode")]
pub mod decode;
#[cfg(feature = "decode")]
pub use decode::Avro;

/// The first four bytes of every container file.
pub const MAGIC: &[u8; 4] = b"Obj\x01";
/// Most bytes a header may take (schema and metadata).
pub const MAX_HEADER: usize = 16 << 20;
/// Most bytes any block limit may allow, compressed or decompressed.
pub const MAX_BLOCK: usize = 512 << 20;
/// Most bytes a block header (two longs) takes.
pub const MAX_BLOCK_HEAD: usize = 20;

/// Read past the end of the bytes at hand (or a varint longer than 64 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Short;

/// A position in a slice of Avro binary data; every read is bounds-checked.
#[derive(Debug)]
pub struct Cursor<'a> {
    pub data: &'a [u8],
    pub pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(data: &'a [u8]) -> Cursor<'a> {
        Cursor { data, pos: 0 }
    }

    /// A `long` (also an `int`, a count or a length).
    #[inline]
    pub fn long(&mut self) -> Result<i64, Short> {
        let mut v: u64 = 0;
        let mut shift = 0;
        loop {
            let b = *self.data.get(self.pos).ok_or(Short)?;
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Ok(((v >> 1) as i64) ^ -((v & 1) as i64));
            }
            shift += 7;
            if shift > 63 {
                return Err(Short);
            }
        }
    }

    #[inline]
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], Short> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len()).ok_or(Short)?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// `bytes` or `string`: a length, then that many bytes.
    #[inline]
    pub fn len_prefixed(&mut self) -> Result<&'a [u8], Short> {
        let n = self.long()?;
        if n < 0 {
            return Err(Short);
        }
        self.bytes(n as usize)
    }
}

/// Appends a `long`: zigzag, then a base-128 varint.
pub fn write_long(buf: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        buf.push((z as u8) | 0x80);
        z >>= 7;
    }
    buf.push(z as u8);
}

/// Appends `bytes` or a `string`: the length, then the bytes.
pub fn write_bytes(buf: &mut Vec<u8>, b: &[u8]) {
    write_long(buf, b.len() as i64);
    buf.extend_from_slice(b);
}

/// A block codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Null,
    Deflate,
    Snappy,
    Zstandard,
}

impl Codec {
    pub const ALL: [Codec; 4] = [Codec::Null, Codec::Deflate, Codec::Snappy, Codec::Zstandard];

    /// The name in the `avro.codec` metadata.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Null => "null",
            Codec::Deflate => "deflate",
            Codec::Snappy => "snappy",
            Codec::Zstandard => "zstandard",
        }
    }

    /// A codec this module can decode, by its metadata name (bzip2 and xz are not).
    pub fn parse(name: &str) -> Option<Codec> {
        Codec::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// A container file's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Bytes from the start of the file to the first block.
    pub len: usize,
    pub schema: String,
    /// `avro.codec`, `null` when absent.
    pub codec: String,
    pub sync: [u8; 16],
}

/// What parsing the start of some bytes found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parse<T> {
    Done(T),
    /// More bytes are needed (fewer are at hand than the thing takes).
    More,
    /// Not valid Avro: the reason.
    Corrupt(String),
}

impl Header {
    /// Parses the header at the start of `data`.
    pub fn parse(data: &[u8]) -> Parse<Header> {
        match Header::parse_inner(data) {
            Ok(h) => Parse::Done(h),
            Err(None) => Parse::More,
            Err(Some(m)) => Parse::Corrupt(m),
        }
    }

    fn parse_inner(data: &[u8]) -> Result<Header, Option<String>> {
        if data.len() < 4 {
            return Err(None);
        }
        if &data[..4] != MAGIC {
            return Err(Some("not an Avro object container file (bad magic)".into()));
        }
        let mut c = Cursor { data, pos: 4 };
        let (mut schema, mut codec) = (None, None);
        let short = |_: Short| None;
        let bad = || Some("corrupt Avro header: a negative or oversized count or length".to_string());
        loop {
            let mut count = c.long().map_err(short)?;
            if count == 0 {
                break;
            }
            if count < 0 {
                // A negative count is followed by the block's size in bytes.
                count = count.checked_neg().ok_or_else(bad)?;
                c.long().map_err(short)?;
            }
            for _ in 0..count {
                let mut item = || -> Result<&[u8], Option<String>> {
                    let n = c.long().map_err(short)?;
                    let n = usize::try_from(n).ok().filter(|&n| n <= MAX_HEADER).ok_or_else(bad)?;
                    c.bytes(n).map_err(short)
                };
                let k = item()?;
                let v = item()?;
                match k {
                    b"avro.schema" => schema = Some(String::from_utf8_lossy(v).into_owned()),
                    b"avro.codec" => codec = Some(String::from_utf8_lossy(v).into_owned()),
                    _ => {}
                }
            }
            if c.pos > MAX_HEADER {
                return Err(Some(format!("Avro header longer than {MAX_HEADER} bytes")));
            }
        }
        let sync: [u8; 16] = c.bytes(16).map_err(short)?.try_into().expect("16 bytes");
        let schema = schema.ok_or_else(|| Some("Avro header has no avro.schema".to_string()))?;
        Ok(Header { len: c.pos, schema, codec: codec.unwrap_or_else(|| "null".into()), sync })
    }
}

/// A block's count and size, read from the start of `data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHead {
    pub records: u64,
    /// Bytes of (compressed) records after the head.
    pub size: usize,
    /// Bytes the head itself takes.
    pub len: usize,
}

impl BlockHead {
    /// Block `index` starts at file offset `at` (both for the error message); a block may
    /// take at most `limit` bytes.
    pub fn parse(data: &[u8], index: u64, at: u64, limit: usize) -> Parse<BlockHead> {
        let limit = limit.min(MAX_BLOCK);
        let mut c = Cursor::new(data);
        match (c.long(), c.long()) {
            (Ok(n), Ok(s)) if n >= 0 && s >= 0 && (s as u64) <= limit as u64 => {
                Parse::Done(BlockHead { records: n as u64, size: s as usize, len: c.pos })
            }
            (Ok(_), Ok(s)) => Parse::Corrupt(format!(
                "Avro block {index} at byte {at}: negative record count, or a size of {s} bytes (limit {limit}, max_record_size)"
            )),
            _ if data.len() >= MAX_BLOCK_HEAD => Parse::Corrupt(format!("Avro block {index} at byte {at}: malformed block header")),
            _ => Parse::More,
        }
    }

    /// Bytes of the whole block: head, records, sync marker.
    pub fn total(&self) -> usize {
        self.len + self.size + 16
    }
}

/// Reading a container file failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The bytes are not valid Avro; retrying will not help.
    #[error("{0}")]
    Corrupt(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A container file read block by block through one buffer: extract's splitter and
/// transform's decoder walk files with it. The buffer is refilled in large reads and grows
/// only as bytes arrive, never to a size a (corrupt) length merely claims; a block is handed
/// out as one slice of it, checked (head within the limit, every byte at hand, the sync marker
/// at its end) before anyone looks inside.
#[derive(Debug)]
pub struct Blocks<R> {
    inner: R,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    eof: bool,
    /// File offset of `buf[pos]`, for error messages.
    offset: u64,
    /// Blocks handed out so far.
    index: u64,
    sync: [u8; 16],
    limit: usize,
}

/// One block as it is in the file, checked by [`Blocks::next_block`].
#[derive(Debug)]
pub struct RawBlock<'a> {
    pub records: u64,
    /// The whole block as it is in the file: head, (compressed) records, sync marker.
    pub bytes: &'a [u8],
    /// The (compressed) records.
    pub data: &'a [u8],
    /// Which block of the file it is, from 0, and the file offset it starts at.
    pub index: u64,
    pub offset: u64,
}

impl RawBlock<'_> {
    /// Corrupt input in this block: `what`, with where it is.
    pub fn corrupt(&self, what: &str) -> ReadError {
        ReadError::Corrupt(format!("Avro block {} at byte {}: {what}", self.index, self.offset))
    }
}

impl<R: Read> Blocks<R> {
    /// Reads `inner` through `buf` (its contents are dropped; its capacity is reused, and it
    /// starts at `capacity` bytes). Blocks may take at most `limit` bytes (`max_record_size`).
    pub fn new(inner: R, mut buf: Vec<u8>, capacity: usize, limit: usize) -> Self {
        buf.clear();
        buf.resize(capacity.max(MAX_BLOCK_HEAD), 0);
        Blocks { inner, buf, pos: 0, end: 0, eof: false, offset: 0, index: 0, sync: [0; 16], limit: limit.min(MAX_BLOCK) }
    }

    /// At least `n` bytes from the current position, or fewer only at the end of the file.
    fn ensure(&mut self, n: usize) -> std::io::Result<&[u8]> {
        if self.end - self.pos < n && !self.eof {
            if self.buf.len() - self.pos < n {
                self.buf.copy_within(self.pos..self.end, 0);
                self.end -= self.pos;
                self.pos = 0;
            }
            while self.end - self.pos < n {
                if self.end == self.buf.len() {
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
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(&self.buf[self.pos..self.end])
    }

    fn consume(&mut self, n: usize) {
        self.pos += n;
        self.offset += n as u64;
    }

    /// The file's header (at most [`MAX_HEADER`] bytes) and its raw bytes; the blocks follow.
    /// Call it first, once.
    pub fn header(&mut self) -> Result<(Header, Vec<u8>), ReadError> {
        let mut want = 64 << 10;
        loop {
            let avail = self.ensure(want)?;
            match Header::parse(avail) {
                Parse::Done(h) => {
                    let raw = avail[..h.len].to_vec();
                    self.consume(h.len);
                    self.sync = h.sync;
                    return Ok((h, raw));
                }
                Parse::Corrupt(m) => return Err(ReadError::Corrupt(m)),
                // Longer than what is buffered: read more, unless there is no more.
                Parse::More if avail.len() < want || want > MAX_HEADER => {
                    return Err(ReadError::Corrupt("truncated Avro header".into()));
                }
                Parse::More => want *= 4,
            }
        }
    }

    /// The next block, checked, or `None` at the end of the file. Nothing is decompressed.
    pub fn next_block(&mut self) -> Result<Option<RawBlock<'_>>, ReadError> {
        let (index, offset, limit, sync) = (self.index, self.offset, self.limit, self.sync);
        let corrupt = |what: String| ReadError::Corrupt(format!("Avro block {index} at byte {offset}: {what}"));
        let head = self.ensure(MAX_BLOCK_HEAD)?;
        if head.is_empty() {
            return Ok(None);
        }
        let b = match BlockHead::parse(head, index, offset, limit) {
            Parse::Done(b) => b,
            Parse::Corrupt(m) => return Err(ReadError::Corrupt(m)),
            Parse::More => return Err(corrupt("truncated block header".into())),
        };
        let got = self.ensure(b.total())?.len();
        if got < b.total() {
            return Err(ReadError::Corrupt(format!(
                "truncated Avro block {index} at byte {offset}: the file ends inside it ({got} of {} bytes)",
                b.total()
            )));
        }
        let start = self.pos;
        if self.buf[start + b.len + b.size..start + b.total()] != sync {
            return Err(corrupt("does not end with the file's sync marker".into()));
        }
        self.consume(b.total());
        self.index += 1;
        let bytes = &self.buf[start..start + b.total()];
        Ok(Some(RawBlock { records: b.records, bytes, data: &bytes[b.len..b.len + b.size], index, offset }))
    }

    /// Reads whatever is left after the last block (normally nothing), so that a reader
    /// hashing the input sees every byte.
    pub fn drain(&mut self) -> std::io::Result<()> {
        self.pos = self.end;
        std::io::copy(&mut self.inner, &mut std::io::sink())?;
        Ok(())
    }

    /// The buffer, for reuse (the reader is done with it).
    pub fn take_buffer(&mut self) -> Vec<u8> {
        (self.pos, self.end) = (0, 0);
        std::mem::take(&mut self.buf)
    }
}

/// Decompresses one block's records into `out` (cleared first), at most `limit` bytes: the
/// decoder stops one byte past it, whatever the block would expand to.
pub fn decompress(codec: Codec, data: &[u8], out: &mut Vec<u8>, limit: usize) -> Result<(), String> {
    let limit = limit.min(MAX_BLOCK);
    out.clear();
    match codec {
        Codec::Null => out.extend_from_slice(data),
        Codec::Deflate => {
            flate2::read::DeflateDecoder::new(data).take(limit as u64 + 1).read_to_end(out).map_err(|e| e.to_string())?;
        }
        Codec::Zstandard => {
            zstd::stream::read::Decoder::with_buffer(data)
                .and_then(|d| d.take(limit as u64 + 1).read_to_end(out))
                .map_err(|e| e.to_string())?;
        }
        Codec::Snappy => {
            // Snappy blocks end with the CRC-32 of the uncompressed bytes, big-endian.
            let (body, crc) = data.split_at(data.len().checked_sub(4).ok_or("shorter than its checksum")?);
            let n = snap::raw::decompress_len(body).map_err(|e| e.to_string())?;
            if n > limit {
                return Err(format!("claims {n} bytes uncompressed (limit {limit}, max_record_size)"));
            }
            out.resize(n, 0);
            snap::raw::Decoder::new().decompress(body, out).map_err(|e| e.to_string())?;
            if crc32fast::hash(out) != u32::from_be_bytes(crc.try_into().expect("4 bytes")) {
                return Err("checksum mismatch".into());
            }
        }
    }
    if out.len() > limit {
        return Err(format!("more than {limit} bytes uncompressed (limit max_record_size)"));
    }
    Ok(())
}

fn compress(codec: Codec, block: &[u8]) -> std::io::Result<Vec<u8>> {
    Ok(match codec {
        Codec::Null => block.to_vec(),
        Codec::Deflate => {
            let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(block)?;
            e.finish()?
        }
        Codec::Snappy => {
            let mut d = snap::raw::Encoder::new().compress_vec(block).map_err(std::io::Error::other)?;
            d.extend_from_slice(&crc32fast::hash(block).to_be_bytes());
            d
        }
        Codec::Zstandard => zstd::encode_all(block, 3)?,
    })
}

/// Writes a container file: the header at once, then a block per [`Writer::end_block`].
pub struct Writer<W: Write> {
    out: W,
    codec: Codec,
    sync: [u8; 16],
    block: Vec<u8>,
    records: i64,
}

impl<W: Write> Writer<W> {
    pub fn new(mut out: W, schema: &str, codec: Codec, sync: [u8; 16]) -> std::io::Result<Writer<W>> {
        let mut header = MAGIC.to_vec();
        write_long(&mut header, 2);
        write_bytes(&mut header, b"avro.schema");
        write_bytes(&mut header, schema.as_bytes());
        write_bytes(&mut header, b"avro.codec");
        write_bytes(&mut header, codec.name().as_bytes());
        write_long(&mut header, 0);
        header.extend_from_slice(&sync);
        out.write_all(&header)?;
        Ok(Writer { out, codec, sync, block: Vec::new(), records: 0 })
    }

    /// Appends one record, encoded by `encode` into the block's buffer.
    pub fn record(&mut self, encode: impl FnOnce(&mut Vec<u8>)) {
        encode(&mut self.block);
        self.records += 1;
    }

    /// Records in the block being built.
    pub fn pending(&self) -> i64 {
        self.records
    }

    /// Writes the records so far as one block (nothing if there are none).
    pub fn end_block(&mut self) -> std::io::Result<()> {
        if self.records == 0 {
            return Ok(());
        }
        let data = compress(self.codec, &self.block)?;
        let mut head = Vec::with_capacity(MAX_BLOCK_HEAD);
        write_long(&mut head, self.records);
        write_long(&mut head, data.len() as i64);
        self.out.write_all(&head)?;
        self.out.write_all(&data)?;
        self.out.write_all(&self.sync)?;
        self.block.clear();
        self.records = 0;
        Ok(())
    }

    /// Ends the last block and returns the output.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.end_block()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(codec: Codec, blocks: &[&[&[u8]]]) -> Vec<u8> {
        let schema = r#"{"type":"record","name":"R","fields":[{"name":"s","type":"string"}]}"#;
        let mut w = Writer::new(Vec::new(), schema, codec, [9; 16]).unwrap();
        for b in blocks {
            for r in *b {
                w.record(|buf| write_bytes(buf, r));
            }
            w.end_block().unwrap();
        }
        w.finish().unwrap()
    }

    #[test]
    fn written_files_parse_back_for_every_codec() {
        for codec in Codec::ALL {
            let f = file(codec, &[&[b"a", b"bc"], &[b"def"]]);
            let (h, raw) = Blocks::new(&f[..], Vec::new(), 64, MAX_BLOCK).header().unwrap();
            assert_eq!((h.codec.as_str(), h.sync), (codec.name(), [9; 16]));
            assert_eq!(raw, f[..h.len]);
            let mut at = h.len;
            let mut got = Vec::new();
            let mut out = Vec::new();
            for index in 0.. {
                if at == f.len() {
                    break;
                }
                let Parse::Done(b) = BlockHead::parse(&f[at..], index, at as u64, MAX_BLOCK) else { panic!("block {index}") };
                let data = &f[at + b.len..at + b.len + b.size];
                assert_eq!(&f[at + b.len + b.size..at + b.total()], &[9; 16]);
                decompress(codec, data, &mut out, MAX_BLOCK).unwrap();
                let mut c = Cursor::new(&out);
                for _ in 0..b.records {
                    got.push(c.len_prefixed().unwrap().to_vec());
                }
                at += b.total();
            }
            assert_eq!(got, vec![b"a".to_vec(), b"bc".to_vec(), b"def".to_vec()], "{codec:?}");
        }
    }

    #[test]
    fn blocks_come_whole_and_checked_or_not_at_all() {
        let f = file(Codec::Deflate, &[&[b"a", b"bc"], &[b"def"], &[b"g"]]);
        // A buffer smaller than a block: it grows as bytes arrive.
        let mut blocks = Blocks::new(&f[..], Vec::new(), 1, MAX_BLOCK);
        let (h, _) = blocks.header().unwrap();
        let mut at = h.len;
        let mut seen = Vec::new();
        while let Some(b) = blocks.next_block().unwrap() {
            assert_eq!((b.offset, b.bytes), (at as u64, &f[at..at + b.bytes.len()]));
            assert!(b.bytes.ends_with(&[9; 16]));
            at += b.bytes.len();
            seen.push((b.index, b.records));
        }
        assert_eq!((at, seen), (f.len(), vec![(0, 2), (1, 1), (2, 1)]));
        // Cut inside the last block; its sync marker changed.
        let walk = |bytes: &[u8]| -> Result<u64, ReadError> {
            let mut blocks = Blocks::new(bytes, Vec::new(), 64, MAX_BLOCK);
            blocks.header()?;
            let mut n = 0;
            while blocks.next_block()?.is_some() {
                n += 1;
            }
            Ok(n)
        };
        let e = walk(&f[..f.len() - 3]).unwrap_err().to_string();
        assert!(e.contains("truncated Avro block 2") && e.contains("ends inside it"), "{e}");
        let mut bad = f.clone();
        *bad.last_mut().unwrap() ^= 1;
        let e = walk(&bad).unwrap_err().to_string();
        assert!(e.contains("Avro block 2") && e.contains("sync marker"), "{e}");
        // A block larger than the limit is refused by its head, before its bytes are read.
        let mut blocks = Blocks::new(&f[..], Vec::new(), 64, 4);
        blocks.header().unwrap();
        assert!(blocks.next_block().unwrap_err().to_string().contains("limit"));
    }

    #[test]
    fn lengths_read_from_a_file_are_never_trusted() {
        let f = file(Codec::Null, &[&[b"a"]]);
        // A header entry claiming 2^50 bytes, a negative count, a truncated header, bad magic.
        let mut huge = MAGIC.to_vec();
        write_long(&mut huge, 1);
        write_long(&mut huge, 1 << 50);
        assert!(matches!(Header::parse(&huge), Parse::Corrupt(m) if m.contains("oversized")));
        let mut neg = MAGIC.to_vec();
        write_long(&mut neg, i64::MIN);
        assert!(matches!(Header::parse(&neg), Parse::Corrupt(_) | Parse::More));
        assert!(matches!(Blocks::new(&f[..20], Vec::new(), 64, MAX_BLOCK).header(), Err(ReadError::Corrupt(m)) if m.contains("truncated")));
        assert!(matches!(Header::parse(b"PAR1...."), Parse::Corrupt(m) if m.contains("magic")));
        // Block heads: 2^42 bytes, a negative count, a varint that never ends.
        let mut head = Vec::new();
        write_long(&mut head, 1);
        write_long(&mut head, 1 << 42);
        assert!(matches!(BlockHead::parse(&head, 3, 100, MAX_BLOCK), Parse::Corrupt(m) if m.contains("limit") && m.contains("block 3")));
        let mut head = Vec::new();
        write_long(&mut head, -1);
        write_long(&mut head, 1);
        assert!(matches!(BlockHead::parse(&head, 0, 0, MAX_BLOCK), Parse::Corrupt(_)));
        assert!(matches!(BlockHead::parse(&[0xff; 30], 0, 0, MAX_BLOCK), Parse::Corrupt(_)));
        assert_eq!(BlockHead::parse(&[0x02], 0, 0, MAX_BLOCK), Parse::More);
        // A snappy block that claims more than a block may hold.
        let mut bomb = Vec::new();
        write_long(&mut bomb, (MAX_BLOCK as i64 + 1) << 1); // snappy's length prefix is a plain varint
        bomb.truncate(5);
        bomb.extend_from_slice(&[0, 0, 0, 0]);
        assert!(decompress(Codec::Snappy, &bomb, &mut Vec::new(), MAX_BLOCK).is_err());
        // A deflate and a zstd bomb: a megabyte of zeros stops at the limit, not at its size.
        for codec in [Codec::Deflate, Codec::Zstandard] {
            let packed = compress(codec, &vec![0u8; 1 << 20]).unwrap();
            let mut out = Vec::new();
            let e = decompress(codec, &packed, &mut out, 64 << 10).unwrap_err();
            assert!(e.contains("limit"), "{e}");
            assert!(out.len() <= (64 << 10) + 1, "{codec:?} stopped at {}", out.len());
            decompress(codec, &packed, &mut out, 1 << 20).unwrap();
        }
    }
}
