//! Brought NAT gateways: an egress may use an existing NAT gateway instead of one clb creates
//! (`PodUpdate::nat_gateway`, from the pods' annotation). The tracker binds an egress to the NAT
//! gateway its first pod names (none: one clb owns) and refuses a pod naming another one while
//! the binding holds: while the egress is desired (it has pods, or a writer declared it), or NRP
//! has it (registered, or resources left by a saga that stopped part-way). Changing the NAT
//! gateway of a live egress is therefore refused rather than done as drain, unregister, unlink
//! and link: the brought NAT gateway carries the egress's public IPs, so a change would move every
//! pod's outbound address at once, which is a new egress (another name) rather than an update.
//! Once NRP no longer has the egress, the next pod binds it anew.
//!
//! An identity known only from NRP (observed after a restart) has no binding yet (`nat_known`
//! false): the first pod binds it, and when it brings a NAT gateway its creation is sent again
//! (the server does not know which NAT gateway NRP registered it with; the saga is idempotent). The NAT gateway travels with the service changes of the
//! identity (`ServiceChange::nat_gateway`), the deletion's included, so that the worker unlinks
//! a brought NAT gateway instead of deleting one it owns. The core knows nothing of Azure beyond
//! the name: the worker checks the NAT gateway itself.

use super::DiffTracker;
use super::error::{InvalidInput, Reason};
use super::identity::ServiceId;

/// The field of the NAT gateway in a pod update.
const FIELD: &str = "nat_gateway";

/// Checks a NAT gateway name as ARM does (1–80 characters of letters, digits, `_`, `.`, `-`;
/// starting with a letter or digit, ending with a letter, a digit or `_`).
pub fn check_nat_gateway_name(field: &str, name: &str) -> Result<(), InvalidInput> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    let why = if name.chars().count() > 80 {
        Some("is longer than 80 characters")
    } else if !name.chars().all(ok) {
        Some("may hold only letters, digits, '_', '.' and '-'")
    } else if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        Some("must start with a letter or a digit")
    } else if !name.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
        Some("must end with a letter, a digit or '_'")
    } else {
        None
    };
    match why {
        Some(why) => Err(InvalidInput::new(
            field,
            name,
            Reason::InvalidNatGatewayName(why),
        )),
        None => Ok(()),
    }
}

impl DiffTracker {
    /// Binds the outbound identity `sid` to the NAT gateway `given` (empty: one clb owns), or
    /// checks that it is bound to it; refused (changing nothing) when it is bound to another.
    pub(super) fn bind_nat_gateway(
        &mut self,
        sid: ServiceId,
        given: &str,
    ) -> Result<(), InvalidInput> {
        if !given.is_empty() {
            check_nat_gateway_name(FIELD, given)?;
        }
        let e = self.services.get_mut(sid);
        let desired = e.egress.is_some_and(|g| g.declared || g.pods > 0);
        let held = e.nat_known && (desired || e.actual.is_some() || e.leftover);
        let current = e.nat_gateway.as_deref().unwrap_or("");
        if held {
            if current.eq_ignore_ascii_case(given) {
                return Ok(());
            }
            return Err(InvalidInput::new(
                FIELD,
                given,
                Reason::NatGatewayConflict {
                    egress: e.name.to_string(),
                    existing: e.nat_gateway.as_deref().map(str::to_owned),
                },
            ));
        }
        // Known only from NRP (a restart): which NAT gateway it is registered with is not known, so
        // an egress that brings one is created again (the saga is idempotent: it links the NAT
        // gateway if need be, and moves the registration to it, letting the other one go).
        let recreate = e.actual.is_some() && !e.nat_known && !given.is_empty();
        e.nat_gateway = (!given.is_empty()).then(|| given.into());
        e.nat_known = true;
        if recreate {
            e.reprogram = true;
            self.revision += 1;
            self.dirty_service(sid);
        }
        Ok(())
    }

    /// Sends the creation of the outbound identity `name` (canonical) again, if NRP has it: its
    /// brought NAT gateway was re-created after a read-back found it missing, and the new one is
    /// to be linked (`gateway/report.rs`). Returns whether it was marked.
    pub fn reprogram_egress(&mut self, name: &str) -> bool {
        let Some(sid) = self.services.id(name) else {
            return false;
        };
        let e = self.services.get_mut(sid);
        if e.kind != super::identity::ServiceKind::Outbound || e.actual.is_none() {
            return false;
        }
        e.reprogram = true;
        self.revision += 1;
        self.dirty_service(sid);
        true
    }

    /// The NAT gateway the outbound identity `name` brings, when a pod stated one.
    pub fn egress_nat_gateway(&self, name: &str) -> Option<&str> {
        let sid = self.services.id(&name.to_ascii_lowercase())?;
        self.services.get(sid).nat_gateway.as_deref()
    }
}

#[cfg(test)]
#[path = "natgw_tests.rs"]
mod tests;
