//! Actual-state mutations: what NRP accepted (recorded exactly as sent, never what is desired now)
//! and what an observation read back from NRP.

use foldhash::HashSet;
use std::net::IpAddr;

use super::DiffTracker;
use super::diff::{AddressUpdateAction, LocationDiff, ServiceAction, ServiceChange};
use super::error::{InvalidInput, quote};
use super::identity::{ServiceId, ServiceKind, normalize_identity};
use super::location::RefBuf;

/// A report that cannot be true of NRP; nothing of it was recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// An address refers to a service NRP does not have (NRP refuses such a call).
    #[error(
        "location {location}, address {address}: service {} is not in NRP's actual state",
        quote(.service)
    )]
    UnknownService {
        /// The location of the address.
        location: IpAddr,
        /// The address.
        address: IpAddr,
        /// The service it names.
        service: String,
    },
    /// A service was reported deleted while NRP addresses still refer to it (NRP refuses that).
    #[error(
        "service {} cannot have been deleted: {count} addresses in NRP still refer to it",
        quote(.service)
    )]
    StillReferenced {
        /// The service.
        service: String,
        /// How many actual addresses refer to it.
        count: u32,
    },
    /// The same location appears twice in one report.
    #[error("location {0} appears twice in one report")]
    DuplicateLocation(IpAddr),
    /// A name in the report is not a valid identity, or is of the other kind.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
}

/// One location as NRP holds it: its addresses with their service names.
pub type ObservedLocation = (IpAddr, Vec<(IpAddr, Vec<String>)>);

/// NRP's whole state for one gateway, as read back by an observe unit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActualSnapshot {
    /// Inbound services (load balancer backend pools) registered on the gateway.
    pub load_balancers: Vec<String>,
    /// Outbound services (NAT gateways) registered on the gateway.
    pub nat_gateways: Vec<String>,
    /// Every location with its addresses and their service refs.
    pub locations: Vec<ObservedLocation>,
}

/// What an observation changed in the actual state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObserveSummary {
    /// Services whose actual presence changed.
    pub services_changed: usize,
    /// Locations whose actual content changed.
    pub locations_changed: usize,
}

impl DiffTracker {
    /// Records that NRP created or deleted a service.
    pub fn record_service_applied(&mut self, change: &ServiceChange) -> Result<(), ReportError> {
        let result = self.record_service_applied_inner(change);
        self.services.collect_unused();
        result
    }

    fn record_service_applied_inner(&mut self, change: &ServiceChange) -> Result<(), ReportError> {
        let name = normalize_identity("service", &change.name)?;
        match change.action {
            ServiceAction::Create => {
                let sid = self
                    .services
                    .intern(&name, change.kind)
                    .map_err(|existing| {
                        InvalidInput::new(
                            "service",
                            &change.name,
                            super::Reason::KindConflict {
                                existing: existing.as_str(),
                            },
                        )
                    })?;
                let entry = self.services.get_mut(sid);
                entry.reprogram = false;
                // The registration uses the resources a part-way saga left: nothing to clean up.
                entry.leftover = false;
                self.set_service_actual(sid, Some(change.kind));
                // An egress created before its first IPv6 pod came is created again.
                if self.record_egress_family(sid, change) {
                    self.services.get_mut(sid).reprogram = true;
                }
            }
            ServiceAction::Delete => {
                let Some(sid) = self.services.id(&name) else {
                    return Ok(());
                };
                let count = self.services.get(sid).actual_refs;
                if count > 0 {
                    return Err(ReportError::StillReferenced {
                        service: name.into_owned(),
                        count,
                    });
                }
                let entry = self.services.get_mut(sid);
                entry.leftover = false;
                entry.nat_v6 = false;
                self.set_service_actual(sid, None);
                self.services.release_if_unused(sid);
            }
        }
        Ok(())
    }

    /// Records that NRP accepted a location update exactly as given.
    pub fn record_location_applied(&mut self, update: &LocationDiff) -> Result<(), ReportError> {
        let result = self.record_location_applied_inner(update);
        self.services.collect_unused();
        result
    }

