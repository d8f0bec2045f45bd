//! The one retry policy of clb's clients, built on [`backon`]: exponential backoff from `initial`,
//! doubling up to `max`, each delay drawn uniformly from the upper half of its step ("equal
//! jitter": `[d/2, d)`), so that hundreds of node agents or workers do not retry in lockstep and
//! no delay exceeds `max`.
//!
//! Users: the connection retries of [`Client::connect`](crate::Client::connect), the watcher's
//! writers and session/state streams, the write-back's per-Service retries, the watcher's watch
//! streams (through kube's `Backoff`, [`policy`] converts into it) and the sync worker's
//! reconnections.
//!
//! A refused call — one that cost no server anything: no connection could be made, or a standby
//! answered `UNAVAILABLE` — may be paced with a lower cap ([`Backoff::with_refusal_cap`],
//! [`RECONNECT_MAX`] by the writers and the sync worker), so that a client finds a newly elected
//! leader within about 2 s. The delay keeps growing underneath: a failure that reached a server
//! right after refusals waits the grown delay.
//!
//! What stays hand-written, and why: the dispatcher's retry delays of failed units
//! (`core/src/dispatch`) are part of a pure, synchronous domain — `now` is passed in and the jitter
//! is a seeded generator of `DispatchEnv`, so that tests and property tests replay exactly; they
//! also combine with NRP's `Retry-After` and park keys, which is not an iterator of delays. The
//! leader election's fixed period (`state-server/src/leader.rs`) is a poll with jitter, not a
//! growing backoff. The write-back's poll interval (50 ms doubling to `--poll-interval`) paces the
//! polls of a pending Service, which are not failures.
//!
//! (backon's own jitter adds up to the same again, `[h, 2h)`; the builder is given half of
//! `initial` and `max`, which makes it `[d/2, d)`. Its growth is computed in `f32`: a delay may be
//! off by a few nanoseconds from the exact power of two.)

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// The largest delay after a refused call (no connection, or `UNAVAILABLE` from a standby).
pub const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// The policy as a backon builder: steps `initial` (at most `max`), `2 × initial`, … up to `max`;
/// each delay uniform in the upper half of its step; never gives up. Each call seeds its jitter
/// anew: backon without its `std` feature would otherwise give every process the same sequence.
pub fn policy(initial: Duration, max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(initial.min(max) / 2)
        .with_max_delay(max / 2)
        .with_factor(2.0)
        .with_jitter()
        .with_jitter_seed(rand::random())
        .without_max_times()
}

/// The delays of one sequence of attempts: [`next_delay`](Self::next_delay) after each failure,
/// [`reset`](Self::reset) after a success.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    delays: ExponentialBackoff,
    /// The refusal cap and its sequence, advanced together with `delays`.
    refusals: Option<(Duration, ExponentialBackoff)>,
}

impl Backoff {
    /// Starts at `initial` (at most `max`), doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            delays: policy(initial, max).build(),
            refusals: None,
        }
    }

    /// The same, with the delays after a refusal ([`next_delay`](Self::next_delay) with `refused`)
    /// capped at `cap` (if lower than `max`).
    pub fn with_refusal_cap(mut self, cap: Duration) -> Self {
        let cap = cap.min(self.max);
        self.refusals = Some((cap, policy(self.initial, cap).build()));
        self
    }

    /// After a success: the next failure waits about `initial` again.
    pub fn reset(&mut self) {
        self.delays = policy(self.initial, self.max).build();
        if let Some((cap, refusals)) = &mut self.refusals {
            *refusals = policy(self.initial, *cap).build();
        }
    }

    /// The delay before the next attempt; `refused`: the failed call cost the server nothing (see
    /// [`with_refusal_cap`](Self::with_refusal_cap)).
    pub fn next_delay(&mut self, refused: bool) -> Duration {
        let grown = self.delays.next().unwrap_or(self.max);
        match &mut self.refusals {
            Some((cap, refusals)) => {
                let capped = refusals.next().unwrap_or(*cap);
                if refused { capped } else { grown }
            }
            None => grown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// backon computes its steps in `f32`.
    const SLACK: Duration = Duration::from_micros(1);

    #[test]
    fn delays_double_in_the_upper_half_of_each_step_up_to_the_cap() {
        let initial = Duration::from_millis(100);
        let max = Duration::from_secs(1);
        let mut b = Backoff::new(initial, max);
        for attempt in 0..40 {
            let d = b.next_delay(false);
            let step = (initial * 2u32.pow(attempt.min(10))).min(max);
            assert!(
                d + SLACK >= step / 2 && d <= step + SLACK,
                "{attempt}: {d:?}"
            );
        }
        b.reset();
        assert!(b.next_delay(false) <= initial + SLACK);
    }

    #[test]
    fn refusals_stop_at_their_cap_while_the_delay_grows_underneath() {
        let mut b = Backoff::new(Duration::from_millis(200), Duration::from_secs(10))
            .with_refusal_cap(RECONNECT_MAX);
        let refusals: Vec<Duration> = (0..10).map(|_| b.next_delay(true)).collect();
        assert!(
            refusals[0] <= Duration::from_millis(200) + SLACK,
            "{refusals:?}"
        );
        assert!(
            refusals.iter().all(|d| *d <= RECONNECT_MAX + SLACK),
            "{refusals:?}"
        );
        // The jitter differs from one delay to the next.
        assert!(
            refusals[5..].windows(2).any(|w| w[0] != w[1]),
            "{refusals:?}"
        );
        // A failure that reached the server waits the grown delay.
        assert!(b.next_delay(false) + SLACK >= Duration::from_secs(5));
        b.reset();
        assert!(b.next_delay(false) <= Duration::from_millis(200) + SLACK);
    }

    #[test]
    fn a_max_below_initial_caps_the_first_delay_too() {
        let mut b = Backoff::new(Duration::from_secs(5), Duration::from_secs(1));
        assert!(b.next_delay(false) <= Duration::from_secs(1) + SLACK);
        let mut zero = Backoff::new(Duration::ZERO, Duration::ZERO);
        assert_eq!(zero.next_delay(false), Duration::ZERO);
    }
}
