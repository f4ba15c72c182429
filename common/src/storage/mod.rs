//! One storage abstraction for source, staging and destination, chosen by URL scheme.
//!
//! `file://` URLs and plain paths are local directories (a NAS mount looks the same);
//! `hdfs://` and `viewfs://` go through hdfs-native ([`hdfs`]); `s3://` through object_store
//! ([`s3`]). Callers never branch on the backend.
//!
//! Every method takes paths relative to the store's root, with `/` separators, and every
//! method ends: network calls run under `call_timeout`, streams under a no-progress watchdog.
//! Each backend's module opens with its publish protocol: what `upload` followed by
//! `rename_noreplace` means there, and what an ambiguous failure leaves behind.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::StoreOptions;
use crate::error::{Error, Result};

pub mod hdfs;
pub mod s3;

#[derive(Debug, Clone)]
pub enum Store {
    Local(LocalStore),
    Hdfs(std::sync::Arc<hdfs::HdfsStore>),
    S3(std::sync::Arc<s3::S3Store>),
}

#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
    /// A hard-mounted NAS that stops answering blocks a syscall forever: every call gets a
    /// deadline (the thread may stay stuck, the caller does not).
    call_timeout: Duration,
}

/// A file in a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub rel: String,
    pub size: u64,
    pub mtime_ms: i64,
}

impl Store {
    /// A store with default options (see [`Store::open`]).
    pub fn from_url(url: &str) -> Result<Store> {
        Store::open(url, &StoreOptions::default())
    }

    /// `file:///abs/dir`, `/abs/dir`, `rel/dir`, `hdfs://nn-or-nameservice/dir`,
    /// `viewfs://cluster/dir` or `s3://bucket/prefix`. Other schemes are named in the error.
    pub fn open(url: &str, opts: &StoreOptions) -> Result<Store> {
        let path = if let Some(p) = url.strip_prefix("file://") {
            p
        } else if url.starts_with("hdfs://") || url.starts_with("viewfs://") {
            return Ok(Store::Hdfs(std::sync::Arc::new(hdfs::HdfsStore::new(url, opts)?)));
        } else if url.starts_with("s3://") || url.starts_with("s3a://") {
            return Ok(Store::S3(std::sync::Arc::new(s3::S3Store::new(url, opts)?)));
        } else if let Some((scheme, _)) = url.split_once("://") {
            return Err(Error::Config {
                file: url.to_string(),
                message: format!("storage scheme {scheme}:// is not supported (file://, plain paths, hdfs://, viewfs://, s3://)"),
            });
        } else {
            url
        };
        if path.is_empty() {
            return Err(Error::Config { file: url.to_string(), message: "empty storage path".into() });
        }
        Ok(Store::Local(LocalStore { root: PathBuf::from(path), call_timeout: opts.call_timeout.0 }))
    }

    /// The same store on its own connections, for one chunk's work: a connection that hangs
    /// or breaks then holds back that chunk only, never the others (hdfs-native multiplexes
    /// every call of a client over one NameNode connection).
    pub fn isolated(&self) -> Result<Store> {
        Ok(match self {
            Store::Hdfs(h) => Store::Hdfs(std::sync::Arc::new(h.isolated()?)),
            other => other.clone(),
        })
    }

    /// Multipart uploads (key, id) under the store's root started before `cutoff_ms` and
    /// never completed: what gc would abort. Only S3 has them.
    pub async fn abandoned_uploads(&self, cutoff_ms: i64) -> Result<Vec<(String, String)>> {
        match self {
            Store::S3(s) => s.abandoned_uploads(cutoff_ms).await,
            _ => Ok(vec![]),
        }
    }

    /// Whether an upload can go straight to its final name. True on S3, where an upload is
    /// atomic (a PUT or a completed multipart upload appears whole or not at all) and a rename
    /// would be a second copy of every byte; false where files grow in place (local, HDFS) and a
    /// temp name keeps half-written files out of sight.
    pub fn uploads_in_place(&self) -> bool {
        matches!(self, Store::S3(_))
    }

    /// Removes what crashed writers left behind below `dir`: temp files older than
    /// `cutoff_ms` and, on S3, multipart uploads started before it. Returns how many went.
    pub async fn gc(&self, dir: &str, cutoff_ms: i64) -> Result<usize> {
        let mut n = self.remove_old(dir, cutoff_ms, |_| true).await?;
        if let Store::S3(s) = self {
            n += s.abort_uploads(cutoff_ms).await?;
        }
        Ok(n)
    }

