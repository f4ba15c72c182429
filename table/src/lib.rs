//! The table seam: what a table format does with the chunks load publishes, behind one trait
//! ([`Table`]) chosen once from `destination.table_format` (as a store is one `Backend` chosen
//! once from its URL). Load, `ferry verify`, `ferry vacuum`, `ferry compact`, `ferry skip` and
//! the sweeps call the format through it, and never ask which format it is.
//!
//! # What load keeps, what the format does
//!
//! ```text
//!  load (shared)                          the format ([`Table`])
//!  ─────────────────────────────────────  ───────────────────────────────────────────────
//!  a newer version of the file is in   ─► withdraw: the chunk's rows out of the table
//!  the version whole? its switch held;
//!  the parts to move (its siblings')   ─► publish: the parts made visible as one step,
//!                                         recorded in the ledger, older versions' and
//!                                         skipped siblings' rows taken out
//!  siblings woken, the chunk's work    ◄─ Outcome
//!  at exit                             ─► finish (Hive: the DDL as the ledger has it)
//! ```
//!
//! A format's promise is the same as the Hive layout's (see `hive`): a chunk's rows are in the
//! table once or not at all; a retry after any crash finds what an earlier attempt did (in the
//! store, in the table's log) and finishes it, never doing it twice; what another writer of the
//! table owns (its files, settings, rows) is never changed, and an operation that would change
//! it is refused naming it.
//!
//! # Adding a format
//!
//! One crate that implements [`Table`] (`ferry-delta` is the example: its log library and its
//! `DeltaTable`), a variant of `TableFormat` in the configuration, and one arm in
//! `ferry_load::open_table`. The integration tests of load's promise (tests/tests/versions*.rs,
//! crashes.rs) then run on it by configuration.

pub mod hive;

/// Ferry's recorded column types (`SchemaColumn::detail`: `list<struct<a:int,b:string>>`), as the
/// formats with a schema of their own read them.
pub mod types {
    /// `<...>` without its brackets.
    pub fn inner(t: &str) -> Option<&str> {
        t.strip_prefix('<').and_then(|t| t.strip_suffix('>'))
    }

    /// The precision and scale of `(p,s)`, where both formats with a schema can hold them
    /// (precision 1 to 38, scale at most the precision).
    pub fn decimal(t: &str) -> Option<(u32, u32)> {
        let (prec, scale) = t.trim_matches(['(', ')']).split_once(',')?;
        let (p, s) = (prec.trim().parse::<u32>().ok()?, scale.trim().parse::<u32>().ok()?);
        ((1..=38).contains(&p) && s <= p).then_some((p, s))
    }

