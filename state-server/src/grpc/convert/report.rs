//! A worker's report as the dispatcher's: its outcome, the snapshot an observe read, and what it
//! carries beside (frontends, load balancer rules).

use super::*;
use clb_core::dispatch::ChangeError;

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
            let service = normalize_identity("service", &f.service_id).ok()?;
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
pub fn rules_from_proto(r: &v1::Report) -> Vec<(String, LbSpec)> {
    let Some(v1::report::Outcome::Observed(o)) = &r.outcome else {
        return Vec::new();
    };
    let listed = o.snapshot.as_ref().map_or(&[][..], |s| s.rules.as_slice());
    let rules: Vec<(String, LbSpec)> = listed
        .iter()
        .filter_map(|s| {
            let service = normalize_identity("service", &s.service_id).ok()?;
            Some((
                service.into_owned(),
                LbSpec {
                    ports: s.ports.iter().map(port_from_proto).collect(),
                    settings: super::settings::observed_settings_from_proto(s.settings.as_ref()),
                },
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
            refused: e.refused,
        },
        Some(v1::report::Outcome::Terminal(e)) => Outcome::Terminal {
            code: e.code,
            message: e.message,
            changes: e
                .changes
                .into_iter()
                .map(|c| ChangeError {
                    index: c.index,
                    code: c.code,
                    message: c.message,
                })
                .collect(),
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
    // A refused address that is no IP makes the report malformed (nothing of it is recorded).
    let mut refused = Vec::with_capacity(r.refused_addresses.len());
    let mut outcome = outcome;
    for (i, a) in r.refused_addresses.iter().enumerate() {
        match a.address.trim().parse::<IpAddr>() {
            Ok(ip) => refused.push(dispatch::AddressRefusal {
                index: a.index,
                address: ip.to_canonical(),
                code: a.code.clone(),
                message: a.message.clone(),
            }),
            Err(e) => {
                outcome = invalid(format!(
                    "report.refused_addresses[{i}].address: {} is not an IP address: {e}",
                    quote(&a.address)
                ));
                refused.clear();
                break;
            }
        }
    }
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
        refused,
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
            addresses.push((address, a.service_ids.clone()));
        }
        locations.push((location, addresses));
    }
    Ok(ActualSnapshot {
        load_balancers: s.load_balancers,
        nat_gateways: s.nat_gateways,
        locations,
    })
}
