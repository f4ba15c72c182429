//! HDFS (`hdfs://`, `viewfs://`) through hdfs-native.
//!
//! # Publish protocol
//!
//! ```text
//!  create  <dest>/_ferry/tmp/<chunk>.<epoch>.<i>.<try> (overwrite = false; unique per try)
//!  write   blocks, under the caller's deadline and no-progress watchdog
//!  close   = NameNode complete()                      <- seed 001: a reset here is ambiguous
//!  check   length == bytes sent
//!  rename2 tmp -> landed name, overwrite = false      (atomic on the NameNode)
//! ```
//!
//! hdfs-native gives NameNode calls no deadline and hands an ambiguous `complete()` back to
//! the caller (the file may be closed or still under construction). So every call here runs
//! under `call_timeout`, and after `close` fails or times out we do not guess:
//!
//! 1. `recover_lease(tmp)` (from a different client than the writer's) until the NameNode
//!    says the file is closed: this fences our own writer and finalizes the last block;
//! 2. compare its length with what we sent, then read it back and compare the hash;
//! 3. equal: the chunk is written, carry on to the rename. Different or not closable in time:
//!    an error, and copy sends this one part again (to a new temp name, on a new client).
//!
//! An ambiguous `rename` is settled by looking at both names (the temp name is ours alone, so
//! "temp gone, target there" means our rename went through). A crash at any step leaves at most
//! a temp file, possibly under construction; the stage's gc (and `ferry gc`) deletes temp files
//! older than a copy deadline plus two leases, which also ends their leases.
//!
//! Each chunk gets a client of its own ([`Backend::isolated`]): hdfs-native multiplexes all
//! calls of one client over one NameNode connection, so a connection that hangs would otherwise
//! stall every chunk. Clients are pooled, not built per chunk: hdfs-native never frees a client
//! that has written a file (its lease-renewal task holds it), so one client per chunk would leak
//! a NameNode connection per chunk in a long-running service. Any call that was given up on
//! (its deadline passed, or its caller dropped it: a watchdog, a hedge that lost) retires the
//! client it used, and so does a file write that did not close cleanly, `close()` included:
//! its connection may be hung, and the next call goes out on a new one. Only those few
//! clients are retired.
//!
//! A retired or surplus client must also go, which hdfs-native does not do by itself: a client
//! that has written a file keeps a lease-renewal task that holds it for ever, so dropping it
//! frees neither its NameNode connection nor its tasks (a slow leak over weeks of hedges and
//! timeouts). Each client therefore runs its background tasks on a runtime of its own (one
//! worker thread, see [`Conn`]), which is shut down a few seconds after the last user of the
//! client lets go: the renewal task ends with it, and the connection closes.
//!
//! Reads go through one client shared by a store and its isolated copies, never one of the
//! pooled writers. hdfs-native keeps a finished read's DataNode connection in a process-wide
//! cache and drops expired entries only when a later read looks in it; a connection made on a
//! pooled client's runtime keeps that runtime's reactor (five descriptors) alive after the
//! runtime is shut down. Copy reads only to check a landed part after an ambiguous write, so
//! what it cached during a storm of faults stayed for good (the soak showed the step). On the
//! reader's runtime, which lives as long as the store, a cached connection holds its socket
//! only, and the next read reuses or expires it.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use hdfs_native::{Client, ClientBuilder, HdfsError, WriteOptions};

use super::{Entry, Progress, ReadAhead, StreamReader};
use crate::backend::{Backend, Capabilities};
use crate::error::{Error, Result};
use crate::options::StoreOptions;

#[derive(Debug)]
pub struct HdfsStore {
    /// `hdfs://authority` (a NameNode address or a nameservice).
    base: String,
    /// The store's root path, without a trailing slash ("" for `/`).
    root: String,
    opts: StoreOptions,
    client: Mutex<Arc<Conn>>,
    /// Idle clients, shared by this store and its isolated copies, each with the time it came
    /// back; the most recent last.
    pool: Pool,
    /// An isolated copy gives its client back to the pool when dropped.
    pooled: bool,
    /// The client every read of this store and its isolated copies goes through (see the
    /// module's notes); built at the first read, built again after it was retired.
    reader: Arc<Mutex<Option<Arc<Conn>>>>,
}

