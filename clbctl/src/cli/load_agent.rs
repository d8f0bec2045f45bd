//! One simulated node agent of `clbctl load --node-agents`: the state-server protocol of the
//! shipped node agent (`watcher/src/sender.rs`, `watcher/src/lane.rs`), and nothing of Kubernetes.
//!
//! **The protocol lives in this module only** (so that a change of the node agent's protocol is
//! one change here). As the node agent of this commit talks:
//!
//! - writer `node-agent/<node>`, the gateway of the client (`--gateway`);
//! - **one HTTP/2 connection** (`--agent-connections 1`, the default) shared by the sender
//!   ([`clb_client::client::Client::connect`], one attempt per call, the caller backs off) and its
//!   session follower, which holds `Writer.WatchSession` open and reopens it after a failure;
//!   `--agent-connections 2` gives each its own, as node agents did before;
//! - first a `Writer.Resync` of scope `pods_at(<node IP>)` (no topology) carrying the node's pods
//!   (`pod_add` with the node IP as location, key `<namespace>/<name>`, the pod's UID), with a
//!   `resync_sequence` larger than any it sent before; the epoch of its answer's session and the
//!   sequence are kept;
//! - then each change as a unary `Writer.Apply` (a new `Writer` per call, as the sender makes one:
//!   batch id 1) of the coalesced deltas: a pod replacement is one batch of the new pod's
//!   `pod_add` and the old pod's `pod_remove`;
//! - a session message (stream or answer) with another epoch, or saying the server holds no resync
//!   of ours while echoing our last resync's sequence or a later one (an older echo was built
//!   before that resync landed: stale), makes a resync due at once (unless a call is under way: its answer tells); an apply
//!   answered with `resynced: false` before any resync completed, too; a failed call drops the
//!   connection, backs off and resyncs.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clb_client::backoff::Backoff;
use clb_client::client::{Client, ClientError, ConnectOptions, scope};
use clb_client::updates;
use clb_proto::v1::{Update, WriterSession};
use tokio::sync::{Mutex as AsyncMutex, Notify, watch};

use super::load::lock;

/// The node agent's writer name for node `node` (as `clb_watcher::config::node_agent_writer`).
pub(super) fn writer_name(node: &str) -> String {
    format!("node-agent/{node}")
}

/// The watcher's defaults: `--backoff-initial` 200 ms, `--backoff-max` 10 s; the session stream
/// reopens within 2 s (`RECONNECT_MAX`).
const BACKOFF_INITIAL: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// What one of an agent's writes is (`clbctl load --agent-call`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AgentCall {
    /// The node agent's `Writer.Apply` of a pod replacement.
    Apply,
    /// `grpc.health.v1.Health/Check`: a unary call that changes nothing (the floor).
    HealthCheck,
    /// The pod replacement as one message on a `Writer.ApplyStream` the agent holds open (the
    /// shipped node agent does not: this measures what writes on a held stream would cost).
    ApplyStream,
}

/// How an agent talks to the server: its connections (`--agent-connections`) and its writes
/// (`--agent-call`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Talk {
    pub(super) connections: u8,
    pub(super) call: AgentCall,
}

/// A pod of a simulated node.
#[derive(Debug, Clone)]
pub(super) struct AgentPod {
    address: String,
    key: String,
    uid: String,
}

/// Pod addresses of the agents: `172.16.0.0/12` from serial 1 on (1,048,575 of them), apart
/// from the churn's `10.64.0.0/10` and the nodes' `10.240.0.0/12`.
pub(super) fn pod_address(serial: u64) -> String {
    let n = 0xAC10_0000u64 + (serial & 0x000F_FFFF);
    format!(
        "{}.{}.{}.{}",
        n >> 24,
        (n >> 16) & 255,
        (n >> 8) & 255,
        n & 255
    )
}

/// The IP of simulated node `i` (`10.240.0.1` on; 1,048,574 of them).
pub(super) fn node_ip(i: usize) -> String {
    let n = 0x0AF0_0001u64 + i as u64;
    format!(
        "{}.{}.{}.{}",
        n >> 24,
        (n >> 16) & 255,
        (n >> 8) & 255,
        n & 255
    )
}

/// What every agent adds to, read by the orchestrator.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) connects: AtomicU64,
    pub(super) connect_failures: AtomicU64,
    pub(super) resyncs: AtomicU64,
    pub(super) resync_failures: AtomicU64,
    pub(super) applies: AtomicU64,
    pub(super) apply_failures: AtomicU64,
    pub(super) session_messages: AtomicU64,
    pub(super) session_reopens: AtomicU64,
    /// Agents whose first resync completed.
    pub(super) synced_agents: AtomicU64,
    /// Woken at each first resync.
    pub(super) synced: Notify,
    /// Round trips of the agents' `Apply` calls (the writes phase and after).
    pub(super) apply_times: std::sync::Mutex<Vec<Duration>>,
    /// The distinct failures (their first 10), each with its count.
    pub(super) errors: std::sync::Mutex<Vec<(String, u64)>>,
}

