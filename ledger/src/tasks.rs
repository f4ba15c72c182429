//! A task's life: claim, heartbeat, complete, fail, release, and the reclaim of expired
//! leases. Every write after the claim is fenced by the lease's epoch.

use std::sync::atomic::Ordering;

use ferry_common::error::ErrorClass;

use crate::backend::{Backend, Begin};
use crate::batch::Completion;
use crate::state::{AttemptOutcome, Stage, TaskState};
use crate::{Error, FailOutcome, Lease, Ledger, Result, Tally, Work, db};

/// The claim statement; `$lock` is the row-locking clause of the backend. Its state list must
/// stay textually identical to the `tasks_due` partial index's predicate, or the planner stops
/// using the index (tested in `tests/schema.rs` with the query plan of both backends).
macro_rules! claim_sql {
    ($lock:literal) => {
        concat!(
            "WITH picked AS (
                SELECT id FROM tasks ",
            due_where!(),
            "
                ORDER BY scheduled_at, id
                LIMIT $3 ",
            $lock,
            ")
            UPDATE tasks
            SET state = $6, attempt = attempt + 1, epoch = epoch + 1,
                lease_owner = $4, lease_expires_at = $5, attempted_at = $2,
                node = CASE WHEN stage = 'transform' THEN $8 ELSE node END
            WHERE id IN (SELECT id FROM picked)
            RETURNING id, chunk_id, attempt, max_attempts, epoch"
        )
    };
}

/// What makes a task claimable by this worker: `$1` stage, `$2` now, `$7` pipeline, `$8` node.
/// One text for the claim and for [`DUE`], so the question "is there work?" can never answer
/// differently from the claim that follows it.
macro_rules! due_where {
    () => {
        "WHERE pipeline = $7 AND stage = $1 AND state IN ('available', 'retryable') AND scheduled_at <= $2
                  AND (stage <> 'copy' OR node IS NULL OR node = $8)"
    };
}

/// Is a task claimable? The claim's own predicate, read only: one probe of the `tasks_due`
/// index, no write lock on SQLite and no row lock on Postgres (bind as the claim: `$3`-`$6`
/// unused).
pub const DUE: &str = concat!("SELECT id FROM tasks ", due_where!(), " LIMIT 1");

/// The claim statements, for the tests that check their query plans.
pub const CLAIM_SQLITE: &str = claim_sql!("");
pub const CLAIM_POSTGRES: &str = claim_sql!("FOR UPDATE SKIP LOCKED");

/// What a claim returns per task.
struct Claimed {
    id: i64,
    chunk_id: String,
    attempt: i64,
    max_attempts: i64,
    epoch: i64,
}

from_row!(Claimed { id, chunk_id, attempt, max_attempts, epoch });

/// A running task whose lease has expired.
struct Expired {
    id: i64,
    chunk_id: String,
    stage: Stage,
    attempt: i64,
    max_attempts: i64,
    epoch: i64,
    lease_owner: String,
    attempted_at: Option<i64>,
}

from_row!(Expired { id, chunk_id, stage: String, attempt, max_attempts, epoch, lease_owner, attempted_at });

/// Appends one row to the attempt history; run inside the caller's transaction.
macro_rules! insert_attempt {
    ($tx:expr, $lease:expr, $now:expr, $outcome:expr, $class:expr, $error:expr, $work:expr) => {{
        let lease: &Lease = $lease;
        let outcome: AttemptOutcome = $outcome;
        let class: Option<ErrorClass> = $class;
        let error: Option<&str> = $error;
        let work: Work = $work;
        sqlx::query(INSERT_ATTEMPT)
            .bind(lease.task_id)
            .bind(lease.chunk_id.as_str())
            .bind(lease.stage.as_str())
            .bind(lease.attempt)
            .bind(lease.epoch)
            .bind(lease.worker.as_str())
            .bind(lease.started_at)
            .bind($now)
            .bind(outcome.as_str())
            .bind(class.map(|c| c.as_str()))
            .bind(error.map(crate::text))
            .bind(work.bytes)
            .bind(work.records)
            .bind(work.redone_bytes)
            .execute($tx)
            .await
            .map_err(db("insert_attempt"))
    }};
}

