//! The server's shared state: one [`Gateway`] (its rules: [`GatewayCore`]) per gateway name, each
//! behind its own mutex and driven by its own task ([`crate::state::push`]): gRPC handlers lock a
//! gateway briefly, change it, and wake its task.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::Notify;

pub mod awaits;
pub mod push;

use crate::metrics::{self, Metrics};
use clb_core::dispatch::{DispatchConfig, DispatchEnv, WriteBudget};
use clb_core::gateway::{GatewayConfig, GatewayCore};
pub use clb_proto::unix_ms;

/// Configuration of the server core (the binary fills it from flags).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Identity of this server instance (reported to workers and in status).
    pub server_id: String,
    /// Gateways this server drives; the first is the default (used for an empty gateway name).
    pub gateways: Vec<String>,
    /// The Azure subscription of each gateway (from the gateways file): gateways of one
    /// subscription share its write budget ([`clb_core::dispatch::WriteBudget`]). A gateway not
    /// named has a budget of its own.
    pub subscriptions: std::collections::BTreeMap<String, String>,
    /// Writers (sources) whose first resync must complete before removals are allowed, beside
    /// the restart gate's own rules (an extra; see [`crate::gate`]).
    pub expected_writers: Vec<String>,
    /// Longest wait, after the cluster view and the read-back of NRP, for a pod writer or an
    /// expected writer that has not resynced (see [`crate::gate`]).
    pub resync_wait: Duration,
    /// Most updates accepted in one batch (`Apply`, one `ApplyStream` message, one resync chunk).
    pub max_items_per_batch: usize,
    /// Largest gRPC message accepted or sent.
    pub max_message_bytes: usize,
    /// Dispatcher settings: leases, unit limits, retries, anti-entropy.
    pub dispatch: DispatchConfig,
    /// Starts as a standby: the server leads only once leader election makes it the leader
    /// ([`crate::leader`], [`StateServer::set_leader`]). False: it leads from the start, alone.
    pub leader_elect: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            server_id: "clb-state-server".into(),
            gateways: vec!["default".into()],
            subscriptions: Default::default(),
            expected_writers: Vec::new(),
            resync_wait: crate::gate::DEFAULT_RESYNC_WAIT,
            max_items_per_batch: 10_000,
            max_message_bytes: 16 * 1024 * 1024,
            dispatch: DispatchConfig::default(),
            leader_elect: false,
        }
    }
}

pub use clb_core::gateway::WriterRecord;

/// One gateway as the server holds it: its rules ([`GatewayCore`], which it dereferences to) and
/// the writer spans to link from the spans of the units that carry their changes.
#[derive(Debug)]
pub struct Gateway {
    core: GatewayCore,
    /// Writer spans to link from the spans of the units that carry their changes.
    trace_links: crate::trace_links::TraceLinks,
}

impl std::ops::Deref for Gateway {
    type Target = GatewayCore;
    fn deref(&self) -> &GatewayCore {
        &self.core
    }
}

impl std::ops::DerefMut for Gateway {
    fn deref_mut(&mut self) -> &mut GatewayCore {
        &mut self.core
    }
}

impl Gateway {
    fn new(
        name: String,
        config: &ServerConfig,
        metrics: Arc<Metrics>,
        budget: WriteBudget,
    ) -> Self {
        let observer = crate::metrics::gateway_observer(metrics, &name);
        let settings = GatewayConfig {
            expected_writers: config.expected_writers.clone(),
            resync_wait: config.resync_wait,
            dispatch: config.dispatch.clone(),
        };
        let env = DispatchEnv::new(Instant::now(), unix_ms(SystemTime::now()), rand::random())
            .with_observer(observer);
        let mut core = GatewayCore::new(name, &settings, env);
        core.share_write_budget(budget);
        Self {
            core,
            trace_links: Default::default(),
        }
    }

    /// Notes the writer request's span `link` for each update of `updates` that was applied
    /// (`applied`, item by item), so that the units carrying them link to it.
    pub fn link_applied(
        &mut self,
        link: Option<&clb_telemetry::SpanLink>,
        updates: &[clb_proto::v1::Update],
        applied: &[bool],
    ) {
        let Some(link) = link else { return };
        for (update, _) in updates.iter().zip(applied).filter(|(_, a)| **a) {
            self.trace_links.note(link, update);
        }
    }

