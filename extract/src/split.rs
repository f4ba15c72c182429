//! Splitting a source file at record boundaries into chunks of at most `chunk_size` bytes
//! (a single record larger than that becomes a chunk of its own).
//!
//! - JSON lines: whole lines.
//! - CSV: whole records (a quoted field may hold newlines), the header repeated in every chunk.
//! - Avro object container files: whole blocks, each chunk the original header (schema, codec,
//!   sync marker) followed by its blocks, so every chunk is a valid Avro file.

use std::io::{BufRead, Read};

/// One chunk's bytes and where its records sit in the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub bytes: Vec<u8>,
    /// Index of the chunk's first record (JSON lines: line; CSV: data record; Avro: record).
    pub first_record: i64,
    pub records: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    /// The file is not valid input; it will never split, so it is quarantined.
    #[error("{0}")]
    Corrupt(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

pub fn split_jsonl(r: impl Read, chunk_size: usize, mut emit: impl FnMut(Piece) -> Result<(), SplitError>) -> Result<(), SplitError> {
    let mut r = std::io::BufReader::with_capacity(1 << 20, r);
    let mut cur = Piece { bytes: Vec::new(), first_record: 0, records: 0 };
    let mut line = Vec::new();
    let mut n = 0i64;
    loop {
        line.clear();
        if r.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        if !cur.bytes.is_empty() && cur.bytes.len() + line.len() > chunk_size {
            emit(std::mem::replace(&mut cur, Piece { bytes: Vec::new(), first_record: n, records: 0 }))?;
        }
        cur.bytes.extend_from_slice(&line);
        cur.records += 1;
        n += 1;
    }
    if cur.records > 0 {
        emit(cur)?;
    }
    Ok(())
}

/// Reads one CSV record's raw bytes (it ends at a newline outside quotes). Empty at EOF.
fn csv_record(r: &mut impl BufRead, out: &mut Vec<u8>) -> std::io::Result<()> {
    out.clear();
    let mut quoted = false;
    loop {
        let start = out.len();
        if r.read_until(b'\n', out)? == 0 {
            return Ok(());
        }
        // A doubled quote inside a quoted field toggles twice, so parity is all that matters.
        quoted ^= out[start..].iter().filter(|&&b| b == b'"').count() % 2 == 1;
        if !quoted {
            return Ok(());
        }
    }
}

pub fn split_csv(r: impl Read, chunk_size: usize, mut emit: impl FnMut(Piece) -> Result<(), SplitError>) -> Result<(), SplitError> {
    let mut r = std::io::BufReader::with_capacity(1 << 20, r);
    let mut header = Vec::new();
    csv_record(&mut r, &mut header)?;
    if header.is_empty() {
        return Err(SplitError::Corrupt("empty CSV file: no header row".into()));
    }
    if !header.ends_with(b"\n") {
        header.push(b'\n');
    }
    let new = |first| Piece { bytes: header.clone(), first_record: first, records: 0 };
    let mut cur = new(0);
    let mut rec = Vec::new();
    let mut n = 0i64;
    loop {
        csv_record(&mut r, &mut rec)?;
        if rec.is_empty() {
            break;
        }
        if cur.records > 0 && cur.bytes.len() + rec.len() > chunk_size {
            emit(std::mem::replace(&mut cur, new(n)))?;
        }
        cur.bytes.extend_from_slice(&rec);
        cur.records += 1;
        n += 1;
    }
    if cur.records > 0 {
        emit(cur)?;
    }
    Ok(())
}

fn read_long(r: &mut impl Read, raw: &mut Vec<u8>) -> std::io::Result<Option<i64>> {
    let mut v: u64 = 0;
    let mut shift = 0;
    loop {
        let mut b = [0u8; 1];
        if r.read(&mut b)? == 0 {
            return if shift == 0 { Ok(None) } else { Err(std::io::ErrorKind::UnexpectedEof.into()) };
        }
        raw.push(b[0]);
        v |= ((b[0] & 0x7f) as u64) << shift;
        if b[0] & 0x80 == 0 {
            return Ok(Some(((v >> 1) as i64) ^ -((v & 1) as i64)));
        }
        shift += 7;
        if shift > 63 {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "varint too long"));
        }
    }
}

fn read_n(r: &mut impl Read, n: i64, raw: &mut Vec<u8>, what: &str, at: u64) -> Result<(), SplitError> {
    if n < 0 {
        return Err(SplitError::Corrupt(format!("negative length {n} in {what} at byte {at}")));
    }
    let start = raw.len();
    raw.resize(start + n as usize, 0);
    r.read_exact(&mut raw[start..]).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => SplitError::Corrupt(format!("truncated {what} at byte {at}: file ends inside it")),
        _ => SplitError::Io(e),
    })
}

