//! JSON lines: one record per line.

use std::io::{BufRead, Read};

use crate::{Piece, SplitError};

/// Splits at line ends. A line longer than `max_record` bytes is corrupt input: no length in a
/// file decides how much memory a chunk takes.
pub fn split<E>(
    r: impl Read,
    chunk_size: usize,
    max_record: usize,
    mut emit: impl FnMut(Piece) -> Result<(), E>,
) -> Result<(), SplitError<E>> {
    let mut r = std::io::BufReader::with_capacity(1 << 20, r);
    let mut cur = Piece { bytes: Vec::new(), first_record: 0, records: 0 };
    let mut line = Vec::new();
    let mut n = 0i64;
    // A UTF-8 byte order mark is not part of the first record.
    if r.fill_buf()?.starts_with(b"\xEF\xBB\xBF") {
        r.consume(3);
    }
    loop {
        line.clear();
        if (&mut r).take(max_record as u64 + 1).read_until(b'\n', &mut line)? == 0 {
            break;
        }
        if line.len() > max_record {
            return Err(SplitError::Corrupt(format!("line {} is longer than max_record_size ({max_record} bytes)", n + 1)));
        }
        if !cur.bytes.is_empty() && cur.bytes.len() + line.len() > chunk_size {
            emit(std::mem::replace(&mut cur, Piece { bytes: Vec::new(), first_record: n, records: 0 })).map_err(SplitError::Emit)?;
        }
        cur.bytes.extend_from_slice(&line);
        cur.records += 1;
        n += 1;
    }
    if cur.records > 0 {
        emit(cur).map_err(SplitError::Emit)?;
    }
    Ok(())
}
