//! The server's shared state: one [`Gateway`] (DiffTracker + dispatcher + writer table, and what is
//! kept beside the tracker: service ports and frontends) per gateway name, each behind its own mutex.
//! The server is the single writer of every DiffTracker: gRPC handlers lock a gateway briefly,
//! mutate, and wake the worker sessions.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use clb_proto::v1::ServicePort;
use tokio::sync::Notify;

use crate::gate::{GateView, RestartGate, Topology};
use crate::grpc::resync::Scope;
use crate::metrics::Metrics;
use clb_core::difftracker::{DiffTracker, ServiceAction, ServiceChange, ServiceKind};
use clb_core::dispatch::{DispatchConfig, DispatchEnv, Dispatcher, Outcome, Report};
pub use clb_proto::unix_ms;

/// Configuration of the server core (the binary fills it from flags).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Identity of this server instance (reported to workers and in status).
    pub server_id: String,
    /// Gateways this server drives; the first is the default (used for an empty gateway name).
    pub gateways: Vec<String>,
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
            expected_writers: Vec::new(),
            resync_wait: crate::gate::DEFAULT_RESYNC_WAIT,
            max_items_per_batch: 10_000,
            max_message_bytes: 16 * 1024 * 1024,
            dispatch: DispatchConfig::default(),
            leader_elect: false,
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

/// One gateway: its DiffTracker, its dispatcher, its writers, and beside the tracker the ports and
/// frontend IPs of its inbound services.
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
    pub service_ports: HashMap<String, Vec<ServicePort>>,
    /// Frontend IPs of inbound identities (canonical name → canonical IP) as NRP last reported
    /// them: set by the report of a service's creation, replaced by each completed observe,
    /// dropped when its deletion is recorded. Kept beside the DiffTracker, which knows nothing of
    /// them.
    pub frontends: HashMap<String, String>,
    /// The ports each inbound identity's load balancer rules were last created with in NRP, as
    /// far as this server saw: a change of the desired ports against these re-creates the service.
    programmed_ports: HashMap<String, Vec<ServicePort>>,
    /// The ports that the creation unit in flight for a service carries (one unit per service).
    /// An entry may outlive its unit (a creation that failed or was not confirmed): whether a
    /// creation is really in flight is the dispatcher's to say.
    ports_in_flight: HashMap<String, Vec<ServicePort>>,
    /// What the parts received so far of an observe unit (by work id) carried beside the snapshot.
    observing: Option<(u64, ObservedExtras)>,
    /// The restart gate: which removals wait for which writer (see [`crate::gate`]).
    pub gate: RestartGate,
    /// Writer spans to link from the spans of the units that carry their changes.
    pub trace_links: crate::trace_links::TraceLinks,
}

/// What an observe reports beside the DiffTracker's snapshot, merged over its parts.
#[derive(Debug, Default)]
struct ObservedExtras {
    /// Frontend IP of each inbound service whose public IP has one.
    frontends: HashMap<String, String>,
    /// The load balancer rules (as ports) of each inbound service whose load balancer was read.
    rules: HashMap<String, Vec<ServicePort>>,
}

/// Ports as a set of (protocol, port, effective target port): the order and repetition of a list
/// do not change the rules, and a target port of 0 is the port itself (the rule's backend port is
/// the same either way), so a change of the target port re-creates the rules as a port change does.
fn port_set(ports: &[ServicePort]) -> BTreeSet<(i32, u32, u32)> {
    ports
        .iter()
        .map(|p| (p.protocol, p.port, effective_target_port(p)))
        .collect()
}

/// The backend port of `p`'s rule: its target port, or its port when the target port is 0.
fn effective_target_port(p: &ServicePort) -> u32 {
    if p.target_port == 0 {
        p.port
    } else {
        p.target_port
    }
}

/// Whether a worker can make a load balancing rule of `p` (TCP or UDP, port and target port 1 to
/// 65535, the target port 0 meaning the port).
fn programmable(p: &ServicePort) -> bool {
    use clb_proto::v1::Protocol;
    matches!(
        Protocol::try_from(p.protocol),
        Ok(Protocol::Tcp | Protocol::Udp)
    ) && (1..=65535).contains(&p.port)
        && p.target_port <= 65535
}

