//! Moving a ledger from SQLite to Postgres (`ferry move-ledger`): the embedded default
//! outgrown, or a second host coming.
//!
//! - **The source holds still.** The move takes SQLite's write lock (`BEGIN IMMEDIATE`) for
//!   all of it, so no writer changes a row between the copy and the mark, and it refuses while
//!   a task's lease is live (a stage at work on a chunk).
//! - **All or nothing.** The target must be a Postgres ledger migrated to this binary's schema
//!   (the source too) with no row in the ledger's tables. Every row is copied with its ids in
//!   one Postgres transaction, the identity sequences are set past them, and each table's row
//!   count is compared before it commits.
//! - **The old ledger cannot be used by mistake.** After the commit, the SQLite file is marked
//!   moved (`PRAGMA user_version`, under the same write lock) and a note beside it
//!   (`<file>.moved`) says where to; any stage or command that opens it afterwards is refused
//!   with that note, instead of working on a ledger nobody else reads any more. Nothing else
//!   in the file changes: it stays a backup of the moment of the move.
//! - **A move cut short is finished by running it again.** A target that holds exactly the
//!   source's rows (a crash after the commit, before the mark) is taken as copied and only
//!   the mark is written.

use std::path::{Path, PathBuf};

use sqlx::{Connection, Postgres, QueryBuilder, Row};

use crate::error::{Error, Result};
use crate::options::LedgerUrl;
use crate::{LedgerOptions, SCHEMA_VERSION};
use ferry_common::config::redact_url;
use ferry_common::error::ConfigError;

/// The ledger's tables, parents before the tables whose rows refer to them: what a move copies.
pub const TABLES: [&str; 15] = [
    "pipelines",
    "source_files",
    "chunks",
    "tasks",
    "attempts",
    "parts",
    "rejects",
    "published",
    "outages",
    "skips",
    "table_schemas",
    "chunk_notes",
    "switches",
    "iceberg_tables",
    "iceberg_namespace_properties",
];

/// Tables the move does not copy: each ledger's own bookkeeping, which its migrations write
/// (the migrations applied, what binaries they suit, the durability barrier's counter).
#[cfg(test)]
pub(crate) const NOT_COPIED: [&str; 3] = ["_sqlx_migrations", "ledger_compat", "syncs"];

/// `PRAGMA user_version` of a SQLite ledger that was moved ("FRMV").
const MOVED: i64 = 0x4652_4d56;

/// What a move did: rows copied per table (none listed, and `already`, when an earlier run had
/// copied them).
#[derive(Debug, Clone, Default)]
pub struct Moved {
    pub rows: Vec<(&'static str, i64)>,
    pub already: bool,
    pub note: PathBuf,
}

/// The note beside a moved SQLite ledger.
fn note_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push(".moved");
    PathBuf::from(p)
}

/// Refuses a SQLite ledger that was moved, with where it went.
pub(crate) async fn refuse_if_moved(pool: &sqlx::SqlitePool, db: &Path) -> Result<()> {
    let mark: i64 =
        sqlx::query_scalar("PRAGMA user_version").fetch_one(pool).await.map_err(|source| Error::Database { op: "connect", source })?;
    if mark != MOVED {
        return Ok(());
    }
    let note = std::fs::read_to_string(note_path(db)).unwrap_or_else(|_| "its note beside it is gone".into());
    Err(Error::Config(ConfigError::new(
        "ledger",
        format!(
            "the SQLite ledger {} was moved ({}); point [ledger] url, FERRY_LEDGER or --ledger at the ledger it went to",
            db.display(),
            note.trim()
        ),
    )))
}

