//! The pod readiness gate `clb.azure.com/programmed` (docs/readiness-gate.md), cluster mode with
//! `--readiness-gate=true`.
//!
//! A pod that lists the gate in `spec.readinessGates` is Ready only once the condition is `True`.
//! The watcher watches only the pods that carry the label [`GATE_LABEL`] (the webhook adds it with
//! the gate; users who add the gate by hand add the label too): at 100,000 pods the watch carries
//! just the gated ones, and no pod of the cluster is held in memory for this.
//!
//! - **No deadlock.** A gated pod is not Ready, so its EndpointSlice endpoint says `ready: false`.
//!   A pod whose containers are all ready and whose only unmet readiness condition is this gate
//!   is *eligible*: the translators program its endpoints as if ready
//!   ([`crate::translate::Translator::set_gate_ready`]), as AWS's controller does.
//! - **True once programmed.** An eligible pod's gate turns `True` (reason `Programmed`) once, for
//!   every clb Service whose EndpointSlices list the pod's address, the state server of the
//!   Service's gateway reports the address in NRP's actual state at the pod's node's location
//!   with that Service. The state server pushes it: one `Writer.WatchAddresses` stream per lane
//!   (verb `write`) watches the addresses the lane's pending pods wait for, and the set changes on
//!   the open stream (`streams.rs`). A pod no clb Service lists
//!   (once every lane has listed every kind, and after [`NOT_SELECTED_GRACE`], so that a late
//!   EndpointSlice is not raced) gets `True` with reason `NotSelected`: a gate never blocks an
//!   unrelated pod. While it waits, the condition is
//!   `False`, reason `Pending`.
//! - **Fail open, bounded.** Not programmed within `--readiness-gate-timeout` (10 min): `True`
//!   with reason `Timeout`, a Warning Event `ReadinessGateTimeout` on the pod naming the Services,
//!   and `clb_watcher_readiness_gate_total{reason="Timeout"}`. The Event names each Service's
//!   condition (`Writer.ServiceConditions`, one call per lane when the gate times out).
//! - **Nothing polls.** A pending pod is checked again when its pod changes, when a stream pushes
//!   an answer, when a lane's translator has sent a change (its acknowledgement: an EndpointSlice
//!   that lists the pod may have come), and when its own timer passes (one per pod on a
//!   `DelayQueue`: [`NOT_SELECTED_GRACE`], the timeout, or a failed patch's retry). An idle
//!   cluster costs no call.
//! - **Never back to False.** A gate once `True` is left alone: a restarted server or watcher, or
//!   a state held back by the restart gate, never turns a Ready pod un-Ready.
//!
//! The condition is written with a strategic merge patch of the `status` subresource (pod
//! conditions merge by `type`, so other conditions are untouched; RBAC `patch` on `pods/status`,
//! granted by `deploy/components/readiness-gate`).
//!
//! The loop does not wait for its patches: the pod watch is read by a task of its own (a watch's
//! body is read only while polled; read between patches, it gave one event per patch), and the
//! patches run as tasks beside the loop (`PATCHES_AT_ONCE` at once, one per pod at a time).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::time::{DelayQueue, delay_queue};

use crate::config::{WATCHER_WRITER, WatcherConfig};
use crate::lane::Lane;
use crate::sender::Conn;
use crate::supervise::{Ended, READINESS_GATE, fault_point};
use crate::translate::ObjKey;
use crate::webhook::{GATE_CONDITION_TYPE, GATE_LABEL, GATE_LABEL_VALUE};

mod pod;
mod streams;

use pod::GatedPod;
use streams::{AddressKey, LaneStream, Pushed};

/// A pod that no clb Service lists gets `True` only after this long (its EndpointSlice may lag).
pub const NOT_SELECTED_GRACE: Duration = Duration::from_secs(2);

/// How long after a failed patch of a pod's condition it is tried again.
const PATCH_RETRY: Duration = Duration::from_secs(1);

/// The most patches of pods' conditions under way at once. A scale-up of 100 gated pods costs
/// 100 `False, Pending` and 100 `True` patches: one after the other, each an API server's
/// write (tens of ms, more under load), they held every pod's gate back by seconds. They run
/// beside the gate's loop, which goes on taking pod events and pushes meanwhile.
const PATCHES_AT_ONCE: usize = 16;

/// The most pod events taken in after a wake-up before the dirty pods are checked (so that a
/// burst of pod events is fed to the translators at once, not one per round of patches).
const DRAIN: usize = 1_000;

