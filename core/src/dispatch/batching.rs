//! Holding location units back while a burst of changes is still arriving, so that one wave of
//! wide units carries it instead of a first wave of thin ones (each NRP call has a fixed cost,
//! and a location in flight cannot be sent again until its call ends).
//!
//! While no location unit is in flight and changes to locations keep arriving less than
//! [`DispatchConfig::batch_quiet`] apart, a location unit is not cut — unless the burst started
//! [`DispatchConfig::batch_linger`] ago, or the locations waiting already fill a unit for every
//! free slot. An isolated change waits one quiet interval. With location units in flight (steady
//! churn) nothing is gathered: the headway of `stagger.rs` spaces the units, and holding a
//! continuous stream to the linger would only make them wider and later.

use std::time::Instant;

use super::DispatchConfig;

/// The burst of location changes that has not yet been cut into a unit.
#[derive(Debug, Default)]
pub(super) struct Batching {
    /// When the first change of the burst was taken in, and the last.
    burst: Option<(Instant, Instant)>,
}

impl Batching {
    /// Notes that changes to locations were taken in at `now`. A change after a quiet interval
    /// starts a new burst, even when the last one was never cut (its locations needed no call,
    /// or they wait for a slot): otherwise its linger would be spent before it began.
    pub(super) fn changed(&mut self, config: &DispatchConfig, now: Instant) {
        let first = match self.burst {
            Some((first, last)) if now <= last + config.batch_quiet => first,
            _ => now,
        };
        self.burst = Some((first, now));
    }

    /// A location unit was cut: the burst is on its way.
    pub(super) fn cut(&mut self) {
        self.burst = None;
    }

    /// When the burst stops holding location units back, if it does (`None`: batching off or no
    /// burst).
    pub(super) fn ends(&self, config: &DispatchConfig) -> Option<Instant> {
        if config.batch_linger.is_zero() {
            return None;
        }
        let (first, last) = self.burst?;
        Some((last + config.batch_quiet).min(first + config.batch_linger))
    }

    /// Until when location units are held back at `now`, with `pending` locations waiting and
    /// room for `room` more mutating calls (`None`: cut now).
    pub(super) fn held_until(
        &self,
        config: &DispatchConfig,
        pending: usize,
        room: usize,
        now: Instant,
    ) -> Option<Instant> {
        let until = self.ends(config).filter(|t| *t > now)?;
        // Enough waits to fill a unit for every free slot: waiting would not widen them.
        let fills = room.saturating_mul(config.max_locations_per_unit.max(1));
        (pending < fills).then_some(until)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn config(quiet_ms: u64, linger_ms: u64) -> DispatchConfig {
        DispatchConfig {
            batch_quiet: Duration::from_millis(quiet_ms),
            batch_linger: Duration::from_millis(linger_ms),
            max_locations_per_unit: 10,
            ..DispatchConfig::default()
        }
    }

    #[test]
    fn a_burst_holds_until_quiet_and_at_most_the_linger() {
        let c = config(3, 100);
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut b = Batching::default();
        assert_eq!(b.held_until(&c, 1, 4, t0), None, "no burst, no hold");
        b.changed(&c, t0);
        assert_eq!(
            b.held_until(&c, 1, 4, t0),
            Some(ms(3)),
            "one quiet interval"
        );
        assert_eq!(b.held_until(&c, 1, 4, ms(3)), None, "quiet: cut");
        // A stream of changes 1 ms apart keeps holding, up to the linger.
        for n in 1..=99 {
            b.changed(&c, ms(n));
        }
        assert_eq!(b.held_until(&c, 5, 4, ms(99)), Some(ms(100)));
        b.changed(&c, ms(100));
        assert_eq!(
            b.held_until(&c, 5, 4, ms(100)),
            None,
            "the linger bounds it"
        );
        b.cut();
        assert_eq!(b.ends(&c), None, "a cut ends the burst");
    }

    #[test]
    fn a_burst_that_went_quiet_uncut_does_not_spend_the_next_ones_linger() {
        let c = config(3, 100);
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut b = Batching::default();
        // A burst whose locations needed no call: never cut.
        b.changed(&c, t0);
        b.changed(&c, ms(2));
        // The next burst, long after: held for its own quiet interval, not cut at once.
        b.changed(&c, ms(500));
        assert_eq!(b.held_until(&c, 1, 4, ms(500)), Some(ms(503)));
        // And its linger counts from its own first change.
        for n in 501..=598 {
            b.changed(&c, ms(n));
        }
        assert_eq!(b.held_until(&c, 1, 4, ms(598)), Some(ms(600)));
    }

    #[test]
    fn enough_waiting_to_fill_every_free_slot_is_not_held() {
        let c = config(3, 100);
        let t0 = Instant::now();
        let mut b = Batching::default();
        b.changed(&c, t0);
        assert!(b.held_until(&c, 39, 4, t0).is_some());
        assert_eq!(b.held_until(&c, 40, 4, t0), None, "4 slots × 10 locations");
        assert_eq!(b.held_until(&c, 10, 1, t0), None, "1 slot × 10 locations");
    }

    #[test]
    fn a_zero_linger_turns_batching_off() {
        let c = config(3, 0);
        let t0 = Instant::now();
        let mut b = Batching::default();
        b.changed(&c, t0);
        assert_eq!(b.held_until(&c, 1, 4, t0), None);
        assert_eq!(b.ends(&c), None);
    }
}
