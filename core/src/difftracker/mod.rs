//! The DiffTracker: desired state (from Kubernetes) against actual state (confirmed by NRP), and the
//! incremental difference between them, for one gateway.
//!
//! Pure domain code: no gRPC, no async runtime, no Kubernetes. The rules are those of
//! `docs/contract.md` §3; `docs/architecture.md` maps each rule to the function that implements it.
//!
//! * [`desired`] — mutations from Kubernetes: services, egresses, endpoints (level and edge), pods.
//! * [`actual`] — what NRP accepted (recorded exactly as sent) and what an observation read back.
//! * [`diff`] — the readiness-filtered, ordered difference; per location in time proportional to
//!   that location, driven by the dirty sets kept here.

pub mod actual;
mod addrmap;
pub mod desired;
pub mod diff;
pub(crate) mod dirty;
mod egress_family;
pub mod error;
pub mod family;
pub mod identity;
pub mod ip;
mod location;
mod members;
mod natgw;
mod pods;
pub mod progress;
pub mod scope;
pub mod view;
pub mod withheld;

use std::net::IpAddr;

pub use actual::{ActualSnapshot, ReportError};
pub use desired::{Endpoint, EndpointIp, Operation, PodIpUpdate, PodUpdate};
pub use diff::{
    AddressUpdate, AddressUpdateAction, Diff, LocationDiff, ServiceAction, ServiceChange,
    ServiceStatus,
};
pub use error::{InvalidInput, MAX_QUOTED_CHARS, Quoted, Reason, excerpt, quote};
pub use family::IpFamily;
pub use identity::ServiceKind;
pub use progress::ServiceStep;
pub use view::{AddressView, Counts, LocationView, ServiceView};
pub use withheld::{Withheld, WithheldLocations};

use dirty::DirtyQueue;
use identity::{ServiceId, ServiceTable};
use location::{AddressIndex, Desired, LocationId, LocationTable, RefBuf, for_each_change};

/// Dirty work taken from the tracker: locations and services whose diff may be non-empty.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DirtyWork {
    /// Locations to re-diff, oldest change first.
    pub locations: Vec<IpAddr>,
    /// Services (canonical names) to re-diff, oldest change first.
    pub services: Vec<String>,
}

/// Desired vs actual state of one gateway, with incremental change tracking.
#[derive(Debug, Clone)]
pub struct DiffTracker {
    services: ServiceTable,
    locations: LocationTable,
    /// Where each desired address lives (an address is desired at one location at most).
    desired_at: AddressIndex,
    dirty_locations: DirtyQueue<IpAddr>,
    dirty_services: DirtyQueue<Box<str>>,
    /// The removal gate (see [`withheld`]).
    withheld: Withheld,
    revision: u64,
    actual_addresses: u64,
    actual_locations: u64,
    /// Buffers reused by the endpoint updates, so that the hot path allocates nothing.
    scratch: desired::Scratch,
}

impl Default for DiffTracker {
    fn default() -> Self {
        Self::new()
    }
}

impl DiffTracker {
    /// An empty tracker that emits removals (see [`DiffTracker::set_withheld`]).
    pub fn new() -> Self {
        Self {
            services: ServiceTable::default(),
            locations: LocationTable::default(),
            desired_at: AddressIndex::default(),
            dirty_locations: DirtyQueue::default(),
            dirty_services: DirtyQueue::default(),
            withheld: Withheld::nothing(),
            revision: 0,
            actual_addresses: 0,
            actual_locations: 0,
            scratch: desired::Scratch::default(),
        }
    }

    /// Revision of the desired state: grows with every desired change that changed something.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Takes every dirty location and service (FIFO). The caller computes their diffs; a location
    /// whose work fails must be retried by the caller, as nothing marks it dirty again.
    pub fn take_dirty(&mut self) -> DirtyWork {
        DirtyWork {
            locations: self.dirty_locations.drain().collect(),
            services: self.dirty_services.drain().map(String::from).collect(),
        }
    }

    /// Whether a location is waiting in the dirty set.
    pub fn is_location_dirty(&self, location: IpAddr) -> bool {
        self.dirty_locations.contains(&location)
    }

    /// Whether a service (canonical name) is waiting in the dirty set.
    pub fn is_service_dirty(&self, name: &str) -> bool {
        self.dirty_services.contains(name)
    }

    /// A service became (un)desired or appeared in / vanished from NRP: it, and every location
    /// whose filtered refs depend on it, must be re-diffed.
    fn service_changed(&mut self, id: ServiceId) {
        for location in self.locations_of(id) {
            self.dirty_locations.push(self.locations.ip(location));
        }
        self.dirty_service(id);
    }

