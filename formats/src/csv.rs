//! CSV: records end where a CSV parser says they end (csv-core, the parser under the `csv`
//! crate transform decodes with, with the same settings), so a quote inside an unquoted field
//! or a newline inside a quoted one frames exactly as transform reads it. The header row is
//! repeated in every chunk.

use std::io::{BufRead, Read};

use crate::spec::CsvOptions;

#[cfg(feature = "decode")]
use crate::decode::{Cell, Decode, Decoded, Decoding, Error, Rows, Sink, Unmatched};
#[cfg(feature = "decode")]
use crate::spec::ColumnType;
use crate::{Cut, Piece, SplitError};

/// Reads one CSV record's raw bytes (with its line end) into `out`, at most `max` bytes of
/// it. Empty at EOF. A record longer than `max` (an unclosed quote swallows the file) is
/// corrupt input.
pub fn read_record(r: &mut impl BufRead, out: &mut Vec<u8>, max: usize, dialect: &CsvOptions) -> Result<(), RecordError> {
    use csv_core::ReadRecordResult as R;
    out.clear();
    let mut rdr = csv_core::ReaderBuilder::new().delimiter(dialect.delimiter.0).quote(dialect.quote.0).build();
    // The parser's field output is not needed, only where the record ends.
    let (mut field, mut ends) = ([0u8; 4096], [0usize; 256]);
    loop {
        let buf = r.fill_buf()?;
        let (res, nin, _, _) = rdr.read_record(buf, &mut field, &mut ends);
        out.extend_from_slice(&buf[..nin]);
        let at_eof = buf.is_empty();
        r.consume(nin);
        if out.len() > max {
            return Err(RecordError::TooLong(out.len()));
        }
        match res {
            R::InputEmpty if !at_eof => {}
            R::OutputFull | R::OutputEndsFull => {}
            R::Record => {
                // Blank lines before a record belong to no record; readers skip them too.
                return Ok(());
            }
            R::InputEmpty | R::End => return Ok(()),
        }
    }
}

/// Why one record could not be read.
#[derive(Debug)]
pub enum RecordError {
    TooLong(usize),
    Io(std::io::Error),
}

impl From<std::io::Error> for RecordError {
    fn from(e: std::io::Error) -> Self {
        RecordError::Io(e)
    }
}

impl<E> From<RecordError> for SplitError<E> {
    fn from(e: RecordError) -> Self {
        match e {
            RecordError::TooLong(n) => {
                SplitError::Corrupt(format!("a CSV record of over {n} bytes, more than max_record_size (an unclosed quote?)"))
            }
            RecordError::Io(e) => SplitError::Io(e),
        }
    }
}

