//! transform: staging -> local spool. Decodes a staged chunk (Avro, JSON lines, CSV) into
//! Arrow in the table's types, applies the `[transform]` plan, and writes one Parquet file per
//! partition value to the spool, named deterministically (see `ferry_common::paths`), so a
//! retry rewrites the same files with the same bytes.
//!
//! Bad records (up to `max_bad_records` per chunk) are set aside with their position and
//! reason, in the ledger's `rejects` table and a rejects file; more than that, or a chunk that
//! cannot be decoded at all, quarantines the chunk. Other chunks never wait for it.

pub mod encode;
pub mod exact;
pub mod ops;
pub mod schema;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, new_null_array};
use arrow::datatypes::{Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use ferry_common::error::ErrorClass;
use ferry_common::paths;
use ferry_formats::decode;
use ferry_ledger::{Chunk, Lease, Ledger, Part, Reject, Work};
use ferry_runtime::config::{self, Config, Format};
use ferry_runtime::sweeps::{Places, Sweep};
use ferry_runtime::{Failure, StageError};
use ferry_storage::Store;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, GzipLevel, ZstdLevel};
use parquet::file::properties::WriterProperties;

/// The transform stage's error: the kinds every stage shares ([`StageError`], with the one
/// rule for retry-or-not) and transform's own.
pub type TransformError = StageError<TransformFailure>;

/// What only transform meets.
#[derive(Debug, thiserror::Error)]
pub enum TransformFailure {
    /// The input cannot be turned into table rows; retrying will not help.
    #[error("bad input: {0}")]
    BadInput(String),
    /// The configuration does not fit the data (a missing column, an unknown function).
    #[error("configuration: {0}")]
    Config(String),
    /// Another chunk moved the table to a new schema version while this one was written in
    /// it: redone in the new one.
    #[error("schema moved: {0}")]
    SchemaMoved(String),
    /// A file this attempt was writing in the spool went away under it (`ferry gc` with a
    /// cut-off shorter than the attempt, an operator): the attempt is redone from the staged
    /// chunk, which is still there.
    #[error("spool file gone: {0}")]
    SpoolFileGone(String),
}

impl Failure for TransformFailure {
    const STORE: &'static str = "staging";
    fn class(&self) -> ErrorClass {
        match self {
            TransformFailure::BadInput(_) | TransformFailure::Config(_) => ErrorClass::Permanent,
            TransformFailure::SchemaMoved(_) | TransformFailure::SpoolFileGone(_) => ErrorClass::Transient,
        }
    }
    fn is_config(&self) -> bool {
        matches!(self, TransformFailure::Config(_))
    }
}

/// Input that cannot become table rows: the chunk is quarantined with this reason.
pub(crate) fn bad_input(reason: impl Into<String>) -> TransformError {
    TransformError::Stage(TransformFailure::BadInput(reason.into()))
}

/// The configuration does not fit the data.
pub(crate) fn misconfigured(reason: impl Into<String>) -> TransformError {
    TransformError::Stage(TransformFailure::Config(reason.into()))
}

/// An I/O error on a file this attempt writes in the spool: one that is gone (not found) was
/// removed under the attempt, which is then redone; anything else keeps its class.
fn own_spool_file(path: &Path, e: std::io::Error) -> TransformError {
    if e.kind() == std::io::ErrorKind::NotFound {
        TransformError::Stage(TransformFailure::SpoolFileGone(format!("{}: {e}", path.display())))
    } else {
        TransformError::io(path.display(), e)
    }
}

/// An error of the Parquet writer on `path` in the spool: its I/O errors (a full disk) keep
/// their class; anything else is a bug.
fn spool_write(path: &Path, e: parquet::errors::ParquetError) -> TransformError {
    match e {
        parquet::errors::ParquetError::External(inner) => match inner.downcast::<std::io::Error>() {
            Ok(io) => TransformError::io(path.display(), *io),
            Err(other) => TransformError::Internal(format!("writing {}: {other}", path.display())),
        },
        other => TransformError::Internal(format!("writing {}: {other}", path.display())),
    }
}