/// Finishing a task: the `tasks_on_done` trigger appends the history row and enqueues the
/// chunk's next stage inside this same statement. `$6` is `done`, `$7` is `running`.
pub(crate) const COMPLETE: &str = "UPDATE tasks SET state = $6, finalized_at = $3, lease_owner = NULL,
        lease_expires_at = NULL, last_error = NULL, last_error_class = NULL, bytes = $4, records = $5,
        redone_bytes = $8
    WHERE id = $1 AND epoch = $2 AND state = $7";

const INSERT_ATTEMPT: &str = "INSERT INTO attempts
    (task_id, chunk_id, stage, attempt, epoch, worker, started_at, ended_at, outcome,
     error_class, error, bytes, records, redone_bytes)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)";

/// Ends a running task at the caller's epoch: `$3` state, `$4` scheduled_at, `$5` error,
/// `$6` error class, `$7` the time; `$8` is `running` and `$9` `quarantined`; `$10` is 1 to
/// give the attempt back (it failed because its store was down), else 0.
const END_RUNNING: &str = "UPDATE tasks SET state = $3, scheduled_at = $4, lease_owner = NULL,
        lease_expires_at = NULL, last_error = $5, last_error_class = $6,
        finalized_at = CASE WHEN $3 = $9 THEN $7 ELSE NULL END, attempt = attempt - $10
    WHERE id = $1 AND epoch = $2 AND state = $8";

/// What `last_error` of a failure that found its store down ends with (see
/// [`Ledger::fail_uncounted`]); [`Ledger::wake_after_outage`] finds such tasks by it.
const STORE_DOWN_NOTE: &str = " (store down: not counted as an attempt)";

impl Ledger {
    /// Claims up to `n` due tasks of `stage` for `worker`. Each claim bumps the task's attempt
    /// and fencing epoch and sets a lease of `opts.lease`.
    pub async fn claim(&self, stage: Stage, worker: &str, n: i64) -> Result<Vec<Lease>> {
        let now = self.now_ms();
        let interval = self.opts.reclaim_interval.as_millis() as i64;
        let last = self.last_reclaim_ms.load(Ordering::Relaxed);
        if last == i64::MIN || now.saturating_sub(last) >= interval {
            self.last_reclaim_ms.store(now, Ordering::Relaxed);
            self.reclaim_expired().await?;
        }
        let expires = now + self.opts.lease.as_millis() as i64;
        self.call("claim", || async move {
            on_backend!(self, |pool, begin| {
                let sql = match begin {
                    Begin::SQLITE => CLAIM_SQLITE,
                    _ => CLAIM_POSTGRES,
                };
                let query = sqlx::query_as::<_, Claimed>(sql)
                    .bind(stage.as_str())
                    .bind(now)
                    .bind(n)
                    .bind(worker)
                    .bind(expires)
                    .bind(TaskState::Running.as_str())
                    .bind(self.pipeline())
                    .bind(self.node());
                // One statement is atomic on its own, on both backends, so a claim is a single
                // round trip. On SQLite an UPDATE takes the write lock as it starts, before it
                // reads (the same as BEGIN IMMEDIATE: no lock upgrade half-way, waits bounded by
                // busy_timeout); this process's writers also queue on `sqlite_writer`.
                let _write = self.write_guard().await;
                let rows = query.fetch_all(pool).await.map_err(db("claim"))?;
                drop(_write);
                let mut leases: Vec<Lease> = rows
                    .into_iter()
                    .map(|r| Lease {
                        task_id: r.id,
                        chunk_id: r.chunk_id,
                        stage,
                        attempt: r.attempt,
                        max_attempts: r.max_attempts,
                        epoch: r.epoch,
                        worker: worker.to_string(),
                        started_at: now,
                        tally: Tally::default(),
                    })
                    .collect();
                leases.sort_by_key(|l| l.task_id);
                Ok(leases)
            })
        })
        .await
    }

    /// Would [`Ledger::claim`] find a task of `stage` now? A read of one index entry: under
    /// `--watch` a stage asks this between its polls and claims only on a yes, so a chunk the
    /// stage before it has just handed on waits a fraction of a second, not a whole poll,
    /// while an idle stage takes no write lock.
    pub async fn due(&self, stage: Stage) -> Result<bool> {
        let now = self.now_ms();
        self.call("due", || async move {
            on_backend!(self, |pool, begin| {
                let found: Option<i64> = sqlx::query_scalar(DUE)
                    .bind(stage.as_str())
                    .bind(now)
                    .bind(0i64)
                    .bind("")
                    .bind(0i64)
                    .bind("")
                    .bind(self.pipeline())
                    .bind(self.node())
                    .fetch_optional(pool)
                    .await
                    .map_err(db("due"))?;
                Ok(found.is_some())
            })
        })
        .await
    }

