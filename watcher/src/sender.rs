//! The state-server side of the watcher: resyncs and coalesced `Apply` batches, with reconnects.
//!
//! Nothing acknowledged is ever lost: a failed call (or a failed connection) drops the queued deltas
//! and makes a resync due, and the resync carries the translator's whole view.

use std::collections::BTreeSet;
use std::net::IpAddr;

use clb_proto::v1::{ClusterNode, ClusterTopology, ResyncScope, Update, WriterSession};

use crate::backoff::ServerBackoff;
use crate::config::{Mode, WATCHER_WRITER, node_agent_writer};
use crate::lane::{Job, Lane};
use crate::supervise::{SENDER, fault_point};
use crate::translate::{NodeIps, SentView, Translator};
use clb_client::client::{Client, ClientError, ConnectOptions, scope};

/// A connection to the state server, made on demand (one attempt per call; the caller backs off).
/// [`Conn::share`] gives another task the same connection: a lane's sender and its session
/// follower run their calls and streams over one HTTP/2 connection, so a node agent costs the
/// server one connection (one file descriptor, one set of buffers), not two.
#[derive(Debug)]
pub(crate) struct Conn {
    options: ConnectOptions,
    shared: std::sync::Arc<std::sync::Mutex<Slot>>,
    /// The generation of the client this handle got last (0: none).
    got: u64,
}

/// The connection that handles of one [`Conn`] share, and how many times it was made.
#[derive(Debug, Default)]
struct Slot {
    client: Option<Client>,
    generation: u64,
}

impl Conn {
    pub(crate) fn new(options: &ConnectOptions) -> Self {
        let mut options = options.clone();
        options.attempts = 1;
        Self {
            options,
            shared: Default::default(),
            got: 0,
        }
    }

    /// Another handle on the same connection.
    pub(crate) fn share(&self) -> Self {
        Self {
            options: self.options.clone(),
            shared: self.shared.clone(),
            got: 0,
        }
    }

    fn slot(shared: &std::sync::Mutex<Slot>) -> std::sync::MutexGuard<'_, Slot> {
        shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The client, connecting if needed.
    pub(crate) async fn get(&mut self) -> Result<Client, ClientError> {
        {
            let slot = Self::slot(&self.shared);
            if let Some(c) = &slot.client {
                self.got = slot.generation;
                return Ok(c.clone());
            }
        }
        let c = Client::connect(self.options.clone()).await?;
        let mut slot = Self::slot(&self.shared);
        if let Some(other) = &slot.client {
            // Another handle connected meanwhile: use its connection, drop this one.
            self.got = slot.generation;
            return Ok(other.clone());
        }
        tracing::info!(endpoint = %self.options.endpoint, "connected to the state server");
        slot.generation += 1;
        slot.client = Some(c.clone());
        self.got = slot.generation;
        Ok(c)
    }

    /// Forgets the connection after a failure; the next call reconnects. A connection another
    /// handle made since this one got its client is kept (it is not the one that failed).
    pub(crate) fn reset(&mut self) {
        let mut slot = Self::slot(&self.shared);
        if slot.generation == self.got {
            slot.client = None;
        }
    }
}

/// One resync: its scope, the topology its header declares (the cluster view only) and the view.
type View = (ResyncScope, Option<ClusterTopology>, Vec<Update>);

/// The cluster's nodes as the translator knows them, each with the writer of its pods: this
/// watcher when it reports pods itself, the node's agent otherwise. A restarted state server waits
/// for each node's pod writer before it removes anything at the node's IPs.
fn topology(nodes: Vec<(String, NodeIps)>, pods: bool) -> ClusterTopology {
    let nodes = nodes
        .into_iter()
        .filter(|(_, ips)| ips.all().next().is_some())
        .map(|(name, ips)| ClusterNode {
            locations: ips.all().map(|ip| ip.to_string()).collect(),
            pods_writer: if pods {
                WATCHER_WRITER.to_owned()
            } else {
                node_agent_writer(&name)
            },
            name,
        })
        .collect();
    ClusterTopology { nodes }
}

