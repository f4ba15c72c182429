//! What every chunk stage runs on top of the ledger: the loop that claims tasks, runs each
//! under its lease and deadline and records how it ended ([`runner`]), the breaker that tells a
//! store that is down from chunks that are bad ([`breaker`]), and what a running stage shows:
//! metrics, `/healthz` and systemd's notify protocol ([`observe`]); the error type every stage
//! shares ([`error`]), maintenance as named sweeps ([`sweeps`]), and what the table holds of a chunk ([`table`]).
//!
//! The ledger (`ferry-ledger`) is the SQL and its states; this crate is the process around it.

pub mod breaker;
pub mod config;
pub mod error;
#[cfg(debug_assertions)]
pub mod gate;
pub mod observe;
pub mod runner;
pub mod sweeps;

pub use error::{Failure, StageError};
