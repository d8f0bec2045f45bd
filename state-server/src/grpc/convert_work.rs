//! Worker traffic and the proto forms of the domain's diff (part of `convert.rs`): a leased unit
//! as the [`v1::WorkUnit`] sent, a worker's [`v1::Report`] as the dispatcher's [`Report`], and
//! NRP's state as an observe read it back.

use std::net::IpAddr;
use std::time::Duration;

use clb_proto::v1::{
    self, AddressChange, AddressState, LocationChange, LocationState, ServicePort,
};
use tracing::warn;

use clb_core::difftracker::identity::normalize_identity;
use clb_core::difftracker::{
    self, ActualSnapshot, IpFamily, LocationDiff, LocationView, ServiceKind, quote,
};
use clb_core::dispatch::{self, Outcome, Report, UnitWork};
use clb_core::gateway::{Leased, Port, Protocol};

use super::ip_family_to_proto;

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
