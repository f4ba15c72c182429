//! Local directories (a NAS mount looks the same), through std::fs on blocking threads.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ferry_common::paths;

use crate::backend::{Backend, Capabilities};
use crate::error::{Error, Result};
use crate::{Entry, Progress};

#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
    /// A hard-mounted NAS that stops answering blocks a syscall forever: every call gets a
    /// deadline (the thread may stay stuck, the caller does not).
    call_timeout: Duration,
}

impl LocalStore {
    pub(crate) fn new(root: PathBuf, call_timeout: Duration) -> LocalStore {
        LocalStore { root, call_timeout }
    }

    fn abs(&self, rel: &str) -> PathBuf {
        let rel = rel.trim_start_matches('/');
        if rel.is_empty() { self.root.clone() } else { self.root.join(rel) }
    }

    /// Where `rel` is on this machine's file system.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.abs(rel)
    }

    /// [`Backend::put_atomic_blocking`] up to its fsync: see [`Unsynced`].
    pub fn write_unsynced_blocking(&self, rel: &str, bytes: &[u8]) -> Result<Unsynced> {
        Unsynced::write(&self.abs(rel), bytes)
    }
}

#[async_trait::async_trait]
impl Backend for LocalStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    fn as_local(&self) -> Option<&LocalStore> {
        Some(self)
    }

    fn url(&self, rel: &str) -> String {
        format!("file://{}", self.abs(rel).display())
    }

    fn rel_of(&self, url: &str) -> Option<String> {
        let p = url.strip_prefix("file://").unwrap_or(url);
        Path::new(p).strip_prefix(&self.root).ok().map(|r| r.to_string_lossy().into_owned())
    }

    async fn list(&self, dir: &str) -> Result<Vec<Entry>> {
        Ok(self.list_source(dir).await?.entries)
    }

    /// [`Backend::list`], with the entries it could not take (see `walk`) and why.
    async fn list_source(&self, dir: &str) -> Result<crate::Listing> {
        let (root, start) = (self.root.clone(), self.abs(dir));
        blocking(self.call_timeout * 4, "list", move || {
            let mut out = crate::Listing::default();
            if start.exists() {
                walk(&root, &start, &mut out)?;
            }
            out.entries.sort_by(|a, b| a.rel.cmp(&b.rel));
            Ok(out)
        })
        .await
    }

    async fn children(&self, dir: &str) -> Result<Vec<String>> {
        let p = self.abs(dir);
        blocking(self.call_timeout, "list", move || {
            let rd = match std::fs::read_dir(&p) {
                Ok(rd) => rd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
                Err(e) => return Err(Error::io(p.display(), e)),
            };
            rd.map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()).map_err(|e| Error::io(p.display(), e))).collect()
        })
        .await
    }

    async fn head(&self, rel: &str) -> Result<Option<Entry>> {
        let p = self.abs(rel);
        let rel = rel.to_string();
        blocking(self.call_timeout, "stat", move || match std::fs::metadata(&p) {
            Ok(m) => Ok(Some(Entry { rel, size: m.len(), mtime_ms: mtime_ms(&m), change_token: Some(change_token(&m)) })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(p.display(), e)),
        })
        .await
    }

    async fn read(&self, rel: &str) -> Result<Vec<u8>> {
        let p = self.abs(rel);
        blocking(self.call_timeout * 4, "read", move || std::fs::read(&p).map_err(|e| Error::io(p.display(), e))).await
    }

    fn open_blocking(&self, rel: &str) -> Result<Box<dyn Read + Send>> {
        let p = self.abs(rel);
        let f = std::fs::File::open(&p).map_err(|e| Error::io(p.display(), e))?;
        Ok(Box::new(f))
    }

    async fn put_atomic(&self, rel: &str, bytes: Vec<u8>) -> Result<()> {
        let p = self.abs(rel);
        blocking(self.call_timeout * 4, "write", move || write_atomic(&p, &bytes)).await
    }

    fn put_atomic_blocking(&self, rel: &str, bytes: &[u8]) -> Result<()> {
        write_atomic(&self.abs(rel), bytes)
    }

    async fn rename_noreplace(&self, from: &str, to: &str) -> Result<bool> {
        let (a, b) = (self.abs(from), self.abs(to));
        blocking(self.call_timeout, "rename", move || {
            if let Some(dir) = b.parent() {
                std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), e))?;
            }
            let moved = rename_noreplace(&a, &b).map_err(|e| Error::io(format!("{} -> {}", a.display(), b.display()), e))?;
            if moved {
                sync_dir(&b);
            }
            Ok(moved)
        })
        .await
    }

    async fn create_new(&self, rel: &str, bytes: bytes::Bytes) -> Result<bool> {
        let p = self.abs(rel);
        blocking(self.call_timeout * 4, "create", move || {
            // The temp file synced first, then renamed without replacing: the name appears with
            // every byte or not at all, and never over another writer's file.
            let w = Unsynced::write(&p, &bytes)?;
            w.file.sync_all().map_err(|e| Error::io(w.tmp.display(), e))?;
            let created = rename_noreplace(&w.tmp, &p).map_err(|e| Error::io(p.display(), e))?;
            if created {
                sync_dir(&p);
            } else {
                let _ = std::fs::remove_file(&w.tmp);
            }
            Ok(created)
        })
        .await
    }

    /// Renames `from` over `to` (replacing it) and makes the rename durable.
    async fn rename_over(&self, from: &str, to: &str) -> Result<()> {
        let (a, b) = (self.abs(from), self.abs(to));
        blocking(self.call_timeout, "rename", move || {
            std::fs::rename(&a, &b).map_err(|e| Error::io(format!("{} -> {}", a.display(), b.display()), e))?;
            sync_dir(&b);
            Ok(())
        })
        .await
    }

    async fn delete(&self, rel: &str) -> Result<()> {
        let p = self.abs(rel);
        blocking(self.call_timeout, "delete", move || match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(p.display(), e)),
            _ => Ok(()),
        })
        .await
    }

    async fn upload(&self, local: &Path, rel: &str, _expected: Option<&str>, progress: Progress) -> Result<(u64, String)> {
        let (src, dst) = (local.to_path_buf(), self.abs(rel));
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

    async fn hash(&self, rel: &str) -> Result<(u64, String)> {
        let p = self.abs(rel);
        blocking(self.call_timeout * 4, "hash", move || hash_file(&p)).await
    }
}

