//! Write-back to Kubernetes (cluster mode): the finalizer and `status.loadBalancer.ingress`.
//!
//! For every LoadBalancer Service of our class the task
//! 1. adds our finalizer (the translator programs a Service only once it carries it);
//! 2. once the state server says the service is actual (NRP has it) with a frontend IP, sets
//!    `status.loadBalancer.ingress` to `[{ip}]` when it differs;
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

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::WatcherConfig;
use super::sender::Conn;
use super::translate::{ObjKey, ServiceClass, TranslatorConfig, classify};
use clb_client::client::ConnectOptions;

/// The field manager named in our patches.
pub(crate) const FIELD_MANAGER: &str = "clb-watcher";

/// What the write-back needs to know of a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServiceFacts {
    pub key: ObjKey,
    pub uid: String,
    pub resource_version: String,
    /// A LoadBalancer Service of our class.
    pub ours: bool,
    pub deleting: bool,
    pub has_finalizer: bool,
    pub finalizers: Vec<String>,
    /// `status.loadBalancer.ingress[].ip` (or hostname).
    pub ingress: Vec<String>,
}

impl ServiceFacts {
    /// The facts of a Service that concerns us (ours, or carrying our finalizer); `None` otherwise.
    pub(crate) fn of(key: &ObjKey, svc: &Service, config: &TranslatorConfig) -> Option<Self> {
        let finalizer = config.require_finalizer.as_deref()?;
        let ours = classify(svc, config) == ServiceClass::Ours;
        let finalizers = svc.metadata.finalizers.clone().unwrap_or_default();
        let has_finalizer = finalizers.iter().any(|f| f == finalizer);
        if !ours && !has_finalizer {
            return None;
        }
        // A Service without UID is skipped (the translator logs it): nothing to program or patch.
        let uid = svc.metadata.uid.clone().filter(|u| !u.trim().is_empty())?;
        let ingress = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .map(|l| {
                l.iter()
                    .map(|i| {
                        i.ip.clone()
                            .or_else(|| i.hostname.clone())
                            .unwrap_or_default()
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(Self {
            key: key.clone(),
            uid,
            resource_version: svc.metadata.resource_version.clone().unwrap_or_default(),
            ours,
            deleting: svc.metadata.deletion_timestamp.is_some(),
            has_finalizer,
            finalizers,
            ingress,
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
}

#[derive(Debug, Clone)]
pub(crate) struct Config {
    server: ConnectOptions,
    finalizer: String,
    poll: Duration,
    recheck: Duration,
    backoff_initial: Duration,
    backoff_max: Duration,
    max_per_tick: usize,
}

impl From<&WatcherConfig> for Config {
    fn from(c: &WatcherConfig) -> Self {
        Self {
            server: c.server.clone(),
            finalizer: c.finalizer.clone(),
            poll: c.poll_interval,
            recheck: c.recheck_interval,
            backoff_initial: c.backoff_initial,
            backoff_max: c.backoff_max,
            max_per_tick: 200,
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
    /// Errors in a row (for the backoff of this record).
    failures: u32,
    /// The resource version at which our last patch succeeded: the same patch is not sent again
    /// before the watch shows the result.
    patched_at_rv: Option<String>,
    seen_in_relist: bool,
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
    conn: Conn,
    records: HashMap<ObjKey, Record>,
    acked: watch::Receiver<u64>,
}

/// Runs until the kube side ends.
pub(crate) async fn run(
    config: Config,
    kube: kube::Client,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    acked: watch::Receiver<u64>,
) {
    let mut wb = WriteBack {
        conn: Conn::new(&config.server),
        config,
        kube,
        records: HashMap::new(),
        acked,
    };
    let mut tick = tokio::time::interval(wb.config.poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                // A Service seen without our finalizer gets it at once, not at the next tick: the
                // translator programs a Service only once it carries the finalizer.
                Some(m) => if wb.handle(m) {
                    wb.act().await;
                },
                None => return,
            },
            _ = tick.tick() => wb.act().await,
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
            Msg::Seen { facts, seq } => {
                let now = Instant::now();
                match self.records.get_mut(&facts.key) {
                    Some(r) => {
                        if r.facts.resource_version != facts.resource_version {
                            r.next_at = now;
                            r.failures = 0;
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
                                failures: 0,
                                patched_at_rv: None,
                                seen_in_relist: true,
                            },
                        );
                    }
                }
            }
        }
    }

    async fn act(&mut self) {
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
                continue;
            }
            let result = match action {
                Action::AddFinalizer => self.add_finalizer(&key).await,
                Action::Ingress => self.ingress(&key).await,
                Action::Cleanup => {
                    if nrp_observed.is_none() {
                        nrp_observed = Some(self.nrp_observed().await);
                    }
                    if nrp_observed == Some(true) {
                        self.cleanup(&key).await
                    } else {
                        Ok(Some(self.config.poll))
                    }
                }
            };
            let Some(r) = self.records.get_mut(&key) else {
                continue;
            };
            match result {
                Ok(Some(after)) => {
                    r.failures = 0;
                    r.next_at = Instant::now() + after;
                }
                Ok(None) => {
                    self.records.remove(&key);
                }
                Err(()) => {
                    r.failures += 1;
                    let base = self.config.backoff_initial.max(self.config.poll);
                    let d = (base * 2u32.pow(r.failures.min(10) - 1))
                        .min(self.config.backoff_max.max(base));
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
                tracing::warn!(service = %key, error = %e, "{what} failed");
                Err(())
            }
        }
    }

    async fn ingress(&mut self, key: &ObjKey) -> Result<Option<Duration>, ()> {
        let (uid, ingress, rv, patched) = {
            let r = &self.records[key];
            (
                r.facts.uid.clone(),
                r.facts.ingress.clone(),
                r.facts.resource_version.clone(),
                r.patched_at_rv.clone(),
            )
        };
        let state = match self.service_state(&uid).await? {
            Some(s) if s.actual && !s.frontend_ip.is_empty() => s,
            // Not programmed yet (or the frontend IP is not known yet).
            _ => return Ok(Some(self.config.poll)),
        };
        if ingress == [state.frontend_ip.clone()] {
            return Ok(Some(self.config.recheck));
        }
        if patched.as_deref() == Some(rv.as_str()) {
            return Ok(Some(self.config.poll));
        }
        let patch =
            json!({ "status": { "loadBalancer": { "ingress": [ { "ip": state.frontend_ip } ] } } });
        match self
            .api(key)
            .patch_status(&key.name, &Self::params(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(service = %key, ip = %state.frontend_ip, "status.loadBalancer.ingress set");
                if let Some(r) = self.records.get_mut(key) {
                    r.patched_at_rv = Some(rv);
                }
                Ok(Some(self.config.poll))
            }
            Err(e) => self.kube_error(key, "patching status.loadBalancer.ingress", e),
        }
    }

    async fn cleanup(&mut self, key: &ObjKey) -> Result<Option<Duration>, ()> {
        let r = &self.records[key];
        if r.patched_at_rv.as_deref() == Some(r.facts.resource_version.as_str()) {
            return Ok(Some(self.config.poll));
        }
        let facts = r.facts.clone();
        if !facts.uid.is_empty()
            && let Some(s) = self.service_state(&facts.uid).await?
            && (s.desired || s.actual)
        {
            tracing::debug!(service = %key, desired = s.desired, actual = s.actual, "waiting for NRP to drop the service");
            return Ok(Some(self.config.poll));
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

    /// `GetService`: `Ok(None)` when the server does not know the service.
    async fn service_state(
        &mut self,
        uid: &str,
    ) -> Result<Option<clb_proto::v1::ServiceState>, ()> {
        let client = match self.conn.get().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "write-back cannot reach the state server");
                self.conn.reset();
                return Err(());
            }
        };
        match client.service(uid).await {
            Ok(s) => Ok(Some(s)),
            Err(e)
                if e.status()
                    .is_some_and(|s| s.code() == tonic::Code::NotFound) =>
            {
                Ok(None)
            }
            Err(e) => {
                tracing::warn!(error = %e, "write-back: GetService failed");
                self.conn.reset();
                Err(())
            }
        }
    }

    /// Whether the server has read NRP back at least once (for the gateway we write to; with the
    /// default gateway, every gateway it drives): only then does "unknown service" mean "NRP does
    /// not have it".
    async fn nrp_observed(&mut self) -> bool {
        let client = match self.conn.get().await {
            Ok(c) => c,
            Err(_) => {
                self.conn.reset();
                return false;
            }
        };
        match client.status().await {
            Ok(s) => {
                let gw = client.gateway();
                let relevant: Vec<_> = s
                    .gateways
                    .iter()
                    .filter(|g| gw.is_empty() || g.name == gw)
                    .collect();
                !relevant.is_empty()
                    && relevant
                        .iter()
                        .all(|g| g.init.as_ref().is_some_and(|i| i.nrp_observed))
            }
            Err(e) => {
                tracing::warn!(error = %e, "write-back: Status failed");
                self.conn.reset();
                false
            }
        }
    }
}
