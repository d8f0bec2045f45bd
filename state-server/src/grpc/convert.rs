//! Proto ↔ domain conversion at the gRPC edge: validation and application of one writer
//! [`Update`] to a [`DiffTracker`] (every refusal becomes a precise [`ItemError`]), and the
//! domain's diff and views as proto messages for the Worker and Admin services.

use clb_proto::v1::{
    self, AddressChange, AddressState, ItemError, LocationChange, LocationState, ServicePort,
    Update, endpoints_update::Change, update::Kind,
};

use crate::state::UnknownGateway;
use clb_core::difftracker::{
    self, DiffTracker, InvalidInput, LocationDiff, LocationView, Operation, Reason, ServiceKind,
};

/// A request-level refusal: `INVALID_ARGUMENT` naming the field, the value and the reason.
pub fn invalid_argument(field: &str, value: &str, reason: &str) -> tonic::Status {
    tonic::Status::invalid_argument(format!("{field} = {value:?}: {reason}"))
}

/// A gateway the server does not drive: `NOT_FOUND`.
pub fn unknown_gateway(err: &UnknownGateway) -> tonic::Status {
    tonic::Status::not_found(err.to_string())
}

/// Builds an [`ItemError`] for the update at `index`.
pub fn item_error(
    index: usize,
    field: impl Into<String>,
    value: impl Into<String>,
    reason: impl Into<String>,
) -> ItemError {
    ItemError {
        index: u32::try_from(index).unwrap_or(u32::MAX),
        field: field.into(),
        value: value.into(),
        reason: reason.into(),
    }
}

/// The field path of the update at `index`: `updates[3]`.
pub fn update_path(index: usize) -> String {
    format!("updates[{index}]")
}

/// The proto name of an update's kind (`service`, `egress`, `endpoints`, `pod`), if it has one.
pub fn kind_name(kind: &Kind) -> &'static str {
    match kind {
        Kind::Service(_) => "service",
        Kind::Egress(_) => "egress",
        Kind::Endpoints(_) => "endpoints",
        Kind::Pod(_) => "pod",
    }
}

/// Maps a domain refusal to an [`ItemError`]; `prefix` is the path of the proto message the
/// domain's field belongs to (e.g. `updates[3].pod`). Paths inside the reason are prefixed too.
pub fn domain_error(index: usize, prefix: &str, err: InvalidInput) -> ItemError {
    let reason = match &err.reason {
        Reason::Duplicate { first } => Reason::Duplicate {
            first: format!("{prefix}.{first}"),
        }
        .to_string(),
        other => other.to_string(),
    };
    let err = err.within(prefix);
    item_error(index, err.field, err.value, reason)
}

/// Converts a proto operation: `OPERATION_UNSPECIFIED` and unknown values are refused.
pub fn operation(index: usize, field: &str, raw: i32) -> Result<Operation, ItemError> {
    operation_lazy(index, || field.to_owned(), raw)
}

/// [`operation`] with the field path built only for an error (this runs for every update).
pub fn operation_lazy(
    index: usize,
    field: impl FnOnce() -> String,
    raw: i32,
) -> Result<Operation, ItemError> {
    match v1::Operation::try_from(raw) {
        Ok(v1::Operation::Add) => Ok(Operation::Add),
        Ok(v1::Operation::Remove) => Ok(Operation::Remove),
        Ok(v1::Operation::Unspecified) => Err(item_error(
            index,
            field(),
            v1::Operation::Unspecified.as_str_name(),
            "unknown operation: must be OPERATION_ADD or OPERATION_REMOVE",
        )),
        Err(_) => Err(item_error(
            index,
            field(),
            raw.to_string(),
            "unknown operation: must be OPERATION_ADD or OPERATION_REMOVE",
        )),
    }
}

