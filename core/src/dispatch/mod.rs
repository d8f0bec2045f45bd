//! The dispatcher of one gateway: turns the DiffTracker's dirty locations and services into work
//! units under leases, and folds the workers' reports back into the actual state.
//!
//! * at most one unit in flight per location and per service, so changes to one location are applied
//!   in order; a location changed while in flight is re-diffed when its unit's result arrives;
//! * many locations are packed into one unit up to the configured limits;
//! * a unit's lease ends at its deadline; a disconnect releases a worker's units at once; a late
//!   report (after expiry or release) is ignored, so it cannot corrupt the actual state;
//! * failures come back with a retry hint (backoff with jitter, capped); a failure that shows the
//!   actual state to be wrong (or leaves it unknown) is held until NRP has been read back, then
//!   retried; only work that is invalid whatever NRP holds is parked, until the desired state of
//!   what it carried changes (docs/errors.md);
//! * observe units read NRP back at start-up, after such failures, one lease after units were
//!   taken back, and periodically (anti-entropy); no location unit or service deletion is in flight
//!   while an observe is, so that its snapshot never undoes a report folded meanwhile.
//!
//! Synchronous and clock-injected (`now` is passed in), so it is tested without a runtime.

mod batching;
mod config;
mod cut;
mod env;
mod flight;
mod pacing;
mod refusal;
mod refused;
mod report;
mod stagger;
mod unit;
use batching::Batching;
use flight::LocationFlight;
use stagger::Stagger;

use foldhash::{HashMap, HashSet};
use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::difftracker::dirty::DirtyQueue as Queue;
use crate::difftracker::{ActualSnapshot, DiffTracker, ServiceAction, ServiceChange, ServiceStep};
pub use config::DispatchConfig;
pub use cut::SPLIT_MIN_ADDRESSES;
pub use env::{DispatchEnv, DispatchObserver, Jitter, NoObserver, WallClock};
pub use pacing::WriteBudget;
pub use refusal::{RefusedItem, RefusedKind};
pub use refused::{AddressHold, RefusedAddress};
pub use unit::{
    AddressRefusal, ChangeError, Folded, Outcome, Report, ServiceProgress, Unit, UnitKind, UnitWork,
};

/// An error kept for status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorRecord {
    /// When (Unix ms).
    pub at_unix_ms: i64,
    /// The unit that failed.
    pub work_id: u64,
    /// The worker session the unit was leased to (the caller's id for the worker).
    pub worker: u64,
    /// What the unit carried, in short (`locations 10.0.0.1 +2 more`, `services create svc-a`,
    /// `observe`).
    pub unit: String,
    /// Error code (ARM code or a stable label).
    pub code: String,
    /// Message.
    pub message: String,
    /// Whether the work was parked (terminal) rather than retried.
    pub terminal: bool,
}

/// A unit taken back because its lease expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expired {
    /// The unit.
    pub work_id: u64,
    /// The worker session it was leased to.
    pub worker: u64,
}

/// Counters for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DispatchStats {
    /// Units handed out.
    pub units_cut: u64,
    /// Reports by (kind, result, code).
    pub outcomes: HashMap<(&'static str, &'static str, String), u64>,
    /// Leases that expired.
    pub lease_expiries: u64,
    /// Reports for units no longer leased to their sender.
    pub late_reports: u64,
    /// Locations and services parked after a terminal error, by the error's code.
    pub parked: HashMap<String, u64>,
    /// Reports that asked for a read-back before a retry (outcome `Repair`), by code.
    pub repairs: HashMap<String, u64>,
}

/// Something a unit carries: the key of the one-in-flight rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Location(IpAddr),
    Service(String),
}

#[derive(Debug, Clone, Copy)]
struct Backoff {
    attempts: u32,
    not_before: Instant,
}

#[derive(Debug)]
struct InFlight {
    worker: u64,
    /// When it was cut.
    started: Instant,
    deadline: Instant,
    work: UnitWork,
    /// The concurrent mutating calls it is counted for ([`Dispatcher::mutating_calls_in_flight`]).
    calls: usize,
}

