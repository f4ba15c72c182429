//! The one TOML file all stages share (`--config`, `FERRY_CONFIG`), with `FERRY_<SECTION>_<KEY>`
//! environment overrides and, for the ledger, the `--ledger` flag.
//!
//! Each section lives with the crate that reads it, and this module assembles them: a store's
//! settings are `ferry-storage`'s (`options.rs`), the ledger's `ferry-ledger`'s, a source
//! format's `ferry-formats`'. What stays here is what several crates read: the pipeline's
//! source, spool and table, and the stage sections (gc reads `copy.deadline` and
//! `transform.keep_staged`; load's DDL and this validation read `transform.rename` and
//! `derive`). The stages depend on this crate, so their sections cannot live in them.
//!
//! Unknown keys, bad values and missing sections are errors that name the key and the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ferry_common::config::{self, Layout};
use ferry_common::error::ConfigError;
use serde::{Deserialize, Serialize};

// Every section, so that a stage names its settings from one place.
pub use ferry_common::config::{
    AsciiChar, ByteSize, ColumnSpec, ColumnType, CsvOptions, EpochUnit, Format, HumanDuration, REDACTED, SourceFormat, host_name,
    redact_url,
};
pub use ferry_ledger::options::{LedgerSection, LedgerUrl};
pub use ferry_storage::options::{AzureOptions, GcsOptions, HdfsOptions, ObjectLimits, S3Options, StoreOptions, StoreSection};

type Result<T, E = ConfigError> = std::result::Result<T, E>;

/// The file's sections, for `FERRY_<SECTION>_<KEY>` overrides.
const LAYOUT: Layout = Layout {
    sections: &["ledger", "source", "staging", "spool", "destination", "table", "extract", "transform", "copy", "load"],
    store_sections: &["source", "staging", "destination"],
    store_subsections: StoreOptions::SUBSECTIONS,
};

/// The Parquet codec of transform's output (`transform.compression`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    Zstd,
    Snappy,
    Gzip,
    Lz4,
    None,
}

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
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
    pub destination: DestinationSection,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Disposition {
    #[default]
    Keep,
    Archive,
    Delete,
}

/// What a file with new bytes at a path that was ingested before means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Versions {
    /// A correction: the new version's rows replace the old version's in the table.
    #[default]
    Replace,
    /// Another file that happens to reuse the name (a rotated `events.jsonl`): both stay.
    Keep,
}

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
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

/// Where the table is published: a store, and the table's format there.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DestinationSection {
    /// The same URL forms as `staging.url`.
    pub url: String,
    #[serde(default)]
    pub store: StoreOptions,
    /// `hive` (Parquet in Hive partition directories, with `CREATE EXTERNAL TABLE` DDL beside
    /// it), `delta` (the same files, committed to a Delta Lake log: readers see whole
    /// commits, with statistics and time travel) or `iceberg` (the same files in an Apache
    /// Iceberg table, format version 2, whose catalog is `[destination.iceberg]`).
    #[serde(default)]
    pub table_format: TableFormat,
    /// The Iceberg table's catalog (`table_format = "iceberg"`).
    #[serde(default)]
    pub iceberg: IcebergSection,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TableFormat {
    #[default]
    Hive,
    Delta,
    Iceberg,
}

