//! `ferry doctor`: can Ferry reach everything this configuration names, with its settings?
//!
//! One hop per place Ferry reads or writes: the ledger, the source (and the archive), staging,
//! the spool and the destination. A store hop does what the stages will do there, on a probe
//! file of its own under `_ferry/`: list, write (temp name, then rename into place, as every
//! write of Ferry's does), read back and compare the hash, hash on the store, rename without
//! replacing, delete, and check that it is gone. The source is only listed unless Ferry is
//! configured to remove files from it (`disposition = "delete"` or `"archive"`).
//!
//! Every step runs under a deadline, so a store that accepts connections and never answers is
//! a failed hop, not a hung command. A failure names the step and, when the error says enough,
//! the likely fix.

use std::time::{Duration, Instant};

use ferry_common::error::{likely_cause, with_causes};
use ferry_ledger::{Ledger, LedgerOptions};
use ferry_runtime::config::{Config, Disposition, LedgerUrl, StoreOptions, redact_url};
use ferry_storage::Store;

/// One place Ferry reaches, and what asking it gave.
#[derive(Debug, Clone)]
pub struct Hop {
    /// ledger, source, archive, staging, spool, destination.
    pub hop: &'static str,
    /// The URL (a ledger URL with its password hidden).
    pub url: String,
    pub ok: bool,
    /// Wall time of the whole hop.
    pub ms: u64,
    /// The steps that succeeded, in order, with what they found.
    pub steps: Vec<String>,
    /// The step that failed and its error.
    pub error: Option<String>,
    /// What usually causes that error, and what to check.
    pub fix: Option<String>,
}

/// Asks every hop of `cfg` (the ledger at `ledger_url`), each step bounded by `timeout`.
pub async fn run(cfg: &Config, ledger_url: &str, pipeline: &str, timeout: Duration) -> Vec<Hop> {
    let mut hops = vec![ledger_hop(ledger_url, pipeline, timeout).await];
    let source_writes = cfg.source.disposition != Disposition::Keep;
    hops.push(store_hop("source", &cfg.source.url, &cfg.source.store, source_writes, timeout).await);
    if cfg.source.disposition == Disposition::Archive
        && let Some(archive) = &cfg.source.archive_url
    {
        hops.push(store_hop("archive", archive, &cfg.source.store, true, timeout).await);
    }
    hops.push(store_hop("staging", &cfg.staging.url, &cfg.staging.store, true, timeout).await);
    let spool = cfg.spool.dir.display().to_string();
    hops.push(store_hop("spool", &spool, &StoreOptions::default(), true, timeout).await);
    hops.push(store_hop("destination", &cfg.destination.url, &cfg.destination.store, true, timeout).await);
    hops.extend(table_hop(cfg, timeout).await);
    hops
}

/// The table load writes to, checked as its format asks (see `ferry_load::preflight`): for a
/// Delta table, that the store honours put-if-absent and that the table asks nothing of writers
/// Ferry does not give, so a table another engine set up is refused here, by name, before any
/// chunk fails on it.
async fn table_hop(cfg: &Config, timeout: Duration) -> Option<Hop> {
    let start = Instant::now();
    let p = ferry_load::preflight(cfg, timeout).await?;
    let mut s = Steps::new("table", format!("{}/{}", cfg.destination.url, cfg.table.name), timeout);
    s.start = start;
    s.hop.steps = p.steps;
    let ok = match p.failed {
        Some((step, error)) => s.fail::<()>(&step, error).is_ok(),
        None => true,
    };
    Some(s.finish(ok))
}

/// A hop's steps, each under the deadline; the first failure ends the hop.
struct Steps {
    hop: Hop,
    start: Instant,
    timeout: Duration,
}

impl Steps {
    fn new(hop: &'static str, url: String, timeout: Duration) -> Steps {
        let h = Hop { hop, url, ok: false, ms: 0, steps: vec![], error: None, fix: None };
        Steps { hop: h, start: Instant::now(), timeout }
    }

    /// Runs one step; `Err(())` once it failed (the error is recorded).
    async fn step<T, E: std::error::Error>(&mut self, name: &str, f: impl Future<Output = Result<T, E>>) -> Result<T, ()> {
        let t = Instant::now();
        match tokio::time::timeout(self.timeout, f).await {
            Ok(Ok(v)) => {
                self.hop.steps.push(format!("{name} ({} ms)", t.elapsed().as_millis()));
                Ok(v)
            }
            Ok(Err(e)) => self.fail(name, with_causes(&e)),
            Err(_) => self.fail(name, format!("no answer in {}", humantime::format_duration(self.timeout))),
        }
    }

    /// Records a failed step (also one whose call succeeded with a wrong answer).
    fn fail<T>(&mut self, name: &str, error: String) -> Result<T, ()> {
        self.hop.fix = likely_cause(&error).map(|c| c.fix().to_string());
        self.hop.error = Some(format!("{name}: {error}"));
        Err(())
    }