    /// Extends the lease by `opts.lease` from now. Fails with [`Error::LeaseLost`] if the
    /// caller no longer holds the current epoch.
    pub async fn heartbeat(&self, lease: &Lease) -> Result<()> {
        let now = self.now_ms();
        let expires = now + self.opts.lease.as_millis() as i64;
        let changed = self
            .call("heartbeat", || async move {
                on_backend!(self, |pool, begin| {
                    Ok(sqlx::query(
                        "UPDATE tasks SET lease_expires_at = $3
                         WHERE id = $1 AND epoch = $2 AND state = $4",
                    )
                    .bind(lease.task_id)
                    .bind(lease.epoch)
                    .bind(expires)
                    .bind(TaskState::Running.as_str())
                    .execute(pool)
                    .await
                    .map_err(db("heartbeat"))?
                    .rows_affected())
                })
            })
            .await?;
        if changed == 1 { Ok(()) } else { Err(self.lease_lost(lease).await) }
    }

    /// Marks the task done; in the same statement the ledger records the attempt and makes
    /// the chunk's next stage (transform -> copy -> load) available. Rejected with
    /// [`Error::LeaseLost`] unless the caller holds the current epoch.
    pub async fn complete(&self, lease: &Lease, work: Work) -> Result<()> {
        let now = self.now_ms();
        let changed = self
            .call("complete", || async move {
                match &self.backend {
                    // One statement, one round trip, one commit.
                    Backend::Postgres(pool, _) => sqlx::query(COMPLETE)
                        .bind(lease.task_id)
                        .bind(lease.epoch)
                        .bind(now)
                        .bind(work.bytes)
                        .bind(work.records)
                        .bind(TaskState::Done.as_str())
                        .bind(TaskState::Running.as_str())
                        .bind(work.redone_bytes)
                        .execute(pool)
                        .await
                        .map(|r| r.rows_affected() == 1)
                        .map_err(db("complete")),
                    Backend::Sqlite(pool) => {
                        let item = Completion { lease: lease.clone(), work, now, reply: None };
                        self.complete_batched(pool, item).await
                    }
                }
            })
            .await?;
        if changed {
            return Ok(());
        }
        // A retried call whose first try committed finds its own result: that is success.
        match self.task_state(lease.task_id).await? {
            Some((TaskState::Done, epoch)) if epoch == lease.epoch => Ok(()),
            _ => Err(self.lease_lost(lease).await),
        }
    }

    /// Records a failed attempt. Transient failures go to `retryable` with backoff until
    /// `max_attempts`; permanent ones (and the last attempt) go to `quarantined`.
    pub async fn fail(&self, lease: &Lease, class: ErrorClass, error: &str, work: Work) -> Result<FailOutcome> {
        self.end_failed(lease, class, error, work, None).await
    }

    /// Records a failed attempt that does not count toward `max_attempts`: the chunk's store
    /// was down (an outage is not the chunk's fault). The task is retried at `retry_at_ms`.
    pub async fn fail_uncounted(&self, lease: &Lease, error: &str, work: Work, retry_at_ms: i64) -> Result<FailOutcome> {
        self.end_failed(lease, ErrorClass::Transient, error, work, Some((retry_at_ms, STORE_DOWN_NOTE))).await
    }

    /// Makes this pipeline's `stage` tasks that wait for a store found down (see
    /// [`Ledger::fail_uncounted`]) due now: the store is back, and they would otherwise idle
    /// until the probe time they were given. Returns how many.
    pub async fn wake_after_outage(&self, stage: Stage) -> Result<u64> {
        let now = self.now_ms();
        self.call("wake_after_outage", || async move {
            on_backend!(self, |pool, begin| {
                let n = sqlx::query(
                    "UPDATE tasks SET scheduled_at = $1 WHERE pipeline = $2 AND stage = $3 AND state = $4
                       AND scheduled_at > $1 AND last_error LIKE $5",
                )
                .bind(now)
                .bind(self.pipeline())
                .bind(stage.as_str())
                .bind(TaskState::Retryable.as_str())
                .bind(format!("%{STORE_DOWN_NOTE}"))
                .execute(pool)
                .await
                .map_err(db("wake_after_outage"))?
                .rows_affected();
                Ok(n)
            })
        })
        .await
    }