/// Pod events read ahead of the gate's loop.
const POD_EVENTS_BUFFERED: usize = 1_024;

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[derive(Debug)]
struct Tracked {
    pod: GatedPod,
    /// When the watcher first saw it eligible (the gate's clock).
    eligible_since: Option<Instant>,
    /// `False, Pending` written (or found).
    pending_written: bool,
    /// We set it `True` (waiting for the watch to show it).
    opened: bool,
    /// The addresses it waits for, by lane (what it added to the lanes' streams).
    wanted: Vec<(usize, AddressKey)>,
    /// Its timer: the next moment time alone may change its outcome.
    timer: Option<delay_queue::Key>,
}

impl Tracked {
    /// Eligible, and its gate not `True` yet.
    fn pending(&self) -> bool {
        self.pod.eligible() && !self.pod.open() && !self.opened
    }
}

/// The gate's task: the gated pods' watch, the eligibility fed to the translators, the lanes'
/// address streams, and the checks.
pub(crate) struct Gate {
    config: WatcherConfig,
    lanes: Vec<Lane>,
    write: kube::Client,
    recorder: Recorder,
    pods: HashMap<ObjKey, Tracked>,
    /// Per lane (by index): its `WatchAddresses` stream.
    streams: Vec<LaneStream>,
    /// Per lane: a connection for `ServiceConditions` (a timed-out gate's Event).
    conns: Vec<Conn>,
    /// Where the streams' readers send what they read.
    pushed: mpsc::UnboundedSender<Pushed>,
    pushes: Option<mpsc::UnboundedReceiver<Pushed>>,
    /// Each pod's timer ([`Tracked::timer`]) and each failed stream's reopening.
    timers: DelayQueue<Timer>,
    /// Pods to check.
    dirty: HashSet<ObjKey>,
    /// The patches of pods' conditions under way, each with its pod (at most one per pod: a pod
    /// is checked again once its patch is done).
    writes: tokio::task::JoinSet<(Write, bool)>,
    writing: HashMap<tokio::task::Id, ObjKey>,
    busy: HashSet<ObjKey>,
    /// At most [`PATCHES_AT_ONCE`] of them patch at once.
    patches: Arc<tokio::sync::Semaphore>,
    listing: Option<HashSet<ObjKey>>,
}

/// A condition the gate writes on a pod.
#[derive(Debug)]
struct Write {
    key: ObjKey,
    status: &'static str,
    reason: &'static str,
    message: String,
    /// The pod's gate clock (for the histogram of `True`).
    since: Instant,
}

/// What a timer is for.
#[derive(Debug)]
enum Timer {
    /// A pod's next moment ([`Tracked::timer`]).
    Pod(ObjKey),
    /// A failed stream's backoff passed: it may be opened again.
    Reopen,
}

/// What woke the gate's loop.
enum Woken {
    Pod(Box<Option<Result<Event<Pod>, watcher::Error>>>),
    Pushed(Pushed),
    Acked,
    Timer(Timer),
    /// A patch of a pod's condition is done (`Ok((write, succeeded))`), or its task failed.
    Written(Result<(tokio::task::Id, (Write, bool)), tokio::task::JoinError>),
}

impl Gate {
    pub(crate) fn new(config: WatcherConfig, lanes: Vec<Lane>, write: kube::Client) -> Self {
        let reporter = Reporter {
            controller: crate::writeback::REPORTING_CONTROLLER.to_owned(),
            instance: std::env::var("POD_NAME").ok().filter(|n| !n.is_empty()),
        };
        let conns = lanes
            .iter()
            .map(|l| Conn::new(&l.config().server))
            .collect();
        let streams = lanes.iter().map(|l| LaneStream::new(l.config())).collect();
        let (pushed, pushes) = mpsc::unbounded_channel();
        Self {
            recorder: Recorder::new(write.clone(), reporter),
            config,
            lanes,
            write,
            pods: HashMap::new(),
            streams,
            conns,
            pushed,
            pushes: Some(pushes),
            timers: DelayQueue::new(),
            dirty: HashSet::new(),
            writes: tokio::task::JoinSet::new(),
            writing: HashMap::new(),
            busy: HashSet::new(),
            patches: Arc::new(tokio::sync::Semaphore::new(PATCHES_AT_ONCE)),
            listing: None,
        }
    }

