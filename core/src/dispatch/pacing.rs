//! Pacing against the subscription's write budget (ARM's
//! `x-ms-ratelimit-remaining-subscription-writes`, which the workers report): while the budget is
//! estimated below [`DispatchConfig::write_reserve`], mutating units start at most
//! [`DispatchConfig::write_pace`] per second, and each carries what accumulated meanwhile.

use std::time::{Duration, Instant};

use super::{DispatchConfig, UnitWork};

/// What the dispatcher knows of the subscription's write budget.
#[derive(Debug, Default)]
pub(super) struct Pacing {
    /// The last remaining writes a worker reported.
    remaining: Option<u32>,
    /// Writes the units cut since then may make (an estimate: 1 per location unit, 3 per service
    /// change: public IP, load balancer or NAT gateway, registration).
    spent: u32,
    /// When the last mutating unit was cut.
    last_cut: Option<Instant>,
}

impl Pacing {
    /// Folds a reported budget: it replaces the estimate.
    pub(super) fn note(&mut self, remaining: u32) {
        self.remaining = Some(remaining);
        self.spent = 0;
    }

    /// The budget last reported.
    pub(super) fn remaining(&self) -> Option<u32> {
        self.remaining
    }

    /// The spacing of mutating units while the budget is tight (`None`: not pacing). The estimate
    /// is the last report less what was cut since; no refill is assumed: ARM's 5-minute cap frees
    /// writes only as old ones age out, so a refill guessed from a rate would overestimate (it let
    /// 429s through when tried), and the next report brings the truth.
    pub(super) fn window(&self, config: &DispatchConfig) -> Option<Duration> {
        if config.write_pace <= 0.0 {
            return None;
        }
        let estimated = i64::from(self.remaining?) - i64::from(self.spent);
        (estimated < i64::from(config.write_reserve))
            .then(|| Duration::from_secs_f64(1.0 / config.write_pace))
    }

    /// Until when the next mutating unit is held back (`None`: it may go now).
    pub(super) fn held_until(&self, config: &DispatchConfig, now: Instant) -> Option<Instant> {
        let window = self.window(config)?;
        self.last_cut.map(|t| t + window).filter(|t| *t > now)
    }

    /// Counts a unit cut at `now`.
    pub(super) fn cut(&mut self, work: &UnitWork, now: Instant) {
        let writes = match work {
            UnitWork::Observe => return,
            UnitWork::Locations(_) => 1,
            UnitWork::Services(changes) => 3 * changes.len() as u32,
        };
        self.spent = self.spent.saturating_add(writes);
        self.last_cut = Some(now);
    }
}
