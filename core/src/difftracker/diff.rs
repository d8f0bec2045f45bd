//! The difference between desired and actual state, and its ordering rules.
//!
//! * An address is sent with its desired ref **filtered to services NRP has** (and that are still
//!   desired), so a service is always created in NRP before any address refers to it.
//! * An actual address no longer desired is sent with an empty ref; a location no longer desired
//!   at all (no address with a non-empty filtered ref) is sent as a full update with no addresses,
//!   which deletes it in NRP; a location NRP does not have is sent as a full update.
//! * A service is deleted only once no actual address refers to it (drain first).
//! * At a location whose removals are withheld ([`super::withheld`]), nothing is removed and no
//!   full update replaces NRP's content; a service whose deletions are withheld is not deleted.

use std::net::IpAddr;

use super::DiffTracker;
use super::identity::{ServiceId, ServiceKind};
use super::location::{RefBuf, Slot};

/// How NRP applies a location's address list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressUpdateAction {
    /// Replace the location's addresses with the list; an empty list deletes the location.
    Full,
    /// Change only the listed addresses; an address with an empty ref is removed.
    Partial,
}

/// One address and the service ref it must have in NRP (empty = remove the address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressUpdate {
    /// The pod IP.
    pub address: IpAddr,
    /// Canonical service names, sorted.
    pub services: Vec<String>,
}

/// The change one location needs in NRP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocationDiff {
    /// The node IP.
    pub location: IpAddr,
    /// Full or partial.
    pub action: AddressUpdateAction,
    /// Addresses sorted by IP.
    pub addresses: Vec<AddressUpdate>,
}

impl LocationDiff {
    /// True if this update deletes the whole location in NRP.
    pub fn deletes_location(&self) -> bool {
        self.action == AddressUpdateAction::Full && self.addresses.is_empty()
    }

    /// The addresses with their refs as borrowed pairs.
    pub(crate) fn addresses_as_pairs(&self) -> Vec<(IpAddr, &[String])> {
        self.addresses
            .iter()
            .map(|a| (a.address, a.services.as_slice()))
            .collect()
    }
}

/// Create or delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServiceAction {
    /// Create the service in NRP (load balancer or NAT gateway, then register it).
    Create,
    /// Delete the service from NRP; only offered once no NRP address refers to it.
    Delete,
}

/// A service change NRP needs now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceChange {
    /// Canonical name.
    pub name: String,
    /// Inbound or outbound.
    pub kind: ServiceKind,
    /// Create or delete.
    pub action: ServiceAction,
    /// For an outbound identity: the NAT gateway its egress brings, when known (`natgw.rs`);
    /// `None`: one clb owns, or not known (an identity only observed since a restart).
    pub nat_gateway: Option<String>,
    /// For an outbound identity: its NAT gateway must carry an IPv6 public IP (some of its pods
    /// have IPv6 addresses, or NRP's NAT gateway already has one, which is kept:
    /// `egress_family.rs`). False for an inbound identity (its family is the server's, per service).
    pub ipv6: bool,
}

/// Where one service stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceStatus {
    /// Desired and actual agree.
    InSync,
    /// A change can be sent now.
    Pending(ServiceChange),
    /// Not desired, but NRP addresses still refer to it: their removal must land first.
    AwaitingDrain {
        /// Addresses in NRP still referring to it.
        actual_refs: u32,
    },
    /// Deletion is due but deletions of its kind are withheld (restart gate closed).
    Withheld,
}

/// The whole pending difference (computed by a full scan: for the read API and for tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    /// Service changes that can be sent now, by name.
    pub services: Vec<ServiceChange>,
    /// Location changes, by location.
    pub locations: Vec<LocationDiff>,
}

impl Diff {
    /// True if nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && self.locations.is_empty()
    }
}

/// What a location's diff is (see `DiffTracker::scan_location`).
enum Scan {
    /// Nothing to send.
    InSync,
    /// Nothing here can be programmed any more: the whole location goes.
    DeleteAll,
    /// These addresses, as a full replacement or a partial update.
    Send(AddressUpdateAction),
}

impl DiffTracker {
    /// The change `location` needs now, in time proportional to that location; `None` if in sync.
    pub fn location_diff(&self, location: IpAddr) -> Option<LocationDiff> {
        // The location's addresses are kept sorted by IP, so the output is sorted too.
        let mut addresses = Vec::new();
        let action = match self.scan_location(location, |address, want| {
            addresses.push(AddressUpdate {
                address,
                services: self.names(want),
            })
        }) {
            Scan::InSync => return None,
            // Nothing here can be programmed any more: delete the whole location.
            Scan::DeleteAll => {
                return Some(LocationDiff {
                    location,
                    action: AddressUpdateAction::Full,
                    addresses: Vec::new(),
                });
            }
            Scan::Send(action) => action,
        };
        Some(LocationDiff {
            location,
            action,
            addresses,
        })
    }

    /// How many addresses [`DiffTracker::location_diff`] would carry for `location` now (a
    /// deletion of the whole location counts 1; 0: in sync), without building it: what a
    /// dispatcher weighs a backlog by.
    pub fn location_diff_len(&self, location: IpAddr) -> usize {
        let mut n = 0;
        match self.scan_location(location, |_, _| n += 1) {
            Scan::InSync => 0,
            Scan::DeleteAll => 1,
            Scan::Send(_) => n,
        }
    }

