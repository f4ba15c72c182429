//! The work ledger: every stage's source of truth, in SQLite (embedded default) or Postgres.
//!
//! # Design note
//!
//! Three kinds of rows. `source_files` are identified by `(uri, content_hash)`: the same bytes
//! at the same place are never ingested twice, changed bytes are a new version. `chunks` are
//! pieces of one source file with a deterministic id (a hash of the file's content hash and
//! the chunk's sequence number), so re-splitting a file after a crash names the same chunks.
//! `tasks` hold one row per (chunk, stage) and move through this state machine:
//!
//! ```text
//!                      claim (attempt+1, epoch+1, lease)
//!   available ───────────────────────────────────────────────► running ──complete──► done
//!       ▲                                                       │  │  │
//!       │ release (SIGTERM; attempt-1)                          │  │  └─fail(permanent) or
//!       └───────────────────────────────────────────────────────┘  │    attempts used up──► quarantined
//!                                                                  │                           │
//!   retryable ◄──fail(transient) / lease expired, scheduled_at=backoff                         │
//!       │                                                                                      │
//!       └──claim once scheduled_at <= now ──► running        requeue (attempt=0) ──► available ◄┘
//! ```
//!
//! `attempts` is append-only: one row per lease that ended (done, retryable, quarantined,
//! lease_expired, released), with the worker, the times, the error class and the bytes moved.
//!
//! ## Invariants
//! - A task is `running` exactly when it has a lease owner and expiry (CHECK constraint), and
//!   `finalized_at` is set exactly for `done` / `quarantined` (CHECK constraint).
//! - Every claim bumps the task's `epoch`. complete / fail / heartbeat / release change a row
//!   only `WHERE state = 'running' AND epoch = <caller's epoch>`: a zombie whose lease was
//!   reclaimed gets [`Error::LeaseLost`] and its result is not recorded.
//! - Backoff is stored as `scheduled_at`; no process sleeps through it, and claims skip rows
//!   whose time has not come.
//! - Completing stage S of a chunk and creating its stage S+1 task happen in one transaction,
//!   so a chunk never falls between stages.
//! - complete and fail are idempotent for the same epoch: a retry after a lost reply (the
//!   commit went through, the connection dropped) sees its own result and returns Ok.
//!
//! ## What a crash leaves behind
//! - During extract, after a file is registered but before its chunks are: the file stays
//!   `registered`; the next run splits it again into the same chunk ids and records them.
//! - After a claim, before complete: the task stays `running` until its lease expires; the
//!   next claim (or [`Ledger::reclaim_expired`]) moves it to `retryable` (or `quarantined`
//!   when its attempts are used up) and writes a `lease_expired` attempt.
//! - Between a stage's side effect (a file written, renamed, published) and complete: the
//!   task is retried, so every stage's side effect must be idempotent for the same chunk.
//!   The stages guarantee this with deterministic names and content hashes.
//! - Inside any ledger transaction: the database rolls it back; nothing is half-written.
//!
//! ## Bounded calls
//! Every call runs under `call_timeout` (client side) and, on Postgres, `statement_timeout`;
//! SQLite waits at most `busy_timeout` for the write lock. A failed call whose error is
//! transient (lost connection, busy database, timeout) is retried with capped, jittered
//! backoff; anything else is returned at once.

mod backend;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use sqlx::Row;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, ErrorClass, Result};
pub use backend::LedgerUrl;
use backend::{Backend, Begin};

/// A pipeline stage that works on chunks through tasks. (Extract works on source files.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    Transform,
    Copy,
    Load,
}

impl Stage {
    pub const ALL: [Stage; 3] = [Stage::Transform, Stage::Copy, Stage::Load];

    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Transform => "transform",
            Stage::Copy => "copy",
            Stage::Load => "load",
        }
    }
}

impl std::str::FromStr for Stage {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Stage::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown stage {s:?} (expected transform, copy or load)"))
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Exponential backoff with jitter, applied by writing `scheduled_at`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub min: Duration,
    pub max: Duration,
    pub factor: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        // 1 s doubles to 5 min: a few quick retries for a flapping link, then patience.
        Backoff { min: Duration::from_secs(1), max: Duration::from_secs(300), factor: 2.0 }
    }
}

impl Backoff {
    /// Ceiling of the delay after the `attempt`-th failure (attempt counts from 1).
    pub fn ceiling(&self, attempt: i64) -> Duration {
        let exp = (attempt.max(1) - 1).min(62) as i32;
        let d = self.min.as_secs_f64() * self.factor.powi(exp);
        Duration::from_secs_f64(d.min(self.max.as_secs_f64()))
    }

