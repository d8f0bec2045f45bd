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
//! **Polling.** A Service is polled only while something is pending for it: first after
//! `poll_initial` (50 ms), doubling to `poll_interval`; once it is settled (programmed with its
//! ingress and condition written, or rejected) only every `recheck_interval`. A new version of the
//! Service, or a change of its endpoints sent to the server, starts the short polls again.
//!
//! **Not a kube-runtime `Controller`.** Its triggers are mostly not Service events (the server's
//! pushed states, the translator's messages), it acts only on what the server acknowledged, and its
//! cleanup waits for NRP to drop the service (also for a Service that stopped being ours without
//! being deleted), where `finalizer()` drops the finalizer once `Cleanup` returns: docs/watcher.md,
//! "Why the write-back is not a kube-runtime `Controller`".

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use clb_proto::v1::{ProgrammingReason, ServiceState};
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::WatcherConfig;
use super::ingress::{self, IngressEntry};
use super::poolservice::{self, PoolService, PoolServiceFacts};
use super::routing;
use super::translate::{ObjKey, ServiceClass, TranslatorConfig, classify};
use clb_client::backoff::Backoff;
use clb_client::client::ConnectOptions;
use clb_gateways::Gateways;

/// The field manager named in our patches.
pub(crate) const FIELD_MANAGER: &str = "clb-watcher";

/// The type of our condition in `status.conditions` of a Service.
pub const CONDITION_TYPE: &str = "clb.azure.com/Programmed";

/// The reporting controller of our Events.
pub const REPORTING_CONTROLLER: &str = "clb.azure.com/clb-watcher";

/// The first poll of a Service with something pending comes this soon (then doubling to
/// `poll_interval`).
const POLL_INITIAL: Duration = Duration::from_millis(50);

/// A Service whose latest event the server has not acknowledged yet is looked at again this soon.
const ACK_WAIT: Duration = Duration::from_millis(10);

/// What the write-back needs to know of a Service.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ServiceFacts {
    pub key: ObjKey,
    pub uid: String,
    /// Its inbound identities, one per IP family, primary first (`crate::families`).
    pub ids: Vec<String>,
    pub resource_version: String,
    /// A LoadBalancer Service of our class.
    pub ours: bool,
    pub deleting: bool,
    pub has_finalizer: bool,
    pub finalizers: Vec<String>,
    /// `status.loadBalancer.ingress`.
    pub ingress: Vec<IngressEntry>,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `status.conditions`, every type.
    pub conditions: Vec<Condition>,
    /// The gateways the Service is exposed in (`[""]`, the one of `--gateway`, without a gateways
    /// file), sorted.
    pub gateways: Vec<String>,
    /// Its gateway annotations cannot be used: why (the gateways stay as they were).
    pub selection_error: Option<String>,
}

impl ServiceFacts {
    /// The facts of a Service that concerns us (ours, or carrying our finalizer); `None` otherwise.
    pub(crate) fn of(
        key: &ObjKey,
        svc: &Service,
        config: &TranslatorConfig,
        gateways: Option<&Gateways>,
    ) -> Option<Self> {
        let finalizer = config.require_finalizer.as_deref()?;
        let ours = classify(svc, config) == ServiceClass::Ours;
        let finalizers = svc.metadata.finalizers.clone().unwrap_or_default();
        let has_finalizer = finalizers.iter().any(|f| f == finalizer);
        if !ours && !has_finalizer {
            return None;
        }
        // A Service without UID is skipped (the translator logs it): nothing to program or patch.
        let uid = svc.metadata.uid.clone().filter(|u| !u.trim().is_empty())?;
        let ingress = ingress::entries(svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()));
        let (gateways, selection_error) = match gateways {
            None => (vec![String::new()], None),
            Some(g) => match routing::selected(g, svc.metadata.annotations.as_ref()) {
                Ok(set) => (set.into_iter().collect(), None),
                Err(e) => (Vec::new(), Some(e.to_string())),
            },
        };
        let ids = crate::families::identities(&uid, &crate::families::of_service(key, svc))
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        Some(Self {
            gateways,
            selection_error,
            key: key.clone(),
            ids,
            uid,
            resource_version: svc.metadata.resource_version.clone().unwrap_or_default(),
            ours,
            deleting: svc.metadata.deletion_timestamp.is_some(),
            has_finalizer,
            finalizers,
            ingress,
            generation: svc.metadata.generation,
            conditions: svc
                .status
                .as_ref()
                .and_then(|s| s.conditions.clone())
                .unwrap_or_default(),
        })
    }
}

