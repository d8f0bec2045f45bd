//! One gateway written to (a *lane*): its translator, the deltas queued for its sender, and what
//! the state server acknowledged.
//!
//! The lane owns that state behind a private lock that never leaves this module and is never held
//! across an await. The kube side, the readiness gate, node moves and the PoolService side change
//! the translator through [`Lane::change`] (which queues the deltas and wakes the sender); the
//! sender takes its next job with [`Lane::next_job`] and reports how it went; whoever waits for
//! the server follows [`Lane::acked`], a `watch` of the last event sequence number acknowledged.

use std::collections::{BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use clb_proto::v1::{Update, WriterSession};
use tokio::sync::{Notify, watch};

use crate::config::WatcherConfig;
use crate::translate::{Kind, PortConflict, SentView, Translator, TranslatorConfig};

/// A handle on one lane (cheap to clone: every clone is the same lane).
#[derive(Clone)]
pub(crate) struct Lane {
    /// The gateway's name (`""`: the one of `--gateway`, without a gateways file).
    gateway: String,
    /// The lane's configuration (its `server.gateway` is the lane's).
    config: WatcherConfig,
    state: Arc<Mutex<State>>,
    /// Wakes the lane's sender.
    notify: Arc<Notify>,
}

/// The lane's state (see the module comment: only this module locks it).
#[derive(Debug)]
struct State {
    translator: Translator,
    /// Deltas not sent yet.
    pending: Vec<Update>,
    /// When the oldest pending delta was queued.
    first_pending_at: Option<Instant>,
    /// Number of watch events processed so far.
    seq: u64,
    /// Every stream has completed its first list.
    initialized: bool,
    /// Streams that have completed a list at least once.
    listed: HashSet<Kind>,
    /// Streams between `Init` and `InitDone`.
    relisting: HashSet<Kind>,
    /// A resync must be sent (first list, relist, failure).
    resync_due: bool,
    /// The sender has a call under way.
    in_flight: bool,
    /// The last `seq` whose deltas the server has acknowledged.
    acked: watch::Sender<u64>,
    /// Node agent: the locations of its last successful resync.
    agent_locations: BTreeSet<IpAddr>,
    /// The server's epoch at this writer's last completed resync that sent something (`None`:
    /// nothing sent yet, so nothing to lose). An answer or session message with another epoch, or
    /// saying the server holds no resync of ours, makes a resync due at once.
    session_epoch: Option<u64>,
    /// The `resync_sequence` of the last resync call this writer completed (0: none). A session
    /// message that echoes an older one was built before that resync landed: its `resynced: false`
    /// is stale and asks for nothing.
    resync_sequence: u64,
    /// A resync is due at once, even while a stream relists: the server holds nothing of ours.
    resync_now: bool,
}

/// What a change of the translator brought, for the write-back.
#[derive(Debug, Default)]
pub(crate) struct Changed {
    /// The inbound services (UIDs) whose endpoints the queued deltas change.
    pub(crate) endpoints_of: Vec<String>,
    /// Port-name conflicts the translator found (or whose situation changed).
    pub(crate) conflicts: Vec<PortConflict>,
}

/// The lane's first complete list of every stream (for the log).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FirstList {
    pub(crate) services: usize,
    pub(crate) endpoints: usize,
    pub(crate) pods: usize,
    pub(crate) unlocated: usize,
}

/// What the sender does next.
pub(crate) enum Job {
    /// Nothing to send: wait for [`Lane::notified`].
    Idle,
    /// Deltas are being coalesced until then (or until notified).
    WaitUntil(tokio::time::Instant),
    /// Send the whole view of the sent record `sent`, taken at event `seq` (the view is built
    /// from it outside the lock).
    Resync { sent: SentView, seq: u64 },
    /// Send these deltas, queued up to event `seq`.
    Apply { batch: Vec<Update>, seq: u64 },
}

