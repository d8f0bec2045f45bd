//! Serde views of the Admin answers for `--output json`. The prost types do not derive serde; these
//! small structs mirror them field by field (the same names as in the `.proto` files), with enums as
//! names (`inbound`, `create`, `full_update`, `TCP`) instead of numbers.

use std::collections::BTreeSet;

use clb_proto::v1::{
    AddressState, AddressUpdateAction, ErrorRecord, GatewayStatus, InitGates, IpFamily,
    LocationChange, LocationState, PendingDiffResponse, Protocol, ServiceAction, ServiceChange,
    ServiceKind, ServicePort, ServiceState, StatusResponse, WorkerStatus, WriterStatus,
};
use serde::Serialize;

use super::refused_view::RefusedView;
use crate::demo::{PhaseReport, Summary};

/// The name of a `ServiceKind` value: `inbound`, `outbound`, `unspecified` or `unknown(N)`.
pub fn kind_name(v: i32) -> String {
    match ServiceKind::try_from(v) {
        Ok(ServiceKind::Inbound) => "inbound".into(),
        Ok(ServiceKind::Outbound) => "outbound".into(),
        Ok(ServiceKind::Unspecified) => "unspecified".into(),
        Err(_) => format!("unknown({v})"),
    }
}

/// The name of an `IpFamily` value: `IPv4`, `IPv6`, `unspecified` (an inbound service whose writer
/// stated no family: IPv4 frontend, endpoints unchecked), `unknown(n)`.
pub fn family_name(v: i32) -> String {
    match IpFamily::try_from(v) {
        Ok(IpFamily::Ipv4) => "IPv4".into(),
        Ok(IpFamily::Ipv6) => "IPv6".into(),
        Ok(IpFamily::Unspecified) => "unspecified".into(),
        Err(_) => format!("unknown({v})"),
    }
}

/// The name of a `ServiceAction` value: `create`, `delete`, …
pub fn action_name(v: i32) -> String {
    match ServiceAction::try_from(v) {
        Ok(ServiceAction::Create) => "create".into(),
        Ok(ServiceAction::Delete) => "delete".into(),
        Ok(ServiceAction::Unspecified) => "unspecified".into(),
        Err(_) => format!("unknown({v})"),
    }
}

/// The name of an `AddressUpdateAction` value: `full_update`, `partial_update`, …
pub fn update_action_name(v: i32) -> String {
    match AddressUpdateAction::try_from(v) {
        Ok(AddressUpdateAction::FullUpdate) => "full_update".into(),
        Ok(AddressUpdateAction::PartialUpdate) => "partial_update".into(),
        Ok(AddressUpdateAction::Unspecified) => "unspecified".into(),
        Err(_) => format!("unknown({v})"),
    }
}

/// The name of a `Protocol` value: `TCP`, `UDP`, …
pub fn protocol_name(v: i32) -> String {
    match Protocol::try_from(v) {
        Ok(Protocol::Tcp) => "TCP".into(),
        Ok(Protocol::Udp) => "UDP".into(),
        Ok(Protocol::Unspecified) => "unspecified".into(),
        Err(_) => format!("unknown({v})"),
    }
}

/// `Admin.Status`.
#[derive(Debug, Clone, Serialize)]
pub struct StatusView {
    /// The server replica.
    pub server_id: String,
    /// One entry per gateway.
    pub gateways: Vec<GatewayView>,
    /// Connected workers.
    pub workers: Vec<WorkerView>,
    /// Known writers.
    pub writers: Vec<WriterView>,
}

