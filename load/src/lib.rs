//! load: landed chunks -> the table, exactly once.
//!
//! What every table format shares is here; what a format does is behind `ferry_table::Table`
//! (the Hive layout: `ferry_table::hive`, whose opening note is the publish protocol and what a
//! crash at each step leaves; Delta: `ferry_delta::DeltaTable`; Iceberg: `ferry_iceberg::IcebergTable`), chosen once by [`open_table`].
//!
//! One chunk's load:
//! 1. A chunk of a file whose corrected version (a newer one at the same path) is in the table
//!    is not published: the newer version's rows replace its (`Table::withdraw`).
//! 2. A version N that replaces another is published whole (`source.versions = "replace"`):
//!    its chunks' loads wait (not counted as attempts) until every chunk of N is copied; the
//!    first to find them all copied holds N's switch (one load lease at a time across hosts,
//!    the ledger's `switches`) and publishes every part of N; the others find their parts in
//!    place and record them. A chunk of N quarantined keeps N waiting, and the older version
//!    whole, until it is requeued or skipped.
//! 3. The format makes the parts visible as one step and records them (`Table::publish`).
//! 4. The version's other chunks are woken: their parts are in, and their loads record them.

use std::sync::Arc;

use ferry_ledger::{Lease, Ledger, Part, Work};
use ferry_runtime::config::{Config, TableFormat, Versions};
use ferry_runtime::sweeps::{Places, Sweep};
use ferry_storage::Store;
use ferry_table::{HiveTable, Job, Outcome, Table, WAIT_BRIEFLY};

pub use ferry_table::{TableError as LoadError, TableFailure as LoadFailure};

/// The table `destination.table_format` names, on the destination store: the one place a
/// format is chosen.
pub fn open_table(cfg: &Config, ledger: &Ledger) -> Result<Arc<dyn Table>, LoadError> {
    let dest = Store::open(&cfg.destination.url, &cfg.destination.store)?;
    Ok(match cfg.destination.table_format {
        TableFormat::Hive => Arc::new(HiveTable::new(cfg.clone(), ledger.clone(), dest)),
        TableFormat::Delta => Arc::new(ferry_delta::DeltaTable::new(cfg.clone(), ledger.clone(), dest)),
        TableFormat::Iceberg => Arc::new(ferry_iceberg::IcebergTable::new(cfg.clone(), ledger.clone(), dest)?),
    })
}

/// What `ferry doctor` checks of the table `destination.table_format` names before any load
/// (each step bounded by `timeout`), or None for a format with nothing to check beyond the
/// destination store's own hop.
pub async fn preflight(cfg: &Config, timeout: std::time::Duration) -> Option<ferry_table::Preflight> {
    let mut p = ferry_table::Preflight::new(timeout);
    match cfg.destination.table_format {
        TableFormat::Hive | TableFormat::Iceberg => return None,
        TableFormat::Delta => {
            let _ = ferry_delta::preflight(cfg, &mut p).await;
        }
    }
    Some(p)
}

/// What one chunk's publish moves (see [`Loader::moving`]).
struct Moving {
    /// The chunk's own parts.
    parts: Vec<Part>,
    /// Its parts and, in a version switch, its siblings'.
    moving: Vec<Part>,
    /// The version's other chunks, woken once the switch is recorded.
    siblings: Vec<String>,
    /// The version's switch, held until this is dropped.
    switching: Option<Switching>,
}

pub struct Loader {
    cfg: Config,
    ledger: Ledger,
    table: Arc<dyn Table>,
    /// Versions of corrected files being switched into the table by this process.
    switches: Arc<std::sync::Mutex<std::collections::HashSet<(String, i64)>>>,
}

/// Holds a version's switch (see [`Loader::switching`]) until dropped: in this process, and
/// in the ledger once taken there.
struct Switching {
    key: (String, i64),
    switches: Arc<std::sync::Mutex<std::collections::HashSet<(String, i64)>>>,
    /// The ledger's switch, given back when this is dropped (the lease's end frees it too).
    held: Option<(Ledger, Lease)>,
}

impl Drop for Switching {
    fn drop(&mut self) {
        self.switches.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.key);
        if let Some((ledger, lease)) = self.held.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let (uri, version) = self.key.clone();
            rt.spawn(async move {
                if let Err(e) = ledger.release_switch(&lease, &uri, version).await {
                    tracing::debug!(uri, version, error = %e, "cannot give the switch back now; the lease's end frees it");
                }
            });
        }
    }
}

impl Loader {
    /// The destination store, as the chunks reach it.
    pub fn destination(&self) -> &Store {
        self.table.store()
    }

    /// The table load publishes into.
    pub fn table(&self) -> &Arc<dyn Table> {
        &self.table
    }

    pub fn new(cfg: Config, ledger: Ledger) -> Result<Loader, LoadError> {
        let table = open_table(&cfg, &ledger)?;
        Ok(Loader { cfg, ledger, table, switches: Default::default() })
    }

    /// Removes the table's metadata temp files left by a load that crashed, and landed files of
    /// chunks already published (a zombie copy that landed a chunk again after its load).
    pub async fn gc(&self) -> Result<(), LoadError> {
        let cutoff = self.cfg.temp_cutoff_ms(self.ledger.now_ms());
        let meta_dirs = self.table.meta_dirs();
        let at = Places {
            cfg: &self.cfg,
            ledger: &self.ledger,
            staging: None,
            destination: Some(self.table.store()),
            spool: None,
            meta_dirs: &meta_dirs,
        };
        // Each place on its own: one that fails does not keep the other.
        let temps = Sweep::TableMetaTemps.run(&at, cutoff).await;
        let landed = Sweep::StrayLanded.run(&at, cutoff).await;
        temps?;
        landed?;
        Ok(())
    }

