//! What operators and the stages' summaries read, and the one thing operators change:
//! requeueing quarantined work. Reads go through the users' views, so `ferry status` shows
//! what a hand-written query would.

use crate::backend::{Backend, Begin};
use crate::state::{FileState, Stage, TaskState};
use crate::{Ledger, Result, db};

/// One row of the `backlog` view.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct BacklogRow {
    #[sqlx(try_from = "String")]
    pub stage: Stage,
    #[sqlx(try_from = "String")]
    pub state: TaskState,
    pub tasks: i64,
    pub bytes: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    pub files: Vec<(FileState, i64)>,
    pub backlog: Vec<BacklogRow>,
    pub stuck_leases: i64,
    pub redone_attempts: i64,
    pub redone_bytes: i64,
}

impl Status {
    /// Tasks in `state`, of one stage or of all.
    pub fn tasks(&self, stage: Option<Stage>, state: TaskState) -> i64 {
        self.backlog.iter().filter(|r| r.state == state && stage.is_none_or(|s| r.stage == s)).map(|r| r.tasks).sum()
    }
}

/// One row of the `quarantined` view: a source file or a chunk's task set aside.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Quarantined {
    /// `file` or `chunk`.
    pub kind: String,
    pub what: String,
    pub reason: Option<String>,
}

/// Which quarantined tasks to send back to `available`.
#[derive(Debug, Clone, Default)]
pub struct RequeueFilter {
    pub stage: Option<Stage>,
    pub chunk_id: Option<String>,
}

impl Ledger {
    /// Sends quarantined tasks back to `available` with a fresh attempt budget.
    pub async fn requeue(&self, filter: &RequeueFilter) -> Result<u64> {
        let now = self.now_ms();
        let stage = filter.stage.map(|s| s.as_str());
        self.call("requeue", || async move {
            on_backend!(self, |pool, begin| {
                Ok(sqlx::query(
                    "UPDATE tasks SET state = $4, attempt = 0, scheduled_at = $1, finalized_at = NULL
                     WHERE state = $5
                       AND ($2 IS NULL OR stage = $2)
                       AND ($3 IS NULL OR chunk_id = $3)",
                )
                .bind(now)
                .bind(stage)
                .bind(filter.chunk_id.as_deref())
                .bind(TaskState::Available.as_str())
                .bind(TaskState::Quarantined.as_str())
                .execute(pool)
                .await
                .map_err(db("requeue"))?
                .rows_affected())
            })
        })
        .await
    }

    /// Is there anything left for `stage` to do now or later (not done, not quarantined)?
    pub async fn pending(&self, stage: Stage) -> Result<i64> {
        let [a, b, c] = TaskState::PENDING.map(|s| s.as_str());
        self.call("pending", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query_scalar("SELECT COUNT(*) FROM tasks WHERE stage = $1 AND state IN ($2, $3, $4)")
                    .bind(stage.as_str())
                    .bind(a)
                    .bind(b)
                    .bind(c)
                    .fetch_one(pool)
                    .await
                    .map_err(db("pending"))
            })
        })
        .await
    }

    /// The summary behind `ferry status`, read from the users' views.
    pub async fn status(&self) -> Result<Status> {
        let (files, backlog, stuck_leases, (redone_attempts, redone_bytes)) = self
            .call("status", || async move {
                on_backend!(self, |pool, begin| {
                    let op = "status";
                    let files: Vec<(String, i64)> =
                        sqlx::query_as("SELECT state, COUNT(*) AS n FROM source_files GROUP BY state ORDER BY state")
                            .fetch_all(pool)
                            .await
                            .map_err(db(op))?;
                    let backlog: Vec<BacklogRow> = sqlx::query_as("SELECT stage, state, tasks, bytes FROM backlog ORDER BY stage, state")
                        .fetch_all(pool)
                        .await
                        .map_err(db(op))?;
                    let stuck: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM stuck_leases").fetch_one(pool).await.map_err(db(op))?;
                    let redone: (i64, i64) = sqlx::query_as(
                        "SELECT CAST(COALESCE(SUM(attempts), 0) AS BIGINT), CAST(COALESCE(SUM(bytes), 0) AS BIGINT)
                         FROM redone_work",
                    )
                    .fetch_one(pool)
                    .await
                    .map_err(db(op))?;
                    Ok((files, backlog, stuck, redone))
                })
            })
            .await?;
        let files = files.into_iter().map(|(s, n)| Ok((s.parse()?, n))).collect::<Result<_>>()?;
        Ok(Status { files, backlog, stuck_leases, redone_attempts, redone_bytes })
    }

    /// Chunks whose `stage` task is done (for cleaning up what that stage left behind).
    pub async fn done_chunks(&self, stage: Stage) -> Result<Vec<String>> {
        self.call("done_chunks", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query_scalar("SELECT chunk_id FROM tasks WHERE stage = $1 AND state = $2")
                    .bind(stage.as_str())
                    .bind(TaskState::Done.as_str())
                    .fetch_all(pool)
                    .await
                    .map_err(db("done_chunks"))
            })
        })
        .await
    }

    /// Quarantined files and tasks, from the `quarantined` view.
    pub async fn quarantined(&self) -> Result<Vec<Quarantined>> {
        self.call("quarantined", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query_as("SELECT kind, what, reason FROM quarantined ORDER BY kind, what")
                    .fetch_all(pool)
                    .await
                    .map_err(db("quarantined"))
            })
        })
        .await
    }
}
