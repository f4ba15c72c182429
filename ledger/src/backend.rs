//! Connecting to the ledger's database and migrating it. The rest of the ledger is written
//! once for both backends; only connection setup, migrations and row locking differ.

use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::{Duration, Instant};

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{AssertSqlSafe, SqlSafeStr};

use crate::options::LedgerUrl;
use ferry_common::error::ConfigError;

use crate::LedgerOptions;
use crate::error::{Error, Result};

/// The ledger's migrations (`migrations/<backend>/<version>_<description>.sql`), compiled in as
/// sqlx's `migrate!` would do it, without building sqlx's proc-macros and a second copy of its
/// drivers for them. A new migration is one more name here; a test checks the list against
/// both directories.
macro_rules! embed_migrations {
    ($($file:literal),* $(,)?) => {
        (
            &[$(($file, include_str!(concat!("../../migrations/sqlite/", $file)))),*],
            &[$(($file, include_str!(concat!("../../migrations/postgres/", $file)))),*],
        )
    };
}

type Embedded = &'static [(&'static str, &'static str)];

const MIGRATION_FILES: (Embedded, Embedded) = embed_migrations!(
    "0001_ledger.sql",
    "0002_outputs.sql",
    "0003_backlog_bytes.sql",
    "0004_outages.sql",
    "0005_recovery.sql",
    "0006_schemas.sql",
    "0007_pipelines.sql",
    "0008_spool_nodes.sql",
    "0009_redone_bytes.sql",
    "0010_pipeline_scope.sql",
    "0011_published_chunk.sql",
    "0012_keep_and_switches.sql",
    "0013_withdrawn_and_switched.sql",
    "0014_part_stats_and_table_versions.sql",
    "0015_iceberg_catalog.sql",
    "0016_partition_table_version.sql",
);

static SQLITE_MIGRATIONS: LazyLock<Migrator> = LazyLock::new(|| migrator(MIGRATION_FILES.0));
static POSTGRES_MIGRATIONS: LazyLock<Migrator> = LazyLock::new(|| migrator(MIGRATION_FILES.1));

/// Each file as sqlx reads a migrations directory: version and description from the name, the
/// checksum over the text, `-- no-transaction` first to run outside a transaction. Ledgers
/// migrated by earlier builds (through `migrate!`) carry the same checksums.
fn migrator(files: Embedded) -> Migrator {
    let migrations = files
        .iter()
        .map(|(name, sql)| {
            let (version, rest) = name.split_once('_').expect("migration file names are <version>_<description>.sql");
            Migration::new(
                version.parse().expect("a migration's version is a number"),
                rest.trim_end_matches(".sql").replace('_', " ").into(),
                MigrationType::Simple,
                AssertSqlSafe(*sql).into_sql_str(),
                sql.starts_with("-- no-transaction"),
            )
        })
        .collect();
    Migrator::with_migrations(migrations)
}

/// The statement that opens a write transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Begin(pub &'static str);

impl Begin {
    /// Takes SQLite's write lock up front, so a transaction that reads then writes never
    /// fails half-way with SQLITE_BUSY; waiting for the lock is bounded by busy_timeout.
    pub const SQLITE: Begin = Begin("BEGIN IMMEDIATE");
    pub const POSTGRES: Begin = Begin("BEGIN");
}

#[derive(Debug, Clone)]
pub(crate) enum Backend {
    Sqlite(SqlitePool),
    Postgres(PgPool, Suspect),
}

/// When the last transient ledger error happened. A Postgres restart or a dropped link kills
/// every pooled connection at once, but each only shows it when used: without this, every
/// retry of a call would draw another dead connection until the retries run out. Connections
/// that went idle before the last error are pinged before use (and replaced if dead); the
/// common case, no recent error, costs no extra round trip.
#[derive(Debug, Clone, Default)]
pub(crate) struct Suspect(Arc<AtomicU64>);

impl Suspect {
    fn since_start() -> Duration {
        static START: OnceLock<Instant> = OnceLock::new();
        START.get_or_init(Instant::now).elapsed()
    }

    fn mark(&self) {
        self.0.store(Self::since_start().as_millis() as u64 + 1, Ordering::Relaxed);
    }

    /// Whether a connection idle for `idle_for` was already idle at the last error.
    fn covers(&self, idle_for: Duration) -> bool {
        let at = self.0.load(Ordering::Relaxed);
        at != 0 && Self::since_start().saturating_sub(idle_for).as_millis() as u64 <= at
    }
}

