//! What operators and the stages' summaries read, and the one thing operators change:
//! requeueing quarantined work. Reads go through the users' views, so `ferry status` shows
//! what a hand-written query would.

use crate::backend::{Backend, Begin};
use crate::state::{AttemptOutcome, FileState, Stage, TaskState};
use crate::{Ledger, Result, db};

/// One row of the `backlog` view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BacklogRow {
    pub stage: Stage,
    pub state: TaskState,
    pub tasks: i64,
    pub bytes: i64,
}

from_row!(BacklogRow { stage: String, state: String, tasks, bytes });

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    /// `file` or `chunk`.
    pub kind: String,
    pub what: String,
    pub reason: Option<String>,
}

from_row!(Quarantined { kind, what, reason });

/// Which quarantined tasks to send back to `available`.
#[derive(Debug, Clone, Default)]
pub struct RequeueFilter {
    pub stage: Option<Stage>,
    pub chunk_id: Option<String>,
}

/// Takes the row locks of a chunk's tasks before an admin command reads them (a no-op write,
/// one statement for both backends). On Postgres a claim then skips those rows (`SKIP
/// LOCKED`) and one in flight is waited for and then seen, so what the command read is what
/// it changes; SQLite's write transaction holds the whole database already.
macro_rules! lock_chunk_tasks {
    ($tx:expr, $chunk:expr, $pipeline:expr, $op:expr) => {
        sqlx::query("UPDATE tasks SET epoch = epoch WHERE chunk_id = $1 AND pipeline = $2")
            .bind($chunk)
            .bind($pipeline)
            .execute(&mut *$tx)
            .await
            .map_err(db($op))?
    };
}

impl Ledger {
    /// Sends quarantined tasks back to `available` with a fresh attempt budget.
    pub async fn requeue(&self, filter: &RequeueFilter) -> Result<u64> {
        self.requeue_tasks(filter, false).await
    }

    /// [`Ledger::requeue`]; with `dry_run`, only counts what it would requeue.
    pub async fn requeue_tasks(&self, filter: &RequeueFilter, dry_run: bool) -> Result<u64> {
        let now = self.now_ms();
        let stage = filter.stage.map(|s| s.as_str());
        self.call("requeue", || async move {
            on_backend!(self, |pool, begin| {
                let q = if dry_run {
                    "SELECT COUNT(*) FROM tasks WHERE $1 = $1 AND $4 = $4 AND pipeline = $6
                       AND state = $5 AND ($2 IS NULL OR stage = $2) AND ($3 IS NULL OR chunk_id = $3)"
                } else {
                    "UPDATE tasks SET state = $4, attempt = 0, scheduled_at = $1, finalized_at = NULL
                     WHERE state = $5 AND pipeline = $6
                       AND ($2 IS NULL OR stage = $2)
                       AND ($3 IS NULL OR chunk_id = $3)"
                };
                let query = sqlx::query(q)
                    .bind(now)
                    .bind(stage)
                    .bind(filter.chunk_id.as_deref())
                    .bind(TaskState::Available.as_str())
                    .bind(TaskState::Quarantined.as_str())
                    .bind(self.pipeline());
                if dry_run {
                    let row = query.fetch_one(pool).await.map_err(db("requeue"))?;
                    Ok(sqlx::Row::try_get::<i64, _>(&row, 0).map_err(db("requeue"))? as u64)
                } else {
                    Ok(query.execute(pool).await.map_err(db("requeue"))?.rows_affected())
                }
            })
        })
        .await
    }