    fn record_location_applied_inner(&mut self, update: &LocationDiff) -> Result<(), ReportError> {
        let resolved = self.resolve_actual(update.location, &update.addresses_as_pairs())?;
        self.apply_actual_location(update.location, update.action, resolved);
        Ok(())
    }

    /// Replaces the whole actual state with what NRP holds (anti-entropy). Locations and services
    /// that changed become dirty, so drift made outside the system is repaired.
    pub fn observe(&mut self, snapshot: &ActualSnapshot) -> Result<ObserveSummary, ReportError> {
        let result = self.observe_inner(snapshot);
        self.services.collect_unused();
        result
    }

    fn observe_inner(&mut self, snapshot: &ActualSnapshot) -> Result<ObserveSummary, ReportError> {
        let mut services = Vec::new();
        for (names, kind) in [
            (&snapshot.load_balancers, ServiceKind::Inbound),
            (&snapshot.nat_gateways, ServiceKind::Outbound),
        ] {
            for n in names {
                services.push((normalize_identity("service", n)?.into_owned(), kind));
            }
        }
        let observed: HashSet<&str> = services.iter().map(|(n, _)| n.as_str()).collect();
        let mut seen = HashSet::default();
        for (location, addresses) in &snapshot.locations {
            if !seen.insert(*location) {
                return Err(ReportError::DuplicateLocation(*location));
            }
            for (address, refs) in addresses {
                for r in refs {
                    let n = normalize_identity("service", r)?;
                    if !observed.contains(n.as_ref()) {
                        return Err(ReportError::UnknownService {
                            location: *location,
                            address: *address,
                            service: r.clone(),
                        });
                    }
                }
            }
        }
        // Kinds must agree with what the tracker knows; check before changing anything.
        for (n, kind) in &services {
            if let Some(sid) = self.services.id(n)
                && self.services.get(sid).kind != *kind
            {
                return Err(InvalidInput::new(
                    "service",
                    n.as_str(),
                    super::Reason::KindConflict {
                        existing: self.services.get(sid).kind.as_str(),
                    },
                )
                .into());
            }
        }
        // Egresses that IPv6 addresses in NRP refer to: their NAT gateway has an IPv6 public IP.
        let v6_refs: HashSet<String> = snapshot
            .locations
            .iter()
            .flat_map(|(_, addresses)| addresses.iter())
            .filter(|(a, _)| a.is_ipv6())
            .flat_map(|(_, refs)| refs.iter().map(|r| r.to_ascii_lowercase()))
            .collect();
        let mut summary = ObserveSummary::default();
        let mut ids = Vec::with_capacity(services.len());
        for (n, kind) in &services {
            let sid = self.services.intern(n, *kind).expect("kinds checked above");
            let fresh = self.services.get(sid).actual != Some(*kind);
            // Found anew (a restart): it has an IPv6 public IP when IPv6 addresses refer to it;
            // known: what was recorded, or more.
            let v6 = v6_refs.contains(n.as_str()) || (!fresh && self.services.get(sid).nat_v6);
            if fresh {
                summary.services_changed += 1;
                // An egress bound to a brought NAT gateway, found in NRP without a creation
                // recorded (a restart): which NAT gateway it is registered with is not known, so its
                // creation is sent again (`natgw.rs`).
                let entry = self.services.get_mut(sid);
                if *kind == ServiceKind::Outbound && entry.nat_gateway.is_some() {
                    entry.reprogram = true;
                }
                self.set_service_actual(sid, Some(*kind));
            }
            self.observe_egress_family(sid, v6);
            ids.push(sid);
        }
        let stale: Vec<IpAddr> = self
            .locations
            .iter()
            .filter(|(l, loc)| (loc.in_nrp || loc.actual_addresses > 0) && !seen.contains(l))
            .map(|(l, _)| l)
            .collect();
        for location in stale {
            summary.locations_changed += 1;
            self.apply_actual_location(location, AddressUpdateAction::Full, Vec::new());
        }
        for (location, addresses) in &snapshot.locations {
            let pairs: Vec<(IpAddr, &[String])> =
                addresses.iter().map(|(a, r)| (*a, r.as_slice())).collect();
            let resolved = self.resolve_actual(*location, &pairs)?;
            if self.actual_differs(*location, &resolved) {
                summary.locations_changed += 1;
                self.apply_actual_location(*location, AddressUpdateAction::Full, resolved);
            }
            // A location NRP has, even with no address, is in NRP.
            self.set_in_nrp(*location, true);
        }
        let gone: Vec<ServiceId> = self
            .services
            .iter()
            .filter(|(sid, e)| e.actual.is_some() && !ids.contains(sid))
            .map(|(sid, _)| sid)
            .collect();
        for sid in gone {
            summary.services_changed += 1;
            // The registration went without a recorded deletion: its resources may remain.
            let entry = self.services.get_mut(sid);
            entry.leftover = true;
            entry.nat_v6 = false;
            self.set_service_actual(sid, None);
        }
        Ok(summary)
    }