impl Counters {
    /// Counts failure `e` of call `what`.
    fn failed(&self, what: &str, e: &ClientError) {
        let text = format!("{what}: {e}");
        let mut errors = lock(&self.errors);
        if let Some(x) = errors.iter_mut().find(|(t, _)| *t == text) {
            x.1 += 1;
        } else if errors.len() < 10 {
            errors.push((text, 1));
        }
    }
}

/// What the orchestrator tells every agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Connect, resync, follow the session; write nothing.
    Quiet,
    /// Also replace one pod every `every`, the first at `start + offset` (spread over the agents).
    Writing { start: Instant, every: Duration },
    /// Stop (the connections close).
    Stop,
}

/// One simulated node agent.
#[derive(Debug)]
pub(super) struct Agent {
    pub(super) index: usize,
    node: String,
    node_ip: String,
    writer: String,
    pods: std::sync::Mutex<VecDeque<AgentPod>>,
    lane: std::sync::Mutex<LaneState>,
    wake: Notify,
    /// Successful resyncs of this agent.
    pub(super) resyncs: AtomicU64,
    /// When its first resync completed.
    pub(super) first_synced: std::sync::Mutex<Option<Instant>>,
    /// `--agent-call apply-stream`: the open stream's batches.
    stream: AsyncMutex<Option<tokio::sync::mpsc::Sender<Vec<Update>>>>,
}

/// The lane's state the protocol depends on (`watcher/src/lane.rs`).
#[derive(Debug, Default)]
struct LaneState {
    session_epoch: Option<u64>,
    /// The `resync_sequence` of the last resync completed (0: none).
    resync_sequence: u64,
    resync_due: bool,
    in_flight: bool,
}

impl LaneState {
    fn lost_us(&self, session: Option<&WriterSession>) -> bool {
        match (self.session_epoch, session) {
            (Some(epoch), Some(now)) => {
                now.epoch != epoch || (!now.resynced && now.resync_sequence >= self.resync_sequence)
            }
            _ => false,
        }
    }
}

/// The connection(s) of one agent: the sender's, and the session follower's (the same one with
/// `--agent-connections 1`).
#[derive(Debug, Clone)]
struct Conn {
    options: ConnectOptions,
    client: Arc<AsyncMutex<Option<Client>>>,
}

impl Conn {
    fn new(options: &ConnectOptions) -> Self {
        let mut options = options.clone();
        options.attempts = 1;
        Self {
            options,
            client: Arc::new(AsyncMutex::new(None)),
        }
    }

    async fn get(&self, counters: &Counters) -> Result<Client, ClientError> {
        let mut slot = self.client.lock().await;
        if let Some(c) = &*slot {
            return Ok(c.clone());
        }
        match Client::connect(self.options.clone()).await {
            Ok(c) => {
                counters.connects.fetch_add(1, Ordering::Relaxed);
                *slot = Some(c.clone());
                Ok(c)
            }
            Err(e) => {
                counters.connect_failures.fetch_add(1, Ordering::Relaxed);
                counters.failed("connect", &e);
                Err(e)
            }
        }
    }

    async fn reset(&self) {
        *self.client.lock().await = None;
    }
}

impl Agent {
    /// Agent `index` of node `node-<index>` with `pods` pods; `serial` numbers the pods (shared by
    /// every agent, so that addresses stay unique).
    pub(super) fn new(index: usize, pods: usize, serial: &AtomicU64) -> Self {
        let node = format!("load-node-{index}");
        let pods = (0..pods)
            .map(|_| new_pod(&node, serial.fetch_add(1, Ordering::Relaxed) + 1))
            .collect();
        Self {
            index,
            writer: writer_name(&node),
            node_ip: node_ip(index),
            node,
            pods: std::sync::Mutex::new(pods),
            lane: std::sync::Mutex::new(LaneState {
                resync_due: true,
                ..LaneState::default()
            }),
            wake: Notify::new(),
            resyncs: AtomicU64::new(0),
            first_synced: std::sync::Mutex::new(None),
            stream: AsyncMutex::new(None),
        }
    }

