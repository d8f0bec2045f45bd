//! The programming condition of a service, as Kubernetes shows it (the watcher's `Programmed`
//! condition, `clbctl status`): derived from the gateway's facts — the tracker (desired vs actual),
//! the dispatcher (parked and failing work, pending changes) and the restart gate (removals held
//! back) — by `derive_condition`: the first of rejected, throttled / retrying, held back, pending
//! that applies, else programmed (or removed).

use std::collections::HashMap;
use std::net::IpAddr;

use super::GatewayCore;
use crate::difftracker::identity::ServiceKind;
use crate::difftracker::view::ServiceView;
use crate::dispatch::ErrorRecord;

/// Why a service is in its condition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ConditionReason {
    /// A change of it waits or is under way.
    #[default]
    Pending,
    /// NRP has it as desired.
    Programmed,
    /// Not desired and not in NRP.
    Removed,
    /// Azure refused a change; held, and sent again on the refusal schedule or when it changes.
    Rejected,
    /// Azure throttles its changes; retrying.
    Throttled,
    /// The last attempt failed; retrying.
    Retrying,
    /// The restart gate holds back a removal of it.
    HeldBack,
}

/// The programming condition of one service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Condition {
    /// Why.
    pub reason: ConditionReason,
    /// A sentence for people.
    pub message: String,
    /// The error code of the failure, if the reason is one.
    pub error_code: String,
    /// The error message of the failure.
    pub error_message: String,
    /// The location of the failure or the held-back removal (empty: the service itself).
    pub location: String,
    /// The restart gate's reason label, when held back.
    pub held_for: String,
    /// The writer the restart gate waits for, when it names one.
    pub held_for_writer: String,
    /// When the failure happened (Unix ms; 0 for none).
    pub error_at_unix_ms: i64,
    /// The address NRP refused on its own, at `location` (empty: the whole location's change or
    /// the service's).
    pub address: String,
}

impl GatewayCore {
    /// The programming condition of the service `view` shows, its frontend IP as known. Costs,
    /// while removals are withheld, O(withheld locations' addresses): a read of every service
    /// takes [`GatewayCore::held_removals`] once and [`GatewayCore::service_condition_among`].
    pub fn service_condition(&self, view: &ServiceView, frontend_ip: &str) -> Condition {
        derive_condition(&condition_facts(self, view, frontend_ip, None))
    }

    /// [`GatewayCore::service_condition`] with the restart gate's held-back removals read once
    /// for many services (`held`, from [`GatewayCore::held_removals`] under the same lock).
    pub fn service_condition_among(
        &self,
        view: &ServiceView,
        frontend_ip: &str,
        held: &HeldRemovals,
    ) -> Condition {
        derive_condition(&condition_facts(self, view, frontend_ip, Some(held)))
    }

    /// Where the restart gate holds back a removal, per service: one pass over the withheld
    /// locations' addresses, so that each service's condition then costs O(1) for it (before, a
    /// read of S services cost S × the withheld addresses: 50 ms per `Apply` at 2,500 Services,
    /// `state-server/benches/apply_scale.rs`).
    pub fn held_removals(&self) -> HeldRemovals {
        let mut first = HashMap::new();
        if self.tracker.withheld().is_nothing() {
            return HeldRemovals { first };
        }
        // In address order, as `condition_facts` looks for a service's first one.
        for (location, _) in self.tracker.withheld_removals() {
            if !self.tracker.location_removals_withheld(location) {
                continue;
            }
            let Some(v) = self.tracker.location_view(location) else {
                continue;
            };
            for a in &v.addresses {
                for s in a.actual.iter().flatten() {
                    if !a.desired.iter().flatten().any(|d| d == s) {
                        first.entry(s.clone()).or_insert(location);
                    }
                }
            }
        }
        HeldRemovals { first }
    }
}

/// The restart gate's held-back removals by service, read once ([`GatewayCore::held_removals`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldRemovals {
    /// Service (canonical name) → the first location, in address order, where removals are
    /// withheld and an address NRP has with it is not desired with it.
    first: HashMap<String, IpAddr>,
}

/// A failure of the service itself (`location` None) or of a location that carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Failure<'a> {
    pub(super) location: Option<IpAddr>,
    /// An address of `location` refused on its own.
    pub(super) address: Option<IpAddr>,
    pub(super) error: &'a ErrorRecord,
}

/// A removal concerning the service that the restart gate holds back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct HeldBack {
    /// `None`: the service's deletion; `Some(l)`: an address at `l` that must stop referring to it.
    pub(super) location: Option<IpAddr>,
    /// The gate's reason label (`HoldReason::label`).
    pub(super) reason: &'static str,
    /// The writer waited for, if the reason names one.
    pub(super) writer: Option<String>,
}

