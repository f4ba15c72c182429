//! One storage abstraction for source, staging and destination, chosen by URL scheme.
//!
//! `file://` URLs and plain paths are local directories (a NAS mount looks the same).
//! `hdfs://` and `s3://` come in their own issues; callers never branch on the backend, so
//! adding them means a new variant here and nothing in the stages.
//!
//! Every method takes paths relative to the store's root, with `/` separators.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};

#[derive(Debug, Clone)]
pub enum Store {
    Local(LocalStore),
}

#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
}

/// A file in a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub rel: String,
    pub size: u64,
    pub mtime_ms: i64,
}

impl Store {
    /// `file:///abs/dir`, `/abs/dir` or `rel/dir`. Other schemes are named in the error.
    pub fn from_url(url: &str) -> Result<Store> {
        let path = if let Some(p) = url.strip_prefix("file://") {
            p
        } else if let Some((scheme, _)) = url.split_once("://") {
            return Err(Error::Config {
                file: url.to_string(),
                message: format!("storage scheme {scheme}:// is not supported yet (file:// and plain paths are)"),
            });
        } else {
            url
        };
        if path.is_empty() {
            return Err(Error::Config { file: url.to_string(), message: "empty storage path".into() });
        }
        Ok(Store::Local(LocalStore { root: PathBuf::from(path) }))
    }

    /// The URL of a path in this store, as recorded in the ledger.
    pub fn url(&self, rel: &str) -> String {
        match self {
            Store::Local(l) => format!("file://{}", l.abs(rel).display()),
        }
    }

    /// The store's path for a URL this store produced with [`Store::url`], if it is one.
    pub fn rel_of(&self, url: &str) -> Option<String> {
        match self {
            Store::Local(l) => {
                let p = url.strip_prefix("file://").unwrap_or(url);
                Path::new(p).strip_prefix(&l.root).ok().map(|r| r.to_string_lossy().into_owned())
            }
        }
    }

    /// Every file below `dir` (recursively), with sizes and modification times.
    pub async fn list(&self, dir: &str) -> Result<Vec<Entry>> {
        match self {
            Store::Local(l) => {
                let (root, start) = (l.root.clone(), l.abs(dir));
                blocking(move || {
                    let mut out = Vec::new();
                    if start.exists() {
                        walk(&root, &start, &mut out)?;
                    }
                    out.sort_by(|a, b| a.rel.cmp(&b.rel));
                    Ok(out)
                })
                .await
            }
        }
    }

    pub async fn head(&self, rel: &str) -> Result<Option<Entry>> {
        match self {
            Store::Local(l) => {
                let p = l.abs(rel);
                let rel = rel.to_string();
                blocking(move || match std::fs::metadata(&p) {
                    Ok(m) => Ok(Some(Entry { rel, size: m.len(), mtime_ms: mtime_ms(&m) })),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(Error::io(p.display(), e)),
                })
                .await
            }
        }
    }

    pub async fn read(&self, rel: &str) -> Result<Vec<u8>> {
        match self {
            Store::Local(l) => {
                let p = l.abs(rel);
                blocking(move || std::fs::read(&p).map_err(|e| Error::io(p.display(), e))).await
            }
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
        }
    }

    /// Writes `bytes` so that `rel` either does not exist or holds all of them: a temp name in
    /// the same directory, fsync, then rename over `rel`.
    pub async fn put_atomic(&self, rel: &str, bytes: Vec<u8>) -> Result<()> {
        match self {
            Store::Local(l) => {
                let p = l.abs(rel);
                blocking(move || write_atomic(&p, &bytes)).await
            }
        }
    }

    /// [`Store::put_atomic`] for callers already on a blocking thread.
    pub fn put_atomic_blocking(&self, rel: &str, bytes: &[u8]) -> Result<()> {
        match self {
            Store::Local(l) => write_atomic(&l.abs(rel), bytes),
        }
    }

    /// Renames `from` to `to` unless `to` exists. Returns false (and changes nothing) if it does.
    pub async fn rename_noreplace(&self, from: &str, to: &str) -> Result<bool> {
        match self {
            Store::Local(l) => {
                let (a, b) = (l.abs(from), l.abs(to));
                blocking(move || {
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
        }
    }

    /// Removes a file; a missing file is not an error.
    pub async fn delete(&self, rel: &str) -> Result<()> {
        match self {
            Store::Local(l) => {
                let p = l.abs(rel);
                blocking(move || match std::fs::remove_file(&p) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(p.display(), e)),
                    _ => Ok(()),
                })
                .await
            }
        }
    }

    /// Streams a local file to `rel`, hashing what it sends. `progress` is bumped after each
    /// block so a watchdog can tell a stalled transfer from a slow one.
    pub async fn upload(&self, local: &Path, rel: &str, progress: Progress) -> Result<(u64, String)> {
        match self {
            Store::Local(l) => {
                let (src, dst) = (local.to_path_buf(), l.abs(rel));
                blocking(move || {
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
        }
    }

    /// Removes temp files (`.<name>.tmp`, left by a writer that crashed) below `dir` whose
    /// mtime is before `cutoff_ms`. Returns how many went.
    pub async fn remove_stale_temps(&self, dir: &str, cutoff_ms: i64) -> Result<usize> {
        let mut n = 0;
        for e in self.list(dir).await? {
            let base = e.rel.rsplit('/').next().unwrap_or(&e.rel);
            if base.starts_with('.') && base.ends_with(".tmp") && e.mtime_ms < cutoff_ms {
                tracing::info!(file = %e.rel, "removing an abandoned temp file");
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
                blocking(move || hash_file(&p)).await
            }
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
    res
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

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Error::Other(format!("storage task failed: {e}")))?
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
