//! The `[ledger]` section: where the ledger lives and how the stages use it.

use std::path::PathBuf;
use std::time::Duration;

use ferry_common::config::{HumanDuration, redact_url};
use ferry_common::error::ConfigError;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerSection {
    /// sqlite://PATH or postgres://USER:PASSWORD@HOST/DB.
    pub url: String,
    /// Read the URL (with its password) from this file instead.
    pub url_file: Option<PathBuf>,
    /// A claim's validity without a heartbeat; a crashed worker's chunk is retried after it.
    pub lease: HumanDuration,
    /// Attempts per (chunk, stage) before the chunk is quarantined.
    pub max_attempts: i64,
    /// The wait before a failed chunk's first retry; it doubles with each attempt (jittered).
    pub backoff_min: HumanDuration,
    /// The longest wait between two attempts of a chunk.
    pub backoff_max: HumanDuration,
    /// Deadline of one ledger call.
    pub call_timeout: HumanDuration,
    /// The longest wait between probes of a store that is down (staging, destination, the
    /// ledger). Probes start 1 s apart and double, with jitter, up to this: it bounds how long
    /// a stage idles after the store is back (a probe is one cheap call).
    pub outage_probe_max: HumanDuration,
    /// Apply pending ledger migrations when a stage starts. Default: yes for SQLite (one host),
    /// no for Postgres, where `ferry migrate` upgrades the shared ledger once, on purpose.
    pub auto_migrate: Option<bool>,
}

impl Default for LedgerSection {
    fn default() -> Self {
        LedgerSection {
            url: ferry_common::cli::DEFAULT_LEDGER.to_string(),
            url_file: None,
            // Long enough that a heartbeat (every third of it) survives a slow ledger call,
            // short enough that a crashed worker's chunk is picked up within a minute.
            lease: HumanDuration(Duration::from_secs(60)),
            max_attempts: 8,
            // 1 s doubling to 5 min: a few quick retries for a flapping link, then patience.
            backoff_min: HumanDuration(Duration::from_secs(1)),
            backoff_max: HumanDuration(Duration::from_secs(300)),
            call_timeout: HumanDuration(Duration::from_secs(30)),
            // An outage is noticed back within five minutes, and a store that is down for
            // hours sees a dozen probes an hour per worker.
            outage_probe_max: HumanDuration(Duration::from_secs(60)),
            auto_migrate: None,
        }
    }
}

/// Where the ledger lives, from `ledger.url`, `--ledger` or `FERRY_LEDGER`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerUrl {
    Sqlite(PathBuf),
    Postgres(String),
}

impl LedgerUrl {
    pub fn parse(url: &str) -> Result<LedgerUrl, ConfigError> {
        let bad = |reason: &str| ConfigError::new(format!("ledger URL {:?}", redact_url(url)), reason);
        if let Some(path) = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:")) {
            let path = path.split('?').next().unwrap_or("");
            if path.is_empty() {
                return Err(bad("no database file path after sqlite://"));
            }
            Ok(LedgerUrl::Sqlite(path.into()))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            url::Url::parse(url)
                .map_err(|e| bad(&format!("{e} (a password holding '/', '?', '#', '@' or ':' must be percent-encoded)")))?;
            Ok(LedgerUrl::Postgres(url.to_string()))
        } else {
            Err(bad("expected sqlite://PATH or postgres://USER@HOST/DB"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_url_is_named_without_its_password() {
        let e = LedgerUrl::parse("mysql://root:hunter2@db/x").unwrap_err().to_string();
        assert!(!e.contains("hunter2") && e.contains("mysql://root:***@db/x"), "{e}");
        let e = LedgerUrl::parse("postgres://u:p?ss#w/rd@host:1/x").map(|_| ()).unwrap_err().to_string();
        assert!(!e.contains("ss#w") && !e.contains("w/rd"), "{e}");
        assert_eq!(LedgerUrl::parse("sqlite:///var/lib/ferry/ledger.db").unwrap(), LedgerUrl::Sqlite("/var/lib/ferry/ledger.db".into()));
    }
}
