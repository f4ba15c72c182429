//! `ferry verify` and `ferry vacuum` on a Delta table (`[destination] table_format = "delta"`).
//!
//! In a Delta table the log, not the directory, says which files a reader sees: files that
//! commits removed stay on disk for readers of older versions until a vacuum. So verify
//! compares the ledger with the latest version's active files (and checks that each of those
//! is on the store at its size), and vacuum deletes only files that a commit removed more than
//! the retention ago and that the latest version does not name again.

use std::collections::{BTreeSet, HashMap, HashSet};

use ferry_delta::{DeltaError, DeltaLog, Snapshot};
use ferry_ledger::Ledger;
use ferry_storage::Store;

use crate::Error;

/// What `ferry verify` found: lines to print, the chunks involved, and the number of problems.
#[derive(Debug, Default)]
pub struct Verified {
    pub lines: Vec<String>,
    pub bad_chunks: BTreeSet<String>,
    pub problems: usize,
}

/// A log that cannot be read is a finding (the table is not what the ledger says), not an
/// error of the command; a store that cannot be reached is.
fn read_error(e: DeltaError, what: &str, out: &mut Verified) -> Result<(), Error> {
    match e {
        DeltaError::Storage(e) => Err(e.into()),
        other => {
            out.problems += 1;
            out.lines.push(format!("log      {what}: {other}"));
            Ok(())
        }
    }
}

/// The ledger's published files of `table` against the table's latest version.
pub async fn verify(dest: &Store, ledger: &Ledger, table: &str) -> Result<Verified, Error> {
    let mut out = Verified::default();
    let log = DeltaLog::new(dest.clone(), table);
    let s: Snapshot = match log.snapshot().await {
        Ok(s) => s,
        Err(e) => {
            read_error(e, &dest.url(&format!("{table}/_delta_log")), &mut out)?;
            return Ok(out);
        }
    };
    let v = s.version;
    let prefix = format!("{table}/");
    let want = ledger.published_files(table).await?;
    let mut chunk_of: HashMap<&str, &str> = HashMap::new();
    for (path, chunk, bytes) in &want {
        let rel = path.strip_prefix(&prefix).unwrap_or(path);
        chunk_of.insert(rel, chunk);
        match s.files.get(rel) {
            None => {
                out.problems += 1;
                out.bad_chunks.insert(chunk.clone());
                out.lines.push(format!("missing  {path} (chunk {chunk}): not in table version {v}"));
            }
            Some(a) if a.size != *bytes => {
                out.problems += 1;
                out.bad_chunks.insert(chunk.clone());
                out.lines.push(format!("size     {path}: {} bytes in table version {v}, the ledger says {bytes} (chunk {chunk})", a.size));
            }
            Some(_) => {}
        }
    }
    let mut extra: Vec<&String> = s.files.keys().filter(|rel| !chunk_of.contains_key(rel.as_str())).collect();
    extra.sort();
    for rel in extra {
        out.problems += 1;
        out.lines.push(format!(
            "extra    {prefix}{rel}: in table version {v}, not published by pipeline {} as far as the ledger knows",
            ledger.pipeline()
        ));
    }
    // Every file the version names must be there, whole: a reader fails on the first one that
    // is not.
    let on_store: HashMap<String, u64> = dest
        .list(table)
        .await?
        .into_iter()
        .filter_map(|e| Some((e.rel.strip_prefix(&prefix)?.to_string(), e.size)))
        .filter(|(rel, _)| !rel.starts_with("_delta_log/") && !rel.contains("/_ferry/") && !rel.starts_with("_ferry/"))
        .collect();
    let mut active: Vec<(&String, i64)> = s.files.iter().map(|(rel, a)| (rel, a.size)).collect();
    active.sort();
    for (rel, size) in active {
        let chunk = chunk_of.get(rel.as_str()).map_or_else(|| "unknown".to_string(), |c| c.to_string());
        match on_store.get(rel) {
            None => {
                out.problems += 1;
                out.bad_chunks.insert(chunk.clone());
                out.lines.push(format!("gone     {prefix}{rel}: table version {v} names it, the store has no such file (chunk {chunk})"));
            }
            Some(&n) if n != size as u64 => {
                out.problems += 1;
                out.bad_chunks.insert(chunk.clone());
                out.lines.push(format!("size     {prefix}{rel}: {n} bytes on the store, table version {v} says {size} (chunk {chunk})"));
            }
            Some(_) => {}
        }
    }
    out.bad_chunks.remove("unknown");
    let kept = on_store.keys().filter(|rel| rel.ends_with(".parquet") && !s.files.contains_key(*rel)).count();
    let checkpoint = log
        .checkpoint_version()
        .await
        .map_err(|e| Error::internal(e.to_string()))?
        .map_or("no checkpoint".to_string(), |c| format!("checkpoint at {c}"));
    out.lines.push(format!(
        "pipeline {}, Delta table {table}: version {v} ({checkpoint}), {} active file(s), {} published in the ledger, \
         {kept} file(s) on the store no longer in the table (removed by a commit; `ferry vacuum` deletes them past the retention)",
        ledger.pipeline(),
        s.files.len(),
        want.len(),
    ));
    Ok(out)
}

