//! Maintenance as named sweeps: what crashed writers and finished work leave behind, each
//! place with one sweep that knows what in it is Ferry's to remove. `ferry gc` runs all of them
//! (or the ones named with `--sweep`); each stage runs its own at start (extract: staging temps;
//! transform: spool temps; load: table metadata temps and stray landed copies).
//!
//! Every sweep removes only names Ferry writes, older than a cutoff that no live writer can be
//! behind (see `Config::temp_cutoff_ms`), and of chunks this pipeline's ledger knows: another
//! tool's file, or a slower pipeline's live upload, under the same root is never touched. One
//! file that cannot go now does not keep the others; what a sweep removed before it failed
//! is still counted (`ferry_storage::Error::Incomplete`).

use std::collections::HashSet;

use crate::config::Config;
use ferry_common::paths;
use ferry_ledger::Ledger;
use ferry_storage::{Error, Result, Store};

/// One place to clean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sweep {
    /// Temp files of extract writes that crashed, in staging.
    StagingTemps,
    /// Temp files and unfinished multipart uploads that crashed or cancelled copies left at
    /// the destination.
    AbandonedUploads,
    /// Temp files of the table's metadata (manifests, DDL, a Delta table's log) that a crashed
    /// load left.
    TableMetaTemps,
    /// Temp part files of transforms that crashed, in the spool.
    SpoolTemps,
    /// Spool directories of chunks copied already, with nothing newer than the cutoff in them.
    SpentSpool,
    /// Landed copies no load will read (a zombie copy landed a published chunk again, or a
    /// copy attempt landed one before its copy was skipped).
    StrayLanded,
    /// Staged chunks transform committed longer than `transform.keep_staged` ago.
    OldStaged,
}

/// What the sweeps work on; a stage gives the stores it has, `ferry gc` all of them.
pub struct Places<'a> {
    pub cfg: &'a Config,
    pub ledger: &'a Ledger,
    pub staging: Option<&'a Store>,
    pub destination: Option<&'a Store>,
    pub spool: Option<&'a Store>,
    /// The table's metadata directories (`ferry_table::Table::meta_dirs`): where
    /// [`Sweep::TableMetaTemps`] looks.
    pub meta_dirs: &'a [String],
}

impl Sweep {
    /// In the order `ferry gc` runs them.
    pub const ALL: [Sweep; 7] = [
        Sweep::StagingTemps,
        Sweep::AbandonedUploads,
        Sweep::TableMetaTemps,
        Sweep::SpoolTemps,
        Sweep::SpentSpool,
        Sweep::StrayLanded,
        Sweep::OldStaged,
    ];

