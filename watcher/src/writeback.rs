//! Write-back to Kubernetes (cluster mode): the finalizer, `status.loadBalancer.ingress`, the
//! `clb.azure.com/Programmed` condition and Events.
//!
//! For every LoadBalancer Service of our class the task
//! 1. adds our finalizer (the translator programs a Service only once it carries it);
//! 2. once the state server says the service is actual (NRP has it) with a frontend IP, sets
//!    `status.loadBalancer.ingress` to `[{ip, ipMode: VIP}]` when it differs, `ipMode` included
//!    (see `ingress.rs`);
//! 3. once the Service is being deleted (or stopped being one of ours) and the server confirms that
//!    NRP no longer has it, removes the finalizer (and clears the ingress of a Service that still
//!    exists).
//!
//! Patches: finalizers are changed with a JSON **merge patch** of the whole remaining
//! `metadata.finalizers` list together with `metadata.resourceVersion` — the API server refuses it
//! with 409 Conflict if the object changed since we saw it, so a finalizer added by someone else in
//! between is never dropped; on a conflict the next watch event brings the new version and the
//! action is retried. The ingress is set with a merge patch of the `status` subresource
//! (`status.loadBalancer.ingress` is replaced as a whole).
//!
//! The server is asked only about a Service whose watch event has been acknowledged by the server
//! (the kube side's event sequence number): so "not desired, not actual" really follows our removal.
//!
//! **Condition and Events.** `GetService` reports the programming condition the server derives
//! (`ServiceState.condition`: programmed, pending, rejected by Azure, throttled or retrying, held
//! back by the restart gate). The write-back mirrors it on the Service as the condition
//! [`CONDITION_TYPE`] and publishes an `events.k8s.io/v1` Event when its reason changes (not per
//! poll, not per retry; kube's recorder turns a repeated Event into a series). The condition is
//! written with the same merge patch of the `status` subresource as the ingress: a merge patch
//! replaces a list as a whole, so the patch carries every condition of the Service as the watch
//! showed it with ours replaced, and `metadata.resourceVersion` as a precondition — a condition
//! someone else wrote in between makes it fail with 409 instead of being dropped, and the next watch
//! event brings it. (A server-side apply patch would merge the list by `type` as well, but every
//! status write of ours would have to become an apply — the ingress too — and an apply that leaves
//! out a field it set before removes it; the merge patch with a precondition is what the finalizer
//! patch already does, and what every API server version accepts for the `status` subresource.)
//!
//! **No polling.** A Service is looked at when something changes for it: a new version of it
//! (the kube side's `Msg::Seen`), its endpoints sent (`Msg::Touched`), a pushed change of its
//! state in a gateway (`states.rs`), the server acknowledging what was sent for it, a port-name
//! conflict, a PoolService; and after a failed Kubernetes call, when its backoff expires. Each is
//! found through an index (by key, by UID, by acknowledged sequence number) and scheduled on one
//! timer queue (`tokio_util::time::DelayQueue`). An idle cluster costs nothing.
//!
//! **Bounded.** The inbox holds [`INBOX`] messages; when it is full the kube side waits
//! (backpressure, never a dropped message). The Services due at once are handled in batches of at
//! most [`BATCH`], their Kubernetes calls [`CONCURRENCY`] at a time; one Service is in at most one
//! call at a time, so its own calls keep their order. Before each batch, every message already in
//! the inbox is folded in: a patch is built from the newest facts received, so a Service deleted
//! or changed meanwhile is not sent a patch that can only meet 409 Conflict.
//!
//! **Not a kube-runtime `Controller`.** Its triggers are mostly not Service events (the server's
//! pushed states, the translator's messages), it acts only on what the server acknowledged, and its
//! cleanup waits for NRP to drop the service (also for a Service that stopped being ours without
//! being deleted), where `finalizer()` drops the finalizer once `Cleanup` returns: docs/watcher.md,
//! "Why the write-back is not a kube-runtime `Controller`".

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clb_proto::v1::{IpFamily, ServiceState};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::time::{DelayQueue, delay_queue};

use crate::config::WatcherConfig;
use crate::ingress::{self, IngressEntry};
use crate::poolservice::{self, PoolService, PoolServiceFacts};
use crate::supervise::{Ended, WRITE_BACK, fault_point};
use crate::translate::ObjKey;
use clb_client::backoff::Backoff;
use clb_client::client::ConnectOptions;
use clb_gateways::Gateways;
pub(crate) use facts::{Msg, ServiceFacts};

