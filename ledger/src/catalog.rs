//! Iceberg's JDBC catalog in the ledger's database (`[destination.iceberg] catalog = "ledger"`).
//!
//! The catalog is two tables (migration 0015) that Iceberg's JdbcCatalog and PyIceberg's
//! SqlCatalog read and write with the same statements: a table's row names its current
//! metadata file, and a commit moves it from the file the writer read to the one it wrote,
//! only if no other writer moved it meanwhile. Ferry runs that update in the transaction that
//! records the chunks the commit brings (see [`Ledger::publish_tx`]): the commit and the
//! ledger's record of it are one step, so a lost reply or a crash never leaves a snapshot the
//! ledger does not know, and a load whose lease another claim took commits nothing.

use crate::backend::{Backend, Begin};
use crate::{Lease, Ledger, Part, Result, db};

/// A commit to a table of the catalog: its row moves from `old` (None: the table is new, and
/// its row is created) to `new`.
#[derive(Debug, Clone, Copy)]
pub struct CatalogSwap<'a> {
    pub catalog: &'a str,
    pub namespace: &'a str,
    pub table: &'a str,
    pub old: Option<&'a str>,
    pub new: &'a str,
}

/// What a chunk's publish records beside a swap (see [`Ledger::record_published`]).
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    pub table: &'a str,
    pub parts: &'a [(String, Part)],
    pub replace: bool,
    pub table_version: Option<i64>,
}

/// How a publish transaction ended (a lost lease is an error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swapped {
    /// Committed: the swap, and the record.
    Done,
    /// A newer version of the chunk's source file is recorded: nothing committed.
    Superseded,
    /// Another writer moved the table's row first: nothing committed; read the table again.
    Lost,
}

/// Runs a [`CatalogSwap`] in a write transaction: false if the table's row was not where the
/// writer read it (another writer committed first), and nothing changed.
macro_rules! swap_in_tx {
    ($tx:expr, $swap:expr, $op:expr) => {{
        let swap: &$crate::catalog::CatalogSwap<'_> = $swap;
        // The namespace as PyIceberg's create_namespace leaves it; one that exists is kept.
        sqlx::query(
            "INSERT INTO iceberg_namespace_properties (catalog_name, namespace, property_key, property_value)
             VALUES ($1, $2, 'exists', 'true') ON CONFLICT DO NOTHING",
        )
        .bind(swap.catalog)
        .bind(swap.namespace)
        .execute(&mut *$tx)
        .await
        .map_err(db($op))?;
        let done = match swap.old {
            Some(old) => sqlx::query(
                "UPDATE iceberg_tables SET metadata_location = $4, previous_metadata_location = $5
                 WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3 AND metadata_location = $5",
            )
            .bind(swap.catalog)
            .bind(swap.namespace)
            .bind(swap.table)
            .bind(swap.new)
            .bind(old),
            None => sqlx::query(
                "INSERT INTO iceberg_tables (catalog_name, table_namespace, table_name, metadata_location, previous_metadata_location)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            )
            .bind(swap.catalog)
            .bind(swap.namespace)
            .bind(swap.table)
            .bind(swap.new)
            .bind(None::<&str>),
        }
        .execute(&mut *$tx)
        .await
        .map_err(db($op))?;
        done.rows_affected() == 1
    }};
}

impl Ledger {
    /// The current metadata file of a table of the catalog in the ledger, or None if the
    /// catalog has no such table (or has it without a metadata file).
    pub async fn iceberg_location(&self, catalog: &str, namespace: &str, table: &str) -> Result<Option<String>> {
        self.call("iceberg_location", || async move {
            on_backend!(self, |pool, begin| {
                let row: Option<(Option<String>,)> = sqlx::query_as(
                    "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3",
                )
                .bind(catalog)
                .bind(namespace)
                .bind(table)
                .fetch_optional(pool)
                .await
                .map_err(db("iceberg_location"))?;
                Ok(row.and_then(|(l,)| l))
            })
        })
        .await
    }

    /// Commits `swap` (if any: a REST catalog's commit is not the ledger's) and records each entry's chunk (its lease confirmed, its files as
    /// published, see [`Ledger::record_published`]) in one transaction: a group commit. How it
    /// ended (`Superseded`: some entry's newer version is in, nothing committed); a lost lease
    /// is the error of the first entry whose lease another claim took.
    pub async fn record_published_with(&self, swap: Option<&CatalogSwap<'_>>, entries: &[(&Lease, Record<'_>)]) -> Result<Swapped> {
        let entries: Vec<(&Lease, Option<Record<'_>>)> = entries.iter().map(|(l, r)| (*l, Some(*r))).collect();
        self.publish_tx(swap, &entries).await
    }

    /// Commits `swap` alone, for no chunk (`ferry vacuum` expiring snapshots).
    pub async fn swap_catalog(&self, swap: &CatalogSwap<'_>) -> Result<Swapped> {
        self.publish_tx(Some(swap), &[]).await
    }

    /// Commits `swap` alone, if `lease` is still current: a commit that records no chunk.
    /// Without a swap, only confirms the lease (an error if another claim took it).
    pub async fn commit_catalog(&self, lease: &Lease, swap: Option<&CatalogSwap<'_>>) -> Result<Swapped> {
        self.publish_tx(swap, &[(lease, None)]).await
    }
}
