//! The state-server side of the watcher: resyncs and coalesced `Apply` batches, with reconnects.
//!
//! Nothing acknowledged is ever lost: a failed call (or a failed connection) drops the queued deltas
//! and makes a resync due, and the resync carries the translator's whole view.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use clb_proto::v1::{ClusterNode, ClusterTopology, ResyncScope, Update, WriterSession};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Mode, SharedRef, WatcherConfig, lock};
use crate::backoff::ServerBackoff;
use crate::supervise::{SENDER, fault_point};
use clb_client::client::{Client, ClientError, ConnectOptions, scope};

/// A connection to the state server, made on demand (one attempt per call; the caller backs off).
#[derive(Debug)]
pub(crate) struct Conn {
    options: ConnectOptions,
    client: Option<Client>,
}

impl Conn {
    pub(crate) fn new(options: &ConnectOptions) -> Self {
        let mut options = options.clone();
        options.attempts = 1;
        Self {
            options,
            client: None,
        }
    }

    /// The client, connecting if needed.
    pub(crate) async fn get(&mut self) -> Result<Client, ClientError> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let c = Client::connect(self.options.clone()).await?;
        tracing::info!(endpoint = %self.options.endpoint, "connected to the state server");
        self.client = Some(c.clone());
        Ok(c)
    }

    /// Forgets the connection after a failure; the next call reconnects.
    pub(crate) fn reset(&mut self) {
        self.client = None;
    }
}

/// One resync: its scope, the topology its header declares (the cluster view only) and the view.
type View = (ResyncScope, Option<ClusterTopology>, Vec<Update>);

/// The cluster's nodes as the translator knows them, each with the writer of its pods: this
/// watcher when it reports pods itself, the node's agent otherwise. A restarted state server waits
/// for each node's pod writer before it removes anything at the node's IPs.
fn topology(translator: &super::translate::Translator, pods: bool) -> ClusterTopology {
    let nodes = translator
        .nodes()
        .into_iter()
        .filter(|(_, ips)| ips.all().next().is_some())
        .map(|(name, ips)| ClusterNode {
            locations: ips.all().map(|ip| ip.to_string()).collect(),
            pods_writer: if pods {
                super::WATCHER_WRITER.to_owned()
            } else {
                super::node_agent_writer(&name)
            },
            name,
        })
        .collect();
    ClusterTopology { nodes }
}

enum Job {
    Idle,
    WaitUntil(Instant),
    Resync {
        views: Vec<View>,
        locations: BTreeSet<IpAddr>,
        seq: u64,
    },
    Apply {
        batch: Vec<Update>,
        seq: u64,
    },
}

fn decide(shared: &SharedRef, config: &WatcherConfig, failed: bool) -> Job {
    let mut s = lock(shared);
    if !s.initialized || s.in_flight {
        return Job::Idle;
    }
    if s.resync_due && (s.relisting.is_empty() || failed || s.resync_now) {
        s.resync_due = false;
        s.resync_now = false;
        s.pending.clear();
        s.first_pending_at = None;
        s.in_flight = true;
        let (views, locations) = match &config.mode {
            Mode::Cluster { pods } => {
                let scope = ResyncScope {
                    services: true,
                    endpoints: true,
                    pods: *pods,
                    ..ResyncScope::default()
                };
                let topology = topology(&s.translator, *pods);
                (
                    vec![(scope, Some(topology), s.translator.full_view())],
                    BTreeSet::new(),
                )
            }
            Mode::NodeAgent { node } => {
                let mut now = s.translator.pod_locations();
                if let Some(ips) = s.translator.node_ips(node) {
                    now.extend(ips.all());
                }
                // Locations of the last resync that hold nothing now get an empty view, so that
                // the server drops what this agent reported there.
                let all: BTreeSet<IpAddr> = now.union(&s.agent_locations).copied().collect();
                let views = all
                    .iter()
                    .map(|l| {
                        (
                            scope::pods_at(&l.to_string()),
                            None,
                            s.translator.pods_at(*l),
                        )
                    })
                    .collect();
                (views, now)
            }
        };
        return Job::Resync {
            views,
            locations,
            seq: s.seq,
        };
    }
    let Some(first) = s.first_pending_at else {
        return Job::Idle;
    };
    let due = Instant::from_std(first) + config.coalesce;
    if s.pending.len() >= config.max_batch || Instant::now() >= due {
        let batch = std::mem::take(&mut s.pending);
        s.first_pending_at = None;
        s.in_flight = true;
        return Job::Apply { batch, seq: s.seq };
    }
    Job::WaitUntil(due)
}

