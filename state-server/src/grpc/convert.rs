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
use std::time::{Duration, Instant};

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
    self, ActualSnapshot, DiffTracker, InvalidInput, IpFamily, LocationDiff, LocationView,
    Operation, Reason, ServiceKind, ServiceView, excerpt, quote,
};
use clb_core::dispatch::{self, Outcome, Report, UnitWork};
use clb_core::gateway::Scope;
use clb_core::gateway::update::{
    EndpointsChange, Fault, Item, ItemFault, Named, Refusal, Update as GatewayUpdate,
};
use clb_core::gateway::{Leased, Port, Protocol};

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
                named: Named::Service(&s.id),
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
            Ok(GatewayUpdate::Service {
                operation: op,
                id: &s.id,
                ports,
                family,
            })
        }
        Kind::Egress(e) => {
            let operation = operation("egress", e.operation).map_err(|fault| Refusal {
                named: Named::Egress(&e.id),
                fault,
            })?;
            Ok(GatewayUpdate::Egress {
                operation,
                id: &e.id,
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
                    outbound_identity: &p.outbound_identity,
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

/// Validates one update and applies it to `tracker` (no rights, no port book: for tests and
/// tools); `index` is its position in the batch. On error nothing of the update was applied.
pub fn apply_update(
    tracker: &mut DiffTracker,
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

/// A domain service change as proto, with the ports of an inbound creation (the domain does not
/// keep ports; the caller passes them, empty when unknown).
pub fn service_change(
    change: &difftracker::ServiceChange,
    ports: Vec<ServicePort>,
    family: Option<IpFamily>,
) -> v1::ServiceChange {
    let create_inbound =
        change.kind == ServiceKind::Inbound && change.action == difftracker::ServiceAction::Create;
    v1::ServiceChange {
        name: change.name.clone(),
        kind: service_kind(change.kind) as i32,
        action: service_action(change.action) as i32,
        ports: if create_inbound { ports } else { Vec::new() },
        ip_family: if create_inbound {
            ip_family_to_proto(family) as i32
        } else {
            0
        },
        nat_gateway: match change.kind {
            ServiceKind::Outbound => change.nat_gateway.clone().unwrap_or_default(),
            ServiceKind::Inbound => String::new(),
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

/// A unit leased to a worker as the proto sent to it: a creation of an inbound service carries the
/// service's desired ports ([`clb_core::gateway::GatewayCore::lease`] remembers them as in flight); `trace_context`
/// is left for the session to fill.
pub fn unit_to_proto(gateway: &str, leased: Leased, families: &[Option<IpFamily>]) -> v1::WorkUnit {
    let Leased { unit, ports } = leased;
    let work = match &unit.work {
        UnitWork::Observe => v1::work_unit::Work::Observe(v1::ObserveWork {}),
        UnitWork::Services(changes) => v1::work_unit::Work::Services(v1::ServiceWork {
            changes: changes
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let ports = ports.get(i).map_or(&[][..], Vec::as_slice);
                    let family = families.get(i).copied().flatten();
                    service_change(c, ports.iter().map(port_to_proto).collect(), family)
                })
                .collect(),
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

/// The frontends a report carries (for a service unit, or in an observe's snapshot) as canonical
/// (service, IP) pairs. A malformed entry is left out: it cannot be true of NRP, and the next
/// observe reads the frontends back anyway.
pub fn frontends_from_proto(r: &v1::Report) -> Vec<(String, String)> {
    let listed = match &r.outcome {
        Some(v1::report::Outcome::Observed(o)) => o
            .snapshot
            .as_ref()
            .map_or(&[][..], |s| s.frontends.as_slice()),
        _ => r.frontends.as_slice(),
    };
    let frontends: Vec<(String, String)> = listed
        .iter()
        .filter_map(|f| {
            let service = normalize_identity("service", &f.service).ok()?;
            let ip = f.ip.parse::<IpAddr>().ok()?.to_canonical();
            Some((service.into_owned(), ip.to_string()))
        })
        .collect();
    if frontends.len() < listed.len() {
        warn!(
            work_id = r.work_id,
            ignored = listed.len() - frontends.len(),
            "report with malformed frontends: ignored them"
        );
    }
    frontends
}

/// The load balancer rules an observe's part carries, as (canonical service, ports) pairs. An
/// entry with a malformed service name is left out (so that service's rules are not compared).
pub fn rules_from_proto(r: &v1::Report) -> Vec<(String, Vec<Port>)> {
    let Some(v1::report::Outcome::Observed(o)) = &r.outcome else {
        return Vec::new();
    };
    let listed = o.snapshot.as_ref().map_or(&[][..], |s| s.rules.as_slice());
    let rules: Vec<(String, Vec<Port>)> = listed
        .iter()
        .filter_map(|s| {
            let service = normalize_identity("service", &s.service).ok()?;
            Some((
                service.into_owned(),
                s.ports.iter().map(port_from_proto).collect(),
            ))
        })
        .collect();
    if rules.len() < listed.len() {
        warn!(
            work_id = r.work_id,
            ignored = listed.len() - rules.len(),
            "observe with malformed service rules: ignored them"
        );
    }
    rules
}

/// A report from the wire; a malformed one becomes a retryable failure (the unit is cut again).
pub fn report_from_proto(r: v1::Report) -> Report {
    let invalid = |message: String| Outcome::Retryable {
        retry_after: Duration::ZERO,
        code: "InvalidReport".into(),
        message,
    };
    let outcome = match r.outcome {
        Some(v1::report::Outcome::Applied(_)) => Outcome::Applied,
        Some(v1::report::Outcome::Retryable(e)) => Outcome::Retryable {
            retry_after: Duration::from_millis(e.retry_after_ms),
            code: e.code,
            message: e.message,
        },
        Some(v1::report::Outcome::Repair(e)) => Outcome::Repair {
            retry_after: Duration::from_millis(e.retry_after_ms),
            code: e.code,
            message: e.message,
        },
        Some(v1::report::Outcome::Terminal(e)) => Outcome::Terminal {
            code: e.code,
            message: e.message,
        },
        Some(v1::report::Outcome::Observed(o)) => {
            match snapshot_from_proto(o.snapshot.unwrap_or_default()) {
                Ok(snapshot) => Outcome::Observed {
                    snapshot,
                    last: o.last,
                },
                Err(message) => invalid(message),
            }
        }
        None => invalid("report.outcome: missing".into()),
    };
    // A step this server does not know is left out (nothing of it is recorded).
    let progress = r.service_progress.iter().filter_map(|p| {
        let step = match v1::ServiceStep::try_from(p.step).ok()? {
            v1::ServiceStep::Resources => clb_core::difftracker::ServiceStep::Resources,
            v1::ServiceStep::Unregistered => clb_core::difftracker::ServiceStep::Unregistered,
            v1::ServiceStep::Unspecified => return None,
        };
        Some(dispatch::ServiceProgress {
            index: p.index,
            step,
        })
    });
    Report {
        work_id: r.work_id,
        applied: r.applied_indices,
        progress: progress.collect(),
        outcome,
    }
}

/// NRP's state as an observe read it back (one part of it), IPs canonical; a malformed IP refuses
/// the whole part with a message naming the field and (an excerpt of) the value.
pub fn snapshot_from_proto(s: v1::NrpSnapshot) -> Result<ActualSnapshot, String> {
    let ip = |field: String, v: &str| -> Result<IpAddr, String> {
        v.parse::<IpAddr>()
            .map(|ip| ip.to_canonical())
            .map_err(|_| format!("{field} = {}: not an IP address", quote(v)))
    };
    let mut locations = Vec::with_capacity(s.locations.len());
    for (i, l) in s.locations.iter().enumerate() {
        let location = ip(
            format!("observed.snapshot.locations[{i}].location"),
            &l.location,
        )?;
        let mut addresses = Vec::with_capacity(l.addresses.len());
        for (j, a) in l.addresses.iter().enumerate() {
            let address = ip(
                format!("observed.snapshot.locations[{i}].addresses[{j}].address"),
                &a.address,
            )?;
            addresses.push((address, a.services.clone()));
        }
        locations.push((location, addresses));
    }
    Ok(ActualSnapshot {
        load_balancers: s.load_balancers,
        nat_gateways: s.nat_gateways,
        locations,
    })
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

/// The restart gate as proto.
pub fn init_gates(view: GateView) -> v1::InitGates {
    v1::InitGates {
        nrp_observed: view.nrp_observed,
        pending_writers: view.pending_writers,
        removals_allowed: view.open,
        cluster_view_resynced: view.cluster_view_writer.is_some(),
        cluster_view_writer: view.cluster_view_writer.unwrap_or_default(),
        topology_declared: view.topology_declared,
        held: view
            .holds
            .into_iter()
            .map(|h| v1::HeldRemovals {
                reason: h.reason.label().to_owned(),
                writer: h.reason.writer().unwrap_or_default().to_owned(),
                locations: h.locations,
                addresses: h.addresses,
                services: h.services,
                deadline_unix_ms: h.deadline_unix_ms.unwrap_or_default(),
            })
            .collect(),
    }
}

/// One of the dispatcher's recent errors as proto; `worker_id` names the worker session.
pub fn error_record(e: dispatch::ErrorRecord, worker_id: String) -> v1::ErrorRecord {
    v1::ErrorRecord {
        at_unix_ms: e.at_unix_ms,
        work_id: e.work_id,
        code: e.code,
        message: e.message,
        terminal: e.terminal,
        worker_id,
        unit: e.unit,
    }
}

/// A connected worker as proto.
pub fn worker_status(w: WorkerInfo) -> v1::WorkerStatus {
    v1::WorkerStatus {
        worker_id: w.worker_id,
        capacity: w.capacity,
        units_in_flight: w.units_in_flight,
        connected_at_unix_ms: w.connected_at_unix_ms,
        gateways: w.gateways,
        last_report_unix_ms: w.last_report_unix_ms,
        last_unit_unix_ms: w.last_unit_unix_ms,
        lease_expiries: w.lease_expiries,
        expiries_since_report: w.expiries_since_report,
    }
}

/// A gateway's counts, gates and recent errors (newest first) as proto, at `now`; `worker_id`
/// names a worker session.
pub fn gateway_status(
    g: &Gateway,
    now: Instant,
    worker_id: &dyn Fn(u64) -> String,
) -> v1::GatewayStatus {
    let c = g.tracker().counts();
    let mut last_errors: Vec<v1::ErrorRecord> = g
        .dispatch()
        .last_errors()
        .into_iter()
        .map(|e| {
            let worker = worker_id(e.worker);
            error_record(e, worker)
        })
        .collect();
    last_errors.sort_by_key(|e| std::cmp::Reverse(e.at_unix_ms));
    let oldest = g.dispatch().oldest_pending_age(now).unwrap_or_default();
    v1::GatewayStatus {
        name: g.name().to_owned(),
        revision: g.tracker().revision(),
        desired_addresses: c.desired_addresses,
        actual_addresses: c.actual_addresses,
        desired_locations: c.desired_locations,
        actual_locations: c.actual_locations,
        desired_services: c.desired_services,
        actual_services: c.actual_load_balancers,
        desired_egresses: c.desired_egresses,
        actual_nat_gateways: c.actual_nat_gateways,
        dirty_locations: c.dirty_locations,
        units_in_flight: g.dispatch().units_in_flight() as u64,
        parked_units: g.dispatch().parked_units() as u64,
        init: Some(init_gates(g.gate_view(now))),
        last_errors,
        oldest_pending_change_age_ms: u64::try_from(oldest.as_millis()).unwrap_or(u64::MAX),
    }
}

/// One service of gateway `g` as proto: the tracker's view, and beside it the desired ports and
/// the frontend IP of an inbound service (the frontend only while NRP has the service).
pub fn service_state(g: &Gateway, view: &ServiceView) -> v1::ServiceState {
    v1::ServiceState {
        actual_locations: g.tracker().actual_locations_of(&view.name),
        ..service_state_uncounted(g, view)
    }
}

/// [`service_state`] without `actual_locations` (0), which costs a scan of every location: what
/// the writers' stream of service states sends (`grpc/session.rs`).
pub fn service_state_uncounted(g: &Gateway, view: &ServiceView) -> v1::ServiceState {
    let inbound = view.kind == ServiceKind::Inbound;
    let ports = match g.service_ports(&view.name) {
        Some(ports) if inbound => ports.iter().map(port_to_proto).collect(),
        _ => Vec::new(),
    };
    let frontend_ip = match g.frontend(&view.name) {
        Some(ip) if inbound && view.actual => ip.to_owned(),
        _ => String::new(),
    };
    v1::ServiceState {
        gateway: g.name().to_owned(),
        id: view.name.clone(),
        kind: service_kind(view.kind) as i32,
        desired: view.desired,
        actual: view.actual,
        desired_addresses: u64::from(view.desired_addresses),
        actual_addresses: u64::from(view.actual_addresses),
        desired_locations: view.locations as u64,
        actual_locations: 0,
        ports,
        frontend_ip,
        // Derived by the core (`core/src/gateway/condition.rs`, `GatewayCore::service_condition`).
        condition: None,
        ip_family: ip_family_to_proto(g.tracker().service_family(&view.name)) as i32,
        // An egress's brought NAT gateway: `admin::nat_gateway_of`.
        ..v1::ServiceState::default()
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
                ..Default::default()
            })),
        }
    }

    fn service(op: i32, id: &str, ports: Vec<ServicePort>) -> Update {
        Update {
            kind: Some(Kind::Service(ServiceUpdate {
                operation: op,
                id: id.into(),
                ports,
                ..Default::default()
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
            target_port: 0,
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
            target_port: 0,
        };
        let e = err(&service(1, "svc", vec![bad_port]), 0);
        assert_eq!(e.field, "updates[0].service.ports[0].port");
        let no_proto = ServicePort {
            port: 80,
            protocol: 0,
            target_port: 0,
        };
        let e = err(&service(1, "svc", vec![no_proto]), 0);
        assert_eq!(e.field, "updates[0].service.ports[0].protocol");
        assert_eq!(e.value, "PROTOCOL_UNSPECIFIED");
        let tcp = ServicePort {
            port: 80,
            protocol: 1,
            target_port: 0,
        };
        let e = err(&service(1, "svc", vec![tcp, tcp]), 0);
        assert_eq!(e.field, "updates[0].service.ports[1]");
        let bad_target = ServicePort {
            port: 80,
            protocol: 1,
            target_port: 65_536,
        };
        let e = err(&service(1, "svc", vec![tcp, bad_target]), 0);
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("updates[0].service.ports[1].target_port", "65536")
        );
        assert!(e.reason.contains("must be 1 to 65535"), "{}", e.reason);
        // 0 (the same as the port) and any port number are fine.
        for target_port in [0, 1, 8080, 65_535] {
            let p = ServicePort {
                port: 80,
                protocol: 1,
                target_port,
            };
            let mut t = DiffTracker::new();
            apply_update(&mut t, &service(1, "svc", vec![p]), 0).unwrap();
        }
        // Ports are ignored on removal.
        let mut t = DiffTracker::new();
        apply_update(&mut t, &service(2, "svc", vec![no_proto]), 0).unwrap();
    }

    #[test]
    fn header_scopes_are_validated() {
        assert!(resync_scope(None).is_err());
        let empty = ResyncScope::default();
        assert_eq!(
            resync_scope(Some(&empty)).unwrap_err().field,
            "header.scope"
        );
        let loc_without_pods = ResyncScope {
            services: true,
            location: "10.0.0.1".into(),
            ..ResyncScope::default()
        };
        assert_eq!(
            resync_scope(Some(&loc_without_pods)).unwrap_err().field,
            "header.scope.location"
        );
        let bad_loc = ResyncScope {
            pods: true,
            location: "10.0.0.999".into(),
            ..ResyncScope::default()
        };
        let e = resync_scope(Some(&bad_loc)).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("header.scope.location", "10.0.0.999")
        );
        let node = ResyncScope {
            pods: true,
            location: "10.0.0.1".into(),
            ..ResyncScope::default()
        };
        let s = resync_scope(Some(&node)).unwrap();
        assert_eq!(s.location, Some("10.0.0.1".parse::<IpAddr>().unwrap()));
        assert_eq!(s.to_string(), "pods at 10.0.0.1");
    }

    #[test]
    fn long_values_are_cut_in_item_errors_and_messages() {
        let long = "x".repeat(1 << 20);
        let e = err(&pod(v1::Operation::Add, &long, "10.0.0.1", ""), 0);
        assert_eq!(e.field, "updates[0].pod.address");
        assert_eq!(
            e.value,
            format!(
                "{}… (1048576 bytes)",
                "x".repeat(difftracker::MAX_QUOTED_CHARS)
            )
        );
        let e = err(&service(1, &long, vec![]), 0);
        assert!(e.value.ends_with("… (1048576 bytes)"), "{}", e.value);
        assert!(e.reason.contains("1048576 characters long"), "{}", e.reason);

        let status = invalid_argument("id", &long, "is too long");
        assert!(status.message().len() < 200, "{}", status.message());
        assert!(
            status
                .message()
                .ends_with("…\" (1048576 bytes): is too long")
        );
        let status = unknown_gateway(&UnknownGateway(long.clone()));
        assert_eq!(status.code(), tonic::Code::NotFound);
        assert!(status.message().len() < 200, "{}", status.message());

        let header = resync_scope(Some(&ResyncScope {
            pods: true,
            location: long.clone(),
            ..ResyncScope::default()
        }))
        .unwrap_err();
        assert!(header.to_string().len() < 300, "{header}");

        // A worker's malformed observe: the message kept in status quotes an excerpt.
        let report = report_from_proto(v1::Report {
            work_id: 3,
            outcome: Some(v1::report::Outcome::Observed(v1::Observed {
                snapshot: Some(v1::NrpSnapshot {
                    locations: vec![LocationChange {
                        location: long,
                        ..LocationChange::default()
                    }],
                    ..v1::NrpSnapshot::default()
                }),
                last: true,
            })),
            ..v1::Report::default()
        });
        let Outcome::Retryable { code, message, .. } = report.outcome else {
            panic!("{:?}", report.outcome)
        };
        assert_eq!(code, "InvalidReport");
        assert!(message.starts_with("observed.snapshot.locations[0].location = \"xxx"));
        assert!(message.len() < 300, "{message}");
    }

    #[test]
    fn reports_convert_from_proto() {
        let applied = report_from_proto(v1::Report {
            work_id: 7,
            applied_indices: vec![1],
            outcome: Some(v1::report::Outcome::Applied(v1::Applied {})),
            ..v1::Report::default()
        });
        assert_eq!(
            applied,
            Report {
                work_id: 7,
                applied: vec![1],
                progress: vec![],
                outcome: Outcome::Applied
            }
        );
        let retry = report_from_proto(v1::Report {
            work_id: 8,
            outcome: Some(v1::report::Outcome::Retryable(v1::Retryable {
                retry_after_ms: 1500,
                code: "TooManyRequests".into(),
                message: "slow down".into(),
            })),
            ..v1::Report::default()
        });
        assert_eq!(
            retry.outcome,
            Outcome::Retryable {
                retry_after: Duration::from_millis(1500),
                code: "TooManyRequests".into(),
                message: "slow down".into(),
            }
        );
        let missing = report_from_proto(v1::Report {
            work_id: 9,
            ..v1::Report::default()
        });
        assert!(
            matches!(missing.outcome, Outcome::Retryable { code, .. } if code == "InvalidReport")
        );

        let observed = v1::Report {
            work_id: 10,
            outcome: Some(v1::report::Outcome::Observed(v1::Observed {
                snapshot: Some(v1::NrpSnapshot {
                    load_balancers: vec!["svc-a".into()],
                    locations: vec![LocationChange {
                        location: "::ffff:10.0.0.1".into(),
                        action: 0,
                        addresses: vec![AddressChange {
                            address: "10.1.0.1".into(),
                            services: vec!["svc-a".into()],
                        }],
                    }],
                    frontends: vec![
                        v1::ServiceFrontend {
                            service: "SVC-A".into(),
                            ip: "20.0.0.1".into(),
                        },
                        v1::ServiceFrontend {
                            service: "svc-b".into(),
                            ip: "not an ip".into(),
                        },
                    ],
                    rules: vec![v1::ServiceRules {
                        service: "Svc-A".into(),
                        ports: vec![ServicePort {
                            port: 80,
                            protocol: 1,
                            target_port: 0,
                        }],
                    }],
                    ..v1::NrpSnapshot::default()
                }),
                last: false,
            })),
            ..v1::Report::default()
        };
        assert_eq!(
            frontends_from_proto(&observed),
            vec![("svc-a".to_string(), "20.0.0.1".to_string())]
        );
        assert_eq!(
            rules_from_proto(&observed),
            vec![(
                "svc-a".to_string(),
                vec![Port {
                    port: 80,
                    protocol: Protocol::Tcp,
                    target_port: 0,
                }]
            )]
        );
        let Outcome::Observed { snapshot, last } = report_from_proto(observed).outcome else {
            panic!("an observe")
        };
        assert!(!last);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            snapshot.locations,
            vec![(
                ip("10.0.0.1"),
                vec![(ip("10.1.0.1"), vec!["svc-a".to_string()])]
            )]
        );
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
            target_port: 0,
        };
        let s = service_change(&diff.services[0], vec![tcp], None);
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
