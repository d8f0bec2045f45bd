//! The kube watcher and the node agent: Kubernetes → desired state of the clb state server.
//!
//! One process, two modes (binary `clb-watcher`, docs/watcher.md):
//! - **cluster** (writer `watcher`): watches Services, EndpointSlices, Nodes and (unless pods are
//!   left to node agents) egress-labelled Pods; writes inbound identities, their endpoints and pods;
//!   writes back `status.loadBalancer.ingress` and owns a finalizer on the Services it programs;
//! - **node agent** (`--node NAME`, writer `node-agent/NAME`): watches only the egress-labelled
//!   Pods on that node and the Node itself; writes those pods.
//!
//! Three tasks share one [`translate::Translator`]:
//! 1. the **kube side** (this module) runs one `kube::runtime::watcher` stream per kind, decodes
//!    each object (a malformed one is logged and skipped, the stream goes on), feeds the translator
//!    and queues the delta updates it returns;
//! 2. the **sender** (`sender.rs`) sends one `Resync` (the translator's full view) once every
//!    stream has listed, again after every relist, after every failed call or reconnect and when
//!    the server no longer lists a resync of ours (it restarted), and in between coalesces the
//!    queued deltas into `Apply` batches;
//! 3. the **write-back** (`writeback.rs`, cluster mode) adds the finalizer, patches the ingress IP
//!    once the service is programmed and removes the finalizer once NRP no longer has the service.
//!
//! These and the other tasks (readiness gate, node moves, PoolService side) are supervised
//! (`supervise.rs`): one that returns or panics stops the watcher with a [`WatcherError`] naming it.

pub mod backoff;
pub mod cli;
pub mod decode;
pub mod families;
#[cfg(any(test, feature = "test-support"))]
pub mod faults;
pub mod ingress;
pub mod metrics;
pub mod poolservice;
pub mod routing;
pub mod settings;
pub mod supervise;
pub mod translate;
pub mod webhook;

mod gate;
mod moves;
mod pools;
mod relist;
mod sender;
mod writeback;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use clb_proto::v1::Update;
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::watcher::{self, Event};
use tokio::sync::{Notify, mpsc, watch};

use clb_client::client::ConnectOptions;
pub use clb_gateways::Gateways;
pub use metrics::WatcherMetrics;
use poolservice::PoolService;
pub use supervise::WatcherError;
use supervise::{Ended, Tasks, fault_point};
pub use translate::{
    DEFAULT_CLASS, EGRESS_LABEL, FINALIZER, NAT_GATEWAY_ANNOTATION, SERVICE_NAME_LABEL,
};
use translate::{Kind, ObjKey, Translator, TranslatorConfig};
pub use writeback::{CONDITION_TYPE, REPORTING_CONTROLLER};

/// Writer name of the cluster-wide watcher.
pub const WATCHER_WRITER: &str = "watcher";

/// Writer name of the node agent of node `node`: `node-agent/<node>`.
pub fn node_agent_writer(node: &str) -> String {
    format!("node-agent/{node}")
}

/// What the process watches and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// The cluster-wide watcher (writer `watcher`).
    Cluster {
        /// Whether it also reports egress-labelled pods (false when node agents do).
        pods: bool,
    },
    /// A node agent (writer `node-agent/<node>`): only the pods on this node.
    NodeAgent {
        /// The node's name.
        node: String,
    },
}

