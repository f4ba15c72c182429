//! Durable before destructive, in every stage and in gc: nothing Ferry cannot make again is
//! deleted on the strength of a commit that is not yet on stable storage. The ledger commits
//! without waiting for the disk (SQLite in WAL mode, `synchronous = NORMAL`), so a power loss
//! right after a delete could take the commit with it: the chunk is redone and finds its
//! input gone, or a table file has no row that a later correction would retract.
//! - extract deletes (or archives) a source file only once its chunks and the ledger rows
//!   naming them are synced (the unlink is of the file moved aside for disposal,
//!   `.ferry-aside.<name>`: the move itself destroys nothing);
//! - copy removes a chunk's spool files only once its completion is synced;
//! - load removes an older version's table files only once the newer version's record is;
//! - gc's sweeps of spent spool and stray landed copies sync the ledger before they remove.
//!
//! The order is read from the system calls themselves (strace): at each destructive unlink,
//! every write of this process to the ledger's WAL (and, for extract, to staging) must have
//! been fsynced, and the WAL fsynced at least once (a commit of another process, still in the
//! page cache, is made durable only by that). A power loss keeps exactly what was fsynced.

use std::collections::BTreeSet;
use std::process::Command;

use ferry_tests::{Pipeline, bin};

/// One source file per run: what is unsynced at its unlink can then only be its own.
#[test]
fn a_source_file_is_deleted_only_after_its_chunks_and_their_ledger_rows_are_synced() {
    let p = Pipeline::new("16KiB", "30s", "0s");
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    std::fs::write(&p.config, cfg.replacen("[source]\n", "[source]\ndisposition = \"delete\"\n", 1)).unwrap();
    p.generate("gen", "jsonl", "null", 3, 300, 21);
    let mut generated: Vec<_> = std::fs::read_dir(p.path("gen")).unwrap().map(|e| e.unwrap().path()).collect();
    generated.sort();
    assert_eq!(generated.len(), 3);
    for (i, g) in generated.iter().enumerate() {
        let file = p.path(&format!("in/{}", g.file_name().unwrap().to_string_lossy()));
        std::fs::rename(g, &file).unwrap();
        let text = traced(&p, &i.to_string(), "ferry-extract", &["--once"]);
        let aside = file.with_file_name(format!(".ferry-aside.{}", g.file_name().unwrap().to_string_lossy()));
        let aside_path = aside.display().to_string();
        let found = unsynced_at_unlinks(&text, &p, |f| f == aside_path);
        assert_eq!(found.len(), 1, "{} unlinked once", aside.display());
        all_synced(&found, 1, "extract");
        assert!(!file.exists() && !aside.exists());
    }
    assert_eq!(p.count("SELECT COUNT(*) FROM source_files WHERE state = 'chunked'"), 3);
}

/// The calls of an strace log (`strace -f -y`), in order: the call's text, its name and the path
/// of its first descriptor (`fd</path>` read as `/path>`). A call resumed later is counted where
/// it started.
fn calls(text: &str) -> impl Iterator<Item = (&str, &str, Option<String>)> {
    text.lines().filter_map(|line| {
        // "PID syscall(fd</path>, ..."
        let call = line.split_once(' ').map(|(_, rest)| rest.trim_start())?;
        if call.starts_with("<...") {
            return None;
        }
        let name = call.split('(').next().unwrap_or_default();
        let path = call.split_once('<').and_then(|(_, r)| r.split_once('>')).map(|(p, _)| format!("{p}>"));
        Some((call, name, path))
    })
}

/// What a traced process has written and not yet fsynced, call by call: the paths `tracked`
/// accepts (the ledger's WAL always), and whether the WAL had been fsynced at all.
struct Unsynced<'a> {
    wal: String,
    tracked: &'a dyn Fn(&str) -> bool,
    dirty: BTreeSet<String>,
    wal_synced: bool,
}

