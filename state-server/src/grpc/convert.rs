//! All proto ↔ domain conversion of the gRPC edge, in one place:
//!
//! * writer input: one [`Update`] as the gateway's item (`update_from_proto`: what cannot be mapped
//!   is refused with the object it names) and every fault as a precise [`ItemError`]
//!   (`item_error_of`); the scope of a resync header;
//! * worker traffic: a leased unit ([`clb_core::gateway::Leased`]) as the [`v1::WorkUnit`] sent,
//!   and a worker's [`v1::Report`] as the dispatcher's [`Report`] (with the frontends and rules it
//!   carries);
//! * reads: the domain's diff and views as the proto messages of the Admin service.
//!
//! Errors never echo a client's value in full: status messages quote it with
//! [`quote`] and item errors carry an [`excerpt`] of it (at most
//! [`difftracker::MAX_QUOTED_CHARS`] characters, the cut marked).

use std::borrow::Cow;
use std::net::IpAddr;
use std::time::Duration;

use clb_proto::v1::{
    self, AddressChange, AddressState, ItemError, LocationChange, LocationState, ResyncScope,
    ServicePort, Update, endpoints_update::Change, update::Kind,
};
use tracing::warn;

use crate::gate::{GateView, NodeDecl, Topology};
use crate::state::{Gateway, UnknownGateway, WorkerInfo};
use clb_core::difftracker::identity::normalize_identity;
use clb_core::difftracker::ip::parse_ip;
use clb_core::difftracker::{
    self, ActualSnapshot, InvalidInput, IpFamily, LocationDiff, Operation, Reason, ServiceKind,
    ServiceView, excerpt, quote,
};
use clb_core::dispatch::{self, Outcome, Report, UnitWork};
use clb_core::gateway::Scope;
use clb_core::gateway::condition::{Condition, ConditionReason};
use clb_core::gateway::update::{
    EndpointsChange, Fault, Item, ItemFault, Named, Refusal, Update as GatewayUpdate,
};
use clb_core::gateway::{
    LbSettings, LbSpec, Leased, LocationStatus, Port, Protocol, ServiceStatus, StatusView,
};

/// A problem with the resync header as a whole (see [`resync_scope`]): the call fails
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

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} = {}: {}",
            self.field,
            quote(&self.value),
            self.reason
        )
    }
}

/// A request-level refusal: `INVALID_ARGUMENT` naming the field, the value (quoted, cut when
/// long) and the reason.
pub fn invalid_argument(field: &str, value: &str, reason: &str) -> tonic::Status {
    tonic::Status::invalid_argument(format!("{field} = {}: {reason}", quote(value)))
}

/// A gateway the server does not drive: `NOT_FOUND`.
pub fn unknown_gateway(err: &UnknownGateway) -> tonic::Status {
    tonic::Status::not_found(err.to_string())
}