pub struct Transformer {
    cfg: Config,
    ledger: Ledger,
    staging: Store,
    plan: ops::Plan,
    declared: Option<SchemaRef>,
    props: WriterProperties,
    /// The threads that decode and encode: one per core, at most `concurrency`.
    cpu: Workers,
}

/// Dedicated threads for the CPU-bound part of chunks, fed in order. Not tokio's blocking
/// pool: a chunk allocates and frees tens of MiB, and glibc gives every thread it meets its
/// own heap (arena) that keeps what was freed there; over a run the blocking pool's changing
/// threads made peak RSS ~80 MiB higher (measured 222 vs 141 MiB with one arena). A
/// chunk whose files are being fsynced (no CPU, no buffers) has left its thread already.
struct Workers {
    jobs: std::sync::Mutex<std::sync::mpsc::Sender<Box<dyn FnOnce() + Send>>>,
}

impl Workers {
    fn new(n: usize) -> Workers {
        let (tx, rx) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let rx = Arc::new(std::sync::Mutex::new(rx));
        // HDFS and S3 readers block on the runtime's handle: the threads run inside it.
        let runtime = tokio::runtime::Handle::try_current().ok();
        for i in 0..n {
            let rx = rx.clone();
            let runtime = runtime.clone();
            std::thread::Builder::new()
                .name(format!("ferry-transform-{i}"))
                .spawn(move || {
                    let _inside = runtime.as_ref().map(|r| r.enter());
                    loop {
                        let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                        match job {
                            // A panic is reported to the chunk (its result channel closes); the thread goes on.
                            Ok(job) => drop(std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))),
                            Err(_) => return,
                        }
                    }
                })
                .expect("spawn a transform thread");
        }
        Workers { jobs: std::sync::Mutex::new(tx) }
    }

    async fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T, TransformError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Box<dyn FnOnce() + Send> = Box::new(move || {
            // Not started for a chunk whose future is gone (lease lost, shutting down).
            if !tx.is_closed() {
                let _ = tx.send(f());
            }
        });
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).send(job).map_err(TransformError::internal)?;
        rx.await.map_err(|_| TransformError::Panicked("a transform thread panicked".into()))
    }
}

impl Transformer {
    /// The staging store, as the chunks are read from it.
    pub fn staging(&self) -> &Store {
        &self.staging
    }

    pub fn new(cfg: Config, ledger: Ledger) -> Result<Transformer, TransformError> {
        let staging = Store::open(&cfg.staging.url, &cfg.staging.store)?;
        let plan = ops::Plan::new(&cfg.transform, &cfg.table.partition_by)?;
        let declared = (!cfg.table.columns.is_empty()).then(|| decode::table_schema(&cfg.table.columns));
        let t = &cfg.transform;
        let props =
            WriterProperties::builder().set_compression(parquet_codec(t)?).set_max_row_group_row_count(Some(t.row_group_size)).build();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cpu = Workers::new(cores.min(cfg.transform.concurrency).max(1));
        Ok(Transformer { cfg, ledger, staging, plan, declared, props, cpu })
    }

    /// Removes spool temp files left by a transform that crashed.
    pub async fn gc(&self) -> Result<(), TransformError> {
        let spool = Store::from_url(&self.cfg.spool.dir.to_string_lossy())?;
        let at = Places { cfg: &self.cfg, ledger: &self.ledger, staging: None, destination: None, spool: Some(&spool), meta_dirs: &[] };
        Sweep::SpoolTemps.run(&at, self.cfg.temp_cutoff_ms(self.ledger.now_ms())).await?;
        Ok(())
    }

    fn chunk_dir(&self, chunk: &str) -> PathBuf {
        paths::spool_chunk_dir(&self.cfg.spool.dir, &self.cfg.table.name, chunk)
    }

