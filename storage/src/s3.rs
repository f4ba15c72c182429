//! S3 (`s3://bucket/prefix`): an [`ObjectsStore`] over object_store's S3 client, and what S3
//! alone needs: credentials (keys, files, a profile, else the instance's), and the requests
//! object_store has no call for, signed here as it signs its own: ListMultipartUploads (gc of
//! abandoned uploads; needs static keys, else a lifecycle rule does it) and a raw
//! ListObjectsV2 (keys object_store cannot take as paths are set aside, not fatal to a listing).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::aws::AmazonS3Builder;

use crate::Listing;
use crate::error::{Error, Result};
use crate::objects::{ObjectsStore, Service, Transport, bucket_and_prefix, get_bounded, list_pages, parse_uploads, query_value};
use crate::options::StoreOptions;

/// What S3 adds to [`ObjectsStore`].
#[derive(Debug)]
struct S3 {
    /// The bucket's base URL, the region, static credentials if known, and an HTTP client with
    /// the same timeouts and CA as the store's.
    bucket_url: String,
    region: String,
    credential: Option<object_store::aws::AwsCredential>,
    http: object_store::client::HttpClient,
}

/// The store for an `s3://bucket/prefix` (or `s3a://`) URL.
pub(crate) fn open(url: &str, opts: &StoreOptions) -> Result<ObjectsStore> {
    let cfg_err = |message: String| Error::Config { file: url.to_string(), message };
    let (bucket, prefix) = bucket_and_prefix(url, "s3://bucket/prefix")?;
    let s3 = &opts.s3;
    let transport = Transport { limits: s3.limits(), read_stall: opts.read_stall.0 };
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
    let co = transport.client_options("store.s3").map_err(&cfg_err)?;
    let http = transport.http_client(&co).map_err(&cfg_err)?;
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
        .with_retry(transport.retry());
    let store = Arc::new(b.build().map_err(|e| cfg_err(format!("cannot set up the S3 client: {e}")))?);
    let service = S3 {
        bucket_url,
        region,
        credential: credential.map(|(key_id, secret_key, token)| object_store::aws::AwsCredential { key_id, secret_key, token }),
        http,
    };
    Ok(ObjectsStore::new(store.clone(), Some(store), Arc::new(service), bucket, prefix, transport))
}

impl S3 {
    /// A GET of a bucket request object_store has no call for, signed as object_store signs
    /// its own.
    async fn signed_get(&self, cred: &object_store::aws::AwsCredential, uri: &str, what: &str, budget: Duration) -> Result<Bytes> {
        let mut req = http::Request::builder()
            .method("GET")
            .uri(uri)
            .body(object_store::client::HttpRequestBody::from(Vec::new()))
            .map_err(|e| Error::Other(format!("{what}: {e}")))?;
        object_store::aws::AwsAuthorizer::new(cred, "s3", &self.region)
            .try_authorize(&mut req, None)
            .map_err(|e| Error::Other(format!("{what}: cannot sign: {e}")))?;
        get_bounded(&self.http, req, what, budget).await
    }
}

#[async_trait::async_trait]
impl Service for S3 {
    fn name(&self) -> &'static str {
        "S3"
    }

    fn scheme(&self) -> &'static str {
        "s3"
    }

    fn uploads_unlisted(&self) -> Option<&'static str> {
        self.credential.is_none().then_some("no static S3 credentials to sign ListMultipartUploads with")
    }

    async fn list_uploads_once(&self, prefix: &str, budget: Duration) -> Result<Vec<(String, String, i64)>> {
        let Some(cred) = &self.credential else { return Ok(vec![]) };
        let uri = format!("{}?uploads&prefix={}", self.bucket_url, query_value(prefix));
        let body = self.signed_get(cred, &uri, &format!("ListMultipartUploads {} ({prefix})", self.bucket_url), budget).await?;
        Ok(parse_uploads(&String::from_utf8_lossy(&body)))
    }

    async fn list_raw(&self, prefix: &str, root: &str, budget: Duration) -> Result<Option<Listing>> {
        let Some(cred) = &self.credential else { return Ok(None) };
        let what = &format!("ListObjectsV2 {} ({prefix})", self.bucket_url);
        Ok(Some(list_pages(&self.bucket_url, prefix, root, |uri| async move { self.signed_get(cred, &uri, what, budget).await }).await?))
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
