//! Cutting service and location units out of the pending queues.

use std::time::Instant;

use super::refused::Admitted;
use super::stagger::LateTurn;
use super::{Dispatcher, Key, UnitWork};
use crate::difftracker::{
    AddressUpdateAction, DiffTracker, LocationDiff, ServiceAction, ServiceChange, ServiceStatus,
};

/// The fewest addresses a backlog is split into a unit for, when it is spread over free slots.
/// Each split costs one more write of the subscription's budget and holds one more slot for a
/// call's fixed latency (≈ 100 ms); it pays when the unit's per-address time (≈ 0.05 ms each) is
/// comparable: 1,000 addresses are ≈ 50 ms. Counted in addresses, not locations: the first
/// changes of a rollout touch hundreds of locations with one or two addresses each, and four thin
/// units of them would hold every slot for a call while the rest of the rollout arrives.
pub const SPLIT_MIN_ADDRESSES: usize = 1_000;

impl Dispatcher {
    /// Counts one more hand-out of each key `work` carries; returns the unit's attempt: 1 the first
    /// time, more when any of its keys was handed out before and not yet recorded (a retry after a
    /// failure, an expired lease or a worker that disconnected).
    pub(super) fn count_dispatch(&mut self, work: &UnitWork) -> u32 {
        if let UnitWork::Observe = work {
            self.observe_dispatches += 1;
            return self.observe_dispatches;
        }
        let mut attempt = 1;
        for key in work.keys() {
            let n = self.dispatches.entry(key).or_default();
            *n += 1;
            attempt = attempt.max(*n);
        }
        attempt
    }

    /// How many more concurrent mutating calls may be handed out (`usize::MAX`: no bound).
    pub(super) fn mutation_room(&self) -> usize {
        match self.config.max_mutating_units_in_flight {
            0 => usize::MAX,
            cap => cap.saturating_sub(self.mutating_calls_in_flight()),
        }
    }

    pub(super) fn cut_services(
        &mut self,
        tracker: &DiffTracker,
        now: Instant,
        creations_only: bool,
    ) -> Option<UnitWork> {
        let mut changes: Vec<ServiceChange> = Vec::new();
        // Up to the unit bound whatever the room: the unit is counted for `min(changes, room)` calls
        // side by side (`calls_of`), and its registrations go in one `updateServices` call.
        let max = self.config.max_services_per_unit.max(1);
        let mut keep = Vec::new();
        while changes.len() < max {
            let Some(name) = self.pending_services.pop() else {
                break;
            };
            let key = Key::Service(name.clone());
            if !self.ready(&key, now) {
                keep.push(name);
                continue;
            }
            match tracker.service_status(&name) {
                ServiceStatus::Pending(change) => {
                    let referenced =
                        self.service_refs_in_flight.get(&name).copied().unwrap_or(0) > 0;
                    if change.action == ServiceAction::Delete && (referenced || creations_only) {
                        keep.push(name);
                    } else {
                        self.busy.insert(key);
                        changes.push(change);
                    }
                }
                _ => {
                    // In sync, draining or withheld: it is dirtied again when that changes.
                    self.parked.remove(&key);
                    self.refusals.remove(&key);
                    self.pending_since.remove(&key);
                    self.failing.remove(&key);
                    self.dispatches.remove(&key);
                }
            }
        }
        for name in keep.into_iter().rev() {
            self.pending_services.push_front(name);
        }
        (!changes.is_empty()).then_some(UnitWork::Services(changes))
    }

