//! SQLite's batched completions. On SQLite the cost of a statement is mostly the hop to
//! sqlx's connection thread and back (measured: ~60% of CPU in thread wake-ups), so N
//! concurrent completions become one multi-row UPDATE committed by whichever caller holds the
//! writer lock; the others return as soon as their row is in.

use ferry_common::error::ErrorClass;

use crate::state::TaskState;
use crate::{Error, Lease, Ledger, Result, Work, db};

/// Most completions committed in one SQLite transaction (bounded by SQLite's 32766 parameters).
const COMPLETION_BATCH: usize = 256;

/// A completion waiting for the SQLite writer.
#[derive(Debug)]
pub(crate) struct Completion {
    pub(crate) lease: Lease,
    pub(crate) work: Work,
    pub(crate) now: i64,
    pub(crate) reply: Option<tokio::sync::oneshot::Sender<Result<bool>>>,
}

/// Commits a batch of completions as one multi-row UPDATE; only rows still `running` at the
/// caller's epoch change. A single statement is atomic and takes SQLite's write lock when it
/// starts, so it needs no BEGIN/COMMIT round trips. Returns the ids of the rows it changed.
async fn flush_completions(pool: &sqlx::SqlitePool, batch: &[Completion]) -> Result<Vec<i64>> {
    use std::fmt::Write;
    let now = batch.iter().map(|c| c.now).max().unwrap_or_default();
    let mut sql = String::from(
        "UPDATE tasks SET state = $2, finalized_at = $1, lease_owner = NULL,
            lease_expires_at = NULL, last_error = NULL, last_error_class = NULL,
            bytes = v.column3, records = v.column4, redone_bytes = v.column5
         FROM (VALUES ",
    );
    for i in 0..batch.len() {
        let b = 5 * i + 3;
        let _ = write!(sql, "{}(${}, ${}, ${}, ${}, ${})", if i > 0 { ", " } else { "" }, b + 1, b + 2, b + 3, b + 4, b + 5);
    }
    sql.push_str(
        ") AS v WHERE tasks.id = v.column1 AND tasks.epoch = v.column2 AND tasks.state = $3
         RETURNING tasks.id",
    );
    // Only numbered placeholders are spliced in; every value is bound.
    let mut q =
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql)).bind(now).bind(TaskState::Done.as_str()).bind(TaskState::Running.as_str());
    for c in batch {
        q = q.bind(c.lease.task_id).bind(c.lease.epoch).bind(c.work.bytes).bind(c.work.records).bind(c.work.redone_bytes);
    }
    q.fetch_all(pool).await.map_err(db("complete"))
}

impl Ledger {
    /// Queues the completion; whoever holds the writer lock commits every queued completion in
    /// one statement (see the module note). Returns whether this lease's row changed.
    pub(crate) async fn complete_batched(&self, pool: &sqlx::SqlitePool, mut item: Completion) -> Result<bool> {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        item.reply = Some(tx);
        self.completions.lock().unwrap_or_else(|e| e.into_inner()).push(item);
        // Either the current writer flushes this item too (then there is nothing to lock for),
        // or this caller gets the lock and flushes everything queued.
        let cancelled = || Err(Error::Batch { message: "batched completion was cancelled".into(), class: ErrorClass::Transient });
        let _write = tokio::select! {
            biased;
            r = &mut rx => return r.unwrap_or_else(|_| cancelled()),
            w = self.sqlite_writer.lock() => w,
        };
        {
            loop {
                let batch: Vec<Completion> = {
                    let mut q = self.completions.lock().unwrap_or_else(|e| e.into_inner());
                    let k = q.len().min(COMPLETION_BATCH);
                    q.drain(..k).collect()
                };
                if batch.is_empty() {
                    break;
                }
                let res = flush_completions(pool, &batch).await;
                for c in batch {
                    let r = match &res {
                        Ok(changed) => Ok(changed.contains(&c.lease.task_id)),
                        Err(e) => Err(Error::Batch { message: e.to_string(), class: e.class() }),
                    };
                    if let Some(reply) = c.reply {
                        let _ = reply.send(r);
                    }
                }
            }
        }
        drop(_write);
        // Dropped without a reply: the flusher was cancelled mid-transaction, which rolled back.
        rx.await.unwrap_or_else(|_| cancelled())
    }
}