/// Splits at record ends, repeating the header (if the dialect has one) in every chunk.
pub fn split<E>(
    r: impl Read,
    cut: Cut<'_>,
    max_record: usize,
    dialect: &CsvOptions,
    buf: &mut Vec<u8>,
    mut emit: impl FnMut(Piece<'_>) -> Result<(), E>,
) -> Result<(), SplitError<E>> {
    let mut r = std::io::BufReader::with_capacity(1 << 20, r);
    if dialect.has_header {
        read_record(&mut r, buf, max_record, dialect)?;
        if buf.iter().all(u8::is_ascii_whitespace) {
            return Err(SplitError::Corrupt("empty CSV file: no header row".into()));
        }
        if !buf.ends_with(b"\n") {
            buf.push(b'\n');
        }
    }
    // Every piece starts with the header; `buf` keeps it in front between pieces.
    let header = buf.len();
    let (mut first, mut records) = (0i64, 0i64);
    let mut rec = Vec::new();
    let mut n = 0i64;
    loop {
        read_record(&mut r, &mut rec, max_record, dialect)?;
        if rec.is_empty() {
            break;
        }
        if rec.iter().all(u8::is_ascii_whitespace) {
            continue; // a trailing blank line is not a record
        }
        if !rec.ends_with(b"\n") {
            rec.push(b'\n'); // the last record without its line end: the next chunk's header follows
        }
        if records > 0 && cut.ends_before(first, buf.len(), buf.len() + rec.len()) {
            emit(Piece { bytes: buf, first_record: first, records }).map_err(SplitError::Emit)?;
            buf.truncate(header);
            (first, records) = (n, 0);
        }
        buf.extend_from_slice(&rec);
        records += 1;
        n += 1;
    }
    if records > 0 {
        emit(Piece { bytes: buf, first_record: first, records }).map_err(SplitError::Emit)?;
    }
    Ok(())
}

/// CSV into the table's columns. With a header, columns are found by name; without one,
/// fields fill the columns in order. Positions count the data records of the source file.
#[cfg(feature = "decode")]
pub struct Csv;

#[cfg(feature = "decode")]
impl Decode for Csv {
    fn self_describing(&self) -> bool {
        false
    }

    fn decode(&self, input: &mut dyn BufRead, how: &Decoding<'_>, sink: &mut Sink<'_>) -> Result<Decoded, Error> {
        use std::borrow::Cow;
        let (specs, names_rule, dialect) = (how.columns, how.names, how.csv);
        // Whole: a chunk is at most chunk_size bytes, and the csv reader then meets no I/O error.
        let mut data = Vec::with_capacity(how.size_hint);
        input.read_to_end(&mut data).map_err(|e| Error::io(how.path, e))?;
        let mut rows = Rows::new(specs, how.batch_size, how.max_bad, sink);
        let mut notes = Vec::new();
        let data = data.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&data);
        let mut r = ::csv::ReaderBuilder::new()
            .flexible(true)
            .delimiter(dialect.delimiter.0)
            .quote(dialect.quote.0)
            .has_headers(dialect.has_header)
            .from_reader(data);
        let (index, fields): (Vec<usize>, usize) = if dialect.has_header {
            let header = r.headers().map_err(|e| Error::BadInput(format!("CSV header: {e}")))?.clone();
            let mut index = Vec::with_capacity(specs.len());
            for f in specs {
                match header.iter().position(|h| names_rule.matches(h, &f.name)) {
                    Some(i) => index.push(i),
                    None if f.nullable => index.push(usize::MAX),
                    None => {
                        return Err(Error::BadInput(format!("CSV header has no column {:?}", f.name)));
                    }
                }
            }
            if !specs.is_empty() && index.iter().all(|&i| i == usize::MAX) {
                let got: Vec<&str> = header.iter().take(10).collect();
                return Err(Error::BadInput(format!(
                    "the CSV header matches none of the table's columns (it has {got:?}); is this the right file, and does it have a header? (source.csv.has_header)"
                )));
            }
            let mut unmatched = Unmatched::default();
            for h in header.iter().filter(|h| !specs.iter().any(|c| names_rule.matches(h, &c.name))) {
                unmatched.note(h);
            }
            notes.extend(unmatched.report("CSV header"));
            let absent: Vec<&str> = specs.iter().zip(&index).filter(|(_, i)| **i == usize::MAX).map(|(c, _)| c.name.as_str()).collect();
            if !absent.is_empty() {
                notes.push(format!("columns that are not in the CSV header are null: {absent:?}"));
            }
            (index, header.len())
        } else {
            ((0..specs.len()).collect(), specs.len())
        };
        let null = dialect.null_value.as_deref();
        let mut rec = ::csv::StringRecord::new();
        let mut n = how.first_record;
        loop {
            n += 1;
            match r.read_record(&mut rec) {
                Ok(false) => break,
                Ok(true) if rec.len() != fields => {
                    let why = if dialect.has_header {
                        format!("{} fields, the header has {fields}", rec.len())
                    } else {
                        format!("{} fields, the table has {fields} columns", rec.len())
                    };
                    rows.reject(format!("record {n}"), why)?;
                }
                Ok(true) => {
                    let cells = index
                        .iter()
                        .zip(specs)
                        .map(|(&i, f)| match (rec.get(i), null) {
                            (Some(s), Some(null)) if s == null => Cell::Null,
                            // Without a null_value, an empty field is a null, except in a string column.
                            (Some(""), None) if f.ty != ColumnType::String => Cell::Null,
                            (Some(s), _) => Cell::Str(Cow::Borrowed(s)),
                            (None, _) => Cell::Null,
                        })
                        .collect();
                    let line = rec.position().map(|p| p.line()).unwrap_or(0);
                    rows.add(cells, || format!("record {n} (line {line} of the chunk)"))?;
                }
                Err(e) => rows.reject(format!("record {n}"), format!("invalid CSV: {e}"))?,
            }
        }
        Ok(Decoded { rejects: rows.finish()?, notes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(data: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        split(data, Cut::Size(1), 1 << 20, &CsvOptions::default(), &mut Vec::new(), |p: Piece| -> Result<(), ()> {
            out.push(String::from_utf8(p.bytes.to_vec()).unwrap());
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn records_end_where_the_csv_parser_says() {
        // A stray quote inside an unquoted field is a character, not the start of a quote.
        let got = records(b"a,b\n1,x\"y\n2,z\n3,\"multi\nline\"\n");
        assert_eq!(got, ["a,b\n1,x\"y\n", "a,b\n2,z\n", "a,b\n3,\"multi\nline\"\n"]);
        // CRLF line ends and a last record without one.
        let got = records(b"a,b\r\n1,2\r\n3,4");
        assert_eq!(got.len(), 2, "{got:?}");
        // The csv crate (transform's reader) reads the same records from the chunks.
        for chunk in records(b"a,b\n1,x\"y\n\"q,\"\"uoted\",2\n") {
            let mut r = ::csv::ReaderBuilder::new().from_reader(chunk.as_bytes());
            assert_eq!(r.records().count(), 1, "{chunk:?}");
        }
    }

    #[test]
    fn another_dialect_frames_by_its_own_quote_and_may_have_no_header() {
        let d = CsvOptions {
            delimiter: crate::spec::AsciiChar(b';'),
            quote: crate::spec::AsciiChar(b'\''),
            has_header: false,
            null_value: None,
        };
        let mut out = Vec::new();
        split(&b"1;'two\nlines'\n2;\"x\n3;y\n"[..], Cut::Size(1), 1 << 20, &d, &mut Vec::new(), |p: Piece| -> Result<(), ()> {
            out.push(String::from_utf8(p.bytes.to_vec()).unwrap());
            Ok(())
        })
        .unwrap();
        assert_eq!(out, ["1;'two\nlines'\n", "2;\"x\n", "3;y\n"], "no header repeated; \" is a character here");
    }

    #[test]
    fn an_unclosed_quote_is_corrupt_input_not_one_huge_record() {
        let mut data = b"a,b\n1,\"never closed\n".to_vec();
        data.extend(std::iter::repeat_n(b'x', 10_000));
        let e =
            split(&data[..], Cut::Size(1 << 20), 4096, &CsvOptions::default(), &mut Vec::new(), |_p: Piece| -> Result<(), ()> { Ok(()) })
                .unwrap_err();
        assert!(matches!(&e, SplitError::Corrupt(m) if m.contains("max_record_size")), "{e:?}");
    }
}
