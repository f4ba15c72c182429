//! Real servers for the integration tests.
//!
//! - [`MiniDfs`]: a real HDFS (NameNode + DataNode) from `org.apache.hadoop:hadoop-minicluster`,
//!   run by our small Java program in `tests/minidfs` (built by `scripts/minidfs.sh`, which the
//!   test command calls). Started per test, stopped on drop.
//! - [`S3Server`]: the S3-compatible server the test command starts behind TLS with a CA it
//!   generates (`scripts/s3.sh`); tests read its address from `FERRY_TEST_S3_*`.
//!
//! - [`IcebergRest`]: Iceberg's own REST catalog test server (`RESTCatalogServer` from
//!   `org.apache.iceberg:iceberg-open-api`'s test fixtures, over a JDBC catalog in SQLite), run by
//!   `tests/iceberg-rest` (built by `scripts/minidfs.sh`'s `ferry_build_iceberg_rest`, which the
//!   test command calls). Started per test, stopped on drop.
//! - [`GcsServer`] and [`AzureServer`]: the Google Cloud Storage and Azure Blob Storage
//!   emulators the test command starts behind TLS (`scripts/emulators/gcs.sh`, ferry-gcs;
//!   `scripts/emulators/azurite.sh`, Azurite); tests read them from `FERRY_TEST_GCS_*` and
//!   `FERRY_TEST_AZURE_*`.
//!
//! None is optional: a missing server is a failed test, never a skipped one.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The Java classpath of the MiniDFS program (plus Hadoop's FsShell, for independent reads): the
/// file `ferry_build_minidfs` (scripts/minidfs.sh) writes into the cache and exports as
/// FERRY_MINIDFS_CLASSPATH_FILE.
pub fn hadoop_classpath() -> String {
    let f = std::env::var_os("FERRY_MINIDFS_CLASSPATH_FILE").unwrap_or_else(|| {
        panic!("FERRY_MINIDFS_CLASSPATH_FILE is not set: build the MiniDFS program first: `. scripts/services.sh && . scripts/minidfs.sh && ferry_build_minidfs` (scripts/test.sh does)")
    });
    let cp = std::fs::read_to_string(&f).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build the MiniDFS program first: `. scripts/services.sh && . scripts/minidfs.sh && ferry_build_minidfs` (scripts/test.sh does)",
            Path::new(&f).display()
        )
    });
    cp.trim().to_string()
}

pub struct MiniDfs {
    pub name: String,
    /// `hdfs://127.0.0.1:<port>`
    pub url: String,
    pub addr: SocketAddr,
    pub conf_dir: PathBuf,
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    _dir: tempfile::TempDir,
}

impl MiniDfs {
    /// Starts cluster `name` and waits (up to 3 minutes) for its ready line.
    pub fn start(name: &str) -> MiniDfs {
        MiniDfs::start_with(name, &[])
    }

    /// An HA pair of NameNodes behind nameservice `ns` (`hdfs://<ns>`), 1 DataNode. Clients
    /// need [`MiniDfs::conf_dir`] (it names both NameNodes).
    pub fn start_ha(name: &str, ns: &str) -> MiniDfs {
        MiniDfs::start_with(name, &["--ha", "--nameservice", ns])
    }

    /// Makes the standby NameNode active (and the active one standby); returns the new active.
    pub fn failover(&mut self) -> String {
        self.ask("FAILOVER", "FAILED_OVER", "FAILOVER_FAILED")
    }

    /// Stops the NameNode process (its port then refuses connections; the DataNodes keep
    /// running).
    pub fn stop_namenode(&mut self) {
        self.ask("STOP_NAMENODE", "NAMENODE_STOPPED", "OUTAGE_FAILED");
    }

    /// Starts the stopped NameNode again on the same port, with the same namespace; returns
    /// once it is out of safe mode.
    pub fn start_namenode(&mut self) {
        let at = self.ask("START_NAMENODE", "NAMENODE_STARTED", "OUTAGE_FAILED");
        assert!(self.url.starts_with("hdfs://127.") && self.url.ends_with(&at), "the NameNode came back at {at}, not at {}", self.url);
    }

    /// Stops DataNode `i` (from 0) for good, as a lost machine.
    pub fn stop_datanode(&mut self, i: usize) {
        self.ask(&format!("STOP_DATANODE {i}"), "DATANODE_STOPPED", "OUTAGE_FAILED");
    }