/// Configuration of [`run`].
#[derive(Debug, Clone)]
pub struct WatcherConfig {
    /// How to reach the state server (gateway, TLS, timeouts). Connection attempts are retried by
    /// the watcher itself, forever.
    pub server: ConnectOptions,
    /// Cluster watcher or node agent.
    pub mode: Mode,
    /// The `spec.loadBalancerClass` we serve.
    pub class: String,
    /// Whether LoadBalancer Services without a `loadBalancerClass` are ours.
    pub claim_unclassed: bool,
    /// Cluster mode: write back (finalizer, ingress IP). When false, nothing is patched and
    /// Services are programmed without waiting for the finalizer.
    pub write_back: bool,
    /// The finalizer put on our Services.
    pub finalizer: String,
    /// How long deltas are collected before an `Apply` is sent.
    pub coalesce: Duration,
    /// An `Apply` is sent at once when this many deltas are queued.
    pub max_batch: usize,
    /// The longest delay between two polls of the state server for a service that has something
    /// pending (polls start 50 ms after the Service or its endpoints changed, and double up to
    /// this).
    pub poll_interval: Duration,
    /// How often the write-back re-checks a service that is settled (programmed with its ingress
    /// and condition written, or rejected by Azure).
    pub recheck_interval: Duration,
    /// First delay after a failed call to the state server (doubled up to `backoff_max`).
    pub backoff_initial: Duration,
    /// Largest delay between attempts after a failed call; a refused one (no connection, or
    /// `UNAVAILABLE` from a standby) waits at most [`backoff::RECONNECT_MAX`] (2 s).
    pub backoff_max: Duration,
    /// Largest delay before a failed watch connection is tried again (from 200 ms, doubling, with
    /// jitter; reset by any event). It bounds how long after an API-server outage a change takes
    /// to be seen: kube's default (30 s, client-go's) let a change written as the API server came
    /// back wait 10–15 s. An expired watch (`410 Gone`) never waits.
    pub watch_backoff_max: Duration,
    /// Where the watcher's tasks record what they do (`--metrics-listen` serves them).
    pub metrics: Arc<WatcherMetrics>,
    /// Several gateways (`--gateways-file`): each endpoint and pod goes to the gateway of its
    /// node, each Service to the gateways its annotations select (`routing`). `None`: everything
    /// goes to `server.gateway`.
    pub gateways: Option<Arc<Gateways>>,
    /// A node moved to another gateway leaves the old one once the new one has programmed its
    /// addresses, or after this long.
    pub move_bound: Duration,
    /// With `gateways`, cluster mode and write-back: create one PoolService per (Service, selected
    /// gateway), program PoolServices of our class that others created, and write their status.
    pub pool_services: bool,
    /// Cluster mode: drive the pod readiness gate `clb.azure.com/programmed` (docs/readiness-gate.md).
    pub readiness_gate: bool,
    /// A gated pod not programmed within this long gets its gate `True` anyway (reason
    /// `Timeout`, a Warning Event).
    pub readiness_gate_timeout: Duration,
    /// Test support (feature `test-support`): faults injected into the watcher's tasks.
    #[cfg(any(test, feature = "test-support"))]
    pub faults: faults::Faults,
}

impl WatcherConfig {
    /// Defaults: our class, unclassed Services claimed, write-back on, 50 ms coalescing, batches
    /// of up to 1000 updates, 1 s polling, 60 s ingress re-checks, backoff
    /// 200 ms doubling to 10 s.
    pub fn new(server: ConnectOptions, mode: Mode) -> Self {
        Self {
            server,
            mode,
            class: DEFAULT_CLASS.to_owned(),
            claim_unclassed: true,
            write_back: true,
            finalizer: FINALIZER.to_owned(),
            coalesce: Duration::from_millis(50),
            max_batch: 1_000,
            poll_interval: Duration::from_secs(1),
            recheck_interval: Duration::from_secs(60),
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
            watch_backoff_max: Duration::from_secs(1),
            metrics: Arc::new(WatcherMetrics::new()),
            gateways: None,
            move_bound: Duration::from_secs(30),
            pool_services: false,
            readiness_gate: false,
            readiness_gate_timeout: Duration::from_secs(600),
            #[cfg(any(test, feature = "test-support"))]
            faults: faults::Faults::default(),
        }
    }

