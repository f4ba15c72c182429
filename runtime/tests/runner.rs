//! The stage loop on a real ledger (SQLite in a temp dir): a chunk whose work panics fails that
//! attempt with the panic's message, and the stage carries on with the others.

use std::time::Duration;

use ferry_common::ConfigError;
use ferry_ledger::testing::seed;
use ferry_ledger::{Lease, Ledger, Stage, Work};
use ferry_runtime::runner::{RunOptions, TaskFuture, run};
use sqlx::Connection;

async fn scalar(url: &str, sql: &str) -> i64 {
    let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
    let (v,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_string())).fetch_one(&mut c).await.unwrap();
    v
}

#[tokio::test]
async fn a_panicking_chunk_fails_its_attempt_and_the_stage_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/ledger.db", dir.path().display());
    let ledger = Ledger::connect(&url, Default::default()).await.unwrap();
    let chunks = seed(&ledger, "panics", 3).await;
    let bad = chunks[1].clone();
    let opts = RunOptions { poll: Duration::from_millis(20), ..RunOptions::new(Stage::Transform, 2, true, "test".into()) };
    let work = move |lease: Lease| -> TaskFuture<ConfigError> {
        let bad = bad.clone();
        Box::pin(async move {
            if lease.chunk_id == bad {
                panic!("boom in {}", lease.chunk_id);
            }
            Ok(Work::new(100, 10))
        })
    };
    let summary = run(&ledger, &opts, work, None).await.expect("the stage survives the panic");
    assert_eq!((summary.done, summary.retries, summary.quarantined), (2, 1, 0), "{summary:?}");
    let failed = scalar(
        &url,
        &format!(
            "SELECT COUNT(*) FROM attempts WHERE chunk_id = '{}' AND outcome = 'retryable'
             AND error_class = 'transient' AND error LIKE '%panicked: boom in {}%'",
            chunks[1], chunks[1]
        ),
    )
    .await;
    assert_eq!(failed, 1, "the panic is recorded as the attempt's error");
    assert_eq!(scalar(&url, "SELECT COUNT(*) FROM tasks WHERE stage = 'copy'").await, 2);
}

/// Under `--watch` a chunk the stage before has just handed on is claimed within `handoff`,
/// not a whole `poll`: here the poll is 30 s and the chunk must be worked on within 2 s.
#[tokio::test]
async fn a_handed_on_chunk_is_claimed_between_polls() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/ledger.db", dir.path().display());
    let ledger = Ledger::connect(&url, Default::default()).await.unwrap();
    let chunks = seed(&ledger, "handoff", 1).await;
    let opts = RunOptions {
        poll: Duration::from_secs(30),
        handoff: Duration::from_millis(50),
        ..RunOptions::new(Stage::Copy, 2, false, "test".into())
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let work = move |lease: Lease| -> TaskFuture<ConfigError> {
        let tx = tx.clone();
        Box::pin(async move {
            let _ = tx.send(lease.chunk_id.clone());
            Ok(Work::new(100, 10))
        })
    };
    let copy = {
        let ledger = ledger.clone();
        tokio::spawn(async move { run(&ledger, &opts, work, None).await })
    };
    // The copy stage's first claim, at its start, found nothing: no chunk was transformed yet.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(rx.try_recv().is_err(), "nothing to copy yet");
    let lease = ledger.claim(Stage::Transform, "transform", 1).await.unwrap().pop().unwrap();
    ledger.complete(&lease, Work::new(100, 10)).await.unwrap();
    let handed = std::time::Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(2), rx.recv()).await;
    copy.abort();
    assert_eq!(got.expect("claimed within 2 s of the handoff, with a 30 s poll"), Some(chunks[0].clone()));
    assert!(handed.elapsed() < Duration::from_secs(2));
}