    /// Turns reported names into ids, refusing refs to services NRP does not have.
    fn resolve_actual(
        &self,
        location: IpAddr,
        addresses: &[(IpAddr, &[String])],
    ) -> Result<Vec<(IpAddr, RefBuf)>, ReportError> {
        let mut out = Vec::with_capacity(addresses.len());
        for (address, names) in addresses {
            let mut refs = RefBuf::with_capacity(names.len());
            for n in names.iter() {
                let sid = normalize_identity("service", n)
                    .ok()
                    .and_then(|c| self.services.id(&c))
                    .filter(|sid| self.services.get(*sid).actual.is_some())
                    .ok_or_else(|| ReportError::UnknownService {
                        location,
                        address: *address,
                        service: n.clone(),
                    })?;
                refs.push(sid);
            }
            refs.sort_unstable();
            refs.dedup();
            out.push((*address, refs));
        }
        Ok(out)
    }

    /// Whether a full replacement with `resolved` would change the location's actual addresses.
    fn actual_differs(&self, location: IpAddr, resolved: &[(IpAddr, RefBuf)]) -> bool {
        let Some(loc) = self.locations.get(&location) else {
            return true;
        };
        let listed = resolved.iter().filter(|(_, r)| !r.is_empty()).count();
        !loc.in_nrp
            || listed != loc.actual_addresses as usize
            || resolved.iter().any(|(a, r)| {
                let have = loc.addresses.get(a).map_or(&[][..], |s| s.actual());
                have != &r[..]
            })
    }

    /// Applies a full or partial update to the actual state of one location.
    fn apply_actual_location(
        &mut self,
        location: IpAddr,
        action: AddressUpdateAction,
        mut addresses: Vec<(IpAddr, RefBuf)>,
    ) {
        if action == AddressUpdateAction::Full {
            // Sorted by address (a diff's already is), to look the listed ones up without a set.
            if !addresses.is_sorted_by_key(|(a, _)| *a) {
                addresses.sort_by_key(|(a, _)| *a);
            }
            let dropped: Vec<IpAddr> = self
                .locations
                .get(&location)
                .map(|loc| {
                    loc.addresses
                        .iter()
                        .filter(|(a, s)| {
                            s.has_actual()
                                && addresses.binary_search_by_key(a, |(l, _)| *l).is_err()
                        })
                        .map(|(a, _)| a)
                        .collect()
                })
                .unwrap_or_default();
            for address in dropped {
                self.set_actual(location, address, &[]);
            }
        }
        let in_nrp = !(action == AddressUpdateAction::Full && addresses.is_empty());
        for (address, refs) in &addresses {
            self.set_actual(location, *address, refs);
        }
        self.set_in_nrp(location, in_nrp);
    }

    /// Sets whether NRP has a service; the locations whose filtered ref depends on it become dirty.
    pub(super) fn set_service_actual(&mut self, sid: ServiceId, kind: Option<ServiceKind>) {
        let entry = self.services.get_mut(sid);
        if entry.actual == kind {
            return;
        }
        entry.actual = kind;
        self.service_changed(sid);
        self.services.release_if_unused(sid);
    }
}