/// Idle clients with the time each came back.
type Pool = Timed<Arc<Conn>>;

/// Entries with the time each came back, oldest first.
type Timed<T> = Arc<Mutex<Vec<(Instant, T)>>>;

/// Idle clients kept for reuse; more are built when more chunks run at once.
const POOL_MAX: usize = 64;

/// An idle client unused for this long goes (its NameNode connection, thread and runtime with
/// it: five descriptors). A storm of retries or a burst of chunks fills the pool; without this
/// it would hold that many connections to the NameNode for the rest of the process's life (the
/// soak showed 40+ per stage after one storm). The pool hands out its most recent client first,
/// so the ones a steady load does not need grow old. Short, so that what a stage holds follows
/// what it does now, not its busiest minute (a hedge or a temp file's removal takes a client
/// for a moment): a steady stream keeps its clients busy well within it, and a client is cheap
/// to build again (one connection).
const POOL_IDLE: Duration = Duration::from_secs(15);

/// How often the idle clients are looked at when nobody takes or returns one.
const POOL_SWEEP: Duration = Duration::from_secs(5);

/// Takes the clients idle for longer than [`POOL_IDLE`] out of `pool` (dropped by the
/// caller, outside the lock).
fn expired(pool: &mut Vec<(Instant, Arc<Conn>)>) -> Vec<Arc<Conn>> {
    idle_for(pool, POOL_IDLE)
}

/// The entries of `pool` (oldest first) back for longer than `idle`, taken out.
fn idle_for<T>(pool: &mut Vec<(Instant, T)>, idle: Duration) -> Vec<T> {
    let keep = pool.iter().position(|(since, _)| since.elapsed() < idle).unwrap_or(pool.len());
    pool.drain(..keep).map(|(_, c)| c).collect()
}

/// Expires idle entries every `every` while the pool lives, also when nobody takes or returns
/// one: a service gone quiet after a burst (the soak: 65 NameNode connections per stage for
/// minutes after an outage's catch-up) gives its connections back instead of holding them
/// until work comes again. Ends with the pool (it holds it weakly).
fn sweep_while_alive<T: Send + 'static>(pool: &Timed<T>, every: Duration, idle: Duration) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else { return };
    let weak = Arc::downgrade(pool);
    handle.spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let Some(pool) = weak.upgrade() else { return };
            let old = idle_for(&mut pool.lock().unwrap_or_else(|p| p.into_inner()), idle);
            drop(old);
        }
    });
}

/// An HDFS client and the runtime its background tasks (connections, lease renewal) run on.
/// Dropped (its last user gone), the runtime is shut down, which ends those tasks: the only way
/// to free a client that has written a file (see the module's notes).
#[derive(Debug)]
pub(crate) struct Conn {
    client: Client,
    rt: Background,
}

/// A client's runtime, shut down (without blocking) when dropped.
#[derive(Debug, Default)]
struct Background(Option<tokio::runtime::Runtime>);

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// How long a client's runtime outlives the client. hdfs-native keeps DataNode connections
/// for reuse by any client for 3 s; one made on this runtime dies with it, so the runtime
/// stays until none of them can be handed out.
const LINGER: Duration = Duration::from_secs(5);

impl std::ops::Deref for Conn {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Never blocks (also inside the async code that drops the last user). Outside a
        // runtime (the process ending), at once.
        let rt = std::mem::take(&mut self.rt);
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            h.spawn(async move {
                tokio::time::sleep(LINGER).await;
                drop(rt);
            });
        }
    }
}

impl Drop for HdfsStore {
    fn drop(&mut self) {
        if self.pooled {
            let c = self.client.get_mut().unwrap_or_else(|p| p.into_inner()).clone();
            let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
            let old = expired(&mut pool);
            if pool.len() < POOL_MAX {
                pool.push((Instant::now(), c));
            }
            drop(pool);
            drop(old);
        }
    }
}

