//! What the `ferry` admin binary does beyond calling the ledger: the sample generator, and
//! the one error type of the admin commands.

pub mod doctor;
pub mod sample;
pub mod status;

use ferry_common::error::{Classified, ConfigError, ErrorClass};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Ledger(#[from] ferry_ledger::Error),
    #[error(transparent)]
    Storage(#[from] ferry_storage::Error),
    /// What load's own checks answer (`ferry skip` looks at the table through them).
    #[error(transparent)]
    Load(#[from] ferry_load::LoadError),
    #[error("I/O error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub fn io(path: impl std::fmt::Display, source: std::io::Error) -> Self {
        Error::Io { path: path.to_string(), source }
    }
}

impl Classified for Error {
    fn class(&self) -> ErrorClass {
        match self {
            Error::Config(e) => e.class(),
            Error::Ledger(e) => e.class(),
            Error::Storage(e) => e.class(),
            Error::Load(e) => e.class(),
            Error::Io { source, .. } => ferry_common::error::io_error_class(source),
        }
    }
    fn is_config(&self) -> bool {
        match self {
            Error::Config(_) => true,
            Error::Ledger(e) => e.is_config(),
            Error::Storage(e) => e.is_config(),
            Error::Load(e) => e.is_config(),
            Error::Io { .. } => false,
        }
    }
}