/// Builds an [`ItemError`] for the update at `index`; the value is echoed back as an
/// [`excerpt`] (at most [`difftracker::MAX_QUOTED_CHARS`] characters of it, the cut marked).
pub fn item_error(
    index: usize,
    field: impl Into<String>,
    value: impl Into<String>,
    reason: impl Into<String>,
) -> ItemError {
    let value = value.into();
    let value = match excerpt(&value) {
        Cow::Borrowed(_) => value,
        Cow::Owned(cut) => cut,
    };
    ItemError {
        index: u32::try_from(index).unwrap_or(u32::MAX),
        field: field.into(),
        value,
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

/// Converts a proto operation of the update of kind `kind`: `OPERATION_UNSPECIFIED` and unknown
/// values are refused (the fault's field is `<kind>.operation`).
fn operation(kind: &str, raw: i32) -> Result<Operation, Fault> {
    let refuse = |value: String| Fault::Field {
        field: format!("{kind}.operation"),
        value,
        reason: "unknown operation: must be OPERATION_ADD or OPERATION_REMOVE".into(),
    };
    match v1::Operation::try_from(raw) {
        Ok(v1::Operation::Add) => Ok(Operation::Add),
        Ok(v1::Operation::Remove) => Ok(Operation::Remove),
        Ok(v1::Operation::Unspecified) => {
            Err(refuse(v1::Operation::Unspecified.as_str_name().to_owned()))
        }
        Err(_) => Err(refuse(raw.to_string())),
    }
}

/// Converts the proto IP family of the update of kind `kind`: unspecified is `None` (no family
/// stated), an unknown value is refused (the fault's field is `<kind>.ip_family`).
fn ip_family(kind: &str, raw: i32) -> Result<Option<IpFamily>, Fault> {
    match v1::IpFamily::try_from(raw) {
        Ok(v1::IpFamily::Unspecified) => Ok(None),
        Ok(v1::IpFamily::Ipv4) => Ok(Some(IpFamily::V4)),
        Ok(v1::IpFamily::Ipv6) => Ok(Some(IpFamily::V6)),
        Err(_) => Err(Fault::Field {
            field: format!("{kind}.ip_family"),
            value: raw.to_string(),
            reason: "unknown IP family: must be IP_FAMILY_IPV4 or IP_FAMILY_IPV6 (or unset)".into(),
        }),
    }
}

/// The proto IP family of an inbound service's creation (`None`: unspecified, an IPv4 frontend).
pub fn ip_family_to_proto(family: Option<IpFamily>) -> v1::IpFamily {
    match family {
        None => v1::IpFamily::Unspecified,
        Some(IpFamily::V4) => v1::IpFamily::Ipv4,
        Some(IpFamily::V6) => v1::IpFamily::Ipv6,
    }
}

/// Checks the ports of an inbound service: 1 to 65535, a target port of 0 (the same as the port) to
/// 65535, a known protocol, no port listed twice. `path` is the full path of the service message
/// (`updates[3].service`), named in the reason of a repeated port; faults' fields are relative.
fn validate_ports(path: &str, ports: &[ServicePort]) -> Result<(), Fault> {
    let fault = |field: String, value: String, reason: String| Fault::Field {
        field,
        value,
        reason,
    };
    for (j, p) in ports.iter().enumerate() {
        if p.port == 0 || p.port > 65_535 {
            return Err(fault(
                format!("service.ports[{j}].port"),
                p.port.to_string(),
                "is not a port number: must be 1 to 65535".into(),
            ));
        }
        if p.target_port > 65_535 {
            return Err(fault(
                format!("service.ports[{j}].target_port"),
                p.target_port.to_string(),
                "is not a port number: must be 1 to 65535, or 0 for the same as port".into(),
            ));
        }
        match v1::Protocol::try_from(p.protocol) {
            Ok(v1::Protocol::Tcp | v1::Protocol::Udp) => {}
            Ok(v1::Protocol::Unspecified) | Err(_) => {
                let value = match v1::Protocol::try_from(p.protocol) {
                    Ok(known) => known.as_str_name().to_owned(),
                    Err(_) => p.protocol.to_string(),
                };
                return Err(fault(
                    format!("service.ports[{j}].protocol"),
                    value,
                    "unknown protocol: must be PROTOCOL_TCP or PROTOCOL_UDP".into(),
                ));
            }
        }
        if let Some(first) = ports[..j]
            .iter()
            .position(|q| q.port == p.port && q.protocol == p.protocol)
        {
            return Err(fault(
                format!("service.ports[{j}]"),
                format!("{}/{}", p.port, protocol_name(p.protocol)),
                format!("appears twice (first at {path}.ports[{first}])"),
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

/// One update from the wire as the gateway takes it (borrowing its strings), or, when it cannot be
/// mapped (no kind, an unknown operation, ports that are not ports, endpoints without a change),
/// the refusal with the object it names. `index` is its position in the batch (or the view).
pub fn update_from_proto(index: usize, update: &Update) -> Item<'_> {
    let Some(kind) = &update.kind else {
        return Err(Refusal {
            named: Named::Nothing,
            fault: Fault::Field {
                field: "kind".into(),
                value: String::new(),
                reason: "no kind set: expected one of service, egress, endpoints, pod".into(),
            },
        });
    };
    match kind {
        Kind::Service(s) => {
            let refuse = |fault| Refusal {
                named: Named::Service(&s.service_id),
                fault,
            };
            let op = operation("service", s.operation).map_err(refuse)?;
            let ports = if op == Operation::Add {
                validate_ports(&format!("{}.service", update_path(index)), &s.ports)
                    .map_err(refuse)?;
                s.ports.iter().map(port_from_proto).collect()
            } else {
                Vec::new()
            };
            let family = if op == Operation::Add {
                ip_family("service", s.ip_family).map_err(refuse)?
            } else {
                None
            };
            let settings = if op == Operation::Add {
                settings_from_proto(s.settings.as_ref(), family).map_err(refuse)?
            } else {
                LbSettings::default()
            };
            Ok(GatewayUpdate::Service {
                operation: op,
                id: &s.service_id,
                ports,
                family,
                settings,
            })
        }
        Kind::Egress(e) => {
            let operation = operation("egress", e.operation).map_err(|fault| Refusal {
                named: Named::Egress(&e.egress_id),
                fault,
            })?;
            Ok(GatewayUpdate::Egress {
                operation,
                id: &e.egress_id,
            })
        }
        Kind::Endpoints(e) => {
            let change = match &e.change {
                None => {
                    return Err(Refusal {
                        named: Named::Endpoints(&e.service_id),
                        fault: Fault::Field {
                            field: "endpoints.change".into(),
                            value: String::new(),
                            reason: "neither level nor edge is set".into(),
                        },
                    });
                }
                Some(Change::Level(set)) => EndpointsChange::Level(endpoints(&set.endpoints)),
                Some(Change::Edge(edge)) => EndpointsChange::Edge {
                    old: endpoints(&edge.old_endpoints),
                    new: endpoints(&edge.new_endpoints),
                },
            };
            Ok(GatewayUpdate::Endpoints {
                service: &e.service_id,
                change,
            })
        }
        Kind::Pod(p) => {
            let operation = operation("pod", p.operation).map_err(|fault| Refusal {
                named: Named::Pod {
                    address: &p.address,
                    location: &p.location,
                },
                fault,
            })?;
            Ok(GatewayUpdate::Pod {
                operation,
                pod: difftracker::PodUpdate {
                    address: &p.address,
                    location: &p.location,
                    outbound_identity: &p.egress_id,
                    uid: &p.pod_uid,
                    nat_gateway: &p.nat_gateway,
                },
            })
        }
    }
}

/// A refused item as the wire's [`ItemError`]: the item's path (`updates[3]`) in front of the
/// fault's field.
pub fn item_error_of(fault: ItemFault) -> ItemError {
    let index = fault.index;
    let base = update_path(index);
    match fault.fault {
        Fault::Domain { within, error } => domain_error(index, &format!("{base}.{within}"), *error),
        Fault::Field {
            field,
            value,
            reason,
        } => item_error(index, format!("{base}.{field}"), value, reason),
    }
}

/// Validates one update and applies it to `tracker` (no rights, no port book); `index` is its
/// position in the batch. On error nothing of the update was applied. Tests only: the state
/// server applies through `clb_core::gateway::GatewayCore::apply`.
#[cfg(test)]
pub(crate) fn apply_update(
    tracker: &mut difftracker::DiffTracker,
    update: &Update,
    index: usize,
) -> Result<(), ItemError> {
    let applied = match update_from_proto(index, update) {
        Ok(u) => clb_core::gateway::update::apply_one(tracker, &u),
        Err(refusal) => Err(refusal.fault),
    };
    applied.map_err(|fault| item_error_of(ItemFault { index, fault }))
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

/// A domain service change as proto, with the load balancer (ports and settings) of an inbound
/// creation (the DiffTracker does not keep them; the caller passes them, empty when unknown).
pub fn service_change(
    change: &difftracker::ServiceChange,
    spec: &LbSpec,
    family: Option<IpFamily>,
) -> v1::ServiceChange {
    let create_inbound =
        change.kind == ServiceKind::Inbound && change.action == difftracker::ServiceAction::Create;
    v1::ServiceChange {
        service_id: change.name.clone(),
        kind: service_kind(change.kind) as i32,
        action: service_action(change.action) as i32,
        ports: if create_inbound {
            spec.ports.iter().map(port_to_proto).collect()
        } else {
            Vec::new()
        },
        settings: spec
            .settings
            .as_ref()
            .filter(|_| create_inbound)
            .map(settings_to_proto),
        ip_family: if create_inbound {
            ip_family_to_proto(family) as i32
        } else {
            0
        },
        nat_gateway: match change.kind {
            ServiceKind::Outbound => change.nat_gateway.clone().unwrap_or_default(),
            ServiceKind::Inbound => String::new(),
        },
        egress_families: match change.kind {
            ServiceKind::Outbound if change.ipv6 => {
                vec![v1::IpFamily::Ipv4 as i32, v1::IpFamily::Ipv6 as i32]
            }
            ServiceKind::Outbound => vec![v1::IpFamily::Ipv4 as i32],
            ServiceKind::Inbound => Vec::new(),
        },
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
                service_ids: a.services.clone(),
            })
            .collect(),
    }
}

/// Both sides of a location (the core's [`LocationStatus`]) as proto. The location is desired when
/// one of its addresses is; `refused` gives the hold of an address NRP refused on its own.
pub fn location_state(gateway: &str, status: &LocationStatus) -> LocationState {
    let view = &status.view;
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
                desired_service_ids: a.desired.clone().unwrap_or_default(),
                actual_service_ids: a.actual.clone().unwrap_or_default(),
                refused: status
                    .refused
                    .get(&a.address)
                    .cloned()
                    .map(status::refused_item),
            })
            .collect(),
    }
}

/// A unit leased to a worker as the proto sent to it: a creation of an inbound service carries the
/// service's desired ports ([`clb_core::gateway::GatewayCore::lease`] remembers them as in flight); `trace_context`
/// is left for the session to fill.
pub fn unit_to_proto(gateway: &str, leased: Leased, families: &[Option<IpFamily>]) -> v1::WorkUnit {
    let Leased { unit, specs } = leased;
    let none = LbSpec::default();
    let work = match &unit.work {
        UnitWork::Observe => v1::work_unit::Work::Observe(v1::ObserveWork {}),
        UnitWork::Services(changes) => v1::work_unit::Work::Services(v1::ServiceWork {
            changes: changes
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let spec = specs.get(i).unwrap_or(&none);
                    let family = families.get(i).copied().flatten();
                    service_change(c, spec, family)
                })
                .collect(),
            side_by_side: unit.side_by_side,
        }),
        UnitWork::Locations(diffs) => v1::work_unit::Work::Locations(v1::LocationWork {
            locations: diffs.iter().map(location_change).collect(),
        }),
    };
    v1::WorkUnit {
        work_id: unit.work_id,
        gateway: gateway.to_owned(),
        revision: unit.revision,
        lease_deadline_unix_ms: unit.lease_deadline_unix_ms,
        lease_duration_ms: unit.lease.as_millis() as u64,
        attempt: unit.attempt,
        work: Some(work),
        trace_context: Default::default(),
    }
}

