//! What every Ferry stage shares: the work ledger, errors, time, and the command-line plumbing.

pub mod cli;
pub mod clock;
pub mod config;
pub mod error;
pub mod ledger;
pub mod runner;
pub mod sample;
pub mod storage;

pub use error::{Error, ErrorClass, Result};
pub use ledger::{Lease, Ledger, LedgerOptions, Stage};