    /// Walks `location`'s addresses, calling `send` with each address its diff carries and the
    /// refs it wants there (in IP order), and says what the diff is.
    fn scan_location(&self, location: IpAddr, mut send: impl FnMut(IpAddr, &[ServiceId])) -> Scan {
        let Some(loc) = self.locations.get(&location) else {
            return Scan::InSync;
        };
        let allowed = !self.withheld.location(location);
        let full = allowed && !loc.in_nrp;
        let mut sent = false;
        let mut anything_wanted = false;
        for (address, slot) in loc.addresses.iter() {
            let mut want = self.filtered(address, slot);
            let have = slot.actual();
            if !allowed {
                for id in have {
                    if let Err(pos) = want.binary_search(id) {
                        want.insert(pos, *id);
                    }
                }
            }
            anything_wanted |= !want.is_empty();
            let changed = if full {
                !want.is_empty()
            } else {
                want[..] != *have
            };
            if changed {
                sent = true;
                send(address, &want);
            }
        }
        if allowed && loc.in_nrp && !anything_wanted {
            Scan::DeleteAll
        } else if !sent {
            Scan::InSync
        } else if full {
            Scan::Send(AddressUpdateAction::Full)
        } else {
            Scan::Send(AddressUpdateAction::Partial)
        }
    }

    /// Where a service (any case) stands.
    pub fn service_status(&self, name: &str) -> ServiceStatus {
        match self.services.id(&name.to_ascii_lowercase()) {
            Some(sid) => self.status_of(sid),
            None => ServiceStatus::InSync,
        }
    }

    /// The whole pending diff, by a full scan (O(cluster)): for operators and tests.
    pub fn pending_diff(&self) -> Diff {
        let mut services: Vec<ServiceChange> = self
            .services
            .iter()
            .filter_map(|(sid, _)| match self.status_of(sid) {
                ServiceStatus::Pending(c) => Some(c),
                _ => None,
            })
            .collect();
        services.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        let mut locations: Vec<LocationDiff> = self
            .locations
            .iter()
            .filter_map(|(l, _)| self.location_diff(l))
            .collect();
        locations.sort_unstable_by_key(|l| l.location);
        Diff {
            services,
            locations,
        }
    }

    fn status_of(&self, sid: ServiceId) -> ServiceStatus {
        let e = self.services.get(sid);
        match (e.is_desired(), e.actual) {
            // Also created again on request (`reprogram_service`) while NRP has it: the creation
            // saga is idempotent and re-programs what changed; the service stays in NRP meanwhile.
            (true, None) => ServiceStatus::Pending(ServiceChange {
                name: e.name.to_string(),
                kind: e.kind,
                action: ServiceAction::Create,
                nat_gateway: e.nat_gateway.as_deref().map(str::to_owned),
                ipv6: e.needs_ipv6(),
            }),
            (true, Some(_)) if e.reprogram => ServiceStatus::Pending(ServiceChange {
                name: e.name.to_string(),
                kind: e.kind,
                action: ServiceAction::Create,
                nat_gateway: e.nat_gateway.as_deref().map(str::to_owned),
                ipv6: e.needs_ipv6(),
            }),
            (false, Some(kind)) if self.withheld.deletions_of(kind) => ServiceStatus::Withheld,
            (false, Some(_)) if e.actual_refs > 0 => ServiceStatus::AwaitingDrain {
                actual_refs: e.actual_refs,
            },
            (false, Some(kind)) => ServiceStatus::Pending(ServiceChange {
                name: e.name.to_string(),
                kind,
                action: ServiceAction::Delete,
                nat_gateway: e.nat_gateway.as_deref().map(str::to_owned),
                ipv6: e.needs_ipv6(),
            }),
            // Not registered, but a saga that stopped part-way may have left its resources: delete
            // again (nothing can refer to an unregistered service, so there is nothing to drain).
            (false, None) if e.leftover && self.withheld.deletions_of(e.kind) => {
                ServiceStatus::Withheld
            }
            (false, None) if e.leftover => ServiceStatus::Pending(ServiceChange {
                name: e.name.to_string(),
                kind: e.kind,
                action: ServiceAction::Delete,
                nat_gateway: e.nat_gateway.as_deref().map(str::to_owned),
                ipv6: e.needs_ipv6(),
            }),
            _ => ServiceStatus::InSync,
        }
    }

    /// Canonical names of a ref, sorted by name.
    pub(crate) fn names(&self, refs: &[ServiceId]) -> Vec<String> {
        let mut names: Vec<String> = refs
            .iter()
            .map(|id| self.services.name(*id).to_owned())
            .collect();
        names.sort_unstable();
        names
    }

    /// The desired ref of an address, keeping only services that NRP has **and** that are still
    /// desired (the readiness filter). The second half keeps a late endpoint update of a Service
    /// being deleted from re-programming it, which would block its deletion forever. An IPv6
    /// address refers to an egress only once NRP's NAT gateway has an IPv6 public IP
    /// (`egress_family.rs`).
    pub(super) fn filtered(&self, address: IpAddr, slot: &Slot) -> RefBuf {
        let v6 = address.is_ipv6();
        let ready = |id: ServiceId| {
            let e = self.services.get(id);
            e.actual.is_some()
                && e.is_desired()
                && (!v6 || e.kind == ServiceKind::Inbound || e.nat_v6)
        };
        let mut refs = RefBuf::new();
        // The outbound id in its place among the inbound ones (sorted), each kept if ready.
        let mut outbound = slot.outbound;
        for &id in slot.inbound() {
            if let Some(o) = outbound
                && o <= id
            {
                if o < id && ready(o) {
                    refs.push(o);
                }
                outbound = None;
            }
            if ready(id) {
                refs.push(id);
            }
        }
        if let Some(o) = outbound
            && ready(o)
        {
            refs.push(o);
        }
        refs
    }
}
