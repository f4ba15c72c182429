//! Telling a sick store from a sick chunk.
//!
//! A stage's chunks fail for two different reasons: the chunk is bad (or unlucky), or the store
//! it goes to is down. Only the first should spend the chunk's attempts; an outage of the
//! destination (a NameNode restart, an S3 maintenance window, a dead VPN link) would otherwise
//! quarantine every chunk in flight within minutes and stop the pipeline until an operator
//! requeues them.
//!
//! ```text
//!            transient failure on store S (streak of failures, no success in between)
//!   up ──────────────────────────────────────────────────────────────────────► down
//!    ▲   streak of TRIP failures from at least two different chunks               │
//!    │                                                                             │ claims stop;
//!    │   a chunk succeeds (the probe, or one still in flight)                      │ one probe claim
//!    └─────────────────────────────────────────────────────────────────────────────┘ after capped,
//!                                                                                    jittered backoff
//! ```
//!
//! When the store goes down, the streak's attempts are given back and the outage is recorded
//! once in the ledger (`outages`); every failure while it is down is not counted and is
//! retried at the next probe. A chunk that keeps failing on its own while other chunks go
//! through never trips the breaker (its streak is broken by their successes, and one chunk
//! alone is not a streak), so it is still quarantined after `max_attempts`. The state is per
//! process: several workers that find one store down share its ledger row.
//!
//! A store with a probe of its own (a cheap call that needs no chunk: `Store::probe`) is told
//! apart by asking it instead of counting chunks: a transient failure is followed by a probe;
//! the store is down when the probe fails too (one lone chunk is enough), and the chunk's own
//! failure when it answers (two chunks too large for their deadline are that: counted, and in
//! the end quarantined, never an outage for ever). While such a store is down no chunk is
//! claimed at all; the probe runs on the schedule, and the first answer ends the outage.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Failures in a row, from at least two chunks, that make a store "down".
pub const TRIP: usize = 3;

/// The waits between tries at something that is down (a store, the ledger): from `first`
/// doubling to `cap`, never giving up. Every outage wait in Ferry uses this one schedule.
pub fn probe_schedule(first: Duration, cap: Duration) -> ProbeSchedule {
    let cap = cap.max(first);
    ProbeSchedule { step: first, cap }
}

/// [`probe_schedule`]'s waits. Each is "equally jittered": between half its step and the step,
/// so that many workers do not try in step and none tries at once, and no wait is ever longer
/// than the cap (backon's jitter adds up to a whole step on top, which would make a 4 s cap
/// an 8 s one).
#[derive(Debug, Clone)]
pub struct ProbeSchedule {
    step: Duration,
    cap: Duration,
}

impl Iterator for ProbeSchedule {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let step = self.step;
        self.step = (self.step * 2).min(self.cap);
        let half = step / 2;
        Some(half + half.mul_f64(rand::random::<f64>()))
    }
}

/// What to do with one failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A failure like any other: it counts toward `max_attempts`.
    Counted,
    /// The store has just been found down: give back these earlier attempts (task, epoch),
    /// record the outage, and retry this one at the first probe.
    Tripped { refund: Vec<(i64, i64)>, retry_at: Instant },
    /// The store is still down: not counted, retried at the next probe. `probe`: this failure
    /// came at or after the probe's time (it was the probe, or as good as one), so the schedule
    /// moved on; a chunk that was already in flight when the store went down leaves it as it is.
    StillDown { retry_at: Instant, probes: u64, probe: bool },
}

#[derive(Debug)]
struct Down {
    since: Instant,
    probes: u64,
    next_probe: Instant,
    backoff: ProbeSchedule,
}

#[derive(Debug, Default)]
struct Store {
    /// Failed attempts (task, epoch) since the last success.
    streak: Vec<(i64, i64)>,
    chunks: std::collections::HashSet<i64>,
    down: Option<Down>,
    /// Down on the word of its own probe: probed again by the same, not by a chunk.
    probed: bool,
}

/// The breakers of one stage process, one per store its chunks go to.
#[derive(Debug)]
pub struct Breakers {
    cap: Duration,
    stores: HashMap<&'static str, Store>,
}

impl Breakers {
    /// `cap`: the longest wait between probes of a store that is down.
    pub fn new(cap: Duration) -> Breakers {
        Breakers { cap, stores: HashMap::new() }
    }

    fn backoff(&self) -> ProbeSchedule {
        probe_schedule(Duration::from_secs(1), self.cap)
    }

