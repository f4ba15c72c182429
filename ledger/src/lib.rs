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
//! Operators move tasks too: `requeue` (quarantined -> available, fresh budget), `rerun`
//! (any state but running -> available; when that stage completes, the trigger resets the next
//! stage's existing task instead of keeping it, so the chunk runs on to load again) and `skip`
//! (waiting or quarantined -> done without output, the reason in `skips`). `rerun` and `skip`
//! first lock the chunk's task rows (a no-op update), then change only tasks still in the
//! state they read: a task a worker claims meanwhile stays the worker's, and the command says
//! it could not.
//!
//! A task that waits for others (load of a corrected file's version, until all its chunks are
//! copied) goes running -> retryable without counting its attempt ([`Ledger::wait`]).
//!
//! ## Durable before destructive
//! Commits do not wait for the disk (SQLite: WAL, `synchronous = NORMAL`; Postgres: whatever
//! `synchronous_commit` says). Anything destroyed on the strength of a commit waits for
//! [`Ledger::make_durable`] first: extract deleting or archiving a source file, copy removing
//! a chunk's spool files (the runner syncs before a stage's after-commit hook), load removing
//! an older version's table files or a rerun chunk's earlier output, and the sweeps of spent
//! spool, stray landed copies and old staged chunks. The commit may be another process's, so
//! the sync is of everything committed so far, not of one transaction.
//!
//! `attempts` is append-only: one row per lease that ended (done, retryable, quarantined,
//! lease_expired, released), with the worker, the times, the error class and the bytes moved.
//!
//! A failure while the chunk's store is down (see the runtime's breaker) also goes running -> retryable,
//! but gives its attempt back (`fail_uncounted`), as do the failures that found the store down
//! (`refund_attempts`); the outage itself is one row of `outages` ([`Ledger::outage_open`]).
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
//! ## Where things are
//! - [`state`]: stages and the states above as types, and their text in SQL.
//! - [`files`]: source files and chunks (extract); [`tasks`]: claim, heartbeat, complete,
//!   fail, release, reclaim; [`batch`]: SQLite's batched completions; [`outputs`]: parts,
//!   rejects and published files; [`admin`]: status, requeue and the views behind them.
//! - [`backend`]: connecting and migrating (`migrations/sqlite`, `migrations/postgres`).
//! - The loop every chunk stage runs on top of all this, the outage breaker and what a running
//!   stage shows are the `ferry-runtime` crate's.
//!
//! ## Bounded calls
//! Every call runs under `call_timeout` (client side) and, on Postgres, `statement_timeout`;
//! SQLite waits at most `busy_timeout` for the write lock. A failed call whose error is
//! transient (lost connection, busy database, timeout) is retried with capped, jittered
//! backoff; anything else is returned at once.

use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use crate::options::LedgerSection;

pub use admin::{BacklogRow, Count, Overview, Pruned, Quarantined, RecentFailure, RequeueFilter, StageOverview, Status, StuckLease};
use backend::{Backend, Begin};
pub use catalog::{CatalogSwap, Record, Swapped};
use clock::{Clock, SystemClock};
pub use error::{Error, Result};
pub use files::{
    Chunk, NewChunk, NewSourceFile, Recorded, Revived, SourceFile, Undone, UndoneChunk, chunk_id, duplicate_reason, staged_name,
};
pub use outages::Outage;
pub use outputs::{Part, PartitionStats, Reject, VersionChunk, VersionState};
pub use relocate::{Moved, TABLES, move_ledger};
pub use schemas::{SchemaColumn, TableSchema};
pub use state::{AttemptOutcome, FileState, RangeKind, Stage, TaskState};
/// The ledger schema this binary needs: the number of migrations in each of
/// `migrations/sqlite` and `migrations/postgres` (a test keeps them equal).
pub const SCHEMA_VERSION: i64 = 16;
/// What `--version` prints: the release, the commit it was built from (`FERRY_COMMIT` at
/// build time, as deploy/install.sh, the Dockerfile and scripts/deb.sh set it; "unknown" for a
/// plain `cargo build`, whose every commit would otherwise rebuild the workspace) and the
/// ledger schema it needs.
pub fn version() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| {
        let commit = option_env!("FERRY_COMMIT").filter(|c| !c.is_empty()).unwrap_or("unknown");
        format!("{} (commit {commit}, ledger schema {SCHEMA_VERSION})", env!("CARGO_PKG_VERSION"))
    })
}

