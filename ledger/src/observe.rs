//! What a running stage shows to the people and systems that watch it: Prometheus metrics (a
//! `/metrics` endpoint under `--watch`, a node_exporter textfile at the end of `--once`), a
//! `/healthz` check, and systemd's notify protocol (READY, the watchdog, STOPPING).
//!
//! Metrics come in two kinds. What this process did (chunks, records, bytes, attempt
//! durations, hedges) is counted where it happens with the `metrics` facade. What the ledger
//! holds (backlog per stage and state, the oldest due task, the last success, stuck leases,
//! redone work) is read from the ledger every [`LEDGER_REFRESH`] and set as gauges, so any one
//! stage reports the whole pipeline. Every name is in [`names`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use ferry_common::cli::StageArgs;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::state::FileState;
use crate::{Error, Ledger, Result};

/// How often the ledger's gauges are read again.
pub const LEDGER_REFRESH: Duration = Duration::from_secs(15);
/// The window of throughput figures (`ferry status`, progress lines).
pub const RATE_WINDOW: Duration = Duration::from_secs(300);
/// How often a `--watch` stage hands the memory it freed back to the system.
pub const TRIM_EVERY: Duration = Duration::from_secs(60);

/// Every metric Ferry exports. Labels: `stage` (extract, transform, copy, load), `outcome`,
/// `state` (a task state).
pub mod names {
    /// Chunks that ended an attempt in this process, by `stage` and `outcome` (done, retried,
    /// quarantined, lost, released).
    pub const CHUNKS: &str = "ferry_chunks_total";
    /// Records and bytes of the chunks this process finished, by `stage`.
    pub const RECORDS: &str = "ferry_records_total";
    pub const BYTES: &str = "ferry_bytes_total";
    /// How long attempts took, by `stage` and `outcome`.
    pub const ATTEMPT_SECONDS: &str = "ferry_attempt_duration_seconds";
    /// Source files extract looked at, by `outcome` (chunked, quarantined, unfinished, skipped).
    pub const FILES: &str = "ferry_files_total";
    /// Bytes sent again (counter, by stage): retried requests, lost hedges, failed attempts.
    pub const BYTES_REDONE: &str = "ferry_bytes_redone_total";
    /// Requests (a part's upload) sent again inside an attempt on a new connection.
    pub const REQUEST_RETRIES: &str = "ferry_request_retries_total";
    /// Hedged uploads started and won by copy.
    pub const HEDGES_STARTED: &str = "ferry_hedges_started_total";
    pub const HEDGES_WON: &str = "ferry_hedges_won_total";
    /// From the ledger: tasks and bytes to move per `stage` and `state`.
    pub const BACKLOG_CHUNKS: &str = "ferry_backlog_chunks";
    pub const BACKLOG_BYTES: &str = "ferry_backlog_bytes";
    /// From the ledger: how long the oldest due task of a `stage` has waited (0 when none).
    pub const OLDEST_DUE: &str = "ferry_oldest_due_seconds";
    /// From the ledger: when an attempt of a `stage` last finished its task.
    pub const LAST_SUCCESS: &str = "ferry_last_success_timestamp_seconds";
    /// From the ledger: running tasks of a `stage` whose lease has expired.
    pub const STUCK_LEASES: &str = "ferry_stuck_leases";
    /// From the ledger: attempts that did not finish their task, and the bytes they moved.
    pub const REDONE_ATTEMPTS: &str = "ferry_redone_attempts";
    pub const REDONE_BYTES: &str = "ferry_redone_bytes";
    /// From the ledger: source files set aside.
    pub const QUARANTINED_FILES: &str = "ferry_quarantined_files";
    /// 1 while this process makes progress or has nothing due; 0 when /healthz fails.
    pub const HEALTHY: &str = "ferry_healthy";
    /// Outages of a `store` this process found (it stopped claiming, then probed), and whether
    /// the store is down now, by `stage` and `store` (staging, destination, ledger).
    pub const STORE_OUTAGES: &str = "ferry_store_outages_total";
    pub const STORE_DOWN: &str = "ferry_store_down";
    /// From the ledger: outages not over yet, by `stage`.
    pub const OPEN_OUTAGES: &str = "ferry_open_outages";
    /// Textfile (--once) only: when the run ended, and its exit code.
    pub const LAST_RUN: &str = "ferry_last_run_timestamp_seconds";
    pub const LAST_EXIT: &str = "ferry_last_run_exit_code";
    /// Always 1, labelled with the `version` and the ledger `schema` this binary needs.
    pub const BUILD_INFO: &str = "ferry_build_info";
}

