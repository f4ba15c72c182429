//! Apache Iceberg tables (`[destination] table_format = "iceberg"`): the table's metadata,
//! manifests and manifest lists, written by load over Ferry's own stores, and committed through
//! Iceberg's JDBC catalog in the ledger or through an Iceberg REST catalog.
//!
//! # Design note
//!
//! As for Delta, Ferry writes the Parquet files itself (transform) and moves them into the
//! table directory (load); Iceberg adds only the metadata that says which of them a reader
//! sees, so Ferry writes that itself over [`Store`] (the `iceberg` crate would bring a second
//! arrow/parquet and object store, and has no HDFS).
//!
//! ```text
//!  <table>/<k=v>/part-<chunk>-<blake3 8>.parquet      moved in from _ferry/landed; invisible until a snapshot names it
//!  <table>/metadata/<n:05>-<uuid>.metadata.json        one table version: schemas, spec, snapshots, properties, refs
//!  <table>/metadata/snap-<id>-<uuid>.avro              a snapshot's manifest list
//!  <table>/metadata/<uuid>-m<k>.avro                   a manifest: data files added, kept or deleted
//!  ledger: iceberg_tables(catalog_name, table_namespace, table_name, metadata_location, ...)
//! ```
//!
//! - **A commit** writes a new metadata file (under a name no other writer takes) and moves the
//!   table's catalog row to it only if the row still names the file the commit was planned on:
//!   `UPDATE iceberg_tables ... WHERE metadata_location = <read>`, which is what Spark's
//!   JdbcCatalog and PyIceberg's SqlCatalog run too, so every writer of the table serializes
//!   on that row. A writer that loses the race reads the table again and plans again.
//! - **The commit and the ledger's record are one transaction.** The row's update runs in the
//!   ledger transaction that fences the load's lease and records the chunk's files as
//!   published: either both happen or neither, so there is no ambiguous commit (a lost reply,
//!   a kill after the commit) to settle, and a load whose lease another claim took commits
//!   nothing. A newer version of the source file recorded meanwhile rolls the commit back too.
//! - **Every plan is a function of the snapshot it is written against.** Whether a chunk's
//!   files are in is read from the current snapshot's manifests, never assumed: a retry of a
//!   chunk whose files are in (a sibling's switch brought them) only records them. Names are
//!   content-addressed (`ferry_table::part_rel`): a rerun with other bytes adds a new file and
//!   deletes the chunk's old one in the same snapshot (an overwrite); a version switch adds the
//!   version's files and deletes every older version's in one snapshot.
//! - **What is not Ferry's stays.** Other writers' snapshots, data and delete files, manifests,
//!   properties, refs and schemas are carried over as they are: a manifest is rewritten only
//!   when it names a file Ferry deletes (its other entries kept, as existing), and a file Ferry
//!   did not add (no chunk id in its name) is never deleted. Each snapshot's summary names the
//!   chunks it brought (`ferry.chunks`: `<chunk>@<lease epoch>`).
//!
//! - **A REST catalog** (`rest`) takes a commit as requirements and updates, and writes the
//!   metadata file itself; its commit and the ledger's record are two steps, settled by the rule
//!   above (a plan is a function of the snapshot): a lost reply is settled by looking for the
//!   commit's snapshot id in the table, and a kill between the commit and the record leaves
//!   files in the snapshot that the retry records. Each commit asserts the `main` it builds on,
//!   so two sends of one plan (a retry while the first is still on its way) cannot both land.
//!
//! What a crash leaves, at each step of a chunk's load (catalog in the ledger):
//! - parts moved into the table directory, no commit: invisible files; the retry commits them.
//! - manifests or a metadata file written, the catalog row not moved: files no version names
//!   (left for a vacuum); the retry plans again.
//! - the transaction committed: the chunk is in and recorded; its task's end is recorded by the
//!   retry, which finds the files in the snapshot and writes nothing.

mod manifest;
mod rest;
mod schema;
mod table;

use ferry_storage::Store;
pub use table::IcebergTable;

/// What went wrong with a table's metadata.
#[derive(Debug, thiserror::Error)]
pub enum IcebergError {
    #[error(transparent)]
    Storage(#[from] ferry_storage::Error),
    #[error(transparent)]
    Ledger(#[from] ferry_ledger::Error),
    /// The table's metadata is not what Ferry can read or must not write over.
    #[error("{0}")]
    Metadata(String),
    /// The table's schema or partition spec cannot take Ferry's.
    #[error("{0}")]
    Schema(String),
}

type Result<T, E = IcebergError> = std::result::Result<T, E>;

/// The format version Ferry writes, and the only one it writes to.
pub const FORMAT_VERSION: i64 = 2;

/// How many earlier metadata files a metadata file lists (Iceberg's
/// `write.metadata.previous-versions-max` default), unless the table's property says.
const PREVIOUS_VERSIONS_MAX: usize = 100;

/// A file's URL in one spelling: Java's Hadoop paths write local files as `file:/dir/f`, Ferry
/// and PyIceberg as `file:///dir/f`; the two name one file.
pub(crate) fn canon(url: &str) -> std::borrow::Cow<'_, str> {
    match url.strip_prefix("file:") {
        Some(rest) if rest.starts_with('/') && !rest.starts_with("//") => format!("file://{rest}").into(),
        _ => url.into(),
    }
}

/// The table's path in the store for a URL of it (the catalog's and manifests' paths are
/// URLs), or an error naming it.
fn rel(dest: &Store, url: &str) -> Result<String> {
    dest.rel_of(&canon(url)).ok_or_else(|| {
        IcebergError::Metadata(format!("{url} is not on the destination store {}: Ferry reads and writes one store", dest.url("")))
    })
}