/// The claim statement of each backend (its query plan is part of the tests).
pub use tasks::{CLAIM_POSTGRES, CLAIM_SQLITE, DUE};

/// Exponential backoff with jitter, applied by writing `scheduled_at`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub min: Duration,
    pub max: Duration,
    pub factor: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        LedgerOptions::default().backoff
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
    /// The longest wait between probes of a store that is down (see the runtime's breaker).
    pub outage_probe_max: Duration,
    /// Apply pending migrations on connect (else a ledger behind this binary is refused).
    pub migrate: bool,
}

impl Default for LedgerOptions {
    fn default() -> Self {
        LedgerOptions::from_config(&LedgerSection::default())
    }
}

impl LedgerOptions {
    /// The options of the `[ledger]` section; the rest keep their defaults.
    pub fn from_config(s: &LedgerSection) -> LedgerOptions {
        LedgerOptions {
            lease: s.lease.0,
            // A deadline per call attempt; transient failures get a few retries inside it.
            call_timeout: s.call_timeout.0,
            call_retries: 5,
            lock_timeout: Duration::from_secs(10),
            max_attempts: s.max_attempts,
            backoff: Backoff { min: s.backoff_min.0, max: s.backoff_max.0, factor: 2.0 },
            // Often enough that an expired lease waits little past its expiry; at least
            // 100 ms so that a short test lease does not turn every claim into two statements.
            reclaim_interval: (s.lease.0 / 4).max(Duration::from_millis(100)),
            max_connections: 8,
            outage_probe_max: s.outage_probe_max.0,
            // The embedded single-host ledger migrates itself; a shared one only by `ferry
            // migrate`, so that one host's upgrade never changes the ledger under the others.
            migrate: s.auto_migrate.unwrap_or_else(|| s.url.starts_with("sqlite:")),
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
    /// What the holder has sent so far (the runner records it however the attempt ends).
    pub tally: Tally,
}

/// What a finished attempt did, for the history and the throughput view.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Work {
    pub bytes: i64,
    pub records: i64,
    /// Bytes the attempt sent that did not end in place (see [`Tally`]).
    pub redone_bytes: i64,
}

impl Work {
    pub fn new(bytes: i64, records: i64) -> Work {
        Work { bytes, records, redone_bytes: 0 }
    }
}

/// What an attempt has moved so far, kept by the stage as it goes, so that an attempt that
/// fails (or succeeds after retrying a request) still records what it sent: `moved` is every
/// byte sent, `kept` the bytes that ended in place (a landed part). The rest was redone work.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    own: Arc<(AtomicI64, AtomicI64)>,
    /// The attempt's tally, when this one counts a part of it ([`Tally::part`]).
    whole: Option<Arc<(AtomicI64, AtomicI64)>>,
}

