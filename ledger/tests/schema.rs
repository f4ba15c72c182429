//! The migrations and the code agree: every CHECK list of states equals its enum in both
//! migration sets, both triggers hand chunks on in `Stage::next` order, and the claim
//! statement is planned on the partial index it was written for, on both backends.

mod support;

use std::collections::BTreeSet;

use ferry_common::error::ErrorClass;
use ferry_ledger::state::sql_list;
use ferry_ledger::{AttemptOutcome, CLAIM_POSTGRES, CLAIM_SQLITE, DUE, FileState, RangeKind, Stage, TaskState};
use sqlx::Connection;
use support::{Db, TestDb};

/// All migrations of one backend, in order, as one text.
fn migrations(backend: &str) -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations").join(backend);
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files.iter().map(|f| std::fs::read_to_string(f).unwrap()).collect::<Vec<_>>().join("\n")
}

/// The values of every `CHECK (<column> IN (...))` of `table`, by column.
fn checks(sql: &str, table: &str) -> Vec<(String, BTreeSet<String>)> {
    let start = sql.find(&format!("CREATE TABLE IF NOT EXISTS {table} (")).unwrap_or_else(|| panic!("no table {table}"));
    let body = &sql[start..];
    let body = &body[..body.find("\n);").unwrap()];
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(i) = rest.find("CHECK (") {
        rest = &rest[i + "CHECK (".len()..];
        let Some((column, list)) = rest.split_once(" IN (") else { continue };
        if column.contains(' ') || column.contains('(') {
            continue; // a CHECK of another shape, e.g. `(state = 'running') = (...)`
        }
        let values = list[..list.find(')').unwrap()].split(',').map(|v| v.trim().trim_matches('\'').to_string()).collect();
        out.push((column.to_string(), values));
    }
    out
}

fn set<T: Copy>(all: &[T], f: impl Fn(T) -> &'static str) -> BTreeSet<String> {
    all.iter().map(|v| f(*v).to_string()).collect()
}

#[test]
fn check_lists_equal_the_enums_in_both_migration_sets() {
    for backend in ["sqlite", "postgres"] {
        let sql = migrations(backend);
        let expect = |table: &str, column: &str, values: BTreeSet<String>| {
            let found = checks(&sql, table);
            let got = found.iter().filter(|(c, _)| c == column).map(|(_, v)| v.clone()).collect::<Vec<_>>();
            assert_eq!(got, vec![values], "{backend}: CHECK ({column} IN ...) of {table}");
        };
        expect("source_files", "state", set(FileState::ALL, FileState::as_str));
        expect("chunks", "range_kind", set(RangeKind::ALL, RangeKind::as_str));
        expect("tasks", "stage", set(Stage::ALL, Stage::as_str));
        expect("tasks", "state", set(TaskState::ALL, TaskState::as_str));
        expect("tasks", "last_error_class", set(&ErrorClass::ALL, ErrorClass::as_str));
        expect("attempts", "outcome", set(AttemptOutcome::ALL, AttemptOutcome::as_str));
        expect("attempts", "error_class", set(&ErrorClass::ALL, ErrorClass::as_str));
        expect("outages", "stage", set(Stage::ALL, Stage::as_str));
        let finals: Vec<TaskState> = TaskState::ALL.iter().copied().filter(|s| s.is_final()).collect();
        assert!(sql.contains(&format!("CHECK ((state IN {}) = (finalized_at IS NOT NULL))", sql_list(&finals))), "{backend}");
        // The claim's state list is the partial index's predicate, word for word.
        let due = format!("WHERE state IN {}", sql_list(&TaskState::DUE));
        let index = &sql[sql.find("CREATE INDEX IF NOT EXISTS tasks_due").unwrap()..];
        assert!(index[..index.find(';').unwrap()].contains(&due), "{backend}: tasks_due predicate");
        for claim in [CLAIM_SQLITE, CLAIM_POSTGRES, DUE] {
            assert!(claim.contains(&format!("AND state IN {}", sql_list(&TaskState::DUE))), "{claim}");
        }
    }
}

#[test]
fn both_triggers_hand_chunks_on_in_stage_order() {
    // The next-stage CASE of each trigger, rebuilt from `Stage::next`.
    let with_next: Vec<Stage> = Stage::ALL.iter().copied().filter(|s| s.next().is_some()).collect();
    let (last_from, last_to) = {
        let s = *with_next.last().unwrap();
        (s, s.next().unwrap())
    };
    let mut case = String::from("CASE NEW.stage");
    for s in &with_next {
        if *s != last_from {
            case.push_str(&format!(" WHEN '{}' THEN '{}'", s, s.next().unwrap()));
        }
    }
    case.push_str(&format!(" ELSE '{last_to}' END"));
    let names: Vec<String> = with_next.iter().map(|s| format!("'{s}'")).collect();
    let guard = format!("NEW.stage IN ({})", names.join(", "));
    for backend in ["sqlite", "postgres"] {
        let sql = migrations(backend);
        assert!(sql.contains(&case), "{backend}: {case}");
        assert!(sql.contains(&guard), "{backend}: {guard}");
        let done = format!("OLD.state = '{}' AND NEW.state = '{}'", TaskState::Running, TaskState::Done);
        assert!(sql.contains(&done), "{backend}: {done}");
    }
}

