//! Durable before destructive: extract deletes (or archives) a source file only once its
//! chunks and the ledger rows naming them are on stable storage. (The unlink is of the file
//! moved aside for disposal, `.ferry-aside.<name>`: the move itself destroys nothing.) The ledger commits without
//! waiting for the disk (SQLite in WAL mode, `synchronous = NORMAL`), so a power loss right
//! after the unlink could take the commit with it and leave the file nowhere.
//!
//! The order is read from the system calls themselves (strace): every write to the ledger's
//! WAL and every staged chunk must have been fsynced before the source file is unlinked. A
//! power loss keeps exactly what was fsynced, so this is what one would leave.

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
        let trace = p.path(&format!("strace-{i}.txt"));
        let out = Command::new("strace")
            .args(["-f", "-y", "-qq", "-e", "trace=write,pwrite64,writev,pwritev,fsync,fdatasync,unlink,unlinkat", "-o"])
            .arg(&trace)
            .arg(bin("ferry-extract"))
            .arg("--config")
            .arg(&p.config)
            .arg("--once")
            .env_remove("FERRY_LEDGER")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let aside = file.with_file_name(format!(".ferry-aside.{}", g.file_name().unwrap().to_string_lossy()));
        let unsynced = unsynced_at_unlink(&std::fs::read_to_string(&trace).unwrap(), &p, &aside.display().to_string());
        assert_eq!(unsynced, Some(BTreeSet::new()), "{} was unlinked while these were written and not synced", file.display());
        assert!(!file.exists() && !aside.exists());
    }
    assert_eq!(p.count("SELECT COUNT(*) FROM source_files WHERE state = 'chunked'"), 3);
}

/// Reads an strace log: the paths (the ledger's WAL, staged chunks) written and not yet
/// fsynced when `target` was unlinked, in the order the calls were made; None if it never was.
fn unsynced_at_unlink(text: &str, p: &Pipeline, target: &str) -> Option<BTreeSet<String>> {
    let wal = format!("{}-wal>", p.path("ledger.db").display());
    let staging = format!("{}/", p.path("staging").display());
    let mut dirty: BTreeSet<String> = BTreeSet::new();
    for line in text.lines() {
        // "PID syscall(fd</path>, ..." ; a call resumed later is counted where it started.
        let Some(call) = line.split_once(' ').map(|(_, rest)| rest.trim_start()) else { continue };
        if call.starts_with("<...") {
            continue;
        }
        let name = call.split('(').next().unwrap_or_default();
        let path = call.split_once('<').and_then(|(_, r)| r.split_once('>')).map(|(p, _)| format!("{p}>"));
        match name {
            "write" | "pwrite64" | "writev" | "pwritev" => {
                if let Some(path) = path.filter(|p| *p == wal || p.starts_with(&staging)) {
                    dirty.insert(path);
                }
            }
            "fsync" | "fdatasync" => {
                if let Some(path) = path {
                    dirty.remove(&path);
                }
            }
            "unlink" | "unlinkat" if call.split('"').nth(1) == Some(target) => return Some(dirty),
            _ => {}
        }
    }
    None
}
