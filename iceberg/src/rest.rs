//! An Iceberg REST catalog (`[destination.iceberg] catalog = "rest"`): the few calls of the REST
//! catalog spec a writer needs: config, load, create (and its namespace), commit.
//!
//! A commit names what it builds on (`assert-table-uuid`, `assert-ref-snapshot-id` of `main`,
//! and the schema it evolves), so the catalog takes it only if no other writer moved the table
//! first; a 409 is a lost race, planned again. Unlike the catalog in the ledger, the commit and
//! the ledger's record of it are two steps, and a commit whose reply is lost (a reset, a timeout,
//! a 5xx: the catalog may have applied it) is settled by reading the table: the snapshot id is
//! Ferry's own, drawn at random, so the table's snapshots say whether it went in. Either way the
//! chunk's retry plans against the table as it is, finds its files in (or not) and records (or
//! commits): nothing lost, nothing doubled.
//!
//! Every request has the catalog's deadline; loads and the namespace's creation are retried with
//! backoff (they change nothing twice); a commit is sent once per plan.

use std::time::Duration;

use bytes::Bytes;
use ferry_runtime::config::IcebergSection;
use ferry_storage::options::ObjectLimits;
use http::{Method, StatusCode};
use object_store::client::{HttpClient, HttpRequestBody};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::{IcebergError, Result};

/// How a commit ended.
#[derive(Debug)]
pub(crate) enum Committed {
    /// The catalog took it: the table's metadata as the answer gives it (if it does).
    Done(Option<Value>),
    /// A requirement failed (another writer committed first): nothing changed.
    Conflict,
}

/// Retries of a request that changes nothing twice.
const TRIES: u32 = 4;

pub(crate) struct RestCatalog {
    http: HttpClient,
    uri: String,
    warehouse: Option<String>,
    namespace: Vec<String>,
    table: String,
    deadline: Duration,
    /// A fixed token, or client credentials and where to exchange them.
    token: Option<String>,
    credential: Option<(String, String)>,
    oauth2_uri: String,
    scope: String,
    /// The token of `credential`, and the path prefix `/v1/config` named, once asked.
    session: Mutex<Session>,
}

#[derive(Default)]
struct Session {
    token: Option<String>,
    prefix: Option<String>,
}

/// A request that did not get an answer (transport failure, timeout) or got a 5xx / 429: the
/// catalog is out, which heals by itself; the store error's class says so.
fn unreachable(what: &str, reason: String) -> IcebergError {
    IcebergError::Storage(ferry_storage::Error::Stalled { what: what.to_string(), reason })
}

/// The catalog's error message of a JSON error body (`{"error": {"message", "type"}}`).
fn message(body: &[u8]) -> String {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => match v.pointer("/error/message").and_then(Value::as_str) {
            Some(m) => format!("{} ({})", m, v.pointer("/error/type").and_then(Value::as_str).unwrap_or("error")),
            None => v.to_string(),
        },
        Err(_) => String::from_utf8_lossy(&body[..body.len().min(500)]).into_owned(),
    }
}

