//! Desired-state mutations (what Kubernetes wants). Each validates all of its input first and
//! changes nothing when it fails.

use std::cmp::Ordering;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::DiffTracker;
use super::error::{InvalidInput, Reason};
use super::family::IpFamily;
use super::identity::{ServiceId, ServiceKind, normalize_identity};
use super::ip::{check_address_at, parse_address_at};
use super::location::{LocationId, Slot, insert_ref, remove_ref};

/// Add or remove.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// Add (or update) the object.
    Add,
    /// Remove the object.
    Remove,
}

/// One backend of an inbound identity: a pod IP at a node IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint<'a> {
    /// The pod IP.
    pub address: &'a str,
    /// The node IP the pod runs on.
    pub location: &'a str,
}

/// [`Endpoint`] with its IPs already parsed (at the gRPC edge, say): the `_ip` methods take these
/// and parse nothing. They are checked as strings are (canonical form, unicast, one family); an
/// error quotes the IP as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EndpointIp {
    /// The pod IP.
    pub address: IpAddr,
    /// The node IP the pod runs on.
    pub location: IpAddr,
}

/// A pod: its IP at its node, with its optional egress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodUpdate<'a> {
    /// The pod IP.
    pub address: &'a str,
    /// The node IP (hostIP).
    pub location: &'a str,
    /// The egress named by the pod's label; empty for none.
    pub outbound_identity: &'a str,
    /// The pod's UID: a removal naming another UID than the pod at the address is a no-op.
    pub uid: &'a str,
    /// The NAT gateway the egress brings (see [`DiffTracker::update_pod`]); empty for one clb owns.
    pub nat_gateway: &'a str,
}

/// [`PodUpdate`] with its IPs already parsed (see [`EndpointIp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodIpUpdate<'a> {
    /// The pod IP.
    pub address: IpAddr,
    /// The node IP (hostIP).
    pub location: IpAddr,
    /// The egress named by the pod's label; empty for none.
    pub outbound_identity: &'a str,
    /// The pod's UID: a removal naming another UID than the pod at the address is a no-op.
    pub uid: &'a str,
    /// The NAT gateway the egress brings (see [`DiffTracker::update_pod`]); empty for one clb owns.
    pub nat_gateway: &'a str,
}

pub(super) fn conflict(field: &str, value: &str, existing: ServiceKind) -> InvalidInput {
    InvalidInput::new(
        field,
        value,
        Reason::KindConflict {
            existing: existing.as_str(),
        },
    )
}

/// An endpoint as given: strings to parse, or IPs to check.
trait EndpointInput {
    /// The canonical (address, location), or why they are refused (field paths relative to the
    /// endpoint).
    fn check(&self) -> Result<(IpAddr, IpAddr), InvalidInput>;
    /// The address as given, for an error.
    fn address_value(&self) -> String;
}

impl EndpointInput for Endpoint<'_> {
    fn check(&self) -> Result<(IpAddr, IpAddr), InvalidInput> {
        parse_address_at("address", self.address, "location", self.location)
    }

    fn address_value(&self) -> String {
        self.address.to_owned()
    }
}

impl EndpointInput for EndpointIp {
    fn check(&self) -> Result<(IpAddr, IpAddr), InvalidInput> {
        check_address_at("address", self.address, "location", self.location)
    }

    fn address_value(&self) -> String {
        self.address.to_string()
    }
}

/// A checked endpoint set: (address, location, position in the input), sorted by address.
type Checked = Vec<(IpAddr, IpAddr, u32)>;

/// Buffers the endpoint updates reuse (a tracker's clone starts with empty ones).
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    new: Checked,
    old: Checked,
    removals: Vec<(IpAddr, IpAddr)>,
    adds: Vec<(IpAddr, IpAddr)>,
}