    /// Splits `a,b<c,d>,e` at the commas outside brackets.
    pub fn split_top(s: &str) -> Vec<&str> {
        let (mut depth, mut start, mut out) = (0i32, 0usize, Vec::new());
        for (i, c) in s.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(&s[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        out.push(&s[start..]);
        out
    }
}

use std::collections::BTreeSet;
use std::time::Duration;

use ferry_common::error::{ConfigError, ErrorClass};
use ferry_common::paths;
use ferry_ledger::{Lease, Ledger, Part, VersionState};
use ferry_runtime::{Failure, StageError};
use ferry_storage::Store;

pub use hive::HiveTable;

/// What a table's operations fail with: the kinds every stage shares, and the table's own.
pub type TableError = StageError<TableFailure>;

/// What only publishing into a table meets.
#[derive(Debug, thiserror::Error)]
pub enum TableFailure {
    /// The table already holds different content under this chunk's name.
    #[error("conflict: {0}")]
    Conflict(String),
    /// A part's landed file is not there (and no table file holds it already): `chunk` must
    /// be copied again.
    #[error("missing: {message}")]
    Missing { chunk: String, message: String },
    /// A version of a corrected source file waits for all of its chunks, and is looked at
    /// again `after` this long (or when the chunk that publishes the version wakes it).
    #[error("waiting: {reason}")]
    Waiting { reason: String, after: Duration },
    /// The table's format refuses the chunk: its log asks for a protocol Ferry does not
    /// write, its schema changes in a way the format cannot take, or another writer's commit
    /// holds rows the operation would change.
    #[error("table: {0}")]
    Table(String),
    /// A permanent failure after some parts moved, and they could not all be taken back:
    /// retried (not quarantined), so that the next attempt publishes the rest or takes them out.
    #[error("partly published: {0}")]
    PartlyVisible(String),
}

impl Failure for TableFailure {
    const STORE: &'static str = "destination";
    fn class(&self) -> ErrorClass {
        match self {
            TableFailure::Conflict(_) | TableFailure::Missing { .. } | TableFailure::Table(_) => ErrorClass::Permanent,
            TableFailure::PartlyVisible(_) | TableFailure::Waiting { .. } => ErrorClass::Transient,
        }
    }
    fn waits(&self) -> Option<Duration> {
        match self {
            TableFailure::Waiting { after, .. } => Some(*after),
            _ => None,
        }
    }
}

/// How long a chunk waits before it looks again when another task of this process (or a
/// commit of another writer) has the step it needs now.
pub const WAIT_BRIEFLY: Duration = Duration::from_secs(2);

/// One chunk's publish, as load hands it to the format.
pub struct Job<'a> {
    pub lease: &'a Lease,
    /// The destination with connections of this chunk's own: a hung one holds back this chunk
    /// only (hdfs-native sends every call of a client over one NameNode connection).
    pub dest: &'a Store,
    /// The chunk's own parts.
    pub parts: &'a [Part],
    /// Its parts and, in a version switch, its siblings': all of them go in, or none.
    pub moving: &'a [Part],
    /// The version's other chunks whose parts are in `moving`.
    pub siblings: &'a [String],
    /// Its source file's version (`source.versions = "replace"`).
    pub version: Option<&'a VersionState>,
}

/// How a publish ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The chunk's rows are in the table and recorded.
    Published,
    /// A newer version of its source file is in the table: the chunk's rows are not, and it
    /// is done.
    Superseded,
}

/// What `ferry verify` found: lines to print, the chunks involved, and the number of problems.
#[derive(Debug, Default)]
pub struct Verified {
    pub lines: Vec<String>,
    pub bad_chunks: BTreeSet<String>,
    pub problems: usize,
    /// Published parts another writer's commit took out (its DELETE, UPDATE, MERGE or
    /// OPTIMIZE): not problems of the table, but switches and reruns of their chunks are refused.
    pub rewritten: usize,
}

/// What `ferry vacuum` did (or would do, dry).
#[derive(Debug, Default)]
pub struct Vacuumed {
    /// The files deleted (or that would be), as store URLs.
    pub deleted: Vec<String>,
    pub files: usize,
    pub bytes: i64,
    /// Of those, files no version of the table names (never committed).
    pub untracked: usize,
    /// Removed files still within the retention, kept.
    pub kept: usize,
    /// Removed parts past the retention kept because their chunk is at work again (a revert
    /// or a rerun brings the same bytes back under the same name, and a load may be about to
    /// add the file again).
    pub again: usize,
    pub version: i64,
}

/// What `ferry compact` did (or would do, dry).
#[derive(Debug, Default)]
pub struct Compacted {
    /// One line per merge: the files in, the file out.
    pub lines: Vec<String>,
    pub merges: usize,
    pub files_in: usize,
    pub bytes_in: i64,
    /// Merges given up: their inputs changed before the commit (a load took a part out).
    pub lost: usize,
    pub version: i64,
}

/// One table format. Every method ends (the store's calls have their deadlines), and every
/// one that writes can be cut off at any instant: the next call finds what it left and
/// finishes or undoes it.
#[async_trait::async_trait]
pub trait Table: Send + Sync {
    /// The format's name, as `destination.table_format` spells it.
    fn format(&self) -> &'static str;

    /// The destination store.
    fn store(&self) -> &Store;

    /// Directories of the table's metadata where a writer killed mid-write leaves temp files
    /// (the `table-meta-temps` sweep removes them past the cutoff).
    fn meta_dirs(&self) -> Vec<String>;