    pub async fn chunk(self: Arc<Self>, lease: Lease) -> Result<Work, LoadError> {
        let replace = self.cfg.source.versions == Versions::Replace;
        let dest = self.table.store().isolated()?;
        if replace && self.ledger.newer_version_published(&lease.chunk_id).await?.is_some() && self.table.withdraw(&dest, &lease).await? {
            return Ok(Work::default());
        }
        let version = if replace { Some(self.ledger.version_of(&lease.chunk_id).await?) } else { None };
        let Moving { parts, moving, siblings, switching: _switching } = self.moving(&lease, version.as_ref()).await?;
        let job = Job { lease: &lease, dest: &dest, parts: &parts, moving: &moving, siblings: &siblings, version: version.as_ref() };
        if self.table.publish(&job).await? == Outcome::Superseded {
            return Ok(Work::default());
        }
        if !siblings.is_empty() {
            // Their parts are in place: their own load tasks, waiting, record them now.
            self.ledger.wake(&siblings, ferry_ledger::Stage::Load).await?;
        }
        Ok(Work { bytes: parts.iter().map(|p| p.bytes).sum(), records: parts.iter().map(|p| p.records).sum(), ..Work::default() })
    }

    /// What this chunk's publish moves into the table: its parts, and, for a version that
    /// replaces another, every part of the version. Such a version goes in whole: once every
    /// one of its chunks is copied, all of their parts go in in one step (all or nothing), and
    /// only then do the older version's files go; until then the older version stays whole.
    async fn moving(&self, lease: &Lease, version: Option<&ferry_ledger::VersionState>) -> Result<Moving, LoadError> {
        let parts = self.ledger.parts(&lease.chunk_id).await?;
        let mut m = Moving { moving: parts.clone(), parts, siblings: Vec::new(), switching: None };
        if let Some(v) = version.filter(|v| v.replaces) {
            version_ready(v)?;
            // One switch of a version at a time (in this process, and across hosts through
            // the ledger): the others wait for it and then find their parts in place.
            m.switching = Some(self.switching(lease, &v.uri, v.version).await?);
            for c in v.chunks.iter().filter(|c| !c.skipped && c.id != lease.chunk_id) {
                m.moving.extend(self.ledger.parts(&c.id).await?);
                m.siblings.push(c.id.clone());
            }
        }
        Ok(m)
    }

    /// The switch of version `version` of `uri` for this task, or a short wait when another
    /// task is switching it now: of this process (looked at first, without a ledger call), or
    /// of any host (the ledger's `switches`). One switch at a time is what keeps a version
    /// whole: a switch that fails part-way takes back what it moved, and another switch
    /// going on beside it could have recorded some of those parts as published already.
    async fn switching(&self, lease: &Lease, uri: &str, version: i64) -> Result<Switching, LoadError> {
        let key = (uri.to_string(), version);
        let busy = |by: &str| {
            LoadError::Stage(LoadFailure::Waiting {
                reason: format!("version {version} of {uri} is being published by another chunk of it ({by})"),
                after: WAIT_BRIEFLY,
            })
        };
        if !self.switches.lock().unwrap_or_else(|e| e.into_inner()).insert(key.clone()) {
            return Err(busy("in this process"));
        }
        let mut switching = Switching { key, switches: self.switches.clone(), held: None };
        if let Some(holder) = self.ledger.take_switch(lease, uri, version).await? {
            return Err(busy(&format!("the load of chunk {holder}, maybe on another host")));
        }
        switching.held = Some((self.ledger.clone(), lease.clone()));
        Ok(switching)
    }
}

/// How long a chunk of a replacing version waits before it looks again: for another task of
/// this process that is publishing the version now; for the version's other chunks to be
/// copied (the last one to be copied publishes the version and wakes the others at once, so
/// this is only the fallback, and keeps a large corrected file's waiting chunks from polling
/// the ledger); for an operator to requeue or skip a quarantined one.
const WAIT_FOR_COPIES: std::time::Duration = std::time::Duration::from_secs(60);
const WAIT_FOR_OPERATOR: std::time::Duration = std::time::Duration::from_secs(300);

/// Whether every chunk of a replacing version is copied (and none is stuck), so that the
/// version can go into the table whole. A chunk skipped by an operator is not waited for.
fn version_ready(v: &ferry_ledger::VersionState) -> Result<(), LoadError> {
    let needed: Vec<&ferry_ledger::VersionChunk> = v.chunks.iter().filter(|c| !c.skipped).collect();
    if let Some(c) = needed.iter().find(|c| c.quarantined_at.is_some()) {
        return Err(LoadError::Stage(LoadFailure::Waiting {
            reason: format!(
                "version {} of {} is published only whole, and its chunk {} is quarantined at {}; until it is requeued or skipped \
                 (ferry requeue / ferry skip --chunk {}) the version before stays in the table",
                v.version,
                v.uri,
                c.id,
                c.quarantined_at.as_deref().unwrap_or("?"),
                c.id
            ),
            after: WAIT_FOR_OPERATOR,
        }));
    }
    let waiting = needed.iter().filter(|c| !c.copied).count();
    if waiting > 0 {
        return Err(LoadError::Stage(LoadFailure::Waiting {
            reason: format!(
                "version {} of {} is published only whole: {waiting} of its {} chunks are not copied yet",
                v.version,
                v.uri,
                needed.len()
            ),
            after: WAIT_FOR_COPIES,
        }));
    }
    Ok(())
}
