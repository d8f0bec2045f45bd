//! Cutting service and location units out of the pending queues.

use std::time::Instant;

use super::{Dispatcher, Key, UnitWork};
use crate::difftracker::{DiffTracker, LocationDiff, ServiceAction, ServiceChange, ServiceStatus};

/// The fewest locations a backlog is split into a unit for, when it is spread over free slots.
/// Each split costs one more write of the subscription's budget and a call's fixed latency
/// (≈ 100 ms); it pays when the unit's per-address time (≈ 0.05 ms each) is comparable: 32
/// locations of a typical ~40 changed addresses are ≈ 1,300 addresses, ≈ 64 ms.
pub const SPLIT_MIN_LOCATIONS: usize = 32;

impl Dispatcher {
    pub(super) fn cut_services(
        &mut self,
        tracker: &DiffTracker,
        now: Instant,
        room: usize,
        creations_only: bool,
    ) -> Option<UnitWork> {
        let mut changes: Vec<ServiceChange> = Vec::new();
        let max = self.config.max_services_per_unit.max(1).min(room);
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
    /// unit's share of what waits (`slots` free mutating slots: a large backlog is spread over
    /// them, so one wave carries it rather than one wide unit and idle slots; a small one stays
    /// whole, see [`SPLIT_MIN_LOCATIONS`]).
    pub(super) fn cut_locations(
        &mut self,
        tracker: &DiffTracker,
        now: Instant,
        slots: usize,
    ) -> Option<UnitWork> {
        let mut diffs: Vec<LocationDiff> = Vec::new();
        let mut addresses = 0usize;
        let mut keep = Vec::new();
        let mut scanned = 0usize;
        let mut full = false;
        let budget = self.pending_locations.len();
        let units = slots.min(budget / SPLIT_MIN_LOCATIONS).max(1);
        let share = budget.div_ceil(units);
        let most = self.config.max_locations_per_unit.clamp(1, share.max(1));
        while diffs.len() < most && scanned < budget {
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
            let Some(diff) = tracker.location_diff(location) else {
                if in_flight {
                    // What is in flight may land other than now desired: looked at again after.
                    keep.push(location);
                    continue;
                }
                self.pending_since.remove(&key);
                self.failing.remove(&key);
                self.backoff.remove(&key);
                self.dispatches.remove(&key);
                continue;
            };
            let admitted = self.flight.admit(diff);
            if admitted.held_back || in_flight {
                keep.push(location);
            }
            let Some(diff) = admitted.diff else {
                continue;
            };
            if !diffs.is_empty()
                && addresses + diff.addresses.len() > self.config.max_addresses_per_unit
            {
                if !admitted.held_back && !in_flight {
                    keep.push(location);
                }
                full = true;
                break;
            }
            addresses += diff.addresses.len();
            self.flight.take(&diff);
            diffs.push(diff);
        }
        for location in keep.into_iter().rev() {
            self.pending_locations.push_front(location);
        }
        if diffs.is_empty() {
            return None;
        }
        // Ready work left behind (a bound or the share was reached before the queue was seen
        // through): a burst, whose next unit is not held for the headway.
        let left_behind = full || (diffs.len() >= most && scanned < budget);
        self.stagger.started(now, left_behind);
        self.batching.cut();
        for name in diffs
            .iter()
            .flat_map(|d| d.addresses.iter().flat_map(|a| a.services.iter()))
        {
            *self.service_refs_in_flight.entry(name.clone()).or_default() += 1;
        }
        Some(UnitWork::Locations(diffs))
    }
}
