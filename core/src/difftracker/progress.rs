//! A service change that NRP accepted only in part: the actual state follows the steps that went
//! through, never "all or nothing" (docs/errors.md).
//!
//! A creation saga puts the public IP, then the load balancer (or NAT gateway), then registers the
//! service on the gateway; a deletion saga unregisters it, then deletes the load balancer (or NAT
//! gateway), then the public IP. The registration is what the actual state holds (it is what NRP
//! lists and what addresses may refer to); the resources around it are tracked only as
//! "left over" (`ServiceEntry::leftover`), so that an identity that is not desired any more is
//! deleted again until they are gone.

use super::DiffTracker;
use super::diff::ServiceChange;
use super::error::InvalidInput;
use super::identity::normalize_identity;
use super::{Reason, ReportError};

/// How far a service change that did not go through as a whole got in NRP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServiceStep {
    /// NRP holds, or may hold, the change's public IP, load balancer or NAT gateway; the
    /// registration is as before.
    Resources,
    /// A deletion removed the registration; the load balancer or NAT gateway, or the public IP, may
    /// remain.
    Unregistered,
}

impl DiffTracker {
    /// Records that NRP accepted `change` up to `step` (the change as a whole failed). A removed
    /// registration is removed from the actual state (the locations that refer to the service
    /// are dirtied, so the readiness filter drops it), and the service's resources are noted as
    /// left over: an identity not desired any more is sent for deletion again to clean them up,
    /// one desired again is created again (which takes them over).
    pub fn record_service_progress(
        &mut self,
        change: &ServiceChange,
        step: ServiceStep,
    ) -> Result<(), ReportError> {
        let result = self.record_service_progress_inner(change, step);
        self.services.collect_unused();
        result
    }

