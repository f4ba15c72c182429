//! Every path Ferry writes, built here and nowhere else.
//!
//! Paths in stores are relative to the store's root, with `/` separators; spool paths are
//! local. `<partition>` is a Hive path (`dt=2026-11-30/hour=07`, empty when the table is not
//! partitioned, and then left out with its slash); `<chunk>` is a chunk id (24 hex digits).
//!
//! | store | path | written by |
//! |---|---|---|
//! | staging | `<table>/<chunk>.<format>` | extract: one chunk, whole records |
//! | spool | `<table>/<chunk>/<partition>/part-<chunk>.parquet` | transform, one file per partition value |
//! | spool | `<table>/<chunk>/<partition>/.part-<chunk>.<pid>-<job>.tmp` | transform, while writing it |
//! | spool | `rejects/<table>/<chunk>.jsonl` | transform: bad records with position and reason |
//! | destination | `_ferry/tmp/<chunk>.<epoch>.<i>` | copy: part `i` of a chunk in flight, unique per lease epoch |
//! | destination | `_ferry/tmp/<chunk>.<epoch>.<i>.h` | copy: the same part's hedged upload |
//! | destination | `_ferry/landed/<table>/<chunk>/<partition>/part-<chunk>.parquet` | copy: verified and renamed into place |
//! | destination | `<table>/<partition>/part-<chunk>.parquet` | load: the published table |
//! | destination | `<table>/_ferry/manifest/<chunk>.json` | load: the files a chunk published |
//! | destination | `<table>/_ferry/ddl.sql` | load: CREATE EXTERNAL TABLE + ADD PARTITION |
//! | any | `<dir>/.<name>.<pid>-<seq>.tmp` | small files written atomically (temp name, then rename to `<name>`) |
//!
//! Names that start with `.` and end with `.tmp` are temp files: `ferry gc` removes them once
//! they are older than a copy deadline plus two leases. The epoch in a copy temp name is the
//! lease's fencing epoch, which never repeats (an attempt number can, after a release).

use std::path::{Path, PathBuf};

use crate::config::Format;

/// Destination folder of copy's uploads in flight.
pub const COPY_TEMP_DIR: &str = "_ferry/tmp";

/// The name a store probe asks about (it need not exist: absent is an answer).
pub const PROBE: &str = "_ferry/probe";
/// Destination folder of copy's verified files, per table.
const LANDED_DIR: &str = "_ferry/landed";
/// Ferry's own files inside a table folder (manifests, DDL): readers skip `_`-prefixed names.
const TABLE_META: &str = "_ferry";
const PART_PREFIX: &str = "part-";
const PART_SUFFIX: &str = ".parquet";

/// `<table>/<chunk>.<format>` in staging.
/// The directory name Hive and Spark give a partition whose value is null or empty.
pub const DEFAULT_PARTITION: &str = "__HIVE_DEFAULT_PARTITION__";

/// A partition value as it appears in a path (`dt=<this>`), escaped as Hive does: path and
/// control characters as `%XX`. Null and the empty string are [`DEFAULT_PARTITION`], and a
/// value that is literally that name is escaped so it stays a value.
pub fn escape_partition_value(v: Option<&str>) -> String {
    let Some(v) = v.filter(|v| !v.is_empty()) else { return DEFAULT_PARTITION.to_string() };
    if v == DEFAULT_PARTITION {
        return format!("%5F{}", &v[1..]);
    }
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '"' | '#' | '%' | '\'' | '*' | '/' | ':' | '=' | '?' | '\\' | '{' | '[' | ']' | '^' | '\x7f' | '\0'..='\x1f' => {
                s.push_str(&format!("%{:02X}", c as u32))
            }
            c => s.push(c),
        }
    }
    s
}