    /// Requeues a source file (every version at `uri`): a quarantined file goes back to
    /// `registered`, so the next extract pass splits it again under the current config, and
    /// its chunks' quarantined tasks become available. Returns (files, tasks).
    pub async fn requeue_file(&self, uri: &str, dry_run: bool) -> Result<(u64, u64)> {
        let now = self.now_ms();
        self.call("requeue_file", || async move {
            on_backend!(self, |pool, begin| {
                let op = "requeue_file";
                let (_write, mut tx) = write_tx!(self, pool, begin, op);
                let files: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM source_files WHERE uri = $1 AND state = $2 AND pipeline = $3")
                    .bind(uri)
                    .bind(FileState::Quarantined.as_str())
                    .bind(self.pipeline())
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db(op))?;
                let tasks: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM tasks t JOIN chunks c ON c.id = t.chunk_id JOIN source_files f ON f.id = c.file_id
                     WHERE f.uri = $1 AND t.state = $2 AND f.pipeline = $3",
                )
                .bind(uri)
                .bind(TaskState::Quarantined.as_str())
                .bind(self.pipeline())
                .fetch_one(&mut *tx)
                .await
                .map_err(db(op))?;
                if !dry_run {
                    sqlx::query("UPDATE source_files SET state = $3, error = NULL WHERE uri = $1 AND state = $2 AND pipeline = $4")
                        .bind(uri)
                        .bind(FileState::Quarantined.as_str())
                        .bind(FileState::Registered.as_str())
                        .bind(self.pipeline())
                        .execute(&mut *tx)
                        .await
                        .map_err(db(op))?;
                    sqlx::query(
                        "UPDATE tasks SET state = $3, attempt = 0, scheduled_at = $4, finalized_at = NULL
                         WHERE state = $2 AND chunk_id IN
                           (SELECT c.id FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE f.uri = $1 AND f.pipeline = $5)",
                    )
                    .bind(uri)
                    .bind(TaskState::Quarantined.as_str())
                    .bind(TaskState::Available.as_str())
                    .bind(now)
                    .bind(self.pipeline())
                    .execute(&mut *tx)
                    .await
                    .map_err(db(op))?;
                }
                tx.commit().await.map_err(db(op))?;
                Ok((files as u64, tasks as u64))
            })
        })
        .await
    }

    /// The chunks of this pipeline whose copy waits for spool node `node`, or was quarantined
    /// there (a lease of the dead node that expired once too often): what `ferry rerun
    /// --spool-node` sends back to transform when that node is gone. Running ones are not
    /// listed: their node is alive.
    pub async fn copies_waiting_on(&self, node: &str) -> Result<Vec<String>> {
        self.call("copies_waiting_on", || async move {
            on_backend!(self, |pool, _begin| {
                sqlx::query_scalar(
                    "SELECT chunk_id FROM tasks WHERE pipeline = $1 AND stage = 'copy' AND node = $2
                       AND state IN ('available', 'retryable', 'quarantined') ORDER BY chunk_id",
                )
                .bind(self.pipeline())
                .bind(node)
                .fetch_all(pool)
                .await
                .map_err(db("copies_waiting_on"))
            })
        })
        .await
    }

    /// Runs `chunk` again from stage `from` on: that stage's task becomes available with a
    /// fresh budget (whatever its state); each later stage's task is reset when the stage
    /// before it completes (the `tasks_on_done` trigger), and load replaces the chunk's
    /// published files. Refused while a task of the chunk is running. Returns the stages that
    /// will run.
    pub async fn rerun(&self, chunk: &str, from: Stage, dry_run: bool) -> Result<Vec<Stage>> {
        let now = self.now_ms();
        let plan: Vec<Stage> = std::iter::successors(Some(from), |s| s.next()).collect();
        let stages: (Vec<(String, String)>, bool) = self
            .call("rerun", || async move {
                on_backend!(self, |pool, begin| {
                    let op = "rerun";
                    let (_write, mut tx) = write_tx!(self, pool, begin, op);
                    lock_chunk_tasks!(tx, chunk, self.pipeline(), op);
                    let rows: Vec<(String, String)> =
                        sqlx::query_as("SELECT stage, state FROM tasks WHERE chunk_id = $1 AND pipeline = $2")
                            .bind(chunk)
                            .bind(self.pipeline())
                            .fetch_all(&mut *tx)
                            .await
                            .map_err(db(op))?;
                    let running = rows.iter().any(|(_, st)| st == TaskState::Running.as_str());
                    // `ferry prune` deletes the transform and copy tasks of published chunks:
                    // a rerun from there recreates the task (a later stage shows the chunk got
                    // past it), and each stage hands the chunk on as usual.
                    let later = std::iter::successors(from.next(), |s| s.next()).any(|l| rows.iter().any(|(s, _)| s == l.as_str()));
                    let missing = !rows.iter().any(|(s, _)| s == from.as_str()) && later;
                    if missing && !running && !dry_run {
                        sqlx::query(
                            "INSERT INTO tasks (pipeline, chunk_id, stage, state, max_attempts, scheduled_at, created_at)
                             SELECT pipeline, chunk_id, $2, $3, max_attempts, $4, $4 FROM tasks WHERE chunk_id = $1 AND pipeline = $5
                             ORDER BY id LIMIT 1",
                        )
                        .bind(chunk)
                        .bind(from.as_str())
                        .bind(TaskState::Available.as_str())
                        .bind(now)
                        .bind(self.pipeline())
                        .execute(&mut *tx)
                        .await
                        .map_err(db(op))?;
                    }
                    let ready = (missing || rows.iter().any(|(s, _)| s == from.as_str())) && !running;
                    if ready && !dry_run {
                        // Never a running task (claimed since the read above, on Postgres):
                        // its worker's lease stays good and the rerun says it could not.
                        let n = sqlx::query(
                            "UPDATE tasks SET state = $3, attempt = 0, scheduled_at = $4, finalized_at = NULL,
                                last_error = NULL, last_error_class = NULL, epoch = epoch + 1
                             WHERE chunk_id = $1 AND stage = $2 AND pipeline = $5
                               AND NOT EXISTS (SELECT 1 FROM tasks r WHERE r.chunk_id = $1 AND r.pipeline = $5 AND r.state = $6)",
                        )
                        .bind(chunk)
                        .bind(from.as_str())
                        .bind(TaskState::Available.as_str())
                        .bind(now)
                        .bind(self.pipeline())
                        .bind(TaskState::Running.as_str())
                        .execute(&mut *tx)
                        .await
                        .map_err(db(op))?
                        .rows_affected();
                        if n == 0 {
                            tx.rollback().await.map_err(db(op))?;
                            return Ok((vec![("one of its stages".to_string(), TaskState::Running.as_str().to_string())], false));
                        }
                        sqlx::query("DELETE FROM skips WHERE chunk_id = $1").bind(chunk).execute(&mut *tx).await.map_err(db(op))?;
                    }
                    tx.commit().await.map_err(db(op))?;
                    Ok((rows, missing))
                })
            })
            .await?;
        let (stages, recreated) = stages;
        let bad = |m: String| crate::Error::Config(ferry_common::error::ConfigError::new("--chunk", m));
        if stages.is_empty() {
            return Err(bad(format!("no chunk {chunk} in pipeline {:?} of the ledger", self.pipeline())));
        }
        if let Some((s, _)) = stages.iter().find(|(_, st)| st == TaskState::Running.as_str()) {
            return Err(bad(format!("chunk {chunk} is running in {s} now; wait for it (or stop that stage) and run this again")));
        }
        if !recreated && !stages.iter().any(|(s, _)| s == from.as_str()) {
            return Err(bad(format!("chunk {chunk} has not reached {from} yet; it will run there by itself")));
        }
        Ok(plan)
    }

    /// Gives up on `chunk` for good: its unfinished tasks are closed as done without output,
    /// with `reason` kept in `skips`. Returns how many tasks it closed. `replace`: the
    /// pipeline's newer versions of a file replace the older (a sibling's switch moves this
    /// chunk's parts too); with `versions = "keep"` each chunk publishes only its own.
    pub async fn skip(&self, chunk: &str, reason: &str, dry_run: bool, replace: bool) -> Result<u64> {
        let now = self.now_ms();
        let postgres = self.backend_name() == "postgres";
        // Not a running task: its completion would hand the chunk on (the trigger).
        let [a, b, c] = [TaskState::Available, TaskState::Retryable, TaskState::Quarantined].map(|s| s.as_str());
        let n = self
            .call("skip", || async move {
                on_backend!(self, |pool, begin| {
                    let op = "skip";
                    let (_write, mut tx) = write_tx!(self, pool, begin, op);
                    lock_chunk_tasks!(tx, chunk, self.pipeline(), op);
                    let open: Vec<(String, String)> =
                        sqlx::query_as("SELECT stage, state FROM tasks WHERE chunk_id = $1 AND state IN ($2, $3, $4) AND pipeline = $5")
                            .bind(chunk)
                            .bind(a)
                            .bind(b)
                            .bind(c)
                            .bind(self.pipeline())
                            .fetch_all(&mut *tx)
                            .await
                            .map_err(db(op))?;
                    // A load whose parts are in the table already, unrecorded: a sibling
                    // switched the chunk's version in with them (replace), or an attempt moved
                    // some and could not take them back. Closing it would leave them there
                    // with no row naming them; its load only has to record them.
                    if open.iter().any(|(s, _)| s == "load") {
                        // The lock a load's record takes (Postgres; SQLite's write lock does
                        // the same): a sibling's switch recorded meanwhile is seen below, and
                        // one that records after this skip finds it and takes the parts out.
                        if postgres {
                            sqlx::query(
                                "SELECT pg_advisory_xact_lock(hashtextextended(f.uri, 1)) FROM chunks c
                                 JOIN source_files f ON f.id = c.file_id WHERE c.id = $1",
                            )
                            .bind(chunk)
                            .execute(&mut *tx)
                            .await
                            .map_err(db(op))?;
                        }
                        // Its own rows too: recorded, with the older version's files still to
                        // retract (a kill, or a retraction that keeps failing), a skip would leave
                        // both versions in the table.
                        let visible: i64 = sqlx::query_scalar(
                            "SELECT COUNT(*) FROM tasks t WHERE t.chunk_id = $1 AND t.stage = 'load' AND t.pipeline = $2
                               AND (t.last_error LIKE '%partly published:%'
                                    OR EXISTS (SELECT 1 FROM published o WHERE o.chunk_id = t.chunk_id)
                                    OR $3 = 1 AND EXISTS (SELECT 1 FROM chunks c JOIN source_files f ON f.id = c.file_id
                                               JOIN chunks s ON s.file_id = c.file_id AND s.id <> c.id
                                               JOIN published p ON p.chunk_id = s.id
                                               WHERE c.id = t.chunk_id
                                                 AND EXISTS (SELECT 1 FROM source_files o
                                                             WHERE o.pipeline = f.pipeline AND o.uri = f.uri AND o.version < f.version)))",
                        )
                        .bind(chunk)
                        .bind(self.pipeline())
                        .bind(replace as i64)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(db(op))?;
                        if visible > 0 {
                            return Ok(Err(Refused::InTable));
                        }
                        // A version with no rows counts as in the table once it is copied
                        // (nothing of it is moved; its load only retracts the older version):
                        // the older version's chunks are withdrawn from then on. Skipping that
                        // load would leave what of the older version was published for good.
                        let empty_replacing: i64 = sqlx::query_scalar(
                            "SELECT COUNT(*) FROM chunks c JOIN source_files f ON f.id = c.file_id
                             WHERE c.id = $1 AND $2 = 1
                               AND NOT EXISTS (SELECT 1 FROM chunks s JOIN parts q ON q.chunk_id = s.id WHERE s.file_id = c.file_id)
                               AND EXISTS (SELECT 1 FROM source_files o
                                           WHERE o.pipeline = f.pipeline AND o.uri = f.uri AND o.version < f.version)",
                        )
                        .bind(chunk)
                        .bind(replace as i64)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(db(op))?;
                        if empty_replacing > 0 {
                            return Ok(Err(Refused::EmptyVersion));
                        }
                    }
                    let mut closed = 0;
                    if !dry_run {
                        for (stage, state) in &open {
                            // Guarded by the state just read: a worker that claimed the task
                            // since (Postgres reads committed rows only) keeps it, and its
                            // side effects are never handed on under a skip.
                            let n = sqlx::query(
                                "UPDATE tasks SET state = $3, finalized_at = $4, lease_owner = NULL, lease_expires_at = NULL,
                                    epoch = epoch + 1, last_error = $5, bytes = 0, records = 0
                                 WHERE chunk_id = $1 AND stage = $2 AND state = $6 AND pipeline = $7",
                            )
                            .bind(chunk)
                            .bind(stage)
                            .bind(TaskState::Done.as_str())
                            .bind(now)
                            .bind(crate::text(&format!("skipped by an operator: {reason}")))
                            .bind(state)
                            .bind(self.pipeline())
                            .execute(&mut *tx)
                            .await
                            .map_err(db(op))?
                            .rows_affected();
                            if n == 0 {
                                continue;
                            }
                            closed += 1;
                            sqlx::query(
                                "INSERT INTO skips (chunk_id, stage, reason, skipped_at) VALUES ($1, $2, $3, $4)
                                 ON CONFLICT (chunk_id, stage) DO UPDATE SET reason = excluded.reason, skipped_at = excluded.skipped_at",
                            )
                            .bind(chunk)
                            .bind(stage)
                            .bind(crate::text(reason))
                            .bind(now)
                            .execute(&mut *tx)
                            .await
                            .map_err(db(op))?;
                        }
                    }
                    tx.commit().await.map_err(db(op))?;
                    Ok(Ok(if dry_run { open.len() as u64 } else { closed }))
                })
            })
            .await?;
        let n = match n {
            Ok(n) => n,
            Err(why) => {
                let message = match why {
                    Refused::InTable => format!(
                        "chunk {chunk}'s parts are in the table already (moved there with its version, or by an attempt that could \
                         not take them back); its load only records them, so it is not skipped: let load run (or `ferry requeue --stage load`)"
                    ),
                    Refused::EmptyVersion => format!(
                        "chunk {chunk} is a corrected file's version with no rows, which replaced the version before it in the \
                         table once it was copied; its load only removes that older version's rows, so it is not skipped: let \
                         load run (or `ferry requeue --stage load`)"
                    ),
                };
                return Err(crate::Error::Config(ferry_common::error::ConfigError::new("--chunk", message)));
            }
        };
        if n == 0 {
            let bad = ferry_common::error::ConfigError::new(
                "--chunk",
                format!("chunk {chunk} has no task to skip now (none waiting or quarantined; a running one must end first)"),
            );
            return Err(crate::Error::Config(bad));
        }
        Ok(n)
    }

    /// What `ferry doctor` asks of the ledger: the schema it is at, this pipeline's source
    /// files, and whether this login may write. The write is a transaction that opens the way
    /// every stage's does (SQLite takes its write lock up front, so a read-only file or
    /// directory fails here), changes no row, and is rolled back.
    pub async fn doctor(&self) -> Result<(Option<i64>, i64)> {
        let version = self.backend.applied_version().await?;
        let files = self
            .call("doctor", || async move {
                on_backend!(self, |pool, begin| {
                    let op = "doctor";
                    let (_guard, mut tx) = write_tx!(self, pool, begin, op);
                    // Postgres checks the UPDATE privilege whether or not a row matches.
                    sqlx::query("UPDATE pipelines SET table_name = table_name WHERE name = $1 AND 1 = 0")
                        .bind(self.pipeline())
                        .execute(&mut *tx)
                        .await
                        .map_err(db(op))?;
                    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM source_files WHERE pipeline = $1")
                        .bind(self.pipeline())
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(db(op))?;
                    tx.rollback().await.map_err(db(op))?;
                    Ok(n)
                })
            })
            .await?;
        Ok((version, files))
    }

    /// Is there anything left for `stage` to do now or later (not done, not quarantined)?
    pub async fn pending(&self, stage: Stage) -> Result<i64> {
        let [a, b, c] = TaskState::PENDING.map(|s| s.as_str());
        self.call("pending", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query_scalar("SELECT COUNT(*) FROM tasks WHERE stage = $1 AND state IN ($2, $3, $4) AND pipeline = $5")
                    .bind(stage.as_str())
                    .bind(a)
                    .bind(b)
                    .bind(c)
                    .bind(self.pipeline())
                    .fetch_one(pool)
                    .await
                    .map_err(db("pending"))
            })
        })
        .await
    }

    /// The summary behind `ferry status` for this ledger handle's pipeline.
    pub async fn status(&self) -> Result<Status> {
        let (files, backlog, stuck_leases, (redone_attempts, redone_bytes)) = self
            .call("status", || async move {
                on_backend!(self, |pool, begin| {
                    let op = "status";
                    let files: Vec<(String, i64)> =
                        sqlx::query_as("SELECT state, COUNT(*) AS n FROM source_files WHERE pipeline = $1 GROUP BY state ORDER BY state")
                            .bind(self.pipeline())
                            .fetch_all(pool)
                            .await
                            .map_err(db(op))?;
                    // The `backlog` view's numbers, for this pipeline.
                    let backlog: Vec<BacklogRow> = sqlx::query_as(
                        "SELECT t.stage, t.state, COUNT(*) AS tasks,
                            CAST(COALESCE(SUM(CASE WHEN t.stage = 'transform' THEN c.bytes ELSE COALESCE(p.bytes, 0) END), 0) AS BIGINT) AS bytes
                         FROM tasks t JOIN chunks c ON c.id = t.chunk_id
                         LEFT JOIN (SELECT chunk_id, SUM(bytes) AS bytes FROM parts GROUP BY chunk_id) p ON p.chunk_id = t.chunk_id
                         WHERE t.pipeline = $1 GROUP BY t.stage, t.state ORDER BY t.stage, t.state",
                    )
                    .bind(self.pipeline())
                    .fetch_all(pool)
                        .await
                        .map_err(db(op))?;
                    let stuck: i64 =
                        sqlx::query_scalar("SELECT COUNT(*) FROM stuck_leases s JOIN tasks t ON t.id = s.task_id WHERE t.pipeline = $1")
                            .bind(self.pipeline())
                            .fetch_one(pool)
                            .await
                            .map_err(db(op))?;
                    // The `redone_work` view's totals, for this pipeline.
                    let redone: (i64, i64) = sqlx::query_as(
                        "SELECT CAST(COALESCE(SUM(CASE WHEN a.outcome <> 'done' THEN 1 ELSE 0 END), 0) AS BIGINT),
                                CAST(COALESCE(SUM(a.redone_bytes), 0) AS BIGINT)
                         FROM attempts a JOIN tasks t ON t.id = a.task_id
                         WHERE (a.outcome <> 'done' OR a.redone_bytes > 0) AND t.pipeline = $1",
                    )
                    .bind(self.pipeline())
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

    /// Which of `chunks` are this pipeline's (in its ledger rows): what its cleanup may touch
    /// of what it finds under a root other pipelines and tools may share.
    pub async fn own_chunks(&self, chunks: &[String]) -> Result<std::collections::HashSet<String>> {
        let mut ours = std::collections::HashSet::new();
        for c in chunks.iter().collect::<std::collections::BTreeSet<_>>() {
            let n: i64 = self
                .call("own_chunks", || async move {
                    on_backend!(self, |pool, begin| {
                        sqlx::query_scalar(
                            "SELECT COUNT(*) FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE c.id = $1 AND f.pipeline = $2",
                        )
                        .bind(c)
                        .bind(self.pipeline())
                        .fetch_one(pool)
                        .await
                        .map_err(db("own_chunks"))
                    })
                })
                .await?;
            if n > 0 {
                ours.insert(c.clone());
            }
        }
        Ok(ours)
    }

    /// Which of `chunks` are this pipeline's and settled: every task of theirs done (or pruned:
    /// a chunk's next task is inserted in the transaction that finishes the one before), so no
    /// stage is about to write or commit their files. A file of such a chunk that the table
    /// does not name is nobody's (what `ferry vacuum` may remove).
    pub async fn settled_chunks(&self, chunks: &[String]) -> Result<std::collections::HashSet<String>> {
        let mut settled = std::collections::HashSet::new();
        for c in chunks.iter().collect::<std::collections::BTreeSet<_>>() {
            let n: i64 = self
                .call("settled_chunks", || async move {
                    on_backend!(self, |pool, begin| {
                        sqlx::query_scalar(
                            "SELECT COUNT(*) FROM chunks c JOIN source_files f ON f.id = c.file_id
                             WHERE c.id = $1 AND f.pipeline = $2
                               AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.chunk_id = c.id AND t.state <> 'done')",
                        )
                        .bind(c)
                        .bind(self.pipeline())
                        .fetch_one(pool)
                        .await
                        .map_err(db("settled_chunks"))
                    })
                })
                .await?;
            if n > 0 {
                settled.insert(c.clone());
            }
        }
        Ok(settled)
    }

    /// Where each of these chunks of this pipeline is staged, as the ledger records it (chunks
    /// it does not know are left out).
    pub async fn chunk_locations(&self, chunks: &[String]) -> Result<std::collections::HashMap<String, String>> {
        let mut found = std::collections::HashMap::new();
        for c in chunks.iter().collect::<std::collections::BTreeSet<_>>() {
            let location: Option<String> = self
                .call("chunk_locations", || async move {
                    on_backend!(self, |pool, begin| {
                        sqlx::query_scalar(
                            "SELECT c.location FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE c.id = $1 AND f.pipeline = $2",
                        )
                        .bind(c)
                        .bind(self.pipeline())
                        .fetch_optional(pool)
                        .await
                        .map_err(db("chunk_locations"))
                    })
                })
                .await?;
            if let Some(l) = location {
                found.insert(c.clone(), l);
            }
        }
        Ok(found)
    }

    /// Chunks no load will read landed files of: every task of theirs is done and their copy
    /// or load is among them (a load that published them, or a copy an operator skipped, which
    /// hands nothing on though an attempt of it may have landed the parts before it died). A
    /// chunk being redone (`ferry rerun`) is not among them while any of its stages is due,
    /// however long its copy takes, so what its new copy lands is never taken for a stray. So
    /// is a chunk of this pipeline with no task left at all (`ferry prune` took a replaced
    /// version's): a skipped chunk's parts that a switch moved and its version's record took
    /// back out wait under their landed names, and would stay for ever if prune came before gc.
    pub async fn landed_unneeded(&self) -> Result<Vec<String>> {
        self.call("landed_unneeded", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query_scalar(
                    "SELECT l.chunk_id FROM tasks l WHERE l.stage IN ('copy', 'load') AND l.state = 'done' AND l.pipeline = $1
                       AND NOT EXISTS (SELECT 1 FROM tasks o WHERE o.chunk_id = l.chunk_id AND o.pipeline = l.pipeline
                                       AND o.state <> 'done')
                     UNION
                     SELECT c.id FROM chunks c JOIN source_files f ON f.id = c.file_id
                     WHERE f.pipeline = $1 AND NOT EXISTS (SELECT 1 FROM tasks o WHERE o.chunk_id = c.id)",
                )
                .bind(self.pipeline())
                .fetch_all(pool)
                .await
                .map_err(db("landed_unneeded"))
            })
        })
        .await
    }

    /// Chunks whose spool files no one needs any more: no transform or copy of theirs left to
    /// do, whichever of the two tasks is there (done, skipped, or taken by `ferry prune`). A
    /// skipped transform hands nothing on, though an attempt that wrote its Parquet and died
    /// before recording it left the files; a chunk run again from transform and then skipped
    /// at copy may have no transform task left (pruned). Not while a transform is due (`ferry
    /// rerun`), so no transform is writing them now (gc's age cut-off covers a zombie whose
    /// lease ran out mid-write). A spool
    /// node's Parquet for a chunk that another node transformed and copied (its lease was lost
    /// mid-write) is among them, and so is every chunk whose transform and copy tasks `ferry
    /// prune` took: a published one (a copy whose after-commit removal never ran, its reply
    /// lost) and one of a replaced version, whose tasks all went (a skipped copy leaves its
    /// Parquet behind). Nothing else names those, and they would stay for ever.
    pub async fn spool_spent(&self) -> Result<Vec<String>> {
        self.call("spool_spent", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query_scalar(
                    "SELECT c.id FROM chunks c JOIN source_files f ON f.id = c.file_id
                     WHERE f.pipeline = $1
                       AND NOT EXISTS (SELECT 1 FROM tasks e WHERE e.chunk_id = c.id
                                       AND e.stage IN ('transform', 'copy') AND e.state <> 'done')",
                )
                .bind(self.pipeline())
                .fetch_all(pool)
                .await
                .map_err(db("spool_spent"))
            })
        })
        .await
    }

    /// Quarantined files and tasks, from the `quarantined` view.
    pub async fn quarantined(&self) -> Result<Vec<Quarantined>> {
        self.call("quarantined", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query_as("SELECT kind, what, reason FROM quarantined WHERE pipeline = $1 ORDER BY kind, what")
                    .bind(self.pipeline())
                    .fetch_all(pool)
                    .await
                    .map_err(db("quarantined"))
            })
        })
        .await
    }
}

