//! Every stage's error type: what all stages meet (their configuration, the ledger, a store,
//! local files, a bug) written once, with one rule for retry-or-not, and each stage's own
//! failures beside it (`F`).
//!
//! The class rule, in one place:
//! - the ledger's and the stores' errors keep the class their crate gave them;
//! - local I/O is transient unless the error says retrying cannot help (not found, no
//!   permission, bad data: [`io_error_class`]);
//! - a bug in Ferry (`Internal`) is permanent: the same input meets it again;
//! - a panic is transient: the attempt fails with the panic's text, and the chunk is
//!   quarantined once its attempts are used up (a panic can come from the moment, not the
//!   input);
//! - a stage's own failures say their class themselves ([`Failure::class`]).

use std::time::Duration;

use ferry_common::error::{Classified, ConfigError, ErrorClass, io_error_class};

/// A stage's own failures (a bad input, a conflict in the table, a part missing): what only
/// that stage can meet.
pub trait Failure: std::error::Error + Send + Sync + 'static {
    /// The store this stage's storage errors are about (`staging`, `destination`): failures
    /// of every chunk on it, with no success between them, mean it is down (see the breaker).
    const STORE: &'static str;

    /// Retry or not.
    fn class(&self) -> ErrorClass;

    /// The store a transient failure of this kind is about, if any.
    fn store(&self) -> Option<&'static str> {
        None
    }

    /// Not a failure but a wait for other chunks (see [`Classified::waits`]).
    fn waits(&self) -> Option<Duration> {
        None
    }

    /// The configuration does not fit (the binary exits with the configuration code).
    fn is_config(&self) -> bool {
        false
    }
}

/// A stage's error: the shared kinds, and the stage's own failures in `Stage`.
#[derive(Debug, thiserror::Error)]
pub enum StageError<F: Failure> {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Ledger(#[from] ferry_ledger::Error),
    #[error(transparent)]
    Storage(#[from] ferry_storage::Error),
    /// Local files: a source file read part-way, the spool (a full disk, a vanished directory).
    #[error("I/O error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A bug in Ferry, met by this input.
    #[error("internal: {0}")]
    Internal(String),
    /// Ferry panicked while working on this input.
    #[error("panicked: {0}")]
    Panicked(String),
    #[error(transparent)]
    Stage(F),
}

impl<F: Failure> StageError<F> {
    pub fn internal(e: impl std::fmt::Display) -> Self {
        StageError::Internal(e.to_string())
    }

    pub fn io(path: impl std::fmt::Display, source: std::io::Error) -> Self {
        StageError::Io { path: path.to_string(), source }
    }

    /// The same error with its own failure turned into another stage's (`F` into `G`): an
    /// admin command that calls the table reports the table's failure as it is.
    pub fn map_stage<G: Failure>(self, f: impl FnOnce(F) -> G) -> StageError<G> {
        match self {
            StageError::Config(e) => StageError::Config(e),
            StageError::Ledger(e) => StageError::Ledger(e),
            StageError::Storage(e) => StageError::Storage(e),
            StageError::Io { path, source } => StageError::Io { path, source },
            StageError::Internal(e) => StageError::Internal(e),
            StageError::Panicked(e) => StageError::Panicked(e),
            StageError::Stage(s) => StageError::Stage(f(s)),
        }
    }

    /// Whether a later try may get past it.
    pub fn is_transient(&self) -> bool {
        self.class() == ErrorClass::Transient
    }

    /// What a cleanup that failed part-way had removed already.
    pub fn removed(&self) -> usize {
        match self {
            StageError::Storage(e) => e.removed(),
            _ => 0,
        }
    }

    /// A blocking task that did not finish: its panic, or the runtime going away.
    pub fn joined(e: tokio::task::JoinError) -> Self {
        match e.try_into_panic() {
            Ok(panic) => StageError::Panicked(crate::runner::panic_message(&panic)),
            Err(e) => StageError::Internal(e.to_string()),
        }
    }
}

/// How soon a chunk that found its store unavailable (an HDFS NameNode in safe mode) is
/// looked at again.
pub const UNAVAILABLE_WAIT: Duration = Duration::from_secs(5);

/// A stage's own failure is its error: `Err(LoadFailure::Conflict(..).into())`, or `?`.
impl<F: Failure> From<F> for StageError<F> {
    fn from(f: F) -> Self {
        StageError::Stage(f)
    }
}

impl<F: Failure> Classified for StageError<F> {
    fn class(&self) -> ErrorClass {
        match self {
            StageError::Config(e) => e.class(),
            StageError::Ledger(e) => e.class(),
            StageError::Storage(e) => e.class(),
            StageError::Io { source, .. } => io_error_class(source),
            StageError::Internal(_) => ErrorClass::Permanent,
            StageError::Panicked(_) => ErrorClass::Transient,
            StageError::Stage(f) => f.class(),
        }
    }

    fn store(&self) -> Option<&'static str> {
        match self {
            StageError::Storage(_) => Some(F::STORE),
            StageError::Ledger(e) if e.is_transient() => Some("ledger"),
            StageError::Stage(f) => f.store(),
            _ => None,
        }
    }

    fn waits(&self) -> Option<Duration> {
        match self {
            StageError::Stage(f) => f.waits(),
            // Looked at again soon, its attempt not counted: three attempts in safe mode would
            // quarantine a chunk that only had to wait for the NameNode.
            StageError::Storage(e) if e.is_unavailable() => Some(UNAVAILABLE_WAIT),
            _ => None,
        }
    }

    fn is_config(&self) -> bool {
        match self {
            StageError::Config(_) => true,
            StageError::Ledger(e) => e.is_config(),
            StageError::Storage(e) => e.is_config(),
            StageError::Stage(f) => f.is_config(),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("own")]
    struct Own;

    impl Failure for Own {
        const STORE: &'static str = "destination";
        fn class(&self) -> ErrorClass {
            ErrorClass::Transient
        }
    }

    #[test]
    fn one_rule_for_every_stage() {
        type E = StageError<Own>;
        assert_eq!(E::internal("a bug").class(), ErrorClass::Permanent);
        assert_eq!(E::Panicked("boom".into()).class(), ErrorClass::Transient);
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        assert_eq!(E::io("/spool/x", full).class(), ErrorClass::Transient);
        let gone = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(E::io("/spool/x", gone).class(), ErrorClass::Permanent);
        assert_eq!(E::Stage(Own).class(), ErrorClass::Transient);
        let cfg = E::from(ConfigError { file: "ferry.toml".into(), message: "bad".into() });
        assert!(cfg.is_config());
        assert_eq!(cfg.store(), None);
    }
}