    /// Works on one claimed chunk.
    pub async fn chunk(self: Arc<Self>, lease: Lease) -> Result<Work, TransformError> {
        let chunk = self.ledger.chunk(&lease.chunk_id).await?;
        // The one empty chunk of a file without records (a version all the same): nothing
        // was staged, nothing to decode, no parts.
        if chunk.bytes == 0 {
            self.ledger.record_parts(&lease, &[], &[]).await?;
            return Ok(Work::default());
        }
        let rel = self
            .staging
            .rel_of(&chunk.location)
            .ok_or_else(|| misconfigured(format!("chunk {} is staged at {}, outside staging.url", chunk.id, chunk.location)))?;
        let format = chunk.format;
        let this = self.clone();
        let c = chunk.clone();
        let table = self.cfg.table.name.clone();
        let latest = self.ledger.table_schemas(&table).await?.pop();
        // Opened, and fetched ahead, before a core is free: the wait for the first bytes of a
        // chunk on HDFS or S3 is spent while other chunks decode.
        let ahead = self.cfg.transform.read_ahead.0 as usize;
        let input = self.staging.open_ahead(&rel, ahead.min(chunk.bytes.max(1) as usize)).await?;
        let out = self.cpu.run(move || this.transform_blocking(&c, input, format, latest.as_ref())).await?.map_err(|e| match e {
            TransformError::Stage(TransformFailure::BadInput(m)) => bad_input(format!("{}: {m}", chunk.file_uri)),
            other => other,
        })?;
        let Transformed { written, rejects, notes, fit } = out;
        let parts = tokio::task::spawn_blocking(move || written.into_iter().map(Written::persist).collect::<Result<Vec<_>, _>>())
            .await
            .map_err(TransformError::joined)??;
        let rejects: Vec<Reject> =
            rejects.into_iter().map(|r| Reject { position: r.position, reason: format!("{}: {}", chunk.file_uri, r.reason) }).collect();
        if !rejects.is_empty() {
            self.write_rejects(&lease.chunk_id, &rejects)?;
            tracing::warn!(chunk = %lease.chunk_id, file = ?chunk.file_uri, rejects = rejects.len(), "bad records set aside");
        }
        self.ledger.note_chunk(&lease.chunk_id, &notes).await?;
        // The table's new schema version is recorded before any part written in it, so load
        // never publishes a file whose columns its DDL lacks. A crash in between leaves a
        // version whose first chunk is redone in it.
        if let Some(schema::Fit::Evolve { target, version, change }) = &fit {
            let cols = schema::columns(target);
            // Another chunk may have recorded this version first: the same columns (chunks of
            // one change transformed side by side) are fine, any other means a redo.
            if !self.ledger.record_table_schema(&table, *version, &cols, change, &lease.chunk_id).await?
                && self.ledger.table_schemas(&table).await?.into_iter().find(|v| v.version == *version).map(|v| v.columns)
                    != Some(cols.clone())
            {
                return Err(TransformError::Stage(TransformFailure::SchemaMoved(format!(
                    "table {table} got schema version {version} from another chunk while this one was written; redone in it"
                ))));
            }
            tracing::info!(chunk = %lease.chunk_id, table = %table, version, change = %change, "table schema recorded");
        }
        self.ledger.record_parts(&lease, &parts, &rejects).await?;
        Ok(Work::new(parts.iter().map(|p| p.bytes).sum(), parts.iter().map(|p| p.records).sum()))
    }

