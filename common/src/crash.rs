//! Debug builds only: `FERRY_TEST_CRASH_AT=N` kills the process with SIGKILL (what `kill -9`
//! does: no destructor runs, nothing is flushed) at the N-th step of its work. A step is a
//! ledger call begun or answered, or a storage operation begun or ended. Tests that kill a
//! stage at a point of its progress, rather than after some milliseconds, see the same kill
//! when they run the same history again. Release builds have no crash points.

#[cfg(debug_assertions)]
mod imp {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    static AT: OnceLock<Option<u64>> = OnceLock::new();
    static STEPS: AtomicU64 = AtomicU64::new(0);

    pub fn point(what: &str) {
        let Some(at) = *AT.get_or_init(|| std::env::var("FERRY_TEST_CRASH_AT").ok().and_then(|v| v.parse().ok())) else {
            return;
        };
        if STEPS.fetch_add(1, Ordering::SeqCst) + 1 == at {
            eprintln!("FERRY_TEST_CRASH_AT: killed at step {at} ({what})");
            // SAFETY: kill(2) on our own pid with a valid signal number has no preconditions.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
    }
}

/// Kills the process with SIGKILL now (debug builds only: a test's gate asked for it).
#[cfg(debug_assertions)]
pub fn kill_now(what: &str) {
    eprintln!("FERRY_TEST: killed {what}");
    // SAFETY: kill(2) on our own pid with a valid signal number has no preconditions.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
}

/// Release builds: nothing (no test gate exists there).
#[cfg(not(debug_assertions))]
pub fn kill_now(_what: &str) {}

/// A step of the process's work, where a test may kill it (debug builds only).
#[cfg(debug_assertions)]
pub fn point(what: &str) {
    imp::point(what)
}

/// A step of the process's work (release builds: nothing).
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn point(_what: &str) {}
