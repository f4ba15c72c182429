//! The ledger's vocabularies as types: stages, task states, file states, attempt outcomes.
//! Each maps to the text stored in SQL in exactly one place, its `as_str`; the migrations'
//! CHECK lists and triggers are tested against these (`tests/schema.rs`).
//!
//! Adding a state: add the variant here (the compiler then shows every `match` to extend),
//! add it to the CHECK list of both migration sets in a new migration, and say in the design
//! note at the top of `lib.rs` which transitions lead in and out of it.

/// A value read from the ledger that no variant stands for (a newer binary's state, a
/// hand-written UPDATE).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?} in the ledger")]
pub struct UnknownValue {
    pub what: &'static str,
    pub value: String,
}

/// Defines a fieldless enum stored as text: `as_str`, `ALL`, `FromStr`, `TryFrom<String>`
/// (for `sqlx::FromRow`) and `Display`.
macro_rules! sql_enum {
    ($(#[$meta:meta])* $name:ident, $what:literal { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The text stored in the ledger.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl std::str::FromStr for $name {
            type Err = UnknownValue;
            fn from_str(s: &str) -> Result<Self, UnknownValue> {
                $name::ALL
                    .iter()
                    .copied()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| UnknownValue { what: $what, value: s.to_string() })
            }
        }

        impl TryFrom<String> for $name {
            type Error = UnknownValue;
            fn try_from(s: String) -> Result<Self, UnknownValue> {
                s.parse()
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

sql_enum! {
    /// A pipeline stage that works on chunks through tasks, in pipeline order. (Extract works
    /// on source files.)
    Stage, "stage" {
        Transform = "transform",
        Copy = "copy",
        Load = "load",
    }
}

impl Stage {
    /// The stage a chunk goes to when this one is done; the `tasks_on_done` trigger of both
    /// migration sets encodes the same order.
    pub fn next(self) -> Option<Stage> {
        match self {
            Stage::Transform => Some(Stage::Copy),
            Stage::Copy => Some(Stage::Load),
            Stage::Load => None,
        }
    }
}

sql_enum! {
    /// Where a task is in its life; see the state diagram in the crate's design note.
    TaskState, "task state" {
        /// Waiting to be claimed (new, released, or requeued).
        Available = "available",
        /// Claimed: a worker holds its lease.
        Running = "running",
        /// Failed transiently or its lease expired; claimable again once `scheduled_at` passes.
        Retryable = "retryable",
        Done = "done",
        /// Failed for good; only an operator sends it back.
        Quarantined = "quarantined",
    }
}

impl TaskState {
    /// States a claim takes tasks from (with `scheduled_at <= now`).
    pub const DUE: [TaskState; 2] = [TaskState::Available, TaskState::Retryable];
    /// States of a task that is not finished yet.
    pub const PENDING: [TaskState; 3] = [TaskState::Available, TaskState::Running, TaskState::Retryable];

    /// Terminal: `finalized_at` is set exactly for these (a CHECK constraint).
    pub fn is_final(self) -> bool {
        matches!(self, TaskState::Done | TaskState::Quarantined)
    }
}

sql_enum! {
    /// Where a source file is: extract registers it, then records its chunks or quarantines it.
    FileState, "file state" {
        Registered = "registered",
        Chunked = "chunked",
        Quarantined = "quarantined",
    }
}

sql_enum! {
    /// How a lease ended, one row of `attempts` each.
    AttemptOutcome, "attempt outcome" {
        Done = "done",
        Retryable = "retryable",
        Quarantined = "quarantined",
        LeaseExpired = "lease_expired",
        Released = "released",
    }
}

sql_enum! {
    /// What a chunk's range counts (`chunks.range_kind`).
    RangeKind, "range kind" {
        Bytes = "bytes",
        Records = "records",
    }
}

/// The SQL list of `states`, e.g. `('available', 'retryable')`.
pub fn sql_list(states: &[TaskState]) -> String {
    let items: Vec<String> = states.iter().map(|s| format!("'{}'", s.as_str())).collect();
    format!("({})", items.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trips_and_unknown_values_are_named() {
        for s in TaskState::ALL {
            assert_eq!(s.as_str().parse::<TaskState>(), Ok(*s));
        }
        for s in FileState::ALL {
            assert_eq!(s.to_string().parse::<FileState>(), Ok(*s));
        }
        for s in AttemptOutcome::ALL {
            assert_eq!(AttemptOutcome::try_from(s.as_str().to_string()), Ok(*s));
        }
        let e = "copyy".parse::<Stage>().unwrap_err();
        assert_eq!(e.to_string(), "unknown stage \"copyy\" in the ledger");
        assert_eq!(Stage::ALL.iter().filter_map(|s| s.next()).collect::<Vec<_>>(), vec![Stage::Copy, Stage::Load]);
        assert_eq!(sql_list(&TaskState::DUE), "('available', 'retryable')");
        assert!(TaskState::ALL.iter().all(|s| s.is_final() == matches!(s, TaskState::Done | TaskState::Quarantined)));
    }
}
