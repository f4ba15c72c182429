//! How Ferry talks to a store: the `[source]`, `[staging]` and `[destination]` sections' `url`
//! and `store` keys. They live with the backends that read them, so a new backend adds its
//! settings here, beside its code; the configuration file assembles this section three times.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use ferry_common::config::{ByteSize, HumanDuration, REDACTED, secret_from_file};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StoreSection {
    /// `file:///dir`, `/dir`, `hdfs://nameservice/dir`, `viewfs://cluster/dir`, `s3://bucket/prefix`,
    /// `gs://bucket/prefix`, `az://container/prefix`.
    pub url: String,
    #[serde(default)]
    pub store: StoreOptions,
}

/// How Ferry talks to one store. Every call has a deadline; none can hang.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
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

#[derive(Debug, Clone, Deserialize, Serialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HdfsOptions {
    /// Directory with core-site.xml / hdfs-site.xml (HA nameservices, viewfs mounts).
    /// Default: `$HADOOP_CONF_DIR`, then `$HADOOP_HOME/etc/hadoop`.
    pub conf_dir: Option<String>,
    /// Effective user (default: `HADOOP_USER_NAME`, then the login user).
    pub user: Option<String>,
    /// Kerberos: the principal to log in as (`etl@EXAMPLE.COM`), passed to hdfs-native.
    pub kerberos_principal: Option<String>,
    /// Kerberos: the keytab holding `kerberos_principal`'s keys (readable by the user Ferry runs as).
    pub kerberos_keytab: Option<String>,
    /// Kerberos: instead of a keytab, a credential cache someone else fills and renews
    /// (`FILE:/var/lib/ferry/krb5cc_etl`); only read.
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
        #[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
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
            /// The time budget of those retries of one request.
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
        /// The secret key that goes with `access_key_id` (shown as `***` by `check-config`).
        secret_access_key: Option<String> = None,
        /// A session token, for temporary credentials (shown as `***`).
        session_token: Option<String> = None,
        /// `access_key_id` read from this file (a mounted Kubernetes Secret, a systemd
        /// credential), so secrets need not sit in the TOML. A key and its `_file` are not both set.
        access_key_id_file: Option<PathBuf> = None,
        /// `secret_access_key` read from this file.
        secret_access_key_file: Option<PathBuf> = None,
        /// `session_token` read from this file.
        session_token_file: Option<PathBuf> = None,
        /// The profile in ~/.aws/credentials when no key is given (default: `AWS_PROFILE`).
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
        /// `access_key` read from this file (a mounted Kubernetes Secret, a systemd credential).
        access_key_file: Option<PathBuf> = None,
        /// The account's blob endpoint with its path (`https://host:port/account` for Azurite or
        /// a private endpoint); default `https://<account>.blob.core.windows.net`.
        endpoint: Option<String> = None,
    }
}

impl StoreOptions {
    /// The subsections of `store`, which `FERRY_<SECTION>_STORE_<NAME>_<KEY>` environment
    /// overrides nest under (`FERRY_DESTINATION_STORE_S3_REGION` is `[destination.store.s3]
    /// region`).
    pub const SUBSECTIONS: &'static [&'static str] = &["s3", "gcs", "azure", "hdfs"];

    /// Fills the secrets given as `*_file` keys from their files; `section` names the keys in
    /// errors (`destination`).
    pub fn read_secret_files(&mut self, section: &str) -> Result<(), String> {
        let s3 = &mut self.s3;
        secret_from_file(&format!("{section}.store.s3.access_key_id"), &mut s3.access_key_id, &s3.access_key_id_file)?;
        secret_from_file(&format!("{section}.store.s3.secret_access_key"), &mut s3.secret_access_key, &s3.secret_access_key_file)?;
        secret_from_file(&format!("{section}.store.s3.session_token"), &mut s3.session_token, &s3.session_token_file)?;
        let azure = &mut self.azure;
        secret_from_file(&format!("{section}.store.azure.access_key"), &mut azure.access_key, &azure.access_key_file)
    }

    /// The secrets replaced by `***`, for `ferry check-config`.
    pub fn redact(&mut self) {
        for secret in [&mut self.s3.secret_access_key, &mut self.s3.session_token, &mut self.azure.access_key] {
            if secret.is_some() {
                *secret = Some(REDACTED.into());
            }
        }
    }
}