/// Checks the ports of an inbound service: 1 to 65535, a known protocol, no port listed twice.
pub fn validate_ports(index: usize, prefix: &str, ports: &[ServicePort]) -> Result<(), ItemError> {
    for (j, p) in ports.iter().enumerate() {
        if p.port == 0 || p.port > 65_535 {
            return Err(item_error(
                index,
                format!("{prefix}.ports[{j}].port"),
                p.port.to_string(),
                "is not a port number: must be 1 to 65535",
            ));
        }
        match v1::Protocol::try_from(p.protocol) {
            Ok(v1::Protocol::Tcp | v1::Protocol::Udp) => {}
            Ok(v1::Protocol::Unspecified) | Err(_) => {
                let value = match v1::Protocol::try_from(p.protocol) {
                    Ok(known) => known.as_str_name().to_owned(),
                    Err(_) => p.protocol.to_string(),
                };
                return Err(item_error(
                    index,
                    format!("{prefix}.ports[{j}].protocol"),
                    value,
                    "unknown protocol: must be PROTOCOL_TCP or PROTOCOL_UDP",
                ));
            }
        }
        if let Some(first) = ports[..j]
            .iter()
            .position(|q| q.port == p.port && q.protocol == p.protocol)
        {
            return Err(item_error(
                index,
                format!("{prefix}.ports[{j}]"),
                format!("{}/{}", p.port, protocol_name(p.protocol)),
                format!("appears twice (first at {prefix}.ports[{first}])"),
            ));
        }
    }
    Ok(())
}

fn protocol_name(raw: i32) -> &'static str {
    match v1::Protocol::try_from(raw) {
        Ok(v1::Protocol::Tcp) => "TCP",
        Ok(v1::Protocol::Udp) => "UDP",
        _ => "?",
    }
}

fn endpoints(list: &[v1::Endpoint]) -> Vec<difftracker::Endpoint<'_>> {
    list.iter()
        .map(|e| difftracker::Endpoint {
            address: &e.address,
            location: &e.location,
        })
        .collect()
}

/// Validates one update and applies it to `tracker`; `index` is its position in the batch (or
/// across all chunks of a resync). On error nothing of the update was applied.
pub fn apply_update(
    tracker: &mut DiffTracker,
    update: &Update,
    index: usize,
) -> Result<(), ItemError> {
    let base = || update_path(index);
    let Some(kind) = &update.kind else {
        return Err(item_error(
            index,
            format!("{}.kind", base()),
            "",
            "no kind set: expected one of service, egress, endpoints, pod",
        ));
    };
    // Field paths are only formatted for an error: this runs for every update of every batch.
    let prefix = || format!("{}.{}", base(), kind_name(kind));
    match kind {
        Kind::Service(s) => {
            let op = operation_lazy(index, || format!("{}.operation", prefix()), s.operation)?;
            if op == Operation::Add {
                validate_ports(index, &prefix(), &s.ports)?;
            }
            tracker
                .update_service(op, &s.id)
                .map_err(|e| domain_error(index, &prefix(), e))
        }
        Kind::Egress(e) => {
            let op = operation_lazy(index, || format!("{}.operation", prefix()), e.operation)?;
            tracker
                .update_egress(op, &e.id)
                .map_err(|err| domain_error(index, &prefix(), err))
        }
        Kind::Endpoints(e) => match &e.change {
            None => Err(item_error(
                index,
                format!("{}.change", prefix()),
                "",
                "neither level nor edge is set",
            )),
            Some(Change::Level(set)) => tracker
                .set_endpoints(&e.service_id, &endpoints(&set.endpoints))
                .map_err(|err| endpoints_error(index, &prefix(), "level", err)),
            Some(Change::Edge(edge)) => tracker
                .update_endpoints(
                    &e.service_id,
                    &endpoints(&edge.old_endpoints),
                    &endpoints(&edge.new_endpoints),
                )
                .map_err(|err| endpoints_error(index, &prefix(), "edge", err)),
        },
        Kind::Pod(p) => {
            let op = operation_lazy(index, || format!("{}.operation", prefix()), p.operation)?;
            let pod = difftracker::PodUpdate {
                address: &p.address,
                location: &p.location,
                outbound_identity: &p.outbound_identity,
                uid: &p.pod_uid,
            };
            tracker
                .update_pod(op, &pod)
                .map_err(|e| domain_error(index, &prefix(), e))
        }
    }
}