/// When NRP is to be read back.
#[derive(Debug, Default)]
struct ObserveState {
    /// An observe is wanted as soon as possible (start-up, [`Dispatcher::request_observe`]): the
    /// next one that completes meets the wish.
    asap: bool,
    /// An observe is wanted by the report of this number (one that asked for a read-back, or that
    /// NRP could not have accepted): one cut after it meets the wish.
    after_report: Option<u64>,
    /// An observe is wanted once this time has come (one lease after units were taken back): one
    /// cut at or after it meets the wish.
    deferred: Option<Instant>,
    in_flight: Option<u64>,
    /// When the observe in flight (or the last one) was cut, and the number of the last report
    /// folded before: its snapshot meets the wishes made before.
    cut_at: Option<(Instant, u64)>,
    parts: ActualSnapshot,
    /// Service changes NRP confirmed while the observe was in flight: its snapshot may have been
    /// read before them, so they are recorded again once it is folded (else a creation the
    /// snapshot missed would be sent again: three writes for nothing).
    since_cut: Vec<crate::difftracker::ServiceChange>,
    observed_once: bool,
    last_at: Option<Instant>,
    /// Backoff after a failed observe.
    not_before: Option<Instant>,
}

impl ObserveState {
    /// Whether an observe may be cut now.
    fn due(&self, now: Instant, interval: Duration) -> bool {
        let wanted = self.asap
            || self.after_report.is_some()
            || self.deferred.is_some_and(|t| t <= now)
            || self
                .last_at
                .is_some_and(|last| now.saturating_duration_since(last) >= interval);
        wanted && self.in_flight.is_none() && self.not_before.is_none_or(|t| t <= now)
    }
}

const MAX_ERRORS: usize = 20;

/// Work units, leases, retries and anti-entropy for one gateway.
#[derive(Debug)]
pub struct Dispatcher {
    config: DispatchConfig,
    in_flight: HashMap<u64, InFlight>,
    /// Services in flight.
    busy: HashSet<Key>,
    /// Location work in flight (see [`flight`]).
    flight: LocationFlight,
    /// In-flight location units naming each service: a service is not deleted under them.
    service_refs_in_flight: HashMap<String, u32>,
    pending_locations: Queue<IpAddr>,
    pending_services: Queue<String>,
    /// The writes of the next mutating unit, as last seen (`pacing.rs`).
    writes_next: u32,
    /// When each pending key first became pending (for staleness).
    pending_since: HashMap<Key, Instant>,
    backoff: HashMap<Key, Backoff>,
    parked: HashMap<Key, ErrorRecord>,
    /// How many times in a row NRP refused each parked key's work (its refusal delay doubles with
    /// it); forgotten when the work goes through or its desired state (or NRP's) changes.
    refusals: HashMap<Key, u32>,
    /// Addresses NRP refused on their own, held on their refusal schedule (see [`refused`]).
    refused: refused::RefusedAddresses,
    /// The last retried (or repaired) failure of each key that has not gone through since: what
    /// the Admin API reports as "retrying" for a service or a location.
    failing: HashMap<Key, ErrorRecord>,
    /// Keys whose last failure asked for a read-back, with the number of that report: not cut
    /// again before an observe cut after it completes.
    awaiting_read_back: HashMap<Key, u64>,
    /// Reports folded so far (numbers the reports, to order them with observe cuts).
    reports: u64,
    observe: ObserveState,
    errors: VecDeque<ErrorRecord>,
    stats: DispatchStats,
    /// Times each key has been handed out since its change was last recorded (the unit's attempt).
    dispatches: HashMap<Key, u32>,
    /// Observe units handed out since the last completed observe.
    observe_dispatches: u32,
    wall: WallClock,
    jitter: Jitter,
    observer: Arc<dyn DispatchObserver>,
    pacing: WriteBudget,
    batching: Batching,
    stagger: Stagger,
    /// When the last location unit ended (reported, taken back or expired).
    last_location_end: Option<Instant>,
}

