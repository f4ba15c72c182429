//! `disposition = "archive"` streams a source file to the archive: a file larger than the
//! memory a stage is given (the shipped Kubernetes limit is 512 MiB) is archived whole by an
//! extract that stays far below its size.
//!
//! Alone in its test binary: peak RSS is read with `getrusage(RUSAGE_CHILDREN)`, the largest
//! child this process has waited for, so no other test's children may share the process.

use std::io::Write;

use ferry_tests::{Pipeline, children_max_rss_kib};

/// Far below the file's 320 MiB: what splitting it into 4 MiB chunks needs, and no copy of it.
const LIMIT_KIB: i64 = 192 << 10;

fn blake3_of(p: &std::path::Path) -> String {
    let mut h = blake3::Hasher::new();
    std::io::copy(&mut std::fs::File::open(p).unwrap(), &mut h).unwrap();
    h.finalize().to_hex().to_string()
}

#[test]
fn a_file_larger_than_the_memory_limit_is_archived_whole_in_bounded_memory() {
    let p = Pipeline::new("4MiB", "30s", "0s");
    let archive = p.path("archive");
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    let line = format!("disposition = \"archive\"\narchive_url = \"{}\"", archive.display());
    std::fs::write(&p.config, cfg.replacen("[source]\n", &format!("[source]\n{line}\n"), 1)).unwrap();
    // 320 MiB of JSON lines (the records' content does not matter to extract).
    let src = p.path("in/big.jsonl");
    let mut w = std::io::BufWriter::new(std::fs::File::create(&src).unwrap());
    let (mut n, mut i) = (0u64, 0u64);
    while n < 320 << 20 {
        let l = format!(
            "{{\"event_id\":\"e{i:012}\",\"ts\":\"2026-11-30T12:00:00Z\",\"host\":\"h{}\",\"kind\":\"k\",\"user_id\":{i},\"payload\":\"{}\",\"score\":1.5}}\n",
            i % 7,
            "p".repeat(200)
        );
        w.write_all(l.as_bytes()).unwrap();
        n += l.len() as u64;
        i += 1;
    }
    w.into_inner().unwrap().sync_all().unwrap();
    let want = blake3_of(&src);

    let out = p.stage("ferry-extract");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let peak = children_max_rss_kib();
    println!("extract peak RSS archiving a {} MiB file: {} MiB", n >> 20, peak >> 10);
    assert!(!src.exists(), "the source file went once archived");
    assert_eq!(blake3_of(&archive.join("big.jsonl")), want, "the archive holds the file's bytes");
    assert!(peak < LIMIT_KIB, "extract peaked at {} MiB archiving a {} MiB file", peak >> 10, n >> 20);
    assert_eq!(p.count("SELECT COUNT(*) FROM source_files WHERE state = 'chunked'"), 1);
    let leftovers: Vec<_> = std::fs::read_dir(&archive).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(leftovers.len(), 1, "only the archived file, no temp file: {leftovers:?}");
}
