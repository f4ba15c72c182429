//! The ledger under database trouble, against a real Postgres: lost connections are retried,
//! and a call blocked by a lock ends at its deadline instead of hanging.

mod support;

use std::time::{Duration, Instant};

use ferry_ledger::{Lease, LedgerOptions, NewChunk, NewSourceFile, RangeKind, Stage, Work, chunk_id};
use sqlx::Connection;
use support::{Db, TestDb};

async fn seed_one(ledger: &ferry_ledger::Ledger) {
    let f = ledger
        .register_file(&NewSourceFile {
            uri: "file:///src/a".into(),
            size: 1,
            mtime_ms: 1,
            content_hash: "h".into(),
            format: Some(ferry_common::config::Format::Csv),
            change_token: None,
        })
        .await
        .unwrap();
    let c = NewChunk {
        id: chunk_id("default", "h", 0),
        seq: 0,
        range_kind: RangeKind::Bytes,
        range_start: 0,
        range_end: 1,
        records: Some(1),
        bytes: 1,
        content_hash: "c".into(),
        location: "file:///staging/a".into(),
    };
    ledger.record_chunks(f.id, &[c], Stage::Transform).await.unwrap();
}

#[tokio::test]
async fn postgres_lost_connections_are_retried() {
    let t = TestDb::new(Db::Postgres).await;
    let ledger = t.ledger(LedgerOptions { max_connections: 2, ..LedgerOptions::default() }, None).await;
    seed_one(&ledger).await;
    let dbname = t.url.rsplit('/').next().unwrap().to_string();
    // Kill every server process serving the ledger's pool, as a failover or restart would.
    let mut admin = sqlx::PgConnection::connect(&t.url).await.unwrap();
    let killed: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = $1 AND application_name = 'ferry') k",
    )
    .bind(&dbname)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(killed >= 1, "the ledger held no connection to kill");
    // The next calls hit dead connections, get an I/O error, and retry on fresh ones.
    let leases = ledger.claim(Stage::Transform, "w", 1).await.expect("claim survives a lost connection");
    assert_eq!(leases.len(), 1);
    ledger.complete(&leases[0], Work::default()).await.unwrap();
    assert_eq!(t.scalar("SELECT COUNT(*) FROM tasks WHERE state = 'done'").await, 1);
}

/// A ledger with short lock and call deadlines and one claimed task, so a blocked call shows.
async fn claimed_with_short_deadlines(db: Db, lock_timeout: Duration) -> (TestDb, ferry_ledger::Ledger, Lease) {
    let t = TestDb::new(db).await;
    let opts = LedgerOptions { lock_timeout, call_timeout: Duration::from_secs(2), call_retries: 1, ..LedgerOptions::default() };
    let ledger = t.ledger(opts, None).await;
    seed_one(&ledger).await;
    let lease = ledger.claim(Stage::Transform, "w", 1).await.unwrap().pop().unwrap();
    (t, ledger, lease)
}

#[tokio::test]
async fn postgres_call_blocked_by_a_lock_ends_at_its_deadline() {
    let (t, ledger, lease) = claimed_with_short_deadlines(Db::Postgres, Duration::from_millis(500)).await;
    // Another session holds the task's row lock and never lets go.
    let mut blocker = sqlx::PgConnection::connect(&t.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut blocker).await.unwrap();
    sqlx::query("SELECT * FROM tasks FOR UPDATE").execute(&mut blocker).await.unwrap();
    let started = Instant::now();
    let err = ledger.heartbeat(&lease).await.expect_err("a blocked call must fail, not hang");
    let took = started.elapsed();
    assert!(err.is_transient(), "a lock timeout is transient: {err}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
    ledger.heartbeat(&lease).await.unwrap();
}

#[tokio::test]
async fn sqlite_writer_blocked_by_another_process_ends_at_busy_timeout() {
    let (t, ledger, lease) = claimed_with_short_deadlines(Db::Sqlite, Duration::from_millis(300)).await;
    // A foreign writer (another process, as far as this ledger knows) holds the write lock.
    let mut blocker = sqlx::SqliteConnection::connect(&t.url).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE").execute(&mut blocker).await.unwrap();
    let started = Instant::now();
    let err = ledger.complete(&lease, Work::default()).await.expect_err("blocked write must fail, not hang");
    assert!(err.is_transient(), "SQLITE_BUSY is transient: {err}");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
    ledger.complete(&lease, Work::default()).await.unwrap();
}