impl Dispatcher {
    /// A dispatcher that will start by observing NRP. `env` brings the wall clock (for the lease
    /// deadlines and error times it publishes), the jitter source and the observer of outcomes.
    pub fn new(config: DispatchConfig, env: DispatchEnv) -> Self {
        Self {
            config,
            in_flight: HashMap::default(),
            busy: HashSet::default(),
            flight: LocationFlight::default(),
            service_refs_in_flight: HashMap::default(),
            pending_locations: Queue::default(),
            pending_services: Queue::default(),
            writes_next: 1,
            pending_since: HashMap::default(),
            backoff: HashMap::default(),
            parked: HashMap::default(),
            refusals: HashMap::default(),
            refused: refused::RefusedAddresses::default(),
            failing: HashMap::default(),
            awaiting_read_back: HashMap::default(),
            reports: 0,
            observe: ObserveState {
                asap: true,
                ..ObserveState::default()
            },
            errors: VecDeque::new(),
            stats: DispatchStats::default(),
            dispatches: HashMap::default(),
            observe_dispatches: 0,
            wall: env.wall,
            jitter: env.jitter,
            observer: env.observer,
            pacing: WriteBudget::new(),
            batching: Batching::default(),
            stagger: Stagger::default(),
            last_location_end: None,
        }
    }

    /// The settings.
    pub fn config(&self) -> &DispatchConfig {
        &self.config
    }

    /// Whether NRP's actual state has been read back at least once.
    pub fn nrp_observed(&self) -> bool {
        self.observe.observed_once
    }

    /// The next moment at which time alone may change what this dispatcher does: a lease that
    /// expires ([`Dispatcher::expire`]), a backoff that ends, a deferred or backed-off observe, the
    /// next anti-entropy observe. `None`: nothing happens until something is written or reported.
    /// A driver sleeps until then (or until it is told of a change) instead of polling; waking
    /// early is harmless, waking late delays work by as much. Only moments after `now` count: one
    /// that passed already did its part (or waits for a report, which wakes the driver anyway).
    pub fn next_deadline(&self, now: Instant) -> Option<Instant> {
        let leases = self.in_flight.values().map(|u| u.deadline);
        let backoffs = self
            .backoff
            .values()
            .map(|b| b.not_before)
            .chain(self.refused.next_retry());
        let o = &self.observe;
        let observe = [
            o.deferred,
            o.not_before,
            o.last_at.map(|t| t + self.config.anti_entropy_interval),
        ];
        // While paced, the next mutating unit may go once the window has passed.
        let paced = (!self.pending_locations.is_empty() || !self.pending_services.is_empty())
            .then(|| self.pacing.held_until(&self.config, now, self.writes_next))
            .flatten();
        // A burst being gathered (from idle) is cut once it goes quiet or has lingered enough, or
        // after its first quiet interval if it is a trickle.
        let gathering = !self.pending_locations.is_empty() && self.location_units_in_flight() == 0;
        let gathered = gathering
            .then(|| self.batching.next_look(&self.config, now))
            .flatten();
        // A spaced location unit goes once its headway has passed.
        let spaced = (!self.pending_locations.is_empty())
            .then(|| {
                self.stagger
                    .held_until(&self.config, self.location_units_in_flight(), now)
            })
            .flatten();
        leases
            .chain(backoffs)
            .chain(observe.into_iter().flatten())
            .chain(paced)
            .chain(gathered)
            .chain(spaced)
            .filter(|t| *t > now)
            .min()
    }

    /// Makes this dispatcher spend from `budget`, shared with the other gateways of its
    /// subscription (see [`WriteBudget`]).
    pub fn share_write_budget(&mut self, budget: WriteBudget) {
        self.pacing = budget;
    }

    /// The write budget this dispatcher spends from.
    pub fn write_budget(&self) -> &WriteBudget {
        &self.pacing
    }

    /// The remaining writes last reported, if any.
    pub fn remaining_writes(&self) -> Option<u32> {
        self.pacing.remaining()
    }

    /// The headway between location units in steady churn (`None`: staggering off or nothing
    /// measured yet; contract §4.12).
    pub fn unit_headway(&self) -> Option<Duration> {
        self.stagger.headway(&self.config)
    }

    /// The spacing between mutating units while the write budget is tight: the batching window.
    /// `None`: not pacing (no budget reported, above the reserve, or pacing off).
    pub fn batching_window(&self) -> Option<Duration> {
        self.pacing.window(&self.config)
    }

