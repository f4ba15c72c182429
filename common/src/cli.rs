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
}

pub const DEFAULT_LEDGER: &str = "sqlite://ferry-ledger.db";

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

/// Sets up `tracing` on stderr; `RUST_LOG` filters (default `info`).
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
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

    /// Chunks worked on at once (overrides the stage's `concurrency` in the config).
    #[arg(long)]
    pub concurrency: Option<usize>,

    /// After SIGTERM, how long in-flight chunks may finish before their leases are released.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub grace: std::time::Duration,
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
