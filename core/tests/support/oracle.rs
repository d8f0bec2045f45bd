//! The oracle: a deliberately naive model of the DiffTracker rules (`docs/contract.md` §3) that
//! recomputes everything by scanning the whole cluster, as Azure's reference implementation does.
//! Used by the property tests (the incremental tracker must agree with it) and as the benchmark
//! baseline. Inputs are assumed valid: input validation is tested on the tracker itself.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use clb_core::difftracker::{
    AddressUpdate, AddressUpdateAction, Diff, LocationDiff, Operation, ServiceAction,
    ServiceChange, ServiceKind,
};

/// One desired address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OracleAddress {
    pub location: Option<IpAddr>,
    pub inbound: BTreeSet<String>,
    pub outbound: Option<String>,
    pub pod: Option<String>,
}

/// Desired and actual state, kept as plain ordered maps.
#[derive(Debug, Clone)]
pub struct Oracle {
    pub services: BTreeSet<String>,
    /// egress → (declared, pods)
    pub egresses: BTreeMap<String, (bool, u32)>,
    pub addresses: BTreeMap<IpAddr, OracleAddress>,
    pub load_balancers: BTreeSet<String>,
    pub nat_gateways: BTreeSet<String>,
    pub actual: BTreeMap<IpAddr, BTreeMap<IpAddr, BTreeSet<String>>>,
    pub removals_allowed: bool,
    /// Desired inbound services to create again (their load balancer changed).
    pub reprogram: BTreeSet<String>,
    /// Egresses whose NAT gateway NRP has with an IPv6 public IP (a creation with `ipv6`).
    pub nat_v6: BTreeSet<String>,
}

impl Default for Oracle {
    fn default() -> Self {
        Self {
            services: BTreeSet::new(),
            egresses: BTreeMap::new(),
            addresses: BTreeMap::new(),
            load_balancers: BTreeSet::new(),
            nat_gateways: BTreeSet::new(),
            actual: BTreeMap::new(),
            removals_allowed: true,
            reprogram: BTreeSet::new(),
            nat_v6: BTreeSet::new(),
        }
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse::<IpAddr>()
        .expect("oracle inputs are valid")
        .to_canonical()
}

impl Oracle {
    fn drop_empty(&mut self) {
        self.addresses
            .retain(|_, a| !(a.inbound.is_empty() && a.outbound.is_none()));
    }

    fn drop_if_empty(&mut self, address: IpAddr) {
        if self
            .addresses
            .get(&address)
            .is_some_and(|a| a.inbound.is_empty() && a.outbound.is_none())
        {
            self.addresses.remove(&address);
        }
    }

    fn place(&mut self, address: IpAddr, location: IpAddr) -> &mut OracleAddress {
        let a = self.addresses.entry(address).or_default();
        a.location = Some(location);
        a
    }

    pub fn update_service(&mut self, op: Operation, id: &str) {
        let id = id.to_ascii_lowercase();
        match op {
            Operation::Add => {
                self.services.insert(id);
            }
            Operation::Remove => {
                self.services.remove(&id);
                self.reprogram.remove(&id);
                for a in self.addresses.values_mut() {
                    a.inbound.remove(&id);
                }
                self.drop_empty();
            }
        }
    }

    /// A desired inbound service must be created again, even if NRP has it.
    pub fn reprogram_service(&mut self, id: &str) {
        let id = id.to_ascii_lowercase();
        if self.services.contains(&id) {
            self.reprogram.insert(id);
        }
    }

    pub fn update_egress(&mut self, op: Operation, id: &str) {
        let id = id.to_ascii_lowercase();
        match op {
            Operation::Add => self.egresses.entry(id).or_default().0 = true,
            Operation::Remove => {
                self.egresses.remove(&id);
                for a in self.addresses.values_mut() {
                    if a.outbound.as_deref() == Some(id.as_str()) {
                        a.outbound = None;
                        a.pod = None;
                    }
                }
                self.drop_empty();
            }
        }
    }

    fn remove_ref(&mut self, service: &str, address: IpAddr, location: IpAddr) {
        if let Some(a) = self.addresses.get_mut(&address)
            && a.location == Some(location)
        {
            a.inbound.remove(service);
        }
        self.drop_if_empty(address);
    }

    pub fn set_endpoints(&mut self, service: &str, endpoints: &[(&str, &str)]) {
        let service = service.to_ascii_lowercase();
        let new: BTreeMap<IpAddr, IpAddr> = endpoints.iter().map(|(a, l)| (ip(a), ip(l))).collect();
        let old: Vec<(IpAddr, IpAddr)> = self
            .addresses
            .iter()
            .filter(|(_, a)| a.inbound.contains(&service))
            .map(|(addr, a)| (*addr, a.location.expect("placed")))
            .collect();
        for &(a, l) in &old {
            if new.get(&a) != Some(&l) {
                self.remove_ref(&service, a, l);
            }
        }
        for (a, l) in new {
            if !old.contains(&(a, l)) {
                self.place(a, l).inbound.insert(service.clone());
            }
        }
    }