    /// Sends a task that waits for others (not a failure) back to `retryable` until
    /// `retry_at_ms`, without counting the attempt; `reason` says what it waits for.
    pub async fn wait(&self, lease: &Lease, reason: &str, work: Work, retry_at_ms: i64) -> Result<FailOutcome> {
        self.end_failed(lease, ErrorClass::Transient, reason, work, Some((retry_at_ms, ""))).await
    }

    async fn end_failed(
        &self,
        lease: &Lease,
        class: ErrorClass,
        error: &str,
        work: Work,
        uncounted: Option<(i64, &str)>,
    ) -> Result<FailOutcome> {
        let now = self.now_ms();
        let uncounted_until = uncounted.map(|(at, _)| at);
        let exhausted = lease.attempt >= lease.max_attempts && uncounted_until.is_none();
        let quarantine = class == ErrorClass::Permanent || exhausted;
        let retry_at = uncounted_until.unwrap_or_else(|| now + self.opts.backoff.delay(lease.attempt).as_millis() as i64);
        let refund = i64::from(uncounted_until.is_some());
        let (state, outcome) = if quarantine {
            (TaskState::Quarantined, FailOutcome::Quarantined)
        } else {
            (TaskState::Retryable, FailOutcome::Retry { at_ms: retry_at })
        };
        let attempt_outcome = if quarantine { AttemptOutcome::Quarantined } else { AttemptOutcome::Retryable };
        let message = if exhausted && class == ErrorClass::Transient {
            format!("{error} (gave up after {} attempts)", lease.attempt)
        } else if let Some((_, why)) = uncounted {
            format!("{error}{why}")
        } else {
            error.to_string()
        };
        let message = message.as_str();
        let changed = self
            .call("fail", || async move {
                on_backend!(self, |pool, begin| {
                    let op = "fail";
                    let (_write, mut tx) = write_tx!(self, pool, begin, op);
                    let changed = sqlx::query(END_RUNNING)
                        .bind(lease.task_id)
                        .bind(lease.epoch)
                        .bind(state.as_str())
                        .bind(if quarantine { now } else { retry_at })
                        .bind(crate::text(message))
                        .bind(class.as_str())
                        .bind(now)
                        .bind(TaskState::Running.as_str())
                        .bind(TaskState::Quarantined.as_str())
                        .bind(refund)
                        .execute(&mut *tx)
                        .await
                        .map_err(db(op))?
                        .rows_affected();
                    if changed != 1 {
                        return Ok(false);
                    }
                    insert_attempt!(&mut *tx, lease, now, attempt_outcome, Some(class), Some(message), work)?;
                    tx.commit().await.map_err(db(op))?;
                    Ok(true)
                })
            })
            .await?;
        if changed {
            return Ok(outcome);
        }
        match self.task_state(lease.task_id).await? {
            Some((s, epoch)) if s == state && epoch == lease.epoch => Ok(outcome),
            _ => Err(self.lease_lost(lease).await),
        }
    }

    /// Gives a lease back without counting the attempt (a worker shutting down cleanly).
    pub async fn release(&self, lease: &Lease, work: Work) -> Result<()> {
        let now = self.now_ms();
        let changed = self
            .call("release", || async move {
                on_backend!(self, |pool, begin| {
                    let op = "release";
                    let (_write, mut tx) = write_tx!(self, pool, begin, op);
                    let changed = sqlx::query(
                        "UPDATE tasks SET state = $4, attempt = attempt - 1, scheduled_at = $3,
                            lease_owner = NULL, lease_expires_at = NULL
                         WHERE id = $1 AND epoch = $2 AND state = $5",
                    )
                    .bind(lease.task_id)
                    .bind(lease.epoch)
                    .bind(now)
                    .bind(TaskState::Available.as_str())
                    .bind(TaskState::Running.as_str())
                    .execute(&mut *tx)
                    .await
                    .map_err(db(op))?
                    .rows_affected();
                    if changed == 1 {
                        insert_attempt!(&mut *tx, lease, now, AttemptOutcome::Released, None, None, work)?;
                    }
                    tx.commit().await.map_err(db(op))?;
                    Ok(changed == 1)
                })
            })
            .await?;
        if changed { Ok(()) } else { Err(self.lease_lost(lease).await) }
    }

