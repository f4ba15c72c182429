//! Harness for the end-to-end tests: a pipeline in a temp directory (source, staging, spool,
//! destination, SQLite ledger, config file), the real binaries, and an independent reader
//! (Python: fastavro, json, csv for the inputs; pyarrow for the published table).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub mod clusters;
pub mod netns;
pub mod postgres;
pub mod proxy;

/// The directory holding the workspace's binaries (`cargo build --workspace --bins` first;
/// the test command does).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let p = dir.join(name);
    assert!(p.exists(), "{} is not built: run `cargo build --workspace --bins` (scripts/test.sh does)", p.display());
    p
}

pub struct Pipeline {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    /// Extra environment per binary (e.g. copy's destination URL through a fault proxy).
    env: std::sync::Mutex<Vec<(String, String, String)>>,
}

pub const STAGES: [&str; 4] = ["ferry-extract", "ferry-transform", "ferry-copy", "ferry-load"];

impl Pipeline {
    /// `extra` is appended to the config (later keys of a section must not repeat earlier ones).
    pub fn new(chunk_size: &str, lease: &str, settle: &str) -> Pipeline {
        Pipeline::with_stores(chunk_size, lease, settle, None, None)
    }

    /// Like [`Pipeline::new`], with whole `[staging]` / `[destination]` sections (URL and
    /// `[*.store]` options) instead of local directories.
    pub fn with_stores(chunk_size: &str, lease: &str, settle: &str, staging: Option<String>, destination: Option<String>) -> Pipeline {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let staging = staging.unwrap_or_else(|| format!("[staging]\nurl = \"file://{}/staging\"\n", d.display()));
        let destination = destination.unwrap_or_else(|| format!("[destination]\nurl = \"{}/wh\"\n", d.display()));
        std::fs::create_dir_all(d.join("in")).unwrap();
        let config = d.join("ferry.toml");
        let text = format!(
            r#"[ledger]
url = "sqlite://{d}/ledger.db"
lease = "{lease}"
backoff_min = "100ms"
backoff_max = "1s"

[source]
url = "{d}/in"
settle = "{settle}"

{staging}
[spool]
dir = "{d}/spool"

{destination}

[table]
name = "events"
partition_by = ["dt"]
columns = [
  {{ name = "event_id", type = "string", nullable = false }},
  {{ name = "ts", type = "timestamp", nullable = false }},
  {{ name = "host", type = "string", nullable = false }},
  {{ name = "kind", type = "string", nullable = false }},
  {{ name = "user_id", type = "long", nullable = false }},
  {{ name = "payload", type = "string", nullable = false }},
  {{ name = "score", type = "double" }},
]

[extract]
chunk_size = "{chunk_size}"

[transform]
derive = {{ dt = "date(ts)" }}
max_bad_records = 5
"#,
            d = d.display()
        );
        std::fs::write(&config, text).unwrap();
        Pipeline { dir, config, env: Default::default() }
    }

    /// Sets `[destination] table_format` (`"hive"` is the default; `"delta"` makes the table
    /// a Delta table, which [`Pipeline::table_digest`] then reads through delta-rs).
    pub fn table_format(self, format: &str) -> Pipeline {
        let cfg = std::fs::read_to_string(&self.config).unwrap();
        let line = format!("url = \"{}/wh\"", self.dir.path().display());
        assert!(cfg.contains(&line), "the destination line");
        std::fs::write(&self.config, cfg.replace(&line, &format!("{line}\ntable_format = \"{format}\""))).unwrap();
        self
    }

    /// Makes the Iceberg table's catalog the REST catalog at `uri` (plain HTTP allowed, short
    /// deadlines so that a lost reply is settled within seconds); readers of
    /// [`Pipeline::table_digest`] then go through it too.
    pub fn rest_catalog(self, uri: &str) -> Pipeline {
        let mut cfg = std::fs::read_to_string(&self.config).unwrap();
        assert!(cfg.contains("table_format = \"iceberg\""), "an Iceberg table first");
        cfg.push_str(&format!(
            "\n[destination.iceberg]\ncatalog = \"rest\"\nuri = \"{uri}\"\nallow_http = true\nconnect_timeout = \"2s\"\nrequest_timeout = \"3s\"\n"
        ));
        std::fs::write(&self.config, cfg).unwrap();
        self
    }

    /// Where readers find the Iceberg table's catalog: the REST catalog's URI, or the ledger's
    /// URL (Iceberg's JDBC catalog in it).
    pub fn iceberg_catalog(&self) -> String {
        let cfg = std::fs::read_to_string(&self.config).unwrap();
        match cfg.lines().find_map(|l| l.strip_prefix("uri = \"http")) {
            Some(rest) => format!("http{}", rest.trim_end_matches('"')),
            None => self.ledger_url(),
        }
    }