/// One gateway of `Admin.Status`.
#[derive(Debug, Clone, Serialize)]
pub struct GatewayView {
    /// The gateway's name.
    pub name: String,
    /// The desired-state revision.
    pub revision: u64,
    /// Addresses desired.
    pub desired_addresses: u64,
    /// Addresses NRP has confirmed.
    pub actual_addresses: u64,
    /// Locations desired.
    pub desired_locations: u64,
    /// Locations NRP has.
    pub actual_locations: u64,
    /// Inbound identities desired.
    pub desired_services: u64,
    /// Load balancers NRP has.
    pub actual_services: u64,
    /// Egresses desired.
    pub desired_egresses: u64,
    /// NAT gateways NRP has.
    pub actual_nat_gateways: u64,
    /// Locations waiting to be diffed.
    pub dirty_locations: u64,
    /// Units leased to workers.
    pub units_in_flight: u64,
    /// Units parked after a terminal error.
    pub parked_units: u64,
    /// The initialization gates.
    pub init: InitView,
    /// The most recent worker errors, newest first.
    pub last_errors: Vec<ErrorView>,
    /// Age of the oldest change NRP has not confirmed, in ms (0: none).
    pub oldest_pending_change_age_ms: u64,
    /// Work NRP refused, held on the refusal schedule (at most 100).
    pub refused: Vec<RefusedView>,
    /// Addresses held after NRP refused them on their own (all of them).
    pub refused_addresses: u64,
    /// Whether desired and actual counts are equal and nothing is dirty or in flight.
    pub in_sync: bool,
}

/// The initialization gates.
#[derive(Debug, Clone, Serialize)]
pub struct InitView {
    /// NRP was read back once.
    pub nrp_observed: bool,
    /// Writers the restart gate waits for.
    pub pending_writers: Vec<String>,
    /// Removals are sent.
    pub removals_allowed: bool,
    /// The writer of the cluster view (the watcher's resync of services), once it came.
    pub cluster_view_writer: Option<String>,
    /// Whether that resync declared the cluster's nodes.
    pub topology_declared: bool,
    /// What holds removals back, by reason.
    pub held: Vec<HeldView>,
}

/// Removals the restart gate holds back for one reason.
#[derive(Debug, Clone, Serialize)]
pub struct HeldView {
    /// `nrp_not_observed`, `cluster_view`, `expected_writer` or `pod_writer`.
    pub reason: String,
    /// The writer waited for (empty for the first two reasons).
    pub writer: String,
    /// Locations held back.
    pub locations: u64,
    /// Addresses in NRP kept only because of this wait.
    pub addresses: u64,
    /// Services in NRP whose deletion waits.
    pub services: u64,
    /// When the wait ends anyway, in ms since the Unix epoch (0: no bound).
    pub deadline_unix_ms: i64,
}

/// One worker error.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorView {
    /// When, in ms since the Unix epoch.
    pub at_unix_ms: i64,
    /// The unit.
    pub work_id: u64,
    /// The error code.
    pub code: String,
    /// The message.
    pub message: String,
    /// Terminal (parked) or retryable.
    pub terminal: bool,
    /// The worker the unit was leased to (empty: no longer known).
    pub worker_id: String,
    /// What the unit carried, in short.
    pub unit: String,
}

/// One connected worker.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerView {
    /// Its id.
    pub worker_id: String,
    /// Units it accepts at once.
    pub capacity: u32,
    /// Units it holds.
    pub units_in_flight: u32,
    /// When it connected, in ms since the Unix epoch.
    pub connected_at_unix_ms: i64,
    /// The gateways it serves (empty: all).
    pub gateways: Vec<String>,
    /// When it last reported, in ms since the Unix epoch (0: never).
    pub last_report_unix_ms: i64,
    /// When a unit was last leased to it, in ms since the Unix epoch (0: never).
    pub last_unit_unix_ms: i64,
    /// Its units whose lease expired since it connected.
    pub lease_expiries: u64,
    /// Lease expiries since its last report (above 0: it holds units without reporting).
    pub expiries_since_report: u32,
}

/// One writer.
#[derive(Debug, Clone, Serialize)]
pub struct WriterView {
    /// Its name.
    pub writer: String,
    /// Its last completed resync, in ms since the Unix epoch (0: never).
    pub last_resync_unix_ms: i64,
    /// Updates accepted.
    pub updates_applied: u64,
    /// Updates rejected.
    pub items_rejected: u64,
}