/// Chunks and the bytes they still have to move.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Count {
    pub chunks: i64,
    pub bytes: i64,
}

/// One stage's work as an operator sees it (`ferry status`, the metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageOverview {
    pub stage: Stage,
    /// Tasks and bytes per state (every state, zero where there are none).
    pub states: Vec<(TaskState, Count)>,
    /// `scheduled_at` of the oldest task that is due now (ms since the epoch).
    pub oldest_due_ms: Option<i64>,
    /// When an attempt of this stage last finished its task.
    pub last_success_ms: Option<i64>,
    /// Finished in the last [`Overview::window_ms`]: chunks, records, bytes.
    pub recent: (i64, i64, i64),
    /// Attempts that did not finish their task, and the bytes they had moved.
    pub redone_attempts: i64,
    pub redone_bytes: i64,
    /// Running tasks whose lease has expired.
    pub stuck_leases: i64,
}

impl StageOverview {
    pub fn count(&self, state: TaskState) -> Count {
        self.states.iter().find(|(s, _)| *s == state).map(|(_, c)| *c).unwrap_or_default()
    }
}

/// A running task whose lease has expired, with the worker that held it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StuckLease {
    pub task_id: i64,
    pub chunk_id: String,
    pub stage: Stage,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<i64>,
}

from_row!(StuckLease { task_id, chunk_id, stage: String, lease_owner, lease_expires_at });

