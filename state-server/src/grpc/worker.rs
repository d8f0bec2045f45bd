//! The Worker service: one bidirectional `Sync` stream per sync worker. The gateways' tasks push
//! leased work units while the worker has room ([`crate::state::push`]); the session folds its reports
//! back; when the stream ends, for whatever reason, the worker's units are released at once.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime};

use clb_core::gateway::Leased;
use clb_proto::v1;
use clb_proto::v1::worker_server::Worker;
use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{Instrument, Span, debug, info, info_span, warn};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::convert::unit_to_proto;
use super::convert::{frontends_from_proto, report_from_proto, rules_from_proto};
use crate::state::push::{UnitSink, WorkerPort};
use crate::state::{GatewayHandle, StateServer, WorkerInfo, unix_ms};
use clb_core::gateway::{Folded, ReportExtras};

/// Serves `clb.v1.Worker`.
#[derive(Debug, Clone)]
pub struct WorkerService {
    state: Arc<StateServer>,
    sessions: Arc<AtomicU64>,
    shutdown: tokio::sync::watch::Receiver<bool>,
}

impl WorkerService {
    /// A service over the shared state; sessions end when `shutdown` turns true.
    pub fn new(state: Arc<StateServer>, shutdown: tokio::sync::watch::Receiver<bool>) -> Self {
        state.start_tasks();
        Self {
            state,
            sessions: Arc::new(AtomicU64::new(1)),
            shutdown,
        }
    }
}

type SyncStream = Pin<Box<dyn Stream<Item = Result<v1::ServerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl Worker for WorkerService {
    type SyncStream = SyncStream;

    async fn sync(
        &self,
        request: Request<Streaming<v1::WorkerMessage>>,
    ) -> Result<Response<SyncStream>, Status> {
        super::require_leader(&self.state)?;
        let caller = crate::auth::Caller::of(request.extensions()).cloned();
        let mut inbound = request.into_inner();
        let hello = match inbound.message().await?.and_then(|m| m.kind) {
            Some(v1::worker_message::Kind::Hello(h)) => h,
            _ => {
                return Err(Status::invalid_argument(
                    "the first message of Sync must be a hello",
                ));
            }
        };
        if hello.worker_id.is_empty() {
            return Err(Status::invalid_argument(
                "hello.worker_id: must not be empty",
            ));
        }
        if hello.capacity == 0 {
            return Err(Status::invalid_argument(
                "hello.capacity = 0: must be at least 1",
            ));
        }
        let gateways: Vec<Arc<GatewayHandle>> = if hello.gateways.is_empty() {
            self.state.gateways().to_vec()
        } else {
            hello
                .gateways
                .iter()
                .map(|g| {
                    self.state
                        .gateway(g)
                        .map_err(|e| Status::not_found(format!("hello.gateways: {e}")))
                })
                .collect::<Result<_, _>>()?
        };
        if let Some(caller) = &caller {
            for g in &gateways {
                caller.require(crate::auth::Verb::Work, g.name()).await?;
            }
        }
        let session = self.sessions.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        let welcome = v1::ServerMessage {
            kind: Some(v1::server_message::Kind::Welcome(v1::Welcome {
                server_id: self.state.config().server_id.clone(),
                lease_duration_ms: self.state.lease_duration().as_millis() as u64,
            })),
        };
        tx.send(Ok(welcome))
            .map_err(|_| Status::cancelled("worker went away"))?;
        self.state.set_worker(
            session,
            Some(WorkerInfo {
                session,
                worker_id: hello.worker_id.clone(),
                capacity: hello.capacity,
                gateways: gateways.iter().map(|g| g.name().to_owned()).collect(),
                units_in_flight: 0,
                connected_at_unix_ms: unix_ms(SystemTime::now()),
                last_report_unix_ms: 0,
                last_unit_unix_ms: 0,
                lease_expiries: 0,
                expiries_since_report: 0,
            }),
        );
        let span = info_span!("worker_session", session, worker_id = %hello.worker_id);
        let port = Arc::new(WorkerPort::new(
            session,
            hello.capacity as usize,
            gateways,
            Box::new(StreamSink {
                outbox: tx.clone(),
                metrics: self.state.metrics().clone(),
            }),
        ));
        let run = Session {
            state: self.state.clone(),
            port,
            tx,
            shutdown: self.shutdown.clone(),
        };
        tokio::spawn(run.run(inbound).instrument(span));
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
    }
}

