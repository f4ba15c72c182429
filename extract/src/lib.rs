//! extract: source -> staging. Takes finished source files, registers them in the ledger,
//! splits them at record boundaries into chunks, and stages each chunk for transform.
//!
//! A file is finished when its mtime is older than `source.settle` (a writer still appending
//! keeps bumping it) or, if `source.marker` is set, when `<file><marker>` exists. Staged chunks
//! are written under a temp name and renamed, so a crash leaves whole chunks or none; chunk ids
//! are derived from the file's content hash, so a re-run after a crash names the same chunks.
//!
//! A file under a name the ledger has never seen is read once: hashed while it is split. Its
//! chunks are staged under names made from the file's uri, size and mtime and each chunk's own
//! hash (the same names whenever the same file is split again), and get their ids from the
//! whole file's hash when it is registered after the read. A file seen before is hashed first,
//! as bytes already taken in must be recognised before anything is staged again.

use std::sync::Arc;
use std::time::Duration;

use ferry_common::error::{Classified, ConfigError, ErrorClass};
use ferry_common::paths;
use ferry_formats::{Piece, SplitError};
use ferry_ledger::{FileState, Ledger, NewChunk, NewSourceFile, RangeKind, Recorded, Stage, chunk_id};
use ferry_runtime::config::{Config, Disposition, Versions};
use ferry_runtime::observe::{Health, emit};
use ferry_runtime::runner::{human_bytes, progress_bar};
use ferry_runtime::sweeps::{Places, Sweep};
use ferry_runtime::{Failure, StageError};
use ferry_storage::{Entry, Store};

/// The extract stage's error: the kinds every stage shares ([`StageError`], with the one rule
/// for retry-or-not). A panic while splitting one file (`Panicked`) is a bug met by that file:
/// extract quarantines the file with the panic's text and the other files go on.
pub type ExtractError = StageError<ExtractFailure>;

/// Extract meets nothing the other stages do not.
#[derive(Debug, thiserror::Error)]
pub enum ExtractFailure {
    /// The bytes of an earlier version are back, unchanged, but no longer cut into the chunks
    /// recorded for that version (the source's format options changed since it was first
    /// read): it cannot be brought back until they are what they were. Looked at again every
    /// pass, and counted as a failed file meanwhile.
    #[error("{0}")]
    CannotRecut(String),
}

impl Failure for ExtractFailure {
    /// Extract passes over files in a loop of its own, not the chunk loop's breaker.
    const STORE: &'static str = "staging";
    fn class(&self) -> ErrorClass {
        match self {
            ExtractFailure::CannotRecut(_) => ErrorClass::Transient,
        }
    }
}

type Result<T, E = ExtractError> = std::result::Result<T, E>;

/// Files seen by one pass over the source.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    pub chunked: u64,
    pub chunks: u64,
    pub records: i64,
    pub bytes: u64,
    pub quarantined: u64,
    pub unfinished: u64,
    pub skipped: u64,
    /// Files that could not be extracted now (a store or the ledger failing); retried.
    pub failed: u64,
    /// Chunks a run that was stopped part-way through their file had staged already: found
    /// under their names, not written again.
    pub reused: u64,
    /// Files that held bytes taken in before under the same name (`versions = "keep"`): not
    /// taken in again, and counted in the ledger (`ferry status` shows them).
    pub arrived_again: u64,
    /// The last such failure.
    pub last_error: Option<String>,
}

impl Pass {
    fn add(&mut self, o: &Pass) {
        self.chunked += o.chunked;
        self.chunks += o.chunks;
        self.records += o.records;
        self.bytes += o.bytes;
        self.quarantined += o.quarantined;
        self.unfinished += o.unfinished;
        self.skipped += o.skipped;
        self.failed += o.failed;
        self.reused += o.reused;
        self.arrived_again += o.arrived_again;
        if o.last_error.is_some() {
            self.last_error.clone_from(&o.last_error);
        }
    }

    /// Why a run made no progress, if it made none because of failures.
    pub fn stalled(&self) -> Option<String> {
        (self.chunked == 0 && self.failed > 0)
            .then(|| format!("{} files could not be extracted; the last error: {}", self.failed, self.last_error.as_deref().unwrap_or("?")))
    }
}

pub struct Extractor {
    cfg: Config,
    ledger: Ledger,
    source: Store,
    staging: Store,
    glob: globset::GlobMatcher,
    health: Arc<Health>,
    /// Chunk buffers, reused from file to file (see `ferry_formats::split`).
    buffers: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
    /// Files read and split at once: `extract.concurrency`.
    cpu: Arc<tokio::sync::Semaphore>,
    /// MiB of chunks being written to a remote staging store (see [`Writes`]).
    in_flight: Arc<tokio::sync::Semaphore>,
    /// When staging was last swept for crashed writers' temp files (see [`TEMP_SWEEP_EVERY`]).
    swept: std::sync::Mutex<Option<std::time::Instant>>,
    /// Files kept in the source (`disposition = "keep"`) the ledger says are taken in, by name,
    /// with the size, mtime and change token they were taken in at. A pass skips those without
    /// asking the ledger again: under `--watch` a source that keeps a week of files would
    /// otherwise cost one ledger read per file every pass (most of an idle extract's CPU).
    /// Only `chunked` files, whose state nothing turns back, and only with a change token (the
    /// proof that the bytes are the same); names gone from the source are dropped each pass.
    taken: std::sync::Mutex<std::collections::HashMap<String, (u64, i64, String)>>,
}

/// How often a running extract sweeps staging for temp files crashed writers left: at its first
/// pass, then at most this often. The sweep lists the whole staged table, which grows with
/// history (a week of chunks); every pass (every 2 s under `--watch`) would make a NameNode or
/// S3 LIST load that grows with it, for files that only a crash leaves. `ferry gc` sweeps too.
pub const TEMP_SWEEP_EVERY: Duration = Duration::from_secs(3600);

impl Extractor {
    pub fn new(cfg: Config, ledger: Ledger) -> Result<Extractor> {
        let source = Store::open(&cfg.source.url, &cfg.source.store)?;
        let staging = Store::open(&cfg.staging.url, &cfg.staging.store)?;
        let glob = globset::GlobBuilder::new(&cfg.source.glob)
            .literal_separator(false)
            .build()
            .map_err(|e| ConfigError::new("source.glob", e.to_string()))?
            .compile_matcher();
        let cpu = Arc::new(tokio::sync::Semaphore::new(cfg.extract.concurrency.max(1)));
        let in_flight = Arc::new(tokio::sync::Semaphore::new(Writes::BUDGET_MIB));
        Ok(Extractor {
            cfg,
            ledger,
            source,
            staging,
            glob,
            health: Health::new(Duration::from_secs(900)),
            buffers: Default::default(),
            cpu,
            in_flight,
            swept: std::sync::Mutex::new(None),
            taken: Default::default(),
        })
    }