    /// Runs until `watch`'s stream ends (it does not).
    pub(crate) async fn run(mut self, watch: kube::Client) -> Ended {
        let api: Api<Pod> = Api::all(watch);
        let wc = watcher::Config::default().labels(&format!("{GATE_LABEL}={GATE_LABEL_VALUE}"));
        let mut events = crate::relist::paced(
            watcher::watcher(api, wc),
            crate::relist::connection_backoff(self.config.watch_backoff_max),
        )
        .boxed();
        // The pod watch is read by a task of its own: a watch's HTTP body is read only while it
        // is polled, so read between the loop's rounds of patches it gave one pod event per round
        // (a scale-up of 100 pods took in its pods one patch after another).
        let (pod_tx, mut pod_events) = mpsc::channel(POD_EVENTS_BUFFERED);
        let _reader = AbortOnDrop(tokio::spawn(async move {
            while let Some(e) = events.next().await {
                if pod_tx.send(e).await.is_err() {
                    return;
                }
            }
        }));
        let mut pushes = self.pushes.take().expect("run once");
        // A lane's acknowledgement: its translator's change reached the server (an EndpointSlice
        // that lists a pending pod may have come).
        let mut acks: futures::stream::SelectAll<BoxStream<'static, ()>> =
            futures::stream::select_all(self.lanes.iter().map(|l| {
                futures::stream::unfold(l.acked(), |mut rx| async move {
                    rx.changed().await.ok()?;
                    Some(((), rx))
                })
                .boxed()
            }));
        loop {
            if fault_point!(self.config.faults, READINESS_GATE) {
                return Ended::failed(READINESS_GATE, "it returned");
            }
            let pending = self.has_pending();
            let woken = tokio::select! {
                e = pod_events.recv() => Woken::Pod(Box::new(e)),
                Some(p) = pushes.recv() => Woken::Pushed(p),
                Some(()) = acks.next(), if pending => Woken::Acked,
                Some(t) = self.timers.next() => Woken::Timer(t.into_inner()),
                Some(w) = self.writes.join_next_with_id() => Woken::Written(w),
            };
            if let Some(ended) = self.woken(woken) {
                return ended;
            }
            // Whatever else is ready now is taken in before the checks: a burst of pod events
            // (a scale-up) is fed to the translators at once and checked in one round, its
            // patches side by side.
            for _ in 0..DRAIN {
                let Ok(e) = pod_events.try_recv() else {
                    break;
                };
                if let Some(ended) = self.woken(Woken::Pod(Box::new(Some(e)))) {
                    return ended;
                }
            }
            while let Ok(p) = pushes.try_recv() {
                self.pushed(p);
            }
            while let Some(w) = self.writes.try_join_next_with_id() {
                let _ = self.woken(Woken::Written(w));
            }
            self.check_dirty().await;
            for (lane, stream) in self.streams.iter_mut().enumerate() {
                stream.sync(lane, &self.pushed);
            }
        }
    }