    fn transform_blocking(
        &self,
        chunk: &Chunk,
        input: Box<dyn std::io::Read + Send>,
        format: Format,
        latest: Option<&ferry_ledger::TableSchema>,
    ) -> Result<Transformed, TransformError> {
        // The staged bytes must be the ones extract recorded. They are hashed as they are
        // decoded (one read, not two) and checked before any part is recorded.
        let hasher = std::sync::Arc::new(std::sync::Mutex::new(blake3::Hasher::new()));
        let verify = |h: &std::sync::Arc<std::sync::Mutex<blake3::Hasher>>| -> Result<(), TransformError> {
            let got = h.lock().unwrap_or_else(|e| e.into_inner()).finalize().to_hex().to_string();
            if got != chunk.content_hash {
                return Err(bad_input(format!(
                    "staged chunk {} ({}) does not match the hash recorded at extract",
                    chunk.id, chunk.location
                )));
            }
            Ok(())
        };
        let t = &self.cfg.transform;
        let decoder = decode::decoder(format);
        if !decoder.self_describing() && self.cfg.table.columns.is_empty() {
            return Err(misconfigured(format!("table.columns must be declared for {} input", format.as_str())));
        }
        let names = if self.cfg.table.case_insensitive { decode::Names::AnyCase } else { decode::Names::Exact };
        let mut out = PartWriters::new(self, &chunk.id);
        // Records left out after decoding, because a value could not be kept exactly: the
        // declared type (Avro) or `transform.cast`. Positions count the chunk's decoded records.
        let mut late: Vec<Reject> = Vec::new();
        let notes = std::cell::RefCell::new(Vec::<String>::new());
        let mut fit: Option<schema::Fit> = None;
        let mut decoded: i64 = 0;
        let max_bad = t.max_bad_records;
        let mut rejects = {
            // `unfit`: rows the decoder already found bad (Avro), still in `b`.
            let mut sink = |b: RecordBatch, unfit: Vec<(usize, String)>| -> Result<(), TransformError> {
                let first = decoded;
                decoded += b.num_rows() as i64;
                let (b, mut bad) = match &self.declared {
                    Some(s) if decoder.self_describing() => conform(&b, s, names, unfit, &mut notes.borrow_mut())?,
                    _ if unfit.is_empty() => (b, unfit),
                    _ => (exact::without_rows(&b, &unfit.iter().map(|(r, _)| *r).collect::<Vec<_>>())?, unfit),
                };
                // Rows of `b` as rows of the decoded batch (conform may have left some out).
                let kept: Vec<usize> = {
                    let dropped: std::collections::BTreeSet<usize> = bad.iter().map(|(r, _)| *r).collect();
                    (0..b.num_rows() + dropped.len()).filter(|r| !dropped.contains(r)).collect()
                };
                let before = b.num_rows();
                let (b, cast_bad) = self.plan.apply(&b)?;
                // Rows of the planned batch as rows of the decoded batch (the plan left out its
                // own bad rows).
                let planned: Vec<usize> = {
                    let dropped: std::collections::BTreeSet<usize> = cast_bad.iter().map(|(r, _)| *r).collect();
                    (0..before).filter(|r| !dropped.contains(r)).map(|r| kept[r]).collect()
                };
                bad.extend(cast_bad.into_iter().map(|(r, why)| (kept[r], why)));
                // Every batch of a chunk has one schema: its fit to the table's is decided once.
                if fit.is_none() {
                    let widen = self.cfg.destination.table_format.widens_columns();
                    fit = Some(schema::Fit::new(latest, &b.schema(), widen).map_err(bad_input)?);
                }
                let (b, fit_bad) = fit.as_ref().expect("set above").apply(b)?;
                bad.extend(fit_bad.into_iter().map(|(r, why)| (planned[r], why)));
                for (r, why) in bad {
                    let n = chunk.range_start + first + r as i64 + 1;
                    late.push(Reject { position: format!("decoded record {n} of the file"), reason: why });
                }
                if late.len() as u64 > max_bad {
                    let f = &late[0];
                    return Err(bad_input(format!(
                        "more than max_bad_records = {max_bad} bad records; first at {}: {}",
                        f.position, f.reason
                    )));
                }
                out.write(&b)
            };
            // Hashed as it is read; nothing is recorded before the hash is checked.
            let input = HashingReader { inner: input, hasher: hasher.clone() };
            let mut input = std::io::BufReader::with_capacity(256 << 10, input);
            let how = decode::Decoding {
                path: &chunk.location,
                columns: &self.cfg.table.columns,
                names,
                csv: &self.cfg.source.csv,
                first_record: chunk.range_start,
                batch_size: t.batch_size,
                max_bad,
                max_record_size: self.cfg.extract.max_record_size.0 as usize,
                size_hint: chunk.bytes.max(0) as usize,
            };
            // The sink's own error (a spool write, too many bad records) is kept here, and the
            // decode told to stop.
            let mut stopped = None;
            let res = decoder.decode(&mut input, &how, &mut |b, unfit| {
                sink(b, unfit).map_err(|e| {
                    stopped = Some(e);
                    decode::Stopped
                })
            });
            let res = res.map_err(|e| match e {
                decode::Error::BadInput(m) => bad_input(m),
                decode::Error::Io(path, source) => TransformError::io(path, source),
                decode::Error::Internal(m) => TransformError::Internal(m),
                decode::Error::Stopped => stopped.take().unwrap_or_else(|| TransformError::internal("a decode stopped without its reason")),
            });
            // Read to the end, so the hash covers bytes the decoder did not need.
            let decoded = checked(res, &mut input, || verify(&hasher))?;
            notes.borrow_mut().extend(decoded.notes);
            decoded.rejects.into_iter().map(|r| Reject { position: r.position, reason: r.reason }).collect::<Vec<_>>()
        };
        rejects.append(&mut late);
        if rejects.len() as u64 > max_bad {
            let f = &rejects[0];
            return Err(bad_input(format!("more than max_bad_records = {max_bad} bad records; first at {}: {}", f.position, f.reason)));
        }
        Ok(Transformed { written: out.finish()?, rejects, notes: notes.into_inner(), fit })
    }

