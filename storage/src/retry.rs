//! Capped, jittered backoff for the few retry loops storage and copy run themselves (a request
//! that failed before it was sent, a small write, a part resent on a new connection), and the
//! loop storage's own share.

use std::time::Duration;

use crate::error::{Error, Result};

/// Delays that double from `first` up to `cap`, each drawn from [d/2, d] ("equal jitter"): many
/// workers that failed together do not come back together, and none retries at once.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    cap: Duration,
    state: u64,
}

impl Backoff {
    pub fn new(first: Duration, cap: Duration) -> Backoff {
        // Seeded per loop from the clock and a counter; this only spreads retries out.
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos() as u64);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Backoff { next: first, cap, state: (nanos ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1 }
    }

    /// The next delay to wait.
    pub fn next_delay(&mut self) -> Duration {
        // xorshift64: enough randomness for jitter, no dependency.
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        let d = self.next.min(self.cap);
        self.next = (self.next * 2).min(self.cap);
        let frac = (self.state % 1000) as f64 / 1000.0;
        d / 2 + d.mul_f64(frac / 2.0)
    }
}

/// Runs `f` until it succeeds or fails in a way `again` does not allow, sending it again at
/// most `resends` times (and not after `until`), with [`Backoff`] from `first` up to 2 s between.
/// Each resend is logged with `what`. The one loop behind storage's own retries.
pub(crate) async fn resending<T, Fut>(
    what: &str,
    resends: usize,
    first: Duration,
    until: Option<tokio::time::Instant>,
    again: impl Fn(&Error) -> bool,
    mut f: impl FnMut() -> Fut,
) -> Result<T>
where
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut backoff = Backoff::new(first, Duration::from_secs(2));
    let mut tries = 0;
    loop {
        match f().await {
            Err(e) if tries < resends && until.is_none_or(|u| tokio::time::Instant::now() < u) && again(&e) => {
                tries += 1;
                let d = backoff.next_delay();
                tracing::info!(error = %e, try_ = tries, retry_in = ?d, "{what} failed; sending it again");
                tokio::time::sleep(d).await;
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_to_the_cap_with_jitter() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let d: Vec<Duration> = (0..8).map(|_| b.next_delay()).collect();
        assert!(d[0] >= Duration::from_millis(50) && d[0] <= Duration::from_millis(100), "{d:?}");
        assert!(d[2] >= Duration::from_millis(200) && d[2] <= Duration::from_millis(400), "{d:?}");
        assert!(d.iter().all(|x| *x <= Duration::from_secs(1)), "capped: {d:?}");
        assert!(d[7] >= Duration::from_millis(500), "{d:?}");
    }
}
