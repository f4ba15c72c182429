//! Object stores (S3, Google Cloud Storage, Azure Blob Storage) through object_store: one
//! backend, [`ObjectsStore`], with what each service alone needs behind [`Service`] (its
//! credentials, and the requests object_store has no call for: listing multipart uploads).
//!
//! # Publish protocol
//!
//! An object store has no rename, so "rename without overwrite" is a HEAD of the target, a
//! server-side copy, and a delete of the source. That is safe only because of two invariants
//! Ferry keeps:
//!
//! - **Keys are deterministic and their bytes are fixed.** A landed or published key is named
//!   by its chunk and partition, and the ledger records the blake3 of the bytes that belong
//!   there. Two writers of one key can only write identical bytes, so a lost race rewrites
//!   the same object and nothing is doubled.
//! - **Every object carries its blake3** in its user metadata (`x-amz-meta-blake3`,
//!   `x-goog-meta-blake3`, `x-ms-meta-blake3`), set when it is uploaded (an ETag is not a
//!   content hash for multipart uploads). A HEAD therefore compares size and checksum without
//!   downloading anything.
//!
//! ```text
//!  copy    upload straight to <dest>/_ferry/landed/<table>/<chunk>/<k=v>/part-<chunk>.parquet
//!          (an upload is atomic: a PUT or a completed multipart appears whole or not at all)
//!          <= part_size: one conditional create (If-None-Match: * / generation 0)
//!          >  part_size: multipart, completed only if the bytes sent hash to what transform
//!                        recorded, aborted otherwise
//!  hedge   a second upload to _ferry/tmp/<chunk>.<epoch>.<i>.<try>.h (its own key), then
//!          HEAD landed; absent -> server-side COPY tmp -> landed, DELETE tmp
//!  load    the same "rename": HEAD table key; absent -> COPY landed -> table key, DELETE landed
//! ```
//!
//! After an ambiguous failure (a timeout or reset on the conditional PUT, which object_store
//! does not retry; or a 412 that may be our own lost success) we HEAD the key and accept it
//! only if size and blake3 match; otherwise copy sends the part again (in place, or a hedge
//! under a new temp key). A multipart upload that fails is aborted; one cut off by a watchdog
//! is aborted from a background task (each abort is repeated until the upload is no longer
//! listed: a part in flight may land after the first); one orphaned by a crash is found by gc
//! (`ferry gc`, or copy's start) by listing the uploads under the store's root, and aborted
//! once older than a copy deadline plus two leases (no live upload is older: its watchdog ends
//! it). Where uploads cannot be listed (S3 with instance credentials only; Azure, whose
//! uncommitted blocks have no id and expire by themselves after a week) a bucket lifecycle
//! rule does it instead.
//!
//! Retries: object_store retries what is safe to retry (5xx, 429, refused connections, timeouts
//! of idempotent requests) within `max_retries` / `retry_timeout`. It does not resend a
//! non-idempotent request (a conditional PUT, a batch delete) whose connect or TLS handshake
//! timed out, although such a request never went out. Ferry resends those itself ([`Resend`]):
//! a request that failed before it was sent is always sent again, whatever its method; a
//! delete or an abort, whose repetition changes nothing, is sent again after any transport
//! failure; a conditional PUT whose outcome is unknown is settled by a HEAD and hash instead.
//! What still fails goes back to copy, which resends the part on a new connection.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as Key;
use object_store::{
    Attribute, Attributes, BackoffConfig, ClientOptions, GetOptions, MultipartUpload, ObjectStore, ObjectStoreExt, PutMode,
    PutMultipartOptions, PutOptions, PutPayload, RetryConfig,
};

use super::{Entry, Listing, Progress, ReadAhead, StreamReader};
use crate::backend::{Backend, Capabilities};
use crate::error::{Error, Result};
use crate::options::ObjectLimits;

const HASH_META: &str = "blake3";
/// How many times one multipart upload is aborted before gc is left to finish it.
const ABORT_TRIES: u32 = 6;

/// The limits every request to an object store runs under (from the store's options).
#[derive(Debug, Clone)]
pub(crate) struct Transport {
    pub limits: ObjectLimits,
    /// A read that delivers no bytes for this long is abandoned.
    pub read_stall: Duration,
}

impl Transport {
    /// A belt over object_store's own limits: no call outlives its retry budget plus one
    /// request, whatever happens inside.
    fn budget(&self) -> Duration {
        let l = &self.limits;
        l.retry_timeout + l.request_timeout + l.connect_timeout
    }

    /// object_store's client options: the timeouts, plain HTTP if allowed, the extra CAs.
    /// `section` names the options in errors (`store.s3`).
    pub fn client_options(&self, section: &str) -> std::result::Result<ClientOptions, String> {
        let l = &self.limits;
        let mut co = ClientOptions::new()
            .with_connect_timeout(l.connect_timeout)
            .with_timeout(l.request_timeout)
            .with_read_timeout(l.read_timeout)
            .with_allow_http(l.allow_http);
        if let Some(ca) = &l.ca_bundle {
            let pem = std::fs::read(ca).map_err(|e| format!("{section}.ca_bundle {}: {e}", ca.display()))?;
            let certs =
                object_store::Certificate::from_pem_bundle(&pem).map_err(|e| format!("{section}.ca_bundle {}: {e}", ca.display()))?;
            for c in certs {
                co = co.with_root_certificate(c);
            }
        }
        install_tls_provider();
        Ok(co)
    }