/// Moves the SQLite ledger at `from` into the empty Postgres ledger at `to` (see the module's
/// notes). `now_ms` decides which leases are live.
pub async fn move_ledger(from: &str, to: &str, now_ms: i64) -> Result<Moved> {
    let bad = |key: &str, why: String| Error::Config(ConfigError::new(key, why));
    let LedgerUrl::Sqlite(db) = LedgerUrl::parse(from)? else {
        return Err(bad("--ledger", format!("{}: the ledger to move must be SQLite", redact_url(from))));
    };
    if !matches!(LedgerUrl::parse(to)?, LedgerUrl::Postgres(_)) {
        return Err(bad("--to", format!("{}: the ledger to move to must be Postgres", redact_url(to))));
    }
    if !db.exists() {
        return Err(bad("--ledger", format!("{}: no such ledger", db.display())));
    }
    // As long as a migration may take: a large ledger is copied in one transaction.
    let long = std::time::Duration::from_secs(3600);
    let opts = LedgerOptions { migrate: false, lock_timeout: long, call_timeout: long, ..LedgerOptions::default() };
    // Both at this binary's schema: opening them checks that (and refuses a moved source).
    let source = crate::Ledger::connect(from, opts.clone()).await?;
    let target = crate::Ledger::connect(to, opts).await?;
    for (key, backend, url) in [("--ledger", &source.backend, from), ("--to", &target.backend, to)] {
        let v = backend.applied_version().await?;
        if v != Some(SCHEMA_VERSION) {
            return Err(bad(
                key,
                format!("{} is at schema {v:?}, this binary's is {SCHEMA_VERSION}: run `ferry migrate` on it first", redact_url(url)),
            ));
        }
    }
    let (crate::backend::Backend::Sqlite(sqlite), crate::backend::Backend::Postgres(pg, _)) = (&source.backend, &target.backend) else {
        unreachable!("checked above");
    };
    let db_err = |op: &'static str| move |source| Error::Database { op, source };

    // The write lock, held to the end: nothing changes the source from here on. Dropped on any
    // early return, the transaction rolls back and lets the lock go.
    let mut src = sqlite.begin_with(crate::backend::Begin::SQLITE.0).await.map_err(db_err("move: lock the source"))?;
    let live: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT chunk_id, stage, COALESCE(lease_owner, '') FROM tasks WHERE state = 'running' AND lease_expires_at > $1 LIMIT 5",
    )
    .bind(now_ms)
    .fetch_all(&mut *src)
    .await
    .map_err(db_err("move: live leases"))?;
    if let Some((chunk, stage, owner)) = live.first() {
        return Err(bad(
            "--ledger",
            format!(
                "a stage is at work on this ledger ({stage} of chunk {chunk}, lease held by {owner:?}{}): stop every stage (timers, services) first",
                if live.len() > 1 { ", and more" } else { "" }
            ),
        ));
    }

    let mut dst = pg.acquire().await.map_err(db_err("move: target"))?;
    let mut tx = dst.begin().await.map_err(db_err("move: begin"))?;
    let mut moved = Moved { note: note_path(&db), ..Moved::default() };
    let mut counts = Vec::new();
    for table in TABLES {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
            .fetch_one(&mut *src)
            .await
            .map_err(db_err("move: count"))?;
        let there: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
            .fetch_one(&mut *tx)
            .await
            .map_err(db_err("move: count"))?;
        counts.push((table, n, there));
    }
    let empty = counts.iter().all(|(_, _, there)| *there == 0);
    let same = counts.iter().all(|(_, n, there)| n == there);
    if !empty && !same {
        let (table, _, there) = counts.iter().find(|(_, _, t)| *t > 0).expect("not empty");
        return Err(bad("--to", format!("{} is not empty ({there} rows in {table}): a ledger is moved into a new one", redact_url(to))));
    }
    if empty && counts.iter().any(|(_, n, _)| *n > 0) {
        for table in TABLES {
            let n = copy_table(&mut src, &mut tx, table).await?;
            moved.rows.push((table, n));
        }
        for (table, n, _) in &counts {
            let there: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
                .fetch_one(&mut *tx)
                .await
                .map_err(db_err("move: check"))?;
            if there != *n {
                return Err(Error::Internal(format!("move: {table} has {there} rows in the target after the copy, {n} in the source")));
            }
        }
        tx.commit().await.map_err(db_err("move: commit"))?;
    } else {
        // Copied by an earlier run that ended before its mark (or nothing to copy).
        moved.already = counts.iter().any(|(_, n, _)| *n > 0);
        tx.rollback().await.map_err(db_err("move: end"))?;
    }

    let at =
        chrono::DateTime::from_timestamp_millis(now_ms).map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)).unwrap_or_default();
    let note = format!("moved to {} at {at} by ferry move-ledger\n", redact_url(to));
    std::fs::write(&moved.note, &note).map_err(|e| Error::Io { path: moved.note.display().to_string(), source: e })?;
    sqlx::query(sqlx::AssertSqlSafe(format!("PRAGMA user_version = {MOVED}")))
        .execute(&mut *src)
        .await
        .map_err(db_err("move: mark the source"))?;
    src.commit().await.map_err(db_err("move: mark the source"))?;
    Ok(moved)
}