impl Lane {
    /// A lane writing to `config`'s gateway with a translator of `tconfig`, and the receiver of
    /// its acknowledgements.
    pub(crate) fn new(
        config: WatcherConfig,
        tconfig: TranslatorConfig,
    ) -> (Self, watch::Receiver<u64>) {
        let (acked, acked_rx) = watch::channel(0);
        let state = State {
            translator: Translator::new(tconfig),
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
            resync_sequence: 0,
            resync_now: false,
        };
        let lane = Self {
            gateway: config.server.gateway.clone(),
            config,
            state: Arc::new(Mutex::new(state)),
            notify: Arc::new(Notify::new()),
        };
        (lane, acked_rx)
    }

    /// The gateway's name (`""`: the one of `--gateway`).
    pub(crate) fn gateway(&self) -> &str {
        &self.gateway
    }

    /// The lane's configuration.
    pub(crate) fn config(&self) -> &WatcherConfig {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a bug; the state is still consistent enough to go on.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether every stream has completed its first list: before, an object the translator lacks
    /// may be one not listed yet.
    pub(crate) fn initialized(&self) -> bool {
        self.lock().initialized
    }

    /// Reads the translator.
    pub(crate) fn read<R>(&self, f: impl FnOnce(&Translator) -> R) -> R {
        f(&self.lock().translator)
    }

    /// Changes the translator with `f` (at watch event `seq`, when it is one) and queues the
    /// deltas it returns; wakes the sender.
    pub(crate) fn change(
        &self,
        seq: Option<u64>,
        f: impl FnOnce(&mut Translator) -> Vec<Update>,
    ) -> Changed {
        let mut s = self.lock();
        if let Some(seq) = seq {
            s.seq = seq;
        }
        let deltas = f(&mut s.translator);
        let changed = Changed {
            endpoints_of: endpoints_of(&deltas),
            conflicts: s.translator.take_port_conflicts(),
        };
        s.push(deltas);
        s.settle();
        drop(s);
        self.notify.notify_one();
        changed
    }

    /// Changes the translator with `f` outside a watch event (the readiness gate, a node move)
    /// and queues the deltas it returns; wakes the sender. Port-name conflicts stay in the
    /// translator: the kube side reports them with its next event.
    pub(crate) fn feed(&self, f: impl FnOnce(&mut Translator) -> Vec<Update>) {
        let mut s = self.lock();
        let deltas = f(&mut s.translator);
        s.push(deltas);
        s.settle();
        drop(s);
        self.notify.notify_one();
    }

    /// Stream `kind` starts a list at event `seq`.
    pub(crate) fn begin_relist(&self, seq: u64, kind: Kind) {
        let mut s = self.lock();
        s.seq = seq;
        s.translator.begin_relist(kind);
        s.relisting.insert(kind);
    }

    /// Stream `kind` completed a list at event `seq` (`kinds`: every stream of the watcher). A
    /// relist becomes a resync: it also repairs anything the server lost. Returns the counts when
    /// this completes the first list of every stream.
    pub(crate) fn end_relist(
        &self,
        seq: u64,
        kind: Kind,
        kinds: &[Kind],
    ) -> (Option<FirstList>, Vec<PortConflict>) {
        let mut s = self.lock();
        s.seq = seq;
        let deltas = s.translator.end_relist(kind);
        s.push(deltas);
        s.relisting.remove(&kind);
        s.listed.insert(kind);
        let mut first = None;
        if !s.initialized && kinds.iter().all(|k| s.listed.contains(k)) {
            s.initialized = true;
            s.translator.set_warn_unlocated(true);
            let unlocated = s.translator.warn_unlocated();
            let (services, endpoints, pods) = s.translator.counts();
            first = Some(FirstList {
                services,
                endpoints,
                pods,
                unlocated,
            });
        }
        if s.initialized {
            s.resync_due = true;
            s.pending.clear();
            s.first_pending_at = None;
        }
        let conflicts = s.translator.take_port_conflicts();
        s.settle();
        drop(s);
        self.notify.notify_one();
        (first, conflicts)
    }

    /// Makes a resync due (the lane's share of the cluster changed: its topology follows).
    pub(crate) fn resync_soon(&self) {
        self.lock().resync_due = true;
        self.notify.notify_one();
    }

    /// The last event sequence number whose deltas the server acknowledged.
    pub(crate) fn acked(&self) -> watch::Receiver<u64> {
        self.lock().acked.subscribe()
    }

    /// Until [`Lane::change`] or another change wakes the sender.
    pub(crate) async fn notified(&self) {
        self.notify.notified().await;
    }

    /// The sender's next job (`failed`: its last call failed, so a resync is sent even while a
    /// stream relists). A resync or an apply marks a call under way until the sender reports it.
    pub(crate) fn next_job(&self, failed: bool) -> Job {
        let mut s = self.lock();
        if !s.initialized || s.in_flight {
            return Job::Idle;
        }
        if s.resync_due && (s.relisting.is_empty() || failed || s.resync_now) {
            s.resync_due = false;
            s.resync_now = false;
            s.pending.clear();
            s.first_pending_at = None;
            s.in_flight = true;
            return Job::Resync {
                sent: s.translator.sent(),
                seq: s.seq,
            };
        }
        let Some(first) = s.first_pending_at else {
            return Job::Idle;
        };
        let due = tokio::time::Instant::from_std(first) + self.config.coalesce;
        if s.pending.len() >= self.config.max_batch || tokio::time::Instant::now() >= due {
            let batch = std::mem::take(&mut s.pending);
            s.first_pending_at = None;
            s.in_flight = true;
            return Job::Apply { batch, seq: s.seq };
        }
        Job::WaitUntil(due)
    }

    /// Node agent: the locations of its last successful resync.
    pub(crate) fn agent_locations(&self) -> BTreeSet<IpAddr> {
        self.lock().agent_locations.clone()
    }

    /// The resync taken at event `seq` succeeded; the server's epoch is `epoch` and its last call
    /// carried `resync_sequence` (`sent`: it carried something), the node agent's locations are
    /// now `locations`.
    pub(crate) fn resynced(
        &self,
        seq: u64,
        epoch: Option<u64>,
        resync_sequence: u64,
        sent: bool,
        locations: BTreeSet<IpAddr>,
    ) {
        let mut s = self.lock();
        s.in_flight = false;
        if sent {
            s.session_epoch = epoch.or(s.session_epoch);
            s.resync_sequence = s.resync_sequence.max(resync_sequence);
        }
        s.agent_locations = locations;
        s.ack(seq);
        s.settle();
    }

    /// The apply of the deltas up to event `seq` succeeded with the answer's `session`. A batch
    /// that went to a server holding no resync of ours (it restarted, or another replica leads;
    /// or nothing was resynced before: the first view was empty) makes a resync due at once.
    pub(crate) fn applied(&self, seq: u64, session: Option<&WriterSession>, writer: &str) {
        let mut s = self.lock();
        s.in_flight = false;
        let unsynced =
            s.session_epoch.is_none() && session.as_ref().is_some_and(|now| !now.resynced);
        if s.lost_us(session) || unsynced {
            s.resync_at_once(writer, None);
            return;
        }
        s.ack(seq);
        s.settle();
    }

    /// The sender's call failed: what was queued goes, a resync is due.
    pub(crate) fn call_failed(&self) {
        let mut s = self.lock();
        s.in_flight = false;
        s.resync_due = true;
        s.pending.clear();
        s.first_pending_at = None;
    }

    /// The session stream says `session`: a resync is due at once when the server no longer
    /// holds ours (unless a call is under way: its answer tells).
    pub(crate) fn session_seen(&self, session: &WriterSession, writer: &str) {
        let mut s = self.lock();
        if !s.in_flight && s.lost_us(Some(session)) {
            s.resync_at_once(writer, Some(session));
            drop(s);
            self.notify.notify_one();
        }
    }
}

impl State {
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
    fn settle(&mut self) {
        if self.initialized && self.pending.is_empty() && !self.in_flight && !self.resync_due {
            let seq = self.seq;
            self.ack(seq);
        }
    }