/// Whether the stage is alive in the sense that matters: it finishes work when work is due.
#[derive(Debug)]
pub struct Health {
    window_ms: i64,
    last_progress_ms: AtomicI64,
    idle: AtomicBool,
}

impl Health {
    pub fn new(window: Duration) -> Arc<Health> {
        Arc::new(Health { window_ms: window.as_millis() as i64, last_progress_ms: AtomicI64::new(now_ms()), idle: AtomicBool::new(true) })
    }

    /// A chunk or file finished (in any way: done, failed, given back).
    pub fn progressed(&self) {
        self.last_progress_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Nothing is due and nothing in flight: idle is healthy.
    pub fn set_idle(&self, idle: bool) {
        if idle {
            self.progressed();
        }
        self.idle.store(idle, Ordering::Relaxed);
    }

    /// Ok, or why not.
    pub fn check(&self) -> std::result::Result<(), String> {
        let quiet = now_ms() - self.last_progress_ms.load(Ordering::Relaxed);
        if self.idle.load(Ordering::Relaxed) || quiet < self.window_ms {
            Ok(())
        } else {
            Err(format!("work is due and nothing finished for {}s", quiet / 1000))
        }
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// One stage's observability, for the life of the process.
pub struct Observer {
    stage: &'static str,
    handle: Option<PrometheusHandle>,
    health: Arc<Health>,
    textfile: Option<PathBuf>,
}

impl Observer {
    /// Installs the metrics recorder if metrics are wanted (`--metrics-addr`,
    /// `--metrics-textfile`), serves `/metrics` and `/healthz`, keeps the ledger's gauges
    /// fresh, feeds systemd's watchdog while healthy, and tells systemd the stage is ready.
    pub async fn start(stage: &'static str, args: &StageArgs, ledger: &Ledger) -> Result<Observer> {
        let health = Health::new(args.health_window);
        let handle = if args.metrics_addr.is_some() || args.metrics_textfile.is_some() { Some(install(ledger.pipeline())?) } else { None };
        if let Some(dir) = &args.metrics_textfile {
            // Fail at start, not after the run, when the directory cannot take the file.
            if !dir.is_dir() {
                return Err(ferry_common::ConfigError::new("--metrics-textfile", format!("{} is not a directory", dir.display())).into());
            }
        }
        if let (Some(addr), Some(h)) = (args.metrics_addr, &handle) {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| ferry_common::ConfigError::new("--metrics-addr", format!("cannot listen on {addr}: {e}")))?;
            tracing::info!(%addr, "serving /metrics and /healthz");
            tokio::spawn(serve_http(listener, h.clone(), health.clone(), stage));
        }
        if handle.is_some() {
            let (ledger, health) = (ledger.clone(), health.clone());
            tokio::spawn(async move {
                loop {
                    refresh(&ledger, stage, &health).await;
                    tokio::time::sleep(LEDGER_REFRESH).await;
                }
            });
        }
        if let Some(every) = watchdog_interval() {
            let health = health.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    match health.check() {
                        Ok(()) => sd_notify("WATCHDOG=1"),
                        Err(why) => tracing::error!(stage, reason = %why, "unhealthy: not feeding the systemd watchdog"),
                    }
                }
            });
        }
        if args.watch {
            limit_arenas();
            tokio::spawn(async {
                loop {
                    tokio::time::sleep(TRIM_EVERY).await;
                    let _ = tokio::task::spawn_blocking(release_freed_memory).await;
                }
            });
        }
        sd_notify("READY=1");
        Ok(Observer { stage, handle, health, textfile: args.metrics_textfile.clone() })
    }

    pub fn health(&self) -> Arc<Health> {
        self.health.clone()
    }

    /// At exit: tells systemd, and writes the textfile (with the ledger's gauges as of now).
    pub async fn finish(&self, ledger: &Ledger, exit_code: i32) {
        sd_notify("STOPPING=1");
        let (Some(dir), Some(h)) = (&self.textfile, &self.handle) else { return };
        refresh(ledger, self.stage, &self.health).await;
        metrics::gauge!(names::LAST_RUN, "stage" => self.stage).set(now_ms() as f64 / 1000.0);
        metrics::gauge!(names::LAST_EXIT, "stage" => self.stage).set(exit_code as f64);
        h.run_upkeep();
        if let Err(e) = write_textfile(dir, self.stage, &h.render()) {
            tracing::error!(dir = %dir.display(), error = %e, "cannot write the metrics textfile");
        }
    }
}