impl Gateway {
    fn new(name: String, config: &ServerConfig, metrics: Arc<Metrics>) -> Self {
        let observer = crate::metrics::gateway_observer(metrics, &name);
        let mut tracker = DiffTracker::new();
        // Restart gate: nothing is removed until NRP was read back and writers resynced.
        tracker.set_removals_allowed(false);
        Self {
            name,
            tracker,
            dispatch: Dispatcher::new(
                config.dispatch.clone(),
                DispatchEnv::new(Instant::now(), unix_ms(SystemTime::now()), rand::random())
                    .with_observer(observer),
            ),
            writers: BTreeMap::new(),
            service_ports: HashMap::new(),
            frontends: HashMap::new(),
            programmed_ports: HashMap::new(),
            ports_in_flight: HashMap::new(),
            observing: None,
            trace_links: Default::default(),
            gate: RestartGate::new(config.expected_writers.clone(), config.resync_wait),
        }
    }

    /// Remembers (or forgets) the ports of a service from an update that was applied. When the
    /// ports of a service whose load balancer NRP has differ from those it was created with, the
    /// service is created again (its saga re-programs the rules).
    pub fn remember_ports(&mut self, update: &clb_proto::v1::Update) {
        use clb_proto::v1::{Operation, update::Kind};
        if let Some(Kind::Service(s)) = &update.kind {
            let id = s.id.to_ascii_lowercase();
            if s.operation == Operation::Add as i32 {
                self.reprogram_if_changed(&id, &s.ports);
                self.service_ports.insert(id, s.ports.clone());
            } else {
                self.service_ports.remove(&id);
            }
        }
    }

    /// Forgets the ports of every service that is no longer desired as an inbound identity (a
    /// resync that replaced the services scope removes services without naming them; an `Apply`
    /// removal is forgotten by [`Gateway::remember_ports`]): Admin shows no stale ports, and a
    /// service added again later starts from its new ports.
    pub fn forget_undesired_ports(&mut self) {
        let desired: HashSet<String> = self
            .tracker
            .desired_inbound_identities()
            .into_iter()
            .collect();
        self.service_ports.retain(|name, _| desired.contains(name));
    }

    /// Asks the tracker to create `id` again if `desired` differs from the ports NRP has.
    fn reprogram_if_changed(&mut self, id: &str, desired: &[ServicePort]) {
        let changed = self
            .programmed_ports
            .get(id)
            .is_some_and(|have| port_set(have) != port_set(desired));
        if changed && let Ok(true) = self.tracker.reprogram_service(id) {
            tracing::debug!(service = id, "ports changed: the service is created again");
        }
    }

    /// The ports to send with the creation of `change`'s inbound service, remembered as in flight
    /// so that the report can tell which rules NRP got. Empty for anything else.
    pub fn ports_for(&mut self, change: &ServiceChange) -> Vec<ServicePort> {
        if change.kind != ServiceKind::Inbound || change.action != ServiceAction::Create {
            return Vec::new();
        }
        let ports = self
            .service_ports
            .get(&change.name)
            .cloned()
            .unwrap_or_default();
        self.ports_in_flight
            .insert(change.name.clone(), ports.clone());
        ports
    }