/// The value an escaped partition path component stands for (None: the default partition).
pub fn unescape_partition_value(v: &str) -> Option<String> {
    if v == DEFAULT_PARTITION {
        return None;
    }
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

pub fn staged_chunk(table: &str, chunk: &str, format: Format) -> String {
    format!("{table}/{chunk}.{}", format.as_str())
}

/// `<table>/<chunk>.v<version>-<attempt>.<ext>`: a chunk staged again because its source
/// file's bytes came back as version `version` (a correction undone), by one attempt of one
/// extract (`attempt`, any number unique to it). A name of its own: a revert never overwrites
/// a file that an older row still names, two extracts reverting the same file at once never
/// remove each other's copies, and gc, which removes old staged chunks by the locations the
/// ledger records, does not meet it before the revert is recorded.
pub fn revived_chunk(table: &str, chunk: &str, version: i64, attempt: u64, format: Format) -> String {
    format!("{table}/{chunk}.v{version}-{attempt:016x}.{}", format.as_str())
}

/// The chunk and version a [`revived_chunk`] name was staged for.
pub fn parse_revived<'a>(table: &str, rel: &'a str) -> Option<(&'a str, i64)> {
    let name = rel.strip_prefix(table)?.strip_prefix('/')?;
    let (stem, _ext) = name.rsplit_once('.')?;
    let (chunk, tail) = stem.rsplit_once(".v")?;
    let (version, attempt) = tail.split_once('-')?;
    let valid = !chunk.is_empty()
        && !chunk.contains(['/', '.'])
        && !version.is_empty()
        && version.bytes().all(|b| b.is_ascii_digit())
        && !attempt.is_empty()
        && attempt.bytes().all(|b| b.is_ascii_hexdigit());
    valid.then(|| version.parse().ok().map(|v| (chunk, v))).flatten()
}

/// `part-<chunk>.parquet`: the one name a chunk's file has in every partition.
pub fn part_name(chunk: &str) -> String {
    format!("{PART_PREFIX}{chunk}{PART_SUFFIX}")
}

/// The chunk a part name belongs to.
pub fn chunk_of_part(name: &str) -> Option<&str> {
    name.strip_prefix(PART_PREFIX)?.strip_suffix(PART_SUFFIX)
}

/// `<partition>/<name>`, or `<name>` when unpartitioned.
pub fn part_rel(partition: &str, name: &str) -> String {
    if partition.is_empty() { name.to_string() } else { format!("{partition}/{name}") }
}

/// `<spool>/<table>/<chunk>`: everything transform wrote for a chunk.
pub fn spool_chunk_dir(spool: &Path, table: &str, chunk: &str) -> PathBuf {
    spool.join(table).join(chunk)
}

/// The spool file of one part (`part_rel` from [`part_rel`]).
pub fn spool_part(spool: &Path, table: &str, chunk: &str, part_rel: &str) -> PathBuf {
    spool_chunk_dir(spool, table, chunk).join(part_rel)
}

/// The temp name transform writes a part under, in the part's own directory. `job` is unique
/// per process, so a zombie job (its lease lost, the chunk claimed again, even by this
/// process) never shares a temp file with the new one.
pub fn spool_part_temp(dir: &Path, chunk: &str, job: u64) -> PathBuf {
    dir.join(format!(".{PART_PREFIX}{chunk}.{}-{job}.tmp", std::process::id()))
}

/// `<spool>/rejects/<table>/<chunk>.jsonl`.
pub fn rejects_file(spool: &Path, table: &str, chunk: &str) -> PathBuf {
    spool.join("rejects").join(table).join(format!("{chunk}.jsonl"))
}

/// `_ferry/tmp/<chunk>.<epoch>.<i>.<try>`: part `i` of a chunk in flight to the destination,
/// sent for the `try`-th time in the attempt whose lease has `epoch` (no two tries share one).
pub fn copy_temp(chunk: &str, epoch: i64, part: usize, try_no: u32) -> String {
    format!("{COPY_TEMP_DIR}/{chunk}.{epoch}.{part}.{try_no}")
}

/// The hedged upload's own temp name beside `copy_temp`.
pub fn hedge_temp(copy_temp: &str) -> String {
    format!("{copy_temp}.h")
}

/// What a copy temp name says: (chunk, epoch, part, try, is the hedge).
pub fn parse_copy_temp(rel: &str) -> Option<(&str, i64, usize, u32, bool)> {
    let name = rel.strip_prefix(COPY_TEMP_DIR)?.strip_prefix('/')?;
    let (name, hedge) = match name.strip_suffix(".h") {
        Some(n) => (n, true),
        None => (name, false),
    };
    let mut it = name.split('.');
    let (chunk, epoch, part, try_no) = (it.next()?, it.next()?.parse().ok()?, it.next()?.parse().ok()?, it.next()?.parse().ok()?);
    it.next().is_none().then_some((chunk, epoch, part, try_no, hedge))
}

