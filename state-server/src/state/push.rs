//! Work is pushed, not polled: one task per gateway owns the gateway's timers and hands its units
//! to the worker sessions that have room.
//!
//! A gateway's task sleeps until it is woken ([`GatewayHandle::changed`]: a write, a resync, a
//! report, a worker that joins, leaves or frees a slot) or until the gateway's next deadline (a
//! lease that expires, a backoff or a restart-gate bound that ends, the next anti-entropy
//! observe: [`clb_core::dispatch::Dispatcher::next_deadline`],
//! [`crate::gate::RestartGate::next_deadline`]). Then, under the gateway's lock, it takes back
//! expired leases, lets the restart gate move, cuts units for the sessions that have room (round
//! robin over sessions, each session's slots shared fairly between its gateways: [`WorkerPort`]),
//! sends them, and publishes the gateway's snapshot for the writers' streams
//! ([`crate::state::GatewaySnapshot`]). An idle server has no task awake and takes no lock.
//!
//! A worker session (`grpc/worker.rs`) only registers its [`WorkerPort`], forwards each report to
//! the gateway whose unit it answers (the port knows which), and releases its units when it ends.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use clb_core::difftracker::IpFamily;
use clb_core::dispatch::UnitWork;
use clb_core::gateway::GatewayCore;
use clb_core::gateway::Leased;
use tracing::{Span, info_span, warn};

use super::{GatewayHandle, StateServer, services, unix_ms};

/// The least time between two snapshots of a gateway: a burst of writes and reports costs one
/// snapshot per interval, not one per change.
pub const SNAPSHOT_SPACING: Duration = Duration::from_millis(20);

/// The IP family of each change of a leased services unit, read from `tracker` when the unit is
/// leased: `None` for a change of no stated family (an IPv4 frontend) and for every change that is
/// not an inbound creation (the wire leaves it unspecified there).
fn leased_families(gw: &GatewayCore, leased: &Leased) -> Vec<Option<IpFamily>> {
    match &leased.unit.work {
        UnitWork::Services(changes) => changes.iter().map(|c| gw.service_family(&c.name)).collect(),
        _ => Vec::new(),
    }
}

/// Where a session's units go: the transport (the Worker service's stream) behind a port.
pub trait UnitSink: Send + Sync + std::fmt::Debug {
    /// Sends a unit of `gateway` leased to the worker, with the writer spans its changes came
    /// from; returns the unit's span, kept until the unit's final report (or the session's end).
    /// A worker that went away drops it: its units are released when its session ends.
    /// `families`: the IP family of each change of a services unit, read when it was leased
    /// (`grpc::convert::leased_families`).
    fn send(
        &self,
        gateway: &str,
        leased: Leased,
        families: Vec<Option<IpFamily>>,
        links: Vec<clb_telemetry::SpanLink>,
    ) -> Span;
}

/// A connected worker as the gateway tasks see it: where to send units, how many it may hold, and
/// which it holds (by work id: its `work_unit` span and the index of its gateway in `gateways`).
/// A unit whose lease expired still occupies a slot until the worker answers: a hung worker is
/// not handed more work.
#[derive(Debug)]
pub struct WorkerPort {
    session: u64,
    capacity: usize,
    gateways: Vec<Arc<GatewayHandle>>,
    sink: Box<dyn UnitSink>,
    held: Mutex<HashMap<u64, (Span, usize)>>,
    /// The number of the worker's last report ([`REPORTS`]; 0: none yet).
    last_report: AtomicU64,
    /// Set when the session ends, before it releases its units: a task that sees it unset under a
    /// gateway's lock may lease to the worker (the release, under the same lock, comes after).
    closed: std::sync::atomic::AtomicBool,
}

/// Numbers the reports of every session: which worker answered last.
static REPORTS: AtomicU64 = AtomicU64::new(1);

