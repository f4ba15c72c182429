//! S3 (`s3://bucket/prefix`) through object_store.
//!
//! # Publish protocol
//!
//! S3 has no rename, so "rename without overwrite" is a HEAD of the target, a server-side
//! copy, and a delete of the source. That is safe only because of two invariants Ferry keeps:
//!
//! - **Keys are deterministic and their bytes are fixed.** A landed or published key is named
//!   by its chunk and partition, and the ledger records the blake3 of the bytes that belong
//!   there. Two writers of one key can only write identical bytes, so a lost race rewrites
//!   the same object and nothing is doubled.
//! - **Every object carries its blake3** in `x-amz-meta-blake3`, set when it is uploaded
//!   (S3's ETag is not a content hash for multipart uploads). A HEAD therefore compares size
//!   and checksum without downloading anything.
//!
//! ```text
//!  copy    upload straight to <dest>/_ferry/landed/<table>/<chunk>/<k=v>/part-<chunk>.parquet
//!          (an upload is atomic on S3: a PUT or a completed multipart appears whole or not at all)
//!          <= part_size: one PUT with If-None-Match: *  (conditional create)
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
//! under a new temp key). A
//! multipart upload that fails is aborted; one cut off by a watchdog is aborted from a
//! background task (each abort is repeated until the upload is no longer listed: a part in
//! flight may land after the first); one orphaned by a crash is found by gc (`ferry gc`, or copy's start) with
//! ListMultipartUploads under the store's root and aborted once older than a copy deadline
//! plus two leases (no live upload is older: its watchdog ends it). With
//! only instance credentials (no static keys to sign that request) a bucket lifecycle rule
//! (AbortIncompleteMultipartUpload) does it instead.
//!
//! Retries: object_store retries what is safe to retry (5xx, 429, refused connections, timeouts
//! of idempotent requests) within `max_retries` / `retry_timeout`. It does not resend a
//! non-idempotent request (a conditional PUT, DeleteObjects) whose connect or TLS handshake
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
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::multipart::MultipartStore;
use object_store::path::Path as Key;
use object_store::{
    Attribute, Attributes, BackoffConfig, ClientOptions, GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutMultipartOptions, PutOptions,
    PutPayload, RetryConfig,
};

use super::{Entry, Progress, StreamReader};
use crate::error::{Error, Result};
use ferry_common::config::StoreOptions;

const HASH_META: &str = "blake3";
/// How many times one multipart upload is aborted before gc is left to finish it.
const ABORT_TRIES: u32 = 6;

#[derive(Debug)]
pub struct S3Store {
    store: Arc<AmazonS3>,
    bucket: String,
    /// Key prefix of the store's root, without slashes at either end ("" for the bucket).
    prefix: String,
    opts: StoreOptions,
    /// For the one request object_store does not offer (ListMultipartUploads): the bucket's
    /// base URL, the region, static credentials if known, and an HTTP client with the same
    /// timeouts and CA as the store's.
    bucket_url: String,
    region: String,
    credential: Option<object_store::aws::AwsCredential>,
    http: object_store::client::HttpClient,
}