    /// Its name on the command line (`ferry gc --sweep NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Sweep::StagingTemps => "staging-temps",
            Sweep::AbandonedUploads => "abandoned-uploads",
            Sweep::TableMetaTemps => "table-meta-temps",
            Sweep::SpoolTemps => "spool-temps",
            Sweep::SpentSpool => "spent-spool",
            Sweep::StrayLanded => "stray-landed",
            Sweep::OldStaged => "old-staged",
        }
    }

    /// What it removes, as `ferry gc` reports it.
    pub fn what(self) -> &'static str {
        match self {
            Sweep::StagingTemps => "staging temp files",
            Sweep::AbandonedUploads => "destination temp files and uploads",
            Sweep::TableMetaTemps => "destination table metadata and Delta log temp files",
            Sweep::SpoolTemps => "spool temp files",
            Sweep::SpentSpool => "spool directories of copied chunks",
            Sweep::StrayLanded => "landed copies no load will read",
            Sweep::OldStaged => "staged chunks past transform.keep_staged",
        }
    }

    pub fn parse(name: &str) -> Option<Sweep> {
        Sweep::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Removes what this sweep finds older than `cutoff` (ms since the epoch; `OldStaged`
    /// goes by `transform.keep_staged` instead). Returns how many files or uploads went.
    /// Boxed here (see [`crate::runner::Boxed`]): every stage and `ferry gc` call it.
    pub fn run<'a>(self, at: &'a Places<'a>, cutoff: i64) -> crate::runner::Boxed<'a, Result<usize>> {
        Box::pin(self.run_inner(at, cutoff))
    }

    async fn run_inner(self, at: &Places<'_>, cutoff: i64) -> Result<usize> {
        let table = &at.cfg.table.name;
        match self {
            Sweep::StagingTemps => at.store(at.staging, "staging")?.remove_stale_temps(table, cutoff).await,
            Sweep::AbandonedUploads => abandoned_uploads(at.ledger, at.store(at.destination, "destination")?, table, cutoff).await,
            Sweep::TableMetaTemps => {
                let dest = at.store(at.destination, "destination")?;
                // Each format writes its metadata through temp names (a Delta commit is written
                // to a temp name in the log and renamed to its version without replacing, on
                // local dirs and HDFS): a load killed between the two leaves one.
                let mut n = 0;
                for dir in at.meta_dirs {
                    match dest.remove_stale_temps(dir, cutoff).await {
                        Ok(k) => n += k,
                        Err(e) if e.is_not_found() => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(n)
            }
            Sweep::SpoolTemps => at.store(at.spool, "spool")?.remove_stale_temps(table, cutoff).await,
            Sweep::SpentSpool => {
                let chunks = at.ledger.spool_spent().await.map_err(ledger_error)?;
                if !chunks.is_empty() {
                    durable(at.ledger).await?;
                }
                ferry_storage::remove_quiet_dirs(chunks.iter().map(|c| paths::spool_chunk_dir(&at.cfg.spool.dir, table, c)), cutoff)
            }
            Sweep::StrayLanded => stray_landed(at.ledger, at.store(at.destination, "destination")?, table, cutoff).await,
            Sweep::OldStaged => old_staged(at.cfg, at.ledger, at.store(at.staging, "staging")?).await,
        }
    }
}

impl Places<'_> {
    fn store<'s>(&self, store: Option<&'s Store>, name: &str) -> Result<&'s Store> {
        store.ok_or_else(|| Error::Other(format!("no {name} store given to this sweep")))
    }
}

fn ledger_error(e: ferry_ledger::Error) -> Error {
    Error::Incomplete { removed: 0, reason: format!("the ledger: {e}") }
}

/// Durable before destructive: the sweeps that remove what the ledger calls finished (spent
/// spool, stray landed copies, old staged chunks) first make every commit so far durable. The
/// state they read may be another process's commit still in the page cache; after a power
/// loss the chunk would be redone and find its input gone.
async fn durable(ledger: &Ledger) -> Result<()> {
    ledger.make_durable().await.map_err(ledger_error)
}

/// Deletes `names` from `store`, one failure not keeping the others; the count, or what went
/// before the first failure with its reason.
async fn delete_each(store: &Store, names: impl IntoIterator<Item = String>) -> Result<usize> {
    let (mut n, mut first) = (0, None);
    for rel in names {
        match store.delete(&rel).await {
            Ok(()) => n += 1,
            Err(e) => {
                first.get_or_insert(format!("{}: {e}", store.url(&rel)));
            }
        }
    }
    match first {
        None => Ok(n),
        Some(reason) => Err(Error::Incomplete { removed: n, reason }),
    }
}

/// Temp files and multipart uploads of this pipeline's chunks older than `cutoff`.
async fn abandoned_uploads(ledger: &Ledger, dest: &Store, table: &str, cutoff: i64) -> Result<usize> {
    let found = dest.abandoned(table, cutoff).await?;
    if found.is_empty() {
        return Ok(0);
    }
    let chunks: Vec<String> = found.iter().map(|a| a.chunk.clone()).collect();
    let ours = ledger.own_chunks(&chunks).await.map_err(ledger_error)?;
    let chosen: Vec<_> = found.into_iter().filter(|a| ours.contains(&a.chunk)).collect();
    dest.remove_abandoned(&chosen).await
}

