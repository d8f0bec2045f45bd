//! What the watcher runs with: its mode, its writer's name, and [`WatcherConfig`] (built from the
//! flags by `cli.rs`), split into one configuration per gateway written to ([`WatcherConfig::lanes`]).

use std::sync::Arc;
use std::time::Duration;

use clb_client::client::ConnectOptions;
use clb_gateways::Gateways;

use crate::metrics::WatcherMetrics;
use crate::routing;
use crate::translate::{DEFAULT_CLASS, FINALIZER, Kind, TranslatorConfig};

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

/// Configuration of [`crate::run`].
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
    /// First delay after a failed call to the state server, or to Kubernetes from the write-back
    /// (doubled up to `backoff_max`). Nothing polls: the write-back, the readiness gate and node
    /// moves follow what the state server pushes.
    pub backoff_initial: Duration,
    /// Largest delay between attempts after a failed call; a refused one (no connection, or
    /// `UNAVAILABLE` from a standby) waits at most [`crate::backoff::RECONNECT_MAX`] (2 s).
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
    pub faults: crate::faults::Faults,
}

impl WatcherConfig {
    /// Defaults: our class, unclassed Services claimed, write-back on, 50 ms coalescing, batches
    /// of up to 1000 updates, retries from 200 ms doubling to 10 s.
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
            faults: crate::faults::Faults::default(),
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

    pub(crate) fn writes_back(&self) -> bool {
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