    /// "Equal jitter": at least half the ceiling, so retries spread out but never bunch at 0.
    pub fn delay(&self, attempt: i64) -> Duration {
        let c = self.ceiling(attempt);
        let half = c / 2;
        half + half.mul_f64(rand::random::<f64>())
    }
}

#[derive(Debug, Clone)]
pub struct LedgerOptions {
    /// How long a claim is valid without a heartbeat.
    pub lease: Duration,
    /// Client-side deadline for one ledger call (one attempt of it).
    pub call_timeout: Duration,
    /// How many times a ledger call is retried after a transient failure.
    pub call_retries: u32,
    /// SQLite: how long to wait for the write lock. Postgres: `statement_timeout`.
    pub lock_timeout: Duration,
    /// Default `max_attempts` of new tasks.
    pub max_attempts: i64,
    /// Backoff between attempts of a task.
    pub backoff: Backoff,
    /// How often a claiming process also moves expired leases back to `retryable`.
    pub reclaim_interval: Duration,
    /// Connections in the pool.
    pub max_connections: u32,
}

impl Default for LedgerOptions {
    fn default() -> Self {
        LedgerOptions {
            lease: Duration::from_secs(60),
            call_timeout: Duration::from_secs(30),
            call_retries: 5,
            lock_timeout: Duration::from_secs(10),
            max_attempts: 8,
            backoff: Backoff::default(),
            reclaim_interval: Duration::from_secs(5),
            max_connections: 8,
        }
    }
}

/// A claimed task. Holding one is the right to work on (chunk, stage) until it expires;
/// every write back to the ledger is checked against `epoch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub task_id: i64,
    pub chunk_id: String,
    pub stage: Stage,
    pub attempt: i64,
    pub max_attempts: i64,
    pub epoch: i64,
    pub worker: String,
    pub started_at: i64,
}

/// What a finished attempt did, for the history and the throughput view.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Work {
    pub bytes: i64,
    pub records: i64,
}

/// Where a failed task went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOutcome {
    Retry { at_ms: i64 },
    Quarantined,
}