    /// An HTTP client with the same timeouts and CAs, for the requests object_store has no
    /// call for.
    pub fn http_client(&self, co: &ClientOptions) -> std::result::Result<object_store::client::HttpClient, String> {
        use object_store::client::HttpConnector;
        object_store::client::ReqwestConnector::default().connect(co).map_err(|e| format!("cannot set up the HTTP client: {e}"))
    }

    pub fn retry(&self) -> RetryConfig {
        RetryConfig {
            backoff: BackoffConfig { init_backoff: Duration::from_millis(100), max_backoff: Duration::from_secs(15), base: 2.0 },
            max_retries: self.limits.max_retries,
            retry_timeout: self.limits.retry_timeout,
        }
    }
}

/// What one object service adds to [`ObjectsStore`].
#[async_trait::async_trait]
pub(crate) trait Service: std::fmt::Debug + Send + Sync + 'static {
    /// As messages name it: "S3", "GCS", "Azure".
    fn name(&self) -> &'static str;
    /// Its URL scheme: "s3", "gs", "az".
    fn scheme(&self) -> &'static str;
    /// Why [`Service::list_uploads_once`] cannot answer here (S3 with instance credentials
    /// only: nothing to sign it with; Azure: uncommitted blocks have no upload to list), or
    /// None where it can. A bucket lifecycle rule then removes abandoned uploads.
    fn uploads_unlisted(&self) -> Option<&'static str>;
    /// One request for the multipart uploads of keys starting with `prefix`, as (key, upload
    /// id, started ms), within `budget`; none where [`Service::uploads_unlisted`] says why.
    async fn list_uploads_once(&self, _prefix: &str, _budget: Duration) -> Result<Vec<(String, String, i64)>> {
        Ok(vec![])
    }
    /// The listing of key prefix `prefix` read without object_store, for keys it cannot take
    /// as paths (relative to `root`, set aside with their reason); None where the service has
    /// no such reading.
    async fn list_raw(&self, _prefix: &str, _root: &str, _budget: Duration) -> Result<Option<Listing>> {
        Ok(None)
    }
}

/// One bucket (or container) and key prefix of an object store.
#[derive(Clone)]
pub struct ObjectsStore {
    store: Arc<dyn ObjectStore>,
    /// Multipart uploads with ids, which can be listed and aborted (S3, GCS). None: uploads go
    /// through object_store's own writer (Azure: blocks committed by a block list, no ids).
    multipart: Option<Arc<dyn MultipartStore>>,
    service: Arc<dyn Service>,
    bucket: String,
    /// Key prefix of the store's root, without slashes at either end ("" for the bucket).
    prefix: String,
    transport: Transport,
}

impl std::fmt::Debug for ObjectsStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectsStore").field("url", &self.url("")).field("service", &self.service).finish_non_exhaustive()
    }
}

/// A multipart upload in progress.
enum Upload {
    /// Parts named by the service's upload id (S3, GCS).
    Ids { store: Arc<dyn MultipartStore>, id: String, parts: Vec<PartId> },
    /// object_store's writer (Azure).
    Writer(Box<dyn MultipartUpload>),
}

impl ObjectsStore {
    pub(crate) fn new(
        store: Arc<dyn ObjectStore>,
        multipart: Option<Arc<dyn MultipartStore>>,
        service: Arc<dyn Service>,
        bucket: &str,
        prefix: &str,
        transport: Transport,
    ) -> ObjectsStore {
        ObjectsStore { store, multipart, service, bucket: bucket.to_string(), prefix: prefix.trim_matches('/').to_string(), transport }
    }

    fn key_str(&self, rel: &str) -> String {
        let rel = rel.trim_matches('/');
        match (self.prefix.is_empty(), rel.is_empty()) {
            (true, _) => rel.to_string(),
            (false, true) => self.prefix.clone(),
            (false, false) => format!("{}/{rel}", self.prefix),
        }
    }

    fn key(&self, rel: &str) -> Key {
        Key::from(self.key_str(rel))
    }

    /// A belt over object_store's own limits: no call outlives its retry budget plus one
    /// request, whatever happens inside.
    fn budget(&self) -> Duration {
        self.transport.budget()
    }

    /// [`ObjectsStore::call`], sent again (at most `max_retries` times, with capped, jittered
    /// backoff) when `resend` allows it for the failure.
    async fn call_resending<T, Fut>(&self, op: &'static str, rel: &str, resend: Resend, f: impl Fn() -> Fut) -> Result<T>
    where
        Fut: std::future::Future<Output = object_store::Result<T>>,
    {
        // Ferry's resends on top of object_store's own retries stay within one budget.
        let until = tokio::time::Instant::now() + self.budget();
        let what = format!("{} {op} {}", self.service.name(), self.url(rel));
        super::retry::resending(
            &what,
            self.transport.limits.max_retries,
            Duration::from_millis(100),
            Some(until),
            |e| resend.allows(e),
            || self.call(op, rel, f()),
        )
        .await
    }

    async fn call<T>(&self, op: &'static str, rel: &str, fut: impl std::future::Future<Output = object_store::Result<T>>) -> Result<T> {
        match tokio::time::timeout(self.budget(), fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(Error::ObjectStore { op, path: self.url(rel), source: e }),
            Err(_) => Err(Error::Stalled {
                what: format!("{} {op} {}", self.service.name(), self.url(rel)),
                reason: format!("not done within {:?}", self.budget()),
            }),
        }
    }

    async fn stream(&self, rel: &str) -> Result<futures::stream::BoxStream<'static, Result<Bytes>>> {
        let r = self.call("GET", rel, self.store.get(&self.key(rel))).await?;
        let url = self.url(rel);
        Ok(r.into_stream().map(move |b| b.map_err(|e| Error::ObjectStore { op: "GET", path: url.clone(), source: e })).boxed())
    }