pub fn hash_file(p: &Path) -> Result<(u64, String)> {
    let mut f = std::fs::File::open(p).map_err(|e| Error::io(p.display(), e))?;
    let mut h = blake3::Hasher::new();
    let n = std::io::copy(&mut f, &mut h).map_err(|e| Error::io(p.display(), e))?;
    Ok((n, h.finalize().to_hex().to_string()))
}

/// Removes each directory of `dirs` that exists and holds nothing written since `cutoff_ms`
/// (a spool chunk directory no one needs: a file in it that is newer may be a writer's at work).
/// Returns how many went; one that cannot go does not keep the others.
pub fn remove_quiet_dirs(dirs: impl IntoIterator<Item = PathBuf>, cutoff_ms: i64) -> Result<usize> {
    let mut steps = vec![];
    for d in dirs {
        match newest_mtime_ms(&d) {
            Ok(None) => {}
            Ok(Some(t)) if t >= cutoff_ms => {}
            Ok(Some(_)) => steps.push(std::fs::remove_dir_all(&d).map(|_| 1).map_err(|e| Error::io(d.display(), e))),
            Err(e) => steps.push(Err(e)),
        }
    }
    crate::combine(steps)
}

/// The newest mtime of `dir` and of the files below it ([`walk`]); None when it does not exist.
fn newest_mtime_ms(dir: &Path) -> Result<Option<i64>> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(dir.display(), e)),
    };
    let own = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_millis() as i64);
    let mut files = crate::Listing::default();
    if meta.is_dir() {
        walk(dir, dir, &mut files)?;
    }
    Ok(Some(files.entries.iter().map(|e| e.mtime_ms).fold(own, i64::max)))
}

/// Writes a file through a temp name in the same directory, fsyncs it, and renames it into
/// place, so readers see the old file, no file, or the whole new file.
pub fn write_atomic(p: &Path, bytes: &[u8]) -> Result<()> {
    Unsynced::write(p, bytes)?.finish()
}

/// A file written under a temp name, not yet on disk for sure nor visible under its name: the
/// first half of [`write_atomic`]. The bytes are in the page cache, which the kernel writes back
/// meanwhile; [`Unsynced::finish`] (the fsync, which waits for that, and the rename) can run on
/// another thread while the writer goes on. Dropped unfinished, the temp file is left for gc.
#[derive(Debug)]
#[must_use = "the file appears only when finished"]
pub struct Unsynced {
    file: std::fs::File,
    tmp: PathBuf,
    dst: PathBuf,
}

impl Unsynced {
    pub fn write(p: &Path, bytes: &[u8]) -> Result<Unsynced> {
        let dir = p.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), e))?;
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        // Unique per writer, so concurrent writers of one name never share a temp file; the last
        // rename wins whole.
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(paths::atomic_temp(&name, seq));
        let mut file = std::fs::File::create(&tmp).map_err(|e| Error::io(tmp.display(), e))?;
        file.write_all(bytes).map_err(|e| Error::io(tmp.display(), e))?;
        Ok(Unsynced { file, tmp, dst: p.to_path_buf() })
    }

    /// fsync, then the rename into place (made durable too).
    pub fn finish(self) -> Result<()> {
        self.file.sync_all().map_err(|e| Error::io(self.tmp.display(), e))?;
        std::fs::rename(&self.tmp, &self.dst).map_err(|e| Error::io(self.dst.display(), e))?;
        sync_dir(&self.dst);
        Ok(())
    }
}

