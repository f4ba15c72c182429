//! copy: local spool -> destination. Small on purpose: it only moves finished Parquet files
//! and proves they arrived whole.
//!
//! # Publish protocol (per part file of a chunk)
//!
//! ```text
//!  spool/<table>/<chunk>/<k=v>/part-<chunk>.parquet
//!     │ upload under a deadline and a no-progress watchdog, hashing every byte
//!     ▼
//!  dest/_ferry/tmp/<chunk>.<epoch>.<i>.<try>     (the lease's epoch and the try: never shared)
//!     │ size and hash equal what transform recorded? else delete, quarantine (the spool is bad)
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
//! # Retries inside an attempt
//!
//! A part whose upload fails on a transient error (a reset, a connection that hung until its
//! call timeout, a reply that never came) is first looked for (an ambiguous failure may have
//! landed it), then sent again, up to `copy.retries` times with capped, jittered backoff, to a
//! new temp name (on S3, where uploads go in place, to the landed key again) and on a new
//! connection. A fault on one connection costs one retry of one part,
//! not an attempt of the chunk. The temp file of a try that failed is removed at once, on a new
//! connection and bounded by the call timeout; what cannot be removed is left to gc. Every byte
//! a try sent that did not land is the attempt's redone work (`attempts.redone_bytes`).
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

use ferry_common::error::{Classified, ErrorClass};
use ferry_common::paths;
use ferry_ledger::{Lease, Ledger, Part, Stage, Tally, Work};
use ferry_runtime::config::Config;
use ferry_runtime::observe::emit;
use ferry_runtime::sweeps::{Places, Sweep};
use ferry_runtime::{Failure, StageError};
use ferry_storage::{Backoff, Progress, Store, watched};

/// The copy stage's error: the kinds every stage shares ([`StageError`], with the one rule
/// for retry-or-not) and copy's own.
pub type CopyError = StageError<CopyFailure>;

/// What only copy meets.
#[derive(Debug, thiserror::Error)]
pub enum CopyFailure {
    /// What transform left in the spool is gone or wrong; the chunk needs a new transform.
    #[error("spool: {0}")]
    Spool(String),
    /// What arrived differs from what was sent; a retry may get it right.
    #[error("verify: {0}")]
    Verify(String),
}

impl Failure for CopyFailure {
    const STORE: &'static str = "destination";
    fn class(&self) -> ErrorClass {
        match self {
            CopyFailure::Spool(_) => ErrorClass::Permanent,
            CopyFailure::Verify(_) => ErrorClass::Transient,
        }
    }
    fn store(&self) -> Option<&'static str> {
        match self {
            CopyFailure::Verify(_) => Some(Self::STORE),
            CopyFailure::Spool(_) => None,
        }
    }
}

/// Parts of one chunk in flight at once where a close waits on the store (HDFS): enough to
/// overlap the waits of a chunk's partitions, few enough to keep a chunk's connections few.
const PARTS_AT_ONCE: usize = 4;
/// The most of its file one upload holds in memory (HDFS sends pieces of up to 4 MiB, no
/// larger than the file, at least 64 KiB; see `ferry_storage::hdfs`).
const UPLOAD_HOLDS: u64 = 4 << 20;

/// What one upload of a part of `bytes` holds of its file in memory at once.
fn holds(bytes: i64) -> u64 {
    u64::try_from(bytes).unwrap_or(0).clamp(64 << 10, UPLOAD_HOLDS)
}

pub struct Copier {
    cfg: Config,
    /// `copy.bytes_in_flight`, in KiB: every upload (first tries, retries, hedges) takes
    /// [`holds`] of it before it starts, and gives it back when it ends, or sooner where the
    /// store has every byte before the file is closed (HDFS, whose close waits on the
    /// NameNode; see [`Progress::holding`]).
    room: Arc<tokio::sync::Semaphore>,
    room_kib: u32,
    ledger: Ledger,
    dest: Store,
    recent: Recent,
    hedges: std::sync::atomic::AtomicU64,
    hedges_won: std::sync::atomic::AtomicU64,
}