    /// Moves every `running` task whose lease has expired to `retryable` (or `quarantined`
    /// when its attempts are used up) and records a `lease_expired` attempt for it. The old
    /// holder's epoch is then stale, so its late commit is rejected. Returns how many moved.
    pub async fn reclaim_expired(&self) -> Result<u64> {
        let now = self.now_ms();
        self.call("reclaim_expired", || async move {
            on_backend!(self, |pool, begin| {
                let op = "reclaim_expired";
                let select = match begin {
                    Begin::SQLITE => {
                        "SELECT id, chunk_id, stage, attempt, max_attempts, epoch, lease_owner, attempted_at
                         FROM tasks WHERE state = $2 AND lease_expires_at < $1 ORDER BY id LIMIT 1000"
                    }
                    _ => {
                        "SELECT id, chunk_id, stage, attempt, max_attempts, epoch, lease_owner, attempted_at
                         FROM tasks WHERE state = $2 AND lease_expires_at < $1 ORDER BY id LIMIT 1000
                         FOR UPDATE SKIP LOCKED"
                    }
                };
                let (_write, mut tx) = write_tx!(self, pool, begin, op);
                let rows = sqlx::query_as::<_, Expired>(select)
                    .bind(now)
                    .bind(TaskState::Running.as_str())
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(db(op))?;
                let mut moved = 0;
                for r in rows {
                    let lease = Lease {
                        task_id: r.id,
                        chunk_id: r.chunk_id,
                        stage: r.stage,
                        attempt: r.attempt,
                        max_attempts: r.max_attempts,
                        epoch: r.epoch,
                        worker: r.lease_owner,
                        started_at: r.attempted_at.unwrap_or(now),
                        tally: Tally::default(),
                    };
                    let exhausted = lease.attempt >= lease.max_attempts;
                    let state = if exhausted { TaskState::Quarantined } else { TaskState::Retryable };
                    let message = if exhausted {
                        format!("lease of {} expired (gave up after {} attempts)", lease.worker, lease.attempt)
                    } else {
                        format!("lease of {} expired", lease.worker)
                    };
                    let changed = sqlx::query(END_RUNNING)
                        .bind(lease.task_id)
                        .bind(lease.epoch)
                        .bind(state.as_str())
                        .bind(now)
                        .bind(crate::text(&message))
                        .bind(ErrorClass::Transient.as_str())
                        .bind(now)
                        .bind(TaskState::Running.as_str())
                        .bind(TaskState::Quarantined.as_str())
                        .bind(0i64)
                        .execute(&mut *tx)
                        .await
                        .map_err(db(op))?
                        .rows_affected();
                    if changed == 1 {
                        insert_attempt!(
                            &mut *tx,
                            &lease,
                            now,
                            AttemptOutcome::LeaseExpired,
                            Some(ErrorClass::Transient),
                            Some(message.as_str()),
                            Work::default()
                        )?;
                        moved += 1;
                    }
                }
                tx.commit().await.map_err(db(op))?;
                if moved > 0 {
                    tracing::warn!(moved, "reclaimed tasks whose lease expired");
                }
                Ok(moved)
            })
        })
        .await
    }

    /// The state and epoch of one task.
    pub async fn task_state(&self, task_id: i64) -> Result<Option<(TaskState, i64)>> {
        let row: Option<(String, i64)> = self
            .call("task_state", || async move {
                on_backend!(self, |pool, begin| {
                    sqlx::query_as("SELECT state, epoch FROM tasks WHERE id = $1")
                        .bind(task_id)
                        .fetch_optional(pool)
                        .await
                        .map_err(db("task_state"))
                })
            })
            .await?;
        row.map(|(s, epoch)| Ok((s.parse()?, epoch))).transpose()
    }

    pub(crate) async fn lease_lost(&self, lease: &Lease) -> Error {
        let (current_state, current_epoch) = match self.task_state(lease.task_id).await {
            Ok(Some((s, epoch))) => (Some(s), epoch),
            Ok(None) | Err(_) => (None, -1),
        };
        Error::LeaseLost {
            task_id: lease.task_id,
            stage: lease.stage,
            chunk_id: lease.chunk_id.clone(),
            held_epoch: lease.epoch,
            current_epoch,
            current_state,
        }
    }
}