    /// One conditional create of `rel` (If-None-Match: * / generation 0) carrying `hash` in
    /// its metadata, resent only if it never went out: its outcome is the caller's to settle.
    async fn put_new(&self, rel: &str, bytes: Bytes, hash: &str) -> Result<()> {
        let payload = PutPayload::from(bytes);
        let key = self.key(rel);
        self.call_resending("PUT", rel, Resend::Unsent, || {
            let opts = PutOptions { mode: PutMode::Create, attributes: hash_attr(hash), ..Default::default() };
            self.store.put_opts(&key, payload.clone(), opts)
        })
        .await
        .map(|_| ())
    }

    /// One conditional PUT. Returns size and hash of the file; when that differs from
    /// `expected`, nothing was sent.
    async fn put_small(&self, local: &Path, rel: &str, expected: Option<&str>, progress: &Progress) -> Result<(u64, String)> {
        let bytes = tokio::fs::read(local).await.map_err(|e| Error::io(local.display(), e))?;
        let size = bytes.len() as u64;
        let hash = blake3::hash(&bytes).to_hex().to_string();
        if expected.is_some_and(|e| e != hash) {
            return Ok((size, hash));
        }
        // Waiting for one bounded request: not a stall (its bytes count once it is done).
        let _waiting = progress.in_call();
        match self.put_new(rel, Bytes::from(bytes), &hash).await {
            Ok(_) => {
                progress.add(size);
                Ok((size, hash))
            }
            Err(e) => {
                // 412 may be our own lost success; a timeout or reset leaves the outcome
                // unknown (object_store does not retry a conditional PUT). Look before redoing.
                match self.hash(rel).await {
                    Ok((n, h)) if n == size && h == hash => {
                        tracing::info!(key = %self.url(rel), error = %e, "PUT failed but the object is there, whole");
                        progress.add(size);
                        Ok((size, hash))
                    }
                    // The body may have gone out whole before the failure: counted as sent (unless
                    // it never left), so the retry's redone work is not under-reported.
                    _ if e.is_already_exists() => {
                        progress.add(size);
                        Err(Error::Ambiguous { what: format!("PUT {}", self.url(rel)), reason: "the key holds other bytes".into() })
                    }
                    _ => {
                        if !Resend::Unsent.allows(&e) {
                            progress.add(size);
                        }
                        Err(e)
                    }
                }
            }
        }
    }

    /// A multipart upload whose object carries `hash`; returns the hash of the bytes sent. If
    /// they differ from `hash` the upload is aborted, not completed.
    async fn put_multipart(&self, local: &Path, rel: &str, hash: &str, progress: &Progress) -> Result<String> {
        let key = self.key(rel);
        let opts = PutMultipartOptions { attributes: hash_attr(hash), ..Default::default() };
        let mut upload = match &self.multipart {
            Some(m) => Upload::Ids {
                store: m.clone(),
                id: self.call("CreateMultipartUpload", rel, m.create_multipart_opts(&key, opts)).await?,
                parts: Vec::new(),
            },
            None => Upload::Writer(self.call("CreateMultipartUpload", rel, self.store.put_multipart_opts(&key, opts)).await?),
        };
        // Armed while the upload and its abort run: cut off half-way (a watchdog), the abort is
        // finished in the background.
        let guard = match &upload {
            Upload::Ids { id, .. } => Some(AbortOnDrop { store: self.clone(), rel: rel.to_string(), id: id.clone(), armed: true }),
            Upload::Writer(_) => None,
        };
        let res = match self.send_parts(local, rel, &key, &mut upload, hash, progress).await {
            Ok(None) => Ok(hash.to_string()),
            Ok(Some(sent)) => {
                // Bytes differ from what the caller expects: never complete them.
                self.abort(rel, &mut upload).await;
                Ok(sent)
            }
            Err(e) => {
                self.abort(rel, &mut upload).await;
                Err(e)
            }
        };
        if let Some(mut guard) = guard {
            guard.armed = false;
        }
        res
    }

    async fn abort(&self, rel: &str, upload: &mut Upload) {
        match upload {
            Upload::Ids { id, .. } => self.abort_upload(rel, id).await,
            Upload::Writer(w) => {
                if let Err(e) = self.call("AbortMultipartUpload", rel, w.abort()).await {
                    tracing::debug!(key = %self.url(rel), error = %e, "abort failed");
                }
            }
        }
    }