    /// The locations where a desired address refers to `id`, each once: from the address index of
    /// an inbound identity, from the marks of an egress (dropping those with no pod of it left).
    fn locations_of(&mut self, id: ServiceId) -> Vec<LocationId> {
        let entry = self.services.get(id);
        if entry.kind == ServiceKind::Inbound {
            let mut out: Vec<LocationId> = entry.addresses.iter().map(|(_, l)| l).collect();
            out.sort_unstable();
            out.dedup();
            return out;
        }
        let (used, stale): (Vec<LocationId>, Vec<LocationId>) = entry
            .egress_locations
            .iter()
            .partition(|l| self.egress_is_at(id, *l));
        let marks = &mut self.services.get_mut(id).egress_locations;
        for l in stale {
            marks.remove(l);
        }
        used
    }

    /// Whether a desired address at `location` has the egress `id`.
    fn egress_is_at(&self, id: ServiceId, location: LocationId) -> bool {
        self.locations.by_id(location).is_some_and(|(_, loc)| {
            loc.addresses
                .iter()
                .any(|(_, slot)| slot.outbound == Some(id))
        })
    }

    fn dirty_service(&mut self, id: ServiceId) {
        let name = self.services.get(id).name.clone();
        self.dirty_services.push(name);
    }

    /// Changes the desired part of `address` at `location` in place (an empty result removes it),
    /// keeping counts, the reverse index, the address index and the dirty set in step. Egress pod
    /// counts are the caller's.
    fn update_desired(&mut self, location: IpAddr, address: IpAddr, f: impl FnOnce(&mut Desired)) {
        let (location_id, loc) = self.locations.get_or_create(location);
        let slot = loc.addresses.get_or_insert_default(address);
        let mut desired = slot.desired();
        let (before, before_pod) = (desired.refs(), desired.pod);
        let was = !before.is_empty();
        f(&mut desired);
        let after = desired.refs();
        let changed = before != after || before_pod != desired.pod;
        let is = !after.is_empty();
        slot.set_desired(&desired);
        // Only an emptied slot needs the (three-lookup) cleanup: skip it on the hot path.
        let emptied = slot.is_empty();
        if !changed && was == is {
            if emptied {
                self.cleanup(location, address);
            }
            return;
        }
        if was != is {
            if is {
                loc.desired_addresses += 1;
                self.desired_at.insert(address, location_id);
            } else {
                loc.desired_addresses -= 1;
                self.desired_at.remove(&address);
            }
        }
        let services = &mut self.services;
        for_each_change(&before, &after, |id, d| {
            services.add_desired_ref(id, location_id, address, d);
            if d < 0 {
                services.release_if_unused(id);
            }
        });
        self.revision += 1;
        self.dirty_locations.push(location);
        if emptied {
            self.cleanup(location, address);
        }
    }

    /// Takes the whole desired part of an address away from a location.
    fn take_desired(&mut self, location: IpAddr, address: IpAddr) -> Option<Desired> {
        let mut taken = None;
        self.update_desired(location, address, |d| taken = Some(std::mem::take(d)));
        taken.filter(|d| !d.is_empty())
    }

    /// Replaces the actual part of `address` at `location` (NRP's confirmed ref, sorted; an empty
    /// ref = NRP does not have the address there).
    fn set_actual(&mut self, location: IpAddr, address: IpAddr, new: &[ServiceId]) {
        let (_, loc) = self.locations.get_or_create(location);
        let slot = loc.addresses.get_or_insert_default(address);
        if slot.actual() == new {
            self.cleanup(location, address);
            return;
        }
        let (was, is) = (slot.has_actual(), !new.is_empty());
        let before = RefBuf::from_slice(slot.actual());
        slot.set_actual(new);
        if was != is {
            if is {
                loc.actual_addresses += 1;
                self.actual_addresses += 1;
            } else {
                loc.actual_addresses -= 1;
                self.actual_addresses -= 1;
            }
        }
        let services = &mut self.services;
        let mut drained = RefBuf::new();
        for_each_change(&before, new, |id, d| {
            services.add_actual_ref(id, d);
            if d < 0 && services.get(id).actual_refs == 0 {
                drained.push(id);
            }
        });
        for id in drained {
            // The last NRP reference is gone: a pending deletion may now proceed.
            self.dirty_service(id);
            self.services.release_if_unused(id);
        }
        self.dirty_locations.push(location);
        self.cleanup(location, address);
    }

    /// Records whether NRP has a location at all.
    fn set_in_nrp(&mut self, location: IpAddr, in_nrp: bool) {
        let (_, loc) = self.locations.get_or_create(location);
        if loc.in_nrp != in_nrp {
            loc.in_nrp = in_nrp;
            if in_nrp {
                self.actual_locations += 1;
            } else {
                self.actual_locations -= 1;
            }
            self.dirty_locations.push(location);
        }
        self.locations.remove_if_empty(&location);
    }

    /// Drops an address that neither side has any more, and a location left with nothing.
    fn cleanup(&mut self, location: IpAddr, address: IpAddr) {
        let Some(loc) = self.locations.get_mut(&location) else {
            return;
        };
        if loc.addresses.get(&address).is_some_and(|s| s.is_empty()) {
            loc.addresses.remove(&address);
        }
        self.locations.remove_if_empty(&location);
    }
}

#[cfg(test)]
mod family_tests;
#[cfg(test)]
mod index_tests;
#[cfg(test)]
mod tests;
