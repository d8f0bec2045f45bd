//! Staggering location units: in steady churn, units start evenly spaced rather than in waves.
//!
//! When a freed slot at once takes everything that waits, a unit's size is the time since the
//! unit before it started, and its call lasts a fixed cost plus a per-address cost: a long gap
//! makes a wide unit, a long call, and a longer gap after it. The even spacing is unstable and
//! the slots bunch — several calls start together, finish together, and the changes arriving
//! just after a wave wait for the whole of the next one (buses on one line do the same; the
//! remedy is theirs too: hold a departure to keep the headway).
//!
//! So while location units are in flight and the last one carried everything that waited, the
//! next one starts no sooner than a *headway* after the last start: the recent duration of a
//! location unit (cut to report, smoothed) divided by the concurrency budget, times
//! [`DispatchConfig::unit_headway`] (≥ 1, so a slot is free again before its turn comes). A
//! burst (a unit that had to leave ready work behind) is not held: its units go as slots free,
//! spread over them. No unit in flight: nothing to space from, the unit goes at once.
//!
//! A turn that comes while every slot is still busy (a call ran long) keeps its width: when the
//! slot frees, the unit takes the share of what waits that had built up by its turn (the backlog
//! in proportion to the time), and the next turn is a headway after the one due, not after the
//! late start. Taking everything instead made the late unit wide, its call long, and the turn
//! four units later late again: the one late slot went round for the whole churn (at 20,000
//! pods/s a p99 of ≈ 400 ms, where evenly spaced turns give ≈ 300). Kept to its width, the late
//! unit's call is of the usual length, and the headway's margin over the calls (its factor is
//! over one) takes the lag back in a few rounds. A turn more than [`LATE_TURNS`] headways late takes
//! everything: the calls no longer keep up at the turns' width, and only wider units catch up.
//!
//! The factor stays close to 1 (default 1.05): a wider headway makes wider units, whose calls
//! last longer, which widens the headway again — at 20,000 pods/s the simulation
//! (`cargo bench -p clb-core --bench dispatch_sim`) puts p99 at 284 ms with 1.05 and 340 ms with
//! 1.2, against 476 ms without staggering.

use std::time::{Duration, Instant};

use super::DispatchConfig;

/// The weight of the newest duration in the smoothed estimate.
const NEWEST: f64 = 0.2;

/// How many times the estimate a duration must be to replace it rather than be averaged in.
const JUMP: f64 = 2.0;

/// How many headways late a turn may come and still keep its width (see the module's text).
const LATE_TURNS: f64 = 1.0;

/// How late a turn must come, in headways, to keep its width: a turn a little late (a wake-up a
/// millisecond after its time) takes everything, as leaving a sliver of the backlog behind would
/// split a location for nothing.
const LATE_MIN: f64 = 0.1;

/// A turn that came after its time, every slot having been busy then.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct LateTurn {
    /// When it was due: the next turn is a headway after this.
    pub due: Instant,
    /// The share of the ready backlog it takes: what had built up by `due`, in proportion to
    /// the time since the last turn.
    pub share: f64,
}

/// What the spacing of location units is derived from.
#[derive(Debug, Default)]
pub(super) struct Stagger {
    /// When the last location unit was cut.
    last_start: Option<Instant>,
    /// Whether that unit left ready work behind (a burst: the next one is not held).
    left_behind: bool,
    /// A location unit's smoothed duration, from its cut to its report.
    duration: Option<Duration>,
}

impl Stagger {
    /// A location unit was cut at `now`; `left_behind`: ready work stayed pending.
    pub(super) fn started(&mut self, now: Instant, left_behind: bool) {
        self.last_start = Some(now);
        self.left_behind = left_behind;
    }

    /// A location unit was reported after `took`. A duration more than [`JUMP`] times the
    /// estimate replaces it: the calls' cost has changed (NRP slowed down, or the first loaded
    /// calls after cheap ones), and averaging up to it would space units far too closely for the
    /// many reports it takes, so that they bunch into waves meanwhile.
    pub(super) fn finished(&mut self, took: Duration) {
        self.duration = Some(match self.duration {
            Some(d) if took <= d.mul_f64(JUMP) => d.mul_f64(1.0 - NEWEST) + took.mul_f64(NEWEST),
            _ => took,
        });
    }

    /// The current headway (`None`: staggering off, unbounded, or nothing measured yet).
    pub(super) fn headway(&self, config: &DispatchConfig) -> Option<Duration> {
        let slots = config.max_mutating_units_in_flight;
        if config.unit_headway <= 0.0 || slots == 0 {
            return None;
        }
        let d = self.duration?;
        Some(d.mul_f64(config.unit_headway / slots as f64))
    }

    /// Until when the next location unit waits at `now` with `in_flight` location units out
    /// (`None`: it may go now).
    pub(super) fn held_until(
        &self,
        config: &DispatchConfig,
        in_flight: usize,
        now: Instant,
    ) -> Option<Instant> {
        if in_flight == 0 || self.left_behind {
            return None;
        }
        let until = self.last_start? + self.headway(config)?;
        (until > now).then_some(until)
    }

