//! `source.versions = "replace"` on a Hive-layout table: the scenarios shared with the Delta
//! table's binary (`versions_delta.rs`), and those of the Hive layout's own steps (a switch
//! made of one rename per part, which can fail part-way; table files with no ledger row).

const FORMAT: &str = "hive";

#[path = "versions/scenarios.rs"]
mod scenarios;

use ferry_tests::files_under;
use scenarios::{all_done_and_verified, events, ferry_ok, held_at_gate_with, pipeline, run_all, settle, stage_ok, table_is};

/// Two loads (two hosts) on one corrected version: the first moves a part into the table and
/// stops there; the second runs meanwhile; then the first's next part fails (a conflict), and
/// it takes back what it moved. Before, the switch guard lived in each process, so the second
/// load switched the version in beside the first, recorded its chunks and retracted the older
/// version; the first then took its part back out, and the table showed the new version
/// without it, the old one gone. The switch is now the ledger's, one load lease at a time: the
/// second load waits, the version stays out whole while its chunk is quarantined, and goes in
/// whole once the operator requeues it.
#[test]
fn two_loads_on_one_version_keep_it_whole_when_one_fails_part_way() {
    let p = pipeline();
    let v1 = events("v1", 300, 0..0);
    std::fs::write(p.path("in/data.jsonl"), &v1).unwrap();
    settle(&p);
    table_is(&p, &[("data.jsonl", &v1)]);
    let v2 = events("v2", 400, 0..0);
    std::fs::write(p.path("in/data.jsonl"), &v2).unwrap();
    for s in ["ferry-extract", "ferry-transform", "ferry-copy"] {
        stage_ok(&p, s);
    }
    let chunks = p.count("SELECT COUNT(*) FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE f.version = 2");
    assert!(chunks >= 3, "{chunks} chunks");
    let (first, gate) = held_at_gate_with(&p, "ferry-load", &["--concurrency", "1"], "FERRY_TEST_SWITCH_GATE", |d| d.display().to_string());
    let second = p.command("ferry-load").args(["--once", "--concurrency", "1"]).output().unwrap();
    let said = String::from_utf8_lossy(&second.stderr);
    // Its chunks wait for the first load's switch (as a --once run, it says it made no progress).
    assert!(second.status.code().is_some(), "the second load: {said}");
    std::fs::write(gate.join("fail"), b"").unwrap();
    std::fs::write(gate.join("go"), b"").unwrap();
    let out = first.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "the first load's chunk is quarantined: {said}");
    table_is(&p, &[("data.jsonl", &v1)]);
    let chunk = p.sql("SELECT chunk_id FROM tasks WHERE stage = 'load' AND state = 'quarantined'");
    ferry_ok(&p, &["requeue", "--chunk", &chunk]);
    settle(&p);
    table_is(&p, &[("data.jsonl", &v2)]);
    all_done_and_verified(&p);
}

