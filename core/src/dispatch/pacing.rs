//! Pacing against the subscription's write budget (ARM's
//! `x-ms-ratelimit-remaining-subscription-writes`, which the workers report). Once a budget has
//! been reported (ARM throttles this subscription), mutating units spend from a bucket of
//! [`DispatchConfig::write_burst`] writes refilled at [`DispatchConfig::write_pace`] per second: a
//! burst goes at once, the long-run rate stays under ARM's 5-minute cap (1,000 writes: 3.33/s),
//! which its token bucket alone would let a client exceed (200 + 10/s) until the cap answers 429
//! with a `Retry-After` of minutes. And while the budget is estimated below
//! [`DispatchConfig::write_reserve`], units start at most at the pace (at half of it once the
//! estimate reaches 0). Either way each unit carries what accumulated meanwhile.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{DispatchConfig, Key, UnitWork};
use crate::difftracker::{DiffTracker, ServiceStatus};

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

    pub(super) fn held_until(
        &self,
        config: &DispatchConfig,
        now: Instant,
        need: u32,
    ) -> Option<Instant> {
        self.lock().held_until(config, now, need)
    }

    pub(super) fn cut(&self, config: &DispatchConfig, work: &UnitWork, now: Instant) {
        self.lock().cut(config, work, now);
    }

    pub(super) fn fold(&self, config: &DispatchConfig, now: Instant) {
        self.lock().fold(config, now);
    }
}

impl super::Dispatcher {
    /// Folds the remaining writes of the subscription a worker saw on its last mutating call.
    /// Called while the reporting unit is still in flight: the writes of the others are taken
    /// off the reading (their calls were not yet counted in it); the reporting unit, not named
    /// here, is taken to be a location unit (1 write). [`super::Dispatcher::note_remaining_writes_of`]
    /// names it.
    pub fn note_remaining_writes(&mut self, remaining: u32) {
        let in_flight: u32 = self.in_flight.values().map(|u| writes_of(&u.work)).sum();
        let others = in_flight.saturating_sub(1);
        self.pacing.note(remaining, others);
    }

    /// The writes the next mutating unit may make, as pacing waits for them (noted for
    /// [`Dispatcher::next_deadline`]): a service unit of the service changes pending and ready (at
    /// most a unit's worth) while any are, else a location unit's one.
    pub(super) fn writes_next(&mut self, tracker: &DiffTracker, now: Instant) -> u32 {
        let max = self.config.max_services_per_unit.max(1);
        let changes = self
            .pending_services
            .iter()
            .filter(|name| {
                self.ready(&Key::Service((*name).clone()), now)
                    && matches!(tracker.service_status(name), ServiceStatus::Pending(_))
            })
            .take(max)
            .count();
        self.writes_next = match u32::try_from(changes).unwrap_or(u32::MAX) {
            0 => 1,
            n => n.saturating_mul(2).saturating_add(1),
        };
        self.writes_next
    }

    /// [`super::Dispatcher::note_remaining_writes`] of the report of `work_id`: the writes of every other
    /// unit in flight are taken off the reading, not those of the reporting unit (a service unit's
    /// are 2 per change + 1, which the reading already counts).
    pub fn note_remaining_writes_of(&mut self, remaining: u32, work_id: u64) {
        let others: u32 = self
            .in_flight
            .iter()
            .filter(|(id, _)| **id != work_id)
            .map(|(_, u)| writes_of(&u.work))
            .sum();
        self.pacing.note(remaining, others);
    }
}

/// What the dispatcher knows of the subscription's write budget.
#[derive(Debug, Default)]
struct Pacing {
    /// The last remaining writes a worker reported.
    remaining: Option<u32>,
    /// Writes the units cut since then may make (an estimate: [`writes_of`]).
    spent: u32,
    /// When the last mutating unit was cut.
    last_cut: Option<Instant>,
    /// The writes the long-run bucket holds, as of `refilled_at` (`None`: full).
    tokens: Option<(f64, Instant)>,
    /// The last report's writes left, less the other units' in flight, not folded into `tokens`
    /// yet ([`Pacing::fold`]).
    reported: Option<f64>,
}

impl Pacing {
    /// Folds a reported budget: it replaces the estimate, less the writes of the other units
    /// still in flight (`in_flight`), which the reporting worker's reading did not include.
    fn note(&mut self, remaining: u32, in_flight: u32) {
        self.remaining = Some(remaining);
        self.spent = in_flight;
        self.reported = Some(f64::from(remaining) - f64::from(in_flight));
    }

