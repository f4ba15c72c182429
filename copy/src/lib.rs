//! copy: local spool -> destination. Small on purpose: it only moves finished Parquet files
//! and proves they arrived whole.
//!
//! # Publish protocol (per part file of a chunk)
//!
//! ```text
//!  spool/<table>/<chunk>/<k=v>/part-<chunk>.parquet
//!     │ upload under a deadline and a no-progress watchdog, hashing every byte
//!     ▼
//!  dest/_ferry/tmp/<chunk>.<epoch>.<i>           (the lease's epoch: two attempts never share it)
//!     │ size and hash equal what transform recorded? else delete, retry the chunk
//!     ▼ rename without overwrite
//!  dest/_ferry/landed/<table>/<chunk>/<k=v>/part-<chunk>.parquet
//! ```
//!
//! A landed file that already has the recorded size and hash counts as copied, so a retry after
//! a crash or a lost reply copies nothing twice. The spool files go only after the ledger
//! commit (the runner's after-commit hook). A crash leaves at worst a temp file, which the
//! next run removes once it is older than a copy deadline plus two leases. What "rename" means
//! on each backend, and how an ambiguous failure is settled there, is in `ferry_storage::{hdfs, s3}`;
//! every name above is built in `ferry_common::paths`.
//!
//! # Hedged copies
//!
//! A part whose upload runs longer than `copy.hedge_multiple` x the recent p95 for its size
//! (never sooner than `copy.hedge_min`) gets a second upload on new connections, to its own
//! temp name `<tmp>.h`. Both race to the no-overwrite rename; the first to land wins and the
//! chunk commits in the ledger under the one lease (whose epoch fences any other worker), the
//! other upload is cancelled and its temp file removed. A loser that still reaches the rename
//! finds the landed file with the right hash and stops. On by default: hedges start only for
//! the slow tail, and they turn a connection that hangs until its deadline (seed 000) into a
//! delay of a few p95s. Spark's speculation lost data with direct committers; here only a
//! landed file with the recorded hash ever counts, whichever attempt made it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferry_common::config::Config;
use ferry_common::error::{Classified, ConfigError, ErrorClass};
use ferry_common::paths;
use ferry_ledger::observe::names;
use ferry_ledger::{Lease, Ledger, Part, Stage, Work};
use ferry_storage::{Progress, Store, watched};

