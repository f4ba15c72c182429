//! What every Ferry error shares: whether a retry can help, and whether it is the user's
//! configuration. Each crate has one error type of its own and one `class()` that decides
//! retry-or-not for it; this module holds only the vocabulary they share.

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
    pub const ALL: [ErrorClass; 2] = [ErrorClass::Transient, ErrorClass::Permanent];

    /// The value stored in the ledger's `error_class` columns.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Transient => "transient",
            ErrorClass::Permanent => "permanent",
        }
    }
}

/// An error as the stage runner and the binaries need it.
pub trait Classified: std::error::Error + Send + 'static {
    /// Retry or not: the one decision per error type.
    fn class(&self) -> ErrorClass;

    /// Bad flags, configuration or ledger URL: the binary exits with
    /// [`crate::cli::exit::CONFIG`] instead of [`crate::cli::exit::FATAL`].
    fn is_config(&self) -> bool {
        false
    }

    /// The store a transient failure is about (`staging`, `destination`, `ledger`), if it is
    /// one: failures of every chunk on one store, with no success between them, mean the store
    /// is down rather than the chunks broken.
    fn store(&self) -> Option<&'static str> {
        None
    }

    /// Not a failure of the chunk but a wait for others (a corrected file's version waits for
    /// all of its chunks): the task is looked at again after this long, without the attempt
    /// counting toward `max_attempts`.
    fn waits(&self) -> Option<std::time::Duration> {
        None
    }
}

/// A configuration the binaries cannot work with; `file` names the file, flag or URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration error in {file}: {message}")]
pub struct ConfigError {
    pub file: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(file: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError { file: file.into(), message: message.into() }
    }
}

impl Classified for ConfigError {
    fn class(&self) -> ErrorClass {
        ErrorClass::Permanent
    }
    fn is_config(&self) -> bool {
        true
    }
}

/// I/O errors that a later attempt can plausibly get past.
pub fn io_error_class(e: &std::io::Error) -> ErrorClass {
    use std::io::ErrorKind::*;
    match e.kind() {
        NotFound | PermissionDenied | InvalidInput | InvalidData | Unsupported | AlreadyExists => ErrorClass::Permanent,
        // Everything else (resets, timeouts, a full disk, interrupted calls) may clear up.
        _ => ErrorClass::Transient,
    }
}