/// The process-wide recorder (metrics macros are no-ops until it is installed). Every series
/// carries the `pipeline` label: several pipelines' stages may run on one host and report to
/// one Prometheus.
fn install(pipeline: &str) -> Result<PrometheusHandle> {
    // Seconds: a ledger-only attempt takes milliseconds, a big copy minutes.
    let buckets = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];
    let handle = PrometheusBuilder::new()
        .add_global_label("pipeline", pipeline)
        .set_buckets_for_metric(Matcher::Full(names::ATTEMPT_SECONDS.into()), &buckets)
        .and_then(|b| b.install_recorder())
        .map_err(|e| Error::Internal(format!("cannot set up metrics: {e}")))?;
    metrics::describe_counter!(names::CHUNKS, "Chunks that ended an attempt in this process, by stage and outcome.");
    metrics::describe_counter!(names::RECORDS, "Records of the chunks this process finished.");
    metrics::describe_counter!(names::BYTES, "Bytes of the chunks this process finished.");
    metrics::describe_histogram!(names::ATTEMPT_SECONDS, metrics::Unit::Seconds, "How long attempts took, by stage and outcome.");
    metrics::describe_counter!(names::FILES, "Source files extract looked at, by outcome.");
    metrics::describe_counter!(names::HEDGES_STARTED, "Hedged uploads started by copy.");
    metrics::describe_counter!(names::HEDGES_WON, "Hedged uploads that landed first.");
    metrics::describe_counter!(names::BYTES_REDONE, "Bytes this process sent again: retried requests, lost hedges, failed attempts.");
    metrics::describe_counter!(names::REQUEST_RETRIES, "Parts copy sent again inside an attempt, on a new connection.");
    metrics::describe_gauge!(names::BACKLOG_CHUNKS, "Tasks per stage and state, from the ledger.");
    metrics::describe_gauge!(names::BACKLOG_BYTES, "Bytes still to move per stage and state, from the ledger.");
    metrics::describe_gauge!(names::OLDEST_DUE, metrics::Unit::Seconds, "How long the oldest due task of a stage has waited.");
    metrics::describe_gauge!(names::LAST_SUCCESS, metrics::Unit::Seconds, "When an attempt of a stage last finished its task (Unix time).");
    metrics::describe_gauge!(names::STUCK_LEASES, "Running tasks whose lease has expired.");
    metrics::describe_gauge!(names::REDONE_ATTEMPTS, "Attempts that did not finish their task, from the ledger.");
    metrics::describe_gauge!(names::REDONE_BYTES, "Bytes moved by attempts that did not finish their task, from the ledger.");
    metrics::describe_gauge!(names::QUARANTINED_FILES, "Source files set aside, from the ledger.");
    metrics::describe_counter!(names::STORE_OUTAGES, "Outages of a store this process found, by stage and store.");
    metrics::describe_gauge!(names::STORE_DOWN, "1 while this process finds the store down.");
    metrics::describe_gauge!(names::OPEN_OUTAGES, "Outages not over yet, from the ledger, by stage.");
    metrics::describe_gauge!(names::HEALTHY, "1 while the stage makes progress or has nothing due.");
    metrics::describe_gauge!(names::LAST_RUN, metrics::Unit::Seconds, "When this --once run ended (Unix time).");
    metrics::describe_gauge!(names::LAST_EXIT, "The exit code of this --once run.");
    metrics::describe_gauge!(names::BUILD_INFO, "Always 1: the version and the ledger schema of this binary.");
    metrics::gauge!(names::BUILD_INFO, "version" => env!("CARGO_PKG_VERSION"), "schema" => crate::SCHEMA_VERSION.to_string()).set(1.0);
    Ok(handle)
}