    pub fn update_endpoints(&mut self, service: &str, old: &[(&str, &str)], new: &[(&str, &str)]) {
        let service = service.to_ascii_lowercase();
        let old: Vec<(IpAddr, IpAddr)> = old.iter().map(|(a, l)| (ip(a), ip(l))).collect();
        let new: Vec<(IpAddr, IpAddr)> = new.iter().map(|(a, l)| (ip(a), ip(l))).collect();
        for &(a, l) in old.iter().filter(|p| !new.contains(p)) {
            self.remove_ref(&service, a, l);
        }
        for &(a, l) in new.iter().filter(|p| !old.contains(p)) {
            self.place(a, l).inbound.insert(service.clone());
        }
    }

    fn egress_pod(&mut self, id: &str, delta: i32) {
        let e = self.egresses.entry(id.to_owned()).or_default();
        e.1 = e.1.saturating_add_signed(delta);
        if *e == (false, 0) {
            self.egresses.remove(id);
        }
    }

    pub fn update_pod(
        &mut self,
        op: Operation,
        address: &str,
        location: &str,
        outbound: &str,
        uid: &str,
    ) {
        let (address, location) = (ip(address), ip(location));
        let uid = (!uid.is_empty()).then(|| uid.to_owned());
        match op {
            Operation::Add => {
                let outbound = (!outbound.is_empty()).then(|| outbound.to_ascii_lowercase());
                let entry = self.place(address, location);
                let old = entry.outbound.clone();
                entry.pod = outbound.as_ref().and(uid);
                entry.outbound = outbound.clone();
                if old != outbound {
                    if let Some(n) = &outbound {
                        self.egress_pod(n, 1);
                    }
                    if let Some(o) = &old {
                        self.egress_pod(o, -1);
                    }
                }
                self.drop_if_empty(address);
            }
            Operation::Remove => {
                let Some(a) = self.addresses.get_mut(&address) else {
                    return;
                };
                if a.location != Some(location) || a.outbound.is_none() {
                    return;
                }
                if let (Some(given), Some(held)) = (&uid, &a.pod)
                    && given != held
                {
                    return;
                }
                let old = a.outbound.take().expect("checked");
                a.pod = None;
                self.egress_pod(&old, -1);
                self.drop_if_empty(address);
            }
        }
    }

    fn in_nrp(&self, service: &str) -> bool {
        self.load_balancers.contains(service) || self.nat_gateways.contains(service)
    }

    /// Whether egress `name`'s NAT gateway must have an IPv6 public IP: a desired pod of it has an
    /// IPv6 address, or NRP's has one (kept).
    fn needs_v6(&self, name: &str) -> bool {
        self.nat_v6.contains(name)
            || self
                .addresses
                .iter()
                .any(|(addr, a)| addr.is_ipv6() && a.outbound.as_deref() == Some(name))
    }

    fn filtered(&self, address: IpAddr, a: &OracleAddress) -> BTreeSet<String> {
        let v6_ready = |s: &str| !address.is_ipv6() || self.nat_v6.contains(s);
        a.inbound
            .iter()
            .filter(|s| {
                self.in_nrp(s) && (self.services.contains(*s) || self.egresses.contains_key(*s))
            })
            .chain(
                a.outbound
                    .iter()
                    .filter(|s| self.in_nrp(s) && self.egresses.contains_key(*s) && v6_ready(s)),
            )
            .cloned()
            .collect()
    }

    /// The whole diff, recomputed from scratch.
    pub fn diff(&self) -> Diff {
        let mut services = Vec::new();
        let desired: BTreeMap<&String, ServiceKind> = self
            .services
            .iter()
            .map(|s| (s, ServiceKind::Inbound))
            .chain(self.egresses.keys().map(|e| (e, ServiceKind::Outbound)))
            .collect();
        for (name, kind) in &desired {
            let outbound = *kind == ServiceKind::Outbound;
            let v6 = outbound && self.needs_v6(name);
            let lacks_v6 = v6 && !self.nat_v6.contains(*name);
            if !self.in_nrp(name) || self.reprogram.contains(*name) || lacks_v6 {
                services.push(ServiceChange {
                    name: (*name).clone(),
                    kind: *kind,
                    action: ServiceAction::Create,
                    nat_gateway: None,
                    ipv6: v6,
                });
            }
        }
        let actual = self
            .load_balancers
            .iter()
            .map(|s| (s, ServiceKind::Inbound))
            .chain(self.nat_gateways.iter().map(|s| (s, ServiceKind::Outbound)));
        let referenced: BTreeSet<&String> = self
            .actual
            .values()
            .flat_map(|l| l.values().flatten())
            .collect();
        for (name, kind) in actual {
            if !desired.contains_key(name) && !referenced.contains(name) && self.removals_allowed {
                services.push(ServiceChange {
                    name: name.clone(),
                    kind,
                    action: ServiceAction::Delete,
                    nat_gateway: None,
                    ipv6: kind == ServiceKind::Outbound && self.nat_v6.contains(name),
                });
            }
        }
        services.sort_by(|a, b| a.name.cmp(&b.name));
        let mut by_location: BTreeMap<IpAddr, BTreeMap<IpAddr, &OracleAddress>> = BTreeMap::new();
        for (addr, a) in &self.addresses {
            by_location
                .entry(a.location.expect("placed"))
                .or_default()
                .insert(*addr, a);
        }
        for l in self.actual.keys() {
            by_location.entry(*l).or_default();
        }
        let locations = by_location
            .into_iter()
            .filter_map(|(l, here)| self.diff_of(l, &here))
            .collect();
        Diff {
            services,
            locations,
        }
    }

