//! The IP families of an egress. An egress has no family of its own: its pods may have IPv4 and
//! IPv6 addresses (a dual-stack pod is two pod updates, one per address). Its NAT gateway always
//! has an IPv4 public IP; it needs an IPv6 one as well once a pod of the egress has an IPv6 address.
//!
//! * The tracker counts the egress's pods with an IPv6 address (`EgressState::v6_pods`).
//! * The creation of an egress carries `ServiceChange::ipv6` when it needs an IPv6 public IP; the
//!   worker then creates and attaches one (named like the IPv4 one plus `-v6`).
//! * When the first IPv6 pod of an egress NRP already has appears, the egress's creation is sent
//!   again (an ordinary, idempotent service change: `reprogram`), with `ipv6` set.
//! * An IPv6 address refers to the egress in NRP only once NRP's NAT gateway has its IPv6 public IP
//!   (`ServiceEntry::nat_v6`: a recorded creation with `ipv6`, or an observation that found IPv6
//!   addresses referring to it); until then the address is sent without the egress (the readiness
//!   filter, `diff.rs`), exactly as an address of an egress NRP does not have yet.
//! * When the last IPv6 pod goes, the IPv6 public IP is kept (`ipv6` stays set on later creations,
//!   so a re-sent creation never detaches it): removing it would need its own drain, and another
//!   IPv6 pod would need it back. It goes with the egress's deletion (after the drain).

use super::DiffTracker;
use super::diff::ServiceChange;
use super::identity::{EgressState, ServiceEntry, ServiceId, ServiceKind};

impl ServiceEntry {
    /// Whether this outbound identity's NAT gateway must carry an IPv6 public IP: a pod of it has an
    /// IPv6 address, or NRP's NAT gateway has one already (kept). Always false for an inbound one.
    pub(crate) fn needs_ipv6(&self) -> bool {
        self.kind == ServiceKind::Outbound
            && (self.nat_v6 || self.egress.is_some_and(|g| g.v6_pods > 0))
    }

    /// Whether pods of this egress have IPv6 addresses that NRP's NAT gateway cannot serve yet.
    fn lacks_ipv6(&self) -> bool {
        self.kind == ServiceKind::Outbound
            && !self.nat_v6
            && self.egress.is_some_and(|g| g.v6_pods > 0)
    }
}

impl DiffTracker {
    /// Counts a pod of egress `sid` (`v6`: its address is IPv6). The first IPv6 pod of an egress
    /// that NRP has without an IPv6 public IP sends its creation again.
    pub(super) fn add_egress_pod(&mut self, sid: ServiceId, v6: bool) {
        let egress = self.services.get_mut(sid).egress.get_or_insert_default();
        let was_desired = egress.declared || egress.pods > 0;
        egress.pods += 1;
        let first_v6 = v6 && egress.v6_pods == 0;
        if v6 {
            egress.v6_pods += 1;
        }
        if first_v6 {
            let e = self.services.get_mut(sid);
            if e.actual.is_some() && e.lacks_ipv6() && !e.reprogram {
                e.reprogram = true;
                self.revision += 1;
                self.dirty_service(sid);
            }
        }
        if !was_desired {
            self.revision += 1;
            self.service_changed(sid);
        }
    }

    /// Uncounts a pod of egress `sid` (`v6`: its address is IPv6). The IPv6 public IP stays (module
    /// documentation).
    pub(super) fn remove_egress_pod(&mut self, sid: ServiceId, v6: bool) {
        let entry = self.services.get_mut(sid);
        let Some(egress) = entry.egress.as_mut() else {
            return;
        };
        egress.pods = egress.pods.saturating_sub(1);
        if v6 {
            egress.v6_pods = egress.v6_pods.saturating_sub(1);
        }
        if *egress == EgressState::default() {
            entry.egress = None;
            self.revision += 1;
            self.service_changed(sid);
        }
        // The creation sent again for the IPv6 public IP is no longer due. (An egress that
        // brings its NAT gateway may be created again for another reason: `natgw.rs`.)
        let entry = self.services.get_mut(sid);
        if v6 && entry.nat_gateway.is_none() && !entry.lacks_ipv6() {
            entry.reprogram = false;
        }
        self.services.release_if_unused(sid);
    }

    /// Records the IPv6 public IP of an outbound identity whose creation NRP accepted as `change`:
    /// it has one exactly when the change said so. A creation sent before the first IPv6 pod came
    /// is sent again. Returns whether a creation is still due (so `reprogram` stays set).
    pub(super) fn record_egress_family(&mut self, sid: ServiceId, change: &ServiceChange) -> bool {
        let e = self.services.get_mut(sid);
        if e.kind != ServiceKind::Outbound {
            return false;
        }
        let had = std::mem::replace(&mut e.nat_v6, change.ipv6);
        let again = e.is_desired() && e.lacks_ipv6();
        if had != change.ipv6 {
            // The IPv6 addresses of the egress's pods may now refer to it.
            self.service_changed(sid);
        } else if again {
            self.dirty_service(sid);
        }
        again
    }

    /// Sets, from an observation, whether NRP's NAT gateway of the outbound identity `sid` has an
    /// IPv6 public IP (`v6`: IPv6 addresses in NRP refer to it). An egress found without one while
    /// IPv6 pods need it is created again.
    pub(super) fn observe_egress_family(&mut self, sid: ServiceId, v6: bool) {
        let e = self.services.get_mut(sid);
        if e.kind != ServiceKind::Outbound {
            return;
        }
        if e.nat_v6 != v6 {
            e.nat_v6 = v6;
            self.service_changed(sid);
        }
        let e = self.services.get_mut(sid);
        if e.actual.is_some() && e.lacks_ipv6() && !e.reprogram {
            e.reprogram = true;
            self.dirty_service(sid);
        }
    }

    /// Whether the outbound identity `name` (any case) needs an IPv6 public IP on its NAT gateway,
    /// and whether NRP's has one: `(needs, has)`; `None` for an unknown or inbound identity.
    pub fn egress_ipv6(&self, name: &str) -> Option<(bool, bool)> {
        let sid = self.services.id(&name.to_ascii_lowercase())?;
        let e = self.services.get(sid);
        (e.kind == ServiceKind::Outbound).then(|| (e.needs_ipv6(), e.nat_v6))
    }
}

#[cfg(test)]
#[path = "egress_family_tests.rs"]
mod tests;