    /// A transient failure of task `(id, epoch)` on `store`.
    pub fn failed(&mut self, store: &'static str, task: (i64, i64)) -> Verdict {
        let cap = self.backoff();
        let s = self.stores.entry(store).or_default();
        let now = Instant::now();
        if let Some(d) = &mut s.down {
            // Only a failure at or after the probe's time says anything new: the chunks that
            // were in flight when the store went down fail in a burst right after the trip,
            // and moving the schedule on for each of them would push the next probe (and the
            // retry of every waiting chunk) out to the cap within seconds. A `--watch` stage
            // is woken by the first answer, but a cron-run `--once` stage would find its
            // chunks waiting on that inflated time.
            let probe = now >= d.next_probe;
            if probe {
                d.probes += 1;
                let wait = d.backoff.next().unwrap_or(Duration::from_secs(1));
                d.next_probe = now + wait;
            }
            return Verdict::StillDown { retry_at: d.next_probe, probes: d.probes, probe };
        }
        s.streak.push(task);
        s.chunks.insert(task.0);
        if s.streak.len() < TRIP || s.chunks.len() < 2 {
            return Verdict::Counted;
        }
        let mut backoff = cap;
        let next_probe = now + backoff.next().unwrap_or(Duration::from_secs(1));
        s.down = Some(Down { since: now, probes: 0, next_probe, backoff });
        s.chunks.clear();
        // The last failure is the one that tripped: it is given back by not being counted.
        let mut refund = std::mem::take(&mut s.streak);
        refund.pop();
        Verdict::Tripped { refund, retry_at: next_probe }
    }

    /// A transient failure of task `(id, epoch)` on `store`, after the store's own probe
    /// answered (`store_answers`) or not: down only when the probe failed too.
    pub fn failed_probed(&mut self, store: &'static str, task: (i64, i64), store_answers: bool) -> Verdict {
        if self.is_down(store) {
            return self.failed(store, task);
        }
        let cap = self.backoff();
        let s = self.stores.entry(store).or_default();
        if store_answers {
            // The chunk's own failure: it counts, and says nothing of the store.
            s.streak.clear();
            s.chunks.clear();
            return Verdict::Counted;
        }
        let mut backoff = cap;
        let now = Instant::now();
        let next_probe = now + backoff.next().unwrap_or(Duration::from_secs(1));
        s.down = Some(Down { since: now, probes: 0, next_probe, backoff });
        s.probed = true;
        s.chunks.clear();
        Verdict::Tripped { refund: std::mem::take(&mut s.streak), retry_at: next_probe }
    }

    /// Whether `store` is down now.
    pub fn is_down(&self, store: &str) -> bool {
        self.stores.get(store).is_some_and(|s| s.down.is_some())
    }