    /// Runs the agent until the phase says [`Phase::Stop`]: its session follower beside its sender.
    pub(super) async fn run(
        self: Arc<Self>,
        options: ConnectOptions,
        Talk { connections, call }: Talk,
        offset: Duration,
        serial: Arc<AtomicU64>,
        counters: Arc<Counters>,
        mut phase: watch::Receiver<Phase>,
    ) {
        let conn = Conn::new(&options);
        let session_conn = if connections >= 2 {
            Conn::new(&options)
        } else {
            conn.clone()
        };
        let follower = tokio::spawn(self.clone().follow_session(
            session_conn,
            counters.clone(),
            phase.clone(),
        ));
        let mut backoff = Backoff::new(BACKOFF_INITIAL, BACKOFF_MAX);
        let mut next_write: Option<Instant> = None;
        loop {
            let now_phase = *phase.borrow_and_update();
            let write_at = match now_phase {
                Phase::Stop => break,
                Phase::Quiet => None,
                Phase::Writing { start, every } => {
                    Some((*next_write.get_or_insert(start + offset), every))
                }
            };
            let resync = {
                let mut l = lock(&self.lane);
                if l.resync_due && !l.in_flight {
                    l.resync_due = false;
                    l.in_flight = true;
                    true
                } else {
                    false
                }
            };
            let result = if resync {
                self.resync(&conn, &counters).await
            } else if let Some((at, every)) = write_at.filter(|(at, _)| *at <= Instant::now()) {
                next_write = Some(at + every);
                lock(&self.lane).in_flight = true;
                match call {
                    AgentCall::Apply => self.replace_pod(&conn, &serial, &counters).await,
                    AgentCall::HealthCheck => self.health_check(&conn, &counters).await,
                    AgentCall::ApplyStream => self.stream_pod(&conn, &serial, &counters).await,
                }
            } else {
                let sleep = async {
                    match write_at {
                        Some((at, _)) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = self.wake.notified() => {}
                    _ = phase.changed() => {}
                    () = sleep => {}
                }
                continue;
            };
            match result {
                Ok(()) => backoff.reset(),
                Err(_) => {
                    {
                        let mut l = lock(&self.lane);
                        l.in_flight = false;
                        l.resync_due = true;
                    }
                    conn.reset().await;
                    let delay = backoff.next_delay(false);
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        _ = phase.changed() => {}
                    }
                }
            }
        }
        follower.abort();
    }