    /// The URL of a path in this store, as recorded in the ledger.
    pub fn url(&self, rel: &str) -> String {
        match self {
            Store::Local(l) => format!("file://{}", l.abs(rel).display()),
            Store::Hdfs(h) => h.url(rel),
            Store::S3(s) => s.url(rel),
        }
    }

    /// The store's path for a URL this store produced with [`Store::url`], if it is one.
    pub fn rel_of(&self, url: &str) -> Option<String> {
        match self {
            Store::Local(l) => {
                let p = url.strip_prefix("file://").unwrap_or(url);
                Path::new(p).strip_prefix(&l.root).ok().map(|r| r.to_string_lossy().into_owned())
            }
            Store::Hdfs(h) => h.rel_of(url),
            Store::S3(s) => s.rel_of(url),
        }
    }

    /// Every file below `dir` (recursively), with sizes and modification times.
    pub async fn list(&self, dir: &str) -> Result<Vec<Entry>> {
        match self {
            Store::Local(l) => {
                let (root, start) = (l.root.clone(), l.abs(dir));
                blocking(l.call_timeout * 4, "list", move || {
                    let mut out = Vec::new();
                    if start.exists() {
                        walk(&root, &start, &mut out)?;
                    }
                    out.sort_by(|a, b| a.rel.cmp(&b.rel));
                    Ok(out)
                })
                .await
            }
            Store::Hdfs(h) => h.list(dir).await,
            Store::S3(s) => s.list(dir).await,
        }
    }

    pub async fn head(&self, rel: &str) -> Result<Option<Entry>> {
        match self {
            Store::Local(l) => {
                let p = l.abs(rel);
                let rel = rel.to_string();
                blocking(l.call_timeout, "stat", move || match std::fs::metadata(&p) {
                    Ok(m) => Ok(Some(Entry { rel, size: m.len(), mtime_ms: mtime_ms(&m) })),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(Error::io(p.display(), e)),
                })
                .await
            }
            Store::Hdfs(h) => h.head(rel).await,
            Store::S3(s) => s.head(rel).await,
        }
    }

    pub async fn read(&self, rel: &str) -> Result<Vec<u8>> {
        match self {
            Store::Local(l) => {
                let p = l.abs(rel);
                blocking(l.call_timeout * 4, "read", move || std::fs::read(&p).map_err(|e| Error::io(p.display(), e))).await
            }
            Store::Hdfs(h) => h.read(rel).await,
            Store::S3(s) => s.read(rel).await,
        }
    }

    /// A blocking reader, for callers already on a blocking thread (splitting large files).
    pub fn open_blocking(&self, rel: &str) -> Result<Box<dyn Read + Send>> {
        match self {
            Store::Local(l) => {
                let p = l.abs(rel);
                let f = std::fs::File::open(&p).map_err(|e| Error::io(p.display(), e))?;
                Ok(Box::new(f))
            }
            Store::Hdfs(h) => h.open_blocking(rel),
            Store::S3(s) => s.open_blocking(rel),
        }
    }

    /// Writes `bytes` so that `rel` either does not exist or holds all of them: a temp name in
    /// the same directory, fsync, then rename over `rel`.
    pub async fn put_atomic(&self, rel: &str, bytes: Vec<u8>) -> Result<()> {
        match self {
            Store::Local(l) => {
                let p = l.abs(rel);
                blocking(l.call_timeout * 4, "write", move || write_atomic(&p, &bytes)).await
            }
            Store::Hdfs(h) => h.put_atomic(rel, bytes).await,
            Store::S3(s) => s.put_atomic(rel, bytes).await,
        }
    }

    /// [`Store::put_atomic`] for callers already on a blocking thread.
    pub fn put_atomic_blocking(&self, rel: &str, bytes: &[u8]) -> Result<()> {
        match self {
            Store::Local(l) => write_atomic(&l.abs(rel), bytes),
            Store::Hdfs(h) => h.put_atomic_blocking(rel, bytes),
            Store::S3(s) => s.put_atomic_blocking(rel, bytes),
        }
    }