impl Tally {
    /// A tally of one part of the work (a part shipped beside others), whose bytes also count
    /// in this one: the part's own figures tell what its tries sent.
    pub fn part(&self) -> Tally {
        Tally { own: Default::default(), whole: Some(self.own.clone()) }
    }
    fn counters(&self) -> impl Iterator<Item = &Arc<(AtomicI64, AtomicI64)>> {
        std::iter::once(&self.own).chain(self.whole.as_ref())
    }
    pub fn moved(&self, n: u64) {
        self.counters().for_each(|c| _ = c.0.fetch_add(n as i64, std::sync::atomic::Ordering::Relaxed));
    }
    pub fn kept(&self, n: u64) {
        self.counters().for_each(|c| _ = c.1.fetch_add(n as i64, std::sync::atomic::Ordering::Relaxed));
    }
    /// Bytes sent so far.
    pub fn moved_bytes(&self) -> i64 {
        self.own.0.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// Bytes sent that did not end in place.
    pub fn redone_bytes(&self) -> i64 {
        (self.moved_bytes() - self.own.1.load(std::sync::atomic::Ordering::Relaxed)).max(0)
    }
}

/// Two leases are equal when they are the same claim: the tally is what the holder did with it.
impl PartialEq for Tally {
    fn eq(&self, _: &Tally) -> bool {
        true
    }
}
impl Eq for Tally {}

/// Where a failed task went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOutcome {
    Retry { at_ms: i64 },
    Quarantined,
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
    completions: Arc<std::sync::Mutex<Vec<batch::Completion>>>,
    /// Whether the ledger's server answers, as this process's calls found it.
    link: Arc<std::sync::Mutex<Link>>,
    /// The pipeline whose work this handle registers, claims and reports.
    pipeline: Arc<str>,
    /// The spool node this handle's claims are bound to (see `with_node`).
    node: Arc<str>,
}

/// Which binaries still work on a ledger with each migration: (version, oldest binary schema,
/// note), as the migrations themselves record them in `ledger_compat` (a test keeps the two
/// equal). `ferry migrate --check` reads pending ones from here.
pub const COMPAT: &[(i64, i64, &str)] = &[
    (6, 5, "additive: table_schemas, chunk_notes"),
    (7, 7, "pipelines: an older binary would claim every pipeline's tasks"),
    (8, 8, "spool nodes: an older copy would claim chunks spooled on another host"),
    (9, 8, "additive: redone bytes per attempt"),
    (10, 10, "pipeline scope: schema versions and outages are keyed by pipeline (an older binary's upserts no longer match)"),
    (11, 10, "additive: an index on published.chunk_id"),
    (12, 10, "additive: source_files.arrived_again, switches, syncs"),
    (13, 13, "a version with no rows is in the table once recorded (source_files.switched_at), which older binaries do not write"),
    (14, 13, "additive: parts.stats, published.table_version, table_partitions.table_version"),
    (15, 14, "additive: iceberg_tables, iceberg_namespace_properties (the Iceberg JDBC catalog)"),
    (16, 15, "additive: table_partitions.table_version is the newest published file's (an Iceberg snapshot id)"),
];

/// The pipeline of a config without `pipeline`, and of every row from before pipelines.
pub const DEFAULT_PIPELINE: &str = "default";

/// The ledger's own outages as one process saw them: from the first call that could not reach
/// the server to the next one that did.
#[derive(Debug, Default)]
struct Link {
    down: Option<LedgerOutage>,
    over: Vec<LedgerOutage>,
}

/// One outage of the ledger's server, for the `outages` table once it can be written again.
#[derive(Debug, Clone)]
pub struct LedgerOutage {
    pub since_ms: i64,
    pub since: std::time::Instant,
    /// When a call next answered (epoch ms); the row is written later, when the runner can.
    pub until_ms: Option<i64>,
    pub failures: i64,
    pub last_error: String,
}

/// Calls already in flight can still answer while the server goes down: a failure this soon
/// after the last answer continues the outage that answer ended instead of opening another.
const OUTAGE_REOPEN_WITHIN_MS: i64 = 1_000;

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
            Backend::Postgres($pool, _) => {
                #[allow(unused_variables)]
                let $begin = Begin::POSTGRES;
                $body
            }
        }
    };
}

/// SQL: the version `source_files` row `$n` (an alias in the query) is in the table. One with
/// rows in `published` is; so is a version that will never have any (none of its chunks has a
/// part: an empty file, or records all rejected) once a load recorded one of its chunks
/// (`switched_at`: that load then removes the versions before it). Without the second half an
/// older version's chunk (a `ferry rerun` of it) would find no newer version in the table and
/// publish again after the empty one had replaced it. It never flips back: a load of the
/// version quarantined later leaves it in the table.
macro_rules! version_in_table {
    ($n:literal) => {
        concat!(
            "(EXISTS (SELECT 1 FROM chunks vit_c JOIN published vit_p ON vit_p.chunk_id = vit_c.id WHERE vit_c.file_id = ",
            $n,
            ".id) OR (",
            $n,
            ".switched_at IS NOT NULL AND NOT EXISTS (SELECT 1 FROM chunks vit_c JOIN parts vit_q ON vit_q.chunk_id = vit_c.id WHERE vit_c.file_id = ",
            $n,
            ".id)))"
        )
    };
}

