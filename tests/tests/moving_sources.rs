//! Producers that rename files into place whenever they like: a file replaced while extract
//! reads it. Extract is held at one point of a split (a debug-build gate, see
//! `FERRY_TEST_SPLIT_GATE` in extract), the test renames a corrected file over the source at
//! that instant, and the pipeline then runs to the end: every version that extract read whole
//! is in the table exactly once, and no file it did not take in is removed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use ferry_tests::{Pipeline, STAGES, input_digest};

fn run_all(p: &Pipeline) {
    for s in STAGES {
        let out = p.stage(s);
        assert!(out.status.code().is_some_and(|c| c == 0 || c == 3), "{s}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

fn with_source_setting(p: &Pipeline, line: &str) {
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    std::fs::write(&p.config, cfg.replacen("[source]\n", &format!("[source]\n{line}\n"), 1)).unwrap();
}

/// One generated JSON-lines file of `records` records (seed `seed`), outside the source.
fn version(p: &Pipeline, name: &str, records: u32, seed: u64) -> PathBuf {
    p.generate(name, "jsonl", "null", 1, records, seed);
    std::fs::read_dir(p.path(name)).unwrap().next().unwrap().unwrap().path()
}

/// Renames a copy of `file` over `to`, as a producer delivers a corrected file.
fn rename_over(file: &Path, to: &Path) {
    let tmp = to.with_file_name(".incoming.tmp");
    std::fs::copy(file, &tmp).unwrap();
    std::fs::rename(&tmp, to).unwrap();
}

/// One `extract --once` held at `point` of its split of the one file there is to read; while
/// it waits, `file` is renamed over `to`. Returns once the extract run has ended.
fn extract_with_a_rename_at(p: &Pipeline, point: &str, file: &Path, to: &Path) {
    let gate = p.path(&format!("gate-{point}"));
    std::fs::create_dir_all(&gate).unwrap();
    let mut child = p
        .command("ferry-extract")
        .arg("--once")
        .env("FERRY_TEST_SPLIT_GATE", format!("{point}:{}", gate.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !gate.join("reached").exists() {
        assert!(t.elapsed() < Duration::from_secs(120), "extract never reached the gate {point}");
        if let Some(status) = child.try_wait().unwrap() {
            panic!("extract ended ({status}) before the gate {point}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    rename_over(file, to);
    std::fs::write(gate.join("go"), b"").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.code().is_some_and(|c| c == 0 || c == 3), "extract: {}", String::from_utf8_lossy(&out.stderr));
}

/// The table holds exactly the records of the files in `expect` (a directory of JSON lines).
fn table_holds(p: &Pipeline, files: &[&Path]) {
    let expect = p.path("expect");
    let _ = std::fs::remove_dir_all(&expect);
    std::fs::create_dir_all(&expect).unwrap();
    for (i, f) in files.iter().enumerate() {
        std::fs::copy(f, expect.join(format!("{i}.jsonl"))).unwrap();
    }
    let want = input_digest("jsonl", &expect);
    let got = p.table_digest();
    for k in ["rows", "distinct", "digest"] {
        assert_eq!(got[k], want[k], "{k}: the table holds exactly the expected records ({got} vs {want})");
    }
}

/// Extract read version 1 whole and recorded it; before it removed the file, a corrected
/// version was renamed over the name. The removal takes only the bytes that were read: the
/// correction stays, is taken in on the next pass, and replaces version 1's rows.
fn renamed_over_after_the_read(disposition: &str) {
    let p = Pipeline::new("16KiB", "30s", "0s");
    let archive = p.path("archive");
    with_source_setting(&p, &format!("disposition = \"{disposition}\"\narchive_url = \"{}\"", archive.display()));
    let v1 = version(&p, "v1", 400, 21);
    let v2 = version(&p, "v2", 300, 22);
    let source = p.path("in/data.jsonl");
    rename_over(&v1, &source);
    extract_with_a_rename_at(&p, "after", &v2, &source);
    assert_eq!(std::fs::read(&source).unwrap(), std::fs::read(&v2).unwrap(), "the correction renamed over the name is still there");
    run_all(&p);
    run_all(&p);
    assert!(!source.exists(), "the correction is disposed of once taken in");
    assert_eq!(p.count("SELECT COUNT(*) FROM source_files WHERE uri LIKE '%data.jsonl' AND state = 'chunked'"), 2);
    table_holds(&p, &[&v2]);
    if disposition == "archive" {
        assert_eq!(
            std::fs::read(archive.join("data.jsonl")).unwrap(),
            std::fs::read(&v2).unwrap(),
            "the last version taken in is archived"
        );
    }
    let left: Vec<_> = std::fs::read_dir(p.path("in")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "nothing left aside in the source: {left:?}");
}

#[test]
fn a_file_renamed_over_the_source_after_its_read_is_not_deleted() {
    renamed_over_after_the_read("delete");
}

#[test]
fn a_file_renamed_over_the_source_after_its_read_is_not_archived_in_its_place() {
    renamed_over_after_the_read("archive");
}

/// A file under a known name is hashed first (to recognise bytes taken in before), then split
/// in a second read. A new file renamed over it between the two reads must not be recorded
/// under the first read's hash: with `versions = "keep"` its records would then go in twice
/// (once under each hash). Nothing of that pass is recorded; the next takes the file in once.
#[test]
fn a_file_renamed_over_between_its_hash_and_its_split_is_taken_in_once() {
    let p = Pipeline::new("16KiB", "30s", "0s");
    with_source_setting(&p, "versions = \"keep\"");
    let v1 = version(&p, "v1", 400, 31);
    let v2 = version(&p, "v2", 300, 32);
    let v3 = version(&p, "v3", 350, 33);
    let source = p.path("in/data.jsonl");
    rename_over(&v1, &source);
    run_all(&p);
    table_holds(&p, &[&v1]);
    // Another file under the same name: hashed first, and while extract waits to split it,
    // a third one takes the name.
    rename_over(&v2, &source);
    extract_with_a_rename_at(&p, "before", &v3, &source);
    assert_eq!(
        p.count("SELECT COUNT(*) FROM source_files WHERE uri LIKE '%data.jsonl'"),
        1,
        "nothing recorded for a file that changed between two reads"
    );
    run_all(&p);
    run_all(&p);
    // The second file was replaced before extract read it whole: it never was Ferry's to take.
    table_holds(&p, &[&v1, &v3]);
    assert_eq!(p.count("SELECT COUNT(*) FROM source_files WHERE uri LIKE '%data.jsonl' AND state = 'chunked'"), 2);
}
