//! Where a file's records begin and end: chunks of whole records, for every format.

use std::io::Read;

use crate::spec::Format;
use crate::{avro, csv, jsonl};

/// One chunk's bytes and where its records sit in the source. The bytes are the splitter's
/// buffer, which the next chunk reuses: copy them to keep them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece<'a> {
    pub bytes: &'a [u8],
    /// Index of the chunk's first record (JSON lines: line; CSV: data record; Avro: record).
    pub first_record: i64,
    pub records: i64,
}

/// Where a split ends its pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut<'a> {
    /// At the last record boundary within this many bytes (a record larger than that is a
    /// piece of its own).
    Size(usize),
    /// As an earlier split of the same bytes cut them: each piece as (its first record, its
    /// length in bytes), ascending. Whatever the chunk size is today, each piece ends once it
    /// is as long as it was (so an Avro block with no records goes where it went before).
    Recorded(&'a [(i64, i64)]),
}

impl Cut<'_> {
    /// Whether the piece being cut, which begins at record `first` and is `len` bytes long so
    /// far (not empty), ends before the next record or block, which would make it `with_next`
    /// bytes long.
    pub(crate) fn ends_before(self, first: i64, len: usize, with_next: usize) -> bool {
        match self {
            Cut::Size(max) => with_next > max,
            Cut::Recorded(pieces) => pieces.binary_search_by_key(&first, |p| p.0).is_ok_and(|k| len as i64 >= pieces[k].1),
        }
    }

    /// The piece size a buffer is sized for.
    pub fn size_hint(self) -> usize {
        match self {
            Cut::Size(max) => max,
            Cut::Recorded(_) => 1 << 20,
        }
    }
}

/// Why a file could not be split. `E` is what the caller's `emit` failed with (writing the
/// chunk to a store): it comes back unchanged, so its class (retry or not) is kept.
#[derive(Debug, thiserror::Error)]
pub enum SplitError<E> {
    /// The file is not valid input; it will never split, so it is quarantined.
    #[error("{0}")]
    Corrupt(String),
    /// Reading the source failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Handing a piece on failed.
    #[error(transparent)]
    Emit(E),
}

impl<E> From<avro::ReadError> for SplitError<E> {
    fn from(e: avro::ReadError) -> Self {
        match e {
            avro::ReadError::Corrupt(m) => SplitError::Corrupt(m),
            avro::ReadError::Io(e) => SplitError::Io(e),
        }
    }
}

/// The compression a file's first bytes show (gzip, zstd, bzip2, xz, zip), if any. An Avro
/// container starts with `Obj\x01`; JSON lines and CSV start with text.
pub fn compression_of(head: &[u8]) -> Option<&'static str> {
    const MAGIC: [(&[u8], &str); 4] =
        [(b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"\xfd7zXZ\x00", "xz"), (b"PK\x03\x04", "zip")];
    // bzip2: "BZh", the block size digit, then the block magic (pi): not a CSV header by chance.
    if head.len() >= 10 && head.starts_with(b"BZh") && head[3].is_ascii_digit() && &head[4..10] == b"\x31\x41\x59\x26\x53\x59" {
        return Some("bzip2");
    }
    MAGIC.iter().find(|(m, _)| head.starts_with(m)).map(|(_, kind)| *kind)
}