/// `sqlx::FromRow` for a row struct on both backends, written out by hand instead of derived:
/// the derive needs sqlx's proc-macros, whose build is a second copy of sqlx and its drivers.
/// Each field is read from the column of its name, or `= "column"`; `: String` reads a String
/// and converts it with the field type's `TryFrom<String>` (the ledger's state enums).
macro_rules! from_row {
    ($ty:ident { $($field:ident $(: $via:ty)? $(= $col:literal)?),* $(,)? }) => {
        from_row!(@impl sqlx::sqlite::SqliteRow, $ty { $($field $(: $via)? $(= $col)?),* });
        from_row!(@impl sqlx::postgres::PgRow, $ty { $($field $(: $via)? $(= $col)?),* });
    };
    (@impl $row:ty, $ty:ident { $($field:ident $(: $via:ty)? $(= $col:literal)?),* }) => {
        impl<'r> sqlx::FromRow<'r, $row> for $ty {
            fn from_row(row: &'r $row) -> sqlx::Result<Self> {
                #[allow(unused_imports)]
                use sqlx::Row as _;
                Ok($ty { $($field: from_row!(@col row, $field $(: $via)? $(= $col)?)),* })
            }
        }
    };
    (@col $r:ident, $field:ident) => { $r.try_get(stringify!($field))? };
    (@col $r:ident, $field:ident = $col:literal) => { $r.try_get($col)? };
    (@col $r:ident, $field:ident : $via:ty) => {
        $crate::column_into($r.try_get::<$via, _>(stringify!($field))?, stringify!($field))?
    };
}

/// A column's value converted into its field's type, or the column's decode error.
fn column_into<V, T: TryFrom<V>>(v: V, column: &str) -> sqlx::Result<T>
where
    T::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    T::try_from(v).map_err(|e| sqlx::Error::ColumnDecode { index: column.to_string(), source: e.into() })
}

/// Opens a write transaction on `$pool`, after queueing behind this process's other SQLite
/// writers (see `Ledger::sqlite_writer`); SQLite takes its write lock up front (`$begin`).
/// Yields `(guard, tx)`: keep the guard alive until the transaction ends.
macro_rules! write_tx {
    ($self:expr, $pool:expr, $begin:expr, $op:expr) => {{
        let guard = $self.write_guard().await;
        let tx = $pool.begin_with($begin.0).await.map_err($crate::db($op))?;
        (guard, tx)
    }};
}

mod admin;
mod backend;
mod batch;
#[macro_use]
mod catalog;
pub mod clock;
mod error;
mod files;
pub mod options;
mod outages;
mod outputs;
mod relocate;
mod schemas;
pub mod state;
mod tasks;
#[doc(hidden)]
pub mod testing;

impl Ledger {
    /// Connects (creating an SQLite file on first use) and applies the migrations.
    pub async fn connect(url: &str, opts: LedgerOptions) -> Result<Ledger> {
        let parsed = crate::options::LedgerUrl::parse(url)?;
        let backend = Backend::open(&parsed, &opts).await?;
        Ok(Ledger {
            backend,
            opts,
            clock: Arc::new(SystemClock),
            last_reclaim_ms: Arc::new(AtomicI64::new(i64::MIN)),
            sqlite_writer: Arc::new(tokio::sync::Mutex::new(())),
            completions: Arc::default(),
            link: Arc::default(),
            pipeline: Arc::from(DEFAULT_PIPELINE),
            node: Arc::from(""),
        })
    }

