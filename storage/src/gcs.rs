//! Google Cloud Storage (`gs://bucket/prefix`): an [`ObjectsStore`] over object_store's GCS
//! client (GCS's XML API), and what GCS alone needs: credentials (a service account's key
//! file, else the environment's, else the instance's metadata server) and the requests
//! object_store has no call for, sent with the bearer token it uses: ListMultipartUploads (gc
//! of abandoned uploads) and a raw object listing (keys object_store cannot take as paths are
//! set aside, not fatal to a listing). GCS's XML API answers both as S3 does.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::gcp::{GoogleCloudStorage, GoogleCloudStorageBuilder};

use crate::Listing;
use crate::error::{Error, Result};
use crate::objects::{ObjectsStore, Service, Transport, bucket_and_prefix, get_bounded, list_pages, parse_uploads, query_value};
use crate::options::StoreOptions;

const GOOGLE: &str = "https://storage.googleapis.com";

/// What GCS adds to [`ObjectsStore`].
#[derive(Debug)]
struct Gcs {
    /// `<endpoint>/<bucket>`, where the XML API serves the bucket's own requests.
    bucket_url: String,
    /// For its credentials: the requests sent here carry the same bearer token.
    store: Arc<GoogleCloudStorage>,
    http: object_store::client::HttpClient,
}

/// The store for a `gs://bucket/prefix` URL.
pub(crate) fn open(url: &str, opts: &StoreOptions) -> Result<ObjectsStore> {
    let cfg_err = |message: String| Error::Config { file: url.to_string(), message };
    let (bucket, prefix) = bucket_and_prefix(url, "gs://bucket/prefix")?;
    let g = &opts.gcs;
    let transport = Transport { limits: g.limits(), read_stall: opts.read_stall.0 };
    let mut b = GoogleCloudStorageBuilder::from_env().with_bucket_name(bucket);
    let endpoint = g.endpoint.clone().unwrap_or_else(|| GOOGLE.to_string());
    let endpoint = endpoint.trim_end_matches('/');
    // Explicit, even for Google: a base URL in a service account's key file would otherwise
    // send object_store elsewhere than the requests made here.
    b = b.with_base_url(endpoint);
    if let Some(sa) = &g.service_account {
        b = b.with_service_account_path(sa.to_string_lossy());
    }
    let co = transport.client_options("store.gcs").map_err(&cfg_err)?;
    let http = transport.http_client(&co).map_err(&cfg_err)?;
    let store = b
        .with_client_options(co)
        .with_retry(transport.retry())
        .build()
        .map_err(|e| cfg_err(format!("cannot set up the GCS client: {e}")))?;
    let store = Arc::new(store);
    let service = Gcs { bucket_url: format!("{endpoint}/{bucket}"), store: store.clone(), http };
    Ok(ObjectsStore::new(store.clone(), Some(store), Arc::new(service), bucket, prefix, transport))
}

impl Gcs {
    /// A GET with the bearer token object_store's own requests carry (none where the
    /// credentials give an empty one: an emulator).
    async fn get(&self, uri: &str, what: &str, budget: Duration) -> Result<Bytes> {
        let cred = tokio::time::timeout(budget, self.store.credentials().get_credential())
            .await
            .map_err(|_| Error::Stalled { what: what.to_string(), reason: format!("no credential within {budget:?}") })?
            .map_err(|e| Error::ObjectStore { op: "credential", path: self.bucket_url.clone(), source: e })?;
        let mut req = http::Request::builder().method("GET").uri(uri);
        if !cred.bearer.is_empty() {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {}", cred.bearer));
        }
        let req = req.body(object_store::client::HttpRequestBody::from(Vec::new())).map_err(|e| Error::Other(format!("{what}: {e}")))?;
        get_bounded(&self.http, req, what, budget).await
    }
}

#[async_trait::async_trait]
impl Service for Gcs {
    fn name(&self) -> &'static str {
        "GCS"
    }

    fn scheme(&self) -> &'static str {
        "gs"
    }

    fn uploads_unlisted(&self) -> Option<&'static str> {
        None
    }

    async fn list_uploads_once(&self, prefix: &str, budget: Duration) -> Result<Vec<(String, String, i64)>> {
        let uri = format!("{}?uploads&prefix={}", self.bucket_url, query_value(prefix));
        let body = self.get(&uri, &format!("ListMultipartUploads {} ({prefix})", self.bucket_url), budget).await?;
        Ok(parse_uploads(&String::from_utf8_lossy(&body)))
    }

    async fn list_raw(&self, prefix: &str, root: &str, budget: Duration) -> Result<Option<Listing>> {
        let what = &format!("list {} ({prefix})", self.bucket_url);
        Ok(Some(list_pages(&self.bucket_url, prefix, root, |uri| async move { self.get(&uri, what, budget).await }).await?))
    }
}