#[derive(Debug, Clone)]
pub struct NewSourceFile {
    pub uri: String,
    pub size: i64,
    pub mtime_ms: i64,
    pub content_hash: String,
    pub format: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    pub id: i64,
    pub uri: String,
    pub size: i64,
    pub mtime_ms: i64,
    pub content_hash: String,
    pub version: i64,
    pub format: String,
    pub state: String,
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeKind {
    Bytes,
    Records,
}

impl RangeKind {
    fn as_str(&self) -> &'static str {
        match self {
            RangeKind::Bytes => "bytes",
            RangeKind::Records => "records",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewChunk {
    pub id: String,
    pub seq: i64,
    pub range_kind: RangeKind,
    pub range_start: i64,
    pub range_end: i64,
    pub records: Option<i64>,
    pub bytes: i64,
    pub content_hash: String,
    /// Where the staged chunk lives (a storage URL).
    pub location: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub id: String,
    pub file_id: i64,
    pub file_uri: String,
    pub format: String,
    pub seq: i64,
    /// Index of the chunk's first record in its file (for positions in error messages).
    pub range_start: i64,
    pub records: Option<i64>,
    pub bytes: i64,
    pub content_hash: String,
    pub location: String,
}

/// The deterministic id of the `seq`-th chunk of a file with content hash `file_hash`.
pub fn chunk_id(file_hash: &str, seq: i64) -> String {
    let mut h = blake3::Hasher::new();
    h.update(file_hash.as_bytes());
    h.update(&seq.to_le_bytes());
    h.finalize().to_hex()[..24].to_string()
}

/// One row of the `backlog` view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BacklogRow {
    pub stage: String,
    pub state: String,
    pub tasks: i64,
    pub bytes: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    pub files: Vec<(String, i64)>,
    pub backlog: Vec<BacklogRow>,
    pub stuck_leases: i64,
    pub redone_attempts: i64,
    pub redone_bytes: i64,
}

/// Which quarantined tasks to send back to `available`.
#[derive(Debug, Clone, Default)]
pub struct RequeueFilter {
    pub stage: Option<Stage>,
    pub chunk_id: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Ledger {
    backend: Backend,
    opts: LedgerOptions,
    clock: Arc<dyn Clock>,
    last_reclaim_ms: Arc<AtomicI64>,
    /// SQLite allows one writer at a time. Queueing this process's writers here, instead of
    /// letting them collide on the database lock, avoids SQLite's sleeping busy handler
    /// (which costs milliseconds per collision); other processes still wait via busy_timeout.
    sqlite_writer: Arc<tokio::sync::Mutex<()>>,
    /// SQLite completions waiting to be committed together (see `complete_batched`).
    completions: Arc<std::sync::Mutex<Vec<Completion>>>,
}

/// Runs `$body` with `$pool` bound to the concrete pool of the backend and `$begin` to the
/// statement that opens a write transaction there (SQLite takes the write lock up front).
macro_rules! on_backend {
    ($self:expr, |$pool:ident, $begin:ident| $body:expr) => {
        match &$self.backend {
            Backend::Sqlite($pool) => {
                #[allow(unused_variables)]
                let $begin = Begin::SQLITE;
                $body
            }
            Backend::Postgres($pool) => {
                #[allow(unused_variables)]
                let $begin = Begin::POSTGRES;
                $body
            }
        }
    };
}

/// The claim statement; `$lock` is the row-locking clause of the backend.
macro_rules! claim_sql {
    ($lock:literal) => {
        concat!(
            "WITH picked AS (
                SELECT id FROM tasks
                WHERE stage = $1 AND state IN ('available', 'retryable') AND scheduled_at <= $2
                ORDER BY scheduled_at, id
                LIMIT $3 ",
            $lock,
            ")
            UPDATE tasks
            SET state = 'running', attempt = attempt + 1, epoch = epoch + 1,
                lease_owner = $4, lease_expires_at = $5, attempted_at = $2
            WHERE id IN (SELECT id FROM picked)
            RETURNING id, chunk_id, attempt, max_attempts, epoch"
        )
    };
}

/// Appends one row to the attempt history; run inside the caller's transaction.
macro_rules! insert_attempt {
    ($tx:expr, $lease:expr, $now:expr, $outcome:expr, $class:expr, $error:expr, $work:expr) => {{
        let lease: &Lease = $lease;
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
            .bind($outcome)
            .bind(class.map(|c| c.as_str()))
            .bind(error)
            .bind(work.bytes)
            .bind(work.records)
            .execute($tx)
            .await
            .map_err(db("insert_attempt"))
    }};
}

/// Most completions committed in one SQLite transaction (bounded by SQLite's 32766 parameters).
const COMPLETION_BATCH: usize = 256;

/// A completion waiting for the SQLite writer.
#[derive(Debug)]
struct Completion {
    lease: Lease,
    work: Work,
    now: i64,
    reply: Option<tokio::sync::oneshot::Sender<Result<bool>>>,
}

/// Commits a batch of completions as one multi-row UPDATE; only rows still `running` at the
/// caller's epoch change. A single statement is atomic and takes SQLite's write lock when it
/// starts, so it needs no BEGIN/COMMIT round trips. Returns the ids of the rows it changed.
async fn flush_completions(pool: &sqlx::SqlitePool, batch: &[Completion]) -> Result<Vec<i64>> {
    use std::fmt::Write;
    let now = batch.iter().map(|c| c.now).max().unwrap_or_default();
    let mut sql = String::from(
        "UPDATE tasks SET state = 'done', finalized_at = $1, lease_owner = NULL,
            lease_expires_at = NULL, last_error = NULL, last_error_class = NULL,
            bytes = v.column3, records = v.column4
         FROM (VALUES ",
    );
    for i in 0..batch.len() {
        let b = 4 * i + 1;
        let _ = write!(sql, "{}(${}, ${}, ${}, ${})", if i > 0 { ", " } else { "" }, b + 1, b + 2, b + 3, b + 4);
    }
    sql.push_str(
        ") AS v WHERE tasks.id = v.column1 AND tasks.epoch = v.column2 AND tasks.state = 'running'
         RETURNING tasks.id",
    );
    // Only numbered placeholders are spliced in; every value is bound.
    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now);
    for c in batch {
        q = q.bind(c.lease.task_id).bind(c.lease.epoch).bind(c.work.bytes).bind(c.work.records);
    }
    q.fetch_all(pool)
        .await
        .map_err(db("complete"))?
        .iter()
        .map(|r| r.try_get::<i64, _>("id"))
        .collect::<std::result::Result<_, _>>()
        .map_err(db("complete"))
}

/// Finishing a task: the `tasks_on_done` trigger appends the history row and enqueues the
/// chunk's next stage inside this same statement.
const COMPLETE: &str = "UPDATE tasks SET state = 'done', finalized_at = $3, lease_owner = NULL,
        lease_expires_at = NULL, last_error = NULL, last_error_class = NULL, bytes = $4, records = $5
    WHERE id = $1 AND epoch = $2 AND state = 'running'";

const INSERT_ATTEMPT: &str = "INSERT INTO attempts
    (task_id, chunk_id, stage, attempt, epoch, worker, started_at, ended_at, outcome,
     error_class, error, bytes, records)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)";

impl Ledger {
    /// Connects (creating an SQLite file on first use) and applies the migrations.
    pub async fn connect(url: &str, opts: LedgerOptions) -> Result<Ledger> {
        let parsed = LedgerUrl::parse(url)?;
        let backend = Backend::connect(&parsed, &opts).await?;
        let ledger = Ledger {
            backend,
            opts,
            clock: Arc::new(SystemClock),
            last_reclaim_ms: Arc::new(AtomicI64::new(i64::MIN)),
            sqlite_writer: Arc::new(tokio::sync::Mutex::new(())),
            completions: Arc::default(),
        };
        ledger.migrate().await?;
        Ok(ledger)
    }