    /// What `ferry migrate --check` says about the ledger at `url`, without changing it.
    pub async fn check_schema(url: &str) -> Result<String> {
        let parsed = crate::options::LedgerUrl::parse(url)?;
        let backend = Backend::connect_only(&parsed, &LedgerOptions { migrate: false, ..LedgerOptions::default() }).await?;
        let applied = backend.applied_version().await?;
        let known = SCHEMA_VERSION;
        let mut out =
            format!("ledger schema {}; this binary's schema {known}\n", applied.map_or("none (not created)".into(), |v| v.to_string()));
        let applied = applied.unwrap_or(0);
        if applied < known {
            out.push_str("pending migrations (`ferry migrate` applies them):\n");
            for v in (applied + 1)..=known {
                match COMPAT.iter().find(|c| c.0 == v) {
                    Some((_, oldest, note)) if *oldest <= applied => {
                        out.push_str(&format!("  {v}: {note}; binaries of schema {oldest} and newer keep running on it\n"))
                    }
                    Some((_, oldest, note)) => {
                        out.push_str(&format!("  {v}: {note}; binaries of schema below {oldest} must be stopped (and upgraded) first\n"))
                    }
                    None => out.push_str(&format!("  {v}: older binaries keep running on it\n")),
                }
            }
        } else if applied > known {
            match backend.needs_migration(false).await {
                Ok(_) => out.push_str("the ledger is newer, and its newer migrations are compatible: this binary runs on it\n"),
                Err(e) => out.push_str(&format!("this binary cannot run on it: {e}\n")),
            }
        } else {
            out.push_str("up to date\n");
        }
        Ok(out)
    }

    /// This handle, working for `pipeline` (see `migrations/*/0007_pipelines.sql`).
    pub fn with_pipeline(mut self, pipeline: &str) -> Ledger {
        self.pipeline = Arc::from(pipeline);
        self
    }

    /// The pipeline this handle works for.
    pub fn pipeline(&self) -> &str {
        &self.pipeline
    }

    /// This handle, on spool node `node` (config `spool.node`): the transform tasks it claims
    /// are stamped with it, and it claims only copy tasks of that node (or of none), whose
    /// Parquet is on this host's spool (see `migrations/*/0008_spool_nodes.sql`).
    pub fn with_node(mut self, node: &str) -> Ledger {
        self.node = Arc::from(node);
        self
    }

    /// The spool node of this handle ("" until `with_node`: then it claims only copy tasks
    /// bound to no node).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Records that this handle's pipeline feeds `table`, or checks that it already does: two
    /// configs that share a pipeline name must share its table.
    pub async fn register_pipeline(&self, table: &str) -> Result<()> {
        let now = self.now_ms();
        let recorded: String = self
            .call("register_pipeline", || async move {
                on_backend!(self, |pool, begin| {
                    sqlx::query("INSERT INTO pipelines (name, table_name, created_at) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING")
                        .bind(self.pipeline())
                        .bind(table)
                        .bind(now)
                        .execute(pool)
                        .await
                        .map_err(db("register_pipeline"))?;
                    sqlx::query_scalar("SELECT table_name FROM pipelines WHERE name = $1")
                        .bind(self.pipeline())
                        .fetch_one(pool)
                        .await
                        .map_err(db("register_pipeline"))
                })
            })
            .await?;
        if recorded != table {
            return Err(Error::Config(ferry_common::error::ConfigError::new(
                "pipeline",
                format!(
                    "pipeline {:?} feeds table {recorded:?} in this ledger, but this config says table.name = {table:?}; \
                     give this config its own `pipeline` name",
                    self.pipeline()
                ),
            )));
        }
        Ok(())
    }

    /// Whether the ledger's server is unreachable now (as the last call found it).
    pub fn unreachable(&self) -> bool {
        self.link.lock().unwrap_or_else(|e| e.into_inner()).down.is_some()
    }

    /// Outages of the ledger that are over and not yet recorded (the runner records them).
    pub fn take_ledger_outages(&self) -> Vec<LedgerOutage> {
        std::mem::take(&mut self.link.lock().unwrap_or_else(|e| e.into_inner()).over)
    }