/// Copies one table's rows, ids included, in statements of up to 500 rows; then sets the
/// table's identity sequence past the largest id. The columns are the target's; the source
/// must have the same ones (both are at one schema, checked before).
async fn copy_table(src: &mut sqlx::SqliteConnection, tx: &mut sqlx::PgConnection, table: &'static str) -> Result<i64> {
    let db_err = |op: &'static str| move |source| Error::Database { op, source };
    let columns: Vec<(String, String)> = sqlx::query_as(
        "SELECT column_name::text, data_type::text FROM information_schema.columns \
         WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position",
    )
    .bind(table)
    .fetch_all(&mut *tx)
    .await
    .map_err(db_err("move: columns"))?;
    let theirs: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT name FROM pragma_table_info('{table}')")))
        .fetch_all(&mut *src)
        .await
        .map_err(db_err("move: columns"))?;
    let mut a: Vec<&str> = columns.iter().map(|(c, _)| c.as_str()).collect();
    let mut b: Vec<&str> = theirs.iter().map(String::as_str).collect();
    a.sort_unstable();
    b.sort_unstable();
    if a != b {
        return Err(Error::Internal(format!("move: {table} has columns {b:?} in SQLite and {a:?} in Postgres")));
    }
    if let Some((name, ty)) = columns.iter().find(|(_, ty)| !matches!(ty.as_str(), "text" | "character varying" | "integer" | "bigint")) {
        return Err(Error::Internal(format!("move: {table}.{name} is of type {ty}, which the move does not know")));
    }
    let list = columns.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>().join(", ");
    // Pages in rowid order: each a read, then one INSERT of its rows.
    let select = format!("SELECT rowid, {list} FROM {table} WHERE rowid > $1 ORDER BY rowid LIMIT {}", (60_000 / columns.len()).min(500));
    let (mut after, mut n) = (i64::MIN, 0i64);
    loop {
        let page = sqlx::query(sqlx::AssertSqlSafe(select.clone())).bind(after).fetch_all(&mut *src).await.map_err(db_err("move: read"))?;
        let Some(last) = page.last() else { break };
        after = last.try_get(0).map_err(db_err("move: read"))?;
        let mut q: QueryBuilder<Postgres> = QueryBuilder::new(format!("INSERT INTO {table} ({list}) "));
        let mut bad = None;
        q.push_values(&page, |mut b, r| {
            for (i, (name, ty)) in columns.iter().enumerate() {
                let v = match ty.as_str() {
                    // The Iceberg catalog's columns are VARCHAR(n), as its readers create them.
                    "text" | "character varying" => r.try_get::<Option<String>, _>(i + 1).map(Value::Text),
                    "integer" => r
                        .try_get::<Option<i64>, _>(i + 1)
                        .and_then(|v| v.map(i32::try_from).transpose().map_err(|e| sqlx::Error::Decode(e.into())))
                        .map(Value::Int),
                    _ => r.try_get::<Option<i64>, _>(i + 1).map(Value::Big),
                };
                match v {
                    Ok(Value::Text(t)) => b.push_bind(t),
                    Ok(Value::Int(v)) => b.push_bind(v),
                    Ok(Value::Big(v)) => b.push_bind(v),
                    Err(e) => {
                        bad.get_or_insert_with(|| format!("move: {table}.{name}: {e}"));
                        b.push_bind(None::<i64>)
                    }
                };
            }
        });
        if let Some(why) = bad {
            return Err(Error::Internal(why));
        }
        let done = q.build().execute(&mut *tx).await.map_err(db_err("move: write"))?;
        n += done.rows_affected() as i64;
    }
    if columns.iter().any(|(c, ty)| c == "id" && ty != "text") {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT setval(s, COALESCE((SELECT MAX(id) FROM {table}), 0) + 1, false) \
             FROM pg_get_serial_sequence('{table}', 'id') AS s WHERE s IS NOT NULL"
        )))
        .execute(&mut *tx)
        .await
        .map_err(db_err("move: sequence"))?;
    }
    Ok(n)
}

enum Value {
    Text(Option<String>),
    Int(Option<i32>),
    Big(Option<i64>),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every table a migrated ledger has is copied or named as not copied: a migration that
    /// adds a table must say what a move does with it. (On Postgres the move compares each
    /// table's columns with SQLite's before it copies a row.)
    #[tokio::test]
    async fn the_move_knows_every_table_of_the_schema() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/ledger.db", dir.path().display());
        let ledger = crate::Ledger::connect(&url, LedgerOptions::default()).await.unwrap();
        let crate::backend::Backend::Sqlite(pool) = &ledger.backend else { unreachable!() };
        let mut tables: Vec<String> =
            sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")
                .fetch_all(pool)
                .await
                .unwrap();
        let mut known: Vec<String> = TABLES.iter().chain(NOT_COPIED.iter()).map(|t| t.to_string()).collect();
        tables.sort();
        known.sort();
        assert_eq!(tables, known);
    }
}
