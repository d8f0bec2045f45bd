//! Scope replacement for `Writer.Resync` on the wire: a writer's complete view of its scope
//! replaces what the desired state holds in that scope. The Writer service buffers the whole view
//! and calls [`clb_core::gateway::GatewayCore::replace_scope`] under one lock once the stream has
//! ended cleanly; its outcome goes back as a [`ResyncOutcome`].

#[cfg(test)]
use clb_core::difftracker::DiffTracker;
use clb_core::gateway::update;
use clb_proto::v1::ItemError;
#[cfg(test)]
use clb_proto::v1::Update;

use super::convert::item_error_of;
#[cfg(test)]
use super::convert::update_from_proto;

pub use super::convert::HeaderError;
pub use clb_core::gateway::Scope;

/// The outcome of a scope replacement, as the wire reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResyncOutcome {
    /// Updates of the view that were applied.
    pub applied: u32,
    /// Objects of the scope removed because the view did not contain them.
    pub removed: u32,
    /// Updates of the view that were refused.
    pub rejected: Vec<ItemError>,
}

impl From<update::ResyncOutcome> for ResyncOutcome {
    fn from(o: update::ResyncOutcome) -> Self {
        Self {
            applied: o.applied,
            removed: o.removed,
            rejected: o.rejected.into_iter().map(item_error_of).collect(),
        }
    }
}

/// Replaces the scope's desired state of `tracker` with a view from the wire (the rules are
/// `clb_core::gateway::update`'s; the state server goes through
/// `clb_core::gateway::GatewayCore::replace_scope`, which also keeps the port book and the
/// writer's record). Indices count across the whole view. Tests only: the scope rules seen from
/// the wire, without a gateway.
#[cfg(test)]
pub(crate) fn replace_scope(
    tracker: &mut DiffTracker,
    scope: &Scope,
    view: &[Update],
) -> ResyncOutcome {
    let items: Vec<_> = view
        .iter()
        .enumerate()
        .map(|(i, u)| update_from_proto(i, u))
        .collect();
    update::replace_scope(tracker, scope, &items).0.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clb_proto::v1::{
        self, EgressUpdate, EndpointSet, EndpointsUpdate, ServiceUpdate, endpoints_update::Change,
        update::Kind,
    };
    use std::net::IpAddr;

    fn service(id: &str) -> Update {
        Update {
            kind: Some(Kind::Service(ServiceUpdate {
                operation: 1,
                service_id: id.into(),
                ports: vec![],
                ..Default::default()
            })),
        }
    }

    fn egress(id: &str) -> Update {
        Update {
            kind: Some(Kind::Egress(EgressUpdate {
                operation: 1,
                egress_id: id.into(),
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
                egress_id: egress.into(),
                pod_key: String::new(),
                pod_uid: String::new(),
                ..Default::default()
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
                    service_id: "svc-b".into(),
                    ports: vec![],
                    ..Default::default()
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