    /// The diff of one location, by scanning every address of the cluster.
    pub fn location_diff(&self, location: IpAddr) -> Option<LocationDiff> {
        let here: BTreeMap<IpAddr, &OracleAddress> = self
            .addresses
            .iter()
            .filter(|(_, a)| a.location == Some(location))
            .map(|(k, a)| (*k, a))
            .collect();
        self.diff_of(location, &here)
    }

    fn diff_of(
        &self,
        location: IpAddr,
        here: &BTreeMap<IpAddr, &OracleAddress>,
    ) -> Option<LocationDiff> {
        let empty = BTreeMap::new();
        let in_nrp = self.actual.contains_key(&location);
        let allowed = self.removals_allowed;
        let full = allowed && !in_nrp;
        let nrp = self.actual.get(&location).unwrap_or(&empty);
        let mut keys: BTreeSet<IpAddr> = here.keys().copied().collect();
        keys.extend(nrp.keys().copied());
        let mut addresses = Vec::new();
        let mut anything_wanted = false;
        for a in keys {
            let mut want = here
                .get(&a)
                .map(|d| self.filtered(a, d))
                .unwrap_or_default();
            let have = nrp.get(&a).cloned().unwrap_or_default();
            if !allowed {
                want.extend(have.iter().cloned());
            }
            anything_wanted |= !want.is_empty();
            let send = if full { !want.is_empty() } else { want != have };
            if send {
                addresses.push(AddressUpdate {
                    address: a,
                    services: want.into_iter().collect(),
                });
            }
        }
        if allowed && in_nrp && !anything_wanted {
            return Some(LocationDiff {
                location,
                action: AddressUpdateAction::Full,
                addresses: vec![],
            });
        }
        (!addresses.is_empty()).then_some(LocationDiff {
            location,
            action: if full {
                AddressUpdateAction::Full
            } else {
                AddressUpdateAction::Partial
            },
            addresses,
        })
    }

    /// NRP accepted a service change.
    pub fn record_service(&mut self, c: &ServiceChange) {
        let set = match c.kind {
            ServiceKind::Inbound => &mut self.load_balancers,
            ServiceKind::Outbound => &mut self.nat_gateways,
        };
        match c.action {
            ServiceAction::Create => {
                self.reprogram.remove(&c.name);
                set.insert(c.name.clone())
            }
            ServiceAction::Delete => set.remove(&c.name),
        };
        if c.kind == ServiceKind::Outbound {
            if c.action == ServiceAction::Create && c.ipv6 {
                self.nat_v6.insert(c.name.clone());
            } else {
                self.nat_v6.remove(&c.name);
            }
        }
    }

    /// NRP accepted a location update.
    pub fn record_location(&mut self, d: &LocationDiff) {
        if d.deletes_location() {
            self.actual.remove(&d.location);
            return;
        }
        let loc = self.actual.entry(d.location).or_default();
        if d.action == AddressUpdateAction::Full {
            loc.clear();
        }
        for a in &d.addresses {
            if a.services.is_empty() {
                loc.remove(&a.address);
            } else {
                loc.insert(a.address, a.services.iter().cloned().collect());
            }
        }
    }

    /// Every address of NRP refers only to services NRP has.
    pub fn actual_refs_are_known(&self) -> bool {
        self.actual
            .values()
            .all(|l| l.values().all(|refs| refs.iter().all(|s| self.in_nrp(s))))
    }

    /// NRP equals the desired state: every desired service exists, and every address has its
    /// desired ref restricted to desired services (endpoints of a Service that Kubernetes never
    /// declared as a LoadBalancer can never be programmed).
    pub fn nrp_equals_desired(&self) -> bool {
        let mut want: BTreeMap<IpAddr, BTreeMap<IpAddr, BTreeSet<String>>> = BTreeMap::new();
        for (addr, a) in &self.addresses {
            let refs: BTreeSet<String> = a
                .inbound
                .iter()
                .chain(a.outbound.iter())
                .filter(|s| self.services.contains(*s) || self.egresses.contains_key(*s))
                .cloned()
                .collect();
            if !refs.is_empty() {
                want.entry(a.location.expect("placed"))
                    .or_default()
                    .insert(*addr, refs);
            }
        }
        let egresses: BTreeSet<String> = self.egresses.keys().cloned().collect();
        want == self.actual && self.services == self.load_balancers && egresses == self.nat_gateways
    }
}