/// The files of `chunk` that the table's latest version holds while no `published` row names
/// them: a load committed them and ended before recording them. `ferry skip` refuses to close
/// such a load (the rows are visible), as it does for a Hive table's unrecorded parts.
pub async fn unrecorded_active(dest: &Store, ledger: &Ledger, table: &str, chunk: &str) -> Result<Vec<String>, Error> {
    let s = DeltaLog::new(dest.clone(), table).snapshot().await.map_err(log_error)?;
    let recorded: HashSet<String> = ledger.published_of(chunk).await?.into_iter().map(|(p, _)| p).collect();
    let mut found: Vec<String> = s
        .files
        .keys()
        .filter(|rel| ferry_delta::chunk_of(rel) == Some(chunk))
        .map(|rel| format!("{table}/{rel}"))
        .filter(|path| !recorded.contains(path))
        .collect();
    found.sort();
    Ok(found)
}

/// A store's error keeps its class (a store that cannot be reached); what the log itself
/// refuses is reported as it is.
fn log_error(e: DeltaError) -> Error {
    match e {
        DeltaError::Storage(e) => e.into(),
        other => Error::internal(other.to_string()),
    }
}

/// What `ferry vacuum` did (or would do, dry).
#[derive(Debug, Default)]
pub struct Vacuumed {
    /// The files deleted (or that would be), as store URLs.
    pub deleted: Vec<String>,
    pub files: usize,
    pub bytes: i64,
    /// Removed files still within the retention, kept.
    pub kept: usize,
    pub version: i64,
}

/// Deletes the files of `table` that a commit removed before `cutoff_ms` and that the latest
/// version does not name (a file removed and added again is live). With `dry_run`, only
/// counts them. A file already gone counts as deleted.
pub async fn vacuum(dest: &Store, table: &str, cutoff_ms: i64, dry_run: bool) -> Result<Vacuumed, Error> {
    let log = DeltaLog::new(dest.clone(), table);
    let s = log.snapshot_with_history().await.map_err(log_error)?;
    let mut out = Vacuumed { version: s.version, ..Default::default() };
    let live: HashSet<&str> = s.files.keys().map(String::as_str).collect();
    let mut gone: Vec<(&String, i64)> = Vec::new();
    for (rel, r) in &s.removed {
        if live.contains(rel.as_str()) {
            continue;
        }
        let at = r.get("deletionTimestamp").and_then(serde_json::Value::as_i64).unwrap_or(i64::MAX);
        if at < cutoff_ms {
            gone.push((rel, r.get("size").and_then(serde_json::Value::as_i64).unwrap_or(0)));
        } else {
            out.kept += 1;
        }
    }
    gone.sort();
    for (rel, size) in gone {
        let path = format!("{table}/{rel}");
        if !dry_run {
            match dest.delete(&path).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        out.deleted.push(dest.url(&path));
        out.files += 1;
        out.bytes += size;
    }
    Ok(out)
}

/// The retention a table asks for (`delta.deletedFileRetentionDuration`), in ms, or 1 week.
pub async fn retention_ms(dest: &Store, table: &str) -> Result<i64, Error> {
    let s = DeltaLog::new(dest.clone(), table).snapshot().await.map_err(log_error)?;
    Ok(s.property("delta.deletedFileRetentionDuration").and_then(ferry_delta::interval_ms).unwrap_or(7 * 86_400_000))
}
