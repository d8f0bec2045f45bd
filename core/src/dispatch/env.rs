//! What the dispatcher takes from its surroundings instead of reaching for it: the wall clock, the
//! jitter of its backoff and an observer of what happens (the state server's metrics). Everything
//! else it needs (`now`) is passed to each call.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Maps the monotonic `now` the dispatcher is given to Unix milliseconds, for the times it publishes
/// (lease deadlines sent to workers, error records): one anchor taken when it is built.
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    anchor: Instant,
    anchor_unix_ms: i64,
}

impl WallClock {
    /// `anchor` (monotonic) is the same moment as `anchor_unix_ms` (Unix milliseconds).
    pub fn new(anchor: Instant, anchor_unix_ms: i64) -> Self {
        Self {
            anchor,
            anchor_unix_ms,
        }
    }

    /// `at` in Unix milliseconds.
    pub fn unix_ms(&self, at: Instant) -> i64 {
        let ms = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        if at >= self.anchor {
            self.anchor_unix_ms.saturating_add(ms(at - self.anchor))
        } else {
            self.anchor_unix_ms.saturating_sub(ms(self.anchor - at))
        }
    }
}

/// The jitter of retry delays: a small deterministic generator (xorshift64*) seeded by the caller, so
/// a test can fix it and a server seeds it from its own randomness.
#[derive(Debug, Clone)]
pub struct Jitter(u64);

impl Jitter {
    /// A generator seeded with `seed` (0 is replaced by a fixed non-zero value).
    pub fn new(seed: u64) -> Self {
        Self(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// The next factor, uniform in [0.5, 1.0].
    pub fn next_factor(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11; // 53 bits
        0.5 + 0.5 * (r as f64 / (1u64 << 53) as f64)
    }
}

/// Told of each outcome as the dispatcher counts it (the state server turns them into metrics).
pub trait DispatchObserver: Send + Sync + fmt::Debug {
    /// A unit's report (or lease expiry) of `kind` ended with `result` (`applied`, `retryable`,
    /// `terminal`, `observed`, `lease_expired`) and error `code` (empty on success).
    fn unit_outcome(&self, kind: &'static str, result: &'static str, code: &str);
    /// `n` leases expired.
    fn lease_expired(&self, n: u64);
    /// A report arrived for a unit no longer leased to its sender.
    fn late_report(&self);
    /// NRP accepted a change of `kind` (`locations` or `services`) that became pending `latency`
    /// before the report that says so was folded: the desired → programmed latency of one key.
    fn programmed(&self, kind: &'static str, latency: Duration) {
        let _ = (kind, latency);
    }
}

/// An observer that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;

impl DispatchObserver for NoObserver {
    fn unit_outcome(&self, _: &'static str, _: &'static str, _: &str) {}
    fn lease_expired(&self, _: u64) {}
    fn late_report(&self) {}
}

/// Everything [`super::Dispatcher::new`] takes from its surroundings.
#[derive(Debug, Clone)]
pub struct DispatchEnv {
    /// The wall clock of published times.
    pub wall: WallClock,
    /// The jitter of retry delays.
    pub jitter: Jitter,
    /// Told of outcomes.
    pub observer: Arc<dyn DispatchObserver>,
}

impl DispatchEnv {
    /// An environment anchored at (`anchor`, `anchor_unix_ms`) with jitter seeded by `seed` and no
    /// observer.
    pub fn new(anchor: Instant, anchor_unix_ms: i64, seed: u64) -> Self {
        Self {
            wall: WallClock::new(anchor, anchor_unix_ms),
            jitter: Jitter::new(seed),
            observer: Arc::new(NoObserver),
        }
    }

    /// The same, telling `observer` of outcomes.
    pub fn with_observer(mut self, observer: Arc<dyn DispatchObserver>) -> Self {
        self.observer = observer;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_clock_maps_both_directions_from_the_anchor() {
        let t = Instant::now();
        let w = WallClock::new(t, 1_000_000);
        assert_eq!(w.unix_ms(t + Duration::from_millis(250)), 1_000_250);
        if let Some(before) = t.checked_sub(Duration::from_millis(40)) {
            assert_eq!(w.unix_ms(before), 999_960);
        }
    }

    #[test]
    fn jitter_stays_in_range_and_is_seeded() {
        let mut a = Jitter::new(7);
        let mut b = Jitter::new(7);
        let xs: Vec<f64> = (0..1000).map(|_| a.next_factor()).collect();
        assert!(xs.iter().all(|x| (0.5..=1.0).contains(x)));
        assert!(xs.iter().any(|x| *x < 0.6) && xs.iter().any(|x| *x > 0.9));
        assert_eq!(xs[0], b.next_factor());
    }
}