    /// Points the config's `ledger.url` at `url` (a Postgres ledger).
    pub fn use_ledger(&self, url: &str) {
        let cfg = std::fs::read_to_string(&self.config).unwrap();
        let line = cfg.lines().find(|l| l.starts_with("url = \"sqlite://")).expect("the ledger URL line").to_string();
        std::fs::write(&self.config, cfg.replace(&line, &format!("url = \"{url}\""))).unwrap();
        // A shared (Postgres) ledger is migrated on purpose, not by the stages.
        let out = self.command("ferry").arg("migrate").output().unwrap();
        assert!(out.status.success(), "ferry migrate: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// `ferry gen` a batch of `files` JSON lines files into the source directory, named
    /// `<batch>-...` so that batches never overwrite each other.
    pub fn add_jsonl_batch(&self, batch: &str, files: u32, records: u32, seed: u64) {
        let dir = format!("gen-{batch}");
        self.generate(&dir, "jsonl", "null", files, records, seed);
        for e in std::fs::read_dir(self.path(&dir)).unwrap().flatten() {
            let name = format!("{batch}-{}", e.file_name().to_string_lossy());
            let tmp = self.path(&format!("{dir}/.{name}"));
            std::fs::rename(e.path(), &tmp).unwrap();
            // Into place by rename: extract never sees a half-written file.
            std::fs::rename(&tmp, self.path(&format!("in/{name}"))).unwrap();
        }
    }

    /// Starts `binary --watch` with a short poll, its log read as it comes (a full pipe would
    /// block the service); [`Service::stop`] sends SIGTERM and returns the exit code and log.
    pub fn watch(&self, binary: &str, extra: &[&str]) -> Service {
        self.watch_on(binary, extra, |c| c)
    }

    /// [`Pipeline::watch`], its command first passed through `wrap` (to run it on another
    /// host, say: [`netns::Host::run`]).
    pub fn watch_on(&self, binary: &str, extra: &[&str], wrap: impl FnOnce(Command) -> Command) -> Service {
        let mut c = self.command(binary);
        c.env("RUST_LOG", "info").args(["--watch", "--poll", "200ms"]).args(extra);
        let mut child = wrap(c).stderr(std::process::Stdio::piped()).spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let lines = seen.clone();
        let log = std::thread::spawn(move || {
            let mut r = std::io::BufReader::new(stderr);
            let mut line = String::new();
            while std::io::BufRead::read_line(&mut r, &mut line).is_ok_and(|n| n > 0) {
                lines.lock().unwrap().push_str(&line);
                line.clear();
            }
            lines.lock().unwrap().clone()
        });
        Service { name: binary.to_string(), child, log: Some(log), seen, metrics_port: None }
    }

    /// [`Pipeline::watch`], returned once the service is past its start checks (the ledger and
    /// its stores answered): its metrics endpoint, which it opens then, answers. A store that
    /// does not answer at start is waited for at start (`--start-wait`), not an outage, so a
    /// test of outages starts its services this way and only then takes the store away.
    pub fn watch_started(&self, binary: &str, extra: &[&str]) -> Service {
        // Port 0: the service binds a free port itself and logs which (a port found free here
        // and passed on could be taken by another process before the service binds it).
        let mut args = vec!["--metrics-addr", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        let mut s = self.watch(binary, &args);
        let mut port = None;
        wait_until(&format!("{binary} past its start checks"), std::time::Duration::from_secs(60), || {
            assert!(s.running(), "{binary} ended at start: {}", s.log_so_far());
            port = metrics_port_in(&s.log_so_far());
            port.is_some_and(|p| std::net::TcpStream::connect(("127.0.0.1", p)).is_ok())
        });
        s.metrics_port = port;
        s
    }

    /// Copies the pipeline's entries `names` (files or directories under its root) into
    /// `to`, to be put back by [`Pipeline::restore`]: a test that runs a stage from the same
    /// state again and again (killed at each step in turn).
    pub fn save(&self, names: &[&str], to: &Path) {
        let _ = std::fs::remove_dir_all(to);
        std::fs::create_dir_all(to).unwrap();
        for k in names {
            if self.path(k).exists() {
                copy_tree(&self.path(k), &to.join(k));
            }
        }
    }

    /// Puts entries `names` back as [`Pipeline::save`] kept them in `from` (an entry that did
    /// not exist then does not exist after).
    pub fn restore(&self, names: &[&str], from: &Path) {
        for k in names {
            let _ = std::fs::remove_dir_all(self.path(k));
            let _ = std::fs::remove_file(self.path(k));
            if from.join(k).exists() {
                copy_tree(&from.join(k), &self.path(k));
            }
        }
    }

    /// Sets `key=value` in the environment of every run of `binary`.
    pub fn stage_env(&self, binary: &str, key: &str, value: &str) {
        self.env.lock().unwrap().push((binary.into(), key.into(), value.into()));
    }

    /// Raises `ledger.max_attempts` to `cap` for every stage: for tests whose fault proxy
    /// fails a large share of all calls on purpose, where the default cap (8) would now and
    /// then quarantine a chunk unlucky eight times in a row. The cap's own behaviour is the
    /// ledger's conformance tests'; [`Pipeline::assert_attempts_within`] shows that a raised
    /// cap was never needed near its end.
    pub fn raise_attempt_cap(&self, cap: u32) {
        for s in STAGES {
            self.stage_env(s, "FERRY_LEDGER_MAX_ATTEMPTS", &cap.to_string());
        }
    }

    /// Fails if a task took more than half of `cap` attempts: the raised cap hid no chunk that
    /// kept failing. Returns the failed attempts (a test whose faults must fail some asserts so).
    pub fn assert_attempts_within(&self, cap: u32) -> i64 {
        let failed = self.count("SELECT COUNT(*) FROM attempts WHERE outcome <> 'done'");
        let most = self.count("SELECT COALESCE(MAX(attempt), 0) FROM attempts");
        assert!(
            most <= i64::from(cap / 2),
            "a task took {most} attempts, more than half the raised cap of {cap}: {}",
            self.sql("SELECT group_concat(stage || ' ' || chunk_id || ': ' || COALESCE(error, ''), '; ') FROM (SELECT * FROM attempts ORDER BY attempt DESC LIMIT 3)")
        );
        failed
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The ledger's URL as the config has it (a SQLite file in the test's directory unless
    /// [`Pipeline::use_ledger`] pointed it elsewhere).
    pub fn ledger_url(&self) -> String {
        let cfg = std::fs::read_to_string(&self.config).unwrap();
        let line = cfg.lines().find(|l| l.starts_with("url = ")).expect("the ledger's url, first in the config");
        line.trim_start_matches("url = ").trim_matches('"').to_string()
    }

    pub fn command(&self, name: &str) -> Command {
        let mut c = Command::new(bin(name));
        c.env("FERRY_CONFIG", &self.config).env_remove("FERRY_LEDGER").env("RUST_LOG", "warn");
        for (b, k, v) in self.env.lock().unwrap().iter() {
            if b == name {
                c.env(k, v);
            }
        }
        c
    }

    /// Replaces the config's `table.columns` with `columns` (TOML lines) and its derive with
    /// `derive` (a whole `derive = {...}` line).
    pub fn set_columns(&self, columns: &str, derive: &str) {
        let cfg = std::fs::read_to_string(&self.config).unwrap();
        let start = cfg.find("columns = [").unwrap();
        let end = start + cfg[start..].find("]\n").unwrap() + 2;
        let cfg = format!("{}columns = [\n{columns}\n]\n{}", &cfg[..start], &cfg[end..]);
        let cfg = cfg.replace("derive = { dt = \"date(ts)\" }", derive);
        std::fs::write(&self.config, cfg).unwrap();
    }

    /// Runs one stage with --once and returns its output. A run that outlives ten minutes
    /// fails the test (killed, its log shown) instead of hanging the suite.
    pub fn stage(&self, name: &str) -> Output {
        output_within(self.command(name).arg("--once"), std::time::Duration::from_secs(600))
    }

    /// Runs each stage with --once, in order; fails the test on the first that does not succeed.
    pub fn stages_ok(&self, names: &[&str]) {
        for name in names {
            let o = self.stage(name);
            assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
        }
    }

    /// `ferry gen` into `dir` (relative to the pipeline).
    pub fn generate(&self, dir: &str, format: &str, codec: &str, files: u32, records: u32, seed: u64) {
        let out = Command::new(bin("ferry"))
            .args(["gen", "--format", format, "--codec", codec, "--files", &files.to_string()])
            .args(["--records", &records.to_string(), "--seed", &seed.to_string(), "--block-records", "200"])
            .arg("--out")
            .arg(self.path(dir))
            .output()
            .unwrap();
        assert!(out.status.success(), "gen: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// One --once run of a stage in a round of retries: its exit code must be one a stage
    /// gives while faults, retries and quarantines are part of the test ([`ROUND_EXITS`]); a
    /// fatal error, a configuration error, a panic or a signal fails the test with its output.
    pub fn stage_round(&self, name: &str) -> Output {
        let o = self.stage(name);
        round_exit(name, &o);
        o
    }

    /// Runs every stage with --once, in order, until the ledger has nothing pending (retries
    /// and expired leases of killed runs included) or `rounds` passes are used up. Every run's
    /// exit code is checked ([`Pipeline::stage_round`]).
    pub fn drain(&self, rounds: usize) -> Vec<Output> {
        let mut last = Vec::new();
        for _ in 0..rounds {
            last = STAGES.iter().map(|s| self.stage_round(s)).collect();
            if self.sql("SELECT COUNT(*) FROM tasks WHERE state IN ('available','running','retryable')") == "0"
                && self.sql("SELECT COUNT(*) FROM source_files WHERE state = 'registered'") == "0"
            {
                return last;
            }
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        last
    }

    /// `q` on the ledger through Python's sqlite3 (an independent reader): its first value.
    fn query(&self, q: &str) -> std::process::Output {
        Command::new("python3")
            .args([
                "-c",
                "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); r=c.execute(sys.argv[2]).fetchone(); print('' if r is None else r[0])",
            ])
            .arg(self.path("ledger.db"))
            .arg(q)
            .output()
            .unwrap()
    }

    /// One value from the ledger, through the sqlite3 command line (an independent reader).
    pub fn sql(&self, q: &str) -> String {
        let out = self.query(q);
        assert!(out.status.success(), "{q}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A count from the ledger, or None while it cannot be read yet (no stage has made its
    /// tables: services just started under load).
    pub fn try_count(&self, q: &str) -> Option<i64> {
        let out = self.query(q);
        if !out.status.success() {
            return None;
        }
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    }

    /// Every one of `files` source files taken in, every chunk through load, nothing waiting
    /// (false while the ledger has no tables yet).
    pub fn drained(&self, files: i64) -> bool {
        let n = |q: &str| self.try_count(q);
        n("SELECT COUNT(*) FROM source_files WHERE state <> 'registered'") == Some(files)
            && n("SELECT COUNT(*) FROM tasks WHERE state <> 'done'") == Some(0)
            && n("SELECT COUNT(*) FROM tasks WHERE stage = 'load'").is_some_and(|l| Some(l) == n("SELECT COUNT(*) FROM chunks"))
    }

    /// Runs `script` (SQL statements) on the SQLite ledger and commits: a test that puts the
    /// ledger where an instant it cannot time would leave it.
    pub fn ledger_script(&self, script: &str) {
        let out = Command::new("python3")
            .args(["-c", "import sqlite3, sys\nc = sqlite3.connect(sys.argv[1])\nc.executescript(sys.argv[2])\nc.commit()"])
            .arg(self.path("ledger.db"))
            .arg(script)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }

    /// A count (or any integer) from the ledger.
    pub fn count(&self, q: &str) -> i64 {
        let v = self.sql(q);
        v.parse().unwrap_or_else(|_| panic!("{q}: not a number: {v:?}"))
    }

    /// Digest of the published table: rows, distinct ids, and a hash of all rows in a
    /// canonical form. A Hive table is read by pyarrow, a Delta table (one with a
    /// `_delta_log`) by delta-rs at its latest version.
    pub fn table_digest(&self) -> serde_json::Value {
        let dir = self.path("wh/events");
        if self.is_iceberg() {
            iceberg_digest(&self.iceberg_catalog(), "default.events", None)
        } else if dir.join("_delta_log").exists() {
            delta_digest(&dir, None)
        } else {
            table_digest(&dir)
        }
    }

    /// Whether the table is an Iceberg table (`table_format = "iceberg"`), which
    /// [`Pipeline::table_digest`] reads through PyIceberg and the catalog in the ledger.
    pub fn is_iceberg(&self) -> bool {
        std::fs::read_to_string(&self.config).unwrap().contains("table_format = \"iceberg\"")
    }
}

/// Another writer of an Iceberg table: appends `n` batches of 5 rows (ids `theirs-<i>-<k>`)
/// through PyIceberg, each retried on a lost race, through the catalog at `catalog` (an
/// `http://` REST catalog, else the ledger's URL as SQLAlchemy takes it). Spawned, not waited
/// for: it runs beside loads.
pub fn spawn_iceberg_appender(catalog: &str, n: usize) -> std::process::Child {
    const APPENDER: &str = r#"
import sys, os, datetime, time
import pyarrow as pa
from pyiceberg.exceptions import CommitFailedException
if sys.argv[1].startswith("http"):
    from pyiceberg.catalog.rest import RestCatalog
    cat = RestCatalog("ferry", uri=sys.argv[1])
else:
    from pyiceberg.catalog.sql import SqlCatalog
    cat = SqlCatalog("ferry", uri=sys.argv[1], init_catalog_tables="false")
ts = datetime.datetime(2026, 11, 21, 12, 0, tzinfo=datetime.timezone.utc)
for i in range(int(sys.argv[2])):
    while True:
        t = cat.load_table("default.events")
        ids = [f"theirs-{i}-{k}" for k in range(5)]
        rows = {"event_id": ids, "ts": [ts] * 5, "host": ["other"] * 5, "kind": ["k"] * 5, "user_id": [7] * 5,
                "payload": ["x"] * 5, "score": [None] * 5, "dt": [ts.date()] * 5}
        try:
            t.append(pa.Table.from_pydict(rows, schema=t.schema().as_arrow()))
            break
        except CommitFailedException:
            time.sleep(0.05)
sys.stdout.flush()
os._exit(0)
"#;
    Command::new("python3")
        .args(["-c", APPENDER, &sqlalchemy_url(catalog), &n.to_string()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Asserts that a table's digest is `want`'s (rows, distinct ids, content), every row in the
/// partition of its day.
pub fn same_digest(got: &serde_json::Value, want: &serde_json::Value, what: &str) {
    for k in ["rows", "distinct", "digest"] {
        assert_eq!(got[k], want[k], "{what}: {k} ({got} vs {want})");
    }
    assert_eq!(got["bad_dt"], 0, "{what}: rows in the wrong partition ({got})");
}

impl Pipeline {
    /// Rounds of the four stages until every task is done (retries made due at once), at most
    /// `rounds`, or the test fails naming what is left.
    pub fn drained_within(&self, rounds: usize, what: &str) {
        for _ in 0..rounds {
            for s in STAGES {
                self.stage_round(s);
            }
            if self.count("SELECT COUNT(*) FROM tasks WHERE state <> 'done'") == 0 {
                return;
            }
            self.ledger_script("UPDATE tasks SET scheduled_at = 0 WHERE state = 'retryable'");
        }
        let left = self
            .sql("SELECT group_concat(stage || ' ' || state || ': ' || COALESCE(last_error, ''), '; ') FROM tasks WHERE state <> 'done'");
        panic!("{what}: tasks left: {left}");
    }
}

/// Sets the modification time of `path` (a file, or a directory and everything under it) `secs`
/// seconds back: a test of an age cutoff (`ferry gc --older-than`) makes its files old at once
/// instead of sleeping past the cutoff.
pub fn age(path: &Path, secs: u64) {
    let when = std::time::SystemTime::now() - std::time::Duration::from_secs(secs);
    if path.is_dir() {
        for e in std::fs::read_dir(path).unwrap().flatten() {
            age(&e.path(), secs);
        }
    }
    let f = std::fs::File::open(path).unwrap();
    f.set_modified(when).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// `cp -a from to` (a file or a whole tree; `to` replaced).
pub fn copy_tree(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    let out = Command::new("cp").arg("-a").arg(from).arg(to).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Exit codes a stage's `--once` run may end with in a round of retries: 0 (all done), 3
/// (finished, some work quarantined), 4 (no progress: a store down, every attempt failed).
/// Never 1 (fatal), 2 (configuration), a panic (101) or a signal.
pub const ROUND_EXITS: [i32; 3] = [0, 3, 4];

/// Fails the test unless stage run `o` of `name` ended with one of [`ROUND_EXITS`].
pub fn round_exit(name: &str, o: &Output) {
    assert!(
        o.status.code().is_some_and(|c| ROUND_EXITS.contains(&c)),
        "{name} --once ended with {:?} (a stage in a round of retries exits 0, 3 or 4): {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `cmd.output()`, with a deadline: a command still running after `limit` is killed and fails
/// the test with what it printed so far. Every command a test expects to end goes through this,
/// so a hang is a red test that names the command, never a suite that runs until CI gives up.
pub fn output_within(cmd: &mut Command, limit: std::time::Duration) -> Output {
    use std::io::Read;
    let what = format!("{cmd:?}");
    // As `output()`: no stdin, both outputs captured.
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let log = err.join().unwrap_or_default();
            panic!("{what} still running after {limit:?}, killed:\n{}", String::from_utf8_lossy(&log));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    Output { status, stdout: out.join().unwrap_or_default(), stderr: err.join().unwrap_or_default() }
}

/// Polls `f` every half second until it holds; fails the test naming `what` after `limit`.
pub fn wait_until(what: &str, limit: std::time::Duration, f: impl FnMut() -> bool) {
    assert!(held_within(limit, f), "{what}: not within {limit:?}");
}

/// Polls `f` every half second until it holds (true) or `limit` has passed (false): for a test
/// that has more to say than [`wait_until`] when it fails.
pub fn held_within(limit: std::time::Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = std::time::Instant::now();
    while !f() {
        if t0.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    true
}

/// A stage running under `--watch` (see [`Pipeline::watch`]).
pub struct Service {
    pub name: String,
    pub child: std::process::Child,
    log: Option<std::thread::JoinHandle<String>>,
    /// What it has logged so far.
    seen: std::sync::Arc<std::sync::Mutex<String>>,
    /// Where its `/metrics` answers, when started by [`Pipeline::watch_started`].
    pub metrics_port: Option<u16>,
}

/// The port a stage's log says it serves `/metrics` on (its "serving /metrics and /healthz"
/// line), if it has said so yet.
pub fn metrics_port_in(log: &str) -> Option<u16> {
    let line = log.lines().find(|l| l.contains("serving /metrics and /healthz"))?;
    let at = line.find("127.0.0.1:")? + "127.0.0.1:".len();
    line[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// A loopback port that refuses connections for as long as this lives: bound, so no other
/// process can take it, but never listening. (A port found free, let go and then used may be
/// taken by anything in between.)
pub struct ClosedPort {
    fd: i32,
    pub port: u16,
}

impl ClosedPort {
    pub fn new() -> ClosedPort {
        // SAFETY: plain socket calls on a descriptor this value owns; the address structs are
        // sized as the calls are told.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            let mut addr: libc::sockaddr_in = std::mem::zeroed();
            addr.sin_family = libc::AF_INET as libc::sa_family_t;
            addr.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
            let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let rc = libc::bind(fd, (&raw const addr).cast(), len);
            assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
            let mut got = len;
            let rc = libc::getsockname(fd, (&raw mut addr).cast(), &mut got);
            assert_eq!(rc, 0, "getsockname: {}", std::io::Error::last_os_error());
            ClosedPort { fd, port: u16::from_be(addr.sin_port) }
        }
    }
}

impl Default for ClosedPort {
    fn default() -> ClosedPort {
        ClosedPort::new()
    }
}

impl Drop for ClosedPort {
    fn drop(&mut self) {
        // SAFETY: the descriptor is this value's own, closed once.
        unsafe { libc::close(self.fd) };
    }
}

impl Service {
    /// What the service has logged so far.
    pub fn log_so_far(&self) -> String {
        self.seen.lock().unwrap().clone()
    }

    /// Still running (it has not exited by itself)?
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Sends `signal` (as `kill` names it: "-STOP", "-CONT", ...) to the service.
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill").args([signal, &self.child.id().to_string()]).status().unwrap();
        assert!(ok.success(), "kill {signal} {}", self.name);
    }

    /// SIGTERM, then waits: (exit code, seconds it took, log).
    pub fn stop(mut self) -> (Option<i32>, f64, String) {
        let t0 = std::time::Instant::now();
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let status = self.child.wait().unwrap();
        let log = self.log.take().map(|h| h.join().unwrap()).unwrap_or_default();
        (status.code(), t0.elapsed().as_secs_f64(), log)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Digest of a published table in a local directory (Hive layout, `_ferry/` ignored).
pub fn table_digest(dir: &Path) -> serde_json::Value {
    python(DIGEST, &["table", dir.to_str().unwrap()])
}

/// Digest of a published table on the S3 test server (`bucket/prefix/table`), read by pyarrow's
/// own S3 client.
pub fn s3_table_digest(path: &str) -> serde_json::Value {
    python(DIGEST, &["s3table", path])
}

/// Digests of many published tables in local directories ([`table_digest`] of each), read by one
/// Python process: a test that checks hundreds of outcomes starts one interpreter, not hundreds.
pub fn table_digests(dirs: &[PathBuf]) -> Vec<serde_json::Value> {
    let list: Vec<serde_json::Value> = dirs.iter().map(|d| serde_json::json!(["table", d, null])).collect();
    many_digests(&list)
}

/// [`delta_digest`] of each (table, version), read by one Python process.
pub fn delta_digests(tables: &[(PathBuf, Option<i64>)]) -> Vec<serde_json::Value> {
    let list: Vec<serde_json::Value> = tables.iter().map(|(d, v)| serde_json::json!(["delta", d, v])).collect();
    many_digests(&list)
}

fn many_digests(list: &[serde_json::Value]) -> Vec<serde_json::Value> {
    let got = python(DIGEST, &["many", &serde_json::Value::from(list.to_vec()).to_string()]);
    let got = got.as_array().expect("a list of digests").clone();
    assert_eq!(got.len(), list.len(), "one digest per table");
    got
}

/// Digest of a Delta table as delta-rs (the `deltalake` Python package) reads it: at its latest
/// version, or at `version` (time travel).
pub fn delta_digest(dir: &Path, version: Option<i64>) -> serde_json::Value {
    let v = version.map(|v| v.to_string()).unwrap_or_default();
    python(DIGEST, &["delta", dir.to_str().unwrap(), &v])
}

/// Digest of an Iceberg table as PyIceberg reads it through the JDBC catalog in the ledger at
/// `ledger_url` (given only that URL, as a user would point it there): at the current snapshot,
/// or at `snapshot` (time travel by snapshot id). `table`: `namespace.name`. An `http://` URL is
/// an Iceberg REST catalog's, read through it instead (as are the other Iceberg readers').
pub fn iceberg_digest(ledger_url: &str, table: &str, snapshot: Option<i64>) -> serde_json::Value {
    let v = snapshot.map(|v| v.to_string()).unwrap_or_default();
    python_in(pyiceberg_python(), DIGEST, &["iceberg", &format!("{}|{table}", sqlalchemy_url(ledger_url)), &v])
}

/// One Python process that digests tables on request (as [`iceberg_digest`] and the others
/// do): a test that reads the table after each of many steps imports pyarrow and PyIceberg once.
pub struct Digester {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl Digester {
    pub fn new() -> Digester {
        let mut child = pyiceberg_python()
            .args(["-c", DIGEST, "serve"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        Digester { child, out }
    }

    /// [`iceberg_digest`], answered by this process.
    pub fn iceberg(&mut self, ledger_url: &str, table: &str, snapshot: Option<i64>) -> serde_json::Value {
        use std::io::{BufRead, Write};
        let ask = serde_json::json!(["iceberg", format!("{}|{table}", sqlalchemy_url(ledger_url)), snapshot.map(|s| s.to_string())]);
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{ask}").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("digest of {ask}: {e}: {line:?} (the reader's error is above)"))
    }
}

impl Default for Digester {
    fn default() -> Self {
        Digester::new()
    }
}

impl Drop for Digester {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A ledger URL as SQLAlchemy (PyIceberg's SqlCatalog) takes it.
pub fn sqlalchemy_url(ledger_url: &str) -> String {
    if ledger_url.starts_with("http") {
        // An Iceberg REST catalog's: read through it.
        return ledger_url.to_string();
    }
    if let Some(path) = ledger_url.strip_prefix("sqlite://") {
        format!("sqlite:///{}", path.split('?').next().unwrap_or(path))
    } else {
        let rest = ledger_url.split_once("://").map_or(ledger_url, |(_, r)| r);
        format!("postgresql+psycopg2://{rest}")
    }
}

/// Digests of an Iceberg table as Spark (iceberg-spark-runtime, Iceberg's own Java
/// implementation) reads it through Iceberg's JdbcCatalog on the ledger at `ledger_url`, one per
/// entry of `snapshots` (None: the current snapshot; Some: `VERSION AS OF` the snapshot id), from
/// one Spark session.
pub fn spark_iceberg_digests(ledger_url: &str, table: &str, snapshots: &[Option<i64>]) -> Vec<serde_json::Value> {
    let list: Vec<serde_json::Value> =
        snapshots.iter().map(|s| serde_json::json!(["spark-iceberg", format!("{}|{table}", jdbc_url(ledger_url)), s])).collect();
    let (_one, python) = iceberg_spark_python();
    let out = Command::new(python)
        .arg("-c")
        .arg(DIGEST)
        .args(["many", &serde_json::Value::from(list.clone()).to_string()])
        .env("TZ", "UTC")
        .output()
        .unwrap();
    assert!(out.status.success(), "spark: {}", String::from_utf8_lossy(&out.stderr));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let got = got.as_array().expect("a list of digests").clone();
    assert_eq!(got.len(), list.len(), "one digest per snapshot");
    got
}

/// Spark 4.1's Python (with Iceberg's runtime), held for one session at a time.
fn iceberg_spark_python() -> (std::sync::MutexGuard<'static, ()>, String) {
    let one = SPARK.lock().unwrap_or_else(|p| p.into_inner());
    let python = std::env::var("FERRY_ICEBERG_SPARK_PYTHON")
        .expect("FERRY_ICEBERG_SPARK_PYTHON is not set: run the README's test command, which installs Spark 4.1 for Iceberg");
    (one, python)
}

/// Runs SQL statements in Spark with Iceberg's runtime and the JdbcCatalog on the ledger at
/// `ledger_url` (as `ferry`), one session: each statement's rows, as text.
pub fn spark_iceberg_sql(ledger_url: &str, statements: &[&str]) -> Vec<Vec<Vec<String>>> {
    let (_one, python) = iceberg_spark_python();
    let out = Command::new(python)
        .arg("-c")
        .arg(DIGEST)
        .arg("spark-sql")
        .arg(jdbc_url(ledger_url))
        .args(statements)
        .env("TZ", "UTC")
        .output()
        .unwrap();
    assert!(out.status.success(), "spark: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A ledger URL as JDBC takes it, the user and password as query parameters (which the digest
/// script hands to the catalog as `jdbc.user` and `jdbc.password`).
pub fn jdbc_url(ledger_url: &str) -> String {
    if ledger_url.starts_with("http") {
        // An Iceberg REST catalog's: read through it.
        return ledger_url.to_string();
    }
    if let Some(path) = ledger_url.strip_prefix("sqlite://") {
        return format!("jdbc:sqlite:{}", path.split('?').next().unwrap_or(path));
    }
    let rest = ledger_url.split_once("://").map_or(ledger_url, |(_, r)| r);
    let (auth, host) = rest.rsplit_once('@').unwrap_or(("", rest));
    let host = host.split('?').next().unwrap_or(host);
    let (user, password) = auth.split_once(':').unwrap_or((auth, ""));
    let mut url = format!("jdbc:postgresql://{host}");
    if !user.is_empty() {
        url += &format!("?user={user}");
        if !password.is_empty() {
            url += &format!("&password={password}");
        }
    }
    url
}

/// Digests of a Delta table as Spark with delta-spark (Delta's reference implementation)
/// reads it, one per entry of `versions` (None: the latest; Some: time travel), from one Spark
/// session. Each version is read through Spark, written out with pyarrow and digested like a
/// Hive table.
pub fn spark_delta_digests(dir: &Path, versions: &[Option<i64>]) -> Vec<serde_json::Value> {
    spark_read(dir.to_str().unwrap(), versions, None)
}

/// [`spark_delta_digests`] of the table at `path` (`bucket/prefix/table`) on the S3 test server,
/// read where it is through Hadoop's S3A connector (hadoop-aws of the Hadoop that pyspark
/// ships, and the AWS SDK bundle, from Maven Central), trusting the server's test CA.
pub fn spark_delta_digests_s3(s3: &clusters::S3Server, path: &str, versions: &[Option<i64>]) -> Vec<serde_json::Value> {
    let s3 = serde_json::json!({
        "endpoint": s3.endpoint, "key": s3.access_key, "secret": s3.secret_key, "ca": s3.ca.to_str().unwrap(),
    });
    spark_read(&format!("s3a://{path}"), versions, Some(s3))
}

/// The jars of Spark's packages for the tests (delta-spark; hadoop-aws and the AWS SDK bundle for
/// S3A), from the directory scripts/test.sh exports as FERRY_SPARK_JARS.
fn spark_jars() -> Vec<String> {
    let dir = std::env::var_os("FERRY_SPARK_JARS").unwrap_or_else(|| {
        panic!(
            "FERRY_SPARK_JARS is not set: fetch Spark's test jars first: `. scripts/services.sh && ferry_spark_jars` (scripts/test.sh does)"
        )
    });
    let mut jars: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("FERRY_SPARK_JARS={}: {e}", Path::new(&dir).display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jar"))
        .map(|p| p.to_str().unwrap().to_string())
        .collect();
    jars.sort();
    assert!(jars.iter().any(|j| j.contains("delta-spark")), "FERRY_SPARK_JARS={}: no delta-spark jar", Path::new(&dir).display());
    jars
}

/// One Spark session at a time per test binary: each is a JVM of its own, and several at once
/// on two cores slow every test beside them.
static SPARK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn spark_read(table: &str, versions: &[Option<i64>], s3: Option<serde_json::Value>) -> Vec<serde_json::Value> {
    let _one = SPARK.lock().unwrap_or_else(|p| p.into_inner());
    let work = tempfile::tempdir().unwrap();
    // Spark's packages were fetched before the tests started (ferry_spark_jars in
    // scripts/services.sh): loaded here as files, so no test reaches the network and tests running
    // at once never fetch into one Ivy cache together.
    let jars = spark_jars();
    let list: Vec<String> = versions.iter().map(|v| v.map(|v| v.to_string()).unwrap_or_default()).collect();
    let out = Command::new("python3")
        .arg("-c")
        .arg(SPARK_READ)
        .arg(table)
        .arg(work.path())
        .arg(jars.join(","))
        .arg(list.join(","))
        .arg(s3.map(|v| v.to_string()).unwrap_or_default())
        .output()
        .unwrap();
    assert!(out.status.success(), "spark: {}", String::from_utf8_lossy(&out.stderr));
    (0..versions.len())
        .map(|i| {
            let d = work.path().join(format!("v{i}"));
            python(DIGEST, &["table", d.to_str().unwrap()])
        })
        .collect()
}

/// Writes `in/<name>` of pipeline `p` as an Avro file with fastavro: `fields` and `records` as
/// Python literals.
pub fn write_avro(p: &Pipeline, name: &str, fields: &str, records: &str) {
    let script = format!(
        "import sys, fastavro\nschema = {{'type': 'record', 'name': 'e', 'fields': {fields}}}\n\
         with open(sys.argv[1], 'wb') as f:\n    fastavro.writer(f, schema, {records})\n"
    );
    let out = Command::new("python3").arg("-c").arg(script).arg(p.path(&format!("in/{name}"))).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Runs SQL statements in one Spark session with delta-spark (Delta's reference
/// implementation) as another engine would (`delta.`<path>`` names a table by its directory),
/// and returns each statement's rows, each row its values joined by `,`. A statement
/// `-- wait for <path>` waits (ten minutes at most) until that file exists: a test paces
/// Spark's commits against Ferry's with it.
pub fn spark_sql(statements: &[String]) -> Vec<Vec<String>> {
    let _one = SPARK.lock().unwrap_or_else(|p| p.into_inner());
    let out = Command::new("python3")
        .arg("-c")
        .arg(SPARK_SQL)
        .arg(spark_jars().join(","))
        .arg(serde_json::to_string(statements).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success(), "spark: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().rev().find(|l| l.starts_with('[')).unwrap_or_else(|| panic!("spark printed no result: {text}"));
    serde_json::from_str(last).unwrap()
}

/// Python that both Spark scripts start with: `delta_session(app, jars)`, a local Spark session
/// builder with delta-spark's catalog, UTC, two shuffle partitions and no UI.
macro_rules! spark_prelude {
    () => {
        r#"
from pyspark.sql import SparkSession
def delta_session(app, jars):
    return (SparkSession.builder.master("local[2]").appName(app).config("spark.jars", jars)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.session.timeZone", "UTC").config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false"))
"#
    };
}

const SPARK_SQL: &str = concat!(
    spark_prelude!(),
    r#"
import sys, json
jars, statements = sys.argv[1], json.loads(sys.argv[2])
spark = delta_session("ferry-spark-sql", jars).getOrCreate()
out = []
import os, time
for s in statements:
    if s.startswith("-- wait for "):
        path, t = s[len("-- wait for "):], time.time()
        while not os.path.exists(path) and time.time() - t < 600:
            time.sleep(0.05)
        out.append([])
        continue
    out.append([",".join("" if v is None else str(v) for v in r) for r in spark.sql(s).collect()])
print(json.dumps(out))
spark.stop()
"#
);

const SPARK_READ: &str = concat!(
    spark_prelude!(),
    r#"
import sys, os, json, shutil, subprocess
import pyarrow.parquet as pq
table, out, jars, versions, s3 = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(","), sys.argv[5]
b = delta_session("ferry-delta-read", jars)
if s3:
    s3 = json.loads(s3)
    # The JVM's own trust anchors and the test server's CA.
    java = os.path.realpath(shutil.which("java"))
    home = os.environ.get("JAVA_HOME") or os.path.dirname(os.path.dirname(java))
    trust = os.path.join(out, "trust.p12")
    subprocess.run(["keytool", "-importkeystore", "-noprompt", "-srckeystore", os.path.join(home, "lib", "security", "cacerts"),
        "-srcstorepass", "changeit", "-destkeystore", trust, "-deststoretype", "PKCS12", "-deststorepass", "changeit"],
        check=True, capture_output=True)
    subprocess.run(["keytool", "-importcert", "-noprompt", "-alias", "ferry-test-ca", "-file", s3["ca"], "-keystore", trust,
        "-storetype", "PKCS12", "-storepass", "changeit"], check=True, capture_output=True)
    b = (b.config("spark.driver.extraJavaOptions", f"-Djavax.net.ssl.trustStore={trust} -Djavax.net.ssl.trustStorePassword=changeit "
            "-Djavax.net.ssl.trustStoreType=PKCS12")
        .config("spark.hadoop.fs.s3a.endpoint", s3["endpoint"]).config("spark.hadoop.fs.s3a.endpoint.region", "us-east-1")
        .config("spark.hadoop.fs.s3a.path.style.access", "true")
        .config("spark.hadoop.fs.s3a.access.key", s3["key"]).config("spark.hadoop.fs.s3a.secret.key", s3["secret"]))
spark = b.getOrCreate()
for i, v in enumerate(versions):
    r = spark.read.format("delta")
    if v:
        r = r.option("versionAsOf", int(v))
    os.makedirs(f"{out}/v{i}")
    pq.write_table(r.load(table).toArrow(), f"{out}/v{i}/rows.parquet")
spark.stop()
"#
);

/// Digest of input files (`fmt` = avro, jsonl or csv) read by Python's own readers.
/// Fails unless digests `got` and `want` hold the same rows: count, distinct ids and the hash
/// of every row.
pub fn assert_same_rows(got: &serde_json::Value, want: &serde_json::Value, what: &str) {
    for k in ["rows", "distinct", "digest"] {
        assert_eq!(got[k], want[k], "{what}: {k} ({got} against {want})");
    }
}

pub fn input_digest(fmt: &str, dir: &Path) -> serde_json::Value {
    python(DIGEST, &[fmt, dir.to_str().unwrap()])
}

fn python(script: &str, args: &[&str]) -> serde_json::Value {
    python_in(Command::new("python3"), script, args)
}

/// `python3` for PyIceberg: pyarrow's S3 client (PyIceberg's) takes no CA of its own, so it
/// trusts the S3 test server's through the environment its TLS library reads at start.
pub fn pyiceberg_python() -> Command {
    let mut cmd = Command::new("python3");
    if let Some(ca) = std::env::var_os("FERRY_TEST_S3_CA") {
        cmd.env("AWS_CA_BUNDLE", &ca).env("SSL_CERT_FILE", &ca);
    }
    cmd
}

fn python_in(mut cmd: Command, script: &str, args: &[&str]) -> serde_json::Value {
    let out = cmd.arg("-c").arg(script).args(args).output().unwrap();
    assert!(out.status.success(), "python: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

const DIGEST: &str = r#"
import sys, json, csv, glob, hashlib, datetime
def ms(v):
    if isinstance(v, datetime.datetime):
        return int(v.timestamp() * 1000)
    if isinstance(v, str):
        return int(datetime.datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp() * 1000)
    return int(v)
SPARK = None
def iceberg_spark(jdbc):
    # Spark (iceberg-spark-runtime) with Iceberg's JdbcCatalog on the ledger's database as
    # `ferry`, one session for every table this process reads.
    global SPARK
    if SPARK is None:
        import os
        from pyspark.sql import SparkSession
        jars = ",".join(sorted(glob.glob(os.environ["FERRY_ICEBERG_SPARK_JARS"] + "/*.jar")))
        b = (SparkSession.builder.master("local[1]").config("spark.jars", jars)
             .config("spark.sql.session.timeZone", "UTC").config("spark.ui.enabled", "false")
             .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
             .config("spark.sql.catalog.ferry", "org.apache.iceberg.spark.SparkCatalog"))
        if jdbc.startswith("http"):
            # An Iceberg REST catalog at that URL.
            b = b.config("spark.sql.catalog.ferry.type", "rest").config("spark.sql.catalog.ferry.uri", jdbc)
        else:
            b = (b.config("spark.sql.catalog.ferry.catalog-impl", "org.apache.iceberg.jdbc.JdbcCatalog")
                 .config("spark.sql.catalog.ferry.uri", jdbc.split("?")[0])
                 # Where JdbcCatalog would create new tables; it refuses to start without one.
                 .config("spark.sql.catalog.ferry.warehouse", "file:///tmp/ferry-spark-warehouse"))
        for kv in (jdbc.split("?", 1)[1].split("&") if "?" in jdbc else []):
            k, v2 = kv.split("=", 1)
            b = b.config("spark.sql.catalog.ferry.jdbc." + k, v2)
        SPARK = b.getOrCreate()
        SPARK.sparkContext.setLogLevel("ERROR")
    return SPARK
def digest(kind, d, v):
    rows = []
    def add(r):
        s = r["score"]
        s = None if s in (None, "") else float(s)
        rows.append((r["event_id"], ms(r["ts"]), r["host"], r["kind"], int(r["user_id"]), r["payload"], s))
    if kind == "spark-iceberg":
        # Spark (iceberg-spark-runtime) through Iceberg's JdbcCatalog on the ledger's database,
        # one session for every table read by this process.
        jdbc, name = d.split("|", 1)
        spark = iceberg_spark(jdbc)
        q = "SELECT * FROM ferry." + name + ("" if v is None else " VERSION AS OF " + str(int(v)))
        rs = [r.asDict() for r in spark.sql(q).collect()]
        for r in rs:
            r["ts"] = r["ts"].replace(tzinfo=datetime.timezone.utc)
            add(r)
        days = sorted({str(r["dt"]) for r in rs})
        bad_dt = sum(1 for r in rs if str(r["dt"]) != r["ts"].date().isoformat())
    elif kind in ("table", "s3table", "delta", "iceberg"):
        import pyarrow.dataset as ds
        fsys = None
        if kind == "s3table":
            import os, pyarrow.fs as pfs
            e = os.environ
            fsys = pfs.S3FileSystem(access_key=e["FERRY_TEST_S3_ACCESS_KEY"], secret_key=e["FERRY_TEST_S3_SECRET_KEY"],
                endpoint_override=e["FERRY_TEST_S3_ENDPOINT"].split("//")[1], scheme="https", region="us-east-1",
                tls_ca_file_path=e["FERRY_TEST_S3_CA"])
        if kind == "delta":
            from deltalake import DeltaTable
            t = DeltaTable(d, version=None if v is None else int(v)).to_pyarrow_table()
        elif kind == "iceberg":
            from pyiceberg.catalog.sql import SqlCatalog
            uri, name = d.split("|", 1)
            import os
            e = os.environ
            # The S3 test server's, for a table there (the process trusts its CA: AWS_CA_BUNDLE).
            s3 = {"s3.endpoint": e["FERRY_TEST_S3_ENDPOINT"], "s3.access-key-id": e["FERRY_TEST_S3_ACCESS_KEY"],
                  "s3.secret-access-key": e["FERRY_TEST_S3_SECRET_KEY"], "s3.region": "us-east-1"} if "FERRY_TEST_S3_ENDPOINT" in e else {}
            if uri.startswith("http"):
                from pyiceberg.catalog.rest import RestCatalog
                cat = RestCatalog("ferry", uri=uri, **s3)
            else:
                cat = SqlCatalog("ferry", uri=uri, init_catalog_tables="false", **s3)
            t = cat.load_table(name).scan(snapshot_id=None if v is None else int(v)).to_arrow()
        elif fsys is not None and fsys.get_file_info(d).type == pfs.FileType.NotFound:
            import pyarrow as pa
            t = pa.table({})
        else:
            t = ds.dataset(d, filesystem=fsys, format="parquet", partitioning="hive").to_table()
        for r in t.to_pylist():
            add(r)
        if "dt" in t.schema.names:
            days = sorted({str(r["dt"]) for r in t.select(["dt", "ts"]).to_pylist()})
            bad_dt = sum(1 for r in t.select(["dt", "ts"]).to_pylist() if str(r["dt"]) != r["ts"].astimezone(datetime.timezone.utc).date().isoformat())
        else:
            # No file under a dt= directory: an empty table has no days; rows outside the
            # partition layout all count as misplaced.
            days, bad_dt = [], t.num_rows
    else:
        days, bad_dt = [], 0
        for p in sorted(glob.glob(d + "/*." + kind)):
            if kind == "avro":
                import fastavro
                with open(p, "rb") as f:
                    for r in fastavro.reader(f): add(r)
            elif kind == "jsonl":
                with open(p) as f:
                    for l in f: add(json.loads(l))
            else:
                with open(p, newline="") as f:
                    for r in csv.DictReader(f): add(r)
    rows.sort(key=lambda r: r[0])
    h = hashlib.sha256(json.dumps(rows).encode()).hexdigest()
    return {"rows": len(rows), "distinct": len({r[0] for r in rows}), "digest": h, "days": days, "bad_dt": bad_dt}
if sys.argv[1] == "spark-sql":
    # [jdbc url, statement, ...]: each statement's rows, as lists of strings.
    spark = iceberg_spark(sys.argv[2])
    print(json.dumps([[[str(c) for c in r] for r in spark.sql(q).collect()] for q in sys.argv[3:]]))
elif sys.argv[1] == "serve":
    # One [kind, path, version or null] per line in, its digest per line out, until stdin ends.
    for line in sys.stdin:
        k, d, v = json.loads(line)
        print(json.dumps(digest(k, d, v)), flush=True)
elif sys.argv[1] == "many":
    # [[kind, path, version or null], ...]: one interpreter (and one pyarrow import) for all.
    print(json.dumps([digest(k, d, v) for k, d, v in json.loads(sys.argv[2])]))
else:
    print(json.dumps(digest(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else None)))
# deltalake with pyarrow aborts in the interpreter's teardown ("terminate called without an
# active exception") most of the time: the answer is out, so the process ends without one.
sys.stdout.flush()
import os
os._exit(0)
"#;

/// Every file below `dir`, sorted (none if it is missing).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Every file below `dir` whose name looks like a temp file.
pub fn temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                if p.ends_with("_ferry/tmp") {
                    out.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
                }
                stack.push(p);
            } else if p.to_string_lossy().ends_with(".tmp") {
                out.push(p);
            }
        }
    }
    out
}

/// Runs `cmd` to its end (its stdout and stderr to `log`) and returns how it exited and its own
/// peak RSS in KiB (`wait4`), whatever other processes ran before or beside it.
pub fn run_with_peak_rss(cmd: &mut Command, log: &Path) -> (std::process::ExitStatus, i64) {
    use std::os::unix::process::ExitStatusExt;
    let f = std::fs::File::create(log).unwrap();
    // Reaped by the wait4 below, which also gives its rusage (Child::wait would not).
    #[allow(clippy::zombie_processes)]
    let child = cmd.stdout(f.try_clone().unwrap()).stderr(f).spawn().unwrap();
    let (mut status, mut u): (libc::c_int, libc::rusage) = (0, unsafe { std::mem::zeroed() });
    // SAFETY: the child is ours and not waited for yet; `status` and `u` are valid to fill.
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut u) };
    assert_eq!(pid, child.id() as libc::pid_t, "wait4: {}", std::io::Error::last_os_error());
    (std::process::ExitStatus::from_raw(status), u.ru_maxrss)
}

/// The largest peak RSS (KiB) of any child this process has waited for so far
/// (`getrusage(RUSAGE_CHILDREN)`): a test reading it must be alone in its test binary.
pub fn children_max_rss_kib() -> i64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid rusage for the call to fill.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) }, 0);
    u.ru_maxrss
}