impl Backend {
    /// Called on every transient error: see [`Suspect`].
    pub(crate) fn suspect_connections(&self) {
        if let Backend::Postgres(_, suspect) = self {
            suspect.mark();
        }
    }

    /// Connects and applies pending migrations. Safe when several processes start at once on
    /// a new ledger (cron starting four stages in the same minute): Postgres migrations hold an
    /// advisory lock; SQLite's first connection (which creates the file and switches it to WAL)
    /// and its migrations run under a file lock beside the database, because SQLite's busy
    /// handler does not cover the switch to WAL on a database another process is creating.
    ///
    /// Rolling upgrades: a ledger whose schema is older than this binary's is migrated only
    /// with `opts.migrate` (else refused: `ferry migrate`); one whose schema is newer is used
    /// as it is when every newer migration says, in `ledger_compat`, that binaries of this
    /// binary's schema still work on it, and refused otherwise.
    pub(crate) async fn open(url: &LedgerUrl, opts: &LedgerOptions) -> Result<Backend> {
        match url {
            LedgerUrl::Sqlite(path) => {
                let lock = lock_beside(path).await?;
                let backend = Backend::connect_sqlite(path, opts).await?;
                if let Backend::Sqlite(pool) = &backend {
                    crate::relocate::refuse_if_moved(pool, path).await?;
                }
                if opts.migrate
                    && let Backend::Sqlite(pool) = &backend
                {
                    record_unrecorded_rebuild(pool).await?;
                }
                if backend.needs_migration(opts.migrate).await?
                    && let Backend::Sqlite(pool) = &backend
                {
                    SQLITE_MIGRATIONS.run(pool).await?;
                    backend.make_durable().await?;
                }
                drop(lock);
                Ok(backend)
            }
            LedgerUrl::Postgres(url) => {
                let backend = Backend::connect_postgres(url, opts).await?;
                if backend.needs_migration(opts.migrate).await? {
                    backend.migrate().await?;
                }
                Ok(backend)
            }
        }
    }

    /// Connects without looking at the schema (for `ferry migrate --check`).
    pub(crate) async fn connect_only(url: &LedgerUrl, opts: &LedgerOptions) -> Result<Backend> {
        match url {
            LedgerUrl::Sqlite(path) => Backend::connect_sqlite(path, opts).await,
            LedgerUrl::Postgres(url) => Backend::connect_postgres(url, opts).await,
        }
    }

    /// The newest migration applied to the ledger (`None`: not created yet).
    pub(crate) async fn applied_version(&self) -> Result<Option<i64>> {
        let op = "schema version";
        match self {
            Backend::Sqlite(pool) => {
                let exists: i64 =
                    sqlx::query_scalar("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'")
                        .fetch_one(pool)
                        .await
                        .map_err(crate::db(op))?;
                if exists == 0 {
                    return Ok(None);
                }
                sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations WHERE success").fetch_one(pool).await.map_err(crate::db(op))
            }
            Backend::Postgres(pool, _) => {
                let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
                    .fetch_one(pool)
                    .await
                    .map_err(crate::db(op))?;
                if !exists {
                    return Ok(None);
                }
                sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations WHERE success").fetch_one(pool).await.map_err(crate::db(op))
            }
        }
    }

    /// Newer migrations that binaries of schema `known` cannot run on: (version, oldest
    /// binary schema that can, note). A migration without a `ledger_compat` row counts as
    /// incompatible.
    async fn incompatible_after(&self, known: i64, applied: i64) -> Result<Vec<(i64, i64, String)>> {
        const Q: &str = "SELECT version, oldest_binary, note FROM ledger_compat WHERE version > $1 ORDER BY version";
        // A ledger without the table (none of its migrations said anything) has no rows.
        let rows: Vec<(i64, i64, String)> = match self {
            Backend::Sqlite(pool) => sqlx::query_as(Q).bind(known).fetch_all(pool).await.unwrap_or_default(),
            Backend::Postgres(pool, _) => sqlx::query_as(Q).bind(known).fetch_all(pool).await.unwrap_or_default(),
        };
        Ok(((known + 1)..=applied)
            .filter_map(|v| match rows.iter().find(|r| r.0 == v) {
                Some(r) if r.1 <= known => None,
                Some(r) => Some(r.clone()),
                None => Some((v, v, "no compatibility record".into())),
            })
            .collect())
    }