impl Clone for Scratch {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl Scratch {
    /// Keeps the buffers for the next update, unless a huge one left them huge.
    fn trim(&mut self) {
        const KEEP: usize = 1024;
        if self.new.capacity() > KEEP || self.old.capacity() > KEEP {
            self.new = Vec::new();
            self.old = Vec::new();
        }
        if self.removals.capacity() > KEEP || self.adds.capacity() > KEEP {
            self.removals = Vec::new();
            self.adds = Vec::new();
        }
    }
}

/// An address of one family.
trait Family: Ord + Copy {
    fn of(ip: IpAddr) -> Self;
    fn ip(self) -> IpAddr;
}

impl Family for Ipv4Addr {
    fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(a) => a,
            IpAddr::V6(_) => unreachable!("split by family"),
        }
    }

    fn ip(self) -> IpAddr {
        IpAddr::V4(self)
    }
}

impl Family for Ipv6Addr {
    fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V6(a) => a,
            IpAddr::V4(_) => unreachable!("split by family"),
        }
    }

    fn ip(self) -> IpAddr {
        IpAddr::V6(self)
    }
}

/// Merges a service's sorted addresses of one family with the new set's (sorted, same family):
/// what the old has and the new lacks, or has at another location, goes to `removals`; what the
/// new has and the old lacks, or has at another location, to `adds`.
fn merge<K: Family>(
    old: &[(K, LocationId)],
    new: &[(IpAddr, IpAddr, u32)],
    ip: impl Fn(LocationId) -> IpAddr,
    removals: &mut Vec<(IpAddr, IpAddr)>,
    adds: &mut Vec<(IpAddr, IpAddr)>,
) {
    let (mut i, mut j) = (0, 0);
    while i < old.len() && j < new.len() {
        let (a, lo) = old[i];
        let (b, ln, _) = new[j];
        match a.cmp(&K::of(b)) {
            Ordering::Less => {
                removals.push((a.ip(), ip(lo)));
                i += 1;
            }
            Ordering::Greater => {
                adds.push((b, ln));
                j += 1;
            }
            Ordering::Equal => {
                let lo = ip(lo);
                if lo != ln {
                    removals.push((b, lo));
                    adds.push((b, ln));
                }
                i += 1;
                j += 1;
            }
        }
    }
    removals.extend(old[i..].iter().map(|&(a, lo)| (a.ip(), ip(lo))));
    adds.extend(new[j..].iter().map(|&(b, ln, _)| (b, ln)));
}

/// Checks a set of endpoints into `out`, sorted by address; an address listed twice is refused.
/// The error is the one met first in input order, as if the list were checked one by one.
fn check_endpoints<E: EndpointInput>(
    field: &str,
    endpoints: &[E],
    out: &mut Checked,
) -> Result<(), InvalidInput> {
    out.clear();
    let mut failed = None;
    for (i, e) in endpoints.iter().enumerate() {
        match e.check() {
            Ok((address, location)) => out.push((
                address,
                location,
                u32::try_from(i).expect("fewer than 2^32 endpoints"),
            )),
            Err(err) => {
                // Field paths are only formatted for an error: this runs for every endpoint.
                failed = Some(err.within(&format!("{field}[{i}]")));
                break;
            }
        }
    }
    out.sort_unstable_by_key(|&(address, _, i)| (address, i));
    // The first repeat in input order: the least second position among equal addresses.
    let repeat = out
        .windows(2)
        .filter(|w| w[0].0 == w[1].0)
        .map(|w| (w[1].2, w[0].2))
        .min();
    if let Some((i, first)) = repeat {
        return Err(InvalidInput::new(
            format!("{field}[{i}].address"),
            endpoints[i as usize].address_value(),
            Reason::Duplicate {
                first: format!("{field}[{first}].address"),
            },
        ));
    }
    failed.map_or(Ok(()), Err)
}

impl DiffTracker {
    /// Adds or removes an inbound identity (a LoadBalancer Service, by UID). Removing it also strips
    /// it from every address, dropping addresses and locations left with nothing.
    /// It states no IP family (see [`DiffTracker::update_service_family`]).
    pub fn update_service(&mut self, op: Operation, id: &str) -> Result<(), InvalidInput> {
        self.update_service_family(op, id, None)
    }

    /// [`DiffTracker::update_service`] of an inbound identity of IP family `family` (ignored on
    /// removal): its endpoints must be of that family, and its frontend family cannot change
    /// while the tracker knows it (`family.rs`). `None` states no family: an IPv4 frontend, and
    /// endpoints of both families accepted.
    pub fn update_service_family(
        &mut self,
        op: Operation,
        id: &str,
        family: Option<IpFamily>,
    ) -> Result<(), InvalidInput> {
        let result = self.update_service_inner(op, id, family);
        self.services.collect_unused();
        result
    }

