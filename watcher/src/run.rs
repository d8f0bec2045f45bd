//! Wiring: [`run`] starts one lane and sender per gateway, the write-back, the readiness gate and
//! the kube side as supervised tasks, and hands each the handles and channels it talks through.

use std::future::Future;

use futures::StreamExt;
use tokio::sync::{mpsc, watch};

use crate::config::{Mode, WatcherConfig};
use crate::kube_side::{self, KubeSide};
use crate::lane::Lane;
use crate::supervise::{self, Ended, Tasks, WatcherError};
use crate::{gate, sender, writeback};

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
/// Runs the watcher (or node agent) until `shutdown` completes. Every failure (kube API, state
/// server) is retried; it ends with an error only when the state server's endpoint is invalid
/// ([`WatcherError::Client`]) or when one of its tasks returns or panics
/// ([`WatcherError::TaskEnded`], logged; the other tasks are stopped): see [`crate::supervise`].
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
        let (lane, acked_rx) = Lane::new(lane_config, tconfig);
        let sender = sender::run(lane.clone());
        let gateway = lane.gateway().to_owned();
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
    let write_back = if config.writes_back() {
        let (tx, rx) = mpsc::channel(writeback::INBOX);
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
    let streams = futures::stream::select(
        kube_side::streams(&kube.watch, &config, &kinds),
        kube_side::pool_stream(&kube.watch, &config),
    );
    tasks.spawn(
        supervise::KUBE_SIDE,
        kube_side::run(
            streams.boxed(),
            KubeSide {
                lanes,
                write_back,
                kinds,
                config: config.clone(),
                tasks: tasks.clone(),
            },
        ),
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
