//! Pod mutations: a pod is an address at a location with its optional egress (outbound identity);
//! the egress counts its pods, and those with an IPv6 address (`egress_family.rs`).

use std::net::IpAddr;

use super::DiffTracker;
use super::desired::{Operation, PodIpUpdate, PodUpdate, conflict};
use super::error::InvalidInput;
use super::identity::{ServiceKind, normalize_identity};
use super::ip::{check_address_at, parse_address_at};
use super::location::PodUid;

impl DiffTracker {
    /// Adds/updates or removes a pod. Adding sets the address's outbound identity (moving the pod's
    /// count from its old egress to the new one); removing clears only the outbound identity, and
    /// is a no-op for an unknown pod or one whose UID differs from the pod now at the address.
    /// An add naming another NAT gateway than its egress is bound to is refused (`natgw.rs`).
    pub fn update_pod(&mut self, op: Operation, pod: &PodUpdate<'_>) -> Result<(), InvalidInput> {
        let at = parse_address_at("address", pod.address, "location", pod.location);
        let pod = (pod.outbound_identity, pod.uid, pod.nat_gateway);
        self.update_pod_at(op, at, pod)
    }

    /// [`DiffTracker::update_pod`] with parsed IPs.
    pub fn update_pod_ip(
        &mut self,
        op: Operation,
        pod: &PodIpUpdate<'_>,
    ) -> Result<(), InvalidInput> {
        let at = check_address_at("address", pod.address, "location", pod.location);
        let pod = (pod.outbound_identity, pod.uid, pod.nat_gateway);
        self.update_pod_at(op, at, pod)
    }

    /// Applies a pod whose (address, location) was parsed or checked into `at`; `pod` is its
    /// (outbound identity, UID, NAT gateway).
    fn update_pod_at(
        &mut self,
        op: Operation,
        at: Result<(IpAddr, IpAddr), InvalidInput>,
        (identity, uid, nat_gateway): (&str, &str, &str),
    ) -> Result<(), InvalidInput> {
        let result = at.and_then(|(address, location)| {
            self.update_pod_inner(op, address, location, identity, uid, nat_gateway)
        });
        self.services.collect_unused();
        result
    }

    fn update_pod_inner(
        &mut self,
        op: Operation,
        address: IpAddr,
        location: IpAddr,
        outbound_identity: &str,
        uid: &str,
        nat_gateway: &str,
    ) -> Result<(), InvalidInput> {
        let uid = PodUid::of(uid);
        match op {
            Operation::Add => {
                let outbound = if outbound_identity.is_empty() {
                    None
                } else {
                    let name = normalize_identity("egress_id", outbound_identity)?;
                    let sid = self
                        .services
                        .intern(&name, ServiceKind::Outbound)
                        .map_err(|k| conflict("egress_id", outbound_identity, k))?;
                    self.bind_nat_gateway(sid, nat_gateway)?;
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
                        self.add_egress_pod(sid, address.is_ipv6());
                    }
                    if let Some(old) = old_outbound {
                        self.remove_egress_pod(old, address.is_ipv6());
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
                let Some(current) = self.desired_slot(location, address) else {
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
                self.remove_egress_pod(old_outbound, address.is_ipv6());
            }
        }
        Ok(())
    }
}