/// Renames `a` to `b` unless `b` exists (false then, nothing changed). One step where the file
/// system has `renameat2(RENAME_NOREPLACE)`: whatever is at `a` moves, even if a producer
/// renamed a new file over `a` an instant before. Elsewhere link(2) (which fails if `b`
/// exists) and then unlink(2) of `a`, which would remove a file renamed over `a` between the two.
fn rename_noreplace(a: &Path, b: &Path) -> std::io::Result<bool> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt;
        let (from, to) = (std::ffi::CString::new(a.as_os_str().as_bytes())?, std::ffi::CString::new(b.as_os_str().as_bytes())?);
        // SAFETY: two NUL-terminated paths that live across the call.
        let r = unsafe { libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::RENAME_NOREPLACE) };
        if r == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EEXIST) => return Ok(false),
            // The file system (or an old kernel) does not have it: the fallback below.
            Some(libc::EINVAL | libc::ENOSYS) => {}
            _ => return Err(e),
        }
    }
    match std::fs::hard_link(a, b) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(e),
    }
    std::fs::remove_file(a)?;
    Ok(true)
}

/// Makes a rename durable; failures only weaken durability, so they are ignored.
fn sync_dir(p: &Path) {
    if let Some(d) = p.parent().and_then(|d| std::fs::File::open(d).ok()) {
        let _ = d.sync_all();
    }
}

fn mtime_ms(m: &std::fs::Metadata) -> i64 {
    m.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn change_token(m: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    format!("{}:{}:{}.{:09}", m.dev(), m.ino(), m.ctime(), m.ctime_nsec())
}

/// Lists the files below `dir`. The directory itself must be readable; below it, one entry
/// that cannot be read (permissions, a name that is not UTF-8, a file gone meanwhile) is
/// skipped with a warning and the walk goes on. Symbolic links are not followed: a link could
/// lead outside the root (or in a circle), and what it points to is not this directory's.
fn walk(root: &Path, dir: &Path, out: &mut crate::Listing) -> Result<()> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir.display(), e))?;
    // The name as the ledger and the log show it: relative, every byte that is not UTF-8
    // escaped.
    let shown = |p: &Path| {
        let rel = p.strip_prefix(root).unwrap_or(p);
        String::from_utf8_lossy(rel.as_os_str().as_encoded_bytes()).into_owned()
    };
    for ent in rd {
        let ent = match ent {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(dir = ?dir, error = %e, "skipping an entry that cannot be read");
                out.set_aside.push((shown(dir), format!("an entry in this directory cannot be read: {e}")));
                continue;
            }
        };
        let p = ent.path();
        match ent.file_type() {
            Ok(t) if t.is_symlink() => {
                tracing::warn!(path = ?p, "skipping a symbolic link: links are not followed");
                out.set_aside.push((shown(&p), "a symbolic link: links are not followed".into()));
                continue;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(path = ?p, error = %e, "skipping an entry whose type cannot be read");
                out.set_aside.push((shown(&p), format!("its type cannot be read: {e}")));
                continue;
            }
        }
        let m = match std::fs::symlink_metadata(&p) {
            Ok(m) => m,
            // Gone between listing and stat (a writer renamed it): not there.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                tracing::warn!(path = ?p, error = %e, "skipping a file that cannot be read");
                out.set_aside.push((shown(&p), format!("it cannot be read: {e}")));
                continue;
            }
        };
        if m.is_dir() {
            if let Err(e) = walk(root, &p, out) {
                tracing::warn!(path = ?p, error = %e, "skipping a directory that cannot be read");
                out.set_aside.push((shown(&p), format!("a directory that cannot be read: {e}")));
            }
        } else if m.is_file() {
            let Some(rel) = p.strip_prefix(root).unwrap_or(&p).to_str() else {
                tracing::warn!(path = ?p, "skipping a file whose name is not UTF-8; rename it to take it in");
                out.set_aside.push((shown(&p), "its name is not UTF-8; rename it to take it in".into()));
                continue;
            };
            out.entries.push(Entry { rel: rel.to_string(), size: m.len(), mtime_ms: mtime_ms(&m), change_token: Some(change_token(&m)) });
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
                return Err(Error::Stalled {
                    what: format!("local {op}"),
                    reason: format!("no answer within {deadline:?} (a hung mount?)"),
                });
            }
        }
    };
    joined.map_err(|e| Error::Other(format!("storage task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use crate::Store;

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