    fn record_service_progress_inner(
        &mut self,
        change: &ServiceChange,
        step: ServiceStep,
    ) -> Result<(), ReportError> {
        let name = normalize_identity("service", &change.name)?;
        let sid = self
            .services
            .intern(&name, change.kind)
            .map_err(|existing| {
                InvalidInput::new(
                    "service",
                    &change.name,
                    Reason::KindConflict {
                        existing: existing.as_str(),
                    },
                )
            })?;
        if step == ServiceStep::Unregistered {
            let count = self.services.get(sid).actual_refs;
            if count > 0 {
                self.services.release_if_unused(sid);
                return Err(ReportError::StillReferenced {
                    service: name.into_owned(),
                    count,
                });
            }
        }
        let entry = self.services.get_mut(sid);
        let (was, registered) = (entry.leftover, entry.actual.is_some());
        entry.leftover = true;
        if step == ServiceStep::Unregistered && registered {
            self.set_service_actual(sid, None);
        } else if !was {
            // An undesired identity becomes a deletion to send (its resources).
            self.dirty_service(sid);
        }
        self.services.release_if_unused(sid);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn change(name: &str, kind: ServiceKind, action: ServiceAction) -> ServiceChange {
        ServiceChange {
            name: name.into(),
            kind,
            action,
            nat_gateway: None,
            ipv6: false,
        }
    }

    fn delete(name: &str) -> ServiceChange {
        change(name, ServiceKind::Inbound, ServiceAction::Delete)
    }

    fn create(name: &str) -> ServiceChange {
        change(name, ServiceKind::Inbound, ServiceAction::Create)
    }

    /// `svc` registered in NRP, desired, with one address at 10.0.0.1 referring to it there too.
    fn programmed() -> DiffTracker {
        let mut t = DiffTracker::new();
        t.update_service(Operation::Add, "svc").unwrap();
        t.set_endpoints(
            "svc",
            &[Endpoint {
                address: "10.1.0.1",
                location: "10.0.0.1",
            }],
        )
        .unwrap();
        t.record_service_applied(&create("svc")).unwrap();
        let diff = t.location_diff(ip("10.0.0.1")).unwrap();
        t.record_location_applied(&diff).unwrap();
        assert!(t.pending_diff().is_empty());
        t
    }

    /// Removes `svc` from the desired state and records the drain of its address.
    fn drained(t: &mut DiffTracker) {
        t.update_service(Operation::Remove, "svc").unwrap();
        let diff = t.location_diff(ip("10.0.0.1")).unwrap();
        t.record_location_applied(&diff).unwrap();
        assert_eq!(
            t.service_status("svc"),
            ServiceStatus::Pending(delete("svc"))
        );
    }

    #[test]
    fn a_deletion_that_unregistered_takes_the_service_out_of_nrp_and_cleans_up_later() {
        let mut t = programmed();
        drained(&mut t);
        // Unregistered, then the load balancer's deletion failed.
        t.record_service_progress(&delete("svc"), ServiceStep::Unregistered)
            .unwrap();
        assert!(!t.service_view("svc").unwrap().actual);
        // Not desired: deleted again (its resources), with nothing to drain.
        assert_eq!(
            t.service_status("svc"),
            ServiceStatus::Pending(delete("svc"))
        );
        // Desired again before that: created again, and no address refers to it until it is.
        t.update_service(Operation::Add, "svc").unwrap();
        t.set_endpoints(
            "svc",
            &[Endpoint {
                address: "10.1.0.1",
                location: "10.0.0.1",
            }],
        )
        .unwrap();
        assert_eq!(
            t.service_status("svc"),
            ServiceStatus::Pending(create("svc"))
        );
        assert_eq!(t.location_diff(ip("10.0.0.1")), None, "readiness filter");
        t.record_service_applied(&create("svc")).unwrap();
        let diff = t
            .location_diff(ip("10.0.0.1"))
            .expect("now it may be referred to");
        assert_eq!(diff.addresses[0].services, vec!["svc"]);
    }

    #[test]
    fn a_creation_that_stopped_part_way_is_cleaned_up_when_not_desired_any_more() {
        let mut t = DiffTracker::new();
        t.update_service(Operation::Add, "svc").unwrap();
        t.record_service_progress(&create("svc"), ServiceStep::Resources)
            .unwrap();
        assert_eq!(
            t.service_status("svc"),
            ServiceStatus::Pending(create("svc")),
            "still desired: created again"
        );
        t.update_service(Operation::Remove, "svc").unwrap();
        assert_eq!(
            t.service_status("svc"),
            ServiceStatus::Pending(delete("svc")),
            "its public IP and load balancer may be in NRP"
        );
        assert!(t.take_dirty().services.contains(&"svc".to_string()));
        t.record_service_applied(&delete("svc")).unwrap();
        assert_eq!(t.service_status("svc"), ServiceStatus::InSync);
        assert!(t.service_view("svc").is_none(), "forgotten");
    }

    #[test]
    fn a_recorded_creation_takes_over_what_was_left() {
        let mut t = DiffTracker::new();
        t.update_service(Operation::Add, "svc").unwrap();
        t.record_service_progress(&create("svc"), ServiceStep::Resources)
            .unwrap();
        t.record_service_applied(&create("svc")).unwrap();
        t.update_service(Operation::Remove, "svc").unwrap();
        t.record_service_applied(&delete("svc")).unwrap();
        assert_eq!(t.service_status("svc"), ServiceStatus::InSync);
        assert!(t.pending_diff().is_empty());
    }

    #[test]
    fn an_unregistration_while_nrp_addresses_still_refer_is_refused() {
        let mut t = programmed();
        t.update_service(Operation::Remove, "svc").unwrap();
        let err = t
            .record_service_progress(&delete("svc"), ServiceStep::Unregistered)
            .unwrap_err();
        assert!(matches!(err, ReportError::StillReferenced { count: 1, .. }));
        assert!(t.service_view("svc").unwrap().actual, "nothing recorded");
    }

    #[test]
    fn a_registration_that_vanished_from_nrp_leaves_resources_to_clean_up() {
        let mut t = programmed();
        drained(&mut t);
        // Someone (or a call whose outcome was unknown) removed the registration.
        t.observe(&ActualSnapshot::default()).unwrap();
        assert_eq!(
            t.service_status("svc"),
            ServiceStatus::Pending(delete("svc"))
        );
        t.record_service_applied(&delete("svc")).unwrap();
        assert!(t.pending_diff().is_empty());
    }

    #[test]
    fn withheld_deletions_hold_the_cleanup_too() {
        let mut t = DiffTracker::new();
        t.update_service(Operation::Add, "svc").unwrap();
        t.record_service_progress(&create("svc"), ServiceStep::Resources)
            .unwrap();
        t.set_removals_allowed(false);
        t.update_service(Operation::Remove, "svc").unwrap();
        assert_eq!(t.service_status("svc"), ServiceStatus::Withheld);
    }
}