/// One of the latest attempts that did not finish its task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecentFailure {
    pub ended_at: i64,
    pub stage: Stage,
    pub chunk_id: String,
    pub attempt: i64,
    pub worker: String,
    pub outcome: String,
    pub error: Option<String>,
}

from_row!(RecentFailure { ended_at, stage: String, chunk_id, attempt, worker, outcome, error });

/// Everything `ferry status` and the ledger metrics show, read at `now_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overview {
    pub now_ms: i64,
    /// The window of [`StageOverview::recent`].
    pub window_ms: i64,
    pub stages: Vec<StageOverview>,
    pub files: Vec<(FileState, i64)>,
    pub stuck: Vec<StuckLease>,
    pub recent_failures: Vec<RecentFailure>,
    pub quarantined: Vec<Quarantined>,
    /// Stores down now, as the stages found them.
    pub outages: Vec<crate::Outage>,
    /// Chunks an operator skipped (`ferry skip`): (chunk, stage, reason).
    pub skipped: Vec<(String, String, String)>,
    /// Files whose bytes, taken in before, arrived again under the same name and were not
    /// taken in again (`versions = "keep"`): (uri, times, last at ms), latest first.
    pub arrived_again: Vec<(String, i64, i64)>,
}

impl Ledger {
    /// The operator's view of every stage (see [`Overview`]); `window` sets how far back
    /// throughput is measured.
    pub async fn overview(&self, window: std::time::Duration) -> Result<Overview> {
        let now = self.now_ms();
        let window_ms = window.as_millis() as i64;
        let status = self.status().await?;
        type Rows = (Vec<(String, i64)>, Vec<(String, i64, i64, i64)>, Vec<(String, i64, i64)>, Vec<StuckLease>, Vec<RecentFailure>);
        let [due_a, due_b] = TaskState::DUE.map(|s| s.as_str());
        let (oldest, recent, redone, stuck, failures): Rows = self
            .call("overview", || async move {
                on_backend!(self, |pool, begin| {
                    let op = "overview";
                    let oldest = sqlx::query_as(
                        "SELECT stage, MIN(scheduled_at) FROM tasks WHERE state IN ($2, $3) AND scheduled_at <= $1 AND pipeline = $4 GROUP BY stage",
                    )
                    .bind(now)
                    .bind(due_a)
                    .bind(due_b)
                    .bind(self.pipeline())
                    .fetch_all(pool)
                    .await
                    .map_err(db(op))?;
                    let recent = sqlx::query_as(
                        "SELECT a.stage, COUNT(*), CAST(COALESCE(SUM(a.records), 0) AS BIGINT), CAST(COALESCE(SUM(a.bytes), 0) AS BIGINT)
                         FROM attempts a JOIN chunks c ON c.id = a.chunk_id JOIN source_files f ON f.id = c.file_id
                         WHERE a.outcome = $2 AND a.ended_at >= $1 AND f.pipeline = $3 GROUP BY a.stage",
                    )
                    .bind(now - window_ms)
                    .bind(AttemptOutcome::Done.as_str())
                    .bind(self.pipeline())
                    .fetch_all(pool)
                    .await
                    .map_err(db(op))?;
                    let redone = sqlx::query_as(
                        "SELECT stage, CAST(SUM(CASE WHEN outcome <> 'done' THEN attempts ELSE 0 END) AS BIGINT),
                                CAST(COALESCE(SUM(bytes), 0) AS BIGINT) FROM redone_work
                         WHERE pipeline = $1 GROUP BY stage",
                    )
                    .bind(self.pipeline())
                    .fetch_all(pool)
                    .await
                    .map_err(db(op))?;
                    let stuck = sqlx::query_as(
                        "SELECT s.task_id, s.chunk_id, s.stage, s.lease_owner, s.lease_expires_at FROM stuck_leases s
                         JOIN tasks t ON t.id = s.task_id WHERE t.pipeline = $1 ORDER BY s.lease_expires_at",
                    )
                    .bind(self.pipeline())
                    .fetch_all(pool)
                    .await
                    .map_err(db(op))?;
                    let failures = sqlx::query_as(
                        "SELECT ended_at, stage, chunk_id, attempt, worker, outcome, error FROM recent_failures WHERE pipeline = $1 LIMIT 10",
                    )
                    .bind(self.pipeline())
                    .fetch_all(pool)
                    .await
                    .map_err(db(op))?;
                    Ok((oldest, recent, redone, stuck, failures))
                })
            })
            .await?;
        let mut stages = Vec::new();
        for &stage in Stage::ALL {
            let last_success_ms: Option<i64> = self
                .call("overview", || async move {
                    on_backend!(self, |pool, begin| {
                        // Newest first along the ended_at index: stops at the first match.
                        sqlx::query_scalar(
                            "SELECT a.ended_at FROM attempts a JOIN chunks c ON c.id = a.chunk_id JOIN source_files f ON f.id = c.file_id
                             WHERE a.stage = $1 AND a.outcome = $2 AND f.pipeline = $3 ORDER BY a.ended_at DESC LIMIT 1",
                        )
                        .bind(stage.as_str())
                        .bind(AttemptOutcome::Done.as_str())
                        .bind(self.pipeline())
                        .fetch_optional(pool)
                        .await
                        .map_err(db("overview"))
                    })
                })
                .await?;
            let name = stage.as_str();
            let states = TaskState::ALL
                .iter()
                .map(|&state| {
                    let r = status.backlog.iter().find(|r| r.stage == stage && r.state == state);
                    (state, r.map(|r| Count { chunks: r.tasks, bytes: r.bytes }).unwrap_or_default())
                })
                .collect();
            let (redone_attempts, redone_bytes) = redone.iter().find(|r| r.0 == name).map(|r| (r.1, r.2)).unwrap_or_default();
            stages.push(StageOverview {
                stage,
                states,
                oldest_due_ms: oldest.iter().find(|r| r.0 == name).map(|r| r.1),
                last_success_ms,
                recent: recent.iter().find(|r| r.0 == name).map(|r| (r.1, r.2, r.3)).unwrap_or_default(),
                redone_attempts,
                redone_bytes,
                stuck_leases: stuck.iter().filter(|s| s.stage == stage).count() as i64,
            });
        }
        let quarantined = self.quarantined().await?;
        let outages = self.open_outages().await?;
        let skipped = self
            .call("skips", || async move {
                on_backend!(self, |pool, begin| {
                    sqlx::query_as(
                        "SELECT s.chunk_id, s.stage, s.reason FROM skips s
                         WHERE EXISTS (SELECT 1 FROM tasks t WHERE t.chunk_id = s.chunk_id AND t.pipeline = $1)
                         ORDER BY s.skipped_at DESC, s.chunk_id LIMIT 50",
                    )
                    .bind(self.pipeline())
                    .fetch_all(pool)
                    .await
                    .map_err(db("skips"))
                })
            })
            .await?;
        let arrived_again = self
            .call("arrived_again", || async move {
                on_backend!(self, |pool, begin| {
                    sqlx::query_as(
                        "SELECT uri, arrived_again, arrived_again_at FROM source_files
                         WHERE pipeline = $1 AND arrived_again > 0 AND arrived_again_at IS NOT NULL
                         ORDER BY arrived_again_at DESC, uri LIMIT 50",
                    )
                    .bind(self.pipeline())
                    .fetch_all(pool)
                    .await
                    .map_err(db("arrived_again"))
                })
            })
            .await?;
        Ok(Overview {
            now_ms: now,
            window_ms,
            stages,
            files: status.files,
            stuck,
            recent_failures: failures,
            quarantined,
            outages,
            skipped,
            arrived_again,
        })
    }
}