    /// Aborts one multipart upload and makes sure it is gone. A part still in flight when the
    /// abort lands (a dropped request the server is still storing) may be stored after it and
    /// bring the upload back: S3 says an abort may have to be repeated until the upload is no
    /// longer listed. So: abort, look, and abort again, 0.25 s apart doubling, at most
    /// `ABORT_TRIES` times. What is still left is logged and left to gc, which finds every
    /// upload under the store's root. Never fails: the caller has its own outcome to report.
    async fn abort_upload(&self, rel: &str, id: &str) {
        let Some(m) = &self.multipart else { return };
        let key = self.key(rel);
        let mut wait = Duration::from_millis(250);
        for attempt in 1..=ABORT_TRIES {
            let upload = id.to_string();
            match self.call_resending("AbortMultipartUpload", rel, Resend::Always, || m.abort_multipart(&key, &upload)).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => tracing::debug!(key = %self.url(rel), upload = %id, attempt, error = %e, "abort failed"),
            }
            if self.service.uploads_unlisted().is_some() {
                // Nothing to list with: the bucket's lifecycle rule is the backstop.
                return;
            }
            tokio::time::sleep(wait).await;
            wait *= 2;
            match self.uploads(rel).await {
                Ok(left) if !left.iter().any(|u| u.1 == id) => return,
                Ok(_) => {}
                Err(e) => tracing::debug!(key = %self.url(rel), upload = %id, error = %e, "cannot list multipart uploads"),
            }
        }
        tracing::warn!(key = %self.url(rel), upload = %id, tries = ABORT_TRIES, "multipart upload still listed after aborting it; gc will abort it again");
    }

    /// Sends every part, hashing as it goes, and completes the upload if the hash is `hash`.
    /// Returns the other hash, uncompleted, if it is not.
    async fn send_parts(
        &self,
        local: &Path,
        rel: &str,
        key: &Key,
        upload: &mut Upload,
        hash: &str,
        progress: &Progress,
    ) -> Result<Option<String>> {
        use tokio::io::AsyncReadExt;
        let part = self.transport.limits.part_size as usize;
        let mut f = tokio::fs::File::open(local).await.map_err(|e| Error::io(local.display(), e))?;
        let mut h = blake3::Hasher::new();
        let mut inflight = futures::stream::FuturesOrdered::new();
        let mut idx = 0usize;
        let mut eof = false;
        loop {
            while !eof && inflight.len() < self.transport.limits.part_concurrency.max(1) {
                let mut buf = vec![0u8; part];
                let mut filled = 0;
                while filled < part {
                    let k = f.read(&mut buf[filled..]).await.map_err(|e| Error::io(local.display(), e))?;
                    if k == 0 {
                        eof = true;
                        break;
                    }
                    filled += k;
                }
                if filled == 0 {
                    break;
                }
                buf.truncate(filled);
                h.update(&buf);
                let (payload, n) = (PutPayload::from(Bytes::from(buf)), filled as u64);
                let sent: BoxFuture<'static, object_store::Result<Option<PartId>>> = match &mut *upload {
                    Upload::Ids { store, id, .. } => {
                        let (store, key, id, i) = (store.clone(), key.clone(), id.clone(), idx);
                        Box::pin(async move { store.put_part(&key, &id, i, payload).await.map(Some) })
                    }
                    Upload::Writer(w) => {
                        let part = w.put_part(payload);
                        Box::pin(async move { part.await.map(|()| None) })
                    }
                };
                idx += 1;
                inflight.push_back(async move { (sent.await, n) });
            }
            let Some((r, n)) = inflight.next().await else { break };
            let pid = r.map_err(|e| Error::ObjectStore { op: "UploadPart", path: self.url(rel), source: e })?;
            if let (Some(pid), Upload::Ids { parts, .. }) = (pid, &mut *upload) {
                parts.push(pid);
            }
            progress.add(n);
            if progress.cancelled() {
                return Err(Error::Other(format!("upload to {} cancelled", self.url(rel))));
            }
        }
        let sent = h.finalize().to_hex().to_string();
        if sent != hash {
            return Ok(Some(sent));
        }
        let _waiting = progress.in_call();
        let done = match upload {
            Upload::Ids { store, id, parts } => {
                self.call("CompleteMultipartUpload", rel, store.complete_multipart(key, id, std::mem::take(parts))).await.map(drop)
            }
            Upload::Writer(w) => self.call("CompleteMultipartUpload", rel, w.complete()).await.map(drop),
        };
        match done {
            Ok(()) => Ok(None),
            Err(e) => match self.hash(rel).await {
                // A lost reply to a complete that went through.
                Ok((_, h)) if h == hash => Ok(None),
                _ => Err(e),
            },
        }
    }

    /// Multipart uploads of the key `rel`, as (key, upload id, started ms).
    async fn uploads(&self, rel: &str) -> Result<Vec<(String, String, i64)>> {
        let key = self.key_str(rel);
        Ok(self.list_uploads(&key).await?.into_iter().filter(|u| u.0 == key).collect())
    }

    /// The service's listing of multipart uploads for keys starting with `prefix`, as (key,
    /// upload id, started ms); a GET, so sent again after any transport failure, as
    /// object_store does with its own.
    async fn list_uploads(&self, prefix: &str) -> Result<Vec<(String, String, i64)>> {
        let until = tokio::time::Instant::now() + self.budget();
        let what = format!("{} ListMultipartUploads {} ({prefix})", self.service.name(), self.url(""));
        super::retry::resending(
            &what,
            self.transport.limits.max_retries,
            Duration::from_millis(100),
            Some(until),
            Error::is_transient,
            || self.service.list_uploads_once(prefix, self.budget()),
        )
        .await
    }
}

