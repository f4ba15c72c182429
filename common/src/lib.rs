//! What every Ferry crate shares: the configuration, the paths Ferry writes, error classes,
//! Hive quoting and the command-line plumbing. Nothing here talks to a store or the ledger.

pub mod cli;
pub mod config;
pub mod crash;
pub mod error;
pub mod hive;
pub mod paths;

pub use error::{Classified, ConfigError, ErrorClass};