    /// The stores extract works on, by the names its errors give them, with their probes
    /// (what a `--watch` stage checks at start).
    pub fn stores(&self) -> ferry_runtime::runner::Stores {
        let (source, staging) = (self.source.clone().prober("source"), self.staging.clone().prober("staging"));
        ferry_runtime::runner::Stores {
            names: vec![("source", self.cfg.source.url.clone()), ("staging", self.cfg.staging.url.clone())],
            probe: Some(ferry_runtime::runner::StoreProbe(Arc::new(move |name| source(name).or_else(|| staging(name))))),
        }
    }

    /// Reports progress to `health` (`/healthz`, the systemd watchdog).
    pub fn with_health(mut self, health: Arc<Health>) -> Extractor {
        self.health = health;
        self
    }

    /// One pass over the source: every finished, new file is chunked and recorded.
    pub async fn pass(&self) -> Result<Pass> {
        let mut pass = Pass::default();
        let sweep = {
            let mut swept = self.swept.lock().unwrap_or_else(|e| e.into_inner());
            let due = swept.is_none_or(|t| t.elapsed() >= TEMP_SWEEP_EVERY);
            if due {
                *swept = Some(std::time::Instant::now());
            }
            due
        };
        if sweep {
            let cutoff = self.cfg.temp_cutoff_ms(self.ledger.now_ms());
            let at = Places {
                cfg: &self.cfg,
                ledger: &self.ledger,
                staging: Some(&self.staging),
                destination: None,
                spool: None,
                meta_dirs: &[],
            };
            ferry_runtime::runner::cleanup(Sweep::StagingTemps.run(&at, cutoff)).await;
        }
        let listing = self.source.list_source("").await?;
        let entries = listing.entries;
        pass.failed += self.settle_asides(&entries).await;
        // Hidden and `_`-prefixed names are what Hadoop, Spark and Hive readers skip too:
        // `_SUCCESS`, `.part-0.crc`, `_temporary/` of a job still writing.
        let hidden = |rel: &str| rel.split('/').any(|c| c.starts_with('.') || c.starts_with('_'));
        // An entry that cannot be taken in as it is: set aside, in the ledger once (the walk
        // warns every pass); the others go on.
        for (name, why) in &listing.set_aside {
            if hidden(name) || !self.glob.is_match(name) {
                continue;
            }
            let uri = self.source.url(name);
            let reason = format!("{name}: {why}");
            if self.ledger.set_aside_entry(&uri, &reason).await? {
                tracing::error!(file = %name, reason = %why, "set aside: an entry of the source that cannot be taken in");
                pass.quarantined += 1;
            }
        }
        let names: std::collections::HashSet<&str> = entries.iter().map(|e| e.rel.as_str()).collect();
        self.taken.lock().unwrap_or_else(|e| e.into_inner()).retain(|rel, _| names.contains(rel.as_str()));
        let now = self.ledger.now_ms();
        let mut ready = Vec::new();
        for e in &entries {
            let is_marker = self.cfg.source.marker.as_deref().is_some_and(|m| e.rel.ends_with(m));
            if hidden(&e.rel) || is_marker || !self.glob.is_match(&e.rel) {
                continue;
            }
            let finished = match &self.cfg.source.marker {
                Some(m) => names.contains(format!("{}{m}", e.rel).as_str()),
                None => now - e.mtime_ms >= self.cfg.source.settle.0.as_millis() as i64,
            };
            if !finished {
                pass.unfinished += 1;
                continue;
            }
            ready.push(e);
        }
        emit::files("unfinished").increment(pass.unfinished);
        let bar = if ready.is_empty() { None } else { progress_bar("extract", "files") };
        if let Some(b) = &bar {
            b.set_length(ready.len() as u64);
        }
        self.health.set_idle(ready.is_empty());
        // A few files at once: reading, hashing and writing chunks to a remote staging store
        // are mostly waiting (an HDFS close alone waits for the DataNode's block report).
        // Files of one size go one after another in name order: two copies of the same bytes
        // under two names then always get the same decision (the first name taken in, the
        // other set aside naming it), whatever the timing.
        use futures::{FutureExt, StreamExt};
        ready.sort_by(|a, b| (a.size, &a.rel).cmp(&(b.size, &b.rel)));
        let mut groups: Vec<Vec<&Entry>> = Vec::new();
        for e in ready {
            match groups.last_mut() {
                Some(g) if g[0].size == e.size => g.push(e),
                _ => groups.push(vec![e]),
            }
        }
        let mut files = futures::stream::iter(groups)
            .map(|group| {
                Box::pin(futures::stream::iter(group).then(|e| async move {
                    let mut p = Pass::default();
                    // A panic is a bug met by this file: it fails this file (looked at again
                    // next pass, as any file that failed), not the pass. What it staged is
                    // found again by the next try (the names are fixed by the bytes) or swept
                    // as a temp file.
                    let r = match std::panic::AssertUnwindSafe(self.file(e, &mut p)).catch_unwind().await {
                        Ok(r) => r,
                        Err(panic) => Err(ExtractError::Panicked(ferry_runtime::runner::panic_message(&panic))),
                    };
                    (e, r, p)
                }))
            })
            // Files past their split wait for writes to a remote staging store without a core.
            .flatten_unordered(self.cfg.extract.concurrency.max(1) * 8);
        while let Some((e, r, p)) = files.next().await {
            pass.add(&p);
            self.health.progressed();
            let outcome = match &r {
                Err(_) => "failed",
                Ok(()) if p.chunked > 0 => "chunked",
                Ok(()) if p.quarantined > 0 => "quarantined",
                Ok(()) if p.unfinished > 0 => "unfinished",
                Ok(()) if p.arrived_again > 0 => "arrived_again",
                Ok(()) => "skipped",
            };
            emit::files(outcome).increment(1);
            if p.chunked > 0 {
                emit::chunks("extract", "done").increment(p.chunks);
                emit::records("extract").increment(p.records.max(0) as u64);
                emit::bytes("extract").increment(p.bytes);
            }
            if let Some(b) = &bar {
                b.inc(1);
                b.set_message(format!("{} chunked, {} chunks, {}", pass.chunked, pass.chunks, human_bytes(pass.bytes as f64)));
            }
            match r {
                Ok(()) => {}
                // One unreadable file must not stop the others; it is retried next pass.
                Err(err @ ExtractError::Panicked(_)) => {
                    tracing::error!(file = ?e.rel, error = %err, "extract panicked on this file (a bug in Ferry); the others go on, and it is tried again next pass");
                    pass.failed += 1;
                    pass.last_error = Some(format!("{}: {err}", e.rel));
                }
                Err(err) if err.is_transient() => {
                    tracing::warn!(file = ?e.rel, error = %err, "cannot extract now; will retry");
                    pass.failed += 1;
                    pass.last_error = Some(format!("{}: {err}", e.rel));
                }
                // A file that cannot be read at all (permissions, gone since the listing) is
                // skipped with its reason, and looked at again next pass; the others go on.
                // Without its bytes there is no hash to record it under in the ledger.
                Err(err @ (ExtractError::Io { .. } | ExtractError::Storage(_))) if !err.is_config() => {
                    tracing::warn!(file = ?e.rel, error = %err, "skipping a file that cannot be read");
                    pass.failed += 1;
                    pass.last_error = Some(format!("{}: {err}", e.rel));
                }
                Err(err) => return Err(err),
            }
        }
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        Ok(pass)
    }