/// What one upload sent, added to the attempt's tally when it ends in any way (also when its
/// future is dropped: a hedge that lost); `kept` once its bytes are the ones that landed.
struct Sent<'a> {
    progress: Progress,
    tally: &'a Tally,
    kept: bool,
}

impl Drop for Sent<'_> {
    fn drop(&mut self) {
        let n = self.progress.bytes();
        self.tally.moved(n);
        if self.kept {
            self.tally.kept(n);
        }
    }
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
    /// The destination store, as the chunks reach it.
    pub fn destination(&self) -> &Store {
        &self.dest
    }

    pub fn new(cfg: Config, ledger: Ledger) -> Result<Copier, CopyError> {
        let dest = Store::open(&cfg.destination.url, &cfg.destination.store)?;
        let room_kib = u32::try_from(cfg.copy.bytes_in_flight.0 >> 10).unwrap_or(u32::MAX).max(1);
        Ok(Copier {
            cfg,
            ledger,
            dest,
            room: Arc::new(tokio::sync::Semaphore::new(room_kib as usize)),
            room_kib,
            recent: Recent::default(),
            hedges: Default::default(),
            hedges_won: Default::default(),
        })
    }

    fn spool_dir(&self, chunk: &str) -> PathBuf {
        paths::spool_chunk_dir(&self.cfg.spool.dir, &self.cfg.table.name, chunk)
    }

    pub async fn chunk(self: Arc<Self>, lease: Lease) -> Result<Work, CopyError> {
        let parts = self.ledger.parts(&lease.chunk_id).await?;
        // The chunk's work is all of its parts, also those an earlier attempt landed.
        let mut work =
            Work { bytes: parts.iter().map(|p| p.bytes).sum(), records: parts.iter().map(|p| p.records).sum(), ..Work::default() };
        // Its own connections: a hung one holds back this chunk only.
        let dest = self.dest.isolated()?;
        // Where closing a file waits on the store, parts go side by side and their waits
        // overlap, as long as together they hold no more than one upload does (an upload holds
        // up to UPLOAD_HOLDS of its file): small parts overlap, large ones still go one by one,
        // so a chunk in flight holds what it did when parts went one at a time.
        let at_once = if dest.capabilities().slow_close { PARTS_AT_ONCE } else { 1 };
        let holds = |p: &Part| holds(p.bytes);
        let mut next = parts.iter().enumerate().peekable();
        let mut running = futures::stream::FuturesUnordered::new();
        let mut holding = 0u64;
        let mut failed = None;
        loop {
            // After a failure no new part starts; those under way finish (their temp files
            // removed by their own ends), and the first failure is the attempt's.
            while failed.is_none() && running.len() < at_once {
                let Some(&(i, p)) = next.peek() else { break };
                if !running.is_empty() && holding + holds(p) > UPLOAD_HOLDS {
                    break;
                }
                next.next();
                holding += holds(p);
                let (held, part) = (holds(p), self.part(&dest, &lease, i, p));
                running.push(async move { (held, part.await) });
            }
            match futures::StreamExt::next(&mut running).await {
                None => break,
                Some((held, r)) => {
                    holding -= held;
                    if let Err(e) = r {
                        failed.get_or_insert(e);
                    }
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        work.redone_bytes = lease.tally.redone_bytes();
        Ok(work)
    }

    /// Part `i` of a chunk, landed unless an earlier attempt did.
    async fn part(&self, dest: &Store, lease: &Lease, i: usize, p: &Part) -> Result<(), CopyError> {
        let landed = landed_path(&self.cfg.table.name, p);
        if self.landed_whole(dest, &landed, p).await? {
            return Ok(()); // an earlier attempt landed it
        }
        let src = paths::spool_part(&self.cfg.spool.dir, &self.cfg.table.name, &p.chunk_id, &p.rel_path());
        if !src.exists() {
            return Err(CopyError::Stage(CopyFailure::Spool(format!(
                "{} is missing; transform the chunk again (ferry requeue)",
                src.display()
            ))));
        }
        self.ship_retrying(dest, lease, i, &src, &landed, p).await
    }

    /// Whether `landed` holds the part whole. A file there with other bytes is removed.
    async fn landed_whole(&self, dest: &Store, landed: &str, p: &Part) -> Result<bool, CopyError> {
        if let Some(h) = dest.head(landed).await? {
            if h.size as i64 == p.bytes && dest.hash(landed).await?.1 == p.content_hash {
                return Ok(true);
            }
            dest.delete(landed).await?;
        }
        Ok(false)
    }

    /// [`Copier::ship_hedged`], sent again after a transient failure up to `copy.retries` times,
    /// each time to a new temp name (the try number is in it) and on a new connection (a hung
    /// HDFS client is retired by the call that gave up on it; S3 never reuses a connection that
    /// failed). The attempt fails only when every try did.
    async fn ship_retrying(&self, dest: &Store, lease: &Lease, part: usize, src: &Path, landed: &str, p: &Part) -> Result<(), CopyError> {
        let retries = self.cfg.copy.retries;
        let tally = lease.tally.part();
        let mut backoff = Backoff::new(std::time::Duration::from_millis(250), std::time::Duration::from_secs(5));
        let mut try_no = 0u32;
        loop {
            let tmp = paths::copy_temp(&lease.chunk_id, lease.epoch, part, try_no);
            // What the part's own tally gains meanwhile is this try's (other parts may be
            // under way beside it, counted in the attempt's tally only).
            let before = tally.moved_bytes();
            match self.ship_hedged(dest, src, &tmp, landed, p, &tally).await {
                Ok(()) => return Ok(()),
                Err(e) if try_no < retries && e.class() == ErrorClass::Transient => {
                    // An ambiguous failure (a lost reply) may have landed it after all: then
                    // what this try sent is what landed, not redone work.
                    if matches!(self.landed_whole(dest, landed, p).await, Ok(true)) {
                        let sent = (tally.moved_bytes() - before).clamp(0, p.bytes);
                        tally.kept(sent as u64);
                        return Ok(());
                    }
                    try_no += 1;
                    let d = backoff.next_delay();
                    tracing::warn!(
                        chunk = %p.chunk_id, part = %p.rel_path(), retry = try_no, of = retries, error = %e, retry_in = ?d,
                        "part copy failed; sending it again on a new connection"
                    );
                    emit::request_retries(Stage::Copy).increment(1);
                    tokio::time::sleep(d).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// [`Copier::ship`], hedged: if it runs past the hedge delay for its size, a second one
    /// starts on new connections to `<tmp>.h`; the first to land wins and the other is
    /// cancelled, its temp file removed before this returns (a `--once` run never exits
    /// ahead of it). Without hedging (or before the delay) it is one ship.
    async fn ship_hedged(&self, dest: &Store, src: &Path, tmp: &str, landed: &str, p: &Part, tally: &Tally) -> Result<(), CopyError> {
        // Room in the byte budget first: a part waiting for it is not a slow upload (its hedge
        // clock and its speed sample start once it goes).
        let room = self.room(p).await;
        let started = std::time::Instant::now();
        let in_place = dest.uploads_in_place();
        let (res, loser) = match self.hedge_delay(p.bytes as u64) {
            None => (self.ship(dest, src, tmp, landed, p, in_place, tally, room).await, None),
            Some(delay) => self.race(dest, src, (tmp, landed), p, tally, delay, room).await,
        };
        // Both uploads' futures are gone by now (the loser cancelled): its temp file goes.
        if let Some(name) = loser {
            self.remove_temp(&name).await;
        }
        if res.is_ok() {
            self.recent.record(started.elapsed().as_secs_f64() / (p.bytes.max(1) as f64));
        }
        res
    }

    /// The first ship, and after `delay` a hedge beside it. Returns the outcome and the temp
    /// name of a loser that may have left a file.
    #[allow(clippy::too_many_arguments)]
    async fn race(
        &self,
        dest: &Store,
        src: &Path,
        (tmp, landed): (&str, &str),
        p: &Part,
        tally: &Tally,
        delay: std::time::Duration,
        room: tokio::sync::OwnedSemaphorePermit,
    ) -> (Result<(), CopyError>, Option<String>) {
        let in_place = dest.uploads_in_place();
        let first = self.ship(dest, src, tmp, landed, p, in_place, tally, room);
        tokio::pin!(first);
        tokio::select! {
            r = &mut first => return (r, None),
            _ = tokio::time::sleep(delay) => {}
        }
        let hedge_tmp = paths::hedge_temp(tmp);
        let Ok(hedge_dest) = dest.isolated() else { return ((&mut first).await, None) };
        tracing::info!(chunk = %p.chunk_id, part = %p.rel_path(), after = ?delay, "copy is slow; starting a hedged upload");
        self.hedges.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        emit::hedges_started().increment(1);
        // Always to its own temp name, even where the first went in place; with room of its
        // own (it reads the file again).
        let second = async {
            let room = self.room(p).await;
            self.ship(&hedge_dest, src, &hedge_tmp, landed, p, false, tally, room).await
        };
        tokio::pin!(second);
        // First success wins; a failure waits for the other one.
        tokio::select! {
            r = &mut first => match r {
                Ok(()) => (Ok(()), Some(hedge_tmp.clone())),
                Err(e) => {
                    tracing::info!(error = %e, "first upload failed; the hedge carries on");
                    ((&mut second).await, None)
                }
            },
            r = &mut second => match r {
                Ok(()) => {
                    tracing::info!(chunk = %p.chunk_id, "the hedged upload won");
                    self.hedges_won.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    emit::hedges_won().increment(1);
                    (Ok(()), (!in_place).then(|| tmp.to_string()))
                }
                Err(e) => {
                    tracing::info!(error = %e, "hedged upload failed; waiting for the first");
                    ((&mut first).await, None)
                }
            },
        }
    }

    /// Room for one upload of `p` in `copy.bytes_in_flight`, held until dropped (a part larger
    /// than the whole budget waits for all of it, and goes alone): its size, up to two pieces
    /// (one read while the one before it is still on its way: an HDFS writer queues up to
    /// ~6 MB of packets until the DataNodes acknowledge them).
    async fn room(&self, p: &Part) -> tokio::sync::OwnedSemaphorePermit {
        let holds = u64::try_from(p.bytes).unwrap_or(0).clamp(64 << 10, 2 * UPLOAD_HOLDS);
        let kib = u32::try_from(holds.div_ceil(1024)).unwrap_or(u32::MAX).min(self.room_kib);
        self.room.clone().acquire_many_owned(kib).await.expect("the budget is never closed")
    }

    /// Removes a temp file of a try that failed or lost, on a new connection (the try's own may
    /// be the hung one), bounded by the store's call timeout. Never fails: what cannot be
    /// removed now is logged and left to gc; it never costs the part that landed.
    async fn remove_temp(&self, name: &str) {
        let bound = self.cfg.destination.store.call_timeout.0;
        for _ in 0..2 {
            let Ok(store) = self.dest.isolated() else { break };
            match tokio::time::timeout(bound, store.delete(name)).await {
                Ok(Ok(())) => return,
                Ok(Err(e)) => tracing::debug!(file = %store.url(name), error = %e, "cannot remove a temp file"),
                Err(_) => tracing::debug!(file = %store.url(name), "removing a temp file got no answer"),
            }
        }
        tracing::warn!(file = %self.dest.url(name), "cannot remove a temp file now; gc will");
    }

    /// When a hedge for a part of `bytes` starts: `hedge_multiple` x the recent p95 seconds per
    /// byte x `bytes` (16 MB/s assumed until 8 copies have been seen), at least `hedge_min` (see
    /// [`Config::copy_hedge_min`]);
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
        Some(est.max(self.cfg.copy_hedge_min()))
    }

    /// One upload of a part to `tmp` under the deadline and the watchdog, verified against
    /// what transform recorded, then renamed (without overwrite) to `landed`. With `in_place`
    /// (S3, where an upload appears whole or not at all) it goes straight to `landed`, and a
    /// mismatching hash is caught before the upload completes. What it sends is added to
    /// `tally`, and kept only if this upload is the one that landed.
    #[allow(clippy::too_many_arguments)]
    async fn ship(
        &self,
        dest: &Store,
        src: &Path,
        tmp: &str,
        landed: &str,
        p: &Part,
        in_place: bool,
        tally: &Tally,
        room: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<(), CopyError> {
        let progress = Progress::holding(room);
        let mut sent = Sent { progress: progress.clone(), tally, kept: false };
        let c = &self.cfg.copy;
        let target = if in_place { landed } else { tmp };
        let what = format!("copy of {} to {}", src.display(), dest.url(target));
        let upload = dest.upload_checked(src, target, Some(&p.content_hash), progress.clone());
        let res = watched(&what, c.deadline.0, c.stall_timeout.0, progress, upload).await;
        let (n, hash) = match res {
            Ok(v) => v,
            Err(e) => {
                if !in_place {
                    self.remove_temp(tmp).await;
                }
                // Our own upload's target vanished mid-way (another process's gc, an operator):
                // worth another attempt, not a quarantine.
                if e.is_not_found() {
                    return Err(CopyError::Stage(CopyFailure::Verify(format!("{what}: the upload's target vanished ({e})"))));
                }
                return Err(e.into());
            }
        };
        if n as i64 != p.bytes || hash != p.content_hash {
            if !in_place {
                self.remove_temp(tmp).await;
            }
            // These are the bytes read from the spool file: it is not what transform wrote, and
            // no retry of the copy changes that.
            return Err(CopyError::Stage(CopyFailure::Spool(format!(
                "{}: holds {n} bytes with hash {hash}, transform recorded {} bytes with hash {}; transform the chunk again (ferry requeue --stage transform)",
                src.display(),
                p.bytes,
                p.content_hash
            ))));
        }
        if !in_place {
            let renamed = match dest.rename_noreplace(tmp, landed).await {
                Ok(r) => r,
                Err(e) => {
                    // mkdirs or rename failed: the temp file must not outlive this try.
                    self.remove_temp(tmp).await;
                    // The temp file vanished before its rename (a gc with a cut-off shorter than
                    // this attempt, an operator): another attempt, not a quarantine.
                    if e.is_not_found() {
                        return Err(CopyError::Stage(CopyFailure::Verify(format!("{what}: the uploaded temp file vanished ({e})"))));
                    }
                    return Err(e.into());
                }
            };
            if !renamed {
                // Another attempt (or our hedge) landed it first; keep theirs if it is right.
                self.remove_temp(tmp).await;
                if dest.hash(landed).await?.1 != p.content_hash {
                    return Err(CopyError::Stage(CopyFailure::Verify(format!("{landed} exists with other content"))));
                }
                return Ok(());
            }
        }
        sent.kept = true;
        Ok(())
    }

    /// Hedged uploads started by this process.
    pub fn hedges(&self) -> u64 {
        self.hedges.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Hedged uploads that landed first.
    pub fn hedges_won(&self) -> u64 {
        self.hedges_won.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Removes spool directories of chunks already copied (left by a crash between the
    /// commit and the removal, or by a transform whose lease was lost mid-write), and temp
    /// files in the destination and the spool, all older than a deadline plus two leases.
    pub async fn gc(&self) -> Result<(), CopyError> {
        let cutoff = self.cfg.temp_cutoff_ms(self.ledger.now_ms());
        let spool = Store::from_url(&self.cfg.spool.dir.to_string_lossy())?;
        let at = Places {
            cfg: &self.cfg,
            ledger: &self.ledger,
            staging: None,
            destination: Some(&self.dest),
            spool: Some(&spool),
            meta_dirs: &[],
        };
        // Each place on its own: one that fails does not keep the others.
        let mut done = Vec::new();
        for sweep in [Sweep::SpentSpool, Sweep::AbandonedUploads, Sweep::SpoolTemps] {
            done.push(sweep.run(&at, cutoff).await);
        }
        ferry_storage::combine(done)?;
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