    /// Adds what the last step found to its line.
    fn note(&mut self, what: String) {
        if let Some(last) = self.hop.steps.last_mut() {
            last.push_str(&format!(": {what}"));
        }
    }

    fn finish(mut self, ok: bool) -> Hop {
        self.hop.ok = ok;
        self.hop.ms = self.start.elapsed().as_millis() as u64;
        self.hop
    }
}

async fn ledger_hop(url: &str, pipeline: &str, timeout: Duration) -> Hop {
    let mut s = Steps::new("ledger", redact_url(url), timeout);
    let ok = ledger_steps(&mut s, url, pipeline).await.is_ok();
    s.finish(ok)
}

async fn ledger_steps(s: &mut Steps, url: &str, pipeline: &str) -> Result<(), ()> {
    let parsed = match LedgerUrl::parse(url) {
        Ok(p) => p,
        Err(e) => return s.fail("parse the URL", with_causes(&e)),
    };
    if let LedgerUrl::Sqlite(path) = &parsed
        && !path.exists()
    {
        // The embedded default before its first run (as `deploy/install.sh` leaves it): every
        // stage creates the file, so it is fine as long as its directory takes a new file.
        return sqlite_to_be_created(s, path);
    }
    // A database client retries a refused or unresolvable server until its own timeout and
    // then says only that; a plain TCP connect first says which it was.
    if let LedgerUrl::Postgres(pg) = &parsed
        && let Some(addr) = postgres_host_port(pg)
    {
        s.step("reach the server (TCP)", async { tokio::net::TcpStream::connect(&addr).await.map(|_| ()) }).await?;
        s.note(addr);
    }
    let opts = LedgerOptions { migrate: false, ..LedgerOptions::default() };
    let ledger = s.step("connect", Ledger::connect(url, opts)).await?.with_pipeline(pipeline);
    s.note(ledger.backend_name().to_string());
    let (version, files) = s.step("write transaction (rolled back)", ledger.doctor()).await?;
    let known = ferry_ledger::SCHEMA_VERSION;
    match version {
        Some(v) if v >= known => s.note(format!("schema {v}, {files} source file(s) of pipeline {pipeline}")),
        Some(v) => {
            return s.fail("schema", format!("the ledger is at schema {v} and this binary's is {known}: run `ferry migrate`"));
        }
        None => return s.fail("schema", "the ledger has no schema: run `ferry migrate`".to_string()),
    }
    Ok(())
}

/// A SQLite ledger that does not exist yet: its directory must exist and take a new file (the
/// check writes and removes one of its own there, never the ledger itself).
fn sqlite_to_be_created(s: &mut Steps, path: &std::path::Path) -> Result<(), ()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    if !dir.is_dir() {
        return s.fail(
            "open",
            format!(
                "{} does not exist, nor does its directory {} (the stages create the file, not the directory)",
                path.display(),
                dir.display()
            ),
        );
    }
    let probe = dir.join(format!(".doctor-{}-{}.tmp", ferry_common::config::host_name(), std::process::id()));
    let created = std::fs::OpenOptions::new().write(true).create_new(true).open(&probe);
    let _ = std::fs::remove_file(&probe);
    match created {
        Ok(_) => {
            s.hop.steps.push(format!("{} not created yet: the first stage run creates it (or `ferry migrate`)", path.display()));
            Ok(())
        }
        Err(e) => s.fail("open", format!("{} does not exist and {} takes no new file: {e}", path.display(), dir.display())),
    }
}

/// `host:port` of a Postgres URL (`postgres://user:pw@host:port/db?..`); None for a URL that
/// names no host (a Unix socket), which the connect step covers alone.
fn postgres_host_port(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?']).next()?;
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if hostport.is_empty() || hostport.contains(',') {
        return None;
    }
    let has_port = hostport.rsplit_once(':').is_some_and(|(h, p)| !h.ends_with(':') && p.chars().all(|c| c.is_ascii_digit()));
    Some(if has_port && !hostport.ends_with(']') { hostport.to_string() } else { format!("{hostport}:5432") })
}

/// A store hop. `writes`: Ferry writes there, so the probe file is written, read, renamed
/// and deleted; otherwise the store is only listed.
async fn store_hop(hop: &'static str, url: &str, opts: &StoreOptions, writes: bool, timeout: Duration) -> Hop {
    let mut s = Steps::new(hop, url.to_string(), timeout);
    let ok = store_steps(&mut s, url, opts, writes).await.is_ok();
    s.finish(ok)
}