    /// Asks for an observe unit as soon as possible.
    pub fn request_observe(&mut self) {
        self.observe.asap = true;
    }

    /// Locations and services held until NRP has been read back (their last failure showed the
    /// actual state to be wrong, or left it unknown).
    pub fn awaiting_read_back(&self) -> usize {
        self.awaiting_read_back.len()
    }

    /// Units leased out now.
    pub fn units_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Locations and services parked after a terminal error.
    pub fn parked_units(&self) -> usize {
        self.parked.len()
    }

    /// The terminal error that parked service `name` (canonical name), if it is parked.
    pub fn parked_service(&self, name: &str) -> Option<&ErrorRecord> {
        self.parked.get(&Key::Service(name.to_owned()))
    }

    /// The parked locations with the error that parked each.
    pub fn parked_locations(&self) -> impl Iterator<Item = (IpAddr, &ErrorRecord)> {
        self.parked.iter().filter_map(|(k, e)| match k {
            Key::Location(l) => Some((*l, e)),
            Key::Service(_) => None,
        })
    }

    /// The last retried or repaired failure of service `name` (canonical name), while its change
    /// has not gone through since.
    pub fn failing_service(&self, name: &str) -> Option<&ErrorRecord> {
        self.failing.get(&Key::Service(name.to_owned()))
    }

    /// The locations whose last change failed and is retried (or repaired), with that failure.
    pub fn failing_locations(&self) -> impl Iterator<Item = (IpAddr, &ErrorRecord)> {
        self.failing.iter().filter_map(|(k, e)| match k {
            Key::Location(l) => Some((*l, e)),
            Key::Service(_) => None,
        })
    }

    /// Whether a change of service `name` (canonical name) waits to be sent or is in flight.
    pub fn service_pending(&self, name: &str) -> bool {
        self.pending_since
            .contains_key(&Key::Service(name.to_owned()))
    }

    /// Whether a unit in flight carries the creation of service `name` (canonical name).
    pub fn service_creation_in_flight(&self, name: &str) -> bool {
        self.in_flight.values().any(|u| match &u.work {
            UnitWork::Services(changes) => changes
                .iter()
                .any(|c| c.action == ServiceAction::Create && c.name == name),
            _ => false,
        })
    }

    /// Whether a change of `location` waits to be sent or is in flight.
    pub fn location_pending(&self, location: IpAddr) -> bool {
        self.pending_since.contains_key(&Key::Location(location))
    }

    /// The most recent errors, newest last.
    pub fn last_errors(&self) -> Vec<ErrorRecord> {
        self.errors.iter().cloned().collect()
    }

    /// Counters.
    pub fn stats(&self) -> &DispatchStats {
        &self.stats
    }

    /// Age of the oldest change not yet applied in NRP.
    pub fn oldest_pending_age(&self, now: Instant) -> Option<Duration> {
        self.pending_since
            .values()
            .min()
            .map(|t| now.saturating_duration_since(*t))
    }

    /// Takes the tracker's changes in at `now` (as [`Dispatcher::next_unit`] does first): a driver
    /// calls it when woken by a write even with no worker free, so a burst's timing is known.
    pub fn take_changes(&mut self, tracker: &mut DiffTracker, now: Instant) {
        self.absorb(tracker, now);
    }

    /// Moves the tracker's dirty work into the pending queues. A parked key that changes again
    /// is unparked (its desired state changed).
    fn absorb(&mut self, tracker: &mut DiffTracker, now: Instant) {
        let dirty = tracker.take_dirty();
        if !dirty.locations.is_empty() {
            // From idle: no location unit is in flight, or has ended, for a quiet interval (not
            // the backlog left when a wave of units has just ended together).
            let idle = self.location_units_in_flight() == 0
                && self
                    .last_location_end
                    .is_none_or(|t| now >= t + self.config.batch_quiet);
            let waiting = !self.pending_locations.is_empty();
            self.batching.changed(&self.config, now, idle, waiting);
        }
        // Held addresses whose refusal delay has passed go with their location's next unit.
        for l in self.refused.due(now) {
            self.pending_locations.push(l);
        }
        for l in dirty.locations {
            let key = Key::Location(l);
            self.unpark(&key);
            self.pending_since.entry(key).or_insert(now);
            self.pending_locations.push(l);
        }
        for s in dirty.services {
            let key = Key::Service(s.clone());
            self.unpark(&key);
            self.pending_since.entry(key).or_insert(now);
            self.pending_services.push(s);
        }
    }

