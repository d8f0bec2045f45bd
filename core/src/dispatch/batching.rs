//! Holding location units back while a burst of changes is still arriving, so that one wave of
//! wide units carries it instead of a first wave of thin ones (each NRP call has a fixed cost,
//! and a location in flight cannot be sent again until its call ends).
//!
//! A burst that began from idle (no location unit in flight or ended for a quiet interval) is
//! gathered: while its changes keep arriving less than [`DispatchConfig::batch_quiet`] apart, no
//! location unit is cut — unless the burst started [`DispatchConfig::batch_linger`] ago, or the
//! locations waiting already fill a unit for every free slot, or (checked by the dispatcher) its
//! first quiet interval brought less than a split's worth of addresses
//! ([`super::SPLIT_MIN_ADDRESSES`]): a trickle, such as steady churn starting, goes as it comes
//! and is then spaced by `stagger.rs`; holding it would only delay it. An isolated change waits
//! one quiet interval.
//!
//! Changes that begin while units are in flight (steady churn) are not gathered, even once those
//! units have all ended: the headway of `stagger.rs` spaces the units, and holding a continuous
//! stream to the linger would make them wider and later — and, held at the moment the slots
//! empty, cut them all at once, a wave that ends all at once and empties the slots again.

use std::time::Instant;

use super::DispatchConfig;

/// The burst of location changes that has not yet been cut into a unit.
#[derive(Debug, Default)]
pub(super) struct Batching {
    /// When the first change of the burst was taken in, and the last.
    burst: Option<(Instant, Instant)>,
    /// Whether the burst began from idle (only such a burst is gathered). Kept after the burst is
    /// cut, until the next burst begins: the wave that carries it is spread over the free slots.
    from_idle: bool,
}

impl Batching {
    /// Notes that changes to locations were taken in at `now`. A change after a quiet interval
    /// starts a new burst, even when the last one was never cut (its locations needed no call,
    /// or they wait for a slot): otherwise its linger would be spent before it began.
    /// `idle`: no location unit was in flight before these changes, or ended within a quiet
    /// interval. `waiting`: location work was already pending.
    ///
    /// A change after a quiet interval starts a new burst — unless the last one was never cut
    /// and its work still waits: then it is the same backlog, whose linger counts from its first
    /// change. (Writes about a quiet interval apart would otherwise each start a burst, and the
    /// linger would never bind.) A burst never cut whose locations needed no call leaves nothing
    /// waiting, so the next one starts afresh.
    pub(super) fn changed(
        &mut self,
        config: &DispatchConfig,
        now: Instant,
        idle: bool,
        waiting: bool,
    ) {
        let first = match self.burst {
            Some((first, last)) if now <= last + config.batch_quiet => first,
            Some((first, _)) if waiting => first,
            _ => {
                self.from_idle = idle;
                now
            }
        };
        self.burst = Some((first, now));
    }

    /// When the burst began, if one is open.
    pub(super) fn began(&self) -> Option<Instant> {
        self.burst.map(|(first, _)| first)
    }

    /// Whether the backlog began from idle, so that its wave is spread over the free slots (what
    /// builds up beside units in flight is not: `stagger.rs` spaces it).
    pub(super) fn spreads(&self) -> bool {
        self.from_idle
    }

    /// A location unit was cut: the burst is on its way.
    pub(super) fn cut(&mut self) {
        self.burst = None;
    }

    /// When the burst stops holding location units back, if it does (`None`: batching off or no
    /// burst).
    pub(super) fn ends(&self, config: &DispatchConfig) -> Option<Instant> {
        if config.batch_linger.is_zero() || !self.from_idle {
            return None;
        }
        let (first, last) = self.burst?;
        Some((last + config.batch_quiet).min(first + config.batch_linger))
    }

    /// When a gathered burst is to be looked at again after `now`: at the end of its first quiet
    /// interval (to weigh it: a trickle is cut then), then when it ends (`None`: not gathered).
    pub(super) fn next_look(&self, config: &DispatchConfig, now: Instant) -> Option<Instant> {
        let ends = self.ends(config)?;
        let weighed = self.began()? + config.batch_quiet;
        Some(if weighed > now {
            weighed.min(ends)
        } else {
            ends
        })
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
        b.changed(&c, t0, true, false);
        assert_eq!(
            b.held_until(&c, 1, 4, t0),
            Some(ms(3)),
            "one quiet interval"
        );
        assert_eq!(b.held_until(&c, 1, 4, ms(3)), None, "quiet: cut");
        // A stream of changes 1 ms apart keeps holding, up to the linger.
        for n in 1..=99 {
            b.changed(&c, ms(n), true, false);
        }
        assert_eq!(b.held_until(&c, 5, 4, ms(99)), Some(ms(100)));
        b.changed(&c, ms(100), true, false);
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
        b.changed(&c, t0, true, false);
        b.changed(&c, ms(2), true, false);
        // The next burst, long after: held for its own quiet interval, not cut at once.
        b.changed(&c, ms(500), true, false);
        assert_eq!(b.held_until(&c, 1, 4, ms(500)), Some(ms(503)));
        // And its linger counts from its own first change.
        for n in 501..=598 {
            b.changed(&c, ms(n), true, false);
        }
        assert_eq!(b.held_until(&c, 1, 4, ms(598)), Some(ms(600)));
    }

    #[test]
    fn enough_waiting_to_fill_every_free_slot_is_not_held() {
        let c = config(3, 100);
        let t0 = Instant::now();
        let mut b = Batching::default();
        b.changed(&c, t0, true, false);
        assert!(b.held_until(&c, 39, 4, t0).is_some());
        assert_eq!(b.held_until(&c, 40, 4, t0), None, "4 slots × 10 locations");
        assert_eq!(b.held_until(&c, 10, 1, t0), None, "1 slot × 10 locations");
    }

    #[test]
    fn a_burst_that_began_beside_units_in_flight_is_not_gathered() {
        let c = config(3, 100);
        let t0 = Instant::now();
        let mut b = Batching::default();
        b.changed(&c, t0, false, false);
        assert_eq!(b.held_until(&c, 1, 4, t0), None);
        assert_eq!(b.ends(&c), None);
        // Still the same burst when the slots have emptied: not gathered either.
        b.changed(&c, t0 + Duration::from_millis(2), true, false);
        assert_eq!(b.held_until(&c, 1, 4, t0 + Duration::from_millis(2)), None);
    }

    #[test]
    fn writes_a_quiet_interval_apart_onto_an_uncut_backlog_are_one_burst() {
        let c = config(3, 100);
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut b = Batching::default();
        b.changed(&c, t0, true, false);
        // Each write a little more than a quiet interval after the last, the backlog not cut:
        // still the burst of t0, so its linger binds at 100 ms.
        for n in (4..=96).step_by(4) {
            b.changed(&c, ms(n), true, true);
        }
        assert_eq!(b.began(), Some(t0));
        assert_eq!(b.held_until(&c, 1, 4, ms(96)), Some(ms(99)));
        b.changed(&c, ms(100), true, true);
        assert_eq!(
            b.held_until(&c, 1, 4, ms(100)),
            None,
            "the linger bounds it"
        );
    }

    #[test]
    fn a_zero_linger_turns_batching_off() {
        let c = config(3, 0);
        let t0 = Instant::now();
        let mut b = Batching::default();
        b.changed(&c, t0, true, false);
        assert_eq!(b.held_until(&c, 1, 4, t0), None);
        assert_eq!(b.ends(&c), None);
    }
}
