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
        service_ids: i.services,
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

/// A gateway's status (the core's [`StatusView`]) as proto; `worker_id` names a worker session.
/// Recent errors newest first.
pub fn gateway_status(
    name: &str,
    status: StatusView,
    worker_id: &dyn Fn(u64) -> String,
) -> v1::GatewayStatus {
    let c = status.counts;
    let mut last_errors: Vec<v1::ErrorRecord> = status
        .last_errors
        .into_iter()
        .map(|e| {
            let worker = worker_id(e.worker);
            error_record(e, worker)
        })
        .collect();
    last_errors.sort_by_key(|e| std::cmp::Reverse(e.at_unix_ms));
    v1::GatewayStatus {
        name: name.to_owned(),
        revision: status.revision,
        desired_addresses: c.desired_addresses,
        actual_addresses: c.actual_addresses,
        desired_locations: c.desired_locations,
        actual_locations: c.actual_locations,
        desired_services: c.desired_services,
        actual_services: c.actual_load_balancers,
        desired_egresses: c.desired_egresses,
        actual_nat_gateways: c.actual_nat_gateways,
        dirty_locations: c.dirty_locations,
        units_in_flight: status.units_in_flight as u64,
        parked_units: status.parked_units as u64,
        init: Some(init_gates(status.gate)),
        last_errors,
        oldest_pending_change_age_ms: u64::try_from(status.oldest_pending_age.as_millis())
            .unwrap_or(u64::MAX),
        refused: status.refused.into_iter().map(refused_item).collect(),
        refused_addresses: status.refused_addresses as u64,
    }
}

/// One service of gateway `gateway` (the core's [`ServiceStatus`]) as proto: both sides, and
/// beside them the desired ports, settings and frontend IP of an inbound service, the brought NAT
/// gateway of an egress, and the condition and `actual_locations` when the status has them (0 and
/// unset otherwise).
pub fn service_state_of(gateway: &str, status: ServiceStatus) -> v1::ServiceState {
    let ServiceStatus {
        view,
        family,
        ports,
        settings,
        frontend,
        actual_locations,
        egress,
        condition,
    } = status;
    let egress = egress.unwrap_or_default();
    v1::ServiceState {
        gateway: gateway.to_owned(),
        kind: service_kind(view.kind) as i32,
        desired: view.desired,
        actual: view.actual,
        desired_addresses: u64::from(view.desired_addresses),
        actual_addresses: u64::from(view.actual_addresses),
        desired_locations: view.locations as u64,
        actual_locations: actual_locations.unwrap_or_default(),
        ports: ports.iter().map(port_to_proto).collect(),
        frontend_ip: frontend.unwrap_or_default(),
        condition: condition.map(condition_to_proto),
        ip_family: ip_family_to_proto(family) as i32,
        settings: settings.as_ref().map(super::settings_to_proto),
        nat_gateway: egress.nat_gateway.unwrap_or_default(),
        nat_gateway_missing: egress.nat_gateway_missing,
        service_id: view.name,
    }
}

/// [`service_state_of`] for the service of `view` without `actual_locations` (0), which costs a
/// scan of every location, nor the condition: what the writers' stream of service states sends
/// (`grpc/session.rs`).
pub fn service_state_uncounted(g: &Gateway, view: &ServiceView) -> v1::ServiceState {
    service_state_of(g.name(), g.service_status_of(view))
}

/// A condition as proto.
pub fn condition_to_proto(c: Condition) -> v1::ServiceCondition {
    let reason = match c.reason {
        ConditionReason::Pending => v1::ProgrammingReason::Pending,
        ConditionReason::Programmed => v1::ProgrammingReason::Programmed,
        ConditionReason::Removed => v1::ProgrammingReason::Removed,
        ConditionReason::Rejected => v1::ProgrammingReason::Rejected,
        ConditionReason::Throttled => v1::ProgrammingReason::Throttled,
        ConditionReason::Retrying => v1::ProgrammingReason::Retrying,
        ConditionReason::HeldBack => v1::ProgrammingReason::HeldBack,
    };
    v1::ServiceCondition {
        reason: reason as i32,
        message: c.message,
        error_code: c.error_code,
        error_message: c.error_message,
        location: c.location,
        held_for: c.held_for,
        held_for_writer: c.held_for_writer,
        error_at_unix_ms: c.error_at_unix_ms,
        address: c.address,
    }
}
