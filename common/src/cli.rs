//! Command-line plumbing shared by every binary: logging, the ledger flag, exit codes.

use std::io::IsTerminal;

use crate::error::Error;

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
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

/// Prints an error with its causes and picks the exit code for it.
pub fn report(e: &Error) -> i32 {
    let mut msg = format!("error: {e}");
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(&format!("\n  caused by: {s}"));
        src = s.source();
    }
    eprintln!("{msg}");
    match e {
        Error::Config { .. } | Error::LedgerUrl { .. } => exit::CONFIG,
        _ => exit::FATAL,
    }
}
