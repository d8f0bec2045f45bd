//! The `Admin` gRPC service: read-only status, the state of a location or service, and the
//! pending diff, for operators (`clbctl`) and tests.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use clb_proto::v1::admin_server::{Admin, AdminServer};
use clb_proto::v1::{
    DiffQuery, LocationQuery, LocationState, PendingDiffResponse, ProgrammingReason,
    ServiceCondition, ServiceQuery, ServiceState, StatusRequest, StatusResponse, WriterStatus,
};
use tonic::{Request, Response, Status};

use super::convert::{
    gateway_status, invalid_argument, location_change, location_state, service_change,
    service_state, unknown_gateway, worker_status,
};
use crate::state::{Gateway, StateServer};
use clb_core::difftracker::identity::ServiceKind;
use clb_core::difftracker::identity::normalize_identity;
use clb_core::difftracker::ip::parse_ip;
use clb_core::difftracker::quote;
use clb_core::difftracker::view::ServiceView;
use clb_core::dispatch::ErrorRecord;

/// Entries of each `PendingDiff` list when the query leaves the limit to the server.
pub const DEFAULT_DIFF_LIMIT: usize = 1000;

/// Implements `clb.v1.Admin` on the shared [`StateServer`]. Never changes anything.
#[derive(Debug, Clone)]
pub struct AdminService {
    state: Arc<StateServer>,
}

impl AdminService {
    /// An Admin service reading the gateways of `state`.
    pub fn new(state: Arc<StateServer>) -> Self {
        Self { state }
    }

    /// The service wrapped for a tonic server.
    pub fn into_server(self) -> AdminServer<Self> {
        AdminServer::new(self)
    }
}

/// Adds a gateway's writers (and the expected writers it still waits for) to the server-wide
/// table: counts are summed over gateways, the latest resync wins.
fn merge_writers(g: &Gateway, writers: &mut BTreeMap<String, WriterStatus>) {
    let pending = g.pending_writers();
    for writer in &pending {
        writers
            .entry(writer.clone())
            .or_insert_with(|| WriterStatus {
                writer: writer.clone(),
                ..WriterStatus::default()
            });
    }
    for (writer, record) in g.writers() {
        let w = writers
            .entry(writer.clone())
            .or_insert_with(|| WriterStatus {
                writer: writer.clone(),
                ..WriterStatus::default()
            });
        w.updates_applied += record.updates_applied;
        w.items_rejected += record.items_rejected;
        if let Some(at) = record.last_resync_unix_ms {
            w.last_resync_unix_ms = w.last_resync_unix_ms.max(at);
        }
    }
}

impl AdminService {
    #[tracing::instrument(name = "Admin.Status", skip_all)]
    fn status(&self) -> StatusResponse {
        let now = Instant::now();
        let mut gateways = Vec::new();
        let mut writers = BTreeMap::new();
        for handle in self.state.gateways() {
            let g = handle.lock();
            gateways.push(gateway_status(&g, now, &|session| {
                self.state.worker_id(session)
            }));
            merge_writers(&g, &mut writers);
        }
        let workers = self
            .state
            .workers()
            .into_iter()
            .map(worker_status)
            .collect();
        StatusResponse {
            server_id: self.state.config().server_id.clone(),
            gateways,
            workers,
            writers: writers.into_values().collect(),
        }
    }

    #[tracing::instrument(name = "Admin.GetLocation", skip_all, fields(gateway = %q.gateway, location = %q.location))]
    fn get_location(&self, q: &LocationQuery) -> Result<LocationState, Status> {
        let ip = parse_ip("location", &q.location)
            .map_err(|e| invalid_argument(&e.field, &e.value, &e.reason.to_string()))?;
        let handle = self
            .state
            .gateway(&q.gateway)
            .map_err(|e| unknown_gateway(&e))?;
        let g = handle.lock();
        let view = g.tracker().location_view(ip).ok_or_else(|| {
            Status::not_found(format!(
                "location {ip} is neither desired nor in NRP in gateway {}",
                quote(g.name())
            ))
        })?;
        Ok(location_state(g.name(), &view))
    }