    fn link_failed(&self, op: &str, e: &Error) {
        let mut link = self.link.lock().unwrap_or_else(|e| e.into_inner());
        match &mut link.down {
            Some(d) => {
                d.failures += 1;
                d.last_error = e.to_string();
            }
            None => {
                let now = self.now_ms();
                let reopened = match link.over.last() {
                    Some(o) if o.until_ms.is_some_and(|t| now - t < OUTAGE_REOPEN_WITHIN_MS) => link.over.pop(),
                    _ => None,
                };
                match reopened {
                    Some(mut o) => {
                        tracing::warn!(op, error = %e, "ledger unreachable again: the same outage goes on");
                        o.until_ms = None;
                        o.failures += 1;
                        o.last_error = e.to_string();
                        link.down = Some(o);
                    }
                    None => {
                        tracing::error!(op, error = %e, "ledger unreachable: its calls are retried until it answers");
                        link.down = Some(LedgerOutage {
                            since_ms: now,
                            since: std::time::Instant::now(),
                            until_ms: None,
                            failures: 1,
                            last_error: e.to_string(),
                        });
                    }
                }
            }
        }
    }

    fn link_answered(&self) {
        let mut link = self.link.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mut d) = link.down.take() {
            tracing::info!(down_for = ?d.since.elapsed(), failures = d.failures, "ledger is back");
            d.until_ms = Some(self.now_ms());
            link.over.push(d);
        }
    }

    /// Replaces the clock (tests drive a [`crate::clock::ManualClock`]).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Ledger {
        self.clock = clock;
        self
    }

    pub fn options(&self) -> &LedgerOptions {
        &self.opts
    }

    /// Makes every transaction this process has committed durable: on stable storage, not
    /// only acknowledged. Called before anything is destroyed on the strength of a commit
    /// (extract deleting or archiving a source file), since the ledger commits without
    /// waiting for the disk: SQLite in WAL mode with `synchronous = NORMAL` syncs the WAL only
    /// at checkpoints, and a Postgres run with `synchronous_commit = off` acknowledges before
    /// its WAL is flushed; after a power loss either can have lost the commit while the
    /// unlink survived.
    ///
    /// SQLite: one commit with `synchronous = FULL`, which fsyncs the WAL (a checkpoint since
    /// an earlier commit has synced the database file itself). Postgres: a transaction that
    /// writes (the same counter) and commits with `synchronous_commit = on` returns only once
    /// the WAL is flushed up to its own commit record, so up to every earlier commit too.
    pub async fn make_durable(&self) -> Result<()> {
        self.call("make_durable", || async move {
            let _write = self.write_guard().await;
            self.backend.make_durable().await
        })
        .await
    }

    pub fn backend_name(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(..) => "postgres",
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
    /// an advisory lock, SQLite a file lock next to the database. Durable when it returns: a
    /// server that acknowledges commits before they are on disk (`synchronous_commit = off`)
    /// and then crashed could otherwise go back to an older schema after `ferry migrate` said
    /// it was done (the model test's lost-commit restarts found a ledger back at schema 11).
    pub async fn migrate(&self) -> Result<()> {
        self.backend.migrate().await
    }

    async fn write_guard(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match self.backend {
            Backend::Sqlite(_) => Some(self.sqlite_writer.lock().await),
            Backend::Postgres(..) => None,
        }
    }

    /// Runs one ledger call under the client-side deadline, retrying transient failures with
    /// capped, jittered backoff (`backon`). The only retry loop around ledger calls; a caller
    /// that must outlive a longer ledger outage (the stage runner) waits it out above this.
    async fn call<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        use backon::BackoffBuilder;
        let mut delays = backon::ExponentialBuilder::new()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_secs(5))
            .with_factor(2.0)
            .with_jitter()
            .with_max_times(self.opts.call_retries as usize)
            .build();
        loop {
            ferry_common::crash::point(op);
            let res = match tokio::time::timeout(self.opts.call_timeout, f()).await {
                Ok(r) => r,
                Err(_) => Err(Error::Timeout { op, deadline: self.opts.call_timeout }),
            };
            ferry_common::crash::point(op);
            match &res {
                Err(e) if e.is_unreachable() => self.link_failed(op, e),
                Ok(_) => self.link_answered(),
                Err(_) => {}
            }
            match res {
                Err(e) if e.is_transient() => {
                    // Connections idle in the pool since before this error may be dead too
                    // (a server restart ends them all): test them before the next use.
                    self.backend.suspect_connections();
                    match delays.next() {
                        Some(d) => {
                            tracing::warn!(op, error = %e, retry_in = ?d, "ledger call failed, retrying");
                            tokio::time::sleep(d).await;
                        }
                        None => return Err(e),
                    }
                }
                other => return other,
            }
        }
    }
}