    /// Makes the job's parts visible in the table as one step and records them in the ledger
    /// (`Ledger::record_published`); in a version that replaces another, the older versions'
    /// rows and the skipped siblings' leave the table in that step or right after it. A chunk
    /// found superseded on the way (a newer version went in meanwhile) is withdrawn, not
    /// published.
    async fn publish(&self, job: &Job<'_>) -> Result<Outcome, TableError>;

    /// Takes a superseded chunk out of the table (once its withdrawal is recorded in the
    /// ledger): whatever of it is visible, and its landed files. False: it is not superseded
    /// any more (its bytes came back as the newest version), nothing done.
    async fn withdraw(&self, dest: &Store, lease: &Lease) -> Result<bool, TableError>;

    /// The table paths of `chunk`'s parts that readers see while no `published` row names
    /// them: an attempt made them visible and ended before recording them. `ferry skip`
    /// refuses to close such a load.
    async fn unrecorded(&self, chunk: &str) -> Result<Vec<String>, TableError>;

    /// The table against what the ledger says is published.
    async fn verify(&self) -> Result<Verified, TableError>;

    /// Deletes files no reader of the table needs any more: removed longer than `retain` ago
    /// (None: the table's own retention; a shorter one only with `allow_short`).
    async fn vacuum(&self, retain: Option<Duration>, allow_short: bool, dry_run: bool) -> Result<Vacuumed, TableError> {
        let _ = (retain, allow_short, dry_run);
        Err(refused(self.format(), "ferry vacuum", "this format keeps no removed files"))
    }

    /// Merges the table's small files into files of up to `target` bytes.
    async fn compact(&self, target: i64, dry_run: bool) -> Result<Compacted, TableError> {
        let _ = (target, dry_run);
        Err(refused(self.format(), "ferry compact", "this format cannot merge files"))
    }

    /// Runs beside a load's chunks until [`Table::finish`]: what the format keeps up to date
    /// in the background (the Hive layout's DDL). Nothing by default.
    async fn upkeep(&self) {}

    /// At the end of a load run, however it ended: ends [`Table::upkeep`] and leaves the
    /// table's metadata as the ledger has it.
    async fn finish(&self) -> Result<(), TableError> {
        Ok(())
    }
}

/// What `ferry doctor` found checking a table before any load: the steps that passed (with what
/// they found) in order, and the first that failed with its error. Each step runs under the
/// doctor's deadline, so a store that never answers is a failed step, not a hung command.
#[derive(Debug, Clone)]
pub struct Preflight {
    pub steps: Vec<String>,
    pub failed: Option<(String, String)>,
    timeout: Duration,
}

/// A preflight step failed: what failed is recorded in the [`Preflight`], and the checks after
/// it do not run.
#[derive(Debug, Clone, Copy)]
pub struct StepFailed;

impl Preflight {
    pub fn new(timeout: Duration) -> Preflight {
        Preflight { steps: vec![], failed: None, timeout }
    }

    /// Runs one step; `Err` once it failed (the error is recorded).
    pub async fn step<T, E: std::error::Error>(&mut self, name: &str, f: impl Future<Output = Result<T, E>>) -> Result<T, StepFailed> {
        let t = std::time::Instant::now();
        match tokio::time::timeout(self.timeout, f).await {
            Ok(Ok(v)) => {
                self.steps.push(format!("{name} ({} ms)", t.elapsed().as_millis()));
                Ok(v)
            }
            Ok(Err(e)) => self.fail(name, ferry_common::error::with_causes(&e)),
            Err(_) => self.fail(name, format!("no answer in {} s", self.timeout.as_secs_f64())),
        }
    }

    /// What the last step found.
    pub fn note(&mut self, what: String) {
        match self.steps.last_mut() {
            Some(last) => *last = format!("{last}: {what}"),
            None => self.steps.push(what),
        }
    }