/// `v` percent-encoded as one path segment or query value.
fn encode(v: &str) -> String {
    let mut out = String::new();
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl RestCatalog {
    pub(crate) fn new(ice: &IcebergSection, table: &str) -> Result<RestCatalog> {
        let uri = ice.uri.clone().ok_or_else(|| IcebergError::Metadata("destination.iceberg.uri is not set".into()))?;
        let limits = ObjectLimits {
            ca_bundle: ice.ca_bundle.clone(),
            allow_http: ice.allow_http,
            connect_timeout: ice.connect_timeout.0,
            request_timeout: ice.request_timeout.0,
            read_timeout: ice.request_timeout.0,
            max_retries: 0,
            retry_timeout: ice.request_timeout.0,
            part_size: 0,
            part_concurrency: 1,
        };
        let http = ferry_storage::http_client(&limits, "destination.iceberg").map_err(IcebergError::Metadata)?;
        let uri = uri.trim_end_matches('/').to_string();
        let credential = ice.credential.as_deref().and_then(|c| c.split_once(':')).map(|(i, s)| (i.to_string(), s.to_string()));
        Ok(RestCatalog {
            http,
            oauth2_uri: ice.oauth2_server_uri.clone().unwrap_or_else(|| format!("{uri}/v1/oauth/tokens")),
            uri,
            warehouse: ice.warehouse.clone(),
            namespace: ice.namespace.split('.').map(str::to_string).collect(),
            table: table.to_string(),
            deadline: ice.request_timeout.0 + ice.connect_timeout.0,
            token: ice.token.clone(),
            credential,
            scope: ice.scope.clone(),
            session: Mutex::new(Session::default()),
        })
    }

    /// One request within the deadline: the status and body, or a transport failure / timeout
    /// as [`unreachable`].
    async fn send(&self, method: Method, url: &str, body: Option<(&str, Vec<u8>)>, what: &str) -> Result<(StatusCode, Bytes)> {
        let mut req = http::Request::builder().method(method).uri(url).header("accept", "application/json");
        if let Some(token) = self.bearer(what).await? {
            req = req.header("authorization", format!("Bearer {token}"));
        }
        let req = match body {
            Some((kind, b)) => req.header("content-type", kind).body(HttpRequestBody::from(b)),
            None => req.body(HttpRequestBody::from(Vec::new())),
        }
        .map_err(|e| IcebergError::Metadata(format!("{what}: {url}: {e}")))?;
        self.exchange(req, what).await
    }

    /// `req` sent and its whole answer read within the deadline; no answer is [`unreachable`].
    async fn exchange(&self, req: http::Request<HttpRequestBody>, what: &str) -> Result<(StatusCode, Bytes)> {
        tokio::time::timeout(self.deadline, async {
            let resp = self.http.execute(req).await.map_err(|e| unreachable(what, e.to_string()))?;
            let status = resp.status();
            let body = resp.into_body().bytes().await.map_err(|e| unreachable(what, e.to_string()))?;
            Ok((status, body))
        })
        .await
        .map_err(|_| unreachable(what, format!("no answer within {:?}", self.deadline)))?
    }

    /// The bearer token: the configured one, or the credential's (asked for once, and again
    /// after a 401).
    async fn bearer(&self, what: &str) -> Result<Option<String>> {
        if let Some(t) = &self.token {
            return Ok(Some(t.clone()));
        }
        let Some((id, secret)) = &self.credential else { return Ok(None) };
        let mut session = self.session.lock().await;
        if let Some(t) = &session.token {
            return Ok(Some(t.clone()));
        }
        let form = format!(
            "grant_type=client_credentials&client_id={}&client_secret={}&scope={}",
            encode(id),
            encode(secret),
            encode(&self.scope)
        );
        let req = http::Request::builder()
            .method(Method::POST)
            .uri(&self.oauth2_uri)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(HttpRequestBody::from(form.into_bytes()))
            .map_err(|e| IcebergError::Metadata(format!("{what}: {}: {e}", self.oauth2_uri)))?;
        let (status, body) = self.exchange(req, "the catalog's token").await?;
        if !status.is_success() {
            return Err(unreachable("the catalog's token", format!("{} answered HTTP {status}: {}", self.oauth2_uri, message(&body))));
        }
        let token = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v.get("access_token")?.as_str().map(str::to_string))
            .ok_or_else(|| unreachable("the catalog's token", format!("{} answered without access_token", self.oauth2_uri)))?;
        session.token = Some(token.clone());
        Ok(Some(token))
    }

    /// Forgets the credential's token (the catalog refused it: expired).
    async fn forget_token(&self) {
        self.session.lock().await.token = None;
    }

    /// `<uri>/v1/<prefix>/`: the prefix the catalog's config names for the warehouse.
    async fn base(&self) -> Result<String> {
        if let Some(p) = &self.session.lock().await.prefix {
            return Ok(p.clone());
        }
        let url = match &self.warehouse {
            Some(w) => format!("{}/v1/config?warehouse={}", self.uri, encode(w)),
            None => format!("{}/v1/config", self.uri),
        };
        let body = self.get_json(&url, "the catalog's config").await?.unwrap_or_default();
        let prefix = body
            .pointer("/overrides/prefix")
            .or_else(|| body.pointer("/defaults/prefix"))
            .and_then(Value::as_str)
            .map(|p| format!("{}/v1/{}/", self.uri, p.trim_matches('/')))
            .unwrap_or_else(|| format!("{}/v1/", self.uri));
        self.session.lock().await.prefix = Some(prefix.clone());
        Ok(prefix)
    }

    fn namespace_path(&self) -> String {
        encode(&self.namespace.join("\u{1f}"))
    }

    async fn table_url(&self) -> Result<String> {
        Ok(format!("{}namespaces/{}/tables/{}", self.base().await?, self.namespace_path(), encode(&self.table)))
    }

    /// A GET, retried with backoff while the catalog is out; None for a 404.
    async fn get_json(&self, url: &str, what: &str) -> Result<Option<Value>> {
        self.retrying(Method::GET, url, None, what, |s, body| match s {
            s if s.is_success() => Some(
                serde_json::from_slice(body)
                    .map(Some)
                    .map_err(|e| IcebergError::Metadata(format!("{what}: {url} answered with no JSON: {e}"))),
            ),
            StatusCode::NOT_FOUND => Some(Ok(None)),
            _ => None,
        })
        .await
    }

    /// A request that changes nothing when repeated, sent until `done` takes its answer (Some),
    /// at most [`TRIES`] times with backoff while the catalog is out (see [`RestCatalog::unanswered`]).
    async fn retrying<T>(
        &self,
        method: Method,
        url: &str,
        body: Option<&Value>,
        what: &str,
        done: impl Fn(StatusCode, &Bytes) -> Option<Result<T>>,
    ) -> Result<T> {
        let mut backoff = ferry_storage::Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        let mut tries = 0;
        loop {
            tries += 1;
            let sent = self.send(method.clone(), url, body.map(|b| ("application/json", b.to_string().into_bytes())), what).await;
            let retry = match sent {
                Ok((s, answer)) => match done(s, &answer) {
                    Some(r) => return r,
                    None => self.unanswered(what, s, &answer).await?,
                },
                Err(e) => e,
            };
            if tries >= TRIES {
                return Err(retry);
            }
            tracing::debug!(what, error = %retry, "the catalog did not answer; asking again");
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }

    /// An answer no caller took: the catalog out (5xx, 429) or the credential's token expired
    /// (401, 419: dropped, asked for again) is the error to retry on (`Ok`); anything else is
    /// what the catalog meant (`Err`, see [`refused`]).
    async fn unanswered(&self, what: &str, s: StatusCode, body: &[u8]) -> Result<IcebergError> {
        if token_expired(s) && self.credential.is_some() {
            self.forget_token().await;
            return Ok(unreachable(what, message(body)));
        }
        if s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS {
            return Ok(unreachable(what, format!("HTTP {s}: {}", message(body))));
        }
        Err(refused(what, s, body))
    }

    /// The table's current metadata file and its content, or None if the catalog has no such
    /// table.
    pub(crate) async fn load(&self) -> Result<Option<(String, Value)>> {
        let url = self.table_url().await?;
        let Some(body) = self.get_json(&url, "loading the Iceberg table").await? else { return Ok(None) };
        let location = body.get("metadata-location").and_then(Value::as_str).map(str::to_string);
        match (location, body.get("metadata")) {
            (Some(l), Some(m)) => Ok(Some((l, m.clone()))),
            _ => Err(IcebergError::Metadata(format!("{url}: the catalog's answer has no metadata-location or metadata"))),
        }
    }

    /// Creates the table (format version 2) with `schema` and `spec` at `location`, and its
    /// namespace first if the catalog has none (a catalog that lets Ferry create tables but not
    /// namespaces is asked for the namespace only when it is missing); one another writer
    /// created first is taken as it is.
    pub(crate) async fn create(&self, schema: &Value, spec: &Value, location: &str) -> Result<()> {
        let base = self.base().await?;
        let body = json!({
            "name": self.table,
            "location": location,
            "schema": schema,
            "partition-spec": spec,
            "write-order": {"order-id": 0, "fields": []},
            "stage-create": false,
            "properties": {"format-version": "2"},
        });
        let url = format!("{base}namespaces/{}/tables", self.namespace_path());
        if self.post_idempotent(&url, &body, "creating the Iceberg table").await? {
            return Ok(());
        }
        let ns = json!({"namespace": self.namespace, "properties": {}});
        self.post_idempotent(&format!("{base}namespaces"), &ns, "creating the table's namespace").await?;
        if self.post_idempotent(&url, &body, "creating the Iceberg table").await? {
            return Ok(());
        }
        Err(IcebergError::Metadata(format!("{url}: the catalog has no namespace {} after creating it", self.namespace.join("."))))
    }

    /// A POST whose second delivery is a 409 (a create): 409 counts as done. False: a 404 (no
    /// such namespace).
    async fn post_idempotent(&self, url: &str, body: &Value, what: &str) -> Result<bool> {
        self.retrying(Method::POST, url, Some(body), what, |s, _| match s {
            s if s.is_success() || s == StatusCode::CONFLICT => Some(Ok(true)),
            StatusCode::NOT_FOUND => Some(Ok(false)),
            _ => None,
        })
        .await
    }

    /// Sends a commit once. `Err` of a store class is an unknown outcome (no answer, a 5xx):
    /// the caller settles it by reading the table.
    pub(crate) async fn commit(&self, requirements: Value, updates: Value) -> Result<Committed> {
        let url = self.table_url().await?;
        let body = json!({"requirements": requirements, "updates": updates});
        let what = "committing to the Iceberg table";
        ferry_common::crash::point("rest commit");
        let sent = self.send(Method::POST, &url, Some(("application/json", body.to_string().into_bytes())), what).await;
        ferry_common::crash::point("rest commit");
        let (status, body) = sent?;
        match status {
            s if s.is_success() => {
                let answer = serde_json::from_slice::<Value>(&body).ok().and_then(|v| v.get("metadata").cloned());
                Ok(Committed::Done(answer))
            }
            StatusCode::CONFLICT => Ok(Committed::Conflict),
            // A snapshot whose sequence number another branch's commit took since the table was
            // read (main did not move, so its requirement held): planned again, as a lost race.
            StatusCode::BAD_REQUEST if message(&body).contains("sequence number") => Ok(Committed::Conflict),
            s => Err(self.unanswered(what, s, &body).await?),
        }
    }
}

/// 401, and the spec's 419 (credentials timed out): a token of `credential` to ask for again.
fn token_expired(s: StatusCode) -> bool {
    s == StatusCode::UNAUTHORIZED || s.as_u16() == 419
}

/// A 4xx the catalog meant: credentials it refuses are an outage the operator mends (the chunk
/// waits); anything else is the chunk's.
fn refused(what: &str, status: StatusCode, body: &[u8]) -> IcebergError {
    match status {
        s if token_expired(s) || s == StatusCode::FORBIDDEN => {
            unreachable(what, format!("the catalog refused Ferry's credentials (HTTP {status}): {}", message(body)))
        }
        _ => IcebergError::Metadata(format!("{what}: the catalog answered HTTP {status}: {}", message(body))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_and_errors() {
        assert_eq!(encode("a\u{1f}b c/d"), "a%1Fb%20c%2Fd");
        let body =
            br#"{"error": {"message": "Requirement failed: branch main has changed", "type": "CommitFailedException", "code": 409}}"#;
        assert_eq!(message(body), "Requirement failed: branch main has changed (CommitFailedException)");
        assert_eq!(message(b"<html>oops</html>"), "<html>oops</html>");
    }
}