/// From the kube side.
#[derive(Debug)]
pub(crate) enum Msg {
    /// The Service stream starts a list.
    RelistStart,
    /// A Service that concerns us, seen at event `seq`.
    Seen { facts: ServiceFacts, seq: u64 },
    /// The Service is gone or does not concern us.
    Gone(ObjKey),
    /// The Service list is complete: records not seen since `RelistStart` are dropped.
    RelistDone,
    /// Updates about these inbound services (UIDs) were sent at event `seq` (their endpoints
    /// changed): something is pending for them again.
    Touched { uids: Vec<String>, seq: u64 },
    /// The translator found a port-name conflict of a Service (or its situation changed).
    PortConflict {
        key: ObjKey,
        port_name: String,
        message: String,
    },
    /// A PoolService of our class was seen.
    Pool(PoolServiceFacts),
    /// A PoolService is gone or no longer of our class.
    PoolGone(ObjKey),
    /// Something changed for this Service (a PoolService of someone else exposes it elsewhere).
    Poke(ObjKey),
}

#[derive(Debug, Clone)]
pub(crate) struct Config {
    server: ConnectOptions,
    finalizer: String,
    poll: Duration,
    poll_initial: Duration,
    recheck: Duration,
    backoff_initial: Duration,
    backoff_max: Duration,
    max_per_tick: usize,
    metrics: std::sync::Arc<crate::metrics::WatcherMetrics>,
    gateways: Option<std::sync::Arc<Gateways>>,
    class: String,
    pool_services: bool,
}