impl From<&InitGates> for InitView {
    fn from(i: &InitGates) -> Self {
        Self {
            nrp_observed: i.nrp_observed,
            pending_writers: i.pending_writers.clone(),
            removals_allowed: i.removals_allowed,
            cluster_view_writer: i
                .cluster_view_resynced
                .then(|| i.cluster_view_writer.clone()),
            topology_declared: i.topology_declared,
            held: i
                .held
                .iter()
                .map(|h| HeldView {
                    reason: h.reason.clone(),
                    writer: h.writer.clone(),
                    locations: h.locations,
                    addresses: h.addresses,
                    services: h.services,
                    deadline_unix_ms: h.deadline_unix_ms,
                })
                .collect(),
        }
    }
}

impl From<&ErrorRecord> for ErrorView {
    fn from(e: &ErrorRecord) -> Self {
        Self {
            at_unix_ms: e.at_unix_ms,
            work_id: e.work_id,
            code: e.code.clone(),
            message: e.message.clone(),
            terminal: e.terminal,
            worker_id: e.worker_id.clone(),
            unit: e.unit.clone(),
        }
    }
}

impl From<&GatewayStatus> for GatewayView {
    fn from(g: &GatewayStatus) -> Self {
        Self {
            name: g.name.clone(),
            revision: g.revision,
            desired_addresses: g.desired_addresses,
            actual_addresses: g.actual_addresses,
            desired_locations: g.desired_locations,
            actual_locations: g.actual_locations,
            desired_services: g.desired_services,
            actual_services: g.actual_services,
            desired_egresses: g.desired_egresses,
            actual_nat_gateways: g.actual_nat_gateways,
            dirty_locations: g.dirty_locations,
            units_in_flight: g.units_in_flight,
            parked_units: g.parked_units,
            init: InitView::from(&g.init.clone().unwrap_or_default()),
            last_errors: g.last_errors.iter().map(ErrorView::from).collect(),
            oldest_pending_change_age_ms: g.oldest_pending_change_age_ms,
            refused: g.refused.iter().map(RefusedView::from).collect(),
            refused_addresses: g.refused_addresses,
            in_sync: crate::status::counts_in_sync(g),
        }
    }
}

impl From<&WorkerStatus> for WorkerView {
    fn from(w: &WorkerStatus) -> Self {
        Self {
            worker_id: w.worker_id.clone(),
            capacity: w.capacity,
            units_in_flight: w.units_in_flight,
            connected_at_unix_ms: w.connected_at_unix_ms,
            gateways: w.gateways.clone(),
            last_report_unix_ms: w.last_report_unix_ms,
            last_unit_unix_ms: w.last_unit_unix_ms,
            lease_expiries: w.lease_expiries,
            expiries_since_report: w.expiries_since_report,
        }
    }
}

impl From<&WriterStatus> for WriterView {
    fn from(w: &WriterStatus) -> Self {
        Self {
            writer: w.writer.clone(),
            last_resync_unix_ms: w.last_resync_unix_ms,
            updates_applied: w.updates_applied,
            items_rejected: w.items_rejected,
        }
    }
}

impl From<&StatusResponse> for StatusView {
    fn from(s: &StatusResponse) -> Self {
        Self {
            server_id: s.server_id.clone(),
            gateways: s.gateways.iter().map(GatewayView::from).collect(),
            workers: s.workers.iter().map(WorkerView::from).collect(),
            writers: s.writers.iter().map(WriterView::from).collect(),
        }
    }
}

/// How an address's desired and actual service refs compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AddressSync {
    /// Desired and actual refs are equal.
    InSync,
    /// Desired, not in NRP yet.
    ToAdd,
    /// In NRP, no longer desired.
    ToRemove,
    /// In both, with different refs.
    ToChange,
}