/// Rows of attempts and of tasks `ferry prune` deletes per transaction.
const PRUNE_BATCH: i64 = 5000;

/// What `ferry prune` deleted (or would).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub attempts: u64,
    pub tasks: u64,
    pub outages: u64,
    pub notes: u64,
}

impl Ledger {
    /// Deletes this pipeline's history finished before `cutoff_ms`: attempts of done tasks,
    /// the transform and copy tasks of chunks whose load is done (with their attempts), every
    /// task of a chunk of a replaced version (a newer version of its file is in the table,
    /// nothing of it is), closed outages and chunk notes. Exactly-once needs none of it:
    /// source files, chunks, parts, rejects, published rows and the load task of every chunk
    /// in the table stay, so extract still knows every file and no stage finds work to redo.
    pub async fn prune(&self, cutoff_ms: i64, dry_run: bool) -> Result<Pruned> {
        // Transform and copy tasks that may go: their chunk is published (load done), and the
        // task finished before the cutoff.
        // The conditions are on the deleted rows themselves (not only in a subquery), so a task
        // a concurrent `rerun` just made available again is not deleted under it.
        // And every task of a chunk of a replaced version: nothing of it is in the table, a
        // newer version of its file is, and none of its tasks is unfinished. Should the old
        // bytes come back, extract sends such a chunk through transform again (see
        // `undone_version`), so its history is not needed for that either.
        const OLD_TASK: &str = concat!(
            "tasks.pipeline = $1 AND tasks.state = 'done' AND tasks.finalized_at < $2
             AND ((tasks.stage IN ('transform', 'copy')
                   AND EXISTS (SELECT 1 FROM tasks l WHERE l.chunk_id = tasks.chunk_id AND l.stage = 'load' AND l.state = 'done'))
                  OR (NOT EXISTS (SELECT 1 FROM published p WHERE p.chunk_id = tasks.chunk_id)
                      AND NOT EXISTS (SELECT 1 FROM tasks o WHERE o.chunk_id = tasks.chunk_id AND o.state <> 'done')
                      AND EXISTS (SELECT 1 FROM chunks c JOIN source_files f ON f.id = c.file_id
                                  JOIN source_files n ON n.pipeline = f.pipeline AND n.uri = f.uri AND n.version > f.version
                                  WHERE c.id = tasks.chunk_id AND ",
            version_in_table!("n"),
            ")))"
        );
        let old_attempt = format!(
            "attempts.task_id IN (SELECT id FROM tasks WHERE {OLD_TASK})
             OR (attempts.ended_at < $2 AND attempts.task_id IN (SELECT id FROM tasks WHERE pipeline = $1 AND state = 'done'))"
        );
        // Deleted PRUNE_BATCH rows at a time, one transaction each: the first prune of a year
        // of history holds the write lock (SQLite) or its row locks (Postgres) for one batch at
        // a time, and stages keep claiming in between. A task goes once its attempts have.
        let attempts_sql =
            format!("DELETE FROM attempts WHERE id IN (SELECT attempts.id FROM attempts WHERE {old_attempt} LIMIT {PRUNE_BATCH})");
        let tasks_sql = format!(
            "DELETE FROM tasks WHERE {OLD_TASK} AND id IN (SELECT tasks.id FROM tasks WHERE {OLD_TASK}
               AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.task_id = tasks.id) LIMIT {PRUNE_BATCH})"
        );
        let outages_sql = "DELETE FROM outages WHERE ended_at IS NOT NULL AND ended_at < $2 AND pipeline = $1".to_string();
        let notes_sql = "DELETE FROM chunk_notes WHERE noted_at < $2 AND chunk_id IN
            (SELECT c.id FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE f.pipeline = $1)"
            .to_string();
        if dry_run {
            let counts = [
                format!("SELECT COUNT(*) FROM attempts WHERE {old_attempt}"),
                format!("SELECT COUNT(*) FROM tasks WHERE {OLD_TASK}"),
                outages_sql.replacen("DELETE", "SELECT COUNT(*)", 1),
                notes_sql.replacen("DELETE", "SELECT COUNT(*)", 1),
            ];
            let n: Vec<i64> = self
                .call("prune", || {
                    let counts = counts.clone();
                    async move {
                        on_backend!(self, |pool, begin| {
                            let mut n = Vec::new();
                            for q in &counts {
                                let c: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(q.clone()))
                                    .bind(self.pipeline())
                                    .bind(cutoff_ms)
                                    .fetch_one(pool)
                                    .await
                                    .map_err(db("prune"))?;
                                n.push(c);
                            }
                            Ok(n)
                        })
                    }
                })
                .await?;
            return Ok(Pruned { attempts: n[0] as u64, tasks: n[1] as u64, outages: n[2] as u64, notes: n[3] as u64 });
        }
        let mut total = Pruned::default();
        loop {
            let batch = [&attempts_sql, &tasks_sql, &outages_sql, &notes_sql];
            let n: [u64; 4] = self
                .call("prune", || async move {
                    on_backend!(self, |pool, begin| {
                        let op = "prune";
                        let (_write, mut tx) = write_tx!(self, pool, begin, op);
                        let mut n = [0u64; 4];
                        for (i, q) in batch.into_iter().enumerate() {
                            n[i] = sqlx::query(sqlx::AssertSqlSafe(q.clone()))
                                .bind(self.pipeline())
                                .bind(cutoff_ms)
                                .execute(&mut *tx)
                                .await
                                .map_err(db(op))?
                                .rows_affected();
                        }
                        tx.commit().await.map_err(db(op))?;
                        Ok(n)
                    })
                })
                .await?;
            total.attempts += n[0];
            total.tasks += n[1];
            total.outages += n[2];
            total.notes += n[3];
            if n[0] == 0 && n[1] == 0 {
                return Ok(total);
            }
        }
    }
}

/// Why `skip` closed nothing: its load has work only it can finish.
enum Refused {
    /// Parts of the chunk are in the table, unrecorded, or its own rows are recorded.
    InTable,
    /// The chunk is a version with no rows that replaces an older one.
    EmptyVersion,
}
