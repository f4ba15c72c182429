//! The one error type of `ferry-ledger`, and the one place that decides retry-or-not for it.

use std::time::Duration;

use ferry_common::error::{Classified, ConfigError, ErrorClass, io_error_class};

use crate::state::{Stage, TaskState};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller's lease is no longer the current one: the lease expired and was reclaimed,
    /// or another worker holds a newer epoch. Its work must not be committed.
    #[error(
        "lease lost on task {task_id} ({stage} of chunk {chunk_id}): held epoch {held_epoch}, ledger has epoch {current_epoch} in state {}",
        current_state.map_or("missing", |s| s.as_str())
    )]
    LeaseLost {
        task_id: i64,
        stage: Stage,
        chunk_id: String,
        held_epoch: i64,
        current_epoch: i64,
        /// None: the task is gone, or its state could not be read.
        current_state: Option<TaskState>,
    },

    #[error("ledger call `{op}` did not finish within {deadline:?}")]
    Timeout { op: &'static str, deadline: Duration },

    #[error("ledger database error in `{op}`: {source}")]
    Database {
        op: &'static str,
        #[source]
        source: sqlx::Error,
    },

    /// A batched ledger write failed; every caller in the batch gets this copy of the error.
    #[error("ledger batch write failed: {message}")]
    Batch { message: String, class: ErrorClass },

    #[error("ledger migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),

    /// A bad ledger URL or configuration file.
    #[error(transparent)]
    Config(#[from] ConfigError),

    #[error("I/O error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// A value in the ledger that this binary has no name for.
    #[error(transparent)]
    Unknown(#[from] crate::state::UnknownValue),

    /// A stage's chunk work panicked or its task could not be joined: a bug, not bad input.
    #[error("{0}")]
    Internal(String),

    /// A store (or the ledger) that did not answer within the stage's wait at start.
    #[error("{0}")]
    Unreachable(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(path: impl std::fmt::Display, source: std::io::Error) -> Self {
        Error::Io { path: path.to_string(), source }
    }

    /// The single retry-or-not decision for ledger calls.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Timeout { .. } => ErrorClass::Transient,
            Error::Batch { class, .. } => *class,
            Error::Database { source, .. } => db_error_class(source),
            Error::Io { source, .. } => io_error_class(source),
            Error::LeaseLost { .. }
            | Error::Migrate(_)
            | Error::Config(_)
            | Error::Unknown(_)
            | Error::Internal(_)
            | Error::Unreachable(_) => ErrorClass::Permanent,
        }
    }

    pub fn is_transient(&self) -> bool {
        self.class() == ErrorClass::Transient
    }

    /// A TLS failure talking to the ledger (a certificate that does not verify, a name that
    /// does not match): a configuration to fix, not an outage to wait out at start.
    pub fn is_tls(&self) -> bool {
        matches!(self, Error::Database { source: sqlx::Error::Tls(_), .. })
    }

    /// The ledger's server could not be reached or dropped the connection (not a busy
    /// database or a conflict): the ledger is down while this lasts.
    pub fn is_unreachable(&self) -> bool {
        match self {
            Error::Timeout { .. } => true,
            Error::Database { source, .. } => match source {
                sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => true,
                sqlx::Error::Database(db) => {
                    let code = db.code().map(|c| c.to_string()).unwrap_or_default();
                    code.starts_with("57P") || code.starts_with("08")
                }
                _ => false,
            },
            _ => false,
        }
    }
}

impl Classified for Error {
    fn class(&self) -> ErrorClass {
        Error::class(self)
    }
    fn is_config(&self) -> bool {
        matches!(self, Error::Config(_))
    }
}

/// Lost connections, pool exhaustion, SQLite lock contention and Postgres serialization or
/// shutdown errors are retried; constraint violations and bad SQL are not.
fn db_error_class(e: &sqlx::Error) -> ErrorClass {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => {
            ErrorClass::Transient
        }
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.to_string()).unwrap_or_default();
            let transient = matches!(
                code.as_str(),
                // SQLite: SQLITE_BUSY, SQLITE_LOCKED and their extended codes
                "5" | "6" | "261" | "262" | "517" | "773"
                // Postgres: serialization, deadlock, statement timeout, connection, shutdown
                | "40001" | "40P01" | "57014" | "57P01" | "57P02" | "57P03" | "53300"
            ) || code.starts_with("08");
            if transient { ErrorClass::Transient } else { ErrorClass::Permanent }
        }
        _ => ErrorClass::Permanent,
    }
}
