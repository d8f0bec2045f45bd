//! Addresses NRP refused on their own (a worker split the refused call down to them: docs/errors.md,
//! "A refused call is split"). Each is held on the refusal schedule of its own — left out of its
//! location's diffs while its delay runs, so the rest of the location's changes go — and sent
//! again when the delay has passed, or at once when the ref it should have changes (its desired
//! state, or a service of it becoming ready or going) or NRP's ref of it changes (a read-back).
//!
//! A hold is keyed by address at its location and remembers the ref NRP refused and NRP's ref at
//! the time: a diff that carries another ref for the address, or an actual ref that differs, voids
//! it. A hold whose address is no longer in its location's diff (in sync, or gone) is forgotten.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::net::IpAddr;
use std::time::Instant;

use foldhash::HashMap;

use super::ErrorRecord;
use crate::difftracker::{AddressUpdateAction, DiffTracker, LocationDiff};

/// One held address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressHold {
    /// The ref NRP refused for it (canonical names, sorted).
    pub services: Vec<String>,
    /// NRP's ref of it when it was refused (empty: NRP did not have it).
    pub actual: Vec<String>,
    /// The refusal.
    pub record: ErrorRecord,
    /// Refusals in a row of this same ref (its delay doubles with each).
    pub refusals: u32,
    /// When it is sent again; `None` once that time has come (it goes with its location's next
    /// unit).
    pub retry_at: Option<Instant>,
}

/// A held address as a view shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedAddress<'a> {
    /// The location (node IP).
    pub location: IpAddr,
    /// The address (pod IP).
    pub address: IpAddr,
    /// Its hold.
    pub hold: &'a AddressHold,
}

/// What [`RefusedAddresses::admit`] left of a diff.
pub(super) enum Admitted {
    /// Nothing was held: the diff as it was.
    Whole(LocationDiff),
    /// Held addresses were left out; the rest (never empty).
    Trimmed(LocationDiff),
    /// Every address of the diff is held: nothing goes.
    AllHeld,
}

/// The held addresses of one dispatcher.
#[derive(Debug, Default)]
pub(super) struct RefusedAddresses {
    by_location: HashMap<IpAddr, HashMap<IpAddr, AddressHold>>,
    /// (location, address) of the holds whose ref names each service.
    by_service: HashMap<String, BTreeSet<(IpAddr, IpAddr)>>,
    len: usize,
    /// Retry times; an entry whose hold is gone or was renewed is skipped when it comes up.
    timers: BinaryHeap<Reverse<(Instant, IpAddr, IpAddr)>>,
}

impl RefusedAddresses {
    /// How many addresses are held.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The refusals in a row a new refusal of `address` at `location` with ref `services` (NRP's
    /// being `actual`) makes: one more than its hold's if that hold is of the same ref and the same
    /// NRP ref, else 1.
    pub(super) fn refusals_after(
        &self,
        location: IpAddr,
        address: IpAddr,
        services: &[String],
        actual: &[String],
    ) -> u32 {
        match self.get(location, address) {
            Some(h) if h.services == services && h.actual == actual => h.refusals + 1,
            _ => 1,
        }
    }

    /// Holds `address` at `location` until `hold.retry_at`.
    pub(super) fn hold(&mut self, location: IpAddr, address: IpAddr, hold: AddressHold) {
        if let Some(at) = hold.retry_at {
            self.timers.push(Reverse((at, location, address)));
        }
        self.forget(location, address);
        for s in &hold.services {
            self.by_service
                .entry(s.clone())
                .or_default()
                .insert((location, address));
        }
        self.by_location
            .entry(location)
            .or_default()
            .insert(address, hold);
        self.len += 1;
    }

    /// The hold of `address` at `location`, if held.
    pub(super) fn get(&self, location: IpAddr, address: IpAddr) -> Option<&AddressHold> {
        self.by_location.get(&location)?.get(&address)
    }

