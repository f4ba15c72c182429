//! `source.versions = "replace"` on a Delta table: the scenarios the Hive layout goes through
//! (corrections, reverts, skips, reruns, two loads at once, crashes mid-switch), with the table
//! read back by delta-rs.

const FORMAT: &str = "delta";

#[path = "versions/scenarios.rs"]
mod scenarios;

use scenarios::{all_done_and_verified, events, held_at_gate_with, pipeline, put_back, release, settle, stage_ok, table_is};

/// A chunk of version 1 looks (no newer version in the table), then version 2, an empty file,
/// is switched in (it removes what version 1 has in the table: nothing yet), then the chunk
/// commits its files and is killed before anything records it or takes them back out. Its
/// rows must not stay in the table: the load that picks the chunk up again finds it
/// superseded and takes its files out with the withdrawal.
#[test]
fn a_superseded_chunk_killed_after_its_commit_leaves_the_table_when_withdrawn() {
    let p = pipeline();
    std::fs::write(p.path("in/data.jsonl"), events("v1", 200, 0..0)).unwrap();
    for s in ["ferry-extract", "ferry-transform", "ferry-copy"] {
        stage_ok(&p, s);
    }
    let (first, gate) =
        held_at_gate_with(&p, "ferry-load", &["--concurrency", "1"], "FERRY_TEST_DELTA_COMMIT_GATE", |d| d.display().to_string());
    let held = p.sql("SELECT chunk_id FROM tasks WHERE stage = 'load' AND state = 'running'");
    assert_eq!(held.lines().count(), 1, "one chunk held before its commit: {held}");
    // Version 2: the file emptied. Its one chunk switches it in while the first load waits.
    std::fs::write(p.path("in/.data.jsonl.part"), "").unwrap();
    std::fs::rename(p.path("in/.data.jsonl.part"), p.path("in/data.jsonl")).unwrap();
    for s in ["ferry-extract", "ferry-transform", "ferry-copy", "ferry-load"] {
        stage_ok(&p, s);
    }
    let switched = "SELECT COUNT(*) FROM source_files WHERE version = 2 AND switched_at IS NOT NULL";
    assert_eq!(p.count(switched), 1, "version 2 is switched in");
    std::fs::write(gate.join("kill"), b"").unwrap();
    std::fs::write(gate.join("go"), b"").unwrap();
    let out = first.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("killed after the commit"), "the first load was killed after its commit: {said}");
    let log = p.path("wh/events/_delta_log");
    let added_last = std::fs::read_dir(&log)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .max_by_key(|e| e.file_name())
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .unwrap();
    assert!(added_last.contains(&format!("part-{held}-")), "the killed load's commit is the table's newest: {added_last}");
    // Its lease ends (as the lease time would); the next loads find it superseded.
    p.ledger_script("UPDATE tasks SET lease_expires_at = 0 WHERE state = 'running'");
    settle(&p);
    table_is(&p, &[]);
    all_done_and_verified(&p);
}

/// A correction undone brings the old bytes back under the old part names, which the
/// correction's switch removed from the table (their files wait for a vacuum). A vacuum past
/// the retention while a load of the old bytes has placed its parts and not yet committed
/// them must leave those files: the load's commit adds them again.
#[test]
fn a_vacuum_while_an_undone_correction_is_loaded_leaves_the_parts_it_adds_again() {
    let p = pipeline();
    let (v1, v2) = (events("v1", 200, 0..0), events("v2", 150, 0..0));
    std::fs::write(p.path("in/data.jsonl"), &v1).unwrap();
    settle(&p);
    put_back(&p, &v2);
    settle(&p);
    table_is(&p, &[("data.jsonl", &v2)]);
    put_back(&p, &v1);
    for s in ["ferry-extract", "ferry-transform", "ferry-copy"] {
        stage_ok(&p, s);
    }
    let (load, gate) =
        held_at_gate_with(&p, "ferry-load", &["--concurrency", "1"], "FERRY_TEST_DELTA_COMMIT_GATE", |d| d.display().to_string());
    let out = p.command("ferry").args(["vacuum", "--retain", "0s", "--allow-short-retention"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "vacuum: {said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(!said.contains("kept, 0 kept for chunks at work again"), "the old version's parts are kept: {said}");
    release(load, &gate, "the load held before its commit");
    settle(&p);
    table_is(&p, &[("data.jsonl", &v1)]);
    all_done_and_verified(&p);
    // Settled, the correction's own removed parts go with the next vacuum; the table reads the same.
    let out = p.command("ferry").args(["vacuum", "--retain", "0s", "--allow-short-retention"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("kept, 0 kept for chunks at work again"), "{out:?}");
    table_is(&p, &[("data.jsonl", &v1)]);
    all_done_and_verified(&p);
}
