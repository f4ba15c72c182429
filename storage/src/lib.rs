//! One storage abstraction for source, staging and destination, chosen by URL scheme.
//!
//! `file://` URLs and plain paths are local directories (a NAS mount looks the same);
//! `hdfs://` and `viewfs://` go through hdfs-native ([`hdfs`]); `s3://`, `gs://` and `az://`
//! through object_store, one backend for the three ([`objects`]) with what each service alone
//! needs in its own module. Each is a [`Backend`]; [`Store`] holds one and adds what is the same
//! for all.
//! Callers never branch on the backend.
//!
//! Every method takes paths relative to the store's root, with `/` separators, and every
//! method ends: network calls run under `call_timeout`, streams under a no-progress watchdog.
//! Each backend's module opens with its publish protocol: what `upload` followed by
//! `rename_noreplace` means there, and what an ambiguous failure leaves behind.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::options::StoreOptions;
use ferry_common::{crash, paths};

mod azure;
mod backend;
mod error;
mod gcs;
pub mod hdfs;
mod kerberos;
mod local;
mod objects;
pub mod options;
mod retry;
mod s3;
mod transfer;

pub use backend::{Backend, Capabilities};
pub use error::{Error, Result};
pub use local::{LocalStore, Unsynced, hash_file, remove_quiet_dirs, write_atomic};
pub use retry::Backoff;
pub use transfer::{InCall, Progress, watched};
use transfer::{ReadAhead, StreamReader, drain, drain_hash};

/// The outcome of several cleanup steps: how many files went in all, or, if a step failed,
/// [`Error::Incomplete`] with that count and the first failure.
pub fn combine(steps: Vec<Result<usize>>) -> Result<usize> {
    let (mut n, mut first) = (0, None);
    for r in steps {
        match r {
            Ok(k) => n += k,
            Err(e) => {
                n += e.removed();
                first.get_or_insert(e.to_string());
            }
        }
    }
    match first {
        None => Ok(n),
        Some(reason) => Err(Error::Incomplete { removed: n, reason }),
    }
}

/// Cleanups a store runs in the background (an abort of a multipart upload that a watchdog
/// cut off), counted so that a process can let them finish before it exits.
static BACKGROUND: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One background cleanup in flight, while it lives.
pub(crate) struct Background;

