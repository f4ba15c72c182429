//! Command-line plumbing shared by every binary: logging, the ledger flag, exit codes.

use std::io::IsTerminal;

use crate::error::{Classified, ConfigError};

/// Exit codes, the same for every Ferry binary.
pub mod exit {
    /// All work done.
    pub const OK: i32 = 0;
    /// A fatal error: the ledger or storage could not be reached, an I/O error, a bug.
    pub const FATAL: i32 = 1;
    /// Bad flags, bad configuration or a bad ledger URL; nothing was done.
    pub const CONFIG: i32 = 2;
    /// The run finished, but some chunks or files are quarantined (see `ferry status`).
    pub const QUARANTINED: i32 = 3;
    /// `--once` made no progress: work was due, but every attempt failed or a store (or the
    /// ledger) was down. Nothing is lost; the next run retries. The summary line says why.
    pub const NO_PROGRESS: i32 = 4;
}

pub const DEFAULT_LEDGER: &str = "sqlite://ferry-ledger.db";

/// The end of every stage binary's `--help`: exit codes and the environment it reads.
pub const STAGE_HELP: &str = "\
Exit codes:
  0  all work available was done (--once), or stopped cleanly (--watch)
  1  fatal: the ledger or a store could not be used, an I/O error, a bug; also --watch
     when the ledger or a store did not answer within --start-wait (a refused port, no
     answer: a supervisor restarts it)
  2  bad flags, configuration or ledger URL; nothing was done; also --watch when a store
     refused us at start, or did not answer within --start-wait for a reason in the
     configuration (a name that does not resolve, a certificate, credentials, Kerberos)
  3  finished, but chunks or files of this stage are quarantined (see `ferry status`)
  4  --once made no progress: work was due but every attempt failed, or a store was
     down (the summary line says why; nothing is lost, the next run retries)

Environment:
  FERRY_CONFIG              the configuration file (--config)
  FERRY_LEDGER              the ledger URL (--ledger), over ledger.url
  FERRY_<SECTION>_<KEY>     any configuration key, e.g. FERRY_COPY_CONCURRENCY=8
  FERRY_LOG_FORMAT          text or json (--log-format)
  FERRY_METRICS_ADDR        serve /metrics and /healthz here (--metrics-addr)
  FERRY_METRICS_TEXTFILE    write a node_exporter textfile here at exit (--metrics-textfile)
  FERRY_METRICS_PUSH        push metrics to this Prometheus Pushgateway at exit (--metrics-push)
  FERRY_START_WAIT          how long --watch waits for the ledger and stores at start (--start-wait)
  RUST_LOG                  log filter, e.g. info (the default), debug, ferry_storage=debug
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_PROFILE
                            S3 credentials when the store settings name none
  HADOOP_CONF_DIR, HADOOP_USER_NAME
                            HDFS client configuration and user
  NOTIFY_SOCKET, WATCHDOG_USEC
                            set by systemd for Type=notify services (--watch)";

/// The four stage binaries and what each does (their `--help`, man pages and completions).
pub const STAGES: [(&str, &str); 4] = [
    (
        "ferry-extract",
        "Take finished files from the source, split them at record boundaries into chunks, and \
         stage the chunks (cluster B) for ferry-transform. Every file and chunk is recorded in the \
         ledger; a file is never ingested twice, and a changed file is a new version.",
    ),
    (
        "ferry-transform",
        "Decode staged chunks (Avro, JSON lines, CSV) into the table's columns, apply the \
         [transform] plan, and write Parquet to the local spool for ferry-copy. Bad records go to \
         the ledger's `rejects` table; a chunk with too many is quarantined, the others flow on.",
    ),
    (
        "ferry-copy",
        "Move each transformed chunk from the local spool to the destination (cluster A): upload \
         to a temp name under a deadline and a no-progress watchdog, verify size and hash, rename \
         into place. A reset or a hung connection redoes one chunk, with backoff; the others keep \
         going.",
    ),
    (
        "ferry-load",
        "Publish each landed chunk into the table exactly once: a Hive-partitioned table \
         (<table>/<k=v>/part-<chunk>.parquet by atomic rename, with a manifest and Hive DDL under \
         <table>/_ferry/) or a Delta table (one commit to its log), and record it in the ledger. \
         Re-running publishes nothing twice.",
    ),
];

// A stage binary's command line: the flags every binary takes and the stage's own. (Not a
// doc comment: clap would take it for the binaries' about.)
#[derive(Debug, Clone, clap::Args)]
pub struct StageCli {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub stage: StageArgs,
}

/// The command of stage binary `name` (one of [`STAGES`]), at `version`: what the binary
/// parses, and what `ferry completions` and `ferry man` describe.
pub fn stage_command(name: &'static str, version: &'static str) -> clap::Command {
    let about = STAGES.iter().find(|(n, _)| *n == name).map_or("", |(_, a)| a);
    // The about after the flags: augment_args would set the struct's own.
    <StageCli as clap::Args>::augment_args(clap::Command::new(name)).version(version).about(about).after_help(STAGE_HELP)
}

/// Parses stage binary `name`'s command line (help, version and errors exit as clap does).
pub fn parse_stage(name: &'static str, version: &'static str) -> StageCli {
    let matches = stage_command(name, version).get_matches();
    <StageCli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Flags every binary takes.
#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// The work ledger: sqlite://PATH (embedded, created on first use) or postgres://USER@HOST/DB.
    /// Overrides `ledger.url` in the config file.
    #[arg(long, env = "FERRY_LEDGER", global = true)]
    pub ledger: Option<String>,

    /// Log format on stderr.
    #[arg(long, value_enum, default_value = "text", env = "FERRY_LOG_FORMAT", global = true)]
    pub log_format: LogFormat,
}

