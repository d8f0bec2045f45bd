//! Location work in flight. A full replacement of a location (its first programming, or its
//! deletion) holds the whole location until its call ends; a partial update holds only the
//! addresses it carries, so a change to another address of the same location can go in another
//! unit meanwhile instead of waiting a whole call (NRP applies a partial update per address).

use foldhash::{HashMap, HashSet};
use std::net::IpAddr;

use crate::difftracker::{AddressUpdateAction, LocationDiff};

#[derive(Debug, Default)]
struct Held {
    /// A full replacement is in flight.
    full: bool,
    /// Units in flight at this location.
    units: u32,
    /// Addresses carried by the partial updates in flight.
    addresses: HashSet<IpAddr>,
}

/// What is in flight, per location.
#[derive(Debug, Default)]
pub(super) struct LocationFlight {
    held: HashMap<IpAddr, Held>,
}

/// What may go of a location's diff beside the units in flight.
pub(super) struct Admitted {
    /// The diff trimmed to what may go now (`None`: nothing).
    pub diff: Option<LocationDiff>,
    /// Part of the diff waits for a unit in flight: the location stays pending.
    pub held_back: bool,
}

impl LocationFlight {
    /// Whether a unit in flight carries work of `location`.
    pub(super) fn holds(&self, location: IpAddr) -> bool {
        self.held.contains_key(&location)
    }

    /// Trims `diff` to what may go now: all of it when nothing is in flight at its location;
    /// nothing when a full replacement is in flight or `diff` is one; else its addresses that no
    /// unit in flight carries.
    pub(super) fn admit(&self, mut diff: LocationDiff) -> Admitted {
        let Some(held) = self.held.get(&diff.location) else {
            return Admitted {
                diff: Some(diff),
                held_back: false,
            };
        };
        if held.full || diff.action == AddressUpdateAction::Full {
            return Admitted {
                diff: None,
                held_back: true,
            };
        }
        let before = diff.addresses.len();
        diff.addresses
            .retain(|a| !held.addresses.contains(&a.address));
        let held_back = diff.addresses.len() < before;
        Admitted {
            diff: (!diff.addresses.is_empty()).then_some(diff),
            held_back,
        }
    }

    /// Of a location's diff of `len` addresses, about how many may go beside the units in flight
    /// (exact when the addresses in flight are all still in the diff, as in a burst).
    pub(super) fn may_go(&self, location: IpAddr, len: usize) -> usize {
        match self.held.get(&location) {
            None => len,
            Some(held) if held.full => 0,
            Some(held) => len.saturating_sub(held.addresses.len()),
        }
    }

    /// Notes that `diff` was cut.
    pub(super) fn take(&mut self, diff: &LocationDiff) {
        let held = self.held.entry(diff.location).or_default();
        held.units += 1;
        if diff.action == AddressUpdateAction::Full {
            held.full = true;
        } else {
            held.addresses
                .extend(diff.addresses.iter().map(|a| a.address));
        }
    }

    /// Notes that the unit that carried `diff` ended (reported, taken back or expired).
    pub(super) fn release(&mut self, diff: &LocationDiff) {
        let Some(held) = self.held.get_mut(&diff.location) else {
            return;
        };
        held.units = held.units.saturating_sub(1);
        if held.units == 0 {
            self.held.remove(&diff.location);
        } else if diff.action == AddressUpdateAction::Full {
            held.full = false;
        } else {
            for a in &diff.addresses {
                held.addresses.remove(&a.address);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::difftracker::AddressUpdate;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn diff(action: AddressUpdateAction, addresses: &[&str]) -> LocationDiff {
        LocationDiff {
            location: ip("10.0.0.1"),
            action,
            addresses: addresses
                .iter()
                .map(|a| AddressUpdate {
                    address: ip(a),
                    services: Vec::new(),
                })
                .collect(),
        }
    }

    fn carried(a: &Admitted) -> Vec<IpAddr> {
        a.diff
            .as_ref()
            .map(|d| d.addresses.iter().map(|a| a.address).collect())
            .unwrap_or_default()
    }

    #[test]
    fn partial_updates_go_side_by_side_on_other_addresses_only() {
        let partial = AddressUpdateAction::Partial;
        let mut f = LocationFlight::default();
        let first = diff(partial, &["10.1.0.1", "10.1.0.2"]);
        let a = f.admit(first.clone());
        assert!(!a.held_back);
        f.take(&first);
        // A later change to .2 (in flight) and .3 (not): .3 goes, .2 waits.
        let a = f.admit(diff(partial, &["10.1.0.2", "10.1.0.3"]));
        assert_eq!(carried(&a), vec![ip("10.1.0.3")]);
        assert!(a.held_back);
        let second = a.diff.unwrap();
        f.take(&second);
        // Only in-flight addresses: nothing goes, the location stays pending.
        let a = f.admit(diff(partial, &["10.1.0.1"]));
        assert!(a.diff.is_none() && a.held_back);
        f.release(&first);
        let a = f.admit(diff(partial, &["10.1.0.1", "10.1.0.3"]));
        assert_eq!(carried(&a), vec![ip("10.1.0.1")], ".3 is still in flight");
        f.release(&second);
        let a = f.admit(diff(partial, &["10.1.0.3"]));
        assert_eq!(carried(&a), vec![ip("10.1.0.3")]);
        assert!(!a.held_back);
        assert!(f.held.is_empty(), "nothing left behind");
    }

    #[test]
    fn a_full_replacement_holds_the_whole_location_both_ways() {
        let mut f = LocationFlight::default();
        let full = diff(AddressUpdateAction::Full, &["10.1.0.1"]);
        f.take(&full);
        let a = f.admit(diff(AddressUpdateAction::Partial, &["10.1.0.9"]));
        assert!(a.diff.is_none() && a.held_back, "behind a full replacement");
        f.release(&full);
        let partial = diff(AddressUpdateAction::Partial, &["10.1.0.1"]);
        f.take(&partial);
        let a = f.admit(diff(AddressUpdateAction::Full, &[]));
        assert!(
            a.diff.is_none() && a.held_back,
            "a deletion waits for the partial"
        );
        f.release(&partial);
        assert!(f.admit(diff(AddressUpdateAction::Full, &[])).diff.is_some());
    }
}