/// Runs until an unrecoverable error (an invalid endpoint; `Ok` only when a test ends it). Beside it, [`follow_session`] holds
/// the writer's session stream open, so that a restarted or new leader is noticed at once.
pub(crate) async fn run(
    shared: SharedRef,
    notify: Arc<Notify>,
    config: WatcherConfig,
) -> Result<(), ClientError> {
    let writer = config.writer();
    let session = tokio::spawn(follow_session(
        shared.clone(),
        notify.clone(),
        config.clone(),
    ));
    let _session = AbortOnDrop(session);
    let mut conn = Conn::new(&config.server);
    let mut backoff = ServerBackoff::new(config.backoff_initial, config.backoff_max);
    let mut failed = false;
    // The delay the last failure earned, slept before the next attempt.
    let mut pause: Option<std::time::Duration> = None;
    loop {
        if fault_point!(config.faults, SENDER) {
            return Ok(());
        }
        match decide(&shared, &config, failed) {
            Job::Idle => notify.notified().await,
            Job::WaitUntil(t) => {
                tokio::select! {
                    () = notify.notified() => {}
                    () = tokio::time::sleep_until(t) => {}
                }
            }
            Job::Resync {
                views,
                locations,
                seq,
            } => {
                let sends = !views.is_empty();
                let r = resync(&mut conn, &writer, views).await;
                let mut s = lock(&shared);
                s.in_flight = false;
                config.metrics.resync_of(&config.server.gateway, r.is_ok());
                match r {
                    Ok(epoch) => {
                        failed = false;
                        if sends {
                            s.session_epoch = epoch.or(s.session_epoch);
                        }
                        backoff.reset();
                        s.agent_locations = locations;
                        s.ack(seq);
                        s.settle();
                    }
                    Err(e) => {
                        pause = Some(backoff.next_delay(&e));
                        fail_or_return(e, &mut s, &mut conn)?;
                        failed = true;
                    }
                }
            }
            Job::Apply { batch, seq } => {
                let r = apply(&mut conn, &writer, batch).await;
                let mut s = lock(&shared);
                s.in_flight = false;
                match r {
                    Ok(session) => {
                        failed = false;
                        backoff.reset();
                        // Written without a resync the server holds (nothing was resynced
                        // before: the first view was empty) also asks for one, so the server
                        // holds our whole view and a later restart is noticed.
                        let unsynced = s.session_epoch.is_none()
                            && session.as_ref().is_some_and(|now| !now.resynced);
                        if lost_us(&s, session.as_ref()) || unsynced {
                            // The batch went to a server that holds no resync of ours (it
                            // restarted, or another replica leads): what it holds is incomplete.
                            resync_at_once(&mut s, &writer, None);
                            continue;
                        }
                        s.ack(seq);
                        s.settle();
                    }
                    Err(e) => {
                        pause = Some(backoff.next_delay(&e));
                        fail_or_return(e, &mut s, &mut conn)?;
                        failed = true;
                    }
                }
            }
        }
        if let Some(delay) = pause.take() {
            tracing::debug!(?delay, "backing off before the resync");
            tokio::time::sleep(delay).await;
        }
    }
}

/// Aborts its task when dropped (the session follower ends with its sender).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The server holds no (complete) resync of ours: resync at once, even while a stream relists;
/// what is queued goes with it (the resync carries the whole view).
fn resync_at_once(s: &mut super::Shared, writer: &str, session: Option<&WriterSession>) {
    tracing::info!(
        writer,
        server_id = session.map(|s| s.server_id.as_str()),
        epoch = session.map(|s| s.epoch),
        "the state server holds no resync of ours (it restarted, or another replica leads); \
         resyncing"
    );
    s.resync_due = true;
    s.resync_now = true;
    s.pending.clear();
    s.first_pending_at = None;
}

/// Whether `session` (from an answer or the session stream) shows that the server no longer holds
/// the resync this writer last completed: another epoch, or no resync of ours. Never while
/// nothing was sent.
fn lost_us(s: &super::Shared, session: Option<&WriterSession>) -> bool {
    match (s.session_epoch, session) {
        (Some(epoch), Some(now)) => now.epoch != epoch || !now.resynced,
        _ => false,
    }
}