/// The field manager named in our patches.
pub(crate) const FIELD_MANAGER: &str = "clb-watcher";

/// The type of our condition in `status.conditions` of a Service.
pub const CONDITION_TYPE: &str = "clb.azure.com/Programmed";

/// The reporting controller of our Events.
pub const REPORTING_CONTROLLER: &str = "clb.azure.com/clb-watcher";

/// How many messages the write-back's inbox holds. When it is full, the kube side waits
/// (backpressure): a message is never dropped.
pub(crate) const INBOX: usize = 1024;

/// The write-back's inbox, as the kube side holds it.
pub(crate) type Inbox = mpsc::Sender<Msg>;

/// The most Services handled in one batch (the inbox waits meanwhile; what it received before
/// the batch is folded in first).
pub(crate) const BATCH: usize = 200;

/// The most Kubernetes calls of a batch under way at once.
pub(crate) const CONCURRENCY: usize = 16;

/// Why an action on a Service did not get done; it is tried again as the error says.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteBackError {
    /// A Kubernetes call failed (not a conflict or a missing object): retried with backoff.
    #[error("{what} of {object} failed: {source}")]
    Kube {
        what: &'static str,
        object: ObjKey,
        #[source]
        source: Box<kube::Error>,
    },
    /// A call about the PoolServices of a Service failed (each failure is logged where it
    /// happens): the Service's record retries with backoff.
    #[error("a PoolService of {service} could not be written")]
    PoolServices { service: ObjKey },
    /// A gateway's stream of service states is down: the Service waits for it to come back.
    #[error(transparent)]
    StatesDown(#[from] states::StatesDown),
}

/// What becomes of a Service after an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Nothing to do until something changes for it.
    Wait,
    /// It no longer concerns us: forget it.
    Forget,
}

#[derive(Debug, Clone)]
pub(crate) struct Config {
    server: ConnectOptions,
    finalizer: String,
    backoff_initial: Duration,
    backoff_max: Duration,
    metrics: std::sync::Arc<crate::metrics::WatcherMetrics>,
    gateways: Option<std::sync::Arc<Gateways>>,
    class: String,
    pool_services: bool,
    #[cfg(any(test, feature = "test-support"))]
    faults: crate::faults::Faults,
}