    /// One configuration per gateway written to, with its translator's: without a gateways file
    /// this one; with one, one per gateway of the file (the default first), each connecting to its
    /// gateway and translating only its share. A node agent's share is its node's pods in the lane
    /// of the gateway that serves its node (its Node's labels) and nothing in the others: a pod on
    /// a node another gateway serves is never located there (not even through its `hostIPs`), so
    /// those lanes send nothing, and their first resync succeeds without a call.
    pub fn lanes(&self) -> Vec<(Self, TranslatorConfig)> {
        let Some(gateways) = &self.gateways else {
            return vec![(self.clone(), self.translator_config())];
        };
        gateways
            .all()
            .iter()
            .map(|g| {
                let mut c = self.clone();
                c.server.gateway = g.name.clone();
                let mut t = c.translator_config();
                t.gateway = Some(routing::GatewayScope {
                    gateways: gateways.clone(),
                    name: g.name.clone(),
                });
                (c, t)
            })
            .collect()
    }

    /// The writer's name: `watcher` or `node-agent/<node>`.
    pub fn writer(&self) -> String {
        match &self.mode {
            Mode::Cluster { .. } => WATCHER_WRITER.to_owned(),
            Mode::NodeAgent { node } => node_agent_writer(node),
        }
    }

    /// The kinds this mode watches.
    pub fn kinds(&self) -> Vec<Kind> {
        match &self.mode {
            Mode::Cluster { pods: true } => Kind::ALL.to_vec(),
            Mode::Cluster { pods: false } => vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
            Mode::NodeAgent { .. } => vec![Kind::Pod, Kind::Node],
        }
    }

    fn writes_back(&self) -> bool {
        self.write_back && matches!(self.mode, Mode::Cluster { .. })
    }

    /// Whether PoolServices are watched and written.
    pub(crate) fn pool_services_on(&self) -> bool {
        self.pool_services && self.gateways.is_some() && self.writes_back()
    }

    /// The translator's configuration for this mode.
    pub fn translator_config(&self) -> TranslatorConfig {
        TranslatorConfig {
            class: self.class.clone(),
            claim_unclassed: self.claim_unclassed,
            require_finalizer: self.writes_back().then(|| self.finalizer.clone()),
            node: match &self.mode {
                Mode::NodeAgent { node } => Some(node.clone()),
                Mode::Cluster { .. } => None,
            },
            gateway: None,
        }
    }
}

/// State shared by the kube side and the sender, behind one mutex (never held across an await).
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) translator: Translator,
    /// Deltas not sent yet.
    pub(crate) pending: Vec<Update>,
    /// When the oldest pending delta was queued.
    pub(crate) first_pending_at: Option<Instant>,
    /// Number of watch events processed so far.
    pub(crate) seq: u64,
    /// Every stream has completed its first list.
    pub(crate) initialized: bool,
    /// Streams that have completed a list at least once.
    listed: HashSet<Kind>,
    /// Streams between `Init` and `InitDone`.
    pub(crate) relisting: HashSet<Kind>,
    /// A resync must be sent (first list, relist, failure).
    pub(crate) resync_due: bool,
    /// The sender has a call under way.
    pub(crate) in_flight: bool,
    /// The last `seq` whose deltas the server has acknowledged.
    pub(crate) acked: watch::Sender<u64>,
    /// Node agent: the locations of its last successful resync.
    pub(crate) agent_locations: BTreeSet<IpAddr>,
    /// The server's epoch at this writer's last completed resync that sent something (`None`:
    /// nothing sent yet, so nothing to lose). An answer or session message with another epoch, or
    /// saying the server holds no resync of ours, makes a resync due at once.
    pub(crate) session_epoch: Option<u64>,
    /// A resync is due at once, even while a stream relists: the server holds nothing of ours.
    pub(crate) resync_now: bool,
}

impl Shared {
    fn new(translator: Translator) -> (Self, watch::Receiver<u64>) {
        let (acked, acked_rx) = watch::channel(0);
        (
            Self {
                translator,
                pending: Vec::new(),
                first_pending_at: None,
                seq: 0,
                initialized: false,
                listed: HashSet::new(),
                relisting: HashSet::new(),
                resync_due: false,
                in_flight: false,
                acked,
                agent_locations: BTreeSet::new(),
                session_epoch: None,
                resync_now: false,
            },
            acked_rx,
        )
    }