    #[tracing::instrument(name = "Admin.GetService", skip_all, fields(gateway = %q.gateway, id = %q.id))]
    fn get_service(&self, q: &ServiceQuery) -> Result<ServiceState, Status> {
        normalize_identity("id", &q.id)
            .map_err(|e| invalid_argument(&e.field, &e.value, &e.reason.to_string()))?;
        let handle = self
            .state
            .gateway(&q.gateway)
            .map_err(|e| unknown_gateway(&e))?;
        let g = handle.lock();
        let view = g.tracker().service_view(&q.id).ok_or_else(|| {
            Status::not_found(format!(
                "service {} is unknown in gateway {}",
                quote(&q.id),
                quote(g.name())
            ))
        })?;
        let mut state = service_state(&g, &view);
        state.condition = Some(service_condition(&g, &view, &state.frontend_ip));
        Ok(state)
    }

    #[tracing::instrument(name = "Admin.PendingDiff", skip_all, fields(gateway = %q.gateway, limit = q.limit))]
    fn pending_diff(&self, q: &DiffQuery) -> Result<PendingDiffResponse, Status> {
        let limit = match q.limit {
            0 => DEFAULT_DIFF_LIMIT,
            n => n as usize,
        };
        let handle = self
            .state
            .gateway(&q.gateway)
            .map_err(|e| unknown_gateway(&e))?;
        let g = handle.lock();
        let diff = g.tracker().pending_diff();
        let truncated = diff.services.len() > limit || diff.locations.len() > limit;
        Ok(PendingDiffResponse {
            gateway: g.name().to_owned(),
            revision: g.tracker().revision(),
            services: diff
                .services
                .iter()
                .take(limit)
                .map(|s| service_change(s, Vec::new()))
                .collect(),
            locations: diff
                .locations
                .iter()
                .take(limit)
                .map(location_change)
                .collect(),
            truncated,
        })
    }
}

/// A failure of the service itself (`location` None) or of a location that carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Failure<'a> {
    location: Option<IpAddr>,
    error: &'a ErrorRecord,
}

/// A removal concerning the service that the restart gate holds back.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HeldBack {
    /// `None`: the service's deletion; `Some(l)`: an address at `l` that must stop referring to it.
    location: Option<IpAddr>,
    /// The gate's reason label (`HoldReason::label`).
    reason: &'static str,
    /// The writer waited for, if the reason names one.
    writer: Option<String>,
}

/// What the condition of one service is derived from (gathered under the gateway's lock).
#[derive(Debug, Clone, PartialEq, Eq)]
struct ConditionFacts<'a> {
    /// An inbound service (only those have a frontend IP).
    inbound: bool,
    desired: bool,
    actual: bool,
    frontend_ip: &'a str,
    desired_addresses: u32,
    actual_addresses: u32,
    /// A change of the service waits (dirty, queued, in flight).
    pending: bool,
    parked: Option<Failure<'a>>,
    failing: Option<Failure<'a>>,
    held: Option<HeldBack>,
}

/// The codes that mean "throttled" (docs/errors.md): `TooManyRequests` and another operation
/// holding the resource. A 429 with another code is reported as retrying: the error record keeps
/// the code, not the HTTP status.
fn throttled(code: &str) -> bool {
    matches!(code, "TooManyRequests" | "AnotherOperationInProgress")
}

fn at(location: Option<IpAddr>) -> String {
    location.map_or_else(
        || "its load balancer".to_owned(),
        |l| format!("location {l}"),
    )
}

