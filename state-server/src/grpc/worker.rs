//! The Worker service: one bidirectional `Sync` stream per sync worker. The server pushes leased
//! work units while the worker has capacity and folds its reports back; when the stream ends, for
//! whatever reason, the worker's units are released at once.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use clb_proto::v1;
use clb_proto::v1::worker_server::Worker;
use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{Instrument, Span, debug, info, info_span, warn};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::convert::{frontends_from_proto, report_from_proto, rules_from_proto, unit_to_proto};
use crate::state::{GatewayHandle, StateServer, WorkerInfo, unix_ms};

/// How often an idle session looks for work whose backoff has ended.
const IDLE_POLL: Duration = Duration::from_millis(50);

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
        let (tx, rx) = mpsc::channel(hello.capacity as usize + 2);
        let welcome = v1::ServerMessage {
            kind: Some(v1::server_message::Kind::Welcome(v1::Welcome {
                server_id: self.state.config().server_id.clone(),
                lease_duration_ms: self.state.lease_duration().as_millis() as u64,
            })),
        };
        tx.send(Ok(welcome))
            .await
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
        let run = Session {
            state: self.state.clone(),
            session,
            capacity: hello.capacity as usize,
            gateways,
            tx,
            shutdown: self.shutdown.clone(),
            next_gateway: 0,
            outstanding: HashMap::new(),
        };
        tokio::spawn(run.run(inbound).instrument(span));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// One connected worker.
struct Session {
    state: Arc<StateServer>,
    session: u64,
    capacity: usize,
    gateways: Vec<Arc<GatewayHandle>>,
    tx: mpsc::Sender<Result<v1::ServerMessage, Status>>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    next_gateway: usize,
    /// Units sent and not yet answered, with their `work_unit` spans and the index of their gateway
    /// in `gateways`. A unit whose lease expired still occupies the worker until it answers: a hung
    /// worker is not handed more work.
    outstanding: HashMap<u64, (Span, usize)>,
}

impl Session {
    async fn run(mut self, mut inbound: Streaming<v1::WorkerMessage>) {
        info!("worker connected");
        let state = self.state.clone();
        let mut shutdown = self.shutdown.clone();
        let tx = self.tx.clone();
        let mut leadership = state.leadership();
        loop {
            if !state.is_leader() {
                // Stepped down: the stream ends, the worker reconnects (to the new leader).
                let _ = tx.try_send(Err(Status::unavailable(
                    "this state server replica lost the leader lease: reconnect",
                )));
                break;
            }
            let notified = state.work_notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.fill().await.is_err() {
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
                _ = &mut notified => {}
                _ = tokio::time::sleep(IDLE_POLL) => {}
                _ = tx.closed() => break,
                _ = shutdown.changed() => break,
                _ = leadership.changed() => {}
            }
        }
        // Disconnect: the worker's units go back at once, to be cut for another worker.
        let mut released = 0;
        for g in &self.gateways {
            released += g
                .lock()
                .dispatch
                .release_worker(self.session, Instant::now());
        }
        self.state.set_worker(self.session, None);
        self.state.notify_work();
        for (_, (span, _)) in self.outstanding.drain() {
            span.record("outcome", "released");
        }
        info!(released, "worker disconnected");
    }

    /// Sends units while the worker has capacity and some gateway has work.
    async fn fill(&mut self) -> Result<(), ()> {
        let mut leased = false;
        while self.outstanding.len() < self.capacity {
            let Some((mut unit, links, gateway)) = self.cut() else {
                break;
            };
            debug!(work_id = unit.work_id, gateway = %unit.gateway, "unit leased");
            self.state.metrics().unit_leased(unit_kind(&unit));
            let span = unit_span(&unit);
            clb_telemetry::add_links(&span, links);
            unit.trace_context = clb_telemetry::inject_map(&span.context());
            self.outstanding.insert(unit.work_id, (span, gateway));
            let msg = v1::ServerMessage {
                kind: Some(v1::server_message::Kind::Unit(unit)),
            };
            if self.tx.send(Ok(msg)).await.is_err() {
                return Err(());
            }
            leased = true;
        }
        self.update_info(self.outstanding.len(), leased);
        Ok(())
    }