async fn store_steps(s: &mut Steps, url: &str, opts: &StoreOptions, writes: bool) -> Result<(), ()> {
    let store = match Store::open(url, opts) {
        Ok(store) => store,
        Err(e) => return s.fail("open", with_causes(&e)),
    };
    let names = s.step("list", store.children("")).await?;
    s.note(format!("{} name(s) at the top", names.len()));
    if !writes {
        return Ok(());
    }
    // A temp-style name (what gc removes once old, what listings of sources and tables skip),
    // unique per run, so two doctors never share one and one that is killed leaves litter only.
    let stamp = chrono::Utc::now().timestamp_millis();
    let base = format!(".doctor-{}-{}-{stamp}", ferry_common::config::host_name(), std::process::id());
    let probe = format!("_ferry/{base}.tmp");
    let moved = format!("_ferry/{base}.renamed.tmp");
    // Enough bytes for more than one packet and one checksum chunk, different every run.
    let bytes: Vec<u8> = (0..70_000u32).map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(stamp as u32) >> 13) as u8).collect();
    let want = blake3::hash(&bytes).to_hex().to_string();
    s.step("write", store.put_atomic(&probe, bytes.clone())).await?;
    let back = s.step("read back", store.read(&probe)).await;
    let back = match back {
        Ok(b) => b,
        Err(()) => return cleanup(s, &store, &probe).await,
    };
    if back != bytes {
        let got = blake3::hash(&back).to_hex().to_string();
        let _ = s.fail::<()>("compare", format!("read {} bytes (blake3 {got}), wrote {} (blake3 {want})", back.len(), bytes.len()));
        return cleanup(s, &store, &probe).await;
    }
    let hashed = s.step("hash on the store", store.hash(&probe)).await;
    match hashed {
        Ok((n, h)) if n == bytes.len() as u64 && h == want => s.note(format!("{n} bytes, blake3 {}", &h[..16])),
        Ok((n, h)) => {
            let _ = s.fail::<()>("hash on the store", format!("{n} bytes, blake3 {h}; wrote {} bytes, blake3 {want}", bytes.len()));
            return cleanup(s, &store, &probe).await;
        }
        Err(()) => return cleanup(s, &store, &probe).await,
    }
    match s.step("rename", store.rename_noreplace(&probe, &moved)).await {
        Ok(true) => {}
        Ok(false) => {
            let _ = s.fail::<()>("rename", format!("{} exists already", store.url(&moved)));
            return cleanup(s, &store, &probe).await;
        }
        Err(()) => return cleanup(s, &store, &probe).await,
    }
    s.step("delete", store.delete(&moved)).await?;
    let left =
        s.step("check it is gone", async { Ok::<_, ferry_storage::Error>((store.head(&moved).await?, store.head(&probe).await?)) }).await?;
    if let (Some(_), _) | (_, Some(_)) = left {
        return s.fail("check it is gone", format!("{} is still there after its delete", store.url(&moved)));
    }
    Ok(())
}

/// After a failed step: the probe file goes (best effort, bounded); the hop stays failed.
async fn cleanup(s: &mut Steps, store: &Store, probe: &str) -> Result<(), ()> {
    let _ = tokio::time::timeout(s.timeout, store.delete(probe)).await;
    Err(())
}

/// The hops for automation (`--json`).
pub fn json(hops: &[Hop]) -> serde_json::Value {
    let hops: Vec<_> = hops
        .iter()
        .map(|h| {
            serde_json::json!({
                "hop": h.hop, "url": h.url, "ok": h.ok, "ms": h.ms, "steps": h.steps, "error": h.error, "fix": h.fix,
            })
        })
        .collect();
    serde_json::json!({ "ok": hops.iter().all(|h| h["ok"] == true), "hops": hops })
}

/// The hops as lines for a terminal.
pub fn text(hops: &[Hop]) -> String {
    let mut out = String::new();
    let width = hops.iter().map(|h| h.url.len()).max().unwrap_or(0).min(60);
    for h in hops {
        let status = if h.ok { "ok" } else { "FAILED" };
        out.push_str(&format!("{status:<7} {:<12} {:<width$} {:>6} ms\n", h.hop, h.url, h.ms));
        for step in &h.steps {
            out.push_str(&format!("          {step}\n"));
        }
        if let Some(e) = &h.error {
            out.push_str(&format!("          FAILED at {e}\n"));
        }
        if let Some(f) = &h.fix {
            out.push_str(&format!("          likely fix: {f}\n"));
        }
    }
    let failed = hops.iter().filter(|h| !h.ok).count();
    out.push_str(&format!("{} hop(s): {} ok, {failed} failed\n", hops.len(), hops.len() - failed));
    out
}

#[cfg(test)]
mod tests {
    use super::postgres_host_port;

    #[test]
    fn the_server_of_a_postgres_url() {
        assert_eq!(postgres_host_port("postgres://u:p@db.example:6432/x?sslmode=require").as_deref(), Some("db.example:6432"));
        assert_eq!(postgres_host_port("postgres://u@db/x").as_deref(), Some("db:5432"));
        assert_eq!(postgres_host_port("postgresql://[::1]:5433/x").as_deref(), Some("[::1]:5433"));
        assert_eq!(postgres_host_port("postgres:///x?host=/run/postgresql"), None);
    }
}
