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

use ferry_ledger::FileState;
use ferry_ledger::{Error, Ledger, Result};

/// How often the ledger's gauges are read again.
pub const LEDGER_REFRESH: Duration = Duration::from_secs(15);
/// The window of throughput figures (`ferry status`, progress lines).
pub const RATE_WINDOW: Duration = Duration::from_secs(300);
/// How often a `--watch` stage hands the memory it freed back to the system.
pub const TRIM_EVERY: Duration = Duration::from_secs(60);

/// Declares every metric once: its constant in [`names`], its kind, unit, labels and the help
/// text the scrape shows, and its one emitter in [`emit`], which takes the labels as typed
/// arguments (`emit::chunks(Stage::Copy, "done").increment(1)`). A metric added here is
/// described by `install`; one not declared here has no emitter to call.
macro_rules! catalog {
    ($( $(#[$doc:meta])* $kind:ident $(($unit:ident))? $name:ident $emit:ident ( $($label:ident),* ) = $metric:literal, $help:literal; )*) => {
        /// Every metric Ferry exports. Labels: `stage` (extract, transform, copy, load),
        /// `outcome`, `state` (a task state), `store`.
        pub mod names {
            $( $(#[$doc])* pub const $name: &str = $metric; )*
        }

        /// Every metric's emitter: the metric with its labels set, to count, set or record.
        pub mod emit {
            #[allow(unused_imports)]
            use super::Label;
            $(
                $(#[$doc])*
                pub fn $emit($($label: impl Label),*) -> catalog!(@handle $kind) {
                    metrics::$kind!(super::names::$name $(, stringify!($label) => $label.value())*)
                }
            )*
        }

        /// Every metric's name, kind ("counter", "gauge", "histogram") and label names.
        pub const CATALOG: &[(&str, &str, &[&str])] = &[ $( ($metric, stringify!($kind), &[$(stringify!($label)),*]) ),* ];

        fn describe_all() {
            $( catalog!(@describe $kind $(($unit))? $metric, $help); )*
        }
    };
    (@handle counter) => { metrics::Counter };
    (@handle gauge) => { metrics::Gauge };
    (@handle histogram) => { metrics::Histogram };
    (@describe counter $metric:literal, $help:literal) => { metrics::describe_counter!($metric, $help) };
    (@describe gauge $metric:literal, $help:literal) => { metrics::describe_gauge!($metric, $help) };
    (@describe gauge ($unit:ident) $metric:literal, $help:literal) => { metrics::describe_gauge!($metric, metrics::Unit::$unit, $help) };
    (@describe histogram ($unit:ident) $metric:literal, $help:literal) => {
        metrics::describe_histogram!($metric, metrics::Unit::$unit, $help)
    };
}

/// A label's value: a stage, a task state, or text.
pub trait Label {
    fn value(self) -> metrics::SharedString;
}

impl Label for ferry_ledger::Stage {
    fn value(self) -> metrics::SharedString {
        self.as_str().into()
    }
}

impl Label for ferry_ledger::TaskState {
    fn value(self) -> metrics::SharedString {
        self.as_str().into()
    }
}

impl Label for &'static str {
    fn value(self) -> metrics::SharedString {
        self.into()
    }
}

impl Label for String {
    fn value(self) -> metrics::SharedString {
        self.into()
    }
}

catalog! {
    /// Chunks that ended an attempt in this process, by `stage` and `outcome` (done, retried,
    /// quarantined, lost, released).
    counter CHUNKS chunks(stage, outcome) = "ferry_chunks_total", "Chunks that ended an attempt in this process, by stage and outcome.";
    /// Records and bytes of the chunks this process finished, by `stage`.
    counter RECORDS records(stage) = "ferry_records_total", "Records of the chunks this process finished.";
    counter BYTES bytes(stage) = "ferry_bytes_total", "Bytes of the chunks this process finished.";
    /// How long attempts took, by `stage` and `outcome`.
    histogram(Seconds) ATTEMPT_SECONDS attempt_seconds(stage, outcome) = "ferry_attempt_duration_seconds", "How long attempts took, by stage and outcome.";
    /// Source files extract looked at, by `outcome` (chunked, quarantined, unfinished, skipped).
    counter FILES files(outcome) = "ferry_files_total", "Source files extract looked at, by outcome.";
    /// Bytes sent again (by stage): retried requests, lost hedges, failed attempts.
    counter BYTES_REDONE bytes_redone(stage) = "ferry_bytes_redone_total", "Bytes this process sent again: retried requests, lost hedges, failed attempts.";
    /// Requests (a part's upload) sent again inside an attempt on a new connection.
    counter REQUEST_RETRIES request_retries(stage) = "ferry_request_retries_total", "Parts copy sent again inside an attempt, on a new connection.";
    /// Hedged uploads started and won by copy.
    counter HEDGES_STARTED hedges_started() = "ferry_hedges_started_total", "Hedged uploads started by copy.";
    counter HEDGES_WON hedges_won() = "ferry_hedges_won_total", "Hedged uploads that landed first.";
    /// From the ledger: tasks and bytes to move per `stage` and `state`.
    gauge BACKLOG_CHUNKS backlog_chunks(stage, state) = "ferry_backlog_chunks", "Tasks per stage and state, from the ledger.";
    gauge BACKLOG_BYTES backlog_bytes(stage, state) = "ferry_backlog_bytes", "Bytes still to move per stage and state, from the ledger.";
    /// From the ledger: how long the oldest due task of a `stage` has waited (0 when none).
    gauge(Seconds) OLDEST_DUE oldest_due(stage) = "ferry_oldest_due_seconds", "How long the oldest due task of a stage has waited.";
    /// From the ledger: when an attempt of a `stage` last finished its task.
    gauge(Seconds) LAST_SUCCESS last_success(stage) = "ferry_last_success_timestamp_seconds", "When an attempt of a stage last finished its task (Unix time).";
    /// From the ledger: running tasks of a `stage` whose lease has expired.
    gauge STUCK_LEASES stuck_leases(stage) = "ferry_stuck_leases", "Running tasks whose lease has expired.";
    /// From the ledger: attempts that did not finish their task, and the bytes they moved.
    gauge REDONE_ATTEMPTS redone_attempts(stage) = "ferry_redone_attempts", "Attempts that did not finish their task, from the ledger.";
    gauge REDONE_BYTES redone_bytes(stage) = "ferry_redone_bytes", "Bytes moved by attempts that did not finish their task, from the ledger.";
    /// From the ledger: source files set aside.
    gauge QUARANTINED_FILES quarantined_files() = "ferry_quarantined_files", "Source files set aside, from the ledger.";
    /// 1 while this process makes progress or has nothing due; 0 when /healthz fails.
    gauge HEALTHY healthy(stage) = "ferry_healthy", "1 while the stage makes progress or has nothing due.";
    /// Outages of a `store` this process found (it stopped claiming, then probed), and whether
    /// the store is down now, by `stage` and `store` (staging, destination, ledger).
    counter STORE_OUTAGES store_outages(stage, store) = "ferry_store_outages_total", "Outages of a store this process found, by stage and store.";
    gauge STORE_DOWN store_down(stage, store) = "ferry_store_down", "1 while this process finds the store down.";
    /// From the ledger: outages not over yet, by `stage`.
    gauge OPEN_OUTAGES open_outages(stage) = "ferry_open_outages", "Outages not over yet, from the ledger, by stage.";
    /// Textfile (--once) only: when the run ended, and its exit code.
    gauge(Seconds) LAST_RUN last_run(stage) = "ferry_last_run_timestamp_seconds", "When this --once run ended (Unix time).";
    gauge LAST_EXIT last_exit(stage) = "ferry_last_run_exit_code", "The exit code of this --once run.";
    /// Always 1, labelled with the `version` and the ledger `schema` this binary needs.
    gauge BUILD_INFO build_info(version, schema) = "ferry_build_info", "Always 1: the version and the ledger schema of this binary.";
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
    push: Option<PushTarget>,
}

impl Observer {
    /// Installs the metrics recorder if metrics are wanted (`--metrics-addr`,
    /// `--metrics-textfile`), serves `/metrics` and `/healthz`, keeps the ledger's gauges
    /// fresh, feeds systemd's watchdog while healthy, and tells systemd the stage is ready.
    pub async fn start(stage: &'static str, args: &StageArgs, ledger: &Ledger) -> Result<Observer> {
        let health = Health::new(args.health_window);
        let push = args.metrics_push.as_deref().map(PushTarget::parse).transpose()?;
        let wanted = args.metrics_addr.is_some() || args.metrics_textfile.is_some() || push.is_some();
        let handle = if wanted { Some(install(ledger.pipeline())?) } else { None };
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
            // The address bound, not the one asked for: `--metrics-addr 127.0.0.1:0` takes a
            // free port, and this line says which.
            let addr = listener.local_addr().unwrap_or(addr);
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
            tokio::spawn(async {
                loop {
                    tokio::time::sleep(TRIM_EVERY).await;
                    let _ = tokio::task::spawn_blocking(release_freed_memory).await;
                }
            });
        }
        sd_notify("READY=1");
        Ok(Observer { stage, handle, health, textfile: args.metrics_textfile.clone(), push })
    }

    pub fn health(&self) -> Arc<Health> {
        self.health.clone()
    }

    /// At exit: tells systemd, and writes the textfile and pushes to the Pushgateway (with
    /// the ledger's gauges as of now).
    pub async fn finish(&self, ledger: &Ledger, exit_code: i32) {
        sd_notify("STOPPING=1");
        let Some(h) = &self.handle else { return };
        if self.textfile.is_none() && self.push.is_none() {
            return;
        }
        refresh(ledger, self.stage, &self.health).await;
        emit::last_run(self.stage).set(now_ms() as f64 / 1000.0);
        emit::last_exit(self.stage).set(exit_code as f64);
        h.run_upkeep();
        let text = h.render();
        if let Some(dir) = &self.textfile
            && let Err(e) = write_textfile(dir, self.stage, &text)
        {
            tracing::error!(dir = %dir.display(), error = %e, "cannot write the metrics textfile");
        }
        if let Some(to) = &self.push
            && let Err(e) = to.push(self.stage, ledger.pipeline(), &text).await
        {
            tracing::error!(pushgateway = %to.url, error = %e, "cannot push the metrics");
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
    describe_all();
    emit::build_info(env!("CARGO_PKG_VERSION"), ferry_ledger::SCHEMA_VERSION.to_string()).set(1.0);
    Ok(handle)
}

/// Reads the ledger's view into gauges. A ledger that cannot be read leaves the last values
/// (and is logged): the scrape still answers.
async fn refresh(ledger: &Ledger, stage: &'static str, health: &Health) {
    emit::healthy(stage).set(if health.check().is_ok() { 1.0 } else { 0.0 });
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
            emit::backlog_chunks(st, *state).set(c.chunks as f64);
            emit::backlog_bytes(st, *state).set(c.bytes as f64);
        }
        let waited = s.oldest_due_ms.map_or(0, |t| (o.now_ms - t).max(0));
        emit::oldest_due(st).set(waited as f64 / 1000.0);
        if let Some(t) = s.last_success_ms {
            emit::last_success(st).set(t as f64 / 1000.0);
        }
        emit::stuck_leases(st).set(s.stuck_leases as f64);
        emit::redone_attempts(st).set(s.redone_attempts as f64);
        emit::redone_bytes(st).set(s.redone_bytes as f64);
        emit::open_outages(st).set(o.outages.iter().filter(|x| x.stage == s.stage).count() as f64);
    }
    let files = o.files.iter().find(|(s, _)| *s == FileState::Quarantined).map_or(0, |f| f.1);
    emit::quarantined_files().set(files as f64);
}

/// A Prometheus Pushgateway (`--metrics-push`): plain HTTP, as it runs beside Prometheus
/// inside a cluster. One PUT per run, under [`PushTarget::DEADLINE`].
struct PushTarget {
    url: String,
    /// `host:port`
    authority: String,
    /// The path before `/metrics/job/...`, without a trailing slash.
    prefix: String,
}

impl PushTarget {
    /// The whole push: connect, send, read the answer. A Pushgateway that hangs costs this,
    /// never the run.
    const DEADLINE: Duration = Duration::from_secs(10);

    fn parse(url: &str) -> std::result::Result<PushTarget, ferry_common::ConfigError> {
        let bad = |why: &str| ferry_common::ConfigError::new("--metrics-push", format!("{url}: {why}"));
        let rest = url.strip_prefix("http://").ok_or_else(|| bad("want http://HOST:PORT[/PATH] (a Pushgateway speaks plain HTTP)"))?;
        let (authority, prefix) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
        let port = authority.rsplit_once(':').map(|(_, p)| p);
        if authority.is_empty() || port.is_none_or(|p| p.parse::<u16>().is_err()) {
            return Err(bad("want http://HOST:PORT[/PATH], with the port"));
        }
        let prefix = prefix.trim_end_matches('/');
        Ok(PushTarget {
            url: url.to_string(),
            authority: authority.to_string(),
            prefix: if prefix.is_empty() { String::new() } else { format!("/{prefix}") },
        })
    }

    /// PUT: the group (job `ferry_<stage>`, the pipeline) becomes exactly these metrics.
    async fn push(&self, stage: &str, pipeline: &str, text: &str) -> std::io::Result<()> {
        let path = format!("{}/metrics/job/ferry_{}/pipeline/{}", self.prefix, escape(stage), escape(pipeline));
        let head = format!(
            "PUT {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.authority,
            text.len()
        );
        let exchange = async {
            let mut s = tokio::net::TcpStream::connect(&self.authority).await?;
            s.write_all(head.as_bytes()).await?;
            s.write_all(text.as_bytes()).await?;
            // The status line and a little of the reason; nothing more is needed or trusted.
            let mut answer = Vec::with_capacity(512);
            (&mut s).take(4096).read_to_end(&mut answer).await?;
            let text = String::from_utf8_lossy(&answer);
            let status = text.split(' ').nth(1).unwrap_or("");
            if status.starts_with('2') {
                Ok(())
            } else {
                let body = text.split("\r\n\r\n").nth(1).unwrap_or("").trim();
                Err(std::io::Error::other(format!("PUT {path}: {} {body}", text.lines().next().unwrap_or("no answer"))))
            }
        };
        tokio::time::timeout(Self::DEADLINE, exchange)
            .await
            .unwrap_or_else(|_| Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no answer within {:?}", Self::DEADLINE))))
    }
}

/// A path segment as the Pushgateway reads it: letters, digits and `_.-~` as they are, any
/// other byte percent-encoded.
fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"_.-~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
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
                    emit::healthy(stage).set(if health.check().is_ok() { 1.0 } else { 0.0 });
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

/// Runs a stage's `main` on a multi-thread runtime. A `--watch` service first caps glibc's
/// arenas at one per core, before the runtime starts any thread.
///
/// glibc keeps what a thread frees in that thread's arena (up to eight arenas per core) for
/// the thread to reuse, and returns it to the system only from the top of the main heap. A
/// burst of blocking threads (a reset storm, a store outage, a backlog after a restart) leaves
/// every arena at its high-water mark for good: in a week-long service that reads as a slow
/// leak, and under a container's memory limit it ends in an OOM kill. The soak measured it: an
/// extract with 4 MB in use held 20 MB in 12 arenas, and each new burst of threads added one.
/// glibc reads the cap whenever it would make an arena, so it must be set before the first
/// threads exist: set later, the arenas those threads made stay (the soak saw 6 on 2 cores).
/// Threads share the capped arenas; their per-thread caches keep the arenas' locks cold.
/// A `--once` run is short and its memory goes back at exit: it keeps glibc's defaults.
///
/// SIGTERM and SIGINT are caught from the runtime's first moment (see
/// [`crate::runner::shutdown_signal`]): a stage told to stop while it starts stops cleanly.
pub fn block_on<F: std::future::Future>(watch: bool, main: F) -> F::Output {
    if watch {
        limit_arenas();
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            // Nothing ran yet: no ledger, no store. Out of threads or file descriptors.
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1)
        }
    };
    rt.block_on(async {
        // Before anything else: a stop signal during start-up is then a clean stop.
        crate::runner::catch_stop_signals();
        main.await
    })
}

fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get()).max(2);
        // SAFETY: mallopt only sets a tunable; no thread but this one exists yet.
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

    /// Prometheus' conventions, and the shipped alert rules and dashboard use only metrics the
    /// catalog declares (a renamed metric would leave an alert that can never fire).
    #[test]
    fn the_catalog_follows_the_conventions_and_covers_what_is_shipped() {
        let mut seen = std::collections::HashSet::new();
        for &(name, kind, _) in CATALOG {
            assert!(seen.insert(name), "{name} declared twice");
            assert!(name.starts_with("ferry_"), "{name}");
            assert_eq!(kind == "counter", name.ends_with("_total"), "{name}: counters and only counters end in _total");
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for file in ["deploy/prometheus/alerts.yml", "deploy/grafana/ferry-dashboard.json"] {
            let text = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            let used = text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("ferry_"));
            for w in used {
                let base = ["_bucket", "_sum", "_count"].iter().fold(w, |w, s| w.strip_suffix(s).unwrap_or(w));
                assert!(seen.contains(base) || seen.contains(w), "{file} uses {w}, which no stage exports");
            }
        }
    }

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