impl AddressSync {
    /// A short mark for tables.
    pub fn mark(self) -> &'static str {
        match self {
            AddressSync::InSync => "= in sync",
            AddressSync::ToAdd => "+ to add",
            AddressSync::ToRemove => "- to remove",
            AddressSync::ToChange => "~ to change",
        }
    }
}

/// One address of `Admin.GetLocation`.
#[derive(Debug, Clone, Serialize)]
pub struct AddressView {
    /// The pod IP.
    pub address: String,
    /// In the desired state.
    pub desired: bool,
    /// In NRP.
    pub actual: bool,
    /// The desired service ref.
    pub desired_services: Vec<String>,
    /// The actual service ref.
    pub actual_services: Vec<String>,
    /// How they compare.
    pub sync: AddressSync,
    /// Services desired but not in the actual ref.
    pub missing_services: Vec<String>,
    /// Services in the actual ref but not desired.
    pub extra_services: Vec<String>,
    /// Set while NRP's refusal of the address holds it back.
    pub refused: Option<RefusedView>,
}

impl From<&AddressState> for AddressView {
    fn from(a: &AddressState) -> Self {
        let desired: BTreeSet<String> = a
            .desired_service_ids
            .iter()
            .map(|s| s.to_lowercase())
            .collect();
        let actual: BTreeSet<String> = a
            .actual_service_ids
            .iter()
            .map(|s| s.to_lowercase())
            .collect();
        let sync = match (a.desired, a.actual) {
            (true, false) => AddressSync::ToAdd,
            (false, true) => AddressSync::ToRemove,
            _ if desired == actual => AddressSync::InSync,
            _ => AddressSync::ToChange,
        };
        Self {
            address: a.address.clone(),
            desired: a.desired,
            actual: a.actual,
            desired_services: a.desired_service_ids.clone(),
            actual_services: a.actual_service_ids.clone(),
            sync,
            missing_services: desired.difference(&actual).cloned().collect(),
            extra_services: actual.difference(&desired).cloned().collect(),
            refused: a.refused.as_ref().map(RefusedView::from),
        }
    }
}

/// `Admin.GetLocation`.
#[derive(Debug, Clone, Serialize)]
pub struct LocationView {
    /// The gateway.
    pub gateway: String,
    /// The location (node IP).
    pub location: String,
    /// In the desired state.
    pub desired: bool,
    /// In NRP.
    pub actual: bool,
    /// Whether every address is in sync.
    pub in_sync: bool,
    /// Addresses that differ.
    pub differences: usize,
    /// Every desired or actual address, sorted.
    pub addresses: Vec<AddressView>,
}

impl From<&LocationState> for LocationView {
    fn from(l: &LocationState) -> Self {
        let addresses: Vec<AddressView> = l.addresses.iter().map(AddressView::from).collect();
        let differences = addresses
            .iter()
            .filter(|a| a.sync != AddressSync::InSync)
            .count();
        Self {
            gateway: l.gateway.clone(),
            location: l.location.clone(),
            desired: l.desired,
            actual: l.actual,
            in_sync: differences == 0 && l.desired == l.actual,
            differences,
            addresses,
        }
    }
}

/// A service port.
#[derive(Debug, Clone, Serialize)]
pub struct PortView {
    /// The port number (the load-balancing rule's frontend port).
    pub port: u32,
    /// `TCP` or `UDP`.
    pub protocol: String,
    /// The port the pods listen on (the rule's backend port): the target port, or `port` when
    /// the target port is not set.
    pub target_port: u32,
}

impl PortView {
    /// `80/TCP`, or `80→8080/TCP` when the pods listen on another port.
    pub fn label(&self) -> String {
        if self.target_port == self.port {
            format!("{}/{}", self.port, self.protocol)
        } else {
            format!("{}→{}/{}", self.port, self.target_port, self.protocol)
        }
    }
}

