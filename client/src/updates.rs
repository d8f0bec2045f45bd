//! Builders of `clb.v1.Update` messages, so callers do not assemble the proto `oneof`s by hand.

use clb_proto::v1::update::Kind;
use clb_proto::v1::{
    EgressUpdate, Endpoint, EndpointEdge, EndpointSet, EndpointsUpdate, IpFamily,
    LoadBalancerSettings, Operation, PodUpdate, Protocol, ServicePort, ServiceUpdate, Update,
    endpoints_update::Change,
};

/// A `(port, protocol)` pair of an inbound service; the pods listen on the same port (target port
/// 0). See [`port_to`] for another pod port.
pub fn port(port: u16, protocol: Protocol) -> ServicePort {
    ServicePort {
        port: u32::from(port),
        protocol: protocol as i32,
        target_port: 0,
    }
}

/// A port of an inbound service whose pods listen on `target_port`: the load-balancing rule's
/// frontend port is `port`, its backend port `target_port`.
pub fn port_to(port: u16, protocol: Protocol, target_port: u16) -> ServicePort {
    ServicePort {
        port: u32::from(port),
        protocol: protocol as i32,
        target_port: u32::from(target_port),
    }
}

/// Declares the inbound service `service_id` (a Service UID) with its load balancer ports, of no stated IP
/// family (an IPv4 frontend, endpoints of either family: the behaviour before families existed).
pub fn service_add(service_id: &str, ports: &[ServicePort]) -> Update {
    service(
        Operation::Add,
        service_id,
        ports.to_vec(),
        IpFamily::Unspecified,
    )
}

/// Declares the inbound service `service_id` of IP family `family` with its load balancer ports: its
/// frontend is a public IP of that version and its endpoints must be of that family.
pub fn service_add_family(service_id: &str, ports: &[ServicePort], family: IpFamily) -> Update {
    service(Operation::Add, service_id, ports.to_vec(), family)
}

/// Declares the inbound service `service_id` of IP family `family` (`Unspecified`: none stated) with its
/// load balancer ports and settings (default settings are not sent).
pub fn service_add_with(
    service_id: &str,
    ports: &[ServicePort],
    family: IpFamily,
    settings: &LoadBalancerSettings,
) -> Update {
    let mut update = service(Operation::Add, service_id, ports.to_vec(), family);
    if let Some(Kind::Service(s)) = &mut update.kind
        && *settings != LoadBalancerSettings::default()
    {
        s.settings = Some(settings.clone());
    }
    update
}

/// Withdraws the inbound service `service_id`.
pub fn service_remove(service_id: &str) -> Update {
    service(
        Operation::Remove,
        service_id,
        Vec::new(),
        IpFamily::Unspecified,
    )
}

fn service(op: Operation, service_id: &str, ports: Vec<ServicePort>, family: IpFamily) -> Update {
    Update {
        kind: Some(Kind::Service(ServiceUpdate {
            operation: op as i32,
            service_id: service_id.to_owned(),
            ports,
            ip_family: family as i32,
            settings: None,
        })),
    }
}

/// Declares the egress (outbound identity) `egress_id`.
pub fn egress_add(egress_id: &str) -> Update {
    egress(Operation::Add, egress_id)
}

/// Withdraws the egress `egress_id`.
pub fn egress_remove(egress_id: &str) -> Update {
    egress(Operation::Remove, egress_id)
}

fn egress(op: Operation, egress_id: &str) -> Update {
    Update {
        kind: Some(Kind::Egress(EgressUpdate {
            operation: op as i32,
            egress_id: egress_id.to_owned(),
        })),
    }
}

/// One endpoint: a pod `address` at its node IP `location`.
pub fn endpoint(address: &str, location: &str) -> Endpoint {
    Endpoint {
        address: address.to_owned(),
        location: location.to_owned(),
    }
}

/// The complete set of ready endpoints of inbound service `service_id` (level-triggered).
pub fn endpoints_level(service_id: &str, endpoints: Vec<Endpoint>) -> Update {
    Update {
        kind: Some(Kind::Endpoints(EndpointsUpdate {
            service_id: service_id.to_owned(),
            change: Some(Change::Level(EndpointSet { endpoints })),
        })),
    }
}

/// A change of the endpoints of inbound service `service_id` from `old` to `new` (edge-triggered).
pub fn endpoints_edge(service_id: &str, old: Vec<Endpoint>, new: Vec<Endpoint>) -> Update {
    Update {
        kind: Some(Kind::Endpoints(EndpointsUpdate {
            service_id: service_id.to_owned(),
            change: Some(Change::Edge(EndpointEdge {
                old_endpoints: old,
                new_endpoints: new,
            })),
        })),
    }
}

/// A pod at `address` on `location`, using egress `egress_id` (empty: none); `key` is
/// `namespace/name`, `uid` the pod UID (may be empty).
pub fn pod_add(address: &str, location: &str, egress_id: &str, key: &str, uid: &str) -> Update {
    pod(Operation::Add, address, location, egress_id, key, uid)
}

/// [`pod_add`] of a pod whose egress brings the NAT gateway `nat_gateway` (the pod annotation
/// `clb.azure.com/nat-gateway`; empty: clb owns the egress's NAT gateway).
pub fn pod_add_bringing(
    address: &str,
    location: &str,
    egress_id: &str,
    key: &str,
    uid: &str,
    nat_gateway: &str,
) -> Update {
    let mut update = pod(Operation::Add, address, location, egress_id, key, uid);
    if let Some(Kind::Pod(p)) = &mut update.kind {
        p.nat_gateway = nat_gateway.to_owned();
    }
    update
}

/// The pod at `address` on `location` is gone.
pub fn pod_remove(address: &str, location: &str, key: &str, uid: &str) -> Update {
    pod(Operation::Remove, address, location, "", key, uid)
}

fn pod(
    op: Operation,
    address: &str,
    location: &str,
    egress_id: &str,
    key: &str,
    uid: &str,
) -> Update {
    Update {
        kind: Some(Kind::Pod(PodUpdate {
            operation: op as i32,
            address: address.to_owned(),
            location: location.to_owned(),
            egress_id: egress_id.to_owned(),
            pod_key: key.to_owned(),
            pod_uid: uid.to_owned(),
            ..Default::default()
        })),
    }
}