/// The copy stage's one error type; [`Classified::class`] decides retry-or-not.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// What transform left in the spool is gone or wrong; the chunk needs a new transform.
    #[error("spool: {0}")]
    Spool(String),
    /// What arrived differs from what was sent; a retry may get it right.
    #[error("verify: {0}")]
    Verify(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Ledger(#[from] ferry_ledger::Error),
    #[error(transparent)]
    Storage(#[from] ferry_storage::Error),
    #[error("I/O error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl Classified for CopyError {
    fn class(&self) -> ErrorClass {
        match self {
            CopyError::Spool(_) => ErrorClass::Permanent,
            CopyError::Verify(_) => ErrorClass::Transient,
            CopyError::Config(e) => e.class(),
            CopyError::Ledger(e) => e.class(),
            CopyError::Storage(e) => e.class(),
            CopyError::Io { source, .. } => ferry_common::error::io_error_class(source),
        }
    }
    fn store(&self) -> Option<&'static str> {
        match self {
            CopyError::Storage(_) | CopyError::Verify(_) => Some("destination"),
            CopyError::Ledger(e) if e.is_transient() => Some("ledger"),
            _ => None,
        }
    }
    fn is_config(&self) -> bool {
        match self {
            CopyError::Config(_) => true,
            CopyError::Ledger(e) => e.is_config(),
            CopyError::Storage(e) => e.is_config(),
            _ => false,
        }
    }
}

pub struct Copier {
    cfg: Config,
    ledger: Ledger,
    dest: Store,
    recent: Recent,
    hedges: std::sync::atomic::AtomicU64,
}

/// Seconds per byte of the last successful part copies, for the hedge delay.
#[derive(Default)]
struct Recent(std::sync::Mutex<std::collections::VecDeque<f64>>);

impl Recent {
    const KEEP: usize = 256;
    /// Fewer samples than this and there is no p95 to trust yet (only `hedge_min` applies).
    const MIN: usize = 8;

    fn record(&self, secs_per_byte: f64) {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() == Self::KEEP {
            q.pop_front();
        }
        q.push_back(secs_per_byte);
    }

    fn p95(&self) -> Option<f64> {
        let q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() < Self::MIN {
            return None;
        }
        let mut v: Vec<f64> = q.iter().copied().collect();
        v.sort_by(|a, b| a.total_cmp(b));
        Some(v[(v.len() * 95 / 100).min(v.len() - 1)])
    }
}

/// Where copy lands a part, relative to the destination.
pub fn landed_path(table: &str, p: &Part) -> String {
    paths::landed(table, &p.chunk_id, &p.rel_path())
}

impl Copier {
    pub fn new(cfg: Config, ledger: Ledger) -> Result<Copier, CopyError> {
        let dest = Store::open(&cfg.destination.url, &cfg.destination.store)?;
        Ok(Copier { cfg, ledger, dest, recent: Recent::default(), hedges: Default::default() })
    }

    fn spool_dir(&self, chunk: &str) -> PathBuf {
        paths::spool_chunk_dir(&self.cfg.spool.dir, &self.cfg.table.name, chunk)
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
            let src = paths::spool_part(&self.cfg.spool.dir, &self.cfg.table.name, &p.chunk_id, &p.rel_path());
            if !src.exists() {
                return Err(CopyError::Spool(format!("{} is missing; transform the chunk again (ferry requeue)", src.display())));
            }
            // The lease's epoch, not its attempt number: only the epoch never repeats (a released
            // or requeued task gets an attempt number again, and may find its old temp file).
            let tmp = paths::copy_temp(&lease.chunk_id, lease.epoch, i);
            self.ship_hedged(&dest, &src, &tmp, &landed, p).await?;
            work.bytes += p.bytes;
            work.records += p.records;
        }
        Ok(work)
    }

    /// [`Copier::ship`], hedged: if it runs past the hedge delay for its size, a second one
    /// starts on new connections to `<tmp>.h`; the first to land wins and the other is
    /// cancelled, its temp file removed. Without hedging (or before the delay) it is one ship.
    async fn ship_hedged(&self, dest: &Store, src: &Path, tmp: &str, landed: &str, p: &Part) -> Result<(), CopyError> {
        let started = std::time::Instant::now();
        let first = self.ship(dest, src, tmp, landed, p, dest.uploads_in_place());
        tokio::pin!(first);
        let res = match self.hedge_delay(p.bytes as u64) {
            None => first.await,
            Some(delay) => {
                tokio::select! {
                    r = &mut first => r,
                    _ = tokio::time::sleep(delay) => {
                        let hedge_tmp = paths::hedge_temp(tmp);
                        let hedge_dest = dest.isolated()?;
                        tracing::info!(chunk = %p.chunk_id, part = %p.rel_path(), after = ?delay, "copy is slow; starting a hedged upload");
                        self.hedges.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        metrics::counter!(names::HEDGES_STARTED).increment(1);
                        // Always to its own temp name, even where the first went in place.
                        let second = self.ship(&hedge_dest, src, &hedge_tmp, landed, p, false);
                        tokio::pin!(second);
                        // First success wins; a failure waits for the other one.
                        let (r, loser) = tokio::select! {
                            r = &mut first => match r {
                                Ok(()) => (Ok(()), Some((hedge_dest.clone(), hedge_tmp.clone()))),
                                Err(e) => {
                                    tracing::info!(error = %e, "first upload failed; the hedge carries on");
                                    ((&mut second).await, None)
                                }
                            },
                            r = &mut second => match r {
                                Ok(()) => {
                                    tracing::info!(chunk = %p.chunk_id, "the hedged upload won");
                                    metrics::counter!(names::HEDGES_WON).increment(1);
                                    (Ok(()), Some((dest.clone(), tmp.to_string())))
                                }
                                Err(e) => {
                                    tracing::info!(error = %e, "hedged upload failed; waiting for the first");
                                    ((&mut first).await, None)
                                }
                            },
                        };
                        if let Some((store, name)) = loser {
                            // The loser's future is dropped with this scope (cancelled); its
                            // temp file goes in the background, bounded by the store's deadlines.
                            tokio::spawn(async move {
                                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                                let _ = store.delete(&name).await;
                            });
                        }
                        r
                    }
                }
            }
        };
        if res.is_ok() {
            self.recent.record(started.elapsed().as_secs_f64() / (p.bytes.max(1) as f64));
        }
        res
    }

    /// When a hedge for a part of `bytes` starts: `hedge_multiple` x the recent p95 seconds per
    /// byte x `bytes` (16 MB/s assumed until 8 copies have been seen), at least `hedge_min`;
    /// None when hedging is off.
    fn hedge_delay(&self, bytes: u64) -> Option<std::time::Duration> {
        let c = &self.cfg.copy;
        if c.hedge_multiple <= 0.0 {
            return None;
        }
        let est = match self.recent.p95() {
            Some(p95) => std::time::Duration::from_secs_f64((p95 * bytes as f64 * c.hedge_multiple).min(86_400.0)),
            // No history yet (a fresh process, a `--once` run from cron): assume a modest
            // 16 MB/s, so a stuck first upload is hedged in seconds, not at its deadline.
            None => std::time::Duration::from_secs_f64(bytes as f64 / 16e6 * c.hedge_multiple),
        };
        Some(est.max(c.hedge_min.0))
    }

    /// One upload of a part to `tmp` under the deadline and the watchdog, verified against
    /// what transform recorded, then renamed (without overwrite) to `landed`. With `in_place`
    /// (S3, where an upload appears whole or not at all) it goes straight to `landed`, and a
    /// mismatching hash is caught before the upload completes.
    async fn ship(&self, dest: &Store, src: &Path, tmp: &str, landed: &str, p: &Part, in_place: bool) -> Result<(), CopyError> {
        let progress = Progress::default();
        let c = &self.cfg.copy;
        let target = if in_place { landed } else { tmp };
        let what = format!("copy of {} to {}", src.display(), dest.url(target));
        let upload = dest.upload_checked(src, target, Some(&p.content_hash), progress.clone());
        let res = watched(&what, c.deadline.0, c.stall_timeout.0, progress, upload).await;
        let (n, hash) = match res {
            Ok(v) => v,
            Err(e) => {
                if !in_place {
                    let _ = dest.delete(tmp).await;
                }
                // Our own upload's target vanished mid-way (another process's gc, an operator):
                // worth another attempt, not a quarantine.
                if e.is_not_found() {
                    return Err(CopyError::Verify(format!("{what}: the upload's target vanished ({e})")));
                }
                return Err(e.into());
            }
        };
        if n as i64 != p.bytes || hash != p.content_hash {
            if !in_place {
                dest.delete(tmp).await?;
            }
            // These are the bytes read from the spool file: it is not what transform wrote, and
            // no retry of the copy changes that.
            return Err(CopyError::Spool(format!(
                "{}: holds {n} bytes with hash {hash}, transform recorded {} bytes with hash {}; transform the chunk again (ferry requeue --stage transform)",
                src.display(),
                p.bytes,
                p.content_hash
            )));
        }
        if !in_place && !dest.rename_noreplace(tmp, landed).await? {
            // Another attempt (or our hedge) landed it first; keep theirs if it is right.
            dest.delete(tmp).await?;
            if dest.hash(landed).await?.1 != p.content_hash {
                return Err(CopyError::Verify(format!("{landed} exists with other content")));
            }
        }
        Ok(())
    }

    /// Hedged uploads started by this process.
    pub fn hedges(&self) -> u64 {
        self.hedges.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Removes spool directories of chunks already copied (left by a crash between the
    /// commit and the removal), and temp files in the destination older than a deadline plus two leases.
    pub async fn gc(&self) -> Result<(), CopyError> {
        for chunk in self.ledger.done_chunks(Stage::Copy).await? {
            let d = self.spool_dir(&chunk);
            if d.exists() {
                std::fs::remove_dir_all(&d).map_err(|source| CopyError::Io { path: d.display().to_string(), source })?;
            }
        }
        let cutoff = self.cfg.temp_cutoff_ms(self.ledger.now_ms());
        self.dest.gc(paths::COPY_TEMP_DIR, cutoff).await?;
        let spool = Store::from_url(&self.cfg.spool.dir.to_string_lossy())?;
        spool.remove_stale_temps(&self.cfg.table.name, cutoff).await?;
        Ok(())
    }

    /// The after-commit hook: the chunk is recorded as copied, so its spool files can go.
    /// Done here and now (a few unlinks on local disk), not in a background task that a
    /// `--once` run could exit before.
    pub fn remove_spool(&self, lease: &Lease) {
        let d = self.spool_dir(&lease.chunk_id);
        if let Err(e) = std::fs::remove_dir_all(&d) {
            tracing::warn!(dir = %d.display(), error = %e, "cannot remove spool files; gc will");
        }
    }
}