impl From<&WatcherConfig> for Config {
    fn from(c: &WatcherConfig) -> Self {
        Self {
            server: c.server.clone(),
            finalizer: c.finalizer.clone(),
            backoff_initial: c.backoff_initial,
            backoff_max: c.backoff_max,
            metrics: c.metrics.clone(),
            gateways: c.gateways.clone(),
            class: c.class.clone(),
            pool_services: c.pool_services_on(),
            #[cfg(any(test, feature = "test-support"))]
            faults: c.faults.clone(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    AddFinalizer,
    Ingress,
    Cleanup,
}

#[derive(Debug)]
struct Record {
    facts: ServiceFacts,
    seq: u64,
    /// Its entry in the timer queue, while it is due at some time.
    timer: Option<delay_queue::Key>,
    /// When it is due (meaningful while `timer` is set).
    due_at: Instant,
    /// The backoff of this record while its actions fail in a row ([`clb_client::backoff`]:
    /// from `backoff_initial` up to `backoff_max`); `None` once one succeeds.
    retry: Option<Backoff>,
    /// The resource version at which our last patch succeeded: the same patch is not sent again
    /// before the watch shows the result.
    patched_at_rv: Option<String>,
    seen_in_relist: bool,
    /// The (reason, error code) of the last Event published for the Service.
    reported: Option<(&'static str, String)>,
    /// The translator's last port-name conflict of each port of the Service (by port name).
    port_conflicts: BTreeMap<String, String>,
    /// Port-name conflicts to publish as Events.
    conflicts_due: Vec<String>,
    /// The refused gateway selection last published as a Warning Event.
    selection_warned: Option<String>,
    /// The ignored settings last published as a Warning Event.
    ignored_warned: Option<String>,
}

impl Record {
    fn new(facts: ServiceFacts, seq: u64) -> Self {
        Self {
            facts,
            seq,
            timer: None,
            due_at: Instant::now(),
            retry: None,
            patched_at_rv: None,
            seen_in_relist: true,
            reported: None,
            port_conflicts: BTreeMap::new(),
            conflicts_due: Vec::new(),
            selection_warned: None,
            ignored_warned: None,
        }
    }

    fn action(&self) -> Action {
        let f = &self.facts;
        match (f.ours && !f.deleting, f.has_finalizer) {
            (true, false) => Action::AddFinalizer,
            (true, true) => Action::Ingress,
            (false, _) => Action::Cleanup,
        }
    }
}

/// The Events published by the write-back: kube's recorder and the note last published per
/// (object, type and reason) (see [`WriteBack::publish_event`]). Shared by the calls of a batch.
struct EventLog {
    recorder: Recorder,
    notes: HashMap<(String, String), String>,
}

struct WriteBack {
    config: Config,
    kube: kube::Client,
    reporter: Reporter,
    events: Mutex<EventLog>,
    /// The services' states, pushed by the server (`states.rs`).
    states: States,
    records: HashMap<ObjKey, Record>,
    /// Service UID → its record's key.
    by_uid: HashMap<String, ObjKey>,
    /// When each record with a timer is due.
    timers: DelayQueue<ObjKey>,
    /// Records waiting for the server to acknowledge the event of their last change, by it.
    awaiting_ack: BTreeMap<u64, HashSet<ObjKey>>,
    /// Records waiting for a gateway's stream of states to come back, or for NRP to be read back.
    awaiting_states: HashSet<ObjKey>,
    acked: watch::Receiver<u64>,
    /// PoolServices of our class, by key, indexed by Service and by owner UID (`pool_index.rs`).
    pools: PoolIndex,
    /// PoolService → the resourceVersion our last status patch was based on.
    pool_patched: Mutex<HashMap<ObjKey, String>>,
    /// PoolService → the problem last published as a Warning Event on it.
    pool_warned: HashMap<ObjKey, String>,
    /// Warning Events on PoolServices not published yet.
    pool_warnings: Vec<PoolServiceFacts>,
    /// (gateway, egress) → the (reason, code) of the last NAT gateway Event published (`egress.rs`).
    egress_reported: HashMap<(String, String), (&'static str, String)>,
    /// Whether the API server keeps `ipMode` in a Service's ingress (and the PoolService CRD in a
    /// PoolService's): true until the answer to a status write shows it dropped
    /// ([`ingress::drops_ip_mode`]); then the ingress is compared without it.
    ip_mode_kept: AtomicBool,
    pool_ip_mode_kept: AtomicBool,
}

impl WriteBack {
    /// Notes, from the answer to a status write of ours, whether the server kept `ipMode`.
    fn note_ip_mode(kept: &AtomicBool, stored: &[IngressEntry], what: &str) {
        if ingress::drops_ip_mode(stored) && kept.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                "the API server dropped status.loadBalancer.ingress[].ipMode of a {what} (the \
                 LoadBalancerIPMode feature gate is off, or the schema lacks the field): the ingress \
                 is compared without it from now on"
            );
        }
    }
}

/// Runs until its inbox closes (the kube side is gone).
pub(crate) async fn run(
    config: Config,
    kube: kube::Client,
    mut rx: mpsc::Receiver<Msg>,
    acked: watch::Receiver<u64>,
) -> Ended {
    let reporter = Reporter {
        controller: REPORTING_CONTROLLER.to_owned(),
        instance: std::env::var("POD_NAME")
            .ok()
            .filter(|n| !n.is_empty())
            .or_else(|| Some(FIELD_MANAGER.to_owned())),
    };
    let (changed_tx, mut changed) = mpsc::channel(INBOX);
    let followed = match &config.gateways {
        Some(g) => g.names(),
        None => vec![String::new()],
    };
    let mut wb = WriteBack {
        states: States::follow(&config, followed, changed_tx),
        events: Mutex::new(EventLog {
            recorder: Recorder::new(kube.clone(), reporter.clone()),
            notes: HashMap::new(),
        }),
        reporter,
        config,
        kube,
        records: HashMap::new(),
        by_uid: HashMap::new(),
        timers: DelayQueue::new(),
        awaiting_ack: BTreeMap::new(),
        awaiting_states: HashSet::new(),
        acked,
        pools: PoolIndex::default(),
        pool_patched: Mutex::new(HashMap::new()),
        pool_warned: HashMap::new(),
        pool_warnings: Vec::new(),
        egress_reported: HashMap::new(),
        ip_mode_kept: AtomicBool::new(true),
        pool_ip_mode_kept: AtomicBool::new(true),
    };
    loop {
        if fault_point!(wb.config.faults, WRITE_BACK) {
            // As if the kube side had dropped its end: the inbox closes.
            rx.close();
        }
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(m) => {
                    wb.fold(m);
                    for f in std::mem::take(&mut wb.pool_warnings) {
                        wb.publish_on_pool(&f).await;
                    }
                }
                None => {
                    return Ended::Consequence {
                        task: WRITE_BACK,
                        reason: "its inbox closed".to_owned(),
                    };
                }
            },
            Some(pushed) = changed.recv() => {
                // The server pushed new states: look at those Services now.
                for id in &pushed.ids {
                    wb.poke(None, Some(crate::families::service_uid(id)));
                }
                if pushed.fresh {
                    for key in std::mem::take(&mut wb.awaiting_states) {
                        wb.due_now(&key);
                    }
                }
                wb.egress_events(&pushed.ids).await;
            }
            Ok(()) = wb.acked.changed() => {
                let acked = *wb.acked.borrow_and_update();
                let later = wb.awaiting_ack.split_off(&(acked + 1));
                for key in std::mem::replace(&mut wb.awaiting_ack, later).into_values().flatten() {
                    wb.due_now(&key);
                }
            }
            Some(first) = wb.timers.next() => {
                let mut due = vec![first.into_inner()];
                while due.len() < BATCH {
                    match wb.timers.next().now_or_never() {
                        Some(Some(e)) => due.push(e.into_inner()),
                        _ => break,
                    }
                }
                // A patch built from facts older than a message already received cannot succeed
                // (409 Conflict: e.g. a Service deleted meanwhile is cleaned up, not programmed):
                // every message already in the inbox is folded in first. A due record's timer has
                // expired, so folding leaves it due, not rescheduled.
                while let Ok(m) = rx.try_recv() {
                    wb.fold(m);
                }
                for f in std::mem::take(&mut wb.pool_warnings) {
                    wb.publish_on_pool(&f).await;
                }
                wb.act(due).await;
            }
        }
    }
}

impl WriteBack {
    /// Folds in `msg`: only the records it concerns are touched (found by key or UID).
    fn fold(&mut self, msg: Msg) {
        match msg {
            Msg::RelistStart => {
                for r in self.records.values_mut() {
                    r.seen_in_relist = false;
                }
            }
            Msg::RelistDone => {
                let stale: Vec<ObjKey> = self
                    .records
                    .iter()
                    .filter(|(_, r)| !r.seen_in_relist)
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in stale {
                    self.forget(&k);
                }
            }
            Msg::Gone(key) => self.forget(&key),
            Msg::Pool(f) => {
                match &f.problem {
                    Some(p) if self.pool_warned.get(&f.key) != Some(p) => {
                        self.pool_warned.insert(f.key.clone(), p.clone());
                        self.pool_warnings.push(f.clone());
                    }
                    Some(_) => {}
                    None => {
                        self.pool_warned.remove(&f.key);
                    }
                }
                let svc = f.service.clone();
                let owner = f.owner_uid.clone();
                self.pools.insert(f);
                self.poke(svc.as_ref(), owner.as_deref());
            }
            Msg::PoolGone(key) => {
                self.pool_warned.remove(&key);
                if let Some(f) = self.pools.remove(&key) {
                    self.pool_patched
                        .get_mut()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&key);
                    self.poke(f.service.as_ref(), f.owner_uid.as_deref());
                }
            }
            Msg::Poke(key) => self.poke(Some(&key), None),
            Msg::Touched { uids, seq } => {
                for uid in uids {
                    let Some(key) = self.by_uid.get(&uid).cloned() else {
                        continue;
                    };
                    if let Some(r) = self.records.get_mut(&key) {
                        r.seq = r.seq.max(seq);
                    }
                    self.poke(Some(&key), None);
                }
            }
            Msg::PortConflict {
                key,
                port_name,
                message,
            } => {
                if let Some(r) = self.records.get_mut(&key) {
                    r.port_conflicts.insert(port_name, message.clone());
                    r.conflicts_due.push(message);
                    self.due_now(&key);
                }
            }
            Msg::Seen { mut facts, seq } => {
                let key = facts.key.clone();
                let uid = facts.uid.clone();
                match self.records.get_mut(&key) {
                    Some(r) => {
                        if facts.selection_error.is_some() {
                            // Refused annotations change nothing.
                            facts.gateways = r.facts.gateways.clone();
                        }
                        let new_version = r.facts.resource_version != facts.resource_version;
                        if r.facts.uid != uid {
                            self.by_uid.remove(&r.facts.uid);
                        }
                        r.facts = facts;
                        r.seq = seq;
                        r.seen_in_relist = true;
                        if new_version {
                            r.retry = None;
                            self.due_now(&key);
                        }
                    }
                    None => {
                        self.records.insert(key.clone(), Record::new(facts, seq));
                        self.due_now(&key);
                    }
                }
                self.by_uid.insert(uid, key);
            }
        }
    }

