//! Scope replacement for `Writer.Resync`: a writer's complete view of its scope replaces what the
//! desired state holds in that scope. Pure (no I/O): the Writer service buffers the whole view and
//! calls [`replace_scope`] under one lock once the stream has ended cleanly.

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;

use clb_proto::v1::{self, ItemError, Update, endpoints_update::Change, update::Kind};

use super::convert::{self, apply_update, item_error, kind_name, update_path};
use clb_core::difftracker::identity::normalize_identity;
use clb_core::difftracker::ip::parse_ip;
use clb_core::difftracker::{DiffTracker, Operation, PodUpdate, quote};

pub use clb_core::gateway::Scope;

/// A problem with the resync header as a whole (see [`convert::resync_scope`]): the call fails
/// with `INVALID_ARGUMENT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderError {
    /// The path of the field at fault, such as `header.scope`.
    pub field: String,
    /// The value received.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} = {}: {}",
            self.field,
            quote(&self.value),
            self.reason
        )
    }
}

/// Whether `scope` covers updates of `kind`.
fn covers(scope: &Scope, kind: &Kind) -> bool {
    match kind {
        Kind::Service(_) => scope.services,
        Kind::Egress(_) => scope.egresses,
        Kind::Endpoints(_) => scope.endpoints,
        Kind::Pod(_) => scope.pods,
    }
}

/// The outcome of a scope replacement.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResyncOutcome {
    /// Updates of the view that were applied.
    pub applied: u32,
    /// Objects of the scope removed because the view did not contain them.
    pub removed: u32,
    /// Updates of the view that were refused.
    pub rejected: Vec<ItemError>,
}

/// What the view names, in canonical form. An object named by an update of the scope is kept even
/// when that update is refused: a malformed report must not delete a live backend.
#[derive(Debug, Default)]
struct Reported {
    services: HashSet<String>,
    egresses: HashSet<String>,
    endpoints: HashSet<String>,
    pods: HashSet<IpAddr>,
}

fn canonical_id(id: &str) -> Option<String> {
    normalize_identity("id", id).ok().map(|c| c.into_owned())
}

/// Checks that an update of a view is inside the scope and describes what exists, noting the
/// object it names; then applies it.
fn apply_view_update(
    tracker: &mut DiffTracker,
    scope: &Scope,
    update: &Update,
    index: usize,
    reported: &mut Reported,
) -> Result<(), ItemError> {
    let Some(kind) = &update.kind else {
        return apply_update(tracker, update, index);
    };
    let prefix = format!("{}.{}", update_path(index), kind_name(kind));
    if !covers(scope, kind) {
        return Err(item_error(
            index,
            prefix,
            "",
            format!("is outside the resync scope ({scope})"),
        ));
    }
    let raw_operation = match kind {
        Kind::Service(s) => {
            reported.services.extend(canonical_id(&s.id));
            Some(s.operation)
        }
        Kind::Egress(e) => {
            reported.egresses.extend(canonical_id(&e.id));
            Some(e.operation)
        }
        Kind::Endpoints(e) => {
            reported.endpoints.extend(canonical_id(&e.service_id));
            if let Some(Change::Edge(_)) = e.change {
                return Err(item_error(
                    index,
                    format!("{prefix}.edge"),
                    "",
                    "a resync view must give endpoints as a level, not as an edge",
                ));
            }
            None
        }
        Kind::Pod(p) => {
            if let (Some(want), Ok(at)) = (scope.location, parse_ip("location", &p.location))
                && want != at
            {
                return Err(item_error(
                    index,
                    format!("{prefix}.location"),
                    p.location.clone(),
                    format!("is outside the resync scope, which covers only the pods at {want}"),
                ));
            }
            reported.pods.extend(parse_ip("address", &p.address).ok());
            Some(p.operation)
        }
    };
    if let Some(raw) = raw_operation
        && convert::operation(index, &format!("{prefix}.operation"), raw)? != Operation::Add
    {
        return Err(item_error(
            index,
            format!("{prefix}.operation"),
            v1::Operation::Remove.as_str_name(),
            "a resync view describes what exists: only OPERATION_ADD is allowed",
        ));
    }
    apply_update(tracker, update, index)
}