/// A port from the wire; a protocol this server does not know is kept as its wire value (no rule
/// can be made of it).
pub fn port_from_proto(p: &ServicePort) -> Port {
    let protocol = match v1::Protocol::try_from(p.protocol) {
        Ok(v1::Protocol::Tcp) => Protocol::Tcp,
        Ok(v1::Protocol::Udp) => Protocol::Udp,
        _ => Protocol::Other(p.protocol),
    };
    Port {
        protocol,
        port: p.port,
        target_port: p.target_port,
    }
}

/// A port as the wire has it.
pub fn port_to_proto(p: &Port) -> ServicePort {
    let protocol = match p.protocol {
        Protocol::Tcp => v1::Protocol::Tcp as i32,
        Protocol::Udp => v1::Protocol::Udp as i32,
        Protocol::Other(raw) => raw,
    };
    ServicePort {
        port: p.port,
        protocol,
        target_port: p.target_port,
    }
}

/// The scope of a resync header: at least one kind, and a location only for pods.
pub fn resync_scope(scope: Option<&ResyncScope>) -> Result<Scope, HeaderError> {
    let empty = || HeaderError {
        field: "header.scope".into(),
        value: String::new(),
        reason: "is empty: set at least one of services, egresses, endpoints, pods".into(),
    };
    let s = scope.ok_or_else(empty)?;
    if !(s.services || s.egresses || s.endpoints || s.pods) {
        return Err(empty());
    }
    let location = if s.location.is_empty() {
        None
    } else {
        if !s.pods {
            return Err(HeaderError {
                field: "header.scope.location".into(),
                value: s.location.clone(),
                reason: "restricts pods, but the scope does not cover pods".into(),
            });
        }
        let ip = parse_ip("header.scope.location", &s.location).map_err(|e| HeaderError {
            field: e.field,
            value: e.value,
            reason: e.reason.to_string(),
        })?;
        Some(ip)
    };
    Ok(Scope {
        services: s.services,
        egresses: s.egresses,
        endpoints: s.endpoints,
        pods: s.pods,
        location,
    })
}