    /// Whether the worker's next slot may go to the gateway at `index`: a gateway holds at most its
    /// share of the worker's capacity (capacity / gateways, at least 1) unless more slots are free
    /// than other gateways without any unit on this worker. So a region that hangs (its units held
    /// until their leases end) never takes every slot: each other gateway keeps one.
    fn may_take(&self, index: usize) -> bool {
        let n = self.gateways.len();
        if n <= 1 {
            return true;
        }
        let mut held = vec![0usize; n];
        for (_, g) in self.outstanding.values() {
            held[*g] += 1;
        }
        let share = (self.capacity / n).max(1);
        let free = self.capacity.saturating_sub(self.outstanding.len());
        let others_without = (0..n).filter(|&i| i != index && held[i] == 0).count();
        held[index] < share || free > others_without
    }

    /// Cuts one unit from the next gateway (round robin) that has work and may take a slot
    /// ([`Session::may_take`]). Also returns the links to the writer spans whose changes the unit
    /// carries, and the gateway's index.
    fn cut(&mut self) -> Option<(v1::WorkUnit, Vec<clb_telemetry::SpanLink>, usize)> {
        for i in 0..self.gateways.len() {
            let index = (self.next_gateway + i) % self.gateways.len();
            if !self.may_take(index) {
                continue;
            }
            let g = &self.gateways[index];
            let mut gw = g.lock();
            // Checked under the gateway lock: a replica that stepped down cuts nothing more.
            if !self.state.is_leader() {
                return None;
            }
            let work_id = self.state.next_work_id();
            let gw = &mut *gw;
            if let Some(unit) =
                gw.dispatch
                    .next_unit(&mut gw.tracker, self.session, work_id, Instant::now())
            {
                self.next_gateway = (self.next_gateway + i + 1) % self.gateways.len();
                let links = gw.trace_links.take(&unit.work);
                return Some((unit_to_proto(gw, unit), links, index));
            }
        }
        None
    }

    fn update_info(&self, units_in_flight: usize, leased: bool) {
        let now = unix_ms(SystemTime::now());
        self.state.update_worker(self.session, |info| {
            info.units_in_flight = units_in_flight as u32;
            if leased {
                info.last_unit_unix_ms = now;
            }
        });
    }

    fn report(&mut self, report: v1::Report) {
        let work_id = report.work_id;
        let now = unix_ms(SystemTime::now());
        self.state.update_worker(self.session, |info| {
            info.last_report_unix_ms = now;
            info.expiries_since_report = 0;
        });
        let partial = matches!(&report.outcome, Some(v1::report::Outcome::Observed(o)) if !o.last);
        if !partial && let Some((span, _)) = self.outstanding.remove(&work_id) {
            span.record("outcome", report_outcome(&report));
        }
        let frontends = frontends_from_proto(&report);
        let rules = rules_from_proto(&report);
        let report = report_from_proto(report);
        for g in &self.gateways {
            let handled = {
                let mut gw = g.lock();
                let held = gw.dispatch.holds(work_id);
                if held {
                    gw.on_report(
                        self.session,
                        report.clone(),
                        frontends.clone(),
                        rules.clone(),
                        Instant::now(),
                    );
                }
                held
            };
            if handled {
                self.state.notify_work();
                return;
            }
        }
        warn!(
            work_id,
            "report for a unit this worker does not hold (late or unknown): ignored"
        );
        if let Some(g) = self.gateways.first() {
            g.lock().dispatch.count_late_report();
        }
    }
}

/// The server-side span of one unit, a trace root: it lasts until the unit's final report (or the
/// end of the session) and records the outcome. Its context travels in `WorkUnit.trace_context`.
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