    /// Replaces the clock (tests drive a [`crate::clock::ManualClock`]).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Ledger {
        self.clock = clock;
        self
    }

    pub fn options(&self) -> &LedgerOptions {
        &self.opts
    }

    pub fn backend_name(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Files older than this were left by a writer whose lease has surely expired: anything
    /// temporary from before it is abandoned.
    pub fn stale_before_ms(&self) -> i64 {
        self.now_ms() - 2 * self.opts.lease.as_millis() as i64
    }

    /// Applies pending migrations. Safe when several processes start at once: Postgres takes
    /// an advisory lock, SQLite a file lock next to the database.
    pub async fn migrate(&self) -> Result<()> {
        self.backend.migrate().await
    }

    async fn write_guard(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match self.backend {
            Backend::Sqlite(_) => Some(self.sqlite_writer.lock().await),
            Backend::Postgres(_) => None,
        }
    }

    /// Runs one ledger call under the client-side deadline, retrying transient failures with
    /// capped, jittered backoff. The only retry loop around ledger calls.
    async fn call<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let backoff = Backoff {
            min: Duration::from_millis(50),
            max: Duration::from_secs(5),
            factor: 2.0,
        };
        let mut tries = 0;
        loop {
            tries += 1;
            let res = match tokio::time::timeout(self.opts.call_timeout, f()).await {
                Ok(r) => r,
                Err(_) => Err(Error::LedgerTimeout { op, deadline: self.opts.call_timeout }),
            };
            match res {
                Err(e) if e.is_transient() && tries <= self.opts.call_retries => {
                    let d = backoff.delay(tries as i64);
                    tracing::warn!(op, error = %e, retry_in = ?d, "ledger call failed, retrying");
                    tokio::time::sleep(d).await;
                }
                other => return other,
            }
        }
    }

    // ----- source files and chunks (extract) -------------------------------------------------

    /// The file already known at this uri with this size and mtime, if any: lets extract skip
    /// hashing files it has seen.
    pub async fn find_file(&self, uri: &str, size: i64, mtime_ms: i64) -> Result<Option<SourceFile>> {
        self.call("find_file", || async move {
            on_backend!(self, |pool, begin| {
                let row = sqlx::query(
                    "SELECT id, uri, size, mtime_ms, content_hash, version, format, state, error
                     FROM source_files WHERE uri = $1 AND size = $2 AND mtime_ms = $3
                     ORDER BY id DESC LIMIT 1",
                )
                .bind(uri)
                .bind(size)
                .bind(mtime_ms)
                .fetch_optional(pool)
                .await
                .map_err(db("find_file"))?;
                row.map(|r| source_file_from_row(&r)).transpose()
            })
        })
        .await
    }