impl S3Store {
    pub fn new(url: &str, opts: &StoreOptions) -> Result<S3Store> {
        let cfg_err = |message: String| Error::Config { file: url.to_string(), message };
        let rest = url.split_once("://").map(|(_, r)| r).unwrap_or_default();
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(cfg_err("an S3 URL needs a bucket: s3://bucket/prefix".into()));
        }
        let s3 = &opts.s3;
        let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
        if let Some(e) = &s3.endpoint {
            b = b.with_endpoint(e.clone());
        }
        let region = s3
            .region
            .clone()
            .or_else(|| std::env::var("AWS_REGION").ok())
            .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
            .unwrap_or_else(|| "us-east-1".into());
        b = b.with_region(region.clone());
        let credential = match (&s3.access_key_id, &s3.secret_access_key) {
            (Some(k), Some(s)) => Some((k.clone(), s.clone(), s3.session_token.clone())),
            (None, None) => match (std::env::var("AWS_ACCESS_KEY_ID"), std::env::var("AWS_SECRET_ACCESS_KEY")) {
                (Ok(k), Ok(s)) => Some((k, s, std::env::var("AWS_SESSION_TOKEN").ok())),
                _ => {
                    let profile = s3.profile.clone().or_else(|| std::env::var("AWS_PROFILE").ok());
                    profile_credentials(profile.as_deref()).map_err(&cfg_err)?
                }
            },
            _ => return Err(cfg_err("store.s3: set both access_key_id and secret_access_key, or neither".into())),
        };
        if let Some((k, s, t)) = &credential {
            b = b.with_access_key_id(k.clone()).with_secret_access_key(s.clone());
            if let Some(t) = t {
                b = b.with_token(t.clone());
            }
        }
        let mut co = ClientOptions::new()
            .with_connect_timeout(s3.connect_timeout.0)
            .with_timeout(s3.request_timeout.0)
            .with_read_timeout(s3.read_timeout.0)
            .with_allow_http(s3.allow_http);
        if let Some(ca) = &s3.ca_bundle {
            let pem = std::fs::read(ca).map_err(|e| cfg_err(format!("store.s3.ca_bundle {}: {e}", ca.display())))?;
            let certs = object_store::Certificate::from_pem_bundle(&pem)
                .map_err(|e| cfg_err(format!("store.s3.ca_bundle {}: {e}", ca.display())))?;
            for c in certs {
                co = co.with_root_certificate(c);
            }
        }
        let http = {
            use object_store::client::HttpConnector;
            object_store::client::ReqwestConnector::default()
                .connect(&co)
                .map_err(|e| cfg_err(format!("cannot set up the S3 HTTP client: {e}")))?
        };
        let endpoint = s3.endpoint.clone().unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
        let endpoint = endpoint.trim_end_matches('/');
        let bucket_url = if s3.path_style {
            format!("{endpoint}/{bucket}")
        } else {
            match endpoint.split_once("://") {
                Some((scheme, host)) => format!("{scheme}://{bucket}.{host}"),
                None => format!("https://{bucket}.{endpoint}"),
            }
        };
        b = b
            .with_client_options(co)
            .with_virtual_hosted_style_request(!s3.path_style)
            .with_unsigned_payload(s3.unsigned_payload && !s3.endpoint.as_deref().is_some_and(|e| e.starts_with("http://")))
            .with_allow_http(s3.allow_http)
            .with_retry(RetryConfig {
                backoff: BackoffConfig { init_backoff: Duration::from_millis(100), max_backoff: Duration::from_secs(15), base: 2.0 },
                max_retries: s3.max_retries,
                retry_timeout: s3.retry_timeout.0,
            });
        let store = b.build().map_err(|e| cfg_err(format!("cannot set up the S3 client: {e}")))?;
        Ok(S3Store {
            store: Arc::new(store),
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
            opts: opts.clone(),
            bucket_url,
            region,
            credential: credential.map(|(key_id, secret_key, token)| object_store::aws::AwsCredential { key_id, secret_key, token }),
            http,
        })
    }

    pub fn url(&self, rel: &str) -> String {
        format!("s3://{}/{}", self.bucket, self.key_str(rel))
    }

    pub fn rel_of(&self, url: &str) -> Option<String> {
        let k = url.strip_prefix(&format!("s3://{}/", self.bucket))?;
        if self.prefix.is_empty() { Some(k.to_string()) } else { k.strip_prefix(&format!("{}/", self.prefix)).map(str::to_string) }
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
        let s3 = &self.opts.s3;
        s3.retry_timeout.0 + s3.request_timeout.0 + s3.connect_timeout.0
    }

    /// [`S3Store::call`], sent again (at most `max_retries` times, with capped, jittered
    /// backoff) when `resend` allows it for the failure.
    async fn call_resending<T, Fut>(&self, op: &'static str, rel: &str, resend: Resend, f: impl Fn() -> Fut) -> Result<T>
    where
        Fut: std::future::Future<Output = object_store::Result<T>>,
    {
        // Ferry's resends on top of object_store's own retries stay within one budget.
        let until = tokio::time::Instant::now() + self.budget();
        let what = format!("S3 {op} {}", self.url(rel));
        super::retry::resending(
            &what,
            self.opts.s3.max_retries,
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
            Err(_) => {
                Err(Error::Stalled { what: format!("S3 {op} {}", self.url(rel)), reason: format!("not done within {:?}", self.budget()) })
            }
        }
    }

    pub async fn list(&self, dir: &str) -> Result<Vec<Entry>> {
        let prefix = self.key(dir);
        let mut s = self.store.list(Some(&prefix));
        let root = if self.prefix.is_empty() { String::new() } else { format!("{}/", self.prefix) };
        let mut out = Vec::new();
        loop {
            // Each page of a listing is one request; bound the wait for each.
            let next = tokio::time::timeout(self.budget(), s.next()).await.map_err(|_| Error::Stalled {
                what: format!("S3 list {}", self.url(dir)),
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

    /// [`S3Store::list`] of a source. object_store fails a whole page of a listing on one key
    /// it cannot take as a path (`a//b`, a `.` or `..` segment, a control character): then
    /// the listing is read again here, signed as object_store signs, and such a key is set
    /// aside with its reason while the others are listed.
    pub async fn list_source(&self, dir: &str) -> Result<crate::Listing> {
        match self.list(dir).await {
            Ok(entries) => Ok(crate::Listing { entries, set_aside: Vec::new() }),
            Err(Error::ObjectStore { source: object_store::Error::InvalidPath { .. }, .. }) if self.credential.is_some() => {
                let until = tokio::time::Instant::now() + self.budget() * 4;
                let what = format!("ListObjectsV2 {}", self.url(dir));
                super::retry::resending(
                    &what,
                    self.opts.s3.max_retries,
                    Duration::from_millis(100),
                    Some(until),
                    Error::is_transient,
                    || self.list_raw(dir),
                )
                .await
            }
            Err(e) => Err(e),
        }
    }

    async fn list_raw(&self, dir: &str) -> Result<crate::Listing> {
        let Some(cred) = &self.credential else { return Ok(crate::Listing::default()) };
        let prefix = self.key_str(dir);
        let prefix = if prefix.is_empty() || prefix.ends_with('/') { prefix } else { format!("{prefix}/") };
        let root = if self.prefix.is_empty() { String::new() } else { format!("{}/", self.prefix) };
        let enc = |v: &str| -> String { url::form_urlencoded::byte_serialize(v.as_bytes()).collect() };
        let mut out = crate::Listing::default();
        let mut token: Option<String> = None;
        loop {
            let mut uri = format!("{}?list-type=2&prefix={}", self.bucket_url, enc(&prefix));
            if let Some(t) = &token {
                uri.push_str(&format!("&continuation-token={}", enc(t)));
            }
            let body = self.signed_get(cred, &uri, &format!("ListObjectsV2 {}", self.url(dir))).await?;
            token = parse_list_page(&String::from_utf8_lossy(&body), &root, &mut out);
            if token.is_none() {
                break;
            }
        }
        out.entries.sort_by(|a, b| a.rel.cmp(&b.rel));
        Ok(out)
    }

    pub async fn children(&self, dir: &str) -> Result<Vec<String>> {
        let prefix = self.key(dir);
        let found = self.call("list", dir, self.store.list_with_delimiter(Some(&prefix))).await?;
        let name = |p: &object_store::path::Path| p.filename().unwrap_or_default().to_string();
        Ok(found.common_prefixes.iter().map(name).chain(found.objects.iter().map(|m| name(&m.location))).collect())
    }

    pub async fn head(&self, rel: &str) -> Result<Option<Entry>> {
        match self.call("HEAD", rel, self.store.head(&self.key(rel))).await {
            Ok(m) => {
                Ok(Some(Entry { rel: rel.to_string(), size: m.size, mtime_ms: m.last_modified.timestamp_millis(), change_token: m.e_tag }))
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn stream(&self, rel: &str) -> Result<futures::stream::BoxStream<'static, Result<Bytes>>> {
        let r = self.call("GET", rel, self.store.get(&self.key(rel))).await?;
        let url = self.url(rel);
        Ok(r.into_stream().map(move |b| b.map_err(|e| Error::ObjectStore { op: "GET", path: url.clone(), source: e })).boxed())
    }

    pub async fn read(&self, rel: &str) -> Result<Vec<u8>> {
        let s = self.stream(rel).await?;
        let mut out = Vec::new();
        super::drain(&format!("read of {}", self.url(rel)), self.opts.read_stall.0, s, |b| out.extend_from_slice(b)).await?;
        Ok(out)
    }

    pub fn open_blocking(&self, rel: &str) -> Result<Box<dyn std::io::Read + Send>> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| Error::Other("S3 read outside the runtime".into()))?;
        let s = handle.block_on(self.stream(rel))?;
        Ok(Box::new(StreamReader::new(format!("read of {}", self.url(rel)), self.opts.read_stall.0, s)?))
    }

    /// Size and blake3 of an object: from its metadata when Ferry wrote it (one HEAD-sized
    /// request), else by reading it.
    pub async fn hash(&self, rel: &str) -> Result<(u64, String)> {
        let head = GetOptions { head: true, ..Default::default() };
        let r = self.call("HEAD", rel, self.store.get_opts(&self.key(rel), head)).await?;
        if let Some(h) = r.attributes.get(&Attribute::Metadata(HASH_META.into())) {
            return Ok((r.meta.size, h.as_ref().to_string()));
        }
        let s = self.stream(rel).await?;
        super::drain_hash(&format!("read of {}", self.url(rel)), self.opts.read_stall.0, s).await
    }

    pub async fn put_atomic(&self, rel: &str, bytes: Vec<u8>) -> Result<()> {
        // A PUT is atomic on S3: readers see the old object or the whole new one.
        let hash = blake3::hash(&bytes).to_hex().to_string();
        let opts = PutOptions { attributes: hash_attr(&hash), ..Default::default() };
        self.call("PUT", rel, self.store.put_opts(&self.key(rel), PutPayload::from(bytes), opts)).await?;
        Ok(())
    }

    pub fn put_atomic_blocking(&self, rel: &str, bytes: &[u8]) -> Result<()> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| Error::Other("S3 write outside the runtime".into()))?;
        handle.block_on(self.put_atomic(rel, bytes.to_vec()))
    }

    /// HEAD `to`; if absent, server-side copy and delete `from` (see the module's invariants).
    pub async fn rename_noreplace(&self, from: &str, to: &str) -> Result<bool> {
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

    pub async fn delete(&self, rel: &str) -> Result<()> {
        let key = self.key(rel);
        match self.call_resending("DELETE", rel, Resend::Always, || self.store.delete(&key)).await {
            Err(e) if e.is_not_found() => Ok(()),
            r => r,
        }
    }

    pub async fn upload(self: &Arc<Self>, local: &Path, rel: &str, expected: Option<&str>, progress: Progress) -> Result<(u64, String)> {
        let size = tokio::fs::metadata(local).await.map_err(|e| Error::io(local.display(), e))?.len();
        if size <= self.opts.s3.part_size.0 {
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

    /// One conditional PUT. Returns size and hash of the file; when that differs from
    /// `expected`, nothing was sent.
    async fn put_small(&self, local: &Path, rel: &str, expected: Option<&str>, progress: &Progress) -> Result<(u64, String)> {
        let bytes = tokio::fs::read(local).await.map_err(|e| Error::io(local.display(), e))?;
        let size = bytes.len() as u64;
        let hash = blake3::hash(&bytes).to_hex().to_string();
        if expected.is_some_and(|e| e != hash) {
            return Ok((size, hash));
        }
        let payload = PutPayload::from(Bytes::from(bytes));
        let key = self.key(rel);
        // Waiting for one bounded request: not a stall (its bytes count once it is done).
        let _waiting = progress.in_call();
        let res = self
            .call_resending("PUT", rel, Resend::Unsent, || {
                let opts = PutOptions { mode: PutMode::Create, attributes: hash_attr(&hash), ..Default::default() };
                self.store.put_opts(&key, payload.clone(), opts)
            })
            .await;
        match res {
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
    async fn put_multipart(self: &Arc<Self>, local: &Path, rel: &str, hash: &str, progress: &Progress) -> Result<String> {
        let key = self.key(rel);
        let opts = PutMultipartOptions { attributes: hash_attr(hash), ..Default::default() };
        let id = self.call("CreateMultipartUpload", rel, self.store.create_multipart_opts(&key, opts)).await?;
        let guard = AbortOnDrop { store: self.clone(), rel: rel.to_string(), id: id.clone(), armed: true };
        let res = self.send_parts(local, rel, &key, &id, hash, progress).await;
        let mut guard = guard;
        // The guard stays armed while the abort runs: cut off half-way (a watchdog), it
        // finishes the abort in the background.
        let res = match res {
            Ok(Some(sent)) => {
                // Bytes differ from what the caller expects: never complete them.
                self.abort_upload(rel, &id).await;
                Ok(sent)
            }
            Ok(None) => Ok(hash.to_string()),
            Err(e) => {
                self.abort_upload(rel, &id).await;
                Err(e)
            }
        };
        guard.armed = false;
        res
    }

    /// Aborts one multipart upload and makes sure it is gone. A part still in flight when the
    /// abort lands (a dropped request the server is still storing) may be stored after it and
    /// bring the upload back: S3 says an abort may have to be repeated until the upload is no
    /// longer listed. So: abort, look, and abort again, 0.25 s apart doubling, at most
    /// `ABORT_TRIES` times. What is still left is logged and left to gc, which finds every
    /// upload under the store's root. Never fails: the caller has its own outcome to report.
    async fn abort_upload(&self, rel: &str, id: &str) {
        let key = self.key(rel);
        let mut wait = Duration::from_millis(250);
        for attempt in 1..=ABORT_TRIES {
            let upload = id.to_string();
            match self.call_resending("AbortMultipartUpload", rel, Resend::Always, || self.store.abort_multipart(&key, &upload)).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => tracing::debug!(key = %self.url(rel), upload = %id, attempt, error = %e, "abort failed"),
            }
            if self.credential.is_none() {
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
    async fn send_parts(&self, local: &Path, rel: &str, key: &Key, id: &String, hash: &str, progress: &Progress) -> Result<Option<String>> {
        use tokio::io::AsyncReadExt;
        let part = self.opts.s3.part_size.0 as usize;
        let mut f = tokio::fs::File::open(local).await.map_err(|e| Error::io(local.display(), e))?;
        let mut h = blake3::Hasher::new();
        let mut inflight = futures::stream::FuturesOrdered::new();
        let mut parts = Vec::new();
        let mut idx = 0usize;
        let mut eof = false;
        loop {
            while !eof && inflight.len() < self.opts.s3.part_concurrency.max(1) {
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
                let (store, key, id, n) = (self.store.clone(), key.clone(), id.clone(), filled as u64);
                let i = idx;
                idx += 1;
                inflight.push_back(async move {
                    let r = store.put_part(&key, &id, i, PutPayload::from(Bytes::from(buf))).await;
                    (r, n)
                });
            }
            let Some((r, n)) = inflight.next().await else { break };
            let pid = r.map_err(|e| Error::ObjectStore { op: "UploadPart", path: self.url(rel), source: e })?;
            parts.push(pid);
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
        match self.call("CompleteMultipartUpload", rel, self.store.complete_multipart(key, id, parts)).await {
            Ok(_) => Ok(None),
            Err(e) => match self.hash(rel).await {
                // A lost reply to a complete that went through.
                Ok((_, h)) if h == hash => Ok(None),
                _ => Err(e),
            },
        }
    }

    /// Multipart uploads under the store's root started before `cutoff_ms`, as (key, upload
    /// id). Empty, with a log line, when only instance credentials are available.
    pub async fn abandoned_uploads(&self, cutoff_ms: i64) -> Result<Vec<(String, String)>> {
        if self.credential.is_none() {
            tracing::info!("no static S3 credentials: abandoned multipart uploads are left to the bucket's lifecycle rule");
            return Ok(vec![]);
        }
        let prefix = if self.prefix.is_empty() { String::new() } else { format!("{}/", self.prefix) };
        Ok(self.list_uploads(&prefix).await?.into_iter().filter(|u| u.2 < cutoff_ms).map(|(k, id, _)| (k, id)).collect())
    }

    /// Multipart uploads of the key `rel`, as (key, upload id, started ms).
    async fn uploads(&self, rel: &str) -> Result<Vec<(String, String, i64)>> {
        let key = self.key_str(rel);
        Ok(self.list_uploads(&key).await?.into_iter().filter(|u| u.0 == key).collect())
    }

    /// ListMultipartUploads for keys starting with `prefix` (signed here: object_store has no
    /// call for it), as (key, upload id, started ms). Needs static credentials.
    async fn list_uploads(&self, prefix: &str) -> Result<Vec<(String, String, i64)>> {
        // A GET: sent again after any transport failure, as object_store does with its own.
        let until = tokio::time::Instant::now() + self.budget();
        let what = format!("ListMultipartUploads {} ({prefix})", self.url(""));
        super::retry::resending(&what, self.opts.s3.max_retries, Duration::from_millis(100), Some(until), Error::is_transient, || {
            self.list_uploads_once(prefix)
        })
        .await
    }

    /// A GET of a bucket request object_store has no call for, signed as object_store signs
    /// its own, bounded by the call budget. A transport failure is transient; an HTTP error
    /// status is what the server decided (5xx and 429 transient, the rest not).
    async fn signed_get(&self, cred: &object_store::aws::AwsCredential, uri: &str, what: &str) -> Result<Bytes> {
        let mut req = http::Request::builder()
            .method("GET")
            .uri(uri)
            .body(object_store::client::HttpRequestBody::from(Vec::new()))
            .map_err(|e| Error::Other(format!("{what}: {e}")))?;
        object_store::aws::AwsAuthorizer::new(cred, "s3", &self.region)
            .try_authorize(&mut req, None)
            .map_err(|e| Error::Other(format!("{what}: cannot sign: {e}")))?;
        let stalled = |reason: String| Error::Stalled { what: what.to_string(), reason };
        tokio::time::timeout(self.budget(), async {
            let resp = self.http.execute(req).await.map_err(|e| stalled(e.to_string()))?;
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
        .map_err(|_| stalled(format!("not done within {:?}", self.budget())))?
    }

    async fn list_uploads_once(&self, prefix: &str) -> Result<Vec<(String, String, i64)>> {
        let Some(cred) = &self.credential else { return Ok(vec![]) };
        let enc: String = url::form_urlencoded::byte_serialize(prefix.as_bytes()).collect();
        let uri = format!("{}?uploads&prefix={enc}", self.bucket_url);
        let body = self.signed_get(cred, &uri, &format!("ListMultipartUploads {}", self.url(""))).await?;
        let text = String::from_utf8_lossy(&body);
        let mut out = Vec::new();
        for upload in text.split("<Upload>").skip(1) {
            let field = |name: &str| {
                upload.split_once(&format!("<{name}>")).and_then(|(_, r)| r.split_once(&format!("</{name}>"))).map(|(v, _)| xml_unescape(v))
            };
            let (Some(key), Some(id), Some(initiated)) = (field("Key"), field("UploadId"), field("Initiated")) else { continue };
            let started = chrono::DateTime::parse_from_rfc3339(&initiated).map(|t| t.timestamp_millis()).unwrap_or(i64::MAX);
            out.push((key, id, started));
        }
        Ok(out)
    }

    /// The store-relative path of a key this store listed (`<prefix>/<rel>`).
    pub fn rel_of_key<'a>(&self, key: &'a str) -> Option<&'a str> {
        if self.prefix.is_empty() { Some(key) } else { key.strip_prefix(&self.prefix)?.strip_prefix('/') }
    }

    /// Aborts these multipart uploads (key, id): a crashed uploader's, whether headed for a
    /// temp key or, in place, for a landed one. Listed again until none of them is left (a
    /// part in flight can land after an abort), not paged by markers (some servers reject
    /// their own markers); uploads not among them are never touched.
    pub async fn abort_uploads(&self, chosen: &[(String, String)]) -> Result<usize> {
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
                tracing::info!(key = %format!("s3://{}/{key}", self.bucket), upload = %id, "aborting an abandoned multipart upload");
                let k = Key::from(key.clone());
                match self.call_resending("AbortMultipartUpload", &key, Resend::Always, || self.store.abort_multipart(&k, &id)).await {
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

/// One page of a ListObjectsV2 answer into `out`: a key that object_store cannot take as a
/// path is set aside with its reason (relative to `root`, as the log and the ledger show it);
/// returns the continuation token when the listing goes on.
fn parse_list_page(text: &str, root: &str, out: &mut crate::Listing) -> Option<String> {
    let field = |part: &str, name: &str| {
        part.split_once(&format!("<{name}>")).and_then(|(_, r)| r.split_once(&format!("</{name}>"))).map(|(v, _)| xml_unescape(v))
    };
    for item in text.split("<Contents>").skip(1) {
        let Some(key) = field(item, "Key") else { continue };
        let rel = key.strip_prefix(root).unwrap_or(&key).to_string();
        // object_store refuses empty segments, `.` and `..`, and control characters.
        if let Err(e) = object_store::path::Path::parse(&key) {
            tracing::warn!(key = ?key, reason = %e, "skipping an S3 key that is not a valid path; rename the object to take it in");
            out.set_aside.push((format!("{rel:?}"), format!("an S3 key that is not a valid path ({e}); rename the object to take it in")));
            continue;
        }
        let size = field(item, "Size").and_then(|v| v.parse().ok()).unwrap_or(0);
        let mtime_ms =
            field(item, "LastModified").and_then(|v| chrono::DateTime::parse_from_rfc3339(&v).ok()).map_or(0, |t| t.timestamp_millis());
        out.entries.push(Entry { rel, size, mtime_ms, change_token: field(item, "ETag") });
    }
    field(text, "NextContinuationToken").filter(|t| !t.is_empty() && text.contains("<IsTruncated>true</IsTruncated>"))
}

/// XML text as it reads: the five named entities and numeric ones (`&#34;`, `&#x1;`).
fn xml_unescape(s: &str) -> String {
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

fn hash_attr(hash: &str) -> Attributes {
    let mut a = Attributes::new();
    a.insert(Attribute::Metadata(HASH_META.into()), hash.to_string().into());
    a
}

/// A multipart upload cut off by a watchdog (its future dropped) is aborted in the background.
struct AbortOnDrop {
    store: Arc<S3Store>,
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

/// Keys from `~/.aws/credentials` (or `AWS_SHARED_CREDENTIALS_FILE`) for `profile`
/// (default "default"). None if there is no such file or profile.
fn profile_credentials(profile: Option<&str>) -> std::result::Result<Option<(String, String, Option<String>)>, String> {
    let file = match std::env::var("AWS_SHARED_CREDENTIALS_FILE") {
        Ok(f) => std::path::PathBuf::from(f),
        Err(_) => match std::env::var("HOME") {
            Ok(h) => Path::new(&h).join(".aws/credentials"),
            Err(_) => return Ok(None),
        },
    };
    let Ok(text) = std::fs::read_to_string(&file) else {
        return match profile {
            Some(p) => Err(format!("store.s3.profile {p:?}: cannot read {}", file.display())),
            None => Ok(None),
        };
    };
    let want = profile.unwrap_or("default");
    let (mut cur, mut k, mut s, mut t) = (String::new(), None, None, None);
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            cur = name.trim().to_string();
        } else if cur == want
            && let Some((key, v)) = line.split_once('=')
        {
            let v = Some(v.trim().to_string());
            match key.trim() {
                "aws_access_key_id" => k = v,
                "aws_secret_access_key" => s = v,
                "aws_session_token" => t = v,
                _ => {}
            }
        }
    }
    match (k, s) {
        (Some(k), Some(s)) => Ok(Some((k, s, t))),
        _ if profile.is_some() => Err(format!("store.s3.profile {want:?}: no keys for it in {}", file.display())),
        _ => Ok(None),
    }
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