    fn push(&mut self, deltas: Vec<Update>) {
        if !self.initialized || deltas.is_empty() {
            // Before the first resync, the resync carries everything.
            return;
        }
        if self.pending.is_empty() {
            self.first_pending_at = Some(Instant::now());
        }
        self.pending.extend(deltas);
    }

    /// With nothing queued, due or under way, every event so far is acknowledged.
    pub(crate) fn settle(&mut self) {
        if self.initialized && self.pending.is_empty() && !self.in_flight && !self.resync_due {
            let seq = self.seq;
            self.acked.send_if_modified(|a| {
                let changed = *a < seq;
                *a = (*a).max(seq);
                changed
            });
        }
    }

    pub(crate) fn ack(&mut self, seq: u64) {
        self.acked.send_if_modified(|a| {
            let changed = *a < seq;
            *a = (*a).max(seq);
            changed
        });
    }
}

pub(crate) type SharedRef = Arc<Mutex<Shared>>;

pub(crate) fn lock(shared: &SharedRef) -> MutexGuard<'_, Shared> {
    // A panic while holding the lock is a bug; the state is still consistent enough to go on.
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

/// The watcher's Kubernetes clients, both to one API server. The watches go without kube's own
/// request retries (its default policy retries a 429/503/504 answer 3 times, waiting 0.5, 1 and 2 s:
/// after an API-server restart that answers 503 while it starts, a watch then waited ~3.5 s longer
/// than needed); their retries are paced by `relist::paced` (at most `--watch-backoff-max`).
/// The writes (finalizers, status, Events) keep kube's retries.
#[derive(Clone)]
pub struct KubeClients {
    /// For the list and watch requests.
    pub watch: kube::Client,
    /// For PATCHes and Events.
    pub write: kube::Client,
}

impl KubeClients {
    /// Both clients from one configuration (in a cluster: `kube::Config::infer`).
    pub fn from_config(config: kube::Config) -> Result<Self, kube::Error> {
        let write = kube::Client::try_from(config.clone())?;
        let mut watch = config;
        watch.default_retry = false;
        Ok(Self {
            watch: kube::Client::try_from(watch)?,
            write,
        })
    }
}

impl std::fmt::Debug for KubeClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClients")
            .field("watch", &self.watch.default_namespace())
            .finish_non_exhaustive()
    }
}

/// One gateway written to: its translator and queue, and the sender's wake-up.
#[derive(Clone)]
pub(crate) struct Lane {
    /// The gateway's name (`""`: the one of `--gateway`, without a gateways file).
    pub(crate) gateway: String,
    pub(crate) shared: SharedRef,
    pub(crate) notify: Arc<Notify>,
    /// The lane's configuration (its `server.gateway` is the lane's).
    pub(crate) config: WatcherConfig,
}