    fn write_rejects(&self, chunk: &str, rejects: &[Reject]) -> Result<(), TransformError> {
        let p = paths::rejects_file(&self.cfg.spool.dir, &self.cfg.table.name, chunk);
        let mut text = String::new();
        for r in rejects {
            text.push_str(&serde_json::json!({"chunk": chunk, "position": r.position, "reason": r.reason}).to_string());
            text.push('\n');
        }
        ferry_storage::write_atomic(&p, text.as_bytes())?;
        Ok(())
    }
}

/// A chunk's files (not yet durable), rejects, notes, and how it fits the table's schema
/// (`None` when no row got through).
struct Transformed {
    written: Vec<Written>,
    rejects: Vec<Reject>,
    notes: Vec<String>,
    fit: Option<schema::Fit>,
}

/// The Parquet codec `transform.compression` names, at `transform.compression_level`.
fn parquet_codec(t: &config::TransformSection) -> Result<Compression, TransformError> {
    let level_err = |e: parquet::errors::ParquetError| misconfigured(format!("transform.compression_level: {e}"));
    Ok(match t.compression {
        config::Compression::Zstd => Compression::ZSTD(ZstdLevel::try_new(t.compression_level).map_err(level_err)?),
        config::Compression::Gzip => Compression::GZIP(GzipLevel::try_new(t.compression_level as u32).map_err(level_err)?),
        config::Compression::Snappy => Compression::SNAPPY,
        config::Compression::Lz4 => Compression::LZ4_RAW,
        config::Compression::None => Compression::UNCOMPRESSED,
    })
}

/// A streamed decode's outcome once the staged bytes' hash is checked. A chunk whose bytes are
/// not the ones extract recorded fails as that, whatever the decoder made of them: after a
/// decode error the rest is read through the hasher before the error is returned.
fn checked<T>(
    res: Result<T, TransformError>,
    rest: &mut impl std::io::Read,
    verify: impl Fn() -> Result<(), TransformError>,
) -> Result<T, TransformError> {
    if res.is_err() && std::io::copy(rest, &mut std::io::sink()).is_ok() {
        verify()?;
    }
    let v = res?;
    verify()?;
    Ok(v)
}

/// Hashes what passes through it (the staged chunk, read once).
struct HashingReader<R> {
    inner: R,
    hasher: std::sync::Arc<std::sync::Mutex<blake3::Hasher>>,
}