    /// The writer spans that the changes of `work` came from (taken: a unit links to them once).
    pub fn take_links(
        &mut self,
        work: &clb_core::dispatch::UnitWork,
    ) -> Vec<clb_telemetry::SpanLink> {
        self.trace_links.take(work)
    }

    /// Logs what the restart gate decided since the last call.
    pub fn log_gate_notes(&mut self) {
        for note in self.core.take_gate_notes() {
            if note.warning {
                tracing::warn!(gateway = %self.core.name(), "{}", note.message);
            } else {
                tracing::info!(gateway = %self.core.name(), "{}", note.message);
            }
        }
    }
}

/// What the writers' streams (`WatchSession`, `WatchServices`) read of a gateway without its lock:
/// published by the gateway's task ([`crate::state::push`]) after changes, at most every
/// [`crate::state::push::SNAPSHOT_SPACING`], and only while someone follows it.
#[derive(Debug, Default)]
pub struct GatewaySnapshot {
    /// The gateway's change counter it was built at ([`GatewayHandle::changes`]).
    pub changes: u64,
    /// Every inbound service with its writer-facing state (condition included, locations not
    /// counted), by canonical name.
    pub services: HashMap<String, clb_proto::v1::ServiceState>,
    /// Every outbound service, the same way (with its brought NAT gateway): what `WatchServices`
    /// streams with `include_outbound`.
    pub egresses: HashMap<String, clb_proto::v1::ServiceState>,
    /// Whether NRP was read back since the state started.
    pub nrp_observed: bool,
    /// The writers whose resync the server holds.
    pub resynced: BTreeSet<String>,
}

/// Handle to one gateway: its state behind a lock, the signal that wakes its task, and the
/// snapshot the task publishes.
#[derive(Debug)]
pub struct GatewayHandle {
    name: String,
    inner: Mutex<Gateway>,
    /// Wakes the gateway's task (a permit is kept when it is not waiting: no wake-up is lost).
    wake: Notify,
    /// Counts changes of the gateway's state that its snapshot may show.
    changes: AtomicU64,
    /// The task ends once this is set (the server is dropped).
    closed: std::sync::atomic::AtomicBool,
    /// Worker sessions serving the gateway ([`push::Ports`] keeps it).
    serving: std::sync::atomic::AtomicUsize,
    snapshot: tokio::sync::watch::Sender<Arc<GatewaySnapshot>>,
    /// The followers of what writers wait for (`WatchLocations`, `WatchAddresses`).
    awaits: awaits::Awaits,
}

impl GatewayHandle {
    fn new(name: String, gateway: Gateway) -> Self {
        Self {
            name,
            inner: Mutex::new(gateway),
            wake: Notify::new(),
            changes: AtomicU64::new(0),
            closed: Default::default(),
            serving: Default::default(),
            snapshot: tokio::sync::watch::Sender::new(Arc::default()),
            awaits: Default::default(),
        }
    }

    /// The gateway's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Wakes the gateway's task: there may be work (a worker joined or freed a slot).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Resolves when the task is woken ([`GatewayHandle::wake`], [`GatewayHandle::changed`]).
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    /// Tells the gateway's task that its state changed (a write, a resync, a report): it cuts
    /// what there is to cut and publishes a new snapshot. A task with no worker to push to and no
    /// stream to publish for is not woken (a write to a server without workers costs no wake-up);
    /// the worker or the stream that comes wakes it.
    pub fn changed(&self) {
        self.changes.fetch_add(1, Ordering::Relaxed);
        if self.serving.load(Ordering::Relaxed) > 0 || self.followed() {
            self.wake();
        }
    }

    /// Counts a worker session that serves the gateway (`true`) or left (`false`), and wakes the
    /// task.
    pub fn served(&self, joined: bool) {
        if joined {
            self.serving.fetch_add(1, Ordering::Relaxed);
        } else {
            self.serving.fetch_sub(1, Ordering::Relaxed);
        }
        self.wake();
    }

    /// The change counter.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }

    /// Whether the task is to end.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.wake();
    }

    /// Follows the gateway's snapshot; the first one built after this call has a change counter of
    /// at least the returned value (wait for it: the current one may be stale or empty).
    pub fn subscribe(&self) -> (tokio::sync::watch::Receiver<Arc<GatewaySnapshot>>, u64) {
        let rx = self.snapshot.subscribe();
        self.changes.fetch_add(1, Ordering::Relaxed);
        self.wake();
        (rx, self.changes())
    }

    /// Whether anyone follows the gateway: its snapshot, or what writers wait for.
    pub fn followed(&self) -> bool {
        self.snapshot_followed() || self.awaits.followed()
    }

    /// Whether anyone follows the snapshot.
    pub fn snapshot_followed(&self) -> bool {
        self.snapshot.receiver_count() > 0
    }

    /// The followers of what writers wait for; the gateway's task answers them.
    pub fn awaits(&self) -> &awaits::Awaits {
        &self.awaits
    }

    /// Publishes a snapshot (the gateway's task does).
    pub fn publish(&self, snapshot: GatewaySnapshot) {
        self.snapshot.send_replace(Arc::new(snapshot));
    }

    /// Locks the gateway. A poisoned lock (a panic while held) is recovered: the DiffTracker
    /// validates before it mutates, so its state stays consistent.
    pub fn lock(&self) -> MutexGuard<'_, Gateway> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A connected sync worker, as shown in status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    /// Session id (unique per connection).
    pub session: u64,
    /// The id the worker announced.
    pub worker_id: String,
    /// Units it may hold at once.
    pub capacity: u32,
    /// Gateways it serves (empty = all).
    pub gateways: Vec<String>,
    /// Units it holds now.
    pub units_in_flight: u32,
    /// When it connected (Unix ms).
    pub connected_at_unix_ms: i64,
    /// When it last reported (Unix ms; 0 for never).
    pub last_report_unix_ms: i64,
    /// When a unit was last leased to it (Unix ms; 0 for never).
    pub last_unit_unix_ms: i64,
    /// Its units whose lease expired, since it connected.
    pub lease_expiries: u64,
    /// Lease expiries since its last report.
    pub expiries_since_report: u32,
}

/// The first epoch of a replica: its start time in nanoseconds since the Unix epoch (distinct
/// across replicas and restarts in practice), never 0.
fn first_epoch() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos.max(1)
}

/// How many ended worker sessions keep their worker id for status (errors name their worker).
pub const RECENT_WORKERS: usize = 256;

/// A gateway name the server does not drive. Its message quotes at most
/// [`clb_core::difftracker::MAX_QUOTED_CHARS`] characters of the name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("gateway {} is not driven by this server", clb_core::difftracker::quote(.0))]
pub struct UnknownGateway(pub String);

impl Drop for StateServer {
    fn drop(&mut self) {
        for g in &self.order {
            g.close();
        }
    }
}

/// Everything the gRPC services share.
#[derive(Debug)]
pub struct StateServer {
    config: ServerConfig,
    gateways: HashMap<String, Arc<GatewayHandle>>,
    order: Vec<Arc<GatewayHandle>>,
    /// The connected worker sessions the gateway tasks push units to.
    ports: crate::state::push::Ports,
    /// Whether the gateway tasks run ([`StateServer::start_tasks`]).
    tasks: std::sync::Once,
    next_work_id: AtomicU64,
    workers: Mutex<BTreeMap<u64, WorkerInfo>>,
    /// Worker ids of sessions that ended, by session (the last [`RECENT_WORKERS`]).
    recent_workers: Mutex<BTreeMap<u64, String>>,
    metrics: Arc<Metrics>,
    /// Whether this replica leads (always, without leader election; see [`crate::leader`]).
    leader: tokio::sync::watch::Sender<bool>,
    /// Changes whenever every gateway starts afresh (see [`StateServer::epoch`]).
    epoch: AtomicU64,
    /// Each gateway's write budget, shared by the gateways of one subscription; kept when the
    /// gateways start afresh (it is Azure's, not the cluster's).
    budgets: HashMap<String, WriteBudget>,
}