    fn update_service_inner(
        &mut self,
        op: Operation,
        id: &str,
        family: Option<IpFamily>,
    ) -> Result<(), InvalidInput> {
        let name = normalize_identity("service_id", id)?;
        match op {
            Operation::Add => {
                let sid = self
                    .services
                    .intern(&name, ServiceKind::Inbound)
                    .map_err(|k| conflict("service_id", id, k))?;
                if let Err(e) = self.check_add_family(sid, family) {
                    self.services.release_if_unused(sid);
                    return Err(e);
                }
                self.set_add_family(sid, family);
                let entry = self.services.get_mut(sid);
                if !entry.desired_inbound {
                    entry.desired_inbound = true;
                    self.revision += 1;
                    self.service_changed(sid);
                }
            }
            Operation::Remove => {
                let Some(sid) = self.services.id(&name) else {
                    return Ok(());
                };
                if self.services.get(sid).kind != ServiceKind::Inbound {
                    return Ok(());
                }
                let entry = self.services.get_mut(sid);
                entry.reprogram = false;
                if entry.desired_inbound {
                    entry.desired_inbound = false;
                    self.revision += 1;
                    self.service_changed(sid);
                }
                for (address, location) in self.desired_addresses_of(sid) {
                    self.remove_inbound_ref(location, address, sid);
                }
                self.services.release_if_unused(sid);
            }
        }
        Ok(())
    }

    /// Asks for a desired inbound identity to be created again in NRP even if NRP has it, because
    /// what its creation sends changed (its ports, which the tracker does not keep): its status
    /// becomes a pending `Create` until a creation is recorded (`record_service_applied`) or it
    /// stops being desired. Counts as a desired change (the revision grows). Returns whether it
    /// did anything: an unknown, undesired or outbound identity is left alone.
    pub fn reprogram_service(&mut self, id: &str) -> Result<bool, InvalidInput> {
        let name = normalize_identity("service_id", id)?;
        let Some(sid) = self.services.id(&name) else {
            return Ok(false);
        };
        let entry = self.services.get_mut(sid);
        if entry.kind != ServiceKind::Inbound || !entry.desired_inbound {
            return Ok(false);
        }
        entry.reprogram = true;
        self.revision += 1;
        self.dirty_service(sid);
        Ok(true)
    }

    /// Adds (declares) or removes an outbound identity (an egress). Removing it clears it from
    /// every pod that used it.
    pub fn update_egress(&mut self, op: Operation, id: &str) -> Result<(), InvalidInput> {
        let result = self.update_egress_inner(op, id);
        self.services.collect_unused();
        result
    }

    fn update_egress_inner(&mut self, op: Operation, id: &str) -> Result<(), InvalidInput> {
        let name = normalize_identity("egress_id", id)?;
        match op {
            Operation::Add => {
                let sid = self
                    .services
                    .intern(&name, ServiceKind::Outbound)
                    .map_err(|k| conflict("egress_id", id, k))?;
                let egress = self.services.get_mut(sid).egress.get_or_insert_default();
                if !egress.declared {
                    let was_desired = egress.pods > 0;
                    egress.declared = true;
                    self.revision += 1;
                    if !was_desired {
                        self.service_changed(sid);
                    }
                }
            }
            Operation::Remove => {
                let Some(sid) = self.services.id(&name) else {
                    return Ok(());
                };
                let entry = self.services.get_mut(sid);
                if entry.egress.take().is_none() {
                    return Ok(());
                }
                // No pod needs an IPv6 public IP any more (`egress_family.rs`).
                if entry.nat_gateway.is_none() {
                    entry.reprogram = false;
                }
                self.revision += 1;
                self.service_changed(sid);
                for (address, location) in self.desired_addresses_of(sid) {
                    self.update_desired(location, address, |d| {
                        if d.outbound == Some(sid) {
                            d.outbound = None;
                            d.pod = None;
                        }
                    });
                }
                self.services.release_if_unused(sid);
            }
        }
        Ok(())
    }

