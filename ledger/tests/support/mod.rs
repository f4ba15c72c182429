//! Real databases for the ledger conformance suite: a fresh SQLite file or a fresh database on
//! the Postgres server named by `FERRY_TEST_POSTGRES` (the test command starts one). A missing
//! server is a failure, never a skip.

#![allow(dead_code)]

use std::sync::Arc;

use ferry_ledger::clock::{Clock, ManualClock};
use ferry_ledger::{Ledger, LedgerOptions};
use sqlx::Connection;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Db {
    Sqlite,
    Postgres,
}

/// One fresh, empty ledger database for one test.
pub struct TestDb {
    pub url: String,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    pub async fn new(db: Db) -> TestDb {
        match db {
            Db::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let url = format!("sqlite://{}/ledger.db", dir.path().display());
                TestDb { url, _dir: Some(dir) }
            }
            Db::Postgres => {
                let admin = std::env::var("FERRY_TEST_POSTGRES").expect(
                    "FERRY_TEST_POSTGRES is not set: run the README's test command, which starts \
                     PostgreSQL (scripts/test.sh), or point it at a server you can create databases on",
                );
                let name = format!("ferry_test_{:016x}", rand::random::<u64>());
                let mut conn =
                    sqlx::PgConnection::connect(&admin).await.unwrap_or_else(|e| panic!("cannot reach the test Postgres at {admin}: {e}"));
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut conn).await.unwrap();
                let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
                TestDb { url: format!("{base}/{name}"), _dir: None }
            }
        }
    }

    pub async fn ledger(&self, opts: LedgerOptions, clock: Option<&ManualClock>) -> Ledger {
        let l = Ledger::connect(&self.url, opts).await.unwrap();
        match clock {
            Some(c) => l.with_clock(Arc::new(c.clone()) as Arc<dyn Clock>),
            None => l,
        }
    }

    /// Runs a query returning one integer, over a connection of the test's own.
    pub async fn scalar(&self, sql: &str) -> i64 {
        use sqlx::Row;
        if self.url.starts_with("sqlite") {
            let mut c = sqlx::SqliteConnection::connect(&self.url).await.unwrap();
            let r = sqlx::query(sqlx::AssertSqlSafe(sql.to_string())).fetch_one(&mut c).await.unwrap();
            r.try_get::<i64, _>(0).unwrap()
        } else {
            let mut c = sqlx::PgConnection::connect(&self.url).await.unwrap();
            let r = sqlx::query(sqlx::AssertSqlSafe(sql.to_string())).fetch_one(&mut c).await.unwrap();
            r.try_get::<i64, _>(0).unwrap()
        }
    }

    /// Runs a statement and returns whether the database accepted it.
    pub async fn try_execute(&self, sql: &str) -> Result<u64, String> {
        if self.url.starts_with("sqlite") {
            let mut c = sqlx::SqliteConnection::connect(&self.url).await.unwrap();
            sqlx::query(sqlx::AssertSqlSafe(sql.to_string())).execute(&mut c).await.map(|r| r.rows_affected()).map_err(|e| e.to_string())
        } else {
            let mut c = sqlx::PgConnection::connect(&self.url).await.unwrap();
            sqlx::query(sqlx::AssertSqlSafe(sql.to_string())).execute(&mut c).await.map(|r| r.rows_affected()).map_err(|e| e.to_string())
        }
    }
}

#[allow(unused_imports)]
pub use ferry_ledger::testing::T0;

#[allow(unused_imports)]
pub use ferry_ledger::testing::seed;