    /// Renames `from` to `to` unless `to` exists. Returns false (and changes nothing) if it does.
    pub async fn rename_noreplace(&self, from: &str, to: &str) -> Result<bool> {
        match self {
            Store::Local(l) => {
                let (a, b) = (l.abs(from), l.abs(to));
                blocking(l.call_timeout, "rename", move || {
                    if let Some(dir) = b.parent() {
                        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), e))?;
                    }
                    // link(2) fails if the target exists, which makes this atomic and
                    // no-overwrite; then the source name goes.
                    match std::fs::hard_link(&a, &b) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
                        Err(e) => return Err(Error::io(format!("{} -> {}", a.display(), b.display()), e)),
                    }
                    std::fs::remove_file(&a).map_err(|e| Error::io(a.display(), e))?;
                    sync_dir(&b);
                    Ok(true)
                })
                .await
            }
            Store::Hdfs(h) => h.rename_noreplace(from, to).await,
            Store::S3(s) => s.rename_noreplace(from, to).await,
        }
    }

    /// Removes a file; a missing file is not an error.
    pub async fn delete(&self, rel: &str) -> Result<()> {
        match self {
            Store::Local(l) => {
                let p = l.abs(rel);
                blocking(l.call_timeout, "delete", move || match std::fs::remove_file(&p) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(p.display(), e)),
                    _ => Ok(()),
                })
                .await
            }
            Store::Hdfs(h) => h.delete(rel).await,
            Store::S3(s) => s.delete(rel).await,
        }
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
        match self {
            Store::Local(l) => {
                let (src, dst) = (local.to_path_buf(), l.abs(rel));
                // Bounded by the caller's deadline and watchdog (it moves `progress`).
                blocking(Duration::MAX, "upload", move || {
                    if let Some(dir) = dst.parent() {
                        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), e))?;
                    }
                    let mut r = std::fs::File::open(&src).map_err(|e| Error::io(src.display(), e))?;
                    let mut w = std::fs::File::create(&dst).map_err(|e| Error::io(dst.display(), e))?;
                    let mut h = blake3::Hasher::new();
                    let mut buf = vec![0u8; 1 << 20];
                    let mut n = 0u64;
                    loop {
                        if progress.cancelled() {
                            return Err(Error::Other(format!("upload to {} cancelled", dst.display())));
                        }
                        let k = r.read(&mut buf).map_err(|e| Error::io(src.display(), e))?;
                        if k == 0 {
                            break;
                        }
                        w.write_all(&buf[..k]).map_err(|e| Error::io(dst.display(), e))?;
                        h.update(&buf[..k]);
                        n += k as u64;
                        progress.add(k as u64);
                    }
                    w.sync_all().map_err(|e| Error::io(dst.display(), e))?;
                    Ok((n, h.finalize().to_hex().to_string()))
                })
                .await
            }
            Store::Hdfs(h) => h.upload(local, rel, progress).await,
            Store::S3(s) => s.upload(local, rel, expected, progress).await,
        }
    }

    /// Removes temp files (`.<name>.tmp`, left by a writer that crashed) below `dir` whose
    /// mtime is before `cutoff_ms`. Returns how many went.
    pub async fn remove_stale_temps(&self, dir: &str, cutoff_ms: i64) -> Result<usize> {
        self.remove_old(dir, cutoff_ms, |base| base.starts_with('.') && base.ends_with(".tmp")).await
    }

    /// Deletes the files below `dir` older than `cutoff_ms` whose base name passes `take`.
    async fn remove_old(&self, dir: &str, cutoff_ms: i64, take: impl Fn(&str) -> bool) -> Result<usize> {
        let mut n = 0;
        for e in self.list(dir).await? {
            let base = e.rel.rsplit('/').next().unwrap_or(&e.rel);
            if e.mtime_ms < cutoff_ms && take(base) {
                tracing::info!(file = %self.url(&e.rel), "removing an abandoned temp file");
                self.delete(&e.rel).await?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Hashes a stored file (to check a landed or published file after an ambiguous failure).
    pub async fn hash(&self, rel: &str) -> Result<(u64, String)> {
        match self {
            Store::Local(l) => {
                let p = l.abs(rel);
                blocking(l.call_timeout * 4, "hash", move || hash_file(&p)).await
            }
            Store::Hdfs(h) => h.hash(rel).await,
            Store::S3(s) => s.hash(rel).await,
        }
    }
}

impl LocalStore {
    fn abs(&self, rel: &str) -> PathBuf {
        let rel = rel.trim_start_matches('/');
        if rel.is_empty() { self.root.clone() } else { self.root.join(rel) }
    }
}

/// Bytes moved by a transfer, shared with its watchdog; also carries cancellation.
#[derive(Debug, Clone, Default)]
pub struct Progress(std::sync::Arc<(std::sync::atomic::AtomicU64, std::sync::atomic::AtomicBool)>);

impl Progress {
    pub fn add(&self, n: u64) {
        self.0.0.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
    pub fn bytes(&self) -> u64 {
        self.0.0.load(std::sync::atomic::Ordering::Relaxed)
    }
    pub fn cancel(&self) {
        self.0.1.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    pub fn cancelled(&self) -> bool {
        self.0.1.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Runs `fut` under a total `deadline` and a no-progress watchdog: if `progress` does not move
/// for `stall`, the transfer is abandoned. Either way the error is transient (retry the chunk).
pub async fn watched<T>(
    what: &str,
    deadline: Duration,
    stall: Duration,
    progress: Progress,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let watchdog = {
        let progress = progress.clone();
        async move {
            let mut last = progress.bytes();
            let tick = (stall / 4).max(Duration::from_millis(10));
            let mut idle = Duration::ZERO;
            loop {
                tokio::time::sleep(tick).await;
                let now = progress.bytes();
                if now == last { idle += tick } else { idle = Duration::ZERO }
                last = now;
                if idle >= stall {
                    return now;
                }
            }
        }
    };
    // Dropped before it ends (a hedge lost, a lease was lost): tell the transfer to stop too.
    struct CancelOnDrop(Progress, bool);
    impl Drop for CancelOnDrop {
        fn drop(&mut self) {
            if !self.1 {
                self.0.cancel();
            }
        }
    }
    let mut guard = CancelOnDrop(progress.clone(), false);
    let res = tokio::select! {
        r = tokio::time::timeout(deadline, fut) => match r {
            Ok(r) => r,
            Err(_) => Err(Error::Stalled { what: what.to_string(), reason: format!("did not finish within its deadline of {deadline:?}") }),
        },
        moved = watchdog => Err(Error::Stalled {
            what: what.to_string(),
            reason: format!("no progress for {stall:?} after {moved} bytes"),
        }),
    };
    if res.is_err() {
        progress.cancel();
    }
    guard.1 = true;
    res
}

/// Feeds every piece of `s` to `f`, waiting at most `stall` for each one (a read's
/// no-progress watchdog); returns the bytes seen.
pub(crate) async fn drain(
    what: &str,
    stall: Duration,
    mut s: futures::stream::BoxStream<'static, Result<bytes::Bytes>>,
    mut f: impl FnMut(&[u8]),
) -> Result<u64> {
    use futures::StreamExt;
    let mut n = 0u64;
    loop {
        match tokio::time::timeout(stall, s.next()).await {
            Err(_) => return Err(Error::Stalled { what: what.to_string(), reason: format!("no bytes for {stall:?}") }),
            Ok(None) => return Ok(n),
            Ok(Some(b)) => {
                let b = b?;
                n += b.len() as u64;
                f(&b);
            }
        }
    }
}

/// Size and blake3 of a stream, read under [`drain`]'s watchdog.
pub(crate) async fn drain_hash(
    what: &str,
    stall: Duration,
    s: futures::stream::BoxStream<'static, Result<bytes::Bytes>>,
) -> Result<(u64, String)> {
    let mut h = blake3::Hasher::new();
    let n = drain(what, stall, s, |b| {
        h.update(b);
    })
    .await?;
    Ok((n, h.finalize().to_hex().to_string()))
}

/// A blocking [`Read`] over an async byte stream, for callers on a blocking thread (the
/// splitter, the decoders). Every wait for the next piece runs under `stall`, so a server that
/// stops sending ends the read instead of hanging it.
pub(crate) struct StreamReader {
    stream: futures::stream::BoxStream<'static, Result<bytes::Bytes>>,
    buf: bytes::Bytes,
    handle: tokio::runtime::Handle,
    stall: Duration,
    what: String,
}

impl StreamReader {
    pub(crate) fn new(
        what: String,
        stall: Duration,
        stream: futures::stream::BoxStream<'static, Result<bytes::Bytes>>,
    ) -> Result<StreamReader> {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::Other(format!("{what}: blocking read outside the runtime")))?;
        Ok(StreamReader { stream, buf: bytes::Bytes::new(), handle, stall, what })
    }
}

impl Read for StreamReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        use futures::StreamExt;
        while self.buf.is_empty() {
            let next = self.handle.block_on(tokio::time::timeout(self.stall, self.stream.next()));
            match next {
                Err(_) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("{}: no bytes for {:?}", self.what, self.stall),
                    ));
                }
                Ok(None) => return Ok(0),
                Ok(Some(Err(e))) => return Err(std::io::Error::other(e.to_string())),
                Ok(Some(Ok(b))) => self.buf = b,
            }
        }
        let n = out.len().min(self.buf.len());
        out[..n].copy_from_slice(&self.buf[..n]);
        bytes::Buf::advance(&mut self.buf, n);
        Ok(n)
    }
}