/// `_ferry/landed/<table>`: every landed file of a table is below it.
pub fn landed_dir(table: &str) -> String {
    format!("{LANDED_DIR}/{table}")
}

/// `_ferry/landed/<table>/<chunk>/<part_rel>`.
pub fn landed(table: &str, chunk: &str, part_rel: &str) -> String {
    format!("{}/{chunk}/{part_rel}", landed_dir(table))
}

/// The chunk a landed path of `table` belongs to, and the part's path inside it.
pub fn parse_landed<'a>(table: &str, rel: &'a str) -> Option<(&'a str, &'a str)> {
    let rest = rel.strip_prefix(LANDED_DIR)?.strip_prefix('/')?.strip_prefix(table)?.strip_prefix('/')?;
    rest.split_once('/').filter(|(c, p)| !c.is_empty() && !p.is_empty())
}

/// `<table>/<part_rel>`: a published file.
pub fn table_file(table: &str, part_rel: &str) -> String {
    format!("{table}/{part_rel}")
}

/// The chunk of a published file of `table` (`<table>/<k=v>/.../part-<chunk>.parquet`).
pub fn parse_table_file<'a>(table: &str, rel: &'a str) -> Option<&'a str> {
    let rest = rel.strip_prefix(table)?.strip_prefix('/')?;
    if rest.starts_with(TABLE_META) {
        return None;
    }
    chunk_of_part(rest.rsplit('/').next()?)
}

/// `<table>/_ferry`: load's own files beside the table's.
pub fn table_meta(table: &str) -> String {
    format!("{table}/{TABLE_META}")
}

/// A Delta table's log directory in the table, relative to the table (where a path in the
/// table is one, as in the log's `add` actions): `_delta_log`.
pub const DELTA_LOG: &str = "_delta_log";

/// `<table>/_delta_log`: a Delta table's log.
pub fn delta_log(table: &str) -> String {
    format!("{table}/{DELTA_LOG}")
}

/// `<table>/_ferry/manifest/<chunk>.json`.
pub fn manifest(table: &str, chunk: &str) -> String {
    format!("{}/manifest/{chunk}.json", table_meta(table))
}

/// `<table>/_ferry/ddl.sql`.
pub fn ddl(table: &str) -> String {
    format!("{}/ddl.sql", table_meta(table))
}

/// `<table>/_ferry/schema-v<N>.sql`: the statements that take a table created in schema
/// version N-1 to version N.
pub fn schema_change(table: &str, version: i64) -> String {
    format!("{}/schema-v{version}.sql", table_meta(table))
}

/// The temp name of an atomic write of `name` in its directory: unique per writer (process,
/// then `seq`), so concurrent writers of one name never share a temp file.
pub fn atomic_temp(name: &str, seq: u64) -> String {
    format!(".{name}.{}-{seq}.tmp", std::process::id())
}

/// Prefix of a source file moved aside for disposal (see [`aside`]).
const ASIDE_PREFIX: &str = ".ferry-aside.";

/// Where extract moves a source file `rel` before it archives or deletes it: beside it, hidden
/// (listings and globs skip it), never a temp name (gc must not remove it), one per name.
pub fn aside(rel: &str) -> String {
    match rel.rsplit_once('/') {
        Some((dir, base)) => format!("{dir}/{ASIDE_PREFIX}{base}"),
        None => format!("{ASIDE_PREFIX}{rel}"),
    }
}

/// The name a file [`aside`] was moved from.
pub fn aside_of(rel: &str) -> Option<String> {
    let (dir, base) = rel.rsplit_once('/').map_or(("", rel), |(d, b)| (d, b));
    let orig = base.strip_prefix(ASIDE_PREFIX).filter(|b| !b.is_empty())?;
    Some(if dir.is_empty() { orig.to_string() } else { format!("{dir}/{orig}") })
}