    /// The turn being taken at `now` with `in_flight` location units out, if it came late (see
    /// the module's text; `None`: on time, not spaced, or so late it takes everything).
    pub(super) fn late_turn(
        &self,
        config: &DispatchConfig,
        in_flight: usize,
        now: Instant,
    ) -> Option<LateTurn> {
        if !self.whole(config, in_flight) {
            return None;
        }
        let last = self.last_start?;
        let headway = self.headway(config)?;
        let due = last + headway;
        let late = now.checked_duration_since(due)?;
        if late < headway.mul_f64(LATE_MIN) || late >= headway.mul_f64(LATE_TURNS) {
            return None;
        }
        Some(LateTurn {
            due,
            share: headway.as_secs_f64() / (now - last).as_secs_f64(),
        })
    }

    /// Whether the next unit is to take everything that waits rather than a share of it (it is
    /// spaced: splitting would start a second unit beside it, a wave).
    pub(super) fn whole(&self, config: &DispatchConfig, in_flight: usize) -> bool {
        in_flight > 0 && !self.left_behind && self.headway(config).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(headway: f64) -> DispatchConfig {
        DispatchConfig {
            unit_headway: headway,
            max_mutating_units_in_flight: 4,
            ..DispatchConfig::default()
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn units_are_spaced_by_the_duration_over_the_slots() {
        let c = config(1.2);
        let t0 = Instant::now();
        let mut s = Stagger::default();
        s.started(t0, false);
        assert_eq!(s.held_until(&c, 1, t0), None, "nothing measured yet");
        s.finished(ms(200));
        // 200 ms over 4 slots × 1.2 = 60 ms after the last start.
        assert_eq!(s.headway(&c), Some(ms(60)));
        assert_eq!(s.held_until(&c, 1, t0 + ms(10)), Some(t0 + ms(60)));
        assert_eq!(s.held_until(&c, 1, t0 + ms(60)), None, "its turn");
        assert_eq!(s.held_until(&c, 0, t0 + ms(10)), None, "nothing in flight");
    }

    #[test]
    fn a_late_turn_keeps_its_width_and_the_schedule() {
        let c = config(1.0);
        let t0 = Instant::now();
        let mut s = Stagger::default();
        s.finished(ms(200));
        s.started(t0, false);
        // Due at 50 ms; every slot busy until 75 ms: the unit takes 50/75 of what waits.
        let turn = s.late_turn(&c, 4, t0 + ms(75)).expect("late");
        assert_eq!(turn.due, t0 + ms(50));
        assert!((turn.share - 50.0 / 75.0).abs() < 1e-9, "{}", turn.share);
        assert_eq!(s.late_turn(&c, 4, t0 + ms(50)), None, "on time");
        assert_eq!(s.late_turn(&c, 4, t0 + ms(54)), None, "a sliver late");
        assert_eq!(s.late_turn(&c, 4, t0 + ms(20)), None, "not yet due");
        assert_eq!(
            s.late_turn(&c, 4, t0 + ms(150)),
            None,
            "a whole headway late: everything goes"
        );
        assert_eq!(s.late_turn(&c, 0, t0 + ms(75)), None, "nothing in flight");
        s.started(t0, true);
        assert_eq!(s.late_turn(&c, 4, t0 + ms(75)), None, "after a burst");
    }

    #[test]
    fn the_duration_is_smoothed() {
        let mut s = Stagger::default();
        s.finished(ms(100));
        s.finished(ms(200));
        // 0.8 × 100 + 0.2 × 200.
        assert_eq!(s.duration, Some(ms(120)));
        s.finished(ms(20));
        // 0.8 × 120 + 0.2 × 20: a fall is averaged in.
        assert_eq!(s.duration, Some(ms(100)));
    }

    #[test]
    fn a_jump_in_the_duration_replaces_the_estimate() {
        let mut s = Stagger::default();
        // Cheap calls, then the first loaded one: the estimate is the new cost at once.
        s.finished(ms(20));
        s.finished(ms(250));
        assert_eq!(s.duration, Some(ms(250)));
    }

    #[test]
    fn a_burst_is_not_held_and_is_split() {
        let c = config(1.2);
        let t0 = Instant::now();
        let mut s = Stagger::default();
        s.finished(ms(200));
        s.started(t0, true);
        assert_eq!(s.held_until(&c, 1, t0), None);
        assert!(!s.whole(&c, 1), "a burst is spread over the free slots");
        s.started(t0, false);
        assert!(s.whole(&c, 1));
        assert!(!s.whole(&c, 0), "idle: spread as before");
    }

    #[test]
    fn zero_or_unbounded_turns_it_off() {
        let t0 = Instant::now();
        let mut s = Stagger::default();
        s.finished(ms(200));
        s.started(t0, false);
        assert_eq!(s.held_until(&config(0.0), 1, t0), None);
        let unbounded = DispatchConfig {
            max_mutating_units_in_flight: 0,
            ..config(1.2)
        };
        assert_eq!(s.held_until(&unbounded, 1, t0), None);
        assert!(!s.whole(&unbounded, 1));
    }
}