impl From<&ServicePort> for PortView {
    fn from(p: &ServicePort) -> Self {
        Self {
            port: p.port,
            protocol: protocol_name(p.protocol),
            target_port: if p.target_port == 0 {
                p.port
            } else {
                p.target_port
            },
        }
    }
}

/// `Admin.GetService`.
#[derive(Debug, Clone, Serialize)]
pub struct ServiceView {
    /// The gateway.
    pub gateway: String,
    /// The identity.
    pub id: String,
    /// `inbound` or `outbound`.
    pub kind: String,
    /// In the desired state.
    pub desired: bool,
    /// In NRP.
    pub actual: bool,
    /// Desired addresses referring to it.
    pub desired_addresses: u64,
    /// Actual addresses referring to it.
    pub actual_addresses: u64,
    /// Desired locations with an address referring to it.
    pub desired_locations: u64,
    /// Actual locations with an address referring to it.
    pub actual_locations: u64,
    /// Its desired ports (inbound).
    pub ports: Vec<PortView>,
    /// Its frontend IP in NRP (inbound), empty while unknown.
    pub frontend_ip: String,
    /// The IP family of an inbound service (`IPv4`, `IPv6`, `unspecified`); empty for an egress,
    /// which has none (its pods may have both).
    pub ip_family: String,
    /// Whether desired and actual agree (presence and counts).
    pub in_sync: bool,
    /// The settings of its load balancer (inbound, desired), in short: `idle timeout 15 min`,
    /// `TCP reset off`, `affinity client IP`, `DNS label shop`, `public IP rg-ips/web-ip (brought)`;
    /// empty when every setting is the default.
    pub settings: Vec<String>,
}

impl From<&ServiceState> for ServiceView {
    fn from(s: &ServiceState) -> Self {
        Self {
            gateway: s.gateway.clone(),
            id: s.service_id.clone(),
            kind: kind_name(s.kind),
            desired: s.desired,
            actual: s.actual,
            desired_addresses: s.desired_addresses,
            actual_addresses: s.actual_addresses,
            desired_locations: s.desired_locations,
            actual_locations: s.actual_locations,
            ports: s.ports.iter().map(PortView::from).collect(),
            frontend_ip: s.frontend_ip.clone(),
            ip_family: if s.kind == ServiceKind::Outbound as i32 {
                String::new()
            } else {
                family_name(s.ip_family)
            },
            in_sync: s.desired == s.actual
                && s.desired_addresses == s.actual_addresses
                && s.desired_locations == s.actual_locations,
            settings: super::settings_view::settings_labels(s.settings.as_ref()),
        }
    }
}

/// One service change of the pending diff.
#[derive(Debug, Clone, Serialize)]
pub struct ServiceChangeView {
    /// The identity.
    pub name: String,
    /// `inbound` or `outbound`.
    pub kind: String,
    /// `create` or `delete`.
    pub action: String,
    /// Ports (inbound creation).
    pub ports: Vec<PortView>,
    /// The families of the public IPs the change makes: an inbound creation's one family, an
    /// egress's (`IPv4`, and `IPv6` once a pod of it has an IPv6 address); empty otherwise.
    pub families: Vec<String>,
}

impl From<&ServiceChange> for ServiceChangeView {
    fn from(c: &ServiceChange) -> Self {
        let inbound_create =
            c.kind == ServiceKind::Inbound as i32 && c.action == ServiceAction::Create as i32;
        let families = if c.kind == ServiceKind::Outbound as i32 {
            c.egress_families.iter().map(|f| family_name(*f)).collect()
        } else if inbound_create {
            vec![family_name(c.ip_family)]
        } else {
            Vec::new()
        };
        Self {
            name: c.service_id.clone(),
            kind: kind_name(c.kind),
            action: action_name(c.action),
            ports: c.ports.iter().map(PortView::from).collect(),
            families,
        }
    }
}