/// Whether a base name is one of Ferry's temp files (what gc may remove once old).
pub fn is_temp(base: &str) -> bool {
    base.starts_with('.') && base.ends_with(".tmp")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_values_escape_and_come_back() {
        for v in ["2026-11-30", "a/b=c", "50%", "it's", "tab\there", "{x}", "__HIVE_DEFAULT_PARTITION__", "é"] {
            let e = escape_partition_value(Some(v));
            assert!(!e.contains('/') && !e.contains('='), "{e}");
            assert_eq!(unescape_partition_value(&e).as_deref(), Some(v), "{v} -> {e}");
        }
        assert_eq!(escape_partition_value(None), DEFAULT_PARTITION);
        assert_eq!(escape_partition_value(Some("")), DEFAULT_PARTITION);
        assert_eq!(unescape_partition_value(DEFAULT_PARTITION), None);
        assert_ne!(escape_partition_value(Some(DEFAULT_PARTITION)), DEFAULT_PARTITION);
    }

    const CHUNK: &str = "0123456789abcdef01234567";

    #[test]
    fn aside_names_come_back() {
        for rel in ["a.jsonl", "d/e/a.jsonl", ".hidden"] {
            let a = aside(rel);
            assert!(a.rsplit('/').next().unwrap().starts_with('.') && !is_temp(&a), "{a}");
            assert_eq!(aside_of(&a).as_deref(), Some(rel));
        }
        assert_eq!(aside_of("d/a.jsonl"), None);
        assert_eq!(aside_of("d/.ferry-aside."), None);
    }

    #[test]
    fn names_parse_back() {
        let rel = part_rel("dt=2026-11-30/hour=07", &part_name(CHUNK));
        assert_eq!(rel, format!("dt=2026-11-30/hour=07/part-{CHUNK}.parquet"));
        assert_eq!(chunk_of_part(&part_name(CHUNK)), Some(CHUNK));
        assert_eq!(part_rel("", "x"), "x");

        let l = landed("events", CHUNK, &rel);
        assert_eq!(parse_landed("events", &l), Some((CHUNK, rel.as_str())));
        assert_eq!(parse_landed("event", &l), None, "another table's prefix");
        assert_eq!(parse_landed("events", &landed_dir("events")), None);

        let t = copy_temp(CHUNK, 17, 3, 2);
        assert_eq!(parse_copy_temp(&t), Some((CHUNK, 17, 3, 2, false)));
        assert_eq!(parse_copy_temp(&hedge_temp(&t)), Some((CHUNK, 17, 3, 2, true)));
        assert_eq!(parse_copy_temp("_ferry/tmp/x.y.z"), None);

        assert_eq!(staged_chunk("events", CHUNK, Format::Jsonl), format!("events/{CHUNK}.jsonl"));
        let r = revived_chunk("events", CHUNK, 12, 0xbeef, Format::Csv);
        assert_eq!(r, format!("events/{CHUNK}.v12-000000000000beef.csv"));
        assert_eq!(parse_revived("events", &r), Some((CHUNK, 12)));
        assert_eq!(parse_revived("events", &staged_chunk("events", CHUNK, Format::Avro)), None);
        assert_eq!(parse_revived("other", &r), None, "another table's prefix");
        assert_eq!(parse_revived("events", &format!("events/{CHUNK}.vx-1.csv")), None);
        assert_eq!(parse_revived("events", &format!("events/{CHUNK}.v12.csv")), None);
        assert_eq!(manifest("events", CHUNK), format!("events/_ferry/manifest/{CHUNK}.json"));
        assert_eq!(ddl("events"), "events/_ferry/ddl.sql");
        assert!(ddl("events").starts_with(&table_meta("events")));
    }

    #[test]
    fn temp_names_are_temp_and_finals_are_not() {
        let spool = Path::new("/spool");
        let dir = spool_chunk_dir(spool, "events", CHUNK).join("dt=2026-11-30");
        let tmp = spool_part_temp(&dir, CHUNK, 9);
        let base = tmp.file_name().unwrap().to_str().unwrap();
        assert!(is_temp(base), "{base}");
        assert_eq!(tmp.parent(), Some(dir.as_path()));
        assert!(is_temp(&atomic_temp("ddl.sql", 4)));
        assert!(!is_temp(&part_name(CHUNK)));
        assert!(!is_temp("ddl.sql"));
        assert_eq!(
            spool_part(spool, "events", CHUNK, &part_rel("dt=1", &part_name(CHUNK))),
            PathBuf::from(format!("/spool/events/{CHUNK}/dt=1/part-{CHUNK}.parquet"))
        );
        assert_eq!(rejects_file(spool, "events", CHUNK), PathBuf::from(format!("/spool/rejects/events/{CHUNK}.jsonl")));
    }
}
