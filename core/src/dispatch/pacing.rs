//! Pacing against the subscription's write budget (ARM's
//! `x-ms-ratelimit-remaining-subscription-writes`, which the workers report): while the budget is
//! estimated below [`DispatchConfig::write_reserve`], mutating units start at most
//! [`DispatchConfig::write_pace`] per second, and each carries what accumulated meanwhile.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{DispatchConfig, UnitWork};

/// A subscription's write budget as its gateways' dispatchers see it. ARM counts writes per
/// subscription, so the gateways of one subscription share one (clones of one `WriteBudget`):
/// a report from any of their workers sets the estimate, every unit any of them cuts spends from
/// it, and the pace is the subscription's, not each gateway's. A dispatcher starts with a budget
/// of its own ([`super::Dispatcher::share_write_budget`] replaces it).
#[derive(Debug, Clone, Default)]
pub struct WriteBudget(Arc<Mutex<Pacing>>);

impl WriteBudget {
    /// A budget nobody reported yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Pacing> {
        // Every update leaves the estimate whole: a panic elsewhere cannot leave it half-written.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `other` is the same budget (shared).
    pub fn same_as(&self, other: &WriteBudget) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    pub(super) fn note(&self, remaining: u32, in_flight: u32) {
        self.lock().note(remaining, in_flight);
    }

    pub(super) fn remaining(&self) -> Option<u32> {
        self.lock().remaining()
    }

    pub(super) fn window(&self, config: &DispatchConfig) -> Option<Duration> {
        self.lock().window(config)
    }

    pub(super) fn held_until(&self, config: &DispatchConfig, now: Instant) -> Option<Instant> {
        self.lock().held_until(config, now)
    }

    pub(super) fn cut(&self, work: &UnitWork, now: Instant) {
        self.lock().cut(work, now);
    }
}

/// What the dispatcher knows of the subscription's write budget.
#[derive(Debug, Default)]
struct Pacing {
    /// The last remaining writes a worker reported.
    remaining: Option<u32>,
    /// Writes the units cut since then may make (an estimate: 1 per location unit, 3 per service
    /// change: public IP, load balancer or NAT gateway, registration).
    spent: u32,
    /// When the last mutating unit was cut.
    last_cut: Option<Instant>,
}

impl Pacing {
    /// Folds a reported budget: it replaces the estimate, less the writes of the other units
    /// still in flight (`in_flight`), which the reporting worker's reading did not include.
    fn note(&mut self, remaining: u32, in_flight: u32) {
        self.remaining = Some(remaining);
        self.spent = in_flight;
    }

    /// The budget last reported.
    fn remaining(&self) -> Option<u32> {
        self.remaining
    }

    /// The spacing of mutating units while the budget is tight (`None`: not pacing). The estimate
    /// is the last report less what was cut since; no refill is assumed: ARM's 5-minute cap frees
    /// writes only as old ones age out, so a refill guessed from a rate would overestimate (it let
    /// 429s through when tried), and the next report brings the truth.
    fn window(&self, config: &DispatchConfig) -> Option<Duration> {
        if config.write_pace <= 0.0 {
            return None;
        }
        let estimated = i64::from(self.remaining?) - i64::from(self.spent);
        let window = Duration::from_secs_f64(1.0 / config.write_pace);
        // Spent out (by the estimate): half the pace until a report says otherwise, as ARM's
        // 5-minute cap only frees writes as old ones age out.
        match estimated {
            e if e <= 0 => Some(2 * window),
            e if e < i64::from(config.write_reserve) => Some(window),
            _ => None,
        }
    }

    /// Until when the next mutating unit is held back (`None`: it may go now).
    fn held_until(&self, config: &DispatchConfig, now: Instant) -> Option<Instant> {
        let window = self.window(config)?;
        self.last_cut.map(|t| t + window).filter(|t| *t > now)
    }

    /// Counts a unit cut at `now`.
    fn cut(&mut self, work: &UnitWork, now: Instant) {
        let writes = writes_of(work);
        if writes == 0 {
            return;
        }
        self.spent = self.spent.saturating_add(writes);
        self.last_cut = Some(now);
    }
}

/// The writes a unit may make (an estimate): none for an observe, 1 per location unit, 3 per
/// service change (public IP, load balancer or NAT gateway, registration).
pub(super) fn writes_of(work: &UnitWork) -> u32 {
    match work {
        UnitWork::Observe => 0,
        UnitWork::Locations(_) => 1,
        UnitWork::Services(changes) => 3 * changes.len() as u32,
    }
}
