//! CSV: records end at a newline outside quotes; the header row is repeated in every chunk.

use std::io::{BufRead, Read};

use crate::{Piece, SplitError};

/// Reads one CSV record's raw bytes (it ends at a newline outside quotes). Empty at EOF.
pub fn read_record(r: &mut impl BufRead, out: &mut Vec<u8>) -> std::io::Result<()> {
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

/// Splits at record ends, repeating the header.
pub fn split<E>(r: impl Read, chunk_size: usize, mut emit: impl FnMut(Piece) -> Result<(), E>) -> Result<(), SplitError<E>> {
    let mut r = std::io::BufReader::with_capacity(1 << 20, r);
    let mut header = Vec::new();
    read_record(&mut r, &mut header)?;
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
        read_record(&mut r, &mut rec)?;
        if rec.is_empty() {
            break;
        }
        if cur.records > 0 && cur.bytes.len() + rec.len() > chunk_size {
            emit(std::mem::replace(&mut cur, new(n))).map_err(SplitError::Emit)?;
        }
        cur.bytes.extend_from_slice(&rec);
        cur.records += 1;
        n += 1;
    }
    if cur.records > 0 {
        emit(cur).map_err(SplitError::Emit)?;
    }
    Ok(())
}