#[tokio::test]
async fn sqlite_claim_uses_the_partial_index() {
    let t = TestDb::new(Db::Sqlite).await;
    t.ledger(Default::default(), None).await;
    let mut c = sqlx::SqliteConnection::connect(&t.url).await.unwrap();
    // The claim, and the read that asks whether it would find anything.
    for sql in [CLAIM_SQLITE, DUE] {
        let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
            .bind("transform")
            .bind(0i64)
            .bind(16i64)
            .bind("w")
            .bind(0i64)
            .bind("running")
            .bind("default")
            .bind("node-a")
            .fetch_all(&mut c)
            .await
            .unwrap();
        let details: Vec<&str> = plan.iter().map(|r| r.3.as_str()).collect();
        assert!(details.iter().any(|d| d.contains("tasks_due")), "{details:?}");
        assert!(!details.iter().any(|d| d.contains("TEMP B-TREE")), "the index gives the order, no sort: {details:?}");
    }
}

#[tokio::test]
async fn postgres_claim_uses_the_partial_index() {
    let t = TestDb::new(Db::Postgres).await;
    t.ledger(Default::default(), None).await;
    let mut c = sqlx::PgConnection::connect(&t.url).await.unwrap();
    // An empty table is cheapest to scan whole; with scans priced out, the planner still has
    // to find an index whose predicate the claim implies.
    sqlx::query("SET enable_seqscan = off").execute(&mut c).await.unwrap();
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {CLAIM_POSTGRES}")))
        .bind("transform")
        .bind(0i64)
        .bind(16i64)
        .bind("w")
        .bind(0i64)
        .bind("running")
        .bind("default")
        .bind("node-a")
        .fetch_all(&mut c)
        .await
        .unwrap();
    assert!(plan.iter().any(|l| l.contains("tasks_due")), "{}", plan.join("\n"));
}

#[test]
fn the_schema_version_is_the_number_of_migrations() {
    for backend in ["sqlite", "postgres"] {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations").join(backend);
        assert_eq!(std::fs::read_dir(dir).unwrap().count() as i64, ferry_ledger::SCHEMA_VERSION, "{backend}");
    }
    assert!(ferry_ledger::version().ends_with(&format!(", ledger schema {})", ferry_ledger::SCHEMA_VERSION)));
}

/// `ferry migrate --check` reads pending migrations' compatibility from `ferry_ledger::COMPAT`;
/// a migrated ledger records the same rows in `ledger_compat`, on both backends.
#[tokio::test]
async fn the_compat_table_matches_the_binary() {
    let want: Vec<(i64, i64, String)> = ferry_ledger::COMPAT.iter().map(|(v, o, n)| (*v, *o, n.to_string())).collect();
    for db in [Db::Sqlite, Db::Postgres] {
        let t = TestDb::new(db).await;
        t.ledger(Default::default(), None).await;
        let q = "SELECT version, oldest_binary, note FROM ledger_compat ORDER BY version";
        let got: Vec<(i64, i64, String)> = match db {
            Db::Sqlite => sqlx::query_as(q).fetch_all(&mut sqlx::SqliteConnection::connect(&t.url).await.unwrap()).await.unwrap(),
            Db::Postgres => sqlx::query_as(q).fetch_all(&mut sqlx::PgConnection::connect(&t.url).await.unwrap()).await.unwrap(),
        };
        assert_eq!(got, want, "{db:?}");
        assert_eq!(want.last().map(|c| c.0), Some(ferry_ledger::SCHEMA_VERSION), "every migration from 6 on has its row");
    }
}

/// SQLite's migration 7 commits by itself and sqlx records it afterwards: a crash in between
/// leaves it applied but unrecorded. The next migrating open records it and goes on, instead
/// of running it again and failing forever.
#[tokio::test]
async fn sqlite_rebuild_applied_but_unrecorded_is_recorded() {
    let t = TestDb::new(Db::Sqlite).await;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations/sqlite");
    let mut upto7 = sqlx::migrate::Migrator::new(dir).await.unwrap();
    upto7.migrations = std::borrow::Cow::Owned(upto7.migrations.iter().filter(|m| m.version <= 7).cloned().collect());
    let opts: sqlx::sqlite::SqliteConnectOptions = t.url.parse::<sqlx::sqlite::SqliteConnectOptions>().unwrap().create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(opts).await.unwrap();
    upto7.run(&pool).await.unwrap();
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = 7").execute(&pool).await.unwrap();
    pool.close().await;
    let ledger = ferry_ledger::Ledger::connect(&t.url, ferry_ledger::LedgerOptions { migrate: true, ..Default::default() }).await.unwrap();
    drop(ledger);
    let mut c = sqlx::SqliteConnection::connect(&t.url).await.unwrap();
    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version").fetch_all(&mut c).await.unwrap();
    assert_eq!(versions, (1..=ferry_ledger::SCHEMA_VERSION).collect::<Vec<_>>());
}