    /// Cuts a location unit: the pending locations in order, up to the unit bounds and to this
    /// unit's share of what waits. With `slots` free mutating slots a large backlog is spread over
    /// them in even shares of addresses, so one wave carries it and its calls end together; a
    /// small one stays whole (see [`SPLIT_MIN_ADDRESSES`]). A partial update that would overflow
    /// the share is split: the unit takes the addresses that fit, the rest stays pending (NRP
    /// applies a partial update per address, and `flight.rs` keeps the two parts apart). A full
    /// replacement is never split. A `late` turn takes its share of the backlog (`stagger.rs`).
    pub(super) fn cut_locations(
        &mut self,
        tracker: &DiffTracker,
        now: Instant,
        slots: usize,
        late: Option<LateTurn>,
    ) -> Option<UnitWork> {
        let mut diffs: Vec<LocationDiff> = Vec::new();
        let mut addresses = 0usize;
        // Locations that go back to the front of the queue (not served, or split: their rest goes
        // first next time) and to its back (served whole, still pending while in flight): a
        // location served goes behind those the unit did not reach, so that units cut short (a
        // share, a bound) take turns over the locations instead of serving the same ones first
        // every time.
        let mut keep = Vec::new();
        let mut served = Vec::new();
        let mut scanned = 0usize;
        // Stopped with ready work behind (a bound or the share reached).
        let mut stopped = false;
        let budget = self.pending_locations.len();
        let (share, everything) = match late {
            Some(turn) => self.share_of_turn(tracker, now, turn.share),
            None => self.share_of_wave(tracker, now, slots),
        };
        let most = self.config.max_locations_per_unit.max(1);
        while diffs.len() < most && addresses < share && scanned < budget {
            let Some(location) = self.pending_locations.pop() else {
                break;
            };
            scanned += 1;
            let key = Key::Location(location);
            if !self.ready(&key, now) {
                keep.push(location);
                continue;
            }
            let in_flight = self.flight.holds(location);
            // Addresses NRP refused on their own wait out their refusal delay (`refused.rs`).
            let diff = match tracker.location_diff(location) {
                Some(diff) => match self.refused.admit(tracker, diff) {
                    Admitted::Whole(diff) | Admitted::Trimmed(diff) => Some(diff),
                    Admitted::AllHeld => None,
                },
                None => {
                    self.refused.forget_location(location);
                    None
                }
            };
            let Some(diff) = diff else {
                if in_flight {
                    // What is in flight may land other than now desired: looked at again after.
                    keep.push(location);
                    continue;
                }
                self.pending_since.remove(&key);
                self.failing.remove(&key);
                self.backoff.remove(&key);
                self.dispatches.remove(&key);
                self.parked.remove(&key);
                self.refusals.remove(&key);
                continue;
            };
            let admitted = self.flight.admit(diff);
            let stays = admitted.held_back || in_flight;
            let Some(mut diff) = admitted.diff else {
                if stays {
                    keep.push(location);
                }
                continue;
            };
            let room = share - addresses;
            let mut split = false;
            if diff.addresses.len() > room {
                if diff.action == AddressUpdateAction::Partial {
                    // Take what fits; the rest goes in another unit.
                    diff.addresses.truncate(room);
                    split = true;
                    stopped = true;
                } else if !diffs.is_empty() {
                    // A full replacement goes whole: in the next unit.
                    keep.push(location);
                    stopped = true;
                    break;
                }
                // Else a full replacement larger than the share goes alone.
            }
            if split {
                keep.push(location);
            } else if stays {
                served.push(location);
            }
            addresses += diff.addresses.len();
            self.flight.take(&diff);
            diffs.push(diff);
        }
        stopped |= scanned < budget && (diffs.len() >= most || (addresses >= share && !everything));
        for location in keep.into_iter().rev() {
            self.pending_locations.push_front(location);
        }
        for location in served {
            self.pending_locations.push(location);
        }
        if diffs.is_empty() {
            return None;
        }
        // Ready work left behind (a bound or the share was reached before the queue was seen
        // through): a burst, whose next unit is not held for the headway.
        // A late turn leaves what came after it for the next turn, a headway after this one's.
        match late {
            Some(turn) => self.stagger.started(turn.due, false),
            None => self.stagger.started(now, stopped),
        }
        self.batching.cut();
        for (name, n) in service_refs(&diffs) {
            match self.service_refs_in_flight.get_mut(name) {
                Some(count) => *count += n,
                None => {
                    self.service_refs_in_flight.insert(name.to_owned(), n);
                }
            }
        }
        Some(UnitWork::Locations(diffs))
    }