/// One address of a location change.
#[derive(Debug, Clone, Serialize)]
pub struct AddressChangeView {
    /// The pod IP.
    pub address: String,
    /// Its new service ref (empty in a partial update: removed).
    pub services: Vec<String>,
}

/// One location change of the pending diff.
#[derive(Debug, Clone, Serialize)]
pub struct LocationChangeView {
    /// The location.
    pub location: String,
    /// `full_update` or `partial_update`.
    pub action: String,
    /// The addresses with their new refs.
    pub addresses: Vec<AddressChangeView>,
}

impl From<&LocationChange> for LocationChangeView {
    fn from(c: &LocationChange) -> Self {
        Self {
            location: c.location.clone(),
            action: update_action_name(c.action),
            addresses: c
                .addresses
                .iter()
                .map(|a| AddressChangeView {
                    address: a.address.clone(),
                    services: a.service_ids.clone(),
                })
                .collect(),
        }
    }
}

/// `Admin.PendingDiff`.
#[derive(Debug, Clone, Serialize)]
pub struct DiffView {
    /// The gateway.
    pub gateway: String,
    /// The revision the diff was computed at.
    pub revision: u64,
    /// Service changes.
    pub services: Vec<ServiceChangeView>,
    /// Location changes.
    pub locations: Vec<LocationChangeView>,
    /// More entries than the limit allowed.
    pub truncated: bool,
    /// Work not sent now because NRP refused it (held on the refusal schedule).
    pub refused: Vec<RefusedView>,
}

impl From<&PendingDiffResponse> for DiffView {
    fn from(d: &PendingDiffResponse) -> Self {
        Self {
            gateway: d.gateway.clone(),
            revision: d.revision,
            services: d.services.iter().map(ServiceChangeView::from).collect(),
            locations: d.locations.iter().map(LocationChangeView::from).collect(),
            truncated: d.truncated,
            refused: d.refused.iter().map(RefusedView::from).collect(),
        }
    }
}

/// One phase of `clbctl demo`.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseView {
    /// The phase.
    pub phase: String,
    /// Whether it converged.
    pub converged: bool,
    /// From its first write to convergence, in ms.
    pub elapsed_ms: u64,
    /// Addresses desired at its end.
    pub desired_addresses: u64,
    /// NRP calls (`null` when NRP is not visible: external state server).
    pub nrp_calls: Option<u64>,
    /// `updateAddressLocations` calls.
    pub update_address_locations_calls: Option<u64>,
    /// Addresses carried by those calls.
    pub addresses_carried: Option<u64>,
    /// Throttled calls.
    pub throttled: Option<u64>,
    /// The differences when it did not converge.
    pub error: Option<String>,
}

impl From<&PhaseReport> for PhaseView {
    fn from(p: &PhaseReport) -> Self {
        Self {
            phase: p.phase.clone(),
            converged: p.outcome.is_ok(),
            elapsed_ms: u64::try_from(p.elapsed.as_millis()).unwrap_or(u64::MAX),
            desired_addresses: p.desired_addresses,
            nrp_calls: p.stats.as_ref().map(|s| s.calls),
            update_address_locations_calls: p.location_calls(),
            addresses_carried: p.stats.as_ref().map(|s| s.addresses_carried),
            throttled: p.throttled(),
            error: p.outcome.as_ref().err().cloned(),
        }
    }
}

/// `clbctl demo`.
#[derive(Debug, Clone, Serialize)]
pub struct DemoView {
    /// `embedded` or `external`.
    pub mode: String,
    /// Every phase converged.
    pub ok: bool,
    /// The phases played.
    pub phases: Vec<PhaseView>,
}

impl From<&Summary> for DemoView {
    fn from(s: &Summary) -> Self {
        Self {
            mode: if s.external { "external" } else { "embedded" }.into(),
            ok: s.ok(),
            phases: s.phases.iter().map(PhaseView::from).collect(),
        }
    }
}