/// Free text (reasons, notes, errors) as the ledger can hold it: Postgres refuses a NUL in
/// `text`, which would make a reject row, and so its chunk, impossible to record for ever.
/// A NUL is written `\0`, as `{:?}` would show it.
pub(crate) fn text(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') { s.replace('\0', "\\0").into() } else { s.into() }
}

/// Wraps a sqlx error with the operation it interrupted.
fn db(op: &'static str) -> impl Fn(sqlx::Error) -> Error {
    move |source| Error::Database { op, source }
}

/// A name for this process as a lease owner: host, pid and a random suffix, so two
/// processes on one host (or a restarted one with a reused pid) never share a name.
pub fn worker_name(stage: &str) -> String {
    let host = ferry_common::config::host_name();
    format!("{stage}@{host}:{}:{:04x}", std::process::id(), rand::random::<u16>())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{Error, Ledger, LedgerOptions, Tally};
    use crate::testing::T0;

    /// Parts shipped side by side each see only their own bytes, and the attempt sees all.
    #[test]
    fn a_part_tally_counts_its_own_bytes_and_the_attempts() {
        let attempt = Tally::default();
        let (a, b) = (attempt.part(), attempt.part());
        a.moved(100);
        b.moved(40);
        a.kept(100);
        b.moved(40);
        b.kept(40);
        assert_eq!((a.moved_bytes(), a.redone_bytes()), (100, 0));
        assert_eq!((b.moved_bytes(), b.redone_bytes()), (80, 40));
        assert_eq!((attempt.moved_bytes(), attempt.redone_bytes()), (180, 40));
    }

    /// An outage spans from the first failed call to the next answer, not to when its row is
    /// written; a failure just after an answer (calls in flight as the server went down)
    /// continues it, and one well after opens the next.
    #[tokio::test]
    async fn a_ledger_outage_ends_when_a_call_answers_and_a_straggler_does_not_split_it() {
        let dir = tempfile::tempdir().unwrap();
        let clock = crate::clock::ManualClock::new(crate::testing::T0);
        let url = format!("sqlite://{}/ledger.db", dir.path().display());
        let ledger = Ledger::connect(&url, LedgerOptions::default()).await.unwrap().with_clock(Arc::new(clock.clone()));
        let e = Error::Internal("down".into());
        ledger.link_failed("a", &e);
        clock.advance(std::time::Duration::from_millis(1));
        ledger.link_answered();
        clock.advance(std::time::Duration::from_millis(10));
        ledger.link_failed("b", &e);
        clock.advance(std::time::Duration::from_secs(60));
        ledger.link_failed("c", &e);
        ledger.link_answered();
        clock.advance(std::time::Duration::from_secs(5));
        ledger.link_failed("d", &e);
        ledger.link_answered();
        clock.advance(std::time::Duration::from_secs(30));
        let spans: Vec<_> =
            ledger.take_ledger_outages().iter().map(|o| (o.since_ms - T0, o.until_ms.map(|t| t - T0), o.failures)).collect();
        assert_eq!(spans, vec![(0, Some(60_011), 3), (65_011, Some(65_011), 1)]);
        assert!(ledger.take_ledger_outages().is_empty(), "each outage is handed over once");
    }
}
