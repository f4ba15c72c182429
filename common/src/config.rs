//! The one TOML file all stages share (`--config`, `FERRY_CONFIG`), with `FERRY_<SECTION>_<KEY>`
//! environment overrides and, for the ledger, the `--ledger` flag.
//!
//! Unknown keys, bad values and missing sections are errors that name the key and the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

// What a source format reads and the columns it decodes into are the formats' own.
pub use ferry_formats::spec::{AsciiChar, ColumnSpec, ColumnType, CsvOptions, EpochUnit, Format, SourceFormat};

type Result<T, E = ConfigError> = std::result::Result<T, E>;

/// A duration written for people: "30s", "5m", "1h 30m", "250ms".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s)
            .map(HumanDuration)
            .map_err(|e| serde::de::Error::custom(format!("invalid duration {s:?} ({e}); write e.g. \"30s\" or \"5m\"")))
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(self.0).to_string())
    }
}

/// A size written for people: "64MiB", "512KiB", "1GB", "1000".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn parse(s: &str) -> std::result::Result<ByteSize, String> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: f64 = num.parse().map_err(|_| format!("invalid size {s:?}; write e.g. \"64MiB\""))?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" => 1000,
            "kib" => 1 << 10,
            "m" | "mb" => 1_000_000,
            "mib" => 1 << 20,
            "g" | "gb" => 1_000_000_000,
            "gib" => 1 << 30,
            u => return Err(format!("invalid size unit {u:?} in {s:?}; use B, KiB, MiB, GiB, KB, MB or GB")),
        };
        if n <= 0.0 {
            return Err(format!("size {s:?} must be positive"));
        }
        Ok(ByteSize((n * mult as f64) as u64))
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => ByteSize::parse(&s).map_err(serde::de::Error::custom),
        }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

