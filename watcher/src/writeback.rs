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

use clb_proto::v1::{IpFamily, ServiceState};
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::config::WatcherConfig;
use crate::ingress::{self, IngressEntry};
use crate::poolservice::{self, PoolService, PoolServiceFacts};
use crate::routing;
use crate::supervise::{Ended, WRITE_BACK, fault_point};
use crate::translate::{ObjKey, ServiceClass, TranslatorConfig, classify};
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

/// How many messages the write-back's inbox holds. When it is full, the kube side waits
/// (backpressure): a message is never dropped.
pub(crate) const INBOX: usize = 1024;

/// The write-back's inbox, as the kube side holds it.
pub(crate) type Inbox = mpsc::Sender<Msg>;

/// What the write-back needs to know of a Service.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ServiceFacts {
    pub key: ObjKey,
    pub uid: String,
    /// Its inbound identities, one per IP family, primary first, each with its family
    /// (`crate::families`).
    pub ids: Vec<(String, IpFamily)>,
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
    /// Why clb does not program it (`crate::settings::admit`), if it refuses it.
    pub refusal: Option<crate::settings::Refusal>,
    /// The Warning Event naming the settings clb ignores, if any.
    pub ignored: Option<String>,
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
        let families = crate::families::of_service(key, svc);
        let ids = crate::families::identities(&uid, &families);
        let (refusal, ignored) = match crate::settings::admit(svc, &families) {
            Ok(a) => (None, a.ignored_message()),
            Err(r) => (Some(r), None),
        };
        Some(Self {
            refusal,
            ignored,
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
    #[cfg(any(test, feature = "test-support"))]
    faults: crate::faults::Faults,
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
    /// The ignored settings last published as a Warning Event.
    ignored_warned: Option<String>,
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
        if fault_point!(wb.config.faults, WRITE_BACK) {
            // As if the kube side had dropped its end: the inbox closes.
            rx.close();
        }
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
                None => {
                    return Ended::Consequence {
                        task: WRITE_BACK,
                        reason: "its inbox closed".to_owned(),
                    };
                }
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
                                ignored_warned: None,
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

mod egress;
mod pools;
mod program;
mod states;
mod wanted;

use states::States;
#[cfg(test)]
use wanted::Wanted;
use wanted::{now_seconds, truncate};

#[cfg(test)]
mod tests;