impl<R: std::io::Read> std::io::Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.lock().unwrap_or_else(|e| e.into_inner()).update(&buf[..n]);
        Ok(n)
    }
}

/// Hashes and counts what a Parquet writer writes, so the output is not read back to hash it.
struct HashingWriter {
    inner: std::io::BufWriter<std::fs::File>,
    hasher: blake3::Hasher,
    bytes: u64,
}

impl std::io::Write for HashingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The Parquet files of one chunk, one per partition value, written as batches arrive.
struct PartWriters<'a> {
    t: &'a Transformer,
    chunk: String,
    props: Option<WriterProperties>,
    open: std::collections::BTreeMap<String, (PathBuf, FileWriter, i64)>,
}

/// Ferry's own page encoder for flat tables, ArrowWriter for everything else (see `encode`).
enum FileWriter {
    Flat(encode::FlatWriter<HashingWriter>),
    Arrow(ArrowWriter<HashingWriter>),
}

impl FileWriter {
    /// Writing to the spool file at `path` (for what an error names).
    fn new(
        f: HashingWriter,
        schema: SchemaRef,
        props: WriterProperties,
        row_group_size: usize,
        path: &Path,
    ) -> Result<Self, TransformError> {
        Ok(if encode::FlatWriter::<HashingWriter>::supports(&schema, &props) {
            FileWriter::Flat(
                encode::FlatWriter::try_new(f, schema, &props, row_group_size).map_err(|e| TransformError::io(path.display(), e))?,
            )
        } else {
            FileWriter::Arrow(ArrowWriter::try_new(f, schema, Some(props)).map_err(|e| spool_write(path, e))?)
        })
    }

    fn write(&mut self, b: &RecordBatch, path: &Path) -> Result<(), TransformError> {
        match self {
            FileWriter::Flat(w) => w.write(b).map_err(|e| TransformError::io(path.display(), e)),
            FileWriter::Arrow(w) => w.write(b).map_err(|e| spool_write(path, e)),
        }
    }

    fn into_inner(self, path: &Path) -> Result<HashingWriter, TransformError> {
        match self {
            FileWriter::Flat(w) => w.into_inner().map_err(|e| TransformError::io(path.display(), e)),
            FileWriter::Arrow(w) => w.into_inner().map_err(|e| spool_write(path, e)),
        }
    }
}