/// Where an Iceberg table's catalog is, and the table's name in it (`[table] name`).
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IcebergSection {
    /// `ledger`: Iceberg's JDBC catalog, in the ledger's own database (the tables
    /// `iceberg_tables` and `iceberg_namespace_properties`); a commit and the ledger's record of
    /// its chunks are one transaction. Spark's JdbcCatalog, Trino's jdbc catalog and PyIceberg's
    /// SqlCatalog read the table given the ledger's URL. `rest`: an Iceberg REST catalog at
    /// `uri` (Polaris, Lakekeeper, Unity, Glue, S3 Tables, Iceberg's own); each commit names the
    /// snapshot it builds on, and a commit whose reply is lost is settled by reading the table.
    #[serde(default)]
    pub catalog: IcebergCatalog,
    /// The JDBC catalog's `catalog_name`: the name readers give the catalog (`ledger` only).
    #[serde(default = "default_catalog_name")]
    pub catalog_name: String,
    /// The table's namespace in the catalog (levels joined with `.`).
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// `rest`: the catalog's base URL (`https://host:port/path`, without `/v1`).
    #[serde(default)]
    pub uri: Option<String>,
    /// `rest`: the warehouse to ask the catalog for (sent as `warehouse` to `/v1/config`).
    #[serde(default)]
    pub warehouse: Option<String>,
    /// `rest`: a bearer token sent with every request.
    #[serde(default)]
    pub token: Option<String>,
    /// `token` read from this file (a mounted Kubernetes Secret, a systemd credential).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// `rest`: OAuth2 client credentials, `client_id:client_secret`, exchanged for a token at
    /// `oauth2_server_uri` (not with `token`).
    #[serde(default)]
    pub credential: Option<String>,
    /// `credential` read from this file.
    #[serde(default)]
    pub credential_file: Option<PathBuf>,
    /// Where `credential` is exchanged; default `<uri>/v1/oauth/tokens`.
    #[serde(default)]
    pub oauth2_server_uri: Option<String>,
    /// The OAuth2 scope asked for with `credential`.
    #[serde(default = "default_scope")]
    pub scope: String,
    /// `rest`: PEM file of extra CA certificates to trust for the catalog.
    #[serde(default)]
    pub ca_bundle: Option<PathBuf>,
    /// `rest`: allow an `http://` catalog (tests, sidecars). Off: tokens never travel in clear.
    #[serde(default)]
    pub allow_http: bool,
    /// `rest`: TCP connect plus TLS handshake to the catalog.
    #[serde(default = "default_rest_connect")]
    pub connect_timeout: HumanDuration,
    /// `rest`: one request to the catalog, from start to end. A commit not answered within it
    /// is settled by reading the table.
    #[serde(default = "default_rest_request")]
    pub request_timeout: HumanDuration,
}

impl Default for IcebergSection {
    fn default() -> Self {
        IcebergSection {
            catalog: IcebergCatalog::default(),
            catalog_name: default_catalog_name(),
            namespace: default_namespace(),
            uri: None,
            warehouse: None,
            token: None,
            token_file: None,
            credential: None,
            credential_file: None,
            oauth2_server_uri: None,
            scope: default_scope(),
            ca_bundle: None,
            allow_http: false,
            connect_timeout: default_rest_connect(),
            request_timeout: default_rest_request(),
        }
    }
}

