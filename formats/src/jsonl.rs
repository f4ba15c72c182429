//! JSON lines: one record per line.

use std::io::{BufRead, Read};

use crate::{Piece, SplitError};

/// Splits at line ends.
pub fn split<E>(r: impl Read, chunk_size: usize, mut emit: impl FnMut(Piece) -> Result<(), E>) -> Result<(), SplitError<E>> {
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