/// `service_id` belongs to the `EndpointsUpdate`; the endpoint lists to its `level` or `edge`.
fn endpoints_error(index: usize, prefix: &str, change: &str, err: InvalidInput) -> ItemError {
    if err.field == "service_id" {
        domain_error(index, prefix, err)
    } else {
        domain_error(index, &format!("{prefix}.{change}"), err)
    }
}

/// The proto service kind.
pub fn service_kind(kind: ServiceKind) -> v1::ServiceKind {
    match kind {
        ServiceKind::Inbound => v1::ServiceKind::Inbound,
        ServiceKind::Outbound => v1::ServiceKind::Outbound,
    }
}

/// The proto service action.
pub fn service_action(action: difftracker::ServiceAction) -> v1::ServiceAction {
    match action {
        difftracker::ServiceAction::Create => v1::ServiceAction::Create,
        difftracker::ServiceAction::Delete => v1::ServiceAction::Delete,
    }
}

/// The proto address update action.
pub fn address_update_action(action: difftracker::AddressUpdateAction) -> v1::AddressUpdateAction {
    match action {
        difftracker::AddressUpdateAction::Full => v1::AddressUpdateAction::FullUpdate,
        difftracker::AddressUpdateAction::Partial => v1::AddressUpdateAction::PartialUpdate,
    }
}

/// A domain service change as proto, with the ports of an inbound creation (the domain does not
/// keep ports; the caller passes them, empty when unknown).
pub fn service_change(
    change: &difftracker::ServiceChange,
    ports: Vec<ServicePort>,
) -> v1::ServiceChange {
    let create_inbound =
        change.kind == ServiceKind::Inbound && change.action == difftracker::ServiceAction::Create;
    v1::ServiceChange {
        name: change.name.clone(),
        kind: service_kind(change.kind) as i32,
        action: service_action(change.action) as i32,
        ports: if create_inbound { ports } else { Vec::new() },
    }
}

/// A domain location diff as proto (canonical IP strings).
pub fn location_change(diff: &LocationDiff) -> LocationChange {
    LocationChange {
        location: diff.location.to_string(),
        action: address_update_action(diff.action) as i32,
        addresses: diff
            .addresses
            .iter()
            .map(|a| AddressChange {
                address: a.address.to_string(),
                services: a.services.clone(),
            })
            .collect(),
    }
}