    /// Forgets the hold of `address` at `location`, if any.
    fn forget(&mut self, location: IpAddr, address: IpAddr) {
        let Some(at) = self.by_location.get_mut(&location) else {
            return;
        };
        let Some(old) = at.remove(&address) else {
            return;
        };
        if at.is_empty() {
            self.by_location.remove(&location);
        }
        self.len -= 1;
        for s in &old.services {
            if let Some(set) = self.by_service.get_mut(s) {
                set.remove(&(location, address));
                if set.is_empty() {
                    self.by_service.remove(s);
                }
            }
        }
    }

    /// Forgets every hold at `location` (it is in sync, or gone).
    pub(super) fn forget_location(&mut self, location: IpAddr) {
        let addresses: Vec<IpAddr> = match self.by_location.get(&location) {
            Some(at) => at.keys().copied().collect(),
            None => return,
        };
        for a in addresses {
            self.forget(location, a);
        }
    }

    /// The locations whose held addresses are due at `now` (each once, when its time comes): their
    /// next unit sends those addresses again.
    pub(super) fn due(&mut self, now: Instant) -> Vec<IpAddr> {
        let mut locations = Vec::new();
        while let Some(Reverse((at, location, address))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(hold) = self
                .by_location
                .get_mut(&location)
                .and_then(|m| m.get_mut(&address))
            else {
                continue;
            };
            if hold.retry_at == Some(at) {
                hold.retry_at = None;
                if !locations.contains(&location) {
                    locations.push(location);
                }
            }
        }
        locations
    }

    /// The next retry time after `now`, if any (a timer of a hold since gone or renewed may wake
    /// the driver early, which is harmless).
    pub(super) fn next_retry(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Leaves the held addresses out of `diff` (see the module documentation): a hold whose ref
    /// or NRP ref changed is voided and its address goes; a due one goes; a hold whose address the
    /// diff no longer carries is forgotten. In a full replacement a held address NRP has keeps
    /// NRP's ref (a full update without it would remove it).
    pub(super) fn admit(&mut self, tracker: &DiffTracker, mut diff: LocationDiff) -> Admitted {
        let location = diff.location;
        let Some(at) = self.by_location.get(&location) else {
            return Admitted::Whole(diff);
        };
        let mut void = Vec::new();
        let mut seen = Vec::new();
        let mut held = 0usize;
        let full = diff.action == AddressUpdateAction::Full;
        diff.addresses.retain_mut(|a| {
            let Some(h) = at.get(&a.address) else {
                return true;
            };
            seen.push(a.address);
            let actual = tracker.actual_ref(location, a.address);
            if h.services != a.services || h.actual != actual {
                void.push(a.address);
                return true;
            }
            if h.retry_at.is_none() {
                return true;
            }
            held += 1;
            if full && !actual.is_empty() {
                a.services = actual;
                return true;
            }
            false
        });
        let gone: Vec<IpAddr> = if seen.len() < at.len() {
            at.keys().filter(|a| !seen.contains(a)).copied().collect()
        } else {
            Vec::new()
        };
        for a in void.into_iter().chain(gone) {
            self.forget(location, a);
        }
        if held == 0 {
            Admitted::Whole(diff)
        } else if diff.addresses.is_empty() {
            Admitted::AllHeld
        } else {
            Admitted::Trimmed(diff)
        }
    }

    /// The held addresses whose refused ref names `service` (canonical name), by location then
    /// address.
    pub(super) fn of_service(&self, service: &str) -> impl Iterator<Item = RefusedAddress<'_>> {
        self.by_service
            .get(service)
            .into_iter()
            .flatten()
            .filter_map(|&(location, address)| {
                self.get(location, address).map(|hold| RefusedAddress {
                    location,
                    address,
                    hold,
                })
            })
    }

    /// Every held address, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = RefusedAddress<'_>> {
        self.by_location.iter().flat_map(|(&location, at)| {
            at.iter().map(move |(&address, hold)| RefusedAddress {
                location,
                address,
                hold,
            })
        })
    }
}