impl StateServer {
    /// Builds the state for the configured gateways (at least one).
    pub fn new(mut config: ServerConfig) -> Arc<Self> {
        if config.gateways.is_empty() {
            config.gateways.push("default".into());
        }
        let metrics = Arc::new(Metrics::new());
        let mut by_subscription: HashMap<&str, WriteBudget> = HashMap::new();
        let budgets: HashMap<String, WriteBudget> = config
            .gateways
            .iter()
            .map(|name| {
                let budget = match config.subscriptions.get(name) {
                    Some(s) => by_subscription.entry(s).or_default().clone(),
                    None => WriteBudget::new(),
                };
                (name.clone(), budget)
            })
            .collect();
        let order: Vec<Arc<GatewayHandle>> = config
            .gateways
            .iter()
            .map(|name| {
                Arc::new(GatewayHandle::new(
                    name.clone(),
                    Gateway::new(
                        name.clone(),
                        &config,
                        metrics.clone(),
                        budgets[name].clone(),
                    ),
                ))
            })
            .collect();
        let gateways = order.iter().map(|g| (g.name.clone(), g.clone())).collect();
        let leading = !config.leader_elect;
        metrics.set_leader(leading);
        Arc::new(Self {
            config,
            gateways,
            order,
            ports: Default::default(),
            tasks: std::sync::Once::new(),
            next_work_id: AtomicU64::new(1),
            workers: Mutex::new(BTreeMap::new()),
            recent_workers: Mutex::new(BTreeMap::new()),
            metrics,
            leader: tokio::sync::watch::Sender::new(leading),
            epoch: AtomicU64::new(first_epoch()),
            budgets,
        })
    }

    /// Whether this replica leads: only a leader serves Writer, Worker and Admin and hands out
    /// work. True unless leader election made it a standby.
    pub fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    /// Follows [`StateServer::is_leader`].
    pub fn leadership(&self) -> tokio::sync::watch::Receiver<bool> {
        self.leader.subscribe()
    }

    /// Makes this replica the leader or a standby. Either way every gateway starts afresh, exactly
    /// as after a restart (empty DiffTracker, restart gate closed, no writer known): a new leader
    /// reads NRP back and waits for the writers' resyncs before it removes anything; a standby
    /// keeps nothing stale. Stepping down takes effect at once: no unit is cut afterwards, and
    /// worker sessions end.
    pub fn set_leader(&self, leading: bool) {
        if !leading {
            self.leader.send_replace(false);
            self.metrics.set_leader(false);
        }
        if leading != self.is_leader() || !leading {
            self.epoch.fetch_add(1, Ordering::Relaxed);
            for g in &self.order {
                *g.lock() = Gateway::new(
                    g.name.clone(),
                    &self.config,
                    self.metrics.clone(),
                    self.budgets[&g.name].clone(),
                );
            }
        }
        if leading {
            self.metrics.set_leader(true);
            self.leader.send_replace(true);
        }
        for g in &self.order {
            g.changes.fetch_add(1, Ordering::Relaxed);
            g.wake();
        }
    }

    /// The epoch of this replica's state: it changes whenever every gateway starts afresh (a start,
    /// taking or leaving the lead), so a writer that compares it with the epoch of its last resync
    /// knows whether the server still holds that resync. Two replicas (or two starts) have
    /// different epochs: the first is the start time in nanoseconds since the Unix epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    /// The Prometheus metrics of this server.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// The gateway named `name` (empty = the default gateway).
    pub fn gateway(&self, name: &str) -> Result<Arc<GatewayHandle>, UnknownGateway> {
        if name.is_empty() {
            return Ok(self.order[0].clone());
        }
        self.gateways
            .get(name)
            .cloned()
            .ok_or_else(|| UnknownGateway(name.to_owned()))
    }

    /// Every gateway, default first.
    pub fn gateways(&self) -> &[Arc<GatewayHandle>] {
        &self.order
    }