#[async_trait::async_trait]
impl Backend for ObjectsStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities { uploads_in_place: true, ..Capabilities::default() }
    }

    /// Never called by [`crate::Store`] here (uploads go in place); a copy and a delete.
    async fn rename_over(&self, from: &str, to: &str) -> Result<()> {
        let (a, b) = (self.key(from), self.key(to));
        self.call("CopyObject", to, self.store.copy(&a, &b)).await?;
        self.delete(from).await
    }

    fn url(&self, rel: &str) -> String {
        format!("{}://{}/{}", self.service.scheme(), self.bucket, self.key_str(rel))
    }

    fn rel_of(&self, url: &str) -> Option<String> {
        let k = url.strip_prefix(&format!("{}://{}/", self.service.scheme(), self.bucket))?;
        if self.prefix.is_empty() { Some(k.to_string()) } else { k.strip_prefix(&format!("{}/", self.prefix)).map(str::to_string) }
    }

    async fn list(&self, dir: &str) -> Result<Vec<Entry>> {
        let prefix = self.key(dir);
        let mut s = self.store.list(Some(&prefix));
        let root = if self.prefix.is_empty() { String::new() } else { format!("{}/", self.prefix) };
        let mut out = Vec::new();
        loop {
            // Each page of a listing is one request; bound the wait for each.
            let next = tokio::time::timeout(self.budget(), s.next()).await.map_err(|_| Error::Stalled {
                what: format!("{} list {}", self.service.name(), self.url(dir)),
                reason: format!("no page within {:?}", self.budget()),
            })?;
            match next {
                None => break,
                Some(Err(e)) => return Err(Error::ObjectStore { op: "list", path: self.url(dir), source: e }),
                Some(Ok(m)) => {
                    let k = m.location.as_ref();
                    let rel = k.strip_prefix(&root).unwrap_or(k).to_string();
                    out.push(Entry { rel, size: m.size, mtime_ms: m.last_modified.timestamp_millis(), change_token: m.e_tag.clone() });
                }
            }
        }
        out.sort_by(|a, b| a.rel.cmp(&b.rel));
        Ok(out)
    }

    /// [`Backend::list`] of a source. object_store fails a whole page of a listing on one key
    /// it cannot take as a path (`a//b`, a `.` or `..` segment, a control character): then
    /// the listing is read again by the service itself where it can ([`Service::list_raw`]),
    /// and such a key is set aside with its reason while the others are listed.
    async fn list_source(&self, dir: &str) -> Result<Listing> {
        match self.list(dir).await {
            Ok(entries) => Ok(Listing { entries, set_aside: Vec::new() }),
            Err(e @ Error::ObjectStore { source: object_store::Error::InvalidPath { .. }, .. }) => {
                let prefix = self.key_str(dir);
                let prefix = if prefix.is_empty() || prefix.ends_with('/') { prefix } else { format!("{prefix}/") };
                let root = if self.prefix.is_empty() { String::new() } else { format!("{}/", self.prefix) };
                let until = tokio::time::Instant::now() + self.budget() * 4;
                let what = format!("{} list {}", self.service.name(), self.url(dir));
                let raw = super::retry::resending(
                    &what,
                    self.transport.limits.max_retries,
                    Duration::from_millis(100),
                    Some(until),
                    Error::is_transient,
                    || self.service.list_raw(&prefix, &root, self.budget()),
                )
                .await?;
                let Some(mut listing) = raw else { return Err(e) };
                listing.entries.sort_by(|a, b| a.rel.cmp(&b.rel));
                Ok(listing)
            }
            Err(e) => Err(e),
        }
    }

    async fn children(&self, dir: &str) -> Result<Vec<String>> {
        let prefix = self.key(dir);
        let found = self.call("list", dir, self.store.list_with_delimiter(Some(&prefix))).await?;
        let name = |p: &object_store::path::Path| p.filename().unwrap_or_default().to_string();
        Ok(found.common_prefixes.iter().map(name).chain(found.objects.iter().map(|m| name(&m.location))).collect())
    }

    async fn head(&self, rel: &str) -> Result<Option<Entry>> {
        match self.call("HEAD", rel, self.store.head(&self.key(rel))).await {
            Ok(m) => {
                Ok(Some(Entry { rel: rel.to_string(), size: m.size, mtime_ms: m.last_modified.timestamp_millis(), change_token: m.e_tag }))
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn read(&self, rel: &str) -> Result<Vec<u8>> {
        let s = self.stream(rel).await?;
        let mut out = Vec::new();
        super::drain(&format!("read of {}", self.url(rel)), self.transport.read_stall, s, |b| out.extend_from_slice(b)).await?;
        Ok(out)
    }

    fn open_blocking(&self, rel: &str) -> Result<Box<dyn std::io::Read + Send>> {
        let handle =
            tokio::runtime::Handle::try_current().map_err(|_| Error::Other(format!("{} read outside the runtime", self.service.name())))?;
        let s = handle.block_on(self.stream(rel))?;
        Ok(Box::new(StreamReader::new(format!("read of {}", self.url(rel)), self.transport.read_stall, s)?))
    }

    async fn open_ahead(&self, rel: &str, ahead: usize) -> Result<Box<dyn std::io::Read + Send>> {
        let s = self.stream(rel).await?;
        Ok(Box::new(ReadAhead::spawn(format!("read of {}", self.url(rel)), self.transport.read_stall, ahead, s)?))
    }

    /// Size and blake3 of an object: from its metadata when Ferry wrote it (one HEAD-sized
    /// request), else by reading it.
    async fn hash(&self, rel: &str) -> Result<(u64, String)> {
        let head = GetOptions { head: true, ..Default::default() };
        let r = self.call("HEAD", rel, self.store.get_opts(&self.key(rel), head)).await?;
        if let Some(h) = r.attributes.get(&Attribute::Metadata(HASH_META.into())) {
            return Ok((r.meta.size, h.as_ref().to_string()));
        }
        let s = self.stream(rel).await?;
        super::drain_hash(&format!("read of {}", self.url(rel)), self.transport.read_stall, s).await
    }

    async fn put_atomic(&self, rel: &str, bytes: Vec<u8>) -> Result<()> {
        // A PUT is atomic on an object store: readers see the old object or the whole new one.
        let hash = blake3::hash(&bytes).to_hex().to_string();
        let opts = PutOptions { attributes: hash_attr(&hash), ..Default::default() };
        self.call("PUT", rel, self.store.put_opts(&self.key(rel), PutPayload::from(bytes), opts)).await?;
        Ok(())
    }

    fn put_atomic_blocking(&self, rel: &str, bytes: &[u8]) -> Result<()> {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::Other(format!("{} write outside the runtime", self.service.name())))?;
        handle.block_on(self.put_atomic(rel, bytes.to_vec()))
    }

    /// HEAD `to`; if absent, server-side copy and delete `from` (see the module's invariants).
    async fn create_new(&self, rel: &str, bytes: Bytes) -> Result<bool> {
        let hash = blake3::hash(&bytes).to_hex().to_string();
        let size = bytes.len() as u64;
        match self.put_new(rel, bytes, &hash).await {
            Ok(_) => Ok(true),
            // A 412 may be our own success whose reply was lost (a resent request), and a
            // timeout or reset leaves the outcome unknown: the object's size and blake3 say
            // whose it is.
            Err(e) => match self.hash(rel).await {
                Ok((n, h)) if n == size && h == hash => Ok(true),
                Ok(_) => Ok(false),
                Err(_) if e.is_already_exists() => Ok(false),
                Err(_) => Err(e),
            },
        }
    }

    async fn rename_noreplace(&self, from: &str, to: &str) -> Result<bool> {
        if self.head(to).await?.is_some() {
            return Ok(false);
        }
        if self.head(from).await?.is_none() {
            return Err(Error::ObjectStore {
                op: "COPY",
                path: self.url(from),
                source: object_store::Error::NotFound { path: self.key_str(from), source: "no such key".into() },
            });
        }
        self.call("COPY", to, self.store.copy(&self.key(from), &self.key(to))).await?;
        // The data is in place: a source that cannot be removed now is left to gc (a landed
        // copy of a published chunk, a temp object), never a reason to undo the step.
        if let Err(e) = self.delete(from).await {
            tracing::warn!(key = %self.url(from), error = %e, "cannot remove the source of a finished copy; gc will");
        }
        Ok(true)
    }

    async fn delete(&self, rel: &str) -> Result<()> {
        let key = self.key(rel);
        match self.call_resending("DELETE", rel, Resend::Always, || self.store.delete(&key)).await {
            Err(e) if e.is_not_found() => Ok(()),
            r => r,
        }
    }

    async fn upload(&self, local: &Path, rel: &str, expected: Option<&str>, progress: Progress) -> Result<(u64, String)> {
        let size = tokio::fs::metadata(local).await.map_err(|e| Error::io(local.display(), e))?.len();
        if size <= self.transport.limits.part_size {
            return self.put_small(local, rel, expected, &progress).await;
        }
        // The hash goes into the object's metadata, which a multipart upload must name at its
        // start: the caller's expected hash, or one pass over the file first.
        let hash = match expected {
            Some(h) => h.to_string(),
            None => {
                let src = local.to_path_buf();
                tokio::task::spawn_blocking(move || super::hash_file(&src))
                    .await
                    .map_err(|e| Error::Other(format!("hash task failed: {e}")))??
                    .1
            }
        };
        let sent = self.put_multipart(local, rel, &hash, &progress).await?;
        Ok((size, sent))
    }

    /// Multipart uploads under the store's root started before `cutoff_ms`, as (key, upload
    /// id). Empty, with a log line, where the service cannot list them.
    async fn abandoned_uploads(&self, cutoff_ms: i64) -> Result<Vec<(String, String)>> {
        if let Some(why) = self.service.uploads_unlisted() {
            tracing::info!(store = %self.url(""), "{why}: abandoned multipart uploads are left to the bucket's lifecycle rule");
            return Ok(vec![]);
        }
        let prefix = if self.prefix.is_empty() { String::new() } else { format!("{}/", self.prefix) };
        Ok(self.list_uploads(&prefix).await?.into_iter().filter(|u| u.2 < cutoff_ms).map(|(k, id, _)| (k, id)).collect())
    }

    /// The store-relative path of a key this store listed (`<prefix>/<rel>`).
    fn rel_of_key<'a>(&self, key: &'a str) -> Option<&'a str> {
        if self.prefix.is_empty() { Some(key) } else { key.strip_prefix(&self.prefix)?.strip_prefix('/') }
    }

    /// Aborts these multipart uploads (key, id): a crashed uploader's, whether headed for a
    /// temp key or, in place, for a landed one. Listed again until none of them is left (a
    /// part in flight can land after an abort), not paged by markers (some servers reject
    /// their own markers); uploads not among them are never touched.
    async fn abort_uploads(&self, chosen: &[(String, String)]) -> Result<usize> {
        let Some(m) = &self.multipart else { return Ok(0) };
        let mut n = 0;
        // A failure part-way still says how many went.
        let incomplete = |n: usize, e: Error| Error::Incomplete { removed: n, reason: e.to_string() };
        let chosen: std::collections::HashSet<&(String, String)> = chosen.iter().collect();
        for round in 0..100 {
            let batch: Vec<(String, String)> = if round == 0 {
                chosen.iter().map(|c| (*c).clone()).collect()
            } else {
                self.abandoned_uploads(i64::MAX).await.map_err(|e| incomplete(n, e))?.into_iter().filter(|u| chosen.contains(u)).collect()
            };
            if batch.is_empty() {
                break;
            }
            for (key, id) in batch {
                tracing::info!(key = %format!("{}://{}/{key}", self.service.scheme(), self.bucket), upload = %id, "aborting an abandoned multipart upload");
                let k = Key::from(key.clone());
                match self.call_resending("AbortMultipartUpload", &key, Resend::Always, || m.abort_multipart(&k, &id)).await {
                    Ok(()) if round == 0 => n += 1,
                    Ok(()) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(incomplete(n, e)),
                }
            }
        }
        Ok(n)
    }
}