/// What a session sends its worker.
type Outbox = mpsc::UnboundedSender<Result<v1::ServerMessage, Status>>;

/// The `Sync` stream as the gateway tasks' sink: a unit goes out as `ServerMessage::Unit`, in its
/// own `work_unit` span (linked to the writer spans whose changes it carries, its context in
/// `WorkUnit.trace_context`).
#[derive(Debug)]
struct StreamSink {
    outbox: Outbox,
    metrics: Arc<crate::metrics::Metrics>,
}

impl UnitSink for StreamSink {
    fn send(
        &self,
        gateway: &str,
        leased: Leased,
        families: Vec<Option<clb_core::difftracker::IpFamily>>,
        links: Vec<clb_telemetry::SpanLink>,
    ) -> Span {
        let mut unit = unit_to_proto(gateway, leased, &families);
        debug!(work_id = unit.work_id, gateway = %unit.gateway, "unit leased");
        self.metrics.unit_leased(unit_kind(&unit));
        let span = unit_span(&unit);
        clb_telemetry::add_links(&span, links);
        unit.trace_context = clb_telemetry::inject_map(&span.context());
        let msg = v1::ServerMessage {
            kind: Some(v1::server_message::Kind::Unit(unit)),
        };
        // A session that ended dropped its receiver; its units are released by the session's end.
        let _ = self.outbox.send(Ok(msg));
        span
    }
}

/// The server-side span of one unit, a trace root: it lasts until the unit's final report (or the
/// end of the session) and records the outcome.
fn unit_span(unit: &v1::WorkUnit) -> Span {
    let kind = unit_kind(unit);
    info_span!(
        parent: None,
        "work_unit",
        work_id = unit.work_id,
        gateway = %unit.gateway,
        kind,
        attempt = unit.attempt,
        outcome = tracing::field::Empty,
    )
}

/// The kind of a unit: `observe`, `services` or `locations`.
fn unit_kind(unit: &v1::WorkUnit) -> &'static str {
    match &unit.work {
        Some(v1::work_unit::Work::Observe(_)) => "observe",
        Some(v1::work_unit::Work::Services(_)) => "services",
        Some(v1::work_unit::Work::Locations(_)) => "locations",
        None => "none",
    }
}

/// One connected worker: the gateway tasks push its units ([`crate::state::push`]); the session folds
/// its reports and releases its units when it ends.
struct Session {
    state: Arc<StateServer>,
    port: Arc<WorkerPort>,
    tx: Outbox,
    shutdown: tokio::sync::watch::Receiver<bool>,
}

