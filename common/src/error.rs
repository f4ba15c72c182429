//! The one error type of `ferry-common`, and the one place that decides retry-or-not.

use std::time::Duration;

/// Whether a failure is worth another attempt.
///
/// The ledger stores this next to the error: a `transient` failure sends the task to
/// `retryable` with backoff, a `permanent` one sends it straight to `quarantined`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    Transient,
    Permanent,
}

impl ErrorClass {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Transient => "transient",
            ErrorClass::Permanent => "permanent",
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller's lease is no longer the current one: the lease expired and was reclaimed,
    /// or another worker holds a newer epoch. Its work must not be committed.
    #[error("lease lost on task {task_id} ({stage} of chunk {chunk_id}): held epoch {held_epoch}, ledger has epoch {current_epoch} in state {current_state}")]
    LeaseLost {
        task_id: i64,
        stage: String,
        chunk_id: String,
        held_epoch: i64,
        current_epoch: i64,
        current_state: String,
    },

    #[error("ledger call `{op}` did not finish within {deadline:?}")]
    LedgerTimeout { op: &'static str, deadline: Duration },

    #[error("ledger database error in `{op}`: {source}")]
    Database {
        op: &'static str,
        #[source]
        source: sqlx::Error,
    },

    /// A batched ledger write failed; every caller in the batch gets this copy of the error.
    #[error("ledger batch write failed: {message}")]
    LedgerBatch { message: String, class: ErrorClass },

    #[error("ledger migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),

    #[error("invalid ledger URL {url:?}: {reason}")]
    LedgerUrl { url: String, reason: String },

    #[error("configuration error in {file}: {message}")]
    Config { file: String, message: String },

    #[error("I/O error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// A transfer that missed its deadline or stopped making progress.
    #[error("{what}: {reason}")]
    Stalled { what: String, reason: String },

    #[error("{0}")]
    Other(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(path: impl std::fmt::Display, source: std::io::Error) -> Self {
        Error::Io { path: path.to_string(), source }
    }

    /// The single retry-or-not decision for everything in this crate.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::LedgerTimeout { .. } | Error::Stalled { .. } => ErrorClass::Transient,
            Error::LedgerBatch { class, .. } => *class,
            Error::Database { source, .. } => db_error_class(source),
            Error::Io { source, .. } => io_error_class(source),
            Error::LeaseLost { .. }
            | Error::Migrate(_)
            | Error::LedgerUrl { .. }
            | Error::Config { .. }
            | Error::Other(_) => ErrorClass::Permanent,
        }
    }

    pub fn is_transient(&self) -> bool {
        self.class() == ErrorClass::Transient
    }
}

/// I/O errors that a later attempt can plausibly get past.
pub fn io_error_class(e: &std::io::Error) -> ErrorClass {
    use std::io::ErrorKind::*;
    match e.kind() {
        NotFound | PermissionDenied | InvalidInput | InvalidData | Unsupported | AlreadyExists => {
            ErrorClass::Permanent
        }
        // Everything else (resets, timeouts, a full disk, interrupted calls) may clear up.
        _ => ErrorClass::Transient,
    }
}

/// Lost connections, pool exhaustion, SQLite lock contention and Postgres serialization or
/// shutdown errors are retried; constraint violations and bad SQL are not.
fn db_error_class(e: &sqlx::Error) -> ErrorClass {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => ErrorClass::Transient,
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

/// A stage's error as the runner needs it: a message and whether to retry.
pub trait Classified: std::fmt::Display + Send + 'static {
    fn class(&self) -> ErrorClass;
}

impl Classified for Error {
    fn class(&self) -> ErrorClass {
        Error::class(self)
    }
}