    /// Folds a worker's report: the dispatcher records it in the tracker, then what is kept beside
    /// the tracker follows. `frontends` are the (service, IP) pairs the report carried, already
    /// canonical: for a service unit, those of its creations; for an observe, those of this part.
    /// `rules` are the (service, rule ports) pairs of an observe's part, service names canonical
    /// (empty for other reports). When an observe completes, each desired inbound service that NRP
    /// has and whose load balancer rules were read back with other ports than the desired ones is
    /// created again. Returns false when the report was ignored (not a unit leased to `worker`).
    pub fn on_report(
        &mut self,
        worker: u64,
        report: Report,
        frontends: Vec<(String, String)>,
        rules: Vec<(String, Vec<ServicePort>)>,
        now: Instant,
    ) -> bool {
        let work_id = report.work_id;
        let observe_part = match &report.outcome {
            Outcome::Observed { last, .. } => Some(*last),
            _ => None,
        };
        let Some(folded) = self
            .dispatch
            .on_report(&mut self.tracker, worker, report, now)
        else {
            return false;
        };
        match observe_part {
            Some(last) => {
                // Only the union of the parts is complete: replace the frontends at the end.
                let parts = match &mut self.observing {
                    Some((id, parts)) if *id == work_id => parts,
                    slot => &mut slot.insert((work_id, ObservedExtras::default())).1,
                };
                parts.frontends.extend(frontends);
                parts.rules.extend(rules);
                if last
                    && let Some((_, observed)) = self.observing.take()
                    && folded.observed
                {
                    self.frontends = observed.frontends;
                    let tracker = &self.tracker;
                    self.programmed_ports
                        .retain(|name, _| tracker.service_view(name).is_some_and(|v| v.actual));
                    self.rules_observed(observed.rules);
                }
            }
            None => {
                let mut reported: HashMap<String, String> = frontends.into_iter().collect();
                for change in folded.services {
                    self.service_recorded(&change, &mut reported);
                }
            }
        }
        self.update_gates();
        true
    }

    /// Takes the load balancer rules an observe read back as the ports NRP has for those services,
    /// and creates again each desired one whose rules differ from its desired ports. A service
    /// without rules read back (its load balancer was not found) keeps what was known of it; one
    /// whose creation is in flight is left to that creation's report.
    fn rules_observed(&mut self, rules: HashMap<String, Vec<ServicePort>>) {
        for (name, ports) in rules {
            let in_nrp = self
                .tracker
                .service_view(&name)
                .is_some_and(|v| v.kind == ServiceKind::Inbound && v.actual);
            if !in_nrp {
                continue;
            }
            // The ports of a creation that ended without a report of it (failed, unconfirmed,
            // its lease expired) tell nothing: what NRP has is what was read.
            if self.dispatch.service_creation_in_flight(&name) {
                continue;
            }
            self.ports_in_flight.remove(&name);
            self.programmed_ports.insert(name.clone(), ports);
            // Ports no worker can program would fail the creation again after every observe.
            if let Some(desired) = self.service_ports.get(&name).cloned()
                && desired.iter().all(programmable)
            {
                self.reprogram_if_changed(&name, &desired);
            }
        }
    }

    /// Keeps the frontends and programmed ports in step with a service change NRP accepted.
    fn service_recorded(&mut self, change: &ServiceChange, reported: &mut HashMap<String, String>) {
        if change.kind != ServiceKind::Inbound {
            return;
        }
        let name = &change.name;
        match change.action {
            ServiceAction::Create => {
                if let Some(ip) = reported.remove(name) {
                    self.frontends.insert(name.clone(), ip);
                }
                if let Some(sent) = self.ports_in_flight.remove(name) {
                    self.programmed_ports.insert(name.clone(), sent);
                    // Changed while the creation was under way: send the new ports too.
                    if let Some(desired) = self.service_ports.get(name).cloned() {
                        self.reprogram_if_changed(name, &desired);
                    }
                }
            }
            ServiceAction::Delete => {
                self.frontends.remove(name);
                self.programmed_ports.remove(name);
                self.ports_in_flight.remove(name);
            }
        }
    }

    /// Counts a batch from `source`.
    pub fn record_writes(&mut self, source: &str, applied: u64, rejected: u64) {
        let w = self.writers.entry(source.to_owned()).or_default();
        w.updates_applied += applied;
        w.items_rejected += rejected;
    }

    /// Marks `source`'s resync of every scope (services, egresses, endpoints, all pods; no
    /// topology) complete; see [`Gateway::resync_scope_completed`].
    pub fn resync_completed(&mut self, source: &str) {
        let all = Scope {
            services: true,
            egresses: true,
            endpoints: true,
            pods: true,
            location: None,
        };
        self.resync_scope_completed(source, &all, None);
    }

