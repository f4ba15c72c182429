//! Connecting to the ledger's database and migrating it. The rest of the ledger is written
//! once for both backends; only connection setup, migrations and row locking differ.

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};

use super::LedgerOptions;
use crate::error::{Error, Result};

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// Where the ledger lives, from `--ledger` / `FERRY_LEDGER`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerUrl {
    Sqlite(std::path::PathBuf),
    Postgres(String),
}

impl LedgerUrl {
    pub fn parse(url: &str) -> Result<LedgerUrl> {
        let bad = |reason: &str| Error::LedgerUrl { url: url.to_string(), reason: reason.to_string() };
        if let Some(path) = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:")) {
            let path = path.split('?').next().unwrap_or("");
            if path.is_empty() {
                return Err(bad("no database file path after sqlite://"));
            }
            Ok(LedgerUrl::Sqlite(path.into()))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            PgConnectOptions::from_str(url).map_err(|e| bad(&e.to_string()))?;
            Ok(LedgerUrl::Postgres(url.to_string()))
        } else {
            Err(bad("expected sqlite://PATH or postgres://USER@HOST/DB"))
        }
    }
}

/// The statement that opens a write transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Begin(pub &'static str);

impl Begin {
    /// Takes SQLite's write lock up front, so a transaction that reads then writes never
    /// fails half-way with SQLITE_BUSY; waiting for the lock is bounded by busy_timeout.
    pub const SQLITE: Begin = Begin("BEGIN IMMEDIATE");
    pub const POSTGRES: Begin = Begin("BEGIN");
}

#[derive(Debug, Clone)]
pub(super) enum Backend {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

impl Backend {
    pub(super) async fn connect(url: &LedgerUrl, opts: &LedgerOptions) -> Result<Backend> {
        let db = |op| move |source| Error::Database { op, source };
        match url {
            LedgerUrl::Sqlite(path) => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), e))?;
                }
                let connect = SqliteConnectOptions::new()
                    .filename(path)
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    // WAL + NORMAL: a commit survives a process crash (kill -9); only a power
                    // loss can drop the last commits, and every stage redoes work idempotently.
                    .synchronous(SqliteSynchronous::Normal)
                    .busy_timeout(opts.lock_timeout)
                    .foreign_keys(true);
                let pool = SqlitePoolOptions::new()
                    // A ping before every acquire would double the hops per statement; a dead
                    // connection shows up as an error that `Ledger::call` retries anyway.
                    .test_before_acquire(false)
                    // SQLite runs one writer at a time, and each sqlx connection is a thread
                    // that every statement hops to: a second connection lets a read overlap a
                    // write, more only add wake-ups (benchmark: 6 -> 4,600/s, 2 -> 4,850/s).
                    .max_connections(opts.max_connections.min(2))
                    .acquire_timeout(opts.call_timeout)
                    .connect_with(connect)
                    .await
                    .map_err(db("connect"))?;
                Ok(Backend::Sqlite(pool))
            }
            LedgerUrl::Postgres(url) => {
                let ms = opts.lock_timeout.as_millis().to_string();
                let connect = PgConnectOptions::from_str(url)
                    .map_err(db("connect"))?
                    .options([("statement_timeout", ms.as_str()), ("lock_timeout", ms.as_str())])
                    .application_name("ferry");
                let pool = PgPoolOptions::new()
                    .test_before_acquire(false)
                    .max_connections(opts.max_connections)
                    .acquire_timeout(opts.call_timeout)
                    .connect_with(connect);
                let pool = tokio::time::timeout(opts.call_timeout, pool)
                    .await
                    .map_err(|_| Error::LedgerTimeout { op: "connect", deadline: opts.call_timeout })?
                    .map_err(db("connect"))?;
                Ok(Backend::Postgres(pool))
            }
        }
    }

    pub(super) async fn migrate(&self) -> Result<()> {
        match self {
            // Postgres migrations hold an advisory lock while they run.
            Backend::Postgres(pool) => Ok(POSTGRES_MIGRATIONS.run(pool).await?),
            // SQLite's migrator takes no lock, so processes starting together serialize on an
            // advisory file lock beside the database (released when the file is dropped).
            Backend::Sqlite(pool) => {
                let db_path = pool.connect_options().get_filename().to_path_buf();
                let lock_path = db_path.with_extension("migrate-lock");
                let lock = tokio::task::spawn_blocking(move || -> Result<std::fs::File> {
                    let f = std::fs::OpenOptions::new()
                        .create(true)
                        .truncate(false)
                        .write(true)
                        .open(&lock_path)
                        .map_err(|e| Error::io(lock_path.display(), e))?;
                    f.lock().map_err(|e| Error::io(lock_path.display(), e))?;
                    Ok(f)
                })
                .await
                .map_err(|e| Error::Other(format!("migration lock task failed: {e}")))??;
                let res = SQLITE_MIGRATIONS.run(pool).await;
                drop(lock);
                Ok(res?)
            }
        }
    }
}
