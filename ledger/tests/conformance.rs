//! The ledger conformance suite: every test runs against SQLite and against a real Postgres.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_common::error::ErrorClass;
use ferry_ledger::Error;
use ferry_ledger::clock::ManualClock;
use ferry_ledger::{
    Backoff, FailOutcome, Lease, Ledger, LedgerOptions, NewChunk, NewSourceFile, RangeKind, Reject, RequeueFilter, Stage, Work, chunk_id,
};
use support::{Db, T0, TestDb, seed};

fn opts() -> LedgerOptions {
    LedgerOptions {
        lease: Duration::from_secs(30),
        max_attempts: 3,
        backoff: Backoff { min: Duration::from_secs(10), max: Duration::from_secs(60), factor: 2.0 },
        reclaim_interval: Duration::ZERO,
        ..LedgerOptions::default()
    }
}

async fn claim_one(ledger: &Ledger, worker: &str) -> Option<Lease> {
    let mut l = ledger.claim(Stage::Transform, worker, 1).await.unwrap();
    assert!(l.len() <= 1);
    l.pop()
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
               async fn $name() { super::$name(super::Db::Sqlite).await } )*
        }
        mod postgres {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
               async fn $name() { super::$name(super::Db::Postgres).await } )*
        }
    };
}

conformance!(
    racing_workers_each_task_held_once_none_lost,
    stale_epoch_cannot_complete,
    expired_lease_is_reclaimed_and_old_holder_rejected,
    backoff_is_respected,
    quarantine_after_max_attempts_then_requeue,
    permanent_error_skips_retries,
    migrations_twice_and_concurrently,
    complete_is_idempotent_and_enqueues_next_stage,
    release_does_not_count_an_attempt,
    registration_is_idempotent_and_versions_changes,
    views_and_constraints,
    copies_stay_on_the_spool_node_of_their_transform,
    free_text_with_a_nul_is_recorded,
    a_file_of_many_chunks_is_recorded_whole_and_once,
    due_answers_as_the_claim_would,
);

/// `due` (the read a `--watch` stage makes between polls) says yes exactly when a claim would
/// find a task: by stage, by backoff time, by spool node, and not for a task already claimed.
async fn due_answers_as_the_claim_would(db: Db) {
    let t = TestDb::new(db).await;
    let clock = ManualClock::new(T0);
    let a = t.ledger(opts(), Some(&clock)).await.with_node("host-a");
    let b = a.clone().with_node("host-b");
    assert!(!a.due(Stage::Transform).await.unwrap(), "an empty ledger");
    seed(&a, "due", 1).await;
    assert!(a.due(Stage::Transform).await.unwrap());
    assert!(!a.due(Stage::Copy).await.unwrap() && !a.due(Stage::Load).await.unwrap(), "nothing handed on yet");
    let l = a.claim(Stage::Transform, "ta", 1).await.unwrap().pop().unwrap();
    assert!(!a.due(Stage::Transform).await.unwrap(), "claimed: not due again");
    // A failed attempt is due at its backoff's end, not before.
    let FailOutcome::Retry { at_ms } = a.fail(&l, ErrorClass::Transient, "reset", Work::default()).await.unwrap() else { panic!() };
    clock.set(at_ms - 1);
    assert!(!a.due(Stage::Transform).await.unwrap(), "before its backoff ends");
    clock.set(at_ms);
    assert!(a.due(Stage::Transform).await.unwrap(), "at its backoff's end");
    // Transformed on host A: its copy is due there, and not on host B, whose claim finds nothing.
    let l = a.claim(Stage::Transform, "ta", 1).await.unwrap().pop().unwrap();
    a.complete(&l, Work::default()).await.unwrap();
    assert!(a.due(Stage::Copy).await.unwrap());
    assert!(!b.due(Stage::Copy).await.unwrap());
    assert!(b.claim(Stage::Copy, "cb", 1).await.unwrap().is_empty());
    assert_eq!(a.claim(Stage::Copy, "ca", 1).await.unwrap().len(), 1);
}