/// Replaces the scope's desired state with the view: applies every valid update of the view
/// (indices count across the whole view), then removes what the scope holds but the view does not
/// name. Objects outside the scope are left alone.
pub fn replace_scope(tracker: &mut DiffTracker, scope: &Scope, view: &[Update]) -> ResyncOutcome {
    let mut out = ResyncOutcome::default();
    let mut reported = Reported::default();
    for (index, update) in view.iter().enumerate() {
        match apply_view_update(tracker, scope, update, index, &mut reported) {
            Ok(()) => out.applied += 1,
            Err(e) => out.rejected.push(e),
        }
    }
    if scope.services {
        for id in tracker.desired_inbound_identities() {
            if !reported.services.contains(&id)
                && tracker.update_service(Operation::Remove, &id).is_ok()
            {
                out.removed += 1;
            }
        }
    }
    if scope.egresses {
        for id in tracker.declared_egresses() {
            if !reported.egresses.contains(&id)
                && tracker.update_egress(Operation::Remove, &id).is_ok()
            {
                out.removed += 1;
            }
        }
    }
    if scope.endpoints {
        for id in tracker.services_with_endpoints() {
            if !reported.endpoints.contains(&id) && tracker.set_endpoints(&id, &[]).is_ok() {
                out.removed += 1;
            }
        }
    }
    if scope.pods {
        for (address, location) in tracker.pods(scope.location) {
            if reported.pods.contains(&address) {
                continue;
            }
            let (address, location) = (address.to_string(), location.to_string());
            let pod = PodUpdate {
                address: &address,
                location: &location,
                outbound_identity: "",
                uid: "",
            };
            if tracker.update_pod(Operation::Remove, &pod).is_ok() {
                out.removed += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clb_proto::v1::{EgressUpdate, EndpointSet, EndpointsUpdate, ServiceUpdate};

    fn service(id: &str) -> Update {
        Update {
            kind: Some(Kind::Service(ServiceUpdate {
                operation: 1,
                id: id.into(),
                ports: vec![],
            })),
        }
    }

    fn egress(id: &str) -> Update {
        Update {
            kind: Some(Kind::Egress(EgressUpdate {
                operation: 1,
                id: id.into(),
            })),
        }
    }

    fn level(id: &str, eps: &[(&str, &str)]) -> Update {
        Update {
            kind: Some(Kind::Endpoints(EndpointsUpdate {
                service_id: id.into(),
                change: Some(Change::Level(EndpointSet {
                    endpoints: eps
                        .iter()
                        .map(|(a, l)| v1::Endpoint {
                            address: (*a).into(),
                            location: (*l).into(),
                        })
                        .collect(),
                })),
            })),
        }
    }

    fn pod(op: i32, address: &str, location: &str, egress: &str) -> Update {
        Update {
            kind: Some(Kind::Pod(v1::PodUpdate {
                operation: op,
                address: address.into(),
                location: location.into(),
                outbound_identity: egress.into(),
                pod_key: String::new(),
                pod_uid: String::new(),
            })),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn all() -> Scope {
        Scope {
            services: true,
            egresses: true,
            endpoints: true,
            pods: true,
            location: None,
        }
    }

    fn seeded() -> DiffTracker {
        let mut t = DiffTracker::new();
        let view = [
            service("svc-a"),
            service("svc-b"),
            egress("eg-1"),
            egress("eg-2"),
            level("svc-a", &[("10.1.0.1", "10.0.0.1")]),
            level("svc-b", &[("10.1.0.2", "10.0.0.2")]),
            pod(1, "10.1.0.3", "10.0.0.1", "eg-1"),
            pod(1, "10.1.0.4", "10.0.0.2", "eg-1"),
        ];
        let out = replace_scope(&mut t, &all(), &view);
        assert_eq!((out.applied, out.removed, out.rejected.len()), (8, 0, 0));
        t
    }

    #[test]
    fn what_the_view_no_longer_names_is_removed() {
        let mut t = seeded();
        let view = [
            service("SVC-A"),
            egress("eg-1"),
            level("svc-a", &[("10.1.0.1", "10.0.0.1")]),
            pod(1, "10.1.0.3", "10.0.0.1", "eg-1"),
        ];
        let out = replace_scope(&mut t, &all(), &view);
        assert!(out.rejected.is_empty(), "{:?}", out.rejected);
        // svc-b (with its endpoint), eg-2 and the pod at 10.1.0.4.
        assert_eq!(out.removed, 3);
        assert_eq!(t.desired_inbound_identities(), vec!["svc-a"]);
        assert_eq!(t.declared_egresses(), vec!["eg-1"]);
        assert_eq!(t.services_with_endpoints(), vec!["svc-a"]);
        assert_eq!(t.pods(None), vec![(ip("10.1.0.3"), ip("10.0.0.1"))]);
    }

    #[test]
    fn a_node_view_replaces_only_its_location() {
        let mut t = seeded();
        let scope = Scope {
            pods: true,
            location: Some(ip("10.0.0.2")),
            ..Scope::default()
        };
        let view = [
            pod(1, "10.1.0.9", "10.0.0.2", "eg-2"),
            pod(1, "10.1.0.8", "10.0.0.1", "eg-2"),
            service("svc-z"),
        ];
        let out = replace_scope(&mut t, &scope, &view);
        assert_eq!(out.applied, 1);
        assert_eq!(out.removed, 1);
        assert_eq!(out.rejected.len(), 2);
        assert_eq!(out.rejected[0].field, "updates[1].pod.location");
        assert_eq!(out.rejected[1].field, "updates[2].service");
        assert_eq!(
            t.pods(None),
            vec![
                (ip("10.1.0.3"), ip("10.0.0.1")),
                (ip("10.1.0.9"), ip("10.0.0.2"))
            ]
        );
        assert_eq!(t.desired_inbound_identities(), vec!["svc-a", "svc-b"]);
    }

    #[test]
    fn views_must_describe_what_exists() {
        let mut t = seeded();
        let edge = Update {
            kind: Some(Kind::Endpoints(EndpointsUpdate {
                service_id: "svc-b".into(),
                change: Some(Change::Edge(v1::EndpointEdge::default())),
            })),
        };
        let view = [
            service("svc-a"),
            Update {
                kind: Some(Kind::Service(ServiceUpdate {
                    operation: 2,
                    id: "svc-b".into(),
                    ports: vec![],
                })),
            },
            level("svc-a", &[("10.1.0.1", "10.0.0.1")]),
            edge,
            // A malformed report keeps the service's endpoints as they are.
            level("svc-c", &[("bad", "10.0.0.1")]),
            Update { kind: None },
        ];
        let scope = Scope {
            services: true,
            endpoints: true,
            ..Scope::default()
        };
        let out = replace_scope(&mut t, &scope, &view);
        let fields: Vec<&str> = out.rejected.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            vec![
                "updates[1].service.operation",
                "updates[3].endpoints.edge",
                "updates[4].endpoints.level.endpoints[0].address",
                "updates[5].kind",
            ]
        );
        assert_eq!(out.removed, 0);
        assert_eq!(t.desired_inbound_identities(), vec!["svc-a", "svc-b"]);
        assert_eq!(t.services_with_endpoints(), vec!["svc-a", "svc-b"]);
    }
}