/// The views of one resync, built from the snapshot `sent` outside the lane's lock, and the node
/// agent's locations after it. A node agent's locations of the last resync that hold nothing now
/// get an empty view, so that the server drops what this agent reported there.
fn views(lane: &Lane, sent: &SentView) -> (Vec<View>, BTreeSet<IpAddr>) {
    match &lane.config().mode {
        Mode::Cluster { pods } => {
            let scope = ResyncScope {
                services: true,
                endpoints: true,
                pods: *pods,
                ..ResyncScope::default()
            };
            // The nodes are few (a short lock); the view is built from the snapshot.
            let topology = topology(lane.read(Translator::nodes), *pods);
            (
                vec![(scope, Some(topology), sent.full_view())],
                BTreeSet::new(),
            )
        }
        Mode::NodeAgent { node } => {
            let mut now = sent.pod_locations();
            if let Some(ips) = lane.read(|t| t.node_ips(node)) {
                now.extend(ips.all());
            }
            let all: BTreeSet<IpAddr> = now.union(&lane.agent_locations()).copied().collect();
            let views = all
                .iter()
                .map(|l| (scope::pods_at(&l.to_string()), None, sent.pods_at(*l)))
                .collect();
            (views, now)
        }
    }
}

/// Runs until an unrecoverable error (an invalid endpoint; `Ok` only when a test ends it). Beside it, [`follow_session`] holds
/// the writer's session stream open, so that a restarted or new leader is noticed at once.
pub(crate) async fn run(lane: Lane) -> Result<(), ClientError> {
    let config = lane.config().clone();
    let writer = config.writer();
    let mut conn = Conn::new(&config.server);
    let session = tokio::spawn(follow_session(lane.clone(), conn.share()));
    let _session = AbortOnDrop(session);
    let mut backoff = ServerBackoff::new(config.backoff_initial, config.backoff_max);
    let mut failed = false;
    // The delay the last failure earned, slept before the next attempt.
    let mut pause: Option<std::time::Duration> = None;
    loop {
        if fault_point!(config.faults, SENDER) {
            return Ok(());
        }
        match lane.next_job(failed) {
            Job::Idle => lane.notified().await,
            Job::WaitUntil(t) => {
                tokio::select! {
                    () = lane.notified() => {}
                    () = tokio::time::sleep_until(t) => {}
                }
            }
            Job::Resync { sent, seq } => {
                let (views, locations) = views(&lane, &sent);
                drop(sent);
                let sends = !views.is_empty();
                let r = resync(&mut conn, &writer, views).await;
                config.metrics.resync_of(&config.server.gateway, r.is_ok());
                match r {
                    Ok((epoch, sequence)) => {
                        failed = false;
                        backoff.reset();
                        lane.resynced(seq, epoch, sequence, sends, locations);
                    }
                    Err(e) => {
                        pause = Some(backoff.next_delay(&e));
                        fail_or_return(e, &lane, &mut conn)?;
                        failed = true;
                    }
                }
            }
            Job::Apply { batch, seq } => {
                let r = apply(&mut conn, &writer, batch).await;
                match r {
                    Ok(session) => {
                        failed = false;
                        backoff.reset();
                        lane.applied(seq, session.as_ref(), &writer);
                    }
                    Err(e) => {
                        pause = Some(backoff.next_delay(&e));
                        fail_or_return(e, &lane, &mut conn)?;
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

/// Holds `Writer.WatchSession` open (reconnecting after at most 2 s) and makes a resync due at
/// once when the server no longer holds ours: a restart or a fail-over is noticed within a round
/// trip of the new leader's first answer, without polling. A failed stream changes nothing by
/// itself: the next answer of the new server says what it holds.
async fn follow_session(lane: Lane, mut conn: Conn) {
    let config = lane.config().clone();
    let writer = config.writer();
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
                            lane.session_seen(&session, &writer);
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

fn fail_or_return(e: ClientError, lane: &Lane, conn: &mut Conn) -> Result<(), ClientError> {
    if let ClientError::InvalidEndpoint { .. } = e {
        return Err(e);
    }
    tracing::warn!(error = %e, "state server call failed; reconnecting, then resyncing");
    conn.reset();
    lane.call_failed();
    Ok(())
}

/// Sends each view, each call with a new `resync_sequence`; returns the server's epoch as the last
/// resync's answer states it, and the last call's sequence.
async fn resync(
    conn: &mut Conn,
    writer: &str,
    views: Vec<View>,
) -> Result<(Option<u64>, u64), ClientError> {
    let client = conn.get().await?;
    let mut epoch = None;
    let mut sequence = 0;
    for (scope, topology, view) in views {
        sequence = clb_client::client::next_resync_sequence();
        let mut w = client.writer(writer).with_resync_sequence(sequence);
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
    Ok((epoch, sequence))
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