impl HdfsStore {
    pub fn new(url: &str, opts: &StoreOptions) -> Result<HdfsStore> {
        let parsed = url::Url::parse(url).map_err(|e| Error::Config { file: url.into(), message: format!("invalid HDFS URL: {e}") })?;
        let base = format!("{}://{}", parsed.scheme(), parsed.authority());
        let root = parsed.path().trim_end_matches('/').to_string();
        crate::kerberos::check(&opts.hdfs, url)?;
        let client = build(&base, opts)?;
        let pool = Pool::default();
        sweep_while_alive(&pool, POOL_SWEEP, POOL_IDLE);
        Ok(HdfsStore { base, root, opts: opts.clone(), client: Mutex::new(client), pool, pooled: false, reader: Default::default() })
    }

    /// [`Backend::isolated`]: the same store on a client taken from the pool or new.
    fn on_own_client(&self) -> Result<HdfsStore> {
        let (idle, old) = {
            let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
            let old = expired(&mut pool);
            (pool.pop().map(|(_, c)| c), old)
        };
        drop(old);
        let client = match idle {
            Some(c) => c,
            None => build(&self.base, &self.opts)?,
        };
        Ok(HdfsStore {
            base: self.base.clone(),
            root: self.root.clone(),
            opts: self.opts.clone(),
            client: Mutex::new(client),
            pool: self.pool.clone(),
            pooled: true,
            reader: self.reader.clone(),
        })
    }

    fn path(&self, rel: &str) -> String {
        let rel = rel.trim_start_matches('/');
        if rel.is_empty() { if self.root.is_empty() { "/".into() } else { self.root.clone() } } else { format!("{}/{rel}", self.root) }
    }