/// The topology of a resync header (`header.topology`), checked: only with a scope that covers
/// services, every node named once, with at least one valid location and a pods writer.
pub fn resync_topology(
    topology: Option<&v1::ClusterTopology>,
    scope: &Scope,
) -> Result<Option<Topology>, HeaderError> {
    let Some(t) = topology else {
        return Ok(None);
    };
    let err = |field: String, value: &str, reason: &str| HeaderError {
        field,
        value: value.to_owned(),
        reason: reason.to_owned(),
    };
    if !scope.services {
        return Err(err(
            "header.topology".into(),
            "",
            "is declared by the cluster view only: the scope must cover services",
        ));
    }
    let mut names = std::collections::HashSet::new();
    let mut nodes = Vec::with_capacity(t.nodes.len());
    for (i, n) in t.nodes.iter().enumerate() {
        let field = |f: &str| format!("header.topology.nodes[{i}].{f}");
        if n.name.is_empty() {
            return Err(err(field("name"), "", "must not be empty"));
        }
        if !names.insert(n.name.as_str()) {
            return Err(err(field("name"), &n.name, "names a node listed before"));
        }
        if n.pods_writer.is_empty() {
            return Err(err(field("pods_writer"), "", "must not be empty"));
        }
        if n.locations.is_empty() {
            return Err(err(field("locations"), "", "must list at least one IP"));
        }
        let locations = n
            .locations
            .iter()
            .enumerate()
            .map(|(j, l)| {
                parse_ip(&field(&format!("locations[{j}]")), l).map_err(|e| HeaderError {
                    field: e.field,
                    value: e.value,
                    reason: e.reason.to_string(),
                })
            })
            .collect::<Result<Vec<IpAddr>, _>>()?;
        nodes.push(NodeDecl {
            name: n.name.clone(),
            locations,
            pods_writer: n.pods_writer.clone(),
        });
    }
    Ok(Some(Topology { nodes }))
}

mod report;
mod settings;
mod status;

pub use report::{frontends_from_proto, report_from_proto, rules_from_proto, snapshot_from_proto};
pub use settings::{settings_from_proto, settings_to_proto};
pub use status::{
    STATUS_REFUSED_ITEMS, condition_to_proto, error_record, gateway_status, init_gates,
    refused_item, service_state_of, service_state_uncounted, worker_status,
};

#[cfg(test)]
mod tests;