impl From<&WatcherConfig> for Config {
    fn from(c: &WatcherConfig) -> Self {
        Self {
            server: c.server.clone(),
            finalizer: c.finalizer.clone(),
            poll: c.poll_interval,
            poll_initial: POLL_INITIAL.min(c.poll_interval),
            recheck: c.recheck_interval,
            backoff_initial: c.backoff_initial,
            backoff_max: c.backoff_max,
            max_per_tick: 200,
            metrics: c.metrics.clone(),
            gateways: c.gateways.clone(),
            class: c.class.clone(),
            pool_services: c.pool_services_on(),
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
    next_at: Instant,
    /// The backoff of this record while its actions fail in a row ([`clb_client::backoff`]:
    /// from `max(backoff_initial, poll)` up to `backoff_max`); `None` once one succeeds.
    retry: Option<Backoff>,
    /// The resource version at which our last patch succeeded: the same patch is not sent again
    /// before the watch shows the result.
    patched_at_rv: Option<String>,
    seen_in_relist: bool,
    /// The delay before the next poll while something is pending (doubles up to `poll`).
    delay: Duration,
    /// The (reason, error code) of the last Event published for the Service.
    reported: Option<(&'static str, String)>,
    /// The translator's last port-name conflict of each port of the Service (by port name).
    port_conflicts: BTreeMap<String, String>,
    /// Port-name conflicts to publish as Events.
    conflicts_due: Vec<String>,
    /// The refused gateway selection last published as a Warning Event.
    selection_warned: Option<String>,
}

impl Record {
    fn action(&self) -> Action {
        let f = &self.facts;
        match (f.ours && !f.deleting, f.has_finalizer) {
            (true, false) => Action::AddFinalizer,
            (true, true) => Action::Ingress,
            (false, _) => Action::Cleanup,
        }
    }
}

struct WriteBack {
    config: Config,
    kube: kube::Client,
    recorder: Recorder,
    reporter: Reporter,
    /// The note last published per (object, type and reason): see [`WriteBack::publish_event`].
    event_notes: HashMap<(String, String), String>,
    /// The services' states, pushed by the server (`states.rs`).
    states: States,
    records: HashMap<ObjKey, Record>,
    acked: watch::Receiver<u64>,
    /// PoolServices of our class, by key.
    pools: HashMap<ObjKey, PoolServiceFacts>,
    /// PoolService → the resourceVersion our last status patch was based on.
    pool_patched: HashMap<ObjKey, String>,
    /// PoolService → the problem last published as a Warning Event on it.
    pool_warned: HashMap<ObjKey, String>,
    /// Warning Events on PoolServices not published yet.
    pool_warnings: Vec<PoolServiceFacts>,
    /// (gateway, egress) → the (reason, code) of the last NAT gateway Event published (`egress.rs`).
    egress_reported: HashMap<(String, String), (&'static str, String)>,
    /// Whether the API server keeps `ipMode` in a Service's ingress (and the PoolService CRD in a
    /// PoolService's): true until the answer to a status write shows it dropped
    /// ([`ingress::drops_ip_mode`]); then the ingress is compared without it.
    ip_mode_kept: bool,
    pool_ip_mode_kept: bool,
}

impl WriteBack {
    /// Notes, from the answer to a status write of ours, whether the server kept `ipMode`.
    fn note_ip_mode(kept: &mut bool, stored: &[IngressEntry], what: &str) {
        if *kept && ingress::drops_ip_mode(stored) {
            *kept = false;
            tracing::warn!(
                "the API server dropped status.loadBalancer.ingress[].ipMode of a {what} (the \
                 LoadBalancerIPMode feature gate is off, or the schema lacks the field): the ingress \
                 is compared without it from now on"
            );
        }
    }
}

/// Runs until the kube side ends.
pub(crate) async fn run(
    config: Config,
    kube: kube::Client,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    acked: watch::Receiver<u64>,
) {
    let reporter = Reporter {
        controller: REPORTING_CONTROLLER.to_owned(),
        instance: std::env::var("POD_NAME")
            .ok()
            .filter(|n| !n.is_empty())
            .or_else(|| Some(FIELD_MANAGER.to_owned())),
    };
    let (changed_tx, mut changed) = mpsc::unbounded_channel();
    let followed = match &config.gateways {
        Some(g) => g.names(),
        None => vec![String::new()],
    };
    let mut wb = WriteBack {
        states: States::follow(&config, followed, changed_tx),
        recorder: Recorder::new(kube.clone(), reporter.clone()),
        reporter,
        event_notes: HashMap::new(),
        config,
        kube,
        records: HashMap::new(),
        acked,
        pools: HashMap::new(),
        pool_patched: HashMap::new(),
        pool_warned: HashMap::new(),
        pool_warnings: Vec::new(),
        egress_reported: HashMap::new(),
        ip_mode_kept: true,
        pool_ip_mode_kept: true,
    };
    loop {
        // Sleep until the first record is due (records are few; an hour when there is none).
        let next = wb
            .records
            .values()
            .map(|r| r.next_at)
            .min()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            msg = rx.recv() => match msg {
                // A Service seen without our finalizer gets it at once, not at the next tick: the
                // translator programs a Service only once it carries the finalizer.
                Some(m) => if wb.handle(m) || !wb.pool_warnings.is_empty() {
                    wb.act().await;
                },
                None => return,
            },
            Some(uids) = changed.recv() => {
                // The server pushed new states: look at those Services now.
                for id in &uids {
                    wb.poke(None, Some(crate::families::service_uid(id)));
                }
                wb.egress_events(&uids).await;
                wb.act().await;
            }
            _ = tokio::time::sleep_until(next) => wb.act().await,
        }
    }
}

impl WriteBack {
    /// Folds in `msg`; returns whether a finalizer is to be added now.
    fn handle(&mut self, msg: Msg) -> bool {
        let key = match &msg {
            Msg::Seen { facts, .. } => Some(facts.key.clone()),
            _ => None,
        };
        self.fold(msg);
        key.and_then(|k| self.records.get(&k)).is_some_and(|r| {
            r.action() == Action::AddFinalizer
                && r.next_at <= Instant::now()
                && r.patched_at_rv.as_deref() != Some(r.facts.resource_version.as_str())
        })
    }

    fn fold(&mut self, msg: Msg) {
        match msg {
            Msg::RelistStart => {
                for r in self.records.values_mut() {
                    r.seen_in_relist = false;
                }
            }
            Msg::RelistDone => {
                self.records.retain(|_, r| r.seen_in_relist);
            }
            Msg::Gone(key) => {
                self.records.remove(&key);
            }
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
                self.pools.insert(f.key.clone(), f);
                self.poke(svc.as_ref(), owner.as_deref());
            }
            Msg::PoolGone(key) => {
                self.pool_warned.remove(&key);
                if let Some(f) = self.pools.remove(&key) {
                    self.pool_patched.remove(&key);
                    self.poke(f.service.as_ref(), f.owner_uid.as_deref());
                }
            }
            Msg::Poke(key) => self.poke(Some(&key), None),
            Msg::Touched { uids, seq } => {
                let now = Instant::now();
                let initial = self.config.poll_initial;
                for r in self.records.values_mut() {
                    if uids.contains(&r.facts.uid) {
                        r.seq = r.seq.max(seq);
                        r.delay = initial;
                        if r.retry.is_none() {
                            r.next_at = r.next_at.min(now + initial);
                        }
                    }
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
                    r.next_at = Instant::now();
                }
            }
            Msg::Seen { mut facts, seq } => {
                let now = Instant::now();
                match self.records.get_mut(&facts.key) {
                    Some(r) => {
                        if facts.selection_error.is_some() {
                            // Refused annotations change nothing.
                            facts.gateways = r.facts.gateways.clone();
                        }
                        if r.facts.resource_version != facts.resource_version {
                            r.next_at = now;
                            r.retry = None;
                            r.delay = self.config.poll_initial;
                        }
                        r.facts = facts;
                        r.seq = seq;
                        r.seen_in_relist = true;
                    }
                    None => {
                        self.records.insert(
                            facts.key.clone(),
                            Record {
                                facts,
                                seq,
                                next_at: now,
                                retry: None,
                                patched_at_rv: None,
                                seen_in_relist: true,
                                delay: self.config.poll_initial,
                                reported: None,
                                port_conflicts: BTreeMap::new(),
                                conflicts_due: Vec::new(),
                                selection_warned: None,
                            },
                        );
                    }
                }
            }
        }
    }

    async fn act(&mut self) {
        for f in std::mem::take(&mut self.pool_warnings) {
            self.publish_on_pool(&f).await;
        }
        let now = Instant::now();
        let acked = *self.acked.borrow();
        let mut due: Vec<(Instant, ObjKey)> = self
            .records
            .iter()
            .filter(|(_, r)| r.next_at <= now)
            .map(|(k, r)| (r.next_at, k.clone()))
            .collect();
        due.sort();
        due.truncate(self.config.max_per_tick);
        let mut nrp_observed: Option<bool> = None;
        for (_, key) in due {
            let Some(r) = self.records.get(&key) else {
                continue;
            };
            let action = r.action();
            if action != Action::AddFinalizer && r.seq > acked {
                // The server has not acknowledged what we sent for this Service yet.
                if let Some(r) = self.records.get_mut(&key) {
                    r.next_at = now + ACK_WAIT;
                }
                continue;
            }
            let result = match action {
                Action::AddFinalizer => self.add_finalizer(&key).await,
                Action::Ingress => self.program(&key).await,
                Action::Cleanup => {
                    // The PoolServices we made for it go at once (NRP's removal is the Service's).
                    self.delete_owned_pools(&key).await;
                    if nrp_observed.is_none() {
                        nrp_observed = Some(self.nrp_observed());
                    }
                    if nrp_observed == Some(true) {
                        self.cleanup(&key).await
                    } else {
                        Ok(Some(self.pending_delay(&key)))
                    }
                }
            };
            let Some(r) = self.records.get_mut(&key) else {
                continue;
            };
            match result {
                Ok(Some(after)) => {
                    r.retry = None;
                    r.next_at = Instant::now() + after;
                }
                Ok(None) => {
                    self.records.remove(&key);
                }
                Err(()) => {
                    let base = self.config.backoff_initial.max(self.config.poll);
                    let max = self.config.backoff_max.max(base);
                    let d = r
                        .retry
                        .get_or_insert_with(|| Backoff::new(base, max))
                        .next_delay(false);
                    r.next_at = Instant::now() + d;
                }
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

    /// `Ok(Some(d))`: check again after `d`; `Ok(None)`: forget the record; `Err`: back off.
    async fn add_finalizer(&mut self, key: &ObjKey) -> Result<Option<Duration>, ()> {
        let r = &self.records[key];
        if r.patched_at_rv.as_deref() == Some(r.facts.resource_version.as_str()) {
            return Ok(Some(self.config.poll));
        }
        let mut finalizers = r.facts.finalizers.clone();
        finalizers.push(self.config.finalizer.clone());
        let rv = r.facts.resource_version.clone();
        let r = self.patch_finalizers(key, finalizers, &rv).await;
        if let Ok(Some(_)) = &r {
            tracing::info!(service = %key, finalizer = %self.config.finalizer, "finalizer added");
            if let Some(rec) = self.records.get_mut(key) {
                rec.patched_at_rv = Some(rv);
            }
        }
        r
    }

    async fn patch_finalizers(
        &self,
        key: &ObjKey,
        finalizers: Vec<String>,
        rv: &str,
    ) -> Result<Option<Duration>, ()> {
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
            Ok(_) => Ok(Some(self.config.poll)),
            Err(e) => self.kube_error(key, "patching the finalizers", e),
        }
    }

    fn kube_error(&self, key: &ObjKey, what: &str, e: kube::Error) -> Result<Option<Duration>, ()> {
        match &e {
            kube::Error::Api(s) if s.code == 409 => {
                tracing::debug!(service = %key, "{what}: conflict, the Service changed; retrying with its new version");
                Ok(Some(self.config.poll))
            }
            kube::Error::Api(s) if s.code == 404 => {
                tracing::debug!(service = %key, "{what}: the Service is gone");
                Ok(None)
            }
            _ => {
                self.config.metrics.writeback_failure(what);
                tracing::warn!(service = %key, error = %e, "{what} failed");
                Err(())
            }
        }
    }

    /// The next delay while something is pending for the Service: `poll_initial`, doubling up
    /// to `poll`.
    fn pending_delay(&mut self, key: &ObjKey) -> Duration {
        let (initial, cap) = (self.config.poll_initial, self.config.poll);
        match self.records.get_mut(key) {
            Some(r) => {
                let d = r.delay.clamp(initial, cap);
                r.delay = (d * 2).min(cap);
                d
            }
            None => cap,
        }
    }

    /// The reference of our Events to the Service (no resourceVersion: the recorder keys its
    /// series on the reference, and one Service's Events form one series per reason).
    fn reference(facts: &ServiceFacts) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Service".to_owned()),
            name: Some(facts.key.name.clone()),
            namespace: Some(facts.key.namespace.clone()),
            uid: Some(facts.uid.clone()),
            ..ObjectReference::default()
        }
    }

    /// Publishes one Event on the Service (best effort: a failure is logged, never retried on
    /// its own; the next change of the condition publishes again).
    async fn publish(
        &mut self,
        facts: &ServiceFacts,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let ev = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(truncate(note, 1024)),
            action: "Programming".to_owned(),
            secondary: None,
        };
        match self.publish_event(&ev, &Self::reference(facts)).await {
            Ok(()) => {
                tracing::debug!(service = %facts.key, reason, "event published");
            }
            Err(e) => {
                tracing::warn!(service = %facts.key, reason, error = %e, "publishing an event failed");
            }
        }
    }

    /// Publishes `ev` about `reference` with kube's recorder, which turns a repeat of the same
    /// (type, reason, action, object) into a series of one Event: the right thing for the same
    /// problem seen again, the wrong one for a *different* problem of the same reason (another
    /// refused annotation value), whose count it would bump under the old message. So a note that
    /// differs from the last one published under the same key starts a fresh recorder: a new Event
    /// with the current message.
    async fn publish_event(
        &mut self,
        ev: &Event,
        reference: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let key = (
            format!(
                "{}/{}/{}/{}",
                reference.kind.as_deref().unwrap_or_default(),
                reference.namespace.as_deref().unwrap_or_default(),
                reference.name.as_deref().unwrap_or_default(),
                reference.uid.as_deref().unwrap_or_default()
            ),
            format!("{:?}/{}", ev.type_, ev.reason),
        );
        let note = ev.note.clone().unwrap_or_default();
        if self.event_notes.get(&key).is_some_and(|last| *last != note) {
            self.recorder = Recorder::new(self.kube.clone(), self.reporter.clone());
        }
        self.event_notes.insert(key, note);
        self.recorder.publish(ev, reference).await
    }

    /// Follows the server's report of an inbound Service: Events when its condition changes,
    /// then one merge patch of the `status` subresource for the ingress and our condition when
    /// either differs from what the watch shows.
    async fn program(&mut self, key: &ObjKey) -> Result<Option<Duration>, ()> {
        let facts = self.records[key].facts.clone();
        if let Some(e) = &facts.selection_error
            && self.records[key].selection_warned.as_ref() != Some(e)
        {
            tracing::warn!(service = %key, "{e}");
            self.publish(
                &facts,
                EventType::Warning,
                "InvalidGatewaySelection",
                e.clone(),
            )
            .await;
            if let Some(r) = self.records.get_mut(key) {
                r.selection_warned = Some(e.clone());
            }
        }
        // Every selected gateway's report of every IP family's identity: the condition follows the
        // first not programmed (else the first), the ingress lists every programmed frontend IP,
        // IPv4 first. PoolServices follow the primary family's identity.
        let mut states = Vec::new();
        let mut by_gateway = BTreeMap::new();
        let mut all = facts.gateways.clone();
        for g in self.foreign_gateways(key) {
            if !all.contains(&g) {
                all.push(g);
            }
        }
        for g in &all {
            for (i, id) in facts.ids.iter().enumerate() {
                let st = self.service_state(g, id)?;
                if i == 0 {
                    by_gateway.insert(g.clone(), st.clone());
                }
                states.push(st);
            }
        }
        if self.config.pool_services {
            self.reconcile_pools(key, &facts, &by_gateway).await;
        }
        let ips = ingress::ordered(
            states
                .iter()
                .flatten()
                .filter(|s| s.actual && !s.frontend_ip.is_empty())
                .map(|s| s.frontend_ip.clone()),
        );
        let state = states
            .iter()
            .find(|s| {
                !s.as_ref()
                    .is_some_and(|s| s.actual && !s.frontend_ip.is_empty())
            })
            .or(states.first())
            .cloned()
            .flatten();
        let record = &self.records[key];
        let conflicts: Vec<String> = record.port_conflicts.values().cloned().collect();
        let want = Wanted::of(state.as_ref(), &conflicts);

        // Events: one per change of the reason (or error code), not per poll or retry. A Service
        // that already shows this condition (a restarted watcher) gets none.
        let event_key = (want.reason, want.error_code.clone());
        let already = record.reported.as_ref() == Some(&event_key)
            || (record.reported.is_none()
                && ours(&facts.conditions)
                    .is_some_and(|c| c.reason == want.reason && c.status == want.status));
        if !already {
            if let Some(type_) = want.event {
                self.publish(&facts, type_, want.reason, want.message.clone())
                    .await;
            }
            if let Some(r) = self.records.get_mut(key) {
                r.reported = Some(event_key);
            }
        }
        let due = self
            .records
            .get_mut(key)
            .map(|r| std::mem::take(&mut r.conflicts_due))
            .unwrap_or_default();
        for m in due {
            self.publish(&facts, EventType::Warning, "PortNameConflict", m)
                .await;
        }

        // `ipMode` is compared too: an entry written without it (or by someone else) is rewritten.
        let ingress_due =
            !ips.is_empty() && !ingress::is_written(&facts.ingress, &ips, self.ip_mode_kept);
        let condition = want.condition(&facts);
        let condition_due = condition.is_some();
        let settled = matches!(want.reason, "Programmed" | "RejectedByAzure")
            && !ingress_due
            && !condition_due;
        if !ingress_due && !condition_due {
            return Ok(Some(if settled {
                self.config.recheck
            } else {
                self.pending_delay(key)
            }));
        }
        let rv = facts.resource_version.clone();
        if self.records[key].patched_at_rv.as_deref() == Some(rv.as_str()) {
            // Our last patch is not in the watch yet.
            return Ok(Some(self.pending_delay(key)));
        }
        let mut status = serde_json::Map::new();
        if ingress_due {
            status.insert(
                "loadBalancer".into(),
                json!({ "ingress": ingress::to_json(&ips) }),
            );
        }
        if let Some(conditions) = condition {
            status.insert("conditions".into(), json!(conditions));
        }
        let patch = json!({ "metadata": { "resourceVersion": rv }, "status": status });
        match self
            .api(key)
            .patch_status(&key.name, &Self::params(), &Patch::Merge(&patch))
            .await
        {
            Ok(stored) => {
                if ingress_due {
                    let stored = ingress::entries(
                        stored
                            .status
                            .as_ref()
                            .and_then(|s| s.load_balancer.as_ref()),
                    );
                    Self::note_ip_mode(&mut self.ip_mode_kept, &stored, "Service");
                    tracing::info!(service = %key, ip = %ips.join(","), "status.loadBalancer.ingress set");
                }
                if condition_due {
                    tracing::info!(service = %key, reason = want.reason, message = %want.message, "condition {CONDITION_TYPE} set");
                }
                if let Some(r) = self.records.get_mut(key) {
                    r.patched_at_rv = Some(rv);
                }
                Ok(Some(self.pending_delay(key)))
            }
            Err(e) => self.kube_error(key, "patching the Service's status", e),
        }
    }

    async fn cleanup(&mut self, key: &ObjKey) -> Result<Option<Duration>, ()> {
        let r = &self.records[key];
        if r.patched_at_rv.as_deref() == Some(r.facts.resource_version.as_str()) {
            return Ok(Some(self.config.poll));
        }
        let facts = r.facts.clone();
        let mut still = None;
        if !facts.uid.is_empty() {
            // Every identity the Service may have had: a family removed just before may still be
            // draining.
            'gateways: for g in self.all_gateways() {
                for id in crate::families::every_identity(&facts.uid) {
                    if let Some(s) = self.service_state(&g, &id)?
                        && (s.desired || s.actual)
                    {
                        still = Some(s);
                        break 'gateways;
                    }
                }
            }
        }
        if let Some(s) = still {
            tracing::debug!(service = %key, desired = s.desired, actual = s.actual, "waiting for NRP to drop the service");
            let held = s
                .condition
                .as_ref()
                .filter(|c| c.reason == ProgrammingReason::HeldBack as i32);
            let reported = self.records.get(key).and_then(|r| r.reported.clone());
            match held {
                Some(c) if reported.as_ref().is_none_or(|r| r.0 != "HeldBack") => {
                    self.publish(&facts, EventType::Normal, "HeldBack", c.message.clone())
                        .await;
                    if let Some(r) = self.records.get_mut(key) {
                        r.reported = Some(("HeldBack", String::new()));
                    }
                }
                Some(_) => {}
                None => {
                    if let Some(r) = self.records.get_mut(key) {
                        r.reported = None;
                    }
                }
            }
            return Ok(Some(self.pending_delay(key)));
        }
        let mut rv = facts.resource_version.clone();
        if !facts.deleting && !facts.ingress.is_empty() {
            let patch = json!({ "status": { "loadBalancer": { "ingress": null } } });
            match self
                .api(key)
                .patch_status(&key.name, &Self::params(), &Patch::Merge(&patch))
                .await
            {
                Ok(svc) => {
                    tracing::info!(service = %key, "status.loadBalancer.ingress cleared: no longer a load balancer of ours");
                    rv = svc.metadata.resource_version.unwrap_or(rv);
                }
                Err(e) => return self.kube_error(key, "clearing status.loadBalancer.ingress", e),
            }
        }
        let remaining: Vec<String> = facts
            .finalizers
            .iter()
            .filter(|f| **f != self.config.finalizer)
            .cloned()
            .collect();
        let r = self.patch_finalizers(key, remaining, &rv).await;
        if let Ok(Some(_)) = &r {
            tracing::info!(service = %key, uid = %facts.uid, "NRP no longer has the service; finalizer removed");
            if let Some(rec) = self.records.get_mut(key) {
                rec.patched_at_rv = Some(facts.resource_version);
            }
        }
        r
    }