pub fn hash_file(p: &Path) -> Result<(u64, String)> {
    let mut f = std::fs::File::open(p).map_err(|e| Error::io(p.display(), e))?;
    let mut h = blake3::Hasher::new();
    let n = std::io::copy(&mut f, &mut h).map_err(|e| Error::io(p.display(), e))?;
    Ok((n, h.finalize().to_hex().to_string()))
}

/// Writes a file through a temp name in the same directory, fsyncs it, and renames it into
/// place, so readers see the old file, no file, or the whole new file.
pub fn write_atomic(p: &Path, bytes: &[u8]) -> Result<()> {
    let dir = p.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), e))?;
    let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // Unique per writer (process, then a counter), so concurrent writers of one name never
    // share a temp file; the last rename wins whole.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}-{seq}.tmp", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io(tmp.display(), e))?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(|e| Error::io(tmp.display(), e))?;
    std::fs::rename(&tmp, p).map_err(|e| Error::io(p.display(), e))?;
    sync_dir(p);
    Ok(())
}

/// Makes a rename durable; failures only weaken durability, so they are ignored.
fn sync_dir(p: &Path) {
    if let Some(d) = p.parent().and_then(|d| std::fs::File::open(d).ok()) {
        let _ = d.sync_all();
    }
}

fn mtime_ms(m: &std::fs::Metadata) -> i64 {
    m.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<Entry>) -> Result<()> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir.display(), e))?;
    for ent in rd {
        let ent = ent.map_err(|e| Error::io(dir.display(), e))?;
        let p = ent.path();
        let m = match std::fs::metadata(&p) {
            Ok(m) => m,
            // Gone between listing and stat (a writer renamed it): not there.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(p.display(), e)),
        };
        if m.is_dir() {
            walk(root, &p, out)?;
        } else if m.is_file() {
            let rel = p.strip_prefix(root).unwrap_or(&p).to_string_lossy().into_owned();
            out.push(Entry { rel, size: m.len(), mtime_ms: mtime_ms(&m) });
        }
    }
    Ok(())
}