/// Which failures of a request Ferry sends again itself (see the module note).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resend {
    /// Only a request that never went out: its connect or TLS handshake failed or timed out.
    Unsent,
    /// After any transport failure or timeout: sending it twice changes nothing (a delete, an abort).
    Always,
}

impl Resend {
    /// Only transport failures: an HTTP status is the server's answer, and a call that used up
    /// its whole budget (`Stalled`) is not tried again.
    fn allows(self, e: &Error) -> bool {
        let Error::ObjectStore { source, .. } = e else { return false };
        match self {
            Resend::Unsent => failed_before_send(source),
            Resend::Always => failed_before_send(source) || transport_kind(source).is_some(),
        }
    }
}

/// The kind of the transport failure a request ended with (none for an HTTP status).
fn transport_kind(e: &object_store::Error) -> Option<object_store::client::HttpErrorKind> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<object_store::client::HttpError>() {
            return Some(h.kind());
        }
        cur = err.source();
    }
    None
}

/// Whether the request failed while connecting (TCP connect, TLS handshake; refused, reset or
/// timed out), so that the server never saw it. object_store files a connect that timed out
/// as a timeout, not a connect error; hyper's connector error ("client error (Connect)") is
/// in the chain either way.
fn failed_before_send(e: &object_store::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<object_store::client::HttpError>()
            && matches!(h.kind(), object_store::client::HttpErrorKind::Connect)
        {
            return true;
        }
        if err.to_string().starts_with("client error (Connect)") {
            return true;
        }
        cur = err.source();
    }
    false
}

