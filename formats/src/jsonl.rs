//! JSON lines: one record per line.

use std::io::{BufRead, Read};

#[cfg(feature = "decode")]
use crate::decode::{Cell, Decode, Decoded, Decoding, Error, Names, Rows, Sink, Unmatched, json_cell};
use crate::{Cut, Piece, SplitError};

/// Splits at line ends. A line longer than `max_record` bytes is corrupt input: no length in a
/// file decides how much memory a chunk takes.
pub fn split<E>(
    r: impl Read,
    cut: Cut<'_>,
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
        if records > 0 && cut.ends_before(first, start, buf.len()) {
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

/// JSON lines into the table's columns, read one line at a time: a chunk is never held
/// whole, only its longest line. Positions count the lines of the source file.
#[cfg(feature = "decode")]
pub struct Jsonl;

#[cfg(feature = "decode")]
impl Decode for Jsonl {
    fn self_describing(&self) -> bool {
        false
    }

    fn decode(&self, r: &mut dyn BufRead, how: &Decoding<'_>, sink: &mut Sink<'_>) -> Result<Decoded, Error> {
        use std::borrow::Cow;
        let (specs, names_rule, first_line) = (how.columns, how.names, how.first_record);
        let mut rows = Rows::new(specs, how.batch_size, how.max_bad, sink);
        let names: std::collections::HashSet<String> =
            specs.iter().map(|c| if names_rule == Names::AnyCase { c.name.to_ascii_lowercase() } else { c.name.clone() }).collect();
        let mut unmatched = Unmatched::default();
        let mut buf = Vec::new();
        for i in 0.. {
            buf.clear();
            if r.read_until(b'\n', &mut buf).map_err(|e| Error::io(how.path, e))? == 0 {
                break;
            }
            let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            // A UTF-8 byte order mark is not part of the first record.
            let line = if i == 0 && first_line == 0 { line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line) } else { line };
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let pos = || format!("line {}", first_line + i as i64 + 1);
            type Obj<'r> = std::collections::HashMap<Cow<'r, str>, &'r serde_json::value::RawValue>;
            match serde_json::from_slice::<Obj<'_>>(line) {
                Ok(mut obj) => {
                    if names_rule == Names::AnyCase {
                        obj = obj.into_iter().map(|(k, v)| (Cow::Owned(k.to_ascii_lowercase()), v)).collect();
                    }
                    for k in obj.keys() {
                        if !names.contains(k.as_ref()) {
                            unmatched.note(k);
                        }
                    }
                    let cells: Result<Vec<Cell<'_>>, String> = specs
                        .iter()
                        .map(|c| {
                            let v = if names_rule == Names::AnyCase {
                                obj.get(c.name.to_ascii_lowercase().as_str())
                            } else {
                                obj.get(c.name.as_str())
                            };
                            json_cell(v.copied())
                        })
                        .collect();
                    match cells {
                        Ok(cells) => rows.add(cells, pos)?,
                        Err(why) => rows.reject(pos(), why)?,
                    }
                }
                Err(e) => rows.reject(pos(), format!("invalid JSON object: {e}"))?,
            }
        }
        let note = unmatched.report("JSON");
        Ok(Decoded { rejects: rows.finish()?, notes: note.into_iter().collect() })
    }
}