    /// Drops the record of `key`, with its timer and its index entries.
    fn forget(&mut self, key: &ObjKey) {
        if let Some(r) = self.records.remove(key) {
            if let Some(t) = r.timer {
                self.timers.remove(&t);
            }
            if self.by_uid.get(&r.facts.uid) == Some(key) {
                self.by_uid.remove(&r.facts.uid);
            }
        }
    }

    /// Makes the record of `key` due at `at` (earlier than it was due, if it was).
    fn due_at(&mut self, key: &ObjKey, at: Instant) {
        let Some(r) = self.records.get_mut(key) else {
            return;
        };
        match &r.timer {
            Some(_) if r.due_at <= at => return,
            Some(t) => self.timers.reset_at(t, at),
            None => r.timer = Some(self.timers.insert_at(key.clone(), at)),
        }
        r.due_at = at;
    }

    fn due_now(&mut self, key: &ObjKey) {
        self.due_at(key, Instant::now());
    }

    /// Handles the records `due` (their timers expired): each one's action runs, the calls of
    /// different Services [`CONCURRENCY`] at a time.
    async fn act(&mut self, due: Vec<ObjKey>) {
        let acked = *self.acked.borrow();
        let nrp_observed = self.nrp_observed();
        let mut batch = Vec::with_capacity(due.len());
        for key in due {
            let Some(mut r) = self.records.remove(&key) else {
                continue;
            };
            r.timer = None;
            if r.action() != Action::AddFinalizer && r.seq > acked {
                // The server has not acknowledged what we sent for this Service yet.
                self.awaiting_ack
                    .entry(r.seq)
                    .or_default()
                    .insert(key.clone());
                self.records.insert(key, r);
                continue;
            }
            batch.push((key, r));
        }
        let this = &*self;
        let done: Vec<(ObjKey, Record, Result<Next, WriteBackError>)> =
            futures::stream::iter(batch)
                .map(|(key, mut r)| async move {
                    let result = this.action(&key, &mut r, nrp_observed).await;
                    (key, r, result)
                })
                .buffer_unordered(CONCURRENCY)
                .collect()
                .await;
        for (key, mut r, result) in done {
            match result {
                Ok(Next::Wait) => {
                    r.retry = None;
                    if r.action() == Action::Cleanup && !nrp_observed {
                        self.awaiting_states.insert(key.clone());
                    }
                    self.records.insert(key, r);
                }
                Ok(Next::Forget) => {
                    self.records.insert(key.clone(), r);
                    self.forget(&key);
                }
                Err(WriteBackError::StatesDown(e)) => {
                    tracing::debug!(service = %key, error = %e, "waiting for the service states");
                    self.awaiting_states.insert(key.clone());
                    self.records.insert(key, r);
                }
                Err(e) => {
                    if let WriteBackError::Kube { what, .. } = &e {
                        self.config.metrics.writeback_failure(what);
                        tracing::warn!(service = %key, error = %e, "write-back failed; retrying");
                    }
                    let base = self.config.backoff_initial;
                    let max = self.config.backoff_max.max(base);
                    let d = r
                        .retry
                        .get_or_insert_with(|| Backoff::new(base, max))
                        .next_delay(false);
                    self.records.insert(key.clone(), r);
                    self.due_at(&key, Instant::now() + d);
                }
            }
        }
    }

