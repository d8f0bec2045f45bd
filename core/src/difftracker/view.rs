//! Read-only views of the tracker for operators (status, state of a location or a service).

use std::net::IpAddr;

use super::DiffTracker;
use super::identity::{ServiceEntry, ServiceId, ServiceKind};

/// Sizes of the desired and actual state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Addresses Kubernetes wants in NRP.
    pub desired_addresses: u64,
    /// Addresses NRP has.
    pub actual_addresses: u64,
    /// Locations with at least one desired address.
    pub desired_locations: u64,
    /// Locations NRP has.
    pub actual_locations: u64,
    /// Desired inbound identities.
    pub desired_services: u64,
    /// Desired outbound identities.
    pub desired_egresses: u64,
    /// Load balancers NRP has.
    pub actual_load_balancers: u64,
    /// NAT gateways NRP has.
    pub actual_nat_gateways: u64,
    /// Locations waiting to be re-diffed.
    pub dirty_locations: u64,
    /// Services waiting to be re-diffed.
    pub dirty_services: u64,
}

/// One address at one location, both sides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressView {
    /// The pod IP.
    pub address: IpAddr,
    /// Desired service ref (unfiltered), if desired here.
    pub desired: Option<Vec<String>>,
    /// NRP's service ref, if NRP has it here.
    pub actual: Option<Vec<String>>,
}

/// One location, both sides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocationView {
    /// The node IP.
    pub location: IpAddr,
    /// Whether NRP has the location.
    pub in_nrp: bool,
    /// Its addresses, by IP.
    pub addresses: Vec<AddressView>,
}

/// One service, both sides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceView {
    /// Canonical name.
    pub name: String,
    /// Inbound or outbound.
    pub kind: ServiceKind,
    /// Whether Kubernetes wants it.
    pub desired: bool,
    /// Whether NRP has it.
    pub actual: bool,
    /// Pods counted for an egress.
    pub egress_pods: u32,
    /// Desired addresses referring to it.
    pub desired_addresses: u32,
    /// NRP addresses referring to it.
    pub actual_addresses: u32,
    /// Locations where some desired address refers to it.
    pub locations: usize,
}

impl DiffTracker {
    /// Sizes of both states (O(services) for the service counts).
    pub fn counts(&self) -> Counts {
        let mut c = Counts {
            desired_addresses: self.desired_at.len() as u64,
            actual_addresses: self.actual_addresses,
            desired_locations: self
                .locations
                .iter()
                .filter(|(_, l)| l.desired_addresses > 0)
                .count() as u64,
            actual_locations: self.actual_locations,
            dirty_locations: self.dirty_locations.len() as u64,
            dirty_services: self.dirty_services.len() as u64,
            ..Counts::default()
        };
        for (_, e) in self.services.iter() {
            c.desired_services += u64::from(e.desired_inbound);
            c.desired_egresses += u64::from(e.egress.is_some());
            c.actual_load_balancers += u64::from(e.actual == Some(ServiceKind::Inbound));
            c.actual_nat_gateways += u64::from(e.actual == Some(ServiceKind::Outbound));
        }
        c
    }

    /// Both sides of one location.
    pub fn location_view(&self, location: IpAddr) -> Option<LocationView> {
        let loc = self.locations.get(&location)?;
        let addresses: Vec<AddressView> = loc
            .addresses
            .iter()
            .map(|(a, s)| AddressView {
                address: a,
                desired: s.has_desired().then(|| self.names(&s.desired_refs())),
                actual: s.has_actual().then(|| self.names(s.actual())),
            })
            .collect();
        Some(LocationView {
            location,
            in_nrp: loc.in_nrp,
            addresses,
        })
    }

    /// Whether NRP has every address desired at `location` (also where nothing is desired there).
    /// O(addresses at the location).
    pub fn location_programmed(&self, location: IpAddr) -> bool {
        self.locations.get(&location).is_none_or(|loc| {
            loc.addresses
                .iter()
                .all(|(_, s)| !s.has_desired() || s.has_actual())
        })
    }

    /// Whether NRP has `address` at `location` with `service` (any case) in its ref. O(1).
    pub fn address_programmed(&self, location: IpAddr, address: IpAddr, service: &str) -> bool {
        let Some(sid) = self.services.id(&service.to_ascii_lowercase()) else {
            return false;
        };
        self.locations
            .get(&location)
            .and_then(|loc| loc.addresses.get(&address))
            .is_some_and(|slot| slot.actual().contains(&sid))
    }

    /// NRP's service ref of `address` at `location`, names sorted (empty when NRP does not have
    /// it there).
    pub fn actual_ref(&self, location: IpAddr, address: IpAddr) -> Vec<String> {
        self.locations
            .get(&location)
            .and_then(|loc| loc.addresses.get(&address))
            .map(|slot| self.names(slot.actual()))
            .unwrap_or_default()
    }

    /// Whether `address` is desired at `location` with service `name` (canonical name) in its ref.
    pub fn desired_with(&self, location: IpAddr, address: IpAddr, name: &str) -> bool {
        let Some(sid) = self.services.id(name) else {
            return false;
        };
        self.locations
            .get(&location)
            .and_then(|loc| loc.addresses.get(&address))
            .is_some_and(|slot| slot.desired_refs().contains(&sid))
    }

    /// Both sides of one service (any case).
    pub fn service_view(&self, name: &str) -> Option<ServiceView> {
        let sid = self.services.id(&name.to_ascii_lowercase())?;
        Some(self.entry_view(sid, self.services.get(sid)))
    }

    /// Both sides of every service of `kind` that either side holds (desired or in NRP), in no
    /// particular order. O(services).
    pub fn service_views(&self, kind: ServiceKind) -> impl Iterator<Item = ServiceView> + '_ {
        self.services
            .iter()
            .filter(move |(_, e)| e.kind == kind && (e.is_desired() || e.actual.is_some()))
            .map(|(sid, e)| self.entry_view(sid, e))
    }

    fn entry_view(&self, sid: ServiceId, e: &ServiceEntry) -> ServiceView {
        let locations = e.locations_memo.get_or(|| match e.kind {
            ServiceKind::Inbound => e.addresses.distinct_locations(),
            ServiceKind::Outbound => e
                .egress_locations
                .iter()
                .filter(|l| self.egress_is_at(sid, *l))
                .count(),
        });
        ServiceView {
            name: e.name.to_string(),
            kind: e.kind,
            desired: e.is_desired(),
            actual: e.actual.is_some(),
            egress_pods: e.egress.map_or(0, |g| g.pods),
            desired_addresses: e.desired_refs,
            actual_addresses: e.actual_refs,
            locations,
        }
    }

    /// Every location either side knows.
    pub fn locations(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.locations.iter().map(|(l, _)| l)
    }
}
