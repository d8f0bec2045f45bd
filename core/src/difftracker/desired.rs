//! Desired-state mutations (what Kubernetes wants). Each validates all of its input first and
//! changes nothing when it fails.

use foldhash::{HashMap, HashMapExt, HashSet};
use std::net::IpAddr;

use super::DiffTracker;
use super::error::{InvalidInput, Reason};
use super::identity::{EgressState, ServiceId, ServiceKind, normalize_identity};
use super::ip::parse_address_at;
use super::location::{Desired, PodUid, with_ref, without_ref};

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
}

fn conflict(field: &str, value: &str, existing: ServiceKind) -> InvalidInput {
    InvalidInput::new(
        field,
        value,
        Reason::KindConflict {
            existing: existing.as_str(),
        },
    )
}

/// Parses a set of endpoints; an address listed twice is refused.
fn parse_endpoints(
    field: &str,
    endpoints: &[Endpoint<'_>],
) -> Result<Vec<(IpAddr, IpAddr)>, InvalidInput> {
    let mut seen: HashMap<IpAddr, usize> = HashMap::with_capacity(endpoints.len());
    let mut out = Vec::with_capacity(endpoints.len());
    for (i, e) in endpoints.iter().enumerate() {
        // Field paths are only formatted for an error: this runs for every endpoint.
        let (addr, loc) = parse_address_at("address", e.address, "location", e.location)
            .map_err(|err| err.within(&format!("{field}[{i}]")))?;
        if let Some(first) = seen.insert(addr, i) {
            return Err(InvalidInput::new(
                format!("{field}[{i}].address"),
                e.address,
                Reason::Duplicate {
                    first: format!("{field}[{first}].address"),
                },
            ));
        }
        out.push((addr, loc));
    }
    Ok(out)
}

impl DiffTracker {
    /// Adds or removes an inbound identity (a LoadBalancer Service, by UID). Removing it also strips
    /// it from every address, dropping addresses and locations left with nothing.
    pub fn update_service(&mut self, op: Operation, id: &str) -> Result<(), InvalidInput> {
        let result = self.update_service_inner(op, id);
        self.services.collect_unused();
        result
    }

    fn update_service_inner(&mut self, op: Operation, id: &str) -> Result<(), InvalidInput> {
        let name = normalize_identity("id", id)?;
        match op {
            Operation::Add => {
                let sid = self
                    .services
                    .intern(&name, ServiceKind::Inbound)
                    .map_err(|k| conflict("id", id, k))?;
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
        let name = normalize_identity("id", id)?;
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
        let name = normalize_identity("id", id)?;
        match op {
            Operation::Add => {
                let sid = self
                    .services
                    .intern(&name, ServiceKind::Outbound)
                    .map_err(|k| conflict("id", id, k))?;
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
                if self.services.get_mut(sid).egress.take().is_none() {
                    return Ok(());
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
    pub fn set_endpoints(
        &mut self,
        service: &str,
        endpoints: &[Endpoint<'_>],
    ) -> Result<(), InvalidInput> {
        let result = self.set_endpoints_inner(service, endpoints);
        self.services.collect_unused();
        result
    }

    fn set_endpoints_inner(
        &mut self,
        service: &str,
        endpoints: &[Endpoint<'_>],
    ) -> Result<(), InvalidInput> {
        let name = normalize_identity("service_id", service)?;
        let new = parse_endpoints("endpoints", endpoints)?;
        let sid = self
            .services
            .intern(&name, ServiceKind::Inbound)
            .map_err(|k| conflict("service_id", service, k))?;
        let old = self.desired_addresses_of(sid);
        let wanted: HashMap<IpAddr, IpAddr> = new.iter().copied().collect();
        for &(address, location) in &old {
            if wanted.get(&address) != Some(&location) {
                self.remove_inbound_ref(location, address, sid);
            }
        }
        let had: HashSet<(IpAddr, IpAddr)> = old.into_iter().collect();
        for (address, location) in new {
            if !had.contains(&(address, location)) {
                self.add_inbound_ref(location, address, sid);
            }
        }
        self.services.release_if_unused(sid);
        Ok(())
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

    fn update_endpoints_inner(
        &mut self,
        service: &str,
        old: &[Endpoint<'_>],
        new: &[Endpoint<'_>],
    ) -> Result<(), InvalidInput> {
        let name = normalize_identity("service_id", service)?;
        let old = parse_endpoints("old_endpoints", old)?;
        let new = parse_endpoints("new_endpoints", new)?;
        let sid = self
            .services
            .intern(&name, ServiceKind::Inbound)
            .map_err(|k| conflict("service_id", service, k))?;
        let old_set: HashSet<(IpAddr, IpAddr)> = old.iter().copied().collect();
        let new_set: HashSet<(IpAddr, IpAddr)> = new.iter().copied().collect();
        for &(address, location) in old.iter().filter(|p| !new_set.contains(p)) {
            self.remove_inbound_ref(location, address, sid);
        }
        for &(address, location) in new.iter().filter(|p| !old_set.contains(p)) {
            self.add_inbound_ref(location, address, sid);
        }
        self.services.release_if_unused(sid);
        Ok(())
    }

    /// Adds/updates or removes a pod. Adding sets the address's outbound identity (moving the pod's
    /// count from its old egress to the new one); removing clears only the outbound identity, and
    /// is a no-op for an unknown pod or one whose UID differs from the pod now at the address.
    pub fn update_pod(&mut self, op: Operation, pod: &PodUpdate<'_>) -> Result<(), InvalidInput> {
        let result = self.update_pod_inner(op, pod);
        self.services.collect_unused();
        result
    }

    fn update_pod_inner(&mut self, op: Operation, pod: &PodUpdate<'_>) -> Result<(), InvalidInput> {
        let (address, location) =
            parse_address_at("address", pod.address, "location", pod.location)?;
        let uid = PodUid::of(pod.uid);
        match op {
            Operation::Add => {
                let outbound = if pod.outbound_identity.is_empty() {
                    None
                } else {
                    let name = normalize_identity("outbound_identity", pod.outbound_identity)?;
                    let sid = self
                        .services
                        .intern(&name, ServiceKind::Outbound)
                        .map_err(|k| conflict("outbound_identity", pod.outbound_identity, k))?;
                    Some(sid)
                };
                self.move_if_elsewhere(address, location);
                let mut old_outbound = None;
                self.update_desired(location, address, |d| {
                    old_outbound = d.outbound;
                    d.outbound = outbound;
                    d.pod = outbound.and(uid);
                });
                if old_outbound != outbound {
                    if let Some(sid) = outbound {
                        self.add_egress_pod(sid);
                    }
                    if let Some(old) = old_outbound {
                        self.remove_egress_pod(old);
                    }
                }
                if let Some(sid) = outbound {
                    self.services.release_if_unused(sid);
                }
            }
            Operation::Remove => {
                if self
                    .desired_at
                    .get(&address)
                    .map(|id| self.locations.ip(id))
                    != Some(location)
                {
                    return Ok(());
                }
                let Some(current) = self.desired(location, address) else {
                    return Ok(());
                };
                let Some(old_outbound) = current.outbound else {
                    return Ok(());
                };
                if let (Some(given), Some(held)) = (uid, current.pod)
                    && given != held
                {
                    return Ok(());
                }
                self.update_desired(location, address, |d| {
                    d.outbound = None;
                    d.pod = None;
                });
                self.remove_egress_pod(old_outbound);
            }
        }
        Ok(())
    }

    /// The desired part of an address at a location.
    fn desired(&self, location: IpAddr, address: IpAddr) -> Option<&Desired> {
        self.locations
            .get(&location)?
            .addresses
            .get(&address)?
            .desired
            .as_ref()
    }

    /// Every desired (address, location) whose ref includes `sid`: proportional to the locations
    /// that use it, thanks to the reverse index.
    fn desired_addresses_of(&self, sid: ServiceId) -> Vec<(IpAddr, IpAddr)> {
        let mut out = Vec::new();
        for location in self.services.get(sid).locations.keys() {
            let location = self.locations.ip(*location);
            let Some(loc) = self.locations.get(&location) else {
                continue;
            };
            for (address, slot) in loc.addresses.iter() {
                if slot.desired.as_ref().is_some_and(|d| {
                    d.inbound.binary_search(&sid).is_ok() || d.outbound == Some(sid)
                }) {
                    out.push((*address, location));
                }
            }
        }
        out
    }

    /// An address desired at another location moves here, with everything it carries.
    fn move_if_elsewhere(&mut self, address: IpAddr, location: IpAddr) {
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
        self.update_desired(location, address, |d| d.inbound = with_ref(&d.inbound, sid));
    }

    fn remove_inbound_ref(&mut self, location: IpAddr, address: IpAddr, sid: ServiceId) {
        if self
            .desired(location, address)
            .is_some_and(|d| d.inbound.binary_search(&sid).is_ok())
        {
            self.update_desired(location, address, |d| {
                d.inbound = without_ref(&d.inbound, sid)
            });
        }
    }

    fn add_egress_pod(&mut self, sid: ServiceId) {
        let egress = self.services.get_mut(sid).egress.get_or_insert_default();
        let was_desired = egress.declared || egress.pods > 0;
        egress.pods += 1;
        if !was_desired {
            self.revision += 1;
            self.service_changed(sid);
        }
    }

    fn remove_egress_pod(&mut self, sid: ServiceId) {
        let entry = self.services.get_mut(sid);
        let Some(egress) = entry.egress.as_mut() else {
            return;
        };
        egress.pods = egress.pods.saturating_sub(1);
        if *egress == EgressState::default() {
            entry.egress = None;
            self.revision += 1;
            self.service_changed(sid);
        }
        self.services.release_if_unused(sid);
    }
}