    /// The action of one Service (owned by the batch while it runs).
    async fn action(
        &self,
        key: &ObjKey,
        r: &mut Record,
        nrp_observed: bool,
    ) -> Result<Next, WriteBackError> {
        match r.action() {
            Action::AddFinalizer => self.add_finalizer(key, r).await,
            Action::Ingress => self.program(key, r).await,
            Action::Cleanup => {
                // The PoolServices we made for it go at once (NRP's removal is the Service's).
                let pools = self.delete_owned_pools(key, &r.facts.uid).await;
                let next = if nrp_observed {
                    self.cleanup(key, r).await?
                } else {
                    Next::Wait
                };
                pools.map(|()| next)
            }
        }
    }

    fn api(&self, key: &ObjKey) -> Api<Service> {
        Api::namespaced(self.kube.clone(), &key.namespace)
    }

    fn params() -> PatchParams {
        PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        }
    }

    async fn add_finalizer(&self, key: &ObjKey, r: &mut Record) -> Result<Next, WriteBackError> {
        if r.patched_at_rv.as_deref() == Some(r.facts.resource_version.as_str()) {
            // Our patch is not in the watch yet: its event makes the record due.
            return Ok(Next::Wait);
        }
        let mut finalizers = r.facts.finalizers.clone();
        finalizers.push(self.config.finalizer.clone());
        let rv = r.facts.resource_version.clone();
        let patched = self.patch_finalizers(key, finalizers, &rv).await?;
        if patched {
            tracing::info!(service = %key, finalizer = %self.config.finalizer, "finalizer added");
        }
        // Written, or refused for a newer version (409): either way a patch at this version is
        // spent, and the next event brings the newer one.
        r.patched_at_rv = Some(rv);
        Ok(Next::Wait)
    }

    /// Patches the finalizers at resource version `rv`: `Ok(true)` when written, `Ok(false)` on a
    /// conflict (the Service changed: its next event brings the new version).
    async fn patch_finalizers(
        &self,
        key: &ObjKey,
        finalizers: Vec<String>,
        rv: &str,
    ) -> Result<bool, WriteBackError> {
        let patch = json!({
            "metadata": {
                "finalizers": finalizers,
                "resourceVersion": rv,
            }
        });
        match self
            .api(key)
            .patch(&key.name, &Self::params(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) => kube_error(key, "patching the finalizers", e).map(|_| false),
        }
    }

    /// The state of service `service_id` in `gateway` as the server's stream last pushed it
    /// (`Ok(None)`: the gateway does not know it).
    fn service_state(
        &self,
        gateway: &str,
        service_id: &str,
    ) -> Result<Option<ServiceState>, WriteBackError> {
        Ok(self.states.get(gateway, service_id)?)
    }

    /// Whether every gateway a Service may be in has read NRP back: only then does "unknown
    /// service" mean "NRP does not have it".
    fn nrp_observed(&self) -> bool {
        self.states.nrp_observed(&self.all_gateways())
    }
}

/// A failed Kubernetes call on Service `key`: a conflict (409) is `Ok(Next::Wait)` (the Service
/// changed: its next event brings the new version), a missing Service (404) `Ok(Next::Forget)`,
/// anything else an error to retry with backoff.
/// Whether `e` is 409 Conflict: the object has a newer version than the one the patch named.
fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn kube_error(key: &ObjKey, what: &'static str, e: kube::Error) -> Result<Next, WriteBackError> {
    match &e {
        kube::Error::Api(s) if s.code == 409 => {
            tracing::debug!(service = %key, "{what}: conflict, the Service changed; retrying with its new version");
            Ok(Next::Wait)
        }
        kube::Error::Api(s) if s.code == 404 => {
            tracing::debug!(service = %key, "{what}: the Service is gone");
            Ok(Next::Forget)
        }
        _ => Err(WriteBackError::Kube {
            what,
            object: key.clone(),
            source: Box::new(e),
        }),
    }
}

mod egress;
mod facts;
mod pool_index;
mod pools;
mod program;
mod states;
mod wanted;

use pool_index::PoolIndex;
use states::States;
#[cfg(test)]
use wanted::Wanted;
use wanted::{now_seconds, truncate};

#[cfg(test)]
mod tests;