    /// The state of service `uid` in `gateway` as the server's stream last pushed it (`Ok(None)`:
    /// the gateway does not know it; `Err(())`: its stream is down).
    fn service_state(&self, gateway: &str, uid: &str) -> Result<Option<ServiceState>, ()> {
        self.states.get(gateway, uid)
    }

    /// Whether every gateway a Service may be in has read NRP back: only then does "unknown
    /// service" mean "NRP does not have it".
    fn nrp_observed(&self) -> bool {
        self.states.nrp_observed(&self.all_gateways())
    }
}

/// Our condition among `conditions`.
fn ours(conditions: &[Condition]) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == CONDITION_TYPE)
}

/// `s` cut to at most `max` bytes (on a character boundary).
fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max.saturating_sub(3);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

/// The condition (and Event) a Service is to show for what the server reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wanted {
    /// `"True"` or `"False"`.
    pub status: &'static str,
    /// CamelCase: `Programmed`, `Pending`, `RejectedByAzure`, `Throttled`, `Retrying`,
    /// `HeldBack`, `PortNameConflict`.
    pub reason: &'static str,
    pub message: String,
    /// The ARM error code, for the reasons that have one.
    pub error_code: String,
    /// The Event to publish when the condition changes to this one (`None`: no Event).
    pub event: Option<EventType>,
}

