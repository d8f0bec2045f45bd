//! The server's shared state: one [`Gateway`] (DiffTracker + dispatcher + writer table) per gateway
//! name, each behind its own mutex. The server is the single writer of every DiffTracker: gRPC handlers
//! lock a gateway briefly, mutate, and wake the worker sessions.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

use crate::difftracker::DiffTracker;
use crate::dispatch::{DispatchConfig, Dispatcher};
use crate::metrics::Metrics;

/// Configuration of the server core (the binary fills it from flags).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Identity of this server instance (reported to workers and in status).
    pub server_id: String,
    /// Gateways this server drives; the first is the default (used for an empty gateway name).
    pub gateways: Vec<String>,
    /// Writers (sources) whose first resync must complete before removals are allowed.
    pub expected_writers: Vec<String>,
    /// Most updates accepted in one batch (`Apply`, one `ApplyStream` message, one resync chunk).
    pub max_items_per_batch: usize,
    /// Largest gRPC message accepted or sent.
    pub max_message_bytes: usize,
    /// Dispatcher settings: leases, unit limits, retries, anti-entropy.
    pub dispatch: DispatchConfig,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            server_id: "clb-state-server".into(),
            gateways: vec!["default".into()],
            expected_writers: Vec::new(),
            max_items_per_batch: 10_000,
            max_message_bytes: 16 * 1024 * 1024,
            dispatch: DispatchConfig::default(),
        }
    }
}

/// What the server knows of one writer (source) of a gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriterRecord {
    /// Unix ms of the last completed resync, if any.
    pub last_resync_unix_ms: Option<i64>,
    /// Updates applied from this source.
    pub updates_applied: u64,
    /// Items rejected from this source.
    pub items_rejected: u64,
}

/// One gateway: its DiffTracker, its dispatcher and its writers.
#[derive(Debug)]
pub struct Gateway {
    /// Gateway name (never empty).
    pub name: String,
    /// Desired vs actual state.
    pub tracker: DiffTracker,
    /// Work units, leases, retries, gates.
    pub dispatch: Dispatcher,
    /// Writers seen, by source name.
    pub writers: BTreeMap<String, WriterRecord>,
    /// Ports of inbound identities (canonical name), for the load balancer rules of their creation.
    /// Kept beside the DiffTracker: the diff does not depend on them.
    pub service_ports: HashMap<String, Vec<clb_proto::v1::ServicePort>>,
    expected_writers: Vec<String>,
}

impl Gateway {
    fn new(name: String, config: &ServerConfig, metrics: Arc<Metrics>) -> Self {
        let mut tracker = DiffTracker::new();
        // Initialization gate: nothing is removed until NRP was read back and writers resynced.
        tracker.set_removals_allowed(false);
        Self {
            name,
            tracker,
            dispatch: Dispatcher::new(config.dispatch.clone(), metrics),
            writers: BTreeMap::new(),
            service_ports: HashMap::new(),
            expected_writers: config.expected_writers.clone(),
        }
    }

    /// Remembers (or forgets) the ports of a service from an update that was applied.
    pub fn remember_ports(&mut self, update: &clb_proto::v1::Update) {
        use clb_proto::v1::{Operation, update::Kind};
        if let Some(Kind::Service(s)) = &update.kind {
            let id = s.id.to_ascii_lowercase();
            if s.operation == Operation::Add as i32 {
                self.service_ports.insert(id, s.ports.clone());
            } else {
                self.service_ports.remove(&id);
            }
        }
    }

    /// Counts a batch from `source`.
    pub fn record_writes(&mut self, source: &str, applied: u64, rejected: u64) {
        let w = self.writers.entry(source.to_owned()).or_default();
        w.updates_applied += applied;
        w.items_rejected += rejected;
    }

    /// Marks `source`'s resync complete, and opens the removal gate if that was the last one needed.
    pub fn resync_completed(&mut self, source: &str) {
        self.writers
            .entry(source.to_owned())
            .or_default()
            .last_resync_unix_ms = Some(unix_ms(SystemTime::now()));
        self.update_gates();
    }

    /// Expected writers that have not completed a resync yet.
    pub fn pending_writers(&self) -> Vec<String> {
        self.expected_writers
            .iter()
            .filter(|w| {
                self.writers
                    .get(*w)
                    .is_none_or(|r| r.last_resync_unix_ms.is_none())
            })
            .cloned()
            .collect()
    }

    /// Allows removals once NRP has been observed and every expected writer resynced.
    pub fn update_gates(&mut self) {
        let open = self.dispatch.nrp_observed() && self.pending_writers().is_empty();
        if open && !self.tracker.removals_allowed() {
            self.tracker.set_removals_allowed(true);
        }
    }
}

/// Handle to one gateway.
#[derive(Debug)]
pub struct GatewayHandle {
    name: String,
    inner: Mutex<Gateway>,
}

impl GatewayHandle {
    /// The gateway's name.
    pub fn name(&self) -> &str {
        &self.name
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
}

/// A gateway name the server does not drive.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("gateway {0:?} is not driven by this server")]
pub struct UnknownGateway(pub String);

/// Everything the gRPC services share.
#[derive(Debug)]
pub struct StateServer {
    config: ServerConfig,
    gateways: HashMap<String, Arc<GatewayHandle>>,
    order: Vec<Arc<GatewayHandle>>,
    work: Notify,
    next_work_id: AtomicU64,
    workers: Mutex<BTreeMap<u64, WorkerInfo>>,
    metrics: Arc<Metrics>,
}

impl StateServer {
    /// Builds the state for the configured gateways (at least one).
    pub fn new(mut config: ServerConfig) -> Arc<Self> {
        if config.gateways.is_empty() {
            config.gateways.push("default".into());
        }
        let metrics = Arc::new(Metrics::new());
        let order: Vec<Arc<GatewayHandle>> = config
            .gateways
            .iter()
            .map(|name| {
                Arc::new(GatewayHandle {
                    name: name.clone(),
                    inner: Mutex::new(Gateway::new(name.clone(), &config, metrics.clone())),
                })
            })
            .collect();
        let gateways = order.iter().map(|g| (g.name.clone(), g.clone())).collect();
        Arc::new(Self {
            config,
            gateways,
            order,
            work: Notify::new(),
            next_work_id: AtomicU64::new(1),
            workers: Mutex::new(BTreeMap::new()),
            metrics,
        })
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

    /// Wakes worker sessions: there may be work (after an update, a report or a timer).
    pub fn notify_work(&self) {
        self.work.notify_waiters();
    }

    /// Resolves when [`StateServer::notify_work`] is next called.
    pub fn work_notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.work.notified()
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

    /// Adds, updates or (with `None`) removes a worker session.
    pub fn set_worker(&self, session: u64, info: Option<WorkerInfo>) {
        let mut w = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        match info {
            Some(i) => {
                w.insert(session, i);
            }
            None => {
                w.remove(&session);
            }
        }
    }

    /// The lease duration handed to workers.
    pub fn lease_duration(&self) -> Duration {
        self.config.dispatch.lease
    }
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