/// Reads the ledger's view into gauges. A ledger that cannot be read leaves the last values
/// (and is logged): the scrape still answers.
async fn refresh(ledger: &Ledger, stage: &'static str, health: &Health) {
    metrics::gauge!(names::HEALTHY, "stage" => stage).set(if health.check().is_ok() { 1.0 } else { 0.0 });
    let o = match ledger.overview(RATE_WINDOW).await {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the ledger for metrics; keeping the last values");
            return;
        }
    };
    for s in &o.stages {
        let st = s.stage.as_str();
        // Every state, zero included, so alerts and rates see no gaps.
        for (state, c) in &s.states {
            metrics::gauge!(names::BACKLOG_CHUNKS, "stage" => st, "state" => state.as_str()).set(c.chunks as f64);
            metrics::gauge!(names::BACKLOG_BYTES, "stage" => st, "state" => state.as_str()).set(c.bytes as f64);
        }
        let waited = s.oldest_due_ms.map_or(0, |t| (o.now_ms - t).max(0));
        metrics::gauge!(names::OLDEST_DUE, "stage" => st).set(waited as f64 / 1000.0);
        if let Some(t) = s.last_success_ms {
            metrics::gauge!(names::LAST_SUCCESS, "stage" => st).set(t as f64 / 1000.0);
        }
        metrics::gauge!(names::STUCK_LEASES, "stage" => st).set(s.stuck_leases as f64);
        metrics::gauge!(names::REDONE_ATTEMPTS, "stage" => st).set(s.redone_attempts as f64);
        metrics::gauge!(names::REDONE_BYTES, "stage" => st).set(s.redone_bytes as f64);
        metrics::gauge!(names::OPEN_OUTAGES, "stage" => st).set(o.outages.iter().filter(|x| x.stage == s.stage).count() as f64);
    }
    let files = o.files.iter().find(|(s, _)| *s == FileState::Quarantined).map_or(0, |f| f.1);
    metrics::gauge!(names::QUARANTINED_FILES).set(files as f64);
}

