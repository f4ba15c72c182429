//! What the `ferry` admin binary does beyond calling the ledger: the sample generator, and
//! the one error type of the admin commands.

pub mod doctor;
pub mod sample;
pub mod status;

use ferry_common::error::ErrorClass;
use ferry_runtime::{Failure, StageError};

/// The admin commands' error: the kinds every stage shares ([`StageError`], with its one rule
/// for retry-or-not).
pub type Error = StageError<AdminFailure>;

/// The admin commands meet nothing the stages do not: what the table refuses is the table's.
#[derive(Debug, thiserror::Error)]
pub enum AdminFailure {
    #[error(transparent)]
    Table(ferry_table::TableFailure),
}

impl Failure for AdminFailure {
    const STORE: &'static str = "destination";
    fn class(&self) -> ErrorClass {
        match self {
            AdminFailure::Table(f) => f.class(),
        }
    }
}

/// A table operation's error as the admin command's.
pub fn from_table(e: ferry_table::TableError) -> Error {
    e.map_stage(AdminFailure::Table)
}