    /// Marks `source`'s resync of `scope` complete (with the topology its header declared) and
    /// opens what the restart gate no longer holds back. When the resync changed who owns the
    /// pods of some locations (see [`RestartGate::resync_completed`]), the pods the old owner
    /// wrote there leave the desired state, removals there wait for the new owner's resync (the
    /// gate withholds them before this returns, under the same lock), and the new owner's last
    /// resync is forgotten so that a live writer resyncs. Returns the pods removed.
    pub fn resync_scope_completed(
        &mut self,
        source: &str,
        scope: &Scope,
        topology: Option<&Topology>,
    ) -> u32 {
        self.writers
            .entry(source.to_owned())
            .or_default()
            .last_resync_unix_ms = Some(unix_ms(SystemTime::now()));
        let handover =
            self.gate
                .resync_completed(source, scope, topology, &self.tracker, Instant::now());
        let mut dropped = 0;
        for location in &handover.drop_pods_at {
            dropped += self.drop_pods_at(*location);
        }
        for writer in &handover.resync_asked {
            if let Some(w) = self.writers.get_mut(writer) {
                w.last_resync_unix_ms = None;
            }
        }
        if !handover.drop_pods_at.is_empty() {
            tracing::info!(
                gateway = %self.name,
                source,
                locations = handover.drop_pods_at.len(),
                pods = dropped,
                asked = ?handover.resync_asked,
                "pods changed owner: the old owner's pods left the desired state"
            );
        }
        self.update_gates();
        dropped
    }

    /// Removes every pod at `location` from the desired state (their outbound identities; an
    /// address stays while an inbound identity uses it). Returns how many went.
    fn drop_pods_at(&mut self, location: std::net::IpAddr) -> u32 {
        let mut dropped = 0;
        for (address, at) in self.tracker.pods(Some(location)) {
            let (address, at) = (address.to_string(), at.to_string());
            let pod = clb_core::difftracker::PodUpdate {
                address: &address,
                location: &at,
                outbound_identity: "",
                uid: "",
            };
            if self
                .tracker
                .update_pod(clb_core::difftracker::Operation::Remove, &pod)
                .is_ok()
            {
                dropped += 1;
            }
        }
        dropped
    }

    /// The writers the restart gate waits for now.
    pub fn pending_writers(&self) -> Vec<String> {
        self.gate.pending_writers()
    }

    /// Brings the tracker's removal gate in step with the restart gate (after an observe, a
    /// resync, or when a bounded wait may have passed). Returns true when it released removals.
    /// Cheap when nothing changed.
    pub fn update_gates(&mut self) -> bool {
        let now = Instant::now();
        if self.dispatch.nrp_observed() && !self.gate.nrp_observed() {
            // At the first read-back the tracker withholds everything, so these are every
            // location and every service NRP has that is not desired.
            let nothing_to_protect = self.tracker.counts().actual_locations == 0
                && self.tracker.withheld_deletions().is_empty();
            self.gate.observed(now, nothing_to_protect);
        }
        match self.gate.poll(now) {
            Some(withheld) if &withheld != self.tracker.withheld() => {
                tracing::debug!(gateway = %self.name, ?withheld, "restart gate changed");
                self.tracker.set_withheld(withheld);
                true
            }
            _ => false,
        }
    }

    /// The restart gate as the Admin API shows it.
    pub fn gate_view(&self) -> GateView {
        self.gate.view(&self.tracker, Instant::now())
    }
}

/// What the writers' streams (`WatchSession`, `WatchServices`) read of a gateway without its lock:
/// published by the gateway's task ([`crate::grpc::push`]) after changes, at most every
/// [`crate::grpc::push::SNAPSHOT_SPACING`], and only while someone follows it.
#[derive(Debug, Default)]
pub struct GatewaySnapshot {
    /// The gateway's change counter it was built at ([`GatewayHandle::changes`]).
    pub changes: u64,
    /// Every inbound service with its writer-facing state (condition included, locations not
    /// counted), by canonical name.
    pub services: HashMap<String, clb_proto::v1::ServiceState>,
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
    snapshot: tokio::sync::watch::Sender<Arc<GatewaySnapshot>>,
}