/// `DIR/ferry_<stage>.prom`, through a temp name in the same directory: node_exporter reads
/// whole files only.
fn write_textfile(dir: &Path, stage: &str, text: &str) -> std::io::Result<()> {
    let path = dir.join(format!("ferry_{stage}.prom"));
    let tmp = dir.join(format!(".ferry_{stage}.prom.{}.tmp", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)
}

/// A deliberately small HTTP/1.1 server: GET /metrics and GET /healthz, one request per
/// connection, every read and write under a deadline.
async fn serve_http(listener: tokio::net::TcpListener, handle: PrometheusHandle, health: Arc<Health>, stage: &'static str) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let (handle, health) = (handle.clone(), health.clone());
        tokio::spawn(async move {
            let deadline = Duration::from_secs(10);
            let mut buf = vec![0u8; 4096];
            let mut n = 0;
            // The request line and headers; a client that sends nothing is dropped.
            while n < buf.len() && !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                match tokio::time::timeout(deadline, conn.read(&mut buf[n..])).await {
                    Ok(Ok(k)) if k > 0 => n += k,
                    _ => return,
                }
            }
            let line = String::from_utf8_lossy(&buf[..n]);
            let path = line.split_whitespace().nth(1).unwrap_or("");
            let (status, ctype, body) = match (line.starts_with("GET "), path) {
                (true, "/metrics") => {
                    metrics::gauge!(names::HEALTHY, "stage" => stage).set(if health.check().is_ok() { 1.0 } else { 0.0 });
                    handle.run_upkeep();
                    ("200 OK", "text/plain; version=0.0.4; charset=utf-8", handle.render())
                }
                (true, "/healthz") => match health.check() {
                    Ok(()) => ("200 OK", "text/plain", "ok\n".to_string()),
                    Err(why) => ("503 Service Unavailable", "text/plain", format!("{why}\n")),
                },
                (true, _) => ("404 Not Found", "text/plain", "try /metrics or /healthz\n".to_string()),
                _ => ("405 Method Not Allowed", "text/plain", "GET only\n".to_string()),
            };
            let head = format!("HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = tokio::time::timeout(deadline, async {
                conn.write_all(head.as_bytes()).await?;
                conn.write_all(body.as_bytes()).await?;
                conn.shutdown().await
            })
            .await;
        });
    }
}

/// glibc keeps what a thread frees in that thread's arena (up to eight arenas per core) for
/// the thread to reuse, and returns it to the system only from the top of the main heap. A
/// burst of blocking threads (a reset storm, a store outage, a backlog after a restart) leaves
/// every arena at its high-water mark for good: in a week-long service that reads as a slow
/// leak, and under a container's memory limit it ends in an OOM kill. The soak measured it: an
/// extract with 4 MB in use held 20 MB in 12 arenas, and each new burst of threads added one.
/// A service makes no new arena once it has one per core: glibc reads the limit whenever it
/// would make one, so the arenas of the threads started before this call stay (the soak saw 6
/// on 2 cores) and every thread after shares them (the per-thread caches keep the locks cold).
fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get()).max(2);
        // SAFETY: mallopt only sets a tunable read under the arenas' own lock.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, cores as libc::c_int);
        }
    }
}

/// What the arenas hold but nothing uses goes back to the system once a minute:
/// `malloc_trim` gives back every whole free page of every arena, walking the free lists.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes the arenas' own locks; it frees nothing still in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Half of systemd's watchdog interval (WATCHDOG_USEC), if systemd set one for this process.
fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    // Meant for another process (systemd names the one it watches).
    if std::env::var("WATCHDOG_PID").ok().and_then(|p| p.parse::<u32>().ok()).is_some_and(|pid| pid != std::process::id()) {
        return None;
    }
    Some(Duration::from_micros(usec / 2).max(Duration::from_millis(100)))
}

/// systemd's notify protocol: one datagram to $NOTIFY_SOCKET (nothing when it is unset, as
/// outside systemd). Failures only lose a notification, so they are logged, not returned.
pub fn sd_notify(state: &str) {
    use std::os::unix::net::UnixDatagram;
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let send = || -> std::io::Result<()> {
        let sock = UnixDatagram::unbound()?;
        let raw = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str());
        if let Some(name) = raw.strip_prefix(b"@") {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(state.as_bytes(), &addr)?;
        } else {
            sock.send_to(state.as_bytes(), &path)?;
        }
        Ok(())
    };
    if let Err(e) = send() {
        tracing::warn!(state, error = %e, "cannot notify systemd");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_while_idle_or_progressing_unhealthy_when_work_is_due_and_nothing_finishes() {
        let h = Health::new(Duration::from_millis(50));
        assert!(h.check().is_ok(), "a new stage is healthy");
        h.set_idle(false);
        h.progressed();
        assert!(h.check().is_ok(), "just finished a chunk");
        std::thread::sleep(Duration::from_millis(80));
        let why = h.check().unwrap_err();
        assert!(why.contains("work is due and nothing finished"), "{why}");
        h.set_idle(true);
        assert!(h.check().is_ok(), "nothing due is healthy, however long");
    }
}
