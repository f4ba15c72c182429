//! The stage loop on a real ledger: a chunk whose work panics fails that attempt with the
//! panic's message, and the stage carries on with the others.

mod support;

use std::sync::Arc;
use std::time::Duration;

use ferry_common::ConfigError;
use ferry_ledger::runner::{RunOptions, TaskFuture, run};
use ferry_ledger::{Lease, Stage, Work};
use support::{Db, TestDb, seed};

#[tokio::test]
async fn a_panicking_chunk_fails_its_attempt_and_the_stage_goes_on() {
    let t = TestDb::new(Db::Sqlite).await;
    let ledger = t.ledger(Default::default(), None).await;
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
    let summary = run(&ledger, &opts, work, Arc::new(|_: &Lease| {})).await.expect("the stage survives the panic");
    assert_eq!((summary.done, summary.retries, summary.quarantined), (2, 1, 0), "{summary:?}");
    let failed = t
        .scalar(&format!(
            "SELECT COUNT(*) FROM attempts WHERE chunk_id = '{}' AND outcome = 'retryable'
             AND error_class = 'transient' AND error LIKE '%panicked: boom in {}%'",
            chunks[1], chunks[1]
        ))
        .await;
    assert_eq!(failed, 1, "the panic is recorded as the attempt's error");
    assert_eq!(t.scalar("SELECT COUNT(*) FROM tasks WHERE stage = 'copy'").await, 2);
}