    async fn file(&self, e: &Entry, pass: &mut Pass) -> Result<()> {
        let uri = self.source.url(&e.rel);
        // Skipped unread only when nothing can have rewritten it (see `Entry::change_token`);
        // otherwise read, so no bytes are skipped or deleted without being looked at.
        let replace = self.cfg.source.versions == Versions::Replace;
        let same = |t: &(u64, i64, String)| Some((t.0, t.1, t.2.as_str())) == e.change_token.as_deref().map(|c| (e.size, e.mtime_ms, c));
        if self.taken.lock().unwrap_or_else(|e| e.into_inner()).get(&e.rel).is_some_and(same) {
            pass.skipped += 1;
            return Ok(());
        }
        if let Some(known) = self.ledger.find_file(&uri, e.size as i64, e.mtime_ms, e.change_token.as_deref(), replace).await?
            && known.state != FileState::Registered
        {
            if let (FileState::Chunked, Disposition::Keep, Some(token)) = (known.state, self.cfg.source.disposition, &e.change_token) {
                self.taken.lock().unwrap_or_else(|e| e.into_inner()).insert(e.rel.clone(), (e.size, e.mtime_ms, token.clone()));
            }
            // Never an undone correction: the old bytes put back changed the token, and a
            // revival cut short by a crash left the row older than its path's newest version.
            pass.skipped += 1;
            return self.dispose(e, known.state, &known.content_hash).await;
        }
        let format = self.cfg.source.format.of(&e.rel);
        // A file under a name never seen is split while it is hashed: one read. One seen before
        // (kept in place and not provably unchanged, or rewritten) is hashed first, so bytes
        // already taken in are recognised without staging them again; so is a file of unknown
        // format, which is only registered to be quarantined. New bytes are then split by a
        // read that hashes too, and only what that read saw is registered: a producer may
        // rewrite the file between the two reads (`hashed_first` tells it).
        let mut file = None;
        let mut hashed_first = None;
        if format.is_none() || self.ledger.knows_uri(&uri).await? {
            let (size, hash) = self.hash(&e.rel).await?;
            let known = self.ledger.state_of_bytes(&uri, &hash).await?.is_some_and(|s| s != FileState::Registered)
                || (size > 0 && self.ledger.same_bytes_as(&hash, &uri).await?.is_some());
            if format.is_some() && !known {
                hashed_first = Some(hash);
            } else {
                match self.register(e, &uri, format, size, hash, pass).await? {
                    Ok(f) => file = Some(f),
                    Err(_) => return Ok(()),
                }
            }
        }
        let Some(format) = format else {
            let reason = if e.rel.to_ascii_lowercase().ends_with(".json") {
                format!("{}: a .json file is taken only as JSON lines, and only when source.format = \"jsonl\" says so", e.rel)
            } else {
                format!("{}: cannot tell the format from the file name (set source.format)", e.rel)
            };
            let id = file.as_ref().map(|f| f.id).ok_or_else(|| ExtractError::Internal("unregistered file".into()))?;
            self.ledger.quarantine_file(id, &reason).await?;
            pass.quarantined += 1;
            return Ok(());
        };
        let split = match self.split(e, &uri, format, file.as_ref().map(|f| f.content_hash.clone()), true, None).await {
            // A bug met by this file: it is quarantined under its real hash (read again, without
            // the splitter, if it was split while hashed), so the next pass skips it; the other
            // files go on. What it staged before the panic is left to gc with other temps.
            Err(ExtractError::Panicked(panic)) => {
                let reason = format!("{}: Ferry failed while splitting this file ({panic}); report it with the file", e.rel);
                tracing::error!(file = ?e.rel, reason = ?reason, "quarantined");
                let id = match file {
                    Some(f) => f.id,
                    None => {
                        let (size, hash) = self.hash(&e.rel).await?;
                        match self.register(e, &uri, Some(format), size, hash, pass).await? {
                            Ok(f) => f.id,
                            Err(_) => return Ok(()),
                        }
                    }
                };
                self.ledger.quarantine_file(id, &reason).await?;
                pass.quarantined += 1;
                return Ok(());
            }
            r => r?,
        };
        if let Some(first) = hashed_first
            && first != split.hash
        {
            tracing::warn!(file = ?e.rel, "the file changed between two reads of it: nothing of it is recorded, it is read again next pass");
            self.unstage(&split.staged).await;
            pass.unfinished += 1;
            return Ok(());
        }
        if split.reused > 0 {
            tracing::info!(file = ?e.rel, chunks = split.reused, "resumed: chunks staged by an interrupted run are kept, not written again");
            pass.reused += split.reused;
        }
        let file = match file {
            Some(f) => f,
            None => match self.register(e, &uri, Some(format), split.size, split.hash.clone(), pass).await? {
                Ok(f) => f,
                // Chunked meanwhile by another extract under this same name: it staged its
                // chunks under the same names as these, and the ledger points to them. Still
                // growing: another extract that read the file at its listed size may have
                // taken in chunks under these names too. Both are left in place.
                Err(NotTaken::Known | NotTaken::Unfinished) => return Ok(()),
                // The same bytes as a file already taken in under another name: what was
                // staged under this file's names (the uri is in them) is no one's.
                Err(NotTaken::Duplicate) => {
                    self.unstage(&split.staged).await;
                    return Ok(());
                }
            },
        };
        match split.outcome {
            Ok(pieces) => {
                let pipeline = self.ledger.pipeline();
                let mut chunks: Vec<NewChunk> = pieces
                    .into_iter()
                    .enumerate()
                    .map(|(seq, mut c)| {
                        c.id = chunk_id(pipeline, &file.content_hash, seq as i64);
                        c
                    })
                    .collect();
                // A file without records is still a version: with `versions = "replace"` it
                // replaces the rows of the version before it (and a revert to it does too), so
                // it gets one empty chunk, which goes through the stages with nothing in it
                // (nothing is staged for it: transform has nothing to read).
                if chunks.is_empty() && self.cfg.source.versions == Versions::Replace {
                    // Every empty file has the same bytes: its chunk is named by its path.
                    let id = chunk_id(pipeline, &blake3::hash(format!("empty\0{uri}").as_bytes()).to_hex(), 0);
                    chunks.push(NewChunk {
                        location: self.staging.url(&paths::staged_chunk(&self.cfg.table.name, &id, format)),
                        id,
                        seq: 0,
                        range_kind: RangeKind::Records,
                        range_start: 0,
                        range_end: 0,
                        records: Some(0),
                        bytes: 0,
                        content_hash: blake3::hash(b"").to_hex().to_string(),
                    });
                }
                let records: i64 = chunks.iter().filter_map(|c| c.records).sum();
                let recorded = self.ledger.record_chunks(file.id, &chunks, Stage::Transform).await?;
                self.health.progressed();
                if let Recorded::SameBytesAs(first) = recorded {
                    // Taken in under another name while this one was split: quarantined
                    // in the same transaction; what it staged is no one's.
                    tracing::error!(file = ?e.rel, reason = ?ferry_ledger::duplicate_reason(&uri, &first), "quarantined");
                    pass.quarantined += 1;
                    self.unstage(&split.staged).await;
                    return Ok(());
                }
                if records == 0 {
                    tracing::warn!(file = ?e.rel, "the file holds no records; recorded with nothing to load");
                } else {
                    tracing::info!(file = ?e.rel, chunks = chunks.len(), records, "extracted");
                }
                pass.chunked += 1;
                pass.chunks += chunks.len() as u64;
                pass.records += records;
                pass.bytes += split.size;
                self.dispose(e, FileState::Chunked, &file.content_hash).await
            }
            Err(reason) => {
                let reason = format!("{}: {reason}", e.rel);
                tracing::error!(file = ?e.rel, reason = ?reason, "quarantined");
                self.ledger.quarantine_file(file.id, &reason).await?;
                pass.quarantined += 1;
                // The chunks staged before the bad record are no one's.
                self.unstage(&split.staged).await;
                Ok(())
            }
        }
    }