    /// Records a failed step (also one whose call succeeded with a wrong answer).
    pub fn fail<T>(&mut self, name: &str, error: String) -> Result<T, StepFailed> {
        self.failed = Some((name.to_string(), error));
        Err(StepFailed)
    }
}

/// An operation the table's format does not have, as the configuration error it is.
pub fn refused(format: &str, what: &str, why: &str) -> TableError {
    ConfigError::new("destination.table_format", format!("{what} is not for {format} tables: {why}")).into()
}

/// Whether the table holds `target`: None if not, else whether it is part `p` (size and
/// hash). A file that goes between the look and the hash (another publisher took it back) is
/// not there.
pub async fn in_table<F: Failure>(dest: &Store, target: &str, p: &Part) -> Result<Option<bool>, StageError<F>> {
    let Some(h) = dest.head(target).await? else { return Ok(None) };
    if h.size as i64 != p.bytes {
        return Ok(Some(false));
    }
    match dest.hash(target).await {
        Ok((_, hash)) => Ok(Some(hash == p.content_hash)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// A part's file name in a table of a format with a log (Delta, Iceberg):
/// `part-<chunk>-<first 8 of its blake3>.parquet`, so that other bytes for the same chunk and
/// partition (a rerun) never take a name an earlier version of the table still reads.
pub fn part_rel(p: &Part) -> String {
    let stem = p.name.strip_suffix(".parquet").unwrap_or(&p.name);
    let hash = p.content_hash.get(..8).unwrap_or(&p.content_hash);
    paths::part_rel(&p.partition, &format!("{stem}-{hash}.parquet"))
}

/// The chunk id in the name of a table file Ferry wrote ([`part_rel`]); None for files of
/// other writers.
pub fn chunk_of(rel: &str) -> Option<&str> {
    let name = rel.rsplit('/').next()?;
    let (chunk, hash) = name.strip_prefix("part-")?.strip_suffix(".parquet")?.rsplit_once('-')?;
    (hash.len() == 8 && hash.bytes().all(|b| b.is_ascii_hexdigit())).then_some(chunk)
}

/// Moves a landed part into `table`'s directory under its [`part_rel`] name, where no reader
/// looks until a commit names it; a part already there with its bytes (a retry) is done, one
/// with other bytes is a conflict, and one in neither place must be copied again.
pub async fn place(dest: &Store, table: &str, p: &Part) -> Result<(), TableError> {
    let landed = paths::landed(table, &p.chunk_id, &p.rel_path());
    let target = paths::table_file(table, &part_rel(p));
    if dest.rename_noreplace(&landed, &target).await.or_else(|e| if e.is_not_found() { Ok(false) } else { Err(e) })? {
        return Ok(());
    }
    match in_table::<TableFailure>(dest, &target, p).await? {
        Some(true) => {
            let _ = dest.delete(&landed).await;
            Ok(())
        }
        Some(false) => Err(conflict(dest, &target, &p.chunk_id)),
        None => Err(missing(dest, &landed, &target, &p.chunk_id)),
    }
}

/// The table holds other content under a chunk's name.
pub fn conflict(dest: &Store, target: &str, chunk: &str) -> TableError {
    TableError::Stage(TableFailure::Conflict(format!("{} holds other content than chunk {chunk}", dest.url(target))))
}

/// Neither a part's landed file nor its table file is there.
pub fn missing(dest: &Store, landed: &str, target: &str, chunk: &str) -> TableError {
    TableError::Stage(TableFailure::Missing {
        chunk: chunk.to_string(),
        message: format!(
            "neither {} nor {} exists; run the chunk again (ferry rerun --chunk {chunk} --from transform)",
            dest.url(landed),
            dest.url(target)
        ),
    })
}

/// Removes a chunk's landed files (a withdrawn chunk's, a published chunk's leftovers); one
/// that cannot go now is left to gc.
pub async fn remove_landed(ledger: &Ledger, dest: &Store, table: &str, chunk: &str) -> Result<(), TableError> {
    for p in ledger.parts(chunk).await? {
        let landed = paths::landed(table, &p.chunk_id, &p.rel_path());
        if let Err(e) = dest.delete(&landed).await
            && !e.is_not_found()
        {
            tracing::debug!(file = %dest.url(&landed), error = %e, "cannot remove a landed file now; gc will");
        }
    }
    Ok(())
}

/// Tests hold the first withdrawal of this process at its record (debug builds only):
/// `FERRY_TEST_WITHDRAW_GATE=DIR`.
pub async fn withdraw_gate() {
    #[cfg(debug_assertions)]
    {
        static USED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if let Some(dir) = ferry_runtime::gate::dir("FERRY_TEST_WITHDRAW_GATE", None)
            && !USED.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            ferry_runtime::gate::hold_async(&dir).await;
        }
    }
}