impl GatewayHandle {
    fn new(name: String, gateway: Gateway) -> Self {
        Self {
            name,
            inner: Mutex::new(gateway),
            wake: Notify::new(),
            changes: AtomicU64::new(0),
            closed: Default::default(),
            snapshot: tokio::sync::watch::Sender::new(Arc::default()),
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
    /// what there is to cut and publishes a new snapshot.
    pub fn changed(&self) {
        self.changes.fetch_add(1, Ordering::Relaxed);
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
        self.changed();
        (rx, self.changes())
    }

    /// Whether anyone follows the snapshot.
    pub fn followed(&self) -> bool {
        self.snapshot.receiver_count() > 0
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
    ports: crate::grpc::push::Ports,
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
                Arc::new(GatewayHandle::new(
                    name.clone(),
                    Gateway::new(name.clone(), &config, metrics.clone()),
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
                *g.lock() = Gateway::new(g.name.clone(), &self.config, self.metrics.clone());
            }
        }
        if leading {
            self.metrics.set_leader(true);
            self.leader.send_replace(true);
        }
        for g in &self.order {
            g.changed();
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

    /// Starts one task per gateway ([`crate::grpc::push`]) once, when called inside a Tokio
    /// runtime (the gRPC services call it when they are built). The tasks end when the server is
    /// dropped.
    pub fn start_tasks(self: &Arc<Self>) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        self.tasks.call_once(|| {
            for g in &self.order {
                crate::grpc::push::spawn(self, g.clone());
            }
        });
    }

    /// Tells every gateway's task that its state changed (after a change made through
    /// [`GatewayHandle::lock`] outside the gRPC services, as tests do).
    pub fn notify_work(&self) {
        for g in &self.order {
            g.changed();
        }
    }

    /// The connected worker sessions.
    pub fn ports(&self) -> &crate::grpc::push::Ports {
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

#[cfg(test)]
mod tests {
    use super::*;
    use clb_core::difftracker::{ActualSnapshot, Operation};
    use clb_core::dispatch::UnitWork;

    fn gateway() -> Gateway {
        Gateway::new(
            "gw".into(),
            &ServerConfig::default(),
            Arc::new(Metrics::new()),
        )
    }

    fn frontends(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(s, ip)| (s.to_string(), ip.to_string()))
            .collect()
    }

    fn observed(work_id: u64, load_balancers: &[&str], last: bool) -> Report {
        Report {
            work_id,
            applied: Vec::new(),
            progress: Vec::new(),
            outcome: Outcome::Observed {
                snapshot: ActualSnapshot {
                    load_balancers: load_balancers.iter().map(|s| s.to_string()).collect(),
                    ..ActualSnapshot::default()
                },
                last,
            },
        }
    }

    #[test]
    fn an_observe_replaces_the_frontends_with_the_union_of_its_parts_at_the_last_part() {
        let mut g = gateway();
        g.tracker.update_service(Operation::Add, "a").unwrap();
        g.tracker.update_service(Operation::Add, "b").unwrap();
        g.frontends.insert("old".into(), "20.0.0.1".into());
        let now = Instant::now();
        let unit = g.dispatch.next_unit(&mut g.tracker, 1, 7, now).unwrap();
        assert_eq!(unit.work, UnitWork::Observe);
        // Another worker's report, or one for another unit, is ignored.
        assert!(!g.on_report(
            2,
            observed(7, &[], true),
            frontends(&[("a", "x")]),
            Vec::new(),
            now
        ));
        assert!(!g.on_report(
            1,
            observed(8, &[], true),
            frontends(&[("a", "x")]),
            Vec::new(),
            now
        ));
        let part = frontends(&[("a", "20.0.0.2")]);
        assert!(g.on_report(1, observed(7, &["a", "b"], false), part, Vec::new(), now));
        assert_eq!(
            g.frontends,
            HashMap::from([("old".to_string(), "20.0.0.1".to_string())]),
            "nothing changes before the last part"
        );
        let part = frontends(&[("b", "20.0.0.3")]);
        assert!(g.on_report(1, observed(7, &[], true), part, Vec::new(), now));
        assert_eq!(
            g.frontends,
            HashMap::from([
                ("a".to_string(), "20.0.0.2".to_string()),
                ("b".to_string(), "20.0.0.3".to_string()),
            ])
        );
        assert!(g.dispatch.nrp_observed());
        // The parts of an observe that was given up do not leak into the next one.
        g.dispatch.request_observe();
        let unit = g.dispatch.next_unit(&mut g.tracker, 1, 9, now).unwrap();
        assert_eq!(unit.work, UnitWork::Observe);
        let part = frontends(&[("a", "20.0.0.4")]);
        assert!(g.on_report(1, observed(9, &["a", "b"], false), part, Vec::new(), now));
        g.dispatch.release_worker(1, now);
        g.dispatch.request_observe();
        let unit = g
            .dispatch
            .next_unit(&mut g.tracker, 1, 10, now + Duration::from_secs(60));
        assert_eq!(unit.map(|u| u.work), Some(UnitWork::Observe));
        assert!(g.on_report(
            1,
            observed(10, &["a", "b"], true),
            Vec::new(),
            Vec::new(),
            now
        ));
        assert!(g.frontends.is_empty(), "{:?}", g.frontends);
    }

    fn ports(list: &[(clb_proto::v1::Protocol, u32)]) -> Vec<ServicePort> {
        list.iter()
            .map(|&(p, port)| ServicePort {
                port,
                protocol: p as i32,
                target_port: 0,
            })
            .collect()
    }

    #[test]
    fn port_sets_compare_the_effective_target_port() {
        use clb_proto::v1::Protocol::Tcp;
        let with_target = |target_port| {
            vec![ServicePort {
                port: 80,
                protocol: Tcp as i32,
                target_port,
            }]
        };
        // 0 is the port itself: the same rule as an explicit 80.
        assert_eq!(port_set(&with_target(0)), port_set(&with_target(80)));
        assert_eq!(port_set(&with_target(0)), port_set(&ports(&[(Tcp, 80)])));
        assert_ne!(port_set(&with_target(0)), port_set(&with_target(8080)));
        assert_ne!(port_set(&with_target(8080)), port_set(&with_target(8081)));
        assert!(programmable(&with_target(65_535)[0]));
        assert!(!programmable(&with_target(65_536)[0]));
    }

    #[test]
    fn observed_rules_create_again_only_a_desired_service_read_back_with_other_ports() {
        use clb_proto::v1::Protocol::{Tcp, Udp, Unspecified};
        let mut g = gateway();
        let now = Instant::now();
        g.tracker.update_service(Operation::Add, "a").unwrap();
        g.service_ports.insert("a".into(), ports(&[(Tcp, 80)]));
        let unit = g.dispatch.next_unit(&mut g.tracker, 1, 7, now).unwrap();
        assert_eq!(unit.work, UnitWork::Observe);
        // A creation of `a` is in flight (with the desired ports): its report decides.
        let unit = g.dispatch.next_unit(&mut g.tracker, 1, 6, now).unwrap();
        let UnitWork::Services(changes) = &unit.work else {
            panic!("{:?}", unit.work)
        };
        assert_eq!(g.ports_for(&changes[0]), ports(&[(Tcp, 80)]));
        for s in ["b", "c", "d"] {
            g.tracker.update_service(Operation::Add, s).unwrap();
            g.service_ports.insert(s.into(), ports(&[(Tcp, 80)]));
        }
        g.service_ports
            .insert("c".into(), ports(&[(Unspecified, 80)]));
        let before = g.tracker.revision();
        let rules = vec![
            ("a".to_string(), ports(&[(Tcp, 1)])),
            ("c".to_string(), ports(&[(Tcp, 1)])),
            ("d".to_string(), ports(&[(Tcp, 80), (Tcp, 80)])),
            ("gone".to_string(), ports(&[(Tcp, 1)])),
        ];
        let lbs = ["a", "b", "c", "d"];
        assert!(g.on_report(1, observed(7, &lbs, true), Vec::new(), rules, now));
        assert_eq!(
            g.tracker.revision(),
            before,
            "in flight (a), no rules read (b), unprogrammable (c), the same (d): nothing to do"
        );
        assert!(!g.programmed_ports.contains_key("a"));
        assert!(!g.programmed_ports.contains_key("b"));
        assert!(!g.programmed_ports.contains_key("gone"), "not in NRP");
        assert_eq!(g.programmed_ports["c"], ports(&[(Tcp, 1)]));

        // b's rules read back, with another protocol: b is created again (and only b).
        g.dispatch.request_observe();
        let unit = g.dispatch.next_unit(&mut g.tracker, 1, 8, now).unwrap();
        assert_eq!(unit.work, UnitWork::Observe);
        let rules = vec![("b".to_string(), ports(&[(Udp, 80)]))];
        assert!(g.on_report(1, observed(8, &lbs, true), Vec::new(), rules, now));
        assert!(g.tracker.revision() > before, "b is created again");
    }
    /// Found by fault seeds 577789694, 269131352 and 550532718: a creation that NRP applied but
    /// whose report said "unconfirmed" left its ports marked as in flight for good, so observes
    /// skipped the service's rules and a later port change was never sent.
    #[test]
    fn an_unconfirmed_creation_does_not_hide_the_rules_read_back() {
        use clb_proto::v1::Protocol::Tcp;
        let mut g = gateway();
        let now = Instant::now();
        g.tracker.update_service(Operation::Add, "a").unwrap();
        g.service_ports.insert("a".into(), ports(&[(Tcp, 80)]));
        let unit = g.dispatch.next_unit(&mut g.tracker, 1, 1, now).unwrap();
        assert_eq!(unit.work, UnitWork::Observe);
        assert!(g.on_report(1, observed(1, &[], true), Vec::new(), Vec::new(), now));
        let unit = g.dispatch.next_unit(&mut g.tracker, 1, 2, now).unwrap();
        let UnitWork::Services(changes) = &unit.work else {
            panic!("{:?}", unit.work)
        };
        g.ports_for(&changes[0]);
        let unconfirmed = Report {
            work_id: 2,
            applied: Vec::new(),
            progress: Vec::new(),
            outcome: Outcome::Repair {
                retry_after: Duration::ZERO,
                code: "OperationUnconfirmed".into(),
                message: "accepted, not followed to its end".into(),
            },
        };
        assert!(g.on_report(1, unconfirmed, Vec::new(), Vec::new(), now));
        // NRP did create it; the read-back finds it with the ports sent.
        let later = now + Duration::from_secs(60);
        let unit = g.dispatch.next_unit(&mut g.tracker, 1, 3, later).unwrap();
        assert_eq!(unit.work, UnitWork::Observe);
        let rules = vec![("a".to_string(), ports(&[(Tcp, 80)]))];
        assert!(g.on_report(1, observed(3, &["a"], true), Vec::new(), rules, later));
        assert!(
            g.tracker.service_view("a").is_some_and(|v| v.actual),
            "in NRP"
        );
        assert_eq!(g.programmed_ports.get("a"), Some(&ports(&[(Tcp, 80)])));
        // The port changes: the service is created again.
        let before = g.tracker.revision();
        let update = clb_proto::v1::Update {
            kind: Some(clb_proto::v1::update::Kind::Service(
                clb_proto::v1::ServiceUpdate {
                    id: "a".into(),
                    operation: clb_proto::v1::Operation::Add as i32,
                    ports: ports(&[(Tcp, 1000)]),
                },
            )),
        };
        g.remember_ports(&update);
        assert!(g.tracker.revision() > before, "a is created again");
    }
}