    /// Registers a source file; idempotent on `(uri, content_hash)`. Returns the stored row,
    /// which may be an earlier registration of the same bytes.
    pub async fn register_file(&self, f: &NewSourceFile) -> Result<SourceFile> {
        let now = self.now_ms();
        self.call("register_file", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query(
                    "INSERT INTO source_files
                        (uri, size, mtime_ms, content_hash, version, format, registered_at)
                     VALUES ($1, $2, $3, $4,
                        (SELECT COUNT(*) + 1 FROM source_files WHERE uri = $1), $5, $6)
                     ON CONFLICT (uri, content_hash) DO NOTHING",
                )
                .bind(&f.uri)
                .bind(f.size)
                .bind(f.mtime_ms)
                .bind(&f.content_hash)
                .bind(&f.format)
                .bind(now)
                .execute(pool)
                .await
                .map_err(db("register_file"))?;
                let row = sqlx::query(
                    "SELECT id, uri, size, mtime_ms, content_hash, version, format, state, error
                     FROM source_files WHERE uri = $1 AND content_hash = $2",
                )
                .bind(&f.uri)
                .bind(&f.content_hash)
                .fetch_one(pool)
                .await
                .map_err(db("register_file"))?;
                source_file_from_row(&row)
            })
        })
        .await
    }

    /// Records a file's chunks and their first tasks, and marks the file `chunked`, in one
    /// transaction. Idempotent: chunks and tasks that exist are left alone.
    pub async fn record_chunks(&self, file_id: i64, chunks: &[NewChunk], first: Stage) -> Result<()> {
        let now = self.now_ms();
        let max_attempts = self.opts.max_attempts;
        self.call("record_chunks", || async move {
            on_backend!(self, |pool, begin| {
                let op = "record_chunks";
                let _write = self.write_guard().await;
                let mut tx = pool.begin_with(begin.0).await.map_err(db(op))?;
                for c in chunks {
                    sqlx::query(
                        "INSERT INTO chunks (id, file_id, seq, range_kind, range_start, range_end,
                            records, bytes, content_hash, location, created_at)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
                         ON CONFLICT (id) DO NOTHING",
                    )
                    .bind(&c.id)
                    .bind(file_id)
                    .bind(c.seq)
                    .bind(c.range_kind.as_str())
                    .bind(c.range_start)
                    .bind(c.range_end)
                    .bind(c.records)
                    .bind(c.bytes)
                    .bind(&c.content_hash)
                    .bind(&c.location)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(db(op))?;
                    sqlx::query(
                        "INSERT INTO tasks (chunk_id, stage, state, max_attempts, scheduled_at, created_at)
                         VALUES ($1, $2, 'available', $3, $4, $4)
                         ON CONFLICT (chunk_id, stage) DO NOTHING",
                    )
                    .bind(&c.id)
                    .bind(first.as_str())
                    .bind(max_attempts)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(db(op))?;
                }
                sqlx::query(
                    "UPDATE source_files SET state = 'chunked', chunks = $2, chunked_at = $3, error = NULL
                     WHERE id = $1 AND state <> 'chunked'",
                )
                .bind(file_id)
                .bind(chunks.len() as i64)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(db(op))?;
                tx.commit().await.map_err(db(op))
            })
        })
        .await
    }

    /// Marks a source file as bad input that will not be chunked, with the reason.
    pub async fn quarantine_file(&self, file_id: i64, reason: &str) -> Result<()> {
        self.call("quarantine_file", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query("UPDATE source_files SET state = 'quarantined', error = $2 WHERE id = $1")
                    .bind(file_id)
                    .bind(reason)
                    .execute(pool)
                    .await
                    .map_err(db("quarantine_file"))?;
                Ok(())
            })
        })
        .await
    }

    pub async fn chunk(&self, id: &str) -> Result<Chunk> {
        self.call("chunk", || async move {
            on_backend!(self, |pool, begin| {
                let r = sqlx::query(
                    "SELECT c.id, c.file_id, f.uri, f.format, c.seq, c.range_start, c.records, c.bytes,
                            c.content_hash, c.location
                     FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE c.id = $1",
                )
                .bind(id)
                .fetch_one(pool)
                .await
                .map_err(db("chunk"))?;
                Ok(Chunk {
                    id: r.try_get("id").map_err(db("chunk"))?,
                    file_id: r.try_get("file_id").map_err(db("chunk"))?,
                    file_uri: r.try_get("uri").map_err(db("chunk"))?,
                    format: r.try_get("format").map_err(db("chunk"))?,
                    seq: r.try_get("seq").map_err(db("chunk"))?,
                    range_start: r.try_get("range_start").map_err(db("chunk"))?,
                    records: r.try_get("records").map_err(db("chunk"))?,
                    bytes: r.try_get("bytes").map_err(db("chunk"))?,
                    content_hash: r.try_get("content_hash").map_err(db("chunk"))?,
                    location: r.try_get("location").map_err(db("chunk"))?,
                })
            })
        })
        .await
    }

    // ----- tasks ---------------------------------------------------------------------------

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
                    Begin::SQLITE => claim_sql!(""),
                    _ => claim_sql!("FOR UPDATE SKIP LOCKED"),
                };
                let query = sqlx::query(sql)
                    .bind(stage.as_str())
                    .bind(now)
                    .bind(n)
                    .bind(worker)
                    .bind(expires);
                // One statement is atomic on its own, on both backends, so a claim is a single
                // round trip. On SQLite an UPDATE takes the write lock as it starts, before it
                // reads (the same as BEGIN IMMEDIATE: no lock upgrade half-way, waits bounded by
                // busy_timeout); this process's writers also queue on `sqlite_writer`.
                let _write = self.write_guard().await;
                let rows = query.fetch_all(pool).await.map_err(db("claim"))?;
                drop(_write);
                let mut leases = rows
                    .iter()
                    .map(|r| {
                        Ok(Lease {
                            task_id: r.try_get("id")?,
                            chunk_id: r.try_get("chunk_id")?,
                            stage,
                            attempt: r.try_get("attempt")?,
                            max_attempts: r.try_get("max_attempts")?,
                            epoch: r.try_get("epoch")?,
                            worker: worker.to_string(),
                            started_at: now,
                        })
                    })
                    .collect::<std::result::Result<Vec<_>, sqlx::Error>>()
                    .map_err(db("claim"))?;
                leases.sort_by_key(|l| l.task_id);
                Ok(leases)
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
                         WHERE id = $1 AND epoch = $2 AND state = 'running'",
                    )
                    .bind(lease.task_id)
                    .bind(lease.epoch)
                    .bind(expires)
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
    /// the chunk's next stage (transform -> copy -> load) available. Rejected with [`Error::LeaseLost`] unless the caller holds the current epoch.
    pub async fn complete(&self, lease: &Lease, work: Work) -> Result<()> {
        let now = self.now_ms();
        let changed = self
            .call("complete", || async move {
                match &self.backend {
                    // One statement, one round trip, one commit.
                    Backend::Postgres(pool) => sqlx::query(COMPLETE)
                        .bind(lease.task_id)
                        .bind(lease.epoch)
                        .bind(now)
                        .bind(work.bytes)
                        .bind(work.records)
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
            Some((state, epoch)) if state == "done" && epoch == lease.epoch => Ok(()),
            _ => Err(self.lease_lost(lease).await),
        }
    }

    /// SQLite: queue the completion; whoever holds the writer lock commits every queued
    /// completion in one statement. On SQLite the cost of a statement is mostly the hop to
    /// sqlx's connection thread and back (measured: ~60% of CPU in thread wake-ups), so N
    /// concurrent completions become one hop instead of N. Returns whether this lease's row changed.
    async fn complete_batched(&self, pool: &sqlx::SqlitePool, mut item: Completion) -> Result<bool> {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        item.reply = Some(tx);
        self.completions.lock().unwrap_or_else(|e| e.into_inner()).push(item);
        // Either the current writer flushes this item too (then there is nothing to lock for),
        // or this caller gets the lock and flushes everything queued.
        let cancelled = || {
            Err(Error::LedgerBatch { message: "batched completion was cancelled".into(), class: ErrorClass::Transient })
        };
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
                        Err(e) => Err(Error::LedgerBatch { message: e.to_string(), class: e.class() }),
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

    /// Records a failed attempt. Transient failures go to `retryable` with backoff until
    /// `max_attempts`; permanent ones (and the last attempt) go to `quarantined`.
    pub async fn fail(&self, lease: &Lease, class: ErrorClass, error: &str, work: Work) -> Result<FailOutcome> {
        let now = self.now_ms();
        let exhausted = lease.attempt >= lease.max_attempts;
        let quarantine = class == ErrorClass::Permanent || exhausted;
        let retry_at = now + self.opts.backoff.delay(lease.attempt).as_millis() as i64;
        let (state, outcome) = if quarantine {
            ("quarantined", FailOutcome::Quarantined)
        } else {
            ("retryable", FailOutcome::Retry { at_ms: retry_at })
        };
        let message = if exhausted && class == ErrorClass::Transient {
            format!("{error} (gave up after {} attempts)", lease.attempt)
        } else {
            error.to_string()
        };
        let message = message.as_str();
        let changed = self
            .call("fail", || async move {
                on_backend!(self, |pool, begin| {
                    let op = "fail";
                    let _write = self.write_guard().await;
                let mut tx = pool.begin_with(begin.0).await.map_err(db(op))?;
                    let changed = sqlx::query(
                        "UPDATE tasks SET state = $3, scheduled_at = $4, lease_owner = NULL,
                            lease_expires_at = NULL, last_error = $5, last_error_class = $6,
                            finalized_at = CASE WHEN $3 = 'quarantined' THEN $7 ELSE NULL END
                         WHERE id = $1 AND epoch = $2 AND state = 'running'",
                    )
                    .bind(lease.task_id)
                    .bind(lease.epoch)
                    .bind(state)
                    .bind(if quarantine { now } else { retry_at })
                    .bind(message)
                    .bind(class.as_str())
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(db(op))?
                    .rows_affected();
                    if changed != 1 {
                        return Ok(false);
                    }
                    insert_attempt!(&mut *tx, lease, now, state, Some(class), Some(message), work)?;
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
    pub async fn release(&self, lease: &Lease) -> Result<()> {
        let now = self.now_ms();
        let changed = self
            .call("release", || async move {
                on_backend!(self, |pool, begin| {
                    let op = "release";
                    let _write = self.write_guard().await;
                let mut tx = pool.begin_with(begin.0).await.map_err(db(op))?;
                    let changed = sqlx::query(
                        "UPDATE tasks SET state = 'available', attempt = attempt - 1, scheduled_at = $3,
                            lease_owner = NULL, lease_expires_at = NULL
                         WHERE id = $1 AND epoch = $2 AND state = 'running'",
                    )
                    .bind(lease.task_id)
                    .bind(lease.epoch)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(db(op))?
                    .rows_affected();
                    if changed == 1 {
                        insert_attempt!(&mut *tx, lease, now, "released", None, None, Work::default())?;
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
                         FROM tasks WHERE state = 'running' AND lease_expires_at < $1 ORDER BY id LIMIT 1000"
                    }
                    _ => {
                        "SELECT id, chunk_id, stage, attempt, max_attempts, epoch, lease_owner, attempted_at
                         FROM tasks WHERE state = 'running' AND lease_expires_at < $1 ORDER BY id LIMIT 1000
                         FOR UPDATE SKIP LOCKED"
                    }
                };
                let _write = self.write_guard().await;
                let mut tx = pool.begin_with(begin.0).await.map_err(db(op))?;
                let rows = sqlx::query(select).bind(now).fetch_all(&mut *tx).await.map_err(db(op))?;
                let mut moved = 0;
                for r in &rows {
                    let lease = Lease {
                        task_id: r.try_get("id").map_err(db(op))?,
                        chunk_id: r.try_get("chunk_id").map_err(db(op))?,
                        stage: r
                            .try_get::<String, _>("stage")
                            .map_err(db(op))?
                            .parse()
                            .map_err(Error::Other)?,
                        attempt: r.try_get("attempt").map_err(db(op))?,
                        max_attempts: r.try_get("max_attempts").map_err(db(op))?,
                        epoch: r.try_get("epoch").map_err(db(op))?,
                        worker: r.try_get("lease_owner").map_err(db(op))?,
                        started_at: r.try_get::<Option<i64>, _>("attempted_at").map_err(db(op))?.unwrap_or(now),
                    };
                    let exhausted = lease.attempt >= lease.max_attempts;
                    let state = if exhausted { "quarantined" } else { "retryable" };
                    let message = if exhausted {
                        format!("lease of {} expired (gave up after {} attempts)", lease.worker, lease.attempt)
                    } else {
                        format!("lease of {} expired", lease.worker)
                    };
                    let changed = sqlx::query(
                        "UPDATE tasks SET state = $3, scheduled_at = $4, lease_owner = NULL,
                            lease_expires_at = NULL, last_error = $5, last_error_class = 'transient',
                            finalized_at = CASE WHEN $3 = 'quarantined' THEN $4 ELSE NULL END
                         WHERE id = $1 AND epoch = $2 AND state = 'running'",
                    )
                    .bind(lease.task_id)
                    .bind(lease.epoch)
                    .bind(state)
                    .bind(now)
                    .bind(&message)
                    .execute(&mut *tx)
                    .await
                    .map_err(db(op))?
                    .rows_affected();
                    if changed == 1 {
                        insert_attempt!(
                            &mut *tx,
                            &lease,
                            now,
                            "lease_expired",
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

    /// Sends quarantined tasks back to `available` with a fresh attempt budget.
    pub async fn requeue(&self, filter: &RequeueFilter) -> Result<u64> {
        let now = self.now_ms();
        let stage = filter.stage.map(|s| s.as_str());
        self.call("requeue", || async move {
            on_backend!(self, |pool, begin| {
                Ok(sqlx::query(
                    "UPDATE tasks SET state = 'available', attempt = 0, scheduled_at = $1,
                        finalized_at = NULL
                     WHERE state = 'quarantined'
                       AND ($2 IS NULL OR stage = $2)
                       AND ($3 IS NULL OR chunk_id = $3)",
                )
                .bind(now)
                .bind(stage)
                .bind(filter.chunk_id.as_deref())
                .execute(pool)
                .await
                .map_err(db("requeue"))?
                .rows_affected())
            })
        })
        .await
    }

    /// The state and epoch of one task.
    pub async fn task_state(&self, task_id: i64) -> Result<Option<(String, i64)>> {
        self.call("task_state", || async move {
            on_backend!(self, |pool, begin| {
                let row = sqlx::query("SELECT state, epoch FROM tasks WHERE id = $1")
                    .bind(task_id)
                    .fetch_optional(pool)
                    .await
                    .map_err(db("task_state"))?;
                row.map(|r| Ok((r.try_get("state")?, r.try_get("epoch")?)))
                    .transpose()
                    .map_err(db("task_state"))
            })
        })
        .await
    }

    async fn lease_lost(&self, lease: &Lease) -> Error {
        let (current_state, current_epoch) = match self.task_state(lease.task_id).await {
            Ok(Some(s)) => s,
            Ok(None) => ("missing".to_string(), -1),
            Err(e) => (format!("unknown ({e})"), -1),
        };
        Error::LeaseLost {
            task_id: lease.task_id,
            stage: lease.stage.to_string(),
            chunk_id: lease.chunk_id.clone(),
            held_epoch: lease.epoch,
            current_epoch,
            current_state,
        }
    }

    /// Is there anything left for `stage` to do now or later (not done, not quarantined)?
    pub async fn pending(&self, stage: Stage) -> Result<i64> {
        self.call("pending", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query(
                    "SELECT COUNT(*) AS n FROM tasks
                     WHERE stage = $1 AND state IN ('available', 'running', 'retryable')",
                )
                .bind(stage.as_str())
                .fetch_one(pool)
                .await
                .and_then(|r| r.try_get::<i64, _>("n"))
                .map_err(db("pending"))
            })
        })
        .await
    }

    /// The summary behind `ferry status`, read from the users' views.
    pub async fn status(&self) -> Result<Status> {
        self.call("status", || async move {
            on_backend!(self, |pool, begin| {
                let op = "status";
                let mut st = Status::default();
                for r in sqlx::query("SELECT state, COUNT(*) AS n FROM source_files GROUP BY state ORDER BY state")
                    .fetch_all(pool)
                    .await
                    .map_err(db(op))?
                {
                    st.files.push((r.try_get("state").map_err(db(op))?, r.try_get("n").map_err(db(op))?));
                }
                for r in sqlx::query("SELECT stage, state, tasks, bytes FROM backlog ORDER BY stage, state")
                    .fetch_all(pool)
                    .await
                    .map_err(db(op))?
                {
                    st.backlog.push(BacklogRow {
                        stage: r.try_get("stage").map_err(db(op))?,
                        state: r.try_get("state").map_err(db(op))?,
                        tasks: r.try_get("tasks").map_err(db(op))?,
                        bytes: r.try_get("bytes").map_err(db(op))?,
                    });
                }
                st.stuck_leases = sqlx::query("SELECT COUNT(*) AS n FROM stuck_leases")
                    .fetch_one(pool)
                    .await
                    .and_then(|r| r.try_get("n"))
                    .map_err(db(op))?;
                let r = sqlx::query(
                    "SELECT CAST(COALESCE(SUM(attempts), 0) AS BIGINT) AS a,
                            CAST(COALESCE(SUM(bytes), 0) AS BIGINT) AS b FROM redone_work",
                )
                .fetch_one(pool)
                .await
                .map_err(db(op))?;
                st.redone_attempts = r.try_get("a").map_err(db(op))?;
                st.redone_bytes = r.try_get("b").map_err(db(op))?;
                Ok(st)
            })
        })
        .await
    }
}

fn source_file_from_row<R: Row>(r: &R) -> Result<SourceFile>
where
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'a> i64: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> String: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> Option<String>: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    let f = || -> std::result::Result<SourceFile, sqlx::Error> {
        Ok(SourceFile {
            id: r.try_get("id")?,
            uri: r.try_get("uri")?,
            size: r.try_get("size")?,
            mtime_ms: r.try_get("mtime_ms")?,
            content_hash: r.try_get("content_hash")?,
            version: r.try_get("version")?,
            format: r.try_get("format")?,
            state: r.try_get("state")?,
            error: r.try_get("error")?,
        })
    };
    f().map_err(db("source_file"))
}

/// Wraps a sqlx error with the operation it interrupted.
fn db(op: &'static str) -> impl Fn(sqlx::Error) -> Error {
    move |source| Error::Database { op, source }
}

/// A name for this process as a lease owner: host, pid and a random suffix, so two
/// processes on one host (or a restarted one with a reused pid) never share a name.
pub fn worker_name(stage: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    format!("{stage}@{host}:{}:{:04x}", std::process::id(), rand::random::<u16>())
}

mod outputs;
pub use outputs::{Part, PartitionStats, Reject};