/// Splits `r` in `format` into pieces where `cut` says (at most `chunk_size` bytes each, or
/// where an earlier split cut them), handing each to `emit`.
/// A JSON line, CSV record or Avro block longer than `max_record` is corrupt input.
///
/// Pieces are built in `buf`, which is cleared first and reused for every piece: a caller
/// that splits many files with one buffer touches no new memory after the first chunk (fresh
/// pages cost a page fault and a zeroing each, a quarter of extract's time once).
pub fn split<E>(
    format: Format,
    r: impl Read,
    cut: Cut<'_>,
    max_record: usize,
    dialect: &crate::spec::CsvOptions,
    buf: &mut Vec<u8>,
    emit: impl FnMut(Piece<'_>) -> Result<(), E>,
) -> Result<(), SplitError<E>> {
    buf.clear();
    match format {
        Format::Jsonl => jsonl::split(r, cut, max_record, buf, emit),
        Format::Csv => csv::split(r, cut, max_record, dialect, buf, emit),
        Format::Avro => avro_split(r, cut, max_record, buf, emit),
    }
}

/// Avro: whole blocks under the original header. Every size is checked against the limits of
/// [`avro`] before it is read, so a corrupt length fails as corrupt input, not as an allocation.
fn avro_split<E>(
    r: impl Read,
    cut: Cut<'_>,
    max_block: usize,
    buf: &mut Vec<u8>,
    mut emit: impl FnMut(Piece<'_>) -> Result<(), E>,
) -> Result<(), SplitError<E>> {
    // The reader's buffer is its own: `buf` holds the piece being cut.
    let mut blocks = avro::Blocks::new(r, Vec::new(), 1 << 20, max_block);
    let (h, raw) = blocks.header()?;
    // Every piece starts with the file's header; `buf` keeps it in front between pieces.
    buf.extend_from_slice(&raw);
    let header = h.len;
    let (mut first, mut records) = (0i64, 0i64);
    let mut n = 0i64;
    while let Some(block) = blocks.next_block()? {
        if records > 0 && cut.ends_before(first, buf.len(), buf.len() + block.bytes.len()) {
            emit(Piece { bytes: buf, first_record: first, records }).map_err(SplitError::Emit)?;
            buf.truncate(header);
            (first, records) = (n, 0);
        }
        buf.extend_from_slice(block.bytes);
        let count = block.records as i64;
        records += count;
        n += count;
    }
    if records > 0 {
        emit(Piece { bytes: buf, first_record: first, records }).map_err(SplitError::Emit)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn avro_file(blocks: &[usize]) -> Vec<u8> {
        let schema = r#"{"type":"record","name":"R","fields":[{"name":"n","type":"long"}]}"#;
        let mut w = avro::Writer::new(Vec::new(), schema, avro::Codec::Deflate, [3; 16]).unwrap();
        let mut i = 0;
        for &records in blocks {
            for _ in 0..records {
                w.record(|b| avro::write_long(b, i));
                i += 1;
            }
            w.end_block().unwrap();
        }
        w.finish().unwrap()
    }

    fn csv_file(records: usize) -> Vec<u8> {
        let mut out = b"id,text\n".to_vec();
        for i in 0..records {
            // Quoted fields with commas, doubled quotes and newlines.
            out.extend_from_slice(format!("{i},\"line one, \"\"quoted\"\"\nline two {i}\"\n").as_bytes());
        }
        out
    }

    /// A piece, copied out of the splitter's buffer.
    #[derive(Debug, PartialEq, Eq)]
    struct Owned {
        bytes: Vec<u8>,
        first_record: i64,
        records: i64,
    }

    fn keep(o: &mut Vec<Owned>, p: Piece<'_>) -> Result<(), &'static str> {
        o.push(Owned { bytes: p.bytes.to_vec(), first_record: p.first_record, records: p.records });
        Ok(())
    }

    fn pieces(f: impl Fn(&[u8], usize, &mut Vec<Owned>) -> Result<(), SplitError<&'static str>>, data: &[u8], size: usize) -> Vec<Owned> {
        let mut out = Vec::new();
        f(data, size, &mut out).unwrap();
        out
    }

    fn jsonl(d: &[u8], s: usize, o: &mut Vec<Owned>) -> Result<(), SplitError<&'static str>> {
        split(Format::Jsonl, d, Cut::Size(s), 1 << 20, &Default::default(), &mut Vec::new(), |p| keep(o, p))
    }
    fn csv_(d: &[u8], s: usize, o: &mut Vec<Owned>) -> Result<(), SplitError<&'static str>> {
        split(Format::Csv, d, Cut::Size(s), 1 << 20, &Default::default(), &mut Vec::new(), |p| keep(o, p))
    }
    fn avro_(d: &[u8], s: usize, o: &mut Vec<Owned>) -> Result<(), SplitError<&'static str>> {
        split(Format::Avro, d, Cut::Size(s), 1 << 20, &Default::default(), &mut Vec::new(), |p| keep(o, p))
    }

    /// A split cut again before the first records of an earlier split gives the same pieces,
    /// byte for byte (a revert stages them so, whatever the chunk size is by then).
    #[test]
    fn a_split_cut_where_an_earlier_one_was_gives_the_same_pieces() {
        let jsonl_data: Vec<u8> =
            (0..300).flat_map(|i| format!("{{\"a\":{i},\"pad\":\"{}\"}}\n", "x".repeat(i % 37)).into_bytes()).collect();
        let cases: [(Format, Vec<u8>); 3] = [
            (Format::Jsonl, jsonl_data),
            (Format::Csv, csv_file(300)),
            (Format::Avro, avro_file(&[40, 40, 0, 40, 0, 0, 40, 40, 40, 0, 40, 40, 40, 40, 0, 40, 40, 40, 40, 40, 40, 40, 0, 40, 40])),
        ];
        for (format, data) in cases {
            let cut = |cut: Cut<'_>| {
                let mut out = Vec::new();
                split::<&str>(format, &data[..], cut, 1 << 20, &Default::default(), &mut Vec::new(), |p| keep(&mut out, p)).unwrap();
                out
            };
            let first = cut(Cut::Size(200));
            assert!(first.len() > 3, "{format:?}: {} pieces", first.len());
            let recorded: Vec<(i64, i64)> = first.iter().map(|p| (p.first_record, p.bytes.len() as i64)).collect();
            assert_eq!(cut(Cut::Recorded(&recorded)), first, "{format:?} cut again");
        }
    }

    #[test]
    fn jsonl_chunks_are_whole_lines() {
        let data = b"{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n";
        let p = pieces(jsonl, data, 16);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].bytes, b"{\"a\":1}\n{\"a\":2}\n");
        assert_eq!((p[1].first_record, p[1].records), (2, 1));
    }

    #[test]
    fn csv_keeps_quoted_newlines_and_repeats_header() {
        let data = csv_file(300);
        let p = pieces(csv_, &data, 1000);
        assert!(p.len() > 10);
        let mut total = 0;
        for piece in &p {
            let mut r = ::csv::Reader::from_reader(&piece.bytes[..]);
            let mut n = 0;
            for rec in r.records() {
                rec.unwrap(); // every piece parses as CSV on its own
                n += 1;
            }
            assert_eq!(n, piece.records);
            assert_eq!(piece.first_record, total);
            total += n;
        }
        assert_eq!(total, 300);
    }

    #[test]
    fn avro_chunks_are_valid_files_and_truncation_is_caught() {
        let data = avro_file(&[100; 10]);
        let p = pieces(avro_, &data, 300);
        assert!(p.len() > 2);
        assert_eq!(p.iter().map(|x| x.records).sum::<i64>(), 1000);
        assert!(p.iter().all(|x| x.bytes.starts_with(b"Obj\x01")));
        let err =
            split::<&str>(Format::Avro, &data[..data.len() - 5], Cut::Size(20_000), 1 << 20, &Default::default(), &mut Vec::new(), |_| {
                Ok(())
            })
            .unwrap_err();
        assert!(matches!(err, SplitError::Corrupt(ref m) if m.contains("truncated")), "{err}");
        let err =
            split::<&str>(Format::Avro, &b"PAR1junk"[..], Cut::Size(20_000), 1 << 20, &Default::default(), &mut Vec::new(), |_| Ok(()))
                .unwrap_err();
        assert!(err.to_string().contains("magic"), "{err}");
    }

    #[test]
    fn a_corrupt_avro_length_is_corrupt_input_not_an_allocation() {
        // A 137-byte-class file: a valid header, then a block claiming 2^50 bytes.
        let data = avro_file(&[1]);
        let (h, _) = avro::Blocks::new(&data[..], Vec::new(), 64, avro::MAX_BLOCK).header().unwrap();
        let mut bad = data[..h.len].to_vec();
        avro::write_long(&mut bad, 1);
        avro::write_long(&mut bad, 1 << 50);
        bad.extend_from_slice(&[0; 8]);
        let err = split::<&str>(Format::Avro, &bad[..], Cut::Size(1 << 20), 1 << 20, &Default::default(), &mut Vec::new(), |_| Ok(()))
            .unwrap_err();
        assert!(matches!(err, SplitError::Corrupt(ref m) if m.contains("limit")), "{err}");
        // Within the limit but beyond the file: truncated, and read only as far as the file goes.
        let mut short = data[..h.len].to_vec();
        avro::write_long(&mut short, 1);
        avro::write_long(&mut short, 100 << 20);
        let err = split::<&str>(Format::Avro, &short[..], Cut::Size(1 << 20), 256 << 20, &Default::default(), &mut Vec::new(), |_| Ok(()))
            .unwrap_err();
        assert!(matches!(err, SplitError::Corrupt(ref m) if m.contains("truncated")), "{err}");
    }

    #[test]
    fn a_failed_emit_comes_back_as_itself() {
        let err =
            split(Format::Jsonl, &b"{}\n{}\n"[..], Cut::Size(1), 1 << 20, &Default::default(), &mut Vec::new(), |_| Err("store down"))
                .unwrap_err();
        assert!(matches!(err, SplitError::Emit("store down")), "{err:?}");
    }
}