    /// Writes `command` to the program's stdin and waits (up to 3 minutes) for its answer.
    fn ask(&mut self, command: &str, done: &str, failed: &str) -> String {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin.write_all(format!("{command}\n").as_bytes()).and_then(|_| stdin.flush()).expect("write to MiniDFS");
        loop {
            let line = self.lines.recv_timeout(Duration::from_secs(180)).unwrap_or_else(|_| panic!("an answer to {command}"));
            if let Some(rest) = line.strip_prefix(done) {
                return rest.trim().to_string();
            }
            assert!(!line.starts_with(failed), "{command}: {line}");
        }
    }

    /// [`MiniDfs::start`] with more arguments of the MiniDFS program (e.g. `--conf k=v`).
    pub fn start_with(name: &str, extra: &[&str]) -> MiniDfs {
        let dir = tempfile::tempdir().unwrap();
        let conf_dir = dir.path().join("conf");
        std::fs::create_dir_all(&conf_dir).unwrap();
        let log = std::fs::File::create(dir.path().join("minidfs.log")).unwrap();
        let mut child = Command::new("java")
            .args(["-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.net.preferIPv4Stack=true"])
            .args(["-cp", &hadoop_classpath(), "ferry.MiniDfs", "--name", name])
            .arg("--base-dir")
            .arg(dir.path().join("data"))
            .arg("--conf-dir")
            .arg(&conf_dir)
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("java");
        let (url, rx) = await_ready(&mut child, &dir.path().join("minidfs.log"), &format!("MiniDFS {name}"));
        // An HA cluster's URL names its nameservice, not an address.
        let addr: SocketAddr = url.trim_start_matches("hdfs://").parse().unwrap_or_else(|_| "127.0.0.1:0".parse().unwrap());
        MiniDfs { name: name.to_string(), url, addr, conf_dir, child, lines: rx, _dir: dir }
    }

    /// A kerberized cluster's (`--kerberos`) client principal, keytab and krb5.conf.
    pub const KERBEROS_PRINCIPAL: &str = "ferry@EXAMPLE.COM";

    pub fn keytab(&self) -> PathBuf {
        self.conf_dir.join("ferry.keytab")
    }

    pub fn krb5_conf(&self) -> PathBuf {
        self.conf_dir.join("krb5.conf")
    }

    /// A `[<section>]` whose store is this kerberized cluster at `path`, as Ferry's client
    /// principal (the keytab path and the conf dir with the client's security settings).
    pub fn kerberized_section(&self, section: &str, path: &str) -> String {
        format!(
            "[{section}]\nurl = \"{}{path}\"\n[{section}.store.hdfs]\nconf_dir = \"{}\"\nkerberos_principal = \"{}\"\nkerberos_keytab = \"{}\"\n",
            self.url,
            self.conf_dir.display(),
            Self::KERBEROS_PRINCIPAL,
            self.keytab().display()
        )
    }

