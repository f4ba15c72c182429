//! The four stages end to end over local directories and a SQLite ledger, checked by an
//! independent reader (pyarrow for the table, Python's own readers for the input).

use std::process::Output;
use std::time::{Duration, SystemTime};

use ferry_tests::{Pipeline, STAGES, input_digest, temp_files};

fn ok(o: &Output, what: &str) {
    assert!(o.status.success(), "{what} exited {:?}: {}", o.status.code(), String::from_utf8_lossy(&o.stderr));
}

fn end_to_end(format: &str, codec: &str) {
    end_to_end_with(format, codec, &[]);
}

/// `transform_env`: extra environment (config overrides) for ferry-transform.
fn end_to_end_with(format: &str, codec: &str, transform_env: &[(&str, &str)]) {
    let p = Pipeline::new("96KiB", "30s", "0s");
    for (k, v) in transform_env {
        p.stage_env("ferry-transform", k, v);
    }
    p.generate("in", format, codec, 3, 2500, 7);
    for s in STAGES {
        ok(&p.stage(s), s);
    }
    let want = input_digest(format, &p.path("in"));
    let got = p.table_digest();
    assert_eq!(want["rows"], 7500);
    assert_eq!(got["rows"], want["rows"], "{format}: rows");
    assert_eq!(got["distinct"], want["distinct"], "{format}: each record exactly once");
    assert_eq!(got["digest"], want["digest"], "{format}: every field equal");
    assert_eq!(got["bad_dt"], 0, "dt partition equals date(ts)");
    assert!(p.sql("SELECT COUNT(*) FROM chunks").parse::<i64>().unwrap() > 3, "files were split into chunks");
    assert_eq!(p.sql("SELECT COUNT(*) FROM tasks WHERE state <> 'done'"), "0");
    assert_eq!(p.sql("SELECT SUM(records) FROM published"), "7500");
    let ddl = std::fs::read_to_string(p.path("wh/events/_ferry/ddl.sql")).unwrap();
    assert!(ddl.contains("CREATE EXTERNAL TABLE") && ddl.contains("ADD IF NOT EXISTS PARTITION (`dt`="), "{ddl}");
    assert!(temp_files(p.dir.path()).is_empty(), "temp files left: {:?}", temp_files(p.dir.path()));
    assert_eq!(std::fs::read_dir(p.path("spool/events")).map(|d| d.count()).unwrap_or(0), 0, "spool emptied after copy");

    // Which writer made the files (the footer's created_by): Ferry's page encoder for zstd.
    let files = published_files(&p);
    let writer = if transform_env.is_empty() { "Parquet pages by ferry" } else { "parquet-rs version" };
    for (f, _) in &files {
        let bytes = std::fs::read(f).unwrap();
        assert!(bytes.windows(writer.len()).any(|w| w == writer.as_bytes()), "{f} not written by {writer}");
    }

    // Running every stage again changes nothing.
    let attempts = p.sql("SELECT COUNT(*) FROM attempts");
    for s in STAGES {
        ok(&p.stage(s), s);
    }
    assert_eq!(published_files(&p), files);
    assert_eq!(p.sql("SELECT COUNT(*) FROM attempts"), attempts);
    assert_eq!(p.table_digest()["digest"], want["digest"]);
}

fn published_files(p: &Pipeline) -> Vec<(String, u64)> {
    let mut v = Vec::new();
    let mut stack = vec![p.path("wh/events")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else {
                v.push((e.path().display().to_string(), m.len()));
            }
        }
    }
    v.retain(|(f, _)| !f.contains("/_ferry/"));
    v.sort();
    v
}

#[test]
fn avro_end_to_end() {
    end_to_end("avro", "deflate");
}

#[test]
fn avro_snappy_and_zstd_end_to_end() {
    end_to_end("avro", "snappy");
    end_to_end("avro", "zstandard");
}

/// Codecs other than zstd and none go through parquet's ArrowWriter rather than Ferry's own
/// page encoder (transform/src/encode.rs): the same table comes out.
#[test]
fn arrow_writer_path_end_to_end() {
    end_to_end_with("avro", "null", &[("FERRY_TRANSFORM_COMPRESSION", "snappy")]);
    end_to_end_with("csv", "null", &[("FERRY_TRANSFORM_COMPRESSION", "gzip"), ("FERRY_TRANSFORM_COMPRESSION_LEVEL", "6")]);
}