fn default_scope() -> String {
    "catalog".into()
}
fn default_rest_connect() -> HumanDuration {
    HumanDuration(Duration::from_secs(5))
}
fn default_rest_request() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}
fn default_catalog_name() -> String {
    "ferry".into()
}
fn default_namespace() -> String {
    "default".into()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum IcebergCatalog {
    #[default]
    Ledger,
    Rest,
}

impl TableFormat {
    /// The format as users know it.
    pub fn name(self) -> &'static str {
        match self {
            TableFormat::Hive => "Hive",
            TableFormat::Delta => "Delta",
            TableFormat::Iceberg => "Iceberg",
        }
    }

    /// Whether a column's type can widen (`int` to `bigint`, `float` to `double`) in a table of
    /// this format. A Delta table cannot without the `typeWidening` table feature, which Ferry
    /// does not write (and readers without it could no longer read the table): there a wider
    /// input is kept in the column's type where each value fits, and a value that does not is a
    /// rejected record.
    pub fn widens_columns(self) -> bool {
        self == TableFormat::Hive
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
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

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TableSection {
    /// The table's name: its directory under the destination, and its name in the DDL.
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

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
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

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
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
    /// The codec's level (zstd 1-22, gzip 0-9; ignored by the others).
    pub compression_level: i32,
    /// Rows per Parquet row group at most.
    pub row_group_size: usize,
    /// Rows decoded per Arrow batch.
    pub batch_size: usize,
    /// Chunks in flight. Default: one more than the cores, so that while one chunk's files are
    /// fsynced (no CPU) the cores stay busy; decoding and encoding take one core each at most.
    pub concurrency: usize,
    /// How far ahead of the decoder a staged chunk is fetched, per chunk in flight, where
    /// staging is on HDFS or an object store: a chunk starts fetching when it is claimed, so
    /// one waiting for a core has its first bytes by then, and the network's waits overlap
    /// decoding. Local staging reads through the page cache and ignores it.
    pub read_ahead: ByteSize,
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
            read_ahead: ByteSize(8 << 20),
            keep_staged: HumanDuration(Duration::from_secs(7 * 24 * 3600)),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CopySection {
    /// Deadline of one upload of one part (a try; a part is tried at most `retries` + 1
    /// times in an attempt, and a hedge runs under its own).
    pub deadline: HumanDuration,
    /// An attempt that moves no bytes for this long is abandoned (no-progress watchdog).
    pub stall_timeout: HumanDuration,
    /// Chunks copied at once. Default by destination: 64 for HDFS, where each file is one
    /// stream and every close waits for the DataNode's block report (hdfs-native sleeps
    /// 500 ms), so most chunks in flight are waiting and hold little data (an upload holds at
    /// most 4 MiB of its file at a time, and all of them together `bytes_in_flight`); 4
    /// elsewhere (S3 already sends `part_concurrency` parts of each file at once).
    pub concurrency: Option<usize>,
    /// Hedged copies: when a part's upload runs longer than `hedge_multiple` times the recent
    /// p95 for its size (and at least `hedge_min`), a second upload starts on new connections
    /// to its own temp name; the first to land wins, the other is cancelled and removed.
    /// 0 turns hedging off.
    pub hedge_multiple: f64,
    /// The shortest time a part's upload runs before a hedge may start. Default by destination:
    /// 4s for HDFS, past hdfs-native's waits for a file's close (it asks the NameNode again
    /// after 0.5, 1 and 2 s while the block report is due), which a second upload cannot
    /// shorten; 1s elsewhere.
    pub hedge_min: Option<HumanDuration>,
    /// A part whose upload fails on a transient error (a reset, a hung connection, a lost
    /// reply) is sent again this many times inside the attempt, on a new connection and to a
    /// new temp name, with capped, jittered backoff: a fault on one connection costs one
    /// retry of one part, not an attempt of the chunk.
    pub retries: u32,
    /// The most bytes of part files that this process's uploads hold at once, first tries,
    /// retries and hedges alike. It bounds copy's memory whatever `concurrency` says: an upload
    /// takes room for up to 8 MiB of its file (two 4 MiB pieces; its whole size when smaller)
    /// before it starts, and a part larger than the budget goes alone. To HDFS it gives the
    /// room back once the DataNodes have acknowledged its last piece, so a file whose close
    /// waits on the NameNode holds none; elsewhere at the upload's end.
    pub bytes_in_flight: ByteSize,
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
            hedge_min: None,
            retries: 3,
            bytes_in_flight: ByteSize(64 << 20),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, schemars::JsonSchema)]
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
        let mut cfg: Config = config::read(path, &LAYOUT, std::env::vars())?;
        let err = |message: String| ConfigError::new(path.display().to_string(), message);
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
            if let Some(why) = ferry_common::hive::unfit_name(name) {
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
        // At least one piece of the smallest upload (64 KiB); at most what a semaphore of KiB
        // counts.
        if !(64 << 10..=1 << 40).contains(&self.copy.bytes_in_flight.0) {
            return Err(format!("copy.bytes_in_flight: {} bytes; must be 64KiB to 1TiB", self.copy.bytes_in_flight.0));
        }
        if !(64 << 10..=1 << 40).contains(&self.transform.read_ahead.0) {
            return Err(format!("transform.read_ahead: {} bytes; must be 64KiB to 1TiB", self.transform.read_ahead.0));
        }
        if self.ledger.max_attempts < 1 {
            return Err("ledger.max_attempts: must be at least 1".into());
        }
        LedgerUrl::parse(&self.ledger.url).map_err(|e| format!("ledger.url: {}", e.message))?;
        if self.destination.table_format == TableFormat::Iceberg {
            let ice = &self.destination.iceberg;
            if ice.catalog == IcebergCatalog::Rest {
                let uri = ice.uri.as_deref().ok_or("destination.iceberg.uri: catalog \"rest\" needs the catalog's URL")?;
                match uri.split_once("://") {
                    Some(("https", rest)) if !rest.is_empty() => {}
                    Some(("http", rest)) if !rest.is_empty() && ice.allow_http => {}
                    Some(("http", _)) => {
                        return Err(format!(
                            "destination.iceberg.uri: {uri:?} is plain HTTP; set destination.iceberg.allow_http = true to allow it"
                        ));
                    }
                    _ => return Err(format!("destination.iceberg.uri: {uri:?} is not an https:// (or http://) URL")),
                }
                if ice.token.is_some() && ice.credential.is_some() {
                    return Err("destination.iceberg.credential: set either it or destination.iceberg.token, not both".into());
                }
                if let Some(o) = ice.oauth2_server_uri.as_deref()
                    && !(o.starts_with("https://") || (o.starts_with("http://") && ice.allow_http))
                {
                    return Err(format!(
                        "destination.iceberg.oauth2_server_uri: {o:?} is not an https:// URL (http:// only with allow_http)"
                    ));
                }
                if ice.credential.as_deref().is_some_and(|c| !c.contains(':')) {
                    return Err("destination.iceberg.credential: must be client_id:client_secret".into());
                }
                if ice.connect_timeout.0.is_zero() || ice.request_timeout.0.is_zero() {
                    return Err("destination.iceberg.request_timeout / connect_timeout: must be above zero".into());
                }
            }
            for (key, v) in [("destination.iceberg.catalog_name", &ice.catalog_name), ("destination.iceberg.namespace", &ice.namespace)] {
                if v.is_empty() || v.len() > 255 || v.chars().any(char::is_control) || v.split('.').any(str::is_empty) {
                    return Err(format!("{key}: {v:?} must be 1 to 255 characters, without control characters or empty levels"));
                }
            }
        }
        if self.destination.table_format != TableFormat::Hive {
            // Delta and Iceberg (v2) timestamps hold microseconds: a nanosecond column would
            // lose digits.
            let mut ns = self
                .table
                .columns
                .iter()
                .filter(|c| c.ty == ColumnType::TimestampNs)
                .map(|c| ("table.columns", &c.name))
                .chain(self.transform.cast.iter().filter(|(_, t)| **t == ColumnType::TimestampNs).map(|(n, _)| ("transform.cast", n)));
            if let Some((key, name)) = ns.next() {
                return Err(format!(
                    "{key}: column {name:?} is timestamp_ns, which a {} table cannot hold (its timestamps are microseconds); \
                     use timestamp_us, or destination.table_format = \"hive\"",
                    self.destination.table_format.name()
                ));
            }
        }
        Ok(())
    }

    /// `copy.concurrency`, or its default for the destination's kind.
    pub fn copy_concurrency(&self) -> usize {
        self.copy.concurrency.unwrap_or(if self.destination_is_hdfs() { 64 } else { 4 })
    }

    /// `copy.hedge_min`, or its default for the destination's kind.
    pub fn copy_hedge_min(&self) -> Duration {
        self.copy.hedge_min.map_or(Duration::from_secs(if self.destination_is_hdfs() { 4 } else { 1 }), |d| d.0)
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
            store.redact();
        }
        for secret in [&mut shown.destination.iceberg.token, &mut shown.destination.iceberg.credential] {
            if secret.is_some() {
                *secret = Some(REDACTED.into());
            }
        }
        toml::to_string_pretty(&shown).unwrap_or_else(|e| format!("# cannot render: {e}"))
    }

    /// Fills the secrets given as `*_file` keys from their files; a secret given both ways,
    /// or a file that cannot be read, is an error naming the key.
    fn read_secret_files(&mut self) -> std::result::Result<(), String> {
        if let Some(path) = &self.ledger.url_file {
            self.ledger.url = config::read_secret("ledger.url_file", path)?;
        }
        for (name, store) in
            [("source", &mut self.source.store), ("staging", &mut self.staging.store), ("destination", &mut self.destination.store)]
        {
            store.read_secret_files(name)?;
        }
        let ice = &mut self.destination.iceberg;
        config::secret_from_file("destination.iceberg.token", &mut ice.token, &ice.token_file)?;
        config::secret_from_file("destination.iceberg.credential", &mut ice.credential, &ice.credential_file)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The file `s` with these environment overrides (and not the test process's own).
    fn load_env(s: &str, vars: &[(&str, &str)]) -> Result<Config> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ferry.toml");
        std::fs::write(&p, s).unwrap();
        config::read(&p, &LAYOUT, vars.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn every_section_of_the_file_takes_environment_overrides() {
        // The layout names each section Config has: one missing would take its overrides as
        // unknown variables, silently.
        let shown: toml::Table = toml::from_str(&load_str(MIN).unwrap().to_toml()).unwrap();
        let sections: Vec<&str> = shown.iter().filter(|(_, v)| v.is_table()).map(|(k, _)| k.as_str()).collect();
        assert_eq!(sections.len(), LAYOUT.sections.len(), "{sections:?}");
        assert!(sections.iter().all(|s| LAYOUT.sections.contains(s)), "{sections:?}");
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
        let c = load_env(MIN, &[("FERRY_COPY_CONCURRENCY", "9"), ("FERRY_EXTRACT_CHUNK_SIZE", "1MiB")]).unwrap();
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
        let c = load_env(
            MIN,
            &[
                ("FERRY_DESTINATION_STORE_S3_SECRET_ACCESS_KEY", "123456"),
                ("FERRY_STAGING_STORE_CALL_TIMEOUT", "5s"),
                ("FERRY_SOURCE_STORE_HDFS_USER", "etl"),
            ],
        )
        .unwrap();
        assert_eq!(c.destination.store.s3.secret_access_key.as_deref(), Some("123456"));
        assert_eq!(c.staging.store.call_timeout, HumanDuration(Duration::from_secs(5)));
        assert_eq!(c.source.store.hdfs.user.as_deref(), Some("etl"));
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
    fn what_a_delta_table_cannot_hold_is_refused_with_its_key() {
        let delta = MIN.replace("url = \"/data/warehouse\"", "url = \"/data/warehouse\"\ntable_format = \"delta\"");
        assert_eq!(load_str(&delta).unwrap().destination.table_format, TableFormat::Delta);
        let ns = delta
            .replace("[table]\nname = \"events\"", "[table]\nname = \"events\"\ncolumns = [{ name = \"at\", type = \"timestamp_ns\" }]");
        let e = load_str(&ns).unwrap_err().to_string();
        assert!(e.contains("table.columns") && e.contains("\"at\"") && e.contains("microseconds"), "{e}");
        let e = load_str(&format!("{delta}\n[transform]\ncast = {{ at = \"timestamp_ns\" }}\n")).unwrap_err().to_string();
        assert!(e.contains("transform.cast"), "{e}");
        let e = load_str(&MIN.replace("url = \"/data/warehouse\"", "url = \"/data/warehouse\"\ntable_format = \"orc\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("orc") && e.contains("delta") && e.contains("iceberg"), "{e}");
        let iceberg = MIN.replace("url = \"/data/warehouse\"", "url = \"/data/warehouse\"\ntable_format = \"iceberg\"");
        let cfg = load_str(&iceberg).unwrap();
        assert_eq!((cfg.destination.iceberg.catalog_name.as_str(), cfg.destination.iceberg.namespace.as_str()), ("ferry", "default"));
        let e = load_str(&ns.replace("table_format = \"delta\"", "table_format = \"iceberg\"")).unwrap_err().to_string();
        assert!(e.contains("Iceberg table cannot hold"), "{e}");
        let e = load_str(&format!("{iceberg}\n[destination.iceberg]\ncatalog = \"rest\"\n")).unwrap_err().to_string();
        assert!(e.contains("destination.iceberg.uri"), "{e}");
        let rest = format!("{iceberg}\n[destination.iceberg]\ncatalog = \"rest\"\nuri = \"http://127.0.0.1:8181\"\n");
        let e = load_str(&rest).unwrap_err().to_string();
        assert!(e.contains("destination.iceberg.uri") && e.contains("allow_http"), "{e}");
        let cfg = load_str(&format!("{rest}allow_http = true\ntoken = \"t0k3n\"\n")).unwrap();
        assert_eq!(cfg.destination.iceberg.token.as_deref(), Some("t0k3n"));
        assert!(!cfg.to_toml().contains("t0k3n"), "check-config shows the catalog's token");
        let e = load_str(&format!("{rest}allow_http = true\ncredential = \"nocolon\"\n")).unwrap_err().to_string();
        assert!(e.contains("destination.iceberg.credential"), "{e}");
        let e = load_str(
            &rest
                .replace("http://127.0.0.1:8181", "https://c")
                .replace("\n[destination.iceberg]", "\n[destination.iceberg]\noauth2_server_uri = \"http://idp\""),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("destination.iceberg.oauth2_server_uri"), "{e}");
        let e = load_str(&format!("{iceberg}\n[destination.iceberg]\nnamespace = \"a..b\"\n")).unwrap_err().to_string();
        assert!(e.contains("destination.iceberg.namespace"), "{e}");
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
}
