//! The reads of the Admin service (and the writers' stream of service states) as proto: the
//! restart gate, errors, workers, a gateway's status, a service's state.

use super::*;

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

/// A piece of refused work held on the refusal schedule as proto.
pub fn refused_item(i: dispatch::RefusedItem) -> v1::RefusedItem {
    let ip = |ip: Option<std::net::IpAddr>| ip.map(|ip| ip.to_string()).unwrap_or_default();
    v1::RefusedItem {
        kind: i.kind.as_str().to_owned(),
        location: ip(i.location),
        address: ip(i.address),
        services: i.services,
        code: i.record.code,
        message: i.record.message,
        at_unix_ms: i.record.at_unix_ms,
        refusals: i.refusals,
        retry_at_unix_ms: i.retry_at_unix_ms.unwrap_or(0),
    }
}

/// The most refused items a gateway's status lists.
pub const STATUS_REFUSED_ITEMS: usize = 100;

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
        refused: g
            .dispatch()
            .refused_items(STATUS_REFUSED_ITEMS)
            .into_iter()
            .map(refused_item)
            .collect(),
        refused_addresses: g.dispatch().refused_address_count() as u64,
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
        settings: g
            .service_settings(&view.name)
            .filter(|_| inbound)
            .map(super::settings_to_proto),
        // An egress's brought NAT gateway: `admin::nat_gateway_of`.
        ..v1::ServiceState::default()
    }
}