    /// Starts one task per gateway ([`crate::state::push`]) once, when called inside a Tokio
    /// runtime (the gRPC services call it when they are built). The tasks end when the server is
    /// dropped.
    pub fn start_tasks(self: &Arc<Self>, snapshot: crate::state::push::SnapshotFn) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        self.tasks.call_once(|| {
            for g in &self.order {
                crate::state::push::spawn(self, g.clone(), snapshot);
            }
        });
    }

    /// Tells every gateway's task that its state changed (after a change made through
    /// [`GatewayHandle::lock`] outside the gRPC services, as tests do).
    pub fn notify_work(&self) {
        for g in &self.order {
            g.changes.fetch_add(1, Ordering::Relaxed);
            g.wake();
        }
    }

    /// The connected worker sessions.
    pub fn ports(&self) -> &crate::state::push::Ports {
        &self.ports
    }

    /// A fresh work id, unique for this server's lifetime.
    pub fn next_work_id(&self) -> u64 {
        self.next_work_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Connected workers, by session.
    pub fn workers(&self) -> Vec<WorkerInfo> {
        self.workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Adds, updates or (with `None`) removes a worker session. A removed session's worker id
    /// is remembered (the last [`RECENT_WORKERS`]), so errors of its units still name it.
    pub fn set_worker(&self, session: u64, info: Option<WorkerInfo>) {
        let mut w = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        match info {
            Some(i) => {
                w.insert(session, i);
            }
            None => {
                if let Some(gone) = w.remove(&session) {
                    let mut recent = self
                        .recent_workers
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    if recent.len() == RECENT_WORKERS {
                        recent.pop_first();
                    }
                    recent.insert(session, gone.worker_id);
                }
            }
        }
    }

    /// Changes the record of a connected worker session (nothing if it is gone).
    pub fn update_worker(&self, session: u64, change: impl FnOnce(&mut WorkerInfo)) {
        let mut w = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(info) = w.get_mut(&session) {
            change(info);
        }
    }

    /// The worker id of a session, connected or recently gone; empty if unknown.
    pub fn worker_id(&self, session: u64) -> String {
        if let Some(w) = self
            .workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&session)
        {
            return w.worker_id.clone();
        }
        self.recent_workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&session)
            .cloned()
            .unwrap_or_default()
    }

    /// The lease duration handed to workers.
    pub fn lease_duration(&self) -> Duration {
        self.config.dispatch.lease
    }
}

/// The metrics read from the state at each scrape (here, not in `metrics.rs`: the metrics know
/// nothing of the state).
impl Metrics {
    /// Sets every gateway's gauges from the server's current state.
    pub fn refresh_from(&self, state: &StateServer) {
        for s in gateway_snapshots(state, Instant::now()) {
            self.set_gateway(&s);
        }
    }
}

/// One [`metrics::GatewaySnapshot`] per gateway of `state` (default first), each taken under its gateway lock.
pub fn gateway_snapshots(state: &StateServer, now: Instant) -> Vec<metrics::GatewaySnapshot> {
    let workers = state.workers();
    state
        .gateways()
        .iter()
        .map(|handle| {
            let name = handle.name().to_owned();
            let (load, gate) = {
                let gw = handle.lock();
                (gw.load(now), gw.gate_view(now))
            };
            let c = load.counts;
            let serving = workers
                .iter()
                .filter(|w| w.gateways.is_empty() || w.gateways.contains(&name))
                .count();
            let held_back = gate
                .holds
                .into_iter()
                .map(|h| {
                    let held = metrics::HeldBack {
                        removals: h.addresses + h.services,
                        locations: h.locations,
                    };
                    (h.reason.label(), held)
                })
                .collect();
            metrics::GatewaySnapshot {
                revision: load.revision,
                desired_addresses: c.desired_addresses,
                actual_addresses: c.actual_addresses,
                desired_locations: c.desired_locations,
                actual_locations: c.actual_locations,
                desired_services: c.desired_services + c.desired_egresses,
                actual_services: c.actual_load_balancers + c.actual_nat_gateways,
                dirty_locations: c.dirty_locations,
                units_in_flight: load.units_in_flight as u64,
                parked_units: load.parked_units as u64,
                nat_gateways_missing: load.missing_nat_gateways as u64,
                staleness: load.oldest_pending_age,
                workers: serving as u64,
                write_budget: load.pacing.remaining_writes,
                batching_window: load.pacing.batching_window.unwrap_or_default(),
                unit_headway: load.pacing.unit_headway.unwrap_or_default(),
                held_back,
                refused: load.refused_by_code.into_iter().collect(),
                gateway: name,
            }
        })
        .collect()
}