/// Runs the watcher (or node agent) until `shutdown` completes. Every failure (kube API, state
/// server) is retried; it ends with an error only when the state server's endpoint is invalid
/// ([`WatcherError::Client`]) or when one of its tasks returns or panics
/// ([`WatcherError::TaskEnded`], logged; the other tasks are stopped): see [`supervise`].
pub async fn run(
    config: WatcherConfig,
    kube: KubeClients,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WatcherError> {
    let writer = config.writer();
    let kinds = config.kinds();
    tracing::info!(
        writer = %writer,
        mode = ?config.mode,
        class = %config.class,
        claim_unclassed = config.claim_unclassed,
        write_back = config.writes_back(),
        gateways = ?config.gateways.as_ref().map(|g| g.names()),
        "starting"
    );
    if config.gateways.is_some() {
        config
            .metrics
            .expect_gateways(config.lanes().into_iter().map(|(c, _)| c.server.gateway));
    }
    let (supervisor, tasks) = supervise::Supervisor::new();
    let mut lanes = Vec::new();
    let mut acks = Vec::new();
    for (lane_config, tconfig) in config.lanes() {
        let (shared, acked_rx) = Shared::new(Translator::new(tconfig));
        let lane = Lane {
            gateway: lane_config.server.gateway.clone(),
            shared: Arc::new(Mutex::new(shared)),
            notify: Arc::new(Notify::new()),
            config: lane_config,
        };
        let sender = sender::run(
            lane.shared.clone(),
            lane.notify.clone(),
            lane.config.clone(),
        );
        let gateway = lane.gateway.clone();
        tasks.spawn(supervise::SENDER, async move {
            match sender.await {
                Ok(()) if gateway.is_empty() => Ended::failed(supervise::SENDER, "it returned"),
                Ok(()) => Ended::failed(
                    supervise::SENDER,
                    format!("it returned (gateway {gateway:?})"),
                ),
                Err(e) => Ended::Client(e),
            }
        });
        acks.push(acked_rx);
        lanes.push(lane);
    }
    let acked_rx = if acks.len() == 1 {
        acks.remove(0)
    } else {
        min_of(acks, &tasks)
    };
    let wb_tx = if config.writes_back() {
        let (tx, rx) = mpsc::unbounded_channel();
        tasks.spawn(
            supervise::WRITE_BACK,
            writeback::run(
                writeback::Config::from(&config),
                kube.write.clone(),
                rx,
                acked_rx,
            ),
        );
        Some(tx)
    } else {
        None
    };

    if config.readiness_gate && matches!(config.mode, Mode::Cluster { .. }) {
        tasks.spawn(
            supervise::READINESS_GATE,
            gate::Gate::new(config.clone(), lanes.clone(), kube.write.clone())
                .run(kube.watch.clone()),
        );
    }
    let streams = streams(&kube.watch, &config, &kinds);
    let pool_stream: BoxStream<'static, Item> = if config.pool_services_on() {
        let api: Api<DynamicObject> =
            Api::all_with(kube.watch.clone(), &ApiResource::erase::<PoolService>(&()));
        relist::paced(
            watcher::watcher(api, watcher::Config::default()),
            relist::connection_backoff(config.watch_backoff_max),
        )
        .map(Item::Pool)
        .chain(futures::stream::once(async { Item::PoolEnded }))
        .boxed()
    } else {
        futures::stream::pending().boxed()
    };
    let streams = futures::stream::select(streams, pool_stream);
    tasks.spawn(
        supervise::KUBE_SIDE,
        kube_side(streams, lanes, wb_tx, kinds, config.clone(), tasks.clone()),
    );
    drop(tasks);
    let result = supervisor.watch(shutdown).await;
    tracing::info!(writer = %writer, "stopped");
    result
}

/// The smallest of several acknowledged sequence numbers, as one channel (a task follows them).
fn min_of(mut rxs: Vec<watch::Receiver<u64>>, tasks: &Tasks) -> watch::Receiver<u64> {
    let (tx, rx) = watch::channel(0);
    tasks.spawn(supervise::ACK_FOLLOWER, async move {
        loop {
            let m = rxs.iter().map(|r| *r.borrow()).min().unwrap_or(0);
            tx.send_if_modified(|a| {
                let changed = *a != m;
                *a = m;
                changed
            });
            let changes = rxs.iter_mut().map(|r| Box::pin(r.changed()));
            let (r, _, _) = futures::future::select_all(changes).await;
            if r.is_err() {
                return Ended::failed(
                    supervise::ACK_FOLLOWER,
                    "the acknowledgements of a lane closed",
                );
            }
            if tx.is_closed() {
                // Its reader (the write-back) is gone: that end is the one to report.
                return Ended::Done;
            }
        }
    });
    rx
}

type PoolEvent = Result<Event<DynamicObject>, watcher::Error>;

/// An event of one of the merged watch streams.
enum Item {
    Obj(Kind, Result<Event<DynamicObject>, watcher::Error>),
    Pool(PoolEvent),
    /// The watch of a kind ended (kube's watcher streams do not: the kube side stops).
    Ended(Kind),
    /// The PoolService watch ended (it does not: the PoolService side stops).
    PoolEnded,
}