    /// Takes in what woke the loop; `Some` when the gate is to end.
    fn woken(&mut self, woken: Woken) -> Option<Ended> {
        match woken {
            Woken::Pod(e) => match *e {
                Some(Ok(e)) => self.event(e),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "readiness gate: pod watch failed; retrying");
                }
                None => return Some(Ended::failed(READINESS_GATE, "its pod watch ended")),
            },
            Woken::Pushed(p) => self.pushed(p),
            Woken::Acked => self.all_pending_dirty(),
            Woken::Timer(Timer::Pod(key)) => {
                if let Some(t) = self.pods.get_mut(&key) {
                    t.timer = None;
                }
                self.dirty.insert(key);
            }
            Woken::Timer(Timer::Reopen) => {}
            Woken::Written(Ok((id, (w, ok)))) => {
                self.writing.remove(&id);
                self.busy.remove(&w.key);
                self.written(w, ok);
            }
            Woken::Written(Err(e)) => {
                // Not expected (a patch does not panic): its pod is checked again.
                tracing::warn!(error = %e, "readiness gate: a patch's task failed");
                if let Some(key) = self.writing.remove(&e.id()) {
                    self.busy.remove(&key);
                    self.arm(&key, Instant::now() + PATCH_RETRY);
                }
            }
        }
        None
    }

    fn has_pending(&self) -> bool {
        self.pods.values().any(Tracked::pending)
    }

    fn all_pending_dirty(&mut self) {
        let keys = self
            .pods
            .iter()
            .filter(|(_, t)| t.pending())
            .map(|(k, _)| k);
        self.dirty.extend(keys.cloned());
    }

    /// A stream's answers: every pending pod may be decided; a stream that ended is opened again
    /// after its backoff.
    fn pushed(&mut self, p: Pushed) {
        let lane = p.lane;
        if let Some(delay) = self.streams[lane].pushed(p) {
            self.timers.insert(Timer::Reopen, delay);
        }
        self.all_pending_dirty();
    }

    fn event(&mut self, e: Event<Pod>) {
        match e {
            Event::Init => self.listing = Some(HashSet::new()),
            Event::InitApply(pod) | Event::Apply(pod) => self.seen(&pod),
            Event::Delete(pod) => {
                if let Some(key) = ObjKey::of(crate::translate::Kind::Pod, &pod.metadata) {
                    self.gone(&key);
                }
            }
            Event::InitDone => {
                if let Some(seen) = self.listing.take() {
                    let stale: Vec<ObjKey> = self
                        .pods
                        .keys()
                        .filter(|k| !seen.contains(*k))
                        .cloned()
                        .collect();
                    for k in stale {
                        self.gone(&k);
                    }
                }
            }
        }
    }

    fn seen(&mut self, pod: &Pod) {
        let Some(key) = ObjKey::of(crate::translate::Kind::Pod, &pod.metadata) else {
            return;
        };
        if let Some(l) = &mut self.listing {
            l.insert(key.clone());
        }
        let now = GatedPod::of(pod);
        let before = self.pods.get(&key).map(|t| t.pod.clone());
        let was = before.as_ref().is_some_and(GatedPod::eligible);
        let old_ips = before.as_ref().map(|p| p.ips.clone()).unwrap_or_default();
        let t = self.pods.entry(key.clone()).or_insert(Tracked {
            pod: now.clone(),
            eligible_since: None,
            pending_written: false,
            opened: false,
            wanted: Vec::new(),
            timer: None,
        });
        if t.pod.uid != now.uid {
            // Another pod of the same name (a missed deletion): start afresh.
            t.eligible_since = None;
            t.pending_written = false;
            t.opened = false;
        }
        if now.eligible() && t.eligible_since.is_none() {
            t.eligible_since = Some(Instant::now());
        }
        if !now.eligible() && !now.open() {
            t.eligible_since = None;
        }
        t.pending_written |= now.ours.is_some();
        // `opened` stays once we set True: an event older than our patch may still show False,
        // and the gate never goes back to False.
        t.pod = now.clone();
        self.dirty.insert(key);
        let is = now.eligible();
        if was != is || old_ips != now.ips {
            for ip in old_ips.iter().filter(|ip| !now.ips.contains(ip)) {
                self.feed(*ip, false);
            }
            for ip in &now.ips {
                self.feed(*ip, is);
            }
        }
    }

    fn gone(&mut self, key: &ObjKey) {
        self.want(key, Vec::new());
        if let Some(t) = self.pods.remove(key) {
            if let Some(timer) = t.timer {
                self.timers.remove(&timer);
            }
            for ip in t.pod.ips {
                self.feed(ip, false);
            }
        }
    }

    /// Tells every lane's translator whether the pod at `ip` is eligible.
    fn feed(&self, ip: IpAddr, eligible: bool) {
        for lane in &self.lanes {
            lane.feed(|t| t.set_gate_ready(ip, eligible));
        }
    }

    /// Makes `wanted` what pod `key` waits for, in the lanes' streams.
    fn want(&mut self, key: &ObjKey, wanted: Vec<(usize, AddressKey)>) {
        let Some(t) = self.pods.get_mut(key) else {
            return;
        };
        if t.wanted == wanted {
            return;
        }
        for (lane, k) in &wanted {
            self.streams[*lane].want(k.clone());
        }
        for (lane, k) in std::mem::replace(&mut t.wanted, wanted) {
            self.streams[lane].unwant(&k);
        }
    }

    /// Sets pod `key`'s timer to `at` (its next moment).
    fn arm(&mut self, key: &ObjKey, at: Instant) {
        let Some(t) = self.pods.get_mut(key) else {
            return;
        };
        match &t.timer {
            Some(timer) => self.timers.reset_at(timer, at),
            None => t.timer = Some(self.timers.insert_at(Timer::Pod(key.clone()), at)),
        }
    }

    /// Checks the pods marked dirty (but those whose patch is under way: they are checked again
    /// once it is done) and starts the patches they need.
    async fn check_dirty(&mut self) {
        let dirty = std::mem::take(&mut self.dirty);
        let mut writes = Vec::new();
        for key in dirty {
            if self.busy.contains(&key) {
                continue;
            }
            if let Some(w) = self.check(&key).await {
                writes.push(w);
            }
        }
        // `True` first: a pod that waits for nothing more is not queued behind `Pending`s.
        writes.sort_by_key(|w| w.status != "True");
        for w in writes {
            let api: Api<Pod> = Api::namespaced(self.write.clone(), &w.key.namespace);
            let metrics = self.config.metrics.clone();
            let patches = self.patches.clone();
            let key = w.key.clone();
            let task = self.writes.spawn(async move {
                let _permit = patches.acquire_owned().await;
                let ok = patch(&api, &metrics, &w).await;
                (w, ok)
            });
            self.writing.insert(task.id(), key.clone());
            self.busy.insert(key);
        }
    }

    /// A write of [`Gate::check`] done (`ok`) or failed (tried again after [`PATCH_RETRY`]).
    fn written(&mut self, w: Write, ok: bool) {
        let key = &w.key;
        if !ok {
            self.arm(key, Instant::now() + PATCH_RETRY);
            return;
        }
        if w.status != "True" {
            if let Some(t) = self.pods.get_mut(key) {
                t.pending_written = true;
            }
            // What came while it was written (an answer) is looked at now.
            self.dirty.insert(key.clone());
            return;
        }
        let waited = w.since.elapsed();
        self.config
            .metrics
            .gate_opened(w.reason, waited.as_secs_f64());
        tracing::info!(pod = %key, reason = w.reason, ?waited, "readiness gate {GATE_CONDITION_TYPE} set True");
        if let Some(t) = self.pods.get_mut(key) {
            t.opened = true;
        }
        self.settled(key);
    }

    /// Checks pod `key`: what to write on it — `False, Pending` once, then `True` once programmed
    /// (or selected by no clb Service, or past the bound). Keeps what it waits for in the lanes'
    /// streams, and its timer at the next moment time alone may decide it.
    async fn check(&mut self, key: &ObjKey) -> Option<Write> {
        let t = self.pods.get(key)?;
        if !t.pending() {
            self.settled(key);
            return None;
        }
        let since = t.eligible_since.unwrap_or_else(Instant::now);
        let pod = t.pod.clone();
        let pending_written = t.pending_written;
        // Per lane: the (location, address, service) the gate waits for.
        let mut wanted: Vec<(usize, AddressKey)> = Vec::new();
        let mut listed = false;
        let mut ours_listed = false;
        for (i, lane) in self.lanes.iter().enumerate() {
            lane.read(|t| {
                for ip in &pod.ips {
                    listed |= t.lists_address(*ip);
                    ours_listed |= t.ours_lists_address(*ip);
                    for (service_id, loc) in t.gate_services(*ip) {
                        let k = (i, (loc.to_string(), ip.to_string(), service_id));
                        if !wanted.contains(&k) {
                            wanted.push(k);
                        }
                    }
                }
            });
        }
        self.want(key, wanted.clone());
        let waited = since.elapsed();
        let timeout = self.config.readiness_gate_timeout;
        // Until every lane has listed every kind once, a pod no EndpointSlice lists may only be
        // listed by one not read yet (a large cluster's first list takes seconds): not decided.
        let lists_known = self.lanes.iter().all(Lane::initialized);
        let outcome = if wanted.is_empty() && !ours_listed && lists_known {
            if !listed && waited < NOT_SELECTED_GRACE {
                self.arm(key, since + NOT_SELECTED_GRACE);
                None
            } else {
                Some((
                    "NotSelected",
                    "no Service of clb's class lists the pod".to_owned(),
                ))
            }
        } else if !wanted.is_empty() && wanted.iter().all(|(i, k)| self.streams[*i].programmed(k)) {
            let services: Vec<&str> = wanted.iter().map(|(_, k)| k.2.as_str()).collect();
            Some((
                "Programmed",
                format!(
                    "Azure has the pod's address in the backend pools of {}",
                    services.join(", ")
                ),
            ))
        } else if waited >= timeout {
            let services = self.why_not(&wanted).await;
            let why = format!(
                "not programmed in Azure within {timeout:?}: {}; failing open (the pod turns Ready \
                 without Azure's confirmation)",
                services.join("; ")
            );
            self.warn(key, &pod, &why).await;
            Some(("Timeout", why))
        } else {
            let mut at = since + timeout;
            if !lists_known {
                at = at.min(Instant::now() + NOT_SELECTED_GRACE);
            }
            self.arm(key, at);
            return (!pending_written).then(|| Write {
                key: key.clone(),
                status: "False",
                reason: "Pending",
                message: "waiting for Azure to program the pod's address in its Services' \
                          backend pools"
                    .to_owned(),
                since,
            });
        };
        let (reason, message) = outcome?;
        Some(Write {
            key: key.clone(),
            status: "True",
            reason,
            message,
            since,
        })
    }

    /// Pod `key` waits for nothing (any more): out of the streams, its timer gone.
    fn settled(&mut self, key: &ObjKey) {
        self.want(key, Vec::new());
        if let Some(timer) = self.pods.get_mut(key).and_then(|t| t.timer.take()) {
            self.timers.remove(&timer);
        }
    }

    /// Per awaited address, why it is not programmed: its service's condition (parked after a
    /// terminal error, throttled, retrying, held back, pending; `Writer.ServiceConditions`, one
    /// call per lane), or what is known without it.
    async fn why_not(&mut self, wanted: &[(usize, AddressKey)]) -> Vec<String> {
        let mut lanes: Vec<usize> = wanted.iter().map(|(i, _)| *i).collect();
        lanes.dedup();
        let mut out = Vec::new();
        for i in lanes {
            let keys: Vec<&AddressKey> = wanted
                .iter()
                .filter(|(l, _)| *l == i)
                .map(|(_, k)| k)
                .collect();
            let services = keys.iter().map(|k| k.2.clone()).collect();
            let answer = match self.conns[i].get().await {
                Ok(client) => client
                    .writer(WATCHER_WRITER)
                    .service_conditions(services)
                    .await
                    .ok(),
                Err(_) => None,
            };
            if answer.is_none() {
                self.conns[i].reset();
            }
            for (n, (location, _, service)) in keys.into_iter().enumerate() {
                let what = format!(
                    "Service {service} at {location} (gateway {:?})",
                    self.lanes[i].gateway()
                );
                let cond = answer.as_ref().and_then(|r| r.get(n));
                out.push(match cond {
                    Some(c) => {
                        let reason = clb_proto::v1::ProgrammingReason::try_from(c.reason)
                            .map_or("UNKNOWN", |r| r.as_str_name());
                        let mut s = format!("{what}: {reason}");
                        if !c.message.is_empty() {
                            s.push_str(&format!(": {}", c.message));
                        }
                        if !c.error_code.is_empty() {
                            s.push_str(&format!(" ({}: {})", c.error_code, c.error_message));
                        }
                        s
                    }
                    None => format!("{what}: the state server could not be asked"),
                });
            }
        }
        out
    }

    async fn warn(&self, key: &ObjKey, pod: &GatedPod, why: &str) {
        let reference = ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            name: Some(key.name.clone()),
            namespace: Some(key.namespace.clone()),
            uid: Some(pod.uid.clone()).filter(|u| !u.is_empty()),
            ..ObjectReference::default()
        };
        let ev = KubeEvent {
            type_: EventType::Warning,
            reason: "ReadinessGateTimeout".to_owned(),
            note: Some(why.chars().take(1024).collect()),
            action: "Programming".to_owned(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &reference).await {
            tracing::warn!(pod = %key, error = %e, "publishing an event failed");
        }
    }
}

/// Sets our condition `w` on its pod (strategic merge patch of `status`: merged by `type`).
async fn patch(api: &Api<Pod>, metrics: &crate::metrics::WatcherMetrics, w: &Write) -> bool {
    let now = k8s_openapi::jiff::Timestamp::now();
    let now = k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now);
    let patch = json!({"status": {"conditions": [{
        "type": GATE_CONDITION_TYPE,
        "status": w.status,
        "reason": w.reason,
        "message": w.message,
        "lastTransitionTime": now.to_string(),
    }]}});
    let params = PatchParams {
        field_manager: Some(crate::writeback::FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match api
        .patch_status(&w.key.name, &params, &Patch::Strategic(&patch))
        .await
    {
        Ok(_) => true,
        Err(e) => {
            metrics.writeback_failure("setting a pod's readiness gate");
            tracing::warn!(pod = %w.key, error = %e, "setting the readiness gate failed; retrying");
            false
        }
    }
}