/// What the condition of one service is derived from (gathered under the gateway's lock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ConditionFacts<'a> {
    /// An inbound service (only those have a frontend IP).
    pub(super) inbound: bool,
    pub(super) desired: bool,
    pub(super) actual: bool,
    pub(super) frontend_ip: &'a str,
    pub(super) desired_addresses: u32,
    pub(super) actual_addresses: u32,
    /// A change of the service waits (dirty, queued, in flight).
    pub(super) pending: bool,
    pub(super) parked: Option<Failure<'a>>,
    pub(super) failing: Option<Failure<'a>>,
    pub(super) held: Option<HeldBack>,
}

/// The codes that mean "throttled" (docs/errors.md): `TooManyRequests` and another operation
/// holding the resource. A 429 with another code is reported as retrying: the error record keeps
/// the code, not the HTTP status.
fn throttled(code: &str) -> bool {
    matches!(code, "TooManyRequests" | "AnotherOperationInProgress")
}

fn at(location: Option<IpAddr>, address: Option<IpAddr>) -> String {
    match (location, address) {
        (Some(l), Some(a)) => format!("address {a} at location {l}"),
        (Some(l), None) => format!("location {l}"),
        (None, _) => "its load balancer".to_owned(),
    }
}

/// The condition of a service from its facts: the first of rejected, throttled/retrying, held
/// back, pending that applies, else programmed (or removed).
pub(super) fn derive_condition(f: &ConditionFacts<'_>) -> Condition {
    let failure = |reason: ConditionReason, what: &str, x: &Failure<'_>| Condition {
        reason,
        message: format!(
            "{what} ({}): {} {}: {}",
            at(x.location, x.address),
            if x.location.is_some() { "at" } else { "for" },
            x.error.code,
            x.error.message
        ),
        error_code: x.error.code.clone(),
        error_message: x.error.message.clone(),
        location: x.location.map(|l| l.to_string()).unwrap_or_default(),
        address: x.address.map(|a| a.to_string()).unwrap_or_default(),
        error_at_unix_ms: x.error.at_unix_ms,
        ..Condition::default()
    };
    if let Some(x) = &f.parked {
        return failure(
            ConditionReason::Rejected,
            "Azure refused the change; it is held and sent again on the refusal schedule, or at once when the Service changes",
            x,
        );
    }
    if let Some(x) = &f.failing {
        return if throttled(&x.error.code) {
            failure(
                ConditionReason::Throttled,
                "throttled by Azure, retrying",
                x,
            )
        } else {
            failure(
                ConditionReason::Retrying,
                "the last attempt failed, retrying",
                x,
            )
        };
    }
    if let Some(h) = &f.held {
        let what = match h.location {
            None => "the deletion of its load balancer".to_owned(),
            Some(l) => format!("removing its stale backends at location {l}"),
        };
        let why = match (&h.writer, h.reason) {
            (Some(w), _) => format!("until writer {w} resyncs its view ({})", h.reason),
            (None, "nrp_not_observed") => "until NRP has been read back".to_owned(),
            (None, "cluster_view") => "until the cluster watcher resyncs its view".to_owned(),
            (None, r) => format!("({r})"),
        };
        return Condition {
            reason: ConditionReason::HeldBack,
            message: format!("the restart gate holds back {what} {why}"),
            location: h.location.map(|l| l.to_string()).unwrap_or_default(),
            held_for: h.reason.to_owned(),
            held_for_writer: h.writer.clone().unwrap_or_default(),
            ..Condition::default()
        };
    }
    let simple = |reason: ConditionReason, message: String| Condition {
        reason,
        message,
        ..Condition::default()
    };
    match (f.desired, f.actual) {
        (false, false) => simple(
            ConditionReason::Removed,
            "not desired; NRP does not have it".to_owned(),
        ),
        (false, true) => simple(
            ConditionReason::Pending,
            "being removed from NRP".to_owned(),
        ),
        (true, false) => simple(
            ConditionReason::Pending,
            "waiting for NRP to create its load balancer".to_owned(),
        ),
        (true, true) if f.inbound && f.frontend_ip.is_empty() => simple(
            ConditionReason::Pending,
            "NRP has the load balancer; its frontend IP is not known yet".to_owned(),
        ),
        (true, true) if f.pending || f.desired_addresses != f.actual_addresses => simple(
            ConditionReason::Pending,
            format!(
                "{} of {} backends programmed, the rest is being sent",
                f.actual_addresses, f.desired_addresses
            ),
        ),
        (true, true) => simple(
            ConditionReason::Programmed,
            if f.frontend_ip.is_empty() {
                format!("programmed in NRP, {} backends", f.actual_addresses)
            } else {
                format!(
                    "programmed in NRP with frontend IP {}, {} backends",
                    f.frontend_ip, f.actual_addresses
                )
            },
        ),
    }
}