    fn client(&self) -> Arc<Conn> {
        self.client.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The shared client for reads (see the module's notes).
    fn reader(&self) -> Result<Arc<Conn>> {
        let mut g = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = g.as_ref() {
            return Ok(c.clone());
        }
        let c = build(&self.base, &self.opts)?;
        *g = Some(c.clone());
        Ok(c)
    }

    /// Replaces `used` (if it is still the current client, or the reader) after a call on it
    /// missed its deadline, was given up on, or broke: a hung or broken connection is never
    /// reused.
    fn retire(&self, used: &Arc<Conn>) {
        {
            let mut r = self.reader.lock().unwrap_or_else(|p| p.into_inner());
            if r.as_ref().is_some_and(|c| Arc::ptr_eq(c, used)) {
                *r = None;
                return;
            }
        }
        let mut g = self.client.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::ptr_eq(&g, used) {
            match build(&self.base, &self.opts) {
                Ok(c) => *g = c,
                Err(e) => tracing::warn!(error = %e, "cannot build a new HDFS client; keeping the old one"),
            }
        }
    }

    /// One NameNode call under `call_timeout`.
    async fn call<T, F, Fut>(&self, op: &'static str, path: &str, f: F) -> Result<T>
    where
        F: FnOnce(Arc<Conn>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, HdfsError>>,
    {
        self.call_on(self.client(), op, path, f).await
    }

    /// [`HdfsStore::call`] on client `c` (a caller that must know which client it used).
    async fn call_on<T, F, Fut>(&self, c: Arc<Conn>, op: &'static str, path: &str, f: F) -> Result<T>
    where
        F: FnOnce(Arc<Conn>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, HdfsError>>,
    {
        let deadline = self.opts.call_timeout.0;
        // A call given up on, by its deadline or by its caller (a hedge that lost, a watchdog),
        // may have left its connection hung: that client is retired, never reused.
        let mut guard = RetireOnDrop { store: self, client: Some(c.clone()) };
        match tokio::time::timeout(deadline, f(c)).await {
            Ok(Ok(v)) => {
                guard.client = None;
                Ok(v)
            }
            Ok(Err(e)) => {
                // A NameNode's answer (a RemoteException) leaves the connection fine; a broken
                // one ("RPC listener disconnected") is not trusted to heal: hdfs-native only
                // reconnects once its listener task has ended, and calls in between fail the same.
                if !matches!(e, HdfsError::IOError(_)) {
                    guard.client = None;
                }
                Err(Error::Hdfs { op, path: self.url_of_path(path), source: e })
            }
            Err(_) => {
                drop(guard);
                Err(Error::Stalled {
                    what: format!("HDFS {op} {}", self.url_of_path(path)),
                    reason: format!("no answer within {deadline:?} (store.call_timeout)"),
                })
            }
        }
    }

    fn url_of_path(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn entry(&self, st: &hdfs_native::client::FileStatus) -> Entry {
        let prefix = format!("{}/", self.root);
        let rel = st.path.strip_prefix(&prefix).unwrap_or(st.path.trim_start_matches('/')).to_string();
        Entry { rel, size: st.length as u64, mtime_ms: st.modification_time as i64, change_token: None }
    }

    /// A stream of the file's bytes; the caller bounds the wait for each piece.
    async fn stream(&self, rel: &str) -> Result<(usize, futures::stream::BoxStream<'static, Result<Bytes>>)> {
        let path = self.path(rel);
        let p = path.clone();
        let conn = self.reader()?;
        let reader = self.call_on(conn.clone(), "open", &path, |c| async move { c.read(&p).await }).await?;
        let len = reader.file_length();
        let url = self.url_of_path(&path);
        // The stream keeps its client (and the runtime its reads run on) until it is dropped.
        let s = reader
            .read_range_stream(0, len)
            .map(move |r| {
                let _conn = &conn;
                r.map_err(|e| Error::Hdfs { op: "read", path: url.clone(), source: e })
            })
            .boxed();
        Ok((len, s))
    }

    /// Writes a whole file from `pieces` to `rel` (which must not exist), following the
    /// protocol at the top of this module up to, not including, the rename.
    async fn write_new(
        &self,
        rel: &str,
        mut next: impl FnMut() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Option<Bytes>>> + Send>>,
        progress: &Progress,
    ) -> Result<(u64, String)> {
        let path = self.path(rel);
        let mut wo = WriteOptions::default().overwrite(false).create_parent(true);
        if let Some(r) = self.opts.hdfs.replication {
            wo = wo.replication(r);
        }
        let p = path.clone();
        let writer = self.client();
        let mut w = {
            let _waiting = progress.in_call();
            self.call_on(writer.clone(), "create", &path, |c| async move { c.create(&p, wo).await }).await?
        };
        // Until the NameNode has closed the file, the writer's client is retired on any way
        // out (an error, a timeout, the watchdog dropping this future): its connection may be
        // the hung one, and the next call of this chunk must not wait behind it.
        let mut retire = RetireOnDrop { store: self, client: Some(writer) };
        let mut h = blake3::Hasher::new();
        let mut n = 0u64;
        while let Some(b) = next().await? {
            if progress.cancelled() {
                return Err(Error::Other(format!("write to {} cancelled", self.url(rel))));
            }
            h.update(&b);
            let len = b.len() as u64;
            n += len;
            // The caller's watchdog bounds this: a DataNode that stops reading shows up as
            // bytes that stop moving.
            w.write_bytes(b).await.map_err(|e| Error::Hdfs { op: "write", path: self.url(rel), source: e })?;
            progress.add(len);
        }
        let hash = h.finalize().to_hex().to_string();
        let deadline = self.opts.call_timeout.0;
        // complete() is a bounded call, not a stall: the settle below needs its turn.
        let waiting = progress.in_call();
        let closed = match tokio::time::timeout(deadline, w.close()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("close failed: {e}")),
            Err(_) => Err(format!("close (complete) got no answer within {deadline:?}")),
        };
        drop(w);
        if closed.is_ok() {
            retire.client = None;
        } else {
            // Retired now, before the settle: every later call goes out on a new connection.
            drop(retire);
        }
        if let Err(reason) = closed {
            tracing::warn!(file = %self.url(rel), %reason, "ambiguous close; recovering the lease to see what the NameNode kept");
            self.settle_ambiguous_close(rel, n, &hash, &reason).await?;
        }
        drop(waiting);
        match self.head(rel).await? {
            Some(e) if e.size == n => Ok((n, hash)),
            Some(e) => Err(Error::Ambiguous {
                what: format!("write of {}", self.url(rel)),
                reason: format!("{} bytes on the NameNode, {n} sent", e.size),
            }),
            None => Err(Error::Ambiguous { what: format!("write of {}", self.url(rel)), reason: "file vanished after close".into() }),
        }
    }

    /// After an ambiguous `complete()`: fence the writer, wait until the file is closed, and
    /// accept it only if it holds exactly the bytes we sent.
    async fn settle_ambiguous_close(&self, rel: &str, n: u64, hash: &str, reason: &str) -> Result<()> {
        let what = format!("write of {}", self.url(rel));
        // A client of its own: the writer's client may be the one whose connection broke.
        let fresh = self.on_own_client()?;
        let path = self.path(rel);
        let give_up = tokio::time::Instant::now() + self.opts.call_timeout.0 * 2;
        loop {
            let p = path.clone();
            match fresh.call("recover_lease", &path, |c| async move { c.recover_lease(&p).await }).await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) if e.is_not_found() => {
                    return Err(Error::Ambiguous { what, reason: format!("{reason}; the temp file is gone") });
                }
                Err(e) => tracing::debug!(error = %e, "recover_lease failed; trying again"),
            }
            if tokio::time::Instant::now() >= give_up {
                return Err(Error::Ambiguous { what, reason: format!("{reason}; the lease was not recovered in time") });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let (m, h) = fresh.hash(rel).await?;
        if m == n && h == hash {
            tracing::warn!(file = %self.url(rel), bytes = n, "ambiguous close settled: the NameNode kept every byte");
            Ok(())
        } else {
            Err(Error::Ambiguous { what, reason: format!("{reason}; after lease recovery it holds {m} bytes (hash {h}), {n} were sent") })
        }
    }

    async fn put_atomic_once(&self, rel: &str, bytes: Bytes) -> Result<()> {
        let tmp = self.write_temp_once(rel, bytes).await?;
        self.commit_temp(&tmp, rel).await
    }

    /// One try of [`Backend::write_temp`]; the temp file is removed again if the write fails.
    async fn write_temp_once(&self, rel: &str, bytes: Bytes) -> Result<String> {
        let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = if dir.is_empty() {
            format!(".{name}.{}-{seq}.tmp", std::process::id())
        } else {
            format!("{dir}/.{name}.{}-{seq}.tmp", std::process::id())
        };
        let progress = Progress::default();
        // Bounded like any transfer: a deadline that grows with the size (1 MiB/s floor) and
        // the no-progress watchdog.
        let deadline = self.opts.call_timeout.0 * 2 + Duration::from_secs(bytes.len() as u64 >> 20);
        // In pieces, so the watchdog sees bytes move while a large chunk is written.
        let mut rest = bytes;
        let next = move || {
            let b = if rest.is_empty() { None } else { Some(rest.split_to(rest.len().min(4 << 20))) };
            Box::pin(async move { Ok(b) }) as std::pin::Pin<Box<dyn std::future::Future<Output = Result<Option<Bytes>>> + Send>>
        };
        let res = super::watched(
            &format!("write of {}", self.url(rel)),
            deadline,
            self.opts.read_stall.0,
            progress.clone(),
            self.write_new(&tmp, next, &progress),
        )
        .await;
        if let Err(e) = res {
            let _ = self.delete(&tmp).await;
            return Err(e);
        }
        Ok(tmp)
    }

    /// Renames a [`Backend::write_temp`] file to `rel`, replacing what is there; the temp
    /// file is removed if that fails.
    pub async fn commit_temp(&self, tmp: &str, rel: &str) -> Result<()> {
        let (t, p) = (self.path(tmp), self.path(rel));
        let target = p.clone();
        match self.call("rename", &target, |c| async move { c.rename(&t, &p, true).await }).await {
            Ok(()) => Ok(()),
            Err(e) => {
                // Settle an ambiguous rename by looking: temp gone means it went through.
                if let (Ok(None), Ok(Some(_))) = (self.head(tmp).await, self.head(rel).await) {
                    return Ok(());
                }
                let _ = self.delete(tmp).await;
                Err(e)
            }
        }
    }
}

#[async_trait::async_trait]
impl Backend for HdfsStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities { slow_close: true, ..Capabilities::default() }
    }

    /// The same store on a client no other user holds right now (its own NameNode
    /// connection), from the pool or new.
    fn isolated(&self) -> Result<Option<Arc<dyn Backend>>> {
        Ok(Some(Arc::new(self.on_own_client()?)))
    }

    /// Renames a [`Backend::write_temp`] file over `to`: see [`HdfsStore::commit_temp`].
    async fn rename_over(&self, from: &str, to: &str) -> Result<()> {
        self.commit_temp(from, to).await
    }

    fn url(&self, rel: &str) -> String {
        format!("{}{}", self.base, self.path(rel))
    }

    fn rel_of(&self, url: &str) -> Option<String> {
        let p = url.strip_prefix(&self.base)?;
        let r = p.strip_prefix(&self.root)?;
        Some(r.trim_start_matches('/').to_string())
    }

    async fn list(&self, dir: &str) -> Result<Vec<Entry>> {
        let path = self.path(dir);
        let p = path.clone();
        match self.call("list", &path, |c| async move { c.list_status(&p, true).await }).await {
            Ok(sts) => {
                let mut out: Vec<Entry> = sts.iter().filter(|s| !s.isdir).map(|s| self.entry(s)).collect();
                out.sort_by(|a, b| a.rel.cmp(&b.rel));
                Ok(out)
            }
            Err(e) if e.is_not_found() => Ok(vec![]),
            Err(e) => Err(e),
        }
    }

    async fn children(&self, dir: &str) -> Result<Vec<String>> {
        let path = self.path(dir);
        let p = path.clone();
        match self.call("list", &path, |c| async move { c.list_status(&p, false).await }).await {
            Ok(sts) => Ok(sts.iter().map(|s| s.path.rsplit('/').next().unwrap_or(&s.path).to_string()).collect()),
            Err(e) if e.is_not_found() => Ok(vec![]),
            Err(e) => Err(e),
        }
    }

    async fn head(&self, rel: &str) -> Result<Option<Entry>> {
        let path = self.path(rel);
        let p = path.clone();
        match self.call("stat", &path, |c| async move { c.get_file_info(&p).await }).await {
            Ok(st) if st.isdir => Ok(None),
            Ok(st) => {
                Ok(Some(Entry { rel: rel.to_string(), size: st.length as u64, mtime_ms: st.modification_time as i64, change_token: None }))
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn read(&self, rel: &str) -> Result<Vec<u8>> {
        let (len, s) = self.stream(rel).await?;
        let mut out = Vec::with_capacity(len);
        super::drain(&format!("read of {}", self.url(rel)), self.opts.read_stall.0, s, |b| out.extend_from_slice(b)).await?;
        Ok(out)
    }

    fn open_blocking(&self, rel: &str) -> Result<Box<dyn std::io::Read + Send>> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| Error::Other("HDFS read outside the runtime".into()))?;
        let (_, s) = handle.block_on(self.stream(rel))?;
        Ok(Box::new(StreamReader::new(format!("read of {}", self.url(rel)), self.opts.read_stall.0, s)?))
    }

    async fn open_ahead(&self, rel: &str, ahead: usize) -> Result<Box<dyn std::io::Read + Send>> {
        let (_, s) = self.stream(rel).await?;
        Ok(Box::new(ReadAhead::spawn(format!("read of {}", self.url(rel)), self.opts.read_stall.0, ahead, s)?))
    }

    async fn hash(&self, rel: &str) -> Result<(u64, String)> {
        let (_, s) = self.stream(rel).await?;
        super::drain_hash(&format!("read of {}", self.url(rel)), self.opts.read_stall.0, s).await
    }

    async fn upload(&self, local: &Path, rel: &str, _expected: Option<&str>, progress: Progress) -> Result<(u64, String)> {
        let f = std::fs::File::open(local).map_err(|e| Error::io(local.display(), e))?;
        // Pieces of up to 4 MiB, each in its own buffer (handed to the writer, whose packets
        // are slices of it): no larger than the file, so that many small parts in flight hold
        // their size, not 4 MiB each. Read straight into that buffer (no file buffer beside
        // it), and the file let go at its end: a close that waits on the NameNode holds none
        // of it.
        let piece = f.metadata().map_err(|e| Error::io(local.display(), e))?.len().clamp(64 << 10, 4 << 20) as usize;
        let f = Arc::new(std::sync::Mutex::new(Some(f)));
        let src = local.display().to_string();
        // The pieces keep the upload's room in the caller's budget; the upload lets go of its
        // own hold after the last one, so the room comes back once the DataNodes have
        // acknowledged every piece, while the close may still wait on the NameNode.
        let held = progress.clone();
        let next = move || {
            let (f, src, held) = (f.clone(), src.clone(), held.clone());
            Box::pin(async move {
                let what = src.clone();
                tokio::task::spawn_blocking(move || {
                    use std::io::Read;
                    let mut g = f.lock().unwrap_or_else(|p| p.into_inner());
                    let Some(file) = g.as_mut() else {
                        held.let_go_of_room();
                        return Ok(None);
                    };
                    let mut buf = vec![0u8; piece];
                    let mut filled = 0;
                    while filled < buf.len() {
                        match file.read(&mut buf[filled..]) {
                            Ok(0) => {
                                *g = None;
                                break;
                            }
                            Ok(k) => filled += k,
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(Error::io(&src, e)),
                        }
                    }
                    buf.truncate(filled);
                    if filled == 0 {
                        held.let_go_of_room();
                        return Ok(None);
                    }
                    Ok(Some(held.piece(buf)))
                })
                .await
                .map_err(|e| Error::Other(format!("reading {what}: {e}")))?
            }) as std::pin::Pin<Box<dyn std::future::Future<Output = Result<Option<Bytes>>> + Send>>
        };
        self.write_new(rel, next, &progress).await
    }

    /// Writes a small file whole or not at all (a manifest, the DDL). A try that fails on a
    /// transient error (a reset, a NameNode that did not answer: its client is retired) is
    /// made again under a new temp name, up to 3 times: a lost reply costs a retry, not the
    /// caller's attempt.
    async fn put_atomic(&self, rel: &str, bytes: Vec<u8>) -> Result<()> {
        let bytes = Bytes::from(bytes);
        let what = format!("HDFS write of {}", self.url(rel));
        super::retry::resending(&what, 3, Duration::from_millis(200), None, Error::is_transient, || {
            self.put_atomic_once(rel, bytes.clone())
        })
        .await
    }

    /// Writes `bytes` to a temp name next to `rel` and returns that name: the slow half of
    /// [`Backend::put_atomic`] (its close waits for the block report), which a caller may run
    /// before `rel` is to appear. Sent again on a transient failure, as `put_atomic` is.
    async fn create_new(&self, rel: &str, bytes: Bytes) -> Result<bool> {
        // A temp file beside it, then a rename without overwrite, which the NameNode does
        // atomically (rename_noreplace settles an ambiguous one by looking at both names).
        let tmp = self.write_temp(rel, bytes).await?.unwrap_or_default();
        let created = match self.rename_noreplace(&tmp, rel).await {
            Ok(created) => created,
            Err(e) => {
                let _ = self.delete(&tmp).await;
                return Err(e);
            }
        };
        if !created {
            let _ = self.delete(&tmp).await;
        }
        Ok(created)
    }

    async fn write_temp(&self, rel: &str, bytes: Bytes) -> Result<Option<String>> {
        let what = format!("HDFS write of {}", self.url(rel));
        super::retry::resending(&what, 3, Duration::from_millis(200), None, Error::is_transient, || {
            self.write_temp_once(rel, bytes.clone())
        })
        .await
        .map(Some)
    }

    fn put_atomic_blocking(&self, rel: &str, bytes: &[u8]) -> Result<()> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| Error::Other("HDFS write outside the runtime".into()))?;
        handle.block_on(self.put_atomic(rel, bytes.to_vec()))
    }

    async fn rename_noreplace(&self, from: &str, to: &str) -> Result<bool> {
        let (f, t) = (self.path(from), self.path(to));
        if let Some((parent, _)) = t.rsplit_once('/')
            && !parent.is_empty()
        {
            let d = parent.to_string();
            self.call("mkdirs", parent, |c| async move { c.mkdirs(&d, 0o755, true).await }).await?;
        }
        let (f2, t2) = (f.clone(), t.clone());
        match self.call("rename", &f, |c| async move { c.rename(&f2, &t2, false).await }).await {
            Ok(()) => Ok(true),
            Err(e) if e.is_already_exists() => Ok(false),
            Err(e) if e.is_not_found() => Err(e),
            Err(e) => {
                // Ambiguous (timeout or reset after the request went out): look at both names.
                match (self.head(from).await?, self.head(to).await?) {
                    (None, Some(_)) => Ok(true),
                    (Some(_), Some(_)) => Ok(false),
                    _ => Err(e),
                }
            }
        }
    }

    async fn delete(&self, rel: &str) -> Result<()> {
        let path = self.path(rel);
        let p = path.clone();
        match self.call("delete", &path, |c| async move { c.delete(&p, false).await }).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Retires the client it holds when dropped (see [`HdfsStore::retire`]); taken out when the
/// client's call ended well.
struct RetireOnDrop<'a> {
    store: &'a HdfsStore,
    client: Option<Arc<Conn>>,
}

impl Drop for RetireOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.client.take() {
            self.store.retire(&c);
        }
    }
}

fn build(base: &str, opts: &StoreOptions) -> Result<Arc<Conn>> {
    let h = &opts.hdfs;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("ferry-hdfs")
        .enable_all()
        .build()
        .map_err(|e| Error::Other(format!("cannot start an HDFS client's runtime: {e}")))?;
    let mut b = ClientBuilder::new().with_url(base).with_io_runtime(rt.handle().clone());
    if let Some(d) = &h.conf_dir {
        b = b.with_config_dir(d.clone());
    }
    if !h.config.is_empty() {
        b = b.with_config(h.config.clone());
    }
    if let Some(u) = &h.user {
        b = b.with_user(u.clone());
    }
    if let Some(p) = &h.kerberos_principal {
        b = b.with_kerberos_principal(p.clone());
    }
    if let Some(k) = &h.kerberos_keytab {
        b = b.with_kerberos_keytab(k.clone());
    }
    if let Some(c) = &h.kerberos_cache {
        b = b.with_kerberos_cache(c.clone());
    }
    let client = b.build().map_err(|e| Error::Config { file: base.to_string(), message: format!("cannot set up the HDFS client: {e}") })?;
    Ok(Arc::new(Conn { client, rt: Background(Some(rt)) }))
}

#[cfg(test)]
mod pool_tests {
    use super::*;

    /// Idle entries go on a timer, with nobody taking or returning one, and the sweeper ends
    /// with its pool.
    #[tokio::test]
    async fn an_idle_pool_gives_its_clients_back_and_its_sweeper_ends_with_it() {
        let pool: Timed<Arc<u32>> = Default::default();
        let kept = Arc::new(7u32);
        pool.lock().unwrap().push((Instant::now(), kept.clone()));
        sweep_while_alive(&pool, Duration::from_millis(20), Duration::from_millis(50));
        assert_eq!(Arc::strong_count(&kept), 2, "in the pool");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(pool.lock().unwrap().is_empty(), "expired without anyone touching the pool");
        assert_eq!(Arc::strong_count(&kept), 1, "and dropped");
        let weak = Arc::downgrade(&pool);
        drop(pool);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(weak.upgrade().is_none(), "the sweeper holds the pool only weakly");
    }
}
