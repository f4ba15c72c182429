//! What the Delta test binaries share: a pipeline whose table is a Delta table, the table's
//! log and rows as other readers see them, and delta-rs as another engine writing to it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use ferry_tests::Pipeline;

/// A pipeline whose table is a Delta table.
pub fn delta_pipeline(chunk: &str) -> Pipeline {
    Pipeline::new(chunk, "30s", "0s").table_format("delta")
}

pub fn table(p: &Pipeline) -> PathBuf {
    p.path("wh/events")
}

/// The log's commits, by version.
pub fn commits(dir: &Path) -> Vec<(i64, Vec<serde_json::Value>)> {
    let mut out: Vec<(i64, Vec<serde_json::Value>)> = std::fs::read_dir(dir.join("_delta_log"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let v = name.strip_suffix(".json")?.parse::<i64>().ok()?;
                    let text = std::fs::read_to_string(e.path()).unwrap();
                    Some((v, text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort_by_key(|(v, _)| *v);
    out
}

pub fn same(got: &serde_json::Value, want: &serde_json::Value, what: &str) {
    for k in ["rows", "distinct", "digest"] {
        assert_eq!(got[k], want[k], "{what}: {k} ({got} vs {want})");
    }
}

/// Every version of the table, as delta-rs reads it: no record twice in any of them.
pub fn no_version_doubles(dir: &Path) -> Vec<serde_json::Value> {
    let versions = commits(dir);
    let last = versions.last().map_or(-1, |(v, _)| *v);
    assert_eq!(versions.iter().map(|(v, _)| *v).collect::<Vec<_>>(), (0..=last).collect::<Vec<_>>(), "the log has no gap");
    let all: Vec<(PathBuf, Option<i64>)> = (0..=last).map(|v| (dir.to_path_buf(), Some(v))).collect();
    let digests = ferry_tests::delta_digests(&all);
    for (v, d) in digests.iter().enumerate() {
        assert_eq!(d["rows"], d["distinct"], "version {v} holds a record twice: {d}");
        assert_eq!(d["bad_dt"], 0, "version {v}: rows in the wrong partition");
    }
    digests
}

pub fn drained(p: &Pipeline) {
    p.drain(6);
    let left =
        p.sql("SELECT COUNT(*) || ' ' || COALESCE(group_concat(stage || ': ' || last_error, '; '), '') FROM tasks WHERE state <> 'done'");
    assert_eq!(left.trim(), "0", "every task done");
}

/// The table's active files, as delta-rs lists them.
pub fn delta_files(dir: &Path) -> Vec<String> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys, os, json; from deltalake import DeltaTable; print(json.dumps(DeltaTable(sys.argv[1]).file_uris())); \
             sys.stdout.flush(); os._exit(0)",
        ])
        .arg(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `n` event lines whose ids start with `tag`.
pub fn events(tag: &str, n: usize) -> String {
    (0..n)
        .map(|i| {
            format!(
                "{{\"event_id\":\"{tag}-{i:05}\",\"ts\":\"2026-11-{:02}T10:{:02}:00Z\",\"host\":\"h\",\"kind\":\"k\",\"user_id\":{i},\"payload\":\"{}\",\"score\":null}}\n",
                20 + i % 3,
                i % 60,
                "p".repeat(60)
            )
        })
        .collect()
}

/// delta-rs (another engine) on Ferry's table: `code` run with `dt` = `DeltaTable(<table>)`.
pub fn other_engine(dir: &Path, code: &str) {
    let script = format!("import sys\nfrom deltalake import DeltaTable\ndt = DeltaTable(sys.argv[1])\n{code}\n");
    let out = Command::new("python3").arg("-c").arg(&script).arg(dir).output().unwrap();
    assert!(out.status.success(), "delta-rs: {}", String::from_utf8_lossy(&out.stderr));
}

/// The table's metaData as delta-rs reads it: configuration, description, and each column's
/// metadata.
pub fn table_metadata(dir: &Path) -> serde_json::Value {
    let script = "import sys, json\nfrom deltalake import DeltaTable\ndt = DeltaTable(sys.argv[1])\nm = dt.metadata()\n\
                  print(json.dumps({'configuration': m.configuration, 'description': m.description, \
                  'columns': {f.name: f.metadata for f in dt.schema().fields}}))";
    let out = Command::new("python3").arg("-c").arg(script).arg(dir).output().unwrap();
    assert!(out.status.success(), "delta-rs: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}