/// Whether an address of `location` refers to `name` on either side.
fn carries(g: &GatewayCore, location: IpAddr, name: &str) -> bool {
    g.tracker.location_view(location).is_some_and(|v| {
        v.addresses.iter().any(|a| {
            a.desired.iter().flatten().any(|s| s == name)
                || a.actual.iter().flatten().any(|s| s == name)
        })
    })
}

/// Whether `location` holds, only because removals are withheld there, an address NRP has with
/// `name` that is not desired with it.
fn held_at(g: &GatewayCore, location: IpAddr, name: &str) -> bool {
    if !g.tracker.location_removals_withheld(location) {
        return false;
    }
    g.tracker.location_view(location).is_some_and(|v| {
        v.addresses.iter().any(|a| {
            a.actual.iter().flatten().any(|s| s == name)
                && !a.desired.iter().flatten().any(|s| s == name)
        })
    })
}

/// The hold of the restart gate that covers `location` (`None`: every location).
fn hold_for(g: &GatewayCore, location: Option<IpAddr>) -> Option<HeldBack> {
    g.gate
        .holds()
        .iter()
        .find(|h| match (&h.locations, location) {
            (None, _) => true,
            (Some(ls), Some(l)) => ls.contains(&l),
            (Some(_), None) => false,
        })
        .map(|h| HeldBack {
            location,
            reason: h.reason.label(),
            writer: h.reason.writer().map(str::to_owned),
        })
}

/// Gathers the facts of one service from the gateway: the tracker, the dispatcher (parked work,
/// last failures, pending changes) and the restart gate. Costs O(parked + failing locations),
/// O(1) for its refused addresses, plus, while removals are withheld, O(withheld locations'
/// addresses) unless `held` read them already.
fn condition_facts<'a>(
    g: &'a GatewayCore,
    view: &ServiceView,
    frontend_ip: &'a str,
    held: Option<&HeldRemovals>,
) -> ConditionFacts<'a> {
    let name = view.name.as_str();
    let first_location = |it: &mut dyn Iterator<Item = (IpAddr, &'a ErrorRecord)>| {
        let mut hits: Vec<(IpAddr, &'a ErrorRecord)> =
            it.filter(|(l, _)| carries(g, *l, name)).collect();
        hits.sort_by_key(|(l, _)| *l);
        hits.into_iter().next().map(|(l, error)| Failure {
            location: Some(l),
            address: None,
            error,
        })
    };
    let parked = match g.dispatch.parked_service(name) {
        Some(error) => Some(Failure {
            location: None,
            address: None,
            error,
        }),
        None => first_location(&mut g.dispatch.parked_locations()).or_else(|| {
            // A hold whose address is no longer desired with the service is forgotten when its
            // location is next cut: it no longer concerns the service.
            g.dispatch
                .refused_addresses_of(name)
                .find(|r| g.tracker.desired_with(r.location, r.address, name))
                .map(|r| Failure {
                    location: Some(r.location),
                    address: Some(r.address),
                    error: &r.hold.record,
                })
        }),
    };
    let failing = match g.dispatch.failing_service(name) {
        Some(error) => Some(Failure {
            location: None,
            address: None,
            error,
        }),
        None => first_location(&mut g.dispatch.failing_locations()),
    };
    let held = if g.tracker.withheld().is_nothing() {
        None
    } else if !view.desired && view.actual && g.tracker.withheld().deletions_of(view.kind) {
        hold_for(g, None)
    } else {
        match held {
            Some(h) => h.first.get(name).copied(),
            None => g
                .tracker
                .withheld_removals()
                .into_iter()
                .map(|(l, _)| l)
                .find(|l| held_at(g, *l, name)),
        }
        .and_then(|l| hold_for(g, Some(l)))
    };
    ConditionFacts {
        inbound: view.kind == ServiceKind::Inbound,
        desired: view.desired,
        actual: view.actual,
        frontend_ip,
        desired_addresses: view.desired_addresses,
        actual_addresses: view.actual_addresses,
        pending: g.tracker.is_service_dirty(name) || g.dispatch.service_pending(name),
        parked,
        failing,
        held,
    }
}

#[cfg(test)]
#[path = "condition_tests.rs"]
mod tests;
