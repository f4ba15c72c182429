//! copy: local spool -> destination. Small on purpose: it only moves finished Parquet files
//! and proves they arrived whole.
//!
//! # Publish protocol (per part file of a chunk)
//!
//! ```text
//!  spool/<table>/<chunk>/<k=v>/part-<chunk>.parquet
//!     │ upload under a deadline and a no-progress watchdog, hashing every byte
//!     ▼
//!  dest/_ferry/tmp/<chunk>.<attempt>.<i>         (attempt-unique: two attempts never share it)
//!     │ size and hash equal what transform recorded? else delete, retry the chunk
//!     ▼ rename without overwrite
//!  dest/_ferry/landed/<table>/<chunk>/<k=v>/part-<chunk>.parquet
//! ```
//!
//! A landed file that already has the recorded size and hash counts as copied, so a retry after
//! a crash or a lost reply copies nothing twice. The spool files go only after the ledger
//! commit (the runner's after-commit hook). A crash leaves at worst a temp file, which the
//! next run removes once it is older than two leases.

use std::path::PathBuf;
use std::sync::Arc;

use ferry_common::config::Config;
use ferry_common::error::{Classified, Error, ErrorClass};
use ferry_common::ledger::{Lease, Ledger, Part, Stage, Work};
use ferry_common::storage::{Progress, Store, watched};

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// What transform left in the spool is gone or wrong; the chunk needs a new transform.
    #[error("spool: {0}")]
    Spool(String),
    /// What arrived differs from what was sent; a retry may get it right.
    #[error("verify: {0}")]
    Verify(String),
    #[error(transparent)]
    Common(#[from] Error),
}

impl Classified for CopyError {
    fn class(&self) -> ErrorClass {
        match self {
            CopyError::Spool(_) => ErrorClass::Permanent,
            CopyError::Verify(_) => ErrorClass::Transient,
            CopyError::Common(e) => e.class(),
        }
    }
}

pub struct Copy {
    cfg: Config,
    ledger: Ledger,
    dest: Store,
}

/// Where copy lands a part, relative to the destination.
pub fn landed_path(table: &str, p: &Part) -> String {
    format!("_ferry/landed/{table}/{}/{}", p.chunk_id, p.rel_path())
}

impl Copy {
    pub fn new(cfg: Config, ledger: Ledger) -> Result<Copy, CopyError> {
        let dest = Store::open(&cfg.destination.url, &cfg.destination.store)?;
        Ok(Copy { cfg, ledger, dest })
    }

    fn spool_dir(&self, chunk: &str) -> PathBuf {
        self.cfg.spool.dir.join(&self.cfg.table.name).join(chunk)
    }

    pub async fn chunk(self: Arc<Self>, lease: Lease) -> Result<Work, CopyError> {
        let parts = self.ledger.parts(&lease.chunk_id).await?;
        let mut work = Work::default();
        // Its own connections: a hung one holds back this chunk only.
        let dest = self.dest.isolated()?;
        for (i, p) in parts.iter().enumerate() {
            let landed = landed_path(&self.cfg.table.name, p);
            if let Some(h) = dest.head(&landed).await? {
                if h.size as i64 == p.bytes && dest.hash(&landed).await?.1 == p.content_hash {
                    continue; // an earlier attempt landed it
                }
                dest.delete(&landed).await?;
            }
            let src = self.spool_dir(&p.chunk_id).join(p.rel_path());
            if !src.exists() {
                return Err(CopyError::Spool(format!("{} is missing; transform the chunk again (ferry requeue)", src.display())));
            }
            let tmp = format!("_ferry/tmp/{}.{}.{i}", lease.chunk_id, lease.attempt);
            let progress = Progress::default();
            let c = &self.cfg.copy;
            let what = format!("copy of {} to {}", src.display(), dest.url(&tmp));
            let res = watched(&what, c.deadline.0, c.stall_timeout.0, progress.clone(), dest.upload(&src, &tmp, progress)).await;
            let (n, hash) = match res {
                Ok(v) => v,
                Err(e) => {
                    let _ = dest.delete(&tmp).await;
                    return Err(e.into());
                }
            };
            if n as i64 != p.bytes || hash != p.content_hash {
                dest.delete(&tmp).await?;
                return Err(CopyError::Verify(format!(
                    "{}: sent {n} bytes with hash {hash}, transform recorded {} bytes with hash {}",
                    src.display(),
                    p.bytes,
                    p.content_hash
                )));
            }
            if !dest.rename_noreplace(&tmp, &landed).await? {
                // Another attempt landed it first; keep theirs if it is right.
                dest.delete(&tmp).await?;
                if dest.hash(&landed).await?.1 != p.content_hash {
                    return Err(CopyError::Verify(format!("{landed} exists with other content")));
                }
            }
            work.bytes += p.bytes;
            work.records += p.records;
        }
        Ok(work)
    }

    /// Removes spool directories of chunks already copied (left by a crash between the
    /// commit and the removal), and temp files in the destination older than two leases.
    pub async fn gc(&self) -> Result<(), CopyError> {
        for chunk in self.ledger.done_chunks(Stage::Copy).await? {
            let d = self.spool_dir(&chunk);
            if d.exists() {
                std::fs::remove_dir_all(&d).map_err(|e| Error::io(d.display(), e))?;
            }
        }
        let cutoff = self.ledger.stale_before_ms();
        self.dest.gc("_ferry/tmp", cutoff).await?;
        let spool = Store::from_url(&self.cfg.spool.dir.to_string_lossy())?;
        spool.remove_stale_temps(&self.cfg.table.name, cutoff).await?;
        Ok(())
    }

    /// The after-commit hook: the chunk is recorded as copied, so its spool files can go.
    pub fn remove_spool(&self, lease: &Lease) {
        let d = self.spool_dir(&lease.chunk_id);
        if let Err(e) = std::fs::remove_dir_all(&d) {
            tracing::warn!(dir = %d.display(), error = %e, "cannot remove spool files; gc will");
        }
    }
}