/// One watch stream per kind, merged, each followed by [`Item::Ended`]. Failed connections are
/// retried with [`relist::connection_backoff`]; an expired watch (410 Gone) relists at once
/// ([`relist::paced`]).
fn streams(
    kube: &kube::Client,
    config: &WatcherConfig,
    kinds: &[Kind],
) -> futures::stream::SelectAll<BoxStream<'static, Item>> {
    let mut all = futures::stream::SelectAll::new();
    for &kind in kinds {
        let (resource, wc) = match kind {
            Kind::Service => (
                ApiResource::erase::<Service>(&()),
                watcher::Config::default(),
            ),
            Kind::EndpointSlice => (
                ApiResource::erase::<EndpointSlice>(&()),
                watcher::Config::default().labels(SERVICE_NAME_LABEL),
            ),
            Kind::Pod => {
                let wc = watcher::Config::default().labels(EGRESS_LABEL);
                let wc = match &config.mode {
                    Mode::NodeAgent { node } => wc.fields(&format!("spec.nodeName={node}")),
                    Mode::Cluster { .. } => wc,
                };
                (ApiResource::erase::<Pod>(&()), wc)
            }
            Kind::Node => {
                let wc = match &config.mode {
                    Mode::NodeAgent { node } => {
                        watcher::Config::default().fields(&format!("metadata.name={node}"))
                    }
                    Mode::Cluster { .. } => watcher::Config::default(),
                };
                (ApiResource::erase::<Node>(&()), wc)
            }
        };
        let api: Api<DynamicObject> = Api::all_with(kube.clone(), &resource);
        let s = relist::paced(
            watcher::watcher(api, wc),
            relist::connection_backoff(config.watch_backoff_max),
        )
        .map(move |e| Item::Obj(kind, e))
        .chain(futures::stream::once(async move { Item::Ended(kind) }))
        .boxed();
        all.push(s);
    }
    all
}

/// What a watch event does, its object set aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Init,
    Apply,
    Delete,
    InitDone,
}

/// A decoded object of a watched kind.
enum Typed {
    Service(Box<Service>),
    Slice(Box<EndpointSlice>),
    Pod(Box<Pod>),
    Node(Box<Node>),
}