impl Background {
    pub(crate) fn start() -> Background {
        BACKGROUND.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Background
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        BACKGROUND.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Waits, at most `limit`, until no background cleanup of any store is running: a `--once`
/// run calls it before it exits, so an abort it started is not cut off with the process.
/// Returns how many were still running.
pub async fn background_settled(limit: std::time::Duration) -> usize {
    let until = tokio::time::Instant::now() + limit;
    loop {
        let n = BACKGROUND.load(std::sync::atomic::Ordering::SeqCst);
        if n == 0 || tokio::time::Instant::now() >= until {
            return n;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A write prepared by [`Store::prepare_put`], not yet visible.
#[derive(Debug)]
#[must_use = "a prepared write appears only when committed"]
pub struct Prepared {
    rel: String,
    bytes: Vec<u8>,
    /// The temp file already written (HDFS).
    temp: Option<String>,
}

/// A store: one [`Backend`], and what every backend's callers need on top of it.
#[derive(Debug, Clone)]
pub struct Store(Arc<dyn Backend>);

/// A temp file or multipart upload a crashed copy may have left (see [`Store::abandoned`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Abandoned {
    /// The file's store path, or the upload's key.
    pub rel: String,
    /// The chunk its name is for.
    pub chunk: String,
    /// The multipart upload's id; None for a file.
    pub upload: Option<String>,
}

/// What a listing of a source directory found: the files, and the entries it set aside
/// instead of failing the whole listing (a name that is not UTF-8, an unreadable directory,
/// an S3 key that is not a valid path), each as (name as shown, why).
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub entries: Vec<Entry>,
    pub set_aside: Vec<(String, String)>,
}

/// A file in a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub rel: String,
    pub size: u64,
    pub mtime_ms: i64,
    /// What changes whenever the file is rewritten, even to the same size and mtime: a local
    /// file's device, inode and ctime (no writer can set ctime back), an S3 object's ETag.
    /// None where the store has nothing of the kind (HDFS): such files are always hashed.
    pub change_token: Option<String>,
}

/// A change to a store between two crash points (debug builds: see [`ferry_common::crash`]), so
/// that a test can kill the process just before it or just after it.
async fn step<T>(what: &str, op: impl Future<Output = T>) -> T {
    crash::point(what);
    let r = op.await;
    crash::point(what);
    r
}

/// What [`Store::prober`] gives for a name: the probe's outcome as text (see [`Store::probe`]).
pub type ProbeFuture = std::pin::Pin<Box<dyn Future<Output = std::result::Result<Option<String>, String>> + Send>>;

impl Store {
    /// A store with default options (see [`Store::open`]).
    pub fn from_url(url: &str) -> Result<Store> {
        Store::open(url, &StoreOptions::default())
    }

    /// `file:///abs/dir`, `/abs/dir`, `rel/dir`, `hdfs://nn-or-nameservice/dir`,
    /// `viewfs://cluster/dir`, `s3://bucket/prefix`, `gs://bucket/prefix` or
    /// `az://container/prefix`. Other schemes are named in the error.
    pub fn open(url: &str, opts: &StoreOptions) -> Result<Store> {
        let path = if let Some(p) = url.strip_prefix("file://") {
            p
        } else if url.starts_with("hdfs://") || url.starts_with("viewfs://") {
            return Ok(Store(Arc::new(hdfs::HdfsStore::new(url, opts)?)));
        } else if url.starts_with("s3://") || url.starts_with("s3a://") {
            return Ok(Store(Arc::new(s3::open(url, opts)?)));
        } else if url.starts_with("gs://") {
            return Ok(Store(Arc::new(gcs::open(url, opts)?)));
        } else if url.starts_with("az://") {
            return Ok(Store(Arc::new(azure::open(url, opts)?)));
        } else if let Some((scheme, _)) = url.split_once("://") {
            return Err(Error::Config {
                file: url.to_string(),
                message: format!(
                    "storage scheme {scheme}:// is not supported (file://, plain paths, hdfs://, viewfs://, s3://, gs://, az://)"
                ),
            });
        } else {
            url
        };
        if path.is_empty() {
            return Err(Error::Config { file: url.to_string(), message: "empty storage path".into() });
        }
        Ok(Store(Arc::new(LocalStore::new(PathBuf::from(path), opts.call_timeout.0))))
    }

    /// The same store on its own connections, for one chunk's work: a connection that hangs
    /// or breaks then holds back that chunk only, never the others (hdfs-native multiplexes
    /// every call of a client over one NameNode connection).
    pub fn isolated(&self) -> Result<Store> {
        Ok(self.0.isolated()?.map_or_else(|| self.clone(), Store))
    }

    /// Multipart uploads (key, id) under the store's root started before `cutoff_ms` and
    /// never completed: what gc would abort. Only S3 has them.
    pub async fn abandoned_uploads(&self, cutoff_ms: i64) -> Result<Vec<(String, String)>> {
        self.0.abandoned_uploads(cutoff_ms).await
    }

    /// Whether an upload can go straight to its final name. True on S3, where an upload is
    /// atomic (a PUT or a completed multipart upload appears whole or not at all) and a rename
    /// would be a second copy of every byte; false where files grow in place (local, HDFS) and a
    /// temp name keeps half-written files out of sight.
    pub fn uploads_in_place(&self) -> bool {
        self.0.capabilities().uploads_in_place
    }

    /// What this store's backend can do that others cannot (see [`Capabilities`]).
    pub fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    /// What crashed copies of `table` may have left in this destination, older than
    /// `cutoff_ms`: temp files under `_ferry/tmp` and, on S3, multipart uploads started before
    /// it, each with the chunk its name is for. Only names Ferry writes are listed (a copy temp
    /// name; an upload to one, or in place to a landed or published part of `table`): another
    /// tool's file or upload under the same root is never a candidate. Which chunks are this
    /// pipeline's is the ledger's to say ([`Store::remove_abandoned`] takes the chosen ones).
    pub async fn abandoned(&self, table: &str, cutoff_ms: i64) -> Result<Vec<Abandoned>> {
        let mut found = Vec::new();
        for e in self.list(paths::COPY_TEMP_DIR).await? {
            if e.mtime_ms < cutoff_ms
                && let Some((chunk, ..)) = paths::parse_copy_temp(&e.rel)
            {
                found.push(Abandoned { chunk: chunk.to_string(), rel: e.rel.clone(), upload: None });
            }
        }
        {
            for (key, id) in self.0.abandoned_uploads(cutoff_ms).await? {
                let Some(rel) = self.0.rel_of_key(&key) else { continue };
                let chunk = paths::parse_copy_temp(rel)
                    .map(|(c, ..)| c)
                    .or_else(|| paths::parse_landed(table, rel).map(|(c, _)| c))
                    .or_else(|| paths::parse_table_file(table, rel));
                if let Some(chunk) = chunk {
                    found.push(Abandoned { chunk: chunk.to_string(), rel: key.clone(), upload: Some(id) });
                }
            }
        }
        Ok(found)
    }

    /// Removes what [`Store::abandoned`] found and the caller chose: temp files are deleted,
    /// uploads aborted. Returns how many went; a failure part-way is [`Error::Incomplete`],
    /// which still says how many went.
    pub async fn remove_abandoned(&self, chosen: &[Abandoned]) -> Result<usize> {
        let (mut n, mut first) = (0, None);
        for a in chosen.iter().filter(|a| a.upload.is_none()) {
            tracing::info!(file = %self.url(&a.rel), chunk = %a.chunk, "removing an abandoned temp file");
            match self.delete(&a.rel).await {
                Ok(()) => n += 1,
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        let uploads: Vec<(String, String)> = chosen.iter().filter_map(|a| Some((a.rel.clone(), a.upload.clone()?))).collect();
        let aborted = if uploads.is_empty() { Ok(0) } else { self.0.abort_uploads(&uploads).await };
        let files = match first {
            None => Ok(n),
            Some(e) => Err(Error::Incomplete { removed: n, reason: e.to_string() }),
        };
        combine(vec![files, aborted])
    }

    /// The URL of a path in this store, as recorded in the ledger.
    pub fn url(&self, rel: &str) -> String {
        self.0.url(rel)
    }

    /// The store's path for a URL this store produced with [`Store::url`], if it is one.
    pub fn rel_of(&self, url: &str) -> Option<String> {
        self.0.rel_of(url)
    }

    /// Every file below `dir` (recursively), with sizes and modification times.
    pub async fn list(&self, dir: &str) -> Result<Vec<Entry>> {
        self.0.list(dir).await
    }

    /// [`Store::list`] of a source: one odd entry (a name that is not UTF-8, a directory
    /// without permission, an S3 key with `//`, a `.` or `..` segment or a control character)
    /// is set aside with its reason, and the others are listed.
    pub async fn list_source(&self, dir: &str) -> Result<Listing> {
        self.0.list_source(dir).await
    }

    /// The names directly under `dir` (files and directories), sorted; none if it is missing.
    /// One call on HDFS and S3, where [`Store::list`] of a tree makes one per directory.
    pub async fn children(&self, dir: &str) -> Result<Vec<String>> {
        let mut names = self.0.children(dir).await?;
        names.sort();
        Ok(names)
    }

    /// A cheap call of the store's own, to tell a store that is down from a chunk that fails
    /// on its own: the metadata of a name below the root (absent is an answer too). `Ok(None)`
    /// when the store answered; `Ok(Some(refusal))` when it answered with an error a later
    /// call cannot change (a login or a permission it refuses: up, and unusable with these
    /// settings); the error when it did not answer in time or the connection failed.
    pub async fn probe(&self) -> Result<Option<Error>> {
        match self.head(paths::PROBE).await {
            Ok(_) => Ok(None),
            Err(e) if !e.is_transient() => Ok(Some(e)),
            Err(e) => Err(e),
        }
    }

    /// [`Store::probe`] of this store under the name a stage's errors give it (`destination`),
    /// as the stage runner takes it: a future for that name, none for any other.
    /// The probe shares the store's clients: it asks the way the chunks went.
    pub fn prober(self, name: &'static str) -> impl Fn(&'static str) -> Option<ProbeFuture> + Send + Sync {
        move |store| {
            let me = self.clone();
            (store == name).then(|| {
                Box::pin(async move {
                    let text = |e: Error| ferry_common::error::with_causes(&e);
                    me.probe().await.map(|refusal| refusal.map(text)).map_err(text)
                }) as _
            })
        }
    }

    pub async fn head(&self, rel: &str) -> Result<Option<Entry>> {
        self.0.head(rel).await
    }

    pub async fn read(&self, rel: &str) -> Result<Vec<u8>> {
        self.0.read(rel).await
    }

    /// A blocking reader, for callers already on a blocking thread (splitting large files).
    pub fn open_blocking(&self, rel: &str) -> Result<Box<dyn Read + Send>> {
        self.0.open_blocking(rel)
    }

    /// A blocking reader opened now, on the runtime, whose bytes a task fetches up to `ahead`
    /// in front of the reader where they come over the network (HDFS, object stores), so the
    /// network's waits overlap the reader's work; a local file as [`Store::open_blocking`].
    pub async fn open_ahead(&self, rel: &str, ahead: usize) -> Result<Box<dyn Read + Send>> {
        self.0.open_ahead(rel, ahead).await
    }

    /// Writes `bytes` so that `rel` either does not exist or holds all of them: a temp name in
    /// the same directory, fsync, then rename over `rel`.
    pub async fn put_atomic(&self, rel: &str, bytes: Vec<u8>) -> Result<()> {
        step("put", self.0.put_atomic(rel, bytes)).await
    }

    /// Does the slow half of [`Store::put_atomic`] now, so that it can run side by side with
    /// other work before the file is to appear: on HDFS it writes the temp file, whose close
    /// waits for the DataNode's block report (hdfs-native sleeps 500 ms); elsewhere it only
    /// keeps the bytes (a local write or an S3 PUT is quick, and an S3 PUT is visible at once).
    /// [`Store::commit`] makes the file appear under `rel`; [`Store::discard`] drops it.
    pub async fn prepare_put(&self, rel: &str, bytes: Vec<u8>) -> Result<Prepared> {
        let temp = step("write temp", self.0.write_temp(rel, bytes::Bytes::from(bytes.clone()))).await?;
        Ok(Prepared { rel: rel.to_string(), bytes, temp })
    }

    /// Makes a prepared write appear under its name, replacing what is there.
    pub async fn commit(&self, p: Prepared) -> Result<()> {
        step("commit", self.commit_now(p)).await
    }

    async fn commit_now(&self, p: Prepared) -> Result<()> {
        match p.temp {
            Some(tmp) => match self.0.rename_over(&tmp, &p.rel).await {
                Ok(()) => Ok(()),
                // The rename failed and its temp file is gone (or was taken away: a gc with a
                // cut-off shorter than this write): the whole write once more.
                Err(e) if e.is_transient() || e.is_not_found() => self.0.put_atomic(&p.rel, p.bytes).await,
                Err(e) => Err(e),
            },
            None => self.0.put_atomic(&p.rel, p.bytes).await,
        }
    }

    /// Drops a prepared write that is not to appear (best effort: gc takes a temp file left).
    pub async fn discard(&self, p: Prepared) {
        if let Some(tmp) = p.temp
            && let Err(e) = self.delete(&tmp).await
        {
            tracing::warn!(file = %self.url(&tmp), error = %e, "cannot remove a temp file; gc will");
        }
    }

    /// [`Store::put_atomic`] for callers already on a blocking thread.
    pub fn put_atomic_blocking(&self, rel: &str, bytes: &[u8]) -> Result<()> {
        crash::point("put");
        let r = self.0.put_atomic_blocking(rel, bytes);
        crash::point("put");
        r
    }

    /// Renames `from` to `to` unless `to` exists. Returns false (and changes nothing) if it does.
    pub async fn rename_noreplace(&self, from: &str, to: &str) -> Result<bool> {
        step("rename", self.0.rename_noreplace(from, to)).await
    }

    /// Creates `rel` with `bytes` unless it exists (put-if-absent): true if this call created
    /// it, false if another writer's file is there. What a Delta commit is made of.
    pub async fn create_new(&self, rel: &str, bytes: Vec<u8>) -> Result<bool> {
        step("create", self.0.create_new(rel, bytes::Bytes::from(bytes))).await
    }

    /// Removes a file; a missing file is not an error.
    pub async fn delete(&self, rel: &str) -> Result<()> {
        step("delete", self.0.delete(rel)).await
    }

    /// Streams a local file to `rel`, hashing what it sends. `progress` is bumped after each
    /// block so a watchdog can tell a stalled transfer from a slow one.
    pub async fn upload(&self, local: &Path, rel: &str, progress: Progress) -> Result<(u64, String)> {
        self.upload_checked(local, rel, None, progress).await
    }

    /// [`Store::upload`], told the blake3 the bytes must have. S3 then names it in the object's
    /// metadata up front and hashes while sending (one pass instead of two), and never completes
    /// an upload whose bytes differ (the returned hash tells the caller). Others ignore it.
    pub async fn upload_checked(&self, local: &Path, rel: &str, expected: Option<&str>, progress: Progress) -> Result<(u64, String)> {
        step("upload", self.0.upload(local, rel, expected, progress)).await
    }

    /// Streams local file `local` to `rel`, replacing what is there, so that `rel` holds either
    /// what it held or all of the file: sent to a temp name beside it and renamed over it
    /// (on S3 an upload completes whole or not at all, in place). Never holds the file in
    /// memory. Bounded by the caller's deadline and watchdog (it moves `progress`); a temp file
    /// of a failed send is removed, and one a crash leaves is a `.<name>.tmp`.
    pub async fn put_file(&self, local: &Path, rel: &str, progress: Progress) -> Result<(u64, String)> {
        step("put file", self.put_file_now(local, rel, progress)).await
    }

    async fn put_file_now(&self, local: &Path, rel: &str, progress: Progress) -> Result<(u64, String)> {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = match rel.rsplit_once('/') {
            Some((dir, name)) => format!("{dir}/{}", paths::atomic_temp(name, seq)),
            None => paths::atomic_temp(rel, seq),
        };
        if self.uploads_in_place() {
            return self.0.upload(local, rel, None, progress).await;
        }
        // The rename settles an ambiguous failure itself (HDFS); a temp file either leaves is
        // removed here.
        let sent = match self.0.upload(local, &tmp, None, progress).await {
            Ok(sent) => self.0.rename_over(&tmp, rel).await.map(|()| sent),
            Err(e) => Err(e),
        };
        if sent.is_err() {
            let _ = self.0.delete(&tmp).await;
        }
        sent
    }

    /// A local directory store, for callers that write its files on this machine directly.
    pub fn as_local(&self) -> Option<&LocalStore> {
        self.0.as_local()
    }

    /// Where `rel` is on this machine's file system, for a local directory store.
    pub fn local_path(&self, rel: &str) -> Option<PathBuf> {
        self.0.as_local().map(|l| l.path(rel))
    }

    /// Removes temp files (`.<name>.tmp`, left by a writer that crashed) below `dir` whose
    /// mtime is before `cutoff_ms`. Returns how many went.
    pub async fn remove_stale_temps(&self, dir: &str, cutoff_ms: i64) -> Result<usize> {
        self.remove_old(dir, cutoff_ms, paths::is_temp).await
    }

    /// Deletes the files below `dir` older than `cutoff_ms` whose base name passes `take`. The
    /// listing is asked again once after a transient failure (a hung connection costs a retry,
    /// not the cleanup); a file that cannot be deleted is skipped, the others still go, and the
    /// result says how many went ([`Error::Incomplete`]).
    async fn remove_old(&self, dir: &str, cutoff_ms: i64, take: impl Fn(&str) -> bool) -> Result<usize> {
        let listed = match self.list(dir).await {
            Err(e) if e.is_transient() => {
                tracing::info!(dir = %self.url(dir), error = %e, "listing failed; asking again");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                self.list(dir).await?
            }
            r => r?,
        };
        let (mut n, mut failed, mut first) = (0, 0, None);
        for e in listed {
            let base = e.rel.rsplit('/').next().unwrap_or(&e.rel);
            if e.mtime_ms < cutoff_ms && take(base) {
                tracing::info!(file = %self.url(&e.rel), "removing an abandoned temp file");
                match self.delete(&e.rel).await {
                    Ok(()) => n += 1,
                    Err(err) => {
                        tracing::warn!(file = %self.url(&e.rel), error = %err, "cannot remove an abandoned temp file; the next gc will try again");
                        failed += 1;
                        first.get_or_insert(err.to_string());
                    }
                }
            }
        }
        match first {
            None => Ok(n),
            Some(reason) => Err(Error::Incomplete { removed: n, reason: format!("{failed} file(s) not removed, the first: {reason}") }),
        }
    }

    /// Hashes a stored file (to check a landed or published file after an ambiguous failure).
    pub async fn hash(&self, rel: &str) -> Result<(u64, String)> {
        self.0.hash(rel).await
    }
}

/// An HTTP client for a service beside the stores (an Iceberg REST catalog) under `limits`: the
/// stores' TLS (ring, the extra CAs of `ca_bundle`), plain HTTP only if allowed, and their
/// connect, request and read timeouts. `section` names the settings in errors.
pub fn http_client(limits: &options::ObjectLimits, section: &str) -> std::result::Result<object_store::client::HttpClient, String> {
    let t = objects::Transport { limits: limits.clone(), read_stall: limits.read_timeout };
    let co = t.client_options(section)?;
    t.http_client(&co)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cleanup_that_fails_part_way_still_counts_what_went() {
        assert_eq!(combine(vec![Ok(2), Ok(3)]).unwrap(), 5);
        let e = combine(vec![Ok(2), Err(Error::Incomplete { removed: 4, reason: "a delete hung".into() }), Err(Error::Other("x".into()))])
            .unwrap_err();
        assert_eq!(e.removed(), 6, "{e}");
        assert!(e.to_string().contains("a delete hung"), "{e}");
    }
}