/// Both sides of a location as proto. The location is desired when one of its addresses is.
pub fn location_state(gateway: &str, view: &LocationView) -> LocationState {
    LocationState {
        gateway: gateway.to_owned(),
        location: view.location.to_string(),
        desired: view.addresses.iter().any(|a| a.desired.is_some()),
        actual: view.in_nrp,
        addresses: view
            .addresses
            .iter()
            .map(|a| AddressState {
                address: a.address.to_string(),
                desired: a.desired.is_some(),
                actual: a.actual.is_some(),
                desired_services: a.desired.clone().unwrap_or_default(),
                actual_services: a.actual.clone().unwrap_or_default(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clb_proto::v1::{EgressUpdate, EndpointEdge, EndpointSet, EndpointsUpdate, ServiceUpdate};

    fn ep(address: &str, location: &str) -> v1::Endpoint {
        v1::Endpoint {
            address: address.into(),
            location: location.into(),
        }
    }

    fn level(service: &str, eps: Vec<v1::Endpoint>) -> Update {
        Update {
            kind: Some(Kind::Endpoints(EndpointsUpdate {
                service_id: service.into(),
                change: Some(Change::Level(EndpointSet { endpoints: eps })),
            })),
        }
    }

    fn pod(op: v1::Operation, address: &str, location: &str, egress: &str) -> Update {
        Update {
            kind: Some(Kind::Pod(v1::PodUpdate {
                operation: op as i32,
                address: address.into(),
                location: location.into(),
                outbound_identity: egress.into(),
                pod_key: "ns/p".into(),
                pod_uid: "uid-1".into(),
            })),
        }
    }

    fn service(op: i32, id: &str, ports: Vec<ServicePort>) -> Update {
        Update {
            kind: Some(Kind::Service(ServiceUpdate {
                operation: op,
                id: id.into(),
                ports,
            })),
        }
    }

    fn err(update: &Update, index: usize) -> ItemError {
        let mut t = DiffTracker::new();
        let e = apply_update(&mut t, update, index).unwrap_err();
        assert_eq!(t.revision(), 0, "a refused update changed the tracker");
        e
    }

    #[test]
    fn valid_updates_are_applied() {
        let mut t = DiffTracker::new();
        let tcp = ServicePort {
            port: 80,
            protocol: v1::Protocol::Tcp as i32,
        };
        apply_update(&mut t, &service(1, "Svc-A", vec![tcp]), 0).unwrap();
        apply_update(&mut t, &level("svc-a", vec![ep("10.1.0.1", "10.0.0.1")]), 1).unwrap();
        apply_update(
            &mut t,
            &pod(v1::Operation::Add, "10.1.0.2", "10.0.0.1", "eg"),
            2,
        )
        .unwrap();
        let egress = Update {
            kind: Some(Kind::Egress(EgressUpdate {
                operation: 1,
                id: "eg2".into(),
            })),
        };
        apply_update(&mut t, &egress, 3).unwrap();
        let c = t.counts();
        assert_eq!(
            (c.desired_services, c.desired_egresses, c.desired_addresses),
            (1, 2, 2)
        );
    }

    #[test]
    fn refusals_name_the_precise_field() {
        let e = err(&pod(v1::Operation::Add, "10.0.0.300", "10.0.0.1", ""), 3);
        assert_eq!((e.index, e.field.as_str()), (3, "updates[3].pod.address"));
        assert_eq!(e.value, "10.0.0.300");
        assert_eq!(e.reason, "is not an IPv4 or IPv6 address");

        let e = err(
            &level("svc", vec![ep("10.1.0.1", "10.0.0.1"), ep("10.1.0.2", "")]),
            2,
        );
        assert_eq!(e.field, "updates[2].endpoints.level.endpoints[1].location");
        assert_eq!(e.reason, "must not be empty");

        let e = err(
            &level(
                "svc",
                vec![ep("10.1.0.1", "10.0.0.1"), ep("10.1.0.1", "10.0.0.2")],
            ),
            0,
        );
        assert_eq!(e.field, "updates[0].endpoints.level.endpoints[1].address");
        assert_eq!(
            e.reason,
            "appears twice (first at updates[0].endpoints.level.endpoints[0].address)"
        );

        let e = err(&level("", vec![]), 1);
        assert_eq!(e.field, "updates[1].endpoints.service_id");

        let edge = Update {
            kind: Some(Kind::Endpoints(EndpointsUpdate {
                service_id: "svc".into(),
                change: Some(Change::Edge(EndpointEdge {
                    old_endpoints: vec![],
                    new_endpoints: vec![ep("fd00::1", "10.0.0.1")],
                })),
            })),
        };
        let e = err(&edge, 4);
        assert_eq!(
            e.field,
            "updates[4].endpoints.edge.new_endpoints[0].address"
        );
        assert!(
            e.reason.contains("IPv6 but its location 10.0.0.1 is IPv4"),
            "{}",
            e.reason
        );

        let e = err(&service(1, "", vec![]), 0);
        assert_eq!(
            (e.field.as_str(), e.reason.as_str()),
            ("updates[0].service.id", "must not be empty")
        );
    }

    #[test]
    fn missing_oneofs_and_bad_enums_are_refused() {
        let e = err(&Update { kind: None }, 5);
        assert_eq!(
            (e.index, e.field.as_str(), e.value.as_str()),
            (5, "updates[5].kind", "")
        );

        let no_change = Update {
            kind: Some(Kind::Endpoints(EndpointsUpdate {
                service_id: "svc".into(),
                change: None,
            })),
        };
        assert_eq!(err(&no_change, 0).field, "updates[0].endpoints.change");

        let e = err(&service(0, "svc", vec![]), 0);
        assert_eq!(e.field, "updates[0].service.operation");
        assert_eq!(e.value, "OPERATION_UNSPECIFIED");
        let e = err(&service(7, "svc", vec![]), 0);
        assert_eq!(e.value, "7");
        assert!(e.reason.starts_with("unknown operation"));

        let bad_port = ServicePort {
            port: 70_000,
            protocol: 1,
        };
        let e = err(&service(1, "svc", vec![bad_port]), 0);
        assert_eq!(e.field, "updates[0].service.ports[0].port");
        let no_proto = ServicePort {
            port: 80,
            protocol: 0,
        };
        let e = err(&service(1, "svc", vec![no_proto]), 0);
        assert_eq!(e.field, "updates[0].service.ports[0].protocol");
        assert_eq!(e.value, "PROTOCOL_UNSPECIFIED");
        let tcp = ServicePort {
            port: 80,
            protocol: 1,
        };
        let e = err(&service(1, "svc", vec![tcp, tcp]), 0);
        assert_eq!(e.field, "updates[0].service.ports[1]");
        // Ports are ignored on removal.
        let mut t = DiffTracker::new();
        apply_update(&mut t, &service(2, "svc", vec![no_proto]), 0).unwrap();
    }

    #[test]
    fn diffs_and_views_convert_to_proto() {
        let mut t = DiffTracker::new();
        apply_update(&mut t, &service(1, "svc-a", vec![]), 0).unwrap();
        apply_update(&mut t, &level("svc-a", vec![ep("10.1.0.1", "10.0.0.1")]), 1).unwrap();
        let diff = t.pending_diff();
        let tcp = ServicePort {
            port: 443,
            protocol: 1,
        };
        let s = service_change(&diff.services[0], vec![tcp]);
        assert_eq!(s.name, "svc-a");
        assert_eq!(s.kind, v1::ServiceKind::Inbound as i32);
        assert_eq!(s.action, v1::ServiceAction::Create as i32);
        assert_eq!(s.ports, vec![tcp]);
        t.record_service_applied(&diff.services[0]).unwrap();
        let loc = t.pending_diff().locations[0].clone();
        let l = location_change(&loc);
        assert_eq!(l.location, "10.0.0.1");
        assert_eq!(l.action, v1::AddressUpdateAction::FullUpdate as i32);
        assert_eq!(l.addresses[0].address, "10.1.0.1");
        assert_eq!(l.addresses[0].services, vec!["svc-a"]);

        let view = t.location_view("10.0.0.1".parse().unwrap()).unwrap();
        let state = location_state("gw", &view);
        assert!(state.desired && !state.actual);
        assert_eq!(state.addresses[0].desired_services, vec!["svc-a"]);
        assert!(!state.addresses[0].actual);
        assert_eq!(
            address_update_action(difftracker::AddressUpdateAction::Partial),
            v1::AddressUpdateAction::PartialUpdate
        );
        assert_eq!(
            service_kind(ServiceKind::Outbound),
            v1::ServiceKind::Outbound
        );
        assert_eq!(
            service_action(difftracker::ServiceAction::Delete),
            v1::ServiceAction::Delete
        );
    }
}
