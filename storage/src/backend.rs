//! What one kind of store does, behind one trait (as object_store's `ObjectStore` is): the
//! backends (local directories, HDFS, S3) implement the operations; what is the same for all
//! of them (a file put in place through a temp name, gc of Ferry's temp names and abandoned
//! uploads, probes, prepared writes) is written once in [`crate::Store`]. A difference between
//! backends is a method with a default here that one backend overrides, or a
//! [`Capabilities`] flag, never a match on the backend.
//!
//! Every method takes paths relative to the store's root, with `/` separators, and ends:
//! network calls run under the store's `call_timeout`; [`Backend::upload`] under the caller's
//! deadline and no-progress watchdog (it moves the `Progress` it is given).

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use crate::error::Result;
use crate::{Entry, Listing, LocalStore, Progress};

/// What a backend can do that others cannot, as flags the shared code reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// An upload can go straight to its final name: it appears whole or not at all (an S3
    /// PUT or completed multipart upload), and a rename would be a second copy of every byte.
    /// False where files grow in place (local, HDFS) and a temp name keeps half-written files
    /// out of sight.
    pub uploads_in_place: bool,
    /// Making a written file whole waits on the store for a fixed time, not for bytes: an HDFS
    /// close asks the NameNode to complete the file until the DataNodes have reported its last
    /// block, and hdfs-native waits 500 ms before asking again. Several files in flight at
    /// once overlap those waits.
    pub slow_close: bool,
}

#[async_trait::async_trait]
pub trait Backend: std::fmt::Debug + Send + Sync {
    fn capabilities(&self) -> Capabilities;

    /// The URL of a path in this store, as recorded in the ledger.
    fn url(&self, rel: &str) -> String;

    /// The store's path for a URL this store produced with [`Backend::url`], if it is one.
    fn rel_of(&self, url: &str) -> Option<String>;

    /// Every file below `dir` (recursively), sorted by path.
    async fn list(&self, dir: &str) -> Result<Vec<Entry>>;

    /// [`Backend::list`] of a source, with the entries set aside instead of failing the
    /// listing. A backend whose listings cannot hold odd names sets none aside.
    async fn list_source(&self, dir: &str) -> Result<Listing> {
        Ok(Listing { entries: self.list(dir).await?, set_aside: Vec::new() })
    }

    /// The names directly under `dir` (files and directories); none if it is missing.
    async fn children(&self, dir: &str) -> Result<Vec<String>>;

    async fn head(&self, rel: &str) -> Result<Option<Entry>>;

    async fn read(&self, rel: &str) -> Result<Vec<u8>>;

    /// A blocking reader, for callers already on a blocking thread.
    fn open_blocking(&self, rel: &str) -> Result<Box<dyn Read + Send>>;

    /// A blocking reader opened on the runtime, that a task keeps up to `ahead` bytes in front
    /// of where a read waits on the network. The default is [`Backend::open_blocking`]: a
    /// local file, whose read-ahead is the kernel's.
    async fn open_ahead(&self, rel: &str, _ahead: usize) -> Result<Box<dyn Read + Send>> {
        self.open_blocking(rel)
    }

    /// `rel` either does not exist or holds all of `bytes`, replacing what was there.
    async fn put_atomic(&self, rel: &str, bytes: Vec<u8>) -> Result<()>;

    /// [`Backend::put_atomic`] for callers already on a blocking thread.
    fn put_atomic_blocking(&self, rel: &str, bytes: &[u8]) -> Result<()>;

    /// Renames `from` to `to` unless `to` exists. Returns false (and changes nothing) if it does.
    async fn rename_noreplace(&self, from: &str, to: &str) -> Result<bool>;

    /// Creates `rel` holding `bytes` unless it exists (put-if-absent), durably. True: this call
    /// created it, also when a failure left that unclear and a look settles that `rel` holds
    /// these bytes; false: `rel` holds other bytes (another writer got there first), nothing
    /// changed. Two writers racing for one name: exactly one gets true.
    async fn create_new(&self, rel: &str, bytes: bytes::Bytes) -> Result<bool>;

    /// Renames temp file `from` over `to`, replacing it, durably. An ambiguous failure is
    /// settled here; on a failure `from` may be left for the caller to remove.
    async fn rename_over(&self, from: &str, to: &str) -> Result<()>;

    /// Removes a file; a missing file is not an error.
    async fn delete(&self, rel: &str) -> Result<()>;

    /// Streams local file `local` to `rel`, hashing what it sends (size and blake3). Told the
    /// hash the bytes must have (`expected`), a backend may use it to send in one pass and must
    /// then never make different bytes visible; others ignore it.
    async fn upload(&self, local: &Path, rel: &str, expected: Option<&str>, progress: Progress) -> Result<(u64, String)>;

    /// Size and blake3 of a stored file.
    async fn hash(&self, rel: &str) -> Result<(u64, String)>;

    /// The same store on its own connections, for one chunk's work; None where calls do not
    /// share a connection that one hung call could hold up.
    fn isolated(&self) -> Result<Option<Arc<dyn Backend>>> {
        Ok(None)
    }

    /// Writes `bytes` under a temp name beside `rel` now, when that is the slow half of a
    /// [`Backend::put_atomic`] (an HDFS close waits for the DataNodes' report) and worth
    /// running beside other work; returns the temp name, or None to write it all at commit.
    async fn write_temp(&self, _rel: &str, _bytes: bytes::Bytes) -> Result<Option<String>> {
        Ok(None)
    }

    /// Uploads under the root (key, id) started before `cutoff_ms` and never completed.
    async fn abandoned_uploads(&self, _cutoff_ms: i64) -> Result<Vec<(String, String)>> {
        Ok(Vec::new())
    }

    /// Aborts the chosen uploads (key, id); how many went.
    async fn abort_uploads(&self, _chosen: &[(String, String)]) -> Result<usize> {
        Ok(0)
    }

    /// The store path of an upload's key, if it is under the root.
    fn rel_of_key<'a>(&self, key: &'a str) -> Option<&'a str> {
        Some(key)
    }

    /// A local directory store, for callers that write its files on this machine directly.
    fn as_local(&self) -> Option<&LocalStore> {
        None
    }
}