    fn ready(&self, key: &Key, now: Instant) -> bool {
        !self.busy.contains(key)
            && !self.awaiting_read_back.contains_key(key)
            && self.backoff.get(key).is_none_or(|b| b.not_before <= now)
    }

    /// Units in flight that an observe must not overlap: location units and service units with a
    /// deletion. A creation may (a snapshot read before it lands only makes it go again).
    fn units_holding_observe(&self) -> usize {
        self.in_flight
            .values()
            .filter(|u| match &u.work {
                UnitWork::Observe => false,
                UnitWork::Locations(_) => true,
                UnitWork::Services(changes) => {
                    changes.iter().any(|c| c.action == ServiceAction::Delete)
                }
            })
            .count()
    }

    /// Cuts the next unit for `worker`, if there is work: an observe first (start-up, read-back,
    /// anti-entropy), then service changes, then packed location changes. An observe waits for the
    /// location units and service deletions in flight to end, and none is cut while it is wanted
    /// or in flight: a report folded between its read and its fold would be undone by its older
    /// snapshot (NRP would keep what the server then believes gone, or lose what it believes
    /// there). Service creations still go: one confirmed while the observe is in flight is
    /// recorded again once its snapshot is folded (the snapshot may have been read before it).
    pub fn next_unit(
        &mut self,
        tracker: &mut DiffTracker,
        worker: u64,
        work_id: u64,
        now: Instant,
    ) -> Option<Unit> {
        self.absorb(tracker, now);
        self.pacing.fold(&self.config, now);
        let due = self.observe.due(now, self.config.anti_entropy_interval);
        let room = self.mutation_room();
        let work = if due && self.units_holding_observe() == 0 {
            self.observe.in_flight = Some(work_id);
            self.observe.cut_at = Some((now, self.reports));
            self.observe.parts = ActualSnapshot::default();
            self.observe.since_cut.clear();
            Some(UnitWork::Observe)
        } else {
            // While NRP is read back (or waits to be), only creations go. No location work before
            // NRP has been read back at all: a partial update sets an address's whole ref, so a
            // cut from a partial view of NRP would drop refs NRP has.
            let hold = due || self.observe.in_flight.is_some();
            let locations = self.observe.observed_once && !hold;
            let need = self.writes_next(tracker, now);
            if room == 0 || self.pacing.held_until(&self.config, now, need).is_some() {
                return None;
            }
            self.cut_services(tracker, now, hold).or_else(|| {
                // A burst is gathered only if it began from idle (`batching.rs`); in steady churn
                // the headway spaces the units instead (`stagger.rs`).
                let out = self.location_units_in_flight();
                let gathering = out == 0
                    && self
                        .batching
                        .held_until(&self.config, self.pending_locations.len(), room, now)
                        .is_some()
                    && !self.trickle(tracker, now);
                // While paced by the write budget, the budget spaces the units; otherwise, in
                // steady churn, the headway does.
                let paced = self.pacing.window(&self.config).is_some();
                let spaced = !paced && self.stagger.held_until(&self.config, out, now).is_some();
                // The backlog is spread over the free slots, unless calls are bounded by the
                // write budget (then each unit carries all that waits) or not at all, or units
                // take turns (a second unit beside this one would be a wave), or the backlog did
                // not begin from idle: in steady churn, what built up while all slots were busy
                // goes as one unit (up to the bound) and the next a headway later — spread, it
                // would be a wave of units that end together, and the next backlog would be
                // spread again.
                let staggered = self.stagger.headway(&self.config).is_some();
                let slots = if self.config.max_mutating_units_in_flight == 0
                    || paced
                    || self.stagger.whole(&self.config, out)
                    || (staggered && !self.batching.spreads())
                {
                    1
                } else {
                    room
                };
                // A late turn is one slot freeing after its time; several free at once are not.
                let late = (slots == 1 && room == 1)
                    .then(|| self.stagger.late_turn(&self.config, out, now))
                    .flatten();
                if locations && !gathering && !spaced {
                    self.cut_locations(tracker, now, slots, late)
                } else {
                    None
                }
            })
        }?;
        self.stats.units_cut += 1;
        self.pacing.cut(&self.config, &work, now);
        let deadline = now + self.config.lease;
        let attempt = self.count_dispatch(&work);
        let calls = cut::calls_of(&work, room);
        let unit = Unit {
            work_id,
            revision: tracker.revision(),
            lease_deadline_unix_ms: self.wall.unix_ms(deadline),
            lease: self.config.lease,
            attempt,
            work: work.clone(),
            side_by_side: match work {
                UnitWork::Services(_) => u32::try_from(calls).unwrap_or(u32::MAX),
                _ => 0,
            },
        };
        self.in_flight.insert(
            work_id,
            InFlight {
                worker,
                started: now,
                deadline,
                work,
                calls,
            },
        );
        Some(unit)
    }