fn hash_attr(hash: &str) -> Attributes {
    let mut a = Attributes::new();
    a.insert(Attribute::Metadata(HASH_META.into()), hash.to_string().into());
    a
}

/// A multipart upload cut off by a watchdog (its future dropped) is aborted in the background.
struct AbortOnDrop {
    store: ObjectsStore,
    rel: String,
    id: String,
    armed: bool,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (store, rel, id) = (self.store.clone(), std::mem::take(&mut self.rel), std::mem::take(&mut self.id));
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            let job = super::Background::start();
            h.spawn(async move {
                store.abort_upload(&rel, &id).await;
                drop(job);
            });
        }
    }
}

/// One GET that object_store has no call for (`req`, already authorized), bounded by
/// `budget`. A transport failure is transient; an HTTP error status is what the server decided
/// (5xx and 429 transient, the rest not).
pub(crate) async fn get_bounded(
    http: &object_store::client::HttpClient,
    req: http::Request<object_store::client::HttpRequestBody>,
    what: &str,
    budget: Duration,
) -> Result<Bytes> {
    let stalled = |reason: String| Error::Stalled { what: what.to_string(), reason };
    tokio::time::timeout(budget, async {
        let resp = http.execute(req).await.map_err(|e| stalled(e.to_string()))?;
        let status = resp.status();
        let body = resp.into_body().bytes().await.map_err(|e| stalled(e.to_string()))?;
        if status.is_server_error() || status.as_u16() == 429 {
            return Err(stalled(format!("HTTP {status}")));
        }
        if !status.is_success() {
            return Err(Error::Other(format!("{what}: HTTP {status}: {}", String::from_utf8_lossy(&body))));
        }
        Ok(body)
    })
    .await
    .map_err(|_| stalled(format!("not done within {budget:?}")))?
}

/// A ListMultipartUploads answer (S3's XML, which GCS's XML API speaks too), as (key, upload
/// id, started ms).
pub(crate) fn parse_uploads(text: &str) -> Vec<(String, String, i64)> {
    let mut out = Vec::new();
    for upload in text.split("<Upload>").skip(1) {
        let (Some(key), Some(id), Some(initiated)) =
            (xml_field(upload, "Key"), xml_field(upload, "UploadId"), xml_field(upload, "Initiated"))
        else {
            continue;
        };
        let started = chrono::DateTime::parse_from_rfc3339(&initiated).map(|t| t.timestamp_millis()).unwrap_or(i64::MAX);
        out.push((key, id, started));
    }
    out
}

/// The bucket (or container) and key prefix of `url` (`<scheme>://bucket/prefix`); `example`
/// names the form in the error.
pub(crate) fn bucket_and_prefix<'a>(url: &'a str, example: &str) -> Result<(&'a str, &'a str)> {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or_default();
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(Error::Config { file: url.to_string(), message: format!("the URL needs a bucket: {example}") });
    }
    Ok((bucket, prefix))
}