/// A switch that moved every chunk's parts into the table and died before recording its own;
/// then an operator skips one of the waiting chunks. Its parts are in the table (only the store
/// says so: no row names them yet), so `ferry skip` refuses it. A skip that raced the switch
/// (it looked before the moves and committed after them) is let through; the switch's retry
/// then records the rest and takes the skipped chunk's parts back out: no table file without a
/// row naming it. The crash and the race are reproduced by leaving the ledger as those
/// instants do (version 1 was corrupt, so there is no older version to retract and the table
/// is exactly as the crash leaves it).
#[test]
fn a_skip_while_a_switch_is_under_way_leaves_no_unrecorded_part_in_the_table() {
    let p = pipeline();
    std::fs::write(p.path("in/data.jsonl"), b"\x1f\x8b\x08\x00gzip, not JSON lines").unwrap();
    stage_ok(&p, "ferry-extract");
    assert_eq!(p.count("SELECT COUNT(*) FROM source_files WHERE state = 'quarantined'"), 1);
    let v2 = events("v2", 300, 0..0);
    std::fs::write(p.path("in/data.jsonl"), &v2).unwrap();
    run_all(&p);
    let switcher = p.sql("SELECT MIN(chunk_id) FROM published");
    assert!(!switcher.is_empty(), "one chunk switched version 2 in");
    let waiting = p.sql("SELECT MIN(chunk_id) FROM tasks WHERE stage = 'load' AND state <> 'done'");
    assert!(!waiting.is_empty(), "the switch is under way: a chunk has not recorded its parts");
    p.ledger_script(&format!(
        "DELETE FROM published WHERE chunk_id = '{switcher}';
             UPDATE tasks SET state = 'available', finalized_at = NULL, scheduled_at = 0 WHERE chunk_id = '{switcher}' AND stage = 'load';"
    ));
    let out = p.command("ferry").args(["skip", "--chunk", &waiting, "--reason", "test"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "a load whose parts are in the table is not skipped: {said}");
    assert!(said.contains("in the table already"), "{said}");
    p.ledger_script(&format!(
        "UPDATE tasks SET state = 'done', finalized_at = 1, epoch = epoch + 1, last_error = 'skipped by an operator: test'
               WHERE chunk_id = '{waiting}' AND stage = 'load';
             INSERT INTO skips (chunk_id, stage, reason, skipped_at) VALUES ('{waiting}', 'load', 'test', 1);"
    ));
    settle(&p);
    all_done_and_verified(&p);
    let skipped = p.count(&format!("SELECT records FROM chunks WHERE id = '{waiting}'"));
    assert_eq!(p.count(&format!("SELECT COUNT(*) FROM published WHERE chunk_id = '{waiting}'")), 0);
    assert_eq!(p.table_digest()["rows"], serde_json::json!(300 - skipped), "version 2 without the skipped chunk");
    // The skipped chunk's parts went back to their landed names. Version 3 replaces version 2
    // and `ferry prune` takes version 2's tasks before gc runs: gc still finds them.
    let landed = p.path(&format!("wh/_ferry/landed/events/{waiting}"));
    assert!(!files_under(&landed).is_empty(), "the skipped chunk's parts wait under {}", landed.display());
    let v3 = events("v3", 200, 0..0);
    std::fs::write(p.path("in/data.jsonl"), &v3).unwrap();
    settle(&p);
    table_is(&p, &[("data.jsonl", &v3)]);
    ferry_ok(&p, &["prune", "--older-than", "0s"]);
    assert_eq!(p.count(&format!("SELECT COUNT(*) FROM tasks WHERE chunk_id = '{waiting}'")), 0, "prune took its tasks");
    ferry_ok(&p, &["gc", "--older-than", "0s"]);
    assert!(files_under(&landed).is_empty(), "gc removed {}", landed.display());
    all_done_and_verified(&p);
}

/// With `versions = "keep"` a reused name is another file, and each chunk publishes only its
/// own parts: a chunk of the second file whose load could not run is skipped even though its
/// siblings' rows are in the table (the check for a sibling's switch is for `replace` only;
/// before, the skip was refused). The load that could not run is reproduced by leaving the
/// ledger and the table as a quarantined load leaves them.
#[test]
fn with_versions_kept_a_chunk_of_a_reused_name_can_be_skipped() {
    let p = pipeline();
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    std::fs::write(&p.config, cfg.replacen("[source]\n", "[source]\nversions = \"keep\"\n", 1)).unwrap();
    let (v1, v2) = (events("v1", 300, 0..0), events("v2", 300, 0..0));
    std::fs::write(p.path("in/data.jsonl"), &v1).unwrap();
    settle(&p);
    std::fs::write(p.path("in/data.jsonl"), &v2).unwrap();
    settle(&p);
    let chunk = p.sql("SELECT MIN(c.id) FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE f.version = 2");
    for path in p.sql(&format!("SELECT GROUP_CONCAT(path, char(10)) FROM published WHERE chunk_id = '{chunk}'")).lines() {
        std::fs::remove_file(p.path(&format!("wh/{path}"))).unwrap();
    }
    p.ledger_script(&format!(
        "DELETE FROM published WHERE chunk_id = '{chunk}';
             UPDATE tasks SET state = 'quarantined', last_error = 'test' WHERE chunk_id = '{chunk}' AND stage = 'load';"
    ));
    ferry_ok(&p, &["skip", "--chunk", &chunk, "--reason", "test"]);
    let skipped = p.count(&format!("SELECT records FROM chunks WHERE id = '{chunk}'"));
    assert_eq!(p.table_digest()["rows"], serde_json::json!(600 - skipped), "both files, without the skipped chunk");
    all_done_and_verified(&p);
}