static JSON_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether logs are JSON lines (`--log-format json`): summaries then go out as log events too.
pub fn json_logs() -> bool {
    JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Sets up `tracing` on stderr; `RUST_LOG` filters (default `info`).
pub fn init_logging(format: LogFormat) {
    JSON_LOGS.store(format == LogFormat::Json, std::sync::atomic::Ordering::Relaxed);
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Json => builder.with_writer(std::io::stderr).json().init(),
        LogFormat::Text => builder.with_writer(|| OneLine(std::io::stderr())).with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

/// A text log writer that keeps every event on one line: a newline or carriage return inside
/// it (a file name or an error message that holds one) is written as `\n` / `\r`, so input
/// can never forge a log line. Each event arrives in one write, ending with its newline.
struct OneLine<W>(W);

impl<W: std::io::Write> std::io::Write for OneLine<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let (body, end) = match buf.strip_suffix(b"\n") {
            Some(b) => (b, &b"\n"[..]),
            None => (buf, &b""[..]),
        };
        if !body.iter().any(|&c| c == b'\n' || c == b'\r') {
            self.0.write_all(buf)?;
            return Ok(buf.len());
        }
        let mut out = Vec::with_capacity(buf.len() + 16);
        for &c in body {
            match c {
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                c => out.push(c),
            }
        }
        out.extend_from_slice(end);
        self.0.write_all(&out)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    #[test]
    fn a_newline_inside_a_log_event_cannot_start_a_line_of_its_own() {
        let mut out = Vec::new();
        super::OneLine(&mut out).write_all(b"WARN skipping file=\"a\nERROR forged\r\" x\n").unwrap();
        assert_eq!(out, b"WARN skipping file=\"a\\nERROR forged\\r\" x\n");
    }
}

/// Prints an error with its causes and picks the exit code for it.
pub fn report(e: &dyn Classified) -> i32 {
    let mut msg = format!("error: {e}");
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(&format!("\n  caused by: {s}"));
        src = s.source();
    }
    eprintln!("{msg}");
    if e.is_config() { exit::CONFIG } else { exit::FATAL }
}

/// Flags of the four stage binaries.
#[derive(Debug, Clone, clap::Args)]
pub struct StageArgs {
    /// The TOML file shared by all stages (see deploy/ferry.example.toml).
    #[arg(long, env = "FERRY_CONFIG")]
    pub config: std::path::PathBuf,

    /// Do the work available now, then exit (for cron). Chunks waiting for a retry's backoff
    /// are left for the next run.
    #[arg(long, conflicts_with = "watch")]
    pub once: bool,

    /// Keep polling for new work until SIGTERM (for systemd). The default.
    #[arg(long)]
    pub watch: bool,

    /// How often --watch looks for new work.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub poll: std::time::Duration,

    /// Between two polls, how often --watch asks the ledger whether the stage before has handed
    /// a chunk on (one read of an index; a claim only when there is one), so a chunk waits this
    /// long for its next stage, not a whole --poll. 0s: look only every --poll. Not for extract,
    /// whose work comes from the source store.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    pub handoff: std::time::Duration,

    /// Chunks worked on at once (overrides the stage's `concurrency` in the config).
    #[arg(long)]
    pub concurrency: Option<usize>,

    /// After SIGTERM, how long in-flight chunks may finish before their leases are released.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub grace: std::time::Duration,

    /// Serve Prometheus metrics on http://ADDR/metrics and a health check on /healthz
    /// (e.g. 127.0.0.1:9643). For --watch.
    #[arg(long, env = "FERRY_METRICS_ADDR", value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,

    /// At exit, write this run's metrics to DIR/ferry_<stage>.prom for node_exporter's textfile
    /// collector (atomically: a scrape never sees half a file). For --once.
    #[arg(long, env = "FERRY_METRICS_TEXTFILE", value_name = "DIR")]
    pub metrics_textfile: Option<std::path::PathBuf>,

    /// At exit, push this run's metrics to the Prometheus Pushgateway at URL
    /// (http://HOST:PORT[/PATH]), grouped by job "ferry_<stage>" and the pipeline: each run
    /// replaces the last one's. For --once runs nothing scrapes (Kubernetes CronJobs). A push
    /// that fails is logged; the run's exit code stays its own.
    #[arg(long, env = "FERRY_METRICS_PUSH", value_name = "URL")]
    pub metrics_push: Option<String>,

    /// /healthz fails (and the systemd watchdog is no longer fed) when the stage has had work
    /// due and finished nothing for this long. Longer than a chunk can take (copy.deadline).
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
    pub health_window: std::time::Duration,

    /// Under --watch, how long the ledger and the stage's stores may fail to answer at start
    /// before the stage exits: 2 when the error points at the configuration (a name that does
    /// not resolve, a certificate, credentials, Kerberos, a store that refuses us), 1 otherwise
    /// (a refused port, no answer: a supervisor restarts it). A store that answered at start
    /// and went away later is an outage, waited out however long it lasts.
    #[arg(long, env = "FERRY_START_WAIT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub start_wait: std::time::Duration,

    /// How often --watch logs a progress line (chunks, records, bytes, rate).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub progress_interval: std::time::Duration,
}

impl StageArgs {
    /// A stage that cannot start with this configuration (a bad URL, an unusable transform).
    pub fn config_error(&self, e: impl std::fmt::Display) -> ConfigError {
        ConfigError::new(self.config.display().to_string(), e.to_string())
    }
}

/// Runs a binary's body and exits with its code; errors are reported with their causes.
pub fn exit_with<E: Classified>(res: Result<i32, E>) -> ! {
    let code = match res {
        Ok(c) => c,
        Err(e) => report(&e),
    };
    std::process::exit(code)
}