    /// Level update: `endpoints` is the whole set of backends of inbound identity `service` now.
    /// In time proportional to the old and the new set (the service's own addresses are indexed).
    pub fn set_endpoints(
        &mut self,
        service: &str,
        endpoints: &[Endpoint<'_>],
    ) -> Result<(), InvalidInput> {
        let result = self.set_endpoints_inner(service, endpoints);
        self.services.collect_unused();
        result
    }

    /// [`DiffTracker::set_endpoints`] with parsed IPs.
    pub fn set_endpoints_ip(
        &mut self,
        service: &str,
        endpoints: &[EndpointIp],
    ) -> Result<(), InvalidInput> {
        let result = self.set_endpoints_inner(service, endpoints);
        self.services.collect_unused();
        result
    }

    fn set_endpoints_inner<E: EndpointInput>(
        &mut self,
        service: &str,
        endpoints: &[E],
    ) -> Result<(), InvalidInput> {
        let name = normalize_identity("service_id", service)?;
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = check_endpoints("endpoints", endpoints, &mut scratch.new).and_then(|()| {
            let sid = self
                .services
                .intern(&name, ServiceKind::Inbound)
                .map_err(|k| conflict("service_id", service, k))?;
            if let Err(e) = self.check_endpoint_families(sid, "endpoints", &scratch.new) {
                self.services.release_if_unused(sid);
                return Err(e);
            }
            self.apply_level(sid, &mut scratch);
            self.services.release_if_unused(sid);
            Ok(())
        });
        scratch.trim();
        self.scratch = scratch;
        result
    }

    /// Makes `scratch.new` the whole set of backends of `sid`: what the service's address index
    /// has and the new set lacks (or has at another location) is removed first, then what is new
    /// is added.
    fn apply_level(&mut self, sid: ServiceId, scratch: &mut Scratch) {
        let Scratch {
            new,
            removals,
            adds,
            ..
        } = scratch;
        removals.clear();
        adds.clear();
        let old = &self.services.get(sid).addresses;
        let locations = &self.locations;
        if let Some((old4, old6)) = old.sorted() {
            // Both sides sorted by address (every IPv4 first): one merge per family.
            let split = new.partition_point(|e| e.0.is_ipv4());
            let ip = |l| locations.ip(l);
            merge(old4, &new[..split], ip, removals, adds);
            merge(old6, &new[split..], ip, removals, adds);
        } else {
            for (a, lo) in old.iter() {
                let lo = locations.ip(lo);
                match new.binary_search_by_key(&a, |e| e.0) {
                    Ok(i) if new[i].1 == lo => {}
                    _ => removals.push((a, lo)),
                }
            }
            for &(a, ln, _) in new.iter() {
                if old.get(&a).map(|l| locations.ip(l)) != Some(ln) {
                    adds.push((a, ln));
                }
            }
        }
        for &(address, location) in removals.iter() {
            // Known from the index: the address refers to `sid` there.
            self.update_desired(location, address, |d| {
                remove_ref(&mut d.inbound, sid);
            });
        }
        for &(address, location) in adds.iter() {
            self.add_inbound_ref(location, address, sid);
        }
    }

    /// Edge update: the backends of `service` went from `old` to `new`.
    pub fn update_endpoints(
        &mut self,
        service: &str,
        old: &[Endpoint<'_>],
        new: &[Endpoint<'_>],
    ) -> Result<(), InvalidInput> {
        let result = self.update_endpoints_inner(service, old, new);
        self.services.collect_unused();
        result
    }

    /// [`DiffTracker::update_endpoints`] with parsed IPs.
    pub fn update_endpoints_ip(
        &mut self,
        service: &str,
        old: &[EndpointIp],
        new: &[EndpointIp],
    ) -> Result<(), InvalidInput> {
        let result = self.update_endpoints_inner(service, old, new);
        self.services.collect_unused();
        result
    }

    fn update_endpoints_inner<E: EndpointInput>(
        &mut self,
        service: &str,
        old: &[E],
        new: &[E],
    ) -> Result<(), InvalidInput> {
        let name = normalize_identity("service_id", service)?;
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = check_endpoints("old_endpoints", old, &mut scratch.old)
            .and_then(|()| check_endpoints("new_endpoints", new, &mut scratch.new))
            .and_then(|()| {
                let sid = self
                    .services
                    .intern(&name, ServiceKind::Inbound)
                    .map_err(|k| conflict("service_id", service, k))?;
                if let Err(e) = self.check_endpoint_families(sid, "new_endpoints", &scratch.new) {
                    self.services.release_if_unused(sid);
                    return Err(e);
                }
                self.apply_edge(sid, &mut scratch);
                self.services.release_if_unused(sid);
                Ok(())
            });
        scratch.trim();
        self.scratch = scratch;
        result
    }

    /// Removes what `scratch.old` has and `scratch.new` lacks (or has at another location), then
    /// adds what is new.
    fn apply_edge(&mut self, sid: ServiceId, scratch: &mut Scratch) {
        let Scratch {
            new,
            old,
            removals,
            adds,
        } = scratch;
        removals.clear();
        adds.clear();
        let (mut i, mut j) = (0, 0);
        while i < old.len() || j < new.len() {
            match (old.get(i), new.get(j)) {
                (Some(&(a, lo, _)), Some(&(b, ln, _))) if a == b => {
                    if lo != ln {
                        removals.push((a, lo));
                        adds.push((b, ln));
                    }
                    i += 1;
                    j += 1;
                }
                (Some(&(a, lo, _)), Some(&(b, _, _))) if a < b => {
                    removals.push((a, lo));
                    i += 1;
                }
                (Some(&(a, lo, _)), None) => {
                    removals.push((a, lo));
                    i += 1;
                }
                (_, Some(&(b, ln, _))) => {
                    adds.push((b, ln));
                    j += 1;
                }
                (None, None) => unreachable!("loop condition"),
            }
        }
        for &(address, location) in removals.iter() {
            self.remove_inbound_ref(location, address, sid);
        }
        for &(address, location) in adds.iter() {
            self.add_inbound_ref(location, address, sid);
        }
    }

    /// The slot of an address desired at a location.
    pub(super) fn desired_slot(&self, location: IpAddr, address: IpAddr) -> Option<&Slot> {
        self.locations
            .get(&location)?
            .addresses
            .get(&address)
            .filter(|s| s.has_desired())
    }

    /// Every desired (address, location) whose ref includes `sid`: from its address index (inbound)
    /// or the locations its pods are at (outbound).
    fn desired_addresses_of(&mut self, sid: ServiceId) -> Vec<(IpAddr, IpAddr)> {
        if self.services.get(sid).kind == ServiceKind::Inbound {
            return self
                .services
                .get(sid)
                .addresses
                .iter()
                .map(|(address, location)| (address, self.locations.ip(location)))
                .collect();
        }
        let mut out = Vec::new();
        for location in self.locations_of(sid) {
            let (ip, loc) = self.locations.by_id(location).expect("live location");
            for (address, slot) in loc.addresses.iter() {
                if slot.outbound == Some(sid) {
                    out.push((address, ip));
                }
            }
        }
        out
    }

    /// An address desired at another location moves here, with everything it carries.
    pub(super) fn move_if_elsewhere(&mut self, address: IpAddr, location: IpAddr) {
        // Desired here already (the usual update): it is desired nowhere else.
        if self.desired_slot(location, address).is_some() {
            return;
        }
        if let Some(from) = self
            .desired_at
            .get(&address)
            .map(|id| self.locations.ip(id))
            && from != location
            && let Some(moved) = self.take_desired(from, address)
        {
            self.update_desired(location, address, |d| *d = moved);
        }
    }

    fn add_inbound_ref(&mut self, location: IpAddr, address: IpAddr, sid: ServiceId) {
        self.move_if_elsewhere(address, location);
        self.update_desired(location, address, |d| {
            insert_ref(&mut d.inbound, sid);
        });
    }

    fn remove_inbound_ref(&mut self, location: IpAddr, address: IpAddr, sid: ServiceId) {
        if self
            .desired_slot(location, address)
            .is_some_and(|s| s.inbound().binary_search(&sid).is_ok())
        {
            self.update_desired(location, address, |d| {
                remove_ref(&mut d.inbound, sid);
            });
        }
    }
}