pub fn split_avro(r: impl Read, chunk_size: usize, mut emit: impl FnMut(Piece) -> Result<(), SplitError>) -> Result<(), SplitError> {
    let mut r = std::io::BufReader::with_capacity(1 << 20, r);
    let corrupt = |m: String| SplitError::Corrupt(m);
    fn eof(what: &'static str) -> impl Fn(std::io::Error) -> SplitError {
        move |e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => SplitError::Corrupt(format!("truncated Avro {what}")),
            _ => SplitError::Io(e),
        }
    }
    let mut header = Vec::new();
    read_n(&mut r, 4, &mut header, "Avro header", 0)?;
    if &header[..4] != b"Obj\x01" {
        return Err(corrupt("not an Avro object container file (bad magic)".into()));
    }
    let mut has_schema = false;
    loop {
        let at = header.len() as u64;
        let mut count = read_long(&mut r, &mut header).map_err(eof("header"))?.ok_or_else(|| corrupt("truncated Avro header".into()))?;
        if count == 0 {
            break;
        }
        if count < 0 {
            count = -count;
            read_long(&mut r, &mut header).map_err(eof("header"))?;
        }
        for _ in 0..count {
            let klen = read_long(&mut r, &mut header).map_err(eof("header"))?.unwrap_or(-1);
            let kstart = header.len();
            read_n(&mut r, klen, &mut header, "Avro header", at)?;
            has_schema |= &header[kstart..] == b"avro.schema";
            let vlen = read_long(&mut r, &mut header).map_err(eof("header"))?.unwrap_or(-1);
            read_n(&mut r, vlen, &mut header, "Avro header", at)?;
        }
    }
    if !has_schema {
        return Err(corrupt("Avro header has no avro.schema".into()));
    }
    let sync_at = header.len();
    read_n(&mut r, 16, &mut header, "Avro sync marker", sync_at as u64)?;
    let sync: [u8; 16] = header[sync_at..].try_into().expect("16 bytes");

    let mut offset = header.len() as u64;
    let new = |first| Piece { bytes: header.clone(), first_record: first, records: 0 };
    let mut cur = new(0);
    let mut n = 0i64;
    let mut block = Vec::new();
    let mut index = 0;
    loop {
        block.clear();
        let Some(count) = read_long(&mut r, &mut block).map_err(eof("block header"))? else { break };
        let size = read_long(&mut r, &mut block)
            .map_err(eof("block header"))?
            .ok_or_else(|| corrupt(format!("truncated Avro block {index} header at byte {offset}")))?;
        if count < 0 {
            return Err(corrupt(format!("negative record count in Avro block {index} at byte {offset}")));
        }
        read_n(&mut r, size, &mut block, &format!("Avro block {index}"), offset)?;
        let mark = block.len();
        read_n(&mut r, 16, &mut block, &format!("Avro block {index} sync marker"), offset)?;
        if block[mark..] != sync {
            return Err(corrupt(format!("Avro block {index} at byte {offset} does not end with the file's sync marker")));
        }
        if cur.records > 0 && cur.bytes.len() + block.len() > chunk_size {
            emit(std::mem::replace(&mut cur, new(n)))?;
        }
        cur.bytes.extend_from_slice(&block);
        cur.records += count;
        n += count;
        offset += block.len() as u64;
        index += 1;
    }
    if cur.records > 0 {
        emit(cur)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_common::config::Format;
    use ferry_common::sample::{AvroCodec, events, write_events};

    fn pieces(f: impl Fn(&[u8], usize, &mut Vec<Piece>) -> Result<(), SplitError>, data: &[u8], size: usize) -> Vec<Piece> {
        let mut out = Vec::new();
        f(data, size, &mut out).unwrap();
        out
    }

    fn jsonl(d: &[u8], s: usize, o: &mut Vec<Piece>) -> Result<(), SplitError> {
        split_jsonl(d, s, |p| Ok(o.push(p)))
    }
    fn csv_(d: &[u8], s: usize, o: &mut Vec<Piece>) -> Result<(), SplitError> {
        split_csv(d, s, |p| Ok(o.push(p)))
    }
    fn avro(d: &[u8], s: usize, o: &mut Vec<Piece>) -> Result<(), SplitError> {
        split_avro(d, s, |p| Ok(o.push(p)))
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
        let mut data = Vec::new();
        write_events(&mut data, Format::Csv, events(3, 300, 0), AvroCodec::Null, 1).unwrap();
        let p = pieces(csv_, &data, 4096);
        assert!(p.len() > 10);
        let mut total = 0;
        for piece in &p {
            let mut r = csv::Reader::from_reader(&piece.bytes[..]);
            let n = r.records().map(|r| r.unwrap()).count() as i64;
            assert_eq!(n, piece.records);
            assert_eq!(piece.first_record, total);
            total += n;
        }
        assert_eq!(total, 300);
    }

    #[test]
    fn avro_chunks_are_valid_files_and_truncation_is_caught() {
        let mut data = Vec::new();
        write_events(&mut data, Format::Avro, events(3, 1000, 0), AvroCodec::Deflate, 100).unwrap();
        let p = pieces(avro, &data, 20_000);
        assert!(p.len() > 2);
        assert_eq!(p.iter().map(|x| x.records).sum::<i64>(), 1000);
        assert!(p.iter().all(|x| x.bytes.starts_with(b"Obj\x01")));
        let err = split_avro(&data[..data.len() - 5], 20_000, |_| Ok(())).unwrap_err();
        assert!(matches!(err, SplitError::Corrupt(ref m) if m.contains("truncated")), "{err}");
        let err = split_avro(&b"PAR1junk"[..], 20_000, |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("magic"), "{err}");
    }
}