impl Wanted {
    /// From `GetService` (`None`: the server does not know the service yet) and the translator's
    /// port-name conflicts of the Service.
    pub(crate) fn of(state: Option<&ServiceState>, port_conflicts: &[String]) -> Self {
        let pending = |message: &str| Self {
            status: "False",
            reason: "Pending",
            message: message.to_owned(),
            error_code: String::new(),
            event: None,
        };
        let mut w = match state {
            None => pending("waiting for the state server to take the Service"),
            Some(s) => {
                let c = s.condition.clone().unwrap_or_default();
                let reason =
                    ProgrammingReason::try_from(c.reason).unwrap_or(ProgrammingReason::Unspecified);
                let failure = |reason: &'static str, text: &str| Self {
                    status: "False",
                    reason,
                    message: format!("{text}: {}: {}", c.error_code, c.error_message),
                    error_code: c.error_code.clone(),
                    event: Some(EventType::Warning),
                };
                match reason {
                    ProgrammingReason::Programmed if !s.frontend_ip.is_empty() => Self {
                        status: "True",
                        reason: "Programmed",
                        message: format!(
                            "programmed in Azure: frontend IP {}, {} backends",
                            s.frontend_ip, s.actual_addresses
                        ),
                        error_code: String::new(),
                        event: Some(EventType::Normal),
                    },
                    ProgrammingReason::Rejected => failure(
                        "RejectedByAzure",
                        "Azure rejected the load balancer; nothing is retried until the Service changes",
                    ),
                    ProgrammingReason::Throttled => {
                        failure("Throttled", "Azure throttles the requests; retrying")
                    }
                    ProgrammingReason::Retrying => {
                        failure("Retrying", "programming failed; retrying")
                    }
                    ProgrammingReason::HeldBack => Self {
                        status: "False",
                        reason: "HeldBack",
                        message: c.message.clone(),
                        error_code: String::new(),
                        event: Some(EventType::Normal),
                    },
                    _ => pending("waiting for Azure to program the load balancer and its backends"),
                }
            }
        };
        if !port_conflicts.is_empty() {
            let conflicts = port_conflicts.join("; ");
            if matches!(w.reason, "Programmed" | "Pending") {
                w.reason = "PortNameConflict";
                w.event = None; // published per conflict (PortNameConflict Events)
            }
            w.message = format!("{}; port name conflict: {conflicts}", w.message);
        }
        w
    }

    /// The whole `status.conditions` list with ours replaced, when ours differs from the one the
    /// Service shows (`None`: nothing to patch). `lastTransitionTime` changes only with the status.
    pub(crate) fn condition(&self, facts: &ServiceFacts) -> Option<Vec<Condition>> {
        let message = truncate(self.message.clone(), 32 * 1024);
        let current = ours(&facts.conditions);
        if let Some(c) = current
            && c.status == self.status
            && c.reason == self.reason
            && c.message == message
            && c.observed_generation == facts.generation
        {
            return None;
        }
        let last_transition_time = match current {
            Some(c) if c.status == self.status => c.last_transition_time.clone(),
            _ => Time(now_seconds()),
        };
        let mine = Condition {
            type_: CONDITION_TYPE.to_owned(),
            status: self.status.to_owned(),
            reason: self.reason.to_owned(),
            message,
            last_transition_time,
            observed_generation: facts.generation,
        };
        let mut list: Vec<Condition> = facts
            .conditions
            .iter()
            .filter(|c| c.type_ != CONDITION_TYPE)
            .cloned()
            .collect();
        list.push(mine);
        Some(list)
    }
}

/// Now, to the second (`metav1.Time` is serialized in RFC 3339 seconds).
fn now_seconds() -> k8s_openapi::jiff::Timestamp {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now)
}

mod egress;
mod pools;
mod states;

use states::States;

#[cfg(test)]
mod tests;