/// Feeds watch events into the lanes' translators until a stream ends (none does: it returns
/// why), and the PoolService events into the PoolService side (a panic there is reported as the
/// PoolService side's).
async fn kube_side(
    mut streams: impl futures::Stream<Item = Item> + Unpin,
    lanes: Vec<Lane>,
    wb: Option<mpsc::UnboundedSender<writeback::Msg>>,
    kinds: Vec<Kind>,
    config: WatcherConfig,
    tasks: Tasks,
) -> Ended {
    use supervise::{KUBE_SIDE, POOL_SERVICE_SIDE};
    let metrics = config.metrics.clone();
    let tconfig = config.translator_config();
    for lane in &lanes {
        lock(&lane.shared).translator.set_warn_unlocated(false);
    }
    let mut moves = moves::Moves::new(&lanes, config.move_bound, tasks);
    let mut seq = 0u64;
    let mut pools = pools::PoolSide::new(&config);
    while let Some(item) = streams.next().await {
        if fault_point!(config.faults, KUBE_SIDE) {
            return Ended::failed(KUBE_SIDE, "it returned");
        }
        let (kind, event) = match item {
            Item::Obj(kind, event) => (kind, event),
            Item::Pool(event) => {
                let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    if fault_point!(config.faults, POOL_SERVICE_SIDE) {
                        return false;
                    }
                    pools.event(event, &lanes, wb.as_ref());
                    true
                }));
                match handled {
                    Ok(true) => continue,
                    Ok(false) => return Ended::failed(POOL_SERVICE_SIDE, "it returned"),
                    Err(panic) => {
                        return Ended::failed(
                            POOL_SERVICE_SIDE,
                            supervise::panic_message(panic.as_ref()),
                        );
                    }
                }
            }
            Item::Ended(kind) => {
                return Ended::failed(KUBE_SIDE, format!("the watch of {kind} ended"));
            }
            Item::PoolEnded => {
                return Ended::failed(POOL_SERVICE_SIDE, "the PoolService watch ended");
            }
        };
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                let gone = relist::is_gone(&e);
                metrics.watch_restart(kind_label(kind), if gone { "expired" } else { "failed" });
                if gone {
                    tracing::info!(%kind, error = %e, "watch expired; relisting");
                } else {
                    tracing::warn!(%kind, error = %e, "watch failed; retrying with backoff");
                }
                continue;
            }
        };
        metrics.event(
            kind_label(kind),
            match &event {
                Event::Init => "init",
                Event::InitApply(_) | Event::Apply(_) => "apply",
                Event::Delete(_) => "delete",
                Event::InitDone => "init_done",
            },
        );
        seq += 1;
        // The write-back hears of the event once, before the lanes.
        let (phase, obj) = match event {
            Event::Init => (Phase::Init, None),
            Event::InitApply(o) | Event::Apply(o) => (Phase::Apply, Some(o)),
            Event::Delete(o) => (Phase::Delete, Some(o)),
            Event::InitDone => (Phase::InitDone, None),
        };
        let mut typed = None;
        let mut deleted = None;
        match (phase, obj) {
            (Phase::Init, _) => {
                if kind == Kind::Service
                    && let Some(wb) = &wb
                {
                    let _ = wb.send(writeback::Msg::RelistStart);
                }
            }
            (Phase::Apply, Some(obj)) => {
                if let Some(key) = ObjKey::of(kind, &obj.metadata) {
                    let t = decode_object(kind, obj, &key);
                    if let (Some(Typed::Service(svc)), Some(wb)) = (&t, &wb) {
                        let msg = match writeback::ServiceFacts::of(
                            &key,
                            svc,
                            &tconfig,
                            config.gateways.as_deref(),
                        ) {
                            Some(facts) => writeback::Msg::Seen { facts, seq },
                            None => writeback::Msg::Gone(key.clone()),
                        };
                        let _ = wb.send(msg);
                    }
                    if let Some(Typed::Node(node)) = &t {
                        moves.node_seen(&key.name, node, seq);
                    }
                    if let Some(Typed::Service(svc)) = &t {
                        pools.service_seen(&key, svc);
                    }
                    typed = Some((key, t));
                }
            }
            (Phase::Delete, Some(obj)) => {
                if let Some(key) = ObjKey::of(kind, &obj.metadata) {
                    if kind == Kind::Service
                        && let Some(wb) = &wb
                    {
                        let _ = wb.send(writeback::Msg::Gone(key.clone()));
                    }
                    if kind == Kind::Node {
                        moves.node_gone(&key.name);
                    }
                    if kind == Kind::Service {
                        pools.service_gone(&key);
                    }
                    deleted = Some(key);
                }
            }
            (Phase::InitDone, _) => {
                if kind == Kind::Service
                    && let Some(wb) = &wb
                {
                    let _ = wb.send(writeback::Msg::RelistDone);
                }
            }
            (Phase::Apply | Phase::Delete, None) => {}
        }
        let mut conflicts = BTreeMap::new();
        for (i, lane) in lanes.iter().enumerate() {
            let mut s = lock(&lane.shared);
            s.seq = seq;
            match phase {
                Phase::Init => {
                    if i == 0 {
                        tracing::debug!(%kind, "listing");
                    }
                    s.translator.begin_relist(kind);
                    s.relisting.insert(kind);
                }
                Phase::Apply => {
                    if let Some((key, t)) = &typed {
                        let deltas = apply_typed(&mut s.translator, kind, key, t.as_ref());
                        touched(wb.as_ref(), &deltas, seq);
                        s.push(deltas);
                    }
                }
                Phase::Delete => {
                    if let Some(key) = &deleted {
                        let deltas = delete_object(&mut s.translator, kind, key);
                        touched(wb.as_ref(), &deltas, seq);
                        s.push(deltas);
                    }
                }
                Phase::InitDone => {
                    let deltas = s.translator.end_relist(kind);
                    s.push(deltas);
                    s.relisting.remove(&kind);
                    s.listed.insert(kind);
                    if !s.initialized && kinds.iter().all(|k| s.listed.contains(k)) {
                        s.initialized = true;
                        if i == 0 {
                            metrics.lists_done();
                        }
                        s.translator.set_warn_unlocated(true);
                        let unlocated = s.translator.warn_unlocated();
                        let (services, endpoints, pods) = s.translator.counts();
                        tracing::info!(
                            gateway = %lane.gateway,
                            services,
                            endpoints,
                            pod_addresses = pods,
                            unlocated,
                            "every stream listed; resyncing"
                        );
                    }
                    if s.initialized {
                        // A relist becomes a resync: it also repairs anything the server lost.
                        s.resync_due = true;
                        s.pending.clear();
                        s.first_pending_at = None;
                    }
                }
            }
            for c in s.translator.take_port_conflicts() {
                conflicts.insert((c.service.clone(), c.port_name.clone()), c);
            }
            s.settle();
            drop(s);
            lane.notify.notify_one();
        }
        for c in conflicts.into_values() {
            tracing::warn!(service = %c.service, port = %c.port_name, chosen = c.chosen, "{}", c.message);
            if let Some(wb) = &wb {
                let _ = wb.send(writeback::Msg::PortConflict {
                    key: c.service,
                    port_name: c.port_name,
                    message: c.message,
                });
            }
        }
    }
    Ended::failed(KUBE_SIDE, "its watch streams ended")
}