async fn racing_workers_each_task_held_once_none_lost(db: Db) {
    let t = TestDb::new(db).await;
    let ledger = t.ledger(LedgerOptions { reclaim_interval: Duration::from_secs(3600), ..opts() }, None).await;
    let ids = seed(&ledger, "race", 300).await;

    // Which worker holds each task right now; a second holder is a violation.
    let held: Arc<Mutex<HashMap<i64, String>>> = Default::default();
    let completed: Arc<Mutex<Vec<i64>>> = Default::default();
    let mut workers = Vec::new();
    for w in 0..8 {
        let ledger = ledger.clone();
        let held = held.clone();
        let completed = completed.clone();
        workers.push(tokio::spawn(async move {
            let me = format!("worker-{w}");
            loop {
                let leases = ledger.claim(Stage::Transform, &me, 4).await.unwrap();
                if leases.is_empty() {
                    break;
                }
                for l in &leases {
                    let prev = held.lock().unwrap().insert(l.task_id, me.clone());
                    assert!(prev.is_none(), "task {} claimed by {me} while held by {prev:?}", l.task_id);
                }
                tokio::task::yield_now().await;
                for l in leases {
                    held.lock().unwrap().remove(&l.task_id);
                    ledger.complete(&l, Work::new(100, 10)).await.unwrap();
                    completed.lock().unwrap().push(l.task_id);
                }
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    let completed = completed.lock().unwrap().clone();
    let distinct: HashSet<_> = completed.iter().collect();
    assert_eq!(completed.len(), ids.len(), "every task completed exactly once");
    assert_eq!(distinct.len(), ids.len());
    assert_eq!(t.scalar("SELECT COUNT(*) FROM tasks WHERE stage = 'transform' AND state = 'done'").await, 300);
    assert_eq!(t.scalar("SELECT COUNT(*) FROM tasks WHERE stage = 'copy' AND state = 'available'").await, 300);
    assert_eq!(t.scalar("SELECT COUNT(*) FROM attempts WHERE outcome = 'done'").await, 300);
    assert_eq!(t.scalar("SELECT COUNT(*) FROM tasks WHERE attempt <> 1 AND stage = 'transform'").await, 0);
}

async fn stale_epoch_cannot_complete(db: Db) {
    let t = TestDb::new(db).await;
    let clock = ManualClock::new(T0);
    let ledger = t.ledger(opts(), Some(&clock)).await;
    seed(&ledger, "stale", 1).await;
    let a = claim_one(&ledger, "a").await.unwrap();
    clock.advance(Duration::from_secs(31));
    let b = claim_one(&ledger, "b").await.expect("expired lease is claimable again");
    assert_eq!(b.task_id, a.task_id);
    assert!(b.epoch > a.epoch);
    let err = ledger.complete(&a, Work::default()).await.unwrap_err();
    match &err {
        Error::LeaseLost { held_epoch, current_epoch, current_state, .. } => {
            assert_eq!(*held_epoch, a.epoch);
            assert_eq!(*current_epoch, b.epoch);
            assert_eq!(*current_state, Some(ferry_ledger::TaskState::Running));
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    assert!(err.to_string().contains("lease lost"), "{err}");
    assert_eq!(err.class(), ErrorClass::Permanent);
    // The zombie can neither fail, heartbeat nor release either.
    assert!(matches!(ledger.fail(&a, ErrorClass::Transient, "x", Work::default()).await, Err(Error::LeaseLost { .. })));
    assert!(matches!(ledger.heartbeat(&a).await, Err(Error::LeaseLost { .. })));
    assert!(matches!(ledger.release(&a, Work::default()).await, Err(Error::LeaseLost { .. })));
    ledger.complete(&b, Work::default()).await.unwrap();
    assert_eq!(t.scalar("SELECT COUNT(*) FROM attempts WHERE outcome = 'done'").await, 1);
    assert_eq!(t.scalar("SELECT COUNT(*) FROM attempts WHERE outcome = 'lease_expired'").await, 1);
}

async fn expired_lease_is_reclaimed_and_old_holder_rejected(db: Db) {
    let t = TestDb::new(db).await;
    let clock = ManualClock::new(T0);
    let ledger = t.ledger(opts(), Some(&clock)).await;
    seed(&ledger, "expire", 2).await;
    let a = claim_one(&ledger, "a").await.unwrap();
    // A heartbeat keeps the lease alive past its first expiry.
    clock.advance(Duration::from_secs(20));
    ledger.heartbeat(&a).await.unwrap();
    clock.advance(Duration::from_secs(20));
    assert_eq!(ledger.reclaim_expired().await.unwrap(), 0, "heartbeat extended the lease");
    assert_eq!(t.scalar("SELECT COUNT(*) FROM stuck_leases").await, 0);
    // Then the holder goes silent.
    clock.advance(Duration::from_secs(31));
    // `stuck_leases` (an operator's view, on the database's own clock, not the test's) shows
    // the lease once it is past: put its expiry a minute into the database's past.
    t.try_execute(&format!(
        "UPDATE tasks SET lease_expires_at = {} WHERE id = {}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64 - 60_000,
        a.task_id
    ))
    .await
    .unwrap();
    assert_eq!(t.scalar(&format!("SELECT COUNT(*) FROM stuck_leases WHERE task_id = {}", a.task_id)).await, 1);
    assert_eq!(t.scalar("SELECT COUNT(*) FROM stuck_leases").await, 1, "only the silent holder's lease");
    let overdue = t.scalar("SELECT overdue_ms FROM stuck_leases").await;
    assert!((60_000..600_000).contains(&overdue), "overdue {overdue} ms");
    assert_eq!(ledger.reclaim_expired().await.unwrap(), 1);
    assert_eq!(t.scalar("SELECT COUNT(*) FROM stuck_leases").await, 0, "reclaimed: no longer stuck");
    assert_eq!(t.scalar(&format!("SELECT COUNT(*) FROM tasks WHERE id = {} AND state = 'retryable'", a.task_id)).await, 1);
    assert!(matches!(ledger.heartbeat(&a).await, Err(Error::LeaseLost { .. })));
    assert!(matches!(ledger.complete(&a, Work::default()).await, Err(Error::LeaseLost { .. })));
    // The reclaimed task is claimable at once (a lost lease is not the task's fault).
    let mut got = ledger.claim(Stage::Transform, "b", 10).await.unwrap();
    got.sort_by_key(|l| l.task_id);
    assert_eq!(got.len(), 2);
    let again = got.iter().find(|l| l.task_id == a.task_id).unwrap();
    assert_eq!(again.attempt, 2);
    for l in &got {
        ledger.complete(l, Work::default()).await.unwrap();
    }
    assert_eq!(t.scalar("SELECT COUNT(*) FROM tasks WHERE state = 'done'").await, 2);
}

async fn backoff_is_respected(db: Db) {
    let t = TestDb::new(db).await;
    let clock = ManualClock::new(T0);
    let o = LedgerOptions { max_attempts: 5, ..opts() };
    let ledger = t.ledger(o, Some(&clock)).await;
    seed(&ledger, "backoff", 1).await;
    let l = claim_one(&ledger, "a").await.unwrap();
    let FailOutcome::Retry { at_ms } = ledger.fail(&l, ErrorClass::Transient, "reset", Work::default()).await.unwrap() else {
        panic!("transient failure must be retried")
    };
    // Equal jitter: between half the ceiling (5 s) and the ceiling (10 s).
    assert!((T0 + 5_000..=T0 + 10_000).contains(&at_ms), "retry at +{} ms", at_ms - T0);
    clock.set(at_ms - 1);
    assert!(claim_one(&ledger, "a").await.is_none(), "claimed before scheduled_at");
    clock.set(at_ms);
    let l2 = claim_one(&ledger, "a").await.expect("due at scheduled_at");
    assert_eq!(l2.attempt, 2);
    // The second failure waits twice as long: 10..20 s.
    let now = clock_now(&clock);
    let FailOutcome::Retry { at_ms } = ledger.fail(&l2, ErrorClass::Transient, "reset", Work::default()).await.unwrap() else { panic!() };
    assert!((now + 10_000..=now + 20_000).contains(&at_ms), "retry at +{} ms", at_ms - now);
    clock.set(now + 9_999);
    assert!(claim_one(&ledger, "a").await.is_none());
    assert_eq!(t.scalar("SELECT COUNT(*) FROM attempts WHERE outcome = 'retryable' AND error = 'reset'").await, 2);
    // Doubling stops at the cap (60 s here): attempts 3 and 4 wait 20..40 s and 30..60 s, never more.
    let mut at = at_ms;
    for (attempt, (lo, hi)) in [(3, (20_000, 40_000)), (4, (30_000, 60_000))] {
        clock.set(at);
        let l = claim_one(&ledger, "a").await.expect("due");
        assert_eq!(l.attempt, attempt);
        let now = clock_now(&clock);
        let FailOutcome::Retry { at_ms } = ledger.fail(&l, ErrorClass::Transient, "reset", Work::default()).await.unwrap() else {
            panic!()
        };
        assert!((now + lo..=now + hi).contains(&at_ms), "attempt {attempt}: retry at +{} ms", at_ms - now);
        at = at_ms;
    }
    // However many attempts, the wait stays between half the cap and the cap.
    let cap = LedgerOptions { max_attempts: 5, ..opts() }.backoff;
    for attempt in [5, 10, 40, 1_000] {
        let d = cap.delay(attempt);
        assert!((Duration::from_secs(30)..=Duration::from_secs(60)).contains(&d), "attempt {attempt}: {d:?}");
    }
}

fn clock_now(c: &ManualClock) -> i64 {
    use ferry_ledger::clock::Clock;
    c.now_ms()
}

async fn quarantine_after_max_attempts_then_requeue(db: Db) {
    let t = TestDb::new(db).await;
    let clock = ManualClock::new(T0);
    let ledger = t.ledger(opts(), Some(&clock)).await;
    let ids = seed(&ledger, "q", 2).await;
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let got = ledger.claim(Stage::Transform, "a", 10).await.unwrap();
        let mut mine = None;
        for l in got {
            if l.chunk_id == ids[0] { mine = Some(l) } else { ledger.release(&l, Work::default()).await.unwrap() }
        }
        let l = mine.expect("the failing chunk is due again after its backoff");
        outcomes.push(ledger.fail(&l, ErrorClass::Transient, "connection reset", Work::default()).await.unwrap());
        clock.advance(Duration::from_secs(61));
    }
    assert!(matches!(outcomes[0], FailOutcome::Retry { .. }));
    assert!(matches!(outcomes[1], FailOutcome::Retry { .. }));
    assert_eq!(outcomes[2], FailOutcome::Quarantined);
    let q = format!(
        "SELECT COUNT(*) FROM tasks WHERE chunk_id = '{}' AND state = 'quarantined' AND finalized_at IS NOT NULL \
         AND last_error LIKE '%gave up after 3 attempts%' AND last_error_class = 'transient'",
        ids[0]
    );
    assert_eq!(t.scalar(&q).await, 1);
    // A quarantined task is never claimed again...
    clock.advance(Duration::from_secs(3600));
    let rest = ledger.claim(Stage::Transform, "a", 10).await.unwrap();
    assert!(rest.iter().all(|l| l.chunk_id != ids[0]));
    for l in &rest {
        ledger.release(l, Work::default()).await.unwrap();
    }
    let q = format!("SELECT COUNT(*) FROM recent_failures WHERE chunk_id = '{}' AND outcome <> 'released'", ids[0]);
    assert_eq!(t.scalar(&q).await, 3);
    // ...until requeued, with a fresh budget.
    let n = ledger.requeue(&RequeueFilter { stage: Some(Stage::Transform), chunk_id: None }).await.unwrap();
    assert_eq!(n, 1);
    let again = ledger.claim(Stage::Transform, "a", 10).await.unwrap();
    let l = again.iter().find(|l| l.chunk_id == ids[0]).expect("requeued task is claimable");
    assert_eq!(l.attempt, 1);
}

async fn permanent_error_skips_retries(db: Db) {
    let t = TestDb::new(db).await;
    let clock = ManualClock::new(T0);
    let ledger = t.ledger(opts(), Some(&clock)).await;
    seed(&ledger, "perm", 1).await;
    let l = claim_one(&ledger, "a").await.unwrap();
    let out = ledger.fail(&l, ErrorClass::Permanent, "invalid JSON at line 7", Work::default()).await.unwrap();
    assert_eq!(out, FailOutcome::Quarantined);
    assert_eq!(
        t.scalar(
            "SELECT COUNT(*) FROM tasks WHERE state = 'quarantined' AND attempt = 1 \
             AND last_error = 'invalid JSON at line 7' AND last_error_class = 'permanent'"
        )
        .await,
        1
    );
    clock.advance(Duration::from_secs(3600));
    assert!(claim_one(&ledger, "a").await.is_none());
}

async fn migrations_twice_and_concurrently(db: Db) {
    // cron starts every stage in the same minute on a new host: the first start of several
    // processes on one new ledger must never fail ("database is locked" once did, on SQLite).
    // Fresh ledgers, many rounds, because the race is rare.
    let rounds = if db == Db::Sqlite { 50 } else { 3 };
    for _ in 0..rounds {
        let t = TestDb::new(db).await;
        let starts: Vec<_> = (0..6)
            .map(|_| {
                let url = t.url.clone();
                std::thread::spawn(move || {
                    // Own runtimes on own threads: as close to separate processes as a test gets.
                    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                    rt.block_on(Ledger::connect(&url, opts())).map(|_| ())
                })
            })
            .collect();
        for s in starts {
            s.join().unwrap().expect("concurrent start-up migrates without error");
        }
    }
    let t = TestDb::new(db).await;
    let mut starts = Vec::new();
    for _ in 0..6 {
        let url = t.url.clone();
        starts.push(tokio::spawn(async move { Ledger::connect(&url, opts()).await.map(|_| ()) }));
    }
    for s in starts {
        s.await.unwrap().expect("concurrent start-up migrates without error");
    }
    let ledger = t.ledger(opts(), None).await;
    ledger.migrate().await.unwrap();
    ledger.migrate().await.unwrap();
    let versions = t.scalar("SELECT COUNT(*) FROM _sqlx_migrations").await;
    assert_eq!(versions, std::fs::read_dir("../migrations/sqlite").unwrap().count() as i64);
    seed(&ledger, "after-migrate", 1).await;
}

async fn complete_is_idempotent_and_enqueues_next_stage(db: Db) {
    let t = TestDb::new(db).await;
    let clock = ManualClock::new(T0);
    let ledger = t.ledger(opts(), Some(&clock)).await;
    let ids = seed(&ledger, "next", 1).await;
    let l = claim_one(&ledger, "a").await.unwrap();
    ledger.complete(&l, Work::new(100, 10)).await.unwrap();
    // A retry of the same call (its reply was lost) is a success and records nothing more.
    ledger.complete(&l, Work::new(100, 10)).await.unwrap();
    assert_eq!(t.scalar("SELECT COUNT(*) FROM attempts").await, 1);
    let copy = ledger.claim(Stage::Copy, "c", 5).await.unwrap();
    assert_eq!(copy.len(), 1);
    assert_eq!(copy[0].chunk_id, ids[0]);
    ledger.complete(&copy[0], Work::default()).await.unwrap();
    let load = ledger.claim(Stage::Load, "l", 5).await.unwrap();
    ledger.complete(&load[0], Work::default()).await.unwrap();
    assert_eq!(t.scalar("SELECT COUNT(*) FROM tasks WHERE state = 'done'").await, 3);
    assert_eq!(ledger.pending(Stage::Load).await.unwrap(), 0);
}

async fn copies_stay_on_the_spool_node_of_their_transform(db: Db) {
    let t = TestDb::new(db).await;
    let clock = ManualClock::new(T0);
    let a = t.ledger(opts(), Some(&clock)).await.with_node("host-a");
    let b = a.clone().with_node("host-b");
    let ids = seed(&a, "nodes", 3).await;
    // Host A transforms two chunks, host B the third.
    let on_a: Vec<Lease> = a.claim(Stage::Transform, "ta", 2).await.unwrap();
    let on_b: Vec<Lease> = b.claim(Stage::Transform, "tb", 5).await.unwrap();
    assert_eq!((on_a.len(), on_b.len()), (2, 1));
    for l in on_a.iter().chain(&on_b) {
        a.complete(l, Work::default()).await.unwrap();
    }
    // Each host copies only what its own spool holds.
    let copies_b = b.claim(Stage::Copy, "cb", 5).await.unwrap();
    assert_eq!(copies_b.iter().map(|l| &l.chunk_id).collect::<Vec<_>>(), vec![&on_b[0].chunk_id]);
    assert!(b.claim(Stage::Copy, "cb", 5).await.unwrap().is_empty(), "A's chunks are not B's to copy");
    assert_eq!(t.scalar("SELECT chunks FROM copy_backlog_by_node WHERE node = 'host-a'").await, 2);
    // A is gone for good: its chunks go back to transform, and then belong to whoever does it.
    let mut waiting = a.copies_waiting_on("host-a").await.unwrap();
    waiting.sort();
    let mut want: Vec<String> = on_a.iter().map(|l| l.chunk_id.clone()).collect();
    want.sort();
    assert_eq!(waiting, want);
    for c in &waiting {
        b.rerun(c, Stage::Transform, false).await.unwrap();
    }
    let again = b.claim(Stage::Transform, "tb", 5).await.unwrap();
    assert_eq!(again.len(), 2);
    for l in &again {
        b.complete(l, Work::default()).await.unwrap();
    }
    assert_eq!(b.claim(Stage::Copy, "cb", 5).await.unwrap().len(), 2, "B copies them now");
    assert!(a.copies_waiting_on("host-a").await.unwrap().is_empty());
    assert_eq!(ids.len(), 3);
}

async fn release_does_not_count_an_attempt(db: Db) {
    let t = TestDb::new(db).await;
    let clock = ManualClock::new(T0);
    let ledger = t.ledger(opts(), Some(&clock)).await;
    seed(&ledger, "rel", 1).await;
    let l = claim_one(&ledger, "a").await.unwrap();
    // What the released attempt had sent is its redone work.
    ledger.release(&l, Work { bytes: 300, records: 0, redone_bytes: 300 }).await.unwrap();
    let l2 = claim_one(&ledger, "b").await.unwrap();
    assert_eq!(l2.attempt, 1);
    assert!(l2.epoch > l.epoch);
    assert_eq!(t.scalar("SELECT COUNT(*) FROM attempts WHERE outcome = 'released'").await, 1);
    assert_eq!(t.scalar("SELECT bytes FROM redone_work WHERE outcome = 'released'").await, 300);
}

async fn registration_is_idempotent_and_versions_changes(db: Db) {
    let t = TestDb::new(db).await;
    let ledger = t.ledger(opts(), None).await;
    let f = NewSourceFile {
        uri: "file:///src/a.jsonl".into(),
        size: 10,
        mtime_ms: T0,
        content_hash: "aaa".into(),
        format: Some(ferry_common::config::Format::Jsonl),
        change_token: Some("dev:ino:ctime1".into()),
    };
    let a = ledger.register_file(&f).await.unwrap();
    let a2 = ledger.register_file(&f).await.unwrap();
    assert_eq!(a, a2);
    assert_eq!(a.version, 1);
    let found = ledger.find_file(&f.uri, 10, T0, Some("dev:ino:ctime1"), true).await.unwrap().unwrap();
    assert_eq!(found.id, a.id);
    // Same size and mtime, but rewritten (another ctime), or a store with no token: not
    // found, so the caller hashes the bytes instead of skipping them.
    assert!(ledger.find_file(&f.uri, 10, T0, Some("dev:ino:ctime2"), true).await.unwrap().is_none());
    assert!(ledger.find_file(&f.uri, 10, T0, None, true).await.unwrap().is_none());
    let changed = NewSourceFile { size: 12, mtime_ms: T0 + 1, content_hash: "bbb".into(), ..f.clone() };
    let b = ledger.register_file(&changed).await.unwrap();
    assert_ne!(b.id, a.id);
    assert_eq!(b.version, 2);
    // The first bytes back (a correction undone), registered again with their new token: an
    // older version is not "known" to a caller that replaces versions (its revival may not
    // have happened), and is to one that keeps them.
    let back = NewSourceFile { change_token: Some("dev:ino:ctime3".into()), ..f.clone() };
    assert_eq!(ledger.register_file(&back).await.unwrap().id, a.id);
    assert!(ledger.find_file(&f.uri, 10, T0, Some("dev:ino:ctime3"), true).await.unwrap().is_none());
    assert_eq!(ledger.find_file(&f.uri, 10, T0, Some("dev:ino:ctime3"), false).await.unwrap().unwrap().id, a.id);
    // Recording chunks twice (a crash between the two) leaves one set.
    let chunk = NewChunk {
        id: chunk_id("default", "bbb", 0),
        seq: 0,
        range_kind: RangeKind::Records,
        range_start: 0,
        range_end: 5,
        records: Some(5),
        bytes: 12,
        content_hash: "c".into(),
        location: "file:///staging/x".into(),
    };
    ledger.record_chunks(b.id, std::slice::from_ref(&chunk), Stage::Transform).await.unwrap();
    ledger.record_chunks(b.id, &[chunk], Stage::Transform).await.unwrap();
    assert_eq!(t.scalar("SELECT COUNT(*) FROM chunks").await, 1);
    assert_eq!(t.scalar("SELECT COUNT(*) FROM tasks").await, 1);
    assert_eq!(t.scalar("SELECT COUNT(*) FROM source_files WHERE state = 'chunked'").await, 1);
}

/// Chunks are recorded many rows per statement: a file of more chunks than one statement
/// holds (here 2.4 statements' worth) gets every chunk and its task, each with its own values,
/// and recording it again (a crash before the caller saw the commit) adds nothing.
async fn a_file_of_many_chunks_is_recorded_whole_and_once(db: Db) {
    let t = TestDb::new(db).await;
    let ledger = t.ledger(opts(), None).await;
    let ids = seed(&ledger, "many.jsonl", 1201).await;
    let again = seed(&ledger, "many.jsonl", 1201).await;
    assert_eq!(ids, again);
    assert_eq!(t.scalar("SELECT COUNT(*) FROM chunks").await, 1201);
    assert_eq!(t.scalar("SELECT COUNT(DISTINCT seq) FROM chunks").await, 1201);
    assert_eq!(t.scalar("SELECT CAST(SUM(seq) AS BIGINT) FROM chunks").await, 1200 * 1201 / 2);
    assert_eq!(t.scalar("SELECT COUNT(*) FROM chunks WHERE range_start = seq * 100 AND range_end = seq * 100 + 100").await, 1201);
    assert_eq!(t.scalar("SELECT COUNT(*) FROM tasks WHERE stage = 'transform' AND state = 'available'").await, 1201);
    assert_eq!(t.scalar("SELECT COUNT(*) FROM tasks t JOIN chunks c ON c.id = t.chunk_id").await, 1201);
    assert_eq!(t.scalar("SELECT MAX(chunks) FROM source_files WHERE state = 'chunked'").await, 1201);
}

async fn views_and_constraints(db: Db) {
    let t = TestDb::new(db).await;
    let ledger = t.ledger(opts(), None).await;
    seed(&ledger, "views", 3).await;
    let leases = ledger.claim(Stage::Transform, "v", 3).await.unwrap();
    // A done attempt that sent 7 bytes twice (a retried request), a failed one that sent 40.
    ledger.complete(&leases[0], Work { bytes: 100, records: 10, redone_bytes: 7 }).await.unwrap();
    ledger.fail(&leases[1], ErrorClass::Transient, "timeout", Work { bytes: 40, records: 0, redone_bytes: 40 }).await.unwrap();
    assert_eq!(t.scalar("SELECT COUNT(*) FROM backlog").await, 4); // transform done/retryable/running, copy available
    assert_eq!(t.scalar("SELECT tasks FROM backlog WHERE stage = 'transform' AND state = 'running'").await, 1);
    assert_eq!(t.scalar("SELECT bytes FROM redone_work WHERE stage = 'transform' AND outcome = 'retryable'").await, 40);
    assert_eq!(t.scalar("SELECT bytes FROM redone_work WHERE stage = 'transform' AND outcome = 'done'").await, 7);
    assert_eq!(t.scalar("SELECT redone_bytes FROM attempts WHERE outcome = 'done'").await, 7);
    assert_eq!(t.scalar("SELECT records FROM throughput WHERE stage = 'transform'").await, 10);
    assert_eq!(t.scalar("SELECT COUNT(*) FROM recent_failures").await, 1);
    assert_eq!(t.scalar("SELECT COUNT(*) FROM stuck_leases").await, 0);
    let st = ledger.status().await.unwrap();
    assert_eq!(st.redone_attempts, 1);
    assert_eq!(st.redone_bytes, 47);
    // The CHECK constraints hold the state machine together.
    assert!(t.try_execute("UPDATE tasks SET state = 'bogus'").await.is_err());
    assert!(t.try_execute("UPDATE tasks SET state = 'running', lease_owner = NULL WHERE state = 'available'").await.is_err());
    assert!(t.try_execute("UPDATE tasks SET finalized_at = NULL WHERE state = 'done'").await.is_err());
    assert!(t.try_execute("UPDATE tasks SET last_error_class = 'maybe'").await.is_err());
}

/// Input decides what a reason holds: a NUL in a rejected value (Postgres refuses it in
/// `text`) must not make the chunk's rejects, its notes or its errors impossible to record.
async fn free_text_with_a_nul_is_recorded(db: Db) {
    let t = TestDb::new(db).await;
    let ledger = t.ledger(opts(), None).await;
    seed(&ledger, "nul", 1).await;
    let l = claim_one(&ledger, "a").await.unwrap();
    let reject = Reject { position: "line 1".into(), reason: "column \"s\": expected a number, got a\0b".into() };
    ledger.record_parts(&l, &[], &[reject]).await.unwrap();
    ledger.note_chunk(&l.chunk_id, &["header name \"x\0y\" matches no column".into()]).await.unwrap();
    ledger.fail(&l, ErrorClass::Transient, "read \0 failed", Work::default()).await.unwrap();
    // Stored with the NUL written as two characters, `\0` (LIKE escapes differ by backend).
    let shown = "column \"s\": expected a number, got a\\0b";
    let sql = format!("SELECT COUNT(*) FROM rejects WHERE reason LIKE 'column %' AND length(reason) = {}", shown.len());
    assert_eq!(t.scalar(&sql).await, 1);
    assert_eq!(t.scalar("SELECT COUNT(*) FROM chunk_notes").await, 1);
    assert_eq!(t.scalar("SELECT COUNT(*) FROM attempts WHERE error LIKE 'read %'").await, 1);
}

/// `ferry skip` and `ferry rerun` read a chunk's tasks and then write them. On Postgres a
/// worker can claim a task between the read and the write: the write must leave that task
/// running (its worker's side effects are its own), and say it could not. The claim is held
/// open in a transaction of its own while the admin command runs, then committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_skip_and_rerun_leave_a_task_claimed_meanwhile_alone() {
    use sqlx::Connection;
    let t = TestDb::new(Db::Postgres).await;
    let ledger = t.ledger(opts(), None).await;
    let ids = seed(&ledger, "claimed-meanwhile", 2).await;
    // Chunk 1 gets past transform, so a rerun from transform has a done task to reset.
    let first = ledger.claim(Stage::Transform, "w0", 1).await.unwrap().pop().unwrap();
    let rerun_chunk = first.chunk_id.clone();
    ledger.complete(&first, Work::default()).await.unwrap();
    let skip_chunk = ids.iter().find(|c| **c != rerun_chunk).unwrap().clone();
    for (chunk, stage) in [(skip_chunk.clone(), "transform"), (rerun_chunk.clone(), "copy")] {
        let mut claim = sqlx::PgConnection::connect(&t.url).await.unwrap();
        sqlx::query("BEGIN").execute(&mut claim).await.unwrap();
        sqlx::query(
            "UPDATE tasks SET state = 'running', attempt = attempt + 1, epoch = epoch + 1, lease_owner = 'w1',
                lease_expires_at = $2, attempted_at = $2 WHERE chunk_id = $1 AND stage = $3",
        )
        .bind(&chunk)
        .bind(T0 + 60_000)
        .bind(stage)
        .execute(&mut claim)
        .await
        .unwrap();
        let admin = {
            let ledger = ledger.clone();
            let chunk = chunk.clone();
            tokio::spawn(async move {
                if stage == "transform" {
                    ledger.skip(&chunk, "test", false, true).await.map(|_| ())
                } else {
                    ledger.rerun(&chunk, Stage::Transform, false).await.map(|_| ())
                }
            })
        };
        // The admin command has read the tasks and now waits on the claimed row's lock.
        tokio::time::sleep(Duration::from_millis(500)).await;
        sqlx::query("COMMIT").execute(&mut claim).await.unwrap();
        let e = admin.await.unwrap().unwrap_err().to_string();
        assert!(e.contains("running") || e.contains("no task to skip"), "{e}");
        let sql = format!("SELECT COUNT(*) FROM tasks WHERE chunk_id = '{chunk}' AND stage = '{stage}' AND state = 'running'");
        assert_eq!(t.scalar(&sql).await, 1, "the claimed {stage} task of {chunk} is still its worker's");
        assert_eq!(t.scalar(&format!("SELECT COUNT(*) FROM skips WHERE chunk_id = '{chunk}'")).await, 0);
    }
    assert_eq!(
        t.scalar(&format!("SELECT COUNT(*) FROM tasks WHERE chunk_id = '{rerun_chunk}' AND stage = 'transform' AND state = 'done'")).await,
        1,
        "the rerun changed nothing"
    );
}

/// Postgres: `make_durable` flushes the WAL up to every commit made before it, also those the
/// server acknowledged without flushing them (`synchronous_commit = off`, which docs/operations.md
/// calls safe because of this). The WAL writer flushes such commits by itself within
/// `wal_writer_delay` (200 ms by default), so each check comes right after the call, and five
/// rounds keep a `make_durable` that flushed nothing from passing by luck (it did flush
/// nothing once: its transaction wrote no WAL before its commit record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_make_durable_flushes_every_earlier_commit() {
    use sqlx::Connection;
    let t = TestDb::new(Db::Postgres).await;
    let ledger = t.ledger(opts(), None).await;
    let mut c = sqlx::PgConnection::connect(&t.url).await.unwrap();
    sqlx::query("SET synchronous_commit = off").execute(&mut c).await.unwrap();
    sqlx::query("CREATE TABLE async_writes (n BIGINT)").execute(&mut c).await.unwrap();
    for round in 0..5 {
        sqlx::query("INSERT INTO async_writes VALUES (1)").execute(&mut c).await.unwrap();
        let written: String = sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text").fetch_one(&mut c).await.unwrap();
        ledger.make_durable().await.unwrap();
        let flushed: String = sqlx::query_scalar("SELECT pg_current_wal_flush_lsn()::text").fetch_one(&mut c).await.unwrap();
        let on_disk: bool =
            sqlx::query_scalar("SELECT $1::pg_lsn >= $2::pg_lsn").bind(&flushed).bind(&written).fetch_one(&mut c).await.unwrap();
        assert!(on_disk, "round {round}: WAL flushed to {flushed} after make_durable, an earlier commit wrote up to {written}");
    }
}
