//! Copy's memory is bounded by `copy.bytes_in_flight`, not by how many chunks it copies at once
//! nor by how large their files are: 64 chunks at once (the HDFS default) of 4 MiB parts to a
//! real MiniDFS cluster, where every close waits on the NameNode, stay far below what the
//! chunks in flight would hold unbounded.
//!

use std::fmt::Write;

use ferry_tests::clusters::MiniDfs;
use ferry_tests::{Pipeline, run_with_peak_rss};

/// Each part's size once inflated (copy moves bytes; what they hold does not matter to it).
const PART: usize = 4 << 20;
/// The budget the test gives copy.
const BUDGET: &str = "16MiB";
/// The process without any upload (a debug build, its runtime, the ledger, the HDFS clients)
/// plus the budget twice over (an upload's piece in flight and the next one being read).
const LIMIT_KIB: i64 = 128 << 10;

fn ok(o: &std::process::Output, what: &str) {
    assert!(o.status.success(), "{what} exited {:?}: {}", o.status.code(), String::from_utf8_lossy(&o.stderr));
}

#[test]
fn copy_to_hdfs_holds_no_more_than_its_byte_budget() {
    let a = MiniDfs::start("A");
    let dest = format!("[destination]\nurl = \"{}/wh\"\n", a.url);
    let p = Pipeline::with_stores("32KiB", "30s", "0s", None, Some(dest));
    p.generate("in", "avro", "deflate", 40, 300, 5);
    ok(&p.stage("ferry-extract"), "extract");
    ok(&p.stage("ferry-transform"), "transform");

    // Every part in the spool made 4 MiB of pseudo-random bytes, and the ledger told their
    // size and hash (what copy checks every byte against).
    let spool = p.path("spool/events");
    let mut sql = String::new();
    let mut parts = 0;
    for chunk in std::fs::read_dir(&spool).unwrap().flatten() {
        let chunk_id = chunk.file_name().to_string_lossy().into_owned();
        for dir in std::fs::read_dir(chunk.path()).unwrap().flatten().filter(|e| e.path().is_dir()) {
            let partition = dir.file_name().to_string_lossy().into_owned();
            for f in std::fs::read_dir(dir.path()).unwrap().flatten() {
                let name = f.file_name().to_string_lossy().into_owned();
                if !name.ends_with(".parquet") {
                    continue;
                }
                let mut bytes = vec![0u8; PART];
                blake3::Hasher::new().update(f.path().to_string_lossy().as_bytes()).finalize_xof().fill(&mut bytes);
                std::fs::write(f.path(), &bytes).unwrap();
                let hash = blake3::hash(&bytes).to_hex();
                writeln!(
                    sql,
                    "UPDATE parts SET bytes = {PART}, content_hash = '{hash}' WHERE chunk_id = '{chunk_id}' AND partition = '{partition}' AND name = '{name}';"
                )
                .unwrap();
                parts += 1;
            }
        }
    }
    assert!(parts >= 64, "want many parts, got {parts}");
    p.ledger_script(&sql);
    assert_eq!(p.count(&format!("SELECT COUNT(*) FROM parts WHERE bytes = {PART}")), parts);

    let cfg = std::fs::read_to_string(&p.config).unwrap();
    std::fs::write(&p.config, format!("{cfg}\n[copy]\nconcurrency = 64\nbytes_in_flight = \"{BUDGET}\"\n")).unwrap();
    let log = p.path("copy.log");
    let (status, peak) = run_with_peak_rss(p.command("ferry-copy").arg("--once"), &log);
    assert!(status.success(), "copy exited {status}: {}", std::fs::read_to_string(&log).unwrap());
    println!("copy peak RSS moving {parts} parts of {} MiB, budget {BUDGET}: {} MiB", PART >> 20, peak >> 10);
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE stage = 'copy' AND state <> 'done'"), 0, "every chunk copied");
    // Every part is on the cluster whole, as Hadoop's own client sees it.
    let du = String::from_utf8_lossy(&a.fs(&["-du", "-s", "/wh"]).stdout).into_owned();
    let total: i64 = du.split_whitespace().next().unwrap().parse().unwrap();
    assert_eq!(total, parts * PART as i64, "{du}");
    assert!(peak < LIMIT_KIB, "copy peaked at {} MiB with a budget of {BUDGET}", peak >> 10);
}