    /// The concurrent mutating NRP calls the units in flight may make: 1 per location unit (its calls
    /// go one after the other), a service unit's `side_by_side` (`cut::calls_of`).
    pub fn mutating_calls_in_flight(&self) -> usize {
        self.in_flight.values().map(|u| u.calls).sum()
    }

    /// The location units in flight.
    fn location_units_in_flight(&self) -> usize {
        self.in_flight
            .values()
            .filter(|u| matches!(u.work, UnitWork::Locations(_)))
            .count()
    }

    /// Frees what a unit held (at `now`) and returns it.
    fn finish(&mut self, work_id: u64, now: Instant) -> Option<InFlight> {
        let unit = self.in_flight.remove(&work_id)?;
        match &unit.work {
            UnitWork::Observe => self.observe.in_flight = None,
            UnitWork::Services(changes) => {
                for c in changes {
                    self.busy.remove(&Key::Service(c.name.clone()));
                }
            }
            UnitWork::Locations(diffs) => {
                self.last_location_end = Some(now);
                for d in diffs {
                    self.flight.release(d);
                }
                for (name, n) in cut::service_refs(diffs) {
                    if let Some(count) = self.service_refs_in_flight.get_mut(name) {
                        *count = count.saturating_sub(n);
                        if *count == 0 {
                            self.service_refs_in_flight.remove(name);
                        }
                    }
                }
            }
        }
        Some(unit)
    }

    /// Puts what a unit carried back in the queues (after a failure, release or expiry).
    fn requeue(&mut self, work: &UnitWork, skip: &[u32], backoff: Option<(Duration, Instant)>) {
        if let UnitWork::Observe = work {
            // Still wanted (what wanted it is cleared only by a completed observe).
            self.observe.asap = true;
            if let Some((delay, now)) = backoff {
                self.observe.not_before = Some(now + delay);
            }
            return;
        }
        // Pushed to the front in reverse, so the unit's order is kept.
        for (i, key) in work.keys().into_iter().enumerate().rev() {
            if skip.contains(&(i as u32)) {
                continue;
            }
            if let Some((hint, now)) = backoff {
                let attempts = self.backoff.get(&key).map_or(0, |b| b.attempts) + 1;
                let delay = hint.max(self.retry_delay(attempts));
                self.backoff.insert(
                    key.clone(),
                    Backoff {
                        attempts,
                        not_before: now + delay,
                    },
                );
            }
            match key {
                Key::Location(l) => self.pending_locations.push_front(l),
                Key::Service(s) => self.pending_services.push_front(s),
            }
        }
    }

    /// Exponential backoff with full jitter in [delay/2, delay], capped.
    fn retry_delay(&mut self, attempts: u32) -> Duration {
        let exp = self
            .config
            .retry_base
            .saturating_mul(1u32 << attempts.saturating_sub(1).min(16));
        let capped = exp.min(self.config.retry_max);
        capped.mul_f64(self.jitter.next_factor())
    }
}

#[cfg(test)]
mod cut_tests;
#[cfg(test)]
mod pacing_tests;
#[cfg(test)]
mod refused_tests;
#[cfg(test)]
mod repair_tests;
#[cfg(test)]
mod service_units_tests;
#[cfg(test)]
mod tests;