    /// `Writer.Resync` of the node's pods at its IP.
    async fn resync(&self, conn: &Conn, counters: &Counters) -> Result<(), ClientError> {
        let client = conn.get(counters).await?;
        let view: Vec<Update> = lock(&self.pods)
            .iter()
            .map(|p| updates::pod_add(&p.address, &self.node_ip, "", &p.key, &p.uid))
            .collect();
        let sequence = clb_client::client::next_resync_sequence();
        let r = client
            .writer(&self.writer)
            .with_resync_sequence(sequence)
            .resync(scope::pods_at(&self.node_ip), view)
            .await;
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                counters.resync_failures.fetch_add(1, Ordering::Relaxed);
                counters.failed("resync", &e);
                return Err(e);
            }
        };
        {
            let mut l = lock(&self.lane);
            l.in_flight = false;
            l.session_epoch = r.session.map(|s| s.epoch).or(l.session_epoch);
            l.resync_sequence = l.resync_sequence.max(sequence);
        }
        counters.resyncs.fetch_add(1, Ordering::Relaxed);
        if self.resyncs.fetch_add(1, Ordering::Relaxed) == 0 {
            *lock(&self.first_synced) = Some(Instant::now());
            counters.synced_agents.fetch_add(1, Ordering::Relaxed);
            counters.synced.notify_waiters();
        }
        Ok(())
    }

    /// One pod replacement: the oldest pod goes, a new one comes, in one `Writer.Apply`.
    async fn replace_pod(
        &self,
        conn: &Conn,
        serial: &AtomicU64,
        counters: &Counters,
    ) -> Result<(), ClientError> {
        let client = conn.get(counters).await?;
        let batch = self.replacement(serial);
        let sent = Instant::now();
        let r = client.writer(&self.writer).apply(batch).await;
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                counters.apply_failures.fetch_add(1, Ordering::Relaxed);
                counters.failed("apply", &e);
                return Err(e);
            }
        };
        lock(&counters.apply_times).push(sent.elapsed());
        counters.applies.fetch_add(1, Ordering::Relaxed);
        let mut l = lock(&self.lane);
        l.in_flight = false;
        let unsynced = l.session_epoch.is_none() && r.session.as_ref().is_some_and(|s| !s.resynced);
        if l.lost_us(r.session.as_ref()) || unsynced {
            l.resync_due = true;
            drop(l);
            self.wake.notify_one();
        }
        Ok(())
    }

    /// `--agent-call apply-stream`: the pod replacement sent on the agent's open
    /// `Writer.ApplyStream` (opened at its first write, again after it broke). Only the send is
    /// timed: the server's answers are read by the stream's task.
    async fn stream_pod(
        &self,
        conn: &Conn,
        serial: &AtomicU64,
        counters: &Counters,
    ) -> Result<(), ClientError> {
        let mut stream = self.stream.lock().await;
        if stream
            .as_ref()
            .is_none_or(tokio::sync::mpsc::Sender::is_closed)
        {
            let client = conn.get(counters).await?;
            let (tx, rx) = tokio::sync::mpsc::channel::<Vec<Update>>(4);
            let mut writer = client.writer(&self.writer);
            tokio::spawn(async move {
                let _ = writer
                    .apply_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
                    .await;
            });
            *stream = Some(tx);
        }
        let batch = self.replacement(serial);
        let sent = Instant::now();
        let open = stream.as_ref().map(|tx| tx.try_send(batch));
        lock(&self.lane).in_flight = false;
        if let Some(Ok(())) = open {
            lock(&counters.apply_times).push(sent.elapsed());
            counters.applies.fetch_add(1, Ordering::Relaxed);
        } else {
            counters.apply_failures.fetch_add(1, Ordering::Relaxed);
            *stream = None;
        }
        Ok(())
    }

    /// The next pod replacement: the oldest pod goes, a new one comes.
    fn replacement(&self, serial: &AtomicU64) -> Vec<Update> {
        let mut pods = lock(&self.pods);
        let new = new_pod(&self.node, serial.fetch_add(1, Ordering::Relaxed) + 1);
        let add = updates::pod_add(&new.address, &self.node_ip, "", &new.key, &new.uid);
        pods.push_back(new);
        let mut batch = vec![add];
        if pods.len() > 1
            && let Some(old) = pods.pop_front()
        {
            batch.push(updates::pod_remove(
                &old.address,
                &self.node_ip,
                &old.key,
                &old.uid,
            ));
        }
        batch
    }

    /// `--agent-call health-check`: one `Health/Check` in place of a write, timed as one.
    async fn health_check(&self, conn: &Conn, counters: &Counters) -> Result<(), ClientError> {
        let client = conn.get(counters).await?;
        let sent = Instant::now();
        if let Err(e) = client.health_check().await {
            counters.apply_failures.fetch_add(1, Ordering::Relaxed);
            counters.failed("health check", &e);
            return Err(e);
        }
        lock(&counters.apply_times).push(sent.elapsed());
        counters.applies.fetch_add(1, Ordering::Relaxed);
        lock(&self.lane).in_flight = false;
        Ok(())
    }

    /// Holds `Writer.WatchSession` open, reopening it after a failure (at most 2 s later).
    async fn follow_session(
        self: Arc<Self>,
        conn: Conn,
        counters: Arc<Counters>,
        phase: watch::Receiver<Phase>,
    ) {
        let mut backoff = Backoff::new(BACKOFF_INITIAL, RECONNECT_MAX);
        let mut opened = false;
        while *phase.borrow() != Phase::Stop {
            if opened {
                counters.session_reopens.fetch_add(1, Ordering::Relaxed);
            }
            opened = true;
            // Why it ended changes nothing: the next answer says what the server holds.
            let ended: ClientError = match conn.get(&counters).await {
                Err(e) => e,
                Ok(client) => match client.writer(&self.writer).watch_session().await {
                    Err(e) => e,
                    Ok(mut stream) => loop {
                        match stream.message().await {
                            Ok(Some(session)) => {
                                backoff.reset();
                                counters.session_messages.fetch_add(1, Ordering::Relaxed);
                                self.session_seen(&session);
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
            if *phase.borrow() != Phase::Stop {
                counters.failed("session stream", &ended);
            }
            conn.reset().await;
            tokio::time::sleep(backoff.next_delay(false)).await;
        }
    }

    fn session_seen(&self, session: &WriterSession) {
        let mut l = lock(&self.lane);
        if !l.in_flight && l.lost_us(Some(session)) {
            l.resync_due = true;
            drop(l);
            self.wake.notify_one();
        }
    }
}

fn new_pod(node: &str, serial: u64) -> AgentPod {
    AgentPod {
        address: pod_address(serial),
        key: format!("load-agents/{node}-pod-{serial}"),
        uid: format!("load-agent-uid-{serial}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_stay_in_their_ranges() {
        assert_eq!(pod_address(1), "172.16.0.1");
        assert_eq!(pod_address(0x000F_FFFF), "172.31.255.255");
        assert_eq!(node_ip(0), "10.240.0.1");
        assert_eq!(node_ip(4999), "10.240.19.136");
        assert_eq!(writer_name("n"), "node-agent/n");
    }
}