impl WorkerPort {
    /// A port for session `session`.
    pub fn new(
        session: u64,
        capacity: usize,
        gateways: Vec<Arc<GatewayHandle>>,
        sink: Box<dyn UnitSink>,
    ) -> Self {
        Self {
            session,
            capacity,
            gateways,
            sink,
            held: Mutex::new(HashMap::new()),
            last_report: AtomicU64::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Notes that the worker reported (it is alive).
    pub fn reported(&self) {
        self.last_report
            .store(REPORTS.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
    }

    /// How a gateway task ranks the sessions with room for its next unit: the most free slots
    /// first, then the one that reported last (a live worker before one that has been silent).
    fn rank(&self, index: usize) -> Option<(usize, u64)> {
        let held = self.held();
        let open = !self.closed.load(Ordering::SeqCst);
        (open && self.may_take(&held, index)).then(|| {
            (
                self.capacity - held.len(),
                self.last_report.load(Ordering::Relaxed),
            )
        })
    }

    /// The session id.
    pub fn session(&self) -> u64 {
        self.session
    }

    /// The gateways this worker serves.
    pub fn gateways(&self) -> &[Arc<GatewayHandle>] {
        &self.gateways
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (Span, usize)>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Units the worker holds now.
    pub fn units_held(&self) -> usize {
        self.held().len()
    }

    /// Whether the worker's next slot may go to the gateway at `index`: a gateway holds at most its
    /// share of the worker's capacity (capacity / gateways, at least 1) unless more slots are free
    /// than other gateways without any unit on this worker. So a region that hangs (its units held
    /// until their leases end) never takes every slot: each other gateway keeps one.
    fn may_take(&self, held: &HashMap<u64, (Span, usize)>, index: usize) -> bool {
        if held.len() >= self.capacity {
            return false;
        }
        let n = self.gateways.len();
        if n <= 1 {
            return true;
        }
        let mut per = vec![0usize; n];
        for (_, g) in held.values() {
            per[*g] += 1;
        }
        let share = (self.capacity / n).max(1);
        let free = self.capacity.saturating_sub(held.len());
        let others_without = (0..n).filter(|&i| i != index && per[i] == 0).count();
        per[index] < share || free > others_without
    }

    /// Marks the session ended: no task leases to it any more (call before releasing its units).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Reserves a slot for unit `work_id` of the gateway at `index`, if the session has not ended
    /// and [`WorkerPort::may_take`]. Called under the gateway's lock.
    fn reserve(&self, index: usize, work_id: u64) -> bool {
        let mut held = self.held();
        if self.closed.load(Ordering::SeqCst) || !self.may_take(&held, index) {
            return false;
        }
        held.insert(work_id, (Span::none(), index));
        true
    }

    /// Gives back a reserved slot that got no unit.
    fn unreserve(&self, work_id: u64) {
        self.held().remove(&work_id);
    }

    /// The gateway of a unit the worker holds, and, when `last` (the report ends the unit), its
    /// span, the slot freed.
    pub fn answer(&self, work_id: u64, last: bool) -> Option<(Arc<GatewayHandle>, Option<Span>)> {
        let mut held = self.held();
        let index = held.get(&work_id)?.1;
        let span = if last {
            held.remove(&work_id).map(|(span, _)| span)
        } else {
            None
        };
        Some((self.gateways[index].clone(), span))
    }

    /// Ends every span of the units still held (the session ended).
    pub fn drain(&self) {
        for (_, (span, _)) in self.held().drain() {
            span.record("outcome", "released");
        }
    }

    fn index_of(&self, gateway: &GatewayHandle) -> Option<usize> {
        self.gateways
            .iter()
            .position(|g| std::ptr::eq(Arc::as_ptr(g), gateway))
    }
}

/// The worker sessions connected, by session id.
#[derive(Debug, Default)]
pub struct Ports {
    ports: Mutex<BTreeMap<u64, Arc<WorkerPort>>>,
}

impl Ports {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<WorkerPort>>> {
        self.ports.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a session's port and wakes its gateways.
    pub fn add(&self, port: Arc<WorkerPort>) {
        self.lock().insert(port.session, port.clone());
        for g in port.gateways() {
            g.served(true);
        }
    }

    /// Removes a session's port.
    pub fn remove(&self, session: u64) -> Option<Arc<WorkerPort>> {
        let port = self.lock().remove(&session)?;
        for g in port.gateways() {
            g.served(false);
        }
        Some(port)
    }

    /// The ports serving `gateway` (by session id), with the gateway's index in each.
    fn serving(&self, gateway: &GatewayHandle) -> Vec<(Arc<WorkerPort>, usize)> {
        self.lock()
            .values()
            .filter_map(|p| p.index_of(gateway).map(|i| (p.clone(), i)))
            .collect()
    }
}

/// Starts the task of `handle` (it ends when the server is dropped or the handle closed).
pub fn spawn(state: &Arc<StateServer>, handle: Arc<GatewayHandle>) {
    let span = info_span!("gateway_task", gateway = %handle.name());
    let state = Arc::downgrade(state);
    tokio::spawn(tracing::Instrument::instrument(run(state, handle), span));
}

async fn run(state: Weak<StateServer>, handle: Arc<GatewayHandle>) {
    let mut task = Task { published: None };
    loop {
        let next = {
            let Some(state) = state.upgrade() else { return };
            if handle.is_closed() {
                return;
            }
            task.step(&state, &handle)
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = handle.woken() => {}
                    () = tokio::time::sleep_until(at.into()) => {}
                }
            }
            None => handle.woken().await,
        }
    }
}

/// What a gateway's task keeps between steps.
#[derive(Debug)]
struct Task {
    /// The change counter the last snapshot was built at, and when.
    published: Option<(u64, Instant)>,
}

impl Task {
    /// One step: expiries, gates, units, snapshot. Returns when to step again at the latest.
    fn step(&mut self, state: &StateServer, handle: &GatewayHandle) -> Option<Instant> {
        let now = Instant::now();
        let ports = if state.is_leader() {
            state.ports().serving(handle)
        } else {
            Vec::new()
        };
        let mut served: Vec<Arc<WorkerPort>> = Vec::new();
        let mut gathered = None;
        let (expired, next) = {
            let mut gw = handle.lock();
            let gw = &mut *gw;
            // Leases that expired, restart-gate bounds that passed.
            let expired = gw.tick(now);
            gw.log_gate_notes();
            // Writers' sessions the core changed outside a resync reach their channels.
            gw.sync_sessions();
            // Each unit to the best-ranked session with room ([`WorkerPort::rank`]), until none
            // has room or the dispatcher has nothing to cut now.
            loop {
                let best = ports
                    .iter()
                    .filter_map(|(port, index)| port.rank(*index).map(|r| (r, port, *index)))
                    .max_by_key(|(r, _, _)| *r);
                let Some((_, port, index)) = best else { break };
                let work_id = state.next_work_id();
                if !port.reserve(index, work_id) {
                    // Its session ended, or a slot went to another gateway, since it was ranked:
                    // stop here (ranking it again could loop); the next wake-up goes on.
                    break;
                }
                // Checked under the gateway lock: a replica that stepped down cuts nothing.
                if !state.is_leader() {
                    port.unreserve(work_id);
                    break;
                }
                let Some(leased) = gw.lease(port.session, work_id, now) else {
                    port.unreserve(work_id);
                    break;
                };
                let links = gw.take_links(&leased.unit.work);
                let families = leased_families(gw, &leased);
                let work_id = leased.unit.work_id;
                let span = port.sink.send(handle.name(), leased, families, links);
                if let Some(slot) = port.held().get_mut(&work_id) {
                    slot.0 = span;
                }
                served.push(port.clone());
            }
            let changes = handle.changes();
            let spacing_due = match self.published {
                Some((at, _)) if at == changes => None,
                Some((_, when)) if now < when + SNAPSHOT_SPACING => Some(when + SNAPSHOT_SPACING),
                _ => {
                    // Read only while a `WatchServices` stream follows it; compared and
                    // published after the lock.
                    if handle.snapshot_followed() {
                        gathered = Some(services::gather(gw, changes));
                    }
                    // What writers wait for, answered; only those owed an answer are woken.
                    handle.awaits().refresh(gw);
                    self.published = Some((changes, now));
                    None
                }
            };
            let next = [gw.next_deadline(now), spacing_due]
                .into_iter()
                .flatten()
                .min();
            (expired, next)
        };
        if let Some(gathered) = gathered {
            let before = handle.snapshot();
            handle.publish(services::publication(&before, gathered));
        }
        let when = unix_ms(SystemTime::now());
        served.dedup_by_key(|p| p.session);
        for port in ports.iter().map(|(p, _)| p) {
            let units = port.units_held() as u32;
            let got = served.iter().any(|p| p.session == port.session);
            state.update_worker(port.session, |info| {
                info.units_in_flight = units;
                if got {
                    info.last_unit_unix_ms = when;
                }
            });
        }
        for e in &expired {
            state.update_worker(e.worker, |w| {
                w.lease_expiries += 1;
                w.expiries_since_report = w.expiries_since_report.saturating_add(1);
            });
            warn!(
                work_id = e.work_id,
                worker = %state.worker_id(e.worker),
                "a unit's lease expired unreported; it goes back to the queue"
            );
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ServerConfig;

    #[derive(Debug)]
    struct Nowhere;

    impl UnitSink for Nowhere {
        fn send(
            &self,
            _: &str,
            _: Leased,
            _: Vec<Option<IpFamily>>,
            _: Vec<clb_telemetry::SpanLink>,
        ) -> Span {
            Span::none()
        }
    }

    /// A port whose session ended ranks nowhere and reserves nothing: a task that took its handle
    /// before it was removed must not pick it again and again (it looped at 100 % CPU).
    #[test]
    fn a_closed_port_ranks_nowhere_and_reserves_nothing() {
        let state = StateServer::new(ServerConfig {
            gateways: vec!["east".into(), "west".into()],
            ..ServerConfig::default()
        });
        let port = WorkerPort::new(7, 2, state.gateways().to_vec(), Box::new(Nowhere));
        assert_eq!(port.rank(0), Some((2, 0)));
        assert!(port.reserve(0, 1));
        // One slot each: west keeps its share of the worker's capacity.
        assert_eq!(port.rank(0), None);
        assert_eq!(port.rank(1), Some((1, 0)));
        port.close();
        assert_eq!(port.rank(1), None);
        assert!(!port.reserve(1, 2));
        // The unit it held is still accounted for until the session releases it.
        assert_eq!(port.units_held(), 1);
    }
}