impl<'a> PartWriters<'a> {
    fn new(t: &'a Transformer, chunk: &str) -> Self {
        PartWriters { t, chunk: chunk.to_string(), props: None, open: Default::default() }
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<(), TransformError> {
        for (partition, rows) in self.t.plan.partition(batch)? {
            if rows.num_rows() == 0 {
                continue;
            }
            if !self.open.contains_key(&partition) {
                let props = self.props.get_or_insert_with(|| tuned_props(&self.t.props, &rows)).clone();
                let dir = self.t.chunk_dir(&self.chunk);
                let pdir = if partition.is_empty() { dir } else { dir.join(&partition) };
                std::fs::create_dir_all(&pdir).map_err(|e| TransformError::io(pdir.display(), e))?;
                static JOBS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let job = JOBS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let tmp = paths::spool_part_temp(&pdir, &self.chunk, job);
                let f = std::fs::File::create(&tmp).map_err(|e| own_spool_file(&tmp, e))?;
                // A small buffer: it only gathers page headers and the footer; pages (hundreds of
                // KiB) are bigger and go straight to the file instead of being copied into it.
                let f = HashingWriter { inner: std::io::BufWriter::with_capacity(64 << 10, f), hasher: blake3::Hasher::new(), bytes: 0 };
                let w = FileWriter::new(f, rows.schema(), props, self.t.cfg.transform.row_group_size, &tmp)?;
                self.open.insert(partition.clone(), (tmp, w, 0));
            }
            let (tmp, w, n) = self.open.get_mut(&partition).expect("inserted");
            w.write(&rows, tmp)?;
            *n += rows.num_rows() as i64;
        }
        Ok(())
    }

    /// Closes every file; [`Written::persist`] makes each durable under its final name.
    fn finish(self) -> Result<Vec<Written>, TransformError> {
        let name = paths::part_name(&self.chunk);
        let mut parts = Vec::with_capacity(self.open.len());
        for (partition, (tmp, w, records)) in self.open {
            let hw = w.into_inner(&tmp)?;
            let (bytes, content_hash) = (hw.bytes, hw.hasher.finalize().to_hex().to_string());
            let f = hw.inner.into_inner().map_err(|e| TransformError::io(tmp.display(), e.into_error()))?;
            let part = Part {
                chunk_id: self.chunk.clone(),
                partition,
                name: name.clone(),
                records,
                bytes: bytes as i64,
                content_hash,
                stats: None,
            };
            parts.push(Written { file: f, tmp, part });
        }
        Ok(parts)
    }
}

/// A part file written under its temp name, not yet durable.
struct Written {
    file: std::fs::File,
    tmp: PathBuf,
    part: Part,
}

impl Written {
    /// fsync, then the deterministic name: durable before the ledger says so, because copy
    /// trusts the recorded hash of this file. The part's column statistics are read back from
    /// the footer written (one read of a file in the page cache), whichever writer wrote it.
    fn persist(mut self) -> Result<Part, TransformError> {
        self.file.sync_all().map_err(|e| TransformError::io(self.tmp.display(), e))?;
        let fin = self.tmp.with_file_name(&self.part.name);
        std::fs::rename(&self.tmp, &fin).map_err(|e| own_spool_file(&self.tmp, e))?;
        self.part.stats = Some(ferry_delta::stats::of_file(&fin).map_err(|e| TransformError::io(fin.display(), std::io::Error::other(e)))?);
        Ok(self.part)
    }
}

/// Dictionary encoding pays off for repeated values (hosts, kinds) and is wasted work on
/// unique ones (ids, payloads, timestamps, measurements): a profile showed it among the top
/// costs. Judge each string and 4/8-byte column on the chunk's first rows and switch the
/// dictionary off where most values differ.
fn tuned_props(base: &WriterProperties, sample: &RecordBatch) -> WriterProperties {
    use arrow::array::{Array, StringArray};
    let mut b = base.clone().into_builder();
    let n = sample.num_rows().min(2000);
    if n < 100 {
        return base.clone();
    }
    for (f, col) in sample.schema().fields().iter().zip(sample.columns()) {
        let distinct = if let Some(s) = col.as_any().downcast_ref::<StringArray>() {
            (0..n).filter(|&i| s.is_valid(i)).map(|i| s.value(i)).collect::<std::collections::HashSet<&str>>().len()
        } else if let Some(width) = col.data_type().primitive_width().filter(|w| *w == 8 || *w == 4) {
            // Timestamps, ids, measurements: compare the raw values.
            let data = col.to_data();
            let buf = &data.buffers()[0].as_slice()[data.offset() * width..];
            (0..n)
                .filter(|&i| col.is_valid(i))
                .map(|i| &buf[i * width..(i + 1) * width])
                .collect::<std::collections::HashSet<&[u8]>>()
                .len()
        } else {
            continue;
        };
        if distinct * 2 > n {
            b = b.set_column_dictionary_enabled(parquet::schema::types::ColumnPath::from(f.name().as_str()), false);
        }
    }
    b.build()
}

/// Puts Avro-decoded columns into the declared table columns: by name, cast to the declared
/// type exactly; a declared nullable column the file lacks is all nulls. A record whose value
/// does not fit (out of range, more precision than the column keeps, a null in a required
/// column) is returned as `(row, reason)` and left out, not changed, as are the rows in
/// `unfit` (found bad by the decoder), each once with its first reason.
#[allow(clippy::type_complexity)]
fn conform(
    b: &RecordBatch,
    schema: &SchemaRef,
    names: decode::Names,
    unfit: Vec<(usize, String)>,
    notes: &mut Vec<String>,
) -> Result<(RecordBatch, Vec<(usize, String)>), TransformError> {
    let mut cols: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    let mut bad: Vec<(usize, String)> = unfit;
    let unmatched: Vec<&str> = b
        .schema_ref()
        .fields()
        .iter()
        .filter(|g| !schema.fields().iter().any(|f| names.matches(g.name(), f.name())))
        .map(|g| g.name().as_str())
        .collect();
    let note = |notes: &mut Vec<String>, n: String| {
        if !notes.contains(&n) {
            tracing::warn!("{n}");
            notes.push(n);
        }
    };
    if !unmatched.is_empty() {
        note(notes, format!("Avro fields that match no column of the table are not loaded: {unmatched:?}"));
    }
    for f in schema.fields() {
        let found = b.schema().fields().iter().position(|g| names.matches(g.name(), f.name())).ok_or(());
        match found {
            Ok(i) => {
                let (col, rows) = exact::cast(b.column(i), f.data_type())?;
                bad.extend(rows.into_iter().map(|(r, why)| (r, format!("column {:?}: {why}", f.name()))));
                if !f.is_nullable() && col.null_count() > 0 {
                    for r in (0..col.len()).filter(|&r| col.is_null(r) && b.column(i).is_null(r)) {
                        bad.push((r, format!("column {:?} is required but null", f.name())));
                    }
                }
                cols.push(col);
            }
            Err(_) if f.is_nullable() => {
                note(notes, format!("the Avro schema has no field for column {:?}: it is null", f.name()));
                cols.push(new_null_array(f.data_type(), b.num_rows()))
            }
            Err(_) => {
                return Err(bad_input(format!("the Avro schema has no required column {:?}", f.name())));
            }
        }
    }
    bad.sort_by_key(|(r, _)| *r); // stable: a row's first reason stays first
    bad.dedup_by_key(|(r, _)| *r);
    // Built without the nullability check first: the rows that break it are the ones dropped.
    let loose = Arc::new(Schema::new(schema.fields().iter().map(|f| f.as_ref().clone().with_nullable(true)).collect::<Vec<_>>()));
    let all = RecordBatch::try_new(loose, cols).map_err(|e| bad_input(e.to_string()))?;
    let rows: Vec<usize> = bad.iter().map(|(r, _)| *r).collect();
    let kept = exact::without_rows(&all, &rows)?;
    let kept = RecordBatch::try_new(schema.clone(), kept.columns().to_vec()).map_err(|e| bad_input(e.to_string()))?;
    Ok((kept, bad))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every codec the configuration accepts writes Parquet that reads back: the parquet crate
    /// refuses at write time a codec it was built without, so a config that names one would
    /// fail every chunk.
    #[test]
    fn every_codec_the_configuration_accepts_writes_parquet() {
        use arrow::array::Int64Array;
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        let all = [
            config::Compression::Zstd,
            config::Compression::Snappy,
            config::Compression::Gzip,
            config::Compression::Lz4,
            config::Compression::None,
        ];
        // A codec added to the configuration must be added above.
        for c in all {
            match c {
                config::Compression::Zstd
                | config::Compression::Snappy
                | config::Compression::Gzip
                | config::Compression::Lz4
                | config::Compression::None => {}
            }
        }
        let batch = RecordBatch::try_from_iter([("v", Arc::new(Int64Array::from_iter_values(0..1000)) as ArrayRef)]).unwrap();
        for c in all {
            let t = config::TransformSection { compression: c, ..Default::default() };
            let props = WriterProperties::builder().set_compression(parquet_codec(&t).unwrap()).build();
            let mut out = Vec::new();
            let mut w = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
            w.write(&batch).unwrap_or_else(|e| panic!("{c:?}: {e}"));
            w.close().unwrap_or_else(|e| panic!("{c:?}: {e}"));
            let back: Vec<RecordBatch> =
                ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(out)).unwrap().build().unwrap().map(|b| b.unwrap()).collect();
            assert_eq!(back, vec![batch.clone()], "{c:?}");
        }
    }
}