    fn ack(&mut self, seq: u64) {
        self.acked.send_if_modified(|a| {
            let changed = *a < seq;
            *a = (*a).max(seq);
            changed
        });
    }

    /// Whether `session` (from an answer or the session stream) shows that the server no longer
    /// holds the resync this writer last completed: another epoch, or no resync of ours. Never
    /// while nothing was sent, and never from a message of this epoch built before our last
    /// resync landed (it echoes an older `resync_sequence`): a reconnect costs one resync.
    fn lost_us(&self, session: Option<&WriterSession>) -> bool {
        match (self.session_epoch, session) {
            (Some(epoch), Some(now)) => {
                now.epoch != epoch || (!now.resynced && now.resync_sequence >= self.resync_sequence)
            }
            _ => false,
        }
    }

    /// The server holds no (complete) resync of ours: resync at once, even while a stream
    /// relists; what is queued goes with it (the resync carries the whole view).
    fn resync_at_once(&mut self, writer: &str, session: Option<&WriterSession>) {
        tracing::info!(
            writer,
            server_id = session.map(|s| s.server_id.as_str()),
            epoch = session.map(|s| s.epoch),
            "the state server holds no resync of ours (it restarted, or another replica leads); \
             resyncing"
        );
        self.resync_due = true;
        self.resync_now = true;
        self.pending.clear();
        self.first_pending_at = None;
    }
}

/// The inbound services (UIDs) whose endpoints `deltas` change.
fn endpoints_of(deltas: &[Update]) -> Vec<String> {
    use clb_proto::v1::update::Kind as UpdateKind;
    deltas
        .iter()
        .filter_map(|u| match &u.kind {
            Some(UpdateKind::Endpoints(e)) => {
                Some(crate::families::service_uid(&e.service_id).to_owned())
            }
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mode;
    use clb_client::client::ConnectOptions;

    const AGENT: &str = "node-agent/a";

    fn session(epoch: u64, resynced: bool, resync_sequence: u64) -> WriterSession {
        WriterSession {
            epoch,
            resynced,
            resync_sequence,
            ..WriterSession::default()
        }
    }

    fn agent_lane() -> Lane {
        let config = WatcherConfig::new(
            ConnectOptions::new("http://127.0.0.1:1"),
            Mode::NodeAgent { node: "a".into() },
        );
        let (config, tconfig) = config.lanes().remove(0);
        Lane::new(config, tconfig).0
    }

    /// Issue 36: a session message built before the agent's resync landed reaches it after the
    /// resync's answer, saying `resynced: false` with an older sequence: it asks for no second
    /// resync. One that echoes the agent's last sequence (the server forgot that resync) or comes
    /// from another epoch does.
    #[test]
    fn a_session_message_older_than_the_last_resync_asks_for_no_resync() {
        let lane = agent_lane();
        lane.resynced(0, Some(5), 10, true, BTreeSet::new());
        for stale in [session(5, false, 9), session(5, false, 0)] {
            lane.session_seen(&stale, AGENT);
            assert!(!lane.lock().resync_due, "{stale:?} made a resync due");
        }
        lane.session_seen(&session(5, true, 10), AGENT);
        assert!(!lane.lock().resync_due);
        // The server forgot our resync (a pods handover): current, resync.
        lane.session_seen(&session(5, false, 10), AGENT);
        assert!(lane.lock().resync_due);

        let lane = agent_lane();
        lane.resynced(0, Some(5), 10, true, BTreeSet::new());
        // Another epoch: the server holds nothing of ours, whatever it echoes.
        lane.session_seen(&session(6, false, 0), AGENT);
        assert!(lane.lock().resync_due);
    }
}