    /// The file's size and content hash, by reading it once.
    async fn hash(&self, rel: &str) -> Result<(u64, String)> {
        let _cpu = self.cpu.clone().acquire_owned().await.map_err(|e| ExtractError::Internal(e.to_string()))?;
        let store = self.source.clone();
        let rel = rel.to_string();
        tokio::task::spawn_blocking(move || -> Result<(u64, String)> {
            let mut r = store.open_blocking(&rel)?;
            let mut h = blake3::Hasher::new();
            let n = std::io::copy(&mut r, &mut h).map_err(|source| ExtractError::Io { path: rel, source })?;
            Ok((n, h.finalize().to_hex().to_string()))
        })
        .await
        .map_err(|err| ExtractError::Internal(err.to_string()))?
    }

    /// Registers the file as read (`size`, `hash`), unless there is nothing more to do with it:
    /// it was still growing, it is known already (then disposed of), or it holds the same bytes
    /// as another file already taken in (then quarantined).
    async fn register(
        &self,
        e: &Entry,
        uri: &str,
        format: Option<ferry_common::config::Format>,
        size: u64,
        hash: String,
        pass: &mut Pass,
    ) -> Result<std::result::Result<ferry_ledger::SourceFile, NotTaken>> {
        if size != e.size {
            pass.unfinished += 1; // still growing after all
            return Ok(Err(NotTaken::Unfinished));
        }
        // With `versions = "keep"` a reused name is another file, but bytes taken in under it
        // before would be loaded twice: they are not taken in again, and that is recorded and
        // said, not passed over in silence. (With "replace" the same bytes are the same
        // version, or an undone correction: see `revive_if_undone`.)
        if self.cfg.source.versions == Versions::Keep
            && let Some(times) = self.ledger.arrived_again(uri, &hash, e.change_token.as_deref(), e.mtime_ms).await?
        {
            tracing::warn!(
                file = ?e.rel, times,
                "the same bytes arrived again under this name: taken in before, so not taken in again (versions = keep); `ferry status` lists it"
            );
            pass.arrived_again += 1;
        }
        let file = self
            .ledger
            .register_file(&NewSourceFile {
                uri: uri.to_string(),
                size: size as i64,
                mtime_ms: e.mtime_ms,
                content_hash: hash.clone(),
                format,
                change_token: e.change_token.clone(),
            })
            .await?;
        // Each step after a long split is progress of its own: the quiet the health window
        // measures is then one ledger commit, not the split's whole tail.
        self.health.progressed();
        if file.state != FileState::Registered {
            if !self.revive_if_undone(e, uri, &file).await? {
                // Neither disposed of nor remembered as seen: the next pass brings it back.
                pass.unfinished += 1;
                return Ok(Err(NotTaken::Unfinished));
            }
            pass.skipped += 1;
            self.dispose(e, file.state, &file.content_hash).await?;
            return Ok(Err(NotTaken::Known));
        }
        // The same bytes under another name (a file delivered twice): loading them again
        // would double every record, so it is set aside with the name of the first.
        // An empty file holds nothing to double: it is never a duplicate.
        if let Some(first) = if size == 0 { None } else { self.ledger.same_bytes_as(&hash, uri).await? } {
            let reason = ferry_ledger::duplicate_reason(uri, &first);
            tracing::error!(file = ?e.rel, reason = ?reason, "quarantined");
            self.ledger.quarantine_file(file.id, &reason).await?;
            pass.quarantined += 1;
            return Ok(Err(NotTaken::Duplicate));
        }
        Ok(Ok(file))
    }