    /// The stores down on their probe's word whose next probe is due.
    pub fn probes_due(&self) -> Vec<&'static str> {
        let now = Instant::now();
        let mut v: Vec<_> =
            self.stores.iter().filter(|(_, s)| s.probed && s.down.as_ref().is_some_and(|d| now >= d.next_probe)).map(|(n, _)| *n).collect();
        v.sort_unstable();
        v
    }

    /// A probe of `store` failed again: the next one later. Returns the probes so far.
    pub fn probe_failed(&mut self, store: &'static str) -> u64 {
        let Some(d) = self.stores.get_mut(store).and_then(|s| s.down.as_mut()) else { return 0 };
        d.probes += 1;
        d.next_probe = Instant::now() + d.backoff.next().unwrap_or(Duration::from_secs(1));
        d.probes
    }

    /// `store`'s probe answered: it is up. Returns how long it was down, if it was.
    pub fn probe_answered(&mut self, store: &'static str) -> Option<Duration> {
        let s = self.stores.get_mut(store)?;
        s.streak.clear();
        s.chunks.clear();
        s.probed = false;
        s.down.take().map(|d| d.since.elapsed())
    }

    /// A chunk finished, or failed for a reason of its own (the store answered): every store of
    /// the stage is up. Returns the stores that were down, with how long.
    pub fn succeeded(&mut self) -> Vec<(&'static str, Duration)> {
        let mut back = Vec::new();
        for (name, s) in self.stores.iter_mut() {
            s.streak.clear();
            s.chunks.clear();
            s.probed = false;
            if let Some(d) = s.down.take() {
                back.push((*name, d.since.elapsed()));
            }
        }
        back
    }

    /// The stores that are down now.
    pub fn down_stores(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.stores.iter().filter(|(_, s)| s.down.is_some()).map(|(n, _)| *n).collect();
        v.sort_unstable();
        v
    }

    /// Whether any store is down.
    pub fn any_down(&self) -> bool {
        self.stores.values().any(|s| s.down.is_some())
    }

    /// How many new claims may go out now, with `in_flight` chunks running and room for
    /// `free` more. While a store is down: none, then one probe once its time has come and
    /// nothing else is in flight.
    pub fn claim_limit(&self, in_flight: usize, free: usize) -> usize {
        let downs: Vec<&Down> = self.stores.values().filter_map(|s| s.down.as_ref()).collect();
        if downs.is_empty() {
            return free;
        }
        // A store that has a probe of its own is probed by it, never by a chunk.
        if self.stores.values().any(|s| s.probed && s.down.is_some()) {
            return 0;
        }
        let due = downs.iter().all(|d| Instant::now() >= d.next_probe);
        if due && in_flight == 0 { free.min(1) } else { 0 }
    }

    /// When the next probe is due, if a store is down.
    pub fn next_probe(&self) -> Option<Instant> {
        self.stores.values().filter_map(|s| s.down.as_ref()).map(|d| d.next_probe).max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_trips_after_a_streak_of_several_chunks_and_heals_on_success() {
        let mut b = Breakers::new(Duration::from_secs(300));
        assert_eq!(b.failed("destination", (1, 1)), Verdict::Counted);
        assert_eq!(b.failed("destination", (2, 1)), Verdict::Counted);
        let Verdict::Tripped { refund, .. } = b.failed("destination", (3, 1)) else { panic!("trips") };
        assert_eq!(refund, vec![(1, 1), (2, 1)], "the streak's earlier attempts are given back");
        assert!(b.any_down());
        assert_eq!(b.claim_limit(0, 4), 0, "no claims before the first probe is due");
        assert!(matches!(b.failed("destination", (4, 1)), Verdict::StillDown { probes: 0, probe: false, .. }));
        let back = b.succeeded();
        assert_eq!(back.len(), 1);
        assert!(!b.any_down());
        assert_eq!(b.claim_limit(0, 4), 4);
    }

    #[test]
    fn one_chunk_failing_alone_or_between_successes_never_trips() {
        let mut b = Breakers::new(Duration::from_secs(300));
        for epoch in 1..10 {
            assert_eq!(b.failed("destination", (7, epoch)), Verdict::Counted, "a poison chunk counts");
        }
        b.succeeded();
        for t in 0..10 {
            assert_eq!(b.failed("destination", (t, 1)), Verdict::Counted);
            if t % 2 == 1 {
                b.succeeded(); // others get through between the failures
            }
        }
        assert!(!b.any_down());
    }

    #[test]
    fn with_a_probe_a_lone_chunk_trips_and_chunks_that_fail_alone_never_do() {
        let mut b = Breakers::new(Duration::from_secs(300));
        // The store does not answer its probe either: down at the first failure.
        let Verdict::Tripped { refund, .. } = b.failed_probed("destination", (1, 1), false) else { panic!("trips") };
        assert!(refund.is_empty());
        assert_eq!(b.claim_limit(0, 4), 0, "no chunk goes out while the store is down");
        assert!(matches!(b.failed_probed("destination", (1, 2), false), Verdict::StillDown { .. }));
        assert_eq!(b.probe_failed("destination"), 1, "the chunk in flight was no probe");
        assert_eq!(b.claim_limit(0, 4), 0, "not even a probe chunk: the store's own probe runs");
        assert!(b.probe_answered("destination").is_some());
        assert_eq!(b.claim_limit(0, 4), 4);
        // Two chunks that fail while the store answers (too large for their deadline): each
        // failure counts, however many in a row.
        for epoch in 1..10 {
            assert_eq!(b.failed_probed("destination", (7, epoch), true), Verdict::Counted);
            assert_eq!(b.failed_probed("destination", (8, epoch), true), Verdict::Counted);
        }
        assert!(!b.any_down());
    }

    #[test]
    fn probes_wait_longer_each_time_up_to_the_cap() {
        let mut b = Breakers::new(Duration::from_secs(4));
        for t in 0..3 {
            b.failed("staging", (t, 1));
        }
        let mut waits = Vec::new();
        for t in 10..20 {
            // Each failure comes when its probe is due (as the probe chunk's would).
            b.stores.get_mut("staging").unwrap().down.as_mut().unwrap().next_probe = Instant::now();
            let Verdict::StillDown { retry_at, probe: true, .. } = b.failed("staging", (t, 1)) else { panic!() };
            waits.push(retry_at.saturating_duration_since(Instant::now()));
        }
        // Within the cap (a scheduling instant of slack), and grown to it: half the cap at least.
        assert!(waits.iter().all(|w| *w <= Duration::from_millis(4_050)), "capped: {waits:?}");
        assert!(waits[4..].iter().all(|w| *w >= Duration::from_millis(1_950)), "grown to the cap: {waits:?}");
    }

    #[test]
    fn chunks_in_flight_when_the_store_went_down_do_not_push_the_probe_out() {
        let mut b = Breakers::new(Duration::from_secs(300));
        for t in 0..2 {
            b.failed("destination", (t, 1));
        }
        let Verdict::Tripped { retry_at: first, .. } = b.failed("destination", (2, 1)) else { panic!("trips") };
        // Six more chunks that were in flight fail right after the trip: each waits for the
        // same first probe, and none counts as one.
        for t in 3..9 {
            let v = b.failed("destination", (t, 1));
            assert_eq!(v, Verdict::StillDown { retry_at: first, probes: 0, probe: false }, "chunk {t}");
        }
        assert_eq!(b.next_probe(), Some(first));
        assert!(first <= Instant::now() + Duration::from_secs(2), "the first probe stays within its first wait");
    }
}