/// The Parquet codec of transform's output (`transform.compression`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    Zstd,
    Snappy,
    Gzip,
    Lz4,
    None,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The pipeline this config runs: every file, chunk and task it makes carries the name,
    /// and its stages claim only that pipeline's work, so several pipelines (each its own
    /// config) can share one ledger. A name feeds one table (the ledger refuses a config that
    /// names the pipeline with another table).
    #[serde(default = "default_pipeline")]
    pub pipeline: String,
    #[serde(default)]
    pub ledger: LedgerSection,
    pub source: SourceSection,
    pub staging: StoreSection,
    pub spool: SpoolSection,
    pub destination: StoreSection,
    pub table: TableSection,
    #[serde(default)]
    pub extract: ExtractSection,
    #[serde(default)]
    pub transform: TransformSection,
    #[serde(default)]
    pub copy: CopySection,
    #[serde(default)]
    pub load: LoadSection,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
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
    pub backoff_min: HumanDuration,
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
            url: crate::cli::DEFAULT_LEDGER.to_string(),
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
    pub fn parse(url: &str) -> Result<LedgerUrl> {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Disposition {
    #[default]
    Keep,
    Archive,
    Delete,
}

/// What a file with new bytes at a path that was ingested before means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Versions {
    /// A correction: the new version's rows replace the old version's in the table.
    #[default]
    Replace,
    /// Another file that happens to reuse the name (a rotated `events.jsonl`): both stay.
    Keep,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSection {
    /// A directory: file:///path, /path, or a relative path.
    pub url: String,
    /// Which files in it to take (glob over the path relative to `url`).
    #[serde(default = "default_glob")]
    pub glob: String,
    /// avro, jsonl, csv, or auto (by file extension).
    #[serde(default)]
    pub format: SourceFormat,
    /// A file is finished when its size and mtime have not changed for this long...
    #[serde(default = "default_settle")]
    pub settle: HumanDuration,
    /// ...or, if set, when a marker file `<name><marker>` exists (e.g. ".done").
    #[serde(default)]
    pub marker: Option<String>,
    /// What happens to a source file once its chunks are in the ledger.
    #[serde(default)]
    pub disposition: Disposition,
    /// Where `archive` moves files.
    #[serde(default)]
    pub archive_url: Option<String>,
    /// New bytes under a path that was ingested before: `replace` (a corrected file: its
    /// rows replace the earlier version's) or `keep` (a new file reusing the name).
    #[serde(default)]
    pub versions: Versions,
    /// The CSV dialect of CSV source files.
    #[serde(default)]
    pub csv: CsvOptions,
    /// Deadlines and backend settings for `url` (and `archive_url`).
    #[serde(default)]
    pub store: StoreOptions,
}

fn default_glob() -> String {
    "**/*".into()
}
fn default_settle() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSection {
    /// `file:///dir`, `/dir`, `hdfs://nameservice/dir`, `viewfs://cluster/dir`, `s3://bucket/prefix`,
    /// `gs://bucket/prefix`, `az://container/prefix`.
    pub url: String,
    #[serde(default)]
    pub store: StoreOptions,
}

/// How Ferry talks to one store. Every call has a deadline; none can hang.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreOptions {
    /// Deadline of one metadata call (list, stat, create, complete, rename, delete, HEAD).
    /// hdfs-native gives NameNode calls no timeout of their own.
    pub call_timeout: HumanDuration,
    /// A read that delivers no bytes for this long is abandoned (no-progress watchdog).
    pub read_stall: HumanDuration,
    pub hdfs: HdfsOptions,
    pub s3: S3Options,
    pub gcs: GcsOptions,
    pub azure: AzureOptions,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            call_timeout: HumanDuration(Duration::from_secs(30)),
            read_stall: HumanDuration(Duration::from_secs(60)),
            hdfs: HdfsOptions::default(),
            s3: S3Options::default(),
            gcs: GcsOptions::default(),
            azure: AzureOptions::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct HdfsOptions {
    /// Directory with core-site.xml / hdfs-site.xml (HA nameservices, viewfs mounts).
    /// Default: `$HADOOP_CONF_DIR`, then `$HADOOP_HOME/etc/hadoop`.
    pub conf_dir: Option<String>,
    /// Effective user (default: `HADOOP_USER_NAME`, then the login user).
    pub user: Option<String>,
    /// Kerberos: principal, keytab and credential cache, passed to hdfs-native.
    pub kerberos_principal: Option<String>,
    pub kerberos_keytab: Option<String>,
    pub kerberos_cache: Option<String>,
    /// Extra Hadoop settings (`"dfs.client.socket-timeout" = "30000"`), over the conf dir's.
    pub config: BTreeMap<String, String>,
    /// Replication of files Ferry writes (default: the cluster's).
    pub replication: Option<u32>,
}

/// The limits of every request to an object store: the same keys, with the same defaults,
/// under `store.s3`, `store.gcs` and `store.azure`.
#[derive(Debug, Clone)]
pub struct ObjectLimits {
    pub ca_bundle: Option<PathBuf>,
    pub allow_http: bool,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub read_timeout: Duration,
    pub max_retries: usize,
    pub retry_timeout: Duration,
    pub part_size: u64,
    pub part_concurrency: usize,
}

/// An object-store section: its own keys, then the keys of [`ObjectLimits`].
macro_rules! object_store_section {
    ($(#[$meta:meta])* $name:ident { $($(#[$fmeta:meta])* $field:ident: $ty:ty = $default:expr,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Deserialize, Serialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
            /// PEM file of extra CA certificates to trust (a private CA in front of the endpoint).
            pub ca_bundle: Option<PathBuf>,
            /// Allow `http://` endpoints (tests, sidecars). Off: credentials never travel in clear.
            pub allow_http: bool,
            /// TCP connect plus TLS handshake. Seed 000 hung forever in a handshake; this bounds it.
            pub connect_timeout: HumanDuration,
            /// One HTTP request from start to end. Uploads go in parts of `part_size`, so this is
            /// sized to a part, not to a whole chunk: 60 s at 8 MiB is a floor of ~140 KB/s.
            pub request_timeout: HumanDuration,
            /// No bytes read for this long ends the request (object_store's `read_timeout`).
            pub read_timeout: HumanDuration,
            /// object_store's own retries of retryable requests (5xx, 429, connect errors and
            /// timeouts of idempotent requests), and their time budget. Ferry resends, as many
            /// times, the requests object_store leaves alone although they are safe: one that never
            /// went out (its connect or handshake timed out), a delete, an abort.
            pub max_retries: usize,
            pub retry_timeout: HumanDuration,
            /// Files larger than this go multipart, in parts of `part_size`.
            pub part_size: ByteSize,
            /// Parts in flight per upload.
            pub part_concurrency: usize,
        }

        impl Default for $name {
            fn default() -> Self {
                $name {
                    $($field: $default,)*
                    ca_bundle: None,
                    allow_http: false,
                    // AWS's Java SDK v2 uses 2 s too: a working network finishes a handshake far
                    // sooner, and a connect error is retried by object_store on a new connection.
                    connect_timeout: HumanDuration(Duration::from_secs(2)),
                    request_timeout: HumanDuration(Duration::from_secs(60)),
                    read_timeout: HumanDuration(Duration::from_secs(20)),
                    max_retries: 3,
                    retry_timeout: HumanDuration(Duration::from_secs(60)),
                    part_size: ByteSize(8 << 20),
                    part_concurrency: 4,
                }
            }
        }

        impl $name {
            pub fn limits(&self) -> ObjectLimits {
                ObjectLimits {
                    ca_bundle: self.ca_bundle.clone(),
                    allow_http: self.allow_http,
                    connect_timeout: self.connect_timeout.0,
                    request_timeout: self.request_timeout.0,
                    read_timeout: self.read_timeout.0,
                    max_retries: self.max_retries,
                    retry_timeout: self.retry_timeout.0,
                    part_size: self.part_size.0,
                    part_concurrency: self.part_concurrency,
                }
            }
        }
    };
}

object_store_section! {
    /// Amazon S3 and S3-compatible servers (`s3://bucket/prefix`).
    S3Options {
        /// `https://host:port` of an S3-compatible server; default AWS for `region`.
        endpoint: Option<String> = None,
        /// Default: `AWS_REGION` / `AWS_DEFAULT_REGION`, then us-east-1.
        region: Option<String> = None,
        /// Credentials: these keys, else `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/
        /// `AWS_SESSION_TOKEN`, else `profile` in ~/.aws/credentials (`AWS_PROFILE`), else the
        /// instance metadata service.
        access_key_id: Option<String> = None,
        secret_access_key: Option<String> = None,
        session_token: Option<String> = None,
        /// The same three read from files (a mounted Kubernetes Secret, a systemd credential), so
        /// secrets need not sit in the TOML. A key and its `_file` are not both set.
        access_key_id_file: Option<PathBuf> = None,
        secret_access_key_file: Option<PathBuf> = None,
        session_token_file: Option<PathBuf> = None,
        profile: Option<String> = None,
        /// Path-style requests (`endpoint/bucket/key`), which most self-hosted servers need.
        path_style: bool = false,
        /// Sign requests without hashing their bodies (`UNSIGNED-PAYLOAD`). On by default over
        /// HTTPS: TLS already protects the bytes in flight and Ferry hashes every byte with blake3
        /// anyway, so SigV4's SHA-256 of each body would only burn a core. Off for `http://`.
        unsigned_payload: bool = true,
    }
}

object_store_section! {
    /// Google Cloud Storage (`gs://bucket/prefix`).
    GcsOptions {
        /// Base URL of the service (a private endpoint, an emulator); default Google's.
        endpoint: Option<String> = None,
        /// A service account's JSON key file. Default: `GOOGLE_SERVICE_ACCOUNT` /
        /// `GOOGLE_APPLICATION_CREDENTIALS`, then the instance's metadata server.
        service_account: Option<PathBuf> = None,
    }
}

object_store_section! {
    /// Azure Blob Storage (`az://container/prefix`).
    AzureOptions {
        /// The storage account. Default: `AZURE_STORAGE_ACCOUNT_NAME`.
        account: Option<String> = None,
        /// The account's shared key, or a file holding it (not both). Default:
        /// `AZURE_STORAGE_ACCOUNT_KEY`, then the environment's Azure credentials (workload or
        /// managed identity, the Azure CLI).
        access_key: Option<String> = None,
        access_key_file: Option<PathBuf> = None,
        /// The account's blob endpoint with its path (`https://host:port/account` for Azurite or
        /// a private endpoint); default `https://<account>.blob.core.windows.net`.
        endpoint: Option<String> = None,
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SpoolSection {
    /// Local disk where transform writes Parquet for copy to ship.
    pub dir: PathBuf,
    /// The name of this spool (by default the host's name). Only a copy on the same node as
    /// the transform that wrote a chunk claims that chunk: another host cannot read this disk.
    /// Give every host its own name; hosts that mount one shared spool (NFS, one Kubernetes
    /// volume for a pod whose name changes at each restart) share one fixed name.
    #[serde(default = "host_name")]
    pub node: String,
}

/// The machine's host name, the default spool node.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TableSection {
    pub name: String,
    /// Columns of the table (required for jsonl and csv; taken from the Avro schema if empty).
    #[serde(default)]
    pub columns: Vec<ColumnSpec>,
    /// Hive partition columns, in path order (each must be a column or a `derive`d one).
    #[serde(default)]
    pub partition_by: Vec<String>,
    /// Match input field names (JSON keys, CSV header names, Avro fields) to columns without
    /// regard to ASCII case (`userId` fills `userid`). Off: names must match exactly.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub case_insensitive: bool,
}

fn default_pipeline() -> String {
    "default".into()
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExtractSection {
    /// Upper bound of a chunk's size; chunks end at record boundaries.
    pub chunk_size: ByteSize,
    /// Source files read and split at once (each takes a core). Writes of chunks to a remote
    /// staging store go on in the background without counting here, up to 512 MiB at a time.
    pub concurrency: usize,
    /// The longest JSON line or CSV record taken, and the most bytes an Avro block may take,
    /// compressed or decompressed (extract and transform both check it): a longer one (an
    /// unclosed quote, a file that is not line-oriented, a compression bomb) makes its file
    /// or chunk corrupt input instead of a chunk, or an allocation, of any size.
    pub max_record_size: ByteSize,
}

impl Default for ExtractSection {
    fn default() -> Self {
        ExtractSection { chunk_size: ByteSize(64 << 20), concurrency: 2, max_record_size: ByteSize(64 << 20) }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TransformSection {
    /// Keep only these columns (after rename), in this order. Empty keeps all.
    pub select: Vec<String>,
    /// Old name -> new name.
    pub rename: BTreeMap<String, String>,
    /// Column -> type (see `table.columns`).
    pub cast: BTreeMap<String, ColumnType>,
    /// Row filters, all of which must hold: `col == value`, `col != value`, `col > 3`,
    /// `col is null`, `col is not null`.
    pub filter: Vec<String>,
    /// New column -> expression: `date(col)`, `hour(col)`, `col`.
    pub derive: BTreeMap<String, String>,
    /// Bad records per chunk that go to a rejects file; one more quarantines the chunk.
    pub max_bad_records: u64,
    /// Parquet codec: zstd, snappy, gzip, lz4, none.
    pub compression: Compression,
    pub compression_level: i32,
    pub row_group_size: usize,
    /// Rows decoded per Arrow batch.
    pub batch_size: usize,
    /// Chunks in flight. Default: one more than the cores, so that while one chunk's files are
    /// fsynced (no CPU) the cores stay busy; decoding and encoding take one core each at most.
    pub concurrency: usize,
    /// How long a staged chunk stays after transform committed it (`ferry gc` removes it
    /// then). Within it, `ferry rerun --from transform` needs no new extract.
    pub keep_staged: HumanDuration,
}

impl Default for TransformSection {
    fn default() -> Self {
        TransformSection {
            select: vec![],
            rename: BTreeMap::new(),
            cast: BTreeMap::new(),
            filter: vec![],
            derive: BTreeMap::new(),
            max_bad_records: 100,
            compression: Compression::Zstd,
            // zstd's own default, and Spark's and polars'. Measured on the 1.7M-event benchmark
            // (bench/pipeline.sh): on text-like payloads level 1 writes 20% more bytes (430 vs
            // 359 MB) in 70% of the time, level 2 0.9% more in 87%; on random letters all three
            // write the same bytes.
            compression_level: 3,
            row_group_size: 1 << 20,
            batch_size: 8192,
            concurrency: std::thread::available_parallelism().map_or(2, |n| n.get()) + 1,
            keep_staged: HumanDuration(Duration::from_secs(7 * 24 * 3600)),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CopySection {
    /// Deadline of one upload of one part (a try; a part is tried at most `retries` + 1
    /// times in an attempt, and a hedge runs under its own).
    pub deadline: HumanDuration,
    /// An attempt that moves no bytes for this long is abandoned (no-progress watchdog).
    pub stall_timeout: HumanDuration,
    /// Chunks copied at once. Default by destination: 64 for HDFS, where each file is one
    /// stream and every close waits for the DataNode's block report (hdfs-native sleeps
    /// 500 ms), so most chunks in flight are waiting and hold no data (an upload holds at most
    /// 4 MiB of its file at a time); 4 elsewhere (S3 already sends `part_concurrency` parts of
    /// each file at once).
    pub concurrency: Option<usize>,
    /// Hedged copies: when a part's upload runs longer than `hedge_multiple` times the recent
    /// p95 for its size (and at least `hedge_min`), a second upload starts on new connections
    /// to its own temp name; the first to land wins, the other is cancelled and removed.
    /// 0 turns hedging off.
    pub hedge_multiple: f64,
    pub hedge_min: HumanDuration,
    /// A part whose upload fails on a transient error (a reset, a hung connection, a lost
    /// reply) is sent again this many times inside the attempt, on a new connection and to a
    /// new temp name, with capped, jittered backoff: a fault on one connection costs one
    /// retry of one part, not an attempt of the chunk.
    pub retries: u32,
}

impl Default for CopySection {
    fn default() -> Self {
        CopySection {
            deadline: HumanDuration(Duration::from_secs(600)),
            stall_timeout: HumanDuration(Duration::from_secs(30)),
            concurrency: None,
            // On by default: a hedge starts only for the slowest few percent of parts, so it
            // costs little, and it turns "one connection hung until its deadline" into
            // "one connection's worth of delay". See the copy stage's design note.
            hedge_multiple: 3.0,
            hedge_min: HumanDuration(Duration::from_secs(1)),
            retries: 3,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoadSection {
    /// Chunks published at once. Default by destination: 64 for HDFS, where publishing a
    /// chunk is a few NameNode calls per part and one small file (the manifest) whose close
    /// waits ~0.5 s for the DataNode's block report: nearly all waiting, so the chunks wait
    /// side by side; 4 elsewhere. Each chunk at once has its own NameNode connection.
    pub concurrency: Option<usize>,
}

impl Config {
    /// Reads the file, applies `FERRY_<SECTION>_<KEY>` overrides from the environment, and
    /// validates. Every error names the file and the key.
    pub fn load(path: &Path) -> Result<Config> {
        let file = path.display().to_string();
        let err = |message: String| ConfigError::new(file.clone(), message);
        let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read it: {e}")))?;
        // Deserializing the text itself first gives errors with the line and the key in it.
        toml::from_str::<Config>(&text).map_err(|e| err(toml_error(&text, &e)))?;
        let mut doc: toml::Table = text.parse().map_err(|e: toml::de::Error| err(toml_error(&text, &e)))?;
        apply_env(&mut doc, std::env::vars()).map_err(err)?;
        let mut cfg: Config = toml::Value::Table(doc)
            .try_into()
            .map_err(|e: toml::de::Error| err(format!("after FERRY_* environment overrides: {}", e.message())))?;
        cfg.read_secret_files().map_err(err)?;
        cfg.validate().map_err(err)?;
        Ok(cfg)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        if self.pipeline.is_empty()
            || self.pipeline.len() > 64
            || !self.pipeline.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        {
            return Err(format!("pipeline: {:?} must be 1-64 letters, digits, '_', '-' or '.'", self.pipeline));
        }
        if self.spool.node.trim().is_empty() || self.spool.node.len() > 255 {
            return Err(format!("spool.node: {:?} must be 1-255 characters", self.spool.node));
        }
        if self.source.disposition == Disposition::Archive && self.source.archive_url.is_none() {
            return Err("source.archive_url: required when source.disposition = \"archive\"".into());
        }
        globset::Glob::new(&self.source.glob).map_err(|e| format!("source.glob: {e}"))?;
        if self.table.name.is_empty() || self.table.name.contains('/') {
            return Err(format!("table.name: {:?} must be a non-empty name without '/'", self.table.name));
        }
        // Names that go into the DDL: a name Hive cannot hold is refused here, with its key.
        let t = &self.transform;
        let names = std::iter::once(("table.name", &self.table.name))
            .chain(self.table.columns.iter().map(|c| ("table.columns", &c.name)))
            .chain(self.table.partition_by.iter().map(|n| ("table.partition_by", n)))
            .chain(t.rename.values().map(|n| ("transform.rename", n)))
            .chain(t.derive.keys().map(|n| ("transform.derive", n)));
        for (key, name) in names {
            if let Some(why) = crate::hive::unfit_name(name) {
                return Err(format!("{key}: {why}"));
            }
        }
        for (name, v) in [
            ("extract.concurrency", self.extract.concurrency),
            ("transform.concurrency", self.transform.concurrency),
            ("transform.batch_size", self.transform.batch_size),
            ("transform.row_group_size", self.transform.row_group_size),
            ("copy.concurrency", self.copy_concurrency()),
            ("load.concurrency", self.load_concurrency()),
        ] {
            if v == 0 {
                return Err(format!("{name}: must be at least 1"));
            }
        }
        // Also refuses NaN, which compares false with everything.
        if self.copy.hedge_multiple.is_nan() || self.copy.hedge_multiple < 0.0 {
            return Err("copy.hedge_multiple: must be 0 (off) or positive".into());
        }
        if self.ledger.max_attempts < 1 {
            return Err("ledger.max_attempts: must be at least 1".into());
        }
        LedgerUrl::parse(&self.ledger.url).map_err(|e| format!("ledger.url: {}", e.message))?;
        Ok(())
    }

    /// `copy.concurrency`, or its default for the destination's kind.
    pub fn copy_concurrency(&self) -> usize {
        self.copy.concurrency.unwrap_or(if self.destination_is_hdfs() { 64 } else { 4 })
    }

    /// `load.concurrency`, or its default for the destination's kind.
    pub fn load_concurrency(&self) -> usize {
        self.load.concurrency.unwrap_or(if self.destination_is_hdfs() { 64 } else { 4 })
    }

    fn destination_is_hdfs(&self) -> bool {
        let u = self.destination.url.as_str();
        u.starts_with("hdfs://") || u.starts_with("viewfs://")
    }

    /// Temp files and uploads older than this (ms since the epoch) are a crashed writer's: a
    /// live writer is at most a copy deadline into its file (its watchdog ends it; extract's
    /// and load's writes have shorter deadlines), and two leases of slack cover clock skew and
    /// a worker that has not noticed its lease is gone.
    pub fn temp_cutoff_ms(&self, now_ms: i64) -> i64 {
        now_ms - (self.copy.deadline.0 + self.ledger.lease.0 * 2).as_millis() as i64
    }

    /// The resolved configuration as TOML, secrets replaced by `***` (what `ferry
    /// check-config` prints).
    pub fn to_toml(&self) -> String {
        let mut shown = self.clone();
        shown.ledger.url = redact_url(&shown.ledger.url);
        for store in [&mut shown.source.store, &mut shown.staging.store, &mut shown.destination.store] {
            for secret in [&mut store.s3.secret_access_key, &mut store.s3.session_token, &mut store.azure.access_key] {
                if secret.is_some() {
                    *secret = Some(REDACTED.into());
                }
            }
        }
        toml::to_string_pretty(&shown).unwrap_or_else(|e| format!("# cannot render: {e}"))
    }

    /// Fills the secrets given as `*_file` keys from their files; a secret given both ways,
    /// or a file that cannot be read, is an error naming the key.
    fn read_secret_files(&mut self) -> std::result::Result<(), String> {
        fn read(key: &str, path: &Path) -> std::result::Result<String, String> {
            let text = std::fs::read_to_string(path).map_err(|e| format!("{key}: cannot read {}: {e}", path.display()))?;
            Ok(text.trim_end_matches(['\r', '\n']).to_string())
        }
        fn fill(key: &str, value: &mut Option<String>, file: &Option<PathBuf>) -> std::result::Result<(), String> {
            if let Some(path) = file {
                if value.is_some() {
                    return Err(format!("{key}: set either it or {key}_file, not both"));
                }
                *value = Some(read(&format!("{key}_file"), path)?);
            }
            Ok(())
        }
        if let Some(path) = &self.ledger.url_file {
            self.ledger.url = read("ledger.url_file", path)?;
        }
        for (name, store) in
            [("source", &mut self.source.store), ("staging", &mut self.staging.store), ("destination", &mut self.destination.store)]
        {
            let s3 = &mut store.s3;
            fill(&format!("{name}.store.s3.access_key_id"), &mut s3.access_key_id, &s3.access_key_id_file)?;
            fill(&format!("{name}.store.s3.secret_access_key"), &mut s3.secret_access_key, &s3.secret_access_key_file)?;
            fill(&format!("{name}.store.s3.session_token"), &mut s3.session_token, &s3.session_token_file)?;
            let azure = &mut store.azure;
            fill(&format!("{name}.store.azure.access_key"), &mut azure.access_key, &azure.access_key_file)?;
        }
        Ok(())
    }
}

/// What a secret is shown as.
pub const REDACTED: &str = "***";

/// Keys whose values are secrets: their lines are never quoted in an error.
fn is_secret_key(key: &str) -> bool {
    let key = key.trim().trim_matches(['"', '\'']).to_ascii_lowercase();
    ["secret", "token", "password", "passwd"].iter().any(|w| key.contains(w))
        || key == "url"
        || key == "access_key_id"
        || key == "access_key"
}

/// A TOML error as "line L, column C: what", quoting the offending line as the parser does,
/// unless that line sets a secret (`secret_access_key = abc` without quotes would print the
/// secret) or the ledger URL (which may hold a password): then only the key is named.
fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let Some(span) = e.span() else { return e.message().to_string() };
    let start = span.start.min(text.len());
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let line_no = text[..start].matches('\n').count() + 1;
    let column = text[line_start..start].chars().count() + 1;
    let line = text[line_start..line_end].trim_end_matches('\r');
    let key = line.split('=').next().unwrap_or_default().trim();
    if line.contains('=') && is_secret_key(key) {
        return format!(
            "line {line_no}, column {column}: the value of `{key}` is not valid TOML (not shown: it is a secret; quote it as \"...\")"
        );
    }
    format!("line {line_no}, column {column}: {}\n  {line_no} | {line}", e.message().trim_end())
}

/// A URL with its password replaced by `***` (`postgres://ferry:***@db/ferry`), for logs,
/// errors and `ferry status`. A URL without a password is returned as it is.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let mut end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    // A password holding `/`, `?` or `#` without percent-encoding ends the authority early
    // for a parser; for the redaction, a `user:` before such a character and an `@` after
    // it mean the `@` ends the userinfo (hiding too much is the safe side).
    let after_colon = rest[..end].split_once(':').map(|(_, p)| p);
    if !rest[..end].contains('@')
        && after_colon.is_some_and(|p| !p.bytes().all(|b| b.is_ascii_digit()))
        && let Some(at) = rest.rfind('@')
    {
        end = at + rest[at..].find(['/', '?', '#']).unwrap_or(rest.len() - at);
    }
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:{REDACTED}@{host}"),
            None => authority.to_string(),
        },
        None => authority.to_string(),
    };
    // libpq-style parameters can carry one too: ?password=...
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") || k.eq_ignore_ascii_case("sslpassword") => {
                        format!("{k}={REDACTED}")
                    }
                    _ => p.to_string(),
                })
                .collect();
            format!("{path}?{}", params.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// `FERRY_COPY_CONCURRENCY=8` sets `copy.concurrency`. Section and key are matched against the
/// known sections; values are parsed as TOML when they can be (numbers, booleans), else strings.
fn apply_env(doc: &mut toml::Table, vars: impl Iterator<Item = (String, String)>) -> std::result::Result<(), String> {
    const SECTIONS: &[&str] = &["ledger", "source", "staging", "spool", "destination", "table", "extract", "transform", "copy", "load"];
    // Variables that are flags of the binaries, not config keys.
    const NOT_KEYS: &[&str] = &["FERRY_CONFIG", "FERRY_LEDGER", "FERRY_LOG_FORMAT"];
    for (k, v) in vars {
        let Some(rest) = k.strip_prefix("FERRY_") else { continue };
        if NOT_KEYS.contains(&k.as_str()) || k.starts_with("FERRY_TEST_") {
            continue;
        }
        let lower = rest.to_ascii_lowercase();
        // The one top-level key: the pipeline (also `ferry --pipeline`'s variable).
        if lower == "pipeline" {
            doc.insert("pipeline".into(), toml::Value::String(v.clone()));
            continue;
        }
        let Some((section, key)) =
            SECTIONS.iter().find_map(|s| lower.strip_prefix(s).and_then(|r| r.strip_prefix('_')).map(|key| (*s, key.to_string())))
        else {
            // Other FERRY_* variables belong to scripts and tools around Ferry; one whose first
            // word is a section name misspelt would be a setting silently lost.
            let word = lower.split('_').next().unwrap_or_default();
            if let Some(s) = SECTIONS.iter().find(|s| word != "log" && edit_distance(word, s) <= 2 && word.len() + 1 >= s.len()) {
                return Err(format!("{k}: there is no section `{word}` (did you mean FERRY_{}_...?)", s.to_ascii_uppercase()));
            }
            continue;
        };
        let value =
            format!("v = {v}").parse::<toml::Table>().ok().and_then(|mut t| t.remove("v")).unwrap_or(toml::Value::String(v.clone()));
        // Store settings nest: FERRY_DESTINATION_STORE_S3_SECRET_ACCESS_KEY is
        // [destination.store.s3] secret_access_key.
        let mut path = vec![section.to_string()];
        let mut key = key;
        if ["source", "staging", "destination"].contains(&section) {
            for nest in ["store_s3_", "store_gcs_", "store_azure_", "store_hdfs_", "store_"] {
                if let Some(inner) = key.strip_prefix(nest) {
                    path.extend(nest.trim_end_matches('_').split('_').map(str::to_string));
                    key = inner.to_string();
                    break;
                }
            }
        }
        // Secrets, URLs and paths are text even when they look like a number or a boolean.
        let value = if ["_key", "_key_id", "_token", "url", "_file", "account", "endpoint"].iter().any(|end| key.ends_with(end)) {
            toml::Value::String(v.clone())
        } else {
            value
        };
        let mut table = &mut *doc;
        for name in &path {
            table = table
                .entry(name.as_str())
                .or_insert_with(|| toml::Value::Table(Default::default()))
                .as_table_mut()
                .ok_or_else(|| format!("{}: expected a section (from env {k})", path.join(".")))?;
        }
        table.insert(key, value);
    }
    Ok(())
}

/// Levenshtein distance, for telling a misspelt section from an unrelated variable.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for j in 0..b.len() {
            let cur = row[j + 1];
            row[j + 1] = if ca == b[j] { prev } else { 1 + prev.min(row[j]).min(row[j + 1]) };
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_section_in_an_environment_override_is_an_error_naming_it() {
        let mut doc: toml::Table = MIN.parse().unwrap();
        for typo in ["FERRY_DESTINATON_URL", "FERRY_COPPY_CONCURRENCY", "FERRY_LEGDER_URL", "FERRY_TRANSFORMS_MAX_BAD_RECORDS"] {
            let e = apply_env(&mut doc, std::iter::once((typo.to_string(), "1".to_string()))).unwrap_err();
            assert!(e.starts_with(typo) && e.contains("did you mean"), "{e}");
        }
        // Variables of the scripts and tools around Ferry are not config keys, and not typos.
        for other in ["FERRY_CACHE", "FERRY_MINIDFS_HOME", "FERRY_PG_PORT", "FERRY_S3_DIR", "FERRY_SEED", "FERRY_METRICS_ADDR", "FERRY_LOG"]
        {
            apply_env(&mut doc, std::iter::once((other.to_string(), "1".to_string()))).unwrap();
        }
    }

    const MIN: &str = r#"
[source]
url = "/data/in"
[staging]
url = "/data/staging"
[spool]
dir = "/data/spool"
[destination]
url = "/data/warehouse"
[table]
name = "events"
"#;

    fn load_str(s: &str) -> Result<Config> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ferry.toml");
        std::fs::write(&p, s).unwrap();
        Config::load(&p)
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = load_str(MIN).unwrap();
        assert_eq!(c.extract.chunk_size, ByteSize(64 << 20));
        assert_eq!(c.copy.stall_timeout, HumanDuration(Duration::from_secs(30)));
        assert_eq!(c.source.format, SourceFormat::Auto);
    }

    #[test]
    fn unknown_key_is_named() {
        let e = load_str(&format!("{MIN}\n[copy]\nconcurency = 3\n")).unwrap_err().to_string();
        assert!(e.contains("concurency") && e.contains("ferry.toml"), "{e}");
    }

    #[test]
    fn bad_duration_and_missing_section_are_named() {
        let e = load_str(&format!("{MIN}\n[copy]\ndeadline = \"ten minutes\"\n")).unwrap_err().to_string();
        assert!(e.contains("deadline") || e.contains("invalid duration"), "{e}");
        let e = load_str(&MIN.replace("[spool]\ndir = \"/data/spool\"", "")).unwrap_err().to_string();
        assert!(e.contains("spool"), "{e}");
    }

    #[test]
    fn env_overrides() {
        let mut doc: toml::Table = MIN.parse().unwrap();
        apply_env(
            &mut doc,
            vec![("FERRY_COPY_CONCURRENCY".to_string(), "9".to_string()), ("FERRY_EXTRACT_CHUNK_SIZE".into(), "1MiB".into())].into_iter(),
        )
        .unwrap();
        let c: Config = toml::Value::Table(doc).try_into().unwrap();
        assert_eq!(c.copy_concurrency(), 9);
        assert_eq!(c.extract.chunk_size, ByteSize(1 << 20));
    }

    #[test]
    fn concurrency_defaults_follow_the_destination() {
        let local: Config = load_str(MIN).unwrap();
        assert_eq!((local.copy_concurrency(), local.load_concurrency()), (4, 4));
        let hdfs = MIN.replace("[destination]\nurl = \"", "[destination]\nurl = \"hdfs://nn:8020");
        assert_ne!(hdfs, MIN, "the test config has a [destination] url line");
        let hdfs: Config = load_str(&hdfs).unwrap();
        assert_eq!((hdfs.copy_concurrency(), hdfs.load_concurrency()), (64, 64));
        let set: Config = load_str(&format!("{MIN}\n[load]\nconcurrency = 7\n")).unwrap();
        assert_eq!(set.load_concurrency(), 7);
    }

    #[test]
    fn formats_types_and_codecs_are_parsed_once_and_named_when_wrong() {
        let c = load_str(&format!("{MIN}\n[transform]\ncompression = \"snappy\"\ncast = {{ n = \"long\" }}\n")).unwrap();
        assert_eq!(c.transform.compression, Compression::Snappy);
        assert_eq!(c.transform.cast["n"], ColumnType::Long);
        for (extra, key) in [
            ("[transform]\ncompression = \"lzma\"", "compression"),
            ("[transform]\ncast = { n = \"decimal\" }", "decimal"),
            ("[[table.columns]]\nname = \"a\"\ntype = \"varchar\"", "varchar"),
        ] {
            let text = if extra.starts_with("[[table") {
                MIN.replace("[table]\nname = \"events\"", &format!("[table]\nname = \"events\"\n{extra}"))
            } else {
                format!("{MIN}\n{extra}\n")
            };
            let e = load_str(&text).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("ferry.toml"), "{e}");
        }
        let e = load_str(&MIN.replace("url = \"/data/in\"", "url = \"/data/in\"\nformat = \"xml\"")).unwrap_err().to_string();
        assert!(e.contains("xml") && e.contains("auto"), "{e}");
        assert_eq!(SourceFormat::Fixed(Format::Csv).of("x.avro"), Some(Format::Csv));
        assert_eq!(SourceFormat::Auto.of("x.ndjson"), Some(Format::Jsonl));
    }

    #[test]
    fn secrets_come_from_files_or_nested_env_and_are_never_printed() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "s3cr3t-from-file\n").unwrap();
        let url = dir.path().join("url");
        std::fs::write(&url, "postgres://ferry:pa55word@db.example.com/ferry?application_name=x\n").unwrap();
        let text = format!("{MIN}\n[destination.store.s3]\naccess_key_id = \"AKIA\"\nsecret_access_key_file = \"{}\"\n", secret.display())
            .replace("[source]", &format!("[ledger]\nurl_file = \"{}\"\n[source]", url.display()));
        let c = load_str(&text).unwrap();
        assert_eq!(c.destination.store.s3.secret_access_key.as_deref(), Some("s3cr3t-from-file"));
        assert_eq!(c.ledger.url, "postgres://ferry:pa55word@db.example.com/ferry?application_name=x");
        let shown = c.to_toml();
        assert!(!shown.contains("s3cr3t") && !shown.contains("pa55word"), "{shown}");
        assert!(shown.contains("postgres://ferry:***@db.example.com/ferry?application_name=x"), "{shown}");

        // Both ways at once, or a file that is not there: named.
        let both = text.replace("access_key_id = \"AKIA\"", "access_key_id = \"AKIA\"\nsecret_access_key = \"x\"");
        let e = load_str(&both).unwrap_err().to_string();
        assert!(e.contains("destination.store.s3.secret_access_key") && e.contains("not both"), "{e}");
        let missing = text.replace(&secret.display().to_string(), "/nonexistent/secret");
        let e = load_str(&missing).unwrap_err().to_string();
        assert!(e.contains("secret_access_key_file") && e.contains("/nonexistent/secret"), "{e}");

        // Nested store keys from the environment; a secret that looks like a number stays text.
        let mut doc: toml::Table = MIN.parse().unwrap();
        apply_env(
            &mut doc,
            vec![
                ("FERRY_DESTINATION_STORE_S3_SECRET_ACCESS_KEY".to_string(), "123456".to_string()),
                ("FERRY_STAGING_STORE_CALL_TIMEOUT".into(), "5s".into()),
                ("FERRY_SOURCE_STORE_HDFS_USER".into(), "etl".into()),
            ]
            .into_iter(),
        )
        .unwrap();
        let c: Config = toml::Value::Table(doc).try_into().unwrap();
        assert_eq!(c.destination.store.s3.secret_access_key.as_deref(), Some("123456"));
        assert_eq!(c.staging.store.call_timeout, HumanDuration(Duration::from_secs(5)));
        assert_eq!(c.source.store.hdfs.user.as_deref(), Some("etl"));
    }

    #[test]
    fn urls_lose_their_password_only() {
        assert_eq!(redact_url("postgres://u:p@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("postgres://u@h/db?sslmode=verify-full&password=x"), "postgres://u@h/db?sslmode=verify-full&password=***");
        assert_eq!(redact_url("sqlite:///var/lib/ferry/ledger.db"), "sqlite:///var/lib/ferry/ledger.db");
        let e = LedgerUrl::parse("mysql://root:hunter2@db/x").unwrap_err().to_string();
        assert!(!e.contains("hunter2") && e.contains("mysql://root:***@db/x"), "{e}");
    }

    #[test]
    fn passwords_with_delimiters_are_hidden_too() {
        let url = "postgres://u:p?ss#w/rd@host:1/x";
        let shown = redact_url(url);
        assert!(!shown.contains("p?ss") && !shown.contains("w/rd"), "{shown}");
        assert_eq!(shown, "postgres://u:***@host:1/x");
        let e = LedgerUrl::parse(url).map(|_| ()).unwrap_err().to_string();
        assert!(!e.contains("ss#w") && !e.contains("w/rd"), "{e}");
        assert_eq!(redact_url("postgres://u:pw@h/db?options=a@b"), "postgres://u:***@h/db?options=a@b");
    }

    #[test]
    fn a_syntax_error_on_a_secret_line_does_not_echo_it() {
        let text = format!("{MIN}\n[destination.store.s3]\nsecret_access_key = abcSECRETdef\n");
        let e = load_str(&text).unwrap_err().to_string();
        assert!(!e.contains("abcSECRETdef"), "{e}");
        assert!(e.contains("secret_access_key") && e.contains("ferry.toml") && e.contains("line"), "{e}");
        let text = MIN.replace("[source]", "[ledger]\nurl = postgres://u:hunter2@db/x\n[source]");
        let e = load_str(&text).unwrap_err().to_string();
        assert!(!e.contains("hunter2") && e.contains("url"), "{e}");
        // Other lines are still quoted, which is what helps.
        let e = load_str(&format!("{MIN}\n[copy]\nconcurrency = = 3\n")).unwrap_err().to_string();
        assert!(e.contains("concurrency = = 3"), "{e}");
    }

    #[test]
    fn a_name_hive_cannot_hold_is_refused_with_its_key() {
        let text =
            MIN.replace("[table]\nname = \"events\"", "[table]\nname = \"events\"\ncolumns = [{ name = \"a\\nb\", type = \"long\" }]");
        let e = load_str(&text).unwrap_err().to_string();
        assert!(e.contains("table.columns") && e.contains("control character"), "{e}");
        let text = format!("{MIN}\n[transform]\nrename = {{ a = \"\" }}\n");
        let e = load_str(&text).unwrap_err().to_string();
        assert!(e.contains("transform.rename") && e.contains("empty"), "{e}");
    }

    #[test]
    fn sizes() {
        assert_eq!(ByteSize::parse("64MiB").unwrap(), ByteSize(64 << 20));
        assert_eq!(ByteSize::parse("1.5KB").unwrap(), ByteSize(1500));
        assert!(ByteSize::parse("12 parsecs").is_err());
    }
}