    /// Whether pending migrations must run now; an error if this binary cannot use the ledger.
    pub(crate) async fn needs_migration(&self, migrate: bool) -> Result<bool> {
        let known = crate::SCHEMA_VERSION;
        let applied = self.applied_version().await?;
        match applied {
            Some(v) if v == known => Ok(false),
            Some(v) if v > known => {
                let bad = self.incompatible_after(known, v).await?;
                if let Some((version, oldest, note)) = bad.first() {
                    return Err(Error::Config(ConfigError::new(
                        "ledger",
                        format!(
                            "the ledger's schema is {v}, newer than this binary's ({known}), and its migration {version} ({note}) \
                             needs binaries of schema {oldest} or newer: upgrade this binary (ferry --version)"
                        ),
                    )));
                }
                tracing::info!(
                    ledger_schema = v,
                    binary_schema = known,
                    "the ledger's schema is newer; its newer migrations are compatible"
                );
                Ok(false)
            }
            _ if migrate => Ok(true),
            _ => Err(Error::Config(ConfigError::new(
                "ledger",
                match applied {
                    None => format!("the ledger has no schema yet; create it with `ferry migrate` (this binary's schema is {known})"),
                    Some(v) => format!(
                        "the ledger's schema is {v}, older than this binary's ({known}); run `ferry migrate --check`, then \
                         `ferry migrate` (or set ledger.auto_migrate = true)"
                    ),
                },
            ))),
        }
    }

    async fn connect_sqlite(path: &Path, opts: &LedgerOptions) -> Result<Backend> {
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
            .map_err(|source| Error::Database { op: "connect", source })?;
        Ok(Backend::Sqlite(pool))
    }