    /// Splits the file into staged chunks, hashing it on the way unless `known_hash` is given.
    /// With a known hash each chunk is staged under its id; without one, under
    /// [`ferry_ledger::staged_name`] (ids need the whole file's hash, named afterwards).
    ///
    /// With `resume`, a file whose split was cut short (a kill, a crash, a restart by a watchdog)
    /// goes on from what is staged: a chunk is staged under a name that only these bytes at this
    /// position of this file get, and atomically, so one found under its name is whole and is
    /// not written again. Only the first chunk is looked for on every file (one stat or HEAD);
    /// the others only when it was there. Not for a revived version: its chunks' staged copies
    /// are ones gc may be removing.
    ///
    /// With a `revival` (a version brought back, see [`Extractor::revive_if_undone`]) the file
    /// is cut where its chunks were first cut, and only the chunks it names are written, each
    /// under a name of its own.
    async fn split(
        &self,
        e: &Entry,
        uri: &str,
        format: ferry_common::config::Format,
        known_hash: Option<String>,
        resume: bool,
        revival: Option<Revival>,
    ) -> Result<Split> {
        let chunk_size = self.cfg.extract.chunk_size.0 as usize;
        let max_record = self.cfg.extract.max_record_size.0 as usize;
        let dialect = self.cfg.source.csv.clone();
        let pipeline = self.ledger.pipeline().to_string();
        let (source, staging, table, rel, uri) =
            (self.source.clone(), self.staging.clone(), self.cfg.table.name.clone(), e.rel.clone(), uri.to_string());
        let (listed_size, mtime_ms) = (e.size as i64, e.mtime_ms);
        let revival = revival.map(Arc::new);
        let buffers = self.buffers.clone();
        // Progress is bytes moved, not files finished: a file that takes longer to split than
        // the health window (a large file, a slow link) must not get the stage killed and the
        // file split again from the start, for ever.
        let health = self.health.clone();
        // Reading, hashing and splitting take a core; writes to a remote staging store then
        // finish without one, while the next file is split.
        let cpu = self.cpu.clone().acquire_owned().await.map_err(|e| ExtractError::Internal(e.to_string()))?;
        let mut writes = Writes::new(self.staging.clone(), self.in_flight.clone());
        writes.resume = resume.then_some(None);
        let (split, mut writes) = tokio::task::spawn_blocking(move || {
            // Tests stand in for a bug here (debug builds only): a panic while splitting a file
            // whose name holds this text.
            #[cfg(debug_assertions)]
            if std::env::var("FERRY_TEST_PANIC_SPLITTING").is_ok_and(|n| !n.is_empty() && rel.contains(&n)) {
                panic!("FERRY_TEST_PANIC_SPLITTING matched {rel}");
            }
            #[cfg(debug_assertions)]
            test_gate("before");
            let mut buf = buffers.lock().unwrap_or_else(|p| p.into_inner()).pop().unwrap_or_default();
            let split = (|| -> Result<Split> {
            let read_err = |rel: &str, source| ExtractError::Io { path: rel.to_string(), source };
            // A revival hashes what it reads too: its chunks must be cut from the very bytes
            // recorded, not from a file rewritten since.
            let hash_it = known_hash.is_none() || revival.is_some();
            let mut hashing = Hashing { inner: source.open_blocking(&rel)?, hasher: hash_it.then(blake3::Hasher::new), bytes: 0 };
            let mut staged = Vec::new();
            let outcome = {
                let mut r = std::io::BufReader::with_capacity(1 << 16, &mut hashing);
                // A compressed file named (or configured) as text would split into garbage records.
                let head = std::io::BufRead::fill_buf(&mut r).map_err(|e| read_err(&rel, e))?;
                let refused = if let Some(kind) = ferry_formats::compression_of(head) {
                    Some(format!(
                        "the file is {kind}-compressed; compressed input is not read: decompress it before it lands (or name it so that source.glob leaves it out)"
                    ))
                } else if format == ferry_common::config::Format::Jsonl && head.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
                    Some("the file is a JSON array (one document), not JSON lines (one object per line); convert it, e.g. `jq -c '.[]'`".into())
                } else {
                    None
                };
                let outcome = match refused {
                    Some(reason) => Err(reason),
                    None => {
                        let mut pieces = Vec::new();
                        let emit = |p: Piece| -> ferry_storage::Result<()> {
                            let seq = pieces.len() as i64;
                            let hash = blake3::hash(p.bytes).to_hex().to_string();
                            let name = match (&known_hash, revival.as_deref()) {
                                (Some(file_hash), Some(r)) => {
                                    paths::revived_chunk(&table, &chunk_id(&pipeline, file_hash, seq), r.version, r.attempt, format)
                                }
                                (Some(file_hash), None) => paths::staged_chunk(&table, &chunk_id(&pipeline, file_hash, seq), format),
                                (None, _) => paths::staged_chunk(
                                    &table,
                                    &ferry_ledger::staged_name(&pipeline, &uri, listed_size, mtime_ms, seq, &hash),
                                    format,
                                ),
                            };
                            if revival.as_deref().is_none_or(|r| r.stage.contains(&seq)) {
                                writes.put(&name, p.bytes)?;
                                health.progressed();
                                staged.push(name.clone());
                            }
                            pieces.push(NewChunk {
                                id: String::new(),
                                seq,
                                range_kind: RangeKind::Records,
                                range_start: p.first_record,
                                range_end: p.first_record + p.records,
                                records: Some(p.records),
                                bytes: p.bytes.len() as i64,
                                content_hash: hash,
                                location: staging.url(&name),
                            });
                            Ok(())
                        };
                        let cut = match revival.as_deref() {
                            Some(r) => ferry_formats::Cut::Recorded(&r.pieces),
                            None => ferry_formats::Cut::Size(chunk_size),
                        };
                        match ferry_formats::split(format, &mut r, cut, max_record, &dialect, &mut buf, emit) {
                            Ok(()) => Ok(pieces),
                            Err(SplitError::Corrupt(m)) => Err(m),
                            Err(SplitError::Io(source)) => return Err(read_err(&rel, source)),
                            // Writing the chunk failed: the store's own error, with its class.
                            Err(SplitError::Emit(e)) => return Err(e.into()),
                        }
                    }
                };
                // The file's hash covers all of it, also what a refused or corrupt file has
                // after the point where splitting stopped.
                if hash_it {
                    std::io::copy(&mut r, &mut std::io::sink()).map_err(|e| read_err(&rel, e))?;
                }
                outcome
            };
            let (size, hash) = match (known_hash, hashing.hasher) {
                (_, Some(h)) => (hashing.bytes, h.finalize().to_hex().to_string()),
                (Some(h), None) => (listed_size as u64, h),
                (None, None) => unreachable!("a hasher is made whenever no hash is known"),
            };
            #[cfg(debug_assertions)]
            test_gate("after");
            Ok(Split { size, hash, outcome, staged, reused: 0 })
            })();
            // One grown by a record far larger than a chunk is let go.
            if buf.capacity() <= 2 * chunk_size + (1 << 20) {
                buffers.lock().unwrap_or_else(|p| p.into_inner()).push(buf);
            }
            (split, writes)
        })
        .await
        .map_err(ExtractError::joined)?;
        drop(cpu);
        // Every chunk is in staging (or its write failed) before the file goes on.
        let written = writes.finish().await;
        #[cfg(debug_assertions)]
        if let Some(dir) = ferry_runtime::gate::dir("FERRY_TEST_SPLIT_GATE", Some("staged")) {
            ferry_runtime::gate::hold_async(&dir).await;
        }
        self.health.progressed();
        let mut split = split?;
        if split.outcome.is_ok() {
            written?;
        }
        split.reused = writes.reused;
        Ok(split)
    }

    /// A file taken in before whose bytes are at its path again although a newer version
    /// came after them (a correction undone): with `versions = "replace"` these bytes are the
    /// file's newest version again. It gets the next version number, and its chunks that must
    /// run again (the newer version replaced their rows, or a load withdrew them) go through
    /// transform again, staged anew from the file at hand (their staged copies may be gone):
    /// cut where they were first cut, whatever the chunk size is now, and under names of their
    /// own, so that nothing an older row names is overwritten and gc, which removes old
    /// staged chunks by the locations the ledger records, never meets them unrecorded. Load
    /// then replaces the newer version's rows, whole.
    ///
    /// False: not now (a load of the version is running, another version came meanwhile, or
    /// the bytes read no longer cut into the recorded chunks); the file is left in place and
    /// looked at again next pass.
    async fn revive_if_undone(&self, e: &Entry, uri: &str, file: &ferry_ledger::SourceFile) -> Result<bool> {
        if file.state != FileState::Chunked || self.cfg.source.versions != Versions::Replace {
            return Ok(true);
        }
        let Some(undone) = self.ledger.undone_version(file.id).await? else { return Ok(true) };
        let not_now = |why: &str| {
            tracing::info!(file = ?e.rel, why, "the bytes of an earlier version are back; brought back on a later pass");
            Ok(false)
        };
        if undone.busy {
            return not_now("a load of one of its chunks is running");
        }
        let stage: Vec<&ferry_ledger::UndoneChunk> = undone.chunks.iter().filter(|c| c.rerun && c.bytes > 0).collect();
        let mut staged = Vec::new();
        let mut written = Vec::new();
        if !stage.is_empty() {
            let Some(format) = self.cfg.source.format.of(&e.rel) else {
                return not_now("source.format no longer tells this file's format");
            };
            let attempt = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
                ^ (u64::from(std::process::id()) << 40);
            let revival = Revival {
                version: undone.next,
                attempt,
                pieces: undone.chunks.iter().map(|c| (c.range_start, c.bytes)).collect(),
                stage: stage.iter().map(|c| c.seq).collect(),
            };
            let split = self.split(e, uri, format, Some(file.content_hash.clone()), false, Some(revival)).await?;
            written = split.staged;
            if split.hash != file.content_hash {
                self.unstage(&written).await;
                return not_now("the file changed while it was read");
            }
            let pieces = split.outcome.as_ref().map(Vec::as_slice).unwrap_or_default();
            if let Some(c) = stage.iter().find(|c| pieces.get(c.seq as usize).is_none_or(|p| p.content_hash != c.content_hash)) {
                self.unstage(&written).await;
                let why = match &split.outcome {
                    Err(reason) => format!("reading it now fails ({reason})"),
                    Ok(_) => format!("its chunk {} does not come out as it was recorded", c.id),
                };
                return Err(ExtractError::Stage(ExtractFailure::CannotRecut(format!(
                    "{}: the bytes of an earlier version are back, but cannot be staged again as that version's chunks: {why}; \
                     the source's format options (source.csv, extract.max_record_size) must be what they were when it was first read",
                    e.rel
                ))));
            }
            staged = stage.iter().map(|c| (c.id.clone(), pieces[c.seq as usize].location.clone())).collect();
        }
        match self.ledger.revive_version(file.id, undone.next, &staged).await? {
            ferry_ledger::Revived::Version(version, again) => {
                tracing::warn!(file = ?e.rel, version, chunks_again = again.len(), "the bytes of an earlier version are back: they are the file's newest version again");
                // Staged for a chunk that, decided again in the revert's transaction, did not
                // have to run again: no one's.
                let taken: std::collections::HashSet<String> =
                    staged.into_iter().filter(|(c, _)| again.contains(c)).map(|(_, l)| l).collect();
                let orphans: Vec<String> = written.into_iter().filter(|rel| !taken.contains(&self.staging.url(rel))).collect();
                self.unstage(&orphans).await;
                Ok(true)
            }
            ferry_ledger::Revived::NotNow(why) => {
                self.unstage(&written).await;
                not_now(&why)
            }
        }
    }

    /// Best effort: removes staged chunks no ledger row points to. What cannot go now is
    /// logged; it is a file in staging, not a record in the table.
    async fn unstage(&self, staged: &[String]) {
        for rel in staged {
            if let Err(err) = self.staging.delete(rel).await {
                tracing::warn!(chunk = ?rel, error = %err, "cannot remove a staged chunk that is not needed");
            }
        }
    }

    /// keep / archive / delete, only once the file's chunks are durable (staged, fsynced or
    /// acknowledged by a remote store, and the ledger rows naming them on stable storage), and
    /// only the bytes that were taken in (`hash`): a producer may have renamed a new file over
    /// the name since it was read. The file is first moved aside ([`paths::aside`]), in one
    /// step that takes whatever is at the name at that instant; what was moved is then hashed,
    /// and archived and removed only if it is what was taken in. Anything else goes back under
    /// its name, to be taken in as the new file it is. A crash between the steps leaves the
    /// file aside, where the next pass finds it ([`Extractor::settle_aside`]).
    async fn dispose(&self, e: &Entry, state: FileState, hash: &str) -> Result<()> {
        if state != FileState::Chunked || self.cfg.source.disposition == Disposition::Keep {
            return Ok(());
        }
        // Durable before destructive: the commit of the chunks may still be in the page cache.
        self.ledger.make_durable().await?;
        let aside = paths::aside(&e.rel);
        match self.source.rename_noreplace(&e.rel, &aside).await {
            Ok(true) => self.settle_aside(&e.rel, &aside, Some(hash)).await,
            // A disposal of this name cut short (or under way in another extract): the pass
            // that finds the file aside settles it; this one stays for a later pass.
            Ok(false) => Ok(()),
            // Gone since the listing (another extract disposed of it, or the producer).
            Err(err) if err.is_not_found() => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// A source file moved aside from `rel` for disposal: archived and removed if it holds the
    /// bytes taken in under `rel` (`hash`, or when a crash lost it, whatever the ledger says
    /// was taken in there), else put back under `rel`. Should a newer file hold the name by
    /// then, this one stays aside, and each pass tries again.
    async fn settle_aside(&self, rel: &str, aside: &str, hash: Option<&str>) -> Result<()> {
        let (size, got) = self.source.hash(aside).await?;
        let taken = match (self.cfg.source.disposition, hash) {
            (Disposition::Keep, _) => false,
            (_, Some(h)) => h == got,
            (_, None) => {
                self.ledger.state_of_bytes(&self.source.url(rel), &got).await? == Some(FileState::Chunked)
                    && self.ledger.make_durable().await.is_ok()
            }
        };
        if taken {
            if self.cfg.source.disposition == Disposition::Archive {
                self.archive(aside, rel, size).await?;
            }
            return Ok(self.source.delete(aside).await?);
        }
        if hash.is_some() {
            tracing::warn!(file = ?rel, "another file was put under this name after it was read: it is put back and taken in as a new file, not removed");
        }
        if !self.source.rename_noreplace(aside, rel).await? {
            tracing::warn!(file = ?rel, aside = ?aside, "a file moved aside cannot go back yet: a newer file holds its name; tried again next pass");
        }
        Ok(())
    }

    /// Settles the files a disposal left aside (see [`Extractor::dispose`]): a crash between
    /// moving a file aside and removing it, or a name held by a newer file.
    async fn settle_asides(&self, entries: &[Entry]) -> u64 {
        let mut failed = 0;
        for e in entries {
            let Some(rel) = paths::aside_of(&e.rel) else { continue };
            if let Err(err) = self.settle_aside(&rel, &e.rel, None).await {
                tracing::warn!(file = ?rel, aside = ?e.rel, error = %err, "cannot settle a file moved aside for disposal; tried again next pass");
                failed += 1;
            }
        }
        failed
    }

    /// Streams a source file to `source.archive_url`: never held in memory (a file of a few
    /// hundred MB would not fit a pod's limit), sent from the file itself when the source is
    /// a local directory, else through a temp file in the system's temp directory. As many at
    /// once as files are split. Bounded like any transfer: a deadline that grows with the
    /// size (a 1 MiB/s floor) and the no-progress watchdog of `source.store.read_stall`.
    /// `from` is where the file is now (moved aside), `rel` its name in the source and the archive.
    async fn archive(&self, from: &str, rel: &str, size: u64) -> Result<()> {
        let _cpu = self.cpu.clone().acquire_owned().await.map_err(|e| ExtractError::Internal(e.to_string()))?;
        let archive = Store::open(self.cfg.source.archive_url.as_deref().unwrap_or_default(), &self.cfg.source.store)?;
        let mut _local_copy = None;
        let local = match self.source.local_path(from) {
            Some(p) => p,
            None => {
                let (source, rel) = (self.source.clone(), from.to_string());
                let copy = tokio::task::spawn_blocking(move || -> Result<tempfile::NamedTempFile> {
                    let tmp_err = |e| ExtractError::Io { path: "a temp file for archiving".into(), source: e };
                    let mut tmp = tempfile::Builder::new().prefix(".ferry-archive-").tempfile().map_err(tmp_err)?;
                    let mut r = source.open_blocking(&rel)?;
                    std::io::copy(&mut r, tmp.as_file_mut()).map_err(|e| ExtractError::Io { path: rel.clone(), source: e })?;
                    Ok(tmp)
                })
                .await
                .map_err(|e| ExtractError::Internal(e.to_string()))??;
                let p = copy.path().to_path_buf();
                _local_copy = Some(copy);
                p
            }
        };
        let o = &self.cfg.source.store;
        let deadline = o.call_timeout.0 * 2 + Duration::from_secs(size >> 20);
        let progress = ferry_storage::Progress::default();
        let what = format!("archiving {} to {}", self.source.url(rel), archive.url(rel));
        ferry_storage::watched(&what, deadline, o.read_stall.0, progress.clone(), archive.put_file(&local, rel, progress)).await?;
        Ok(())
    }
}

/// Tests hold a split at `point` (`before` the file is opened, `after` it was read, `staged`
/// when its chunks' writes have ended) to change the file or run something else at that
/// instant: `FERRY_TEST_SPLIT_GATE=POINT:DIR` (see [`ferry_runtime::gate`]).
#[cfg(debug_assertions)]
fn test_gate(point: &str) {
    if let Some(dir) = ferry_runtime::gate::dir("FERRY_TEST_SPLIT_GATE", Some(point)) {
        ferry_runtime::gate::hold(&dir);
    }
}

/// Chunk writes to staging. To a local directory the bytes are written in line (into the page
/// cache), and the fsync that waits for the disk, with the rename after it, runs on another
/// thread while the file goes on being split: reading and the disk's write-back overlap, as
/// they do for `cp`. At most [`Writes::LOCAL_PENDING`] of a file's chunks wait so. To a remote
/// store a write is mostly waiting (an HDFS close waits ~0.5 s for the DataNode's block
/// report), so each chunk is written from its own copy of the bytes while the file goes on
/// being split. The copies of all files' chunks in flight are bounded by [`Writes::BUDGET_MIB`].
/// Either way the file's writes are awaited after its split, without a core, and before the
/// file is registered.
struct Writes {
    staging: Store,
    budget: Arc<tokio::sync::Semaphore>,
    handle: tokio::runtime::Handle,
    in_flight: Vec<tokio::task::JoinHandle<ferry_storage::Result<()>>>,
    /// Resuming a split cut short: None = not asked, Some(None) = the first chunk not looked
    /// for yet, Some(Some(found)) = whether it was staged already.
    resume: Option<Option<bool>>,
    /// Chunks found staged, not written again.
    reused: u64,
}

impl Writes {
    /// MiB of chunk copies being written at once, by the whole extract stage.
    const BUDGET_MIB: usize = 512;
    /// A file's local chunks written but not yet synced: dirty pages stay bounded.
    const LOCAL_PENDING: usize = 4;

    fn new(staging: Store, budget: Arc<tokio::sync::Semaphore>) -> Writes {
        Writes { staging, budget, handle: tokio::runtime::Handle::current(), in_flight: Vec::new(), resume: None, reused: 0 }
    }

    /// Whether `name` is staged whole already (see [`Extractor::split`]): looked for at the
    /// first chunk, and at the others only when the first was there. A failed look is a miss:
    /// the chunk is written again, which is always safe.
    fn staged_already(&mut self, name: &str, len: usize) -> bool {
        let Some(state) = self.resume else { return false };
        if state == Some(false) {
            return false;
        }
        let found = matches!(self.handle.block_on(self.staging.head(name)), Ok(Some(e)) if e.size == len as u64);
        if state.is_none() {
            self.resume = Some(Some(found));
        }
        if found {
            self.reused += 1;
        }
        found
    }

    /// On a blocking thread (`spawn_blocking`): waits for room in the budget.
    fn put(&mut self, name: &str, bytes: &[u8]) -> ferry_storage::Result<()> {
        if self.staged_already(name, bytes.len()) {
            return Ok(());
        }
        if let Some(local) = self.staging.as_local() {
            while self.in_flight.len() >= Self::LOCAL_PENDING {
                let oldest = self.in_flight.remove(0);
                self.handle.block_on(oldest).map_err(|e| ferry_storage::Error::Other(format!("writing a chunk to staging: {e}")))??;
            }
            let unsynced = local.write_unsynced_blocking(name, bytes)?;
            self.in_flight.push(self.handle.spawn_blocking(move || unsynced.finish()));
            return Ok(());
        }
        let mib = (bytes.len() >> 20).clamp(1, Self::BUDGET_MIB) as u32;
        let permit = self
            .handle
            .block_on(self.budget.clone().acquire_many_owned(mib))
            .map_err(|e| ferry_storage::Error::Other(format!("writing a chunk to staging: {e}")))?;
        let (staging, name, bytes) = (self.staging.clone(), name.to_string(), bytes.to_vec());
        self.in_flight.push(self.handle.spawn(async move {
            let _permit = permit;
            staging.put_atomic(&name, bytes).await
        }));
        Ok(())
    }

    /// Waits for every write under way; the first failure, if any.
    async fn finish(&mut self) -> ferry_storage::Result<()> {
        let mut first = Ok(());
        for w in self.in_flight.drain(..) {
            let r = w.await.map_err(|e| ferry_storage::Error::Other(format!("writing a chunk to staging: {e}"))).and_then(|r| r);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// Why a file read is not taken in.
enum NotTaken {
    Unfinished,
    Known,
    Duplicate,
}

/// How a version brought back is staged again (see [`Extractor::revive_if_undone`]).
struct Revival {
    /// The version number it gets back, and a number unique to this attempt: both are part
    /// of its chunks' staged names.
    version: i64,
    attempt: u64,
    /// Each of its chunks as recorded, (first record, bytes): where the file is cut again.
    pieces: Vec<(i64, i64)>,
    /// The chunks (by position) that run again: only these are written.
    stage: std::collections::HashSet<i64>,
}

/// What splitting one file gave.
struct Split {
    /// Bytes read, and their blake3 hash (or the hash already known).
    size: u64,
    hash: String,
    /// The chunks (ids not yet set), or why the file is bad input.
    outcome: std::result::Result<Vec<NewChunk>, String>,
    /// Everything written to staging, for removal when the file is not taken in.
    staged: Vec<String>,
    /// Chunks found staged by a run cut short, not written again.
    reused: u64,
}

/// Hashes and counts what is read through it, so a new file is read once.
struct Hashing<R> {
    inner: R,
    hasher: Option<blake3::Hasher>,
    bytes: u64,
}

impl<R: std::io::Read> std::io::Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(h) = &mut self.hasher {
            h.update(&buf[..n]);
        }
        self.bytes += n as u64;
        Ok(n)
    }
}

/// `--once` runs one pass; `--watch` passes every `poll` until SIGTERM / SIGINT (a pass under
/// way finishes first: every step of it is idempotent, but stopping between files is tidier).
/// `--watch` logs a progress line every `progress_interval`.
pub async fn run(x: &Extractor, once: bool, poll: Duration, progress_interval: Duration) -> Result<Pass> {
    let mut total = Pass::default();
    let mode = if once { "once" } else { "watch" };
    tracing::info!(stage = "extract", mode, "stage starting");
    let stop = ferry_runtime::runner::shutdown_signal();
    tokio::pin!(stop);
    let mut last_log = (std::time::Instant::now(), Pass::default());
    // A pass that fails as a whole (the source cannot be listed, the ledger is down) is
    // waited out under --watch: an outage of a store is not the end of the service.
    let mut outage: Option<(std::time::Instant, ferry_runtime::breaker::ProbeSchedule)> = None;
    loop {
        let p = match x.pass().await {
            Ok(p) => {
                if let Some((since, _)) = outage.take() {
                    tracing::info!(stage = "extract", down_for = ?since.elapsed(), "the source and ledger answer again; extracting");
                }
                p
            }
            Err(e) if !once && e.is_transient() => {
                let first = outage.is_none();
                let (_, delays) = outage.get_or_insert_with(|| {
                    let b = ferry_runtime::breaker::probe_schedule(poll.max(Duration::from_secs(1)), x.cfg.ledger.outage_probe_max.0);
                    (std::time::Instant::now(), b)
                });
                let wait = delays.next().unwrap_or(poll);
                if first {
                    tracing::error!(stage = "extract", error = %e, retry_in = ?wait, "pass failed: a store or the ledger is unreachable; retrying until it answers");
                } else {
                    tracing::warn!(stage = "extract", error = %e, retry_in = ?wait, "still unreachable");
                }
                total.failed += 1;
                total.last_error = Some(e.to_string());
                tokio::select! {
                    _ = tokio::time::sleep(wait) => continue,
                    _ = &mut stop => {
                        tracing::info!(stage = "extract", "shutdown requested");
                        break;
                    }
                }
            }
            Err(e) => return Err(e),
        };
        total.chunked += p.chunked;
        total.chunks += p.chunks;
        total.records += p.records;
        total.bytes += p.bytes;
        total.quarantined += p.quarantined;
        total.unfinished = p.unfinished;
        total.skipped = p.skipped;
        total.failed += p.failed;
        total.reused += p.reused;
        total.arrived_again += p.arrived_again;
        if p.last_error.is_some() {
            total.last_error = p.last_error;
        }
        if once {
            break;
        }
        if last_log.0.elapsed() >= progress_interval {
            let secs = last_log.0.elapsed().as_secs_f64();
            tracing::info!(
                stage = "extract",
                files = total.chunked,
                chunks = total.chunks,
                records = total.records,
                bytes = total.bytes,
                files_per_s = format!("{:.2}", (total.chunked - last_log.1.chunked) as f64 / secs),
                bytes_per_s = %human_bytes((total.bytes - last_log.1.bytes) as f64 / secs),
                quarantined = total.quarantined,
                unfinished = total.unfinished,
                "progress"
            );
            last_log = (std::time::Instant::now(), total.clone());
        }
        tokio::select! {
            _ = tokio::time::sleep(poll) => {}
            _ = &mut stop => {
                tracing::info!(stage = "extract", "shutdown requested: stopping between passes");
                ferry_runtime::observe::sd_notify("STOPPING=1");
                break;
            }
        }
    }
    tracing::info!(stage = "extract", "stage stopped");
    Ok(total)
}