    /// Hadoop's own client (FsShell) on a kerberized cluster, logged in from Ferry's keytab.
    pub fn kerberized_fs(&self, args: &[&str]) -> std::process::Output {
        let cp = format!("{}:{}", self.conf_dir.display(), hadoop_classpath());
        let mut cmd = Command::new("java");
        cmd.args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
            .arg(format!("-Djava.security.krb5.conf={}", self.krb5_conf().display()))
            .args(["-cp", &cp, "ferry.KeytabShell", Self::KERBEROS_PRINCIPAL])
            .arg(self.keytab())
            .args(["-fs", &self.url])
            .args(args);
        let out = crate::output_within(&mut cmd, std::time::Duration::from_secs(300));
        assert!(out.status.success(), "kerberized hdfs dfs {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        out
    }

    /// Hadoop's own client (FsShell) against this cluster: an independent reader and writer.
    pub fn fs(&self, args: &[&str]) -> std::process::Output {
        let out = self.try_fs(args);
        assert!(out.status.success(), "hdfs dfs {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        out
    }

    /// [`MiniDfs::fs`] that returns a failure (`-test`, a listing of a directory that may not
    /// exist) instead of asserting.
    pub fn try_fs(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = Command::new("java");
        cmd.args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", &hadoop_classpath()])
            .args(["org.apache.hadoop.fs.FsShell", "-fs", &self.url])
            .args(["-conf", &self.conf_dir.join("hdfs-site.xml").display().to_string()])
            .args(args)
            .env("HADOOP_CONF_DIR", &self.conf_dir);
        crate::output_within(&mut cmd, std::time::Duration::from_secs(300))
    }
}

impl MiniDfs {
    /// Hadoop's `hdfs dfsadmin` against this cluster (quotas, safe mode).
    pub fn admin(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = Command::new("java");
        cmd.args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", &hadoop_classpath()])
            .args(["org.apache.hadoop.hdfs.tools.DFSAdmin", "-fs", &self.url])
            .args(args)
            .env("HADOOP_CONF_DIR", &self.conf_dir);
        let out = crate::output_within(&mut cmd, std::time::Duration::from_secs(300));
        assert!(out.status.success(), "hdfs dfsadmin {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        out
    }
}

impl Drop for MiniDfs {
    fn drop(&mut self) {
        // Closing stdin asks it to stop; a kill makes sure.
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (up to 3 minutes) for the `READY <address>` line of a Java fixture `child` (whose
/// stdout is piped); returns the address and the lines after it. On a timeout, kills it and
/// fails with the tail of its `log`.
fn await_ready(child: &mut Child, log: &Path, what: &str) -> (String, std::sync::mpsc::Receiver<String>) {
    let out = child.stdout.take().expect("the fixture's stdout, piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                if let Some(u) = line.strip_prefix("READY ") {
                    return (u.trim().to_string(), rx);
                }
            }
            Err(_) => {
                let _ = child.kill();
                let log = std::fs::read_to_string(log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                panic!("{what} did not become ready in 180 s; log tail:\n{}", tail.join("\n"));
            }
        }
    }
}

/// Iceberg's REST catalog test server on 127.0.0.1 (see the module's note).
pub struct IcebergRest {
    /// `http://127.0.0.1:<port>`
    pub url: String,
    pub addr: SocketAddr,
    child: Child,
    dir: tempfile::TempDir,
}

impl IcebergRest {
    /// Starts a server with an empty catalog and waits (up to 3 minutes) for its ready line.
    pub fn start() -> IcebergRest {
        let f = std::env::var_os("FERRY_ICEBERG_REST_CLASSPATH_FILE").unwrap_or_else(|| {
            panic!("FERRY_ICEBERG_REST_CLASSPATH_FILE is not set: build it first: `. scripts/services.sh && . scripts/minidfs.sh && ferry_build_iceberg_rest` (scripts/test.sh does)")
        });
        let cp = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", Path::new(&f).display()));
        let dir = tempfile::tempdir().unwrap();
        let log = std::fs::File::create(dir.path().join("rest.log")).unwrap();
        let mut child = Command::new("java")
            .args(["-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.net.preferIPv4Stack=true"])
            .args(["-cp", cp.trim(), "org.apache.iceberg.rest.FerryRestFixture"])
            .arg(dir.path().join("warehouse"))
            .arg(dir.path().join("catalog.db"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("java");
        let (url, _) = await_ready(&mut child, &dir.path().join("rest.log"), "the Iceberg REST catalog");
        let addr: SocketAddr = url.trim_start_matches("http://").parse().expect("http://127.0.0.1:<port>");
        IcebergRest { url, addr, child, dir }
    }

    /// The server's log so far (for a failed assertion's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("rest.log")).unwrap_or_default()
    }
}

impl Drop for IcebergRest {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The S3-compatible server the test command started (scripts/s3.sh).
pub struct S3Server {
    pub endpoint: String,
    pub addr: SocketAddr,
    pub bucket: String,
    pub ca: PathBuf,
    pub access_key: String,
    pub secret_key: String,
}

impl S3Server {
    pub fn from_env() -> S3Server {
        let get = |k: &str| {
            std::env::var(k).unwrap_or_else(|_| {
                panic!("{k} is not set: start the S3 test server first (`. scripts/s3.sh && ferry_start_s3`; scripts/test.sh does)")
            })
        };
        let endpoint = get("FERRY_TEST_S3_ENDPOINT");
        let hostport = endpoint.trim_start_matches("https://").trim_start_matches("http://").trim_end_matches('/');
        let addr: SocketAddr =
            hostport.parse().unwrap_or_else(|_| panic!("FERRY_TEST_S3_ENDPOINT {endpoint}: want https://127.0.0.1:port"));
        S3Server {
            endpoint,
            addr,
            bucket: get("FERRY_TEST_S3_BUCKET"),
            ca: PathBuf::from(get("FERRY_TEST_S3_CA")),
            access_key: get("FERRY_TEST_S3_ACCESS_KEY"),
            secret_key: get("FERRY_TEST_S3_SECRET_KEY"),
        }
    }

    /// Store options for this server at `endpoint` (the server itself, or a proxy in front).
    pub fn store_options(&self, endpoint: &str) -> ferry_storage::options::StoreOptions {
        let mut o = ferry_storage::options::StoreOptions::default();
        o.s3.endpoint = Some(endpoint.to_string());
        o.s3.region = Some("us-east-1".into());
        o.s3.path_style = true;
        o.s3.ca_bundle = Some(self.ca.clone());
        o.s3.access_key_id = Some(self.access_key.clone());
        o.s3.secret_access_key = Some(self.secret_key.clone());
        o
    }

    /// A whole `[destination]` section for `s3://<bucket>/<prefix>` on this server at
    /// `endpoint`, with short timeouts for tests behind a fault proxy (`max_retries`, `retry_timeout`).
    pub fn destination_toml(&self, prefix: &str, endpoint: &str, max_retries: u32, retry_timeout: &str) -> String {
        format!(
            "[destination]\nurl = \"s3://{}/{prefix}\"\n[destination.store]\ncall_timeout = \"5s\"\nread_stall = \"5s\"\n\
             [destination.store.s3]\n{}connect_timeout = \"1s\"\nrequest_timeout = \"10s\"\nread_timeout = \"3s\"\n\
             max_retries = {max_retries}\nretry_timeout = \"{retry_timeout}\"\n",
            self.bucket,
            self.store_toml(endpoint)
        )
    }

    /// A `[... .store.s3]` TOML body for this server at `endpoint` (the server itself, or a
    /// proxy in front of it).
    pub fn store_toml(&self, endpoint: &str) -> String {
        format!(
            "endpoint = \"{endpoint}\"\nregion = \"us-east-1\"\npath_style = true\nca_bundle = \"{}\"\naccess_key_id = \"{}\"\nsecret_access_key = \"{}\"\n",
            self.ca.display(),
            self.access_key,
            self.secret_key
        )
    }
}

/// A second gateway of the S3 test server over plain HTTP: the same versitygw binary, data
/// directory, bucket and keys. TLS hides a request from the fault proxy; through this gateway
/// a proxy can aim a fault at a request by its method and path (a commit's PUT, say). Stopped
/// when dropped.
pub struct PlainS3Gateway {
    /// `http://127.0.0.1:<port>`
    pub endpoint: String,
    pub addr: SocketAddr,
    child: Child,
}

impl S3Server {
    /// Starts a [`PlainS3Gateway`] on a free port, ready when it answers a request (any HTTP
    /// answer: a bare connect may reach another process).
    pub fn plain_gateway(&self) -> PlainS3Gateway {
        let how = "`. scripts/s3.sh && ferry_start_s3`";
        let (bin, data) = (test_env("FERRY_TEST_S3_BIN", how), test_env("FERRY_TEST_S3_DATA", how));
        let (child, addr) = serve_on_free_port(
            "a plain-HTTP versitygw",
            |port| {
                let mut c = Command::new(&bin);
                c.args(["--port", &format!("127.0.0.1:{port}"), "--region", "us-east-1", "--quiet", "--keep-alive", "posix", &data])
                    .env("ROOT_ACCESS_KEY_ID", &self.access_key)
                    .env("ROOT_SECRET_ACCESS_KEY", &self.secret_key);
                c
            },
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"HTTP/",
        );
        PlainS3Gateway { endpoint: format!("http://{addr}"), addr, child }
    }
}

/// Starts the server `command(port)` makes on a free port (another one if a process took the port
/// between the look and the server's bind), ready when `request` sent to it gets an answer that
/// starts with `answer`. Up to 5 tries of 60 s.
fn serve_on_free_port(what: &str, command: impl Fn(u16) -> Command, request: &[u8], answer: &[u8]) -> (Child, SocketAddr) {
    for _ in 0..5 {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut child = command(port)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) && child.try_wait().unwrap().is_none() {
            if let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                use std::io::{Read, Write};
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut head = vec![0u8; answer.len()];
                if s.write_all(request).is_ok() && s.read_exact(&mut head).is_ok() && head == answer && child.try_wait().unwrap().is_none()
                {
                    return (child, addr);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("{what} did not start in 5 tries");
}

impl Drop for PlainS3Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An S3-compatible server that lets a second create of an object replace the first: moto's
/// server 5.0.0 ignores `If-None-Match` on PUT (later releases honour it), as some S3-compatible
/// stores do. Plain HTTP on a free port, any keys accepted, bucket `ferry` made at start. What a
/// Delta commit must never be given; stopped when dropped.
pub struct OverwritingS3 {
    /// `http://127.0.0.1:<port>`
    pub endpoint: String,
    child: Child,
}

impl OverwritingS3 {
    pub fn start() -> OverwritingS3 {
        let bin = test_env("FERRY_TEST_MOTO_SERVER", "`. scripts/s3.sh && ferry_install_overwriting_s3`");
        // The bucket's creation is the readiness probe: a 200 from this server.
        let (child, addr) = serve_on_free_port(
            "moto_server",
            |port| {
                let mut c = Command::new(&bin);
                c.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
                c
            },
            b"PUT /ferry HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            b"HTTP/1.1 200",
        );
        OverwritingS3 { endpoint: format!("http://{addr}"), child }
    }

    /// A `[destination]` section for a table under `prefix` on this server.
    pub fn destination_toml(&self, prefix: &str, table_format: &str) -> String {
        format!(
            "[destination]\nurl = \"s3://ferry/{prefix}\"\ntable_format = \"{table_format}\"\n[destination.store.s3]\n\
             endpoint = \"{}\"\nregion = \"us-east-1\"\npath_style = true\nallow_http = true\n\
             access_key_id = \"moto\"\nsecret_access_key = \"moto\"\nmax_retries = 1\n",
            self.endpoint
        )
    }
}

impl Drop for OverwritingS3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn test_env(k: &str, how: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set: start the server first ({how}; scripts/test.sh does)"))
}

fn loopback_addr(var: &str, endpoint: &str) -> SocketAddr {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    let hostport = rest.split('/').next().unwrap_or_default();
    hostport.parse().unwrap_or_else(|_| panic!("{var} {endpoint}: want https://127.0.0.1:port[/path]"))
}

/// The GCS emulator (ferry-gcs) the test command starts.
pub struct GcsServer {
    /// `https://127.0.0.1:<port>`
    pub endpoint: String,
    pub addr: SocketAddr,
    pub bucket: String,
    pub ca: PathBuf,
    /// A service account key file without keys (`disable_oauth`): requests carry no token.
    pub service_account: PathBuf,
}

impl GcsServer {
    pub fn from_env() -> GcsServer {
        let how = "`. scripts/emulators/gcs.sh && ferry_start_gcs`";
        let endpoint = test_env("FERRY_TEST_GCS_ENDPOINT", how);
        GcsServer {
            addr: loopback_addr("FERRY_TEST_GCS_ENDPOINT", &endpoint),
            endpoint,
            bucket: test_env("FERRY_TEST_GCS_BUCKET", how),
            ca: PathBuf::from(test_env("FERRY_TEST_GCS_CA", how)),
            service_account: PathBuf::from(test_env("FERRY_TEST_GCS_SERVICE_ACCOUNT", how)),
        }
    }

    /// Store options for this server at `endpoint` (the server itself, or a proxy in front).
    pub fn store_options(&self, endpoint: &str) -> ferry_storage::options::StoreOptions {
        let mut o = ferry_storage::options::StoreOptions::default();
        o.gcs.endpoint = Some(endpoint.to_string());
        o.gcs.service_account = Some(self.service_account.clone());
        o.gcs.ca_bundle = Some(self.ca.clone());
        o
    }
}

/// The Azure Blob Storage emulator (Azurite) the test command starts.
pub struct AzureServer {
    /// `https://127.0.0.1:<port>/<account>`: the account's blob endpoint.
    pub endpoint: String,
    pub addr: SocketAddr,
    pub account: String,
    pub key: String,
    pub container: String,
    pub ca: PathBuf,
}

impl AzureServer {
    pub fn from_env() -> AzureServer {
        let how = "`. scripts/emulators/azurite.sh && ferry_start_azurite`";
        let endpoint = test_env("FERRY_TEST_AZURE_ENDPOINT", how);
        AzureServer {
            addr: loopback_addr("FERRY_TEST_AZURE_ENDPOINT", &endpoint),
            endpoint,
            account: test_env("FERRY_TEST_AZURE_ACCOUNT", how),
            key: test_env("FERRY_TEST_AZURE_KEY", how),
            container: test_env("FERRY_TEST_AZURE_CONTAINER", how),
            ca: PathBuf::from(test_env("FERRY_TEST_AZURE_CA", how)),
        }
    }

    /// Store options for this server, reached at `host_port` (the server itself, or a proxy
    /// in front): the account path stays.
    pub fn store_options(&self, host_port: &str) -> ferry_storage::options::StoreOptions {
        let mut o = ferry_storage::options::StoreOptions::default();
        o.azure.endpoint = Some(format!("https://{host_port}/{}", self.account));
        o.azure.account = Some(self.account.clone());
        o.azure.access_key = Some(self.key.clone());
        o.azure.ca_bundle = Some(self.ca.clone());
        o
    }
}
