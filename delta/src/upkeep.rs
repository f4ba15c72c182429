//! `ferry verify`, `ferry vacuum` and `ferry compact` on a Delta table (`[destination] table_format = "delta"`).
//!
//! In a Delta table the log, not the directory, says which files a reader sees: files that
//! commits removed stay on disk for readers of older versions until a vacuum. So verify
//! compares the ledger with the latest version's active files (and checks that each of those
//! is on the store at its size), and vacuum deletes only files that a commit removed more than
//! the retention ago and that the latest version does not name again.

use std::collections::{BTreeMap, HashMap, HashSet};

use bytes::Bytes;

use ferry_common::paths::DELTA_LOG;
use ferry_ledger::Ledger;
use ferry_storage::Store;
use ferry_table::{Compacted, TableError as Error, Vacuumed, Verified};

use crate::{Active, DeltaError, DeltaLog, Input, Snapshot};

/// A path (relative to the table) in its `_delta_log`.
fn in_log(rel: &str) -> bool {
    rel.strip_prefix(DELTA_LOG).is_some_and(|r| r.starts_with('/'))
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
pub(crate) async fn verify(dest: &Store, ledger: &Ledger, table: &str) -> Result<Verified, Error> {
    let mut out = Verified::default();
    let log = DeltaLog::new(dest.clone(), table);
    let mut s: Snapshot = match log.snapshot().await {
        Ok(s) => s,
        Err(e) => {
            read_error(e, &dest.url(&ferry_common::paths::delta_log(table)), &mut out)?;
            return Ok(out);
        }
    };
    let v = s.version;
    let prefix = format!("{table}/");
    let want = ledger.published_files(table).await?;
    // A published part out of the table: who took it out, when the checkpoint does not say.
    if want.iter().any(|(path, _, _)| !s.has_part(path.strip_prefix(&prefix).unwrap_or(path)))
        && let Err(e) = log.trace(&mut s).await
    {
        read_error(e, &dest.url(&ferry_common::paths::delta_log(table)), &mut out)?;
        return Ok(out);
    }
    // Parts by table path, whether a file of their own or held by a compacted file.
    let parts: HashMap<&str, (i64, Option<&str>)> = s.parts().map(|(rel, size, file)| (rel, (size, file))).collect();
    let mut chunk_of: HashMap<&str, &str> = HashMap::new();
    for (path, chunk, bytes) in &want {
        let rel = path.strip_prefix(&prefix).unwrap_or(path);
        chunk_of.insert(rel, chunk);
        match parts.get(rel).map(|(size, _)| size) {
            // Another writer's to change: reported, not a fault of the table.
            None if let Some(r) = s.rewritten.get(rel) => {
                out.rewritten += 1;
                out.lines.push(format!(
                    "rewritten {path} (chunk {chunk}): taken out by another writer's commit {} ({}){}",
                    r.version,
                    r.operation,
                    if r.kept { "; its rows are in that writer's files" } else { "; no file took its rows" }
                ));
            }
            None => {
                out.problems += 1;
                out.bad_chunks.insert(chunk.clone());
                out.lines.push(format!("missing  {path} (chunk {chunk}): not in table version {v}"));
            }
            Some(size) if size != bytes => {
                out.problems += 1;
                out.bad_chunks.insert(chunk.clone());
                out.lines.push(format!("size     {path}: {size} bytes in table version {v}, the ledger says {bytes} (chunk {chunk})"));
            }
            Some(_) => {}
        }
    }
    // Files other writers added (not named as Ferry's parts) are theirs: counted, not faults.
    type Found<'a> = Vec<(&'a str, Option<&'a str>)>;
    let (mut extra, others): (Found, Found) = parts
        .iter()
        .filter(|(rel, _)| !chunk_of.contains_key(*rel))
        .map(|(rel, (_, file))| (*rel, *file))
        .partition(|(rel, file)| file.is_some() || crate::chunk_of(rel).is_some());
    extra.sort();
    for (rel, file) in extra {
        out.problems += 1;
        let held = file.map(|f| format!(" (held by {prefix}{f})")).unwrap_or_default();
        out.lines.push(format!(
            "extra    {prefix}{rel}{held}: in table version {v}, not published by pipeline {} as far as the ledger knows",
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
        .filter(|(rel, _)| !in_log(rel) && !rel.contains("/_ferry/") && !rel.starts_with("_ferry/"))
        .collect();
    let mut active: Vec<(&String, i64)> = s.files.iter().map(|(rel, a)| (rel, a.size)).collect();
    active.sort();
    for (rel, size) in active {
        // A compacted file stands for each of its members' chunks.
        let chunks: Vec<&str> = match &s.files[rel].members[..] {
            [] => vec![chunk_of.get(rel.as_str()).copied().unwrap_or("unknown")],
            ms => ms.iter().map(|m| chunk_of.get(m.rel.as_str()).copied().unwrap_or("unknown")).collect(),
        };
        let chunk = chunks.join(", ");
        let bad = |out: &mut Verified| out.bad_chunks.extend(chunks.iter().map(|c| c.to_string()));
        match on_store.get(rel) {
            None => {
                out.problems += 1;
                bad(&mut out);
                out.lines.push(format!("gone     {prefix}{rel}: table version {v} names it, the store has no such file (chunk {chunk})"));
            }
            Some(&n) if n != size as u64 => {
                out.problems += 1;
                bad(&mut out);
                out.lines.push(format!("size     {prefix}{rel}: {n} bytes on the store, table version {v} says {size} (chunk {chunk})"));
            }
            Some(_) => {}
        }
    }
    out.bad_chunks.remove("unknown");
    let compacted = s.files.values().filter(|a| !a.members.is_empty()).count();
    let kept = on_store.keys().filter(|rel| rel.ends_with(".parquet") && !s.files.contains_key(*rel)).count();
    let checkpoint = log
        .checkpoint_version()
        .await
        .map_err(|e| Error::internal(e.to_string()))?
        .map_or("no checkpoint".to_string(), |c| format!("checkpoint at {c}"));
    out.lines.push(format!(
        "pipeline {}, Delta table {table}: version {v} ({checkpoint}), {} active file(s) ({compacted} compacted, holding {} \
         part(s)), {} part(s) in all, {} published in the ledger, {kept} file(s) on the store not in the table (removed by a \
         commit, or never committed; `ferry vacuum` deletes them past the retention){}{}",
        ledger.pipeline(),
        s.files.len(),
        s.members.len(),
        parts.len(),
        want.len(),
        if others.is_empty() { String::new() } else { format!("; {} active file(s) of other writers", others.len()) },
        if out.rewritten > 0 {
            format!("; {} published part(s) rewritten by other writers (a switch, rerun or skip of their chunks is refused)", out.rewritten)
        } else {
            String::new()
        },
    ));
    Ok(out)
}

/// The files of `chunk` that the table's latest version holds while no `published` row names
/// them: a load committed them and ended before recording them. `ferry skip` refuses to close
/// such a load (the rows are visible), as it does for a Hive table's unrecorded parts.
pub(crate) async fn unrecorded_active(dest: &Store, ledger: &Ledger, table: &str, chunk: &str) -> Result<Vec<String>, Error> {
    let s = DeltaLog::new(dest.clone(), table).snapshot().await.map_err(log_error)?;
    let recorded: HashSet<String> = ledger.published_of(chunk).await?.into_iter().map(|(p, _)| p).collect();
    let mut found: Vec<String> = s
        .parts()
        .map(|(rel, _, _)| rel)
        .filter(|rel| crate::chunk_of(rel) == Some(chunk))
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

/// Deletes the files of `table` that a commit removed before `cutoff_ms` and that the latest
/// version does not name (a file removed and added again is live), and Ferry's files that no
/// version names, written before `cutoff_ms` (parts a load placed and never committed, a
/// compacted file whose commit lost), but for parts of chunks the ledger does not show settled
/// (a load at work on them may commit them yet) and merged files younger than an hour. With `dry_run`, only counts them. A file
/// already gone counts as deleted.
pub(crate) async fn vacuum(dest: &Store, ledger: &Ledger, table: &str, cutoff_ms: i64, dry_run: bool) -> Result<Vacuumed, Error> {
    let prefix = format!("{table}/");
    let now_ms = chrono::Utc::now().timestamp_millis();
    // In this order: the listing, the ledger, the log. A part listed here whose chunk the
    // ledger then shows settled had its commit (if any) before that, so the log read after
    // names it; a part placed after the listing is not a candidate.
    let listed: Vec<(String, u64, i64)> = dest
        .list(table)
        .await?
        .into_iter()
        .filter_map(|e| Some((e.rel.strip_prefix(&prefix)?.to_string(), e.size, e.mtime_ms)))
        .filter(|(rel, _, mtime)| *mtime < cutoff_ms && is_ferry_file(rel))
        // A merged file no version names may be one a compaction or a load is about to commit
        // (nothing in the ledger says so): those younger than an hour stay, whatever the
        // retention.
        .filter(|(rel, _, mtime)| crate::chunk_of(rel).is_some() || *mtime < now_ms - MERGE_IN_FLIGHT_MS)
        .collect();
    let chunks: Vec<String> = listed.iter().filter_map(|(rel, _, _)| crate::chunk_of(rel).map(str::to_string)).collect();
    let settled = ledger.settled_chunks(&chunks).await?;
    let log = DeltaLog::new(dest.clone(), table);
    let mut s = log.snapshot_for_vacuum(cutoff_ms).await.map_err(log_error)?;
    let mut out = Vacuumed { version: s.version, ..Default::default() };
    let mut removed: Vec<(String, i64)> = Vec::new();
    for (rel, r) in &s.removed {
        if s.files.contains_key(rel) {
            continue;
        }
        let at = r.get("deletionTimestamp").and_then(serde_json::Value::as_i64).unwrap_or(i64::MAX);
        if at < cutoff_ms {
            removed.push((rel.clone(), r.get("size").and_then(serde_json::Value::as_i64).unwrap_or(0)));
        } else {
            out.kept += 1;
        }
    }
    // A removed part's name comes back when its bytes do (a correction undone, a rerun of the
    // same bytes): a load of its chunk may have placed it again and be about to commit its
    // add. Such parts stay while the ledger, read after the log, shows their chunk at work; and
    // the log is read again after the ledger, so a load that added one and recorded it in
    // between is seen too.
    let chunks: Vec<String> = removed.iter().filter_map(|(rel, _)| crate::chunk_of(rel).map(str::to_string)).collect();
    let settled_now = ledger.settled_chunks(&chunks).await?;
    log.catch_up(&mut s).await.map_err(log_error)?;
    out.version = s.version;
    let mut gone: Vec<(String, i64)> = Vec::new();
    for (rel, size) in removed {
        if s.files.contains_key(&rel) {
            continue;
        }
        if crate::chunk_of(&rel).is_some_and(|c| !settled_now.contains(c)) {
            out.again += 1;
            continue;
        }
        gone.push((rel, size));
    }
    let live: HashSet<&str> = s.files.keys().map(String::as_str).collect();
    for (rel, size, _) in listed {
        if live.contains(rel.as_str()) || s.removed.contains_key(&rel) {
            continue;
        }
        if crate::chunk_of(&rel).is_some_and(|c| !settled.contains(c)) {
            continue;
        }
        out.untracked += 1;
        gone.push((rel, size as i64));
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

/// How long a merged file no version names may still be on its way into a commit.
const MERGE_IN_FLIGHT_MS: i64 = 3_600_000;

/// A data file of Ferry's in a table directory: a part (`part-<chunk>-<8 hex>.parquet`) or a
/// compacted file (`compact-<16 hex>.parquet`), outside the log and Ferry's own directories.
fn is_ferry_file(rel: &str) -> bool {
    if in_log(rel) || rel.starts_with("_ferry/") || rel.contains("/_ferry/") {
        return false;
    }
    let name = rel.rsplit('/').next().unwrap_or(rel);
    let compacted = name
        .strip_prefix("compact-")
        .and_then(|n| n.strip_suffix(".parquet"))
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    compacted || crate::chunk_of(rel).is_some()
}

/// Merges the small files of each partition of `table` (those under `target` bytes) into files
/// of up to `target` bytes, one commit per merge (see `ferry_delta`'s compaction: row groups
/// copied whole, every part still found by its chunk). A merge whose inputs a commit changed
/// meanwhile is not written; files of other writers are left alone.
/// `clock` stamps each merge (its file, its removes, its commit) with the time it is made: a
/// long compaction's last merge is not dated at the run's start.
pub(crate) async fn compact(dest: &Store, table: &str, target: i64, dry_run: bool, clock: fn() -> i64) -> Result<Compacted, Error> {
    let log = DeltaLog::new(dest.clone(), table);
    let start = log.snapshot().await.map_err(log_error)?;
    let mut out = Compacted { version: start.version, ..Default::default() };
    let mut by_dir: BTreeMap<&str, Vec<(&str, &Active)>> = BTreeMap::new();
    for (rel, a) in &start.files {
        if a.size < target && (!a.members.is_empty() || crate::chunk_of(rel).is_some()) {
            by_dir.entry(rel.rsplit_once('/').map_or("", |(d, _)| d)).or_default().push((rel, a));
        }
    }
    let mut cache = Some(start.clone());
    for files in by_dir.values_mut() {
        // Oldest first: files of one schema come together, and a merge's members keep the
        // order they were loaded in.
        files.sort_by_key(|(rel, a)| (a.added_in, *rel));
        let mut bin: Vec<(&str, &Active, Bytes)> = Vec::new();
        let mut bin_key = String::new();
        for (rel, a) in files.iter() {
            let size: i64 = bin.iter().map(|(_, a, _)| a.size).sum();
            if !bin.is_empty() && size + a.size > target {
                merge_bin(&log, &mut cache, &mut bin, dry_run, clock(), &mut out).await?;
            }
            let bytes = Bytes::from(dest.read(&format!("{table}/{rel}")).await?);
            let key = match crate::compatibility(rel, &bytes) {
                Ok(k) => k,
                Err(e) => {
                    out.lines.push(format!("skipped  {table}/{rel}: {e}"));
                    continue;
                }
            };
            if key != bin_key {
                merge_bin(&log, &mut cache, &mut bin, dry_run, clock(), &mut out).await?;
                bin_key = key;
            }
            bin.push((rel, a, bytes));
        }
        merge_bin(&log, &mut cache, &mut bin, dry_run, clock(), &mut out).await?;
    }
    out.version = cache.map_or(out.version, |s| s.version);
    Ok(out)
}

/// One merge of [`compact`]: `bin`'s files (two or more) into one, written, then committed if
/// every input is still active. Empties `bin`.
async fn merge_bin(
    log: &DeltaLog,
    cache: &mut Option<Snapshot>,
    bin: &mut Vec<(&str, &Active, Bytes)>,
    dry_run: bool,
    now_ms: i64,
    out: &mut Compacted,
) -> Result<(), Error> {
    let inputs: Vec<(&str, &Active, Bytes)> = std::mem::take(bin);
    if inputs.len() < 2 {
        return Ok(());
    }
    let merged =
        crate::merge(&inputs.iter().map(|(rel, active, bytes)| Input { rel, active, bytes: bytes.clone() }).collect::<Vec<_>>(), now_ms)
            .map_err(log_error)?;
    let names: Vec<&str> = inputs.iter().map(|(rel, _, _)| *rel).collect();
    let bytes_in: i64 = inputs.iter().map(|(_, a, _)| a.size).sum();
    let verb = if dry_run { "would merge" } else { "merged" };
    if !dry_run {
        let table = log.table();
        if !log.store().create_new(&format!("{table}/{}", merged.rel), merged.bytes.clone()).await? {
            return Err(Error::internal(format!("{table}/{}: a file has the new name already", merged.rel)));
        }
        let mut stale = false;
        let written = log
            .commit(cache, |s| {
                stale = names.iter().any(|rel| !s.files.contains_key(*rel));
                if stale {
                    return Ok(None);
                }
                let mut actions = vec![crate::commit_info("OPTIMIZE", &[], now_ms)];
                for (rel, a, _) in &inputs {
                    let mut r = crate::remove_active(rel, a, now_ms);
                    r["remove"]["dataChange"] = false.into();
                    actions.push(r);
                }
                actions.push(merged.add.clone());
                Ok(Some(actions))
            })
            .await
            .map_err(log_error)?;
        if stale || written.is_none() {
            out.lost += 1;
            out.lines.push(format!("lost     {} file(s) into {}: a commit changed them first", names.len(), merged.rel));
            return Ok(());
        }
    }
    out.merges += 1;
    out.files_in += names.len();
    out.bytes_in += bytes_in;
    out.lines.push(format!("{verb} {} file(s), {bytes_in} bytes -> {} ({} bytes)", names.len(), merged.rel, merged.bytes.len()));
    Ok(())
}

/// The retention a table asks for (`delta.deletedFileRetentionDuration`), in ms, or 1 week.
pub(crate) async fn retention_ms(dest: &Store, table: &str) -> Result<i64, Error> {
    let s = DeltaLog::new(dest.clone(), table).snapshot().await.map_err(log_error)?;
    Ok(s.tombstone_retention_ms())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicI64, Ordering};

    use ferry_ledger::SchemaColumn;
    use serde_json::Value;

    use super::*;

    static NOW: AtomicI64 = AtomicI64::new(1_000);

    /// A clock that moves a second at each reading.
    fn ticking() -> i64 {
        NOW.fetch_add(1_000, Ordering::SeqCst)
    }

    /// Each merge of a compaction is dated when it is made: its commit, its file's add and its
    /// removes carry one time, and a later merge a later one (not the run's start for all).
    #[test]
    fn each_merge_is_stamped_with_the_time_it_is_made() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::from_url(&d.path().display().to_string()).unwrap();
        let log = DeltaLog::new(store.clone(), "t");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let col =
                |name: &str, detail: &str| SchemaColumn { name: name.into(), hive: String::new(), detail: detail.into(), nullable: true };
            let cols = [col("n", "bigint"), col("s", "string"), col("k", "string")];
            let mut cache = None;
            let (protocol, meta) = (crate::protocol(&cols), crate::metadata("id", "t", &cols, &["k".to_string()], 1).unwrap());
            log.commit(&mut cache, |_| Ok(Some(vec![crate::protocol_line(&protocol), crate::metadata_line(&meta)]))).await.unwrap();
            // Two partitions of two parts each: two merges.
            for (i, rel) in
                ["k=1/part-a-0000000a.parquet", "k=1/part-b-0000000b.parquet", "k=2/part-c-0000000c.parquet", "k=2/part-d-0000000d.parquet"]
                    .into_iter()
                    .enumerate()
            {
                let bytes = crate::compact::tests::part(i as i64 * 10, 5);
                store.put_atomic(&format!("t/{rel}"), bytes.to_vec()).await.unwrap();
                let pv = crate::partition_values(rel.rsplit_once('/').unwrap().0, &cols);
                log.commit(&mut cache, |_| {
                    Ok(Some(vec![crate::commit_info("WRITE", &[], 1), crate::add(rel, &pv, bytes.len() as i64, 5, None, 1)]))
                })
                .await
                .unwrap();
            }
            let report = compact(&store, "t", 1 << 20, false, ticking).await.unwrap();
            assert_eq!(report.merges, 2, "{:?}", report.lines);
            let mut stamps = Vec::new();
            for v in [5, 6] {
                let text = std::fs::read_to_string(d.path().join(format!("t/_delta_log/{v:020}.json"))).unwrap();
                let actions: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
                let at = actions.iter().find_map(|a| a.get("commitInfo")?.get("timestamp")?.as_i64()).unwrap();
                for a in &actions {
                    if let Some(add) = a.get("add") {
                        assert_eq!(add["modificationTime"].as_i64(), Some(at), "commit {v}: {add}");
                        assert_eq!(add["partitionValues"], serde_json::json!(BTreeMap::from([("k", if v == 5 { "1" } else { "2" })])));
                    }
                    if let Some(r) = a.get("remove") {
                        assert_eq!(r["deletionTimestamp"].as_i64(), Some(at), "commit {v}: {r}");
                    }
                }
                stamps.push(at);
            }
            assert!(stamps[0] < stamps[1], "the second merge dated after the first: {stamps:?}");
        });
    }
}