#[test]
fn jsonl_end_to_end() {
    end_to_end("jsonl", "null");
}

#[test]
fn csv_end_to_end() {
    end_to_end("csv", "null");
}

fn set_old(path: &std::path::Path) {
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(600)).unwrap();
}

/// A truncated Avro file, an invalid JSON line, a CSV row with the wrong column count and a
/// file still being written: each ends rejected or quarantined with a reason, the rest is
/// published exactly once.
#[test]
fn bad_input_is_set_aside_with_reasons_and_the_rest_flows() {
    let p = Pipeline::new("64KiB", "30s", "5s");
    // Good data, whose digest is what the table must hold.
    p.generate("good", "jsonl", "null", 1, 800, 21);
    p.generate("good", "csv", "null", 1, 800, 22);
    let good_json = std::fs::read_dir(p.path("good")).unwrap().flatten().find(|e| e.path().extension().unwrap() == "jsonl").unwrap().path();
    let good_csv = std::fs::read_dir(p.path("good")).unwrap().flatten().find(|e| e.path().extension().unwrap() == "csv").unwrap().path();
    let mut want_rows = 0;
    for f in ["jsonl", "csv"] {
        want_rows += input_digest(f, &p.path("good"))["rows"].as_u64().unwrap();
    }

    // The JSON file with one invalid line in the middle (line 401).
    let text = std::fs::read_to_string(&good_json).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.insert(400, "{\"event_id\": \"broken\", \"ts\": ");
    std::fs::write(p.path("in/a.jsonl"), lines.join("\n") + "\n").unwrap();
    // The CSV file with one row of the wrong column count appended.
    let mut csv = std::fs::read_to_string(&good_csv).unwrap();
    csv.push_str("only,three,fields\n");
    std::fs::write(p.path("in/b.csv"), csv).unwrap();
    // A truncated Avro file.
    p.generate("trunc", "avro", "deflate", 1, 500, 23);
    let avro = std::fs::read_dir(p.path("trunc")).unwrap().flatten().next().unwrap().path();
    let bytes = std::fs::read(&avro).unwrap();
    std::fs::write(p.path("in/c.avro"), &bytes[..bytes.len() - 300]).unwrap();
    for f in ["in/a.jsonl", "in/b.csv", "in/c.avro"] {
        set_old(&p.path(f));
    }
    // A file still being written: its mtime is fresh.
    std::fs::write(p.path("in/d.jsonl"), "{\"event_id\": \"half").unwrap();

    let out = p.stage("ferry-extract");
    assert_eq!(out.status.code(), Some(3), "extract quarantined a file: {}", String::from_utf8_lossy(&out.stderr));
    for s in &STAGES[1..] {
        ok(&p.stage(s), s);
    }
    let reason = p.sql("SELECT error FROM source_files WHERE uri LIKE '%c.avro'");
    assert!(reason.contains("c.avro") && reason.contains("truncated"), "{reason}");
    assert_eq!(p.sql("SELECT COUNT(*) FROM source_files WHERE uri LIKE '%d.jsonl'"), "0", "unfinished file not ingested");
    let json_reject = p.sql("SELECT position || ': ' || reason FROM rejects WHERE reason LIKE '%a.jsonl%'");
    assert!(json_reject.contains("line 401") && json_reject.contains("invalid JSON"), "{json_reject}");
    let csv_reject = p.sql("SELECT position || ': ' || reason FROM rejects WHERE reason LIKE '%b.csv%'");
    assert!(csv_reject.contains("record 801") && csv_reject.contains("3 fields"), "{csv_reject}");
    let got = p.table_digest();
    assert_eq!(got["rows"].as_u64().unwrap(), want_rows);
    assert_eq!(got["distinct"].as_u64().unwrap(), want_rows);
    let rejects = std::fs::read_dir(p.path("spool/rejects/events")).unwrap().count();
    assert!(rejects >= 2, "rejects files written");

    // Too many bad records in one chunk quarantine that chunk, not the run.
    let many: String = (0..10).map(|i| format!("not json {i}\n")).collect();
    std::fs::write(p.path("in/e.jsonl"), many).unwrap();
    set_old(&p.path("in/e.jsonl"));
    p.stage("ferry-extract");
    let out = p.stage("ferry-transform");
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let why = p.sql("SELECT last_error FROM tasks WHERE state = 'quarantined'");
    assert!(why.contains("e.jsonl") && why.contains("max_bad_records"), "{why}");
}