    /// Whether the burst being gathered is a trickle: its first quiet interval has passed and it
    /// brought less than a split's worth of ready addresses ([`SPLIT_MIN_ADDRESSES`]), so holding
    /// it longer would delay it for no wider wave (steady churn starting, a slow rollout).
    pub(super) fn trickle(&self, tracker: &DiffTracker, now: Instant) -> bool {
        self.batching
            .began()
            .is_some_and(|first| now >= first + self.config.batch_quiet)
            && self.ready_backlog(tracker, now, SPLIT_MIN_ADDRESSES) < SPLIT_MIN_ADDRESSES
    }

    /// The ready backlog's addresses (less what is in flight), weighed without building the
    /// diffs, counted only up to `cap`.
    pub(super) fn ready_backlog(&self, tracker: &DiffTracker, now: Instant, cap: usize) -> usize {
        let mut backlog = 0usize;
        for &location in self.pending_locations.iter() {
            if self.ready(&Key::Location(location), now) {
                let len = tracker.location_diff_len(location);
                backlog += self.flight.may_go(location, len);
                if backlog >= cap {
                    break;
                }
            }
        }
        backlog
    }

    /// The addresses a late turn carries (its `share` of the ready backlog, at least 1, at most
    /// the unit bound), and whether that is all of it.
    fn share_of_turn(&self, tracker: &DiffTracker, now: Instant, share: f64) -> (usize, bool) {
        let bound = self.config.max_addresses_per_unit.max(1);
        let backlog = self.ready_backlog(tracker, now, usize::MAX);
        let take = ((backlog as f64 * share).ceil() as usize).clamp(1, bound);
        (take, take >= backlog)
    }

    /// The addresses the next location unit may carry, and whether that is all the ready backlog:
    /// the unit bound, or with `slots` > 1 free slots an even share of the ready backlog over as
    /// many units as it is worth splitting into (at least [`SPLIT_MIN_ADDRESSES`] each). The
    /// backlog is weighed without building its diffs (less what is in flight), and only until it
    /// fills every free slot.
    fn share_of_wave(&self, tracker: &DiffTracker, now: Instant, slots: usize) -> (usize, bool) {
        let bound = self.config.max_addresses_per_unit.max(1);
        if slots <= 1 {
            return (bound, false);
        }
        let fills = bound.saturating_mul(slots);
        let backlog = self.ready_backlog(tracker, now, fills);
        if backlog >= fills {
            return (bound, false);
        }
        let units = slots.min(backlog / SPLIT_MIN_ADDRESSES).max(1);
        let share = backlog.div_ceil(units).clamp(1, bound);
        (share, share >= backlog)
    }
}

/// The concurrent mutating calls a unit cut with `room` free is counted for: none for an observe,
/// 1 for a location unit (its calls go one after the other), and for a service unit as many of its
/// changes as go side by side: all of them, at most `room`. A service unit carries up to
/// [`super::DispatchConfig::max_services_per_unit`] changes whatever the room, so that their
/// registrations go in one `updateServices` call; the worker runs them `side_by_side` at a time.
pub(super) fn calls_of(work: &UnitWork, room: usize) -> usize {
    match work {
        UnitWork::Observe => 0,
        UnitWork::Locations(_) => 1,
        UnitWork::Services(changes) => changes.len().min(room).max(1),
    }
}

/// How many addresses of `diffs` refer to each service: counted per unit, so that the count of
/// refs in flight is updated once per service, not once per address.
pub(super) fn service_refs(diffs: &[LocationDiff]) -> foldhash::HashMap<&str, u32> {
    let mut refs = foldhash::HashMap::default();
    for name in diffs
        .iter()
        .flat_map(|d| d.addresses.iter().flat_map(|a| a.services.iter()))
    {
        *refs.entry(name.as_str()).or_default() += 1;
    }
    refs
}