    async fn connect_postgres(url: &str, opts: &LedgerOptions) -> Result<Backend> {
        let ms = opts.lock_timeout.as_millis().to_string();
        let connect = PgConnectOptions::from_str(url)
            .map_err(|e| ConfigError::new(format!("ledger URL {:?}", ferry_common::config::redact_url(url)), e.to_string()))?
            // A client that stops inside a transaction (a paused VM, SIGSTOP) would hold its
            // row locks until it wakes: the server ends such a session instead.
            .options([
                ("statement_timeout", ms.as_str()),
                ("lock_timeout", ms.as_str()),
                ("idle_in_transaction_session_timeout", ms.as_str()),
            ])
            .application_name("ferry");
        let suspect = Suspect::default();
        let check = suspect.clone();
        let pool = PgPoolOptions::new()
            .test_before_acquire(false)
            .before_acquire(move |conn, meta| {
                let stale = check.covers(meta.idle_for);
                Box::pin(async move {
                    if stale {
                        use sqlx::Connection;
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .max_connections(opts.max_connections)
            .acquire_timeout(opts.call_timeout)
            .connect_with(connect);
        let pool = tokio::time::timeout(opts.call_timeout, pool)
            .await
            .map_err(|_| Error::Timeout { op: "connect", deadline: opts.call_timeout })?
            .map_err(|source| Error::Database { op: "connect", source })?;
        Ok(Backend::Postgres(pool, suspect))
    }

    /// Applies pending migrations, under the same locks as [`Backend::open`], and makes them
    /// durable before it returns: a server that acknowledges commits before they are on disk
    /// (`synchronous_commit = off`) and then crashed would otherwise be back at an older
    /// schema after `ferry migrate` said it was done (the model test's lost-commit restarts
    /// found a ledger back at schema 11).
    pub(crate) async fn migrate(&self) -> Result<()> {
        match self {
            Backend::Postgres(pool, _) => POSTGRES_MIGRATIONS.run(pool).await?,
            Backend::Sqlite(pool) => {
                let _lock = lock_beside(pool.connect_options().get_filename()).await?;
                record_unrecorded_rebuild(pool).await?;
                SQLITE_MIGRATIONS.run(pool).await?
            }
        }
        self.make_durable().await
    }

    /// Makes every commit so far durable (see [`crate::Ledger::make_durable`], which also
    /// queues this process's SQLite writers around it).
    pub(crate) async fn make_durable(&self) -> Result<()> {
        let op = "make_durable";
        let db = |source| Error::Database { op, source };
        match self {
            Backend::Sqlite(pool) => {
                // One commit that SQLite itself syncs: with `synchronous = FULL` a WAL commit
                // fsyncs the WAL, which holds every earlier commit's frames too. (Not an fsync
                // of our own: opening and closing the database file in this process would
                // drop SQLite's POSIX locks on it, and with them other connections' commits.)
                // The write bumps a counter: a commit that changes no page writes no frame,
                // and syncs nothing.
                let mut conn = pool.acquire().await.map_err(db)?;
                sqlx::query("PRAGMA synchronous = FULL").execute(&mut *conn).await.map_err(db)?;
                let synced = sqlx::query("UPDATE syncs SET n = n + 1 WHERE id = 1").execute(&mut *conn).await.map_err(db);
                let back = sqlx::query("PRAGMA synchronous = NORMAL").execute(&mut *conn).await.map_err(db);
                if back.is_err() {
                    // Not back in the pool with every commit syncing.
                    conn.detach();
                }
                synced?;
                back.map(|_| ())
            }
            Backend::Postgres(pool, _) => {
                let mut tx = pool.begin().await.map_err(db)?;
                sqlx::query("SET LOCAL synchronous_commit = on").execute(&mut *tx).await.map_err(db)?;
                // A write of its own: Postgres flushes the WAL at commit only for a
                // transaction that wrote WAL before its commit record. An xid alone (as
                // `txid_current()` gives) writes none, and that commit returned without
                // flushing anything: a lost-commit model run found a source file archived
                // whose registration an immediate restart then lost.
                sqlx::query("UPDATE syncs SET n = n + 1 WHERE id = 1").execute(&mut *tx).await.map_err(db)?;
                tx.commit().await.map_err(db)
            }
        }
    }
}

/// The SQLite migration that runs outside sqlx's transaction: it rebuilds `source_files` with
/// foreign keys off, which SQLite allows only outside a transaction, so it commits its own
/// transaction and sqlx records it afterwards.
const SQLITE_REBUILD: i64 = 7;

/// A crash between that migration's COMMIT and sqlx's record of it leaves it applied but
/// unrecorded, and running it again would fail on the column it already added: the ledger
/// could never open again. Its last change (`tasks.pipeline`) tells it was applied; then the
/// record sqlx would have written is written here. Runs under the migration lock.
async fn record_unrecorded_rebuild(pool: &SqlitePool) -> Result<()> {
    let op = |e: sqlx::Error| Error::Database { op: "record_unrecorded_rebuild", source: e };
    let tracked: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'")
        .fetch_one(pool)
        .await
        .map_err(op)?;
    if tracked == 0 {
        return Ok(());
    }
    let recorded: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations WHERE version = $1")
        .bind(SQLITE_REBUILD)
        .fetch_one(pool)
        .await
        .map_err(op)?;
    let applied: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM pragma_table_info('tasks') WHERE name = 'pipeline'").fetch_one(pool).await.map_err(op)?;
    if recorded > 0 || applied == 0 {
        return Ok(());
    }
    let Some(m) = SQLITE_MIGRATIONS.iter().find(|m| m.version == SQLITE_REBUILD) else { return Ok(()) };
    tracing::warn!(version = SQLITE_REBUILD, "ledger migration applied but not recorded (a crash right after it): recording it");
    sqlx::query("INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES ($1, $2, TRUE, $3, -1)")
        .bind(m.version)
        .bind(&*m.description)
        .bind(&*m.checksum)
        .execute(pool)
        .await
        .map_err(op)?;
    Ok(())
}

/// Creates the database's directory and takes an exclusive lock on `<db>.migrate-lock`
/// beside it, released when the returned file is dropped.
async fn lock_beside(db: &Path) -> Result<std::fs::File> {
    if let Some(dir) = db.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), e))?;
    }
    let lock_path = db.with_extension("migrate-lock");
    tokio::task::spawn_blocking(move || -> Result<std::fs::File> {
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
    .map_err(|e| Error::Internal(format!("migration lock task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file of both migration directories is compiled in, in order, and the newest is
    /// the binary's schema version.
    #[test]
    fn every_migration_file_is_embedded() {
        for (dir, embedded) in [("sqlite", MIGRATION_FILES.0), ("postgres", MIGRATION_FILES.1)] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations").join(dir);
            let mut on_disk: Vec<String> =
                std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
            on_disk.sort();
            let names: Vec<&str> = embedded.iter().map(|(n, _)| *n).collect();
            assert_eq!(names, on_disk, "migrations/{dir}: add the new file to embed_migrations!");
            let m = migrator(embedded);
            assert_eq!(m.iter().last().map(|m| m.version), Some(crate::SCHEMA_VERSION));
            assert!(m.iter().zip(m.iter().skip(1)).all(|(a, b)| a.version < b.version));
        }
    }
}