    /// Folds the last report into the long-run bucket at `now`: it holds no more than the
    /// subscription has left. ARM's bucket can hold fewer writes than this one believes: at the
    /// start (the units cut before any report went unpaced, and this bucket starts full), or when
    /// another writer of the subscription spends from it. Counted as of `now`, later than the
    /// reading: the refill between the two is not counted (the estimate errs low).
    fn fold(&mut self, config: &DispatchConfig, now: Instant) {
        let Some(left) = self.reported.take() else {
            return;
        };
        if let Some(tokens) = self.bucket_refilled(config, now) {
            self.tokens = Some((tokens.min(left), now));
        }
    }

    /// The budget last reported.
    fn remaining(&self) -> Option<u32> {
        self.remaining
    }

    /// The spacing of mutating units now (`None`: not pacing): the reserve's window, else the
    /// pace while the long-run bucket was empty at the last cut.
    fn window(&self, config: &DispatchConfig) -> Option<Duration> {
        self.reserve_window(config).or_else(|| {
            let (tokens, _) = self.tokens?;
            (config.write_pace > 0.0 && tokens < 1.0)
                .then(|| Duration::from_secs_f64(1.0 / config.write_pace))
        })
    }

    /// The spacing of mutating units while the budget is estimated below the reserve (`None`:
    /// it is not). The estimate is the last report less what was cut since; no refill is
    /// assumed: ARM's 5-minute cap frees writes only as old ones age out, so a refill guessed from
    /// a rate would overestimate (it let 429s through when tried), and the next report brings the
    /// truth.
    fn reserve_window(&self, config: &DispatchConfig) -> Option<Duration> {
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

    /// Until when the next mutating unit, of `need` writes, is held back (`None`: it may go now):
    /// the long-run bucket must hold its writes (at most the bucket's size) before it goes. A
    /// location unit's one write may overdraw nothing; a service unit's (2 per change + 1) would
    /// overdraw ARM's bucket as fast as its calls go, and meet 429s.
    fn held_until(&self, config: &DispatchConfig, now: Instant, need: u32) -> Option<Instant> {
        let reserve = self
            .reserve_window(config)
            .and_then(|window| self.last_cut.map(|t| t + window));
        let need = f64::from(need.clamp(1, config.write_burst.max(1)));
        let bucket = self.bucket_refilled(config, now).map(|tokens| {
            let missing = (need - tokens).max(0.0);
            now + Duration::from_secs_f64(missing / config.write_pace)
        });
        reserve.into_iter().chain(bucket).max().filter(|t| *t > now)
    }

    /// The long-run bucket's writes at `now` (`None`: no bucket — pacing off, or no budget
    /// reported yet, as with an NRP that does not throttle).
    fn bucket_refilled(&self, config: &DispatchConfig, now: Instant) -> Option<f64> {
        if config.write_pace <= 0.0 || self.remaining.is_none() {
            return None;
        }
        let burst = f64::from(config.write_burst.max(1));
        Some(match self.tokens {
            None => burst,
            Some((tokens, at)) => (tokens
                + now.saturating_duration_since(at).as_secs_f64() * config.write_pace)
                .min(burst),
        })
    }

    /// Counts a unit cut at `now`.
    fn cut(&mut self, config: &DispatchConfig, work: &UnitWork, now: Instant) {
        let writes = writes_of(work);
        if writes == 0 {
            return;
        }
        self.spent = self.spent.saturating_add(writes);
        self.last_cut = Some(now);
        if let Some(tokens) = self.bucket_refilled(config, now) {
            // May go below 0 (a service unit's writes): the next unit then waits longer.
            self.tokens = Some((tokens - f64::from(writes), now));
        }
    }
}

/// The writes a unit may make (an estimate): none for an observe, 1 per location unit; for a
/// service unit 2 per change (a creation's public IP and load balancer or NAT gateway, a
/// deletion's load balancer or NAT gateway and public IP) and 1 for the unit's one
/// `updateServices` call, which registers or unregisters them all.
pub(super) fn writes_of(work: &UnitWork) -> u32 {
    match work {
        UnitWork::Observe => 0,
        UnitWork::Locations(_) => 1,
        UnitWork::Services(changes) => {
            let n = u32::try_from(changes.len()).unwrap_or(u32::MAX);
            n.saturating_mul(2).saturating_add(1)
        }
    }
}