/// The condition of a service from its facts: the first of rejected, throttled/retrying, held
/// back, pending that applies, else programmed (or removed).
fn derive_condition(f: &ConditionFacts<'_>) -> ServiceCondition {
    let failure = |reason: ProgrammingReason, what: &str, x: &Failure<'_>| ServiceCondition {
        reason: reason as i32,
        message: format!(
            "{what} ({}): {} {}: {}",
            at(x.location),
            if x.location.is_some() { "at" } else { "for" },
            x.error.code,
            x.error.message
        ),
        error_code: x.error.code.clone(),
        error_message: x.error.message.clone(),
        location: x.location.map(|l| l.to_string()).unwrap_or_default(),
        error_at_unix_ms: x.error.at_unix_ms,
        ..ServiceCondition::default()
    };
    if let Some(x) = &f.parked {
        return failure(
            ProgrammingReason::Rejected,
            "Azure rejected the change; it is parked until the Service changes",
            x,
        );
    }
    if let Some(x) = &f.failing {
        return if throttled(&x.error.code) {
            failure(
                ProgrammingReason::Throttled,
                "throttled by Azure, retrying",
                x,
            )
        } else {
            failure(
                ProgrammingReason::Retrying,
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
        return ServiceCondition {
            reason: ProgrammingReason::HeldBack as i32,
            message: format!("the restart gate holds back {what} {why}"),
            location: h.location.map(|l| l.to_string()).unwrap_or_default(),
            held_for: h.reason.to_owned(),
            held_for_writer: h.writer.clone().unwrap_or_default(),
            ..ServiceCondition::default()
        };
    }
    let simple = |reason: ProgrammingReason, message: String| ServiceCondition {
        reason: reason as i32,
        message,
        ..ServiceCondition::default()
    };
    match (f.desired, f.actual) {
        (false, false) => simple(
            ProgrammingReason::Removed,
            "not desired; NRP does not have it".to_owned(),
        ),
        (false, true) => simple(
            ProgrammingReason::Pending,
            "being removed from NRP".to_owned(),
        ),
        (true, false) => simple(
            ProgrammingReason::Pending,
            "waiting for NRP to create its load balancer".to_owned(),
        ),
        (true, true) if f.inbound && f.frontend_ip.is_empty() => simple(
            ProgrammingReason::Pending,
            "NRP has the load balancer; its frontend IP is not known yet".to_owned(),
        ),
        (true, true) if f.pending || f.desired_addresses != f.actual_addresses => simple(
            ProgrammingReason::Pending,
            format!(
                "{} of {} backends programmed, the rest is being sent",
                f.actual_addresses, f.desired_addresses
            ),
        ),
        (true, true) => simple(
            ProgrammingReason::Programmed,
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
fn carries(g: &Gateway, location: IpAddr, name: &str) -> bool {
    g.tracker().location_view(location).is_some_and(|v| {
        v.addresses.iter().any(|a| {
            a.desired.iter().flatten().any(|s| s == name)
                || a.actual.iter().flatten().any(|s| s == name)
        })
    })
}

/// Whether `location` holds, only because removals are withheld there, an address NRP has with
/// `name` that is not desired with it.
fn held_at(g: &Gateway, location: IpAddr, name: &str) -> bool {
    if !g.tracker().location_removals_withheld(location) {
        return false;
    }
    g.tracker().location_view(location).is_some_and(|v| {
        v.addresses.iter().any(|a| {
            a.actual.iter().flatten().any(|s| s == name)
                && !a.desired.iter().flatten().any(|s| s == name)
        })
    })
}

/// The hold of the restart gate that covers `location` (`None`: every location).
fn hold_for(g: &Gateway, location: Option<IpAddr>) -> Option<HeldBack> {
    g.gate()
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
/// last failures, pending changes) and the restart gate. Costs O(parked + failing locations) plus,
/// while removals are withheld, O(withheld locations' addresses).
fn condition_facts<'a>(
    g: &'a Gateway,
    view: &ServiceView,
    frontend_ip: &'a str,
) -> ConditionFacts<'a> {
    let name = view.name.as_str();
    let first_location = |it: &mut dyn Iterator<Item = (IpAddr, &'a ErrorRecord)>| {
        let mut hits: Vec<(IpAddr, &'a ErrorRecord)> =
            it.filter(|(l, _)| carries(g, *l, name)).collect();
        hits.sort_by_key(|(l, _)| *l);
        hits.into_iter().next().map(|(l, error)| Failure {
            location: Some(l),
            error,
        })
    };
    let parked = match g.dispatch().parked_service(name) {
        Some(error) => Some(Failure {
            location: None,
            error,
        }),
        None => first_location(&mut g.dispatch().parked_locations()),
    };
    let failing = match g.dispatch().failing_service(name) {
        Some(error) => Some(Failure {
            location: None,
            error,
        }),
        None => first_location(&mut g.dispatch().failing_locations()),
    };
    let held = if g.tracker().withheld().is_nothing() {
        None
    } else if !view.desired && view.actual && g.tracker().withheld().deletions_of(view.kind) {
        hold_for(g, None)
    } else {
        g.tracker()
            .withheld_removals()
            .into_iter()
            .map(|(l, _)| l)
            .find(|l| held_at(g, *l, name))
            .and_then(|l| hold_for(g, Some(l)))
    };
    ConditionFacts {
        inbound: view.kind == ServiceKind::Inbound,
        desired: view.desired,
        actual: view.actual,
        frontend_ip,
        desired_addresses: view.desired_addresses,
        actual_addresses: view.actual_addresses,
        pending: g.tracker().is_service_dirty(name) || g.dispatch().service_pending(name),
        parked,
        failing,
        held,
    }
}

/// The programming condition of a service (`ServiceState.condition`).
pub(crate) fn service_condition(
    g: &Gateway,
    view: &ServiceView,
    frontend_ip: &str,
) -> ServiceCondition {
    derive_condition(&condition_facts(g, view, frontend_ip))
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        super::require_leader(&self.state)?;
        Ok(Response::new(AdminService::status(self)))
    }

    async fn get_location(
        &self,
        request: Request<LocationQuery>,
    ) -> Result<Response<LocationState>, Status> {
        super::require_leader(&self.state)?;
        AdminService::get_location(self, request.get_ref()).map(Response::new)
    }

    async fn get_service(
        &self,
        request: Request<ServiceQuery>,
    ) -> Result<Response<ServiceState>, Status> {
        super::require_leader(&self.state)?;
        AdminService::get_service(self, request.get_ref()).map(Response::new)
    }

    async fn pending_diff(
        &self,
        request: Request<DiffQuery>,
    ) -> Result<Response<PendingDiffResponse>, Status> {
        super::require_leader(&self.state)?;
        AdminService::pending_diff(self, request.get_ref()).map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ServerConfig;
    use clb_core::difftracker::{Endpoint, Operation};
    use clb_core::dispatch::{Outcome, Report, UnitWork};
    use std::time::Duration;

    fn record(code: &str) -> ErrorRecord {
        ErrorRecord {
            at_unix_ms: 1_700_000_000_000,
            work_id: 7,
            worker: 1,
            unit: "locations 10.0.0.1".into(),
            code: code.into(),
            message: format!("{code} happened"),
            terminal: false,
        }
    }

    fn facts(desired: bool, actual: bool, ip: &str) -> ConditionFacts<'_> {
        ConditionFacts {
            inbound: true,
            desired,
            actual,
            frontend_ip: ip,
            desired_addresses: 2,
            actual_addresses: 2,
            pending: false,
            parked: None,
            failing: None,
            held: None,
        }
    }

    fn reason(c: &ServiceCondition) -> ProgrammingReason {
        ProgrammingReason::try_from(c.reason).unwrap()
    }

    #[test]
    fn the_condition_follows_the_desired_and_actual_state() {
        let c = derive_condition(&facts(true, true, "20.0.0.1"));
        assert_eq!(reason(&c), ProgrammingReason::Programmed);
        assert!(c.message.contains("20.0.0.1"), "{}", c.message);
        assert!(c.error_code.is_empty());
        for f in [
            facts(true, false, ""),
            facts(true, true, ""),
            facts(false, true, "20.0.0.1"),
            ConditionFacts {
                pending: true,
                ..facts(true, true, "20.0.0.1")
            },
            ConditionFacts {
                actual_addresses: 1,
                ..facts(true, true, "20.0.0.1")
            },
        ] {
            assert_eq!(
                reason(&derive_condition(&f)),
                ProgrammingReason::Pending,
                "{f:?}"
            );
        }
        assert_eq!(
            reason(&derive_condition(&facts(false, false, ""))),
            ProgrammingReason::Removed
        );
        // An egress has no frontend IP and is programmed without one.
        let egress = ConditionFacts {
            inbound: false,
            ..facts(true, true, "")
        };
        assert_eq!(
            reason(&derive_condition(&egress)),
            ProgrammingReason::Programmed
        );
    }

    #[test]
    fn failures_come_first_rejected_before_retrying_before_held_back() {
        let parked = record("InvalidResourceName");
        let throttled = record("TooManyRequests");
        let other = record("InternalServerError");
        let l: IpAddr = "10.0.0.1".parse().unwrap();
        let held = HeldBack {
            location: Some(l),
            reason: "pod_writer",
            writer: Some("node-agent/a".into()),
        };
        let all = ConditionFacts {
            parked: Some(Failure {
                location: None,
                error: &parked,
            }),
            failing: Some(Failure {
                location: Some(l),
                error: &throttled,
            }),
            held: Some(held.clone()),
            pending: true,
            ..facts(true, true, "20.0.0.1")
        };
        let c = derive_condition(&all);
        assert_eq!(reason(&c), ProgrammingReason::Rejected);
        assert_eq!(c.error_code, "InvalidResourceName");
        assert_eq!(c.error_message, "InvalidResourceName happened");
        assert_eq!(c.error_at_unix_ms, 1_700_000_000_000);
        assert!(c.location.is_empty());
        assert!(c.message.contains("InvalidResourceName"), "{}", c.message);

        let c = derive_condition(&ConditionFacts {
            parked: None,
            ..all.clone()
        });
        assert_eq!(reason(&c), ProgrammingReason::Throttled);
        assert_eq!(c.error_code, "TooManyRequests");
        assert_eq!(c.location, "10.0.0.1");

        let c = derive_condition(&ConditionFacts {
            parked: None,
            failing: Some(Failure {
                location: None,
                error: &other,
            }),
            ..all.clone()
        });
        assert_eq!(reason(&c), ProgrammingReason::Retrying);
        assert_eq!(c.error_code, "InternalServerError");

        let c = derive_condition(&ConditionFacts {
            parked: None,
            failing: None,
            ..all.clone()
        });
        assert_eq!(reason(&c), ProgrammingReason::HeldBack);
        assert_eq!(c.held_for, "pod_writer");
        assert_eq!(c.held_for_writer, "node-agent/a");
        assert_eq!(c.location, "10.0.0.1");
        assert!(c.message.contains("node-agent/a"), "{}", c.message);
    }

    /// The facts are gathered from the dispatcher and the gate of a real gateway: a throttled
    /// creation, then one NRP rejects for good, and removals held back by the restart gate.
    #[test]
    fn the_condition_is_gathered_from_the_dispatcher_and_the_gate() {
        let state = StateServer::new(ServerConfig::default());
        let handle = state.gateway("").unwrap();
        let mut guard = handle.lock();
        let g = &mut *guard;
        let svc = "3b0c0d4e-0000-4000-8000-00000000000a";
        g.tracker_mut().update_service(Operation::Add, svc).unwrap();
        g.tracker_mut()
            .set_endpoints(
                svc,
                &[Endpoint {
                    address: "10.1.0.1",
                    location: "10.0.0.1",
                }],
            )
            .unwrap();
        let condition = |g: &Gateway| {
            let view = g.tracker().service_view(svc).unwrap();
            service_condition(g, &view, "")
        };
        // Nothing read back, nothing sent yet.
        assert_eq!(reason(&condition(g)), ProgrammingReason::Pending);

        // NRP has a load balancer nobody wants any more.
        let old = "3b0c0d4e-0000-4000-8000-0000000000ff";
        let mut snapshot = clb_core::difftracker::ActualSnapshot::default();
        snapshot.load_balancers.push(old.into());
        let mut now = Instant::now();
        let observe = g.lease(1, 1, now).unwrap().unit;
        assert_eq!(observe.work, UnitWork::Observe);
        g.take_report(
            1,
            Report {
                work_id: 1,
                applied: vec![],
                progress: vec![],
                outcome: Outcome::Observed {
                    snapshot,
                    last: true,
                },
            },
            Default::default(),
            now,
        );
        g.update_gates(now);
        let fail = |g: &mut Gateway, id: u64, now: Instant, outcome: Outcome| {
            let unit = g.lease(1, id, now).unwrap().unit;
            assert!(
                matches!(unit.work, UnitWork::Services(_)),
                "{:?}",
                unit.work
            );
            g.take_report(
                1,
                Report {
                    work_id: id,
                    applied: vec![],
                    progress: vec![],
                    outcome,
                },
                Default::default(),
                now,
            );
        };
        fail(
            g,
            2,
            now,
            Outcome::Retryable {
                retry_after: Duration::from_millis(1),
                code: "TooManyRequests".into(),
                message: "slow down".into(),
            },
        );
        let c = condition(g);
        assert_eq!(reason(&c), ProgrammingReason::Throttled, "{c:?}");
        assert_eq!(c.error_code, "TooManyRequests");
        assert_eq!(c.error_message, "slow down");

        now += Duration::from_secs(60);
        fail(
            g,
            3,
            now,
            Outcome::Terminal {
                code: "InvalidResourceName".into(),
                message: "resource name is invalid".into(),
            },
        );
        let c = condition(g);
        assert_eq!(reason(&c), ProgrammingReason::Rejected, "{c:?}");
        assert_eq!(c.error_code, "InvalidResourceName");
        assert!(c.location.is_empty());

        // While the gate waits for the cluster view, the deletion of the unwanted one is held back.
        let view = g.tracker().service_view(old).unwrap();
        let c = service_condition(g, &view, "");
        assert_eq!(reason(&c), ProgrammingReason::HeldBack, "{c:?}");
        assert_eq!(c.held_for, "cluster_view");
        assert!(c.location.is_empty());
    }
}