/// Landed part files, older than `cutoff`, of chunks no load will read (see
/// [`Ledger::landed_unneeded`]): a zombie copy that landed a chunk again after load published
/// it, or a copy attempt that landed a chunk and died before an operator skipped the copy. A
/// chunk that `ferry rerun` is redoing keeps its landed files.
///
/// Only the chunk directories are listed first (one call on HDFS), and only those of done
/// chunks are then listed whole: the landed tree holds every chunk waiting for load, and
/// listing all of it cost load on HDFS one NameNode call per partition directory at each start.
async fn stray_landed(ledger: &Ledger, dest: &Store, table: &str, cutoff: i64) -> Result<usize> {
    let dir = paths::landed_dir(table);
    let chunks = dest.children(&dir).await?;
    if chunks.is_empty() {
        return Ok(0);
    }
    let done: HashSet<String> = ledger.landed_unneeded().await.map_err(ledger_error)?.into_iter().collect();
    let mut stray = Vec::new();
    for chunk in chunks.iter().filter(|c| done.contains(c.as_str())) {
        for e in dest.list(&format!("{dir}/{chunk}")).await? {
            // Every entry is under a done chunk's directory; a part's path below it is required.
            if e.mtime_ms < cutoff && paths::parse_landed(table, &e.rel).is_some() {
                tracing::info!(file = %dest.url(&e.rel), "removing a landed copy no load will read");
                stray.push(e.rel);
            }
        }
    }
    if !stray.is_empty() {
        durable(ledger).await?;
    }
    delete_each(dest, stray).await
}

/// Staged chunks transform committed more than `transform.keep_staged` ago (found by the
/// location the ledger records for each chunk), and chunks a revert staged anew that no row
/// names (the revert was cut short, or the file changed again before it was recorded), once
/// they are past `keep_staged` and past the cutoff no live writer can be behind. Staging is
/// listed before the ledger is read: a file a revert stages after the listing is not seen,
/// and one recorded before the read is named.
async fn old_staged(cfg: &Config, ledger: &Ledger, staging: &Store) -> Result<usize> {
    let now = chrono::Utc::now().timestamp_millis();
    let cutoff = now - cfg.transform.keep_staged.0.as_millis() as i64;
    let table = &cfg.table.name;
    let listed = staging.list(table).await?;
    // Matched as paths in the store, so a location spelled differently (a port, a trailing
    // slash) still matches.
    let done: HashSet<String> =
        ledger.transformed_before(cutoff).await.map_err(ledger_error)?.iter().filter_map(|l| staging.rel_of(l)).collect();
    let unrecorded_cutoff = cutoff.min(cfg.temp_cutoff_ms(now));
    let revived: Vec<(&str, &str)> = listed
        .iter()
        .filter(|e| e.mtime_ms < unrecorded_cutoff)
        .filter_map(|e| paths::parse_revived(table, &e.rel).map(|(chunk, _)| (chunk, e.rel.as_str())))
        .collect();
    // Only chunks this pipeline's ledger knows: another pipeline's revert under the same root
    // is never touched.
    let known = if revived.is_empty() {
        Default::default()
    } else {
        let chunks: Vec<String> = revived.iter().map(|(c, _)| c.to_string()).collect();
        ledger.chunk_locations(&chunks).await.map_err(ledger_error)?
    };
    let unrecorded: HashSet<String> = revived
        .iter()
        .filter(|(chunk, rel)| known.get(*chunk).is_some_and(|l| staging.rel_of(l).as_deref() != Some(*rel)))
        .map(|(_, rel)| rel.to_string())
        .collect();
    let old: Vec<String> = listed.into_iter().map(|e| e.rel).filter(|rel| done.contains(rel) || unrecorded.contains(rel)).collect();
    if !old.is_empty() {
        durable(ledger).await?;
    }
    delete_each(staging, old).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sweep_has_a_name_it_is_found_by() {
        let names: HashSet<&str> = Sweep::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(names.len(), Sweep::ALL.len());
        for s in Sweep::ALL {
            assert_eq!(Sweep::parse(s.name()), Some(s));
        }
        assert_eq!(Sweep::parse("everything"), None);
    }
}