/// `v` as a URL query value.
pub(crate) fn query_value(v: &str) -> String {
    url::form_urlencoded::byte_serialize(v.as_bytes()).collect()
}

/// A ListObjectsV2 of key prefix `prefix` read without object_store, page by page through
/// `get` (a GET of the URI, authorized as the service does): keys object_store cannot take as
/// paths are set aside (see [`parse_list_page`]).
pub(crate) async fn list_pages<F, Fut>(bucket_url: &str, prefix: &str, root: &str, get: F) -> Result<Listing>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<Bytes>>,
{
    let mut out = Listing::default();
    let mut token: Option<String> = None;
    loop {
        let mut uri = format!("{bucket_url}?list-type=2&prefix={}", query_value(prefix));
        if let Some(t) = &token {
            uri.push_str(&format!("&continuation-token={}", query_value(t)));
        }
        let body = get(uri).await?;
        token = parse_list_page(&String::from_utf8_lossy(&body), root, &mut out);
        if token.is_none() {
            return Ok(out);
        }
    }
}

/// One page of a ListObjectsV2 answer (S3; GCS's XML API answers alike) into `out`: a key that object_store cannot take as a
/// path is set aside with its reason (relative to `root`, as the log and the ledger show it);
/// returns the continuation token when the listing goes on.
pub(crate) fn parse_list_page(text: &str, root: &str, out: &mut Listing) -> Option<String> {
    let field = xml_field;
    for item in text.split("<Contents>").skip(1) {
        let Some(key) = field(item, "Key") else { continue };
        let rel = key.strip_prefix(root).unwrap_or(&key).to_string();
        // object_store refuses empty segments, `.` and `..`, and control characters.
        if let Err(e) = object_store::path::Path::parse(&key) {
            tracing::warn!(key = ?key, reason = %e, "skipping a key that is not a valid path; rename the object to take it in");
            out.set_aside.push((format!("{rel:?}"), format!("a key that is not a valid path ({e}); rename the object to take it in")));
            continue;
        }
        let size = field(item, "Size").and_then(|v| v.parse().ok()).unwrap_or(0);
        let mtime_ms =
            field(item, "LastModified").and_then(|v| chrono::DateTime::parse_from_rfc3339(&v).ok()).map_or(0, |t| t.timestamp_millis());
        out.entries.push(Entry { rel, size, mtime_ms, change_token: field(item, "ETag") });
    }
    field(text, "NextContinuationToken").filter(|t| !t.is_empty() && text.contains("<IsTruncated>true</IsTruncated>"))
}

/// The text of the first `<name>` element in `part`, unescaped.
pub(crate) fn xml_field(part: &str, name: &str) -> Option<String> {
    part.split_once(&format!("<{name}>")).and_then(|(_, r)| r.split_once(&format!("</{name}>"))).map(|(v, _)| xml_unescape(v))
}

/// XML text as it reads: the five named entities and numeric ones (`&#34;`, `&#x1;`).
pub(crate) fn xml_unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        let Some(end) = rest.find(';') else { break };
        let entity = &rest[1..end];
        let c = match entity {
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            "amp" => Some('&'),
            _ => entity
                .strip_prefix("#x")
                .or_else(|| entity.strip_prefix("#X"))
                .map(|h| u32::from_str_radix(h, 16))
                .or_else(|| entity.strip_prefix('#').map(|d| d.parse::<u32>()))
                .and_then(|n| n.ok())
                .and_then(char::from_u32),
        };
        match c {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// reqwest's rustls takes the process's crypto provider. Ferry builds one, ring (sqlx's too),
/// and installs it before the first S3 client; a provider installed before it stays.
fn install_tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page as S3 writes it, with keys no object_store path can be: each set aside with its
    /// reason, the good one listed, the token taken. (The test S3 server stores objects as
    /// files, so it cannot hold such keys; real S3 can.)
    #[test]
    fn odd_keys_on_a_list_page_are_set_aside_and_the_rest_listed() {
        let page = "<ListBucketResult><IsTruncated>true</IsTruncated><NextContinuationToken>t&amp;1</NextContinuationToken>\
            <Contents><Key>p/in/good.jsonl</Key><LastModified>2026-11-30T10:00:00Z</LastModified><ETag>&#34;abc&#34;</ETag><Size>42</Size></Contents>\
            <Contents><Key>p/in/a//b.jsonl</Key><Size>1</Size></Contents>\
            <Contents><Key>p/in/x/../y.jsonl</Key><Size>1</Size></Contents>\
            <Contents><Key>p/in/bad&#x1;name.jsonl</Key><Size>1</Size></Contents></ListBucketResult>";
        let mut out = crate::Listing::default();
        assert_eq!(parse_list_page(page, "p/", &mut out).as_deref(), Some("t&1"));
        assert_eq!(out.entries.len(), 1);
        assert_eq!(out.entries[0].rel, "in/good.jsonl");
        assert_eq!((out.entries[0].size, out.entries[0].change_token.as_deref()), (42, Some("\"abc\"")));
        let names: Vec<&str> = out.set_aside.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["\"in/a//b.jsonl\"", "\"in/x/../y.jsonl\"", "\"in/bad\\u{1}name.jsonl\""]);
        assert!(out.set_aside.iter().all(|(_, why)| why.contains("not a valid path")), "{:?}", out.set_aside);
        assert_eq!(xml_unescape("a &lt;b&gt; &amp;c &#65;&#x42; &bogus; &"), "a <b> &c AB &bogus; &");
    }
}