/// Holds `Writer.WatchSession` open (reconnecting after at most 2 s) and makes a resync due at
/// once when the server no longer holds ours: a restart or a fail-over is noticed within a round
/// trip of the new leader's first answer, without polling. A failed stream changes nothing by
/// itself: the next answer of the new server says what it holds.
async fn follow_session(shared: SharedRef, notify: Arc<Notify>, config: WatcherConfig) {
    let writer = config.writer();
    let mut conn = Conn::new(&config.server);
    let mut backoff = ServerBackoff::new(config.backoff_initial, crate::backoff::RECONNECT_MAX);
    loop {
        let failure = match conn.get().await {
            Err(e) => e,
            Ok(client) => match client.writer(&writer).watch_session().await {
                Err(e) => e,
                Ok(mut stream) => loop {
                    match stream.message().await {
                        Ok(Some(session)) => {
                            backoff.reset();
                            let mut s = lock(&shared);
                            if !s.in_flight && lost_us(&s, Some(&session)) {
                                resync_at_once(&mut s, &writer, Some(&session));
                                drop(s);
                                notify.notify_one();
                            }
                        }
                        Ok(None) => {
                            break ClientError::StreamClosed {
                                rpc: "Writer.WatchSession",
                                batch_id: 0,
                            };
                        }
                        Err(status) => {
                            break ClientError::Rpc {
                                rpc: "Writer.WatchSession",
                                status,
                            };
                        }
                    }
                },
            },
        };
        if let ClientError::InvalidEndpoint { .. } = failure {
            return;
        }
        tracing::debug!(error = %failure, "session stream ended; reopening");
        conn.reset();
        tokio::time::sleep(backoff.next_delay(&failure)).await;
    }
}

fn fail_or_return(
    e: ClientError,
    s: &mut super::Shared,
    conn: &mut Conn,
) -> Result<(), ClientError> {
    if let ClientError::InvalidEndpoint { .. } = e {
        return Err(e);
    }
    tracing::warn!(error = %e, "state server call failed; reconnecting, then resyncing");
    conn.reset();
    s.resync_due = true;
    s.pending.clear();
    s.first_pending_at = None;
    Ok(())
}

/// Sends each view; returns the server's epoch as the last resync's answer states it.
async fn resync(
    conn: &mut Conn,
    writer: &str,
    views: Vec<View>,
) -> Result<Option<u64>, ClientError> {
    let client = conn.get().await?;
    let mut w = client.writer(writer);
    let mut epoch = None;
    for (scope, topology, view) in views {
        let what = scope_name(&scope);
        let n = view.len();
        let nodes = topology.as_ref().map(|t| t.nodes.len());
        let r = w.resync_with_topology(scope, topology, view).await?;
        for rejected in &r.rejected {
            tracing::warn!(writer, "resync item rejected: {rejected}");
        }
        tracing::info!(
            writer,
            scope = %what,
            updates = n,
            nodes,
            applied = r.applied,
            removed = r.removed,
            rejected = r.rejected.len(),
            revision = r.revision,
            "resynced"
        );
        epoch = r.session.map(|s| s.epoch).or(epoch);
    }
    Ok(epoch)
}

/// Sends one batch; returns the writer's session as the answer states it.
async fn apply(
    conn: &mut Conn,
    writer: &str,
    batch: Vec<Update>,
) -> Result<Option<WriterSession>, ClientError> {
    let client = conn.get().await?;
    let mut w = client.writer(writer);
    let n = batch.len();
    let r = w.apply(batch).await?;
    for rejected in &r.rejected {
        tracing::warn!(writer, "update rejected: {rejected}");
    }
    tracing::debug!(
        writer,
        updates = n,
        applied = r.applied,
        rejected = r.rejected.len(),
        revision = r.revision,
        "applied"
    );
    Ok(r.session)
}

fn scope_name(s: &ResyncScope) -> String {
    let mut parts = Vec::new();
    if s.services {
        parts.push("services".to_owned());
    }
    if s.egresses {
        parts.push("egresses".to_owned());
    }
    if s.endpoints {
        parts.push("endpoints".to_owned());
    }
    if s.pods {
        parts.push(if s.location.is_empty() {
            "pods".to_owned()
        } else {
            format!("pods at {}", s.location)
        });
    }
    parts.join(", ")
}