impl<'a> Unsynced<'a> {
    fn new(p: &Pipeline, tracked: &'a dyn Fn(&str) -> bool) -> Unsynced<'a> {
        Unsynced { wal: format!("{}-wal>", p.path("ledger.db").display()), tracked, dirty: BTreeSet::new(), wal_synced: false }
    }

    fn see(&mut self, name: &str, path: Option<String>) {
        match name {
            "write" | "pwrite64" | "writev" | "pwritev" => {
                if let Some(path) = path.filter(|p| *p == self.wal || (self.tracked)(p)) {
                    self.dirty.insert(path);
                }
            }
            "fsync" | "fdatasync" => {
                if let Some(path) = path {
                    self.wal_synced |= path == self.wal;
                    self.dirty.remove(&path);
                }
            }
            _ => {}
        }
    }
}

/// Reads an strace log: for each unlink of a path `target` accepts (in call order), the paths
/// (the ledger's WAL, staged chunks) written and not yet fsynced at that moment, with whether
/// the WAL had been fsynced at all by then. An unlink relative to a directory descriptor
/// (`unlinkat(fd</dir>, "name")`, as `remove_dir_all` does) is read as `/dir/name`.
fn unsynced_at_unlinks(text: &str, p: &Pipeline, target: impl Fn(&str) -> bool) -> Vec<(String, BTreeSet<String>, bool)> {
    let staging = format!("{}/", p.path("staging").display());
    let in_staging = |path: &str| path.starts_with(&staging);
    let mut state = Unsynced::new(p, &in_staging);
    let mut found = Vec::new();
    for (call, name, path) in calls(text) {
        if name == "unlink" || name == "unlinkat" {
            let Some(arg) = call.split('"').nth(1) else { continue };
            let full = match (arg.starts_with('/'), name, call.split_once("(").map(|(_, r)| r)) {
                (false, "unlinkat", Some(rest)) if !rest.starts_with("AT_FDCWD") => {
                    let dir = rest.split_once('<').and_then(|(_, r)| r.split_once('>')).map(|(d, _)| d).unwrap_or_default();
                    format!("{dir}/{arg}")
                }
                _ => arg.to_string(),
            };
            if target(&full) {
                found.push((full, state.dirty.clone(), state.wal_synced));
            }
        } else {
            state.see(name, path);
        }
    }
    found
}

/// Runs `args` (a stage binary or `ferry` and its arguments) under strace with the test's
/// config; the trace, once it succeeded.
fn traced(p: &Pipeline, i: &str, bin_name: &str, args: &[&str]) -> String {
    let trace = p.path(&format!("strace-{i}.txt"));
    let out = Command::new("strace")
        .args(["-f", "-y", "-qq", "-e", "trace=write,pwrite64,writev,pwritev,fsync,fdatasync,unlink,unlinkat", "-o"])
        .arg(&trace)
        .arg(bin(bin_name))
        .arg("--config")
        .arg(&p.config)
        .args(args)
        .env_remove("FERRY_LEDGER")
        .output()
        .unwrap();
    assert!(out.status.code().is_some_and(|c| c == 0 || c == 3), "{bin_name}: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::read_to_string(&trace).unwrap()
}

/// Every unlink found was made with nothing of the ledger's (or staging's) unsynced, after a
/// sync of the WAL; at least `min` of them.
fn all_synced(found: &[(String, BTreeSet<String>, bool)], min: usize, what: &str) {
    assert!(found.len() >= min, "{what}: {} unlinks traced, {min} expected at least", found.len());
    for (path, dirty, wal_synced) in found {
        assert!(
            dirty.is_empty() && *wal_synced,
            "{what}: {path} was unlinked with {dirty:?} written and not synced (WAL synced before: {wal_synced})"
        );
    }
}

/// Copy ships a chunk and commits; the spool files go only once that commit is synced. One
/// chunk at a time, so no other chunk's commit can come between.
#[test]
fn copy_removes_a_chunks_spool_files_only_after_its_completion_is_synced() {
    let p = Pipeline::new("16KiB", "30s", "0s");
    p.generate("in", "jsonl", "null", 2, 300, 22);
    p.stages_ok(&["ferry-extract", "ferry-transform"]);
    let chunks = p.count("SELECT COUNT(*) FROM chunks");
    assert!(chunks >= 3, "{chunks} chunks");
    let spool = format!("{}/", p.path("spool").display());
    let text = traced(&p, "copy", "ferry-copy", &["--once", "--concurrency", "1"]);
    let found = unsynced_at_unlinks(&text, &p, |f| f.starts_with(&spool) && f.ends_with(".parquet"));
    all_synced(&found, chunks as usize, "copy");
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE stage = 'copy' AND state = 'done'"), chunks);
}

/// A corrected source file: load records the new version, and only once that record is
/// synced does it remove the older version's files from the table.
#[test]
fn load_removes_an_older_versions_table_files_only_after_the_newer_versions_record_is_synced() {
    let p = Pipeline::new("16KiB", "30s", "0s");
    p.generate("v1", "jsonl", "null", 1, 300, 23);
    p.generate("v2", "jsonl", "null", 1, 250, 24);
    let first = |d: &str| std::fs::read_dir(p.path(d)).unwrap().next().unwrap().unwrap().path();
    std::fs::copy(first("v1"), p.path("in/data.jsonl")).unwrap();
    p.stages_ok(&["ferry-extract", "ferry-transform", "ferry-copy", "ferry-load"]);
    let old: Vec<String> =
        p.sql("SELECT path FROM published").lines().map(|l| format!("{}", p.path(&format!("wh/{l}")).display())).collect();
    assert!(!old.is_empty());
    std::fs::write(p.path("in/data.jsonl"), std::fs::read(first("v2")).unwrap()).unwrap();
    p.stages_ok(&["ferry-extract", "ferry-transform", "ferry-copy"]);
    let text = traced(&p, "load", "ferry-load", &["--once", "--concurrency", "1"]);
    let found = unsynced_at_unlinks(&text, &p, |f| old.iter().any(|o| o == f));
    all_synced(&found, old.len(), "load");
    assert!(old.iter().all(|o| !std::path::Path::new(o).exists()), "the older version's files are gone");
    ferry_tests::assert_same_rows(&p.table_digest(), &ferry_tests::input_digest("jsonl", &p.path("v2")), "the table holds version 2");
}

/// gc removes spool files of copied chunks and landed copies of published ones, left by a
/// crash and a zombie: each sweep syncs the ledger that calls them finished first (the state it
/// read may be another process's unsynced commit).
#[test]
fn gc_syncs_the_ledger_before_it_removes_spent_spool_and_stray_landed_copies() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.generate("in", "jsonl", "null", 1, 300, 25);
    p.stages_ok(&["ferry-extract", "ferry-transform", "ferry-copy", "ferry-load"]);
    let path = p.sql("SELECT path FROM published ORDER BY path LIMIT 1");
    let chunk = p.sql(&format!("SELECT chunk_id FROM published WHERE path = '{path}'"));
    let part_rel = path.strip_prefix("events/").unwrap().to_string();
    let spent = p.path(&format!("spool/events/{chunk}/{part_rel}"));
    let stray = p.path(&format!("wh/_ferry/landed/events/{chunk}/{part_rel}"));
    for f in [&spent, &stray] {
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::copy(p.path(&format!("wh/{path}")), f).unwrap();
    }
    ferry_tests::age(&p.path(&format!("spool/events/{chunk}")), 60);
    ferry_tests::age(&p.path(&format!("wh/_ferry/landed/events/{chunk}")), 60);
    let text = traced(&p, "gc", "ferry", &["gc", "--older-than", "1s", "--sweep", "spent-spool", "--sweep", "stray-landed"]);
    let (spent, stray) = (spent.display().to_string(), stray.display().to_string());
    let found = unsynced_at_unlinks(&text, &p, |f| f == spent || f == stray);
    all_synced(&found, 2, "gc");
    assert!(!std::path::Path::new(&spent).exists() && !std::path::Path::new(&stray).exists());
}

/// What the trace shows at this process's first write to its stdout of a line containing
/// `said` (within the 32 characters strace shows): the ledger's files written and not yet
/// fsynced, and whether the WAL had been fsynced.
fn unsynced_when_said(text: &str, p: &Pipeline, said: &str) -> Option<(BTreeSet<String>, bool)> {
    let mut state = Unsynced::new(p, &|_| false);
    for (call, name, path) in calls(text) {
        if name == "write" && call.starts_with("write(1<") && call.contains(said) {
            return Some((state.dirty, state.wal_synced));
        }
        state.see(name, path);
    }
    None
}

/// An operator's decision is on disk before the command reports it: a power cut right after
/// `ferry skip` said "skipped" must not bring the chunk back (it would then load after all),
/// nor undo a `ferry rerun` it was told of.
#[test]
fn an_operators_skip_and_rerun_are_synced_before_the_command_reports_them() {
    let p = Pipeline::new("16KiB", "30s", "0s");
    p.generate("in", "jsonl", "null", 1, 300, 26);
    p.stages_ok(&["ferry-extract", "ferry-transform", "ferry-copy", "ferry-load"]);
    let chunk = p.sql("SELECT chunk_id FROM published ORDER BY chunk_id LIMIT 1");
    let text = traced(&p, "rerun", "ferry", &["rerun", "--chunk", &chunk, "--from", "transform"]);
    let (dirty, wal_synced) = unsynced_when_said(&text, &p, &format!("chunk {chunk}")).expect("rerun says what runs again");
    assert!(dirty.is_empty() && wal_synced, "rerun reported with {dirty:?} unsynced (WAL synced before: {wal_synced})");
    let text = traced(&p, "skip", "ferry", &["skip", "--chunk", &chunk, "--reason", "test"]);
    let (dirty, wal_synced) = unsynced_when_said(&text, &p, "skipped 1").expect("skip says it skipped");
    assert!(dirty.is_empty() && wal_synced, "skip reported with {dirty:?} unsynced (WAL synced before: {wal_synced})");
    assert_eq!(p.count(&format!("SELECT COUNT(*) FROM skips WHERE chunk_id = '{chunk}'")), 1);
}