impl Session {
    async fn run(self, mut inbound: Streaming<v1::WorkerMessage>) {
        info!("worker connected");
        let state = self.state.clone();
        let mut shutdown = self.shutdown.clone();
        let tx = self.tx.clone();
        let mut leadership = state.leadership();
        state.ports().add(self.port.clone());
        loop {
            if !state.is_leader() {
                // Stepped down: the stream ends, the worker reconnects (to the new leader).
                let _ = tx.send(Err(Status::unavailable(
                    "this state server replica lost the leader lease: reconnect",
                )));
                break;
            }
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(v1::WorkerMessage { kind: Some(v1::worker_message::Kind::Report(r)) })) => self.report(r),
                    Ok(Some(_)) => debug!("ignoring a message that is not a report"),
                    Ok(None) => break,
                    Err(status) => {
                        debug!(%status, "worker stream failed");
                        break;
                    }
                },
                _ = tx.closed() => break,
                _ = shutdown.changed() => break,
                _ = leadership.changed() => {}
            }
        }
        // Disconnect: the worker's units go back at once, to be cut for another worker.
        let session = self.port.session();
        // Closed first: a gateway task that took the port's handle before it was removed leases
        // nothing to it once this is set, and anything it leased before is released below (under
        // the same gateway lock).
        self.port.close();
        state.ports().remove(session);
        let mut released = 0;
        for g in self.port.gateways() {
            released += g.lock().release_worker(session, Instant::now());
            g.changed();
        }
        state.set_worker(session, None);
        self.port.drain();
        info!(released, "worker disconnected");
    }

    fn report(&self, report: v1::Report) {
        let work_id = report.work_id;
        let now = unix_ms(SystemTime::now());
        let session = self.port.session();
        self.state.update_worker(session, |info| {
            info.last_report_unix_ms = now;
            info.expiries_since_report = 0;
        });
        let partial = matches!(&report.outcome, Some(v1::report::Outcome::Observed(o)) if !o.last);
        let Some((gateway, span)) = self.port.answer(work_id, !partial) else {
            warn!(
                work_id,
                "report for a unit this worker does not hold (late or unknown): ignored"
            );
            if let Some(g) = self.port.gateways().first() {
                g.lock().count_late_report();
            }
            return;
        };
        if let Some(span) = &span {
            span.record("outcome", report_outcome(&report));
        }
        let remaining_writes = report.remaining_subscription_writes;
        let frontends = frontends_from_proto(&report);
        let rules = rules_from_proto(&report);
        let missing_nat_gateways = missing_nat_gateways_from_proto(&report);
        let report = report_from_proto(report);
        self.port.reported();
        let folded = {
            let mut gw = gateway.lock();
            let extras = ReportExtras {
                frontends,
                rules,
                missing_nat_gateways,
            };
            let folded = gw.fold_report(session, report, extras, remaining_writes, Instant::now());
            gw.log_gate_notes();
            folded
        };
        if folded == Folded::Late {
            warn!(
                work_id,
                "report for a unit whose lease ended (late): ignored"
            );
        }
        gateway.changed();
        if span.is_some() {
            // A slot is free: the worker's other gateways may have work waiting for it.
            for g in self.port.gateways() {
                if !Arc::ptr_eq(g, &gateway) {
                    g.wake();
                }
            }
        }
    }
}

/// The outbound services an observe's part found without their brought NAT gateway, canonical; a
/// name that is not an identity is left out with a warning (the field, the value quoted, why).
fn missing_nat_gateways_from_proto(r: &v1::Report) -> Vec<String> {
    let Some(v1::report::Outcome::Observed(o)) = &r.outcome else {
        return Vec::new();
    };
    o.snapshot
        .iter()
        .flat_map(|s| s.missing_nat_gateways.iter().enumerate())
        .filter_map(|(i, n)| {
            let field = format!("observed.snapshot.missing_nat_gateways[{i}]");
            match clb_core::difftracker::identity::normalize_identity(&field, n) {
                Ok(n) => Some(n.into_owned()),
                Err(e) => {
                    warn!(
                        work_id = r.work_id,
                        "observe with a malformed egress name: ignored it: {e}"
                    );
                    None
                }
            }
        })
        .collect()
}

/// The name of a report's outcome, as recorded on the unit's span.
fn report_outcome(report: &v1::Report) -> &'static str {
    match &report.outcome {
        Some(v1::report::Outcome::Applied(_)) => "applied",
        Some(v1::report::Outcome::Retryable(_)) => "retryable",
        Some(v1::report::Outcome::Repair(_)) => "repair",
        Some(v1::report::Outcome::Terminal(_)) => "terminal",
        Some(v1::report::Outcome::Observed(_)) => "observed",
        None => "invalid",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_nat_gateways_are_canonical_and_a_malformed_name_is_left_out() {
        let report = |names: &[&str]| v1::Report {
            work_id: 7,
            outcome: Some(v1::report::Outcome::Observed(v1::Observed {
                snapshot: Some(v1::NrpSnapshot {
                    missing_nat_gateways: names.iter().map(|n| (*n).to_owned()).collect(),
                    ..v1::NrpSnapshot::default()
                }),
                last: true,
            })),
            ..v1::Report::default()
        };
        assert_eq!(
            missing_nat_gateways_from_proto(&report(&["Crawler", "bad name", "eg-2"])),
            ["crawler", "eg-2"]
        );
        let applied = v1::Report {
            outcome: Some(v1::report::Outcome::Applied(v1::Applied::default())),
            ..v1::Report::default()
        };
        assert!(missing_nat_gateways_from_proto(&applied).is_empty());
    }
}