/// The `kind` label of a resource kind.
fn kind_label(kind: Kind) -> &'static str {
    match kind {
        Kind::Service => "service",
        Kind::EndpointSlice => "endpointslice",
        Kind::Pod => "pod",
        Kind::Node => "node",
    }
}

/// Tells the write-back which inbound services the updates `deltas` (of event `seq`) change the
/// endpoints of: something is pending for them again, so it polls them soon.
fn touched(wb: Option<&mpsc::UnboundedSender<writeback::Msg>>, deltas: &[Update], seq: u64) {
    use clb_proto::v1::update::Kind as UpdateKind;
    let Some(wb) = wb else {
        return;
    };
    let uids: Vec<String> = deltas
        .iter()
        .filter_map(|u| match &u.kind {
            Some(UpdateKind::Endpoints(e)) => Some(families::service_uid(&e.service_id).to_owned()),
            _ => None,
        })
        .collect();
    if !uids.is_empty() {
        let _ = wb.send(writeback::Msg::Touched { uids, seq });
    }
}

/// Decodes a watched object (`None`: it does not decode; what was sent for it stays).
fn decode_object(kind: Kind, obj: DynamicObject, key: &ObjKey) -> Option<Typed> {
    let r = match kind {
        Kind::Service => obj
            .try_parse::<Service>()
            .map(|o| Typed::Service(Box::new(o))),
        Kind::EndpointSlice => obj
            .try_parse::<EndpointSlice>()
            .map(|o| Typed::Slice(Box::new(o))),
        Kind::Pod => obj.try_parse::<Pod>().map(|o| Typed::Pod(Box::new(o))),
        Kind::Node => obj.try_parse::<Node>().map(|o| Typed::Node(Box::new(o))),
    };
    match r {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(%kind, object = %key, error = %e, "object skipped: it does not decode");
            None
        }
    }
}

fn apply_typed(t: &mut Translator, kind: Kind, key: &ObjKey, obj: Option<&Typed>) -> Vec<Update> {
    match obj {
        None => {
            t.keep(kind, key);
            Vec::new()
        }
        Some(Typed::Service(svc)) => t.apply_service(svc),
        Some(Typed::Slice(s)) => t.apply_slice(s),
        Some(Typed::Pod(p)) => t.apply_pod(p),
        Some(Typed::Node(n)) => t.apply_node(n),
    }
}

fn delete_object(t: &mut Translator, kind: Kind, key: &ObjKey) -> Vec<Update> {
    match kind {
        Kind::Service => t.delete_service(key),
        Kind::EndpointSlice => t.delete_slice(key),
        Kind::Pod => t.delete_pod(key),
        Kind::Node => t.delete_node(&key.name),
    }
}