async fn blocking<T: Send + 'static>(deadline: Duration, op: &str, f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    let task = tokio::task::spawn_blocking(f);
    let joined = if deadline == Duration::MAX {
        task.await
    } else {
        match tokio::time::timeout(deadline, task).await {
            Ok(j) => j,
            Err(_) => {
                return Err(Error::Stalled { what: format!("local {op}"), reason: format!("no answer within {deadline:?} (a hung mount?)") });
            }
        }
    };
    joined.map_err(|e| Error::Other(format!("storage task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn watchdog_ends_a_stalled_transfer() {
        let p = Progress::default();
        let stalled = std::future::pending::<Result<()>>();
        let e = watched("copy x", Duration::from_secs(600), Duration::from_secs(30), p.clone(), stalled).await.unwrap_err();
        assert!(matches!(e, Error::Stalled { .. }) && e.to_string().contains("no progress for 30s"), "{e}");
        assert!(e.is_transient());
        assert!(p.cancelled(), "the transfer is told to stop");
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_ends_a_slow_but_moving_transfer() {
        let p = Progress::default();
        let trickle = {
            let p = p.clone();
            async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    p.add(1);
                }
                #[allow(unreachable_code)]
                Ok(())
            }
        };
        let e = watched::<()>("copy y", Duration::from_secs(60), Duration::from_secs(30), p, trickle).await.unwrap_err();
        assert!(e.to_string().contains("deadline"), "{e}");
    }

    #[tokio::test]
    async fn rename_noreplace_never_overwrites() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::from_url(&d.path().display().to_string()).unwrap();
        s.put_atomic("a", b"one".to_vec()).await.unwrap();
        s.put_atomic("b", b"two".to_vec()).await.unwrap();
        assert!(!s.rename_noreplace("a", "b").await.unwrap());
        assert_eq!(s.read("b").await.unwrap(), b"two");
        assert!(s.rename_noreplace("a", "c/d").await.unwrap());
        assert_eq!(s.read("c/d").await.unwrap(), b"one");
        assert!(s.head("a").await.unwrap().is_none());
        assert!(Store::from_url("gopher://x").unwrap_err().to_string().contains("gopher"));
    }
}
