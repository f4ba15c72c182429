//! kill -9 at every step: each stage killed (SIGKILL through `FERRY_TEST_CRASH_AT`, which debug
//! builds read) at each of its steps in turn, from the same state each time, then the pipeline
//! run to its end; every outcome holds every record exactly once. Its own binary: a few hundred
//! runs of the stages, minutes, outside the quick tier.

use std::process::Output;
use std::time::Duration;

use ferry_tests::{Pipeline, STAGES, copy_tree, input_digest, output_within, temp_files};

fn ok(o: &Output, what: &str) {
    assert!(o.status.success(), "{what} exited {:?}: {}", o.status.code(), String::from_utf8_lossy(&o.stderr));
}

/// Each stage killed (SIGKILL, `FERRY_TEST_CRASH_AT`) at every step of its run in turn: at each
/// ledger call begun or answered and each store change begun or ended, from the same state
/// every time, then the pipeline run to its end. Every outcome publishes every record exactly
/// once and, after gc, leaves no temp file behind.
#[test]
fn each_stage_killed_at_every_step_then_rerun_is_exactly_once() {
    let p = Pipeline::new("32KiB", "30s", "0s");
    p.generate("in", "avro", "null", 2, 400, 11);
    let want = input_digest("avro", &p.path("in"));
    // What a stage's run reads and changes: put back as it was before each kill.
    let state = ["ledger.db", "ledger.db-wal", "ledger.db-shm", "in", "staging", "spool", "wh"];
    let saved = p.path("saved");
    let results = p.path("results");
    let mut report = Vec::new();
    for (i, stage) in STAGES.iter().enumerate() {
        for s in &STAGES[..i] {
            ok(&p.stage(s), s);
        }
        if i == 0 {
            // The ledger's file exists before the first stage runs, so every kill starts from it.
            ok(&p.command("ferry").arg("migrate").output().unwrap(), "migrate");
        }
        p.save(&state, &saved);
        let mut killed = 0;
        for at in 1..2000 {
            p.restore(&state, &saved);
            let o = output_within(p.command(stage).arg("--once").env("FERRY_TEST_CRASH_AT", at.to_string()), Duration::from_secs(120));
            if !String::from_utf8_lossy(&o.stderr).contains("FERRY_TEST_CRASH_AT: killed") {
                ok(&o, &format!("{stage} run to its end"));
                break;
            }
            killed += 1;
            // The killed run's leases end now instead of after the lease; retries are due at once.
            p.ledger_script("UPDATE tasks SET lease_expires_at = 0 WHERE state = 'running'");
            for round in 0..6 {
                for s in STAGES {
                    p.stage_round(s);
                }
                if p.count("SELECT COUNT(*) FROM tasks WHERE state <> 'done'") == 0
                    && p.count("SELECT COUNT(*) FROM source_files WHERE state = 'registered'") == 0
                {
                    break;
                }
                assert!(round < 5, "{stage} killed at step {at}: not drained in six rounds: {}", p.sql(
                    "SELECT group_concat(stage || ' ' || state || ': ' || COALESCE(last_error, ''), '; ') FROM tasks WHERE state <> 'done'"
                ));
                p.ledger_script("UPDATE tasks SET scheduled_at = 0 WHERE state = 'retryable'; UPDATE tasks SET lease_expires_at = 0 WHERE state = 'running'");
            }
            // Temp files a kill left are gc's: every stage's own sweep at start, and `ferry gc`.
            ok(&p.command("ferry").args(["gc", "--older-than", "0s"]).output().unwrap(), "ferry gc");
            assert!(
                temp_files(p.dir.path()).iter().all(|f| f.starts_with(&saved) || f.starts_with(&results)),
                "{stage} killed at step {at}: temp files left: {:?}",
                temp_files(p.dir.path())
            );
            copy_tree(&p.path("wh"), &results.join(format!("{stage}-{at}")));
        }
        assert!(killed >= 5, "{stage} was killed at only {killed} steps");
        report.push(format!("{stage}: {killed} steps"));
        // The state the next stage starts from: this one run to its end.
    }
    eprintln!("killed at every step: {}", report.join(", "));
    // Every outcome, read by pyarrow: every record exactly once.
    let mut outcomes: Vec<std::path::PathBuf> = std::fs::read_dir(&results).unwrap().flatten().map(|e| e.path()).collect();
    outcomes.sort();
    let tables: Vec<std::path::PathBuf> = outcomes.iter().map(|o| o.join("events")).collect();
    for (o, got) in outcomes.iter().zip(ferry_tests::table_digests(&tables)) {
        let what = o.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(got["rows"], want["rows"], "{what}: rows");
        assert_eq!(got["distinct"], want["rows"], "{what}: no duplicates");
        assert_eq!(got["digest"], want["digest"], "{what}: every field");
    }
}
