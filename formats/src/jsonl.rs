//! JSON lines: one record per line.

use std::io::{BufRead, Read};

use crate::{Piece, SplitError};

/// Splits at line ends. A line longer than `max_record` bytes is corrupt input: no length in a
/// file decides how much memory a chunk takes.
pub fn split<E>(
    r: impl Read,
    chunk_size: usize,
    max_record: usize,
    buf: &mut Vec<u8>,
    mut emit: impl FnMut(Piece<'_>) -> Result<(), E>,
) -> Result<(), SplitError<E>> {
    let mut r = std::io::BufReader::with_capacity(1 << 20, r);
    let (mut first, mut records) = (0i64, 0i64);
    let mut n = 0i64;
    // A UTF-8 byte order mark is not part of the first record.
    if r.fill_buf()?.starts_with(b"\xEF\xBB\xBF") {
        r.consume(3);
    }
    loop {
        // Read straight into the piece; a line that does not fit is moved to the next one.
        let start = buf.len();
        if (&mut r).take(max_record as u64 + 1).read_until(b'\n', buf)? == 0 {
            break;
        }
        if buf.len() - start > max_record {
            return Err(SplitError::Corrupt(format!("line {} is longer than max_record_size ({max_record} bytes)", n + 1)));
        }
        if records > 0 && buf.len() > chunk_size {
            emit(Piece { bytes: &buf[..start], first_record: first, records }).map_err(SplitError::Emit)?;
            buf.drain(..start);
            (first, records) = (n, 0);
        }
        records += 1;
        n += 1;
    }
    if records > 0 {
        emit(Piece { bytes: buf, first_record: first, records }).map_err(SplitError::Emit)?;
    }
    Ok(())
}
